"""The main job on the lab: `pyinfra inventories/lab.py deploy/pd.py` over real SSH to hosts
that boot real systemd, the real router in front of sim engines.

One lab per test session (tests/lab/conftest.py); this module converges it once and then
checks the hosts, the requests, faults and a failed serial rollout. Order matters below the
first test: later tests change the cluster and put it back.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from pdkit import lab as pdlab
from tests.conftest import REPO

pytestmark = pytest.mark.lab

INVENTORY = "inventories/lab.py"
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def run_pyinfra(inventory: str = INVENTORY, *extra: str, timeout: int = 900, tree: Path = REPO) -> tuple[int, dict, str]:
    """Run the deploy as a user would, from the source tree TREE (another than this checkout: its pdkit first on
    PYTHONPATH); return (exit code, parsed --json results, stderr)."""
    proc = subprocess.run(
        [PYINFRA, inventory, "deploy/pd.py", "-y", "--json", *extra],
        cwd=tree, capture_output=True, text=True, timeout=timeout,
        env=None if tree == REPO else {**os.environ, "PYTHONPATH": str(tree)},
    )
    try:
        results = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        results = {}
    return proc.returncode, results, proc.stderr


def operations(results: dict) -> list[dict]:
    return results.get("results", {}).get("operations", [])


def changed_hosts(results: dict) -> dict[str, list[str]]:
    return {op["name"]: op["success"] for op in operations(results) if op.get("success")}


def failed_hosts(results: dict) -> set[str]:
    return {h for op in operations(results) for h in op.get("error") or []}


def lab_spec():
    # load in a child process: importing pyinfra's CLI gevent-patches the importing process
    code = (
        "import json, sys; from pdkit.inventory.loader import load; from pdkit.render.plan import plan_cluster; from pdkit.render.flags import router_address; "
        f"spec = load({INVENTORY!r}); "
        "print(json.dumps({'router': [h.name for h in spec.router_hosts][0], "
        "'gpu': [h.name for h in spec.gpu_hosts], 'addr': {h.name: h.address for h in spec.hosts}, "
        "'files': {n: [[f.path, f.mode, f.owner, f.group, f.sha256] for f in p.files] for n, p in plan_cluster(spec).items()}, "
        "'units': {n: [s.unit for s in p.services] for n, p in plan_cluster(spec).items()}, "
        "'user': spec.cluster.service_user, 'model': spec.cluster.model.name, "
        "'router_metrics': [f'http://{router_address(h)}:{h.router.prometheus_port}/metrics' for h in spec.router_hosts]}))"
    )
    return json_from_child(code)


def json_from_child(code: str) -> dict:
    """The JSON object that CODE prints, run in a child Python: the lab tests read the spec and
    plan there because importing pyinfra's CLI (pdkit.inventory.loader does) gevent-patches the importer."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def ssh(lab, host: str, command: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return pdlab.ssh_run(lab, lab.host(host), command, timeout=timeout)


@pytest.fixture(scope="module")
def deployed(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"first converge failed (rc {rc}):\n{err[-4000:]}"
    return lab_spec()


def router_url(spec) -> str:
    return f"http://{spec['addr'][spec['router']]}:8000"


def circuit_states(metrics_url: str) -> dict[str, float]:
    """worker URL -> smg_worker_cb_state (0 closed, 1 open, 2 half-open) from a router's metrics."""
    text = requests.get(metrics_url, timeout=10).text
    wanted = "\n".join(l for l in text.splitlines() if l.startswith("smg_worker_cb_state")) + "\n"
    return {s.labels["worker"]: s.value for f in text_string_to_metric_families(wanted) for s in f.samples if "worker" in s.labels}


def wait_circuits_closed(spec, timeout: float = 240) -> None:
    """Send requests through the router until every worker's circuit breaker is closed again.

    A test that kills engines leaves open breakers behind, and the router closes one only after
    requests to that worker succeed; later modules share this lab (a roll's drain capacity check
    counts a worker with an open breaker as unusable), so such a test leaves them closed.
    """
    url = f"{router_url(spec)}/v1/completions"
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        states = {}
        for metrics in spec["router_metrics"]:
            states.update(circuit_states(metrics))
        if states and all(v == 0 for v in states.values()):
            return
        assert time.monotonic() < deadline, f"circuit breakers still not closed after {timeout:.0f} s: {states}"
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: requests.post(url, json={"model": spec["model"], "prompt": f"close circuits {n}",
                                                            "max_tokens": 2}, timeout=60).status_code,
                          range(i, i + 16)))
        i += 16
        time.sleep(1)


def test_a_second_run_changes_nothing(deployed):
    rc, results, err = run_pyinfra()
    assert rc == 0, err[-3000:]
    run = results.get("results")
    assert run is not None, f"no results in pyinfra's --json output:\n{err[-2000:]}"
    assert changed_hosts(results) == {}, f"second run changed: {changed_hosts(results)}"
    # converged: no operation is declared on any host, not even the release record (roles/releases.py)
    assert [op["name"] for op in run["operations"]] == [] and run["failed_hosts"] == []
    assert run["totals"] == {"hosts": 0, "success": 0, "error": 0, "no_change": 0}


def _daemon_processes(lab, spec) -> dict[str, dict[str, str]]:
    """host -> unit -> "MainPID real-venv-dirs", for every unit pdkit runs on every host (engines, pdkit-exporter,
    the router, Prometheus...): the venv directories its process mapped (its C extensions among them)."""
    out = {}
    for host, units in spec["units"].items():
        script = "; ".join(
            f"pid=$(systemctl show -p MainPID --value {u}); echo {u} $pid "
            f"$(grep -o '/opt/pdkit/venvs/[a-z]*-[0-9a-f]*' /proc/$pid/maps | sort -u | tr '\\n' ' ')" for u in units)
        lines = ssh(lab, host, script).stdout.splitlines()
        out[host] = {line.split()[0]: " ".join(line.split()[1:]) for line in lines}
    return out


def _deploy_from_tree(tree: Path) -> list[str]:
    rc, results, err = run_pyinfra(tree=tree)
    assert rc == 0 and results, err[-4000:]
    return [op["name"] for op in operations(results)]


def test_a_control_side_change_restarts_nothing_and_a_node_side_one_only_pdkit_exporter(lab, deployed, tmp_path):
    """Issue 48 item 2: the node wheel holds the node's files only (pdkit.wheels.wheelhouse.NODE_SOURCES). A deploy from
    a source tree whose only change is control-side (pdkit/bench/record.py) installs nothing and leaves every
    daemon on every host alone (same MainPID, same environment). A change to a file the node runs
    (pdkit/agent/releases.py) installs a new node venv and restarts pdkit-exporter onto it, and leaves the engines and
    the router alone (issue 30 item 3: the engines run from their own environment; issue #18 item 8: the exporter
    starts after the venv it runs is complete and linked). Deploying the real tree puts the node venv back."""
    import shutil
    import uuid

    before = _daemon_processes(lab, deployed)
    for host in deployed["gpu"]:
        engines = {u: v for u, v in before[host].items() if u.startswith("pdkit-engine-")}
        assert engines and all(v.split()[1:] and all("/venvs/engine-" in d for d in v.split()[1:]) for v in engines.values()), (host, engines)
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("config.py", "pyproject.toml", "README.md", "deploy", "roles", "pdkit", "templates", "inventories"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, tree / name)

    # 1. control side only: nothing on any host changes
    bench = tree / "pdkit" / "bench" / "record.py"
    bench.write_text(bench.read_text() + f"\n# a control-side change (tests/lab/test_deploy.py)\nLAB_MARK = {uuid.uuid4().hex!r}\n")
    ops = _deploy_from_tree(tree)
    assert not any("Install node venv" in n or "Install engine venv" in n for n in ops), ops
    assert _daemon_processes(lab, deployed) == before, "a control-side change restarted or moved a node daemon"

    # 2. a file the node runs: a new node venv, pdkit-exporter restarted onto it, nothing else
    mark = f"LAB_MARK = {uuid.uuid4().hex!r}"
    node_side = tree / "pdkit" / "agent" / "releases.py"
    node_side.write_text(node_side.read_text() + f"\n# a node-side change (tests/lab/test_deploy.py)\n{mark}\n")
    ops = _deploy_from_tree(tree)
    assert any("| Install node venv" in n for n in ops) and not any("Install engine venv" in n for n in ops), ops
    after = _daemon_processes(lab, deployed)
    for host, units in before.items():
        for unit, seen in units.items():
            now = after[host][unit]
            if unit == "pdkit-exporter.service":
                assert now.split()[0] != seen.split()[0], f"{host}: pdkit-exporter was not restarted onto the new node venv"
            else:
                assert now == seen, f"{host}: {unit} was restarted or changed environment by a pdkit-only change: {seen} -> {now}"
    for host in deployed["gpu"]:
        # the exporter started after the node venv link was switched to the venv whose pdkit has the mark
        # (python resolves its venv through the link at start), and the engine environment is a venv of its own
        check = ssh(lab, host, f"grep -c {shlex.quote(mark)} /opt/pdkit/venv/lib/python3*/site-packages/pdkit/agent/releases.py; "
                               "ls /opt/pdkit/venv/lib/python3*/site-packages/pdkit/cli.py 2>/dev/null | wc -l; "
                               "stat -c %Y /opt/pdkit/venv; date -d \"$(systemctl show -p ExecMainStartTimestamp --value pdkit-exporter)\" +%s; "
                               "readlink /opt/pdkit/engine-venv")
        count, control_files, switched, started, engine_env = check.stdout.split()
        assert count == "1" and control_files == "0", check.stdout + check.stderr
        assert int(started) >= int(switched) and "/venvs/engine-" in engine_env, check.stdout + check.stderr

    # 3. the real tree again
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-3000:]
    back = _daemon_processes(lab, deployed)
    for host, units in before.items():
        assert {u: v for u, v in back[host].items() if u != "pdkit-exporter.service"} == \
            {u: v for u, v in units.items() if u != "pdkit-exporter.service"}


def test_units_are_active_and_enabled(lab, deployed):
    for host, units in deployed["units"].items():
        for unit in units:
            proc = ssh(lab, host, f"systemctl is-active {unit} && systemctl is-enabled {unit}")
            assert proc.stdout.split() == ["active", "enabled"], f"{host} {unit}: {proc.stdout} {proc.stderr}"
    # two engines and an exporter per GPU node, the router, Prometheus and Alertmanager on the monitoring host
    assert sum(len(u) for u in deployed["units"].values()) == 3 * len(deployed["gpu"]) + 3, deployed["units"]


def test_files_and_modes_are_as_planned(lab, deployed):
    for host, files in deployed["files"].items():
        paths = " ".join(f[0] for f in files)
        proc = ssh(lab, host, f"stat -c '%n %a %U %G' {paths} && sha256sum {paths}")
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        stats = {line.split()[0]: line.split()[1:] for line in lines[: len(files)]}
        sums = {line.split()[1]: line.split()[0] for line in lines[len(files):]}
        for path, mode, owner, group, sha in files:
            assert stats[path] == [mode.lstrip("0") or "0", owner, group], f"{host}:{path} {stats[path]}"
            assert sums[path] == sha, f"{host}:{path} content differs from the plan"


def test_journald_runs_with_the_kits_size_on_every_host(lab, deployed):
    """Issue 42 item 2: the kit's journald drop-in is the last one journald reads (after the lab
    rootfs's 32 MB pdkit-lab.conf) and journald was restarted after it was written, so the size it
    runs with is the kit's."""
    path = "/etc/systemd/journald.conf.d/zz-pdkit.conf"
    for host in deployed["files"]:
        proc = ssh(lab, host, "systemd-analyze cat-config systemd/journald.conf | grep '^# /' | tail -n 1; "
                              f"stat -c %Y {path}; date -d \"$(systemctl show -p ExecMainStartTimestamp --value "
                              "systemd-journald.service)\" +%s; "
                              f"grep -h '^SystemMaxUse=' {path}")
        assert proc.returncode == 0, f"{host}: {proc.stdout} {proc.stderr}"
        last, written, started, size = proc.stdout.split("\n")[:4]
        assert last == f"# {path}", f"{host}: journald reads {last} last, not the kit's drop-in"
        assert int(started) >= int(written), f"{host}: journald has not been restarted since {path} was written"
        assert size.startswith("SystemMaxUse=") and size.endswith("M") and int(size[13:-1]) >= 1024, f"{host}: {size}"


def test_engines_run_as_the_service_user(lab, deployed):
    checked = 0
    for host, units in deployed["units"].items():
        # pdkit's own units; packaged daemons (Prometheus) keep their package's user. The router
        # has its own user (docs/security.md): an engine cannot read its process or its key
        for unit in (u for u in units if u.startswith("pdkit-")):
            checked += 1
            want = f"{deployed['user']}-router" if unit == "pdkit-router.service" else deployed["user"]
            # stat, not ps: ps cuts user names longer than 8 characters
            proc = ssh(lab, host, f"stat -c %U /proc/$(systemctl show -p MainPID --value {unit})")
            assert proc.stdout.strip() == want, f"{host} {unit} runs as {proc.stdout.strip()!r}"
    assert checked == 3 * len(deployed["gpu"]) + 1


def _engine_counter(spec, port: int, name: str) -> float:
    total = 0.0
    for host in spec["gpu"]:
        text = requests.get(f"http://{spec['addr'][host]}:{port}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    total += sample.value
    return total


def test_completion_and_streaming_chat_through_the_router(deployed):
    url = router_url(deployed)
    prompt_before = _engine_counter(deployed, 30000, "sglang:prompt_tokens_total")
    gen_before = _engine_counter(deployed, 30001, "sglang:generation_tokens_total")

    r = requests.post(f"{url}/v1/completions", json={"model": deployed["model"], "prompt": "the lab says hello", "max_tokens": 12}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 12 and body["choices"][0]["text"].strip()

    chunks = []
    with requests.post(f"{url}/v1/chat/completions", json={"model": deployed["model"], "messages": [{"role": "user", "content": "stream please"}], "max_tokens": 10, "stream": True}, stream=True, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                if delta.get("content"):
                    chunks.append(delta["content"])
            if line == "data: [DONE]":
                break
    assert len(chunks) >= 5, chunks

    # the tokens came from a prefill+decode pair: prefill engines counted the prompts, decode engines generated
    assert _engine_counter(deployed, 30000, "sglang:prompt_tokens_total") > prompt_before
    assert _engine_counter(deployed, 30001, "sglang:generation_tokens_total") >= gen_before + 22


def test_a_killed_prefill_fails_requests_clearly_and_systemd_brings_it_back(lab, deployed):
    url = router_url(deployed)
    restarts_before = {h: int(ssh(lab, h, "systemctl show -p NRestarts --value pdkit-engine-prefill.service").stdout.strip()) for h in deployed["gpu"]}
    for host in deployed["gpu"]:
        assert ssh(lab, host, "systemctl kill -s KILL pdkit-engine-prefill.service").returncode == 0
    r = requests.post(f"{url}/v1/completions", json={"model": deployed["model"], "prompt": "anyone there?", "max_tokens": 4}, timeout=60)
    assert r.status_code in (502, 503), r.text
    message = r.json()["error"]["message"]
    assert "prefill" in message.lower() or ":30000" in message, message

    deadline = time.monotonic() + 90
    while True:
        r = requests.post(f"{url}/v1/completions", json={"model": deployed["model"], "prompt": "back again?", "max_tokens": 4}, timeout=60)
        if r.status_code == 200:
            break
        assert time.monotonic() < deadline, f"the router never recovered: {r.status_code} {r.text}"
        time.sleep(1)
    for host in deployed["gpu"]:
        restarts = int(ssh(lab, host, "systemctl show -p NRestarts --value pdkit-engine-prefill.service").stdout.strip())
        assert restarts == restarts_before[host] + 1, f"{host}: systemd did not restart the prefill"
    wait_circuits_closed(deployed)


def test_serial_rollout_of_a_broken_engine_stops_at_the_first_host(lab, deployed, tmp_path):
    """Every decode gets a config under which it never becomes ready: the first host fails its
    gate and pyinfra stops; the other hosts keep their release and keep serving."""
    broken = tmp_path / "lab_broken.py"
    broken.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / INVENTORY)!r})\n"
        "gpu_nodes = _base['gpu_nodes']\n"
        "for _name, _data in gpu_nodes:\n"
        "    _data['pdkit_node']['engines'][1]['env'] = {'PDKIT_SIM_STARTUP_DELAY_S': '3600'}\n"
        "monitoring = _base['monitoring']\n"
        "_hosts, _data = _base['all']\n"
        "all = (_hosts, {'pdkit_cluster': {**_data['pdkit_cluster'], 'ready_timeout_s': 15}})\n"
    )
    invocation = "systemctl show -p InvocationID --value pdkit-engine-decode.service"
    before = {h: ssh(lab, h, invocation).stdout.strip() for h in deployed["gpu"]}
    rc, results, err = run_pyinfra(str(broken), "--serial")
    assert rc != 0, "a deploy whose health gate fails must exit non-zero"
    # pyinfra stops on FAIL_PERCENT = 0 before printing --json results: read its log instead
    failed = set(re.findall(r"\[(lab-[\w-]+)\] Error", err))
    assert len(failed) == 1, f"expected exactly one failed host, got {failed}\n{err[-3000:]}"
    assert "Over 0% of hosts failed" in err
    first = failed.pop()
    assert "not ready after 15 s" in err

    planned = {h: {f[0]: f[4] for f in files} for h, files in deployed["files"].items()}
    for host in deployed["gpu"]:
        if host == first:
            continue
        env_sum = ssh(lab, host, "sha256sum /etc/pdkit/engines/decode.env").stdout.split()[0]
        assert env_sum == planned[host]["/etc/pdkit/engines/decode.env"], f"{host} was touched"
        assert ssh(lab, host, invocation).stdout.strip() == before[host], f"{host}'s decode was restarted"
        for port in (30000, 30001):
            assert requests.get(f"http://{deployed['addr'][host]}:{port}/health", timeout=10).status_code == 200

    # putting the good spec back converges the broken host again
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), err[-3000:]
    assert requests.get(f"http://{deployed['addr'][first]}:30001/health", timeout=10).status_code == 200
    wait_circuits_closed(deployed)


def test_an_invalid_inventory_stops_before_any_host_is_touched(tmp_path):
    bad = tmp_path / "lab_bad.py"
    bad.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / INVENTORY)!r})\n"
        "gpu_nodes = _base['gpu_nodes']\n"
        "gpu_nodes[0][1]['pdkit_node']['engines'][1]['gpus'] = [4, 5, 6, 9]\n"
        "monitoring = _base['monitoring']\n"
        "all = _base['all']\n"
    )
    rc, results, err = run_pyinfra(str(bad))
    assert rc != 0
    assert "pdkit_node.engines[1].gpus" in err and "no host was changed" in err
    assert not changed_hosts(results)
