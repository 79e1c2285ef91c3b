"""The lab fixture's session lock: a second test session waits for the first instead of taking its lab down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.lab.conftest import _hold_session_lock

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0); os.pwrite(fd, str(os.getpid()).encode(), 0)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_second_session_waits_for_the_first_and_names_it(tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "pdkit-lab"
    monkeypatch.setenv("PDKIT_LAB_DIR", str(state))
    lock = tmp_path / "pdkit-lab.session.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        said: list[str] = []
        t0 = time.monotonic()
        fd = _hold_session_lock(said.append)
        waited = time.monotonic() - t0
    finally:
        holder.wait(timeout=10)
    try:
        assert waited >= 1.0, f"took the lab after {waited:.2f} s while another session held it"
        assert said and f"in use by pid {holder.pid}" in said[0], said
        assert os.pread(fd, 64, 0).decode() == str(os.getpid())  # the next waiter names this session
    finally:
        os.close(fd)


def test_a_free_lab_is_taken_at_once_and_silently(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PDKIT_LAB_DIR", str(tmp_path / "pdkit-lab"))
    said: list[str] = []
    fd = _hold_session_lock(said.append)
    try:
        assert said == []
        assert (tmp_path / "pdkit-lab.session.lock").stat().st_mode & 0o777 == 0o600
    finally:
        os.close(fd)
