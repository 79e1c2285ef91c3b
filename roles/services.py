"""Engine and router units: lay down the planned files, restart only what changed, then gate on health."""

from __future__ import annotations

import shlex
import sys

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from pdkit import flags
from pdkit.deploy import current_host, current_plan, current_spec
from pdkit.plan import Service, services_not_started, staging_dir
from roles import base
from roles.facts import host_state, path_matches, unit_active_enabled
from roles.install_files import install_files


def is_unit_file(path: str) -> bool:
    """A unit or a drop-in: systemd must re-read it (the DCGM exporter is its packaged unit plus a pdkit drop-in)."""
    return path.endswith(".service") or ".service.d/" in path


def restart_plan(services: list[Service], state: dict, changed_paths: set[str], new_venv: bool) -> tuple[list[Service], list[Service]]:
    """(services to start, services to restart): a unit not running (or not enabled) is started;
    a running one restarts when one of its files changes, or, for an engine, when a new node
    venv is installed (it must restart onto it)."""
    start, restart = [], []
    for service in services:
        _, active, enabled = unit_active_enabled(state, service.unit)
        if not (active and enabled):
            start.append(service)
        elif (new_venv and service.kind == "engine") or changed_paths.intersection(service.files):
            restart.append(service)
    return start, restart


@deploy("pdkit services: files, units, restarts, health gates")
def services() -> None:
    spec = current_spec()
    plan = current_plan()
    state = host_state()
    # only files that differ from the plan are written (one fact read them all), in one operation
    changed = [f for f in plan.files if not path_matches(state, f.path, "file", f.mode, f.owner, f.group, f.sha256)]
    if changed:
        install_files(
            name=f"Install {len(changed)} changed file(s): " + ", ".join(f.path + (" (secret)" if f.secret else "") for f in changed),
            files=changed, staging=staging_dir(spec),
            daemon_reload=any(is_unit_file(f.path) for f in changed),
        )
    held = services_not_started(spec, current_host(), list(plan.services))
    for unit, why in held.items():
        print(f"pdkit: {host.name}: not starting {unit}: {why}", file=sys.stderr, flush=True)
    running_held = [u for u in held if unit_active_enabled(state, u)[1] or unit_active_enabled(state, u)[2]]
    if running_held:
        units = " ".join(shlex.quote(u) for u in running_held)
        # it cannot run the configuration just laid down: leave it stopped rather than on old code
        server.shell(name="Stop and disable (cannot start here, see above): " + ", ".join(running_held), commands=[f"systemctl disable --now {units}"])
    start, restart = restart_plan([s for s in plan.services if s.unit not in held], state, {f.path for f in changed}, base.node_venv_will_change())
    venv_python = f"{flags.venv_dir(spec)}/bin/python"
    # Engines and HTTP daemons (pdkit-exporter, Prometheus) (re)start together, so their
    # start-ups overlap, and their gates wait together. The router comes after: its gate needs
    # its workers up.
    start_first, start_router = _router_last(start)
    restart_first, restart_router = _router_last(restart)
    _start_and_restart(start_first, restart_first, "engines and daemons")
    if start_first or restart_first:
        gated = [*start_first, *restart_first]
        server.shell(name="Health gates: " + ", ".join(s.unit for s in gated), commands=[gates_command(venv_python, gated)])
    _start_and_restart(start_router, restart_router, "router")
    for service in (*start_router, *restart_router):
        server.shell(name=f"Health gate {service.unit}", commands=[router_gate_command(venv_python, service)])


def _router_last(services: list[Service]) -> tuple[list[Service], list[Service]]:
    """(engines and daemons, routers): a router's gate needs its workers up, so it goes after."""
    return [s for s in services if s.kind != "router"], [s for s in services if s.kind == "router"]


def _start_and_restart(start: list[Service], restart: list[Service], what: str) -> None:
    """One operation for the units to start and one for those to restart, each one command (one
    round trip) whose systemctl calls take all the units at once."""
    if start:
        units = " ".join(shlex.quote(s.unit) for s in start)
        server.shell(
            name=f"Enable and start {what}: " + ", ".join(s.unit for s in start),
            # reset-failed: an inactive unit may have hit its start limit, and `start` refuses then.
            # restart, not start: a daemon its package started a moment ago (Prometheus) must
            # come up again on the files just laid down
            commands=[f"{{ systemctl reset-failed {units} || true; }} && systemctl enable {units} && systemctl restart {units}"],
        )
    if restart:
        units = " ".join(shlex.quote(s.unit) for s in restart)
        server.shell(
            name=f"Restart {what} (their files or venv changed): " + ", ".join(s.unit for s in restart),
            # "active" may also mean auto-restarting: clear a start-limit state before restarting
            commands=[f"{{ systemctl reset-failed {units} || true; }} && systemctl restart {units}"],
        )


def gates_command(python: str, services: list[Service]) -> str:
    """One on-host command that waits for every engine and HTTP service of SERVICES at once."""
    q = shlex.quote
    args = []
    for s in services:
        if s.kind == "engine" and s.rank > 0:
            # a rank above 0 of an engine spanning nodes: no HTTP of its own, gated through rank 0
            args.append(f"--rank {q(s.unit)} {q(s.health_url)} {s.ready_timeout_s}")
        elif s.kind == "engine":
            args.append(f"--engine {q(s.unit)} {q(s.health_url)} {s.ready_timeout_s}")
        else:
            args.append(f"--http {q(s.health_url)} {s.ready_timeout_s}")
    return f"{q(python)} -m pdkit.health gates " + " ".join(args)


def router_gate_command(python: str, service: Service) -> str:
    q = shlex.quote
    base_url = service.health_url.removesuffix("/health")
    workers = " ".join(f"--worker {q(w)}" for w in service.expected_workers)
    gate = f"{q(python)} -m pdkit.health router --url {q(base_url)} {workers} --model {q(service.model)} --timeout {service.ready_timeout_s}"
    if service.env_files:
        # the router's API key stays in its 0600 file: exported for this command only
        return "set -a && " + " && ".join(f". {q(p)}" for p in service.env_files) + f" && set +a && {gate}"
    return gate
