"""Issue #18 on the lab, with pyinfra's own flags: files the plan dropped are removed (item 1),
`--serial` converges whatever the host order (2), `--dry` names each host's own files (3),
`--diff` shows unified diffs and never a secret (4), `--limit` warns about the router it left
out (5). Item 8 (a new pdkit wheel restarts pdkit-exporter onto it) is checked by
tests/lab/test_deploy.py's pdkit-only change, which also shows that no engine restarts.

Every test leaves the shared lab converged on inventories/lab.py, as it found it.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import requests

from tests.conftest import REPO
from tests.lab.test_deploy import (
    INVENTORY,
    PYINFRA,
    changed_hosts,
    failed_hosts,
    lab_spec,
    run_pyinfra,
    ssh,
    wait_circuits_closed,
)
from tests.lab.test_roll import derived_inventory

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def converged(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"converging the lab failed (rc {rc}):\n{err[-4000:]}"
    return lab_spec()


def back_to_base(spec) -> None:
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"putting the lab back on {INVENTORY} failed:\n{err[-4000:]}"
    rc, results, err = run_pyinfra()
    assert rc == 0 and changed_hosts(results) == {}, f"the lab is not converged after the test: {changed_hosts(results)}\n{err[-2000:]}"
    wait_circuits_closed(spec)


def router_workers(spec) -> dict[str, bool]:
    body = requests.get(f"http://{spec['addr'][spec['router']]}:8000/workers", timeout=10).json()
    return {w["url"]: w["is_healthy"] for w in body["workers"]}


def scrape_targets(spec, mon: str) -> set[str]:
    """The engine targets the monitoring host's Prometheus scrapes (host:port), from its own API."""
    body = requests.get(f"http://{spec['addr'][mon]}:9090/api/v1/targets", timeout=10).json()
    from urllib.parse import urlsplit

    from pdkit.monitoring.common import JOB_ENGINE

    return {urlsplit(t["scrapeUrl"]).netloc for t in body["data"]["activeTargets"] if t["labels"].get("job") == JOB_ENGINE}


def exists(lab, host: str, path: str) -> bool:
    return ssh(lab, host, f"test -e {path}").returncode == 0


def invocations(lab, host: str, units: list[str]) -> dict[str, str]:
    return {u: ssh(lab, host, f"systemctl show -p InvocationID --value {u}").stdout.strip() for u in units}


ENGINES = ["pdkit-engine-prefill.service", "pdkit-engine-decode.service"]


def test_dropping_secrets_removes_their_files_restarts_their_users_and_a_second_run_changes_nothing(lab, converged, tmp_path):
    """Item 1: before, secrets.env and the router's key stayed on the hosts with the old value and the next run reported 0 changes."""
    spec = converged
    with_secrets = derived_inventory(
        tmp_path, "lab_secrets",
        "_cluster['secrets'] = {**_cluster.get('secrets', {}), 'hf_token': 'hf_issue18_recognisable', 'router_api_key': 'rk_issue18_recognisable'}",
    )
    try:
        rc, results, err = run_pyinfra(str(with_secrets))
        assert rc == 0 and not failed_hosts(results), err[-4000:]
        for host in spec["gpu"]:
            assert ssh(lab, host, "stat -c '%a %U %G' /etc/pdkit/secrets.env").stdout.split() == ["600", "root", "root"]
        assert ssh(lab, spec["router"], "stat -c '%a %U %G' /etc/pdkit/router-api-key").stdout.split() == ["600", "root", "root"]
        before = {h: invocations(lab, h, ENGINES) for h in spec["gpu"]}
    finally:
        rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-4000:]
    for host in spec["gpu"]:
        assert not exists(lab, host, "/etc/pdkit/secrets.env"), f"{host}: secrets.env is still there after the inventory dropped it"
        # every engine read it (EnvironmentFile=): each restarted onto the configuration without it
        now = invocations(lab, host, ENGINES)
        assert all(now[u] != before[host][u] for u in ENGINES), f"{host}: engines not restarted: {before[host]} -> {now}"
    for path in ("/etc/pdkit/router-api-key", "/opt/pdkit/bin/pdkit-router-launch"):
        assert not exists(lab, spec["router"], path), f"{spec['router']}: {path} is still there"
    r = requests.post(f"http://{spec['addr'][spec['router']]}:8000/v1/completions", json={"model": spec["model"], "prompt": "no key now", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
    rc, results, err = run_pyinfra()
    assert rc == 0 and changed_hosts(results) == {}, f"the run after the removal changed: {changed_hosts(results)}"
    wait_circuits_closed(spec)


def test_engines_removed_from_the_spec_are_stopped_disabled_deleted_and_out_of_the_router(lab, converged, tmp_path):
    """Item 1, units: before, the removed engines' units kept running with their files, and the next run reported 0 changes."""
    spec = converged
    host = spec["gpu"][-1]
    assert host != spec["router"]
    emptied = derived_inventory(tmp_path, "lab_no_engines", f"[d for n, d in gpu_nodes if n == {host!r}][0]['pdkit_node']['engines'] = []")
    units = [*ENGINES, "pdkit-exporter.service"]
    try:
        rc, results, err = run_pyinfra(str(emptied))
        assert rc == 0 and not failed_hosts(results), err[-4000:]
        for unit in units:
            state = ssh(lab, host, f"systemctl show -p LoadState -p ActiveState --value {unit}").stdout.split()
            assert sorted(state) == ["inactive", "not-found"], f"{host}: {unit} is {state} after its engine left the spec"
            assert not exists(lab, host, f"/etc/systemd/system/{unit}")
            assert not exists(lab, host, f"/etc/systemd/system/multi-user.target.wants/{unit}"), f"{host}: {unit} still enabled"
        for path in ("/etc/pdkit/engines/prefill.env", "/etc/pdkit/engines/decode.env", "/etc/pdkit/exporter.json"):
            assert not exists(lab, host, path), f"{host}: {path} is still there"
        listed = [u for u in router_workers(spec) if f"//{spec['addr'][host]}:" in u]
        assert listed == [], f"the router still lists {host}'s removed engines: {listed}"
        rc, results, err = run_pyinfra(str(emptied))
        assert rc == 0 and changed_hosts(results) == {}, f"the run after the removal changed: {changed_hosts(results)}"
    finally:
        back_to_base(spec)
    workers = router_workers(spec)
    assert all(workers.get(f"http://{spec['addr'][host]}:{p}") for p in (30000, 30001)), workers


def test_serial_converges_a_port_change_and_an_added_node_whatever_the_host_order(lab, converged, tmp_path):
    """Item 2: with the router host first, its gate waited 120 s for a worker whose host was not deployed yet, and the rest never ran."""
    spec = converged
    assert len(spec["gpu"]) >= 3, "this test needs a lab of 3 GPU hosts"
    router, moved_host, added = spec["router"], spec["gpu"][1], spec["gpu"][2]
    assert router not in (moved_host, added)
    moved = derived_inventory(
        tmp_path, "lab_moved",
        f"[d for n, d in gpu_nodes if n == {moved_host!r}][0]['pdkit_node']['engines'][1]['port'] = 30011\n"
        f"gpu_nodes = [(n, d) for n, d in gpu_nodes if n != {added!r}]\n"
        f"_hosts = [h for h in _hosts if h != {added!r}]",
    )
    try:
        rc, results, err = run_pyinfra(str(moved), "--serial")
        assert rc == 0, f"--serial onto the moved port failed:\n{err[-4000:]}"
        assert f"http://{spec['addr'][moved_host]}:30011" in router_workers(spec)
        # the node to add: its engines stopped, as on a node the cluster does not run yet
        assert ssh(lab, added, "systemctl stop " + " ".join(ENGINES)).returncode == 0
        # the order that wedged: the router host alone first, its workers elsewhere not up on the planned ports
        rc, results, err = run_pyinfra(INVENTORY, "--serial", "--limit", router)
        assert rc == 0, f"the router host's deploy wedged on workers of hosts not deployed yet:\n{err[-4000:]}"
        assert "pending" in err, err[-3000:]
        # then every host, serially: the moved port goes back, the added node comes up, the router lists both
        started = time.monotonic()
        rc, results, err = run_pyinfra(INVENTORY, "--serial")
        assert rc == 0, f"--serial did not converge:\n{err[-4000:]}"
        print(f"--serial converged in {time.monotonic() - started:.1f} s")
        workers = router_workers(spec)
        for host in spec["gpu"]:
            for port in (30000, 30001):
                assert workers.get(f"http://{spec['addr'][host]}:{port}") is True, f"{host}:{port} not healthy in the router: {workers}"
        assert f"http://{spec['addr'][moved_host]}:30011" not in workers, workers
    finally:
        back_to_base(spec)


def _host_lines(out: str, host: str) -> list[str]:
    return [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in out.splitlines() if f"[{host}]" in re.sub(r"\x1b\[[0-9;]*m", "", ln)]


def test_dry_names_each_hosts_own_files_and_diff_shows_them_without_secrets(lab, converged, tmp_path):
    """Items 3 and 4: --dry showed the first host's file list for every host; --diff showed nothing."""
    spec = converged
    a, b = spec["gpu"][1], spec["gpu"][2]
    changed = derived_inventory(
        tmp_path, "lab_drydiff",
        f"[d for n, d in gpu_nodes if n == {a!r}][0]['pdkit_node']['engines'][1]['env'] = {{'PDKIT_SIM_DECODE_BASE_MS': '7'}}\n"
        f"[d for n, d in gpu_nodes if n == {b!r}][0]['pdkit_node']['engines'][0]['env'] = {{'PDKIT_SIM_PREFILL_BASE_MS': '9'}}\n"
        "_cluster['secrets'] = {**_cluster.get('secrets', {}), 'hf_token': 'hf_issue18_drydiff'}",
    )
    sums = {h: ssh(lab, h, "sha256sum /etc/pdkit/engines/*.env").stdout for h in (a, b)}
    proc = subprocess.run([PYINFRA, str(changed), "deploy/pd.py", "-y", "--dry", "--diff"], cwd=REPO, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "hf_issue18_drydiff" not in out, "a secret reached pyinfra's output"
    lines_a, lines_b = "\n".join(_host_lines(out, a)), "\n".join(_host_lines(out, b))
    # each host its own list: a's decode env, b's prefill env, both the new secrets file
    assert "/etc/pdkit/engines/decode.env" in lines_a and "/etc/pdkit/engines/prefill.env" not in lines_a.split("to write:")[1].split("\n")[0]
    assert "/etc/pdkit/engines/prefill.env" in lines_b and "/etc/pdkit/engines/decode.env" not in lines_b.split("to write:")[1].split("\n")[0]
    assert "/etc/pdkit/secrets.env (secret)" in lines_a
    # --diff: unified diffs of the text files, the secret only named
    assert "+PDKIT_SIM_DECODE_BASE_MS=7" in lines_a and "+PDKIT_SIM_PREFILL_BASE_MS=9" in lines_b
    assert "Will create /etc/pdkit/secrets.env (secret: content not shown)" in lines_a
    assert "+EnvironmentFile=/etc/pdkit/secrets.env" in lines_a
    # --dry changed nothing
    assert {h: ssh(lab, h, "sha256sum /etc/pdkit/engines/*.env").stdout for h in (a, b)} == sums
    assert not exists(lab, a, "/etc/pdkit/secrets.env")


def test_limit_warns_about_the_router_it_left_out_and_what_to_run(lab, converged, tmp_path):
    """Item 5: a limited deploy moved a worker its router (on a host left out) still pointed at, silently."""
    spec = converged
    router, host = spec["router"], spec["gpu"][1]
    assert router != host
    moved = derived_inventory(tmp_path, "lab_limit", f"[d for n, d in gpu_nodes if n == {host!r}][0]['pdkit_node']['engines'][1]['port'] = 30011")
    new_url, old_url = f"http://{spec['addr'][host]}:30011", f"http://{spec['addr'][host]}:30001"
    try:
        rc, results, err = run_pyinfra(str(moved), "--limit", host)
        assert rc == 0, err[-4000:]
        assert f"--limit left out router host {router}" in err and new_url in err, err[-3000:]
        assert f"deploy/pd.py --limit {router}" in err, err[-3000:]
        # meanwhile the running router serves the moved worker (worker API), not the dead port
        workers = router_workers(spec)
        assert workers.get(new_url) is True and old_url not in workers, workers
        # issue 30 item 6: Prometheus on the monitoring host (left out too) still scrapes the old port: named, with the command
        mon = next(h for h in spec["addr"] if h not in spec["gpu"])
        old_target, new_target = old_url.removeprefix("http://"), new_url.removeprefix("http://")
        assert f"--limit left out monitoring host {mon}" in err and f"{old_target} -> {new_target}" in err, err[-3000:]
        assert old_target in scrape_targets(spec, mon) and new_target not in scrape_targets(spec, mon)
        combined = f"pyinfra {moved} deploy/pd.py --limit {router} --limit {mon}"
        assert combined in err, err[-3000:]
        # the command it names brings both in line
        rc, results, err = run_pyinfra(str(moved), "--limit", router, "--limit", mon)
        assert rc == 0, err[-4000:]
        assert new_target in scrape_targets(spec, mon) and old_target not in scrape_targets(spec, mon)
    finally:
        back_to_base(spec)
    workers = router_workers(spec)
    assert workers.get(old_url) is True and new_url not in workers, workers

