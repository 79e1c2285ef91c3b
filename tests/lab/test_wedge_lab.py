"""A wedged sim engine in the lab: its scheduler stops stepping while its HTTP server answers
(PDKIT_SIM_STALL_FILE, pdkit/sim/knobs.py), requests sit in it, and the lab's real Prometheus
fires PdkitEngineWedged for it while `pdkit doctor` FAILs its queues check. The lab's Alertmanager
sends it to the lab's webhook receiver (tests/lab/alertsink.py) once, within the rule's `for` plus
an evaluation plus group_wait, and sends it resolved once the engine is back (issue 31).

The stall file is switched on through a systemd drop-in on the node (the rendered unit has no sim
knobs); the drop-in is removed and the cluster re-converged afterwards. The alert must fire before
the engine's own scheduler watchdog (SGLang's 300 s default, which the sim models) ends the process.
Runs after test_deploy.py in the same session.
"""

from __future__ import annotations

import threading

import pytest
import requests

from tests.lab.alertsink import Sink, alerting_facts
from tests.lab.test_deploy import failed_hosts, run_pyinfra, ssh
from tests.lab.test_doctor_lab import INVENTORY, doctor, failures
from tests.lab.test_monitoring_lab import _monitoring_facts, _wait

pytestmark = pytest.mark.lab

STALL = "/run/pdkit-sim-stall"
DROPIN_DIR = "/etc/systemd/system/pdkit-engine-decode.service.d"
DROPIN = f"{DROPIN_DIR}/zz-pdkit-wedge-test.conf"


@pytest.fixture(scope="module")
def facts(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-3000:]
    out = _monitoring_facts()
    out.update(alerting_facts())
    return out


def test_a_wedged_engine_fires_the_wedge_alert_and_fails_doctor(lab, facts):
    host = facts["gpu"][-1]
    setup = (f"mkdir -p {DROPIN_DIR} && printf '[Service]\\nEnvironment=PDKIT_SIM_STALL_FILE={STALL}\\n' > {DROPIN} "
             f"&& rm -f {STALL} && systemctl daemon-reload && systemctl restart pdkit-engine-decode.service")
    assert ssh(lab, host, setup).returncode == 0
    sink = Sink(lab, facts["mon"])
    sink.start()
    stop = threading.Event()

    def load():  # requests that reach the wedged decode sit in it until the test ends
        while not stop.is_set():
            try:
                requests.post(f"{facts['router']}/v1/completions",
                              json={"model": facts["model"], "prompt": "stuck", "max_tokens": 64}, timeout=20)
            except requests.RequestException:
                pass

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    addr = "$(hostname -I | awk '{print $1}')"
    try:
        # the engine is back up (it answers /health); the router takes requests to it again as soon as it
        # is back in its list, which the wait below for a running request covers (this was a fixed 20 s)
        back = f"for i in $(seq 300); do curl -sf http://{addr}:30001/health >/dev/null && exit 0; sleep 0.1; done; exit 1"
        assert ssh(lab, host, back).returncode == 0, "the decode did not answer /health within 30 s of its restart"
        for t in threads:
            t.start()
        # wedge it while requests are running in it (a wedged scheduler's gauges keep what they last
        # said, so a stall between two requests would show an idle engine, and no alert): on the
        # host, touch the stall file the moment its own /metrics says a request is running
        # (a fixed sleep missed that once in a fresh-clone run: the router had sent it nothing yet)
        when_running = (f"for i in $(seq 1200); do curl -s http://{addr}:30001/metrics "
                        f"| grep -Eq '^sglang:num_running_reqs(\\{{[^}}]*\\}})? [1-9]' && touch {STALL} && exit 0; sleep 0.05; done; exit 1")
        assert ssh(lab, host, when_running).returncode == 0, "the decode never ran a request in 60 s"

        def firing():
            alerts = requests.get(f"{facts['prom']}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            hit = [a for a in alerts if a["labels"].get("alertname") == "PdkitEngineWedged"
                   and a["state"] == "firing" and a["labels"].get("node") == host
                   and a["labels"].get("engine") == "decode"]
            return bool(hit), [(a["labels"].get("alertname"), a["state"], a["labels"].get("instance")) for a in alerts]

        # the rate window + `for` + scrape and evaluation slack (the lab's: 40 s + 15 s + 90 s; at the
        # real windows 2m + 1m + 90 s), inside the 300 s scheduler watchdog
        timeout = facts["wedge_window_s"] + facts["for_s"]["PdkitEngineWedged"] + 90
        assert timeout <= 270, f"the wedge alert could not fire before the 300 s watchdog: {timeout} s"
        _wait(firing, timeout, f"PdkitEngineWedged firing for {host}/decode", interval=2)
        # a person hears of it: the webhook gets it after Alertmanager's group_wait (plus an evaluation)
        heard = sink.wait_for("PdkitEngineWedged", "firing", facts["group_wait_s"] + 2 * facts["scrape_s"] + 15,
                              node=host, engine="decode")
        print(f"PdkitEngineWedged reached the webhook {heard:.1f} s after Prometheus showed it firing")
        rc, report = doctor(INVENTORY)
        assert rc != 0
        assert (host, "decode", "queues") in failures(report), report
        reason = next(c["reason"] for c in report["checks"]
                      if (c["host"], c["target"], c["check"]) == (host, "decode", "queues"))
        assert "wedged" in reason
    finally:
        stop.set()
        ssh(lab, host, f"rm -f {STALL} {DROPIN}; systemctl daemon-reload; systemctl restart pdkit-engine-decode.service")
        for t in threads:
            if t.is_alive():
                t.join(timeout=30)
    try:
        # and hears that it is over: resolved within the window, an evaluation and a group_interval
        sink.wait_for("PdkitEngineWedged", "resolved", facts["wedge_window_s"] + 2 * facts["scrape_s"] + facts["group_interval_s"] + 30,
                      node=host, engine="decode")
        # once: one group (cluster, alertname, node), sent once when it fired; repeat_interval is an hour
        fired = sink.alerts("PdkitEngineWedged", "firing", node=host, engine="decode")
        assert len(fired) == 1, f"PdkitEngineWedged was sent {len(fired)} times: {[n['groupKey'] for n, _ in fired]}"
        assert fired[0][0]["_bearer"], "Alertmanager sent the lab receiver's notification without its bearer credential"
        assert fired[0][1]["annotations"].get("runbook_url", "").endswith("#pdkitenginewedged"), fired[0][1]["annotations"]
    finally:
        sink.stop()
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-2000:]
