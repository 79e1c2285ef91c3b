"""Which router loses which worker types while a batch of hosts is out: pure, read by `pdkit validate`'s
summary, `pdkit roll` (--allow-downtime, hold times) and `pdkit tune` (a candidate's outage)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdkit.clients.router_api import worker_type
from pdkit.render.paths import router_url
from pdkit.spec import ClusterSpec


@dataclass(frozen=True)
class Outage:
    """A router left without any worker of some kinds while a batch is out of it: clients of
    that router get errors until the batch is back (a one-node cluster has one on every roll)."""

    router: str  # the router's host
    url: str  # the router's base URL, as clients reach it
    kinds: tuple[str, ...]  # the router's worker types (prefill, decode, regular) it loses every worker of

    def lost(self) -> str:
        """What clients of the router lose, in the words of every message about it."""
        return f"the router on {self.router} ({self.url}) has no {' or '.join(self.kinds)} worker"


def batch_outages(spec: ClusterSpec, batch: Iterable[str]) -> list[Outage]:
    """Pure: per router, the worker types whose every planned worker runs on BATCH's hosts."""

    leaving = set(batch)
    out = []
    for router_host in spec.router_hosts:
        hosts_of: dict[str, set[str]] = {}
        for h, e in spec.router_workers(router_host):
            hosts_of.setdefault(worker_type(e.role), set()).add(h.name)
        lost = tuple(sorted(kind for kind, hosts in hosts_of.items() if hosts <= leaving))
        if lost:
            out.append(Outage(router_host.name, router_url(router_host), lost))
    return out
