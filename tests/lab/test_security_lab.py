"""Issue #18 item 9 on the running lab hosts: each pdkit unit's `systemd-analyze security` exposure
at or below its target (pdkit/render/exposure.py), the router as its own user, its API key readable by
no engine and never in the router's environment or argv.

Before: every service ran as `pdkit` (an engine could read the router's /proc/<pid>/environ,
which held the key although the launcher said it removed it); exposure engines 7.4, router 6.7,
exporter 6.7. Leaves the lab converged on inventories/lab.py.
"""

from __future__ import annotations

import pytest
import requests

from pdkit.render.exposure import overall_exposure, unit_target
from tests.lab.test_deploy import failed_hosts, lab_spec, run_pyinfra, ssh, wait_circuits_closed
from tests.lab.test_roll import derived_inventory

pytestmark = pytest.mark.lab

KEY = "rk_issue18_lab_recognisable"


@pytest.fixture(scope="module")
def converged(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"converging the lab failed (rc {rc}):\n{err[-4000:]}"
    return lab_spec()


def test_every_pdkit_unit_is_at_or_below_its_exposure_target_on_the_hosts(lab, converged):
    over, measured = [], {}
    for host, units in converged["units"].items():
        for unit in units:
            target = unit_target(unit)
            if target is None:
                continue
            proc = ssh(lab, host, f"systemd-analyze security --no-pager {unit}")
            score = overall_exposure(proc.stdout + proc.stderr).get(unit)
            assert score is not None, f"{host}: no verdict for {unit}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            measured[f"{host}/{unit}"] = score
            if score > target[1]:
                over.append(f"{host}: {unit} {score} > {target[1]}")
    print(measured)
    assert {unit_target(k.split("/", 1)[1])[0] for k in measured} == {"engine", "router", "exporter"}
    assert not over, "\n".join(over)


def test_the_router_key_is_a_credential_no_engine_can_read(lab, converged, tmp_path):
    spec = converged
    router = spec["router"]
    keyed = derived_inventory(tmp_path, "lab_router_key", f"_cluster['secrets'] = {{**_cluster.get('secrets', {{}}), 'router_api_key': {KEY!r}}}")
    url = f"http://{spec['addr'][router]}:8000/v1/completions"
    body = {"model": spec["model"], "prompt": "key check", "max_tokens": 2}
    try:
        rc, results, err = run_pyinfra(str(keyed))
        assert rc == 0 and not failed_hosts(results), err[-4000:]
        pid = ssh(lab, router, "systemctl show -p MainPID --value pdkit-router.service").stdout.strip()
        assert pid and pid != "0"
        assert ssh(lab, router, f"stat -c %U /proc/{pid}").stdout.strip() == f"{spec['user']}-router"
        # the launcher's promise: not in the environment, not in argv (read as root here)
        environ = ssh(lab, router, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
        cmdline = ssh(lab, router, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
        assert environ and KEY not in environ, "the key is in the router's /proc/<pid>/environ"
        assert cmdline and KEY not in cmdline, "the key is in the router's argv"
        # the engines' user reads neither the key file nor the router's process
        for what in ("/etc/pdkit/router-api-key", f"/proc/{pid}/environ"):
            proc = ssh(lab, router, f"runuser -u {spec['user']} -- cat {what}")
            assert proc.returncode != 0 and KEY not in proc.stdout, f"{spec['user']} can read {what}"
        # the router really uses it
        assert requests.post(url, json=body, timeout=60).status_code == 401
        r = requests.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 200, r.text
        unit = "pdkit-router.service"
        score = overall_exposure(ssh(lab, router, f"systemd-analyze security --no-pager {unit}").stdout).get(unit)
        assert score is not None and score <= unit_target(unit)[1], score
    finally:
        rc, results, err = run_pyinfra()
        assert rc == 0 and not failed_hosts(results), err[-4000:]
    assert requests.post(url, json=body, timeout=60).status_code == 200
    wait_circuits_closed(spec)
