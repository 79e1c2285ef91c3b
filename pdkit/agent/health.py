r"""Health gates, run ON the host right after a restart (stdlib only: it runs in the node venv).

    python -m pdkit.health engine --unit pdkit-engine-decode.service --url http://H:30001/health --timeout 600
    python -m pdkit.health router --url http://H:8000 --worker http://H:30000 --worker http://H:30001 --timeout 120
    python -m pdkit.health gates --engine pdkit-engine-decode.service http://H:30001/health 600 \
        --service pdkit-exporter.service http://H:9400/metrics 180

An engine is ready from what it answers now: its unit is active (the same systemd invocation
throughout), /health answers 200 and /server_info is readable; its shape (KV pool, max running
requests, context length, CUDA-graph sizes) is recorded at its configuration's first healthy
start and compared after every later one (pdkit/agent/engineshape.py). SGLang's readiness line is
extra evidence only (journald rotates it away on a busy box). A router is ready when its
worker list holds every planned worker as healthy: its own /health answers 200 before any
worker has registered (it reports the router process, not its workers), so that alone proves
nothing. Exit 0 when ready, 1 with a one-line reason (and the unit's last log lines) when not.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pdkit.agent import engineshape, enginestarts, jitcache
from pdkit.upstream.metricnames import SGLANG

READY_LOG_LINE = "The server is fired up and ready to roll!"
# beside the shape records: when the engine gate first saw each unit's current invocation ready (node's
# CLOCK_MONOTONIC, as systemd's *TimestampMonotonic), read by the roll's restart-to-ready probe when
# journald rotated the readiness line away (issue 42): <dir>/<unit>.json {"invocation", "ready_monotonic_us"}
READY_MARKS = "ready"


def ready_marks_dir(shapes_dir: str) -> str:
    return str(Path(shapes_dir).parent / READY_MARKS)


def mark_ready(unit: str, invocation: str, marks_dir: str,
               phases_of: Callable[[], dict[str, float]] | None = None) -> None:
    """Keep when this invocation of UNIT was first seen ready (the first gate to see it wins: a later
    gate of the same start would record a later time), with SGLang's own start-up phases of that
    start (PHASES_OF(): startup_phases), read once, by that first gate."""
    path = Path(marks_dir) / f"{unit}.json"
    try:
        if json.loads(path.read_text()).get("invocation") == invocation:
            return
    except (OSError, ValueError, AttributeError):
        pass
    mark = {"invocation": invocation, "ready_monotonic_us": time.monotonic_ns() // 1000}
    if phases_of is not None:
        mark["phases"] = phases_of()
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(mark))
        tmp.replace(path)
    except OSError:
        pass  # evidence for a timing only: never a reason to fail a gate


_STARTUP_SAMPLE = re.compile(r'^(%s|%s)\{([^}]*)\} ([0-9.eE+-]+|NaN)$' % (
    re.escape(SGLANG["startup_time"]), re.escape(SGLANG["startup_cuda_graph_time"])))


def parse_startup_phases(text: str) -> dict[str, float]:
    """SGLang's start-up phase gauges in a /metrics page: {phase: seconds}, a CUDA-graph phase as
    "cuda_graph:<phase>" (0.5.17 and 0.5.23 TokenizerMetricsCollector.emit_startup_time: load_weight,
    kv_cache_allocation, scheduler_e2e, tokenizer_e2e, and one per graph phase). Several tp/dp
    children of one phase: the longest (the start waited for it)."""
    phases: dict[str, float] = {}
    for line in text.splitlines():
        m = _STARTUP_SAMPLE.match(line.strip())
        if not m:
            continue
        phase = re.search(r'(?:^|,)phase="([^"]*)"', m.group(2))
        if not phase:
            continue
        key = (f"cuda_graph:{phase.group(1)}" if m.group(1) == SGLANG["startup_cuda_graph_time"]
               else phase.group(1))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if key.startswith("cuda_graph:") and not value > 0:
            continue  # a graph phase this engine does not capture (SGLang sets every one, 0 when not run)
        phases[key] = round(max(phases.get(key, 0.0), value), 3)
    return phases


def startup_phases(health_url: str, timeout: float = 3.0) -> dict[str, float]:
    """The engine's start-up phases from its /metrics beside HEALTH_URL; {} when it has none (metrics
    off, an older engine) or does not answer in TIMEOUT: evidence, never a gate."""
    status, body = http_request(engine_endpoint(health_url, "metrics"), timeout=timeout)
    return parse_startup_phases(body) if status == 200 else {}



def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The HTTP header that carries an API key (the router's, an engine's), or none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}

def http_request(url: str, payload: dict[str, Any] | None = None, timeout: float = 5.0,
                 headers: dict[str, str] | None = None, method: str | None = None) -> tuple[int, str]:
    """GET (or POST a JSON payload; or METHOD); (status, body), status 0 when nothing answered."""
    data = None if payload is None else json.dumps(payload).encode()
    all_headers = {**({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})}
    request = urllib.request.Request(url, data=data, headers=all_headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def _unit_state(unit: str) -> tuple[str, str]:
    """(ActiveState, InvocationID) of UNIT, in one systemctl call."""
    snap = _unit_snapshot(unit)
    return snap["ActiveState"], snap["InvocationID"]


def _unit_snapshot(unit: str) -> dict[str, str]:
    """ActiveState, SubState, InvocationID, NRestarts of UNIT, in one systemctl call."""
    out = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "InvocationID", "-p",
                          "NRestarts", unit],
                         capture_output=True, text=True, timeout=10).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {k: props.get(k, "") for k in ("ActiveState", "SubState", "InvocationID", "NRestarts")}


def start_failed(first: dict[str, str], now: dict[str, str]) -> bool:
    """Pure: the start the gate is watching has failed, at its FIRST failure: the unit failed, is
    waiting to be restarted (Restart=on-failure), or systemd already started it again (a new
    invocation or a higher restart count). Waiting for systemd's start limit instead took 27 s
    (five starts) to call a broken canary broken (issue #18 item 7)."""
    if now.get("ActiveState") == "failed" or now.get("SubState") == "auto-restart":
        return True
    if first.get("InvocationID") and now.get("InvocationID") and now["InvocationID"] != first["InvocationID"]:
        return True
    try:
        return int(now.get("NRestarts") or 0) > int(first.get("NRestarts") or 0)
    except ValueError:
        return False


_ARGPARSE_ERROR = re.compile(r"^\S+: error: .+")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:?.*")


def error_line(log: str) -> str:
    """Pure: the engine's own error, one line, from its journal: argparse's `prog: error: ...`
    (not its usage fragments), else a Python exception's last line, else the last line that says
    error, else the last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if _ARGPARSE_ERROR.match(ln):
            return ln
    for ln in reversed(lines):
        if _EXCEPTION.match(ln):
            return ln
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln
    return lines[-1] if lines else "(it logged nothing)"


def unit_log(unit: str, invocation: str, lines: int | None = None) -> str:
    cmd = ["journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}"]
    if lines:
        cmd += ["-n", str(lines)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout


class _StartWatch:
    """Watches UNIT's start for a gate: its state read at most every INTERVAL (every STARTING
    seconds while it is not active), the first invocation seen kept as the start being watched.
    `check()` returns the unit's own error line at that start's first failure (start_failed),
    else None; `state` and `invocation` are those of the last read."""

    def __init__(self, unit: str, interval: float, starting: float | None = None):
        self.unit, self.interval = unit, interval
        self.starting = interval if starting is None else min(interval, starting)
        self.first: dict[str, str] = {}
        self.state, self.invocation = "", ""
        self._next = 0.0

    def check(self, now: float) -> str | None:
        if now < self._next:
            return None
        snap = _unit_snapshot(self.unit)
        self.state, self.invocation = snap["ActiveState"], snap["InvocationID"]
        if not self.first and self.invocation:
            self.first = snap
        self._next = now + (self.interval if self.state == "active" else self.starting)
        if self.first and start_failed(self.first, snap):
            return f"{self.unit} failed at its first start: " + error_line(
                unit_log(self.unit, self.first["InvocationID"]))
        return None


def engine_endpoint(health_url: str, path: str) -> str:
    """The engine's PATH (server_info, metrics, ...) beside its /health URL."""
    return health_url.rstrip("/").removesuffix("/health") + "/" + path


def server_info_url(health_url: str) -> str:
    """The engine's /server_info beside its /health URL."""
    return engine_endpoint(health_url, "server_info")


def read_server_info(url: str, timeout: float = 5.0) -> tuple[dict[str, Any] | None, str]:
    """(the engine's /server_info as a dict, "") or (None, why not)."""
    status, body = http_request(url, timeout=timeout)
    if status != 200:
        return None, f"{url} answered {status or 'nothing'}: {body.strip()[:200]}"
    try:
        info = json.loads(body)
    except ValueError as exc:
        return None, f"{url} answered something unreadable: {exc}"
    if not isinstance(info, dict):
        return None, f"{url} answered {type(info).__name__}, not an object"
    return info, ""


def wait_engine(unit: str, url: str, timeout: float, interval: float = 1.0, poll: float = 0.05,
                shape_inputs: tuple[str, ...] | list[str] = (), shapes_dir: str = engineshape.SHAPES_DIR,
                ) -> tuple[bool, str]:
    """Ready = from what the engine answers now: its unit active, URL (/health) answers 200, its
    /server_info is readable, and the unit is still the same invocation after both.

    SGLang's /health answers 503 while the server is Starting and is set Up only after the
    warm-up request, just before the readiness line is logged (0.5.17 and 0.5.23
    sglang/srt/entrypoints/http_server.py health_generate and _wait_and_warmup), and by default
    (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, srt/environ.py: True in both) /health is
    /health_generate: a one-token request through the scheduler (in PD mode with
    FAKE_BOOTSTRAP_HOST), so a 200 already is a real request answered, in both PD roles. The
    readiness line in the journal is extra evidence only: journald rotates it away on a busy box
    (issue 42), so its absence never blocks a healthy engine.

    With SHAPE_INPUTS (the unit's files and venv link), the shape the engine reports is recorded
    at its configuration's first healthy start, else compared with that record: a figure below
    pdkit.agent.engineshape.MIN_FRACTION fails the gate at once, naming both numbers; so are its weight
    checksums (/weights_checker, bounded by engineshape.WEIGHTS_TIMEOUT_S): a changed rank fails,
    an engine that does not answer is recorded unavailable and never blocks.

    URL is polled every POLL seconds; the unit's state every INTERVAL (0.2 s while not active) to
    catch a failed start at once (_StartWatch): the message is then the engine's own error line.
    """
    deadline = time.monotonic() + timeout
    reason = "not checked yet"
    # the gate saw this start before it was ready: its ready time is then the start's own (enginestarts)
    watched = False
    watch = _StartWatch(unit, interval, starting=0.2)
    info_url = server_info_url(url)
    while time.monotonic() < deadline:
        now = time.monotonic()
        failed = watch.check(now)
        if failed:
            return False, failed
        if watch.state == "active" and watch.invocation:
            status, body = http_request(url, timeout=min(5.0, max(deadline - now, 0.1)))
            if status == 200:
                info, why = read_server_info(info_url, timeout=min(5.0, max(deadline - time.monotonic(), 0.1)))
                # the invocation may have changed since it was read (a restart in between): read it again
                state, invocation = _unit_state(unit)
                if info is not None and state == "active" and invocation == watch.invocation:
                    return _engine_ready(unit, url, info, invocation, shape_inputs, shapes_dir, watched)
                reason = (f"{url} answers 200 but {why}" if info is None
                          else f"{unit} restarted while it was checked ({state}): checking the new start")
            else:
                reason = f"{unit} is starting: {url} answered {status or 'nothing'}: {body.strip()[:200]}"
            watched = True
        else:
            reason = f"{unit} is {watch.state or 'unknown'}"
            watched = True
        time.sleep(poll)
    return False, f"not ready after {timeout:.0f} s: {reason}"


def _engine_ready(unit: str, url: str, info: dict[str, Any], invocation: str, shape_inputs: tuple[str, ...] | list[str],
                  shapes_dir: str, watched: bool = False) -> tuple[bool, str]:
    """The verdict once the engine answered: its shape against its record, and the readiness line as evidence.
    WATCHED: the gate saw this start before it was ready, so the start goes into the engine's start
    history (pdkit/agent/enginestarts.py); one already up when the gate came has no start time of its own."""
    mark_ready(unit, invocation, ready_marks_dir(shapes_dir), lambda: startup_phases(url))
    # its JIT caches are warm now for the environment it ran from (pdkit/agent/jitcache.py: the warm stamp)
    jitcache.stamp_ready(shape_inputs, invocation, lambda: startup_phases(url))
    if watched:
        enginestarts.record_start(unit, invocation, ready_marks_dir(shapes_dir))
    try:
        logged = READY_LOG_LINE in unit_log(unit, invocation)
    except (OSError, subprocess.SubprocessError):
        logged = False
    evidence = ("its readiness line is logged" if logged
                else "its readiness line is not in the journal (rotated or not logged: not needed)")
    ready = f"{unit} ready: {url} answered 200 and /server_info was read; {evidence}"
    if not shape_inputs:
        return True, ready
    # its weights beside its shape (issue 44 item 2): an engine that does not answer is "unavailable", never a failure
    weights = engineshape.weights_from_answer(*http_request(
        engineshape.weights_checker_url(url), {"action": "checksum"}, timeout=engineshape.WEIGHTS_TIMEOUT_S))
    try:
        ok, shape = engineshape.check(unit, list(shape_inputs), info, shapes_dir, weights=weights)
    except OSError as exc:
        return False, f"{unit}: cannot record or read its shape under {shapes_dir}: {exc}"
    return (True, f"{ready}; {shape}") if ok else (False, shape)


def wait_rank(unit: str, url: str, timeout: float, interval: float = 0.5) -> tuple[bool, str]:
    """A rank above 0 of an engine spanning nodes serves no HTTP and logs no readiness line
    (SGLang runs the HTTP server on rank 0 only): it is ready when its unit is active, and
    still the same invocation, once rank 0's URL answers 200 (rank 0 is ready only when every
    rank joined)."""
    deadline = time.monotonic() + timeout
    reason = "not checked yet"
    first = ""
    while time.monotonic() < deadline:
        state, invocation = _unit_state(unit)
        if state == "failed":
            return False, f"{unit} failed: " + " | ".join(unit_log(unit, invocation, 5).strip().splitlines()[-5:])
        if state == "active" and invocation:
            first = first or invocation
            status, body = http_request(url, timeout=min(5.0, max(deadline - time.monotonic(), 0.1)))
            if status == 200:
                state, now = _unit_state(unit)
                if state == "active" and now == invocation:
                    restarted = "" if now == first else " (after a restart)"
                    return True, f"{unit} ready: active{restarted} and rank 0's {url} answered 200"
            reason = f"{unit} is active; rank 0's {url} answered {status or 'nothing'}: {body.strip()[:200]}"
        else:
            reason = f"{unit} is {state or 'unknown'}"
        time.sleep(interval)
    return False, f"not ready after {timeout:.0f} s: {reason}"


def worker_key(url: str) -> str:
    """A router worker's identity: its URL without a trailing slash (the routers list `http://h:p` and accept
    `http://h:p/`): every comparison of a planned worker with a router's list goes through this."""
    return url.rstrip("/")


def router_worker_health(body: str) -> dict[str, bool]:
    """url -> healthy, from the router's GET /workers (smg: {"workers": [{"url", "is_healthy"...}]})."""
    data = json.loads(body)
    workers = data.get("workers", data) if isinstance(data, dict) else data
    health: dict[str, bool] = {}
    for worker in workers or []:
        if not isinstance(worker, dict) or "url" not in worker:
            continue
        healthy = worker.get("is_healthy", worker.get("healthy"))
        if healthy is None and isinstance(worker.get("health"), str):
            healthy = worker["health"].lower() == "healthy"
        health[worker_key(worker["url"])] = bool(healthy)
    return health


def router_verdict(wanted: set[str], remote: set[str], listed: dict[str, bool],
                   answering: set[str]) -> tuple[str, list[str], list[str], list[str]]:
    """Pure: ("ready" | "pending" | "waiting", missing, unhealthy, pending) for a router gate.

    WANTED: every planned worker; REMOTE: those on other hosts; LISTED: url -> healthy in the
    router's /workers; ANSWERING: remote workers whose own /health answers 200 now. A remote
    worker that does not answer is pending: its host has not been deployed yet in this run (a
    `--serial` run may reach the router host first), and that host's deploy registers it in
    this router and gates it there (pdkit/hosts/routersync.py). Every other planned worker must be
    listed healthy.
    """
    pending = sorted(w for w in remote if w not in answering and not listed.get(w, False))
    required = wanted - set(pending)
    missing = sorted(required - set(listed))
    unhealthy = sorted(w for w in required & set(listed) if not listed[w])
    if missing or unhealthy:
        return "waiting", missing, unhealthy, pending
    return ("pending" if pending else "ready"), missing, unhealthy, pending


def wait_router(
    url: str, workers: list[str], timeout: float, interval: float = 1.0, api_key: str | None = None,
    model: str | None = None,
    remote: list[str] | None = None, any_workers: bool = False,
) -> tuple[bool, str]:
    """Ready = every planned worker registered and healthy, then (with MODEL) one real completion
    succeeds; workers on other hosts (REMOTE) that do not answer yet are pending (router_verdict).
    ANY_WORKERS: no planned list is known (a release recorded before routers' gates kept one):
    every worker it lists, at least one, healthy."""
    deadline = time.monotonic() + timeout
    reason = "not checked yet"
    headers = bearer_headers(api_key)
    others = {worker_key(w) for w in remote or []}
    wanted = {worker_key(w) for w in workers} | others
    base = url.rstrip("/")
    while time.monotonic() < deadline:
        status, body = http_request(f"{base}/workers", headers=headers)
        if status == 200:
            try:
                health = router_worker_health(body)
            except (ValueError, AttributeError) as exc:
                return False, f"{url}/workers answered something unreadable: {exc}"
            answering = {w for w in others if http_request(f"{w}/health", timeout=2)[0] == 200}
            if any_workers:
                wanted = set(health) or {"(no worker listed yet)"}
            verdict, missing, unhealthy, pending = router_verdict(wanted, others, health, answering)
            if verdict == "pending":
                return True, (f"router up: the {len(wanted) - len(pending)} workers that are up are registered and "
                              f"healthy; pending {pending} (their hosts are not deployed yet: their own deploy "
                              "registers and gates them here)")
            if verdict == "ready":
                if model is None:
                    return True, f"router ready: all {len(wanted)} planned workers registered and healthy"
                # healthy in /workers is not yet routable (circuit breakers, PD pairing): prove it
                status, body = http_request(f"{base}/v1/completions",
                                            {"model": model, "prompt": "pdkit readiness check", "max_tokens": 1},
                                            timeout=30, headers=headers)
                if status == 200:
                    return True, f"router ready: all {len(wanted)} planned workers healthy and a completion succeeded"
                reason = f"workers healthy but a completion answered {status or 'nothing'}: {body.strip()[:200]}"
            else:
                reason = f"workers missing {missing}, unhealthy {unhealthy}"
        else:
            reason = f"{url}/workers answered {status or 'nothing'}: {body.strip()[:200]}"
        time.sleep(interval)
    return False, f"router not ready after {timeout:.0f} s: {reason}"


def wait_http(url: str, timeout: float, interval: float = 0.1) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    reason = "not checked yet"
    while time.monotonic() < deadline:
        status, body = http_request(url)
        if status == 200:
            return True, f"{url} answered 200"
        reason = f"{url} answered {status or 'nothing'}: {body.strip()[:200]}"
        time.sleep(interval)
    return False, f"not ready after {timeout:.0f} s: {reason}"


def wait_service(unit: str, url: str, timeout: float, interval: float = 0.5, poll: float = 0.1) -> tuple[bool, str]:
    """Ready = URL answers 200. UNIT's state is read every INTERVAL: a failed start ends the wait
    at once with the unit's own error line (_StartWatch), so the timeout can allow for a node
    whose cores are busy starting everything else without a crashed service waiting it out."""
    deadline = time.monotonic() + timeout
    reason = "not checked yet"
    watch = _StartWatch(unit, interval)
    while time.monotonic() < deadline:
        now = time.monotonic()
        failed = watch.check(now)
        if failed:
            return False, failed
        status, body = http_request(url, timeout=min(5.0, max(deadline - now, 0.1)))
        if status == 200:
            return True, f"{unit} ready: {url} answered 200"
        reason = f"{url} answered {status or 'nothing'}: {body.strip()[:200]}"
        time.sleep(poll)
    return False, f"not ready after {timeout:.0f} s: {reason}"


def wait_all(engines: list[tuple[str, str, float]], urls: list[tuple[str, float]],
             ranks: Sequence[tuple[str, str, float]] = (),
             services: Sequence[tuple[str, str, float]] = (), shapes: dict[str, tuple[str, ...]] | None = None,
             shapes_dir: str = engineshape.SHAPES_DIR) -> list[tuple[bool, str, float]]:
    """Every engine (unit, url, timeout), HTTP URL (url, timeout), rank above 0 (unit, url,
    timeout) and HTTP service (unit, url, timeout) at once: a node's services restart together,
    so their gates wait together rather than one after another. SHAPES: engine unit -> its shape
    inputs (wait_engine records or compares its shape under SHAPES_DIR).
    (ok, message, seconds until that gate finished) for each, in that order."""

    start = time.monotonic()

    def timed(fn: Callable[..., tuple[bool, str]], *args: object) -> tuple[bool, str, float]:
        ok, message = fn(*args)
        return ok, message, time.monotonic() - start

    with ThreadPoolExecutor(max_workers=max(len(engines) + len(urls) + len(ranks) + len(services), 1)) as pool:
        futures = [pool.submit(timed, wait_engine, u, url, t, 1.0, 0.05, (shapes or {}).get(u, ()), shapes_dir)
                   for u, url, t in engines]
        futures += [pool.submit(timed, wait_http, url, t) for url, t in urls]
        futures += [pool.submit(timed, wait_rank, u, url, t) for u, url, t in ranks]
        futures += [pool.submit(timed, wait_service, u, url, t) for u, url, t in services]
        return [f.result() for f in futures]


def main(argv: list[str] | None = None) -> int:
    from pdkit.agent import lifeline  # here, not at the top: the whole hook of issue 42 item 4 stays in main()
    lifeline.watch_command("pdkit.health", argv)  # as a command: end when its control side goes away
    parser = argparse.ArgumentParser(prog="python -m pdkit.health",
                                     description="Wait until a restarted service is really ready.")
    sub = parser.add_subparsers(dest="kind", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--unit", required=True)
    e.add_argument("--url", required=True, help="the engine's /health URL")
    e.add_argument("--timeout", type=float, default=600)
    e.add_argument("--shape-input", action="append", default=[], metavar="PATH",
                   help="a file (or venv link) of the engine's configuration: record or compare its shape (repeat)")
    e.add_argument("--shapes-dir", default=engineshape.SHAPES_DIR, help=argparse.SUPPRESS)
    r = sub.add_parser("router")
    r.add_argument("--url", required=True, help="the router's base URL")
    r.add_argument("--worker", action="append", default=[], help="a planned worker URL on this host (repeat)")
    r.add_argument("--remote-worker", action="append", default=[],
                   help="a planned worker URL on another host: pending while it does not answer (repeat)")
    r.add_argument("--timeout", type=float, default=120)
    r.add_argument("--model", help="served model name: send one real completion once the workers are healthy")
    r.add_argument("--api-key-file", help="a root-only file holding the router's API key (never on the command line)")
    r.add_argument("--any-workers", action="store_true",
                   help="no planned worker list: every listed worker (at least one) healthy")
    h = sub.add_parser("http")
    h.add_argument("--url", required=True, help="a URL that answers 200 when the service is ready")
    h.add_argument("--timeout", type=float, default=120)
    g = sub.add_parser("gates", help="several engine and HTTP gates at once (exit 1 when any fails)")
    g.add_argument("--engine", nargs=3, action="append", default=[], metavar=("UNIT", "URL", "TIMEOUT"),
                   help="an engine gate (repeat)")
    g.add_argument("--http", nargs=2, action="append", default=[], metavar=("URL", "TIMEOUT"),
                   help="an HTTP gate (repeat)")
    g.add_argument("--rank", nargs=3, action="append", default=[], metavar=("UNIT", "URL", "TIMEOUT"),
                   help="a rank above 0 of an engine spanning nodes: its unit, rank 0's /health URL (repeat)")
    g.add_argument("--service", nargs=3, action="append", default=[], metavar=("UNIT", "URL", "TIMEOUT"),
                   help="an HTTP service: ready when URL answers 200, failed at once when UNIT's start fails (repeat)")
    g.add_argument("--shape", nargs=2, action="append", default=[], metavar=("UNIT", "PATHS"),
                   help="an engine's configuration (comma-separated files and venv link): its shape is recorded at "
                        "the configuration's first healthy start, else compared with that record (repeat)")
    g.add_argument("--shapes-dir", default=engineshape.SHAPES_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    start = time.monotonic()
    if args.kind == "gates":
        try:
            engines = [(u, url, float(t)) for u, url, t in args.engine]
            urls = [(url, float(t)) for url, t in args.http]
            ranks = [(u, url, float(t)) for u, url, t in args.rank]
            services = [(u, url, float(t)) for u, url, t in args.service]
        except ValueError as exc:
            parser.error(f"TIMEOUT must be a number of seconds: {exc}")
        shapes = {u: tuple(p for p in paths.split(",") if p) for u, paths in args.shape}
        results = wait_all(engines, urls, ranks, services, shapes, args.shapes_dir)
        for ok, message, took in results:
            print(f"{'ok    ' if ok else 'FAILED'} {message} ({took:.1f} s)", file=sys.stdout if ok else sys.stderr)
        return 0 if all(ok for ok, _, _ in results) else 1
    if args.kind == "engine":
        ok, message = wait_engine(args.unit, args.url, args.timeout, shape_inputs=tuple(args.shape_input),
                                  shapes_dir=args.shapes_dir)
    elif args.kind == "http":
        ok, message = wait_http(args.url, args.timeout)
    else:
        api_key = None
        if args.api_key_file:
            try:
                with open(args.api_key_file) as fh:
                    api_key = fh.read().strip()
            except OSError as exc:
                print(f"cannot read the router's API key from {args.api_key_file}: {exc}", file=sys.stderr)
                return 1
        ok, message = wait_router(args.url, args.worker, args.timeout, api_key=api_key, model=args.model,
                                  remote=args.remote_worker,
                                  any_workers=args.any_workers)
    print(f"{message} ({time.monotonic() - start:.1f} s)", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
