"""Shared fixture for lab tests: one systemd-nspawn lab per test session.

    def test_something(lab):          # lab: pdkit.lab.model.LabInfo of the running lab
        for name, data in lab.pyinfra_hosts(): ...

- Brings the lab up once per session (`pdkit lab up --hosts $PDKIT_LAB_HOSTS`, default 3)
  and takes it down at the end; teardown fails if anything was left behind.
- PDKIT_LAB_KEEP=1: reuse a running lab (any size) and leave it up afterwards, for quick
  re-runs while developing. Without it, a lab that is already running is taken down first
  so that every session starts from fresh hosts.
- Holds an exclusive lock on the lab's state directory for the whole session
  (`<state dir>.session.lock`): the lab is one per machine, so a second test session (two
  fresh-clone CI runs side by side) waits for the first instead of taking its lab down.
- Skips (does not fail) when not root or when the host tools are missing; the reason
  names .ci/lab-prereqs.sh.
Mark lab tests with @pytest.mark.lab.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator

import pytest

from pdkit.lab.lifecycle import down, leftovers, status, up
from pdkit.lab.model import DEFAULT_GPU_HOSTS, LabError, LabInfo, lab_dir, load_lab
from pdkit.lab.system import Progress, missing_tools
from tests.conftest import require

PREREQS = ".ci/lab-prereqs.sh"


def lab_skip_reason() -> str | None:
    """Why lab tests cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "lab tests need root (systemd-nspawn, network namespaces, a bridge): run pytest as root"
    missing = missing_tools()
    if missing:
        pkgs = " ".join(sorted({p for _, p in missing}))
        return f"lab prerequisites missing ({pkgs}): run `sudo {PREREQS}`"
    return None


def _progress() -> Progress:
    # pytest captures stdout; progress goes to the real stderr so a cold build (~1 min) shows
    return Progress(stream=sys.__stderr__)


def _hold_session_lock(progress: Progress) -> int:
    """Take the machine's lab for this session: wait (saying so) while another session holds it."""
    state = lab_dir()
    path = state.parent / f"{state.name}.session.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another test session"
        progress(f"the lab is in use by pid {holder}: waiting for it ({path})")
        t0 = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        progress(f"the lab is free after {time.monotonic() - t0:.0f} s")
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


@pytest.fixture(scope="session")
def lab() -> Iterator[LabInfo]:
    reason = lab_skip_reason()
    if reason:
        # under CI, .ci/run installs the prerequisites and runs as root: a skip would hide a gap
        require(False, reason)
    keep = os.environ.get("PDKIT_LAB_KEEP") == "1"
    n_gpu = int(os.environ.get("PDKIT_LAB_HOSTS", DEFAULT_GPU_HOSTS))
    progress = _progress()
    # held until the process ends (its descriptor is never closed): the teardown below runs under it
    _hold_session_lock(progress)

    info = None
    if keep:
        running = load_lab()
        if running is not None and status(probe_ssh=False).state == "up":
            progress(f"PDKIT_LAB_KEEP=1: reusing the running lab ({len(running.hosts)} hosts)")
            info = running
    elif load_lab() is not None or leftovers():
        progress("a lab is already up: taking it down for a fresh session (PDKIT_LAB_KEEP=1 reuses it)")
        down(progress=progress)
    if info is None:
        try:
            info = up(n_gpu, progress=progress)
        except LabError as exc:
            pytest.fail(f"pdkit lab up failed: {exc}", pytrace=False)
    assert info is not None

    yield info

    if keep:
        progress("PDKIT_LAB_KEEP=1: leaving the lab up (`pdkit lab down` removes it)")
        return
    left = down(progress=progress)
    assert not left, f"lab down left things behind: {left}"
