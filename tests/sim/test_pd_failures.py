"""PD failure paths: a dead prefill stalls and then fails decode requests, clearly, and the
stack recovers when the prefill comes back; injected transfer failures move SGLang's counters."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from .conftest import start_pd_stack
from .support import (
    MODEL,
    SIM_TEST_ENV,
    completion_ok,
    free_ports,
    get,
    launch_sim,
    post,
    sse_events,
    start_sim,
    wait_until,
)

WAITING_TIMEOUT_S = float(SIM_TEST_ENV["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"])
HEARTBEAT_S = max(float(SIM_TEST_ENV["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"]), 2.0)  # SGLang's floor
MISSES = int(SIM_TEST_ENV["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"])
ENSURE_S = 15 * float(SIM_TEST_ENV["PDKIT_SIM_BOOTSTRAP_RETRY_S"])  # SGLang's decode: 15 tries


def metric(url: str, name: str) -> float:
    text = get(f"{url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_dead_prefill_fails_decode_requests_clearly_then_recovers(procs, tmp_path):
    stall = tmp_path / "prefill-stalled"
    stack = start_pd_stack(procs, prefill_env={"PDKIT_SIM_STALL_FILE": str(stall)})
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}

    # 1. A request in flight when the prefill dies: the prefill is wedged (stall file), the decode
    #    has done its handshake and waits for the KV; then the prefill process is killed.
    stall.touch()
    with ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(lambda: sse_events(post(f"{stack.router_url}/v1/chat/completions", chat, stream=True)))
        wait_until(lambda: metric(stack.decode_url, "sglang:num_decode_transfer_queue_reqs") == 1, 5,
                   "the decode to hold the request in its transfer queue", context=procs.logs)
        stack.prefill.kill()
        killed_at = time.monotonic()
        events = inflight.result(timeout=WAITING_TIMEOUT_S + 10)
    waited = time.monotonic() - killed_at
    errors = [e["error"] for e in events if "error" in e]
    assert errors, events
    # SGLang's decode learns of the dead prefill from its heartbeat: MISSES missed checks HEARTBEAT_S
    # apart, well before the waiting timeout (common/conn.py _handle_node_failure's words)
    assert "Lost connection with prefill instance" in errors[0]["message"], errors
    assert HEARTBEAT_S * (MISSES - 1) <= waited <= HEARTBEAT_S * MISSES + 1.5, waited
    assert metric(stack.decode_url, "sglang:num_transfer_failed_reqs_total") == 1

    # 2. New requests through the router fail at once with an error that names the prefill: its
    #    URL ("Transport error ... for url (<prefill>/v1/completions)") until the health check
    #    notices, then "No available prefill workers".
    started = time.monotonic()
    resp = post(f"{stack.router_url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4})
    assert resp.status_code >= 500
    assert stack.prefill_url in resp.text or "prefill workers" in resp.text, resp.text
    assert time.monotonic() - started < WAITING_TIMEOUT_S

    # 3. A decode asked directly (router-style bootstrap fields) tries the dead prefill's bootstrap
    #    server 15 times (SGLang's decode.py: 1 s apart; the test's knob: 0.1 s), not for the waiting
    #    timeout, then fails with SGLang's handshake error and counts a bootstrap failure.
    started = time.monotonic()
    resp = post(f"{stack.decode_url}/v1/completions",
                {"model": MODEL, "prompt": "x", "max_tokens": 4, "bootstrap_host": "127.0.0.1",
                 "bootstrap_port": stack.bootstrap_port, "bootstrap_room": 4242})
    waited = time.monotonic() - started
    assert resp.status_code == 500
    assert "Decode handshake failed" in resp.json()["message"]
    assert "Could not fetch prefill parallel info" in resp.json()["message"]
    assert "after 15 attempts" in resp.json()["message"]
    assert ENSURE_S - 0.2 <= waited < ENSURE_S + 2, waited
    assert metric(stack.decode_url, "sglang:num_bootstrap_failed_reqs_total") == 1

    # 4. The prefill comes back on the same ports: the router routes to it again.
    stall.unlink()
    start_sim(procs, "prefill-restarted", "prefill", stack.prefill_port, stack.bootstrap_port)
    wait_until(lambda: completion_ok(stack.router_url), 20, "the router to serve again after the prefill returned",
               interval=0.2, context=procs.logs)


def test_transfer_and_bootstrap_failures_move_counters(procs):
    """Without a router: the two legs sent by hand, as smg sends them (same body, same room)."""
    prefill_port, bootstrap_port, decode_port = free_ports(3)
    prefill = f"http://127.0.0.1:{prefill_port}"
    decode = f"http://127.0.0.1:{decode_port}"
    start_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env={"PDKIT_SIM_TRANSFER_FAIL_RATE": "1"})
    start_sim(procs, "decode", "decode", decode_port)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap_port, "bootstrap_room": 99}
    with ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(post, f"{url}/v1/completions", body) for url in (prefill, decode)]
        prefill_resp, decode_resp = (leg.result(timeout=15) for leg in legs)
    assert prefill_resp.status_code == 500 and "Prefill transfer failed" in prefill_resp.json()["message"]
    assert decode_resp.status_code == 500
    assert "Failed to get kvcache from prefill instance, it might be dead" in decode_resp.json()["message"]
    assert metric(prefill, "sglang:num_transfer_failed_reqs_total") == 1
    assert metric(decode, "sglang:num_transfer_failed_reqs_total") == 1

    # A prefill whose decode never calls fails the request after the bootstrap timeout.
    resp = post(f"{prefill}/v1/completions", {**body, "bootstrap_room": 100})
    assert resp.status_code == 500 and "Prefill bootstrap failed" in resp.json()["message"]
    assert metric(prefill, "sglang:num_bootstrap_failed_reqs_total") == 1


def test_prefill_restarted_before_the_heartbeat_misses_add_up_leaves_the_decode_waiting(procs, tmp_path):
    """SGLang's heartbeat asks the bootstrap server's /health, which a restarted prefill answers long
    before its model is loaded (the tokenizer manager starts it first: entrypoints/engine.py). A
    prefill back within MISSES checks resets the count, and the decode's request waits for the
    waiting timeout: the one PD wait only SGLANG_DISAGGREGATION_WAITING_TIMEOUT bounds, which is
    why pdkit.spec.faultbudget renders it (docs/rolling.md, "The fault budget")."""
    stall = tmp_path / "prefill-stalled"
    stack = start_pd_stack(procs, prefill_env={"PDKIT_SIM_STALL_FILE": str(stall)})
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}
    stall.touch()
    with ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(lambda: sse_events(post(f"{stack.router_url}/v1/chat/completions", chat, stream=True)))
        wait_until(lambda: metric(stack.decode_url, "sglang:num_decode_transfer_queue_reqs") == 1, 5,
                   "the decode to hold the request in its transfer queue", context=procs.logs)
        handed_at = time.monotonic()
        stack.prefill.kill()
        # back on the same ports at once, still loading (a long start-up delay): its bootstrap server answers
        start_sim_process = launch_sim(procs, "prefill-back", "prefill", stack.prefill_port, stack.bootstrap_port,
                                       env={"PDKIT_SIM_STARTUP_DELAY_S": "30"})
        events = inflight.result(timeout=WAITING_TIMEOUT_S + 10)
    waited = time.monotonic() - handed_at
    errors = [e["error"] for e in events if "error" in e]
    assert errors, events
    assert "in KVPoll.WaitingForInput" in errors[0]["message"], errors
    assert waited >= WAITING_TIMEOUT_S - 1.0, waited  # no heartbeat verdict: the waiting timeout ended it
    assert waited < WAITING_TIMEOUT_S + 3.0, waited
    start_sim_process.kill()
