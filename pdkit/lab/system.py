"""Host-side plumbing for the lab: commands with timeouts, progress, cgroups, processes.

What gpu/nspawn/host.py needs too (commands, processes by start time, cgroups, mounts) lives in
pdkit/hosts/nspawn_common.py; here are the lab's own, and `run`, which raises its failures as LabError."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pdkit.hosts import nspawn_common
from pdkit.hosts.nspawn_common import CommandError, proc_alive
from pdkit.lab.model import LabError

# tool -> Debian package that provides it
REQUIRED_TOOLS: dict[str, str] = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "apt-cacher-ng": "apt-cacher-ng",
    "zstd": "zstd",
    "tar": "tar",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "mount": "mount",
}
PREREQS_SCRIPT = ".ci/lab-prereqs.sh"
EXTRA_PATH = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


class NotRoot(LabError):
    exit_code = 2


class MissingTool(LabError):
    exit_code = 2


def require_root() -> None:
    if os.geteuid() != 0:
        raise NotRoot(
            "needs root (it creates network namespaces, a bridge and systemd-nspawn containers): run it with sudo"
        )


def which(tool: str) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    for d in EXTRA_PATH:
        cand = Path(d) / tool
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def missing_tools() -> list[tuple[str, str]]:
    """``[(tool, package), ...]`` for every host tool the lab needs that is not installed."""
    return [(t, p) for t, p in REQUIRED_TOOLS.items() if which(t) is None]


def require_tools() -> None:
    missing = missing_tools()
    if missing:
        pkgs = sorted({p for _, p in missing})
        tools = ", ".join(t for t, _ in missing)
        raise MissingTool(f"missing host tool(s) {tools}: apt-get install {' '.join(pkgs)} (or run {PREREQS_SCRIPT})")


# ---------------------------------------------------------------- output


class Progress:
    """Timestamped progress lines on stderr (long steps say what they are doing)."""

    def __init__(self, stream=None, quiet: bool = False) -> None:
        self.t0 = time.monotonic()
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self.elapsed():6.1f}s] {msg}", file=self.stream, flush=True)


# ---------------------------------------------------------------- commands


@contextlib.contextmanager
def lab_errors() -> Iterator[None]:
    """A CommandError (pdkit.hosts.nspawn_common) raised as LabError: what the lab's CLI reports in one line."""
    try:
        yield
    except CommandError as exc:
        raise LabError(str(exc)) from None


def run(cmd: Sequence[str], **options) -> subprocess.CompletedProcess[str]:
    """nspawn_common.run (OPTIONS: its timeout, check, input, capture, env), a failure raised as LabError."""
    with lab_errors():
        return nspawn_common.run(cmd, **options)


def run_streaming(
    cmd: Sequence[str],
    *,
    timeout: float,
    log_path: Path,
    on_line: Callable[[str], None] | None = None,
) -> None:
    """Run a long command, log all of its output to ``log_path``, hand each line to ``on_line``.

    The whole process group is killed when ``timeout`` expires.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        try:
            while True:
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    raise LabError(f"timed out after {timeout:.0f}s: {' '.join(cmd)} (log: {log_path})")
                ready, _, _ = select.select([fd], [], [], 0.5)
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:  # EOF: the command closed its output
                    break
                log.write(chunk)
                log.flush()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if on_line:
                    for line in lines:
                        on_line(line.decode(errors="replace"))
            remaining = max(1.0, deadline - time.monotonic())
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise LabError(f"timed out after {timeout:.0f}s: {' '.join(cmd)} (log: {log_path})") from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            proc.stdout.close()
        if buf and on_line:
            on_line(buf.decode(errors="replace"))
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise LabError(f"exit {proc.returncode}: {cmd[0]}: {tail[0]} (log: {log_path})")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# ---------------------------------------------------------------- processes


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pids_rooted_under(path: Path) -> list[int]:
    """Processes whose root directory lies under ``path`` (container payloads)."""
    out = []
    prefix = str(path).rstrip("/") + "/"
    for pid in all_pids():
        try:
            root = os.readlink(f"/proc/{pid}/root")
        except OSError:
            continue
        if root.startswith(prefix) or root == prefix.rstrip("/"):
            out.append(pid)
    return out


def pids_with_arg_under(path: Path) -> list[int]:
    """Processes with a command-line argument that names ``path`` or something under it."""
    out = []
    me = os.getpid()
    needle = str(path).rstrip("/")
    for pid in all_pids():
        if pid == me:
            continue
        for arg in proc_cmdline(pid):
            if needle in arg:
                out.append(pid)
                break
    return out


def reap(pids: Sequence[int]) -> None:
    """Collect exit statuses of our own children (when the lab runs inside a long-lived process)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    reap(pids)
    left = [p for p in pids if proc_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        reap(left)
        left = [p for p in left if proc_alive(p)]
    return left


# ---------------------------------------------------------------- cgroups


def memory_usage(cgroup_dirs: Sequence[str | Path]) -> dict[str, int] | None:
    """rss / cache bytes of a container from its memory cgroup (v1 or v2), if any."""
    for d in map(Path, cgroup_dirs):
        stat = d / "memory.stat"
        if not stat.exists():
            continue
        values = {}
        for line in stat.read_text().splitlines():
            k, _, v = line.partition(" ")
            values[k] = int(v)
        if "total_rss" in values:  # v1, hierarchical
            return {"rss": values["total_rss"], "cache": values.get("total_cache", 0)}
        if "anon" in values:  # v2
            return {"rss": values["anon"], "cache": values.get("file", 0)}
    return None


def pss_bytes(pids: Sequence[int]) -> int | None:
    """Proportional set size of a set of processes (shared pages split fairly)."""
    total, seen = 0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
                    break
        except OSError:
            continue
    return total if seen else None


def has_capability(cap: int) -> bool:
    """Is ``cap`` in this process's bounding set (e.g. 24 = CAP_SYS_RESOURCE)?"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


# ---------------------------------------------------------------- sockets


def tcp_listening(address: str, port: int) -> bool:
    """Is something on this machine listening on address:port (or on 0.0.0.0:port)?

    Read from /proc/net/tcp, not by connecting: on some networks a connection to an
    address that is not local is accepted by a transparent proxy upstream.
    """
    wanted = {
        f"{struct.unpack('<I', socket.inet_aton(address))[0]:08X}:{port:04X}",
        f"00000000:{port:04X}",
    }
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if fields[3] == "0A" and fields[1] in wanted:  # 0A = LISTEN
            return True
    return False
