"""Doctor's KV hand-off checks: transfers happen and none failed (`kv_transfer`), and a prefill's hand-offs
run at the speed of the path they take and cost little of TTFT (`kv_path`, figures from pdkit.spec.kvcost).
Pure: observations in, rows out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pdkit.doctor.checkbase import cannot_measure, counter_delta, engine_row
from pdkit.doctor.model import (
    FAIL,
    PASS,
    WARN,
    CheckResult,
    EngineObservation,
    EnginePlan,
    KvBench,
    Status,
    WorkerOutcomes,
)
from pdkit.spec.kvcost import (
    KV_PATHS,
    KV_RATE_MIN_MB,
    KV_TTFT_SHARE_WARN,
    KvFigures,
    kv_figures,
    kv_floor,
    rate_judged,
)


def check_kv_transfers(obs: EngineObservation, router: WorkerOutcomes | None = None) -> CheckResult:
    """KV hand-offs happen and none failed (sglang:num_{bootstrap,transfer}_failed_reqs_total: absent
    until an engine's first failure, in every pinned release). `router` is not needed for the verdict."""
    plan, name = obs.plan, "kv_transfer"
    if (early := cannot_measure(obs, name, needs="metrics")) is not None:
        return early
    second = obs.second.read_figures()
    failures = second.get("kv_transfer_failures") or {}
    before = (obs.first.figures or {}).get("kv_transfer_failures") or {}
    moved_key = "prompt_tokens" if plan.role == "prefill" else "generation_tokens"
    moved = second.get(moved_key, 0.0)
    # Both pinned releases create these counters on their first increment (pdkit/upstream/data/metric_catalogue.json:
    # lazy): a counter not on the page has not counted a failure yet, and one that appears between the two
    # samples is a first failure.
    recent = {stage: counter_delta(before.get(stage), value) or 0.0 for stage, value in failures.items()}
    window = obs.second.at - obs.first.at
    if any(v > 0 for v in recent.values()):
        shown = ", ".join(f"{v:.0f} {stage}" for stage, v in sorted(recent.items()) if v > 0)
        return engine_row(plan, name, FAIL, f"KV hand-off failures in the last {window:.0f} s: {shown}",
                          "read both engines' journals for NIXL/UCX errors; across "
                          "nodes set pdkit_node.ucx_net_devices, on one node "
                          "UCX_TLS must keep cuda_ipc; check the pair's versions (version "
                          "check) and that the prefill's bootstrap port is reachable")
    total = sum(failures.values())
    if total > 0:
        return engine_row(plan, name, WARN, f"{total:.0f} KV hand-off failure(s) since the "
                                            f"engine started, none in the last {window:.0f} s",
                          "past failures: read the journal around them; restart "
                          "the engine to reset the counters once understood")
    if moved <= 0:
        return engine_row(plan, name, WARN, "no KV hand-off since the engine started: cannot prove transfers work",
                          "send a request through the router (pdkit chat INVENTORY) and re-run")
    return engine_row(plan, name, PASS, f"no failures; {moved:.0f} {moved_key.replace('_', ' ')} "
                                        "handed through PD since start")


def _ttft_mean_ms(pairs: Iterable[tuple[tuple[float, float] | None, tuple[float, float] | None]]) -> float | None:
    """Mean TTFT in ms of the observations between each (before, after) pair of (sum, count) readings of
    sglang:time_to_first_token_seconds (before None: since the engine started), None when none were made."""
    total = count = 0.0
    for before, after in pairs:
        if after is None:
            continue
        s0, c0 = before or (0.0, 0.0)
        if after[1] < c0:  # restarted between the samples
            s0, c0 = 0.0, 0.0
        total += after[0] - s0
        count += after[1] - c0
    return total / count * 1000.0 if count > 0 else None


def _kv_ms(value: float | None, above: bool = False) -> str:
    if value is None:
        return "?"
    return f">{value:.0f} ms" if above else f"{value:.0f} ms"


def _kv_gb_s(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g} GB/s"


def kv_path_text(plan: EnginePlan) -> tuple[str, float | None, list[str]]:
    """(where the prefill's hand-offs go, in words; the effective-GB/s floor they are judged by, the lowest of
    their paths' floors; the decode hosts reached across hosts over TCP)."""
    by_path: dict[str, list[str]] = {}
    for decode_host, name in plan.kv_paths:
        by_path.setdefault(name, []).append(decode_host)
    floor = kv_floor(tuple((d, KV_PATHS[n]) for d, n in plan.kv_paths))
    if not by_path:
        return "no decode planned to pair with it", None, []
    if len(by_path) == 1:
        (name, hosts), = by_path.items()
        where = f"{name} to {', '.join(hosts)} (floor {floor:g} GB/s)"
    else:
        parts = "; ".join(f"{name} to {', '.join(hosts)}" for name, hosts in by_path.items())
        where = f"{parts} (floor {floor:g} GB/s, the slowest path's: the histograms mix them)"
    return where, floor, by_path.get("cross-host-tcp", [])


def check_kv_path(obs: EngineObservation, decodes: Sequence[EngineObservation] = (),
                  bench: KvBench | None = None) -> CheckResult:
    """A prefill's KV hand-offs: effective rate (bytes moved / time spent moving them: pdkit.spec.kvcost, a ratio of
    sums, not SGLang's mean of per-request ratios) against the floor of the slowest path it may take
    (pdkit.spec.kvcost.KV_PATHS), and the hand-off's share of TTFT against pdkit.spec.kvcost.KV_TTFT_SHARE_WARN.

    The window: doctor's own C=16 bench when it ran one (TTFT: the bench's mean); else the two /metrics
    samples (TTFT: its decodes' own histogram over the same window, else the prefill's); else, no hand-off
    in the window, the totals since the engine started. FAIL when the rate is below the floor and the
    hand-off is more than KV_TTFT_SHARE_WARN of TTFT; WARN when one of the two, or when KV crosses hosts
    over TCP at all (named, with its fix); a sim engine's rate is its knob, so it gets the lowest floor
    (pdkit.spec.kvcost.kv_floor, as the alert)."""
    plan, name = obs.plan, "kv_path"
    if (early := cannot_measure(obs, name, needs="metrics")) is not None:
        return early
    where, floor, tcp_hosts = kv_path_text(plan)
    window = obs.second.at - obs.first.at
    after = obs.second.kv or {}
    fig: KvFigures | None = None
    if bench is not None:
        ttft_ms = bench.ttft_mean_ms
        fig = kv_figures(bench.before, bench.after, ttft_ms)
        over, ttft_from = "during doctor's C=16 bench", "the bench's mean"
    if fig is None or fig.transfers == 0:
        partners = [d for d in decodes if f"{d.plan.host}/{d.plan.engine}" in plan.kv_decodes]
        if obs.first.kv is not None:
            ttft_ms = _ttft_mean_ms((d.first.ttft, d.second.ttft) for d in partners)
            ttft_from = "its decodes' TTFT histograms over the same window"
            if ttft_ms is None:
                ttft_ms, ttft_from = _ttft_mean_ms([(obs.first.ttft, obs.second.ttft)]), "its own TTFT histogram"
            fig = kv_figures(obs.first.kv, after, ttft_ms)
            over = f"in the last {window:.0f} s"
        if fig is None or fig.transfers == 0:
            ttft_ms = _ttft_mean_ms((None, d.second.ttft) for d in partners)
            ttft_from = "its decodes' TTFT histograms since they started"
            if ttft_ms is None:
                ttft_ms, ttft_from = _ttft_mean_ms([(None, obs.second.ttft)]), "its own TTFT histogram since start"
            fig = kv_figures({}, after, ttft_ms)
            over = (f"since the engine started (none in the last {window:.0f} s)" if obs.first.kv is not None
                    else "since the engine started")
    devices = f"ucx_net_devices {plan.ucx_net_devices!r} is not an RDMA device" if plan.ucx_net_devices \
        else "ucx_net_devices is unset"
    tcp = (f"KV crosses hosts over TCP ({devices}) to {', '.join(tcp_hosts)}: every byte is staged "
           "GPU -> host -> socket -> host -> GPU") if tcp_hosts else ""
    tcp_hint = (f"set pdkit_node.ucx_net_devices on {plan.host} to its RDMA NIC (e.g. 'mlx5_0:1') if the hosts have "
                "one; else a larger tuning.page_size (fewer, larger transfers), or keep PD pairs on one host "
                "(a pd_group per host and a router per node: pdkit_router.workers)")
    sim = plan.engine_kind == "sim"
    sim_note = ""
    if sim and floor is not None:
        floor = kv_floor(tuple((d, KV_PATHS[n]) for d, n in plan.kv_paths), sim=True)
        sim_note = (f"; sim engine: its KV rate is its kv_transfer_gb_s knob, not a transport, so it is judged by "
                    f"the lowest floor, {floor:g} GB/s")
    if fig.transfers == 0:
        reason = f"no KV hand-off since the engine started: cannot measure the path ({where})"
        hint = "send a request through the router (pdkit chat INVENTORY) and re-run"
        if tcp:
            return engine_row(plan, name, WARN, f"{tcp}; {reason}", f"{tcp_hint}; {hint}")
        return engine_row(plan, name, WARN, reason, hint)
    p99 = _kv_ms(fig.latency_p99_ms, fig.latency_p99_above_buckets)
    share = (f"{fig.ttft_share:.0%} of TTFT (mean {ttft_ms:.0f} ms, "
             f"{ttft_from})") if fig.ttft_share is not None else "share of TTFT unknown (no TTFT observed)"
    not_judged = ("" if rate_judged(fig.mb_per_request)
                  else f"; rate not judged under {KV_RATE_MIN_MB:g} MiB: latency-bound")
    figures_text = (f"{fig.transfers} hand-offs {over}: {fig.mb_per_request or 0:.1f} MB/request, latency mean "
                    f"{_kv_ms(fig.latency_mean_ms)}, p99 {p99}; effective {_kv_gb_s(fig.effective_gb_s)} "
                    f"(SGLang's speed mean {_kv_gb_s(fig.sglang_speed_mean_gb_s)}"
                    f"{not_judged}"
                    f"); {share}; path {where}{sim_note}")
    # small hand-offs are latency-bound: their rate is not judged, their TTFT share is (pdkit.spec.kvcost)
    slow = (floor is not None and fig.effective_gb_s is not None and fig.effective_gb_s < floor
            and rate_judged(fig.mb_per_request))
    heavy = fig.ttft_share is not None and fig.ttft_share > KV_TTFT_SHARE_WARN
    problems = []
    if slow:
        problems.append(f"effective {_kv_gb_s(fig.effective_gb_s)} is below the path's floor {floor:g} GB/s")
    if heavy:
        problems.append(f"the hand-off is {fig.ttft_share:.0%} of TTFT (above {KV_TTFT_SHARE_WARN:.0%})")
    if tcp:
        problems.insert(0, tcp)
    if not problems:
        return engine_row(plan, name, PASS, figures_text)
    hints = [tcp_hint] if tcp else []
    names = {n for _, n in plan.kv_paths}
    if slow and not tcp and "same-host" in names:
        hints.append("on one host UCX must keep cuda_ipc (UCX_TLS; UCX_PROTO_INFO=y in the engine's environment "
                     "logs the lane UCX picked)")
    if slow and not tcp and "cross-host-rdma" in names:
        hints.append(f"across hosts check that ucx_net_devices ({plan.ucx_net_devices}) names the NIC nearest the "
                     "GPUs and that its link is up (ibstat); UCX_PROTO_INFO=y logs the lane UCX picked")
    if heavy:
        hints.append("hand-offs queue behind each other (the prefill's inflight queue, PD dashboard): fewer, "
                     "larger transfers (tuning.page_size) or more prefill/decode pairs")
    status: Status = FAIL if slow and heavy else WARN
    return engine_row(plan, name, status, "; ".join(problems) + ". " + figures_text, "; ".join(hints))
