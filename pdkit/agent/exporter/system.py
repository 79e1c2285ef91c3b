"""What the exporter reads from the node itself: systemd's main PIDs, /proc/PID/{environ,cmdline},
and the units' journal. Parsing is in pure functions; the classes hold the little state that
keeps each scrape cheap and bounded.

- Main PIDs come from one `systemctl show -p Id -p MainPID UNIT...` for all engines, and only
  when a cached PID stopped being the same process (its start time in /proc/PID/stat changed)
  or every `refresh_s`. A process's environment and argv are fixed at exec, so they are read
  once per process, not once per scrape.
- The journal is read with one `journalctl -u UNIT... -o json` per scrape for all engines,
  resuming after the cursor of the last entry seen, at most `max_entries` entries a scrape. When
  a read hits that bound (a backlog), the next read jumps to the newest entries instead of
  crawling through the backlog: the exporter only exposes the *last* batch figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# ----------------------------------------------------------------------------------- /proc


def parse_environ(data: bytes) -> dict[str, str]:
    """/proc/PID/environ (NUL-separated KEY=VALUE) -> dict. Bytes that are not UTF-8 are kept
    as surrogate escapes so a value never fails to decode."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return env


def parse_cmdline(data: bytes) -> list[str]:
    """/proc/PID/cmdline (NUL-terminated argv) -> list."""
    parts = data.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return [p.decode("utf-8", "surrogateescape") for p in parts]


def env_problems(expected: Mapping[str, str | None], actual: Mapping[str, str]) -> dict[str, str]:
    """{VAR: "missing"|"different"} for each planned variable the process does not have as planned.

    An expected value of None means "must be set, any value" (for secrets the exporter must not know).
    """
    problems: dict[str, str] = {}
    for name, value in expected.items():
        if name not in actual:
            problems[name] = "missing"
        elif value is not None and actual[name] != value:
            problems[name] = "different"
    return problems


def proc_start_time(stat: str) -> int:
    """Field 22 (starttime, clock ticks since boot) of /proc/PID/stat; the name may hold spaces and ')'."""
    return int(stat.rsplit(")", 1)[1].split()[19])


class ProcError(Exception):
    """A process could not be inspected; `reason` is one short word for a metric or log."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class ProcessView:
    pid: int
    start_time: int
    environ: dict[str, str] | None  # None: not readable (error in environ_error)
    environ_error: str | None
    cmdline: list[str] | None


def read_process(pid: int, proc_root: str = "/proc") -> ProcessView:
    """Start time, environment and argv of a process. Raises ProcError when it is gone."""
    base = f"{proc_root}/{pid}"
    try:
        with open(f"{base}/stat") as f:
            start = proc_start_time(f.read())
    except (OSError, ValueError, IndexError) as exc:
        raise ProcError("no_process", f"{base}/stat: {exc}") from None
    environ: dict[str, str] | None = None
    environ_error = None
    try:
        with open(f"{base}/environ", "rb") as f:
            environ = parse_environ(f.read())
    except PermissionError as exc:
        environ_error = (f"permission denied reading {base}/environ ({exc.strerror}): run the exporter as the "
                         "engines' user")
    except OSError as exc:
        environ_error = f"{base}/environ: {exc}"
    cmdline: list[str] | None
    try:
        with open(f"{base}/cmdline", "rb") as f:
            cmdline = parse_cmdline(f.read()) or None
    except OSError:
        cmdline = None
    if cmdline is None and not environ and environ_error is None:
        # right after fork/exec the new image's argv and environment are not laid out yet (both
        # read empty); a view taken then would be cached for the life of the process
        raise ProcError("starting", f"{base}: argv and environment still empty (process starting)")
    return ProcessView(pid, start, environ, environ_error, cmdline)


def still_same_process(view: ProcessView, proc_root: str = "/proc") -> bool:
    try:
        with open(f"{proc_root}/{view.pid}/stat") as f:
            return proc_start_time(f.read()) == view.start_time
    except (OSError, ValueError, IndexError):
        return False


# ---------------------------------------------------------------------------------- systemd


def parse_systemctl_show(text: str) -> list[dict[str, str]]:
    """`systemctl show -p A -p B u1 u2` output -> one {property: value} per unit, in order.

    systemctl separates the units' blocks with an empty line.
    """
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    if current:
        blocks.append(current)
    return blocks


Runner = Callable[[Sequence[str], float], "tuple[int, bytes, bytes]"]


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, bytes, bytes]:
    """Run a command once, with a timeout: (exit status, stdout, stderr). 127 when it is missing."""
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        return 127, b"", str(exc).encode()
    except subprocess.TimeoutExpired:
        return 124, b"", f"timed out after {timeout:g} s".encode()
    return done.returncode, done.stdout, done.stderr


class PidLookupError(Exception):
    pass


class SystemdPids:
    """Unit -> MainPID through systemctl (0 when the unit runs no process)."""

    def __init__(self, runner: Runner = run_command, systemctl: str = "systemctl", timeout: float = 5.0) -> None:
        self.runner = runner
        self.systemctl = systemctl
        self.timeout = timeout

    def lookup(self, units: Sequence[str]) -> dict[str, int]:
        argv = [self.systemctl, "show", "-p", "Id", "-p", "MainPID", *units]
        rc, out, err = self.runner(argv, self.timeout)
        if rc != 0:
            raise PidLookupError(f"{' '.join(argv[:2])} exited {rc}: {err.decode(errors='replace').strip()[:200]}")
        blocks = parse_systemctl_show(out.decode(errors="replace"))
        if len(blocks) != len(units):
            raise PidLookupError(f"systemctl show returned {len(blocks)} blocks for {len(units)} units")
        pids = {}
        for unit, block in zip(units, blocks):
            try:
                pids[unit] = int(block.get("MainPID", "0") or 0)
            except ValueError:
                raise PidLookupError(f"unreadable MainPID for {unit}: {block.get('MainPID')!r}") from None
        return pids


@dataclass
class ProcessCheck:
    """The unit's main process as seen now, or why it could not be seen."""

    pid: int | None = None
    view: ProcessView | None = None
    error: str | None = None  # short reason: no_unit | pid_lookup | not_running | no_process | starting | environ
    detail: str | None = None


class ProcessInspector:
    """Cached view of each unit's main process: one cheap /proc/PID/stat read per unit per scrape
    while the process stays the same; a systemctl call only when it changed or every refresh_s."""

    def __init__(self, pids: SystemdPids | None = None, proc_root: str = "/proc", refresh_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pids = pids or SystemdPids()
        self.proc_root = proc_root
        self.refresh_s = refresh_s
        self.clock = clock
        self._views: dict[str, ProcessView] = {}
        self._looked_up_at = -float("inf")

    def check(self, units: Sequence[str | None]) -> list[ProcessCheck]:
        real = [u for u in units if u]
        stale = self.clock() - self._looked_up_at >= self.refresh_s
        invalid = [u for u in real if u not in self._views or not still_same_process(self._views[u], self.proc_root)]
        lookup_error = None
        pids: dict[str, int] = {}
        if real and (stale or invalid):
            try:
                pids = self.pids.lookup(real)
                self._looked_up_at = self.clock()
            except PidLookupError as exc:
                lookup_error = str(exc)
        out = []
        for unit in units:
            if not unit:
                out.append(ProcessCheck(error="no_unit", detail="no unit name configured"))
                continue
            if lookup_error is not None:
                self._views.pop(unit, None)
                out.append(ProcessCheck(error="pid_lookup", detail=lookup_error))
                continue
            cached = self._views.get(unit)
            if unit in pids:
                pid = pids[unit]
                if pid <= 0:
                    self._views.pop(unit, None)
                    out.append(ProcessCheck(error="not_running", detail=f"{unit} has no main process"))
                    continue
                if cached is None or cached.pid != pid or unit in invalid:
                    try:
                        cached = read_process(pid, self.proc_root)
                    except ProcError as exc:
                        self._views.pop(unit, None)
                        out.append(ProcessCheck(pid=pid, error=exc.reason, detail=str(exc)))
                        continue
                    self._views[unit] = cached
            if cached is None:
                out.append(ProcessCheck(error="not_running", detail=f"{unit} has no main process"))
                continue
            if cached.environ is None:
                out.append(ProcessCheck(pid=cached.pid, view=cached, error="environ", detail=cached.environ_error))
            else:
                out.append(ProcessCheck(pid=cached.pid, view=cached))
        return out


# ---------------------------------------------------------------------------------- journal


@dataclass(frozen=True)
class JournalEntry:
    unit: str | None
    message: str
    realtime_s: float | None


def _message(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # journald's JSON writes non-UTF-8 messages as a byte array
        try:
            return bytes(value).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return None
    return None


def parse_journal_json(data: bytes, needle: bytes | None = b"batch") -> tuple[list[JournalEntry], str | None, int]:
    """`journalctl -o json` output -> (entries whose raw line contains `needle`, last cursor, entry count).

    Lines without the needle are not decoded (a scrape may read thousands of access-log lines);
    the cursor comes from the last line in any case.
    """
    lines = [line for line in data.split(b"\n") if line.strip()]
    entries: list[JournalEntry] = []
    cursor = None
    text_needle = needle.decode() if needle is not None else None
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        # a non-UTF-8 MESSAGE comes as an array of byte values: the needle is not visible in the raw line
        maybe = needle is None or needle in line or b'"MESSAGE":[' in line or b'"MESSAGE": [' in line
        if not maybe and not last:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if last and isinstance(obj.get("__CURSOR"), str):
            cursor = obj["__CURSOR"]
        message = _message(obj.get("MESSAGE"))
        if message is None or (text_needle is not None and text_needle not in message):
            continue
        unit = obj.get("_SYSTEMD_UNIT") or obj.get("UNIT")
        try:
            realtime = int(obj["__REALTIME_TIMESTAMP"]) / 1e6
        except (KeyError, TypeError, ValueError):
            realtime = None
        entries.append(JournalEntry(unit if isinstance(unit, str) else None, message, realtime))
    return entries, cursor, len(lines)


class JournalError(Exception):
    pass


@dataclass
class JournalReader:
    units: Sequence[str]
    max_entries: int = 2000
    timeout: float = 5.0
    journalctl: Sequence[str] = ("journalctl",)
    runner: Runner = run_command
    cursor: str | None = None

    def command(self) -> list[str]:
        argv = [*self.journalctl, "--no-pager", "--quiet", "-o", "json", "--output-fields=MESSAGE,_SYSTEMD_UNIT,UNIT"]
        for unit in self.units:
            argv += ["-u", unit]
        if self.cursor is not None:
            # the first max_entries entries after the cursor, oldest first
            argv += ["--after-cursor", self.cursor]
        # without a cursor: the newest max_entries entries
        argv += ["-n", str(self.max_entries)]
        return argv

    def read(self) -> list[JournalEntry]:
        """New entries (only those that may be batch lines) since the last read; bounded work."""
        if not self.units:
            return []
        argv = self.command()
        rc, out, err = self.runner(argv, self.timeout)
        if rc != 0:
            had_cursor = self.cursor is not None
            self.cursor = None  # e.g. "Failed to seek to cursor" after a journal rotation: restart at the tail
            raise JournalError(f"journalctl exited {rc}{' (cursor dropped)' if had_cursor else ''}: "
                               f"{err.decode(errors='replace').strip()[:200]}")
        entries, cursor, count = parse_journal_json(out)
        in_cursor_mode = self.cursor is not None
        if cursor is not None:
            self.cursor = cursor
        if in_cursor_mode and count >= self.max_entries:
            # a backlog: skip to the newest entries next time rather than crawl through it
            self.cursor = None
        return entries

    def attribute(self, entry: JournalEntry) -> str | None:
        """Which of our units an entry belongs to."""
        if entry.unit in self.units:
            return entry.unit
        if len(self.units) == 1:
            return self.units[0]
        return None


__all__ = [
    "JournalEntry",
    "JournalError",
    "JournalReader",
    "PidLookupError",
    "ProcError",
    "ProcessCheck",
    "ProcessInspector",
    "ProcessView",
    "SystemdPids",
    "env_problems",
    "parse_cmdline",
    "parse_environ",
    "parse_journal_json",
    "parse_systemctl_show",
    "proc_start_time",
    "read_process",
    "run_command",
    "still_same_process",
]


# ------------------------------------------------------------------------------ reboot marker

# written by roles/nvidia_driver.py when the driver packages changed (pdkit.render.node.REBOOT_MARKER_PATH)
REBOOT_MARKER_PATH = "/var/lib/pdkit-node/reboot-required"


def reboot_required(path: str = REBOOT_MARKER_PATH) -> float:
    """1.0 while pdkit's reboot-required marker exists (a driver change waits for a drained reboot)."""
    return 1.0 if os.path.exists(path) else 0.0
