"""Monitoring on the lab: the real Prometheus on lab-mon scrapes every generated target, every
dashboard and alert query returns live data under load, and a stopped engine fires its alert.

Runs after test_deploy.py in the same session (the module fixture converges again, which is a
no-op when the cluster is already deployed).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest
import requests

from tests.conftest import REPO
from tests.lab.test_deploy import INVENTORY, failed_hosts, json_from_child, run_pyinfra, ssh

pytestmark = pytest.mark.lab


def _monitoring_facts():
    # pdkit.inventory.loader imports pyinfra's CLI, which gevent-patches its importer: use a child process
    code = (
        "import json; from pdkit.inventory.loader import load; "
        "from pdkit.monitoring.common import _duration_s, alertmanager_urls; "
        "from pdkit.monitoring.scrape import targets; from pdkit.monitoring.dashboards import all_promql; "
        "from pdkit.monitoring.rules import alerts; from pdkit.monitoring.alertrules.engines import wedge_window; "
        f"spec = load({INVENTORY!r}); mon = spec.monitoring_hosts[0]; router = spec.router_hosts[0]; "
        "print(json.dumps({'prom': f'http://{mon.address}:{mon.monitoring.prometheus_port}', 'alertmanagers': alertmanager_urls(spec), 'mon': mon.name, "
        "'targets': [[t.job, t.address] for t in targets(spec)], 'promql': all_promql(spec), "
        "'router': f'http://{router.address}:{router.router.port}', 'model': spec.cluster.model.name, "
        "'gpu': [h.name for h in spec.gpu_hosts], 'scrape_s': mon.monitoring.scrape_interval_s, "
        # the lab's own windows (inventories/lab.py: lab_alert_speedup), as its rules file says them
        "'for_s': {a.name: _duration_s(a.for_) for a in alerts(spec)}, 'wedge_window_s': _duration_s(wedge_window(spec))}))"
    )
    return json_from_child(code)


@pytest.fixture(scope="module")
def monitored(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-3000:]
    return _monitoring_facts()


def _query(prom: str, expr: str) -> list:
    r = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=20)
    body = r.json()
    assert body.get("status") == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


def _wait(predicate, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(interval)
    pytest.fail(f"{what} not reached in {timeout:.0f} s: {last}")


def test_prometheus_scrapes_every_generated_target_and_all_are_up(monitored):
    planned = {(job, address) for job, address in monitored["targets"]}

    def all_up():
        active = requests.get(f"{monitored['prom']}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        seen = {(t["labels"]["job"], t["scrapeUrl"].split("/")[2]): t["health"] for t in active}
        missing = planned - set(seen)
        down = sorted(k for k, v in seen.items() if v != "up")
        return not missing and not down, {"missing": sorted(missing), "down": down}

    _wait(all_up, 90, "every planned target scraped and up")
    assert len(planned) >= 3 * 2 + 1 + 4  # 6 engines, the router, a node_exporter per host


def test_prometheus_sends_to_the_alertmanager_beside_it(lab, monitored):
    """issue 31: Alertmanager runs on lab-mon with the rendered config, and Prometheus lists it as active."""
    (url,) = monitored["alertmanagers"]

    def active():
        body = requests.get(f"{monitored['prom']}/api/v1/alertmanagers", timeout=10).json()["data"]
        urls = [a["url"] for a in body["activeAlertmanagers"]]
        return any(u.startswith(url + "/") for u in urls), body

    _wait(active, 60, f"Prometheus listing {url} as an active Alertmanager")
    status = requests.get(f"{url}/api/v2/status", timeout=10).json()
    assert status["cluster"]["status"] == "disabled"  # one Alertmanager: no gossip
    assert "lab-sink" in status["config"]["original"] and "inhibit_rules" in status["config"]["original"]
    # the receiver's credential: only in its file, 0600 for the user Debian's unit runs Alertmanager as
    assert "lab-sink-bearer" not in status["config"]["original"]
    cred = "/etc/prometheus/alertmanager-credentials/lab-sink"
    check = ssh(lab, monitored["mon"], f"stat -c '%a %U' {cred} && runuser -u prometheus -- cat {cred} && echo && "
                                       f"! runuser -u nobody -- cat {cred} 2>/dev/null && "
                                       "systemctl show -p User --value prometheus-alertmanager.service")
    assert check.returncode == 0 and check.stdout.split() == ["600", "prometheus", "lab-sink-bearer", "prometheus"], check


def test_every_dashboard_and_alert_query_returns_live_data_under_load(monitored):
    stop = threading.Event()
    errors: list[str] = []

    def load():
        while not stop.is_set():
            try:
                r = requests.post(f"{monitored['router']}/v1/completions", json={"model": monitored["model"], "prompt": "keep the dashboards busy", "max_tokens": 16}, timeout=30)
                if r.status_code != 200:
                    errors.append(r.text[:200])
            except requests.RequestException as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        # rates need two scrapes of the loaded counters: wait until the last query family has data
        def all_have_series():
            empty = [where for where, expr in monitored["promql"] if not _query(monitored["prom"], expr)]
            return not empty, empty

        _wait(all_have_series, 150, "every PromQL expression returning a series", interval=5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[:5]
    assert len(monitored["promql"]) >= 20


def test_grafana_role_is_planned_by_a_dry_run(lab, monitored, tmp_path):
    """Grafana's repository cannot be reached from the lab: the role is checked as a --dry plan
    on lab-mon with Grafana turned on, and nothing may change on the host."""
    inventory = tmp_path / "lab_grafana.py"
    inventory.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / INVENTORY)!r})\n"
        "gpu_nodes = _base['gpu_nodes']\n"
        "monitoring = [(n, {**d, 'pdkit_monitoring': {}}) for n, d in _base['monitoring']]\n"
        "all = _base['all']\n"
    )
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "pyinfra"), str(inventory), "deploy/pd.py", "--dry"],
        cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    mon = next(h for h in lab.hosts if h.role == "monitoring").name
    # operations planned on the host, and the host's own list of files to write (pdkit's install
    # operation has one generic name across hosts; each host prints its files under its name)
    planned = [line for line in out.splitlines() if f"1 ({mon})" in line or (f"[{mon}]" in line and "to write:" in line)]
    for op in ("Grafana's apt key", "Grafana's apt source", "Install grafana",
               "/etc/grafana/provisioning/datasources/pdkit.yaml", "/etc/grafana/provisioning/dashboards/pdkit.yaml",
               "/var/lib/grafana/dashboards/pdkit/pdkit-overview.json",
               # Grafana's own alerting off: Alertmanager alone decides who gets paged
               "/etc/systemd/system/grafana-server.service.d/pdkit.conf"):
        assert any(op in line for line in planned), f"{op!r} not planned on {mon}:\n" + "\n".join(planned)
    assert ssh(lab, mon, "test ! -e /etc/apt/sources.list.d/grafana.sources && ! dpkg -s grafana >/dev/null 2>&1").returncode == 0, "a --dry run changed the host"


def test_dcgm_exporter_is_planned_by_a_dry_run(lab, tmp_path):
    """NVIDIA's repository cannot be reached from the lab and its hosts have no GPUs: the DCGM role
    is checked as a --dry plan on one GPU host with `dcgm_exporter: true`; nothing may change."""
    inventory = tmp_path / "lab_dcgm.py"
    inventory.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / INVENTORY)!r})\n"
        "gpu_nodes = [(n, {**d, 'pdkit_node': {**d['pdkit_node'], 'dcgm_exporter': i == 0}}) for i, (n, d) in enumerate(_base['gpu_nodes'])]\n"
        "monitoring = _base['monitoring']\n"
        "all = _base['all']\n"
    )
    first, *others = [h.name for h in lab.gpu_hosts]

    def dry(limit: str) -> str:
        # one host per run: pyinfra names an operation after the first host that declared it
        proc = subprocess.run(
            [str(REPO / ".venv" / "bin" / "pyinfra"), str(inventory), "deploy/pd.py", "--dry", "--limit", limit],
            cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    out = dry(first)
    for op in ("cuda-keyring from https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/",
               "NVIDIA apt source /etc/apt/sources.list.d/pdkit-nvidia-cuda.sources",
               "datacenter-gpu-manager-4-cuda13, datacenter-gpu-manager-exporter",
               "/etc/systemd/system/nvidia-dcgm-exporter.service.d/pdkit.conf",
               "Enable and start engines and daemons: nvidia-dcgm-exporter.service"):
        assert op in out, f"{op!r} not planned on {first}:\n{out[-4000:]}"
    assert re.search(r"Health gates: .*nvidia-dcgm-exporter\.service", out), f"no health gate for the DCGM exporter on {first}:\n{out[-4000:]}"
    for other in others:
        assert "dcgm" not in dry(other).lower(), f"DCGM planned on {other}, where it is off"
    assert ssh(lab, first, "test ! -e /etc/apt/sources.list.d/pdkit-nvidia-cuda.sources && "
                           "test ! -e /etc/systemd/system/nvidia-dcgm-exporter.service.d").returncode == 0, "a --dry run changed the host"
