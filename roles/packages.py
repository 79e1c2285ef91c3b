"""Packages a host needs (node_exporter, DCGM, Prometheus, Alertmanager, Grafana), installed only when missing;
a pinned one (pdkit.upstream.versions.APT_PINS) at its exact version."""

from __future__ import annotations

import io

from pyinfra.api import deploy
from pyinfra.operations import apt, files

from pdkit.hosts.deploy import current_plan
from pdkit.render.plan import DCGM_PACKAGES, GRAFANA_KEY_URL, GRAFANA_KEYRING_PATH, GRAFANA_SOURCES_PATH
from pdkit.upstream.versions import APT_PINS
from roles.facts import host_state

# apt can hang on a flaky mirror or cache: never let one host stall the whole run
APT_TIMEOUT_S = 900


@deploy("pdkit packages")
def packages() -> None:
    plan = current_plan()
    missing = sorted(set(plan.packages) - set(host_state()["packages"]))
    if "grafana" in missing:
        # Grafana comes from its own repository, trusted only through its key (deb822 Signed-By)
        files.download(name="Grafana's apt key", src=GRAFANA_KEY_URL, dest=GRAFANA_KEYRING_PATH, mode="0644", _timeout=120)
        source = plan.file(GRAFANA_SOURCES_PATH)
        files.put(name="Grafana's apt source", src=io.StringIO(source.content), dest=source.path, mode=source.mode)
    if set(DCGM_PACKAGES) & set(missing):
        # DCGM and its exporter come from NVIDIA's CUDA repository (shared with the node roles)
        from roles.nvidia_repo import nvidia_repo

        nvidia_repo()
    if missing:
        wanted = [install_spec(p) for p in missing]
        apt.packages(name=f"Install {', '.join(wanted)}", packages=wanted, update=True, no_recommends=True, _timeout=APT_TIMEOUT_S)


def install_spec(package: str) -> str:
    """What apt is asked for: `name=version` for a pinned package, else the name."""
    return f"{package}={APT_PINS[package]}" if package in APT_PINS else package
