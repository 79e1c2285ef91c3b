"""Doctor's CUDA-graph checks: decode graphs are on and really used, and their captured batch sizes cover
the load the spec targets. Pure: observations in, rows out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pdkit.doctor.checkbase import cannot_measure, counter_delta, engine_row
from pdkit.doctor.model import FAIL, PASS, WARN, CheckResult, EngineObservation

# Share of decode passes that must run as a CUDA graph before "graphs are used" is a PASS. SGLang
# runs a batch above the largest captured size without a graph, so a few such passes are normal.
GRAPH_RATIO_PASS = 0.9


def decode_graphs_enabled(server_info: dict[str, Any]) -> bool | None:
    """Whether /server_info says decode CUDA graphs are on (None when it does not say)."""
    backend = server_info.get("cuda_graph_backend_decode")
    if isinstance(backend, str):
        return backend != "disabled"
    disabled = server_info.get("disable_cuda_graph")
    if isinstance(disabled, bool):
        return not disabled
    return None


def largest_decode_bucket(server_info: dict[str, Any]) -> int | None:
    """The largest decode batch captured as a graph, from /server_info (per-phase names, then the old ones)."""
    for key in ("cuda_graph_bs_decode", "cuda_graph_bs"):
        buckets = server_info.get(key)
        if isinstance(buckets, list) and buckets and all(isinstance(b, int) for b in buckets):
            return max(buckets)
    for key in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        value = server_info.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def decode_passes(obs: EngineObservation) -> tuple[float, float, str] | None:
    """(graph passes, passes without a graph, over what) for decode: in the window when it saw any,
    else since the engine started. None when the engine exports no pass counters."""
    second = obs.second.figures
    if second is None or not second.get("cuda_graph_passes"):
        return None
    now = second["cuda_graph_passes"]
    before = (obs.first.figures or {}).get("cuda_graph_passes") or {}
    graph = counter_delta(before.get("decode_cuda_graph"), now.get("decode_cuda_graph", 0.0)) or 0.0
    plain = counter_delta(before.get("decode_none"), now.get("decode_none", 0.0)) or 0.0
    if graph + plain > 0 and before:
        return graph, plain, f"in the last {obs.second.at - obs.first.at:.0f} s"
    return now.get("decode_cuda_graph", 0.0), now.get("decode_none", 0.0), "since the engine started"


def check_decode_cuda_graphs(obs: EngineObservation) -> CheckResult:
    """Decode CUDA graphs are on and really used: pass counters, else the exporter's ratio / log line."""
    plan, name = obs.plan, "decode_cuda_graph"
    if (early := cannot_measure(obs, name)) is not None:
        return early
    info = obs.server_info
    enabled = decode_graphs_enabled(info) if info is not None else None
    spec_hint = (f"the spec turns them off for {plan.host}/{plan.engine}: set tuning.cuda_graph: true (or drop the "
                 "override) and roll it; graphs gave 2.9-5.2x decode throughput on H200 (docs/gpu.md)")
    passes = decode_passes(obs)
    if enabled is False:
        seen = (f"; {passes[0]:.0f} of {passes[0] + passes[1]:.0f} decode passes ran as a graph {passes[2]}"
                if passes else "")
        if not plan.cuda_graph:
            return replace(engine_row(plan, name, FAIL, "decode CUDA graphs are off "
                                                        "(cuda_graph_backend_decode=disabled), "
                                                        f"as the spec plans{seen}", spec_hint), as_planned=True)
        return engine_row(plan, name, FAIL, "decode CUDA graphs are off in the running "
                                            f"engine although the plan has them on{seen}",
                          f"the engine does not run the plan: re-apply it to {plan.host} (pyinfra "
                          f"INVENTORY deploy/pd.py --limit {plan.host}); see the flags check")
    if passes is None:
        # no pass counters (older SGLang): the exporter's ratio, else its last `Decode batch` log line
        ex = obs.exporter
        if ex is not None and ex.decode_graph_ratio is not None:
            ratio, source = ex.decode_graph_ratio, "pdkit-exporter's decode CUDA-graph ratio"
        elif ex is not None and ex.decode_batch_cuda_graph is not None:
            ratio, source = ex.decode_batch_cuda_graph, "the last `Decode batch` log line (cuda graph: True/False)"
        else:
            why = "the engine exports no sglang:cuda_graph_passes_total and pdkit-exporter has no decode log line"
            return engine_row(plan, name, WARN, f"not measurable: {why}",
                              "send decode traffic and re-run; the exporter reads `Decode batch ... "
                              "cuda graph:` from the journal (its user needs group systemd-journal)")
        graph, plain, window = ratio, 1.0 - ratio, f"from {source}"
        total_text = f"{ratio:.0%} of decode passes {window}"
    else:
        graph, plain, window = passes
        total_text = f"{graph:.0f} of {graph + plain:.0f} decode passes ran as a CUDA graph {window}"
    total = graph + plain
    if total <= 0:
        return engine_row(plan, name, WARN, "no decode pass seen since the engine "
                                            "started: cannot prove graphs are used",
                          "send a request through the router (pdkit chat INVENTORY) "
                          "and re-run; doctor's probe requests did not reach this engine")
    ratio = graph / total
    if not plan.cuda_graph and ratio == 0:
        return replace(engine_row(plan, name, FAIL, f"decode CUDA graphs unused, as the spec plans: {total_text}",
                                  spec_hint), as_planned=True)
    if ratio == 0:
        return engine_row(plan, name, FAIL, f"decode CUDA graphs enabled but unused: {total_text}",
                          "graph capture failed or every batch is above the captured "
                          f"size ({largest_decode_bucket(info or {}) or '?'}): "
                          f"read journalctl -u pdkit-engine-{plan.engine} on "
                          f"{plan.host} for the capture; raise tuning.cuda_graph_max_bs")
    if ratio < GRAPH_RATIO_PASS:
        return engine_row(plan, name, WARN, f"only {total_text}",
                          "batches above the largest captured size "
                          f"({largest_decode_bucket(info or {}) or '?'}) run without a graph: "
                          "raise tuning.cuda_graph_max_bs to cover the load")
    return engine_row(plan, name, PASS, total_text)


def check_graph_buckets(obs: EngineObservation) -> CheckResult:
    """The captured decode batch sizes cover the configured concurrency (target_concurrency / dp)."""
    plan, name = obs.plan, "graph_buckets"
    if (early := cannot_measure(obs, name, needs="server_info")) is not None:
        return early
    info = obs.read_server_info()
    if decode_graphs_enabled(info) is False:
        return engine_row(plan, name, WARN, "no capture buckets: decode CUDA graphs are off (see decode_cuda_graph)",
                          "follows from decode_cuda_graph")
    largest = largest_decode_bucket(info)
    if largest is None:
        return engine_row(plan, name, WARN, "/server_info reports no decode capture size "
                                            "(cuda_graph_max_bs_decode / cuda_graph_bs_decode)",
                          "not measurable on this version; check the engine's `Capture cuda graph bs [...]` log line")
    if plan.required_bs is None:
        return engine_row(plan, name, WARN, f"captured up to batch {largest}, but the spec "
                                            "sets no target_concurrency to compare with",
                          "set pdkit_cluster.target_concurrency (the load the cluster is tuned for)")
    if largest < plan.required_bs:
        if plan.graph_max_bs is not None and plan.graph_max_bs >= plan.required_bs:
            hint = (f"the plan captures up to {plan.graph_max_bs} but the engine does not run it: re-apply the plan to "
                    f"{plan.host}; if it stays at {largest}, SGLang lowered "
                    "it (memory, max_running_requests): see its start-up log")
        else:
            hint = (f"set tuning.cuda_graph_max_bs >= {plan.required_bs} for {plan.host}/{plan.engine} "
                    "(mind max_running_requests, which clamps it)")
        return engine_row(plan, name, FAIL, "decode graphs captured up to batch "
                                            f"{largest}, below the {plan.required_bs} "
                          "concurrent requests per DP rank the spec targets: larger batches run without a graph", hint)
    return engine_row(plan, name, PASS, f"decode graphs captured up to batch {largest} >= "
                                        f"{plan.required_bs} (target concurrency per DP rank)")
