"""Engine and router units: lay down the planned files, restart only what changed, then gate on health."""

from __future__ import annotations

import io
import shlex

from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from pdkit import flags
from pdkit.deploy import current_plan, current_spec
from pdkit.plan import Service
from roles import base
from roles.facts import host_state, path_matches, unit_active_enabled


@deploy("pdkit services: files, units, restarts, health gates")
def services() -> None:
    spec = current_spec()
    plan = current_plan()
    state = host_state()
    puts = {}
    # only files that differ from the plan get an operation (one fact read them all)
    for f in plan.files:
        if not path_matches(state, f.path, "file", f.mode, f.owner, f.group, f.sha256):
            puts[f.path] = files.put(
                name=f"File {f.path}" + (" (secret)" if f.secret else ""),
                src=io.StringIO(f.content), dest=f.path, mode=f.mode, user=f.owner, group=f.group,
            )
    # units and their drop-ins (the DCGM exporter is the packaged unit plus a pdkit drop-in)
    unit_puts = [op for path, op in puts.items() if path.endswith(".service") or ".service.d/" in path]
    systemd.daemon_reload(name="systemd daemon-reload (units changed)", _if=any_changed(*unit_puts))

    venv_python = f"{flags.venv_dir(spec)}/bin/python"
    # a new node venv (pdkit or sglang upgraded) means engines must restart onto it
    new_venv = base.node_venv_will_change()
    # Order: (re)start the HTTP daemons (pdkit-exporter, Prometheus) first so that their start-up
    # overlaps the engines'; then each engine with its gate, the router last (its gate needs its
    # workers up); then the daemons' gates. Every operation below is declared for every service
    # (gated with _if) so that all hosts share one operation order.
    daemons = [s for s in plan.services if s.kind == "http"]
    daemon_ops = {s.unit: _restart_ops(s, state, puts, new_venv) for s in daemons}
    for service in sorted((s for s in plan.services if s.kind != "http"), key=lambda s: s.kind != "engine"):
        start, restart = _restart_ops(service, state, puts, new_venv)
        server.shell(name=f"Health gate {service.unit}", commands=[_gate_command(venv_python, service)], _if=any_changed(start, restart))
    for service in daemons:
        start, restart = daemon_ops[service.unit]
        server.shell(name=f"Health gate {service.unit}", commands=[_gate_command(venv_python, service)], _if=any_changed(start, restart))


def _restart_ops(service: Service, state: dict, puts: dict, new_venv: bool):
    """Enable-and-start (when not running) and restart (when its files or venv changed), both gated."""
    unit = shlex.quote(service.unit)
    files_changed = any_changed(*(puts[p] for p in service.files if p in puts))
    changed = (lambda: True) if (new_venv and service.kind == "engine") else files_changed
    installed, active, enabled = unit_active_enabled(state, service.unit)
    start = server.shell(
        name=f"Enable and start {service.unit}",
        # reset-failed: an inactive unit may have hit its start limit, and `start` refuses then.
        # restart, not start: a daemon its package started a moment ago (Prometheus) must
        # come up again on the files just laid down
        commands=[f"systemctl reset-failed {unit} || true", f"systemctl enable {unit}", f"systemctl restart {unit}"],
        _if=lambda active=active, enabled=enabled: not (active and enabled),
    )
    # "active" may also mean auto-restarting: clear a start-limit state before restarting
    restart = server.shell(
        name=f"Restart {service.unit} (its files or venv changed)",
        commands=[f"systemctl reset-failed {unit} || true", f"systemctl restart {unit}"],
        _if=lambda active=active, changed=changed: active and changed(),
    )
    return start, restart


def _gate_command(python: str, service: Service) -> str:
    q = shlex.quote
    if service.kind == "engine":
        return f"{q(python)} -m pdkit.health engine --unit {q(service.unit)} --url {q(service.health_url)} --timeout {service.ready_timeout_s}"
    if service.kind == "http":
        return f"{q(python)} -m pdkit.health http --url {q(service.health_url)} --timeout {service.ready_timeout_s}"
    base_url = service.health_url.removesuffix("/health")
    workers = " ".join(f"--worker {q(w)}" for w in service.expected_workers)
    gate = f"{q(python)} -m pdkit.health router --url {q(base_url)} {workers} --model {q(service.model)} --timeout {service.ready_timeout_s}"
    if service.env_files:
        # the router's API key stays in its 0600 file: exported for this command only
        return "set -a && " + " && ".join(f". {q(p)}" for p in service.env_files) + f" && set +a && {gate}"
    return gate
