"""`pdkit bench` and `pdkit compare` on the command line: their arguments, `--limit HOST` checked
before any request, and which of pdkit's client, the chosen engines or SGLang's bench runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pdkit.bench.client import router_target
from pdkit.bench.measure import Measured, measured_for
from pdkit.bench.record import DEFAULT_OUT, RUNS_FILE, find_run, run_bench, served_model
from pdkit.bench.report import render_compare, render_markdown, render_plot, sent_to, write_outputs
from pdkit.bench.sglang import SGLANG_BENCH_MODULE, run_sglang_bench
from pdkit.loader import load_or_report

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

EXIT_INVALID = 2


def parse_concurrency(text: str) -> list[int]:
    """'1,16,64' -> [1, 16, 64]; each level a positive integer."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("--concurrency takes comma-separated positive integers, e.g. 1,16,64; got "
                                         f"{text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("--concurrency takes comma-separated positive integers, e.g. 1,16,64; got "
                                         f"{text!r}")
    return levels


def limited_measure(spec: ClusterSpec, hosts: Sequence[str], engine_bench: str = "pdkit") -> Measured:
    """What `--limit HOST` benches: those hosts' own PD pairs / unified engines, sent to directly
    (pdkit.bench.measure), or the router when they hold every engine it fronts. Refuses a name the
    inventory lacks or a host without engines, before any request."""
    spec.check_limit(hosts)
    engine_hosts = [h.name for h, _ in spec.engines()]
    idle = [h for h in hosts if h not in engine_hosts]
    if idle:
        raise ValueError(f"--limit: host(s) {idle} run no engine; hosts with engines: {sorted(set(engine_hosts))}")
    if engine_bench != "pdkit":
        raise ValueError("--limit needs pdkit's client (--engine-bench pdkit): SGLang's bench sends to one URL, "
                         "and a PD pair needs each request sent to its prefill and decode at once")
    return measured_for(spec, list(dict.fromkeys(hosts)))


def cmd_bench(args: argparse.Namespace) -> int:
    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    common = dict(concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
                  requests=args.requests, warmup=args.warmup, label=args.label, probe_drivers=not args.no_ssh)
    try:
        measured = limited_measure(spec, args.limit, args.engine_bench) if args.limit else None
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        router_url, _ = router_target(spec)
        print(f"bench {sent_to(router_url, measured.describe() if measured else None)} (model {served_model(spec)}, "
              f"engine {spec.cluster.engine}): "
              f"C={','.join(map(str, args.concurrency))}, in {args.input_len} / out {args.output_len} tokens, "
              f"{args.requests} requests per level", file=sys.stderr)
        if args.engine_bench == "sglang":
            record = run_sglang_bench(spec, python=args.sglang_python, tokenizer=args.tokenizer, **common)
        elif measured is not None:
            record = run_bench(spec, timeout_s=args.timeout, progress=not args.quiet, send=measured.stream,
                               measured=measured.describe(), **common)
        else:
            record = run_bench(spec, timeout_s=args.timeout, progress=not args.quiet, **common)
    except (ValueError, RuntimeError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    written = write_outputs(record, args.out, plot=not args.no_plot)
    print(render_markdown(record))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 1 if any(lv["errors"] for lv in record["levels"]) else 0


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        a, b = find_run(args.a, args.runs), find_run(args.b, args.runs)
    except (LookupError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return EXIT_INVALID
    text = render_compare(a, b)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        render_plot([a, b], args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    print(text, end="")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench` and `compare`."""
    p = subparsers.add_parser("bench",
                              help="measure the cluster through its router (tok/s, TTFT, TPOT, ITL per concurrency)",
                              description="Streaming requests with fixed input/output lengths through the router, "
                                          "after a warm-up; one JSON line per run in OUT/runs.jsonl, plus OUT/<id>.md "
                                          "and .png.")
    p.add_argument("inventory")
    p.add_argument("--concurrency", type=parse_concurrency, default=[1, 16, 64], metavar="C1,C2,...",
                   help="concurrency levels, run in this order (default 1,16,64)")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens per request (default 512)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens per request, EOS ignored (default 128)")
    p.add_argument("--requests", type=int, default=64, help="requests per concurrency level (default 64)")
    p.add_argument("--warmup", type=int, default=4,
                   help="warm-up requests before the first level, not counted (default 4)")
    p.add_argument("--label", default="", help="free text kept with the run, e.g. 'before cuda-graph change'")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for runs.jsonl, <id>.md and <id>.png (default "
                   f"{DEFAULT_OUT})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    p.add_argument("--engine-bench", choices=("pdkit", "sglang"), default="pdkit",
                   help=f"pdkit's client (default) or SGLang's own `python -m {SGLANG_BENCH_MODULE}`")
    p.add_argument("--sglang-python", default=sys.executable,
                   help="python that has sglang installed, for --engine-bench sglang (default: this one)")
    p.add_argument("--tokenizer", default=None, help="tokenizer path for --engine-bench sglang (default: the model "
                   "name)")
    p.add_argument("--limit", action="append", default=[], metavar="HOST",
                   help="bench only these hosts' own engines (repeat): each request goes to one of their PD pairs "
                        "directly, in the router's PD form, in turn, so each pair serves an equal share. Through the "
                        "router a load-aware policy moves load off a slow engine, and one changed node of several "
                        "barely shows; the record says what it measured (env.measured)")
    p.add_argument("--no-ssh", action="store_true", help="do not SSH to GPU nodes for the driver version")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)

    p = subparsers.add_parser("compare", help="two bench runs side by side with ratios (B/A)",
                              description="A and B: a run id or label from RUNS, or a .json record / .jsonl file (its "
                              "last run).")
    p.add_argument("a", metavar="A", help="the run before (id, label or file)")
    p.add_argument("b", metavar="B", help="the run after (id, label or file)")
    p.add_argument("--runs", default=f"{DEFAULT_OUT}/{RUNS_FILE}",
                   help=f"runs file to look ids and labels up in (default {DEFAULT_OUT}/{RUNS_FILE})")
    p.add_argument("--out", default=None, help="also write the markdown to this file")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw both runs on one throughput/TPOT chart")
    p.set_defaults(func=cmd_compare)
