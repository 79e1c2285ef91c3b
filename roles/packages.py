"""Debian packages a host needs (node_exporter, Prometheus), installed only when missing."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt

from pdkit.deploy import current_plan
from roles.facts import host_state

# apt can hang on a flaky mirror or cache: never let one host stall the whole run
APT_TIMEOUT_S = 900


@deploy("pdkit packages")
def packages() -> None:
    wanted = current_plan().packages
    missing = sorted(set(wanted) - set(host_state()["packages"]))
    if missing:
        apt.packages(name=f"Install {', '.join(missing)}", packages=missing, update=True, no_recommends=True, _timeout=APT_TIMEOUT_S)
