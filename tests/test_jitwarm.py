"""Warm JIT caches (issue 45 item 2): the deploy's serial first start of a node's engines on cold caches
(pdkit/agent/jitwarm.py, its command from pdkit/render/jitplan.py) and the roll's warning before a node's restart.
The stamp and its verdict: tests/test_jitcache.py; doctor's jit_caches row: tests/test_doctor.py."""

from __future__ import annotations

import json

import pytest

from pdkit.agent import jitcache, jitwarm
from pdkit.inventory.loader import load
from pdkit.render import jitplan
from pdkit.render.plan import plan_cluster
from tests.conftest import REPO


def test_two_cold_engines_start_one_after_another_and_warm_ones_at_once():
    daemons = ["pdkit-exporter.service"]
    # warm, or only one cold: everything at once, as before
    assert jitwarm.serial_stages([("p", False), ("d", False)], daemons) == [["p", "d", *daemons]]
    assert jitwarm.serial_stages([("p", False), ("d", True)], daemons) == [["p", "d", *daemons]]
    # both cold: the prefill (first in start order) with the daemons, then the decode once it serves
    assert jitwarm.serial_stages([("p", True), ("d", True)], daemons) == [["p", *daemons], ["d"]]
    # a warm engine never waits: it starts with the first cold one
    assert jitwarm.serial_stages([("p1", True), ("p2", False), ("d", True)], []) == [["p1", "p2"], ["d"]]


def test_restart_waits_for_the_first_cold_engine_before_the_next_and_never_fails_on_it(monkeypatch, capsys):
    ran, waited = [], []
    monkeypatch.setattr(jitwarm, "_systemctl", lambda verb, units: ran.append([verb, *units]) or 0)
    monkeypatch.setattr(jitcache, "judge", lambda d: {"state": "cold" if "cold" in d else "warm"})

    def wait_engine(unit, url, timeout):
        waited.append((unit, url, timeout))
        return False, "not ready after 9 s"

    monkeypatch.setattr(jitwarm.health, "wait_engine", wait_engine)
    engines = [("prefill.service", "http://h:30000/health", "/c/cold-p"),
               ("decode.service", "http://h:30001/health", "/c/cold-d")]
    units = ["prefill.service", "decode.service", "pdkit-exporter.service"]
    assert jitwarm.restart(units, engines, 9.0) == 0
    # the decode stops with the others (no old decode pairs with the new prefill), starts once the prefill served
    assert ran == [["stop", "decode.service"], ["restart", "prefill.service", "pdkit-exporter.service"],
                   ["restart", "decode.service"]]
    assert waited == [("prefill.service", "http://h:30000/health", 9.0)]
    out = capsys.readouterr().out
    assert "cold for prefill.service, decode.service" in out and "the next starts anyway" in out
    ran.clear()
    warm = [(u, url, d.replace("cold", "warm")) for u, url, d in engines]
    assert jitwarm.restart(units, warm, 9.0) == 0 and ran == [["restart", *units]]
    # systemctl's own failure is the command's
    monkeypatch.setattr(jitwarm, "_systemctl", lambda verb, units: 5)
    assert jitwarm.restart(units, engines, 9.0) == 5


def test_state_prints_each_directory_s_verdict(tmp_path, capsys):
    assert jitwarm.main(["state", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["dir"] for r in rows] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert {r["state"] for r in rows} == {"cold"}


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.chdir(REPO)
    return load("inventories/cluster.py")


def test_the_deploy_restarts_a_node_s_pd_pair_through_the_serial_start_prefill_first(cluster):
    plan = plan_cluster(cluster)["gpu01"]
    services = list(plan.services)
    command = jitplan.restart_command(cluster, "gpu01", services)
    assert command is not None and " -m pdkit.jitwarm restart --timeout " in command
    dirs = jitplan.engine_dirs(cluster, "gpu01")
    prefill = command.index("--engine pdkit-engine-prefill.service http://")
    decode = command.index("--engine pdkit-engine-decode.service http://")
    assert prefill < decode and dirs["prefill"][0] in command and dirs["decode"][0] in command
    # every unit of the operation is restarted by it
    assert all(s.unit in command.split(" --engine")[-1] for s in services)
    # one engine alone, or none: plain systemctl
    assert jitplan.restart_command(cluster, "gpu01", [s for s in services if s.engine != "decode"]) is None


def test_engines_sharing_gpus_keep_their_own_ordered_start(monkeypatch):
    monkeypatch.chdir(REPO)
    spec = load("inventories/h200-1gpu.py")
    host = next(h.name for h in spec.hosts if h.node is not None and h.node.engines)
    services = list(plan_cluster(spec)[host].services)
    assert any(s.share_group for s in services)
    assert jitplan.restart_command(spec, host, services) is None


def test_the_roll_warns_of_cold_caches_with_the_measured_cost_and_says_nothing_when_warm(cluster):
    engines = jitplan.engine_dirs(cluster, "gpu01")
    (pd, release), (dd, _) = engines["prefill"], engines["decode"]
    judged = [{"dir": pd, "state": "warm", "why": "1 gated start(s)", "extra_s": None, "extra_from": None},
              {"dir": dd, "state": "cold", "why": "no start of this engine passed the kit's engine gate",
               "extra_s": 212.4, "extra_from": "/var/cache/x/jit/0.5.17/decode"}]
    words = jitplan.warning_words(judged, engines)
    assert words.startswith("warning: decode (SGLang ") and "prefill" not in words
    assert "expect ~212 s more than a warm start" in words and "0.5.17/decode" in words
    judged[1]["extra_s"] = None
    assert "no cold start of it measured on this node yet" in jitplan.warning_words(judged, engines)
    judged[1]["state"] = "warm"
    assert jitplan.warning_words(judged, engines) == ""
    # through the node: the state command of the release each engine will run
    seen = []

    def run(cmd):
        seen.append(cmd)
        return True, json.dumps([{**judged[0]}, {**judged[1], "state": "cold"}]) + "\n", ""

    assert "decode" in jitplan.pre_restart_warning(cluster, "gpu01", run)
    assert " -m pdkit.jitwarm state " in seen[0] and f"/jit/{release}/" in seen[0]
    # a node that cannot tell says so, and the roll goes on
    said = jitplan.pre_restart_warning(cluster, "gpu01", lambda cmd: (False, "", "No module named pdkit.agent.jitwarm"))
    assert said.startswith("JIT caches not judged (No module named pdkit.agent.jitwarm")

    def broken(cmd):
        raise OSError("ssh went away")

    assert "ssh went away" in jitplan.pre_restart_warning(cluster, "gpu01", broken)
