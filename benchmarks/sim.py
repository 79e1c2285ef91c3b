"""Benchmark the sim behind the real router: can the rehearsal stack carry real client load cheaply?

    .venv/bin/python benchmarks/sim.py            # C=64 streaming chat requests for 20 s

Starts one sim prefill, one sim decode and smg in PD mode on loopback (pdkit.sim.localstack),
runs C concurrent streaming /v1/chat/completions clients through the router for the given
duration, and prints requests/s, output tokens/s, client-side TTFT and ITL (p50/p99), errors,
and the CPU the two sim processes used (from /proc, in cores). Target (issue 3): zero errors at
C=64 while the two sim processes together use at most one core.

These numbers describe the sim and this machine. They are never a performance claim about
SGLang or any GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdkit.bench.client import sse_lines  # noqa: E402
from pdkit.sim.localstack import MODEL, LocalPDStack  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (no psutil)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass
class Totals:
    completed: int = 0
    errors: int = 0
    output_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


async def one_request(session: aiohttp.ClientSession, url: str, body: dict, totals: Totals) -> None:
    started = time.perf_counter()
    last = None
    tokens = 0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for data in sse_lines(resp.content):
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(str(event["error"])[:200])
                for choice in event.get("choices", ()):
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if last is None:
                            totals.ttft.append(now - started)
                        else:
                            totals.itl.append(now - last)
                        last = now
                        tokens += 1
        if tokens != body["max_tokens"]:
            raise RuntimeError(f"got {tokens} tokens, asked for {body['max_tokens']}")
        totals.completed += 1
        totals.output_tokens += tokens
    except Exception as exc:  # noqa: BLE001 - every failure is counted and sampled
        totals.errors += 1
        if len(totals.error_samples) < 5:
            totals.error_samples.append(f"{type(exc).__name__}: {exc}")


async def run_load(router_url: str, concurrency: int, duration: float, max_tokens: int, prompt_words: int) -> tuple[Totals, float]:
    totals = Totals()
    url = f"{router_url}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        stop_at = started + duration

        async def worker(n: int) -> None:
            i = 0
            while time.perf_counter() < stop_at:
                words = " ".join(f"w{n}x{i}y{k}" for k in range(prompt_words))
                body = {"model": MODEL, "messages": [{"role": "user", "content": words}],
                        "max_tokens": max_tokens, "stream": True}
                await one_request(session, url, body, totals)
                i += 1

        await asyncio.gather(*(worker(n) for n in range(concurrency)))
        elapsed = time.perf_counter() - started
    return totals, elapsed


@dataclass
class Report:
    concurrency: int
    duration_s: float
    elapsed_s: float
    max_tokens: int
    prompt_words: int
    requests_completed: int
    errors: int
    requests_per_s: float
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    itl_mean_ms: float
    sim_prefill_cpu_cores: float
    sim_decode_cpu_cores: float
    sim_total_cpu_cores: float
    router_cpu_cores: float
    client_cpu_cores: float
    target_met: bool
    error_samples: list[str]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", "-c", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load (in-flight requests then finish)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the engines' and router's logs here")
    args = parser.parse_args(argv)

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="pdkit-sim-bench-"))
    # Batch log lines at SGLang's default interval; access lines off (they are per request and
    # only cost CPU here).
    sim_env = {"PDKIT_SIM_STARTUP_DELAY_S": "0.2"}
    sim_extra: list[str] = []
    with LocalPDStack(log_dir, sim_env=sim_env, sim_extra=sim_extra) as stack:
        pids = {"prefill": stack.prefill.pid, "decode": stack.decode.pid, "router": stack.router.pid}
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        client_before = time.process_time()
        wall_before = time.perf_counter()
        totals, elapsed = asyncio.run(run_load(stack.router_url, args.concurrency, args.duration,
                                               args.max_tokens, args.prompt_words))
        wall = time.perf_counter() - wall_before
        cores = {k: (cpu_seconds(p) - before[k]) / wall for k, p in pids.items()}
        client = (time.process_time() - client_before) / wall

    ms = 1000.0
    sim_total = cores["prefill"] + cores["decode"]
    report = Report(
        concurrency=args.concurrency, duration_s=args.duration, elapsed_s=round(elapsed, 2),
        max_tokens=args.max_tokens, prompt_words=args.prompt_words,
        requests_completed=totals.completed, errors=totals.errors,
        requests_per_s=round(totals.completed / elapsed, 2),
        output_tokens_per_s=round(totals.output_tokens / elapsed, 1),
        ttft_p50_ms=round(percentile(totals.ttft, 50) * ms, 1), ttft_p99_ms=round(percentile(totals.ttft, 99) * ms, 1),
        itl_p50_ms=round(percentile(totals.itl, 50) * ms, 1), itl_p99_ms=round(percentile(totals.itl, 99) * ms, 1),
        itl_mean_ms=round(statistics.fmean(totals.itl) * ms, 1) if totals.itl else float("nan"),
        sim_prefill_cpu_cores=round(cores["prefill"], 3), sim_decode_cpu_cores=round(cores["decode"], 3),
        sim_total_cpu_cores=round(sim_total, 3), router_cpu_cores=round(cores["router"], 3),
        client_cpu_cores=round(client, 3),
        target_met=totals.errors == 0 and totals.completed > 0 and sim_total <= 1.0,
        error_samples=totals.error_samples,
    )
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print(f"sim PD stack behind smg, C={report.concurrency}, {report.duration_s:.0f} s of load "
              f"({report.elapsed_s} s with drain), {report.max_tokens} output tokens per request")
        print(f"  requests/s        {report.requests_per_s}  ({report.requests_completed} completed, {report.errors} errors)")
        print(f"  output tokens/s   {report.output_tokens_per_s}")
        print(f"  TTFT p50 / p99    {report.ttft_p50_ms} / {report.ttft_p99_ms} ms")
        print(f"  ITL  p50 / p99    {report.itl_p50_ms} / {report.itl_p99_ms} ms (mean {report.itl_mean_ms})")
        print(f"  sim CPU (cores)   prefill {report.sim_prefill_cpu_cores} + decode {report.sim_decode_cpu_cores}"
              f" = {report.sim_total_cpu_cores}   (router {report.router_cpu_cores}, client {report.client_cpu_cores})")
        print(f"  target (0 errors, sims <= 1 core): {'met' if report.target_met else 'NOT met'}")
        for sample in report.error_samples:
            print(f"  error: {sample}")
        print(f"  logs: {log_dir}")
    return 0 if report.target_met else 1


if __name__ == "__main__":
    sys.exit(main())
