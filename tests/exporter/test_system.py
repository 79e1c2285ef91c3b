"""/proc, systemctl and journalctl: parsing, caching, bounded journal reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from pdkit.agent.exporter.system import (
    JournalError,
    JournalReader,
    PidLookupError,
    ProcessInspector,
    SystemdPids,
    env_problems,
    parse_cmdline,
    parse_environ,
    parse_journal_json,
    parse_systemctl_show,
    proc_start_time,
    read_process,
    run_command,
)
from tests.conftest import require

from .support import FakeJournal, FakeSystemctl, data_text


def test_environ_and_cmdline_parsing():
    env = parse_environ(b"NCCL_P2P_LEVEL=PHB\0EMPTY=\0EQ=a=b\0BAD=\xff\0noequals\0")
    assert env == {"NCCL_P2P_LEVEL": "PHB", "EMPTY": "", "EQ": "a=b", "BAD": "\udcff"}
    assert parse_cmdline(b"/usr/bin/python\0-m\0pdkit.sim\0--port\x0030000\0") == [
        "/usr/bin/python", "-m", "pdkit.sim", "--port", "30000"]


def test_env_problems():
    expected = {"NCCL_P2P_LEVEL": "PHB", "UCX_TLS": "cuda_ipc,tcp", "HF_TOKEN": None, "NCCL_IB_DISABLE": "1"}
    actual = {"NCCL_P2P_LEVEL": "PHB", "UCX_TLS": "tcp", "HF_TOKEN": "secret"}
    assert env_problems(expected, actual) == {"UCX_TLS": "different", "NCCL_IB_DISABLE": "missing"}
    assert env_problems({}, actual) == {}


def test_stat_start_time_with_an_awkward_process_name():
    stat = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10"
    assert proc_start_time(stat) == 98765


WAIT_FOR_STDIN = "import sys; print('ready', flush=True); sys.stdin.read()"


def start_child(env: dict[str, str], *args: str) -> subprocess.Popen:
    """A real process, returned once it runs (just after exec its argv and environ read empty)."""
    proc = subprocess.Popen([sys.executable, "-c", WAIT_FOR_STDIN, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


@pytest.fixture
def child():
    """A real process with a known environment and argv."""
    env = {"PATH": os.environ.get("PATH", ""), "NCCL_P2P_LEVEL": "PHB", "UCX_TLS": "cuda_ipc,cuda_copy,sm,self,tcp"}
    proc = start_child(env, "--port", "1")
    yield proc
    proc.stdin.close()
    proc.wait(timeout=10)


def test_read_a_real_process(child):
    view = read_process(child.pid)
    assert view.pid == child.pid and view.environ_error is None
    assert view.environ["NCCL_P2P_LEVEL"] == "PHB" and "HOME" not in view.environ
    assert view.cmdline[-2:] == ["--port", "1"]
    with open(f"/proc/{child.pid}/stat") as f:
        assert view.start_time == proc_start_time(f.read())


SYSTEMCTL_SHOW = """\
MainPID=4242
Id=pdkit-engine-prefill.service

MainPID=0
Id=pdkit-engine-decode.service
"""


def test_systemctl_show_blocks():
    assert parse_systemctl_show(SYSTEMCTL_SHOW) == [
        {"MainPID": "4242", "Id": "pdkit-engine-prefill.service"},
        {"MainPID": "0", "Id": "pdkit-engine-decode.service"},
    ]
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return 0, SYSTEMCTL_SHOW.encode(), b""

    pids = SystemdPids(runner).lookup(["pdkit-engine-prefill.service", "pdkit-engine-decode.service"])
    assert pids == {"pdkit-engine-prefill.service": 4242, "pdkit-engine-decode.service": 0}
    assert calls == [["systemctl", "show", "-p", "Id", "-p", "MainPID",
                      "pdkit-engine-prefill.service", "pdkit-engine-decode.service"]]
    with pytest.raises(PidLookupError, match="2 blocks for 3 units"):
        SystemdPids(runner).lookup(["a", "b", "c"])


def test_inspector_reads_each_process_once_and_follows_a_restart(child):
    units = ["pdkit-engine-a.service", "pdkit-engine-b.service", None]
    systemctl = FakeSystemctl({"pdkit-engine-a.service": child.pid, "pdkit-engine-b.service": 0})
    now = [0.0]
    inspector = ProcessInspector(SystemdPids(systemctl), refresh_s=60, clock=lambda: now[0])
    a, b, none = inspector.check(units)
    assert a.error is None and a.pid == child.pid and a.view.environ["NCCL_P2P_LEVEL"] == "PHB"
    assert b.error == "not_running" and none.error == "no_unit"
    assert systemctl.calls == 1
    # b is still down, so every scrape asks again (a cheap call); a stays cached
    inspector.check(units)
    assert systemctl.calls == 2
    # with b gone from the list, a cached process costs no systemctl call until refresh_s
    assert inspector.check(units[:1])[0].pid == child.pid and systemctl.calls == 2
    now[0] = 61.0
    inspector.check(units[:1])
    assert systemctl.calls == 3
    # a restart: the old process is gone, systemd reports a new main PID
    with start_child({"X": "1"}) as second:
        child.stdin.close()
        child.wait(timeout=10)
        systemctl.pids["pdkit-engine-a.service"] = second.pid
        (a,) = inspector.check(units[:1])
        assert a.pid == second.pid and a.view.environ == {"X": "1"}
        assert systemctl.calls == 4
        second.stdin.close()


def test_inspector_reports_errors_never_a_pass(tmp_path):
    systemctl = FakeSystemctl({})
    systemctl.rc = 1
    (check,) = ProcessInspector(SystemdPids(systemctl)).check(["u.service"])
    assert check.error == "pid_lookup" and "exited 1" in check.detail and check.view is None
    # a process whose environ cannot be read (here: a directory in a fake /proc)
    proc = tmp_path / "77"
    proc.mkdir()
    (proc / "stat").write_text("77 (python) S 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5555 1 1")
    (proc / "environ").mkdir()
    (proc / "cmdline").write_bytes(b"python\0-m\0x\0")
    (check,) = ProcessInspector(SystemdPids(FakeSystemctl({"u.service": 77})), proc_root=str(tmp_path)).check(["u.service"])
    assert check.error == "environ" and check.view.environ is None and check.view.cmdline == ["python", "-m", "x"]
    (check,) = ProcessInspector(SystemdPids(FakeSystemctl({"u.service": 78})), proc_root=str(tmp_path)).check(["u.service"])
    assert check.error == "no_process"
    # a process caught between exec and its start: nothing cached, checked again next scrape
    (tmp_path / "77" / "environ").rmdir()
    (tmp_path / "77" / "environ").write_bytes(b"")
    (tmp_path / "77" / "cmdline").write_bytes(b"")
    inspector = ProcessInspector(SystemdPids(FakeSystemctl({"u.service": 77})), proc_root=str(tmp_path))
    assert inspector.check(["u.service"])[0].error == "starting"
    (tmp_path / "77" / "environ").write_bytes(b"NCCL_P2P_LEVEL=PHB\0")
    (tmp_path / "77" / "cmdline").write_bytes(b"python\0")
    (check,) = inspector.check(["u.service"])
    assert check.error is None and check.view.environ == {"NCCL_P2P_LEVEL": "PHB"}


def test_journal_json_parsing():
    lines = [
        {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": "1800000000500000", "_SYSTEMD_UNIT": "a.service",
         "MESSAGE": "[t TP0] Decode batch, #running-req: 1, cuda graph: True"},
        {"__CURSOR": "c2", "_SYSTEMD_UNIT": "a.service", "MESSAGE": "INFO: access"},
        {"__CURSOR": "c3", "UNIT": "b.service", "MESSAGE": list(b"Prefill batch, #new-seq: 1 \xff")},
        {"__CURSOR": "c4", "_SYSTEMD_UNIT": "a.service", "MESSAGE": "GET /metrics"},
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    entries, cursor, count = parse_journal_json(data)
    assert cursor == "c4" and count == 4
    assert [(e.unit, e.realtime_s) for e in entries] == [("a.service", 1800000000.5), ("b.service", None)]
    assert entries[1].message.startswith("Prefill batch, #new-seq: 1 ")
    assert parse_journal_json(b"") == ([], None, 0)


def _running(entry) -> str:
    return entry.message.split("#running-req: ")[1].split(",")[0]


def test_journal_reader_cursor_backlog_and_errors():
    journal = FakeJournal()
    units = ["pdkit-engine-decode.service"]
    for i in range(10):
        journal.add(units[0], f"[t TP0] Decode batch, #running-req: {i}, cuda graph: True")
        journal.add(units[0], "INFO: access line")
    journal.add("other.service", "Decode batch, #running-req: 99, cuda graph: True")
    reader = JournalReader(units, max_entries=4, runner=journal)

    # first read: the newest entries only
    entries = reader.read()
    assert "--after-cursor" not in journal.calls[-1]
    assert [_running(e) for e in entries] == ["8", "9"]
    assert reader.cursor == "line=19"
    assert reader.read() == [] and journal.calls[-1][-4:] == ["--after-cursor", "line=19", "-n", "4"]

    # new lines: read after the cursor
    journal.add(units[0], "[t TP0] Decode batch, #running-req: 10, cuda graph: False")
    assert [_running(e) for e in reader.read()] == ["10"]
    # a backlog larger than the bound: one bounded read, then a jump to the newest entries
    for i in range(11, 21):
        journal.add(units[0], f"[t TP0] Decode batch, #running-req: {i}, cuda graph: True")
    assert [_running(e) for e in reader.read()] == ["11", "12", "13", "14"]
    assert reader.cursor is None
    assert [_running(e) for e in reader.read()][-1] == "20"
    assert "--after-cursor" not in journal.calls[-1]

    # journalctl failing (e.g. a cursor it cannot seek to): an error, and the cursor is dropped
    journal.fail_with = (1, b"Failed to seek to cursor: Invalid argument")
    with pytest.raises(JournalError, match="cursor dropped.*Failed to seek"):
        reader.read()
    assert reader.cursor is None
    journal.fail_with = None
    assert reader.read()[-1].message.endswith("cuda graph: True")


def test_real_journalctl_accepts_the_command(tmp_path):
    """systemd's journalctl parses the exporter's arguments (on an empty journal directory)."""
    require(shutil.which("journalctl") is not None, "journalctl (package systemd) is not installed")
    reader = JournalReader(["pdkit-engine-a.service", "pdkit-engine-b.service"], max_entries=50,
                           journalctl=("journalctl", f"--directory={tmp_path}"))
    assert reader.read() == []
    rc, out, err = run_command(reader.command(), 10)
    assert rc == 0, err
    reader.cursor = "s=0;i=1;b=0;m=0;t=0;x=0"
    rc, out, err = run_command(reader.command(), 10)
    assert b"unrecognized option" not in err and b"invalid option" not in err


def test_run_command_reports_missing_and_slow_commands():
    assert run_command(["/nonexistent/journalctl"], 1)[0] == 127
    rc, _, err = run_command([sys.executable, "-c", "import time; time.sleep(5)"], 0.3)
    assert rc == 124 and b"timed out" in err


def test_sim_batch_lines_survive_the_journal_round_trip():
    journal = FakeJournal()
    for line in data_text("sim_decode_batch.log").splitlines():
        journal.add("d.service", line)
    entries = JournalReader(["d.service"], runner=journal).read()
    assert [e.message for e in entries] == data_text("sim_decode_batch.log").splitlines()
