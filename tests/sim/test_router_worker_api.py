"""pdkit.clients.router_api against the real smg 1.13.0 binary, with sim engines on loopback.

What a roll relies on: a removed worker stops being routable at once; with the per-worker
drain settle time set to 0 (pdkit.upstream.versions.RouterRelease.per_worker_drain_settle) it can be
added back at once; with the router's own (5 s) a re-add waits the removal out (409 meanwhile).
"""

from __future__ import annotations

import time

from pdkit.clients.router_api import RouterClient
from pdkit.upstream.versions import ROUTER_RELEASES

from .conftest import start_pd_stack
from .support import MODEL


def _remove_and_add_back(client: RouterClient, url: str) -> tuple[float, float]:
    """(seconds until the removed worker is gone from the list, seconds until it is back and healthy)."""
    worker = client.find(url)
    assert worker is not None and worker.status == "ready"
    start = time.monotonic()
    removed = client.remove(url)
    assert removed is not None and removed.url == url
    listed = client.find(url)
    assert listed is None or listed.status == "draining", f"{url} still routable after remove(): {listed}"
    while client.find(url) is not None:
        assert time.monotonic() - start < 30, f"{url} never left the router's list"
        time.sleep(0.05)
    gone = time.monotonic() - start
    client.add(url, worker.worker_type, worker.bootstrap_port, timeout=30)
    client.wait_healthy([url], timeout=30)
    return gone, time.monotonic() - start


def test_a_zero_settle_removal_is_immediate_and_the_default_one_is_not(procs):
    assert ROUTER_RELEASES[("smg", "1.13.0")].per_worker_drain_settle
    stack = start_pd_stack(procs)
    fast = RouterClient(stack.router_url, drain_settle_s=0)
    # the CLI-registered decode: remove() first gives it the 0 s settle time (PUT), then removes it
    gone, back = _remove_and_add_back(fast, stack.decode_url)
    assert gone < 2.0 and back < 3.0, (gone, back)
    # added back by the same client: it keeps the 0 s settle time, the next removal is immediate too
    assert fast.detail(fast.find(stack.decode_url).id).get("health", {}).get("drain_settle_secs") == 0
    gone, back = _remove_and_add_back(fast, stack.prefill_url)
    assert gone < 2.0 and back < 3.0, (gone, back)
    # a client that leaves the router's own settle time: the removal takes smg's default 5 s,
    # and add() waits it out (smg answers 409 until then) instead of failing
    plain = RouterClient(stack.router_url)
    plain.remove(stack.decode_url)  # still the 0 s settle time fast's add gave it
    plain.add(stack.decode_url, "decode", timeout=30)  # registered again without an override
    plain.wait_healthy([stack.decode_url], timeout=30)
    assert "drain_settle_secs" not in plain.detail(plain.find(stack.decode_url).id).get("health", {})
    gone, back = _remove_and_add_back(plain, stack.decode_url)
    assert gone >= 4.0, f"smg removed a worker with its default settle time in {gone:.1f} s (expected ~5 s)"
    assert back >= gone
    # requests still flow through the router after all this
    status, body = plain.completion(MODEL, "after the removals", max_tokens=2)
    assert status == 200, body


def test_sync_router_moves_a_worker_and_returns_only_once_the_old_url_is_gone(procs):
    """Issue #18 item 5: after a host's decode moved port, routersync left the old URL listed
    (draining, unhealthy) beside the new one; done now means the router lists exactly the plan."""
    from pdkit.hosts.routersync import PlannedWorker, sync_router

    from .support import free_ports, start_sim

    stack = start_pd_stack(procs)
    (moved_port,) = free_ports(1)
    start_sim(procs, "decode-moved", "decode", moved_port)
    moved_url = f"http://127.0.0.1:{moved_port}"
    planned = [PlannedWorker(stack.prefill_url, "prefill", stack.bootstrap_port), PlannedWorker(moved_url, "decode")]
    # the router's own settle time (5 s): the case that showed the old URL after the deploy ended
    message = sync_router(RouterClient(stack.router_url), planned, "127.0.0.1", [], timeout=60)
    listed = {w.url: w for w in RouterClient(stack.router_url).workers()}
    assert set(listed) == {stack.prefill_url, moved_url}, (message, listed)
    assert listed[moved_url].healthy, listed
    assert f"took out {stack.decode_url}" in message and f"registered {moved_url}" in message, message
    status, body = RouterClient(stack.router_url).completion(MODEL, "after the move", max_tokens=2)
    assert status == 200, body


def test_sglang_router_0_3_2_lists_no_status_and_removes_a_worker_at_once(procs):
    """SGLang 0.5.17's router (sglang-router 0.3.2, the GPU tier's) answers /workers without
    "status" and drops a removed worker from the list at once. pdkit once required status
    "ready", so its drain gate found no usable worker behind 0.3.2 and refused every roll
    (rehearsal of inventories/h200-nspawn-pair.py, docs/gpu.md)."""
    import os
    from pathlib import Path

    from tests.conftest import require

    from .support import completion_ok, free_ports, launch_sim, wait_ready, wait_until

    home = Path(os.environ.get("PDKIT_CONTRACT_HOME", Path.home() / ".cache/pdkit/contract"))
    python = home / "sglang-router-0.3.2" / "bin" / "python"
    require(python.exists(), f"no sglang-router 0.3.2 contract env at {python} (make contract-env)")
    prefill_port, bootstrap_port, decode_port, other_port, port, metrics_port = free_ports(6)
    engines = [(launch_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port), prefill_port),
               (launch_sim(procs, "decode", "decode", decode_port), decode_port),
               (launch_sim(procs, "decode2", "decode", other_port), other_port)]
    for proc, p in engines:
        wait_ready(procs, proc, p)
    procs.start("router", [str(python), "-m", "sglang_router.launch_router", "--pd-disaggregation",
                           "--prefill", f"http://127.0.0.1:{prefill_port}", str(bootstrap_port),
                           "--decode", f"http://127.0.0.1:{decode_port}", "--decode", f"http://127.0.0.1:{other_port}",
                           "--decode-policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
                           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "warn"])
    client = RouterClient(f"http://127.0.0.1:{port}")
    wait_until(lambda: len([w for w in client.workers() if w.healthy]) == 3, 60, "0.3.2 lists 3 healthy workers", interval=0.5)
    listed = client.workers()
    assert {w.status for w in listed} == {""}, listed  # the release really has no status field
    assert all(w.routable for w in listed)
    other = f"http://127.0.0.1:{other_port}"
    removed = client.remove(other)
    assert removed is not None and removed.worker_type == "decode"
    assert client.find(other) is None  # gone at once: remove() returned only once it was not routable
    client.add(other, "decode", timeout=30)
    client.wait_healthy([other], timeout=30)
    assert completion_ok(f"http://127.0.0.1:{port}")
