"""pyinfra's API, driven for the roll: gevent patched first, one State per batch (connect with
retries, load deploy/pd.py, run its operations, each timed), commands over SSH, and why a host
failed, from pyinfra's own log lines.

pyinfra is imported inside the functions: pyinfra's API loads gevent and paramiko, and every pdkit
command imports pdkit.roll for its parser (pdkit/cli.py COMMAND_MODULES).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEPLOY_FILE = "deploy/pd.py"
CONNECT_ATTEMPTS = 3


class _LogCollector:
    """pyinfra logs an operation's failure (stderr of the gate) through `logging`; keep those lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = lambda record: self.lines.append(_strip_ansi(record.getMessage()))  # type: ignore[method-assign]
        self.logger = logging.getLogger("pyinfra")
        # paramiko prints a traceback for a dropped banner exchange; the roll reports it in one line
        self.paramiko = logging.getLogger("paramiko")

    def __enter__(self) -> _LogCollector:
        self.logger.addHandler(self.handler)
        self.logger.propagate = False
        self.paramiko_level = self.paramiko.level
        self.paramiko.setLevel(logging.CRITICAL)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = True
        self.paramiko.setLevel(self.paramiko_level)


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _op_timer():
    """A pyinfra callback handler that times each operation on each host: (host, op name) -> seconds."""
    # lazy: pyinfra's API loads gevent and paramiko (~500 ms); the CLI imports pdkit.roll for every command
    from pyinfra.api.state import BaseStateCallback

    class OpTimer(BaseStateCallback):
        def __init__(self) -> None:
            self.started: dict[tuple[str, str], float] = {}
            self.took: dict[tuple[str, str], float] = {}

        # pyinfra declares the hooks static but calls them on the handler instance
        # (State.trigger_callbacks: getattr(handler, name)(state, ...)), so methods get the same
        # arguments and keep this timer's dicts; mypy compares them with the static form
        def operation_host_start(self, state, host, op_hash) -> None:  # type: ignore[override]
            self.started[(host.name, op_hash)] = time.monotonic()

        def _end(self, state, host, op_hash) -> None:
            start = self.started.pop((host.name, op_hash), None)
            if start is not None:
                # the operation's own name without its deploy's, and without the list after a colon
                name = sorted(state.get_op_meta(op_hash).names)[0].rsplit(" | ", 1)[-1].split(":", 1)[0]
                self.took[(host.name, name)] = time.monotonic() - start

        def operation_host_success(self, state, host, op_hash, retry_count=0) -> None:  # type: ignore[override]
            self._end(state, host, op_hash)

        def operation_host_error(self, state, host, op_hash, retry_count=0,  # type: ignore[override]
                                 max_retries=0) -> None:
            self._end(state, host, op_hash)

    return OpTimer()


class Pyinfra:
    """pyinfra's API for one inventory: one State per batch (gevent patched first, as pyinfra_cli/__init__.py does)."""

    def __init__(self, inventory: str) -> None:
        self.inventory = inventory
        # seconds of the last batch's deploy phases: prepare (facts, deploy code), execute (operations)
        self.phases: dict[str, float] = {}
        # seconds of each operation of the last execute, per host: host -> op name -> seconds
        self.operations: dict[str, dict[str, float]] = {}

    def _state(self, hosts: list[str]):
        # lazy: pyinfra's API loads gevent and paramiko (~500 ms); the CLI imports pdkit.roll for every command
        from pyinfra.api import Config, State
        from pyinfra.api.connect import connect_all
        from pyinfra.api.exceptions import PyinfraError
        from pyinfra.context import ctx_config, ctx_inventory, ctx_state

        state = State(check_for_changes=False)
        state.cwd = str(REPO)
        config = Config()
        config.FAIL_PERCENT = None  # decide per host here, not by pyinfra's abort
        ctx_config.set(config)
        ctx_state.set(state)
        inventory = roll_inventory(self.inventory)
        ctx_inventory.set(inventory)
        # pdkit's own attribute on pyinfra's State: pdkit/hosts/deploy.py names the inventory by it (getattr)
        state.inventory_filename = self.inventory  # type: ignore[attr-defined]
        state.init(inventory, config, initial_limit=[inventory.get_host(h) for h in hosts])
        # CONNECT_ATTEMPTS tries per host in all: pyinfra's connect_all is the first; each later one
        # is a single host.connect() of the hosts still missing (connect_all again would be two more
        # tries per round: the roll once made 5 tries where docs/rolling.md says 3)
        try:
            connect_all(state)
        except PyinfraError:
            pass  # "No hosts remaining!": every host failed to connect; the caller names them
        for _ in range(CONNECT_ATTEMPTS - 1):
            missing = [h for h in hosts if inventory.get_host(h) not in state.activated_hosts]
            if not missing:
                break
            # a busy sshd sometimes drops the banner exchange: try the missing hosts again
            time.sleep(1)
            for name in missing:
                host = inventory.get_host(name)
                host.connect()
                if host.connected:
                    state.activate_host(host)
                    state.failed_hosts.discard(host)
        # lazy: pdkit.hosts.deploy loads pdkit.render.plan and jinja2 (~60 ms); only a connected batch needs it
        from pdkit.hosts.deploy import tune_connection

        for host in state.activated_hosts:
            tune_connection(host)
        return state, inventory

    def connect(self, hosts: list[str]) -> tuple[Any, dict[str, Any], dict[str, str]]:
        """(state, name -> connected Host, name -> why it could not connect)."""
        with _LogCollector() as log:
            state, inventory = self._state(hosts)
        connected = {h.name: h for h in state.activated_hosts if h.name in hosts}
        failed = {h: _why(log.lines, h) or "no SSH connection" for h in hosts if h not in connected}
        return state, connected, failed

    def prepare(self, hosts: list[str], state: Any) -> dict[str, str]:
        """Load deploy/pd.py into STATE (the batch's, from `connect`): read the facts, decide the
        operations; nothing on the nodes changes. Name -> error for every host that failed."""
        # lazy: pyinfra's API loads gevent and paramiko (~500 ms); the CLI imports pdkit.roll for every command
        from pyinfra.api.state import StateStage
        from pyinfra_cli.util import load_deploy_file

        def work() -> None:
            state.set_stage(StateStage.Prepare)
            load_deploy_file(state, str(REPO / DEPLOY_FILE))

        self.phases = {}
        return self._phase("prepare", hosts, state, work, "the deploy failed while reading the node")

    def execute(self, hosts: list[str], state: Any) -> dict[str, str]:
        """Run the operations `prepare` decided; name -> error for every host that failed."""
        # lazy: pyinfra's API loads gevent and paramiko (~500 ms); the CLI imports pdkit.roll for every command
        from pyinfra.api.operations import run_ops
        from pyinfra.api.state import StateStage

        timer = _op_timer()

        def work() -> None:
            state.set_stage(StateStage.Execute)
            state.add_callback_handler(timer)
            run_ops(state)

        errors = self._phase("execute", hosts, state, work, "the deploy failed")
        self.operations = {}
        for (host_name, op), took in timer.took.items():
            self.operations.setdefault(host_name, {})[op] = took
        return errors

    def _phase(self, name: str, hosts: list[str], state: Any, work: Callable[[], None],
               failed_note: str) -> dict[str, str]:
        """Run one phase of pyinfra's, timed into self.phases; name -> error for every host that failed."""
        with _LogCollector() as log:
            try:
                t = time.monotonic()
                work()
                self.phases[name] = time.monotonic() - t
            except SystemExit as exc:
                return {h: f"the deploy stopped: {exc}" for h in hosts}
            except Exception as exc:  # noqa: BLE001 - pyinfra raises its own errors for a failed host
                failed = {h.name for h in state.failed_hosts} or set(hosts)
                # pyinfra's own "No hosts remaining!" says nothing a user can act on: the gate's line does
                return {h: _why(log.lines, h) or f"{type(exc).__name__}: {exc}" for h in failed}
        connected = {h.name for h in state.activated_hosts}
        failed = {h.name for h in state.failed_hosts} | (set(hosts) - connected)
        return {h: _why(log.lines, h) or failed_note for h in failed}


def roll_inventory(path: str) -> Any:
    """The pyinfra inventory a roll's batch runs with: the user's, plus node_drained=True.

    The deploy runs on a batch only after its drain gate passed, so the node roles may then
    reboot a node that asks for it (pdkit_node.reboot: when-drained, roles/nvidia_driver.py);
    a plain `pyinfra ... deploy/pd.py` never sets it and never reboots.
    """
    # lazy: pyinfra's API loads gevent and paramiko (~500 ms); the CLI imports pdkit.roll for every command
    from pyinfra_cli.inventory import make_inventory

    return make_inventory(path, override_data={"node_drained": True}, cwd=str(REPO))


def _why(lines: list[str], host: str) -> str:
    """Why HOST failed, from pyinfra's log lines: a health gate's own FAILED line (it carries the
    engine's journal error) when there is one, else the host's last lines."""
    mine = [ln.strip() for ln in lines if host in ln or not ln.lstrip().startswith("[")]
    gates = [ln.split("FAILED", 1)[1].strip() for ln in mine if "FAILED " in ln]
    if gates:
        return " | ".join(dict.fromkeys(gates))[-1500:]
    return " | ".join(mine[-6:])[-1500:]


def run_remote(host: Any, command: str, timeout: int = 900) -> tuple[bool, str, str]:
    """Run COMMAND on a connected pyinfra host: (ok, stdout, stderr)."""
    # lazy: pyinfra's API loads gevent and paramiko (~500 ms); the CLI imports pdkit.roll for every command
    from pyinfra.api import StringCommand

    ok, output = host.run_shell_command(StringCommand(command), _timeout=timeout)
    stdout = "\n".join(line.line for line in output if line.buffer_name == "stdout")
    stderr = "\n".join(line.line for line in output if line.buffer_name == "stderr")
    return ok, stdout, stderr


def patch_gevent() -> None:
    # pyinfra's API needs gevent, patched before anything opens a socket (pyinfra 3.10.0's
    # pyinfra_cli/__init__.py does the same)
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # deploy/pd.py imports roles/

