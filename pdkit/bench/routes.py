"""Which engines a bench's requests go to: the router and the engines it fronts, or a target's own
routes (its PD pairs, each prefill + decode, and its unified engines), chosen from the spec.

Pairs: per PD group, the target's prefills and decodes zipped round robin (every one in a pair);
a target that has only one side of a group is paired with that group's engines on other hosts
(they run the baseline), in spec order. The router is kept out of this on purpose: draining the
other nodes would put every user's request on the candidate, which `pdkit roll` never allows, and
smg's per-request worker choice (`X-SMG-Target-Worker`) needs its `manual` policy for everyone's
requests (docs/tune.md). The router's own path is still exercised by the roll's smoke and
doctor's probes, and by any background load. pdkit.bench.measure sends along these routes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdkit.render import flags

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

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


def _ref(spec, host, engine) -> EngineRef:
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


def fronted_engines(spec: ClusterSpec) -> tuple[str, ...]:
    """The engines the first router fronts (host/engine), in spec order."""
    router = spec.router_hosts[0]
    return tuple(f"{h.name}/{e.name}" for h, e in spec.router_workers(router))


def router_measured(spec: ClusterSpec, router_url: str) -> dict[str, Any]:
    """What a bench through the router measures: the engines it fronts (env.measured of a record)."""
    return {"via": "router", "router_url": router_url, "engines": sorted(fronted_engines(spec))}
