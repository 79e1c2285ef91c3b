"""A sim prefill, a sim decode and the real smg router on loopback, for benchmarks and tests.

The readiness gate is the one a real deployment needs: the router answers /health with 200
before its workers are registered, so "ready" means its worker list (GET /workers) shows a
healthy, ready prefill and decode, and then a real request through it succeeds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

MODEL_PATH = "/models/sim"
MODEL = "sim"


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all sockets held until every port is picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def smg_binary() -> str:
    return shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg") or "smg"


def sim_command(mode: str, port: int, bootstrap_port: int | None = None, extra: Sequence[str] = (),
                model_path: str = MODEL_PATH, model: str = MODEL) -> list[str]:
    """A `python -m pdkit.sim` command line with SGLang's flags, as the kit renders them."""
    argv = [sys.executable, "-m", "pdkit.sim", "--model-path", model_path, "--served-model-name", model,
            "--host", "127.0.0.1", "--port", str(port), "--enable-metrics"]
    if mode != "null":
        argv += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "nixl"]
    if bootstrap_port is not None:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return argv + list(extra)


def router_command(prefill_port: int, bootstrap_port: int, decode_port: int, port: int, metrics_port: int,
                   extra: Sequence[str] = ()) -> list[str]:
    """smg in PD mode. Fast worker checks, so that registration and recovery take seconds."""
    return [
        smg_binary(), "launch", "--pd-disaggregation",
        "--prefill", f"http://127.0.0.1:{prefill_port}", str(bootstrap_port),
        "--decode", f"http://127.0.0.1:{decode_port}",
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-startup-check-interval", "1",
        "--health-check-interval-secs", "1",
        "--health-failure-threshold", "2",
        "--health-success-threshold", "1",
        "--shutdown-grace-period-secs", "1",
        "--log-level", "warn",
        *extra,
    ]


def router_workers_ready(router_url: str, timeout: float = 2.0) -> bool:
    """True when the router lists a healthy, ready prefill and decode (its /health is not enough)."""
    workers = requests.get(f"{router_url}/workers", timeout=timeout).json().get("workers", [])
    kinds = {w.get("worker_type") for w in workers if w.get("is_healthy") and w.get("status") == "ready"}
    return {"prefill", "decode"} <= kinds


def router_serves(router_url: str, model: str = MODEL, timeout: float = 10.0) -> bool:
    resp = requests.post(f"{router_url}/v1/completions", json={"model": model, "prompt": "ping", "max_tokens": 2},
                         timeout=timeout)
    return resp.status_code == 200 and resp.json().get("usage", {}).get("completion_tokens") == 2


@dataclass
class LocalProcess:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None

    def start(self) -> LocalProcess:
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, **self.env}, start_new_session=True)
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def wait_for(check, timeout: float, what: str, procs: Sequence[LocalProcess], interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited while waiting for {what}:\n{p.log_tail()}")
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - services coming up
            last = exc
        time.sleep(interval)
    tails = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in procs)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last})\n{tails}")


@dataclass
class LocalPDStack:
    """Start with `with LocalPDStack(log_dir) as stack:`; everything is stopped on exit."""

    log_dir: Path
    sim_env: dict[str, Any] = field(default_factory=dict)
    sim_extra: Sequence[str] = ()
    router_extra: Sequence[str] = ()
    procs: list[LocalProcess] = field(default_factory=list)

    def __enter__(self) -> LocalPDStack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.prefill_port, self.bootstrap_port, self.decode_port,
         self.router_port, self.router_metrics_port) = free_ports(5)
        env = {k: str(v) for k, v in self.sim_env.items()}
        try:
            self.prefill = self._start("prefill", sim_command("prefill", self.prefill_port, self.bootstrap_port,
                                                              self.sim_extra), env)
            self.decode = self._start("decode", sim_command("decode", self.decode_port, None, self.sim_extra), env)
            # /health 200 only, not pdkit.agent.health.wait_engine: local processes, no systemd unit
            # or journal for the gate to read
            for port in (self.prefill_port, self.decode_port):
                wait_for(lambda p=port: requests.get(f"http://127.0.0.1:{p}/health", timeout=2).status_code == 200,
                         30, f"the sim on port {port} to be ready", self.procs)
            self.router = self._start("router", router_command(self.prefill_port, self.bootstrap_port,
                                                               self.decode_port, self.router_port,
                                                               self.router_metrics_port, self.router_extra), {})
            wait_for(lambda: router_workers_ready(self.router_url) and router_serves(self.router_url), 60,
                     "the router's workers to be healthy and a request to succeed", self.procs, interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> LocalProcess:
        proc = LocalProcess(name, argv, self.log_dir / f"{name}.log", env).start()
        self.procs.append(proc)
        return proc

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def __exit__(self, *exc: object) -> None:
        self.stop()
