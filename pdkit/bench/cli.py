"""`pdkit bench` and `pdkit compare` on the command line: their arguments, `--limit HOST` checked
before any request, and which of pdkit's client, the chosen engines or SGLang's bench runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pdkit.bench.agentic import AgenticParams, AgenticWorkload, generate_trace, run_agentic_bench, write_trace
from pdkit.bench.client import router_target
from pdkit.bench.measure import Measured, measured_for
from pdkit.bench.noise import DEFAULT_MARGIN, with_repeats
from pdkit.bench.record import DEFAULT_OUT, RUNS_FILE, find_run, run_bench, served_model
from pdkit.bench.report import render_compare, render_markdown, render_plot, sent_to, write_outputs
from pdkit.bench.sglang import SGLANG_BENCH_MODULE, run_sglang_agentic_bench, run_sglang_bench
from pdkit.inventory.loader import load_or_report

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


MAX_REPEATS = 10  # as pdkit tune's noise.baseline_repeats


def parse_repeats(text: str) -> int:
    """--repeats: how many times the whole level sweep runs, 1..MAX_REPEATS."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"--repeats takes a whole number from 1 to {MAX_REPEATS}; got {text!r}")
    return n


def parse_margin(text: str) -> float:
    """--margin: a fraction of A's figure, 0..1 (0.02 = 2%)."""
    try:
        margin = float(text)
    except ValueError:
        margin = -1.0
    if not 0 <= margin <= 1:
        raise argparse.ArgumentTypeError(f"--margin takes a fraction from 0 to 1 (0.02 = 2%); got {text!r}")
    return margin


def run_figures(record: dict) -> str:
    """One run's sweep in a progress line: output tok/s per level."""
    return ", ".join(f"C={lv['concurrency']} {lv['output_tok_s'] or 0:.1f} tok/s" for lv in record["levels"])


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


def agentic_workload(args: argparse.Namespace, levels: int) -> AgenticWorkload:
    """The agentic workload the arguments describe: the user's --trace, else generated (LEVELS:
    each level plays its own fresh sessions)."""
    if args.trace:
        return AgenticWorkload.from_file(args.trace, args.sessions, args.reply_tokens, args.think_s, args.max_turns)
    if args.max_turns is not None:
        raise ValueError("--max-turns caps a --trace's conversations; a generated workload has --turns")
    defaults = AgenticParams()
    params = AgenticParams(
        sessions=defaults.sessions if args.sessions is None else args.sessions,
        turns=args.turns, system_tokens=args.system_tokens, turn_tokens=args.turn_tokens,
        reply_tokens=defaults.reply_tokens if args.reply_tokens is None else args.reply_tokens,
        think_s=args.think_s, seed=args.seed).check()
    return AgenticWorkload.generated(params, levels)


def goodput_slo(args: argparse.Namespace) -> dict[str, float] | None:
    """{"ttft_ms", "tpot_ms"} from --slo-ttft-ms / --slo-tpot-ms (either alone), or None."""
    slo = {name: value for name, value in (("ttft_ms", args.slo_ttft_ms), ("tpot_ms", args.slo_tpot_ms))
           if value is not None}
    bad = [f"--slo-{k.replace('_', '-')} {v:g}" for k, v in slo.items() if v <= 0]
    if bad:
        raise ValueError(f"{', '.join(bad)}: an SLO must be a positive number of milliseconds")
    return slo or None


def cmd_bench(args: argparse.Namespace) -> int:
    agentic = args.workload == "agentic" or args.trace is not None or args.write_trace is not None
    if args.write_trace and args.trace:
        print("bench: --write-trace writes a generated trace; --trace replays your own (give one of them)",
              file=sys.stderr)
        return EXIT_INVALID
    if agentic and args.repeats > 1:
        # a repeat would replay the sessions run 1 played, their history possibly still in the prefix
        # cache: its spread would be the cache's, not the run-to-run noise
        print("bench: --repeats with the agentic workload is not supported yet: a repeat would replay the sessions "
              "run 1 played, possibly still in the prefix cache", file=sys.stderr)
        return EXIT_INVALID
    try:
        workload = agentic_workload(args, len(args.concurrency or [1])) if agentic else None
        slo = goodput_slo(args)
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.concurrency is None:  # agentic: every session of a level in flight at once; fixed: 1,16,64
        args.concurrency = [workload.sessions] if workload is not None else [1, 16, 64]
    if workload is None and max(args.concurrency) > args.requests:
        # the level would measure at most REQUESTS in flight under a higher level's name
        print(f"bench: --concurrency {max(args.concurrency)} can never be reached with --requests {args.requests} "
              f"(at most {args.requests} in flight): valid: --requests >= {max(args.concurrency)}", file=sys.stderr)
        return EXIT_INVALID
    if workload is not None and workload.path and workload.sessions * len(args.concurrency) > len(
            workload.trace.conversations):
        print(f"bench: {args.trace} has {len(workload.trace.conversations)} conversations for {len(args.concurrency)} "
              f"level(s) of {workload.sessions} sessions: later levels replay conversations an earlier one played, "
              "their history possibly still in the prefix cache", file=sys.stderr)
    if args.write_trace:
        assert workload is not None and workload.params is not None
        sha = write_trace(generate_trace(workload.params, len(workload.trace.conversations)), args.write_trace)
        print(f"wrote {args.write_trace} ({len(workload.trace.conversations)} conversations: {workload.sessions} "
              f"per level x {len(args.concurrency)} level(s); sha256 {sha})", file=sys.stderr)
        return 0
    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    common = dict(concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
                  requests=args.requests, warmup=args.warmup, label=args.label, probe_drivers=not args.no_ssh)
    try:
        if agentic and args.limit:
            raise ValueError("--limit with the agentic workload is not supported yet: it sends chat completions "
                             "through the router, and --limit sends /generate to PD pairs directly")
        measured = limited_measure(spec, args.limit, args.engine_bench) if args.limit else None
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        router_url, _ = router_target(spec)
        if workload is not None:
            described = workload.describe()
            what = (f"agentic: {workload.sessions} sessions per level, up to {described['turns']} turns, reply "
                    f"{workload.reply_tokens} tokens, think {workload.think_s:g} s, largest context "
                    f"{described['largest_context']} tokens")
        else:
            what = f"in {args.input_len} / out {args.output_len} tokens, {args.requests} requests per level"
        repeats = f", the whole sweep {args.repeats} times" if args.repeats > 1 else ""
        print(f"bench {sent_to(router_url, measured.describe() if measured else None)} (model {served_model(spec)}, "
              f"engine {spec.cluster.engine}): C={','.join(map(str, args.concurrency))}, {what}{repeats}",
              file=sys.stderr)
        runs = []
        for i in range(1, args.repeats + 1):
            if args.repeats > 1:
                print(f"repeat {i}/{args.repeats}: C={','.join(map(str, args.concurrency))}", file=sys.stderr)
            if workload is not None and args.engine_bench == "sglang":
                record = run_sglang_agentic_bench(spec, workload, args.concurrency, args.warmup, args.label,
                                                  python=args.sglang_python, tokenizer=args.tokenizer,
                                                  probe_drivers=not args.no_ssh)
            elif workload is not None:
                record = run_agentic_bench(spec, workload, args.concurrency, args.warmup, args.label, args.timeout,
                                           not args.no_ssh, not args.quiet, slo)
            elif args.engine_bench == "sglang":
                record = run_sglang_bench(spec, python=args.sglang_python, tokenizer=args.tokenizer, **common)
            elif measured is not None:
                record = run_bench(spec, timeout_s=args.timeout, progress=not args.quiet, send=measured.stream,
                                   measured=measured.describe(), goodput_slo=slo, **common)
            else:
                record = run_bench(spec, timeout_s=args.timeout, progress=not args.quiet, goodput_slo=slo, **common)
            runs.append(record)
            if args.repeats > 1:
                print(f"repeat {i}/{args.repeats} done: {run_figures(record)}", file=sys.stderr)
    except (ValueError, RuntimeError) as exc:
        done = f" (after {len(runs)} of {args.repeats} repeats; nothing recorded)" if runs else ""
        print(f"bench: {exc}{done}", file=sys.stderr)
        return 1
    # the record is run 1 (its id, time and levels: the table's figures) with the later runs' levels
    # as `repeats` (pdkit.bench.noise.record_runs reads them back)
    record = with_repeats(runs)
    written = write_outputs(record, args.out, plot=not args.no_plot)
    print(render_markdown(record))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 1 if any(lv["errors"] for run in runs for lv in run["levels"]) else 0


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        a, b = find_run(args.a, args.runs), find_run(args.b, args.runs)
    except (LookupError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return EXIT_INVALID
    text = render_compare(a, b, args.margin)
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
    p.add_argument("--concurrency", type=parse_concurrency, default=None, metavar="C1,C2,...",
                   help="concurrency levels, run in this order (default 1,16,64; agentic: sessions in flight, "
                        "default --sessions, i.e. all of a level's sessions at once)")
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
    p.add_argument("--slo-ttft-ms", type=float, default=None,
                   help="with --slo-tpot-ms (or alone): record each level's goodput, requests/s that met every SLO")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT SLO for goodput (ms)")
    p.add_argument("--repeats", type=parse_repeats, default=1, metavar="N",
                   help=f"run the whole level sweep N times, 1..{MAX_REPEATS} (default 1), warm-up included each "
                        "time: the record is the first run (its id, levels, table, every ratio) with the later "
                        "runs' levels kept as `repeats`; the markdown adds each figure's median and spread, and "
                        "`pdkit compare` judges a B against this spread (fixed workload only; 3 is a start)")
    d = AgenticParams()
    g = p.add_argument_group(
        "agentic workload", "multi-turn sessions (docs/bench/README.md 'The agentic workload'): each turn's prompt is "
        "the session's history + the turn's new messages, the engine's real reply appended; each level plays "
        "--sessions fresh sessions with C of them in flight. --input-len, --output-len and --requests do not apply")
    g.add_argument("--workload", choices=("fixed", "agentic"), default="fixed",
                   help="fixed-length random-id prompts (default) or agentic sessions (implied by --trace)")
    g.add_argument("--sessions", type=int, default=None,
                   help=f"sessions per level (default {d.sessions}; with --trace: all its conversations)")
    g.add_argument("--turns", type=int, default=d.turns, help=f"turns per session (default {d.turns})")
    g.add_argument("--system-tokens", type=int, default=d.system_tokens,
                   help=f"the system prompt + tool schema every session shares, tokens (default {d.system_tokens})")
    g.add_argument("--turn-tokens", type=int, default=d.turn_tokens,
                   help=f"tokens added per turn: tool output + user message (default {d.turn_tokens})")
    g.add_argument("--reply-tokens", type=int, default=None,
                   help=f"max_tokens per turn, EOS ignored (default {d.reply_tokens}; with --trace: the reply length "
                        "pdkit wrote in it, else SGLang's 220)")
    g.add_argument("--think-s", type=float, default=d.think_s,
                   help=f"seconds between a reply and the session's next turn (default {d.think_s:g})")
    g.add_argument("--seed", type=int, default=d.seed, help=f"the generator's seed (default {d.seed})")
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="replay your own trace (SGLang's agentic-trace JSON) instead of generating one")
    g.add_argument("--max-turns", type=int, default=None, help="with --trace: at most this many turns per session")
    g.add_argument("--write-trace", default=None, metavar="FILE",
                   help="write the generated trace (every level's sessions) and exit, for SGLang's bench to replay: "
                        "--dataset-name agentic-trace (docs/bench/README.md)")
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
    p.add_argument("--margin", type=parse_margin, default=DEFAULT_MARGIN, metavar="FRACTION",
                   help=f"when A was benched with --repeats: B counts as better or worse only when it differs from "
                        f"A's median by more than A's spread + this fraction of A's figure (default "
                        f"{DEFAULT_MARGIN:g}, pdkit tune's noise.margin)")
    p.set_defaults(func=cmd_compare)
