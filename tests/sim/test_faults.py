"""Engine-level faults: a client that hangs up, a wedged scheduler and its watchdog."""

from __future__ import annotations

import re
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .support import MODEL, free_ports, get, start_sim, status_of, wait_until


def metric(url: str, name: str) -> float:
    text = get(f"{url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_client_hanging_up_aborts_the_request(procs):
    port, = free_ports(1)
    start_sim(procs, "unified", "null", port)
    url = f"http://127.0.0.1:{port}"
    with requests.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "long", "max_tokens": 500,
                                                      "stream": True}, stream=True, timeout=10) as resp:
        next(resp.iter_lines())  # a token arrived: the request is running
        assert metric(url, "sglang:num_running_reqs") == 1
    wait_until(lambda: metric(url, "sglang:num_aborted_requests_total") == 1, 5, "the abort to be counted")
    wait_until(lambda: metric(url, "sglang:num_running_reqs") == 0, 5, "the running batch to empty")


def test_wedged_engine_is_ended_by_its_watchdog(procs, tmp_path):
    stall = tmp_path / "stalled"
    port, = free_ports(1)
    proc = start_sim(procs, "wedged", "null", port, extra=["--watchdog-timeout", "1"],
                     env={"PDKIT_SIM_STALL_FILE": str(stall)})
    url = f"http://127.0.0.1:{port}"
    stall.touch()

    def stuck_request() -> None:
        try:  # never answered: the engine is wedged; the connection drops when the process ends
            requests.post(f"{url}/generate", json={"text": "stuck", "sampling_params": {"max_new_tokens": 2}}, timeout=30)
        except requests.RequestException:
            pass

    with ThreadPoolExecutor(1) as pool:
        pool.submit(stuck_request)
        wait_until(lambda: proc.popen.poll() is not None, 10, "the watchdog to end the process", context=procs.logs)
    assert proc.popen.returncode == 1
    assert re.search(r"\] Scheduler watchdog timeout \(self.watchdog_timeout=1.0", proc.log_text())


def test_sigterm_drains_like_sglang(procs):
    """SGLang on SIGTERM (tokenizer_manager.sigterm_watchdog): /health answers 503, the stream in
    flight and a request that arrives meanwhile are both served to the end, then the process exits 0.
    A sim that exited at once cut the stream: what a decode stopped by systemd under load did to
    requests the router still sent it (docs/gpu.md, "Prefill kill with the fault budget")."""
    port, = free_ports(1)
    proc = start_sim(procs, "draining", "null", port, env={"PDKIT_SIM_DECODE_BASE_MS": "25"})
    url = f"http://127.0.0.1:{port}"
    body = {"model": MODEL, "prompt": "long", "max_tokens": 120, "stream": True}
    with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=30) as resp:
        lines = resp.iter_lines()
        next(lines)  # running
        proc.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: status_of(f"{url}/health") == 503, 5, "/health to answer 503 while draining", context=procs.logs)
        late = requests.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "late", "max_tokens": 3}, timeout=30)
        assert late.status_code == 200 and late.json()["usage"]["completion_tokens"] == 3, late.text
        assert proc.alive(), "the sim exited with a stream still in flight"
        rest = [line for line in lines if line]
    assert rest[-1] == b"data: [DONE]", rest[-3:]
    wait_until(lambda: proc.popen.poll() is not None, 10, "the drained sim to exit", context=procs.logs)
    assert proc.popen.returncode == 0
    log = proc.log_text()
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in log
    assert "Gracefully exiting... Remaining number of requests 1." in log


def test_sigterm_when_idle_exits_at_once(procs):
    port, = free_ports(1)
    proc = start_sim(procs, "idle", "null", port)
    proc.popen.send_signal(signal.SIGTERM)
    wait_until(lambda: proc.popen.poll() is not None, 3, "the idle sim to exit", context=procs.logs)
    assert proc.popen.returncode == 0


def test_sigterm_on_an_unhealthy_engine_exits_without_draining():
    """SGLang: a health probe that timed out left the engine UnHealthy; a SIGTERM then force-exits
    even with requests in flight (they would never finish)."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from pdkit.sim.main import drain

    engine = SimpleNamespace(unhealthy=True, in_flight=3)
    stop = asyncio.Event()
    records = []
    log = logging.getLogger("test.drain")
    log.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r.getMessage())})())

    async def run() -> None:
        await asyncio.wait_for(drain(engine, log, stop), 1)

    asyncio.run(run())
    assert stop.is_set()
    assert records == ["Signal SIGTERM received while health check failed. Force exiting."]
    engine = SimpleNamespace(unhealthy=False, in_flight=1)
    stop = asyncio.Event()
    with pytest.raises(TimeoutError):  # requests in flight: it keeps waiting (SGLang: until they finish)
        asyncio.run(asyncio.wait_for(drain(engine, log, stop), 0.5))
    assert not stop.is_set()
