"""pdkit-exporter's GPU health (issue 47 item 4): the preflight's probe run in the background, judged as
`pdkit roll` judges it, published per engine GPU; a probe that hangs never holds a scrape."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from pdkit.agent.exporter.collector import PdkitCollector
from pdkit.agent.exporter.config import ConfigError, parse_config
from pdkit.agent.exporter.gpuhealth import PROBE_EVERY_S, GpuProbe, judge, probe_argv, run_probe
from pdkit.agent.exporter.system import ProcessInspector, SystemdPids
from pdkit.upstream.metricnames import EXPORTER_GPU_PROBE_ERROR, EXPORTER_GPU_WEDGED

from .support import FakeSystemctl, exposition, label_sets, samples, value

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


# ---- judging one probe answer (pure) ------------------------------------------------------------

def test_a_wedged_gpu_of_the_engine_is_named_with_what_was_seen_and_its_healthy_gpus_are_0():
    states, cannot_tell = judge(fixture("wedged-gpus"), [2, 3, 5], engines_serving=True)
    assert cannot_tell is None
    by_gpu = {s.gpu: s for s in states}
    assert sorted(by_gpu) == [2, 3, 5]
    assert by_gpu[2].wedged and by_gpu[2].bdf == "0000:05:00.0"
    assert "does not list it" in by_gpu[2].seen and "Xid 79" in by_gpu[2].seen
    assert by_gpu[5].wedged and "Remapped Rows Pending" in by_gpu[5].seen
    assert not by_gpu[3].wedged and by_gpu[3].seen == ""


def test_a_busy_gpu_with_no_process_counts_only_while_the_engines_are_not_serving():
    # GPU 6 of the fixture: busy with no process listed (a hung P2P collective, or a serving engine in
    # another PID namespace)
    serving, _ = judge(fixture("wedged-gpus"), [6], engines_serving=True)
    stopped, _ = judge(fixture("wedged-gpus"), [6], engines_serving=False)
    assert [s.wedged for s in serving] == [False]
    assert [s.wedged for s in stopped] == [True] and "no process" in stopped[0].seen


def test_a_healthy_box_gives_0_for_every_gpu_the_engine_uses():
    states, cannot_tell = judge(fixture("numa-halves-own-root"), range(8), engines_serving=True)
    assert cannot_tell is None
    assert [(s.gpu, s.wedged) for s in states] == [(g, False) for g in range(8)]


def test_without_nvidia_smi_q_no_gpu_is_called_healthy_but_a_kernel_log_xid_still_counts():
    probe = fixture("wedged-gpus")
    probe["nvidia_smi_q"] = None
    states, cannot_tell = judge(probe, [0, 1, 2], engines_serving=True)
    assert cannot_tell is not None and cannot_tell.startswith("nvidia-smi -q not read")
    # GPU 2's Xid 79 and GPU 1's Xid 48 (which the driver's Recovery Action "None" clears, when nvidia-smi -q is
    # read); GPU 0: unknown, no series
    assert [(s.gpu, s.wedged) for s in states] == [(1, True), (2, True)]


def test_a_probe_error_is_said_and_judges_nothing():
    assert judge({"error": "the GPU probe did not finish in 150 s"}, [0], engines_serving=True) == (
        [], "the GPU probe did not finish in 150 s")


# ---- running the probe --------------------------------------------------------------------------

def test_the_exporter_runs_the_real_probe_file_and_reads_its_json(tmp_path, monkeypatch):
    # an empty fake root: no GPU, no nvidia-smi; the probe says what it could not read and still answers
    monkeypatch.setenv("PDKIT_TOPOLOGY_ROOT", str(tmp_path))
    probe = run_probe(probe_argv(), timeout_s=60)
    assert "error" not in probe and probe["format"] == 1 and probe["gpus"] == []
    assert judge(probe, [0], engines_serving=True)[1].startswith("nvidia-smi -q not read")


def test_a_hung_probe_is_killed_with_its_children_at_the_timeout(tmp_path):
    # a probe whose child (like a hung nvidia-smi) holds the output pipe open
    hang = tmp_path / "hang.py"
    hang.write_text("import subprocess, time\nsubprocess.Popen(['sleep', '60'])\ntime.sleep(60)\n")
    started = time.monotonic()
    got = run_probe([sys.executable, str(hang)], timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert got == {"error": "the GPU probe did not finish in 0.5 s (nvidia-smi hangs on a wedged GPU)"}


def test_a_probe_that_prints_no_json_or_does_not_start_is_an_error(tmp_path):
    got = run_probe([sys.executable, "-c", "import sys; print('Traceback: boom', file=sys.stderr); sys.exit(1)"])
    assert got["error"].startswith("the GPU probe printed no JSON (exit 1)") and "boom" in got["error"]
    assert run_probe([str(tmp_path / "missing")])["error"].startswith("the GPU probe did not start")


def test_the_probe_runs_at_most_once_a_minute_and_never_blocks_a_poll():
    now = [1000.0]
    runs = []
    probe = GpuProbe(run=lambda: runs.append(1) or fixture("numa-halves-own-root"), clock=lambda: now[0])
    try:
        probe.poll()
        wait_done(probe)
        last, stale = probe.poll()
        assert len(runs) == 1 and last is not None and last["format"] == 1 and stale is None
        now[0] += PROBE_EVERY_S - 1
        probe.poll()
        assert len(runs) == 1
        now[0] += 1
        probe.poll()
        wait_done(probe)
        assert len(runs) == 2
    finally:
        probe.close()


def wait_done(probe: GpuProbe) -> None:
    deadline = time.monotonic() + 10
    while probe.future is not None and not probe.future.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.future is None or probe.future.done()


# ---- the collector ------------------------------------------------------------------------------

def gpu_config(gpu_health: bool = True) -> dict:
    return {"node": "gpu01", "gpu_health": gpu_health, "timeout_s": 0.1,
            "journal": {"enabled": False, "timeout_s": 0.1},
            "engines": [
                {"name": "prefill", "role": "prefill", "url": "http://127.0.0.1:9", "argv": [],
                 "unit": "pdkit-engine-prefill.service", "gpus": [0, 1, 2, 3]},
                {"name": "decode", "role": "decode", "url": "http://127.0.0.1:9", "argv": [],
                 "unit": "pdkit-engine-decode.service", "gpus": [4, 5, 6, 7]},
            ]}


def collector_with(probe: GpuProbe, gpu_health: bool = True, pids: dict[str, int] | None = None) -> PdkitCollector:
    return PdkitCollector(parse_config(gpu_config(gpu_health)),
                          inspector=ProcessInspector(SystemdPids(FakeSystemctl(pids or {}))), gpu_probe=probe)


def test_the_collector_publishes_each_engine_gpu_from_the_last_probe_answer():
    probe = GpuProbe(run=lambda: fixture("wedged-gpus"))
    collector = collector_with(probe)  # no engine process: the engines are not serving
    try:
        wait_done(probe)
        found = samples(exposition(collector))
        wedged = {(s["engine"], s["gpu"]): s for s in label_sets(found, EXPORTER_GPU_WEDGED)}
        assert sorted(wedged) == [("decode", str(g)) for g in range(4, 8)] + [("prefill", str(g)) for g in range(4)]
        for engine, gpus in (("prefill", range(4)), ("decode", range(4, 8))):
            for g in gpus:
                got = value(found, EXPORTER_GPU_WEDGED, engine=engine, gpu=str(g))
                assert got == (1.0 if g in (2, 5, 6, 7) else 0.0), (engine, g)
        gpu2 = wedged[("prefill", "2")]
        assert gpu2["node"] == "gpu01" and gpu2["role"] == "prefill" and gpu2["bdf"] == "0000:05:00.0"
        assert "Xid 79" in gpu2["seen"] and wedged[("prefill", "3")]["seen"] == ""
        assert value(found, EXPORTER_GPU_PROBE_ERROR, node="gpu01") == 0
    finally:
        collector.close()


def test_while_an_engine_process_runs_a_busy_gpu_with_no_process_is_not_wedged():
    probe = GpuProbe(run=lambda: fixture("wedged-gpus"))
    collector = collector_with(probe, pids={"pdkit-engine-decode.service": os.getpid()})
    try:
        wait_done(probe)
        found = samples(exposition(collector))
        assert value(found, EXPORTER_GPU_WEDGED, engine="decode", gpu="6") == 0
        assert value(found, EXPORTER_GPU_WEDGED, engine="decode", gpu="7") == 1  # its Recovery Action stands
    finally:
        collector.close()


def test_a_hung_probe_never_holds_a_scrape_and_is_published_as_an_error():
    release = threading.Event()
    answers = [fixture("numa-halves-own-root")]

    def run() -> dict:
        if not answers:
            release.wait(30)  # nvidia-smi hung on a wedged GPU
            return {"error": "released"}
        return answers.pop()

    now = [0.0]
    probe = GpuProbe(run=run, clock=lambda: now[0], timeout_s=1.0)
    collector = collector_with(probe)
    try:
        wait_done(probe)
        assert value(samples(exposition(collector)), EXPORTER_GPU_PROBE_ERROR) == 0
        now[0] += PROBE_EVERY_S  # the next probe starts, and hangs
        exposition(collector)
        now[0] += 30
        started = time.monotonic()
        found = samples(exposition(collector))
        assert time.monotonic() - started < 2, "a scrape waited for the hung probe"
        [error] = label_sets(found, EXPORTER_GPU_PROBE_ERROR)
        assert value(found, EXPORTER_GPU_PROBE_ERROR) == 1 and "has not ended" in error["why"]
        # the last answer still stands
        assert value(found, EXPORTER_GPU_WEDGED, engine="prefill", gpu="0") == 0
    finally:
        release.set()
        collector.close()


def test_a_probe_that_timed_out_is_an_error_with_no_gpu_called_healthy():
    probe = GpuProbe(run=lambda: {"error": "the GPU probe did not finish in 150 s (nvidia-smi hangs on a wedged GPU)"})
    collector = collector_with(probe)
    try:
        wait_done(probe)
        found = samples(exposition(collector))
        assert label_sets(found, EXPORTER_GPU_WEDGED) == []
        [error] = label_sets(found, EXPORTER_GPU_PROBE_ERROR)
        assert value(found, EXPORTER_GPU_PROBE_ERROR) == 1 and "did not finish in 150 s" in error["why"]
    finally:
        collector.close()


def test_a_node_without_gpu_health_runs_no_probe_and_publishes_nothing_of_it():
    runs = []
    probe = GpuProbe(run=lambda: runs.append(1) or fixture("wedged-gpus"))
    collector = collector_with(probe, gpu_health=False)
    try:
        found = samples(exposition(collector))
        assert runs == []
        assert label_sets(found, EXPORTER_GPU_WEDGED) == [] and label_sets(found, EXPORTER_GPU_PROBE_ERROR) == []
    finally:
        collector.close()
        probe.close()


def test_before_the_first_answer_nothing_is_published():
    release = threading.Event()
    probe = GpuProbe(run=lambda: release.wait(30) and fixture("wedged-gpus"))
    collector = collector_with(probe)
    try:
        found = samples(exposition(collector))
        assert label_sets(found, EXPORTER_GPU_WEDGED) == [] and label_sets(found, EXPORTER_GPU_PROBE_ERROR) == []
    finally:
        release.set()
        collector.close()


# ---- the config -------------------------------------------------------------------------------

def test_the_config_reads_gpu_health_and_each_engine_gpus():
    cfg = parse_config(gpu_config())
    assert cfg.gpu_health is True and [e.gpus for e in cfg.engines] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    bare = parse_config({"node": "n", "engines": [{"name": "e", "role": "decode", "url": "http://h:1", "argv": []}]})
    assert bare.gpu_health is False and bare.engines[0].gpus == ()
    with pytest.raises(ConfigError, match="gpu_health"):
        parse_config({**gpu_config(), "gpu_health": "yes"})
    bad = gpu_config()
    bad["engines"][0]["gpus"] = [0, -1]
    with pytest.raises(ConfigError, match=r"engines\[0\]\.gpus\[1\]"):
        parse_config(bad)


@pytest.mark.parametrize("example, probed", [("cluster", True), ("lab", False)])
def test_the_plan_renders_gpu_health_for_nvidia_nodes_only_and_each_engine_gpus(example, probed):
    from pdkit.render.plan import exporter_config_text, plan_host
    from tests.test_monitoring import _load_example

    spec = _load_example(example)
    nodes = [h for h in spec.hosts if h.node is not None and spec.placements(h)]
    assert nodes
    for host in nodes:
        cfg = parse_config(json.loads(exporter_config_text(spec, host)))
        assert cfg.gpu_health is probed, host.name
        assert {e.name: e.gpus for e in cfg.engines} == {p.engine.name: tuple(p.engine.gpus)
                                                         for p in spec.placements(host)}
        # the probe's nvidia-smi needs the NVIDIA devices, which PrivateDevices hides
        unit = plan_host(spec, host).file("/etc/systemd/system/pdkit-exporter.service").content
        assert ("DeviceAllow=char-nvidia* rw" in unit) is probed and ("PrivateDevices=yes" in unit) is not probed
