"""/metrics text -> figures, on text captured from the sim and on hand-written SGLang text."""

from __future__ import annotations

import re

import pytest

from pdkit.agent.exporter.metrics import decode_cuda_graph_ratio, parse_metrics, wanted_text

from .support import data_text


def rank0(text: str, name: str, **labels: str) -> float:
    """The value of one series, read with a regex (independently of prometheus_client's parser)."""
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"{name} {labels} not in the text")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sim_metrics_text(role):
    text = data_text(f"sim_{role}_metrics.txt")
    got = parse_metrics(text)
    assert got["running_requests"] == rank0(text, "sglang:num_running_reqs", tp_rank="0")
    assert got["queued_requests"] == rank0(text, "sglang:num_queue_reqs", tp_rank="0")
    assert got["prompt_tokens"] == rank0(text, "sglang:prompt_tokens_total") > 0
    assert got["generation_tokens"] == rank0(text, "sglang:generation_tokens_total") > 0
    assert got["gen_throughput"] == rank0(text, "sglang:gen_throughput", tp_rank="0")
    assert got["pd_queues"] == {
        "bootstrap": rank0(text, "sglang:num_prefill_bootstrap_queue_reqs", tp_rank="0"),
        "inflight": rank0(text, "sglang:num_prefill_inflight_queue_reqs", tp_rank="0"),
        "prealloc": rank0(text, "sglang:num_decode_prealloc_queue_reqs", tp_rank="0"),
        "transfer": rank0(text, "sglang:num_decode_transfer_queue_reqs", tp_rank="0"),
    }
    assert got["kv_transfer_failures"] == {
        "bootstrap": rank0(text, "sglang:num_bootstrap_failed_reqs_total", tp_rank="0"),
        "transfer": rank0(text, "sglang:num_transfer_failed_reqs_total", tp_rank="0"),
    }
    # the capture runs TP 2: one pass series per rank, and the figure is one rank's, not the sum
    for mode in ("decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none"):
        r0 = rank0(text, "sglang:cuda_graph_passes_total", mode=mode, tp_rank="0")
        assert rank0(text, "sglang:cuda_graph_passes_total", mode=mode, tp_rank="1") == r0
        assert got["cuda_graph_passes"][mode] == r0


def test_sim_decode_ratio_and_prefill_has_none():
    decode = parse_metrics(data_text("sim_decode_metrics.txt"))["cuda_graph_passes"]
    g, n = decode["decode_cuda_graph"], decode["decode_none"]
    assert g + n > 0
    assert decode_cuda_graph_ratio(decode) == pytest.approx(g / (g + n))
    prefill = parse_metrics(data_text("sim_prefill_metrics.txt"))["cuda_graph_passes"]
    assert prefill["decode_cuda_graph"] == prefill["decode_none"] == 0
    assert decode_cuda_graph_ratio(prefill) is None
    assert decode_cuda_graph_ratio({}) is None


# SGLang's shape with TP 4 x DP 2: per-rank duplicates (max) and data-parallel ranks (sum),
# the newer "prealloc" name of the prefill bootstrap queue, and histograms that are not wanted.
SGLANG_TP4_DP2 = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="0",engine_type="prefill",model_name="m",pp_rank="0",tp_rank="1"} 3.0
sglang:num_running_reqs{dp_rank="1",engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 5.0
sglang:num_running_reqs{dp_rank="1",engine_type="prefill",model_name="m",pp_rank="0",tp_rank="1"} 5.0
# HELP sglang:num_prefill_prealloc_queue_reqs The number of requests in the prefill prealloc queue.
# TYPE sglang:num_prefill_prealloc_queue_reqs gauge
sglang:num_prefill_prealloc_queue_reqs{dp_rank="0",engine_type="prefill",model_name="m",tp_rank="0"} 7.0
sglang:num_prefill_prealloc_queue_reqs{dp_rank="1",engine_type="prefill",model_name="m",tp_rank="0"} 1.0
# HELP sglang:num_transfer_failed_reqs_total The number of transfer failed requests.
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{dp_rank="0",engine_type="prefill",model_name="m",tp_rank="0"} 2.0
sglang:num_transfer_failed_reqs_total{dp_rank="1",engine_type="prefill",model_name="m",tp_rank="0"} NaN
# HELP sglang:cuda_graph_passes_total Total number of forward passes categorized by CUDA graph.
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{mode="prefill_cuda_graph",tp_rank="0"} 90.0
sglang:cuda_graph_passes_total{mode="prefill_cuda_graph",tp_rank="1"} 90.0
sglang:cuda_graph_passes_total{mode="prefill_cuda_graph",tp_rank="2"} 90.0
sglang:cuda_graph_passes_total{mode="prefill_cuda_graph",tp_rank="3"} 89.0
sglang:cuda_graph_passes_total{mode="prefill_none",tp_rank="0"} 10.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 2.0
sglang:time_to_first_token_seconds_count{model_name="m"} 2.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 0.3
"""


def test_replicas_collapse_and_dp_ranks_add():
    got = parse_metrics(SGLANG_TP4_DP2)
    assert got["running_requests"] == 3 + 5
    # no pinned release exports a "prealloc" name for the prefill bootstrap queue (the catalogue): ignored
    assert got["pd_queues"] == {}
    assert got["kv_transfer_failures"] == {"transfer": 2}  # NaN skipped
    assert got["cuda_graph_passes"] == {"prefill_cuda_graph": 90, "prefill_none": 10}
    assert decode_cuda_graph_ratio(got["cuda_graph_passes"]) is None
    assert "queued_requests" not in got and "prompt_tokens" not in got


def test_the_bootstrap_queue_is_read_under_sglangs_name():
    text = (
        'sglang:num_prefill_bootstrap_queue_reqs{tp_rank="0"} 4\n'
        'sglang:num_prefill_prealloc_queue_reqs{tp_rank="0"} 9\n'
    )
    assert parse_metrics(text)["pd_queues"] == {"bootstrap": 4}


def test_only_wanted_families_reach_the_parser():
    kept = wanted_text(data_text("sim_decode_metrics.txt"))
    assert "time_to_first_token" not in kept and "_created" not in kept and "_bucket" not in kept
    assert "sglang:cuda_graph_passes_total{" in kept and "sglang:num_running_reqs{" in kept and "# " not in kept


def test_empty_page_and_garbage():
    assert parse_metrics("") == {"pd_queues": {}, "kv_transfer_failures": {}, "cuda_graph_passes": {}}
    with pytest.raises(ValueError):
        parse_metrics('sglang:num_running_reqs{tp_rank="0"} not-a-number\n')
