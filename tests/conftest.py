"""Shared helpers for the unit tests: write inventories, run the CLI."""

from __future__ import annotations

import copy
import itertools
import os
import pprint
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_script(relative: str, name: str):
    """A script of the repo that is not a package module (benchmarks/, gpu/) imported as NAME,
    registered in sys.modules (its dataclasses look their module up there)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

# A small but complete PD cluster: two GPU nodes, a router, a monitoring host.
BASE_CLUSTER = {
    "name": "test",
    "engine": "sglang",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/m", "served_name": "m"},
    "target_concurrency": 16,
    "tuning": {"decode": {"cuda_graph_max_bs": 32}},
}
_GPUS = {"model": "NVIDIA H200", "count": 4, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0, 1, 1]}
BASE_HOSTS = {
    "gpu01": {
        "ssh_hostname": "10.9.0.1",
        "pdkit_node": {
            "gpus": _GPUS,
            "engines": [
                {"name": "prefill", "role": "prefill", "gpus": [0, 1], "port": 30000},
                {"name": "decode", "role": "decode", "gpus": [2, 3], "port": 30001},
            ],
        },
        # one router per PD pair: a router over both nodes would pair prefill and decode across hosts;
        # no API key, said (without auth: none, validate warns; a test that adds a key drops it)
        "pdkit_router": {"workers": ["gpu01/prefill", "gpu01/decode"], "auth": "none"},
    },
    "gpu02": {
        "ssh_hostname": "10.9.0.2",
        "pdkit_node": {
            "gpus": _GPUS,
            "engines": [
                {"name": "prefill", "role": "prefill", "gpus": [0, 1], "port": 30000, "pd_group": "g2"},
                {"name": "decode", "role": "decode", "gpus": [2, 3], "port": 30001, "pd_group": "g2"},
            ],
        },
    },
    # a receiver, so that alerts reach someone (without one, validate warns)
    "mon01": {"ssh_hostname": "10.9.0.3", "pdkit_monitoring": {"alerting": {"receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.9.0.3:9095/"}]}}},
}


_written = itertools.count()


def write_inventory(directory: Path, hosts: dict, cluster: dict | None, name: str | None = None) -> Path:
    """Write a pyinfra inventory file: GPU hosts in `gpu_nodes`, others in `other`, cluster data on `all`.

    Each call gets a new file name: pyinfra caches compiled files by path within a process.
    """
    name = name or f"inv{next(_written)}.py"
    gpu = [(h, d) for h, d in hosts.items() if "pdkit_node" in d]
    other = [(h, d) for h, d in hosts.items() if "pdkit_node" not in d]
    text = f"gpu_nodes = {pprint.pformat(gpu)}\nother = {pprint.pformat(other)}\n"
    all_data = {} if cluster is None else {"pdkit_cluster": cluster}
    text += f"all = ({list(hosts)!r}, {pprint.pformat(all_data)})\n"
    path = directory / name
    path.write_text(text)
    return path


def require(available: bool, reason: str) -> None:
    """Skip with the reason when something a test needs is missing — but fail under CI, where
    .ci/run installs everything, so that a missing install step can never pass silently."""
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide this)")
    pytest.skip(reason)


@pytest.fixture
def base():
    """Deep copies of the base cluster and hosts, to mutate in a test."""
    return copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)


class _PollingEvent:
    """An Event whose wait() with no timeout waits in short slices (see pytest_configure)."""

    def __init__(self, event) -> None:
        self._event = event

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(0.05 if timeout is None else timeout)


def pytest_configure(config) -> None:
    """Under pytest-xdist (`make test` runs the unit tests with -n 2): keep a worker alive once
    gevent has patched it. Loading any inventory imports pyinfra_cli, which gevent-patches the
    whole process (threading included); the worker then waits for its next tests on an Event that
    execnet's I/O thread, a real thread started before the patch, sets. A wait with no timeout
    on gevent's lock, with nothing else scheduled on gevent's hub, ends in gevent's LoopExit
    ("This operation would block forever") and the worker dies. Waiting in slices keeps a timer
    on the hub; the worker's queue (xdist/remote.py TestQueue.get) already loops until it has an
    item, so nothing else changes."""
    if not hasattr(config, "workerinput"):
        return
    queues = [p.torun for p in config.pluginmanager.get_plugins() if hasattr(getattr(p, "torun", None), "_has_items_event")]
    assert queues, "pytest-xdist's worker queue (WorkerInteractor.torun._has_items_event) not found: has pytest-xdist changed? (pyproject.toml pins it)"
    for queue in queues:
        if not isinstance(queue._has_items_event, _PollingEvent):
            queue._has_items_event = _PollingEvent(queue._has_items_event)
