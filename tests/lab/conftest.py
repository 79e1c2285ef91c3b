"""Shared fixture for lab tests: one systemd-nspawn lab per test session.

    def test_something(lab):          # lab: pdkit.lab.LabInfo of the running lab
        for name, data in lab.pyinfra_hosts(): ...

- Brings the lab up once per session (`pdkit lab up --hosts $PDKIT_LAB_HOSTS`, default 3)
  and takes it down at the end; teardown fails if anything was left behind.
- PDKIT_LAB_KEEP=1: reuse a running lab (any size) and leave it up afterwards, for quick
  re-runs while developing. Without it, a lab that is already running is taken down first
  so that every session starts from fresh hosts.
- Skips (does not fail) when not root or when the host tools are missing; the reason
  names .ci/lab-prereqs.sh.
Mark lab tests with @pytest.mark.lab.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from pdkit import lab as pdlab
from pdkit.lab.system import Progress
from tests.conftest import require

PREREQS = ".ci/lab-prereqs.sh"


def lab_skip_reason() -> str | None:
    """Why lab tests cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "lab tests need root (systemd-nspawn, network namespaces, a bridge): run pytest as root"
    missing = pdlab.missing_tools()
    if missing:
        pkgs = " ".join(sorted({p for _, p in missing}))
        return f"lab prerequisites missing ({pkgs}): run `sudo {PREREQS}`"
    return None


def _progress() -> Progress:
    # pytest captures stdout; progress goes to the real stderr so a cold build (~1 min) shows
    return Progress(stream=sys.__stderr__)


@pytest.fixture(scope="session")
def lab() -> Iterator[pdlab.LabInfo]:
    reason = lab_skip_reason()
    if reason:
        # under CI, .ci/run installs the prerequisites and runs as root: a skip would hide a gap
        require(False, reason)
    keep = os.environ.get("PDKIT_LAB_KEEP") == "1"
    n_gpu = int(os.environ.get("PDKIT_LAB_HOSTS", pdlab.DEFAULT_GPU_HOSTS))
    progress = _progress()

    info = None
    if keep:
        running = pdlab.load_lab()
        if running is not None and pdlab.status(probe_ssh=False).state == "up":
            progress(f"PDKIT_LAB_KEEP=1: reusing the running lab ({len(running.hosts)} hosts)")
            info = running
    elif pdlab.load_lab() is not None or pdlab.leftovers():
        progress("a lab is already up: taking it down for a fresh session (PDKIT_LAB_KEEP=1 reuses it)")
        pdlab.down(progress=progress)
    if info is None:
        try:
            info = pdlab.up(n_gpu, progress=progress)
        except pdlab.LabError as exc:
            pytest.fail(f"pdkit lab up failed: {exc}", pytrace=False)
    assert info is not None

    yield info

    if keep:
        progress("PDKIT_LAB_KEEP=1: leaving the lab up (`pdkit lab down` removes it)")
        return
    left = pdlab.down(progress=progress)
    assert not left, f"lab down left things behind: {left}"
