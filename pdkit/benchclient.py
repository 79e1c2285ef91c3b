"""pdkit's load client: one streamed /generate request, timed chunk by chunk, and the router it goes to.

`pdkit bench` (pdkit.bench) and `pdkit tune`'s measurements (pdkit.tune.measure) both send with it;
it sits below both so that neither imports the other for it.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from pdkit.benchstats import WORKER_HEADER, RequestResult, StreamEnd, failure_kind, stream_failure
from pdkit.paths import router_auth_headers, router_url

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec


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


async def stream_one(session, url: str, headers: dict[str, str], body: dict[str, Any], output_len: int,
                     timeout_s: float) -> RequestResult:
    """Send one streaming /generate request and time its chunks. A failed stream is judged by the
    rule the load clients share (pdkit.benchstats.stream_failure: aborted, no [DONE], empty), then
    by its length: with ignore_eos every answer must have exactly output_len tokens."""
    import aiohttp

    start = time.perf_counter()
    chunk_times: list[float] = []
    tokens = prompt = 0
    end = StreamEnd()
    worker = None

    def failed(why: str, finish: str | None = None) -> RequestResult:
        return RequestResult(ok=False, error=why, kind=failure_kind(why), finish_reason=finish, worker=worker,
                             rid=end.rid)

    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            worker = resp.headers.get(WORKER_HEADER)
            if resp.status != 200:
                text = (await resp.text())[:200].strip()
                return failed(f"status {resp.status}: {text}")
            async for payload in sse_lines(resp.content):
                if payload == b"[DONE]":
                    end.done = True
                    break
                event = json.loads(payload)
                end.see(event)
                meta = event.get("meta_info") or {}
                count = int(meta.get("completion_tokens") or 0)
                prompt = int(meta.get("prompt_tokens") or prompt)
                if count > tokens:
                    chunk_times.append(time.perf_counter() - start)
                    tokens = count
    except TimeoutError:
        return failed(f"hang: timed out after {timeout_s:.0f} s")
    except (aiohttp.ClientError, ValueError) as exc:
        return failed(f"{type(exc).__name__}: {str(exc)[:200]}")
    latency = time.perf_counter() - start
    why = stream_failure(end)
    if why is not None:
        return failed(why, end.shown_finish())
    if tokens != output_len:
        return failed(f"{'short' if tokens < output_len else 'long'} ({end.shown_finish()}): got {tokens} output tokens, "
                      f"asked for {output_len}", end.shown_finish())
    return RequestResult(ok=True, ttft=chunk_times[0], latency=latency, output_tokens=tokens,
                         prompt_tokens=prompt, chunk_times=tuple(chunk_times), finish_reason=end.finish_reason,
                         worker=worker, rid=end.rid)
