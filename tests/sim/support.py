"""Helpers for the sim tests: managed processes with guaranteed cleanup, polling, requests.

Command lines, free ports and the router readiness check come from pdkit.sim.localstack, which
the benchmark uses too.

Every process is started in its own session and registered; `Processes.stop_all()` (called by
the fixtures) and an atexit hook make sure nothing outlives the test run, even on Ctrl-C.
Waiting is always polling with a deadline and a message that carries the process logs.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests

from pdkit.sim.localstack import (
    free_ports,
    router_command,
    router_workers_ready,
    sim_command,
)

PYTHON = sys.executable
MODEL_PATH = "/models/sim-test"
MODEL = "sim-test"

# Short PD timeouts so that failure paths finish within a test's budget. The heartbeat is SGLang's
# floor (2 s: the sim applies it as SGLang does), so a dead prefill is noticed in ~4 s, before the
# waiting timeout; the pre-handshake retries are 0.1 s apart (SGLang: 1 s) so 15 of them take 1.5 s.
SIM_TEST_ENV = {
    "PDKIT_SIM_STARTUP_DELAY_S": "0.2",
    "PDKIT_SIM_BOOTSTRAP_RETRY_S": "0.1",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "8",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}

T = TypeVar("T")


class ManagedProcess:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """Hard kill (the way a crashed engine disappears)."""
        self._signal_group(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class Processes:
    """Registry of the processes one fixture started; stop_all() ends every one of them."""

    _all: list[Processes] = []

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.items: list[ManagedProcess] = []
        Processes._all.append(self)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> ManagedProcess:
        full_env = {**os.environ, **SIM_TEST_ENV, **(env or {})}
        proc = ManagedProcess(name, argv, full_env, self.log_dir / f"{name}.log")
        self.items.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}) ---\n{p.log_tail()}" for p in self.items)

    def stop_all(self) -> None:
        for proc in reversed(self.items):
            proc.stop()
        self.items.clear()


@atexit.register
def _stop_everything() -> None:
    for group in Processes._all:
        group.stop_all()


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.05,
               context: Callable[[], str] = lambda: "") -> T:
    """Poll `check` until it returns something truthy; fail with `what` and context on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - polling a service that is coming up
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})\n{context()}")
        time.sleep(interval)


def get(url: str, timeout: float = 5.0) -> requests.Response:
    return requests.get(url, timeout=timeout)


def post(url: str, body: dict[str, Any], timeout: float = 30.0, stream: bool = False) -> requests.Response:
    return requests.post(url, json=body, timeout=timeout, stream=stream)


def status_of(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0


def sim_argv(mode: str, port: int, bootstrap_port: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The argv the kit would render for sglang.launch_server, run with the sim instead."""
    return sim_command(mode, port, bootstrap_port, ["--decode-log-interval", "5", *extra],
                       model_path=MODEL_PATH, model=MODEL)


def wait_ready(procs: Processes, proc: ManagedProcess, port: int, timeout: float = 20.0) -> ManagedProcess:
    """Wait until a sim answers /health with 200 (the sim's ready state)."""

    def ready() -> bool:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        return status_of(f"http://127.0.0.1:{port}/health") == 200

    wait_until(ready, timeout, f"{proc.name} to become ready", context=procs.logs)
    return proc


def launch_sim(procs: Processes, name: str, mode: str, port: int, bootstrap_port: int | None = None,
               extra: Sequence[str] = (), env: dict[str, str] | None = None) -> ManagedProcess:
    return procs.start(name, sim_argv(mode, port, bootstrap_port, extra), env)


def start_sim(procs: Processes, name: str, mode: str, port: int, bootstrap_port: int | None = None,
              extra: Sequence[str] = (), env: dict[str, str] | None = None, timeout: float = 20.0) -> ManagedProcess:
    """Start a sim and wait until it is ready."""
    return wait_ready(procs, launch_sim(procs, name, mode, port, bootstrap_port, extra, env), port, timeout)


def workers_healthy(router_url: str) -> bool:
    return router_workers_ready(router_url)


def completion_ok(router_url: str) -> bool:
    resp = post(f"{router_url}/v1/completions", {"model": MODEL, "prompt": "ping", "max_tokens": 2}, timeout=10)
    return resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2


def start_router(procs: Processes, prefill_port: int, bootstrap_port: int, decode_port: int,
                 timeout: float = 30.0) -> tuple[ManagedProcess, str, str]:
    """Start smg in PD mode; wait until its worker list is healthy and a real request succeeds."""
    port, metrics_port = free_ports(2)
    proc = procs.start("router", router_command(prefill_port, bootstrap_port, decode_port, port, metrics_port))
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not proc.alive():
            raise AssertionError(f"router exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        return workers_healthy(url) and completion_ok(url)

    wait_until(ready, timeout, "router workers healthy and a request served", interval=0.2, context=procs.logs)
    return proc, url, f"http://127.0.0.1:{metrics_port}"


def sse_events(resp: requests.Response) -> list[Any]:
    """Decoded `data:` events of an SSE response, up to and excluding [DONE]."""
    import json

    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        events.append(json.loads(payload))
    return events


@contextlib.contextmanager
def gated_unit(tmp_path: Path, monkeypatch, unit: str, exec_start: str) -> Iterator[tuple[Processes, Path]]:
    """A node for the engine gate (pdkit.agent.health) without systemd: UNIT is active (one invocation) and
    its journal holds nothing (rotated away, as on a busy box), its unit file runs EXEC_START; the
    process group its sim engines start in, and the unit file."""
    from pdkit.agent import health

    monkeypatch.setattr(health, "_unit_snapshot", lambda _unit: {"ActiveState": "active", "SubState": "running",
                                                                 "InvocationID": "inv1", "NRestarts": "0"})
    monkeypatch.setattr(health, "unit_log", lambda _unit, invocation, lines=None: "")
    unit_file = tmp_path / unit
    unit_file.write_text(f"[Service]\nExecStart={exec_start}\n")
    group = Processes(tmp_path)
    try:
        yield group, unit_file
    finally:
        group.stop_all()
