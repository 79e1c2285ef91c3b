"""What the correctness gate, the soak and the bench of a `pdkit tune` campaign send their requests
to (Measured: the router, or the target's own routes), and the sending itself.

A candidate is rolled onto the campaign's target only. Through the router over the whole cluster
a lever on the target gets a share of the load that the router's policy and chance decide (the
canary's decode: about 1/3 of the requests on the lab, anything from none to all of a handful),
so a corrupting or wedging lever strikes or not from run to run, and the bench measures mostly
the engines the candidate did not touch. So:

- **target = the engines the router fronts** (`target: all` on one router): every request goes
  through the router, as the users' do (`Measured.via == "router"`);
- **otherwise** every request goes to one of the target's own **PD pairs** directly, in the form
  the router gives it: the same JSON to the pair's prefill and decode at once, with
  `bootstrap_host` / `bootstrap_port` (the prefill's address and bootstrap port) and a fresh
  random `bootstrap_room` added; the decode's answer is the answer, the prefill's body is read to
  its end (SGLang's own PD load balancer, `sglang.srt.disaggregation.mini_lb`, and smg do exactly
  this). Requests take the pairs in turn, so each pair gets its share and every target engine is
  measured. A target unified engine is asked directly, as it is.

Which routes: pdkit.bench.routes. `pdkit bench --limit HOST` and doctor's per-engine bench send
the same way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from pdkit.agent import health
from pdkit.bench.client import router_target, stream_one
from pdkit.bench.routes import Route, fronted_engines, target_routes
from pdkit.bench.stats import RequestResult


@dataclass(frozen=True)
class Measured:
    """The router (routes empty) or the target's own routes; what a record says was measured."""

    hosts: tuple[str, ...]
    router_url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()
    router_engines: tuple[str, ...] = ()  # the engines the router fronts

    @property
    def via(self) -> str:
        return "router" if self.router_url is not None and not self.routes else "engines"

    @property
    def engines(self) -> list[str]:
        out = []
        for r in self.routes:
            for e in (r.prefill, r.engine):
                if e is not None and e.label not in out:
                    out.append(e.label)
        return out

    def describe(self) -> dict[str, Any]:
        """For records (bench env.measured, the candidate's `measured`)."""
        if self.via == "router":
            return {"via": "router", "router_url": self.router_url, "hosts": list(self.hosts),
                    "engines": sorted(self.router_engines)}
        return {"via": "engines", "hosts": list(self.hosts), "engines": self.engines,
                "routes": [r.label for r in self.routes]}

    def route(self, index: int) -> Route:
        return self.routes[index % len(self.routes)]

    # ---- sending
    async def stream(self, session, index: int, body: dict[str, Any], output_len: int, timeout_s: float):
        """One streamed request (a pdkit.bench.client.Sender): to the router, or to route INDEX (round robin)."""
        if self.via == "router":
            return await stream_one(session, f"{self.router_url}/generate", self.headers, body, output_len, timeout_s)
        route = self.route(index)
        url = f"{route.engine.url}/generate"
        if route.prefill is None:
            return await stream_one(session, url, {}, body, output_len, timeout_s)
        result, prefill_failed = await _pd(session, route, route.pd_body(body),
                                           lambda s, b: stream_one(s, url, {}, b, output_len, timeout_s),
                                           lambda r: r.ok, timeout_s)
        if prefill_failed:
            return RequestResult(ok=False, error=prefill_failed)
        return result if result.ok else replace(result, error=f"decode {route.engine.label}: {result.error}")

    def ask(self, payloads: Sequence[dict[str, Any]], concurrency: int, timeout_s: float) -> list[tuple[int, str]]:
        """(status, body) of each non-streaming /generate PAYLOAD, CONCURRENCY at a time, in order."""
        if self.via == "router":
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
                return list(pool.map(lambda p: health.http_request(f"{self.router_url}/generate", p, timeout=timeout_s,
                                                                   headers=self.headers),
                                     payloads))
        # one event loop for all of them (pdkit tune runs gevent-patched: no loop per thread)
        return asyncio.run(self._ask_engines(payloads, concurrency, timeout_s))

    def ask_blocking(self, payloads: Sequence[dict[str, Any]], concurrency: int,
                     timeout_s: float) -> list[tuple[int, str]]:
        """As ask, with blocking HTTP in threads and no event loop: the answer gate scores while its
        load's event loop runs (under pdkit tune's gevent every thread is a greenlet of one OS thread,
        and asyncio allows one running loop per OS thread). A PD answer merges the prefill's input
        logprobs as ask does; a prefill that fails leaves its decode to its own timeout."""
        if self.via == "router":
            return self.ask(payloads, concurrency, timeout_s)

        def one(job: tuple[int, dict[str, Any]]) -> tuple[int, str]:
            index, payload = job
            route = self.route(index)
            url = f"{route.engine.url}/generate"
            if route.prefill is None:
                return health.http_request(url, payload, timeout=timeout_s)
            body = route.pd_body(payload)
            with ThreadPoolExecutor(max_workers=2) as pair:
                prefill = pair.submit(health.http_request, f"{route.prefill.url}/generate", body, timeout=timeout_s)
                decode = pair.submit(health.http_request, url, body, timeout=timeout_s)
                (p_status, p_text), (d_status, d_text) = prefill.result(), decode.result()
            if p_status != 200:
                return 0, f"prefill {route.prefill.label}: HTTP {p_status or 'no answer'}: {p_text.strip()[:200]}"
            if d_status != 200:
                return d_status, f"decode {route.engine.label}: {d_text}"
            return 200, merge_input_logprobs(p_text, d_text) if payload.get("return_logprob") else d_text

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, enumerate(payloads)))

    async def _ask_engines(self, payloads: Sequence[dict[str, Any]], concurrency: int,
                           timeout_s: float) -> list[tuple[int, str]]:
        import aiohttp  # lazy: aiohttp takes ~0.3 s to import, and only a run that sends needs it

        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(session, index: int, payload: dict[str, Any]) -> tuple[int, str]:
            async with gate:
                route = self.route(index)
                url = f"{route.engine.url}/generate"
                if route.prefill is None:
                    return await _post(session, url, payload, timeout_s)
                prefill_answer: list[tuple[int, str]] = []
                result, prefill_failed = await _pd(session, route, route.pd_body(payload),
                                                   lambda s, b: _post(s, url, b, timeout_s), lambda r: r[0] == 200,
                                                   timeout_s, prefill_answer)
                if prefill_failed:
                    return 0, prefill_failed
                if result[0] != 200:
                    return result[0], f"decode {route.engine.label}: {result[1]}"
                return (200, merge_input_logprobs(prefill_answer[0][1], result[1])) if payload.get("return_logprob") \
                    else result

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return list(await asyncio.gather(*(one(session, i, p) for i, p in enumerate(payloads))))


async def _post(session, url: str, body: dict[str, Any], timeout_s: float) -> tuple[int, str]:
    """POST BODY, read the whole answer: (status, text); status 0 when nothing answered."""
    import aiohttp  # lazy: aiohttp takes ~0.3 s to import, and only a run that sends needs it

    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.text()
    except TimeoutError:
        return 0, f"timed out after {timeout_s:.0f} s"
    except aiohttp.ClientError as exc:
        return 0, f"{type(exc).__name__}: {str(exc)[:200]}"


def merge_input_logprobs(prefill_text: str, decode_text: str) -> str:
    """A PD answer's input logprobs, as a PD router returns them: the prefill's `input_token_logprobs`
    and `input_top_logprobs` in front of the decode's (the prefill scores the prompt; smg and
    SGLang's mini load balancer merge them the same way for return_logprob requests)."""
    try:
        prefill, decode = json.loads(prefill_text), json.loads(decode_text)
    except ValueError:
        return decode_text
    p_meta, d_meta = prefill.get("meta_info") or {}, decode.get("meta_info")
    if not isinstance(d_meta, dict):
        return decode_text
    for key in ("input_token_logprobs", "input_top_logprobs"):
        if isinstance(p_meta.get(key), list):
            d_meta[key] = p_meta[key] + (d_meta.get(key) or [])
    return json.dumps(decode)


async def _pd(session, route: Route, body: dict[str, Any], decode_call, ok, timeout_s: float,
              prefill_answer: list | None = None) -> tuple[Any, str | None]:
    """BODY to the route's prefill and decode at once (the router's PD protocol): (the decode's
    result, None), or (None or the decode's result, why the prefill failed). The prefill's body is
    read to its end before a good answer counts. A prefill that fails while the decode waits fails
    the request at once and hangs up on the decode (which would wait for KV that never comes); a
    task cancelled from outside (a soak that saw a wedge) hangs up on both."""
    assert route.prefill is not None
    prefill_ref = route.prefill  # the closure below sees this, narrowed
    prefill = asyncio.ensure_future(_post(session, f"{prefill_ref.url}/generate", body, timeout_s))
    decode = asyncio.ensure_future(decode_call(session, body))

    def prefill_failed() -> str | None:
        status, text = prefill.result()
        return (None if status == 200 else f"prefill {prefill_ref.label}: HTTP {status or 'no answer'}: "
                f"{text.strip()[:200]}")

    try:
        done, _ = await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_COMPLETED)
        if prefill in done and prefill_failed():
            return None, prefill_failed()
        result = await decode
        if not ok(result):
            return result, None
        await prefill
        if prefill_answer is not None:
            prefill_answer.append(prefill.result())
        return result, prefill_failed()
    finally:
        pending = [t for t in (prefill, decode) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


# ------------------------------------------------------------------ choosing what to measure


def engines_for(spec, targets: Sequence[str]) -> Measured:
    """The target's own routes even where the router fronts them: the answer gate scores on the engines,
    because smg hands back only the prefill's `input_token_logprobs` of a PD answer, not its
    `input_top_logprobs` (seen with the pinned smg in front of the sim, whose prefill and decode answer
    as SGLang's do: docs/correctness.md); merge_input_logprobs merges both."""
    url, headers = router_target(spec)
    routes = target_routes(spec, targets)
    if not routes:
        raise ValueError(f"the target ({', '.join(targets)}) has no engine to measure")
    return Measured(tuple(targets), url, headers, tuple(routes), fronted_engines(spec))


def measured_for(spec, targets: Sequence[str]) -> Measured:
    """The router when it fronts exactly the target's engines (the whole cluster), else the target's routes."""
    url, headers = router_target(spec)
    fronted = fronted_engines(spec)
    on_target = {f"{h.name}/{e.name}" for h, e in spec.engines() if h.name in set(targets)}
    if set(fronted) == on_target:
        return Measured(tuple(targets), url, headers, (), fronted)
    routes = target_routes(spec, targets)
    if not routes:
        raise ValueError(f"the target ({', '.join(targets)}) has no engine to measure")
    return Measured(tuple(targets), url, headers, tuple(routes), fronted)
