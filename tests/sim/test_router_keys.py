"""pdkit.clients.router_api across an API key change, against the real smg 1.13.0 with sim engines on loopback.

What `pdkit roll` relies on when pdkit_cluster.secrets.router_api_key is added, rotated or
removed (issue 30 item 4): the roll's client holds the keys in order (the one the running
router was started with, the inventory's, none) and keeps the one the router accepts; when the
router restarts on the new key it answers 401 to the old one and the client moves on without
a failed call. A router that accepts none of them gets one message that says so, names where
each key came from and what to run, and never prints a key.
"""

from __future__ import annotations

import secrets

import pytest

from pdkit.clients.router_api import Key, RouterClient, RouterKeyError
from pdkit.sim.localstack import free_ports, router_command

from .support import launch_sim, wait_ready, wait_until


def _start_router(procs, ports: tuple[int, int, int], port: int, metrics: int, key: str | None, name: str):
    prefill, bootstrap, decode = ports
    extra = ["--api-key", key] if key else []
    return procs.start(name, router_command(prefill, bootstrap, decode, port, metrics, extra=extra))


def _ready(client: RouterClient):
    def check() -> bool:
        return len([w for w in client.workers() if w.routable]) == 2 and client.completion("sim-test", "ping", 2)[0] == 200

    return check


@pytest.fixture
def engines(procs):
    prefill, bootstrap, decode = free_ports(3)
    p = launch_sim(procs, "prefill", "prefill", prefill, bootstrap)
    d = launch_sim(procs, "decode", "decode", decode)
    wait_ready(procs, p, prefill)
    wait_ready(procs, d, decode)
    return prefill, bootstrap, decode


def test_the_client_follows_the_router_across_add_rotate_and_remove_without_a_failed_call(procs, engines):
    old, new = secrets.token_hex(16), secrets.token_hex(16)
    port, metrics = free_ports(2)
    url = f"http://127.0.0.1:{port}"
    # add: the router runs without a key, the inventory now has one
    router = _start_router(procs, engines, port, metrics, None, "router-nokey")
    client = RouterClient(url, keys=[Key(None, "the running router (started without a key)"), Key(old, "pdkit_cluster.secrets.router_api_key"), Key(None, "no key")])
    wait_until(_ready(client), 30, "router without a key ready", context=procs.logs)
    assert client.key.value is None
    router.stop()
    router = _start_router(procs, engines, port, metrics, old, "router-old")
    wait_until(_ready(client), 30, "router on the added key ready", context=procs.logs)
    # the first 401 moved the client to the inventory's key, and it stays there
    assert client.key.value == old and client.completion("sim-test", "after add", 2)[0] == 200
    # rotate: the running router has OLD (read from its credential), the inventory NEW
    client = RouterClient(url, keys=[Key(old, "the key the running router was started with"), Key(new, "pdkit_cluster.secrets.router_api_key"), Key(None, "no key")])
    assert client.workers() and client.key.value == old
    router.stop()
    router = _start_router(procs, engines, port, metrics, new, "router-new")
    wait_until(_ready(client), 30, "router on the rotated key ready", context=procs.logs)
    assert client.key.value == new
    # remove: the router runs with NEW, the inventory has none
    client = RouterClient(url, keys=[Key(new, "the key the running router was started with"), Key(None, "pdkit_cluster.secrets.router_api_key")])
    assert client.workers() and client.key.value == new
    router.stop()
    _start_router(procs, engines, port, metrics, None, "router-removed")
    # smg without --api-key ignores the Authorization header: the client's calls go on as they are
    wait_until(_ready(client), 30, "router without its key ready", context=procs.logs)


def test_a_router_that_refuses_every_key_says_missing_or_wrong_and_what_to_run_never_the_key(procs, engines):
    running, wrong = secrets.token_hex(16), secrets.token_hex(16)
    port, metrics = free_ports(2)
    url = f"http://127.0.0.1:{port}"
    _start_router(procs, engines, port, metrics, running, "router")
    wait_until(_ready(RouterClient(url, api_key=running)), 30, "router with a key ready", context=procs.logs)
    fix = "Run: pyinfra INV deploy/pd.py --limit lab-gpu1"
    # wrong: the inventory's key is another one, and the running one could not be read
    client = RouterClient(url, keys=[Key(wrong, "pdkit_cluster.secrets.router_api_key"), Key(None, "no key")], key_fix=fix)
    with pytest.raises(RouterKeyError) as caught:
        client.workers()
    message = str(caught.value)
    assert message.startswith(f"router {url} refuses every API key pdkit has for it: it runs with another key"), message
    assert "tried: pdkit_cluster.secrets.router_api_key, no key)" in message and message.endswith(fix), message
    assert running not in message and wrong not in message
    # missing: no key at all (the inventory has none)
    client = RouterClient(url, keys=[Key(None, "pdkit_cluster.secrets.router_api_key")], key_fix=fix)
    with pytest.raises(RouterKeyError, match=r"requires an API key and pdkit has none for it \(it answered 401: Missing API key"):
        client.completion("sim-test", "no key", 2)
