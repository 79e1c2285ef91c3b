"""The services role's decisions: which files are written how, what (re)starts, the gate command."""

from __future__ import annotations

import shlex

from pdkit.render.plan import PlannedFile, Service
from roles.install_files import install_commands
from roles.services import gates_command, is_unit_file, restart_plan

UNIT = PlannedFile("/etc/systemd/system/pdkit-engine-decode.service", "[Service]\n", "0644", "root", "root")
SECRET = PlannedFile("/etc/pdkit/secrets.env", "HF_TOKEN=x\n", "0600", "root", "root", secret=True)
CONFIG = PlannedFile("/etc/pdkit/exporter.json", "{}\n", "0640", "root", "pdkit")


def test_files_are_uploaded_to_staging_then_given_mode_and_owner_before_they_move_into_place():
    steps = install_commands([UNIT, SECRET, CONFIG], "/etc/pdkit/.staging", daemon_reload=True)
    uploads, command = steps[:-1], steps[-1]
    # every upload lands in the root-only staging directory, never under its final path
    assert uploads == [(UNIT, "/etc/pdkit/.staging/0"), (SECRET, "/etc/pdkit/.staging/1"), (CONFIG, "/etc/pdkit/.staging/2")]
    parts = command.split(" && ")
    for f, staged in uploads:
        chown, chmod, move = (parts.index(p) for p in (f"chown {shlex.quote(f.owner)}:{shlex.quote(f.group)} {staged}",
                                                       f"chmod {f.mode} {staged}", f"mv -f {staged} {f.path}"))
        assert chown < move and chmod < move  # the file is never visible with the upload's mode
    assert parts[-1] == "systemctl daemon-reload"
    # no secret in the command (uploads carry the content)
    assert "HF_TOKEN" not in command
    assert "daemon-reload" not in install_commands([CONFIG], "/s", daemon_reload=False)[-1]


def test_unit_files_and_drop_ins_need_a_daemon_reload():
    assert is_unit_file("/etc/systemd/system/pdkit-engine-decode.service")
    assert is_unit_file("/etc/systemd/system/nvidia-dcgm-exporter.service.d/pdkit.conf")
    assert not is_unit_file("/etc/pdkit/exporter.json")


def _service(unit: str, kind: str, files: tuple[str, ...], venv: str | None = None) -> Service:
    return Service(unit=unit, kind=kind, files=files, health_url=f"http://10.0.0.1/{unit}", ready_timeout_s=60, venv=venv)


def test_restart_plan_starts_what_is_down_and_restarts_what_changed():
    venv, engine_venv = "/opt/pdkit/venv", "/opt/pdkit/engine-venv"
    engine = _service("e.service", "engine", ("/etc/e.service", "/etc/e.env"), engine_venv)
    other = _service("o.service", "engine", ("/etc/o.service",), engine_venv)
    exporter = _service("x.service", "http", ("/etc/x.json",), venv)
    down = _service("d.service", "http", ("/etc/d.json",))
    units = {"e.service": ["loaded", "active", "enabled"], "o.service": ["loaded", "active", "enabled"],
             "x.service": ["loaded", "active", "enabled"], "d.service": ["loaded", "inactive", "enabled"]}
    state = {"units": units}
    start, restart = restart_plan([engine, other, exporter, down], state, {"/etc/e.env", "/etc/x.json"}, set())
    assert [s.unit for s in start] == ["d.service"]
    assert [s.unit for s in restart] == ["e.service", "x.service"]
    # a new node venv (a pdkit upgrade): only what runs from it (the exporter); engines and packaged daemons not
    start, restart = restart_plan([engine, other, exporter, down], state, set(), {venv})
    assert [s.unit for s in restart] == ["x.service"]
    # a new engine environment: the engines
    start, restart = restart_plan([engine, other, exporter, down], state, set(), {engine_venv})
    assert [s.unit for s in restart] == ["e.service", "o.service"]
    # nothing changed, everything up: nothing to do
    assert restart_plan([engine, exporter], state, set(), set()) == ([], [])
    # a file the current release gave the unit (a secrets file the plan drops) restarts it when removed
    state_prev = {"units": units, "release": {"services": {"o.service": {"files": ["/etc/secrets.env"]}}}}
    assert [s.unit for s in restart_plan([other], state_prev, {"/etc/secrets.env"}, set())[1]] == ["o.service"]


def test_one_gate_command_waits_for_every_engine_and_daemon():
    engine = _service("pdkit-engine-decode.service", "engine", ())
    exporter = _service("pdkit-exporter.service", "http", ())
    argv = shlex.split(gates_command("/opt/pdkit/venv/bin/python", [engine, exporter]))
    assert argv == ["/opt/pdkit/venv/bin/python", "-m", "pdkit.health", "gates",
                    "--engine", "pdkit-engine-decode.service", "http://10.0.0.1/pdkit-engine-decode.service", "60",
                    "--service", "pdkit-exporter.service", "http://10.0.0.1/pdkit-exporter.service", "60"]
    from pdkit.agent.health import main

    # the same words parse with the on-host CLI (an unreachable URL fails fast, not a usage error)
    assert main(["gates", "--http", "http://127.0.0.1:9/x", "0.3"]) == 1


def test_the_engines_restart_goes_through_the_serial_start_when_one_is_given(monkeypatch):
    """Issue 45 item 2: the operation that (re)starts a node's engines and daemons ends in the command
    SERIAL gives (pdkit.render.jitplan.restart_command: cold engines one at a time), else `systemctl restart`."""
    from types import SimpleNamespace

    from roles import services as role

    ran = []
    monkeypatch.setattr(role, "server", SimpleNamespace(shell=lambda name, commands: ran.append(commands[0])))
    units = [SimpleNamespace(unit="p.service"), SimpleNamespace(unit="d.service")]
    role._start_and_restart(units[:1], units[1:], "engines", serial=lambda s: f"jitwarm {' '.join(u.unit for u in s)}")
    assert ran[0].endswith("systemctl enable p.service && jitwarm p.service")
    assert ran[1].endswith("|| true; } && jitwarm d.service")
    ran.clear()
    role._start_and_restart([], units, "engines", serial=lambda s: None)
    assert ran == ["{ systemctl reset-failed p.service d.service || true; } && systemctl restart p.service d.service"]
