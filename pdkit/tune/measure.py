"""What the correctness gate, the soak and the bench of a campaign send their requests to.

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

Pairs: per PD group, the target's prefills and decodes zipped round robin (every one in a pair);
a target that has only one side of a group is paired with that group's engines on other hosts
(they run the baseline), in spec order. The router is kept out of this on purpose: draining the
other nodes would put every user's request on the candidate, which `pdkit roll` never allows, and
smg's per-request worker choice (`X-SMG-Target-Worker`) needs its `manual` policy for everyone's
requests (docs/tune.md). The router's own path is still exercised by the roll's smoke and
doctor's probes, and by any background load.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

# bootstrap_room: SGLang reads it as a non-negative int64 (the router draws it the same way)
_ROOM_LIMIT = 2**63
_rooms = random.SystemRandom()


@dataclass(frozen=True)
class EngineRef:
    label: str  # host/engine
    url: str
    bootstrap: tuple[str, int] | None = None  # a prefill's (bootstrap_host, bootstrap_port)


@dataclass(frozen=True)
class Route:
    """One way a request is served: a PD pair (prefill + decode), or a unified engine alone."""

    engine: EngineRef  # the decode, or the unified engine
    prefill: EngineRef | None = None

    @property
    def label(self) -> str:
        return f"{self.prefill.label}+{self.engine.label}" if self.prefill else self.engine.label

    def pd_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """BODY as the router sends it to a PD pair: bootstrap fields added, a fresh room."""
        if self.prefill is None:
            return body
        assert self.prefill.bootstrap is not None
        host, port = self.prefill.bootstrap
        return {**body, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": _rooms.randrange(_ROOM_LIMIT)}


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
            return {"via": "router", "router_url": self.router_url, "hosts": list(self.hosts), "engines": sorted(self.router_engines)}
        return {"via": "engines", "hosts": list(self.hosts), "engines": self.engines, "routes": [r.label for r in self.routes]}

    def route(self, index: int) -> Route:
        return self.routes[index % len(self.routes)]

    # ---- sending
    async def stream(self, session, index: int, body: dict[str, Any], output_len: int, timeout_s: float):
        """One streamed request (a pdkit.bench.Sender): to the router, or to route INDEX (round robin)."""
        from dataclasses import replace

        from pdkit.benchclient import stream_one
        from pdkit.benchstats import RequestResult

        if self.via == "router":
            return await stream_one(session, f"{self.router_url}/generate", self.headers, body, output_len, timeout_s)
        route = self.route(index)
        url = f"{route.engine.url}/generate"
        if route.prefill is None:
            return await stream_one(session, url, {}, body, output_len, timeout_s)
        result, prefill_failed = await _pd(session, route, route.pd_body(body),
                                           lambda s, b: stream_one(s, url, {}, b, output_len, timeout_s), lambda r: r.ok, timeout_s)
        if prefill_failed:
            return RequestResult(ok=False, error=prefill_failed)
        return result if result.ok else replace(result, error=f"decode {route.engine.label}: {result.error}")

    def ask(self, payloads: Sequence[dict[str, Any]], concurrency: int, timeout_s: float) -> list[tuple[int, str]]:
        """(status, body) of each non-streaming /generate PAYLOAD, CONCURRENCY at a time, in order."""
        from pdkit.health import http_request

        if self.via == "router":
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
                return list(pool.map(lambda p: http_request(f"{self.router_url}/generate", p, timeout=timeout_s, headers=self.headers),
                                     payloads))
        # one event loop for all of them (pdkit tune runs gevent-patched: no loop per thread)
        return asyncio.run(self._ask_engines(payloads, concurrency, timeout_s))

    async def _ask_engines(self, payloads: Sequence[dict[str, Any]], concurrency: int, timeout_s: float) -> list[tuple[int, str]]:
        import aiohttp

        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(session, index: int, payload: dict[str, Any]) -> tuple[int, str]:
            async with gate:
                route = self.route(index)
                url = f"{route.engine.url}/generate"
                if route.prefill is None:
                    return await _post(session, url, payload, timeout_s)
                result, prefill_failed = await _pd(session, route, route.pd_body(payload),
                                                   lambda s, b: _post(s, url, b, timeout_s), lambda r: r[0] == 200, timeout_s)
                if prefill_failed:
                    return 0, prefill_failed
                return result if result[0] == 200 else (result[0], f"decode {route.engine.label}: {result[1]}")

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return list(await asyncio.gather(*(one(session, i, p) for i, p in enumerate(payloads))))


async def _post(session, url: str, body: dict[str, Any], timeout_s: float) -> tuple[int, str]:
    """POST BODY, read the whole answer: (status, text); status 0 when nothing answered."""
    import aiohttp

    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.text()
    except TimeoutError:
        return 0, f"timed out after {timeout_s:.0f} s"
    except aiohttp.ClientError as exc:
        return 0, f"{type(exc).__name__}: {str(exc)[:200]}"


async def _pd(session, route: Route, body: dict[str, Any], decode_call, ok, timeout_s: float) -> tuple[Any, str | None]:
    """BODY to the route's prefill and decode at once (the router's PD protocol): (the decode's
    result, None), or (None or the decode's result, why the prefill failed). The prefill's body is
    read to its end before a good answer counts. A prefill that fails while the decode waits fails
    the request at once and hangs up on the decode (which would wait for KV that never comes); a
    task cancelled from outside (a soak that saw a wedge) hangs up on both."""
    assert route.prefill is not None
    prefill = asyncio.ensure_future(_post(session, f"{route.prefill.url}/generate", body, timeout_s))
    decode = asyncio.ensure_future(decode_call(session, body))

    def prefill_failed() -> str | None:
        status, text = prefill.result()
        return None if status == 200 else f"prefill {route.prefill.label}: HTTP {status or 'no answer'}: {text.strip()[:200]}"

    try:
        done, _ = await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_COMPLETED)
        if prefill in done and prefill_failed():
            return None, prefill_failed()
        result = await decode
        if not ok(result):
            return result, None
        await prefill
        return result, prefill_failed()
    finally:
        pending = [t for t in (prefill, decode) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


# ------------------------------------------------------------------ choosing what to measure


def _ref(spec, host, engine) -> EngineRef:
    from pdkit import flags

    bootstrap = (spec.engine_address(host), engine.effective_bootstrap_port) if engine.role == "prefill" else None
    return EngineRef(f"{host.name}/{engine.name}", flags.engine_url(spec, host, engine), bootstrap)


def target_routes(spec, targets: Sequence[str]) -> list[Route]:
    """The target's own routes: its unified engines, and per PD group its prefills and decodes
    zipped round robin (a side the target lacks comes from that group's other hosts)."""
    wanted = set(targets)
    routes: list[Route] = []
    groups: dict[str, dict[str, list[tuple[Any, Any]]]] = {}
    for host, engine in spec.engines():
        if engine.role == "unified":
            if host.name in wanted:
                routes.append(Route(_ref(spec, host, engine)))
            continue
        side = "target" if host.name in wanted else "other"
        groups.setdefault(engine.pd_group, {}).setdefault(f"{side}-{engine.role}", []).append((host, engine))
    for members in groups.values():
        prefills, decodes = members.get("target-prefill", []), members.get("target-decode", [])
        if not prefills and not decodes:
            continue
        prefills = prefills or members.get("other-prefill", [])
        decodes = decodes or members.get("other-decode", [])
        if not prefills or not decodes:
            continue  # the validator refuses a PD group without both roles
        n = max(len(members.get("target-prefill", [])), len(members.get("target-decode", [])))
        for i in range(n):
            p, d = prefills[i % len(prefills)], decodes[i % len(decodes)]
            routes.append(Route(_ref(spec, *d), _ref(spec, *p)))
    return routes


def measured_for(spec, targets: Sequence[str]) -> Measured:
    """The router when it fronts exactly the target's engines (the whole cluster), else the target's routes."""
    from pdkit.benchclient import router_target

    url, headers = router_target(spec)
    router = spec.router_hosts[0]
    fronted = tuple(f"{h.name}/{e.name}" for h, e in spec.router_workers(router))
    on_target = {f"{h.name}/{e.name}" for h, e in spec.engines() if h.name in set(targets)}
    if set(fronted) == on_target:
        return Measured(tuple(targets), url, headers, (), fronted)
    routes = target_routes(spec, targets)
    if not routes:
        raise ValueError(f"the target ({', '.join(targets)}) has no engine to measure")
    return Measured(tuple(targets), url, headers, tuple(routes), fronted)
