"""The collector against live sim engines behind the real router (pdkit.sim.localstack).

The engines' units, journal and main PIDs are stood in for (no systemd here): systemctl answers
with the sims' real PIDs, so /proc/PID/environ and cmdline are the real processes'; the journal
is a FakeJournal fed with the sims' real log lines.
"""

from __future__ import annotations

import concurrent.futures as cf
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from pdkit.agent.exporter.collector import PdkitCollector, http_get
from pdkit.agent.exporter.config import parse_config
from pdkit.agent.exporter.logs import parse_batch_line
from pdkit.agent.exporter.metrics import decode_cuda_graph_ratio, parse_metrics
from pdkit.agent.exporter.system import JournalReader, ProcessInspector, SystemdPids
from pdkit.sim.localstack import MODEL, LocalPDStack, free_ports

from .support import FakeJournal, FakeSystemctl, exposition, label_sets, samples, value

ENV = {"NCCL_P2P_LEVEL": "PHB", "UCX_TLS": "cuda_ipc,cuda_copy,sm,self,tcp", "SGLANG_DISAGGREGATION_NIXL_BACKEND": "UCX"}
EXTRA = ["--tp-size", "2", "--cuda-graph-max-bs-decode", "4", "--page-size", "16", "--decode-log-interval", "3",
         "--disable-custom-all-reduce"]
UNITS = {"prefill": "pdkit-engine-prefill.service", "decode": "pdkit-engine-decode.service"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with LocalPDStack(tmp_path_factory.mktemp("stack"), sim_env={"PDKIT_SIM_STARTUP_DELAY_S": "0.2", **ENV},
                      sim_extra=EXTRA) as st:
        def one(i: int) -> int:
            body = {"model": MODEL, "prompt": "word " * (20 + i), "max_tokens": 24}
            return requests.post(f"{st.router_url}/v1/completions", json=body, timeout=30).status_code

        with cf.ThreadPoolExecutor(8) as pool:
            assert set(pool.map(one, range(12))) == {200}
        yield st


def planned_argv(proc) -> list[str]:
    return proc.argv[proc.argv.index("-m") + 2:]


def engines_config(stack, **changes) -> dict:
    engines = []
    for proc, port in ((stack.prefill, stack.prefill_port), (stack.decode, stack.decode_port)):
        engines.append({"name": proc.name, "role": proc.name, "url": f"http://127.0.0.1:{port}",
                        "unit": UNITS[proc.name], "sglang_version": "sim", "argv": planned_argv(proc),
                        "env": dict(ENV)})
    config = {"node": "gpu01", "cluster": "lab", "release": "r1", "engines": engines, "timeout_s": 2.0}
    for key, val in changes.items():
        config[key] = val
    return config


def make_collector(stack, config: dict, journal: FakeJournal | None = None) -> PdkitCollector:
    cfg = parse_config(config)
    pids = {UNITS["prefill"]: stack.prefill.pid, UNITS["decode"]: stack.decode.pid}
    if journal is None:
        journal = FakeJournal()
        for proc in (stack.prefill, stack.decode):
            for line in proc.log_path.read_text().splitlines():
                journal.add(UNITS[proc.name], line)
    units = [e.unit for e in cfg.engines if e.unit]
    return PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl(pids))),
                          journal=JournalReader(units, max_entries=1000, runner=journal))


def batch_lines(log: Path, kind: str) -> list[dict]:
    return [parse_batch_line(ln) for ln in log.read_text().splitlines() if f"{kind} batch" in ln]


def batches_during(log: Path, kind: str, before: int) -> list[dict]:
    """The batch lines the exporter may have seen last: the newest one before the scrape and any
    written during it (the router's own health checks keep the engines logging)."""
    return batch_lines(log, kind)[max(before - 1, 0):]


def test_a_scrape_of_live_engines(stack):
    collector = make_collector(stack, engines_config(stack))
    decode_before = len(batch_lines(stack.decode.log_path, "Decode"))
    prefill_before = len(batch_lines(stack.prefill.log_path, "Prefill"))
    try:
        text = exposition(collector)
    finally:
        collector.close()
    found = samples(text)
    for role in ("prefill", "decode"):
        lab = {"node": "gpu01", "engine": role, "role": role}
        assert value(found, "pdkit_engine_up", **lab) == 1
        assert value(found, "pdkit_engine_scrape_error", endpoint="metrics", **lab) == 0
        assert value(found, "pdkit_engine_flags_drift", **lab) == 0, text
        assert value(found, "pdkit_engine_flags_unverified", **lab) == 0
        assert value(found, "pdkit_engine_env_present", **lab) == 1
        assert value(found, "pdkit_engine_env_check_error", **lab) == 0
        assert label_sets(found, "pdkit_engine_info", **lab) == [{
            **lab, "cluster": "lab", "release": "r1", "sglang_version": "sim", "planned_sglang_version": "sim",
            "unit": UNITS[role], "model": MODEL}]
        direct = parse_metrics(requests.get(f"http://127.0.0.1:{getattr(stack, role + '_port')}/metrics").text)
        assert value(found, "pdkit_engine_prompt_tokens_total", **lab) == direct["prompt_tokens"] > 0
        assert value(found, "pdkit_engine_generation_tokens_total", **lab) == direct["generation_tokens"] > 0
        assert value(found, "pdkit_engine_running_requests", **lab) == direct["running_requests"]
        for queue in ("bootstrap", "inflight", "prealloc", "transfer"):
            assert value(found, "pdkit_engine_pd_queue_requests", queue=queue, **lab) == direct["pd_queues"][queue]
        for stage in ("bootstrap", "transfer"):
            assert value(found, "pdkit_engine_kv_transfer_failures_total", stage=stage, **lab) == 0
        passes = direct["cuda_graph_passes"]
        # a mode's series exists once a pass of that mode ran (a prefill has no decode passes: none either side)
        assert value(found, "pdkit_engine_forward_passes_total", phase="decode", cuda_graph="true", **lab) == \
            passes.get("decode_cuda_graph")

    dec = {"engine": "decode"}
    direct = parse_metrics(requests.get(f"http://127.0.0.1:{stack.decode_port}/metrics").text)
    assert value(found, "pdkit_decode_cuda_graph_ratio", **dec) == pytest.approx(
        decode_cuda_graph_ratio(direct["cuda_graph_passes"]))
    assert value(found, "pdkit_decode_cuda_graph_ratio", engine="prefill") is None  # never decodes

    # the last batch lines of the real logs
    seen = (
        value(found, "pdkit_decode_batch_gen_throughput_tokens_per_second", **dec),
        value(found, "pdkit_decode_batch_running_requests", **dec),
        value(found, "pdkit_decode_batch_queued_requests", **dec),
        value(found, "pdkit_decode_batch_cuda_graph", **dec),
    )
    candidates = [(d["gen_throughput"], d["running_requests"], d["queued_requests"], float(d["cuda_graph"]))
                  for d in batches_during(stack.decode.log_path, "Decode", decode_before)]
    assert seen in candidates, (seen, candidates)
    assert value(found, "pdkit_decode_batch_timestamp_seconds", **dec) == 1_800_000_000.0
    prefill_candidates = [p["input_throughput"] for p in batches_during(stack.prefill.log_path, "Prefill", prefill_before)]
    assert value(found, "pdkit_prefill_batch_input_throughput_tokens_per_second", engine="prefill") in prefill_candidates
    assert value(found, "pdkit_decode_batch_running_requests", engine="prefill") is None
    assert value(found, "pdkit_exporter_journal_error", node="gpu01") == 0


def test_drift_in_server_info_and_in_argv(stack):
    config = engines_config(stack)
    decode = config["engines"][1]
    # planned page size 32 while the engine runs 16: /server_info shows it
    i = decode["argv"].index("--page-size")
    decode["argv"][i + 1] = "32"
    # the engine runs --decode-log-interval 3 that the plan does not have: only its argv shows it
    i = decode["argv"].index("--decode-log-interval")
    del decode["argv"][i:i + 2]
    collector = make_collector(stack, config)
    try:
        found = samples(exposition(collector))
    finally:
        collector.close()
    assert value(found, "pdkit_engine_flags_drift", engine="decode") == 1
    assert value(found, "pdkit_engine_flags_drift", engine="prefill") == 0
    flags = {s["flag"] for s in label_sets(found, "pdkit_engine_flag_drift_info", engine="decode")}
    assert flags == {"--page-size", "--decode-log-interval"}
    # ignoring them clears the drift
    decode["drift_ignore"] = ["--page-size", "--decode-log-interval"]
    collector = make_collector(stack, config)
    try:
        assert value(samples(exposition(collector)), "pdkit_engine_flags_drift", engine="decode") == 0
    finally:
        collector.close()


def test_env_missing_or_different_in_the_process(stack):
    config = engines_config(stack)
    config["engines"][0]["env"].update({"NCCL_IB_DISABLE": "1", "UCX_TLS": "rc", "PATH": None})
    collector = make_collector(stack, config)
    try:
        found = samples(exposition(collector))
    finally:
        collector.close()
    assert value(found, "pdkit_engine_env_present", engine="prefill") == 0
    assert value(found, "pdkit_engine_env_present", engine="decode") == 1
    assert sorted((s["var"], s["problem"]) for s in label_sets(found, "pdkit_engine_env_mismatch_info")) == [
        ("NCCL_IB_DISABLE", "missing"), ("UCX_TLS", "different")]


def test_unreadable_environment_is_an_error_never_a_pass(stack):
    config = engines_config(stack)
    config["engines"][1]["unit"] = None
    cfg = parse_config(config)
    systemctl = FakeSystemctl({})
    systemctl.rc = 1  # e.g. no systemd
    collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(systemctl)), journal=None)
    try:
        found = samples(exposition(collector))
    finally:
        collector.close()
    for engine in ("prefill", "decode"):
        assert value(found, "pdkit_engine_env_present", engine=engine) is None
        assert value(found, "pdkit_engine_env_check_error", engine=engine) == 1
        assert value(found, "pdkit_engine_up", engine=engine) == 1
        # without the process, drift still comes from /server_info
        assert value(found, "pdkit_engine_flags_drift", engine=engine) == 0


@pytest.fixture
def black_hole():
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def test_dead_and_hanging_engines_are_bounded_and_do_not_hide_the_others(stack, black_hole):
    (dead_port,) = free_ports(1)
    config = engines_config(stack, timeout_s=0.3)
    for name, port in (("dead", dead_port), ("hung", black_hole)):
        config["engines"].append({"name": name, "role": "decode", "url": f"http://127.0.0.1:{port}",
                                  "unit": None, "argv": ["--port", str(port)]})
    collector = make_collector(stack, config)
    try:
        started = time.perf_counter()
        found = samples(exposition(collector))
        elapsed = time.perf_counter() - started
    finally:
        collector.close()
    assert elapsed < 0.3 + 0.5, elapsed
    for name in ("dead", "hung"):
        assert value(found, "pdkit_engine_up", engine=name) == 0
        assert value(found, "pdkit_engine_scrape_error", engine=name, endpoint="metrics") == 1
        assert value(found, "pdkit_engine_scrape_error", engine=name, endpoint="server_info") == 1
        assert value(found, "pdkit_engine_flags_drift", engine=name) is None
        assert value(found, "pdkit_engine_running_requests", engine=name) is None
        assert label_sets(found, "pdkit_engine_info", engine=name)[0]["sglang_version"] == ""
    assert value(found, "pdkit_engine_up", engine="prefill") == 1
    assert value(found, "pdkit_engine_up", engine="decode") == 1


def test_a_request_still_running_is_not_sent_again():
    """One attempt per engine per scrape, and none while the last one has not come back."""
    release = threading.Event()
    calls = []

    class StuckSession:
        def send(self, request, **kwargs):
            calls.append(request.url)
            release.wait(10)
            raise requests.ConnectionError("Connection refused")

        def close(self):
            pass

    cfg = parse_config({"node": "n", "timeout_s": 0.1, "journal": {"enabled": False, "timeout_s": 0.1},
                        "engines": [{"name": "e", "role": "decode", "url": "http://127.0.0.1:9", "argv": []}]})
    collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl({}))),
                               session_factory=StuckSession)
    try:
        first = samples(exposition(collector))
        assert len(calls) == 2 and value(first, "pdkit_engine_up") == 0
        second = samples(exposition(collector))
        assert len(calls) == 2, "a scrape re-sent a request that was still running"
        assert value(second, "pdkit_engine_scrape_error", endpoint="metrics") == 1
        release.set()
        deadline = time.monotonic() + 5
        while any(not f.done() for f in collector.state["e"].inflight.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        exposition(collector)
        assert len(calls) == 4
    finally:
        release.set()
        collector.close()


def test_http_get_caps_the_body(stack):
    session = requests.Session()
    got = http_get(session, f"http://127.0.0.1:{stack.decode_port}/metrics", 2.0, max_bytes=1000)
    assert got.error == "body over 1000 bytes"
    got = http_get(session, f"http://127.0.0.1:{stack.decode_port}/nope", 2.0)
    assert got.error == "HTTP 404" and got.status == 404


def test_release_id_from_the_release_file(stack, tmp_path):
    release = tmp_path / "release.json"
    release.write_text('{"a": 1}\n')
    config = engines_config(stack, release=None, release_file=str(release))
    collector = make_collector(stack, config)
    try:
        import hashlib
        first = label_sets(samples(exposition(collector)), "pdkit_engine_info", engine="decode")[0]["release"]
        assert first == hashlib.sha256(b'{"a": 1}\n').hexdigest()
        release.write_text('{"a": 22}\n')
        second = label_sets(samples(exposition(collector)), "pdkit_engine_info", engine="decode")[0]["release"]
        assert second == hashlib.sha256(b'{"a": 22}\n').hexdigest()
        release.unlink()
        assert label_sets(samples(exposition(collector)), "pdkit_engine_info", engine="decode")[0]["release"] == ""
    finally:
        collector.close()


def test_server_info_due():
    from pdkit.agent.exporter.collector import server_info_due

    assert server_info_due(False, None, None, 0, 60, False)  # never read
    assert not server_info_due(True, (1, 5), (1, 5), 10, 60, False)  # same process, fresh
    assert server_info_due(True, (1, 5), (2, 9), 10, 60, False)  # the unit's main process changed
    assert server_info_due(True, (1, 5), (1, 5), 60, 60, False)  # too old
    assert server_info_due(True, (1, 5), (1, 5), 1, 60, True)  # /metrics failed or counters went back
    assert not server_info_due(True, None, None, 10, 60, False)  # no PID known: age decides


class CountingSession(requests.Session):
    """Counts GETs by endpoint; URLs containing one of `refuse` fail as if the engine were down."""

    urls: list[str] = []
    refuse: set[str] = set()

    def send(self, request, **kwargs):
        CountingSession.urls.append(request.url.rsplit("/", 1)[1])
        if any(r in request.url for r in CountingSession.refuse):
            raise requests.ConnectionError("Connection refused")
        return super().send(request, **kwargs)


def test_server_info_is_read_once_per_engine_process(stack):
    from pdkit.agent.exporter.system import ProcessCheck, ProcessView

    class Inspector:
        pid = 100

        def check(self, units):
            view = ProcessView(self.pid, 1, dict(ENV), None, None)
            return [ProcessCheck(pid=self.pid, view=view) for _ in units]

    CountingSession.urls, CountingSession.refuse = [], set()
    inspector = Inspector()
    cfg = parse_config(engines_config(stack))
    collector = PdkitCollector(cfg, inspector=inspector, journal=None, session_factory=CountingSession)
    try:
        for _ in range(3):
            found = samples(exposition(collector))
            assert value(found, "pdkit_engine_up", engine="decode") == 1
            assert label_sets(found, "pdkit_engine_info", engine="decode")[0]["sglang_version"] == "sim"
        assert CountingSession.urls.count("server_info") == 2  # two engines, once each
        assert CountingSession.urls.count("metrics") == 6
        inspector.pid = 101  # both units restarted
        exposition(collector)
        assert CountingSession.urls.count("server_info") == 4
        # an engine whose /metrics fails is read again once it answers
        CountingSession.refuse = {f":{stack.decode_port}/metrics"}
        found = samples(exposition(collector))
        assert value(found, "pdkit_engine_up", engine="decode") == 0
        assert value(found, "pdkit_engine_scrape_error", engine="decode", endpoint="server_info") == 0
        CountingSession.refuse = set()
        before = CountingSession.urls.count("server_info")
        assert value(samples(exposition(collector)), "pdkit_engine_up", engine="decode") == 1
        assert CountingSession.urls.count("server_info") == before + 1
    finally:
        collector.close()


def test_journal_failures_are_visible_and_reads_never_overlap(stack):
    release = threading.Event()
    calls = []
    journal = FakeJournal()
    journal.add(UNITS["decode"], "[t TP0] Decode batch, #running-req: 7, cuda graph: True, gen throughput "
                                 "(token/s): 5.0, #queue-req: 0")

    def slow(argv, timeout):
        calls.append(argv)
        release.wait(10)
        return journal(argv, timeout)

    config = engines_config(stack, timeout_s=0.1, journal={"timeout_s": 0.1})
    cfg = parse_config(config)
    pids = {UNITS["prefill"]: stack.prefill.pid, UNITS["decode"]: stack.decode.pid}
    reader = JournalReader(list(UNITS.values()), runner=slow)
    collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl(pids))), journal=reader)
    try:
        found = samples(exposition(collector))
        assert value(found, "pdkit_exporter_journal_error", node="gpu01") == 1
        assert value(found, "pdkit_engine_up", engine="decode") == 1  # the rest of the scrape is unaffected
        found = samples(exposition(collector))
        assert value(found, "pdkit_exporter_journal_error") == 1 and len(calls) == 1
        release.set()
        deadline = time.monotonic() + 5
        while not collector._journal_future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        found = samples(exposition(collector))
        assert value(found, "pdkit_exporter_journal_error") == 0 and len(calls) == 2
        assert value(found, "pdkit_decode_batch_running_requests", engine="decode") == 7
        # journalctl failing (no permission to read the journal, say)
        journal.fail_with = (1, b"No journal files were opened due to insufficient permissions.")
        found = samples(exposition(collector))
        assert value(found, "pdkit_exporter_journal_error") == 1
        assert value(found, "pdkit_decode_batch_running_requests", engine="decode") == 7  # last value kept
    finally:
        release.set()
        collector.close()


def test_promtool_finds_no_naming_problems(stack):
    """`promtool check metrics` (Prometheus' own linter for names, units, _total, info) on a full
    exposition, drift and env-mismatch series included."""
    import shutil
    import subprocess

    from tests.conftest import require

    require(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    config = engines_config(stack)
    config["engines"][0]["env"]["NCCL_IB_DISABLE"] = "1"
    config["engines"][1]["argv"][config["engines"][1]["argv"].index("--page-size") + 1] = "64"
    collector = make_collector(stack, config)
    try:
        text = exposition(collector)
    finally:
        collector.close()
    assert "pdkit_engine_flag_drift_info{" in text and "pdkit_engine_env_mismatch_info{" in text
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


def test_a_rank_above_0_is_checked_by_its_process_only(stack):
    """Issue 20: an exporter watching rank 1 of an engine spanning nodes sends it no HTTP (SGLang
    serves HTTP on rank 0 only), says which rank it watches, and still checks the process'
    argv and environment — NCCL settings included — for that rank."""
    config = engines_config(stack)
    rank1 = config["engines"][1]
    # a URL nothing listens on: any HTTP fetch would show as a scrape error
    rank1.update(url=f"http://127.0.0.1:{free_ports(1)[0]}", rank=1, nnodes=2, head="gpu00")
    rank1["env"] = {**rank1["env"], "NCCL_SOCKET_IFNAME": "eth9"}
    collector = make_collector(stack, config)
    try:
        found = samples(exposition(collector))
    finally:
        collector.close()
    assert value(found, "pdkit_engine_rank_up", engine="decode", rank="1", nnodes="2", head="gpu00") == 1
    assert {s["engine"] for s in label_sets(found, "pdkit_engine_up")} == {"prefill"}
    assert {s["engine"] for s in label_sets(found, "pdkit_engine_scrape_error")} == {"prefill"}
    assert value(found, "pdkit_engine_flags_drift", engine="decode") == 0
    assert value(found, "pdkit_engine_env_present", engine="decode") == 0
    assert [(s["var"], s["problem"]) for s in label_sets(found, "pdkit_engine_env_mismatch_info") if s["engine"] == "decode"] == [
        ("NCCL_SOCKET_IFNAME", "missing")]



def test_doctor_reads_a_rank_above_0_from_the_real_exporter_page(stack):
    """pdkit doctor on what the exporter really says about rank 1: up (no HTTP asked of it), its
    argv as planned, its environment lacking the NCCL setting the plan gives that host."""
    from dataclasses import replace

    from pdkit.doctor.checks_engine import check_env, check_flags, check_rank_process
    from pdkit.doctor.model import EngineObservation, EnginePlan
    from pdkit.doctor.observe import exporter_views

    config = engines_config(stack)
    rank1 = config["engines"][1]
    rank1.update(url=f"http://127.0.0.1:{free_ports(1)[0]}", rank=1, nnodes=2, head="gpu00")
    rank1["env"] = {**rank1["env"], "NCCL_SOCKET_IFNAME": "eth9"}
    collector = make_collector(stack, config)
    try:
        text = exposition(collector)
    finally:
        collector.close()
    view = exporter_views(text)["decode"]
    assert (view.rank_up, view.rank) == (1.0, 1)
    plan = EnginePlan(host="gpu01", engine="decode", role="decode", url=rank1["url"], pd_group="g", argv=tuple(rank1["argv"]),
                      sglang_version="sim", engine_kind="sim", context_length=None, cuda_graph=True, graph_max_bs=None,
                      required_bs=None, env_names=tuple(sorted(rank1["env"])), rank=1, nnodes=2, head="gpu00")
    obs = EngineObservation(plan=plan, exporter=view)
    assert check_rank_process(obs).status == "PASS"
    assert check_flags(obs).status == "PASS"
    env = check_env(obs)
    assert env.status == "FAIL" and "NCCL_SOCKET_IFNAME missing" in env.reason and env.target == "decode rank 1"
    assert check_rank_process(replace(obs, exporter=replace(view, rank_up=0.0))).status == "FAIL"


def test_the_weights_page_cache_residency_is_published_per_engine_and_throttled(stack, tmp_path):
    """Issue 45 item 3: an engine whose argv names a local model directory (not dummy weights) gets its
    weight files' page-cache share (pdkit/agent/residency.py, mincore) and bytes; measured at most once a
    RESIDENCY_EVERY_S, so a second scrape reuses the first's figure."""
    import os

    from pdkit.agent import residency
    from pdkit.agent.exporter import collector as collector_mod
    from pdkit.upstream.metricnames import EXPORTER_WEIGHTS_BYTES, EXPORTER_WEIGHTS_CACHED

    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as f:
        f.write(os.urandom(4 << 20))
        f.flush()
        os.fsync(f.fileno())
    config = engines_config(stack)
    decode = config["engines"][1]
    i = decode["argv"].index("--model-path")
    decode["argv"][i + 1] = str(model)
    residency.warm(residency.weight_files(model))
    collector = make_collector(stack, config)
    try:
        found = samples(exposition(collector))
        assert value(found, EXPORTER_WEIGHTS_CACHED, engine="decode") > 0.99
        assert value(found, EXPORTER_WEIGHTS_BYTES, engine="decode") == 4 << 20
        assert {s["model_dir"] for s in label_sets(found, EXPORTER_WEIGHTS_CACHED, engine="decode")} == {str(model)}
        # the prefill's model path is the sim's, which has no weight files: no series
        assert not label_sets(found, EXPORTER_WEIGHTS_CACHED, engine="prefill")
        residency.evict(residency.weight_files(model))
        assert value(samples(exposition(collector)), EXPORTER_WEIGHTS_CACHED, engine="decode") > 0.99  # throttled
        collector._residency_cache.clear()  # the minute has passed
        assert value(samples(exposition(collector)), EXPORTER_WEIGHTS_CACHED, engine="decode") < 0.5
        assert collector_mod.RESIDENCY_EVERY_S == 60.0
    finally:
        collector.close()


def test_the_jit_caches_verdict_is_published_per_engine_from_the_gate_s_stamp(stack, tmp_path, monkeypatch):
    """Issue 45 item 2: an engine whose env file names the kit's cache directory gets 1 (warm) or 0 (cold)
    from the warm stamp the engine gate writes there (pdkit/agent/jitcache.py), with what a cold start cost."""
    import re

    from pdkit.agent import jitcache
    from pdkit.upstream.metricnames import EXPORTER_JIT_COLD_EXTRA, EXPORTER_JIT_WARM

    monkeypatch.setattr(jitcache, "_ENGINE_DIR", re.compile("^" + re.escape(str(tmp_path)) + r"/jit/[^/]+/[^/]+$"))
    decode_dir = tmp_path / "jit" / "sim" / "decode"
    env_file = tmp_path / "decode.env"
    env_file.write_text(f"SGLANG_CACHE_DIR={decode_dir}/sglang\n")
    config = engines_config(stack)
    for e in config["engines"]:
        e["env"] = {**e["env"], "SGLANG_CACHE_DIR": f"{tmp_path}/jit/sim/{e['name']}/sglang"}
    for invocation, seconds in (("i1", 90.0), ("i2", 30.0)):
        jitcache.stamp_ready([str(env_file)], invocation, lambda s=seconds: {"scheduler_e2e": s})
    collector = make_collector(stack, config)
    try:
        found = samples(exposition(collector))
        assert value(found, EXPORTER_JIT_WARM, engine="decode") == 1.0
        assert value(found, EXPORTER_JIT_WARM, engine="prefill") == 0.0  # no start stamped its caches
        assert value(found, EXPORTER_JIT_COLD_EXTRA, engine="decode") == 60.0
        # the prefill's cold start is costed from nothing of its own: no series
        assert not label_sets(found, EXPORTER_JIT_COLD_EXTRA, engine="prefill")
        assert {s["dir"] for s in label_sets(found, EXPORTER_JIT_WARM, engine="decode")} == {str(decode_dir)}
    finally:
        collector.close()
