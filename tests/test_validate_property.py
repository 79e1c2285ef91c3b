"""Property: whatever one field of an example inventory is changed to, validation answers with
problems that name a host and a field, and never raises (so `pdkit validate` never prints a
traceback). Hypothesis draws the field and the value; derandomized, a fixed number of examples."""

from __future__ import annotations

import copy
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pdkit.inventory.loader import read_inventory, spec_from_host_data  # noqa: E402
from tests.conftest import REPO  # noqa: E402

EXAMPLES = ("inventories/cluster.py", "inventories/a6000.py", "inventories/h200x8.py", "inventories/lab.py")


def _host_data(inventory: str):
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return read_inventory(inventory, str(REPO))
    finally:
        os.chdir(cwd)


HOSTS = {inv: _host_data(inv) for inv in EXAMPLES}


def _leaves(value, path=()):
    """Every path into the pdkit sections, containers included (a whole list can be swapped too)."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))


PATHS = [
    (inv, h, (key, *rest))
    for inv, hosts in HOSTS.items()
    for h, (_, _, data) in enumerate(hosts)
    for key in data if key.startswith("pdkit_")
    for rest in _leaves(data[key])
]

TRICKY_STRINGS = ["", " ", "--tp-size 2", "0.0.0.0", "127.0.0.1", "@local", "/", "..", "root", "MTP", "nixel", "-1",
                  "x" * 300, "héllo", "a:b", "/models/../etc", "--api-key", "fp4_e2m1", "cache-aware"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**40, max_value=2**40), st.floats(allow_nan=True),
    st.sampled_from(TRICKY_STRINGS), st.text(max_size=12),
    st.lists(st.one_of(st.integers(-3, 70000), st.sampled_from(TRICKY_STRINGS)), max_size=4),
    st.dictionaries(st.sampled_from(["name", "port", "role", "gpus", "x"]), st.integers(-1, 70000), max_size=3),
)
DELETE = object()


def _mutated(inv, host_index, path, value):
    hosts = copy.deepcopy(HOSTS[inv])
    name, groups, data = hosts[host_index]
    target = data
    for part in path[:-1]:
        target = target[part]
    last = path[-1]
    if value is DELETE:
        if isinstance(target, dict):
            target.pop(last)
        else:
            target = None  # an element of a tuple: leave the inventory as is
    elif isinstance(target, tuple):
        items = list(target)
        items[last] = value
        parent = data
        for part in path[:-2]:
            parent = parent[part]
        parent[path[-2]] = items
    else:
        target[last] = value
    return hosts


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(PATHS), value=st.one_of(VALUES, st.just(DELETE)))
def test_any_one_field_changed_gives_problems_naming_host_and_field_never_an_exception(where, value):
    inv, host_index, path = where
    hosts = _mutated(inv, host_index, path, value)
    spec, problems = spec_from_host_data(hosts, inventory=inv)  # must not raise
    names = {name for name, _, _ in hosts} | {"<inventory>"}
    errors = [p for p in problems if p.severity == "error"]
    assert (spec is None) == bool(errors)
    for p in problems:
        assert p.host in names, p
        assert p.field and p.message and "\n" not in p.message, p
