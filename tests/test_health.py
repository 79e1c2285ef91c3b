"""Health-gate decisions against a small local HTTP server standing in for the router's API."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdkit.agent.health import router_worker_health, wait_router
from tests.conftest import REPO


def test_worker_health_reads_smgs_worker_list():
    body = json.dumps({"workers": [
        {"url": "http://10.0.0.1:30000", "worker_type": "prefill", "is_healthy": True},
        {"url": "http://10.0.0.1:30001/", "worker_type": "decode", "is_healthy": False},
    ]})
    assert router_worker_health(body) == {"http://10.0.0.1:30000": True, "http://10.0.0.1:30001": False}


class _Router:
    """Answers /workers from `workers` and /v1/completions with `completion_status`."""

    def __init__(self):
        self.workers: list[dict] = []
        self.completion_status = 200
        self.completions = 0
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"workers": router.workers})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                router.completions += 1
                self._send(router.completion_status, {"ok": router.completion_status == 200})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def router():
    r = _Router()
    yield r
    r.server.shutdown()


def test_router_with_no_workers_is_not_ready_even_though_it_answers(router):
    ok, reason = wait_router(router.url, ["http://w:1"], timeout=1.5, interval=0.2)
    assert not ok and "missing ['http://w:1']" in reason


def test_router_ready_only_when_every_planned_worker_is_healthy(router):
    router.workers = [{"url": "http://w:1", "is_healthy": True}, {"url": "http://w:2", "is_healthy": False}]
    ok, reason = wait_router(router.url, ["http://w:1", "http://w:2"], timeout=1.5, interval=0.2)
    assert not ok and "unhealthy ['http://w:2']" in reason
    router.workers[1]["is_healthy"] = True
    ok, reason = wait_router(router.url, ["http://w:1", "http://w:2"], timeout=1.5, interval=0.2)
    assert ok, reason


def test_router_gate_needs_a_real_completion_when_given_a_model(router):
    router.workers = [{"url": "http://w:1", "is_healthy": True}]
    router.completion_status = 503
    ok, reason = wait_router(router.url, ["http://w:1"], timeout=1.5, interval=0.2, model="m")
    assert not ok and "completion answered 503" in reason and router.completions >= 2
    router.completion_status = 200
    ok, reason = wait_router(router.url, ["http://w:1"], timeout=1.5, interval=0.2, model="m")
    assert ok and "a completion succeeded" in reason


def test_gates_wait_together_and_name_what_failed(capsys):
    """`pdkit.agent.health gates`: every HTTP gate at once; exit 1 naming the one that never answered 200."""
    from pdkit.agent.health import main

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/ok" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert main(["gates", "--http", f"{base}/ok", "5", "--http", f"{base}/ok", "5"]) == 0
        assert main(["gates", "--http", f"{base}/ok", "5", "--http", f"{base}/down", "0.5"]) == 1
    finally:
        server.shutdown()
    out = capsys.readouterr()
    assert f"FAILED not ready after 0 s: {base}/down answered 503" in out.err
    assert f"ok     {base}/ok answered 200" in out.out
    with pytest.raises(SystemExit):
        main(["gates", "--http", f"{base}/ok", "soon"])  # TIMEOUT must be seconds


def test_tune_connection_turns_nagle_off_on_a_tcp_ssh_socket_only():
    import socket
    from types import SimpleNamespace

    from pdkit.hosts.deploy import SSH_CLOSE_CHECK_S, tune_connection

    def host_with(sock):
        transport = SimpleNamespace(sock=sock)
        return SimpleNamespace(connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport)))

    listener = socket.create_server(("127.0.0.1", 0))
    tcp = socket.create_connection(listener.getsockname())
    try:
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        tcp.settimeout(0.1)  # what paramiko's Transport sets
        assert tune_connection(host_with(tcp)) is True
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert tcp.gettimeout() == SSH_CLOSE_CHECK_S
    finally:
        tcp.close()
        listener.close()
    a, b = socket.socketpair()  # a proxied channel or a local pipe: not TCP, left alone
    try:
        a.settimeout(0.1)
        assert tune_connection(host_with(a)) is False
        assert a.gettimeout() == 0.1
    finally:
        a.close()
        b.close()
    assert tune_connection(SimpleNamespace(connector=SimpleNamespace())) is False  # @local, @docker: no SSH client


# ---- issue #18 item 7: a broken start is caught at its first failure, with the engine's own error line

JOURNAL = REPO / "tests" / "fixtures" / "journal"


@pytest.mark.parametrize(("fixture", "expected"), [
    ("argparse_bad_flag.txt", "launch_server.py: error: argument --disaggregation-mode: invalid choice: 'decod' (choose from 'null', 'prefill', 'decode')"),
    ("traceback_oom.txt", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.2"),
    ("knob_error.txt", "pdkit.sim.knobs.KnobError: PDKIT_SIM_TRANSFER_FAIL_RATE must be within [0, 1]"),
])
def test_error_line_is_the_engines_own_error_not_usage_fragments(fixture, expected):
    from pdkit.agent.health import error_line

    assert error_line((JOURNAL / fixture).read_text()) == expected


def test_error_line_without_an_error():
    from pdkit.agent.health import error_line

    assert error_line("starting\nloading weights\n") == "loading weights"
    assert error_line("") == "(it logged nothing)"


def _snap(active="activating", sub="start", inv="a", n="0"):
    return {"ActiveState": active, "SubState": sub, "InvocationID": inv, "NRestarts": n}


def _scripted(*snapshots):
    """A stand-in for health._unit_snapshot: the recorded SNAPSHOTS in turn, then the last one for good."""
    states = iter(snapshots)
    last = {}

    def snapshot(unit):
        last["s"] = next(states, last.get("s"))
        return last["s"]

    return snapshot


@pytest.mark.parametrize(("now", "failed"), [
    (_snap(), False),
    (_snap("active", "running"), False),
    (_snap("failed", "failed"), True),
    (_snap("activating", "auto-restart"), True),  # Restart=on-failure: waiting to start again
    (_snap("activating", "start", inv="b"), True),  # systemd already started it again
    (_snap("activating", "start", n="1"), True),
])
def test_start_failed_at_the_first_failure(now, failed):
    from pdkit.agent.health import start_failed

    assert start_failed(_snap(), now) is failed


def test_wait_engine_fails_at_the_first_failed_start_with_the_journal_error(monkeypatch):
    """Recorded states of a crash-looping unit: the gate must stop at the first auto-restart, not at systemd's start limit."""
    from pdkit.agent import health

    logs = {"inv1": (JOURNAL / "argparse_bad_flag.txt").read_text()}
    monkeypatch.setattr(health, "_unit_snapshot", _scripted(_snap("activating", "start", "inv1"), _snap("activating", "auto-restart", "inv1")))
    monkeypatch.setattr(health, "unit_log", lambda unit, inv, lines=None: logs.get(inv, ""))
    start = time.monotonic()
    ok, message = health.wait_engine("pdkit-engine-decode.service", "http://127.0.0.1:9/health", timeout=30, interval=0.01, poll=0.01)
    assert not ok
    assert time.monotonic() - start < 5
    assert message == ("pdkit-engine-decode.service failed at its first start: launch_server.py: error: argument --disaggregation-mode: "
                       "invalid choice: 'decod' (choose from 'null', 'prefill', 'decode')")


def _answering(path_ok: str = "/ok"):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == path_ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_service_gate_fails_at_once_when_its_unit_fails_to_start(monkeypatch):
    """A crashed exporter must not wait out its (long) timeout: the gate reads its unit and stops at the first failure."""
    from pdkit.agent import health

    monkeypatch.setattr(health, "_unit_snapshot", _scripted(_snap("activating", "start", "inv1"), _snap("failed", "failed", "inv1")))
    monkeypatch.setattr(health, "unit_log", lambda unit, inv, lines=None: "Traceback (most recent call last):\nModuleNotFoundError: No module named 'prometheus_client'\n")
    server, base = _answering()
    try:
        start = time.monotonic()
        ok, message = health.wait_service("pdkit-exporter.service", f"{base}/down", timeout=60, interval=0.01, poll=0.01)
    finally:
        server.shutdown()
    assert not ok
    assert time.monotonic() - start < 5
    assert message == "pdkit-exporter.service failed at its first start: ModuleNotFoundError: No module named 'prometheus_client'"


def test_a_service_gate_passes_when_its_url_answers_and_times_out_when_it_never_does(monkeypatch, capsys):
    from pdkit.agent import health

    monkeypatch.setattr(health, "_unit_snapshot", lambda unit: _snap("active", "running", "inv1"))
    server, base = _answering()
    try:
        assert health.main(["gates", "--service", "pdkit-exporter.service", f"{base}/ok", "5",
                            "--service", "prometheus.service", f"{base}/ok", "5"]) == 0
        assert health.main(["gates", "--service", "pdkit-exporter.service", f"{base}/down", "0.5"]) == 1
    finally:
        server.shutdown()
    out = capsys.readouterr()
    assert f"ok     pdkit-exporter.service ready: {base}/ok answered 200" in out.out
    assert f"FAILED not ready after 0 s: {base}/down answered 503" in out.err


def test_paramikos_reader_on_a_tuned_socket_still_ends_soon_after_a_close():
    # without gevent (a thread blocked in recv is not woken by close()): paramiko's own read loop
    # on the tuned socket notices the closed packetizer within SSH_CLOSE_CHECK_S
    import socket
    import threading

    from paramiko.packet import Packetizer

    from pdkit.hosts.deploy import SSH_CLOSE_CHECK_S

    listener = socket.create_server(("127.0.0.1", 0))
    tcp = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    tcp.settimeout(SSH_CLOSE_CHECK_S)
    packetizer = Packetizer(tcp)
    ended: list[str] = []

    def read():
        try:
            packetizer.read_all(4)
        except EOFError:
            ended.append("EOF")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        time.sleep(0.3)
        assert reader.is_alive() and not ended  # idle: still waiting for data
        closed_at = time.monotonic()
        packetizer.close()
        reader.join(SSH_CLOSE_CHECK_S + 1.0)
        assert ended == ["EOF"] and time.monotonic() - closed_at <= SSH_CLOSE_CHECK_S + 1.0
    finally:
        for s in (tcp, peer, listener):
            s.close()


def test_an_engine_whose_health_answers_but_server_info_does_not_is_not_ready(monkeypatch):
    """Ready is decided from what the engine answers: /health 200 alone is not enough, /server_info must be readable."""
    from pdkit.agent import health

    monkeypatch.setattr(health, "_unit_snapshot", lambda unit: _snap("active", "running", "inv1"))
    monkeypatch.setattr(health, "unit_log", lambda unit, inv, lines=None: health.READY_LOG_LINE)
    server, base = _answering("/health")
    try:
        ok, message = health.wait_engine("pdkit-engine-decode.service", f"{base}/health", timeout=0.5, poll=0.01)
    finally:
        server.shutdown()
    assert not ok
    assert message == f"not ready after 0 s: {base}/health answers 200 but {base}/server_info answered 503: "


def test_the_engine_gate_keeps_when_it_first_saw_each_invocation_ready(tmp_path):
    """Issue 42: the roll's restart-to-ready falls back on this mark when journald rotated the
    readiness line away; the first gate of a start wins, a new invocation replaces it."""
    from pdkit.agent import health

    marks = health.ready_marks_dir(str(tmp_path / "shapes"))
    assert marks == str(tmp_path / "ready")
    health.mark_ready("pdkit-engine-decode.service", "inv1", marks)
    first = json.loads((tmp_path / "ready" / "pdkit-engine-decode.service.json").read_text())
    time.sleep(0.01)
    health.mark_ready("pdkit-engine-decode.service", "inv1", marks)
    assert json.loads((tmp_path / "ready" / "pdkit-engine-decode.service.json").read_text()) == first
    health.mark_ready("pdkit-engine-decode.service", "inv2", marks)
    second = json.loads((tmp_path / "ready" / "pdkit-engine-decode.service.json").read_text())
    assert second["invocation"] == "inv2" and second["ready_monotonic_us"] > first["ready_monotonic_us"]


def test_the_restart_timing_probe_reads_the_gates_mark_when_the_journal_has_no_readiness_line(tmp_path):
    """The roll's _TIMING_PROBE on a node whose journal was rotated: systemd's timestamps from
    `systemctl show`, no readiness line from journalctl, the engine gate's mark for the same
    invocation; a mark of another invocation is not this start's."""
    import shlex
    import subprocess

    from pdkit.roll.planning import restart_to_ready
    from pdkit.roll.roller import timing_probe_command

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nprintf 'ActiveExitTimestampMonotonic=1000000\\n"
                                       "InactiveEnterTimestampMonotonic=3000000\\nInactiveExitTimestampMonotonic=3100000\\n"
                                       "InvocationID=inv7\\n'\n")
    (bin_dir / "journalctl").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("systemctl", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    marks = tmp_path / "ready"
    marks.mkdir()
    unit = "pdkit-engine-decode.service"
    command = timing_probe_command([unit])
    # the node's own marks folder is the last argument: point it here
    command = command.rsplit(" ", 1)[0] + " " + shlex.quote(str(marks))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    def probe():
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=30)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert probe()[unit][1] is None and restart_to_ready(probe()) is None
    (marks / f"{unit}.json").write_text(json.dumps({"invocation": "inv7", "ready_monotonic_us": 63_100_000}))
    # stopping 2.0 s (left active 1 s -> inactive 3 s) + start 3.1 s -> ready 63.1 s
    assert restart_to_ready(probe()) == pytest.approx(62.0)
    # the mark's phases come back with the timings (for the record), only for the same invocation
    (marks / f"{unit}.json").write_text(json.dumps({"invocation": "inv7", "ready_monotonic_us": 63_100_000,
                                                    "phases": {"load_weight": 2.5}}))
    assert probe()[unit][4] == {"load_weight": 2.5}
    (marks / f"{unit}.json").write_text(json.dumps({"invocation": "inv6", "ready_monotonic_us": 63_100_000,
                                                    "phases": {"load_weight": 2.5}}))
    assert restart_to_ready(probe()) is None and probe()[unit][4] == {}


# ---- SGLang's start-up phases in the gate's ready mark (issue 45 item 1) ---------------------------

FIXTURES = REPO / "tests" / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"


def test_startup_phases_are_read_from_a_real_sglang_page():
    from pdkit.agent.health import parse_startup_phases

    decode = parse_startup_phases((FIXTURES / "metrics-base-after-decode.txt").read_text())
    assert decode == {"load_weight": 0.112, "kv_cache_allocation": 0.013, "scheduler_e2e": 10.218,
                      "tokenizer_e2e": 31.808, "cuda_graph:decode": 4.556}
    prefill = parse_startup_phases((FIXTURES / "metrics-base-after-prefill.txt").read_text())
    assert prefill["cuda_graph:prefill"] == 33.309 and "cuda_graph:decode" not in prefill
    assert parse_startup_phases("sglang:num_running_reqs 3\n") == {}


def test_the_first_gate_to_see_a_start_ready_keeps_its_phases(tmp_path):
    from pdkit.agent.health import mark_ready

    calls = []
    mark_ready("u.service", "inv-1", str(tmp_path), lambda: calls.append(1) or {"load_weight": 1.5})
    mark_ready("u.service", "inv-1", str(tmp_path), lambda: calls.append(1) or {"load_weight": 9.0})
    mark = json.loads((tmp_path / "u.service.json").read_text())
    assert mark["invocation"] == "inv-1" and mark["phases"] == {"load_weight": 1.5} and calls == [1]
    mark_ready("u.service", "inv-2", str(tmp_path), lambda: {})
    assert json.loads((tmp_path / "u.service.json").read_text())["phases"] == {}


def test_the_done_line_names_each_restarted_engine_and_sglangs_phases():
    from pdkit.roll.roller import NodeTiming, phases_words

    words = phases_words({"pdkit-engine-decode.service": {"restart_to_ready_s": 53.1, "load_weight": 0.11,
                                                          "cuda_graph:decode": 4.56}})
    assert words == "; decode ready 53.1 s (SGLang: load_weight 0.1 s, cuda_graph:decode 4.6 s)"
    t = NodeTiming(host="gpu01", total_s=80, engine_phases={"pdkit-engine-prefill.service": {"restart_to_ready_s": 40.0}})
    assert t.summary().endswith("; prefill ready 40.0 s")


def test_pdkit_releases_shows_each_engines_last_start_and_its_phases():
    from pdkit.roll.commands import format_releases, last_starts

    probe = {  # [left active, ready, went inactive, started, phases] (µs)
        "pdkit-engine-decode.service": [1_000_000, 63_100_000, 3_000_000, 3_100_000, {"tokenizer_e2e": 40.5}],
        "pdkit-engine-prefill.service": [0, None, 0, 2_000_000, {}],  # not seen ready: left out
    }
    starts = last_starts(probe)
    assert starts == {"pdkit-engine-decode.service": {"restart_to_ready_s": 62.0, "tokenizer_e2e": 40.5}}
    text = format_releases("gpu01", {"releases": [], "current": None, "last_starts": starts}, "h")
    assert text.splitlines()[-1] == "  decode ready 62.0 s (SGLang: tokenizer_e2e 40.5 s)", text
    assert "engines' last starts" in text


def test_the_engine_gate_stamps_the_engine_s_jit_caches_warm_at_ready(monkeypatch, tmp_path):
    """Issue 45 item 2: the gate that first sees a start ready writes the warm stamp in the engine's cache
    directory (named by SGLANG_CACHE_DIR in its env file among the gate's shape inputs), with the phases."""
    import re

    from pdkit.agent import health, jitcache

    monkeypatch.setattr(jitcache, "_ENGINE_DIR", re.compile("^" + re.escape(str(tmp_path)) + r"/jit/[^/]+/[^/]+$"))
    monkeypatch.setattr(health, "unit_log", lambda unit, inv, lines=None: health.READY_LOG_LINE)
    monkeypatch.setattr(health, "startup_phases", lambda url, timeout=3.0: {"scheduler_e2e": 12.5})
    monkeypatch.setattr(health, "http_request", lambda *a, **k: (0, "nothing"))
    monkeypatch.setattr(health.engineshape, "check", lambda *a, **k: (True, "shape recorded"))
    engine_dir = tmp_path / "jit" / "0.5.23" / "decode"
    env_file = tmp_path / "decode.env"
    env_file.write_text(f"SGLANG_CACHE_DIR={engine_dir}/sglang\n")
    ok, _ = health._engine_ready("pdkit-engine-decode.service", "http://127.0.0.1:9/health", {}, "inv1",
                                 (str(env_file),), str(tmp_path / "shapes"))
    stamp = json.loads((engine_dir / jitcache.WARM_STAMP).read_text())
    assert ok and stamp["last"]["invocation"] == "inv1" and stamp["last"]["phases"] == {"scheduler_e2e": 12.5}
    assert jitcache.judge(str(engine_dir))["state"] == "warm"
