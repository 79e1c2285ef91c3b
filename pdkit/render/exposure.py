"""`systemd-analyze security` exposure targets for pdkit's units, and reading the tool's verdict.

Measured on the rendered units (tests/test_systemd_security.py, `--offline=true` on the unit
file) and on the running lab hosts (tests/lab/test_security_lab.py). docs/security.md says
what each setting does and why the engines stop where they do.
"""

from __future__ import annotations

import re

# 0 (locked down) .. 10 (exposed). Issue #18 asked router and exporter <= 4.0 and engines as low
# as GPU access allows: what keeps an engine above the others is what it needs (devices,
# W+X memory for JIT/CUDA, netlink for UCX/RDMA, NUMA syscalls, no PrivateUsers for CUDA IPC).
TARGETS = {
    "engine": 2.5,
    "router": 2.0,
    "exporter": 2.0,
}

_OVERALL = re.compile(r"Overall exposure level for (\S+): (\d+(?:\.\d+)?)")


def overall_exposure(output: str) -> dict[str, float]:
    """unit -> exposure, from `systemd-analyze security` output (one unit or several)."""
    return {m.group(1): float(m.group(2)) for m in _OVERALL.finditer(output)}


def unit_target(unit: str) -> tuple[str, float] | None:
    """(kind, target) for one of pdkit's own units, None for units pdkit does not harden (packaged daemons)."""
    if unit.startswith("pdkit-engine-"):
        return "engine", TARGETS["engine"]
    if unit == "pdkit-router.service":
        return "router", TARGETS["router"]
    if unit == "pdkit-exporter.service":
        return "exporter", TARGETS["exporter"]
    return None
