"""Issue #18 item 6: after `kill -9` of a decode engine under load, systemd brings it back in
seconds; the router must send it traffic again within a few seconds of it being healthy.

Before: healthy at 7 s, idle until ~62 s (smg's default 60 s circuit-breaker timeout, while
/workers called it healthy). The bound is pdkit.render.flags.readmission_bound_s for the lab's router. Leaves the lab converged, every breaker closed.
"""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from pdkit.render import flags
from tests.lab.test_deploy import circuit_states, failed_hosts, lab_spec, run_pyinfra, ssh, wait_circuits_closed
from tests.lab.test_roll import Load

pytestmark = pytest.mark.lab


def serves_within_s(spec_file: str = "inventories/lab.py") -> float:
    """The lab router's readmission bound (pdkit/render/flags.py readmission_bound_s), not the 60 s breaker default."""
    from pdkit.inventory.loader import load

    spec = load(spec_file)
    router = spec.router_hosts[0].router
    return flags.readmission_bound_s(router, spec.cluster.fault_budget.router_health_check_timeout_s)


@pytest.fixture(scope="module")
def converged(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"converging the lab failed (rc {rc}):\n{err[-4000:]}"
    return lab_spec()


def generated(url: str) -> float | None:
    try:
        text = requests.get(f"{url}/metrics", timeout=2).text
    except requests.RequestException:
        return None
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "sglang:generation_tokens_total")


def router_view(metrics_url: str, worker: str) -> tuple[float | None, float | None]:
    """(smg_worker_health, smg_worker_cb_state) of one worker, as the router sees it."""
    try:
        text = requests.get(metrics_url, timeout=2).text
    except requests.RequestException:
        return None, None
    wanted = "\n".join(l for l in text.splitlines() if l.startswith(("smg_worker_health ", "smg_worker_health{", "smg_worker_cb_state"))) + "\n"
    found = {s.name: s.value for f in text_string_to_metric_families(wanted) for s in f.samples if s.labels.get("worker") == worker}
    return found.get("smg_worker_health"), found.get("smg_worker_cb_state")


def test_a_killed_decode_gets_traffic_within_seconds_of_being_healthy(lab, converged, tmp_path):
    spec = converged
    host = spec["gpu"][1]
    url = f"http://{spec['addr'][host]}:30001"
    plan = {"addr": spec["addr"], "router": spec["router"], "model": spec["model"]}
    wait_circuits_closed(spec)
    load = Load(tmp_path, plan, concurrency=16)
    try:
        load.wait_flowing()
        assert ssh(lab, host, "systemctl kill -s KILL pdkit-engine-decode.service").returncode == 0
        killed = time.monotonic()
        healthy = serving = None
        # the router's view over time (health, breaker), so a slow recovery says which one held it
        timeline: list[tuple[float, tuple]] = []
        while time.monotonic() - killed < 120:
            now = time.monotonic()
            view = router_view(spec["router_metrics"][0], url)
            if not timeline or timeline[-1][1] != view:
                timeline.append((now - killed, view))
            if healthy is None:
                try:
                    if requests.get(f"{url}/health", timeout=1).status_code == 200:
                        healthy = now
                        base = generated(url) or 0.0
                except requests.RequestException:
                    pass
            elif (generated(url) or 0.0) > base:
                serving = now
                break
            time.sleep(0.1)
        assert healthy is not None, "the killed decode never became healthy again"
        assert serving is not None, f"the decode was healthy {healthy - killed:.1f} s after the kill but got no traffic for 120 s"
        print("router's view of the decode (s after the kill: health, breaker):",
              ", ".join(f"{t:.1f}: {v}" for t, v in timeline))
        print(f"healthy {healthy - killed:.1f} s after the kill, serving {serving - killed:.1f} s after ({serving - healthy:.1f} s idle)")
        bound = serves_within_s()
        assert bound < 30, f"the readmission bound {bound} s no longer says the breaker's 60 s default is gone"
        assert serving - healthy <= bound, f"bound {bound:g} s: healthy at {healthy - killed:.1f} s, first token only at {serving - killed:.1f} s"
        # and its breaker is closed again, under the same load
        deadline = time.monotonic() + 30
        while circuit_states(spec["router_metrics"][0]).get(url) != 0:
            assert time.monotonic() < deadline, circuit_states(spec["router_metrics"][0])
            time.sleep(0.5)
    finally:
        counts = load.stop()
        print({k: counts[k] for k in ("ok", "failed", "failures", "slowest_failure_s") if k in counts})
    wait_circuits_closed(spec)
