"""Engine-level faults: a client that hangs up, a wedged scheduler and its watchdog."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import requests
from prometheus_client.parser import text_string_to_metric_families

from .support import MODEL, free_ports, get, start_sim, wait_until


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
