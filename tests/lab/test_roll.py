"""`pdkit roll` on the lab: a change rolled under load with zero failed requests, a broken canary
rolled back byte for byte, a node cut off mid-roll. Every test ends with the lab back on
inventories/lab.py (other lab modules share the one lab).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from pdkit.lab.lifecycle import ssh_run
from pdkit.lab.model import LabConfig
from tests.conftest import REPO
from tests.lab.test_deploy import json_from_child

pytestmark = pytest.mark.lab

BASE = "inventories/lab.py"
PDKIT = str(Path(sys.executable).parent / "pdkit")
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
RELEASES = "/opt/pdkit/releases"
DECODE_UNIT = "/etc/systemd/system/pdkit-engine-decode.service"
DECODE_ENV = "/etc/pdkit/engines/decode.env"


def derived_inventory(tmp_path: Path, name: str, body: str) -> Path:
    """An inventory that takes inventories/lab.py's data and changes it with BODY."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import copy, runpy\n"
        f"_base = runpy.run_path({str(REPO / BASE)!r})\n"
        "gpu_nodes = copy.deepcopy(_base['gpu_nodes'])\n"
        "monitoring = _base['monitoring']\n"
        "_hosts, _data = _base['all']\n"
        "_cluster = copy.deepcopy(_data['pdkit_cluster'])\n"
        f"{body}\n"
        # the lab runs without a router key and says so (auth: none); a body that adds a key means api_key
        "if _cluster.get('secrets', {}).get('router_api_key') is not None:\n"
        "    for _name, _hostdata in gpu_nodes:\n"
        "        _hostdata.get('pdkit_router', {}).pop('auth', None)\n"
        "all = (_hosts, {'pdkit_cluster': _cluster})\n"
    )
    return path


def plan_of(inventory: str | Path) -> dict:
    """Release hash and file hashes per host, addresses, router: computed in a child process
    (importing pyinfra's CLI gevent-patches the importing process)."""
    code = (
        "import json; from pdkit.inventory.loader import load; from pdkit.render.plan import plan_cluster; "
        f"spec = load({str(inventory)!r}); plans = plan_cluster(spec); "
        "print(json.dumps({'release': {n: p.release_hash for n, p in plans.items()}, "
        "'files': {n: {f.path: f.sha256 for f in p.files} for n, p in plans.items()}, "
        "'gpu': [h.name for h in spec.gpu_hosts], 'addr': {h.name: h.address for h in spec.hosts}, "
        "'router': spec.router_hosts[0].name, 'model': spec.cluster.model.name}))"
    )
    return json_from_child(code)


def pdkit(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([PDKIT, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def ssh(lab, host: str, command: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return ssh_run(lab, lab.host(host), command, timeout=timeout)


def current_release(lab, host: str) -> str:
    return ssh(lab, host, f"cat {RELEASES}/CURRENT").stdout.strip()


def file_sums(lab, host: str, paths: list[str]) -> dict[str, str]:
    out = ssh(lab, host, "sha256sum " + " ".join(paths)).stdout.split()
    return {out[i + 1]: out[i] for i in range(0, len(out), 2)}


def invocation(lab, host: str, unit: str = "pdkit-engine-decode.service") -> str:
    return ssh(lab, host, f"systemctl show -p InvocationID --value {unit}").stdout.strip()


def steps(out: str) -> list[tuple[str, str, str]]:
    """(host, step, message) from `pdkit roll`'s progress lines: `[  12.3s] HOST  STEP  MESSAGE`."""
    found = []
    for line in out.splitlines():
        m = re.match(r"^\[\s*[\d.]+s\]\s+(\S+)\s+(\S+)\s+(.*)$", line)
        if m:
            found.append((m.group(1), m.group(2), m.group(3)))
    return found


def router_workers(plan: dict) -> dict[str, dict]:
    body = requests.get(f"http://{plan['addr'][plan['router']]}:8000/workers", timeout=10).json()
    return {w["url"]: w for w in body["workers"]}


def back_to_base(lab, base_plan: dict) -> None:
    """Roll inventories/lab.py onto every host and check that each runs its base release."""
    proc = pdkit("roll", BASE)
    assert proc.returncode == 0, f"rolling the lab back to {BASE} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for host, release in base_plan["release"].items():
        assert current_release(lab, host).endswith(release[:12]), f"{host} is not back on the base release"


@pytest.fixture(scope="module")
def base_plan(lab):
    rc = subprocess.run([PYINFRA, BASE, "deploy/pd.py", "-y"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert rc.returncode == 0, f"converging the lab on {BASE} failed:\n{rc.stderr[-4000:]}"
    plan = plan_of(BASE)
    for host, release in plan["release"].items():
        assert current_release(lab, host).endswith(release[:12]), f"{host}: the deploy recorded no release for its configuration"
    return plan


def wait_router_steady(plan: dict, timeout: float = 300) -> None:
    """Until 10 completions in a row succeed: an earlier test may have left circuit breakers open."""
    url = f"http://{plan['addr'][plan['router']]}:8000/v1/completions"
    deadline = time.monotonic() + timeout
    while True:
        answers = [requests.post(url, json={"model": plan["model"], "prompt": f"steady {i}", "max_tokens": 2}, timeout=60).status_code for i in range(10)]
        if answers == [200] * 10:
            return
        assert time.monotonic() < deadline, f"the router does not serve steadily before the roll: {answers}"
        time.sleep(2)


class Load:
    """tests/lab/loadclient.py in its own process: constant concurrency, streaming, through the router."""

    def __init__(self, tmp_path: Path, plan: dict, concurrency: int = 16, extra: tuple[str, ...] = ()) -> None:
        self.out = tmp_path / "load.json"
        self.stop_file = tmp_path / "load.stop"
        url = f"http://{plan['addr'][plan['router']]}:8000"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lab.loadclient", "--url", url, "--model", plan["model"], "--concurrency", str(concurrency),
             "--out", str(self.out), "--stop-file", str(self.stop_file), "--max-seconds", "1500", *extra],
            cwd=REPO,
        )

    def counts(self) -> dict:
        try:
            return json.loads(self.out.read_text())
        except (OSError, ValueError):
            return {"ok": 0, "failed": 0}

    def wait_flowing(self, at_least: int = 32, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.counts().get("ok", 0) < at_least:
            assert time.monotonic() < deadline, f"the load never got going: {self.counts()}"
            assert self.proc.poll() is None, "the load client exited"
            time.sleep(0.5)

    def stop(self) -> dict:
        self.stop_file.touch()
        self.proc.wait(timeout=200)
        return self.counts()


def test_a_config_change_rolls_across_every_node_under_load_without_a_failed_request(lab, base_plan, tmp_path):
    changed = derived_inventory(tmp_path, "lab_bs", "_cluster['tuning']['decode']['cuda_graph_max_bs'] = 96")
    new = plan_of(changed)
    assert new["release"] != base_plan["release"]
    wait_router_steady(base_plan)
    load = Load(tmp_path, base_plan)
    try:
        load.wait_flowing()
        before_roll = load.counts()
        proc = pdkit("roll", str(changed))
        counts = load.stop()
    finally:
        if load.proc.poll() is None:
            load.proc.kill()
    try:
        assert proc.returncode == 0, f"roll failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
        assert counts["failed"] == 0, (
            f"{counts['failed']} request(s) failed ({before_roll['failed']} before the roll started): {counts['errors'][:10]}\n{proc.stdout[-4000:]}"
        )
        assert counts["ok"] >= 100, counts
        # progress: every node went through every gate, in the planned order, canary first
        seen = steps(proc.stdout)
        for host in new["gpu"]:
            for step in ("connect", "drain", "apply", "ready", "router", "smoke", "done"):
                assert (host, step) in [(h, s) for h, s, _ in seen], f"no {step} line for {host}:\n{proc.stdout}"
        order = [h for h, s, _ in seen if s == "done" and h != "-"]
        assert order[0] != base_plan["router"] and order.index(base_plan["router"]) == len(new["gpu"]) - 1, order
        for host in new["gpu"]:
            assert current_release(lab, host).endswith(new["release"][host][:12]), f"{host} is not on the new release"
            assert file_sums(lab, host, [DECODE_UNIT])[DECODE_UNIT] == new["files"][host][DECODE_UNIT]
            argv = ssh(lab, host, "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value pdkit-engine-decode.service)/cmdline").stdout
            assert "--cuda-graph-max-bs-decode 96" in argv, f"{host}'s running decode has another argv: {argv}"
        listing = pdkit("releases", BASE, new["gpu"][0])
        assert listing.returncode == 0 and "pdkit roll" in listing.stdout and len(listing.stdout.splitlines()) >= 3, listing.stdout
    finally:
        back_to_base(lab, base_plan)


def test_a_broken_canary_is_restored_byte_for_byte_and_the_roll_stops(lab, base_plan, tmp_path):
    canary = base_plan["gpu"][1]
    others = [h for h in base_plan["gpu"] if h != canary]
    broken = derived_inventory(
        tmp_path, "lab_broken",
        "_cluster['ready_timeout_s'] = 15\n"
        f"[d for n, d in gpu_nodes if n == {canary!r}][0]['pdkit_node']['engines'][1]['env'] = {{'PDKIT_SIM_STARTUP_DELAY_S': '3600'}}",
    )
    paths = sorted(base_plan["files"][canary])
    before = {h: (current_release(lab, h), invocation(lab, h)) for h in base_plan["gpu"]}
    try:
        proc = pdkit("roll", str(broken), "--canary", canary)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert f"stopped: {canary}: gate 'apply' failed" in proc.stderr, out[-3000:]
        assert "not ready after 15 s" in out
        # the canary: back on its previous release, every file byte for byte, serving behind the router
        assert current_release(lab, canary) == before[canary][0]
        assert file_sums(lab, canary, paths) == base_plan["files"][canary]
        assert (canary, "restore") in [(h, s) for h, s, m in steps(proc.stdout) if m.startswith(f"back on release {before[canary][0]}")], proc.stdout
        addr = base_plan["addr"][canary]
        for port in (30000, 30001):
            assert requests.get(f"http://{addr}:{port}/health", timeout=10).status_code == 200
        workers = router_workers(base_plan)
        for port in (30000, 30001):
            w = workers.get(f"http://{addr}:{port}")
            assert w and w["is_healthy"], f"{canary}:{port} is not back in the router: {workers}"
        # nobody else was touched
        for host in others:
            assert (current_release(lab, host), invocation(lab, host)) == before[host], f"{host} was touched"
            assert file_sums(lab, host, [DECODE_ENV])[DECODE_ENV] == base_plan["files"][host][DECODE_ENV]
            assert host not in [h for h, _, _ in steps(proc.stdout)], f"{host} appears in the roll:\n{proc.stdout}"
        r = requests.post(f"http://{base_plan['addr'][base_plan['router']]}:8000/v1/completions", json={"model": base_plan["model"], "prompt": "after", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        back_to_base(lab, base_plan)


def _stamped(out: str) -> list[tuple[float, str, str, str]]:
    """(seconds, host, step, message) from the roll's `[  12.3s] HOST  STEP  MESSAGE` lines."""
    found = []
    for line in out.splitlines():
        m = re.match(r"^\[\s*([\d.]+)s\]\s+(\S+)\s+(\S+)\s+(.*)$", line)
        if m:
            found.append((float(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return found


def test_a_canary_that_cannot_start_is_caught_at_its_first_failed_start_with_its_own_error(lab, base_plan, tmp_path):
    """Issue #18 item 7: a crashing canary took 27 s (systemd's start limit) and the message was
    `PyinfraError: No hosts remaining!` with argparse usage fragments."""
    canary = base_plan["gpu"][1]
    broken = derived_inventory(
        tmp_path, "lab_crash",
        f"[d for n, d in gpu_nodes if n == {canary!r}][0]['pdkit_node']['engines'][1]['env'] = {{'PDKIT_SIM_TRANSFER_FAIL_RATE': '2'}}",
    )
    before = current_release(lab, canary)
    try:
        proc = pdkit("roll", str(broken), "--canary", canary)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "failed at its first start: pdkit.sim: error: PDKIT_SIM_TRANSFER_FAIL_RATE must be within [0, 1]" in proc.stderr, out[-3000:]
        assert "No hosts remaining" not in proc.stderr and "usage:" not in proc.stderr, proc.stderr[-3000:]
        stamped = _stamped(proc.stdout)
        drained = next(t for t, h, step, _ in stamped if step == "drain")
        failed = next(t for t, h, step, _ in stamped if step == "FAILED")
        # the apply (upload, restart, gate) failed within seconds, not after five starts (27 s)
        assert failed - drained < 15, f"the broken start was caught {failed - drained:.1f} s after the drain:\n{proc.stdout}"
        assert current_release(lab, canary) == before
        assert f"{canary} is back on its previous release" in proc.stderr
    finally:
        back_to_base(lab, base_plan)


def test_a_node_cut_off_mid_roll_stops_the_roll_and_a_later_roll_completes(lab, base_plan, tmp_path):
    changed = derived_inventory(tmp_path, "lab_ctx", "_cluster['tuning']['all']['context_length'] = 4096")
    new = plan_of(changed)
    canary, victim = base_plan["gpu"][1], base_plan["gpu"][2]
    assert base_plan["router"] not in (canary, victim)
    veth = LabConfig.from_env().veth(victim)
    before = {h: current_release(lab, h) for h in base_plan["gpu"]}
    proc = subprocess.Popen([PDKIT, "roll", str(changed), "--canary", canary], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cut = False
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if not cut and [(h, s) for h, s, _ in steps(line)] == [(canary, "smoke")]:
                # the canary passed its last gate: take the next node off the network before the roll reaches it
                subprocess.run(["ip", "link", "set", "dev", veth, "down"], check=True, timeout=20)
                cut = True
        err = proc.stderr.read()  # type: ignore[union-attr]
        rc = proc.wait(timeout=600)
        out = "".join(lines)
        assert cut, f"the roll never got past the canary:\n{out}\n{err}"
        assert rc != 0, out
        assert f"stopped: {victim}: gate 'connect' failed: cannot reach it over SSH" in err, out + err
        assert f"not touched: {base_plan['router']}" in err, err
        # nothing was changed on it: the roll must not say it was put back (issue #18 item 7)
        assert f"{victim} could not be reached: nothing was changed on it" in err and f"{victim} is back on" not in err, err
        assert current_release(lab, canary).endswith(new["release"][canary][:12])
    finally:
        subprocess.run(["ip", "link", "set", "dev", veth, "up"], check=False, timeout=20)
        if proc.poll() is None:
            proc.kill()
    try:
        # nothing else was touched: the victim and the router host are still on their old release
        for host in (victim, base_plan["router"]):
            assert current_release(lab, host) == before[host], f"{host} was touched"
        # a later roll completes the change
        again = pdkit("roll", str(changed), "--canary", canary)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        for host in new["gpu"]:
            assert current_release(lab, host).endswith(new["release"][host][:12]), f"{host} is not on the new release"
    finally:
        back_to_base(lab, base_plan)


def test_the_weights_page_cache_residency_is_read_and_warmed_on_a_lab_host(lab, base_plan):
    """pdkit.agent.residency from the node venv the deploy installed, on a lab host's own kernel: a weight
    file evicted from the page cache reads as cold, the warm reads it in (issue 45 item 3; the roll runs
    the same command before a real engine's drain, Roller.warm_weights)."""
    from pdkit.inventory.loader import load
    from pdkit.render import flags

    host = base_plan["gpu"][1]
    python = flags.node_python(load(str(REPO / BASE)))
    model = "/var/lib/pdkit-residency-test"
    made = ssh(lab, host, f"mkdir -p {model}/shards && head -c 48M /dev/urandom > {model}/shards/model-00001-of-00001.safetensors"
                          f" && echo '{{}}' > {model}/config.json && sync")
    assert made.returncode == 0, made.stderr
    try:
        done = ssh(lab, host, f"{python} -m pdkit.residency {model} --evict --warm")
        assert done.returncode == 0, done.stdout + done.stderr
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["before"]["files"] == 1 and got["before"]["bytes"] == 48 << 20, got
        assert got["before"]["ratio"] < 0.5 and got["after"]["ratio"] > 0.99 and got["warm_s"] >= 0, got
    finally:
        ssh(lab, host, f"rm -rf {model}")
