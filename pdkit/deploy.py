"""Glue between a running pyinfra deploy and the spec: one validated spec per run, one plan per host.

Deploy files call `current_spec()` at prepare time; it validates the inventory pyinfra loaded
(the same data `pdkit validate` sees) and stops the run before any operation if it is invalid.
"""

from __future__ import annotations

import sys
from functools import lru_cache

from pdkit.loader import inventory_host_data, spec_from_host_data
from pdkit.plan import HostPlan, plan_host
from pdkit.spec import ClusterSpec, HostSpec


@lru_cache(maxsize=1)
def _spec_for(inventory_id: int) -> ClusterSpec:
    from pyinfra import state

    spec, problems = spec_from_host_data(inventory_host_data(state.inventory), inventory=str(getattr(state, "inventory_filename", "") or "inventory"))
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        # no traceback: the same list `pdkit validate` prints, then stop before any operation
        for p in errors:
            print(f"pdkit: error {p}", file=sys.stderr)
        raise SystemExit(f"pdkit: the inventory has {len(errors)} error(s); no host was changed")
    return spec


def current_spec() -> ClusterSpec:
    from pyinfra import state

    return _spec_for(id(state.inventory))


def current_host() -> HostSpec:
    from pyinfra import host

    return current_spec().host(host.name)


def current_plan() -> HostPlan:
    return plan_host(current_spec(), current_host())
