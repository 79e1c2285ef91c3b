"""`pdkit roll` across router API key changes on the lab, under light load (issue 30 item 4).

The lab's router runs without a key; three rolls add a key, rotate it and remove it again, while
tests/lab/loadclient.py keeps 4 streaming requests in flight through the router with the keys a
client across a rotation has (it sends the one the router last accepted, and on a 401 the
others). Each roll restarts the router (its key file or unit changed) and nothing else; every
failed request must fall inside one of those restarts, and none may be a 401: the roll's own
calls and its gates talk to the router with the key it runs with at each moment. The module ends
with the lab back on inventories/lab.py (no key), which the last roll puts it on.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.lab.test_roll import (  # noqa: F401
    BASE,
    base_plan,
    current_release,
    derived_inventory,
    pdkit,
    plan_of,
    ssh,
    steps,
    wait_router_steady,
)

pytestmark = pytest.mark.lab

ROUTER_UNIT = "pdkit-router.service"
# a failure may come this long after the router's new process started (smg binds its port and
# checks its workers before it routes): measured 0.17-0.51 s on the lab (docs/rolling.md
# "Router key changes"); 5 s leaves room for a busy 2-core machine
START_TO_SERVING_S = 5.0


def router_restart(lab, plan: dict) -> tuple[str, float, float]:
    """(invocation, when its stop began, when the new process started): the router unit's last restart (CLOCK_MONOTONIC, s)."""
    out = ssh(lab, plan["router"], f"systemctl show -p InvocationID -p ActiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic {ROUTER_UNIT}").stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props["InvocationID"], int(props["ActiveExitTimestampMonotonic"]) / 1e6, int(props["ActiveEnterTimestampMonotonic"]) / 1e6


def workers_status(plan: dict, key: str | None) -> int:
    import requests

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.get(f"http://{plan['addr'][plan['router']]}:8000/workers", headers=headers, timeout=10).status_code


def test_a_router_key_is_added_rotated_and_removed_by_roll_with_no_failure_beyond_the_router_restart(lab, base_plan, tmp_path):
    first, second = secrets.token_hex(24), secrets.token_hex(24)
    steps_ = [
        ("add", derived_inventory(tmp_path, "lab_key1", f"_cluster['secrets'] = {{**_cluster.get('secrets', {{}}), 'router_api_key': {first!r}}}"), first, None),
        ("rotate", derived_inventory(tmp_path, "lab_key2", f"_cluster['secrets'] = {{**_cluster.get('secrets', {{}}), 'router_api_key': {second!r}}}"), second, first),
        ("remove", REPO / BASE, None, second),
    ]
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps([None, first, second]))
    keys_file.chmod(0o600)
    wait_router_steady(base_plan)
    out, stop = tmp_path / "load.json", tmp_path / "load.stop"
    url = f"http://{base_plan['addr'][base_plan['router']]}:8000"
    load = subprocess.Popen(
        [sys.executable, "-m", "tests.lab.loadclient", "--url", url, "--model", base_plan["model"], "--concurrency", "4",
         "--out", str(out), "--stop-file", str(stop), "--max-seconds", "1500", "--keys-file", str(keys_file),
         # a client that backs off 0.2 s after an error, not a tight loop against a closed port
         "--pause-after-failure", "0.2"], cwd=REPO)
    windows: list[tuple[str, float, float]] = []
    rolls: list[str] = []
    try:
        import time

        deadline = time.monotonic() + 120
        while json.loads(out.read_text() if out.exists() else '{"ok": 0}').get("ok", 0) < 20:
            assert time.monotonic() < deadline and load.poll() is None, "the load never got going"
            time.sleep(0.5)
        for name, inventory, key, old in steps_:
            before = router_restart(lab, base_plan)[0]
            report = tmp_path / f"{name}.json"
            proc = pdkit("roll", str(inventory), "--report", str(report))
            text = proc.stdout + proc.stderr
            rolls.append(f"--- {name}\n{proc.stdout[-2500:]}\n{proc.stderr[-1500:]}")
            assert proc.returncode == 0, f"the {name} roll failed:\n{text[-4000:]}"
            assert first not in text and second not in text, f"the {name} roll printed a key"
            assert json.loads(report.read_text())["result"] == "ok"
            restart = router_restart(lab, base_plan)
            assert restart[0] != before, f"the {name} roll did not restart the router"
            windows.append(restart)
            # the router runs with the inventory's key now, and no longer with the old one
            assert workers_status(base_plan, key) == 200
            if key is not None:
                assert workers_status(base_plan, old) == 401 and workers_status(base_plan, None) == 401
            # only the router host had something to change: every other host was left serving
            rolled = {h for h, s, _ in steps(proc.stdout) if s == "apply"}
            assert rolled == {base_plan["router"]}, proc.stdout
        stop.touch()
        load.wait(timeout=200)
    finally:
        if load.poll() is None:
            load.kill()
    counts = json.loads(out.read_text())
    log = "\n".join(rolls)
    assert "status 401" not in counts["failures"], f"a request was refused its key: {counts['errors'][:10]}\n{log}"
    outside = [t for t in counts["failure_times"] if not any(stop_s - 0.5 <= t <= start_s + START_TO_SERVING_S for _, stop_s, start_s in windows)]
    assert not outside, (f"{len(outside)} of {counts['failed']} failure(s) outside the router's restarts {windows}: "
                         f"{counts['errors'][:10]}\n{log}")
    assert counts["ok"] >= 100, counts
    # what the restarts cost (docs/rolling.md): failures and how long after each start the last one came
    spans = []
    for i, (_, stop_s, start_s) in enumerate(windows):
        until = windows[i + 1][1] - 0.5 if i + 1 < len(windows) else float("inf")
        mine = [t for t in counts["failure_times"] if stop_s - 0.5 <= t <= min(start_s + START_TO_SERVING_S, until)]
        spans.append((len(mine), round(start_s - stop_s, 2), round(min(mine) - stop_s, 2) if mine else None,
                      round(max(mine) - start_s, 2) if mine else None))
    print(f"router restarts (failures, stop-to-start s, first failure after stop began s, last failure after start s): {spans}; "
          f"ok {counts['ok']}; failed {counts['failed']} {counts['failures']}; key switches {counts['key_switches']}", file=sys.__stderr__)
    for host, release in base_plan["release"].items():
        assert current_release(lab, host).endswith(release[:12]), f"{host} is not back on the base release"
