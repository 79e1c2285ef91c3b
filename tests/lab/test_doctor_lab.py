"""`pdkit doctor` on the lab: the deployed base inventory passes; a change that turns decode CUDA
graphs off on ONE engine makes doctor FAIL exactly that engine's CUDA-graph check (with the spec
hint), and a bench before and after shows the drop through `pdkit compare`. The module puts the
base configuration back at the end: other lab modules share the same lab.

The change is rolled out the way a user would, `pdkit roll <derived inventory> --limit <host>`
(drain, apply, gates, smoke requests); the derived inventory is inventories/lab.py's own data with
that one engine's `tuning.cuda_graph` set to false. The base is put back by a full converge.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdkit.agent.health import http_request, router_worker_health
from tests.conftest import REPO
from tests.lab.test_deploy import INVENTORY, failed_hosts, json_from_child, lab_spec, run_pyinfra, wait_circuits_closed

pytestmark = pytest.mark.lab

PDKIT = str(Path(sys.executable).parent / "pdkit")
# the engine whose decode CUDA graphs the change turns off
ENGINE = "decode"
BENCH = ["--concurrency", "16", "--input-len", "128", "--output-len", "32", "--requests", "48", "--warmup", "4",
         "--no-ssh", "--no-plot", "--quiet"]

DERIVED = '''"""inventories/lab.py with decode CUDA graphs off on {host}/{engine} (written by tests/lab/test_doctor_lab.py)."""
import copy as _copy
import importlib.util as _util

_spec = _util.spec_from_file_location("_pdkit_lab_base", {base!r})
_base = _util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

gpu_nodes = _copy.deepcopy(_base.gpu_nodes)
monitoring = _copy.deepcopy(_base.monitoring)
all = _copy.deepcopy(_base.all)  # noqa: A001 - pyinfra's group name
for _name, _data in gpu_nodes:
    if _name == {host!r}:
        for _engine in _data["pdkit_node"]["engines"]:
            if _engine["name"] == {engine!r}:
                _engine["tuning"] = {{**_engine.get("tuning", {{}}), "cuda_graph": False}}
'''


def write_graphs_off_inventory(directory: Path, host: str, engine: str) -> Path:
    """A derived inventory: the lab's, with decode CUDA graphs off on one engine (group_data alongside)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "inventories" / "group_data", directory / "group_data", dirs_exist_ok=True)
    path = directory / "lab_graphs_off.py"
    path.write_text(DERIVED.format(base=str(REPO / INVENTORY), host=host, engine=engine))
    return path


def pdkit(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PDKIT, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def doctor(inventory: str | Path, *extra: str) -> tuple[int, dict]:
    proc = pdkit("doctor", str(inventory), "--json", *extra, timeout=180)
    assert proc.stdout.strip(), f"doctor printed no JSON (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.returncode, json.loads(proc.stdout)


def failures(report: dict) -> list[tuple[str, str, str]]:
    return [(c["host"], c["target"], c["check"]) for c in report["checks"] if c["status"] == "FAIL"]


def lab_layout() -> dict:
    # load in a child process: importing pyinfra's CLI gevent-patches the importing process
    code = (
        "import json; from pdkit.inventory.loader import load; from pdkit.doctor.collection import router_urls; "
        f"spec = load({INVENTORY!r}); "
        "print(json.dumps({'gpu': [h.name for h in spec.gpu_hosts], 'routers': router_urls(spec)}))"
    )
    return json_from_child(code)


def wait_router_settled(layout: dict, timeout: float = 90) -> None:
    """Every planned worker healthy in each router's list (a restarted engine is re-checked every 10 s)."""
    deadline = time.monotonic() + timeout
    for _host, url, workers in layout["routers"]:
        while True:
            status, body = http_request(f"{url}/workers", timeout=5)
            health = router_worker_health(body) if status == 200 else {}
            if all(health.get(w.rstrip("/")) for w in workers):
                break
            assert time.monotonic() < deadline, f"router {url} did not list every worker healthy: {health}"
            time.sleep(2)


@pytest.fixture(scope="module")
def base_deployed(lab):
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"converge failed (rc {rc}):\n{err[-3000:]}"
    layout = lab_layout()
    wait_router_settled(layout)
    # an earlier module (test_deploy kills engines) may have left breakers open: the roll below
    # would find no usable worker to drain to, and doctor's probes would miss engines
    wait_circuits_closed(lab_spec())
    yield layout
    # put the base configuration back whatever happened above (other modules share this lab)
    rc, results, err = run_pyinfra()
    assert rc == 0 and not failed_hosts(results), f"restoring the base configuration failed (rc {rc}):\n{err[-3000:]}"


def test_doctor_passes_on_the_deployed_lab(base_deployed, tmp_path):
    rc, report = doctor(INVENTORY, "--runs", str(tmp_path / "none.jsonl"))
    assert rc == 0 and report["ok"], f"doctor failed on the base lab: {failures(report)}"
    assert failures(report) == []
    by = {(c["host"], c["target"], c["check"]): c for c in report["checks"]}
    for host in base_deployed["gpu"]:
        assert by[(host, ENGINE, "decode_cuda_graph")]["status"] == "PASS", by[(host, ENGINE, "decode_cuda_graph")]
        for engine in ("prefill", "decode"):
            for check in ("reachable", "flags", "context_length", "process_env", "version", "queues"):
                assert by[(host, engine, check)]["status"] == "PASS", by[(host, engine, check)]
    assert {c["check"] for c in report["checks"] if c["target"] == "router"} == {"router_workers"}
    assert all(c["status"] == "PASS" for c in report["checks"] if c["target"] == "router")


def test_graphs_off_on_one_engine_fails_exactly_that_check_and_the_bench_shows_the_drop(base_deployed, tmp_path):
    host = base_deployed["gpu"][0]
    bench_dir = tmp_path / "bench"
    runs = bench_dir / "runs.jsonl"

    # the cluster through the router: doctor's throughput baseline below
    before = pdkit("bench", INVENTORY, *BENCH, "--label", "graphs-on", "--out", str(bench_dir))
    assert before.returncode == 0, before.stderr[-2000:]
    # the changed host's own PD pair, before and after (bench --limit). Through the router smg's
    # power_of_two decode policy moves load off the slow engine: one slow decode of three moved the
    # cluster's C=16 576 -> 549 tok/s in a fresh-clone run (the assertion below failed on it)
    pair_before = pdkit("bench", INVENTORY, *BENCH, "--limit", host, "--label", "pair-graphs-on", "--out", str(bench_dir))
    assert pair_before.returncode == 0, pair_before.stderr[-2000:]

    derived = write_graphs_off_inventory(tmp_path / "inv", host, ENGINE)
    rolled = pdkit("roll", str(derived), "--limit", host, timeout=900)
    assert rolled.returncode == 0, f"rolling graphs-off to {host} failed (rc {rolled.returncode}):\n{rolled.stderr[-3000:]}"
    wait_router_settled(base_deployed)

    rc, report = doctor(derived, "--runs", str(runs))
    assert rc == 1 and not report["ok"]
    assert failures(report) == [(host, ENGINE, "decode_cuda_graph")], report["checks"]
    failed = next(c for c in report["checks"] if c["status"] == "FAIL")
    assert "off" in failed["reason"] and "tuning.cuda_graph: true" in failed["hint"], failed
    # the other engines' graphs still pass; the throughput check names the recorded run but measured nothing
    others = [c for c in report["checks"] if c["check"] == "decode_cuda_graph" and c["host"] != host]
    assert others and all(c["status"] == "PASS" for c in others), others
    throughput = next(c for c in report["checks"] if c["check"] == "throughput_c16")
    assert throughput["status"] == "WARN" and "graphs-on" in throughput["reason"], throughput

    after = pdkit("bench", str(derived), *BENCH, "--limit", host, "--label", "pair-graphs-off", "--out", str(bench_dir))
    assert after.returncode == 0, after.stderr[-2000:]
    compared = pdkit("compare", "pair-graphs-on", "pair-graphs-off", "--runs", str(runs))
    assert compared.returncode == 0, compared.stderr
    print(compared.stdout)
    recorded = {r["label"]: r for r in (json.loads(line) for line in runs.read_text().splitlines())}
    pair = f"{host}/prefill+{host}/{ENGINE}"
    for label in ("pair-graphs-on", "pair-graphs-off"):
        assert recorded[label]["env"]["measured"] == {"via": "engines", "hosts": [host], "engines": [f"{host}/prefill", f"{host}/{ENGINE}"],
                                                      "routes": [pair]}, recorded[label]["env"]["measured"]
    assert recorded["graphs-on"]["env"]["measured"]["via"] == "router"
    # each level's KV hand-offs from the prefills' own /metrics (pdkit.spec.kvcost): through the router
    # every prefill it fronts, with --limit the pair's; one per request, 128 prompt tokens x the
    # sim's 65,536 bytes each = 8 MiB (SGLang's "MB")
    for label, prefills in (("graphs-on", None), ("pair-graphs-on", [f"{host}/prefill"])):
        kv = recorded[label]["levels"][0]["kv"]
        assert kv["transfers"] >= 48 and "unread" not in kv, (label, kv)
        assert prefills is None or kv["prefills"] == prefills, (label, kv)
        assert kv["mb_per_request"] == pytest.approx(8.0, rel=0.01), (label, kv)
        assert kv["effective_gb_s"] > 0 and 0 < kv["ttft_share"] < 1, (label, kv)
    assert "KV effective GB/s" in before.stdout
    on, off = (recorded[label]["levels"][0] for label in ("pair-graphs-on", "pair-graphs-off"))
    # the sim's decode step is 3x slower without graphs (no_cuda_graph_factor): the pair's own
    # TPOT follows it, and its tok/s falls by well over the 10% doctor's tolerance
    assert off["tpot_ms"]["p50"] > 2 * on["tpot_ms"]["p50"], (on["tpot_ms"], off["tpot_ms"])
    assert f"to {pair} directly (not through the router)" in after.stdout, after.stdout[:600]
    assert off["output_tok_s"] < 0.6 * on["output_tok_s"], f"graphs off did not lower the pair's C=16 throughput: {on['output_tok_s']} -> {off['output_tok_s']}"
    assert "output tok/s" in compared.stdout

    # doctor's own C=16 bench (--bench) against the graphs-on record fails its throughput check too
    baseline = tmp_path / "graphs_on.jsonl"
    baseline.write_text(json.dumps(recorded["graphs-on"]) + "\n")
    # doctor's own C=16 bench (--bench): the slow engine is named by its own decode speed (its
    # inter-token latency against its peers'). The cluster's tok/s through the router is not a
    # per-engine signal: the router spreads load, so one slow engine of three moved it 638 -> 630
    # in a fresh-clone run (issue #18 item 10); that row only has to agree with its own figures.
    rc, report = doctor(derived, "--runs", str(baseline), "--bench")
    cluster = next(c for c in report["checks"] if c["check"] == "throughput_c16")
    print(cluster)
    assert rc == 1
    speed = {(c["host"], c["target"]): c for c in report["checks"] if c["check"] == "decode_speed_c16"}
    assert speed[(host, ENGINE)]["status"] == "FAIL", speed
    assert all(c["status"] == "PASS" for k, c in speed.items() if k != (host, ENGINE)), speed
    expected = {(host, ENGINE, "decode_cuda_graph"), (host, ENGINE, "decode_speed_c16")}
    router_row = (base_deployed["routers"][0][0], "cluster", "throughput_c16")
    assert expected <= set(failures(report)) <= expected | {router_row}, report["checks"]
    # measured this time, against the graphs-on record
    assert cluster["status"] in ("PASS", "FAIL") and re.search(r"C=16 \d+ tok/s vs \d+ recorded", cluster["reason"]), cluster


def test_cold_jit_caches_start_one_engine_at_a_time_and_the_gate_makes_them_warm(lab, base_deployed, tmp_path):
    """Issue 45 item 2 on a lab host's sim engines: with both warm stamps removed, the deploy's restart
    command (pdkit.render.jitplan.restart_command -> python -m pdkit.jitwarm restart) stops the decode, starts the
    prefill, waits for it to serve, then starts the decode; the deploy's gates write the stamps again, and
    doctor's jit_caches row passes for both."""
    from tests.lab.test_deploy import ssh

    host = base_deployed["gpu"][0]
    code = (
        "import json; from pdkit.agent import gates; from pdkit.render import flags, jitplan; from pdkit.inventory.loader import load; "
        "from pdkit.render.plan import plan_cluster; "
        f"spec = load({INVENTORY!r}); plan = plan_cluster(spec)[{host!r}]; "
        "engines = [s for s in plan.services if s.kind == 'engine']; "
        f"dirs = {{n: d for n, (d, _) in jitplan.engine_dirs(spec, {host!r}).items()}}; "
        "print(json.dumps({'restart': jitplan.restart_command(spec, " + repr(host) + ", engines), "
        "'gates': gates.command(flags.node_python(spec), [gates.gate_for(s) for s in engines]), "
        "'state': jitplan.state_command(spec, sorted(dirs.values())), 'dirs': dirs, "
        "'units': {s.engine: s.unit for s in engines}}))"
    )
    got = json_from_child(code)
    prefill, decode = got["units"]["prefill"], got["units"]["decode"]
    try:
        removed = ssh(lab, host, "rm -f " + " ".join(f"{d}/warm.json" for d in got["dirs"].values()))
        assert removed.returncode == 0, removed.stderr
        state = ssh(lab, host, got["state"])
        assert {r["state"] for r in json.loads(state.stdout.strip().splitlines()[-1])} == {"cold"}, state.stdout
        done = ssh(lab, host, got["restart"], timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"JIT caches cold for {prefill}, {decode}" in done.stdout and f"{prefill} serves after" in done.stdout, done.stdout
        starts = ssh(lab, host, f"systemctl show -p ExecMainStartTimestampMonotonic --value {prefill} {decode}")
        p_start, d_start = (int(v) for v in starts.stdout.split())
        assert d_start > p_start, starts.stdout  # the decode started once the prefill served
        gated = ssh(lab, host, got["gates"], timeout=900)
        assert gated.returncode == 0, gated.stdout + gated.stderr
        state = ssh(lab, host, got["state"])
        assert {r["state"] for r in json.loads(state.stdout.strip().splitlines()[-1])} == {"warm"}, state.stdout
    finally:
        wait_router_settled(base_deployed)
        wait_circuits_closed(lab_spec())
    _, report = doctor(INVENTORY, "--runs", str(tmp_path / "none.jsonl"))
    rows = {c["target"]: c for c in report["checks"] if c["host"] == host and c["check"] == "jit_caches"}
    assert {t: r["status"] for t, r in rows.items()} == {"prefill": "PASS", "decode": "PASS"}, rows
