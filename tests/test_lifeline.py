"""pdkit/agent/lifeline.py: a gate (or restore) started on a node ends when its control side goes away
(issue 42 item 4).

The end-to-end tests start the command as sshd does (observed on the lab: docs/rolling.md): a
stand-in "session" process, executed under the name `sshd`, forks a child that calls setsid()
and runs `sh -c '<command> && true'` with stdin at EOF and stdout/stderr on pipes that only the
stand-in reads. Killing the stand-in with SIGKILL is the control side dying: the pipes' reader
goes, `sh` is re-parented, nothing is signalled. Before pdkit/agent/lifeline.py the gate polled its URL
until its own timeout (600 s here).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdkit.agent import lifeline, releases
from pdkit.agent.lifeline import Proc
from tests.conftest import REPO

GONE_WITHIN_S = 5.0

STANDIN = textwrap.dedent("""
    import subprocess, sys, time
    mode, command, log = sys.argv[1], sys.argv[2], sys.argv[3]
    out = subprocess.PIPE if mode in ("pipes", "stderr-file") else open(log, "ab")
    err = subprocess.PIPE if mode == "pipes" else open(log, "ab")
    # as sshd's session child does: a new session, `sh -c COMMAND`, stdin closed at once (pyinfra does)
    p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=out, stderr=err,
                         start_new_session=True)
    p.stdin.close()
    print(p.pid, flush=True)
    time.sleep(600)
""")


class _NotReady(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).hits += 1
        self.send_response(503)
        self.end_headers()
        self.wfile.write(b"starting")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def not_ready():
    """A URL that never answers 200 (an engine that never becomes ready), and its hit counter."""
    handler = type("Handler", (_NotReady,), {"hits": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health", handler
    server.shutdown()


def _session(sid: int) -> list[Proc]:
    """The live processes of session SID (a zombie runs nothing)."""
    return [p for p in lifeline.process_table().values() if p.session == sid and p.state != "Z"]


def _wait_for(cond, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def _start(tmp_path: Path, command: str, mode: str = "pipes", name: str = "sshd", path: str | None = None):
    """(stand-in, sid of the command's session, log file): COMMAND started as sshd starts one."""
    exe = tmp_path / name
    exe.symlink_to(os.path.realpath(sys.executable))  # its comm is NAME, as sshd's is
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    log = tmp_path / "command.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    standin = subprocess.Popen([str(exe), str(script), mode, command, str(log)], stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, env=env, text=True)
    sid = int(standin.stdout.readline())
    return standin, sid, log


def _kill_standin(standin: subprocess.Popen) -> None:
    standin.kill()  # SIGKILL: the control side dies without a word
    standin.wait(timeout=10)


def _cleanup(standin: subprocess.Popen, sid: int) -> None:
    if standin.poll() is None:
        standin.kill()
        standin.wait(timeout=10)
    for p in _session(sid):
        try:
            os.kill(p.pid, signal.SIGKILL)  # what a failing run left behind
        except ProcessLookupError:
            pass


def _gate(url: str) -> str:
    return f"{sys.executable} -m pdkit.health gates --http {url} 600 && true"


def _mid_gate(sid: int, handler) -> None:
    assert _wait_for(lambda: handler.hits >= 3, 30), "the gate never polled its URL"
    names = [p.comm for p in _session(sid)]
    assert "sh" in names and any(n.startswith("python") for n in names), names


# ------------------------------------------------------------------ end to end


def test_a_gate_ends_with_its_process_group_when_its_ssh_session_dies(tmp_path, not_ready):
    url, handler = not_ready
    standin, sid, _ = _start(tmp_path, _gate(url))
    try:
        _mid_gate(sid, handler)
        _kill_standin(standin)
        assert _wait_for(lambda: not _session(sid), GONE_WITHIN_S), \
            f"left running {GONE_WITHIN_S:.0f} s after its control side died: {_session(sid)}"
        hits = handler.hits
        time.sleep(0.5)
        assert handler.hits == hits, "something still polls the URL"
    finally:
        _cleanup(standin, sid)


def test_the_gate_says_why_it_ended_on_stderr(tmp_path, not_ready):
    """stdout on the session's pipe, stderr to a file (so the test can read it); the stand-in is
    no sshd: only the pipe tells, and the gate's `sh` ends by itself (`&&` after a failure)."""
    url, handler = not_ready
    standin, sid, log = _start(tmp_path, _gate(url), mode="stderr-file", name="session")
    try:
        _mid_gate(sid, handler)
        _kill_standin(standin)
        assert _wait_for(lambda: not _session(sid), GONE_WITHIN_S), _session(sid)
        said = log.read_text()
        assert "pdkit.health" in said and "the control side went away" in said, said
        assert "nothing reads its stdout any more" in said, said
    finally:
        _cleanup(standin, sid)


def test_a_gate_whose_output_goes_to_a_file_ends_when_its_sshd_exits(tmp_path, not_ready):
    """No pipe to watch: the sshd the gate runs under (found among its ancestors) is the sign."""
    url, handler = not_ready
    standin, sid, log = _start(tmp_path, _gate(url), mode="files")
    try:
        _mid_gate(sid, handler)
        _kill_standin(standin)
        assert _wait_for(lambda: not _session(sid), GONE_WITHIN_S), _session(sid)
        assert "the SSH session it runs under ended" in log.read_text()
    finally:
        _cleanup(standin, sid)


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl for a restore in a temp root: every unit active; `restart` takes a while (the part a
# restore must never be cut in)
echo "$*" >> "{log}"
case "$1" in
  is-active) echo active ;;
  show) printf 'ActiveState=active\\nSubState=running\\nInvocationID=abc\\nNRestarts=0\\n' ;;
  restart) sleep 2; echo "restarted $2" >> "{log}" ;;
esac
exit 0
"""


def _release(root: Path, exporter: str, second: int, url: str) -> dict:
    path = "/etc/pdkit/exporter.json"
    f = root / path.lstrip("/")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(exporter)
    manifest = {"files": {path: {"sha256": hashlib.sha256(exporter.encode()).hexdigest()}},
                "services": ["pdkit-exporter.service"]}
    (root / "etc/pdkit/release.json").write_text(json.dumps(manifest))
    services = {"pdkit-exporter.service": {"kind": "http", "files": [path], "health_url": url, "ready_timeout_s": 600}}
    return releases.record(root=root, releases_dir="/opt/pdkit/releases", release_json="/etc/pdkit/release.json",
                           command=f"test {second}", services=services, venv_links=[],
                           now=dt.datetime(2026, 1, 1, 0, 0, second, tzinfo=dt.UTC))


def test_a_restore_is_never_cut_half_way_it_ends_in_its_gate(tmp_path, not_ready):
    """The control side dies while the restore restarts units: the restart finishes, the release
    is current, and the restore ends in the gate that follows (its timeout is 600 s)."""
    url, handler = not_ready
    root = tmp_path / "root"
    first = _release(root, "one", 1, url)
    _release(root, "two", 2, url)
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "systemctl.log"
    (stub / "systemctl").write_text(FAKE_SYSTEMCTL.format(log=calls))
    (stub / "systemctl").chmod(0o755)
    command = (f"{sys.executable} -m pdkit.releases --root {root} --releases-dir /opt/pdkit/releases "
               "--release-json /etc/pdkit/release.json restore && true")
    standin, sid, _ = _start(tmp_path, command, path=str(stub))
    try:
        assert _wait_for(lambda: calls.exists() and "restart pdkit-exporter.service" in calls.read_text(), 30)
        _kill_standin(standin)  # mid-restart
        assert _wait_for(lambda: not _session(sid), 2 + GONE_WITHIN_S), _session(sid)
        assert "restarted pdkit-exporter.service" in calls.read_text(), "the restore was cut half-way"
        assert (root / "etc/pdkit/exporter.json").read_text() == "one"
        assert (root / "opt/pdkit/releases/CURRENT").read_text().strip() == first["id"]
        assert handler.hits > 0, "it ended before its gate began"
    finally:
        _cleanup(standin, sid)


# ------------------------------------------------------------------ the pure parts


def _proc(pid, comm, ppid, pgrp, session, start=100, state="S") -> Proc:
    return Proc(pid, comm, state, ppid, pgrp, session, start)


def test_parse_stat_reads_a_name_with_spaces_and_parentheses():
    text = "4242 (a (b) c) S 81 81 81 0 -1 4194560 " + " ".join(["0"] * 12) + " 777 0 0"
    assert lifeline.parse_stat(text) == Proc(4242, "a (b) c", "S", 81, 81, 81, 777)
    assert lifeline.parse_stat("garbage") is None


# the chains observed on the lab (python <- sh <- sshd; sudo in between with pyinfra's sudo)
PYINFRA = [_proc(82, "python3", 81, 81, 81), _proc(81, "sh", 75, 81, 81), _proc(75, "sshd", 33, 75, 75),
           _proc(33, "sshd", 1, 33, 33)]
SUDO = [_proc(109, "python3", 108, 107, 107), _proc(108, "sh", 107, 107, 107), _proc(107, "sudo", 101, 107, 107),
        _proc(101, "sshd", 33, 101, 101), _proc(33, "sshd", 1, 33, 33)]
# an interactive login (ssh -t): the job's group is not the session's (bash is the leader)
JOB = [_proc(300, "python3", 299, 300, 299), _proc(299, "bash", 298, 299, 299), _proc(298, "sshd", 33, 298, 298)]
LOCAL = [_proc(500, "python3", 499, 400, 400), _proc(499, "pytest", 400, 400, 400), _proc(400, "bash", 1, 400, 400)]


def test_the_sshd_a_command_runs_under_and_whether_its_group_is_the_commands_own():
    assert lifeline.sshd_of(PYINFRA).pid == 75 and lifeline.sshd_group(PYINFRA) == 81
    assert lifeline.sshd_of(SUDO).pid == 101 and lifeline.sshd_group(SUDO) == 107
    assert lifeline.sshd_of(JOB).pid == 298 and lifeline.sshd_group(JOB) is None
    assert lifeline.sshd_of(LOCAL) is None and lifeline.sshd_group(LOCAL) is None
    assert lifeline.sshd_of([]) is None and lifeline.sshd_group([]) is None


def test_lost_reason_from_a_closed_pipe_or_a_gone_sshd():
    sshd = PYINFRA[2]
    assert lifeline.lost_reason([], sshd, sshd) is None
    assert lifeline.lost_reason([], None, None) is None
    assert "stdout" in lifeline.lost_reason([(1, select.POLLERR)], sshd, sshd)
    assert "stdout and stderr" in lifeline.lost_reason([(1, select.POLLERR), (2, select.POLLHUP)], None, None)
    assert "pid 75" in lifeline.lost_reason([], sshd, None)
    assert lifeline.lost_reason([], sshd, _proc(75, "bash", 1, 75, 75, start=999))  # the pid was reused
    assert lifeline.lost_reason([], sshd, _proc(75, "sshd", 33, 75, 75, state="Z"))  # exited, not reaped yet


def test_targets_are_the_processs_descendants_then_the_rest_of_its_group():
    table = {p.pid: p for p in [*SUDO, _proc(120, "systemctl", 109, 107, 107), _proc(121, "journalctl", 109, 107, 107),
                                _proc(130, "child", 120, 130, 130), _proc(200, "other", 1, 200, 200)]}
    below, others = lifeline.targets(table, 109, 107)
    assert sorted(below) == [120, 121, 130] and others == [107, 108]
    below, others = lifeline.targets(table, 109, None)
    assert sorted(below) == [120, 121, 130] and others == []


def test_gate_waiting_is_a_thread_inside_pdkit_health_or_pdkit_gates():
    def frame(module, back=None):
        return SimpleNamespace(f_globals={"__name__": module}, f_back=back)

    in_gate = frame("subprocess", frame("pdkit.agent.health", frame("pdkit.agent.releases")))
    assert lifeline.gate_waiting({1: frame("pdkit.agent.releases"), 2: in_gate}, me=9)
    assert not lifeline.gate_waiting({1: frame("pdkit.agent.releases"), 2: frame("shutil")}, me=9)
    assert not lifeline.gate_waiting({9: in_gate}, me=9)  # the watcher's own thread does not count


_REAL_GATE_THREAD = """
import sys, threading
from pdkit.agent import health, lifeline
url = sys.argv[1]
idle = threading.Event()
other = threading.Thread(target=idle.wait, args=(5,), daemon=True)
gate = threading.Thread(target=health.wait_http, args=(url, 1.5), daemon=True)
assert not lifeline.gate_waiting(), "a gate before any started"
other.start()
gate.start()
seen = False
for _ in range(100):
    if lifeline.gate_waiting():
        seen = True
        break
    idle.wait(0.01)
idle.set()
gate.join()
other.join()
print(seen, lifeline.gate_waiting())
"""


def test_gate_waiting_sees_a_real_gate_thread(not_ready):
    # in a fresh interpreter: a pytest worker may carry another test's threads, or gevent's patches
    # (pyinfra's), under which threading.Thread makes greenlets that sys._current_frames() never shows
    url, _ = not_ready
    proc = subprocess.run([sys.executable, "-c", _REAL_GATE_THREAD, url], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"], proc.stdout + proc.stderr


def test_only_pipes_and_sockets_are_watched_and_main_argv_arms_nothing(tmp_path):
    r, w = os.pipe()
    with open(tmp_path / "f", "w") as fh:
        assert lifeline.watched_fds([w, fh.fileno(), 999]) == [w]
    os.close(r)
    os.close(w)
    assert lifeline.watch_command("pdkit.health", ["http", "--url", "x"]) is None  # a test's main(argv)


CLOSES_STDOUT = textwrap.dedent("""
    import os, resource, sys, time
    from pdkit.agent import lifeline
    lifeline.watch("test")
    os.close(1)  # the command closes its own stdout; its reader is still there
    time.sleep(1.5)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
          file=sys.stderr)
""")


def test_a_command_closing_its_own_stdout_neither_ends_nor_busies_the_watcher():
    done = subprocess.run([sys.executable, "-c", CLOSES_STDOUT], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert float(done.stderr.split()[-1]) < 0.5, f"CPU seconds in 1.5 s: {done.stderr}"  # a poll() loop on POLLNVAL
