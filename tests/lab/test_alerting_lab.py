"""Alerts reach a person, and planned changes page nobody (issue 31), on the lab's real Prometheus
and Alertmanager, with the lab's webhook receiver (`lab-sink`, tests/lab/alertsink.py) standing in
for a pager.

One scenario, under load: `pdkit roll --canary C` of a change C cannot start (its ready gate waits
`ready_timeout_s`, then the roll restores C and stops). While the roll holds C silenced:

- C's node_exporter is stopped: `PdkitNodeDown` fires for C in Prometheus, Alertmanager marks it
  silenced by the roll's silence, and the test starts the exporter again before the roll ends, so
  it resolves under the silence. Nothing about C may ever reach the sink, also after the roll
  expired its silence (a node a roll restored is not left broken, so nothing should page later).
- Another node X goes down for real (node_exporter and both engines stopped): `PdkitNodeDown` for
  X reaches the sink, once; X's `PdkitEngineDown` alerts fire in Prometheus (one per engine) but
  Alertmanager holds them back, inhibited by the node's alert: one page for the node.

The lab's alert clock (inventories/lab.py: lab_alert_speedup 4, group_wait 5 s, group_interval
10 s) keeps this to about a minute and a half. Leaves the lab converged on inventories/lab.py.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import requests

from tests.conftest import REPO
from tests.lab.alertsink import Sink, alerting_facts
from tests.lab.test_deploy import failed_hosts, run_pyinfra
from tests.lab.test_monitoring_lab import _monitoring_facts
from tests.lab.test_roll import PDKIT, Load, base_plan, derived_inventory, ssh, wait_router_steady  # noqa: F401 - base_plan is a fixture

pytestmark = pytest.mark.lab

NODE_EXPORTER = "prometheus-node-exporter.service"
ENGINES = ("pdkit-engine-prefill.service", "pdkit-engine-decode.service")
# how long the canary's broken change holds the roll (its ready gate): long enough for the canary's
# PdkitNodeDown to fire under the roll's silence (lab `for` 15 s + a 10 s evaluation) and resolve again
HOLD_S = 60


def am_alerts(am: str, **labels: str) -> list[dict]:
    """Alertmanager's view of the alerts with LABELS: each with status.state (active / suppressed),
    silencedBy and inhibitedBy."""
    flt = [f'{k}="{v}"' for k, v in labels.items()]
    r = requests.get(f"{am}/api/v2/alerts", params=[("filter", f) for f in flt], timeout=10)
    r.raise_for_status()
    return r.json()


def pdkit_silences(am: str, node: str) -> list[dict]:
    """Active silences pdkit created whose matchers name NODE."""
    out = []
    for s in requests.get(f"{am}/api/v2/silences", timeout=10).json():
        if s.get("createdBy") != "pdkit" or s["status"]["state"] != "active":
            continue
        if any(m["name"] == "node" and m["value"] == node for m in s["matchers"]):
            out.append(s)
    return out


def wait(predicate, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(interval)
    pytest.fail(f"{what}: not within {timeout:.0f} s; last seen: {last}")


@pytest.fixture(scope="module")
def facts(lab, base_plan):
    out = _monitoring_facts()
    out.update(alerting_facts())
    return out


def test_a_roll_pages_nobody_for_its_node_while_a_node_down_elsewhere_pages_once(lab, base_plan, facts, tmp_path):
    canary, other = base_plan["gpu"][1], base_plan["gpu"][2]
    assert base_plan["router"] not in (canary, other)
    am = facts["am"]
    node_for, engine_for = facts["for_s"]["PdkitNodeDown"], facts["for_s"]["PdkitEngineDown"]
    # the node's page must come first, or its engines page before the inhibition can hold them back
    assert node_for < engine_for, (node_for, engine_for)
    evaluation = facts["scrape_s"]
    sink = Sink(lab, facts["mon"])
    sink.start()
    broken = derived_inventory(
        tmp_path, "lab_alerting",
        f"_cluster['ready_timeout_s'] = {HOLD_S}\n"
        f"[d for n, d in gpu_nodes if n == {canary!r}][0]['pdkit_node']['engines'][1]['env'] = {{'PDKIT_SIM_STARTUP_DELAY_S': '3600'}}",
    )
    report = tmp_path / "roll.json"
    wait_router_steady(base_plan)
    load = Load(tmp_path, base_plan, concurrency=4)
    roll = None
    try:
        load.wait_flowing(at_least=8)
        log = (tmp_path / "roll.log").open("w")
        roll = subprocess.Popen([PDKIT, "roll", str(broken), "--canary", canary, "--report", str(report)],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait(lambda: (bool(pdkit_silences(am, canary)), None), 120, f"the roll's silence for {canary} in Alertmanager")
        assert ssh(lab, canary, f"systemctl stop {NODE_EXPORTER}").returncode == 0
        assert ssh(lab, other, f"systemctl stop {NODE_EXPORTER} {' '.join(ENGINES)}").returncode == 0
        stopped = time.monotonic()

        # the real fault elsewhere pages: X's node alert reaches the sink after `for` + an evaluation + group_wait
        budget = node_for + 2 * evaluation + facts["group_wait_s"] + 20
        took = sink.wait_for("PdkitNodeDown", "firing", budget, node=other)
        print(f"PdkitNodeDown for {other} reached the sink {time.monotonic() - stopped:.1f} s after the stop (waited {took:.1f} s)")

        # the rolled node's alert fires too, and Alertmanager holds it: silenced by pdkit's silence
        def canary_silenced():
            found = am_alerts(am, alertname="PdkitNodeDown", node=canary)
            return any(a["status"]["state"] == "suppressed" and a["status"]["silencedBy"] for a in found), found
        wait(canary_silenced, node_for + 3 * evaluation + 10, f"PdkitNodeDown for {canary} silenced in Alertmanager")
        assert roll.poll() is None, f"the roll ended before the canary's alert was seen silenced; raise HOLD_S:\n{(tmp_path / 'roll.log').read_text()[-3000:]}"
        assert ssh(lab, canary, f"systemctl start {NODE_EXPORTER}").returncode == 0

        # X's engines are down too: Prometheus fires PdkitEngineDown for each (Alertmanager only hears of
        # alerts Prometheus fires; this was test_monitoring_lab's stopped-engine test), Alertmanager inhibits both
        def engines_inhibited():
            found = am_alerts(am, alertname="PdkitEngineDown", node=other)
            held = [a for a in found if a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]]
            return len(held) == len(ENGINES) and len(found) == len(ENGINES), found
        wait(engines_inhibited, engine_for + 3 * evaluation + 10, f"{other}'s PdkitEngineDown alerts inhibited by its node's")

        # the canary's alert resolves under the silence (its exporter is back) before the roll expires it
        def canary_resolved():
            found = am_alerts(am, alertname="PdkitNodeDown", node=canary)
            return not found, found
        wait(canary_resolved, 3 * evaluation + 20, f"PdkitNodeDown for {canary} resolved")
        assert roll.wait(timeout=600) != 0, "the broken canary's roll should have stopped"
        out = (tmp_path / "roll.log").read_text()
        assert f"stopped: {canary}" in out or "stopped" in out, out[-3000:]
        record = json.loads(report.read_text())
        silences = record.get("silences") or []
        assert silences and all(s.get("expired_at") for s in silences), silences
        assert not pdkit_silences(am, canary), "the roll's silence outlived the roll"
        # a group_interval after the silence expired, nothing about the canary has reached the sink
        time.sleep(facts["group_interval_s"] + evaluation)
        about_canary = [(a["labels"].get("alertname"), a["status"]) for n in sink.notifications() for a in n["alerts"]
                        if a["labels"].get("node") == canary]
        assert not about_canary, f"the rolled node paged: {about_canary}"
        # one page for the node that went down: its node alert, once; none of its engine alerts
        about_other = [(a["labels"].get("alertname"), a["labels"].get("instance")) for n in sink.notifications() for a in n["alerts"]
                       if a["labels"].get("node") == other and a["status"] == "firing"]
        assert about_other == [("PdkitNodeDown", other)], f"{other} paged as: {about_other}"
    finally:
        if roll is not None and roll.poll() is None:
            roll.terminate()
            roll.wait(timeout=300)
        ssh(lab, canary, f"systemctl start {NODE_EXPORTER}")
        ssh(lab, other, f"systemctl start {NODE_EXPORTER} {' '.join(ENGINES)}")
        counts = load.stop()
        print({k: counts.get(k) for k in ("ok", "failed", "failures")})
        sink.stop()
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-3000:]
    wait_router_steady(base_plan)
