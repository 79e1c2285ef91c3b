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

Where each part lives: model.py (the observations and `CheckResult`), observe.py (reading one engine,
exporter or router page), collection.py (every host's observations, with progress lines), checks.py
(the table of checks and `evaluate`; the pure checks by concern in checks_engine.py, checks_graphs.py,
checks_kv.py, checks_cache.py and checks_cluster.py, what they share in checkbase.py), baseline.py (the recorded C=16
bench and doctor's own), report.py (table, JSON, exit code); here the command itself. Its surface is what
other packages use: add_parser (pdkit/cli.py), run_doctor and FAIL (pdkit.tune), render_table
(gpu/pdkit_tools.py); tests and the siblings here import the submodules.

A WARN says "could not prove it" (not measurable on this version, no traffic yet, exporter down);
a FAIL says "it is wrong"; an INFO reports a figure with nothing to judge (prefix_cache without traffic in the
window); the exit code is 1 when anything FAILs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from pdkit.doctor.baseline import DEFAULT_RUNS_PATH, fresh_bench, per_engine_bench, recorded_bench
from pdkit.doctor.checks import evaluate
from pdkit.doctor.checks_cluster import DEFAULT_TOLERANCE, check_decode_speed, mean_between
from pdkit.doctor.checks_p2p import read_p2p
from pdkit.doctor.collection import collect
from pdkit.doctor.model import FAIL, CheckResult, KvBench
from pdkit.doctor.observe import itl_sums, kv_pages
from pdkit.doctor.report import EXIT_INVALID, exit_code, json_report, render_table
from pdkit.inventory.loader import load_or_report


def run_doctor(spec, *, window_s: float = 3.0, probe_requests: int = 8, timeout_s: float = 5.0,
               bench: bool = False, tolerance: float = DEFAULT_TOLERANCE, runs_path: Path = DEFAULT_RUNS_PATH,
               progress: Callable[[str], None] = lambda _m: None, show_bar: bool = False,
               inventory: str | None = None) -> list[CheckResult]:
    """Collect from the live cluster and run every check. With `bench` and the INVENTORY (doctor's SSH to the
    nodes), each GPU node's `p2p` row too (pdkit/doctor/checks_p2p.py), measured after the benches."""
    collected = collect(spec, window_s=window_s, probe_requests=probe_requests, timeout_s=timeout_s, progress=progress)
    recorded = recorded_bench(spec, runs_path)
    measured, speed, kv_bench = None, [], None
    if bench and recorded is not None:
        decode = [o.plan for o in collected.engines if o.plan.role in ("decode", "unified") and o.plan.rank == 0]
        prefill = [o.plan for o in collected.engines if o.plan.role == "prefill" and o.plan.rank == 0]
        kv_before = kv_pages(prefill, timeout_s)
        measured = fresh_bench(spec, recorded, progress, show_bar)
        kv_after = kv_pages(prefill, timeout_s)
        ttft = measured.ttft_mean_ms if measured is not None else None
        kv_bench = {k: KvBench(kv_before.get(k) or {}, after, ttft)
                    for k, after in kv_after.items() if after is not None}
        before = itl_sums(decode, timeout_s)
        per_engine_bench(spec, recorded, progress, show_bar)
        after = itl_sums(decode, timeout_s)
        speed = check_decode_speed({k: mean_between(before.get(k), after.get(k)) for k in after}, tolerance)
    # after the benches: the probe's copies share the PCIe links and GPU memory the engines use
    p2p_rows = read_p2p(spec, inventory, progress) if bench and inventory else []
    cluster_host = spec.router_hosts[0].name if spec.router_hosts else ""
    return evaluate(collected.engines, collected.routers, recorded, measured, tolerance, cluster_host,
                    collected.reboots,
                    kv_bench) + speed + p2p_rows


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.bench:
        # --bench measures P2P over SSH (pyinfra's API): gevent is patched before any socket opens
        # lazy: pyinfra's API (gevent, paramiko) loads only for --bench
        from pdkit.roll.pyinfra_api import patch_gevent

        patch_gevent()
    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    quiet = args.json

    def progress(message: str) -> None:
        if not quiet:
            print(f"doctor: {message}", file=sys.stderr, flush=True)

    results = run_doctor(spec, window_s=args.window, probe_requests=args.probe_requests, timeout_s=args.timeout,
                         bench=args.bench, tolerance=args.tolerance, runs_path=Path(args.runs), progress=progress,
                         show_bar=not quiet, inventory=str(args.inventory))
    if args.json:
        print(json.dumps(json_report(str(args.inventory), spec.cluster.name, results), indent=2))
    else:
        print(render_table(results))
    return exit_code(results)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="live checks: does the running cluster "
                                             "match the plan and do its levers work?")
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventories/cluster.py")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--window", type=float, default=3.0, help="seconds between the two /metrics samples (default 3)")
    p.add_argument("--probe-requests", type=int, default=8,
                   help="short completions sent through each router inside the window (default 8; 0: none)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP request (default 5)")
    p.add_argument("--bench", action="store_true", help="run a short C=16 bench (pdkit bench) "
                                                        "and compare with the last recorded one; then measure "
                                                        "GPU-to-GPU copies on each GPU node over SSH (p2p row)")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="allowed C=16 throughput drop (default 0.10)")
    p.add_argument("--runs", default=str(DEFAULT_RUNS_PATH), help="recorded bench runs (default docs/bench/runs.jsonl)")
    p.set_defaults(func=cmd_doctor)


# what other packages use (pdkit/cli.py, pdkit.tune, gpu/pdkit_tools.py)
__all__ = ["FAIL", "add_parser", "render_table", "run_doctor"]
