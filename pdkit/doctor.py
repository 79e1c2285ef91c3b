"""`pdkit doctor INVENTORY [--json]`: is the running cluster the cluster the spec plans, and do its
levers really work?

Live checks per engine (and per router), each PASS / WARN / FAIL with a one-line reason and a fix
hint (docs/doctor.md). Two halves, kept apart so the checks can be tested on captured pages:

- collection (`collect`): HTTP GETs with timeouts from the control machine: each engine's
  /server_info and /metrics (twice, `window_s` apart, with a few probe requests through the
  router in between so that decode passes and KV hand-offs happen inside the window), each GPU
  node's pdkit-exporter /metrics (environment of the engine process, argv drift, log-line
  CUDA-graph flags), each router's GET /workers; optionally a short C=16 bench (pdkit.bench).
- checks: small pure functions, observations in, `CheckResult` out.

A WARN says "could not prove it" (not measurable on this version, no traffic yet, exporter down);
a FAIL says "it is wrong"; the exit code is 1 when anything FAILs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pdkit.exporter.drift import compare_server_info, describe, flag_key
from pdkit.exporter.metrics import parse_metrics
from pdkit.kvcost import (
    KV_PATHS,
    KV_RATE_MIN_MB,
    KV_TTFT_SHARE_WARN,
    Histogram,
    KvFigures,
    kv_figures,
    kv_floor,
    kv_histograms,
    rate_judged,
)
from pdkit.metricnames import ROUTER, SGLANG

Status = Literal["PASS", "WARN", "FAIL"]
PASS: Status = "PASS"
WARN: Status = "WARN"
FAIL: Status = "FAIL"

EXIT_FAIL = 1
EXIT_INVALID = 2

# Share of decode passes that must run as a CUDA graph before "graphs are used" is a PASS. SGLang
# runs a batch above the largest captured size without a graph, so a few such passes are normal.
GRAPH_RATIO_PASS = 0.9
# An uncapped context above this many tokens is flagged: the seeds' 1M context made the indexer
# scan 1M tokens per step; 128k is the largest window a seed needed.
UNCAPPED_CONTEXT_WARN = 131072
# A queue must grow by at least this many requests within the window to count as growing.
QUEUE_GROWTH_MIN = 4
DEFAULT_TOLERANCE = 0.10
BENCH_CONCURRENCY = 16
DEFAULT_RUNS_PATH = Path("docs/bench/runs.jsonl")


@dataclass(frozen=True)
class CheckResult:
    """One verdict: which host and target (an engine, `router` or `cluster`), which check, why, how to fix."""

    host: str
    target: str
    check: str
    status: Status
    reason: str
    hint: str = ""
    # the FAIL reports what the spec itself plans (e.g. decode graphs off by tuning): the engine
    # runs as written, the spec is what to change; `pdkit tune` counts such a lever as in effect
    as_planned: bool = False

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# Observations (what collection hands to the checks)


@dataclass(frozen=True)
class EnginePlan:
    """What the spec says one engine should be running."""

    host: str
    engine: str
    role: str
    url: str
    pd_group: str | None  # None for unified engines
    argv: tuple[str, ...]
    sglang_version: str
    engine_kind: str  # sglang | sim
    context_length: int | None
    cuda_graph: bool  # decode CUDA graphs planned on (False for prefill engines)
    graph_max_bs: int | None  # spec.effective_decode_graph_max_bs
    required_bs: int | None  # pdkit.spec.decode_graph_required_bs: ceil(target_concurrency / DP ranks), None without a target
    env_names: tuple[str, ...] = ()  # planned NCCL/UCX/SGLANG variables of the process
    # an engine spanning nodes: the rank this plan is (on `host`), of how many nodes, and rank 0's
    # host. Only rank 0 serves HTTP (`url` is rank 0's); a rank above 0 is read through its own
    # host's pdkit-exporter (the process' argv and environment) and never counts as down for
    # lacking HTTP.
    rank: int = 0
    nnodes: int = 1
    head: str = ""
    # a prefill: the KV path to each host holding a decode it may hand KV to ((decode host, pdkit.kvcost.KV_PATHS
    # name), pdkit.spec.prefill_kv_paths), those decodes (`host/engine`, pdkit.spec.pairing_sets)
    # and its node's ucx_net_devices
    kv_paths: tuple[tuple[str, str], ...] = ()
    kv_decodes: tuple[str, ...] = ()
    ucx_net_devices: str | None = None

    @property
    def target(self) -> str:
        """The engine as the table names it: `decode`, or `decode rank 1` for a rank above 0."""
        return self.engine if self.rank == 0 else f"{self.engine} rank {self.rank}"


@dataclass
class Sample:
    """One GET of an engine's /metrics: parse_metrics' figures, or why there are none."""

    at: float = 0.0
    figures: dict[str, Any] | None = None
    error: str | None = None
    # the KV hand-off histograms (pdkit.kvcost.kv_histograms: a prefill's; empty before its first hand-off)
    # and (sum, count) of sglang:time_to_first_token_seconds, None where the page has none
    kv: dict[str, Histogram] | None = None
    ttft: tuple[float, float] | None = None


@dataclass
class ExporterView:
    """What the node's pdkit-exporter said about one engine (None fields: series absent)."""

    env_present: float | None = None
    env_check_error: float | None = None
    env_mismatch: dict[str, str] = field(default_factory=dict)  # var -> problem
    flags_drift: float | None = None
    drift_flags: tuple[str, ...] = ()
    decode_graph_ratio: float | None = None
    decode_batch_cuda_graph: float | None = None  # the last `Decode batch` log line
    sglang_version: str | None = None
    rank_up: float | None = None  # pdkit_engine_rank_up: an engine spanning nodes, the rank this node runs
    rank: int | None = None  # which rank that is


@dataclass
class EngineObservation:
    plan: EnginePlan
    server_info: dict[str, Any] | None = None
    server_info_error: str | None = None
    first: Sample = field(default_factory=Sample)
    second: Sample = field(default_factory=Sample)
    exporter: ExporterView | None = None
    exporter_error: str | None = None  # why the exporter page could not be read


@dataclass
class RouterObservation:
    host: str
    url: str
    expected_workers: tuple[str, ...]
    workers: dict[str, bool] | None = None  # url -> healthy
    error: str | None = None
    # smg_worker_cb_outcomes_total at both samples: worker url -> {"success": n, "failure": n}
    outcomes_first: dict[str, dict[str, float]] | None = None
    outcomes_second: dict[str, dict[str, float]] | None = None


@dataclass(frozen=True)
class WorkerOutcomes:
    """What one router recorded for one worker's requests (its circuit breaker), at both samples."""

    router: str
    first: dict[str, float]
    second: dict[str, float]


@dataclass(frozen=True)
class BenchPoint:
    """Output tokens per second at C=16, and the run it comes from (a fresh bench repeats its lengths)."""

    output_tok_s: float
    label: str  # the run's id, or "now"
    input_len: int = 512
    output_len: int = 128
    requests: int = 64
    ttft_mean_ms: float | None = None  # the C=16 level's client-side TTFT mean (a fresh bench)


@dataclass(frozen=True)
class KvBench:
    """One prefill's KV histograms before and after doctor's own C=16 bench, and the bench's TTFT mean."""

    before: dict[str, Histogram]
    after: dict[str, Histogram]
    ttft_mean_ms: float | None


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


def histogram_mean(text: str, name: str) -> tuple[float, float] | None:
    """Pure: (sum, count) of histogram NAME summed over its children in one /metrics page, None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    total, count, seen = 0.0, 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += sample.value
                seen = True
            elif sample.name == f"{name}_count":
                count += sample.value
    return (total, count) if seen else None


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


# ------------------------------------------------------------------------------------------------
# Exporter and router pages


def router_outcomes(text: str) -> dict[str, dict[str, float]]:
    """A router's /metrics text -> {worker url: {outcome: requests}} (smg_worker_cb_outcomes_total)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = "\n".join(line for line in text.splitlines() if line.startswith(ROUTER["worker_outcomes"])) + "\n"
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(wanted):
        for s in family.samples:
            worker, outcome = s.labels.get("worker"), s.labels.get("outcome")
            if worker and outcome:
                slot = out.setdefault(worker.rstrip("/"), {})
                slot[outcome] = slot.get(outcome, 0.0) + s.value
    return out


def reboot_pending(text: str) -> float | None:
    """pdkit_node_reboot_required from a pdkit-exporter page (None: the exporter does not report it)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = "\n".join(l for l in text.splitlines() if l.startswith(("pdkit_node_reboot_required", "# TYPE pdkit_node_reboot_required"))) + "\n"
    for family in text_string_to_metric_families(wanted):
        for s in family.samples:
            return s.value
    return None


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


def exporter_views(text: str) -> dict[str, ExporterView]:
    """pdkit-exporter's /metrics text -> {engine name: ExporterView}."""
    from prometheus_client.parser import text_string_to_metric_families

    views: dict[str, ExporterView] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            engine = s.labels.get("engine")
            if engine is None:
                continue
            view = views.setdefault(engine, ExporterView())
            if s.name == "pdkit_engine_env_present":
                view.env_present = s.value
            elif s.name == "pdkit_engine_env_check_error":
                view.env_check_error = s.value
            elif s.name == "pdkit_engine_env_mismatch_info":
                view.env_mismatch[s.labels.get("var", "?")] = s.labels.get("problem", "?")
            elif s.name == "pdkit_engine_flags_drift":
                view.flags_drift = s.value
            elif s.name == "pdkit_engine_flag_drift_info":
                view.drift_flags = (*view.drift_flags, s.labels.get("flag", "?"))
            elif s.name == "pdkit_decode_cuda_graph_ratio":
                view.decode_graph_ratio = s.value
            elif s.name == "pdkit_decode_batch_cuda_graph":
                view.decode_batch_cuda_graph = s.value
            elif s.name == "pdkit_engine_info":
                view.sglang_version = s.labels.get("sglang_version") or None
            elif s.name == "pdkit_engine_rank_up":
                view.rank_up = s.value
                rank = s.labels.get("rank", "")
                view.rank = int(rank) if rank.isdigit() else None
    return views


# ------------------------------------------------------------------------------------------------
# Collection (HTTP, from the control machine)


def engine_plans(spec) -> list[EnginePlan]:
    """What each engine of the spec should be running."""
    from pdkit import flags
    from pdkit.spec import decode_graph_required_bs, effective_decode_graph_max_bs, pairing_sets, prefill_kv_paths

    target = spec.cluster.target_concurrency
    kv_paths = prefill_kv_paths(spec)
    kv_decodes: dict[tuple[str, str], set[str]] = {}
    for _label, members in pairing_sets(spec):
        decodes = {f"{h.name}/{e.name}" for h, e in members if e.role == "decode"}
        for h, e in members:
            if e.role == "prefill":
                kv_decodes.setdefault((h.name, e.name), set()).update(decodes)
    out = []
    for host, engine in spec.engines():
        tuning = spec.engine_tuning(engine)
        kv = ({"kv_paths": tuple((d, p.name) for d, p in kv_paths.get((host.name, engine.name), ())),
               "kv_decodes": tuple(sorted(kv_decodes.get((host.name, engine.name), ()))),
               "ucx_net_devices": host.node.ucx_net_devices if host.node is not None else None}
              if engine.role == "prefill" else {})
        # every rank of an engine spanning nodes, rank 0 first: each on its own host, with that
        # host's NCCL/UCX environment and its own argv (--node-rank)
        for rank, node in enumerate(spec.engine_hosts(host, engine)):
            env = {**flags.nccl_env(spec, node), **flags.ucx_env(spec, node), **flags.engine_env(spec, host, engine, node)}
            planned_env = sorted(k for k in env if k.startswith(("NCCL_", "UCX_", "SGLANG_")))
            out.append(EnginePlan(
                host=node.name,
                engine=engine.name,
                role=engine.role,
                url=flags.engine_url(spec, host, engine),
                pd_group=engine.pd_group if engine.role != "unified" else None,
                argv=tuple(flags.sglang_args(spec, host, engine, rank)),
                sglang_version=spec.engine_version(engine),
                engine_kind=spec.cluster.engine,
                context_length=tuning.context_length,
                cuda_graph=engine.role != "prefill" and bool(tuning.value("cuda_graph")),
                graph_max_bs=effective_decode_graph_max_bs(spec, host, engine),
                required_bs=decode_graph_required_bs(engine, target),
                env_names=tuple(planned_env),
                **kv,
                **({"rank": rank, "nnodes": engine.nnodes, "head": host.name} if engine.spans_nodes else {}),
            ))
    return out


def router_urls(spec) -> list[tuple[str, str, tuple[str, ...]]]:
    """(host, router base URL, planned worker URLs) per router, from the plan's router service."""
    from pdkit.paths import router_url  # lazy, as pdkit.flags here
    from pdkit.plan import plan_host

    out = []
    for host in spec.router_hosts:
        service = next(s for s in plan_host(spec, host).services if s.kind == "router")
        out.append((host.name, router_url(host), service.expected_workers))
    return out


def _router_outcomes(url: str, timeout_s: float) -> dict[str, dict[str, float]] | None:
    body, _error = _get(url, timeout_s)
    if body is None:
        return None
    try:
        return router_outcomes(body)
    except ValueError:
        return None


def _get(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(body, None) on a 200, else (None, why)."""
    from pdkit.health import http_request

    status, body = http_request(url, timeout=timeout_s, headers=headers)
    if status == 200:
        return body, None
    if status:
        return None, f"HTTP {status}: {body.strip()[:120]}"
    # urllib says "<urlopen error [Errno 111] Connection refused>": keep the reason
    reason = body.strip().removeprefix("<urlopen error ").removesuffix(">")
    return None, reason[:160] or "no answer"


def _sample(url: str, timeout_s: float) -> Sample:
    at = time.monotonic()
    body, error = _get(f"{url}/metrics", timeout_s)
    if body is None:
        return Sample(at, None, error)
    try:
        return Sample(at, parse_metrics(body), kv=kv_histograms(body), ttft=histogram_mean(body, SGLANG["ttft"]))
    except ValueError as exc:
        return Sample(at, None, f"unreadable /metrics: {str(exc)[:120]}")


def _probe(router_url: str, model: str, requests_n: int, timeout_s: float, headers: dict[str, str]) -> list[int]:
    """A few short completions through the router, concurrently: decode passes and KV hand-offs to observe."""
    from pdkit.health import http_request

    def one(i: int) -> int:
        payload = {"model": model, "prompt": f"pdkit doctor probe {i} {time.time_ns()}", "max_tokens": 16}
        return http_request(f"{router_url}/v1/completions", payload, timeout=timeout_s, headers=headers)[0]

    with ThreadPoolExecutor(max(1, requests_n)) as pool:
        return list(pool.map(one, range(requests_n)))


@dataclass
class Collected:
    engines: list[EngineObservation]
    routers: list[RouterObservation]
    probe_statuses: list[int] = field(default_factory=list)
    # GPU node -> (pdkit_node_reboot_required or None, why the exporter could not say)
    reboots: dict[str, tuple[float | None, str | None]] = field(default_factory=dict)


def collect(spec, *, window_s: float = 3.0, probe_requests: int = 8, timeout_s: float = 5.0,
            progress: Callable[[str], None] = lambda _m: None) -> Collected:
    """Read every engine, exporter and router of the spec (two /metrics samples `window_s` apart)."""
    from pdkit.health import router_worker_health
    from pdkit.paths import (  # lazy, as pdkit.flags here: doctor's module stays light
        router_auth_headers,
        router_metrics_url,
    )

    plans = engine_plans(spec)
    obs = [EngineObservation(plan=p) for p in plans]
    # HTTP only to rank 0 of each engine: a rank above 0 serves none (its exporter says the rest)
    served = [o for o in obs if o.plan.rank == 0]
    headers = router_auth_headers(spec)
    routers = [RouterObservation(h, url, workers) for h, url, workers in router_urls(spec)]
    router_metrics = [router_metrics_url(h) for h in spec.router_hosts]
    exporters = {h.name: f"http://{spec.engine_address(h)}:{h.node.exporter_port}" for h in spec.gpu_hosts}

    with ThreadPoolExecutor(max(4, 2 * len(served) + len(routers) + len(exporters))) as pool:
        def read_engine(o: EngineObservation) -> None:
            body, error = _get(f"{o.plan.url}/server_info", timeout_s)
            if body is not None:
                try:
                    info = json.loads(body)
                    o.server_info = info if isinstance(info, dict) else None
                    o.server_info_error = None if isinstance(info, dict) else "not a JSON object"
                except ValueError as exc:
                    o.server_info_error = f"unreadable: {exc}"
            else:
                o.server_info_error = error
            o.first = _sample(o.plan.url, timeout_s)

        progress(f"reading {len(served)} engines")
        list(pool.map(read_engine, served))
        for r, outcomes in zip(routers, pool.map(lambda u: _router_outcomes(u, timeout_s), router_metrics)):
            r.outcomes_first = outcomes
        started = time.monotonic()
        statuses: list[int] = []
        for r in routers if probe_requests > 0 else []:
            progress(f"sending {probe_requests} probe requests through {r.url}")
            statuses += _probe(r.url, spec.cluster.model.name, probe_requests, max(timeout_s, 30.0), headers)
        time.sleep(max(0.0, window_s - (time.monotonic() - started)))
        progress(f"second look at the engines after {time.monotonic() - started:.1f} s; exporters and routers")
        seconds = pool.map(lambda o: _sample(o.plan.url, timeout_s), served)
        exporter_pages = dict(zip(exporters, pool.map(lambda u: _get(f"{u}/metrics", timeout_s), exporters.values())))
        router_pages = list(pool.map(lambda r: _get(f"{r.url}/workers", timeout_s, headers), routers))
        for r, outcomes in zip(routers, pool.map(lambda u: _router_outcomes(u, timeout_s), router_metrics)):
            r.outcomes_second = outcomes
        for o, s in zip(served, seconds):
            o.second = s

    views: dict[str, dict[str, ExporterView]] = {}
    errors: dict[str, str] = {}
    for host, (body, error) in exporter_pages.items():
        if body is None:
            errors[host] = f"{exporters[host]}/metrics: {error}"
            continue
        try:
            views[host] = exporter_views(body)
        except ValueError as exc:
            errors[host] = f"unreadable exporter page: {str(exc)[:120]}"
    for o in obs:
        view = views.get(o.plan.host, {}).get(o.plan.engine)
        o.exporter = view
        if view is None:
            o.exporter_error = errors.get(o.plan.host, f"no series for engine {o.plan.engine}")
    for r, (body, error) in zip(routers, router_pages):
        if body is None:
            r.error = error
            continue
        try:
            r.workers = router_worker_health(body)
        except (ValueError, AttributeError) as exc:
            r.error = f"unreadable /workers: {exc}"
    reboots = {}
    for host, (body, _error) in exporter_pages.items():
        reboots[host] = (reboot_pending(body), None) if body is not None else (None, errors.get(host))
    return Collected(obs, routers, statuses, reboots)


# ------------------------------------------------------------------------------------------------
# The last recorded bench and a fresh one (pdkit.bench, when it exists)


def c16_throughput(record: dict[str, Any]) -> float | None:
    """Output tok/s of the C=16 level of one pdkit.bench record (None without such a level)."""
    for level in record.get("levels") or []:
        if level.get("concurrency") == BENCH_CONCURRENCY and isinstance(level.get("output_tok_s"), (int, float)):
            if level.get("completed", 1) and not level.get("errors"):
                return float(level["output_tok_s"])
    return None


def c16_ttft_mean_ms(record: dict[str, Any]) -> float | None:
    """The client-side TTFT mean (ms) of the C=16 level of one pdkit.bench record."""
    for level in record.get("levels") or []:
        if level.get("concurrency") == BENCH_CONCURRENCY:
            mean = (level.get("ttft_ms") or {}).get("mean")
            return float(mean) if isinstance(mean, (int, float)) else None
    return None


def last_recorded(runs: Iterable[dict[str, Any]], cluster: str, engine: str) -> BenchPoint | None:
    """The newest clean C=16 level recorded through the router for this cluster and engine kind (sim
    and sglang never compare; a bench of chosen hosts' engines, env.measured.via "engines", is not
    the cluster's figure)."""
    best = None
    for record in runs:
        env = record.get("env") or {}
        if record.get("cluster") != cluster or env.get("engine", engine) != engine:
            continue
        if (env.get("measured") or {}).get("via", "router") != "router":
            continue
        value = c16_throughput(record)
        if value is not None:
            best = BenchPoint(value, str(record.get("id") or record.get("time") or "last run"),
                              int(record.get("input_len") or 512), int(record.get("output_len") or 128),
                              int(record.get("requests") or 64))
    return best


def recorded_bench(spec, runs_path: Path) -> BenchPoint | None:
    """The last recorded C=16 figure from runs.jsonl, None when pdkit.bench is absent or nothing is recorded."""
    try:
        from pdkit import bench
    except ModuleNotFoundError as exc:
        if exc.name != "pdkit.bench":
            raise
        return None
    return last_recorded(bench.load_runs(runs_path), spec.cluster.name, spec.cluster.engine)


def fresh_bench(spec, like: BenchPoint, progress: Callable[[str], None], show_bar: bool) -> BenchPoint | None:
    """A short C=16 bench through the router with the recorded run's lengths (pdkit.bench.run_bench)."""
    from pdkit import bench

    # the recorded run's lengths and request count: a shorter run ramps up and down differently
    requests = like.requests
    progress(f"running a C=16 bench through the router ({requests} requests, {like.input_len} in / {like.output_len} out)")
    record = bench.run_bench(spec, concurrency=[BENCH_CONCURRENCY], input_len=like.input_len, output_len=like.output_len,
                             requests=requests, label="pdkit doctor", probe_drivers=False, progress=show_bar)
    value = c16_throughput(record)
    if value is None:
        return None
    return BenchPoint(value, "now", like.input_len, like.output_len, requests, c16_ttft_mean_ms(record))


def per_engine_bench(spec, like: BenchPoint, progress: Callable[[str], None], show_bar: bool) -> dict:
    """The same C=16 load sent to every decode (and unified) engine in turn, each request to one
    PD pair directly in the router's form (pdkit.bench.measure), so each engine serves an equal
    share and its own inter-token latency is measured (decode_speed_c16). Through the router the
    share is the router's choice: one slow engine of three got no request at all in a lab run
    (issue #18 item 10)."""
    # lazy: only --bench sends load; the client and its routes load pydantic (the spec), which doctor's import avoids
    from pdkit import bench
    from pdkit.bench.measure import Measured
    from pdkit.bench.routes import target_routes

    url, headers = bench.router_target(spec)
    routes = tuple(target_routes(spec, [h.name for h in spec.hosts]))
    if not routes:
        return {}
    measured = Measured(tuple(h.name for h in spec.hosts), url, headers, routes)
    progress(f"running the same C=16 load on each engine in turn ({like.requests} requests over {len(routes)} route(s): {', '.join(r.label for r in routes)})")
    return bench.run_bench(spec, concurrency=[BENCH_CONCURRENCY], input_len=like.input_len, output_len=like.output_len,
                           requests=like.requests, label="pdkit doctor per engine", probe_drivers=False, progress=show_bar,
                           send=measured.stream, measured=measured.describe())


# ------------------------------------------------------------------------------------------------
# Entry points


def run_doctor(spec, *, window_s: float = 3.0, probe_requests: int = 8, timeout_s: float = 5.0,
               bench: bool = False, tolerance: float = DEFAULT_TOLERANCE, runs_path: Path = DEFAULT_RUNS_PATH,
               progress: Callable[[str], None] = lambda _m: None, show_bar: bool = False) -> list[CheckResult]:
    """Collect from the live cluster and run every check."""
    collected = collect(spec, window_s=window_s, probe_requests=probe_requests, timeout_s=timeout_s, progress=progress)
    recorded = recorded_bench(spec, runs_path)
    measured, speed, kv_bench = None, [], None
    if bench and recorded is not None:
        decode = [o.plan for o in collected.engines if o.plan.role in ("decode", "unified") and o.plan.rank == 0]
        prefill = [o.plan for o in collected.engines if o.plan.role == "prefill" and o.plan.rank == 0]
        kv_before = _kv_pages(prefill, timeout_s)
        measured = fresh_bench(spec, recorded, progress, show_bar)
        kv_after = _kv_pages(prefill, timeout_s)
        ttft = measured.ttft_mean_ms if measured is not None else None
        kv_bench = {k: KvBench(kv_before.get(k) or {}, after, ttft) for k, after in kv_after.items() if after is not None}
        before = _itl_sums(decode, timeout_s)
        per_engine_bench(spec, recorded, progress, show_bar)
        after = _itl_sums(decode, timeout_s)
        speed = check_decode_speed({k: _mean_between(before.get(k), after.get(k)) for k in after}, tolerance)
    cluster_host = spec.router_hosts[0].name if spec.router_hosts else ""
    return evaluate(collected.engines, collected.routers, recorded, measured, tolerance, cluster_host, collected.reboots,
                    kv_bench) + speed


def _kv_pages(plans: Sequence[EnginePlan], timeout_s: float) -> dict[tuple[str, str], dict[str, Histogram] | None]:
    """(host, engine) -> each prefill's KV histograms now (None: its /metrics did not answer)."""
    out: dict[tuple[str, str], dict[str, Histogram] | None] = {}
    for p in plans:
        body, _ = _get(f"{p.url}/metrics", timeout_s)
        try:
            out[(p.host, p.engine)] = kv_histograms(body) if body is not None else None
        except ValueError:
            out[(p.host, p.engine)] = None
    return out


def _itl_sums(plans: Sequence[EnginePlan], timeout_s: float) -> dict[tuple[str, str], tuple[float, float] | None]:
    """(host, engine) -> (sum, count) of each engine's inter-token latency histogram now."""
    from pdkit.metricnames import SGLANG

    out = {}
    for p in plans:
        body, _ = _get(f"{p.url}/metrics", timeout_s)
        out[(p.host, p.engine)] = histogram_mean(body, SGLANG["itl"]) if body is not None else None
    return out


def _mean_between(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Mean of the observations between two (sum, count) readings, None when none were made."""
    if after is None:
        return None
    s0, c0 = before or (0.0, 0.0)
    count = after[1] - c0
    return (after[0] - s0) / count if count > 0 else None


def render_table(results: Sequence[CheckResult]) -> str:
    """Human output: one block per host/target, a row per check, the hint under WARN/FAIL rows."""
    lines: list[str] = []
    width = max((len(r.check) for r in results), default=10)
    current = None
    for r in results:
        if (r.host, r.target) != current:
            current = (r.host, r.target)
            lines.append("" if lines else "")
            lines.append(f"{r.host}/{r.target}" if r.host else r.target)
        lines.append(f"  {r.check:<{width}}  {r.status}  {r.reason}")
        if r.hint:
            lines.append(f"  {'':<{width}}        fix: {r.hint}")
    counts = {s: sum(1 for r in results if r.status == s) for s in (PASS, WARN, FAIL)}
    lines.append("")
    lines.append(f"{counts[PASS]} PASS, {counts[WARN]} WARN, {counts[FAIL]} FAIL")
    return "\n".join(lines[1:] if lines and lines[0] == "" else lines)


def exit_code(results: Sequence[CheckResult]) -> int:
    return EXIT_FAIL if any(r.status == FAIL for r in results) else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from pdkit.loader import load_or_report

    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    quiet = args.json

    def progress(message: str) -> None:
        if not quiet:
            print(f"doctor: {message}", file=sys.stderr, flush=True)

    results = run_doctor(spec, window_s=args.window, probe_requests=args.probe_requests, timeout_s=args.timeout,
                         bench=args.bench, tolerance=args.tolerance, runs_path=Path(args.runs), progress=progress,
                         show_bar=not quiet)
    if args.json:
        counts = {s: sum(1 for r in results if r.status == s) for s in (PASS, WARN, FAIL)}
        print(json.dumps({"inventory": str(args.inventory), "cluster": spec.cluster.name, "ok": exit_code(results) == 0,
                          "counts": counts, "checks": [r.to_dict() for r in results]}, indent=2))
    else:
        print(render_table(results))
    return exit_code(results)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="live checks: does the running cluster match the plan and do its levers work?")
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventories/cluster.py")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--window", type=float, default=3.0, help="seconds between the two /metrics samples (default 3)")
    p.add_argument("--probe-requests", type=int, default=8,
                   help="short completions sent through each router inside the window (default 8; 0: none)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP request (default 5)")
    p.add_argument("--bench", action="store_true", help="run a short C=16 bench (pdkit bench) and compare with the last recorded one")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="allowed C=16 throughput drop (default 0.10)")
    p.add_argument("--runs", default=str(DEFAULT_RUNS_PATH), help="recorded bench runs (default docs/bench/runs.jsonl)")
    p.set_defaults(func=cmd_doctor)


__all__ = [
    "BenchPoint", "CheckResult", "EngineObservation", "EnginePlan", "ExporterView", "RouterObservation", "Sample",
    "add_parser", "check_context_length", "check_decode_cuda_graphs", "check_env", "check_flags", "check_graph_buckets",
    "check_kv_path", "check_kv_transfers", "check_queues", "check_reachable", "check_router_workers", "check_throughput", "check_versions",
    "check_decode_speed", "histogram_mean",
    "collect", "evaluate", "exit_code", "exporter_views", "render_table", "run_doctor",
]
