"""Engine and router units: lay down the planned files, restart only what changed, then gate on health."""

from __future__ import annotations

import atexit
import shlex
import sys
from weakref import WeakKeyDictionary

from pyinfra import host, state
from pyinfra.api import StringCommand, deploy
from pyinfra.operations import python, server

from pdkit.agent import changes, gates
from pdkit.agent.exporter.config import reads_gpu_health
from pdkit.agent.journald import JOURNALD_UNIT, restart_needed
from pdkit.clients.router_api import RouterError
from pdkit.hosts import limitwarn, p2p, routersync, silences
from pdkit.hosts.deploy import current_host, current_plan, current_spec
from pdkit.monitoring.common import scraped_hosts
from pdkit.render import flags, jitplan
from pdkit.render.plan import Service, services_meta, services_not_started, staging_dir
from roles import base
from roles.facts import host_state, path_matches, unit_active_enabled
from roles.install_files import announce, install_files
from roles.preflight import node_facts


def is_unit_file(path: str) -> bool:
    """A unit or a drop-in: systemd must re-read it (the DCGM exporter is its packaged unit plus a pdkit drop-in)."""
    return path.endswith(".service") or ".service.d/" in path


def journald_changed(paths: set[str]) -> bool:
    """Pure: journald restarts only when its drop-in was written or removed by this run."""
    return restart_needed(paths)


def restart_plan(services: list[Service], state: dict, changed_paths: set[str], changed_venvs: set[str]) -> tuple[list[Service], list[Service]]:
    """(services to start, services to restart), by the one restart rule (pdkit/agent/changes.py) that
    roll and rollback use too: a unit not running (or not enabled) is started; a running one
    restarts when one of its files (or one it read in the current release) was written or
    removed, or the venv it runs from was replaced."""
    running = {s.unit: all(unit_active_enabled(state, s.unit)[1:]) for s in services}
    decision = changes.decide(services_meta(services), changed_paths, changed_venvs, running, state.get("release", {}).get("services"))
    by_unit = {s.unit: s for s in services}
    return [by_unit[u] for u in decision.start], [by_unit[u] for u in decision.restart]


def changed_venvs(spec) -> set[str]:
    """The venv links this run points at a new venv (roles/base.py decides: node, engine, router)."""
    return base.changed_venv_links()


@deploy("pdkit services: files, units, restarts, health gates")
def services() -> None:
    spec = current_spec()
    plan = current_plan()
    state = host_state()
    # only files that differ from the plan are written (one fact read them all), in one operation
    changed = [f for f in plan.files if not path_matches(state, f.path, "file", f.mode, f.owner, f.group, f.sha256)]
    # files and units the node's current release has and the plan no longer does (pdkit/agent/changes.py)
    recorded = state.get("release", {})
    present = [p for p, st in state["paths"].items() if st and st[0] == "file"]
    removed = changes.removals(recorded.get("files", []), [f.path for f in plan.files], present)
    unit_on = {u: any(unit_active_enabled(state, u)[1:]) for u in recorded.get("services", {})}
    gone_units = changes.units_to_stop(recorded.get("services", {}), [s.unit for s in plan.services], unit_on)
    if gone_units:
        units = " ".join(shlex.quote(u) for u in gone_units)
        # before their files go: a unit whose file vanished under it can no longer be stopped cleanly
        server.shell(name="Stop and disable units no longer planned", commands=[f"systemctl disable --now {units}"])
    if changed or removed:
        announce(changed, removed)
        install_files(
            # pyinfra shares an operation's name across hosts: keep it generic, the per-host list is the op's output
            name="Install changed files and remove those no longer planned",
            files=changed, staging=staging_dir(spec), remove=removed,
            daemon_reload=any(is_unit_file(p) for p in [*(f.path for f in changed), *removed]),
        )
    if journald_changed({f.path for f in changed} | set(removed)):
        # journald (systemd 252) reads its drop-ins only at start; it keeps the services' stdout streams
        # across a restart (its unit's file-descriptor store), so no engine loses its log
        server.shell(name="Restart journald (its pdkit drop-in changed)", commands=[f"systemctl restart {JOURNALD_UNIT}"])
    held = services_not_started(spec, current_host(), list(plan.services))
    for unit, why in held.items():
        print(f"pdkit: {host.name}: not starting {unit}: {why}", file=sys.stderr, flush=True)
    running_held = [u for u in held if unit_active_enabled(state, u)[1] or unit_active_enabled(state, u)[2]]
    if running_held:
        units = " ".join(shlex.quote(u) for u in running_held)
        # it cannot run the configuration just laid down: leave it stopped rather than on old code
        server.shell(name="Stop and disable (cannot start here, see above): " + ", ".join(running_held), commands=[f"systemctl disable --now {units}"])
    start, restart = restart_plan([s for s in plan.services if s.unit not in held], state, {f.path for f in changed} | set(removed), changed_venvs(spec))
    venv_python = flags.node_python(spec)
    # Engines and HTTP daemons (pdkit-exporter, Prometheus) (re)start together, so their
    # start-ups overlap, and their gates wait together. The router comes after: its gate needs
    # its workers up.
    start_first, start_router = _router_last(start)
    restart_first, restart_router = _router_last(restart)
    # engines or a router (re)starting outside a roll (which silences its own batch): the host's
    # alerts are silenced in Alertmanager from here to the end of its gates (pdkit/hosts/silences.py)
    silence = silences.deploy_silence(spec, host.name, [*start, *restart], host.data.get("node_drained") is True)
    if silence:
        python.call(name="Silence this host's alerts for its restarts", function=silences.deploy_start, spec=spec,
                    window_s=silence[0], units=silence[1])
    if measures_p2p(spec, current_host(), [*start_first, *restart_first], state):
        # before the node's engines first start: GPU-to-GPU copies of its PD pairs and TP groups with the
        # engine environment's CUDA, judged and kept with the node's facts (pdkit/hosts/p2p.py; issue 47 item 3)
        python.call(name="Measure GPU-to-GPU copies before the engines first start", function=_measure_p2p,
                    spec=spec)
    # two engines on cold JIT caches start one after another, not at once (pdkit/agent/jitwarm.py; sgl-project/sglang#27604)
    _start_and_restart(start_first, restart_first, "engines and daemons",
                       serial=lambda units: jitplan.restart_command(spec, host.name, units))
    if start_first or restart_first:
        gated = [*start_first, *restart_first]
        server.shell(name="Health gates: " + ", ".join(s.unit for s in gated), commands=[gates_command(venv_python, gated)])
    engines_moved = [s for s in (*start_first, *restart_first) if s.kind == "engine"]
    _note_for_limit(spec, [s.health_url.removesuffix("/health") for s in engines_moved],
                    limitwarn.retargeted(state.get("release", {}).get("services") or {},
                                         {s.unit: s.health_url for s in plan.services if s.kind in ("engine", "http") and s.unit not in held}))
    if engines_moved and host.data.get("node_drained") is not True:
        # routers on other hosts learn about this host's (re)started engines now, whatever order
        # --serial takes (pdkit/hosts/routersync.py); a roll re-adds its drained workers itself
        for router_host, mine, others in routersync.routers_for_host(spec, host.name):
            python.call(
                name="Routers on other hosts list this host's engines, healthy",
                function=_sync_router, spec=spec, router_host=router_host, mine=mine, others=others,
                host_address=spec.engine_address(current_host()),
            )
    _start_and_restart(start_router, restart_router, "router")
    for service in (*start_router, *restart_router):
        server.shell(name=f"Health gate {service.unit}", commands=[router_gate_command(venv_python, service)])
        if service.remote_workers:
            # the gate's verdict is not shown by pyinfra (below -vvv): say which workers are pending
            python.call(name=f"Workers of {service.unit} on other hosts", function=_report_remote_workers, spec=spec, router_host=current_host(), service=service)
    if silence:
        python.call(name="Expire this host's silence: its restarts passed their gates", function=silences.deploy_end)


def measures_p2p(spec, this, starting: list[Service], state: dict) -> bool:
    """Pure: the P2P probe runs on a real engine's NVIDIA node whose engines (all of them) are about to
    start and none runs: the first deploy, or one after they were stopped. A serving engine holds the
    GPUs' memory and links; `pdkit doctor --bench` measures then."""
    node = this.node
    if node is None or not node.engines or not reads_gpu_health(node.gpu, spec.cluster.engine):
        return False
    engines = [s for s in starting if s.kind == "engine"]
    return bool(engines) and not any(unit_active_enabled(state, s.unit)[1] for s in engines)


def _measure_p2p(spec) -> None:
    """Runs on the deploying machine (python.call), on the node's SSH connection: pdkit.hosts.p2p does the rest."""
    this = current_host()

    def run(command: str) -> tuple[bool, str]:
        # as the deploy's operations run (root, or sudo where the inventory says so): the record is root's
        ok, output = host.run_shell_command(StringCommand(command), _sudo=bool(host.data.get("_sudo")),
                                            _timeout=p2p.PROBE_TIMEOUT_S + 60)
        return ok, "\n".join(line.line for line in output if line.buffer_name == "stdout")

    # the preflight's facts, read at the start of this deploy (judge the rates: links, NVLink, collapse)
    _, line = p2p.measure_before_start(host.name, p2p.node_pairs(this), flags.engine_python(spec, this),
                                       node_facts(), run)
    print(line, file=sys.stderr, flush=True)


# per pyinfra State: (host -> worker URLs it (re)starts, host -> scrape targets it moves);
# printed once at exit (pdkit/hosts/limitwarn.py)
_MOVED: WeakKeyDictionary = WeakKeyDictionary()


def _note_for_limit(spec, urls: list[str], retargeted: list[str]) -> None:

    if not (urls or retargeted) or not state.limit_hosts or host.data.get("node_drained") is True:
        return  # no --limit (or a roll, which limits itself to its batch and re-adds workers)
    first = state not in _MOVED
    moved, changed = _MOVED.setdefault(state, ({}, {}))
    moved[host.name] = urls
    changed[host.name] = retargeted
    if first:
        limited = {h.name for h in state.limit_hosts}
        excluded = [h.name for h in spec.hosts if h.name not in limited]
        routers = {r.name: [(h.name, flags.engine_url(spec, h, e)) for h, e in spec.router_workers(r)] for r in spec.router_hosts}
        scrapers = {m.name: [h.name for h in scraped_hosts(spec)] for m in spec.monitoring_hosts}
        inventory = next((a for a in sys.argv[1:] if a.endswith(".py") and not a.startswith("-")), "INVENTORY")

        def report() -> None:
            for line in limitwarn.limit_warnings(routers, moved, excluded, inventory, scrapers, changed):
                print(line, file=sys.stderr, flush=True)

        atexit.register(report)


def _sync_router(spec, router_host, mine, others, host_address) -> None:
    """Runs on the deploying machine (python.call): the router's worker API, with the key from the spec."""
    message = routersync.sync_router(routersync.client_for(spec, router_host), mine, host_address, others, timeout=120.0)
    # pyinfra does not show host.log at the default verbosity: this is the line that says what changed
    print(f"pdkit: {host.name}: {message}", file=sys.stderr, flush=True)


def _report_remote_workers(spec, router_host, service: Service) -> None:
    """Runs on the deploying machine after the router's gate passed: which of its workers on
    other hosts are not listed healthy yet (pending: their host's deploy registers them)."""
    client = routersync.client_for(spec, router_host)
    try:
        listed = {w.url: w.healthy for w in client.workers()}
    except RouterError as exc:
        print(f"pdkit: {host.name}: {service.unit} passed its gate; its worker list is not readable from here ({exc})", file=sys.stderr, flush=True)
        return
    print(f"pdkit: {host.name}: {routersync.remote_worker_note(service.unit, service.remote_workers, listed)}", file=sys.stderr, flush=True)


def _router_last(services: list[Service]) -> tuple[list[Service], list[Service]]:
    """(engines and daemons, routers): a router's gate needs its workers up, so it goes after."""
    return [s for s in services if s.kind != "router"], [s for s in services if s.kind == "router"]


def _start_and_restart(start: list[Service], restart: list[Service], what: str, serial=None) -> None:
    """One operation for the units to start and one for those to restart, each one command (one
    round trip) whose systemctl calls take all the units at once. SERIAL(units): the command that
    restarts them instead (pdkit.render.jitplan.restart_command), or None for `systemctl restart`."""
    def restart_units(services: list[Service], units: str) -> str:
        return (serial(services) if serial else None) or f"systemctl restart {units}"

    if start:
        units = " ".join(shlex.quote(s.unit) for s in start)
        server.shell(
            name=f"Enable and start {what}: " + ", ".join(s.unit for s in start),
            # reset-failed: an inactive unit may have hit its start limit, and `start` refuses then.
            # restart, not start: a daemon its package started a moment ago (Prometheus) must
            # come up again on the files just laid down
            commands=[f"{{ systemctl reset-failed {units} || true; }} && systemctl enable {units} && {restart_units(start, units)}"],
        )
    if restart:
        units = " ".join(shlex.quote(s.unit) for s in restart)
        server.shell(
            name=f"Restart {what} (their files or venv changed): " + ", ".join(s.unit for s in restart),
            # "active" may also mean auto-restarting: clear a start-limit state before restarting
            commands=[f"{{ systemctl reset-failed {units} || true; }} && {restart_units(restart, units)}"],
        )


def gates_command(python: str, services: list[Service]) -> str:
    """One on-host command that waits for every engine and HTTP service of SERVICES at once,
    each by its kind's gate in the one gate table (pdkit/agent/gates.py)."""
    return gates.command(python, [gates.gate_for(s) for s in services])


def router_gate_command(python: str, service: Service) -> str:
    """The router's gate (pdkit/agent/gates.py): its planned workers listed healthy and one completion."""
    return gates.command(python, [gates.gate_for(service)])
