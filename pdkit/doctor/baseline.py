"""The throughput baseline doctor compares with: the last C=16 bench recorded in runs.jsonl, doctor's
own C=16 bench through the router (`--bench`), and the same load sent to each engine in turn (pdkit.bench)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pdkit import bench
from pdkit.bench.measure import Measured
from pdkit.bench.routes import target_routes
from pdkit.doctor.model import BenchPoint

BENCH_CONCURRENCY = 16
DEFAULT_RUNS_PATH = Path("docs/bench/runs.jsonl")


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
    """The last recorded C=16 figure from runs.jsonl, None when nothing is recorded."""
    return last_recorded(bench.load_runs(runs_path), spec.cluster.name, spec.cluster.engine)


def fresh_bench(spec, like: BenchPoint, progress: Callable[[str], None], show_bar: bool) -> BenchPoint | None:
    """A short C=16 bench through the router with the recorded run's lengths (pdkit.bench.run_bench)."""
    # the recorded run's lengths and request count: a shorter run ramps up and down differently
    requests = like.requests
    progress(f"running a C=16 bench through the router ({requests} "
             f"requests, {like.input_len} in / {like.output_len} out)")
    record = bench.run_bench(spec, concurrency=[BENCH_CONCURRENCY], input_len=like.input_len,
                             output_len=like.output_len,
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
    url, headers = bench.router_target(spec)
    routes = tuple(target_routes(spec, [h.name for h in spec.hosts]))
    if not routes:
        return {}
    measured = Measured(tuple(h.name for h in spec.hosts), url, headers, routes)
    progress(f"running the same C=16 load on each engine in turn ({like.requests} "
             f"requests over {len(routes)} route(s): {', '.join(r.label for r in routes)})")
    return bench.run_bench(spec, concurrency=[BENCH_CONCURRENCY], input_len=like.input_len, output_len=like.output_len,
                           requests=like.requests, label="pdkit doctor per engine", probe_drivers=False,
                           progress=show_bar,
                           send=measured.stream, measured=measured.describe())

