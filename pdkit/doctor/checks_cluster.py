"""Doctor's router, node and cluster checks: each router lists its planned workers, healthy; no node waits
for a reboot; the C=16 throughput holds against the last recorded bench, and each decode engine keeps
up with its peers. Pure: observations in, rows out."""

from __future__ import annotations

import math

from pdkit.agent.health import worker_key
from pdkit.doctor.model import FAIL, PASS, WARN, BenchPoint, CheckResult, RouterObservation, Status

DEFAULT_TOLERANCE = 0.10


def check_router_workers(router: RouterObservation) -> CheckResult:
    """The router lists every planned worker, healthy (GET /workers)."""
    name = "router_workers"
    if router.workers is None:
        return CheckResult(router.host, "router", name, FAIL, f"{router.url}/workers did not answer: {router.error}",
                           f"on {router.host}: systemctl status pdkit-router; journalctl -u pdkit-router -n 50")
    wanted = {worker_key(w) for w in router.expected_workers}
    missing = sorted(wanted - set(router.workers))
    unhealthy = sorted(w for w in wanted & set(router.workers) if not router.workers[w])
    extra = sorted(set(router.workers) - wanted)
    if missing or unhealthy:
        parts = (([f"missing {', '.join(missing)}"] if missing else [])
                 + ([f"unhealthy {', '.join(unhealthy)}"] if unhealthy else []))
        return CheckResult(router.host, "router", name, FAIL, "; ".join(parts),
                           "fix the engine first (its rows above); the router "
                           "re-checks a worker every health_check_interval_secs. "
                           "A worker missing from the list: re-apply the plan "
                           "to the router host (its --prefill/--decode list)")
    note = f"; also lists unplanned {', '.join(extra)}" if extra else ""
    status: Status = WARN if extra else PASS
    return CheckResult(router.host, "router", name, status, f"all {len(wanted)} planned workers "
                                                            f"registered and healthy{note}",
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
                           "the NVIDIA driver changed since boot: the loaded "
                           "kernel module is the old one until a reboot",
                           f"reboot {host} drained: set pdkit_node.reboot: "
                           f"when-drained and `pdkit roll --limit {host}` "
                           "(the kit never reboots a serving node on its own; docs/tuning.md)")
    return CheckResult(host, "node", name, PASS, "no driver change waiting for a reboot")


def check_throughput(host: str, recorded: BenchPoint | None, measured: BenchPoint | None,
                     tolerance: float = DEFAULT_TOLERANCE) -> CheckResult:
    """C=16 output throughput within `tolerance` of the last recorded bench."""
    name = "throughput_c16"
    if recorded is None:
        return CheckResult(host, "cluster", name, WARN, "no bench recorded at C=16",
                           "run `pdkit bench INVENTORY --concurrency 16` once "
                           "the cluster is right: it records docs/bench/runs.jsonl")
    if measured is None:
        return CheckResult(host, "cluster", name, WARN, "not measured now (last recorded "
                                                        f"{recorded.output_tok_s:.0f} tok/s, {recorded.label})",
                           "pass --bench to run a short C=16 bench through the router and compare")
    ratio = measured.output_tok_s / recorded.output_tok_s if recorded.output_tok_s > 0 else math.inf
    text = (f"C=16 {measured.output_tok_s:.0f} tok/s vs {recorded.output_tok_s:.0f} recorded ({recorded.label}): "
            f"{ratio - 1:+.0%}")
    if ratio < 1 - tolerance:
        return CheckResult(host, "cluster", name, FAIL, text,
                           "a lever regressed: see the FAIL rows (decode_cuda_graph, "
                           "flags, queues) and `pdkit compare` the two runs")
    return CheckResult(host, "cluster", name, PASS, f"{text} (tolerance {tolerance:.0%})")


def mean_between(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Mean of the observations between two (sum, count) readings, None when none were made."""
    if after is None:
        return None
    s0, c0 = before or (0.0, 0.0)
    count = after[1] - c0
    return (after[0] - s0) / count if count > 0 else None


def check_decode_speed(itl: dict[tuple[str, str], float | None],
                       tolerance: float = DEFAULT_TOLERANCE) -> list[CheckResult]:
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
            out.append(CheckResult(host, engine, name, PASS,
                                   f"{speed:.0f} tok/s per request during the bench (no peer to compare)"))
            continue
        median = peers[len(peers) // 2] if len(peers) % 2 else (peers[len(peers) // 2 - 1] + peers[len(peers) // 2]) / 2
        ratio = speed / median
        text = f"{speed:.0f} tok/s per request vs its peers' median {median:.0f}: {ratio - 1:+.0%}"
        if ratio < 1 - tolerance:
            out.append(CheckResult(host, engine, name, FAIL, text,
                                   "this engine decodes slower than its peers: see "
                                   "its decode_cuda_graph, flags and queues rows"))
        else:
            out.append(CheckResult(host, engine, name, PASS, f"{text} (tolerance {tolerance:.0%})"))
    return out
