"""The one gate table (pdkit/agent/gates.py, issue 30 item 7): what ready means per service kind, and
that the deploy, the roll's ready and router steps and a restore all take their gates from it."""

from __future__ import annotations

import shlex

import pytest

from pdkit.agent import gates
from pdkit.inventory.loader import load
from pdkit.render.plan import plan_cluster, services_meta
from tests.conftest import REPO


@pytest.fixture(scope="module")
def lab_plan():
    spec = load(str(REPO / "inventories" / "lab.py"))
    return spec, plan_cluster(spec)


def test_every_service_kind_has_one_gate_and_the_router_waits_for_its_workers(lab_plan):
    spec, plans = lab_plan
    router_host = spec.router_hosts[0].name
    kinds = {s.unit: gates.gate_for(s).kind for p in plans.values() for s in p.services}
    assert kinds["pdkit-engine-decode.service"] == "engine" and kinds["pdkit-exporter.service"] == "http"
    assert kinds["pdkit-router.service"] == "router" and kinds["prometheus.service"] == "http"
    assert set(kinds.values()) <= set(gates.READY) and set(gates.READY) == set(gates.WAITERS)
    router = next(s for s in plans[router_host].services if s.kind == "router")
    gate = gates.gate_for(router)
    # not /health (200 before any worker registered): the worker list, every planned worker, and a completion
    assert gate.url == router.health_url.removesuffix("/health") and set(gate.workers) | set(gate.remote_workers) == set(router.expected_workers)
    assert gate.model == spec.cluster.model.name
    argv = shlex.split(gates.command("py", [gate]))
    assert argv[:4] == ["py", "-m", "pdkit.health", "router"] and "--model" in argv and argv.count("--worker") + argv.count("--remote-worker") == 6


def test_a_release_keeps_the_gate_the_deploy_used(lab_plan):
    """A restore gates from the release's record: the same gate as the deploy's, router included."""
    _, plans = lab_plan
    for plan in plans.values():
        recorded = services_meta(plan.services)
        for s in plan.services:
            assert gates.gate_for(recorded[s.unit], s.unit) == gates.gate_for(s), s.unit


def test_a_router_recorded_without_its_workers_waits_for_every_listed_worker():
    old = {"kind": "router", "files": [], "health_url": "http://h:8000/health", "ready_timeout_s": 30}
    gate = gates.gate_for(old, "pdkit-router.service")
    assert gate.kind == "router" and gate.url == "http://h:8000" and "--any-workers" in gates.command("py", [gate])


def test_the_deploy_takes_its_gate_commands_from_the_table(lab_plan, monkeypatch):
    from roles import services as role

    spec, plans = lab_plan
    seen = []
    monkeypatch.setattr(gates, "command", lambda python, found: seen.append([g.kind for g in found]) or "GATES")
    host = plans[spec.router_hosts[0].name]
    engines = [s for s in host.services if s.kind != "router"]
    assert role.gates_command("py", engines) == "GATES"
    assert role.router_gate_command("py", next(s for s in host.services if s.kind == "router")) == "GATES"
    assert seen == [[gates.gate_for(s).kind for s in engines], ["router"]]


def test_the_rolls_ready_and_router_steps_run_the_tables_gates_on_the_node(lab_plan, monkeypatch):
    import io

    from pdkit.roll import roller as roller_mod
    from pdkit.roll.roller import Progress, Roller

    spec, _ = lab_plan
    roller = Roller("inventories/lab.py", spec, Progress(io.StringIO()))
    router_host = spec.router_hosts[0].name
    roller.connected = {h.name: h.name for h in spec.hosts}
    ran = []
    monkeypatch.setattr(roller_mod, "run_remote", lambda host, command, timeout=900: ran.append((host, command)) or (True, "", ""))
    from pdkit.render import flags

    python = f"{flags.venv_dir(spec)}/bin/python"
    assert "3 engine and daemon gate(s) passed" in roller.ready([router_host])
    assert ran == [(router_host, gates.command(python, roller.gates_of(router_host, 0)))]
    assert [g.kind for g in roller.gates_of(router_host, 0)] == ["engine", "engine", "http"]
    ran.clear()
    assert roller.run_gates([router_host], 1) == (1, [])
    assert ran == [(router_host, gates.command(python, roller.gates_of(router_host, 1)))] and "-m pdkit.health router" in ran[0][1]
    # a failed gate's own line is the step's error
    monkeypatch.setattr(roller_mod, "run_remote", lambda host, command, timeout=900: (False, "", "FAILED pdkit-engine-decode.service failed at its first start: boom"))
    with pytest.raises(RuntimeError, match=f"{router_host}: pdkit-engine-decode.service failed at its first start: boom"):
        roller.ready([router_host])


def test_a_restore_gates_with_the_table(monkeypatch):
    from pdkit.agent import releases

    seen = []
    monkeypatch.setattr(gates, "wait", lambda gate: seen.append(gate) or (True, "ok"))
    meta = {"kind": "router", "files": [], "health_url": "http://h:8000/health", "ready_timeout_s": 30,
            "expected_workers": ["http://h:30000"], "remote_workers": [], "model": "m", "api_key_file": None}
    assert releases._wait_service("pdkit-router.service", meta) == (True, "ok")
    assert seen == [gates.Gate("router", "pdkit-router.service", "http://h:8000", 30.0, ("http://h:30000",), (), "m", None)]
