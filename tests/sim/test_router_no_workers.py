"""What the real routers answer while a roll has taken the last worker of a kind out of them.

A one-box cluster (one PD pair, or one unified engine, behind one router) can only roll a change
with downtime: take the last prefill and/or decode (or the last regular worker) out of the router,
restart the engines, add them back. Clients must get a fast error meanwhile, never a hang. Measured
here against smg 1.13.0 and sglang-router 0.3.2 with sim engines on loopback:

- PD mode, no decode, no prefill, or neither registered: 503 at once. smg 1.13.0 answers in ms,
  X-SMG-Error-Code no_available_workers and Retry-After: 1; sglang-router 0.3.2 answers
  server_selection_failed without Retry-After, after ~0.4 s: it retries its own selection failure
  with the default --retry-* backoff (5 attempts, 50 ms x 1.5^n), so its latency grows with those flags.
- regular mode, sglang-router 0.3.2: 503 no_available_workers (same retry delay, no Retry-After).
- regular mode, smg 1.13.0: 503 + Retry-After: 1 only while the removed worker is still listed
  "draining" (its drain_settle_secs); once it is gone the answer is 404 model_not_found, a client
  error that clients do not retry. A roll that removes the last regular worker from smg must expect that.
- a stream that is already running when its workers are removed finishes normally.
- /health and /liveness stay 200 and /readiness turns 503 while a kind has no worker.
- not removed, engine stopped (the router still lists it healthy): the first request gets a
  502 (PD) or 500 (regular) after the retries (~0.4 s), and the circuit breaker gives 503 later;
  fast, but not the clean 503 that removing the worker first gives.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from pdkit.clients.router_api import RouterClient
from pdkit.render.flags import router_breaker_args
from pdkit.sim.localstack import smg_binary
from pdkit.spec.models import Router
from tests.conftest import require

from .support import MODEL, Processes, completion_ok, free_ports, launch_sim, wait_ready, wait_until

# an answer slower than this is a hang as far as a roll's downtime window is concerned
FAST_S = 2.0
# the sims decode one token per 100 ms, so that a 20-token stream is still running when its worker goes
SLOW_DECODE = {"PDKIT_SIM_DECODE_BASE_MS": "100"}
STREAM_TOKENS = 20


@dataclass(frozen=True)
class RouterKind:
    name: str
    per_worker_drain_settle: bool  # smg takes drain_settle_secs per worker (PUT /workers/{id})
    pd_code: str                    # X-SMG-Error-Code with no prefill or no decode
    retry_after: str | None         # its Retry-After on that 503


SMG = RouterKind("smg-1.13.0", True, "no_available_workers", "1")
SGLANG_ROUTER = RouterKind("sglang-router-0.3.2", False, "server_selection_failed", None)


def launcher(kind: RouterKind) -> list[str]:
    if kind is SMG:
        binary = smg_binary()
        require(shutil.which(binary) is not None, f"no smg binary ({binary}): install the test extras (smg==1.13.0)")
        return [binary, "launch"]
    home = Path(os.environ.get("PDKIT_CONTRACT_HOME", Path.home() / ".cache/pdkit/contract"))
    python = home / "sglang-router-0.3.2" / "bin" / "python"
    require(python.exists(), f"no sglang-router 0.3.2 contract env at {python} (make contract-env)")
    return [str(python), "-m", "sglang_router.launch_router"]


def router_argv(kind: RouterKind, workers: list[str], port: int, metrics_port: int) -> list[str]:
    """The router's flags as pdkit renders them by default (pdkit.render.flags.router_args): its health
    settings, the circuit breaker, and no --retry-*/--queue-* flags (the routers' defaults)."""
    defaults = Router.model_fields
    return [*launcher(kind), *workers, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", str(defaults["health_check_interval_secs"].default),
            "--health-failure-threshold", str(defaults["health_failure_threshold"].default),
            "--worker-startup-check-interval", "1",  # pdkit's is 5: only registration is slower
            "--shutdown-grace-period-secs", "1", *router_breaker_args(), "--log-level", "warn"]


@dataclass
class Answer:
    status: int
    headers: requests.structures.CaseInsensitiveDict
    body: str
    seconds: float

    def code(self) -> str | None:
        return self.headers.get("x-smg-error-code")

    def __str__(self) -> str:
        return f"{self.status} in {self.seconds:.3f}s, headers {dict(self.headers)}, body {self.body[:300]!r}"


def ask(router_url: str, path: str, stream: bool) -> Answer:
    body: dict = {"model": MODEL, "max_tokens": 2, "stream": stream}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    start = time.monotonic()
    resp = requests.post(f"{router_url}{path}", json=body, timeout=30, stream=stream)
    text = resp.content.decode(errors="replace")
    return Answer(resp.status_code, resp.headers, text, time.monotonic() - start)


def every_request(router_url: str) -> list[tuple[str, Answer]]:
    return [(f"{path} stream={stream}", ask(router_url, path, stream))
            for path in ("/v1/chat/completions", "/v1/completions") for stream in (False, True)]


def assert_fast_error(router_url: str, status: int, code: str, retry_after: str | None, message: str = "") -> None:
    """Every OpenAI route, streaming or not, answers STATUS with CODE, quickly, with (or without) Retry-After."""
    for what, answer in every_request(router_url):
        assert answer.status == status, f"{what}: {answer}"
        assert answer.code() == code, f"{what}: {answer}"
        assert answer.headers.get("retry-after") == retry_after, f"{what}: {answer}"
        assert answer.seconds < FAST_S, f"{what}: {answer}"
        assert message in answer.body, f"{what}: {message!r} not in {answer}"


def assert_probes(router_url: str, ready: bool) -> None:
    assert requests.get(f"{router_url}/health", timeout=5).status_code == 200
    assert requests.get(f"{router_url}/liveness", timeout=5).status_code == 200
    readiness = requests.get(f"{router_url}/readiness", timeout=5)
    assert readiness.status_code == (200 if ready else 503), readiness.text


class Stream:
    """A streaming completion that is running: read a few events now, the rest later."""

    def __init__(self, router_url: str) -> None:
        self.resp = requests.post(f"{router_url}/v1/completions", stream=True, timeout=60,
                                  json={"model": MODEL, "prompt": "a long answer", "max_tokens": STREAM_TOKENS, "stream": True})
        assert self.resp.status_code == 200, self.resp.text
        self.lines: Iterator[str] = self.resp.iter_lines(decode_unicode=True)
        self.events: list[dict] = []
        self.done = False

    def read(self, events: int | None = None) -> None:
        for line in self.lines:
            if not line or not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                self.done = True
                return
            self.events.append(json.loads(payload))
            if events is not None and len(self.events) >= events:
                return

    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for e in self.events for c in e.get("choices", []) if c.get("finish_reason")]


def client_for(kind: RouterKind, router_url: str, settle: int = 0) -> RouterClient:
    return RouterClient(router_url, drain_settle_s=settle if kind.per_worker_drain_settle else None)


def start_router(procs: Processes, kind: RouterKind, workers: list[str], expected: int) -> str:
    port, metrics_port = free_ports(2)
    router = procs.start("router", router_argv(kind, workers, port, metrics_port))
    url = f"http://127.0.0.1:{port}"
    client = RouterClient(url)

    def serving() -> bool:
        assert router.alive(), f"router exited:\n{router.log_tail()}"
        return len([w for w in client.workers() if w.healthy]) == expected and completion_ok(url)

    wait_until(serving, 45, f"{kind.name} to list {expected} healthy workers and serve", interval=0.2, context=procs.logs)
    return url


@pytest.mark.parametrize("kind", [SMG, SGLANG_ROUTER], ids=lambda k: k.name)
def test_pd_router_without_a_prefill_or_decode_answers_503_at_once(procs, kind):
    prefill_port, bootstrap_port, decode_port = free_ports(3)
    prefill = launch_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env=SLOW_DECODE)
    decode = launch_sim(procs, "decode", "decode", decode_port, env=SLOW_DECODE)
    wait_ready(procs, prefill, prefill_port)
    wait_ready(procs, decode, decode_port)
    prefill_url, decode_url = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    url = start_router(procs, kind, ["--pd-disaggregation", "--prefill", prefill_url, str(bootstrap_port),
                                     "--decode", decode_url], expected=2)
    client = client_for(kind, url)
    assert_probes(url, ready=True)

    # the decode goes first, while a stream runs on it: new requests get 503, the stream finishes
    stream = Stream(url)
    stream.read(events=2)
    assert not stream.done
    assert client.remove(decode_url) is not None
    client.wait_gone([decode_url], timeout=10)
    assert_fast_error(url, 503, kind.pd_code, kind.retry_after, "No decode workers available")
    assert_probes(url, ready=False)
    stream.read()
    assert stream.done and stream.finish_reasons() == ["length"], (stream.events[-2:], procs.logs())

    client.add(decode_url, "decode", timeout=30)
    client.wait_healthy([decode_url], timeout=30)
    assert completion_ok(url)

    # only the prefill out
    assert client.remove(prefill_url) is not None
    client.wait_gone([prefill_url], timeout=10)
    assert_fast_error(url, 503, kind.pd_code, kind.retry_after, "No prefill workers available")

    # both out: the router has no worker at all
    assert client.remove(decode_url) is not None
    client.wait_gone([decode_url], timeout=10)
    assert client.workers() == []
    assert_fast_error(url, 503, kind.pd_code, kind.retry_after, "No prefill workers available")
    assert_probes(url, ready=False)

    # back: it serves again
    client.add(prefill_url, "prefill", bootstrap_port, timeout=30)
    client.add(decode_url, "decode", timeout=30)
    client.wait_healthy([prefill_url, decode_url], timeout=30)
    assert completion_ok(url)
    assert_probes(url, ready=True)

    # not removed, engines stopped: the router still lists them and tries them, 502 after its retries
    prefill.kill()
    decode.kill()
    first = ask(url, "/v1/completions", False)
    assert first.status == 502 and first.seconds < FAST_S, first
    assert any(w.healthy for w in client.workers())


@pytest.mark.parametrize("kind", [SMG, SGLANG_ROUTER], ids=lambda k: k.name)
def test_regular_router_without_a_worker_answers_fast(procs, kind):
    port = free_ports(1)[0]
    engine = launch_sim(procs, "unified", "null", port, env=SLOW_DECODE)
    wait_ready(procs, engine, port)
    engine_url = f"http://127.0.0.1:{port}"
    url = start_router(procs, kind, ["--worker-urls", engine_url], expected=1)
    # smg: a settle time long enough to see the draining window, short enough for the test
    client = client_for(kind, url, settle=2)

    stream = Stream(url)
    stream.read(events=2)
    assert not stream.done
    assert client.remove(engine_url) is not None
    if kind is SMG:
        # still listed, draining: "workers exist but none available", 503 with Retry-After
        assert client.find(engine_url) is not None
        assert_fast_error(url, 503, "no_available_workers", "1", "All workers are unavailable")
        assert_probes(url, ready=False)
        client.wait_gone([engine_url], timeout=10)
        # gone: smg has no worker for the model at all and says 404, without Retry-After
        assert_fast_error(url, 404, "model_not_found", None, f"No worker available for model '{MODEL}'")
    else:
        client.wait_gone([engine_url], timeout=10)
        assert_fast_error(url, 503, "no_available_workers", None, "No available workers")
    assert_probes(url, ready=False)
    stream.read()
    assert stream.done and stream.finish_reasons() == ["length"], (stream.events[-2:], procs.logs())

    client.add(engine_url, "regular", timeout=30)
    client.wait_healthy([engine_url], timeout=30)
    assert completion_ok(url)
    assert_probes(url, ready=True)

    # not removed, engine stopped: 500 (upstream connection failed) after the router's retries
    engine.kill()
    first = ask(url, "/v1/completions", False)
    assert first.status == 500 and first.seconds < FAST_S, first
    assert client.find(engine_url).healthy
