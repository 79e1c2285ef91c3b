"""What "ready" means for each kind of service: the one gate table (issue 30 item 7).

Stdlib only: it also runs ON the node (a restore, `python -m pdkit.releases restore`, gates the
services it restarted with it). Three paths read it, and nothing else decides a gate:

- the deploy (roles/services.py): after its restarts, `command()` for the engines and daemons
  together, then for the router once its workers passed theirs;
- the roll's ready step (pdkit/roll/roller.py Roller.ready, and the router step for routers): the
  same commands, over SSH, for the services of the batch's hosts;
- a restore (pdkit/agent/releases.py, also the roll's rollback of a failed batch): `wait_all()` from
  the release's service records (`meta()` is what a release keeps of a service's gate).

A router's own /health answers 200 before any worker registered (it reports the router process,
not its workers), so the router's gate is its worker list plus one real completion.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pdkit.agent import health

# kind -> what ready means; the gate of each kind is one function of pdkit/agent/health.py (WAITERS)
READY: dict[str, str] = {
    "engine": ("from what the engine answers now: its unit active, the same invocation throughout, /health 200 (SGLang "
               "answers 503 until its warm-up request passed) and /server_info readable; its KV pool, max running "
               "requests, context length and CUDA-graph sizes recorded at its configuration's first healthy start, "
               "else at least 90% of that record (pdkit/agent/engineshape.py); the readiness line is evidence, never "
               "needed"),
    "rank": ("a rank above 0 of an engine spanning nodes (no HTTP of its own): its unit is active, the same "
             "invocation, once rank 0's /health answers 200 (rank 0 is ready only when every rank joined)"),
    "router": ("its /workers lists every planned worker healthy (workers on another host that do not answer yet are "
               "pending: their host's deploy registers them) and one real completion through it succeeds; its /health "
               "alone is 200 before any worker registered"),
    "http": "its unit has not failed and its URL answers 200 (pdkit-exporter, Prometheus, Grafana, the DCGM exporter)",
}
WAITERS: dict[str, str] = {"engine": "wait_engine", "rank": "wait_rank", "router": "wait_router",
                           "http": "wait_service"}


@dataclass(frozen=True)
class Gate:
    """One service's gate: its kind in READY and what that kind's check needs."""

    kind: str
    unit: str
    url: str  # engine: its /health; rank: rank 0's /health; router: its base URL; http: the URL that answers 200
    timeout: float
    workers: tuple[str, ...] = ()  # router: planned workers on its own host
    remote_workers: tuple[str, ...] = ()  # router: planned workers on other hosts (pending while they do not answer)
    model: str | None = None  # router: the served model, for the real completion
    api_key_file: str | None = None  # router: the root-only file its key is read from (never argv)
    # engine: its configuration on disk (unit and environment files, venv link): the key of its shape record
    shape_inputs: tuple[str, ...] = ()


def gate_kind(service_kind: str, rank: int = 0) -> str:
    """The gate kind of a service of SERVICE_KIND (pdkit.render.plan.Service.kind) and RANK."""
    if service_kind == "engine":
        return "rank" if rank > 0 else "engine"
    if service_kind == "router":
        return "router"
    return "http"


def _get(service: Any, name: str, default: Any = None) -> Any:
    return service.get(name, default) if isinstance(service, Mapping) else getattr(service, name, default)


def gate_for(service: Any, unit: str | None = None) -> Gate:
    """The gate of SERVICE: a pdkit.render.plan.Service, or a release's record of one (a dict from
    pdkit.render.plan.services_meta, with UNIT). A router recorded before its gate fields were kept
    (older releases) has no worker list: its gate then wants every worker it lists healthy."""
    unit = unit or _get(service, "unit")
    kind = gate_kind(_get(service, "kind"), _get(service, "rank", 0) or 0)
    url = _get(service, "health_url")
    timeout = float(_get(service, "ready_timeout_s", 600))
    if kind == "engine":
        venv = _get(service, "venv")
        inputs = tuple(sorted(_get(service, "files", ()) or ())) + ((venv,) if venv else ())
        return Gate(kind, unit, url, timeout, shape_inputs=inputs)
    if kind != "router":
        return Gate(kind, unit, url, timeout)
    workers = tuple(_get(service, "expected_workers", ()) or ())
    remote = tuple(_get(service, "remote_workers", ()) or ())
    return Gate(kind, unit, url.removesuffix("/health"), timeout, tuple(w for w in workers if w not in remote), remote,
                _get(service, "model"), _get(service, "api_key_file"))


def meta(service: Any) -> dict[str, Any]:
    """What a release keeps of SERVICE's gate beyond kind, URL and timeout (pdkit.render.plan.services_meta):
    a router's planned workers, model and key file path (never the key)."""
    if _get(service, "kind") != "router":
        return {}
    return {"expected_workers": list(_get(service, "expected_workers", ())),
            "remote_workers": list(_get(service, "remote_workers", ())),
            "model": _get(service, "model"), "api_key_file": _get(service, "api_key_file")}


def phases(gates: Iterable[Gate]) -> tuple[list[Gate], list[Gate]]:
    """(engines and daemons, routers): a router's gate needs its workers up, so routers go after."""
    gates = list(gates)
    return [g for g in gates if g.kind != "router"], [g for g in gates if g.kind == "router"]


def command(python: str, gates: Iterable[Gate]) -> str:
    """One on-host command that runs GATES (all of one phase) at once: engines, ranks and HTTP
    services in one `pdkit.agent.health gates`, each router with `pdkit.agent.health router` after them."""
    q = shlex.quote
    first, routers = phases(gates)
    parts = []
    if first:
        flag = {"engine": "--engine", "rank": "--rank", "http": "--service"}
        args = " ".join(f"{flag[g.kind]} {q(g.unit)} {q(g.url)} {g.timeout:g}" for g in first)
        # an engine's shape inputs: its record is keyed by them (pdkit/agent/engineshape.py)
        args += "".join(f" --shape {q(g.unit)} {q(','.join(g.shape_inputs))}" for g in first
                        if g.kind == "engine" and g.shape_inputs)
        parts.append(f"{q(python)} -m pdkit.health gates {args}")
    for g in routers:
        workers = " ".join([*(f"--worker {q(w)}" for w in g.workers),
                            *(f"--remote-worker {q(w)}" for w in g.remote_workers)])
        gate = f"{q(python)} -m pdkit.health router --url {q(g.url)} {workers}".rstrip() + f" --timeout {g.timeout:g}"
        if not g.workers and not g.remote_workers:
            gate += " --any-workers"
        if g.model:
            gate += f" --model {q(g.model)}"
        if g.api_key_file:
            # the router's API key stays in its 0600 file: the gate reads it there (never argv or environment)
            gate += f" --api-key-file {q(g.api_key_file)}"
        parts.append(gate)
    return " && ".join(parts)


def wait(gate: Gate) -> tuple[bool, str]:
    """Run GATE here (on the host): (ready, message)."""

    if gate.kind == "router":
        key = None
        if gate.api_key_file:
            try:
                with open(gate.api_key_file) as fh:
                    key = fh.read().strip() or None
            except OSError as exc:
                return False, f"cannot read the router's API key from {gate.api_key_file}: {exc}"
        return health.wait_router(gate.url, list(gate.workers), gate.timeout, api_key=key, model=gate.model,
                                  remote=list(gate.remote_workers),
                                  any_workers=not gate.workers and not gate.remote_workers)
    if gate.kind == "rank":
        return health.wait_rank(gate.unit, gate.url, gate.timeout)
    if gate.kind == "engine":
        return health.wait_engine(gate.unit, gate.url, gate.timeout, shape_inputs=gate.shape_inputs)
    return health.wait_service(gate.unit, gate.url, gate.timeout)


def wait_all(
    gates: Iterable[Gate], waiter: Callable[[Gate], tuple[bool, str]] | None = None
) -> list[tuple[Gate, bool, str]]:
    """GATES of one phase at once (a node's services restart together, so their gates wait
    together rather than one after another); (gate, ready, message) each, in order."""

    gates = list(gates)
    waiter = waiter or wait
    if not gates:
        return []
    with ThreadPoolExecutor(max_workers=len(gates)) as pool:
        results = list(pool.map(waiter, gates))
    return [(g, ok, message) for g, (ok, message) in zip(gates, results)]
