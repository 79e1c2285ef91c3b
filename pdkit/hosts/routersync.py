"""After a host's engines (re)start: every router on ANOTHER host that fronts them lists them, healthy.

Why (issue #18 item 2): `pyinfra --serial` applies hosts one by one in an order pdkit does
not choose (pyinfra keeps active hosts in a set). When the router host comes first, its
router restarts listing workers whose host has not been deployed yet; its gate treats those
as pending (pdkit/agent/health.py router_verdict). When that host's turn comes, this step, run on
the deploying machine with the router's worker API (pdkit/clients/router_api.py), registers its
engines if the router does not list them (smg drops a worker that never became healthy at
start-up), takes out workers on this host's address the plan no longer has (a changed port),
and waits until the router lists them healthy. A host deployed BEFORE the router host gets
the same: the running router (old configuration) is told about the new worker at once, and
the router host's own deploy then restarts it with the full list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdkit.clients.router_api import RouterClient, RouterError, Worker, worker_type
from pdkit.render import flags
from pdkit.render.paths import router_url


@dataclass(frozen=True)
class PlannedWorker:
    url: str
    worker_type: str  # prefill | decode | regular
    bootstrap_port: int | None = None


def sync_actions(listed: Iterable[Worker], planned: Iterable[PlannedWorker], host_address: str,
                 planned_elsewhere: Iterable[str] = ()) -> tuple[list[PlannedWorker], list[str]]:
    """Pure: (workers to register, URLs to take out) so that ROUTER lists exactly this host's
    planned workers. Only URLs on HOST_ADDRESS are ever taken out (other hosts' workers are
    their own deploy's business), and never one the router still plans elsewhere."""
    listed = list(listed)
    urls = {w.url.rstrip("/") for w in listed}
    mine = {p.url.rstrip("/"): p for p in planned}
    keep = set(mine) | {u.rstrip("/") for u in planned_elsewhere}
    add = [p for u, p in sorted(mine.items()) if u not in urls]
    remove = sorted(w.url for w in listed if urlsplit(w.url).hostname == host_address and w.url.rstrip("/") not in keep)
    return add, remove


def sync_router(client: RouterClient, planned: list[PlannedWorker], host_address: str, planned_elsewhere: list[str],
                timeout: float) -> str:
    """Apply sync_actions on CLIENT's router and wait until this host's workers are healthy there."""
    try:
        listed = client.workers()
    except RouterError as exc:
        # the router host is not deployed yet (first deploy) or is down: its own gate checks these workers
        return f"{client.base_url} not reachable ({exc}); its own deploy gates these workers"
    add, remove = sync_actions(listed, planned, host_address, planned_elsewhere)
    for url in remove:
        client.remove(url, timeout=timeout)
    for worker in add:
        client.add(worker.url, worker.worker_type, worker.bootstrap_port, timeout=timeout)
    client.wait_healthy([p.url for p in planned], timeout=timeout)
    # a removed worker stays listed (draining) for the router's settle time: done means gone
    client.wait_gone(remove, timeout=timeout)
    done = [f"registered {', '.join(w.url for w in add)}"] if add else []
    done += [f"took out {', '.join(remove)} (no longer planned)"] if remove else []
    return f"{client.base_url}: {'; '.join(done + ['all ' + str(len(planned)) + ' worker(s) of this host healthy'])}"


def routers_for_host(spec, host_name: str) -> list[tuple[object, list[PlannedWorker], list[str]]]:
    """(router host, this host's planned workers there, that router's other planned worker URLs) for
    every router on another host."""
    out = []
    for router_host in spec.router_hosts:
        if router_host.name == host_name:
            continue  # the router's own gate on this host checks them
        mine, others = [], []
        for h, e in spec.router_workers(router_host):
            url = flags.engine_url(spec, h, e)
            if h.name == host_name:
                mine.append(PlannedWorker(url, worker_type(e.role),
                                          e.effective_bootstrap_port if e.role == "prefill" else None))
            else:
                others.append(url)
        if mine:
            out.append((router_host, mine, others))
    return out


def client_for(spec, router_host) -> RouterClient:

    key = spec.cluster.secrets.router_api_key
    return RouterClient(router_url(router_host), api_key=key.get_secret_value() if key else None)


def remote_worker_note(unit: str, remote: Iterable[str], listed: dict[str, bool]) -> str:
    """Pure: what a router host's deploy says about its workers on other hosts once its gate
    passed (LISTED: url -> healthy in its /workers)."""
    remote = sorted(u.rstrip("/") for u in remote)
    pending = [u for u in remote if not listed.get(u, False)]
    if not pending:
        return f"{unit}: all {len(remote)} worker(s) on other hosts registered and healthy"
    return (f"{unit}: pending {', '.join(pending)} ({len(pending)} of {len(remote)} worker(s) on other hosts not up "
            "yet: each host's own deploy registers its engines here and waits until they are healthy)")
