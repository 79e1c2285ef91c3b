"""A gate's lifeline: a command started on a node over SSH ends when its control side goes away
(issue 42 item 4). Stdlib only: it runs ON the node, in the gates (`python -m pdkit.health ...`)
and a restore (`python -m pdkit.releases restore ...`), from their main().

What the node sees when the control side dies mid-command (observed on the lab's Debian 12 hosts,
OpenSSH 9.2, the control side's ssh client or paramiko process killed with SIGKILL during a
non-pty exec run as pyinfra runs one: `sh -c '...'`, stdin closed at once, with and without
`sudo -H -n` in front):

- no signal: sshd sends SIGHUP only to a pty's session, and pyinfra asks for no pty;
- sshd's per-connection process exits within a second (the TCP connection closed), so the
  command's first process (`sh`, or `sudo`) is re-parented to init. The gate's own parent is that
  `sh` or `sudo`, which lives on: the gate's parent pid does not change;
- the read ends of the command's stdout and stderr pipes close with sshd: poll() reports POLLERR
  on them. A gate writes only when it ends, so it never met the broken pipe and polled the
  engine's /health until its own timeout (ready_timeout_s, up to 600 s): a stranded process;
- stdin says nothing: pyinfra closes it as the command starts (paramiko sends EOF), so it is at
  EOF from the first moment; sudo drops SSH_CONNECTION from the environment.

So `watch()` ends the process on either of two signs, each independent of sh and sudo in between:
its stdout or stderr, where it is a pipe or socket, reports POLLERR/POLLHUP (nobody reads what it
would say), or the sshd process found among its ancestors at the start has exited (this also
covers output redirected to a file). It then says why (stderr, best effort, and the node's
journal through syslog, which outlives the session), ends its own child processes (systemctl,
journalctl) and, when its process group is the one sshd made for this command, the `sh`/`sudo`
around it, and exits 1. A control machine that drops off the network without closing the
connection is seen by neither sign until sshd's keepalives give up: the gate's own timeout bounds
it then, as before.

A command that must not stop half-way (a restore writing files, restarting units) passes
`endable=gate_waiting`: after the loss it ends at the first moment a thread is inside a gate
(pdkit.agent.health, pdkit.agent.gates), so the files and restarts it began are finished and only the wait
is cut short.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import syslog
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType

# OpenSSH's per-connection process (9.8 and later exec it as sshd-session)
SSHD_NAMES = ("sshd", "sshd-session")
# a thread running code of these modules is waiting in a gate (gate_waiting)
GATE_MODULES = ("pdkit.agent.health", "pdkit.agent.gates")
EXIT_LOST = 1  # non-zero: an `a && b` chain around the gate stops there
INTERVAL_S = 0.5  # how often the sshd ancestor is checked (a closed pipe wakes the watcher at once)
GRACE_S = 2.0  # how long the process's children get after SIGTERM before SIGKILL


@dataclass(frozen=True)
class Proc:
    """One process, from /proc/PID/stat."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int  # clock ticks after boot: a pid that was reused has another


def parse_stat(text: str) -> Proc | None:
    """Pure: a Proc from the text of /proc/PID/stat (the name in parentheses may hold anything)."""
    try:
        pid = int(text[:text.index("(")].strip())
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        return Proc(pid, comm, fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (ValueError, IndexError):
        return None


def read_proc(pid: int, proc: str = "/proc") -> Proc | None:
    try:
        with open(f"{proc}/{pid}/stat") as fh:
            return parse_stat(fh.read())
    except OSError:
        return None


def process_table(proc: str = "/proc") -> dict[int, Proc]:
    table = {}
    for name in os.listdir(proc):
        if name.isdigit():
            p = read_proc(int(name), proc)
            if p is not None:
                table[p.pid] = p
    return table


def ancestry(pid: int, read: Callable[[int], Proc | None] = read_proc) -> list[Proc]:
    """PID and its ancestors, itself first, up to (not including) init."""
    chain: list[Proc] = []
    while pid > 1 and len(chain) < 64:
        p = read(pid)
        if p is None:
            break
        chain.append(p)
        pid = p.ppid
    return chain


def sshd_of(chain: list[Proc]) -> Proc | None:
    """Pure: the sshd process a command runs under (its nearest sshd ancestor), or None."""
    return next((p for p in chain[1:] if p.comm in SSHD_NAMES), None)


def sshd_group(chain: list[Proc]) -> int | None:
    """Pure: the command's own process group when sshd made it for this command (sshd's child
    calls setsid() before it runs `sh -c`: the session's leader is then the child of an sshd, and
    the process's group is the session's), else None: the group is then someone else's (a shell's
    job, a test run) and only the process's own children are ended."""
    me = chain[0] if chain else None
    if me is None or me.pgrp != me.session:
        return None
    for i, p in enumerate(chain):
        if p.pid == me.session:
            return me.pgrp if i + 1 < len(chain) and chain[i + 1].comm in SSHD_NAMES else None
    return None


def lost_reason(revents: Iterable[tuple[int, int]], sshd_then: Proc | None, sshd_now: Proc | None) -> str | None:
    """Pure: why the control side is gone, or None. REVENTS: poll()'s (fd, events) for the watched
    output streams; SSHD_THEN: the sshd ancestor found at the start, SSHD_NOW: that pid read now."""
    names = {1: "stdout", 2: "stderr"}
    closed = [names.get(fd, f"fd {fd}") for fd, ev in sorted(revents) if ev & (select.POLLERR | select.POLLHUP)]
    if closed:
        return f"nothing reads its {' and '.join(closed)} any more (the SSH session that started it closed)"
    if sshd_then is not None and (sshd_now is None or sshd_now.start != sshd_then.start or sshd_now.state == "Z"):
        return f"the SSH session it runs under ended (sshd, pid {sshd_then.pid}, exited)"
    return None


def targets(table: Mapping[int, Proc], me: int, group: int | None) -> tuple[list[int], list[int]]:
    """Pure: (ME's descendants, the other processes of GROUP) to end with ME; ME is in neither.
    Descendants go first (SIGTERM, then SIGKILL after a grace): the group's others are the `sh` and
    `sudo` around ME, which end as ME does."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    below, todo = [], list(children.get(me, []))
    while todo:
        pid = todo.pop()
        if pid != me and pid not in below:
            below.append(pid)
            todo.extend(children.get(pid, []))
    others = [] if group is None else sorted(p.pid for p in table.values()
                                             if p.pgrp == group and p.pid != me and p.pid not in below)
    return below, others


def gate_waiting(frames: Mapping[int, FrameType] | None = None, me: int | None = None) -> bool:
    """Whether a thread (other than ME, the watcher's) is inside a gate now: a frame of
    GATE_MODULES on its stack. FRAMES: thread id -> its current frame (sys._current_frames())."""
    frames = sys._current_frames() if frames is None else frames
    me = threading.get_ident() if me is None else me
    for ident, frame in frames.items():
        f: FrameType | None = frame
        while ident != me and f is not None:
            if f.f_globals.get("__name__") in GATE_MODULES:
                return True
            f = f.f_back
    return False


def watched_fds(fds: Iterable[int] = (1, 2)) -> list[int]:
    """The output streams that tell of their reader: pipes and sockets (not files, ttys, /dev/null)."""
    found = []
    for fd in fds:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            found.append(fd)
    return found


def watch_command(name: str, argv: list[str] | None, endable: Callable[[], bool] | None = None
                  ) -> threading.Thread | None:
    """The hook at the top of an on-node command's main(ARGV): watch only when it runs as the
    command (ARGV None: from sys.argv), not when a test or another module calls main(argv)."""
    return watch(name, endable=endable) if argv is None else None


def watch(name: str, endable: Callable[[], bool] | None = None, fds: Iterable[int] = (1, 2),
          interval: float = INTERVAL_S) -> threading.Thread | None:
    """Start the watcher thread of this process (NAME: what it says it ends); None when there is
    nothing to watch (no pipe or socket on FDS and no sshd ancestor). ENDABLE: after the loss,
    end only once it returns True (checked every 0.1 s)."""
    chain = ancestry(os.getpid())
    sshd, group = sshd_of(chain), sshd_group(chain)
    watched = watched_fds(fds)
    if not watched and sshd is None:
        return None
    # duplicates (not inherited by children): the command closing its own fd 1 cannot turn the watch
    # into POLLNVAL at every call (a busy loop), and a pipe still reports the end of its reader
    dups = {os.dup(fd): fd for fd in watched}
    thread = threading.Thread(target=_watch, args=(name, dups, sshd, group, endable, interval),
                              name="pdkit-lifeline", daemon=True)
    thread.start()
    return thread


def _watch(name: str, dups: dict[int, int], sshd: Proc | None, group: int | None,
           endable: Callable[[], bool] | None, interval: float) -> None:
    started = time.monotonic()
    poller = select.poll()
    for fd in dups:
        poller.register(fd, 0)  # no events asked: poll() wakes for POLLERR/POLLHUP only
    while True:
        if dups:
            revents = [(dups[fd], ev) for fd, ev in poller.poll(interval * 1000)]
        else:
            revents = []
            time.sleep(interval)
        reason = lost_reason(revents, sshd, read_proc(sshd.pid) if sshd else None)
        if reason:
            break
    while endable is not None and not endable():
        time.sleep(0.1)
    _end(name, reason, time.monotonic() - started, group)


def _say(message: str) -> None:
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass  # stderr is usually the closed pipe itself: the journal keeps it
    try:
        syslog.openlog(ident="pdkit-lifeline", logoption=syslog.LOG_PID)
        syslog.syslog(syslog.LOG_WARNING, message)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    p = read_proc(pid)
    return p is not None and p.state != "Z"


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _end(name: str, reason: str, took: float, group: int | None) -> None:
    me = os.getpid()
    below, others = targets(process_table(), me, group)
    what = f"{len(below)} child process(es)" + (f" and the {len(others)} around it in its process group {group}"
                                                 if others else "")
    _say(f"{name} (pid {me}): the control side went away after {took:.1f} s: {reason}; ending it, {what}")
    _signal(below, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(_alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal([p for p in below if _alive(p)], signal.SIGKILL)
    _signal(others, signal.SIGTERM)
    os._exit(EXIT_LOST)
