"""Fixtures for the sim tests. Helpers (ports, processes, polling) live in support.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .support import (
    ManagedProcess,
    Processes,
    free_ports,
    launch_sim,
    start_router,
    wait_ready,
)


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    """Processes started by one test; all stopped when it ends, pass or fail."""
    group = Processes(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


@dataclass
class PDStack:
    procs: Processes
    prefill: ManagedProcess
    decode: ManagedProcess
    router: ManagedProcess
    prefill_url: str
    decode_url: str
    router_url: str
    router_metrics_url: str
    prefill_port: int
    decode_port: int
    bootstrap_port: int


def start_pd_stack(group: Processes, prefill_env: dict[str, str] | None = None,
                   decode_env: dict[str, str] | None = None) -> PDStack:
    """A sim prefill, a sim decode and the real smg router in PD mode, all on loopback."""
    prefill_port, bootstrap_port, decode_port = free_ports(3)
    # Both engines start together; the router only once both are ready (its first check is slow).
    prefill = launch_sim(group, "prefill", "prefill", prefill_port, bootstrap_port, env=prefill_env)
    decode = launch_sim(group, "decode", "decode", decode_port, env=decode_env)
    wait_ready(group, prefill, prefill_port)
    wait_ready(group, decode, decode_port)
    router, router_url, metrics_url = start_router(group, prefill_port, bootstrap_port, decode_port)
    return PDStack(group, prefill, decode, router, f"http://127.0.0.1:{prefill_port}",
                   f"http://127.0.0.1:{decode_port}", router_url, metrics_url,
                   prefill_port, decode_port, bootstrap_port)


@pytest.fixture(scope="module")
def pd_stack(tmp_path_factory) -> Iterator[PDStack]:
    """One PD stack shared by a module's read-mostly tests."""
    group = Processes(tmp_path_factory.mktemp("pd_stack"))
    try:
        yield start_pd_stack(group)
    finally:
        group.stop_all()
