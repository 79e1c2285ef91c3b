"""pdkit's load client: streamed /generate requests timed chunk by chunk, the body they carry, and
one concurrency level's loop; `pdkit bench`, doctor's bench and `pdkit tune`'s measurements
(pdkit.bench.measure) all send with it, so it sits below them.

Requests go to SGLang's native `/generate` with `input_ids` (exactly N input tokens; the router
refuses token ids on /v1/completions) and `sampling_params` `max_new_tokens` = output length with
`ignore_eos: true` (SGLang keeps generating past EOS; the sim always produces exactly
max_new_tokens). Every streamed chunk carries `meta_info.completion_tokens`, so output tokens are
counted by the server, not guessed from text. A request that ends with another number of output
tokens than asked for counts as an error.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pdkit.bench.stats import WORKER_HEADER, RequestResult, StreamEnd, failure_kind, stream_failure
from pdkit.render.paths import router_auth_headers, router_url

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

R = TypeVar("R")  # what one job of run_pool gives

# Prompt token ids are drawn from this range: inside every real vocabulary (and the sim's 32000),
# clear of the low special-token ids.
PROMPT_TOKEN_RANGE = (1000, 30000)


def router_target(spec: ClusterSpec) -> tuple[str, dict[str, str]]:
    """(router base URL, auth headers) of the first router host."""
    if not spec.router_hosts:
        raise ValueError("the inventory declares no router (pdkit_router on a host): bench goes through the router")
    router = spec.router_hosts[0]
    assert router.router is not None
    return router_url(router), router_auth_headers(spec)


async def sse_lines(content: Any) -> Any:
    """The `data:` payloads of a server-sent-event stream (aiohttp's response.content), `[DONE]` included."""
    async for raw in content:
        line = raw.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def stream_events(session, url: str, headers: dict[str, str], body: dict[str, Any], timeout_s: float,
                        on_event: Callable[[Any], None]) -> tuple[StreamEnd, str | None, tuple[str, str | None] | None]:
    """POST BODY to URL and read the server-sent events of the answer up to `[DONE]`, each one parsed, seen by the
    stream's end (pdkit.bench.stats.StreamEnd), then handed to ON_EVENT. Returns that end, the router's worker
    header and None, or why the stream failed and its finish reason: a status other than 200, a timeout, a client
    or decoding error, or the rule the load clients share (pdkit.bench.stats.stream_failure: aborted, no [DONE],
    empty)."""
    import aiohttp  # lazy: aiohttp takes ~0.3 s to import, and only a run that sends needs it

    end = StreamEnd()
    worker = None
    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            worker = resp.headers.get(WORKER_HEADER)
            if resp.status != 200:
                return end, worker, (f"status {resp.status}: {(await resp.text())[:200].strip()}", None)
            async for payload in sse_lines(resp.content):
                if payload == b"[DONE]":
                    end.done = True
                    break
                event = json.loads(payload)
                end.see(event)
                on_event(event)
    except TimeoutError:
        return end, worker, (f"hang: timed out after {timeout_s:.0f} s", None)
    except (aiohttp.ClientError, ValueError) as exc:
        return end, worker, (f"{type(exc).__name__}: {str(exc)[:200]}", None)
    why = stream_failure(end)
    return end, worker, None if why is None else (why, end.shown_finish())


async def stream_one(session, url: str, headers: dict[str, str], body: dict[str, Any], output_len: int,
                     timeout_s: float) -> RequestResult:
    """Send one streaming /generate request and time its chunks. A failed stream is judged by the
    rule the load clients share (pdkit.bench.stats.stream_failure: aborted, no [DONE], empty), then
    by its length: with ignore_eos every answer must have exactly output_len tokens."""
    start = time.perf_counter()
    chunk_times: list[float] = []
    tokens = prompt = 0

    def see(event: Any) -> None:
        nonlocal tokens, prompt
        meta = event.get("meta_info") or {}
        count = int(meta.get("completion_tokens") or 0)
        prompt = int(meta.get("prompt_tokens") or prompt)
        if count > tokens:
            chunk_times.append(time.perf_counter() - start)
            tokens = count

    end, worker, failure = await stream_events(session, url, headers, body, timeout_s, see)
    latency = time.perf_counter() - start

    def failed(why: str, finish: str | None = None) -> RequestResult:
        return RequestResult(ok=False, error=why, kind=failure_kind(why), finish_reason=finish, worker=worker,
                             rid=end.rid)

    if failure is not None:
        return failed(*failure)
    if tokens != output_len:
        return failed(f"{'short' if tokens < output_len else 'long'} ({end.shown_finish()}): got {tokens} output "
                      f"tokens, asked for {output_len}", end.shown_finish())
    return RequestResult(ok=True, ttft=chunk_times[0], latency=latency, output_tokens=tokens,
                         prompt_tokens=prompt, chunk_times=tuple(chunk_times), finish_reason=end.finish_reason,
                         worker=worker, rid=end.rid)


def prompt_ids(seed: int, input_len: int) -> list[int]:
    """A deterministic prompt of exactly input_len token ids (distinct per seed: no prefix-cache hits)."""
    rng = random.Random(seed)
    return [rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(input_len)]


def generate_body(seed: int, input_len: int, output_len: int) -> dict[str, Any]:
    """A native /generate request with fixed input and output lengths."""
    return {
        "input_ids": prompt_ids(seed, input_len),
        "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }


class Progress:
    """A one-line progress bar on stderr (a line per quarter when stderr is not a terminal)."""

    def __init__(self, title: str, total: int, enabled: bool = True, stream=None) -> None:
        self.title, self.total, self.enabled = title, total, enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.errors = 0
        self._last_draw = 0.0
        self._last_quarter = 0

    def step(self, ok: bool) -> None:
        self.done += 1
        self.errors += 0 if ok else 1
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw > 0.1 or self.done == self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
        else:
            quarter = self.done * 4 // max(self.total, 1)
            if quarter > self._last_quarter:
                self._last_quarter = quarter
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def line(self) -> str:
        width = 30
        filled = width * self.done // max(self.total, 1)
        return (f"{self.title} [{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total}"
                f"  errors {self.errors}")

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


# Sends one request of a level: (aiohttp session, request index, body, output_len, timeout_s) -> result.
# The default streams it to the router's /generate; `pdkit tune` gives one that sends it to chosen
# engines (pdkit.bench.measure: the target's own PD pairs).
Sender = Callable[[Any, int, dict[str, Any], int, float], Awaitable[RequestResult]]


def router_sender(url: str, headers: dict[str, str]) -> Sender:
    """The Sender that streams every request to URL (the router's /generate)."""
    async def send(session, _index: int, body: dict[str, Any], output_len: int, timeout_s: float) -> RequestResult:
        return await stream_one(session, url, headers, body, output_len, timeout_s)

    return send


async def run_level(url: str, headers: dict[str, str], concurrency: int, requests: int, input_len: int,
                    output_len: int, timeout_s: float, seed: int, progress: Progress | None = None,
                    send: Sender | None = None) -> tuple[list[RequestResult], float]:
    """`requests` requests, `concurrency` in flight at any time; returns the results and the wall time.
    SEND: how each request goes out (default: streamed to URL)."""
    send = send or router_sender(url, headers)

    async def one(session, i: int) -> list[RequestResult]:
        result = await send(session, i, generate_body(seed + i, input_len, output_len), output_len, timeout_s)
        if progress is not None:
            progress.step(result.ok)
        return [result]

    # two connections per request: a sender that talks to a PD pair itself holds a prefill's and a
    # decode's at once (with one per request, C decodes could wait for prefills that never get one)
    return await run_pool(requests, concurrency, 2 * concurrency, one)


async def run_pool(jobs: int, concurrency: int, connections: int,
                   job: Callable[[Any, int], Awaitable[list[R]]]) -> tuple[list[R], float]:
    """JOB(session, i) for i in 0..JOBS-1, CONCURRENCY of them in flight at any time over one aiohttp session
    of at most CONNECTIONS connections: every job's results, in the order the jobs end, and the wall time."""
    import aiohttp  # lazy: aiohttp takes ~0.3 s to import, and only a run that sends needs it

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)
    results: list[R] = []

    async def worker(session) -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results.extend(await job(session, i))

    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(min(concurrency, jobs))))
        duration = time.perf_counter() - start
    return results, duration

