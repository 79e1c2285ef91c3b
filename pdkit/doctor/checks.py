"""Doctor's checks: pure functions, observations (pdkit.doctor.model) in, `CheckResult` rows out; no I/O.
`evaluate` runs every check that applies to each engine, router and the cluster, in table order."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from pdkit.doctor.model import (
    FAIL,
    PASS,
    WARN,
    BenchPoint,
    CheckResult,
    EngineObservation,
    EnginePlan,
    KvBench,
    RouterObservation,
    Status,
    WorkerOutcomes,
)
from pdkit.exporter.drift import compare_server_info, describe, flag_key
from pdkit.kvcost import (
    KV_PATHS,
    KV_RATE_MIN_MB,
    KV_TTFT_SHARE_WARN,
    KvFigures,
    kv_figures,
    kv_floor,
    rate_judged,
)

# Share of decode passes that must run as a CUDA graph before "graphs are used" is a PASS. SGLang
# runs a batch above the largest captured size without a graph, so a few such passes are normal.
GRAPH_RATIO_PASS = 0.9
# An uncapped context above this many tokens is flagged: the seeds' 1M context made the indexer
# scan 1M tokens per step; 128k is the largest window a seed needed.
UNCAPPED_CONTEXT_WARN = 131072
# A queue must grow by at least this many requests within the window to count as growing.
QUEUE_GROWTH_MIN = 4
DEFAULT_TOLERANCE = 0.10


# ------------------------------------------------------------------------------------------------
# Helpers over observations


def _result(plan: EnginePlan, check: str, status: Status, reason: str, hint: str = "") -> CheckResult:
    return CheckResult(plan.host, plan.target, check, status, reason, hint if status != PASS else "")


def _not_measured(plan: EnginePlan, check: str, why: str) -> CheckResult:
    return _result(plan, check, WARN, f"not measured: {why}",
                   f"make {plan.url} reachable from this machine (is pdkit-engine-{plan.engine} running on {plan.host}?) and re-run")


def _down(obs: EngineObservation) -> bool:
    """Neither /server_info nor /metrics answered (a rank above 0, which serves no HTTP: its host's
    exporter finds no process for it): every check of this engine follows from `reachable`
    (`rank_process`)."""
    if obs.plan.rank > 0:
        return obs.exporter is not None and obs.exporter.rank_up == 0
    return obs.server_info is None and obs.second.figures is None


def _unreachable(plan: EnginePlan, check: str) -> CheckResult:
    if plan.rank > 0:
        return _result(plan, check, WARN, "not measured: the rank has no running process (see rank_process)", "follows from rank_process")
    return _result(plan, check, WARN, "not measured: the engine did not answer (see reachable)", "follows from reachable")


def counter_delta(first: float | None, second: float | None) -> float | None:
    """Increase of a cumulative counter between two samples; after a restart (it went back) the new total."""
    if second is None:
        return None
    if first is None or second < first:
        return second
    return second - first


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


# ------------------------------------------------------------------------------------------------
# Checks (pure)


def check_reachable(obs: EngineObservation) -> CheckResult:
    plan = obs.plan
    errors = [f"/server_info: {obs.server_info_error}"] if obs.server_info_error else []
    if obs.second.error:
        errors.append(f"/metrics: {obs.second.error}")
    if not errors:
        return _result(plan, "reachable", PASS, f"{plan.url} answered /server_info and /metrics")
    if obs.server_info is None and obs.second.figures is None:
        return _result(plan, "reachable", FAIL, f"{plan.url} did not answer: {'; '.join(errors)}",
                       f"on {plan.host}: systemctl status pdkit-engine-{plan.engine}; journalctl -u pdkit-engine-{plan.engine} -n 50")
    return _result(plan, "reachable", WARN, f"{plan.url} answered only in part: {'; '.join(errors)}",
                   "/metrics needs tuning.enable_metrics (on by default); re-run if the engine was restarting")


def check_rank_process(obs: EngineObservation) -> CheckResult:
    """A rank above 0 of an engine spanning nodes runs: its unit has a process (pdkit-exporter on its
    host, `pdkit_engine_rank_up`). It serves no HTTP (SGLang runs the HTTP server on rank 0), so
    this, not `reachable`, says whether it is up."""
    plan = obs.plan
    name = "rank_process"
    of = f"rank {plan.rank} of {plan.head}/{plan.engine} ({plan.nnodes} nodes)"
    unit = f"pdkit-engine-{plan.engine}"
    ex = obs.exporter
    if ex is None:
        return _result(plan, name, WARN, f"not measurable: pdkit-exporter on {plan.host} unreadable ({obs.exporter_error})",
                       f"on {plan.host}: systemctl status pdkit-exporter (it watches {of})")
    if ex.rank_up is None:
        return _result(plan, name, WARN, f"pdkit-exporter on {plan.host} does not report {of} (no pdkit_engine_rank_up)",
                       f"re-apply the plan to {plan.host}: its /etc/pdkit/exporter.json names the rank it watches")
    if ex.rank is not None and ex.rank != plan.rank:
        return _result(plan, name, FAIL, f"pdkit-exporter on {plan.host} watches rank {ex.rank} of {plan.engine}, the plan puts rank {plan.rank} there",
                       f"re-apply the plan to {plan.host} (pyinfra INVENTORY deploy/pd.py --limit {plan.host}, or pdkit roll)")
    if ex.rank_up == 0:
        return _result(plan, name, FAIL, f"{of} has no running process on {plan.host}: the engine cannot serve (rank 0 waits for every rank)",
                       f"on {plan.host}: systemctl status {unit}; journalctl -u {unit} -n 50 (a lost rank makes the others exit "
                       "like an NCCL timeout; systemd restarts them and the ranks meet again)")
    return _result(plan, name, PASS, f"{of} runs on {plan.host} (no HTTP on this rank: rank 0 on {plan.head} serves it)")


def check_flags(obs: EngineObservation) -> CheckResult:
    """Running flags equal the plan: /server_info (pdkit.exporter.drift) and the exporter's argv check."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "flags")
    if plan.rank > 0:
        return _rank_flags(obs)
    drifted: dict[str, str] = {}
    unverified: tuple[str, ...] = ()
    if obs.server_info is not None:
        found = compare_server_info(plan.argv, obs.server_info)
        unverified = found.unverified
        for flag in found.drifted:
            drifted[flag] = describe(flag, plan.argv, obs.server_info.get(flag_key(flag)))
    if obs.exporter is not None:
        for flag in obs.exporter.drift_flags:
            drifted.setdefault(flag, f"{flag}: the process argv differs from the deployed plan (pdkit-exporter)")
    if obs.server_info is None and (obs.exporter is None or obs.exporter.flags_drift is None):
        return _not_measured(plan, "flags", f"/server_info unreadable ({obs.server_info_error})")
    if drifted:
        shown = "; ".join(drifted[f] for f in sorted(drifted)[:3]) + (f" (+{len(drifted) - 3} more)" if len(drifted) > 3 else "")
        return _result(plan, "flags", FAIL, f"{len(drifted)} planned flag(s) not in effect: {shown}",
                       f"re-apply the plan to {plan.host} (pyinfra INVENTORY deploy/pd.py --limit {plan.host}, or pdkit roll); "
                       "a flag changed by hand on the host is overwritten by that; an intended change belongs in the inventory")
    checked = len({flag_key(a) for a in plan.argv if a.startswith("--")}) - len(unverified)
    note = f", {len(unverified)} not reported by /server_info ({', '.join(unverified[:3])})" if unverified else ""
    return _result(plan, "flags", PASS, f"{checked} planned flags match the running engine{note}")


def _rank_flags(obs: EngineObservation) -> CheckResult:
    """A rank above 0 has no /server_info: its process argv against its planned argv (pdkit-exporter)."""
    plan = obs.plan
    ex = obs.exporter
    if ex is None or ex.flags_drift is None:
        why = obs.exporter_error if ex is None else "it reports no pdkit_engine_flags_drift"
        return _result(plan, "flags", WARN, f"not measurable: rank {plan.rank} serves no /server_info and pdkit-exporter on {plan.host} "
                       f"does not report its process argv ({why})", f"on {plan.host}: systemctl status pdkit-exporter")
    if ex.drift_flags or ex.flags_drift:
        shown = ", ".join(sorted(ex.drift_flags)[:3]) or "see pdkit_engine_flag_drift_info"
        return _result(plan, "flags", FAIL, f"the process argv of rank {plan.rank} differs from the deployed plan (pdkit-exporter): {shown}",
                       f"re-apply the plan to {plan.host} (pyinfra INVENTORY deploy/pd.py --limit {plan.host}, or pdkit roll; "
                       f"the engine's nodes roll together); every rank must run the same argv but --node-rank")
    checked = len({flag_key(a) for a in plan.argv if a.startswith("--")})
    return _result(plan, "flags", PASS, f"{checked} planned flags match the process argv of rank {plan.rank} (pdkit-exporter; "
                   "this rank serves no /server_info)")


def check_decode_cuda_graphs(obs: EngineObservation) -> CheckResult:
    """Decode CUDA graphs are on and really used: pass counters, else the exporter's ratio / log line."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "decode_cuda_graph")
    name = "decode_cuda_graph"
    info = obs.server_info
    enabled = decode_graphs_enabled(info) if info is not None else None
    spec_hint = (f"the spec turns them off for {plan.host}/{plan.engine}: set tuning.cuda_graph: true (or drop the "
                 "override) and roll it; graphs gave 2.9-5.2x decode throughput on H200 (docs/gpu.md)")
    passes = decode_passes(obs)
    if enabled is False:
        seen = f"; {passes[0]:.0f} of {passes[0] + passes[1]:.0f} decode passes ran as a graph {passes[2]}" if passes else ""
        if not plan.cuda_graph:
            return replace(_result(plan, name, FAIL, f"decode CUDA graphs are off (cuda_graph_backend_decode=disabled), as the spec plans{seen}", spec_hint), as_planned=True)
        return _result(plan, name, FAIL, f"decode CUDA graphs are off in the running engine although the plan has them on{seen}",
                       f"the engine does not run the plan: re-apply it to {plan.host} (pyinfra INVENTORY deploy/pd.py --limit {plan.host}); see the flags check")
    if passes is None:
        # no pass counters (older SGLang): the exporter's ratio, else its last `Decode batch` log line
        ex = obs.exporter
        if ex is not None and ex.decode_graph_ratio is not None:
            ratio, source = ex.decode_graph_ratio, "pdkit-exporter's decode CUDA-graph ratio"
        elif ex is not None and ex.decode_batch_cuda_graph is not None:
            ratio, source = ex.decode_batch_cuda_graph, "the last `Decode batch` log line (cuda graph: True/False)"
        else:
            why = "the engine exports no sglang:cuda_graph_passes_total and pdkit-exporter has no decode log line"
            return _result(plan, name, WARN, f"not measurable: {why}",
                           "send decode traffic and re-run; the exporter reads `Decode batch ... cuda graph:` from the journal (its user needs group systemd-journal)")
        graph, plain, window = ratio, 1.0 - ratio, f"from {source}"
        total_text = f"{ratio:.0%} of decode passes {window}"
    else:
        graph, plain, window = passes
        total_text = f"{graph:.0f} of {graph + plain:.0f} decode passes ran as a CUDA graph {window}"
    total = graph + plain
    if total <= 0:
        return _result(plan, name, WARN, "no decode pass seen since the engine started: cannot prove graphs are used",
                       "send a request through the router (pdkit chat INVENTORY) and re-run; doctor's probe requests did not reach this engine")
    ratio = graph / total
    if not plan.cuda_graph and ratio == 0:
        return replace(_result(plan, name, FAIL, f"decode CUDA graphs unused, as the spec plans: {total_text}", spec_hint), as_planned=True)
    if ratio == 0:
        return _result(plan, name, FAIL, f"decode CUDA graphs enabled but unused: {total_text}",
                       f"graph capture failed or every batch is above the captured size ({largest_decode_bucket(info or {}) or '?'}): "
                       f"read journalctl -u pdkit-engine-{plan.engine} on {plan.host} for the capture; raise tuning.cuda_graph_max_bs")
    if ratio < GRAPH_RATIO_PASS:
        return _result(plan, name, WARN, f"only {total_text}",
                       f"batches above the largest captured size ({largest_decode_bucket(info or {}) or '?'}) run without a graph: "
                       "raise tuning.cuda_graph_max_bs to cover the load")
    return _result(plan, name, PASS, total_text)


def check_graph_buckets(obs: EngineObservation) -> CheckResult:
    """The captured decode batch sizes cover the configured concurrency (target_concurrency / dp)."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "graph_buckets")
    name = "graph_buckets"
    if obs.server_info is None:
        return _not_measured(plan, name, f"/server_info unreadable ({obs.server_info_error})")
    if decode_graphs_enabled(obs.server_info) is False:
        return _result(plan, name, WARN, "no capture buckets: decode CUDA graphs are off (see decode_cuda_graph)",
                       "follows from decode_cuda_graph")
    largest = largest_decode_bucket(obs.server_info)
    if largest is None:
        return _result(plan, name, WARN, "/server_info reports no decode capture size (cuda_graph_max_bs_decode / cuda_graph_bs_decode)",
                       "not measurable on this version; check the engine's `Capture cuda graph bs [...]` log line")
    if plan.required_bs is None:
        return _result(plan, name, WARN, f"captured up to batch {largest}, but the spec sets no target_concurrency to compare with",
                       "set pdkit_cluster.target_concurrency (the load the cluster is tuned for)")
    if largest < plan.required_bs:
        if plan.graph_max_bs is not None and plan.graph_max_bs >= plan.required_bs:
            hint = (f"the plan captures up to {plan.graph_max_bs} but the engine does not run it: re-apply the plan to "
                    f"{plan.host}; if it stays at {largest}, SGLang lowered it (memory, max_running_requests): see its start-up log")
        else:
            hint = (f"set tuning.cuda_graph_max_bs >= {plan.required_bs} for {plan.host}/{plan.engine} "
                    "(mind max_running_requests, which clamps it)")
        return _result(plan, name, FAIL, f"decode graphs captured up to batch {largest}, below the {plan.required_bs} "
                       "concurrent requests per DP rank the spec targets: larger batches run without a graph", hint)
    return _result(plan, name, PASS, f"decode graphs captured up to batch {largest} >= {plan.required_bs} (target concurrency per DP rank)")


def check_context_length(obs: EngineObservation) -> CheckResult:
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "context_length")
    name = "context_length"
    if obs.server_info is None:
        return _not_measured(plan, name, f"/server_info unreadable ({obs.server_info_error})")
    running = obs.server_info.get("context_length")
    if not isinstance(running, int) or isinstance(running, bool):
        return _result(plan, name, WARN, "/server_info reports no context_length", "not measurable on this version")
    if plan.context_length is None:
        if running > UNCAPPED_CONTEXT_WARN:
            return _result(plan, name, WARN, f"not capped by the spec: the engine runs a {running}-token context",
                           "set tuning.context_length to the longest prompt you serve (a 1M context made the seeds' indexer scan 1M tokens per step)")
        return _result(plan, name, PASS, f"not capped by the spec; the engine's context is {running} tokens")
    if running == plan.context_length:
        return _result(plan, name, PASS, f"capped at {running} tokens as planned")
    if running < plan.context_length:
        hint = (f"re-apply the plan to {plan.host} (a hand edit is overwritten); if it stays lower, the model's maximum is: "
                "set tuning.allow_longer_context: true (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1) or lower tuning.context_length")
    else:
        hint = f"the engine does not run the planned --context-length: re-apply the plan to {plan.host}"
    return _result(plan, name, FAIL, f"context length {running}, planned {plan.context_length}", hint)


def check_env(obs: EngineObservation) -> CheckResult:
    """The planned NCCL/UCX/SGLANG environment is in the engine process (the exporter reads /proc/PID/environ)."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "process_env")
    name = "process_env"
    ex = obs.exporter
    if ex is None:
        return _result(plan, name, WARN, f"not measurable: pdkit-exporter on {plan.host} unreadable ({obs.exporter_error})",
                       f"on {plan.host}: systemctl status pdkit-exporter (it reads /proc/<pid>/environ of the engine)")
    if ex.env_check_error == 1 or ex.env_present is None:
        return _result(plan, name, WARN, "pdkit-exporter could not read the engine process's environment",
                       f"is pdkit-engine-{plan.engine} running? the exporter runs as the service user and reads its /proc/<pid>/environ")
    if ex.env_present == 0:
        shown = ", ".join(f"{var} {problem}" for var, problem in sorted(ex.env_mismatch.items())) or "see pdkit_engine_env_mismatch_info"
        return _result(plan, name, FAIL, f"the engine process lacks planned variables: {shown}",
                       f"the unit loads /etc/pdkit/nccl.env, ucx.env and engines/{plan.engine}.env: re-apply the plan to {plan.host} "
                       "and restart the engine (a changed env file takes effect only on restart)")
    names = ", ".join(plan.env_names[:4]) + ("..." if len(plan.env_names) > 4 else "")
    return _result(plan, name, PASS, f"every planned variable is in the process ({len(plan.env_names)}: {names})" if names
                   else "every planned variable is in the process")


def check_versions(group: Sequence[EngineObservation]) -> list[CheckResult]:
    """Prefill and decode of one PD group run the same SGLang version (and, on sglang, the planned one)."""
    running = {id(o): (o.server_info or {}).get("version") for o in group}
    known = {str(v) for v in running.values() if v}
    label = f"PD group {group[0].plan.pd_group!r}" if group[0].plan.pd_group else "engine"
    out = []
    for obs in group:
        plan = obs.plan
        version = running[id(obs)]
        if not version:
            last = f"; last known {obs.exporter.sglang_version} (pdkit-exporter)" if obs.exporter and obs.exporter.sglang_version else ""
            out.append(_result(plan, "version", WARN, f"not measured: /server_info gave no version{last}",
                               "follows from reachable" if _down(obs) else "not reported by this engine"))
        elif len(known) > 1:
            members = ", ".join(f"{o.plan.host}/{o.plan.engine} {running[id(o)] or '?'}" for o in group)
            out.append(_result(plan, "version", FAIL, f"{label} mixes SGLang versions: {members}",
                               "roll the whole group to one version (pdkit_cluster.sglang_version or engines[].sglang_version): "
                               "a mismatched pair fails at the NIXL handshake or corrupts output"))
        elif plan.engine_kind == "sglang" and str(version) != plan.sglang_version:
            out.append(_result(plan, "version", WARN, f"runs SGLang {version}, the spec plans {plan.sglang_version}",
                               f"re-apply the plan to {plan.host} (the wheelhouse installs the pinned version)"))
        else:
            others = f" like the rest of {label}" if len(group) > 1 else ""
            out.append(_result(plan, "version", PASS, f"runs {version}{others}"))
    return out


def check_kv_transfers(obs: EngineObservation, router: WorkerOutcomes | None = None) -> CheckResult:
    """KV hand-offs happen and none failed (sglang:num_{bootstrap,transfer}_failed_reqs_total: absent
    until an engine's first failure, in every pinned release). `router` is not needed for the verdict."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "kv_transfer")
    name = "kv_transfer"
    second = obs.second.figures
    if second is None:
        return _not_measured(plan, name, f"/metrics unreadable ({obs.second.error})")
    failures = second.get("kv_transfer_failures") or {}
    before = (obs.first.figures or {}).get("kv_transfer_failures") or {}
    moved_key = "prompt_tokens" if plan.role == "prefill" else "generation_tokens"
    moved = second.get(moved_key, 0.0)
    # Both pinned releases create these counters on their first increment (pdkit/data/metric_catalogue.json:
    # lazy): a counter not on the page has not counted a failure yet, and one that appears between the two
    # samples is a first failure.
    recent = {stage: counter_delta(before.get(stage), value) or 0.0 for stage, value in failures.items()}
    window = obs.second.at - obs.first.at
    if any(v > 0 for v in recent.values()):
        shown = ", ".join(f"{v:.0f} {stage}" for stage, v in sorted(recent.items()) if v > 0)
        return _result(plan, name, FAIL, f"KV hand-off failures in the last {window:.0f} s: {shown}",
                       "read both engines' journals for NIXL/UCX errors; across nodes set pdkit_node.ucx_net_devices, on one node "
                       "UCX_TLS must keep cuda_ipc; check the pair's versions (version check) and that the prefill's bootstrap port is reachable")
    total = sum(failures.values())
    if total > 0:
        return _result(plan, name, WARN, f"{total:.0f} KV hand-off failure(s) since the engine started, none in the last {window:.0f} s",
                       "past failures: read the journal around them; restart the engine to reset the counters once understood")
    if moved <= 0:
        return _result(plan, name, WARN, "no KV hand-off since the engine started: cannot prove transfers work",
                       "send a request through the router (pdkit chat INVENTORY) and re-run")
    return _result(plan, name, PASS, f"no failures; {moved:.0f} {moved_key.replace('_', ' ')} handed through PD since start")


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
    """A prefill's KV hand-offs: effective rate (bytes moved / time spent moving them: pdkit.kvcost, a ratio of
    sums, not SGLang's mean of per-request ratios) against the floor of the slowest path it may take
    (pdkit.kvcost.KV_PATHS), and the hand-off's share of TTFT against pdkit.kvcost.KV_TTFT_SHARE_WARN.

    The window: doctor's own C=16 bench when it ran one (TTFT: the bench's mean); else the two /metrics
    samples (TTFT: its decodes' own histogram over the same window, else the prefill's); else, no hand-off
    in the window, the totals since the engine started. FAIL when the rate is below the floor and the
    hand-off is more than KV_TTFT_SHARE_WARN of TTFT; WARN when one of the two, or when KV crosses hosts
    over TCP at all (named, with its fix); a sim engine's rate is its knob, so it gets the lowest floor
    (pdkit.kvcost.kv_floor, as the alert)."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "kv_path")
    name = "kv_path"
    if obs.second.figures is None:
        return _not_measured(plan, name, f"/metrics unreadable ({obs.second.error})")
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
            return _result(plan, name, WARN, f"{tcp}; {reason}", f"{tcp_hint}; {hint}")
        return _result(plan, name, WARN, reason, hint)
    p99 = _kv_ms(fig.latency_p99_ms, fig.latency_p99_above_buckets)
    share = (f"{fig.ttft_share:.0%} of TTFT (mean {ttft_ms:.0f} ms, "
             f"{ttft_from})") if fig.ttft_share is not None else "share of TTFT unknown (no TTFT observed)"
    figures_text = (f"{fig.transfers} hand-offs {over}: {fig.mb_per_request or 0:.1f} MB/request, latency mean "
                    f"{_kv_ms(fig.latency_mean_ms)}, p99 {p99}; effective {_kv_gb_s(fig.effective_gb_s)} "
                    f"(SGLang's speed mean {_kv_gb_s(fig.sglang_speed_mean_gb_s)}"
                    f"{'' if rate_judged(fig.mb_per_request) else f'; rate not judged under {KV_RATE_MIN_MB:g} MiB: latency-bound'}"
                    f"); {share}; path {where}{sim_note}")
    # small hand-offs are latency-bound: their rate is not judged, their TTFT share is (pdkit.kvcost)
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
        return _result(plan, name, PASS, figures_text)
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
    return _result(plan, name, status, "; ".join(problems) + ". " + figures_text, "; ".join(hints))


def _queue_depth(figures: dict[str, Any]) -> float:
    return figures.get("queued_requests", 0.0) + sum((figures.get("pd_queues") or {}).values())


def _progress(first: dict[str, Any], second: dict[str, Any]) -> float:
    moved = sum(counter_delta(first.get(k), second.get(k, 0.0)) or 0.0 for k in ("prompt_tokens", "generation_tokens"))
    a, b = first.get("cuda_graph_passes") or {}, second.get("cuda_graph_passes") or {}
    return moved + sum(counter_delta(a.get(k), v) or 0.0 for k, v in b.items())


def check_queues(obs: EngineObservation) -> CheckResult:
    """The waiting and PD queues did not grow between two samples; growing with no progress is stuck."""
    plan = obs.plan
    if _down(obs):
        return _unreachable(plan, "queues")
    name = "queues"
    a, b = obs.first.figures, obs.second.figures
    if a is None or b is None:
        return _not_measured(plan, name, f"/metrics unreadable ({obs.first.error or obs.second.error})")
    before, after = _queue_depth(a), _queue_depth(b)
    window = obs.second.at - obs.first.at
    held = (min(a.get("running_requests", 0.0) + before, b.get("running_requests", 0.0) + after))
    if held > 0 and _progress(a, b) <= 0:
        return _result(plan, name, FAIL, f"wedged: {held:.0f} request(s) running or queued at both samples and no token "
                       f"or forward pass in {window:.0f} s (its HTTP server answers, the scheduler does not step)",
                       f"journalctl -u pdkit-engine-{plan.engine} -n 300 (the last batch line); py-spy dump the scheduler; "
                       f"restart the engine (systemctl restart pdkit-engine-{plan.engine}); alert PdkitEngineWedged")
    if after - before >= QUEUE_GROWTH_MIN:
        if _progress(a, b) <= 0:
            return _result(plan, name, FAIL, f"queued requests {before:.0f} -> {after:.0f} in {window:.0f} s with no token produced: stuck",
                           "a prefill queue waits for its decode partner (bootstrap) or a decode for KV (transfer): check the pair's "
                           "journals; restart the stuck engine (a prefill replaced behind one address stalls its decode)")
        return _result(plan, name, WARN, f"queued requests grew {before:.0f} -> {after:.0f} in {window:.0f} s",
                       "requests arrive faster than this engine drains them: add engines or lower the load; see KV usage and graphs")
    return _result(plan, name, PASS, f"queued requests {before:.0f} -> {after:.0f} over {window:.0f} s")


def check_router_workers(router: RouterObservation) -> CheckResult:
    """The router lists every planned worker, healthy (GET /workers)."""
    name = "router_workers"
    if router.workers is None:
        return CheckResult(router.host, "router", name, FAIL, f"{router.url}/workers did not answer: {router.error}",
                           f"on {router.host}: systemctl status pdkit-router; journalctl -u pdkit-router -n 50")
    wanted = {w.rstrip("/") for w in router.expected_workers}
    missing = sorted(wanted - set(router.workers))
    unhealthy = sorted(w for w in wanted & set(router.workers) if not router.workers[w])
    extra = sorted(set(router.workers) - wanted)
    if missing or unhealthy:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unhealthy {', '.join(unhealthy)}"] if unhealthy else [])
        return CheckResult(router.host, "router", name, FAIL, "; ".join(parts),
                           "fix the engine first (its rows above); the router re-checks a worker every health_check_interval_secs. "
                           "A worker missing from the list: re-apply the plan to the router host (its --prefill/--decode list)")
    note = f"; also lists unplanned {', '.join(extra)}" if extra else ""
    status: Status = WARN if extra else PASS
    return CheckResult(router.host, "router", name, status, f"all {len(wanted)} planned workers registered and healthy{note}",
                       "remove the unplanned worker (DELETE /workers/{id}) or add it to the inventory" if extra else "")


def check_reboot(host: str, pending: float | None, exporter_error: str | None = None) -> CheckResult:
    """A driver installed or changed since the node booted (the driver role's marker, via pdkit-exporter)."""
    name = "reboot_required"
    if pending is None:
        why = exporter_error or "pdkit-exporter does not report pdkit_node_reboot_required"
        return CheckResult(host, "node", name, WARN, f"not measurable: {why}",
                           f"on {host}: systemctl status pdkit-exporter")
    if pending > 0:
        return CheckResult(host, "node", name, WARN,
                           "the NVIDIA driver changed since boot: the loaded kernel module is the old one until a reboot",
                           f"reboot {host} drained: set pdkit_node.reboot: when-drained and `pdkit roll --limit {host}` "
                           "(the kit never reboots a serving node on its own; docs/tuning.md)")
    return CheckResult(host, "node", name, PASS, "no driver change waiting for a reboot")


def check_throughput(host: str, recorded: BenchPoint | None, measured: BenchPoint | None,
                     tolerance: float = DEFAULT_TOLERANCE) -> CheckResult:
    """C=16 output throughput within `tolerance` of the last recorded bench."""
    name = "throughput_c16"
    if recorded is None:
        return CheckResult(host, "cluster", name, WARN, "no bench recorded at C=16",
                           "run `pdkit bench INVENTORY --concurrency 16` once the cluster is right: it records docs/bench/runs.jsonl")
    if measured is None:
        return CheckResult(host, "cluster", name, WARN, f"not measured now (last recorded {recorded.output_tok_s:.0f} tok/s, {recorded.label})",
                           "pass --bench to run a short C=16 bench through the router and compare")
    ratio = measured.output_tok_s / recorded.output_tok_s if recorded.output_tok_s > 0 else math.inf
    text = f"C=16 {measured.output_tok_s:.0f} tok/s vs {recorded.output_tok_s:.0f} recorded ({recorded.label}): {ratio - 1:+.0%}"
    if ratio < 1 - tolerance:
        return CheckResult(host, "cluster", name, FAIL, text,
                           "a lever regressed: see the FAIL rows (decode_cuda_graph, flags, queues) and `pdkit compare` the two runs")
    return CheckResult(host, "cluster", name, PASS, f"{text} (tolerance {tolerance:.0%})")




def mean_between(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Mean of the observations between two (sum, count) readings, None when none were made."""
    if after is None:
        return None
    s0, c0 = before or (0.0, 0.0)
    count = after[1] - c0
    return (after[0] - s0) / count if count > 0 else None


def check_decode_speed(itl: dict[tuple[str, str], float | None], tolerance: float = DEFAULT_TOLERANCE) -> list[CheckResult]:
    """Per decode engine: its decode speed during doctor's own C=16 bench (1 / mean inter-token
    latency, tokens per second per running request, from the engine's own histogram) against the
    median of its peers measured in the same bench.

    Why per engine (issue #18 item 10): the router spreads load, so one slow engine of three
    barely moves the cluster's tok/s (630 against 638 recorded with one engine's graphs off);
    each engine's own latency shows it at once. ITL: (host, engine) -> mean ITL in seconds during
    the bench, None when the engine served no token in it.
    """
    name = "decode_speed_c16"
    speeds = {k: 1.0 / v for k, v in itl.items() if v}
    out = []
    for (host, engine), value in sorted(itl.items()):
        peers = sorted(sp for k, sp in speeds.items() if k != (host, engine))
        if not value:
            out.append(CheckResult(host, engine, name, WARN, "served no decode token during the bench",
                                   "the router sent it nothing: see router_workers and its circuit breaker"))
            continue
        speed = 1.0 / value
        if not peers:
            out.append(CheckResult(host, engine, name, PASS, f"{speed:.0f} tok/s per request during the bench (no peer to compare)"))
            continue
        median = peers[len(peers) // 2] if len(peers) % 2 else (peers[len(peers) // 2 - 1] + peers[len(peers) // 2]) / 2
        ratio = speed / median
        text = f"{speed:.0f} tok/s per request vs its peers' median {median:.0f}: {ratio - 1:+.0%}"
        if ratio < 1 - tolerance:
            out.append(CheckResult(host, engine, name, FAIL, text,
                                   "this engine decodes slower than its peers: see its decode_cuda_graph, flags and queues rows"))
        else:
            out.append(CheckResult(host, engine, name, PASS, f"{text} (tolerance {tolerance:.0%})"))
    return out


ENGINE_CHECKS: tuple[tuple[Callable[..., CheckResult], frozenset[str]], ...] = (
    (check_reachable, frozenset({"prefill", "decode", "unified"})),
    (check_flags, frozenset({"prefill", "decode", "unified"})),
    (check_decode_cuda_graphs, frozenset({"decode", "unified"})),
    (check_graph_buckets, frozenset({"decode", "unified"})),
    (check_context_length, frozenset({"prefill", "decode", "unified"})),
    (check_env, frozenset({"prefill", "decode", "unified"})),
    (check_kv_transfers, frozenset({"prefill", "decode"})),
    (check_kv_path, frozenset({"prefill"})),
    (check_queues, frozenset({"prefill", "decode", "unified"})),
)
# a rank above 0 of an engine spanning nodes: no HTTP, its process only (through its host's exporter)
RANK_CHECKS: tuple[Callable[[EngineObservation], CheckResult], ...] = (check_rank_process, check_flags, check_env)


def evaluate(engines: Sequence[EngineObservation], routers: Sequence[RouterObservation],
             recorded: BenchPoint | None = None, measured: BenchPoint | None = None,
             tolerance: float = DEFAULT_TOLERANCE, cluster_host: str = "",
             reboots: dict[str, tuple[float | None, str | None]] | None = None,
             kv_bench: dict[tuple[str, str], KvBench] | None = None) -> list[CheckResult]:
    """Every check over the collected observations, in table order (host, engine, check). `kv_bench`: each
    prefill's KV histograms around doctor's own bench ((host, engine) -> KvBench), when it ran one."""
    results: list[CheckResult] = []
    versions: dict[int, CheckResult] = {}
    groups: dict[str, list[EngineObservation]] = {}
    for obs in engines:
        if obs.plan.rank > 0:
            continue  # no /server_info: rank 0 says the engine's version
        key = obs.plan.pd_group or f"{obs.plan.host}/{obs.plan.engine}"
        groups.setdefault(key, []).append(obs)
    for members in groups.values():
        for obs, result in zip(members, check_versions(members)):
            versions[id(obs)] = result
    for obs in engines:
        if obs.plan.rank > 0:
            results += [check(obs) for check in RANK_CHECKS]
            continue
        for check, roles in ENGINE_CHECKS:
            if obs.plan.role in roles:
                if check is check_kv_transfers:
                    results.append(check(obs, worker_outcomes(routers, obs.plan.url)))
                elif check is check_kv_path:
                    decodes = [o for o in engines if o.plan.role == "decode" and o.plan.rank == 0]
                    results.append(check(obs, decodes, (kv_bench or {}).get((obs.plan.host, obs.plan.engine))))
                else:
                    results.append(check(obs))
        results.append(versions[id(obs)])
    results += [check_reboot(host, pending, why) for host, (pending, why) in (reboots or {}).items()]
    results += [check_router_workers(r) for r in routers]
    results.append(check_throughput(cluster_host, recorded, measured, tolerance))
    return results


def worker_outcomes(routers: Sequence[RouterObservation], url: str) -> WorkerOutcomes | None:
    """The first router that recorded outcomes for this worker URL at both samples."""
    key = url.rstrip("/")
    for r in routers:
        if r.outcomes_second is not None and key in r.outcomes_second:
            return WorkerOutcomes(r.host, (r.outcomes_first or {}).get(key, {}), r.outcomes_second[key])
    return None
