"""The load client's verdicts through the real router, on the sim engines (issue 30 item 6).

A PD transfer failure (the prefill sim's PDKIT_SIM_TRANSFER_FAIL_RATE) reaches the client as
an error chunk inside a 200 stream; the client counts it `aborted` with finish reason
`error 500`, and names the worker from smg 1.13.0's x-smg-routed-worker-id header (the decode's
URL in PD mode). sglang-router 0.3.2 sends no such header: there the worker is unknown.
"""

from __future__ import annotations

from tests.lab import loadclient

from .conftest import start_pd_stack
from .support import MODEL

REQUESTS = 24


def test_transfer_failures_through_smg_are_aborted_with_the_decode_named(procs):
    stack = start_pd_stack(procs, prefill_env={"PDKIT_SIM_TRANSFER_FAIL_RATE": "0.3"})
    outcomes = [loadclient.request(stack.router_url, MODEL, n, 4, 20) for n in range(REQUESTS)]
    failed = [o for o in outcomes if not o.ok]
    assert failed and len(failed) < REQUESTS, [o.why for o in outcomes]
    for o in failed:
        assert (o.kind, o.finish_reason) == ("aborted", "error 500"), o
        assert "failed for request" in o.why and "KVTransferError" in o.why, o.why
        assert o.worker == stack.decode_url, (o.worker, stack.decode_url)
        assert o.rid and o.rid in o.raw, o  # the engine's rid, from its message: grep its log for it
        assert o.request_id, o  # the router's own id, on every answer
    counts = loadclient.Counts()
    for o in failed:
        counts.failure(o, 0.0)
    snap = counts.snapshot(0.0)
    assert snap["failures"] == {"aborted": len(failed)} and snap["workers"] == {stack.decode_url: len(failed)}
    assert snap["finish_reasons"] == {"error 500": len(failed)}


def test_sglang_router_0_3_2_names_no_worker(procs):
    """The GPU tier's router (SGLang 0.5.17's sglang-router 0.3.2): the same error chunk, no worker
    header, so the worker is recorded unknown (None), and x-request-id is still there."""
    import os
    from pathlib import Path

    from tests.conftest import require

    from .support import free_ports, launch_sim, wait_ready, wait_until

    home = Path(os.environ.get("PDKIT_CONTRACT_HOME", Path.home() / ".cache/pdkit/contract"))
    python = home / "sglang-router-0.3.2" / "bin" / "python"
    require(python.exists(), f"no sglang-router 0.3.2 contract env at {python} (make contract-env)")
    prefill_port, bootstrap_port, decode_port, port, metrics_port = free_ports(5)
    prefill = launch_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env={"PDKIT_SIM_TRANSFER_FAIL_RATE": "0.3"})
    decode = launch_sim(procs, "decode", "decode", decode_port)
    wait_ready(procs, prefill, prefill_port)
    wait_ready(procs, decode, decode_port)
    procs.start("router", [str(python), "-m", "sglang_router.launch_router", "--pd-disaggregation",
                           "--prefill", f"http://127.0.0.1:{prefill_port}", str(bootstrap_port),
                           "--decode", f"http://127.0.0.1:{decode_port}", "--host", "127.0.0.1", "--port", str(port),
                           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "warn"])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: loadclient.request(url, MODEL, 0, 4, 5).ok, 60, "sglang-router 0.3.2 to serve", interval=0.5,
               context=procs.logs)
    outcomes = [loadclient.request(url, MODEL, n, 4, 20) for n in range(REQUESTS)]
    failed = [o for o in outcomes if not o.ok]
    assert failed and len(failed) < REQUESTS, [o.why for o in outcomes]
    for o in failed:
        assert (o.kind, o.finish_reason, o.worker) == ("aborted", "error 500", None), o
        assert o.request_id, o
