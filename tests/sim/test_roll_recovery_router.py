"""Issue 42 item 3 against the real smg 1.13.0 router, with a sim prefill and decode on loopback as
the one-box cluster (inventories/cluster.py, gpu01): a rollback whose `ready` step fails after a
successful restore leaves both workers in the router, serving; with the prefill stopped, the
decode goes back alone and the prefill is named as left out. The SSH side (restore, the node's
gates) is stubbed; the router's worker API, the engines' /health and /metrics are real."""

from __future__ import annotations

import argparse
import contextlib
import io
import types

from pdkit.clients.router_api import RouterClient
from pdkit.inventory.loader import load
from pdkit.roll import commands
from pdkit.roll.roller import Progress, Roller
from tests.conftest import REPO
from tests.test_roll import _FakePyinfra

from .conftest import start_pd_stack
from .support import completion_ok


def _rollback_with_failing_ready(monkeypatch, stack) -> tuple[int, str, str, RouterClient]:
    spec = load(str(REPO / "inventories" / "cluster.py"))
    out = io.StringIO()
    roller = Roller("inventories/cluster.py", spec, Progress(out), allow_downtime=True, command="rollback")
    roller.router_timeout_s = 15
    client = RouterClient(stack.router_url, drain_settle_s=0)
    router_host = spec.router_hosts[0]
    roller._routers = [(router_host, client)]
    loopback = {"prefill": stack.prefill_url, "decode": stack.decode_url}
    # the engines as the router sees them: loopback URLs, the sim prefill's bootstrap port
    engines = [types.SimpleNamespace(role=e.role, effective_bootstrap_port=stack.bootstrap_port)
               for h, e in spec.router_workers(router_host)]
    monkeypatch.setattr(roller, "workers_of", lambda hosts: [(client, e, loopback[e.role]) for e in engines]
                        if "gpu01" in hosts else [])
    monkeypatch.setattr(roller, "engine_urls", lambda hosts: {f"gpu01/{r}": u for r, u in loopback.items()})
    monkeypatch.setattr("pdkit.roll.roller.router_metrics_url", lambda host: stack.router_metrics_url)
    roller.pyinfra = _FakePyinfra()
    monkeypatch.setattr(roller, "read_router_keys", lambda: [])
    monkeypatch.setattr(roller, "last_restart_to_ready", lambda host, name: None)
    monkeypatch.setattr(roller, "silenced", lambda *a, **k: contextlib.nullcontext(types.SimpleNamespace(failed=False)))
    monkeypatch.setattr(roller, "run_gates", lambda hosts, phase: (0, []))
    monkeypatch.setattr(roller, "restore", lambda name, host, to: "back on release rel-0 (0 file(s) rewritten)")

    def ready(hosts):
        raise RuntimeError("gpu01: not ready after 120 s: the prefill has not logged its readiness line yet")

    monkeypatch.setattr(roller, "ready", ready)
    monkeypatch.setattr(commands, "patch_gevent", lambda: None)
    monkeypatch.setattr(commands, "Roller", lambda *a, **k: roller)
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    rc = commands.cmd_rollback(argparse.Namespace(inventory="inventories/cluster.py", host="gpu01", to=None,
                                                  drain_timeout=30.0, allow_downtime=True))
    return rc, err.getvalue(), out.getvalue(), client


def test_a_rollback_whose_ready_step_fails_leaves_the_box_serving(procs, monkeypatch):
    stack = start_pd_stack(procs)
    rc, err, out, client = _rollback_with_failing_ready(monkeypatch, stack)
    assert rc == 1, err
    assert "pdkit rollback: gpu01: gate 'ready' failed: " in err
    assert "1 worker(s) out of the router" not in out and "2 worker(s) out of the router" in out, out
    listed = {w.url: w.routable for w in client.workers()}
    assert listed == {stack.prefill_url: True, stack.decode_url: True}, (listed, out)
    assert err.strip().splitlines()[-1].endswith("its engines are back in the router"), err
    assert completion_ok(stack.router_url)


def test_a_rollback_with_a_dead_prefill_puts_the_decode_back_and_names_the_prefill(procs, monkeypatch):
    stack = start_pd_stack(procs)
    real_drain = Roller.drain

    def drain_then_prefill_dies(self, hosts):
        message = real_drain(self, hosts)
        stack.prefill.stop()
        return message

    monkeypatch.setattr(Roller, "drain", drain_then_prefill_dies)
    rc, err, out, client = _rollback_with_failing_ready(monkeypatch, stack)
    assert rc == 1, err
    listed = {w.url: w.routable for w in client.workers()}
    assert listed == {stack.decode_url: True}, (listed, out)
    last = err.strip().splitlines()[-1]
    assert f"its healthy engines are back in the router; left out: {stack.prefill_url} (its /health did not answer" \
        in last, last
    assert f"left out of the router: {stack.prefill_url}" in out


def _unchanged_roller(monkeypatch, stack) -> tuple[Roller, io.StringIO, RouterClient]:
    """A roll of gpu01 whose plan changes nothing, against the real router and sim engines; the SSH
    side (apply, the node's gates) stubbed."""
    spec = load(str(REPO / "inventories" / "cluster.py"))
    out = io.StringIO()
    roller = Roller("inventories/cluster.py", spec, Progress(out), allow_downtime=True)
    roller.router_timeout_s = 15
    roller.unchanged = {"gpu01"}
    client = RouterClient(stack.router_url, drain_settle_s=0)
    roller._routers = [(spec.router_hosts[0], client)]
    loopback = {"prefill": stack.prefill_url, "decode": stack.decode_url}
    engines = [types.SimpleNamespace(role=e.role, effective_bootstrap_port=stack.bootstrap_port)
               for h, e in spec.router_workers(spec.router_hosts[0])]
    monkeypatch.setattr(roller, "workers_of", lambda hosts: [(client, e, loopback[e.role]) for e in engines]
                        if "gpu01" in hosts else [])
    monkeypatch.setattr(roller, "engine_urls", lambda hosts: {f"gpu01/{r}": u for r, u in loopback.items()})
    monkeypatch.setattr("pdkit.roll.roller.router_metrics_url", lambda host: stack.router_metrics_url)
    roller.pyinfra = _FakePyinfra()
    monkeypatch.setattr(roller, "current_releases", lambda state, hosts: ({h: "rel-0" for h in hosts},
                                                                           {h: None for h in hosts}))
    monkeypatch.setattr(roller, "read_router_keys", lambda: [])
    monkeypatch.setattr(roller, "last_restart_to_ready", lambda host, name: None)
    monkeypatch.setattr(roller, "engines_restart_to_ready", lambda host, name, since: 0.0)
    monkeypatch.setattr(roller, "silenced", lambda *a, **k: contextlib.nullcontext(types.SimpleNamespace(failed=False)))
    monkeypatch.setattr(roller, "run_gates", lambda hosts, phase: (0, []))
    monkeypatch.setattr(roller, "ready", lambda hosts: "ready")
    monkeypatch.setattr(roller, "check_gpu_health_before_drain", lambda name, host: "")
    monkeypatch.setattr(roller, "warm_weights", lambda name, host: (None, ""))
    monkeypatch.setattr("pdkit.roll.roller.jitplan.pre_restart_warning", lambda *a, **k: "")
    # the smoke request with the sim's model name (the inventory's is not the sim's)
    monkeypatch.setattr(roller, "smoke", lambda hosts: f"smoke answered: {completion_ok(stack.router_url)}")
    return roller, out, client


def test_an_unchanged_node_serving_in_its_router_is_left_alone(procs, monkeypatch):
    stack = start_pd_stack(procs)
    roller, out, client = _unchanged_roller(monkeypatch, stack)
    roller.roll_batch(["gpu01"])
    assert "no change: files and services already as planned; serving and in the router" in out.getvalue()
    assert [c[0] for c in roller.pyinfra.calls] == ["connect"], roller.pyinfra.calls


def test_an_unchanged_node_left_out_of_its_router_is_put_back(procs, monkeypatch):
    """A step cut short (a killed `pdkit tune` on the lent H100, 2026-12-07) left the files as planned
    and the workers out of the router: the next roll found "no change" and said "left in the router"
    while the router had no worker. Now it sees that and goes through drain, apply, gates and re-add."""
    stack = start_pd_stack(procs)
    roller, out, client = _unchanged_roller(monkeypatch, stack)
    for url in (stack.decode_url, stack.prefill_url):
        client.remove(url)
    assert client.workers() == []
    roller.roll_batch(["gpu01"])
    text = out.getvalue()
    assert f"{stack.prefill_url} is not in its router" in text and "no change:" not in text, text
    assert ("execute", ("gpu01",)) in roller.pyinfra.calls
    assert {w.url: w.routable for w in client.workers()} == {stack.prefill_url: True, stack.decode_url: True}
    assert "smoke answered: True" in text, text
