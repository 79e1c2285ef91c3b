"""The two gates of a candidate that are pure HTTP: correctness, then the soak.

Correctness: a fixed prompt set at temperature 0 (through the router, or to the target's own PD
pairs: pdkit.bench.measure), each answer's tokens
compared with the baseline's answer to the same prompt, recorded on the same target at the
campaign's start. Soak: load at the target concurrency for a while, watching the engines'
failure counters, the failures the router hands back, and the wedge condition (requests
running, no token produced). Comparison and verdicts are pure functions, tested without a
cluster; the HTTP parts are tested against sim engines behind the real router.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdkit.bench import generate_body
from pdkit.bench.measure import Measured
from pdkit.health import http_request
from pdkit.metricnames import FAILURE_COUNTERS, SGLANG
from pdkit.roll import metric_sums

# words the fixed prompts are built from: plain text, so any tokenizer takes them
_WORDS = ("river", "copper", "signal", "lantern", "orbit", "meadow", "cipher", "harbor", "quartz", "ember",
          "glacier", "violet", "thunder", "pepper", "saddle", "marble", "falcon", "willow", "anchor", "comet")
# a wedge needs work held and no token moved: these counters move with every decode step
PROGRESS_COUNTERS = (SGLANG["realtime_tokens"], SGLANG["cuda_graph_passes"], SGLANG["generation_tokens"])


def prompts(n: int) -> list[str]:
    """N fixed, distinct prompts (the same on every run: answers are compared across runs)."""
    out = []
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(6 + i % 5)]
        out.append(f"pdkit tune correctness prompt {i}: continue the list " + " ".join(words))
    return out


def answer_tokens(body: dict[str, Any]) -> list[Any]:
    """The output tokens of a native /generate answer: output_ids (SGLang, sim); without them the
    text's characters, so a comparison still locates the first divergence."""
    ids = body.get("output_ids")
    if isinstance(ids, list):
        return ids
    return list(str(body.get("text", "")))


def _measured(target: str | Measured, headers: dict[str, str]) -> Measured:
    """A router URL means the router (its engines unnamed); a Measured is used as it is."""
    return target if isinstance(target, Measured) else Measured((), target, headers)


def ask(target: str | Measured, headers: dict[str, str], prompt_set: Sequence[str], max_new_tokens: int,
        concurrency: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every prompt at temperature 0 through the router (TARGET a URL, or a Measured via the router)
    or to the target's own PD pairs in turn (a Measured via engines): [{"tokens"} or {"error"}] in
    prompt order."""
    payloads = [{"text": p, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                                "ignore_eos": True}}
                for p in prompt_set]
    out = []
    for status, body in _measured(target, headers).ask(payloads, concurrency, timeout_s):
        if status != 200:
            out.append({"error": f"HTTP {status or 'no answer'}: {body.strip()[:200]}"})
            continue
        try:
            out.append({"tokens": answer_tokens(json.loads(body))})
        except ValueError:
            out.append({"error": f"not JSON: {body[:200]}"})
    return out


def first_divergence(base: Sequence[Any], got: Sequence[Any]) -> int | None:
    """Index of the first token that differs (a shorter answer diverges where it ends); None: identical."""
    for i, (a, b) in enumerate(zip(base, got)):
        if a != b:
            return i
    return None if len(base) == len(got) else min(len(base), len(got))


def compare(baseline: Sequence[dict[str, Any]], answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per prompt: its first divergence and matched tokens; overall: the match rate, i.e. the
    share of the baseline's tokens reproduced before each answer's first divergence."""
    per = []
    matched = total = 0
    for i, (base, got) in enumerate(zip(baseline, answers)):
        ref = base.get("tokens") or []
        total += len(ref)
        if "error" in got:
            per.append({"prompt": i, "error": got["error"], "first_divergence": 0, "matched": 0, "tokens": len(ref)})
            continue
        div = first_divergence(ref, got["tokens"])
        n = len(ref) if div is None else min(div, len(ref))
        matched += n
        per.append({"prompt": i, "first_divergence": div, "matched": n, "tokens": len(ref)})
    return {"match_rate": (matched / total) if total else 0.0, "matched": matched, "tokens": total,
            "identical": sum(p.get("first_divergence") is None and "error" not in p for p in per),
            "errors": sum("error" in p for p in per), "prompts": per}


def correctness_verdict(comparison: dict[str, Any], min_match_rate: float, exact: bool) -> tuple[bool, str]:
    n = len(comparison["prompts"])
    diverged = [p for p in comparison["prompts"] if p.get("first_divergence") is not None or "error" in p]
    where = ", ".join(f"#{p['prompt']} at token {p['first_divergence']}" + (f" ({p['error']})" if "error" in p else "")
                      for p in diverged[:4]) + (f" (+{len(diverged) - 4} more)" if len(diverged) > 4 else "")
    summary = (f"match rate {comparison['match_rate']:.3f} ({comparison['matched']}/{comparison['tokens']} baseline "
               f"tokens before the first divergence), {comparison['identical']}/{n} prompts identical")
    if comparison["errors"]:
        return False, f"{comparison['errors']} of {n} prompts failed: {where}"
    if exact and diverged:
        return False, f"exactness required and {len(diverged)} prompt(s) diverge: {where}; {summary}"
    if comparison["match_rate"] < min_match_rate:
        return False, f"{summary}, below the threshold {min_match_rate:g}; first divergences: {where}"
    return True, summary + (f"; first divergences: {where}" if diverged else "")


# ------------------------------------------------------------------ soak


def engine_sample(urls: dict[str, str], timeout_s: float = 5.0) -> dict[str, dict[str, float] | None]:
    """label -> {metric: sum} of the failure, running and progress series (None: /metrics unreadable)."""
    names = (*FAILURE_COUNTERS, SGLANG["running"], *PROGRESS_COUNTERS)
    out: dict[str, dict[str, float] | None] = {}
    for label, url in urls.items():
        status, body = http_request(f"{url}/metrics", timeout=timeout_s)
        out[label] = metric_sums(body, names) if status == 200 else None
    return out


@dataclass
class WedgeWatch:
    """Per engine: since when it has held running requests without a progress counter moving."""

    window_s: float
    stuck_since: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def observe(self, now: float, sample: dict[str, dict[str, float] | None]) -> list[str]:
        """Engines wedged at NOW (running > 0 and no progress for window_s)."""
        wedged = []
        for label, figures in sample.items():
            if figures is None:
                continue
            progress = sum(figures.get(n, 0.0) for n in PROGRESS_COUNTERS)
            running = figures.get(SGLANG["running"], 0.0)
            moved = label not in self.last or progress != self.last[label]
            self.last[label] = progress
            if running <= 0 or moved:
                self.stuck_since.pop(label, None)
                continue
            since = self.stuck_since.setdefault(label, now)
            if now - since >= self.window_s:
                wedged.append(label)
        return wedged


def counter_moves(before: dict[str, dict[str, float] | None],
                  after: dict[str, dict[str, float] | None]) -> dict[str, dict[str, float]]:
    """Failure counters that went up between two samples, per engine."""
    out = {}
    for label, a in before.items():
        b = after.get(label)
        if a is None or b is None:
            continue
        moved = {n: b.get(n, 0.0) - a.get(n, 0.0) for n in FAILURE_COUNTERS if b.get(n, 0.0) > a.get(n, 0.0)}
        if moved:
            out[label] = moved
    return out


class LoadThread:
    """CONCURRENCY streaming /generate requests until stopped (pdkit.bench's client), through the
    router or to the target's own PD pairs in turn (TARGET: a router URL or a Measured)."""

    def __init__(self, target: str | Measured, headers: dict[str, str], concurrency: int, input_len: int,
                 output_len: int,
                 timeout_s: float = 120.0, seed: int = 7_000_000) -> None:
        self.measured, self.concurrency = _measured(target, headers), concurrency
        self.input_len, self.output_len, self.timeout_s, self.seed = input_len, output_len, timeout_s, seed
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="pdkit-tune-soak")

    def start(self) -> LoadThread:
        self.thread.start()
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        # lazy: aiohttp costs ~130 ms more than `pdkit --help` (which imports this module) loads; the soak only
        import aiohttp

        self._loop = asyncio.get_running_loop()
        counter = iter(range(10**9))

        async def worker(session) -> None:
            while not self._stop.is_set():
                n = next(counter)
                result = await self.measured.stream(session, n,
                                                    generate_body(self.seed + n, self.input_len, self.output_len),
                                                    self.output_len, self.timeout_s)
                if self._cancelled and not result.ok:
                    return  # hung up by stop(cancel=True): not a failure of the engine
                if result.ok:
                    self.ok += 1
                else:
                    self.failed.append(result.error or "failed")

        # two connections per request: one to a PD pair's prefill and one to its decode at once
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * self.concurrency)) as session:
            self._tasks = [asyncio.ensure_future(worker(session)) for _ in range(self.concurrency)]
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self, cancel: bool = False) -> None:
        """Stop sending; CANCEL: also hang up the requests in flight (a wedged engine never ends them)."""
        self._cancelled = cancel
        self._stop.set()
        if cancel and self._loop is not None:
            for task in self._tasks:
                self._loop.call_soon_threadsafe(task.cancel)
        self.thread.join(timeout=self.timeout_s + 10)


def soak(target: str | Measured, headers: dict[str, str], engine_urls: dict[str, str], seconds: float, concurrency: int,
         input_len: int, output_len: int, wedge_window_s: float, interval_s: float = 0.5,
         progress: Callable[[str], None] = lambda _m: None) -> tuple[bool, str, dict[str, Any]]:
    """(ok, why, figures): load for SECONDS (TARGET: the router's URL, or a Measured: the router or
    the target's own PD pairs) while ENGINE_URLS are watched; fails at once on a wedge, at the end
    on failures."""
    watch = WedgeWatch(wedge_window_s)
    before = engine_sample(engine_urls)
    unreadable = [k for k, v in before.items() if v is None]
    if unreadable:
        return False, f"/metrics unreadable before the soak on {', '.join(unreadable)}", {}
    measured = _measured(target, headers)
    load = LoadThread(measured, headers, concurrency, input_len, output_len).start()
    started = time.monotonic()
    wedged: list[str] = []
    try:
        while time.monotonic() - started < seconds:
            time.sleep(interval_s)
            wedged = watch.observe(time.monotonic(), engine_sample(engine_urls))
            if wedged:
                break
    finally:
        # a wedged engine never finishes what it holds: hang up, so that the router and the
        # engine drop those requests and the rollback's drain can empty it
        load.stop(cancel=bool(wedged))
    after = engine_sample(engine_urls)
    figures = {"seconds": round(time.monotonic() - started, 1), "ok": load.ok, "failed": len(load.failed),
               "errors": load.failed[:5], "concurrency": concurrency, "via": measured.via}
    where = "through the router" if measured.via == "router" else f"to {', '.join(r.label for r in measured.routes)}"
    if wedged:
        figures["wedged"] = wedged
        return False, (f"wedged: {', '.join(wedged)} held running requests and produced no token for "
                       f"{wedge_window_s:g} s (after {figures['seconds']:.0f} s at C={concurrency}); doctor's queues "
                       "check calls this 'wedged'"), figures
    moved = counter_moves(before, after)
    if moved:
        figures["failure_counters"] = moved
        return False, f"engine failure counters moved during the soak: {moved}", figures
    if load.failed:
        return False, (f"{len(load.failed)} of {load.ok + len(load.failed)} soak requests failed {where}: "
                       f"{load.failed[:3]}"), figures
    if load.ok == 0 and seconds > 0:
        return False, f"no soak request finished in {figures['seconds']:.0f} s at C={concurrency}", figures
    return True, (f"{load.ok} requests at C={concurrency} {where} over {figures['seconds']:.0f} s: no failure, "
                  "no failure counter moved, no wedge"), figures
