"""`pdkit bench --engine-bench sglang`: SGLang's own `python -m sglang.benchmark.serving` (random-ids
dataset, `--random-range-ratio 1` for fixed lengths, one run per concurrency) against the router,
its `--output-file` JSONL read into the same record as pdkit's client makes (pdkit.bench.record).

The agentic workload (pdkit.bench.agentic) runs SGLang's multi-turn replay of the same trace file:
`--dataset-name agentic-trace --backend sglang-oai-chat`, one run per level with
`--dataset-offset` so each level plays the same fresh sessions pdkit's client would."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdkit.bench.agentic import AgenticWorkload, check_agentic, generate_trace, write_trace
from pdkit.bench.client import router_target
from pdkit.bench.record import (
    LevelPages,
    check_workload,
    kv_prefills,
    level_kv,
    record_head,
    say_kv_unread,
    scrape_kv,
    served_model,
)

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

SGLANG_BENCH_MODULE = "sglang.benchmark.serving"


def _ms(result: dict[str, Any], metric: str) -> dict[str, float | None]:
    return {"mean": result.get(f"mean_{metric}_ms"), "p50": result.get(f"median_{metric}_ms"),
            "p99": result.get(f"p99_{metric}_ms")}


def level_from_sglang_result(result: dict[str, Any], requests: int | None = None) -> dict[str, Any]:
    """One line of sglang.benchmark.serving's --output-file (0.5.23 keys) -> a levels[] entry.

    The result line has no prompt count: `requests` is the --num-prompts we passed; without it,
    the `errors` list that --output-details adds, else completed (errors unknown -> 0).
    """
    completed = int(result["completed"])
    error_list = [e for e in (result.get("errors") or []) if e]
    if requests is None:
        requests = len(result["errors"]) if isinstance(result.get("errors"), list) else completed
    return {
        "concurrency": result.get("max_concurrency"),
        "requests": requests,
        "completed": completed,
        "errors": requests - completed,
        "error_samples": list(dict.fromkeys(str(e)[:200] for e in error_list))[:3],
        "duration_s": result["duration"],
        "input_tokens": result.get("total_input_tokens"),
        "output_tokens": result.get("total_output_tokens"),
        "output_tok_s": result["output_throughput"],
        "requests_s": result["request_throughput"],
        "ttft_ms": _ms(result, "ttft"),
        "tpot_ms": _ms(result, "tpot"),
        "itl_ms": _ms(result, "itl"),
        "e2e_ms": _ms(result, "e2e_latency"),
    }


def read_sglang_results(path: str | Path, requests: int | None = None) -> list[dict[str, Any]]:
    """Every result line of an sglang.benchmark.serving --output-file, as levels[] entries."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    return [level_from_sglang_result(json.loads(line), requests) for line in lines]


def sglang_bench_available(python: str) -> bool:
    """True when `python` can import sglang.benchmark.serving (without running it)."""
    # find_spec of a submodule imports its parent package, and raises when that is missing
    probe = ("import importlib.util, sys\n"
             f"try:\n    found = importlib.util.find_spec({SGLANG_BENCH_MODULE!r}) is not None\n"
             "except ImportError:\n    found = False\n"
             "sys.exit(0 if found else 1)\n")
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def sglang_bench_command(python: str, router_url: str, model: str, tokenizer: str | None, concurrency: int,
                         requests: int, input_len: int, output_len: int, warmup: int, output_file: str) -> list[str]:
    """argv of one `python -m sglang.benchmark.serving` run at one concurrency (fixed lengths)."""
    argv = [python, "-m", SGLANG_BENCH_MODULE, "--backend", "sglang", "--base-url", router_url,
            # random-ids: token ids drawn locally. `random` samples ShareGPT text it downloads from the
            # hub first, which fails on an offline GPU node (seen on the lent H200)
            "--model", model, "--dataset-name", "random-ids",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "1", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--warmup-requests", str(warmup), "--output-file", output_file,
            # the ids go out as they are (no detokenize/retokenize round trip): exact input lengths
            "--tokenize-prompt"]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def sglang_agentic_command(python: str, router_url: str, model: str, tokenizer: str | None, concurrency: int,
                           sessions: int, offset: int, reply_tokens: int, max_turns: int | None, warmup: int,
                           trace_path: str, output_file: str) -> list[str]:
    """argv of one `python -m sglang.benchmark.serving` replay of an agentic trace at one concurrency.

    Upstream (identical in the pinned 0.5.17 and 0.5.23): sglang/benchmark/datasets/agentic_trace.py
    (AgenticTraceDataset: `--dataset-path`, `--num-prompts` conversations after rotating the list by
    `--dataset-offset`, `--sharegpt-output-len` tokens per turn, `--agentic-max-turns`) and
    sglang/benchmark/serving.py (`wrap_multi_turn_request_func`: each round's messages appended to
    the history, the server's real reply fed back; multi-turn needs a chat backend:
    MULTI_TURN_BACKENDS; `--max-concurrency` conversations in flight; ignore_eos on unless
    --disable-ignore-eos). It has no think time between turns."""
    argv = [python, "-m", SGLANG_BENCH_MODULE, "--backend", "sglang-oai-chat", "--base-url", router_url,
            "--model", model, "--dataset-name", "agentic-trace", "--dataset-path", trace_path,
            "--num-prompts", str(sessions), "--dataset-offset", str(offset),
            "--sharegpt-output-len", str(reply_tokens), "--max-concurrency", str(concurrency),
            "--warmup-requests", str(warmup), "--output-file", output_file]
    if max_turns:
        argv += ["--agentic-max-turns", str(max_turns)]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def _sglang_env(headers: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    if "Authorization" in headers:
        # serving.py's get_auth_headers() reads OPENAI_API_KEY: the key stays out of argv
        env["OPENAI_API_KEY"] = headers["Authorization"].removeprefix("Bearer ")
    return env


def run_sglang_agentic_bench(spec: ClusterSpec, workload: AgenticWorkload, concurrency: Sequence[int] = (8,),
                             warmup: int = 1, label: str = "", python: str = sys.executable,
                             tokenizer: str | None = None, probe_drivers: bool = True,
                             timeout_s: float = 3600.0) -> dict[str, Any]:
    """SGLang's own multi-turn replay of the workload's trace through the router, into a pdkit
    record (no by-depth figures: its result file has none; no think time: it has none)."""
    check_agentic(spec, workload, warmup)
    if not sglang_bench_available(python):
        raise RuntimeError(f"{python} cannot import {SGLANG_BENCH_MODULE}: install sglang there, or give "
                           "--sglang-python of a virtualenv that has it, or use --engine-bench pdkit")
    if workload.think_s:
        print(f"bench: {SGLANG_BENCH_MODULE} has no think time: sessions replay without the {workload.think_s:g} s "
              "pause (the record says think_s 0)", file=sys.stderr)
    router_url, headers = router_target(spec)
    described = {**workload.describe(), "think_s": 0.0}
    record = record_head(spec, SGLANG_BENCH_MODULE, label, workload.largest_context() - workload.reply_tokens,
                         workload.reply_tokens, workload.turns_per_level(0), warmup, probe_drivers, router_url,
                         workload=described)
    pages = LevelPages.named_in(spec, record)
    with tempfile.TemporaryDirectory(prefix="pdkit-bench-") as tmp:
        trace_path = workload.path
        if trace_path is None:  # the generated trace, byte for byte the one pdkit's client replays
            assert workload.params is not None
            trace_path = str(Path(tmp) / "agentic-trace.json")
            write_trace(generate_trace(workload.params, len(workload.trace.conversations)), trace_path)
        for level_index, c in enumerate(concurrency):
            out_file = str(Path(tmp) / f"c{c}-{level_index}.jsonl")
            argv = sglang_agentic_command(python, router_url, served_model(spec), tokenizer, c, workload.sessions,
                                          workload.offset(level_index), workload.reply_tokens, workload.max_turns,
                                          warmup, trace_path, out_file)
            print(f"C={c}: {shlex.join(argv)}", file=sys.stderr)
            before = pages.sample()
            done = subprocess.run(argv, env=_sglang_env(headers), timeout=timeout_s)
            after = pages.sample()
            if done.returncode != 0 or not Path(out_file).is_file():
                raise RuntimeError(f"{SGLANG_BENCH_MODULE} failed at concurrency {c} (exit {done.returncode})")
            levels = read_sglang_results(out_file, workload.turns_per_level(level_index))
            for level in levels[:1]:
                # the window holds the run's own warm-up requests too
                level.update(pages.figures(c, before, after, level["ttft_ms"]["mean"], warmup_included=warmup))
            record["levels"].extend(levels)
    return record


def run_sglang_bench(spec: ClusterSpec, concurrency: Sequence[int] = (16,), input_len: int = 512,
                     output_len: int = 128, requests: int = 64, warmup: int = 4, label: str = "",
                     python: str = sys.executable, tokenizer: str | None = None, probe_drivers: bool = True,
                     timeout_s: float = 3600.0) -> dict[str, Any]:
    """SGLang's own serving benchmark through the router, read into a pdkit record."""
    check_workload(spec, input_len, output_len, requests, warmup)
    if not sglang_bench_available(python):
        raise RuntimeError(f"{python} cannot import {SGLANG_BENCH_MODULE}: install sglang there, or give "
                           "--sglang-python of a virtualenv that has it, or use --engine-bench pdkit")
    router_url, headers = router_target(spec)
    record = record_head(spec, SGLANG_BENCH_MODULE, label, input_len, output_len, requests, warmup,
                         probe_drivers, router_url)
    prefills = kv_prefills(spec, record["env"]["measured"])
    record["kv_prefills"] = list(prefills)
    env = _sglang_env(headers)
    with tempfile.TemporaryDirectory(prefix="pdkit-bench-") as tmp:
        for c in concurrency:
            out_file = str(Path(tmp) / f"c{c}.jsonl")
            argv = sglang_bench_command(python, router_url, served_model(spec), tokenizer, c, requests,
                                        input_len, output_len, warmup, out_file)
            print(f"C={c}: {shlex.join(argv)}", file=sys.stderr)
            before = scrape_kv(prefills)
            done = subprocess.run(argv, env=env, timeout=timeout_s)
            after = scrape_kv(prefills)
            if done.returncode != 0 or not Path(out_file).is_file():
                raise RuntimeError(f"{SGLANG_BENCH_MODULE} failed at concurrency {c} (exit {done.returncode})")
            levels = read_sglang_results(out_file, requests)
            if prefills and len(levels) == 1:
                # the window holds the run's own --warmup-requests too (serving.py sends them first)
                levels[0]["kv"] = {**level_kv(before, after, levels[0]["ttft_ms"]["mean"]), "warmup_included": warmup}
                say_kv_unread(c, levels[0]["kv"])
            record["levels"].extend(levels)
    return record

