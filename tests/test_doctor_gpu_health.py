"""Doctor's gpu_health row (issue 47 item 4): the health of each GPU an engine uses, as the node's
pdkit-exporter last read it with the preflight's probe."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from pdkit.agent.exporter.collector import PdkitCollector
from pdkit.agent.exporter.config import parse_config
from pdkit.agent.exporter.gpuhealth import GpuProbe
from pdkit.agent.exporter.system import ProcessInspector, SystemdPids
from pdkit.doctor.checks import evaluate
from pdkit.doctor.checks_engine import check_gpu_health
from pdkit.doctor.collection import engine_plans
from pdkit.doctor.model import FAIL, INFO, PASS, WARN, EngineObservation
from pdkit.doctor.observe import exporter_views
from pdkit.doctor.report import exit_code
from pdkit.upstream.metricnames import EXPORTER_GPU_PROBE_ERROR, EXPORTER_GPU_WEDGED
from tests.exporter.support import FakeSystemctl, exposition
from tests.test_doctor import _scenario
from tests.test_monitoring import _load_example

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "topology"
LABELS = 'node="gpu01",engine="decode",role="decode"'


def gpu_obs(page: str | None, gpus: tuple[int, ...] = (2, 3)) -> EngineObservation:
    """The lab capture's decode, planned on GPUS of a node whose exporter reads GPU health, with the exporter
    page PAGE (None: unreadable)."""
    obs = _scenario("lab_base")[0][1]
    obs.plan = replace(obs.plan, gpus=gpus, gpu_health=True)
    if page is None:
        obs.exporter, obs.exporter_error = None, "Connection refused"
    else:
        obs.exporter = exporter_views(page).get("decode")
    return obs


def series(gpu: int, wedged: int, seen: str = "") -> str:
    return f'{EXPORTER_GPU_WEDGED}{{{LABELS},gpu="{gpu}",bdf="0000:{gpu + 3:02x}:00.0",seen="{seen}"}} {wedged}.0\n'


PROBE_OK = f'{EXPORTER_GPU_PROBE_ERROR}{{node="gpu01",why=""}} 0.0\n'


def test_a_wedged_gpu_fails_naming_the_gpu_what_was_seen_and_the_reset():
    page = series(2, 1, "Xid 79 at 10233 s after boot (GPU has fallen off the bus)") + series(3, 0) + PROBE_OK
    row = check_gpu_health(gpu_obs(page))
    assert row.status == FAIL and row.check == "gpu_health" and row.target == "decode"
    assert "GPU 2 (0000:05:00.0) is wedged: Xid 79" in row.reason and "GPU 3" not in row.reason
    assert "`nvidia-smi -r -i 2`" in row.hint and "reboot" in row.hint and "drain lab-gpu1" in row.hint
    assert "`pdkit roll` refuses" in row.hint


def test_all_gpus_healthy_pass():
    row = check_gpu_health(gpu_obs(series(2, 0) + series(3, 0) + PROBE_OK))
    assert row.status == PASS and "GPU 2, 3 healthy" in row.reason and row.hint == ""


def test_only_the_gpus_the_plan_gives_the_engine_are_judged():
    page = series(2, 1, "Xid 79") + series(3, 0) + PROBE_OK
    assert check_gpu_health(gpu_obs(page, gpus=(3,))).status == PASS
    assert check_gpu_health(gpu_obs(page, gpus=(0,))).status == INFO  # nothing published for GPU 0


def test_a_probe_that_could_not_tell_warns_with_why():
    page = (series(2, 0) + series(3, 0)
            + f'{EXPORTER_GPU_PROBE_ERROR}{{node="gpu01",why="the GPU probe did not finish in 150 s"}} 1.0\n')
    row = check_gpu_health(gpu_obs(page))
    assert row.status == WARN and "could not tell (the GPU probe did not finish in 150 s)" in row.reason
    assert "nvidia-smi -q" in row.hint


def test_a_wedged_gpu_fails_even_when_the_probe_is_stale_now():
    page = series(2, 1, "retired pages pending") + f'{EXPORTER_GPU_PROBE_ERROR}{{node="gpu01",why="hung"}} 1.0\n'
    assert check_gpu_health(gpu_obs(page)).status == FAIL


def test_an_exporter_that_publishes_no_gpu_health_is_info_and_an_unreadable_one_warns():
    older = check_gpu_health(gpu_obs(f'pdkit_engine_env_present{{{LABELS}}} 1.0\n'))
    assert older.status == INFO and "publishes no GPU health" in older.reason
    gone = check_gpu_health(gpu_obs(None))
    assert gone.status == WARN and "not measurable" in gone.reason and "Connection refused" in gone.reason


def test_a_gpu_the_probe_does_not_find_warns():
    row = check_gpu_health(gpu_obs(series(2, 0) + PROBE_OK))
    assert row.status == WARN and "does not find GPU 3" in row.reason


def test_evaluate_gives_the_row_after_reachable_where_the_exporter_reads_gpus_and_a_wedged_gpu_fails_doctor():
    engines, routers = _scenario("lab_base")
    for obs in engines:
        obs.plan = replace(obs.plan, gpus=(0,) if obs.plan.role == "prefill" else (1,), gpu_health=True)
        obs.exporter = exporter_views(series(0, 0).replace('engine="decode",role="decode"',
                                                           'engine="prefill",role="prefill"')
                                      + series(1, 1, "Xid 48") + PROBE_OK).get(obs.plan.engine)
    results = evaluate(engines, routers, cluster_host="lab-gpu1")
    rows = {(r.target, r.check): r.status for r in results if r.check == "gpu_health"}
    assert rows == {("prefill", "gpu_health"): PASS, ("decode", "gpu_health"): FAIL}
    checks = [r.check for r in results if r.target == "decode"]
    assert checks[:2] == ["reachable", "gpu_health"]
    assert exit_code(results) == 1
    # the lab's sim engines on `gpu: none` hosts: no row at all (the existing plans say gpu_health False)
    assert not [r for r in evaluate(*_scenario("lab_base"), cluster_host="lab-gpu1") if r.check == "gpu_health"]


def test_a_rank_above_0_gets_the_row_of_its_own_node():
    obs = gpu_obs(series(2, 1, "Xid 79") + series(3, 0) + PROBE_OK)
    obs.plan = replace(obs.plan, rank=1, nnodes=2, head="gpu00")
    results = evaluate([obs], [], cluster_host="gpu00")
    assert [(r.check, r.status) for r in results if r.check == "gpu_health"] == [("gpu_health", FAIL)]


def test_doctor_plans_gpu_health_on_nvidia_nodes_with_the_engine_gpus_only():
    cluster = engine_plans(_load_example("cluster"))
    assert cluster and all(p.gpu_health and p.gpus for p in cluster)
    assert not any(p.gpu_health for p in engine_plans(_load_example("lab")))


def test_doctor_reads_the_real_exporter_page_of_a_wedged_fixture():
    """The exporter's own exposition (probe answer: tests/fixtures/topology/wedged-gpus.json) through
    doctor's parser and row."""
    probe = GpuProbe(run=lambda: json.loads((FIXTURES / "wedged-gpus.json").read_text()))
    cfg = parse_config({"node": "gpu01", "gpu_health": True, "timeout_s": 0.1,
                        "journal": {"enabled": False, "timeout_s": 0.1},
                        "engines": [{"name": "decode", "role": "decode", "url": "http://127.0.0.1:9", "argv": [],
                                     "unit": "pdkit-engine-decode.service", "gpus": [4, 5]}]})
    collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl({}))), gpu_probe=probe)
    try:
        deadline = time.monotonic() + 10
        while probe.future is not None and not probe.future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        page = exposition(collector)
    finally:
        collector.close()
    row = check_gpu_health(gpu_obs(page, gpus=(4, 5)))
    assert row.status == FAIL and "GPU 5 (0000:84:00.0) is wedged: row remapping pending" in row.reason
    assert "GPU 4" not in row.reason and "`nvidia-smi -r -i 5`" in row.hint
