"""Glue between a running pyinfra deploy and the spec: one validated spec per run, one plan per host.

Deploy files call `current_spec()` at prepare time; it validates the inventory pyinfra loaded
(the same data `pdkit validate` sees) and stops the run before any operation if it is invalid.
"""

from __future__ import annotations

import socket
from functools import lru_cache
from weakref import WeakKeyDictionary

from pdkit.inventory.loader import invalid_report, inventory_host_data, spec_from_host_data
from pdkit.render.plan import HostPlan, plan_host
from pdkit.spec import ClusterSpec, HostSpec


@lru_cache(maxsize=1)
def _spec_for(inventory_id: int) -> ClusterSpec:
    # lazy: pyinfra (it loads gevent, ~240 ms) must load after the roll's patch_gevent, and
    # pdkit.hosts.hoststate imports this module
    from pyinfra import state

    spec, problems = spec_from_host_data(inventory_host_data(state.inventory),
                                         inventory=str(getattr(state, "inventory_filename", "") or "inventory"))
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        # no traceback: the same list `pdkit validate` prints, then stop before any operation
        raise SystemExit(invalid_report(getattr(state, "inventory_filename", "") or "the inventory", errors,
                                        nothing="no host was changed"))
    return spec


def current_spec() -> ClusterSpec:
    # lazy: pyinfra (it loads gevent, ~240 ms) must load after the roll's patch_gevent, and
    # pdkit.hosts.hoststate imports this module
    from pyinfra import state

    return _spec_for(id(state.inventory))


# how often paramiko's reader wakes on an idle connection to see whether it was closed (its own is 0.1 s)
SSH_CLOSE_CHECK_S = 1.0


def tune_connection(host=None) -> bool:
    """Turn Nagle's algorithm off on HOST's SSH socket (default: the host being prepared), and
    let paramiko's reader wake once a second, not ten times, while the connection is idle.

    paramiko leaves TCP_NODELAY unset, and every command of a deploy is a small request and a
    small reply: Nagle's algorithm meeting the other side's delayed ACK then stalls each round
    trip ~40 ms (measured on the lab: 55-60 ms per command, 4-6 ms with TCP_NODELAY). OpenSSH's
    own client sets it for interactive sessions for the same reason.

    paramiko's transport reads its socket with a 0.1 s timeout (Transport._active_check_timeout,
    paramiko 3.x/4.x) only to notice a close: every open connection wakes the deploying process
    10 times a second for the whole run (~70 us of CPU each under gevent on the lab machine), a
    cost that grows with hosts x run time, most of it while a roll waits on its gates. A data
    packet still wakes it at once, and a close is still seen: under gevent (pyinfra's CLI) closing
    the socket wakes the reader, without it the reader sees the close within SSH_CLOSE_CHECK_S.

    False when the host is not reached over a plain TCP socket (local, docker, a proxied SSH
    channel): left as it is.
    """

    if host is None:
        # lazy: pyinfra (it loads gevent, ~240 ms) must load after the roll's patch_gevent, and
        # pdkit.hosts.hoststate imports this module
        from pyinfra import host
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None and hasattr(client, "get_transport") else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(SSH_CLOSE_CHECK_S)
    return True


def current_host() -> HostSpec:
    # lazy: pyinfra (it loads gevent, ~240 ms) must load after the roll's patch_gevent, and
    # pdkit.hosts.hoststate imports this module
    from pyinfra import host

    return current_spec().host(host.name)


# per pyinfra State, then host name (as roles/facts.py): `pdkit roll` runs one State per batch in
# one process, and a State that is gone takes its plans with it
_PLANS: WeakKeyDictionary = WeakKeyDictionary()


def current_plan() -> HostPlan:
    """This host's plan, computed once per run.

    The roles ask for it seven times per host at prepare time, and the monitoring host's plan
    renders a Prometheus configuration listing every host: re-planning took 210 ms of the 340 ms
    prepare of a 32-host lab no-op (benchmarks/noop_cost.py). A plan is a pure function of the
    spec, one object per run (current_spec): kept with the spec it was made from, made again for another.
    """
    # lazy: pyinfra (it loads gevent, ~240 ms) must load after the roll's patch_gevent, and
    # pdkit.hosts.hoststate imports this module
    from pyinfra import host

    spec = current_spec()
    plans = _PLANS.setdefault(host.state, {})
    hit = plans.get(host.name)
    if hit is None or hit[0] is not spec:
        hit = plans[host.name] = (spec, plan_host(spec, spec.host(host.name)))
    return hit[1]
