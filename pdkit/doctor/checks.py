"""Doctor's table of checks: which check runs on which engine role, and `evaluate`, every check over the
collected observations in table order. The checks themselves, pure functions (observations in,
`CheckResult` rows out, no I/O), live by concern: checks_engine.py (does the engine run the plan, does it
make progress), checks_graphs.py (decode CUDA graphs), checks_kv.py (KV hand-offs), checks_cache.py (the
prefix cache), checks_cluster.py
(routers, nodes, throughput); checkbase.py holds what they share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pdkit.agent.health import worker_key
from pdkit.doctor.checks_cache import check_prefix_cache
from pdkit.doctor.checks_cluster import DEFAULT_TOLERANCE, check_reboot, check_router_workers, check_throughput
from pdkit.doctor.checks_engine import (
    check_context_length,
    check_engine_shape,
    check_env,
    check_flags,
    check_gpu_health,
    check_jit_caches,
    check_queues,
    check_rank_process,
    check_reachable,
    check_versions,
    check_weights,
    check_weights_cached,
    reads_weight_files,
)
from pdkit.doctor.checks_graphs import check_decode_cuda_graphs, check_graph_buckets
from pdkit.doctor.checks_kv import check_kv_path, check_kv_transfers
from pdkit.doctor.model import BenchPoint, CheckResult, EngineObservation, KvBench, RouterObservation, WorkerOutcomes

ENGINE_CHECKS: tuple[tuple[Callable[..., CheckResult], frozenset[str]], ...] = (
    (check_reachable, frozenset({"prefill", "decode", "unified"})),
    (check_gpu_health, frozenset({"prefill", "decode", "unified"})),
    (check_flags, frozenset({"prefill", "decode", "unified"})),
    (check_decode_cuda_graphs, frozenset({"decode", "unified"})),
    (check_graph_buckets, frozenset({"decode", "unified"})),
    (check_context_length, frozenset({"prefill", "decode", "unified"})),
    (check_engine_shape, frozenset({"prefill", "decode", "unified"})),
    (check_weights, frozenset({"prefill", "decode", "unified"})),
    (check_weights_cached, frozenset({"prefill", "decode", "unified"})),
    (check_jit_caches, frozenset({"prefill", "decode", "unified"})),
    (check_env, frozenset({"prefill", "decode", "unified"})),
    (check_kv_transfers, frozenset({"prefill", "decode"})),
    (check_kv_path, frozenset({"prefill"})),
    (check_prefix_cache, frozenset({"prefill", "unified"})),
    (check_queues, frozenset({"prefill", "decode", "unified"})),
)
# a rank above 0 of an engine spanning nodes: no HTTP, its process only (through its host's exporter)
RANK_CHECKS: tuple[Callable[[EngineObservation], CheckResult], ...] = (check_rank_process, check_gpu_health,
                                                                       check_flags, check_env)
# checks with a row only where the node's exporter can measure them
ONLY_WHERE: dict[Callable[..., CheckResult], Callable[[EngineObservation], bool]] = {
    # no row for dummy weights, a hub id or the sim
    check_weights_cached: lambda obs: reads_weight_files(obs.plan),
    # no row on a lab host (`gpu: none`) or with the sim: no GPU to read
    check_gpu_health: lambda obs: obs.plan.gpu_health,
}


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
            results += [check(obs) for check in RANK_CHECKS if ONLY_WHERE.get(check, bool)(obs)]
            continue
        for check, roles in ENGINE_CHECKS:
            if obs.plan.role in roles and ONLY_WHERE.get(check, bool)(obs):
                if check is check_kv_transfers:
                    results.append(check(obs, worker_outcomes(routers, obs.plan.url)))
                elif check is check_kv_path:
                    decodes = [o for o in engines if o.plan.role == "decode" and o.plan.rank == 0]
                    results.append(check(obs, decodes, (kv_bench or {}).get((obs.plan.host, obs.plan.engine))))
                elif check is check_prefix_cache:
                    results.append(check(obs, [o for o in engines if o.plan.role == "decode" and o.plan.rank == 0]))
                else:
                    results.append(check(obs))
        results.append(versions[id(obs)])
    results += [check_reboot(host, pending, why) for host, (pending, why) in (reboots or {}).items()]
    results += [check_router_workers(r) for r in routers]
    results.append(check_throughput(cluster_host, recorded, measured, tolerance))
    return results


def worker_outcomes(routers: Sequence[RouterObservation], url: str) -> WorkerOutcomes | None:
    """The first router that recorded outcomes for this worker URL at both samples."""
    key = worker_key(url)
    for r in routers:
        if r.outcomes_second is not None and key in r.outcomes_second:
            return WorkerOutcomes(r.host, (r.outcomes_first or {}).get(key, {}), r.outcomes_second[key])
    return None
