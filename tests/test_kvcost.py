"""pdkit.spec.kvcost: the KV figures from a prefill's histograms, and the KV path classes."""

from __future__ import annotations

import pytest

from pdkit.spec import kvcost

LATENCY_BOUNDS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)


def page(latencies_ms, mb_each, tp_ranks=(0,)):
    """A /metrics page as SGLang writes it after these transfers (each TP rank's child)."""
    lines = []
    for rank in tp_ranks:
        labels = f'engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="{rank}"'
        for name, values, bounds in (
                ("sglang:kv_transfer_latency_ms", latencies_ms, LATENCY_BOUNDS),
                ("sglang:kv_transfer_total_mb", [mb_each] * len(latencies_ms), (1.0, 5.0, 10.0, 50.0, 100.0, 500.0)),
                ("sglang:kv_transfer_speed_gb_s", [mb_each / 1024 / (v / 1000) for v in latencies_ms], (0.1, 1.0, 10.0, 100.0))):
            lines.append(f"# TYPE {name} histogram")
            for le in (*bounds, float("inf")):
                shown = "+Inf" if le == float("inf") else le
                lines.append(f'{name}_bucket{{{labels},le="{shown}"}} {sum(1 for v in values if v <= le)}')
            lines.append(f"{name}_sum{{{labels}}} {sum(values)}")
            lines.append(f"{name}_count{{{labels}}} {len(values)}")
    return "\n".join(lines) + "\n"


def test_effective_rate_is_a_ratio_of_sums_not_sglangs_mean_of_ratios():
    # one queued hand-off of 8 s among nine fast ones: SGLang's speed mean looks healthy
    latencies = [20.0] * 9 + [8000.0]
    after = kvcost.kv_histograms(page(latencies, 192.0))
    fig = kvcost.kv_figures({}, after, ttft_mean_ms=1000.0)
    assert fig.transfers == 10
    assert fig.mb_per_request == pytest.approx(192.0)
    assert fig.latency_mean_ms == pytest.approx(818.0)
    assert fig.effective_gb_s == pytest.approx(10 * 192 / 1024 / 8.18, rel=1e-6)
    assert fig.sglang_speed_mean_gb_s > 8 * fig.effective_gb_s
    assert fig.ttft_share == pytest.approx(0.818)


def test_the_window_is_the_difference_of_two_samples():
    before = kvcost.kv_histograms(page([30.0] * 4, 8.0))
    after = kvcost.kv_histograms(page([30.0] * 4 + [3000.0] * 2, 8.0))
    fig = kvcost.kv_figures(before, after)
    assert fig.transfers == 2
    assert fig.latency_mean_ms == pytest.approx(3000.0)
    assert fig.ttft_share is None


def test_a_restarted_prefill_counts_from_zero():
    before = kvcost.kv_histograms(page([30.0] * 40, 8.0))
    after = kvcost.kv_histograms(page([60.0] * 3, 8.0))
    assert kvcost.kv_figures(before, after).transfers == 3


def test_no_transfer_yet_gives_no_figures():
    assert kvcost.kv_histograms("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n") == {}
    fig = kvcost.kv_figures({}, {})
    assert fig.transfers == 0 and fig.effective_gb_s is None and fig.latency_p99_ms is None


def test_p99_past_the_top_bucket_is_flagged_as_a_floor():
    fig = kvcost.kv_figures({}, kvcost.kv_histograms(page([9000.0] * 5 + [20.0] * 95, 192.0)))
    assert fig.latency_p99_ms == 5000.0 and fig.latency_p99_above_buckets
    fig = kvcost.kv_figures({}, kvcost.kv_histograms(page([20.0] * 100, 192.0)))
    assert 10.0 < fig.latency_p99_ms <= 25.0 and not fig.latency_p99_above_buckets


def test_tp_ranks_and_prefills_are_summed():
    two_ranks = kvcost.kv_histograms(page([40.0, 40.0], 96.0, tp_ranks=(0, 1)))
    assert two_ranks["latency_ms"].count == 4
    both = kvcost.combine([kvcost.kv_histograms(page([10.0], 8.0)), kvcost.kv_histograms(page([30.0], 8.0))])
    fig = kvcost.kv_figures({}, both)
    assert fig.transfers == 2 and fig.latency_mean_ms == pytest.approx(20.0)


@pytest.mark.parametrize("devices, rdma", [
    ("mlx5_0:1", True), ("mlx5_0:1,mlx5_1:1", True), ("ibp3s0:1", True), ("rxe0:1", True), ("efa0", True),
    ("eth0", False), ("host0", False), ("ens1f0np0", False), ("mlx5_0:1,eth0", False), (None, False), ("", False),
    # issue 46: ib0 is the kernel's IP-over-InfiniBand netdev, which UCX drives over TCP
    ("ib0", False), ("ib0:1", True),
])
def test_rdma_devices_are_told_from_netdevs(devices, rdma):
    assert kvcost.net_devices_are_rdma(devices) is rdma


def test_the_path_of_a_pair():
    assert kvcost.kv_path("gpu01", "gpu01", None).name == "same-host"
    assert kvcost.kv_path("gpu01", "gpu02", "mlx5_0:1").name == "cross-host-rdma"
    assert kvcost.kv_path("gpu01", "gpu02", "host0").name == "cross-host-tcp"
    assert kvcost.kv_path("gpu01", "gpu02", None).name == "cross-host-tcp"
    floors = [p.floor_gb_s for p in kvcost.KV_PATHS.values()]
    assert floors == sorted(floors, reverse=True)


def test_small_hand_offs_are_not_judged_by_rate():
    assert not kvcost.rate_judged(None)
    assert not kvcost.rate_judged(8.0)  # the H200 one-host pair at 128-token prompts: latency-bound
    assert kvcost.rate_judged(kvcost.KV_RATE_MIN_MB) and kvcost.rate_judged(192.0)


def test_a_prefill_is_judged_by_the_lowest_floor_of_its_paths():
    same, tcp = kvcost.KV_PATHS["same-host"], kvcost.KV_PATHS["cross-host-tcp"]
    assert kvcost.kv_floor(()) is None
    assert kvcost.kv_floor((("gpu01", same),)) == same.floor_gb_s
    assert kvcost.kv_floor((("gpu01", same), ("gpu02", tcp))) == tcp.floor_gb_s
    # a sim moves KV at its knob, not over a transport: the lowest floor whatever its paths
    assert kvcost.kv_floor((("gpu01", same),), sim=True) == min(p.floor_gb_s for p in kvcost.KV_PATHS.values())
    # the measured H200 figures (docs/gpu.md): cuda_ipc passes the same-host floor, the TCP fallback does not
    assert 0.35 < same.floor_gb_s < 4.9


# ---- the prefix cache, and the KV a hand-off needs

def _real(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu" / name).read_text()


def test_one_token_s_kv_bytes_from_the_kv_pool_gauges_of_a_real_page():
    """0.5.17 prefill on the H200: 53.93 GiB of K and V buffers for 883,515 tokens (+ one padding page): 64 KiB."""
    assert kvcost.kv_bytes_per_token(_real("metrics-base-after-prefill.txt")) == pytest.approx(65536, rel=1e-5)
    assert kvcost.kv_bytes_per_token(page([10.0], 8.0)) is None  # neither gauge on the page
    two_ranks = "".join(f'sglang:kv_cache_memory_usage_gb{{tp_rank="{r}"}} 4.0\nsglang:max_total_num_tokens'
                        f'{{tp_rank="{r}"}} 131072\n' for r in (0, 1))
    assert kvcost.kv_bytes_per_token(two_ranks) == 32768  # per rank, as each rank's hand-off counts its own bytes


def test_cache_window_and_hit_rate():
    before, after = {"cached": 100.0, "prompt": 400.0}, {"cached": 700.0, "prompt": 1200.0}
    assert kvcost.cache_window(before, after) == {"cached": 600.0, "prompt": 800.0}
    assert kvcost.hit_rate(kvcost.cache_window(before, after)) == 0.75
    assert kvcost.cache_window(after, before) == before  # restarted between the samples: from zero
    assert kvcost.cache_window(None, after) == after
    assert kvcost.hit_rate({"cached": 0.0, "prompt": 0.0}) is None
    real = kvcost.cache_counts(_real("metrics-base-after-prefill.txt"))  # every label summed: is_streaming too
    assert real == {"cached": 38740.0, "prompt": 79668.0}


def test_handoff_need_against_the_uncached_part():
    fig = kvcost.kv_figures({}, kvcost.kv_histograms(page([10.0] * 4, 160.0)))
    need = kvcost.handoff_need(fig, {"cached": 8000.0, "prompt": 10000.0}, 65536)  # 500 uncached tokens a request
    assert need.uncached_tokens_per_request == 500 and need.need_mb_per_request == pytest.approx(31.25)
    assert need.ratio == pytest.approx(5.12) and need.resent_mb_per_request == pytest.approx(128.75) and need.too_much
    small = kvcost.handoff_need(kvcost.kv_figures({}, kvcost.kv_histograms(page([10.0] * 4, 8.0))),
                                {"cached": 400.0, "prompt": 512.0}, 65536)
    assert small.ratio == pytest.approx(4.57, rel=1e-2) and not small.too_much  # 6.25 MiB sent again: under the floor
    everything = kvcost.handoff_need(fig, {"cached": 10000.0, "prompt": 10000.0}, 65536)
    assert everything.ratio is None and everything.too_much  # all cached, 160 MiB crossed anyway
    assert kvcost.handoff_need(kvcost.kv_figures({}, {}), {"cached": 1.0, "prompt": 2.0}, 65536) is None



def test_a_verbs_device_without_its_port_is_named():
    assert kvcost.portless_verbs_devices("mlx5_0,mlx5_1:1,eth0,bnxt_re2") == ["mlx5_0", "bnxt_re2"]
    assert kvcost.portless_verbs_devices(None) == [] and kvcost.portless_verbs_devices("mlx5_0:1") == []
