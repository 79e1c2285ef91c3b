"""The one restart rule (pdkit/agent/changes.py), and deploy, roll and rollback all deciding by it (issue #18 items 1, 8)."""

from __future__ import annotations

import pytest

from pdkit.agent import changes, releases
from pdkit.inventory.loader import load
from pdkit.render.plan import plan_cluster, services_meta
from pdkit.roll.planning import host_diff
from roles.services import restart_plan
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory

NODE_VENV = "/opt/pdkit/venv"
ENGINE_VENV = "/opt/pdkit/engine-venv"
ROUTER_VENV = "/opt/pdkit/router-venv"
SERVICES = {
    "engine.service": {"kind": "engine", "files": ["/u/engine.service", "/etc/engine.env", "/etc/nccl.env"], "venv": ENGINE_VENV},
    "exporter.service": {"kind": "http", "files": ["/u/exporter.service", "/etc/exporter.json"], "venv": NODE_VENV},
    "router.service": {"kind": "router", "files": ["/u/router.service", "/etc/router-api-key"], "venv": ROUTER_VENV},
    "prometheus.service": {"kind": "http", "files": ["/etc/prometheus/prometheus.yml"], "venv": None},
}
UP = {u: True for u in SERVICES}

# (what changed: files, venvs, units down) -> (start, restart)
CASES = [
    ("nothing", set(), set(), set(), [], []),
    ("an engine env file", {"/etc/engine.env"}, set(), set(), [], ["engine.service"]),
    ("the node venv (a pdkit upgrade): only the exporter runs from it", set(), {NODE_VENV}, set(), [], ["exporter.service"]),
    ("the engine environment (a new lock): only the engines", set(), {ENGINE_VENV}, set(), [], ["engine.service"]),
    ("the router venv: only the router", set(), {ROUTER_VENV}, set(), [], ["router.service"]),
    ("every venv", set(), {NODE_VENV, ENGINE_VENV, ROUTER_VENV}, set(), [], ["engine.service", "exporter.service", "router.service"]),
    ("a Prometheus file", {"/etc/prometheus/prometheus.yml"}, set(), set(), [], ["prometheus.service"]),
    ("the router key", {"/etc/router-api-key"}, set(), set(), [], ["router.service"]),
    ("a unit is down: started, not restarted", {"/etc/engine.env"}, set(), {"engine.service"}, ["engine.service"], []),
    ("router and engine: router last", {"/u/router.service", "/etc/nccl.env"}, set(), set(), [], ["engine.service", "router.service"]),
]


@pytest.mark.parametrize(("what", "files", "venvs", "down", "start", "restart"), CASES, ids=[c[0] for c in CASES])
def test_the_restart_rule(what, files, venvs, down, start, restart):
    decision = changes.decide(SERVICES, files, venvs, {u: u not in down for u in SERVICES})
    assert (decision.start, decision.restart) == (start, restart), what


# A node that provides its own engine environment (pdkit_node.engine_venv): its engines run from
# none of pdkit's venvs (pdkit/render/plan.py Service.venv None), pdkit-exporter still from the node venv
PROVIDED = {
    "engine.service": {"kind": "engine", "files": ["/u/engine.service", "/etc/engine.env", "/etc/nccl.env"], "venv": None},
    "exporter.service": {"kind": "http", "files": ["/u/exporter.service", "/etc/exporter.json"], "venv": NODE_VENV},
    "router.service": {"kind": "router", "files": ["/u/router.service"], "venv": ROUTER_VENV},
}
PROVIDED_CASES = [
    ("provided env, the node venv: only the exporter, the engines keep running", set(), {NODE_VENV}, set(), [], ["exporter.service"]),
    ("provided env, both venvs: the exporter and the router", set(), {NODE_VENV, ROUTER_VENV}, set(), [], ["exporter.service", "router.service"]),
    ("provided env, engine_venv moved (its unit file changed): the engine", {"/u/engine.service"}, set(), set(), [], ["engine.service"]),
    ("provided env, an engine env file and the node venv: both", {"/etc/engine.env"}, {NODE_VENV}, set(), [], ["engine.service", "exporter.service"]),
    ("provided env, an engine down: started whatever the venvs", set(), {NODE_VENV}, {"engine.service"}, ["engine.service"], ["exporter.service"]),
]


@pytest.mark.parametrize(("what", "files", "venvs", "down", "start", "restart"), PROVIDED_CASES, ids=[c[0] for c in PROVIDED_CASES])
def test_the_restart_rule_on_a_node_with_its_own_engine_env(what, files, venvs, down, start, restart):
    decision = changes.decide(PROVIDED, files, venvs, {u: u not in down for u in PROVIDED})
    assert (decision.start, decision.restart) == (start, restart), what


def test_a_file_only_the_current_release_gave_a_unit_restarts_it_when_removed():
    previous = {"engine.service": {"files": ["/etc/secrets.env"]}}
    assert changes.decide(SERVICES, {"/etc/secrets.env"}, set(), UP, previous).restart == ["engine.service"]
    assert changes.decide(SERVICES, {"/etc/secrets.env"}, set(), UP).restart == []


def test_a_legacy_release_without_venv_restarts_on_any_venv_change():
    legacy = {"old.service": {"kind": "http", "files": []}}
    assert changes.decide(legacy, set(), {ROUTER_VENV}, {"old.service": True}).restart == ["old.service"]
    assert changes.decide(legacy, set(), set(), {"old.service": True}).restart == []


REMOVALS = [
    ("planned files stay", ["/a", "/b"], ["/a", "/b"], ["/a", "/b"], []),
    ("a dropped file that is there goes", ["/a", "/etc/secrets.env"], ["/a"], ["/a", "/etc/secrets.env"], ["/etc/secrets.env"]),
    ("a dropped file already gone: nothing (second run reports no change)", ["/a", "/etc/secrets.env"], ["/a"], ["/a"], []),
    ("a file never recorded is never touched", ["/a"], ["/a"], ["/a", "/etc/someone-elses"], []),
]


@pytest.mark.parametrize(("what", "recorded", "planned", "present", "remove"), REMOVALS, ids=[c[0] for c in REMOVALS])
def test_removals(what, recorded, planned, present, remove):
    assert changes.removals(recorded, planned, present) == remove, what


def test_units_to_stop():
    on = {"pdkit-engine-old.service": True, "pdkit-engine-stopped.service": False}
    assert changes.units_to_stop([*on, "pdkit-engine-decode.service"], ["pdkit-engine-decode.service"], on) == ["pdkit-engine-old.service"]


@pytest.fixture()
def gpu01_plans(tmp_path):
    """gpu01's plan with secrets, and without them (the inventory dropped pdkit_cluster.secrets)."""
    with_secrets = {**BASE_CLUSTER, "secrets": {"hf_token": "hf_recognisable_1234"}}
    a = plan_cluster(load(str(write_inventory(tmp_path, BASE_HOSTS, with_secrets))))["gpu01"]
    b = plan_cluster(load(str(write_inventory(tmp_path, BASE_HOSTS, BASE_CLUSTER))))["gpu01"]
    return a, b


def _node_on(plan) -> dict:
    """A host-state fact (roles/facts.py) of a node that runs PLAN as its current release."""
    return {
        "paths": {f.path: ["file", f.mode, f.owner, f.group, f.sha256] for f in plan.files},
        "units": {s.unit: ["loaded", "active", "enabled"] for s in plan.services},
        "release": {"files": sorted(f.path for f in plan.files), "services": services_meta(plan.services)},
    }


def test_dropping_secrets_removes_the_file_and_deploy_roll_and_rollback_agree_on_restarts(gpu01_plans):
    with_secrets, without = gpu01_plans
    state = _node_on(with_secrets)
    secrets = "/etc/pdkit/secrets.env"
    assert secrets in state["paths"] and secrets not in {f.path for f in without.files}
    # the dry plan (roll) sees the file to remove
    diff = host_diff(without, state)
    assert diff.removes == (secrets,)
    # the deploy: the same restarts
    changed = set(diff.files) | set(diff.removes)
    start, restart = restart_plan(list(without.services), state, changed, set())
    assert start == []
    assert sorted(s.unit for s in restart) == sorted(diff.restarts)
    # the rollback of the other direction (a release without secrets restored over one with them) removes it too
    target = {"files": {f.path: {"mode": f.mode, "owner": f.owner, "group": f.group, "sha256": f.sha256} for f in without.files},
              "services": services_meta(without.services)}
    current = {f.path: {"mode": f.mode, "owner": f.owner, "group": f.group, "sha256": f.sha256} for f in with_secrets.files}
    restore = releases.plan_restore(target, current, {}, {s.unit: True for s in without.services}, [s.unit for s in with_secrets.services],
                                    services_meta(with_secrets.services))
    assert restore.remove == [secrets]
    assert sorted(restore.restart) == sorted(diff.restarts)
    # every engine read the secrets file: each restarts
    assert {u for u in diff.restarts if "engine" in u} == {s.unit for s in without.services if s.kind == "engine"}


@pytest.mark.parametrize(("link", "expected"), [
    # a pdkit upgrade: pdkit-exporter alone, the engines keep serving (issue 30 item 3)
    (NODE_VENV, ["pdkit-exporter.service"]),
    # a new engine lock (or sim sources): the engines alone
    (ENGINE_VENV, ["pdkit-engine-decode.service", "pdkit-engine-prefill.service"]),
], ids=["node venv", "engine environment"])
def test_a_new_venv_restarts_what_runs_from_it_in_deploy_roll_and_rollback(gpu01_plans, link, expected):
    plan = gpu01_plans[1]
    state = _node_on(plan)
    assert sorted(s.unit for s in plan.services if s.venv == link) == expected
    assert sorted(host_diff(plan, state, new_venvs={link}).restarts) == expected
    assert sorted(s.unit for s in restart_plan(list(plan.services), state, set(), {link})[1]) == expected
    target = {"files": {p: dict(zip(("mode", "owner", "group", "sha256"), v[1:], strict=True)) for p, v in state["paths"].items()},
              "services": services_meta(plan.services), "venvs": {link: "/opt/pdkit/venvs/new"}}
    restore = releases.plan_restore(target, dict(target["files"]), {link: "/opt/pdkit/venvs/old"}, {u: True for u in target["services"]}, list(target["services"]))
    assert sorted(restore.restart) == expected


def test_a_node_whose_engines_left_the_spec_stops_and_removes_them(tmp_path):
    """Item 1, units: the engines, their env files and the exporter of a node with no engines left."""
    import copy

    hosts = copy.deepcopy(BASE_HOSTS)
    before = plan_cluster(load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER))))["gpu02"]
    hosts["gpu02"]["pdkit_node"]["engines"] = []
    after = plan_cluster(load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER))))["gpu02"]
    state = _node_on(before)
    assert not any(s.kind == "engine" or s.unit == "pdkit-exporter.service" for s in after.services)
    units = {u: True for u in state["release"]["services"]}
    assert changes.units_to_stop(state["release"]["services"], [s.unit for s in after.services], units) == sorted(
        ["pdkit-engine-decode.service", "pdkit-engine-prefill.service", "pdkit-exporter.service"])
    removed = host_diff(after, state).removes
    assert {"/etc/systemd/system/pdkit-engine-decode.service", "/etc/pdkit/engines/decode.env", "/etc/pdkit/exporter.json"} <= set(removed)


def test_a_new_node_venv_on_a_provided_env_node_restarts_only_the_exporter_in_deploy_roll_and_rollback(tmp_path):
    """Issue 22 item 1: gpu01's engines run from its own environment, so the deploy, `pdkit roll
    --dry` and a rollback agree that a new node venv restarts pdkit-exporter alone there, while
    gpu02 (engines from the kit-managed engine environment) restarts its engines only on a new
    engine environment."""
    import copy

    hosts = copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_node"]["engine_venv"] = "/opt/sglang-env"
    plans = plan_cluster(load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER))))
    for name, expected in (("gpu01", ["pdkit-exporter.service"]),
                           ("gpu02", ["pdkit-engine-decode.service", "pdkit-engine-prefill.service", "pdkit-exporter.service"])):
        plan = plans[name]
        state = _node_on(plan)
        # every venv pdkit has replaced at once: the provided environment's engines still stay up
        assert sorted(host_diff(plan, state, new_venvs={NODE_VENV, ENGINE_VENV}).restarts) == expected, name
        assert sorted(s.unit for s in restart_plan(list(plan.services), state, set(), {NODE_VENV, ENGINE_VENV})[1]) == expected, name
        target = {"files": {p: dict(zip(("mode", "owner", "group", "sha256"), v[1:], strict=True)) for p, v in state["paths"].items()},
                  "services": services_meta(plan.services), "venvs": {NODE_VENV: "/opt/pdkit/venvs/node-new", ENGINE_VENV: "/opt/pdkit/venvs/engine-new"}}
        restore = releases.plan_restore(target, dict(target["files"]), {NODE_VENV: "/opt/pdkit/venvs/node-old", ENGINE_VENV: "/opt/pdkit/venvs/engine-old"},
                                        {u: True for u in target["services"]}, list(target["services"]))
        assert sorted(restore.restart) == expected, name


def test_a_node_of_the_previous_layout_migrates_with_one_engine_restart_then_pdkit_changes_leave_engines(tmp_path, monkeypatch):
    """Issue 30 item 3, migration: a node deployed when the engines ran from the node venv
    (ExecStart=/opt/pdkit/venv/bin/python, `venv` /opt/pdkit/venv in its release) gets, on its
    first deploy with the engine environment, its engine unit files rewritten and two new venv
    links; every engine and pdkit-exporter restart in that one deploy (deploy, roll --dry and
    rollback agree), and from then on a new node venv restarts pdkit-exporter alone."""
    from pdkit.render import flags

    spec = load(str(write_inventory(tmp_path, BASE_HOSTS, BASE_CLUSTER)))
    new = plan_cluster(spec)["gpu01"]
    # the previous layout, as that pdkit rendered it: engines on the node venv's python
    with monkeypatch.context() as m:
        m.setattr(flags, "engine_python", lambda spec, node: f"{flags.venv_dir(spec)}/bin/python")
        m.setattr(flags, "engine_service_venv", lambda spec, node: flags.venv_dir(spec))
        old = plan_cluster(spec)["gpu01"]
    engines = sorted(s.unit for s in new.services if s.kind == "engine")
    assert engines and all(s.venv == NODE_VENV for s in old.services if s.kind == "engine")
    state = _node_on(old)
    first = host_diff(new, state, new_venvs={NODE_VENV, ENGINE_VENV})
    assert {f"/etc/systemd/system/{u}" for u in engines} <= set(first.files)
    assert sorted(first.restarts) == [*engines, "pdkit-exporter.service"]
    start, restart = restart_plan(list(new.services), state, set(first.files), {NODE_VENV, ENGINE_VENV})
    assert start == [] and sorted(s.unit for s in restart) == sorted(first.restarts)
    # migrated: the next pdkit-only change restarts pdkit-exporter and no engine
    assert host_diff(new, _node_on(new), new_venvs={NODE_VENV}).restarts == ("pdkit-exporter.service",)
