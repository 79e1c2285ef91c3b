"""The users' own shape on the lab: ONE box (inventories/lab-one-node.py: the first GPU host with its
TP4 prefill, TP4 decode and the router, plus the monitoring host). Every change takes the router's
last prefill and decode out, so:

1. `pdkit roll` and `pdkit rollback` refuse without --allow-downtime, before any change, naming the
   router, the kinds it loses and the expected outage; `--dry` shows the same;
2. with it, a change rolls under a streaming load: every request either succeeds or gets an error
   status within seconds (none hangs), the outage is measured and reported, the box serves again;
   `pdkit rollback --allow-downtime` puts the previous release back the same way;
3. a change the decode cannot start with is restored byte for byte and the box serves again;
4. `pdkit tune` with `downtime: true` runs a campaign of three candidates on the box, one of which
   corrupts every answer (the sim's knob) and fails the correctness gate and is put back.

Runs on the shared lab (its first GPU host and the monitoring host; the other GPU hosts are left
alone) and ends with the lab back on inventories/lab.py.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import requests

from pdkit.agent.health import READY_LOG_LINE
from tests.conftest import REPO
from tests.lab.test_roll import (
    BASE,
    PDKIT,
    PYINFRA,
    Load,
    current_release,
    file_sums,
    invocation,
    pdkit,
    plan_of,
    router_workers,
    ssh,
    steps,
    wait_router_steady,
)

pytestmark = pytest.mark.lab

ONE = "inventories/lab-one-node.py"
# a client that backs off half a second after an error, as one honouring the router's answer would
LOAD_ARGS = ("--pause-after-failure", "0.5", "--timeout", "60")
# the longest a request may take to fail while the box is out: an error status, never a hang
QUICK_FAILURE_S = 5.0


def one_node_inventory(tmp_path: Path, name: str, body: str) -> Path:
    """An inventory that takes inventories/lab-one-node.py's data and changes it with BODY
    (`_cluster`: the cluster data, `_node`: the box's host data)."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import copy, runpy\n"
        f"_base = runpy.run_path({str(REPO / ONE)!r})\n"
        "gpu_nodes = copy.deepcopy(_base['gpu_nodes'])\n"
        "monitoring = _base['monitoring']\n"
        "_hosts, _data = _base['all']\n"
        "_cluster = copy.deepcopy(_data['pdkit_cluster'])\n"
        "_node = gpu_nodes[0][1]\n"
        f"{body}\n"
        "all = (_hosts, {'pdkit_cluster': _cluster})\n"
    )
    return path


def deploy(inventory: str) -> None:
    proc = subprocess.run([PYINFRA, inventory, "deploy/pd.py", "-y"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"deploying {inventory} failed:\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def box(lab):
    deploy(ONE)
    plan = plan_of(ONE)
    assert plan["gpu"] == [plan["router"]], plan["gpu"]
    try:
        yield plan
    finally:
        # the lab back on inventories/lab.py for the modules after this one
        deploy(BASE)
        base = plan_of(BASE)
        for host, release in base["release"].items():
            assert current_release(lab, host).endswith(release[:12]), f"{host} is not back on {BASE}"
        wait_router_steady(base)


def roll_under_load(tmp_path: Path, plan: dict, concurrency: int, *roll_args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`pdkit roll ROLL_ARGS` under a streaming load of CONCURRENCY through the router, kept on until
    the box has served 2 x CONCURRENCY more requests after the roll: (the roll, the load's counts)."""
    wait_router_steady(plan)
    load = Load(tmp_path, plan, concurrency=concurrency, extra=LOAD_ARGS)
    try:
        load.wait_flowing(at_least=2 * concurrency)
        proc = pdkit("roll", *roll_args)
        served = load.counts()["ok"]
        deadline = time.monotonic() + 60
        while load.counts()["ok"] < served + 2 * concurrency:
            assert time.monotonic() < deadline, f"the load did not recover after the roll: {load.counts()}\n{proc.stdout[-3000:]}"
            time.sleep(0.5)
        return proc, load.stop()
    finally:
        if load.proc.poll() is None:
            load.proc.kill()


def rotate_journal(lab, host: str) -> None:
    """What a day of request logging does to a capped journal: every line logged so far is gone (the
    engines' readiness lines with it)."""
    proc = ssh(lab, host, "journalctl --rotate && journalctl --vacuum-time=1s >/dev/null 2>&1; "
                          f"journalctl --no-pager -o cat | grep -cF {shlex.quote(READY_LOG_LINE)} || true")
    assert proc.returncode == 0 and proc.stdout.strip() == "0", f"the journal still holds a readiness line: {proc}"


def serves(plan: dict) -> None:
    """The box answers a completion through its router, with both engines registered and healthy."""
    host = plan["router"]
    addr = plan["addr"][host]
    workers = router_workers(plan)
    for port in (30000, 30001):
        w = workers.get(f"http://{addr}:{port}")
        assert w and w["is_healthy"], f"{host}:{port} is not in the router: {workers}"
    r = requests.post(f"http://{addr}:8000/v1/completions", json={"model": plan["model"], "prompt": "one box", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_roll_or_rollback_that_would_leave_the_router_without_workers_is_refused_naming_the_outage(lab, box, tmp_path):
    host = box["router"]
    changed = one_node_inventory(tmp_path, "bs96", "_cluster['tuning']['decode']['cuda_graph_max_bs'] = 96")
    before = (current_release(lab, host), invocation(lab, host))
    refused = tmp_path / "refused.json"
    proc = pdkit("roll", str(changed), "--report", str(refused))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    written = json.loads(refused.read_text())
    assert written["result"] == "refused" and written["nodes"] == [] and "has no decode or prefill worker" in written["downtime"][0], written
    err = proc.stderr
    print(err)
    assert err.startswith("pdkit roll: refused, nothing was changed"), err
    assert f"canary {host}: the router on {host} (http://{box['addr'][host]}:8000) has no decode or prefill worker" in err, err
    # measured on the node, not assumed: an engine's last warm restart (its start history, issue 45
    # item 1), else the deploy's own start of the engines
    assert re.search(rf"expected outage ~\d+ s \((the engines' restart-to-ready as last measured on {host}|"
                     rf"(decode|prefill) on {host}: (its last warm restart|the first start on a new engine environment))",
                     err), err
    assert f"pdkit roll {changed} --allow-downtime" in err, err
    assert (current_release(lab, host), invocation(lab, host)) == before, "a refused roll touched the node"

    dry = pdkit("roll", str(changed), "--dry")
    assert dry.returncode == 0, dry.stderr
    assert "downtime (the roll refuses it without --allow-downtime):" in dry.stdout and "has no decode or prefill worker" in dry.stdout, dry.stdout

    back = pdkit("rollback", ONE, host)
    assert back.returncode == 2 and back.stderr.startswith("pdkit rollback: refused, nothing was changed"), back.stderr
    assert f"pdkit rollback {ONE} {host} --allow-downtime" in back.stderr, back.stderr
    assert (current_release(lab, host), invocation(lab, host)) == before
    serves(box)


def test_with_allow_downtime_a_change_rolls_under_load_with_quick_errors_only_and_rolls_back(lab, box, tmp_path):
    host = box["router"]
    changed = one_node_inventory(tmp_path, "bs96", "_cluster['tuning']['decode']['cuda_graph_max_bs'] = 96")
    new = plan_of(changed)
    release_before = current_release(lab, host)
    report = tmp_path / "report.json"
    # a busy box's journal has rotated away the prefill's readiness line long before the roll (the
    # roll restarts the decode only): its gate must decide from what the engine answers now
    rotate_journal(lab, host)
    proc, counts = roll_under_load(tmp_path, box, 8, str(changed), "--allow-downtime", "--report", str(report))
    assert proc.returncode == 0, f"roll failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    print(f"one-node downtime roll under C=8: {json.dumps({k: v for k, v in counts.items() if k != 'errors'})}")
    # the outage was there and clients saw it as smg's 503 (the box's decode out first), at once:
    # nothing hung, nothing broke mid-stream, and no request was held through the outage
    assert set(counts["failures"]) == {"status 503"}, counts
    assert counts["slowest_failure_s"] < QUICK_FAILURE_S, counts
    assert counts["slowest_ok_s"] < QUICK_FAILURE_S, counts
    assert counts["ok"] >= 32, counts
    seen = steps(proc.stdout)
    names = [s for h, s, _ in seen if h == host]
    for step in ("connect", "drain", "apply", "ready", "router", "smoke", "done"):
        assert step in names, f"no {step} line:\n{proc.stdout}"
    assert any(s == "downtime" for _, s, _ in seen), proc.stdout
    assert json.loads(report.read_text())["result"] == "ok"
    node = json.loads(report.read_text())["nodes"][0]
    assert node["host"] == host and 0 < node["outage_s"] < 120, node
    printed = re.search(r"service outage ([\d.]+) s", proc.stdout)
    assert printed and abs(float(printed.group(1)) - node["outage_s"]) < 0.1, proc.stdout
    # the restarted decode's own start-up phases, as its gate read them from SGLang's gauges (issue 45 item 1)
    phases = node["engine_phases"]["pdkit-engine-decode.service"]
    assert 0 < phases["restart_to_ready_s"] < 120 and phases["tokenizer_e2e"] > 0 and "load_weight" in phases, node
    assert "decode ready" in proc.stdout and "(SGLang: load_weight" in proc.stdout, proc.stdout[-3000:]
    assert current_release(lab, host).endswith(new["release"][host][:12])
    assert file_sums(lab, host, ["/etc/systemd/system/pdkit-engine-decode.service"]) == {
        "/etc/systemd/system/pdkit-engine-decode.service": new["files"][host]["/etc/systemd/system/pdkit-engine-decode.service"]}
    serves(box)

    # the rollback restarts the decode only, after the journal rotated again (issue 42: it waited
    # out ready_timeout_s for the prefill's line and left the box out of the router)
    rotate_journal(lab, host)
    back = pdkit("rollback", ONE, host, "--allow-downtime")
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert current_release(lab, host) == release_before
    assert file_sums(lab, host, sorted(box["files"][host])) == box["files"][host]
    serves(box)

    # the node's start history (issue 45 item 1): the roll's start of the decode on bs96, then the
    # rollback's on the box's own class, each once, the rollback's warm (same engine environment)
    starts = ssh(lab, host, "cat /var/lib/pdkit-engines/ready/pdkit-engine-decode.service.starts.json")
    assert starts.returncode == 0, starts
    *_, rolled, restored = json.loads(starts.stdout)
    assert rolled["config_class"] != restored["config_class"] and restored["warm"] is True, (rolled, restored)
    assert 0 < rolled["restart_to_ready_s"] < 120 and rolled["engine_env"] == restored["engine_env"], rolled
    assert node["announced_outage_s"] is not None and node["announced_outage_source"], node
    # announcing bs96 again: the decode's warm start on bs96 when the roll's was warm (an earlier start
    # on this engine environment was recorded), else its last warm restart, of another class
    dry = pdkit("roll", str(changed), "--dry")
    assert dry.returncode == 0, dry.stderr
    words = "with the same configuration class" if rolled["warm"] else "of ANOTHER configuration class"
    assert re.search(rf"expected outage ~\d+ s \(decode on {host}: its last warm restart,? {words}", dry.stdout), dry.stdout


SHRUNK_DROPIN = "/etc/systemd/system/pdkit-engine-prefill.service.d/zz-test-shrunk.conf"


def restart_prefill(lab, host: str, env: str | None) -> None:
    """Restart the box's prefill (its decode with it: PartOf=) outside the kit, with ENV set through a
    drop-in (the sim's knob) or the drop-in removed."""
    write = (f"mkdir -p {shlex.quote(str(Path(SHRUNK_DROPIN).parent))} && "
             f"printf '[Service]\\nEnvironment={env}\\n' > {SHRUNK_DROPIN}") if env else f"rm -f {SHRUNK_DROPIN}"
    proc = ssh(lab, host, f"{write} && systemctl daemon-reload && systemctl restart pdkit-engine-prefill.service", timeout=120)
    assert proc.returncode == 0, proc


def test_a_rollback_whose_ready_step_fails_leaves_the_box_in_the_router_and_a_shrunken_engine_fails_its_gate(lab, box, tmp_path):
    """Issue 42: an engine that comes back with a fraction of its KV pool serves and would pass every
    gate; and a rollback whose `ready` step failed after a good restore left a healthy box out of the
    router. Here the prefill is restarted outside the kit with 5% of its pool (the sim's
    PDKIT_SIM_KV_POOL_FRACTION), then the rollback restores the decode: its ready step must fail on
    the prefill, naming both pool sizes, and the engines must be back in the router, serving."""
    host = box["router"]
    addr = box["addr"][host]
    release_before = current_release(lab, host)
    # the rollback's target: the newest release kept that is not running (the previous test's roll),
    # named, since the default (the one before the current id) is whatever ran on the box earlier
    kept = pdkit("releases", ONE, host, "--json")
    assert kept.returncode == 0, kept.stderr
    # with each running engine's last start, as the gate saw it (issue 45 item 1)
    last = json.loads(kept.stdout)["last_starts"]
    assert last["pdkit-engine-decode.service"]["restart_to_ready_s"] > 0, last
    assert "tokenizer_e2e" in last["pdkit-engine-decode.service"], last
    target = max(r["id"] for r in json.loads(kept.stdout)["releases"] if r["id"] != release_before)
    full = requests.get(f"http://{addr}:30000/server_info", timeout=10).json()["max_total_num_tokens"]
    restart_prefill(lab, host, "PDKIT_SIM_KV_POOL_FRACTION=0.05")
    try:
        wait_router_steady(box)
        shrunk = requests.get(f"http://{addr}:30000/server_info", timeout=10).json()["max_total_num_tokens"]
        assert shrunk < 0.1 * full, (shrunk, full)
        back = pdkit("rollback", ONE, host, "--to", target, "--allow-downtime")
        out = back.stdout + back.stderr
        assert back.returncode == 1, out[-4000:]
        assert f"{host}: gate 'ready' failed" in back.stderr, out[-4000:]
        # the gate names the figure and both numbers
        assert "KV pool" in back.stderr and str(full) in back.stderr and str(shrunk) in back.stderr, back.stderr[-3000:]
        # the restore went through (the decode is on the previous release) and the box is served again
        assert current_release(lab, host) == target
        assert "back in the router" in out, out[-3000:]
        serves(box)
    finally:
        restart_prefill(lab, host, None)
    wait_router_steady(box)
    again = pdkit("rollback", ONE, host, "--to", release_before, "--allow-downtime")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert current_release(lab, host) == release_before
    serves(box)


def test_an_engine_restarted_onto_other_weights_fails_its_gate_naming_the_rank(lab, box):
    """Issue 44 item 2: the prefill restarted outside the kit onto other weights (the sim's
    PDKIT_SIM_WEIGHTS_SALT through a drop-in: its configuration, so its record's key, unchanged)
    fails the engine gate that the deploy, the roll and a restore run, naming the rank and both
    checksums from /weights_checker; back on its own weights it passes again."""
    from pdkit.agent import gates
    from pdkit.inventory.loader import load
    from pdkit.render import flags
    from pdkit.render.plan import plan_cluster

    host = box["router"]
    spec = load(ONE)
    found = [g for g in gates.phases(gates.gate_for(s) for s in plan_cluster(spec)[host].services)[0]
             if g.kind == "engine"]
    command = gates.command(flags.node_python(spec), found)
    restart_prefill(lab, host, "PDKIT_SIM_WEIGHTS_SALT=another-download")
    try:
        proc = ssh(lab, host, command, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "pdkit-engine-prefill" in out and "other weights" in out and "tp_rank 0" in out, out[-3000:]
    finally:
        restart_prefill(lab, host, None)
    proc = ssh(lab, host, command, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    wait_router_steady(box)
    serves(box)


QUEUE_DROPINS = {
    # two 6,000-token prompts a 2 s pass: a burst of 16 takes ~17 s to prefill
    "pdkit-engine-prefill.service": "PDKIT_SIM_PREFILL_BASE_MS=2000",
    # a tenth of the decode's KV pool (~26K tokens): 4 such prompts at once, the rest queue for admission
    "pdkit-engine-decode.service": "PDKIT_SIM_KV_POOL_FRACTION=0.1",
}
QUEUE_PROMPT_WORDS = 6000  # the sim's tokens are words: under the box's 8,192-token cap


def queue_dropins(lab, host: str, on: bool) -> None:
    """The sim's slow prefill and small decode pool through drop-ins (outside the kit), both engines
    restarted; ON False: removed and restarted back."""
    parts = []
    for unit, env in QUEUE_DROPINS.items():
        path = f"/etc/systemd/system/{unit}.d/zz-test-queue.conf"
        parts.append(f"mkdir -p /etc/systemd/system/{unit}.d && printf '[Service]\\nEnvironment={env}\\n' > {path}"
                     if on else f"rm -f {path}")
    units = " ".join(QUEUE_DROPINS)
    proc = ssh(lab, host, " && ".join(parts) + f" && systemctl daemon-reload && systemctl restart {units}", timeout=180)
    assert proc.returncode == 0, proc


def burst(plan: dict, n: int, timeout: float = 150) -> list[tuple[int, float]]:
    """N long completions at once through the router: (status or 0 for no answer, seconds) each."""
    from concurrent.futures import ThreadPoolExecutor

    url = f"http://{plan['addr'][plan['router']]}:8000/v1/completions"

    def one(i: int) -> tuple[int, float]:
        prompt = " ".join(f"w{i}x{j}" for j in range(QUEUE_PROMPT_WORDS))  # no shared prefix
        start = time.monotonic()
        try:
            r = requests.post(url, json={"model": plan["model"], "prompt": prompt, "max_tokens": 16}, timeout=timeout)
            return r.status_code, time.monotonic() - start
        except requests.RequestException:
            return 0, time.monotonic() - start

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_a_burst_queued_behind_a_small_decode_pool_is_served_and_a_killed_prefill_still_fails_fast(lab, box):
    """Issue 45 item 5: SGLang's prefill starts a request's bootstrap clock at registration and the
    decode admits only what its KV pool holds (docs/rolling.md "Queueing vs the fault budget"; the sim
    queues the same way). A burst of 16 long prompts against a decode that holds 4 queues for ~17 s with
    nothing dead: at the kit's fault budget every request is served (at the old 60 s bootstrap timeout
    of a slower box, the queued ones failed). A prefill killed during a second burst still fails its
    requests with an error status within the budget, none hangs."""
    from pdkit.inventory.loader import load

    host = box["router"]
    addr = box["addr"][host]
    budget = load(ONE).cluster.fault_budget
    queue_dropins(lab, host, True)
    try:
        wait_router_steady(box)
        peak = [0.0]
        stop = False

        def watch() -> None:
            while not stop:
                try:
                    page = requests.get(f"http://{addr}:30001/metrics", timeout=5).text
                    for line in page.splitlines():
                        if line.startswith("sglang:num_decode_prealloc_queue_reqs{"):
                            peak[0] = max(peak[0], float(line.rsplit(" ", 1)[1]))
                except requests.RequestException:
                    pass
                time.sleep(0.2)

        import threading
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        first = burst(box, 16)
        stop = True
        watcher.join(10)
        print(f"burst of 16 behind a 4-request decode pool: {sorted(round(t, 1) for _, t in first)}; "
              f"prealloc queue peak {peak[0]:.0f}")
        assert [s for s, _ in first] == [200] * 16, first
        assert peak[0] >= 4, f"the decode never queued for admission (peak {peak[0]})"
        assert max(t for _, t in first) > 8, first  # they did queue: the burst took the prefill's ~17 s
        failed = requests.get(f"http://{addr}:30000/metrics", timeout=10).text
        assert "sglang:num_bootstrap_failed_reqs_total{" not in failed, "a queued request failed its bootstrap"

        # a prefill killed mid-burst: every request ends with a status within the budget
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(burst, box, 8, 120)
            time.sleep(3)
            killed_at = time.monotonic()
            kill = ssh(lab, host, "systemctl kill -s KILL pdkit-engine-prefill.service")
            assert kill.returncode == 0, kill
            ended = second.result()
        waited = time.monotonic() - killed_at
        print(f"burst of 8, prefill killed after 3 s: {ended}; all ended {waited:.1f} s after the kill")
        # an error status or, retried by the router onto the restarted prefill, an answer: never a hang
        assert 0 not in [s for s, _ in ended], f"a request hung until the client gave up: {ended}"
        assert waited < budget.budget_s + 10, (waited, budget.budget_s, ended)
    finally:
        queue_dropins(lab, host, False)
    wait_router_steady(box)
    serves(box)


def test_a_change_the_box_cannot_start_is_restored_byte_for_byte_and_it_serves_again(lab, box, tmp_path):
    host = box["router"]
    broken = one_node_inventory(tmp_path, "crash", "_node['pdkit_node']['engines'][1]['env'] = {'PDKIT_SIM_TRANSFER_FAIL_RATE': '2'}")
    before = current_release(lab, host)
    report = tmp_path / "report.json"
    proc = pdkit("roll", str(broken), "--allow-downtime", "--report", str(report))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    # the report is written when the roll fails too: the failed gate, the restore, the outage it cost
    written = json.loads(report.read_text())
    assert written["result"] == "stopped", written
    assert (written["failed"]["host"], written["failed"]["gate"], written["failed"]["restored"]) == (host, "apply", True), written
    assert 0 < written["failed"]["outage_s"] < 120, written
    assert f"stopped: {host}: gate 'apply' failed" in proc.stderr and "PDKIT_SIM_TRANSFER_FAIL_RATE must be within [0, 1]" in proc.stderr, out[-3000:]
    assert f"{host} is back on its previous release" in proc.stderr, proc.stderr
    assert current_release(lab, host) == before
    assert file_sums(lab, host, sorted(box["files"][host])) == box["files"][host]
    serves(box)


def test_a_canary_whose_answers_drift_at_long_prompts_only_is_stopped_and_restored_byte_for_byte(lab, box, tmp_path):
    """Issue 44: the change sets the prefill's chunked prefill size, and the sim's prefill (its
    PDKIT_SIM_DRIFT_WHEN on that flag) then ranks another token first from position 2,000 on. The
    short answers and the 1K-token scores agree with the baseline; the longest prompt the cap allows
    does not. The roll stops at the canary's answers gate and the box goes back byte for byte."""
    host = box["router"]
    drift = {"PDKIT_SIM_DRIFT_WHEN": "--chunked-prefill-size=4096", "PDKIT_SIM_DIVERGE_FROM_POSITION": "2000"}
    drifting = one_node_inventory(tmp_path, "drift", "_cluster['answers'] = {'enabled': True}\n"
                                                     "_cluster['tuning'].setdefault('prefill', {})['chunked_prefill_size'] = 4096\n"
                                                     f"_node['pdkit_node']['engines'][0]['env'] = {drift!r}")
    dry = pdkit("roll", str(drifting), "--dry")
    assert "answers gate on the first batch that changes" in dry.stdout and "(b) forced" in dry.stdout, dry.stdout[-2000:]
    before = current_release(lab, host)
    report = tmp_path / "report.json"
    proc = pdkit("roll", str(drifting), "--allow-downtime", "--report", str(report))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    written = json.loads(report.read_text())
    assert (written["failed"]["gate"], written["failed"]["restored"]) == ("answers", True), written["failed"]
    parts = written["answers"]["parts"]
    assert parts["short"]["ok"], parts["short"]
    rows = parts["forced"]["rows"]
    assert len(rows) >= 2 and rows[0]["prompt_tokens"] < 2000 < rows[-1]["prompt_tokens"], rows
    # below the drift's length nothing moved; past it the top-1 disagrees, and the message says where
    assert (rows[0]["top1_agreement"], rows[0]["mean_abs_delta"]) == (1.0, 0.0), rows[0]
    assert rows[-1]["top1_agreement"] < 0.97 and rows[-1]["first_top1_disagreement"] is not None, rows[-1]
    assert f"{rows[-1]['prompt_tokens']} tokens: top-1 agreement" in proc.stderr, out[-3000:]
    assert f"{host} is back on its previous release" in proc.stderr, proc.stderr[-3000:]
    assert current_release(lab, host) == before
    assert file_sums(lab, host, sorted(box["files"][host])) == box["files"][host]
    serves(box)


# issue 44's lever classes on the sim: a chunked prefill of 4096 drifts the logprobs a little (0.003
# per 1,000 tokens of context, within the tolerance), torch compile ranks another token first past
# position 2,000 (greedy answers diverge there)
SIM_ENV = {"PDKIT_SIM_DRIFT_WHEN": "--chunked-prefill-size=4096", "PDKIT_SIM_DRIFT_LOGPROB_PER_1K": "0.003",
           "PDKIT_SIM_DIVERGE_WHEN": "--enable-torch-compile", "PDKIT_SIM_DIVERGE_FROM_POSITION": "2000"}


def test_the_canarys_accuracy_eval_runs_through_the_router_and_its_score_is_in_the_report(lab, box, tmp_path):
    """Issue 44 item 1(d): with pdkit_cluster.answers.accuracy on, the roll runs the pinned sgl-eval
    (pdkit's own environment) on the baseline before the drain and on the canary after it; on one box
    the router fronts exactly the canary's engines, so both go through it. The sim is no model: it
    scores 0 both times and the part passes; the report has both scores, intervals and the seconds."""
    host = box["router"]
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i} + {i}?", "expected_answer": str(2 * i)})
                                + "\n" for i in range(3)))
    accuracy = {"enabled": True, "dataset": str(problems), "max_tokens": 8, "num_threads": 2, "timeout_s": 300}
    changed = one_node_inventory(tmp_path, "acc", f"_cluster['answers'] = {{'enabled': True, 'lengths': [], "
                                                  f"'short_prompts': 2, 'accuracy': {accuracy!r}}}\n"
                                                  "_node['pdkit_node']['engines'][1]['env'] = {'PDKIT_SIM_DECODE_BASE_MS': '21'}")
    dry = pdkit("roll", str(changed), "--dry")
    assert "(d) accuracy: sgl-eval 0.1.3 on" in dry.stdout, dry.stdout[-2000:]
    report = tmp_path / "report.json"
    proc = pdkit("roll", str(changed), "--allow-downtime", "--report", str(report))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    answers = json.loads(report.read_text())["answers"]
    assert answers, f"the roll ran no answer gate:\n{out[-3000:]}"
    part = answers["parts"]["accuracy"]
    assert part["ok"] and part["via"].startswith("the router") and part["exit_code"] == 0, part
    assert (part["score"], part["num_examples"], part["error_rate"]) == (0.0, 3, 0.0), part
    assert part["baseline"]["score"] == 0.0 and part["seconds"] > 0, part
    assert "accuracy 0.000 (95% CI 0.000-0.000)" in out, out[-3000:]
    back = pdkit("rollback", ONE, host, "--allow-downtime")
    assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]
    serves(box)


def test_a_one_node_campaign_rolls_each_candidate_with_downtime_and_puts_a_failed_one_back(lab, box, tmp_path):
    import yaml

    host = box["router"]
    inventory = one_node_inventory(tmp_path, "tune", "".join(f"_node['pdkit_node']['engines'][{i}]['env'] = {SIM_ENV!r}\n" for i in (0, 1)))
    shipped = yaml.safe_load((REPO / "docs" / "tune" / "lab-one-node.yaml").read_text())
    assert shipped["downtime"] is True
    campaign = {
        **shipped, "inventory": str(inventory), "out_dir": str(tmp_path / "tune"), "state_dir": str(tmp_path / "state"), "keep": "baseline",
        # the shipped agentic workload, smaller: 4 sessions of 3 growing turns sharing a system prompt
        "workload": {"input_len": 32, "output_len": 16, "concurrency": [4], "warmup": 1,
                     "agentic": {**shipped["workload"]["agentic"], "sessions": 4, "turns": 3, "system_tokens": 300,
                                 "turn_tokens": 100, "reply_tokens": 16, "think_s": 0.1}},
        "target_concurrency": 4,
        "correctness": {"prompts": 8, "max_new_tokens": 16, "min_match_rate": 0.9, "concurrency": 4},
        "soak": {"seconds": 3, "concurrency": 8, "max_new_tokens": 16, "wedge_window_s": 2},
        "doctor": {"window_s": 2, "probe_requests": 2},
        "noise": {**shipped["noise"], "baseline_repeats": 2},
        # the layout lever (PD -> one unified engine over the same GPUs) and a cache lever, as shipped
        "candidates": [
            next(c for c in shipped["candidates"] if c["name"] == "unified"),
            # an exact lever: answers token for token, every forced top-1 the same
            {**next(c for c in shipped["candidates"] if c["name"] == "decode-radix"), "exact": True},
            # a numerics lever: passes within the tolerance, its drift measured
            {"name": "chunk-4096", "set": {"prefill.chunked_prefill_size": 4096}},
            {"name": "torch-compile", "set": {"all.torch_compile": True}, "note": "the sim diverges past position 2,000"},
        ],
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(json.dumps(campaign))
    done = subprocess.run([PDKIT, "tune", str(inventory), str(path)], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "tune" / "lab-one-node.jsonl").read_text().splitlines() if line.strip()]
    by = {r["candidate"]: r for r in records if r["kind"] != "end"}
    assert list(by) == ["baseline", "unified", "decode-radix", "chunk-4096", "torch-compile"], list(by)
    assert by["baseline"]["measured"]["via"] == "router", by["baseline"]["measured"]
    for name in ("baseline", "unified", "decode-radix", "chunk-4096"):
        assert by[name]["verdict"] == "pass", (name, by[name].get("failed_gate"), by[name].get("reason"))
    # the graded gate (docs/correctness.md): each length's drift measured at rest and under load
    exact = by["decode-radix"]["answer_gate"]
    assert exact["exact"] is True
    for part in ("forced", "loaded"):
        rows = exact["parts"][part]["rows"]
        assert rows and all((r["top1_agreement"], r["mean_abs_delta"]) == (1.0, 0.0) for r in rows), (part, rows)
    numerics = by["chunk-4096"]["answer_gate"]["parts"]["forced"]
    assert 0 < numerics["rows"][-1]["mean_abs_delta"] <= 0.05 and numerics["rows"][-1]["top1_agreement"] == 1.0, numerics
    assert "within tolerance" in numerics["detail"], numerics["detail"]
    for name in ("unified", "decode-radix", "torch-compile"):
        # each candidate restarted the box with the router emptied: the outage was measured
        assert 0 < by[name]["timings"]["outage_s"] < 120, (name, by[name]["timings"])
    # with each restarted engine's own phases (issue 45 item 1), read by its gate: the unified engine the
    # layout added (timed from its first start) and the decode torch-compile restarted
    for name, unit in (("unified", "pdkit-engine-unified.service"), ("torch-compile", "pdkit-engine-decode.service")):
        start = by[name]["timings"]["engine_phases"][host][unit]
        assert start["restart_to_ready_s"] > 0 and "tokenizer_e2e" in start, (name, by[name]["timings"])
    # PD -> unified and back to PD (decode-radix starts from the inventory): two layout changes, each
    # judged on the same workload through the same router, answers compared with the baseline's
    assert by["unified"]["flag_diff"] == [f"{host}/decode: engine removed", f"{host}/prefill: engine removed",
                                          f"{host}/unified: engine added"], by["unified"]["flag_diff"]
    assert by["unified"]["correctness"]["match_rate"] >= 0.9, by["unified"]["correctness"]
    assert by["unified"]["measured"] == by["baseline"]["measured"]
    assert by["decode-radix"]["flag_diff"] == [f"{host}/decode: added `--disaggregation-decode-enable-radix-cache`"]
    # every bench replayed the same agentic sessions: turns 2-3 reuse the shared prefix, read from the
    # engines' own cached_tokens_total / prompt_tokens_total
    for name in ("baseline", "unified", "decode-radix"):
        level = by[name]["bench"]["levels"][0]
        assert by[name]["bench"]["workload"]["kind"] == "agentic", by[name]["bench"].get("workload")
        assert level["prefix_cache"]["hit_rate"] > 0.3, (name, level["prefix_cache"])
    assert len({json.dumps(by[n]["bench"]["workload"], sort_keys=True) for n in ("baseline", "unified", "decode-radix")}) == 1
    assert any("experimental" in w for w in by["decode-radix"]["warnings"]), by["decode-radix"]["warnings"]
    report = (tmp_path / "tune" / "lab-one-node.md").read_text()
    assert "experimental" in report and "engine added" in report
    failed = by["torch-compile"]
    assert (failed["verdict"], failed["failed_gate"]) == ("fail", "correctness"), failed.get("reason")
    # the short answers held (below position 2,000); the long prompt's top-1 did not, and the reason says by how much
    drifted = failed["answer_gate"]["parts"]["forced"]["rows"]
    assert drifted[0]["top1_agreement"] == 1.0 and drifted[-1]["top1_agreement"] < 0.97, drifted
    assert f"{drifted[-1]['prompt_tokens']} tokens: top-1 agreement" in failed["reason"], failed["reason"]
    assert failed["releases_after"][host] == failed["releases_before"][host], failed
    assert any("back on release" in line for line in failed["rollback"]), failed["rollback"]
    assert 0 < failed["timings"]["rollback_outage_s"] < 120, failed["timings"]
    end = records[-1]
    assert end["kind"] == "end" and end["candidate"] == "baseline", end
    assert current_release(lab, host) == end["releases_after"][host]
    assert "downtime" in done.stdout
    serves(box)


# ---------------------------------------------------------------- unified engines behind the router

UNIFIED_ENGINES = "[{'name': 'main', 'role': 'unified', 'gpus': [0, 1, 2, 3], 'port': 30000}]"


def test_one_unified_box_rolls_in_downtime_mode_with_quick_errors_only_and_restores_a_broken_change(lab, box, tmp_path):
    """The 2-GPU box's shape (inventories/a6000.py): one unified engine behind the router. The
    router's worker is re-added as `regular` (smg answers 400 to `unified`)."""
    host = box["router"]
    unified = one_node_inventory(tmp_path, "unified", f"_node['pdkit_node']['engines'] = {UNIFIED_ENGINES}")
    changed = one_node_inventory(tmp_path, "unified_ctx", f"_node['pdkit_node']['engines'] = {UNIFIED_ENGINES}\n"
                                                          "_cluster['tuning']['all']['context_length'] = 4096")
    deploy(str(unified))
    plan = plan_of(unified)
    addr = plan["addr"][host]
    workers = router_workers(plan)
    assert {w["worker_type"] for w in workers.values()} == {"regular"} and f"http://{addr}:30000" in workers, workers
    refused = pdkit("roll", str(changed))
    assert refused.returncode == 2 and "has no regular worker" in refused.stderr, refused.stderr
    proc, counts = roll_under_load(tmp_path, plan, 4, str(changed), "--allow-downtime")
    assert proc.returncode == 0, f"roll failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    print(f"one-node unified downtime roll under C=4: {json.dumps({k: v for k, v in counts.items() if k != 'errors'})}")
    # smg in regular mode answers 404 model_not_found once no worker is listed: the roll holds the
    # worker draining (503 + Retry-After) until the engine is back; a request that meets the moment
    # between its leaving the list and the re-add may get 404, one per client thread at most
    assert counts["failures"].get("status 503", 0) > 0 and set(counts["failures"]) <= {"status 503", "status 404"}, counts
    assert counts["failures"].get("status 404", 0) <= 4, counts
    assert counts["slowest_failure_s"] < QUICK_FAILURE_S and counts["slowest_ok_s"] < QUICK_FAILURE_S, counts
    assert "service outage" in proc.stdout, proc.stdout
    workers = router_workers(plan)
    assert workers[f"http://{addr}:30000"]["worker_type"] == "regular" and workers[f"http://{addr}:30000"]["is_healthy"], workers
    info = requests.get(f"http://{addr}:30000/server_info", timeout=10).json()
    assert info["context_length"] == 4096, info.get("context_length")

    # a fault: a change the unified engine cannot start with is restored byte for byte
    rolled = plan_of(changed)
    before = current_release(lab, host)
    broken = one_node_inventory(tmp_path, "unified_crash", f"_node['pdkit_node']['engines'] = {UNIFIED_ENGINES}\n"
                                                           "_cluster['tuning']['all']['context_length'] = 4096\n"
                                                           "_node['pdkit_node']['engines'][0]['env'] = {'PDKIT_SIM_TRANSFER_FAIL_RATE': '2'}")
    proc = pdkit("roll", str(broken), "--allow-downtime")
    assert proc.returncode == 1 and f"stopped: {host}: gate 'apply' failed" in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert current_release(lab, host) == before
    assert file_sums(lab, host, sorted(rolled["files"][host])) == rolled["files"][host]
    workers = router_workers(plan)
    assert workers[f"http://{addr}:30000"]["worker_type"] == "regular" and workers[f"http://{addr}:30000"]["is_healthy"], workers
    r = requests.post(f"http://{addr}:8000/v1/completions", json={"model": plan["model"], "prompt": "unified again", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text


def test_unified_engines_on_every_node_roll_one_at_a_time_without_a_failed_request(lab, box, tmp_path):
    """Several nodes of unified engines behind one router in regular mode: no downtime needed."""
    from tests.lab.test_roll import derived_inventory

    engines = UNIFIED_ENGINES
    body = f"for _n, _d in gpu_nodes:\n    _d['pdkit_node']['engines'] = {engines}\n"
    unified = derived_inventory(tmp_path, "lab_unified", body)
    changed = derived_inventory(tmp_path, "lab_unified_steps", body + "_cluster['tuning']['all']['context_length'] = 4096\n")
    deploy(str(unified))
    plan = plan_of(unified)
    workers = router_workers(plan)
    assert len(workers) == len(plan["gpu"]) and {w["worker_type"] for w in workers.values()} == {"regular"}, workers
    wait_router_steady(plan)
    load = Load(tmp_path, plan, concurrency=8)
    try:
        load.wait_flowing(at_least=16)
        proc = pdkit("roll", str(changed))
        counts = load.stop()
    finally:
        if load.proc.poll() is None:
            load.proc.kill()
    assert proc.returncode == 0, f"roll failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    assert "downtime" not in proc.stdout, proc.stdout
    assert counts["failed"] == 0, counts
    new = plan_of(changed)
    for host in plan["gpu"]:
        assert current_release(lab, host).endswith(new["release"][host][:12]), host
    assert all(w["is_healthy"] and w["worker_type"] == "regular" for w in router_workers(plan).values())
