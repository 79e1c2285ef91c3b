"""`systemd-analyze security` on every rendered pdkit unit: each at or below its target (pdkit/render/exposure.py).

Before issue #18 the rendered units scored engines 7.5, router 6.9, exporter 6.9 here.
"""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest

from pdkit.inventory.loader import load
from pdkit.render.exposure import TARGETS, overall_exposure, unit_target
from pdkit.render.plan import plan_cluster
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, REPO, require, write_inventory

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _units(spec) -> list[tuple[str, str, str]]:
    """(host, unit, text) of every pdkit unit the spec renders."""
    out = []
    for host, plan in plan_cluster(spec).items():
        for f in plan.files:
            name = f.path.rsplit("/", 1)[1]
            if f.path.endswith(".service") and unit_target(name):
                out.append((host, name, f.content))
    return out


def measure(tmp_path, unit: str, text: str) -> float:
    path = tmp_path / unit
    path.write_text(text)
    proc = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager", str(path)], capture_output=True, text=True, timeout=60)
    scores = overall_exposure(proc.stdout + proc.stderr)
    assert unit in scores, f"systemd-analyze gave no verdict for {unit}:\n{proc.stdout}{proc.stderr}"
    return scores[unit]


def test_overall_exposure_reads_the_tools_verdict():
    text = "  NAME  DESCRIPTION  EXPOSURE\n✗ PrivateNetwork= ... 0.5\n\n→ Overall exposure level for pdkit-router.service: 1.1 OK 🙂\n"
    assert overall_exposure(text) == {"pdkit-router.service": 1.1}
    assert overall_exposure("nothing") == {}


def _keyed_hosts() -> dict:
    """BASE_HOSTS with the router taking the cluster's key: the base runs without one (auth: none)."""
    hosts = copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_router"].pop("auth")
    return hosts


@pytest.mark.parametrize("inventory", ["lab", "cluster", "a6000", "secrets"])
def test_every_pdkit_unit_is_at_or_below_its_exposure_target(inventory, tmp_path, monkeypatch):
    require(SYSTEMD_ANALYZE is not None, "systemd-analyze not installed (Debian package systemd)")
    monkeypatch.chdir(REPO)
    if inventory == "secrets":
        # the router with its API key (LoadCredential, launcher) and engines with an HF token
        spec = load(str(write_inventory(tmp_path, _keyed_hosts(), {**BASE_CLUSTER, "engine": "sim", "secrets": {"hf_token": "x", "router_api_key": "y"}})))
    else:
        spec = load(f"inventories/{inventory}.py")
    units = _units(spec)
    kinds = {unit_target(u)[0] for _, u, _ in units}
    assert kinds == set(TARGETS), f"expected every kind of pdkit unit in {inventory}, got {kinds}"
    over = []
    for host, unit, text in units:
        kind, target = unit_target(unit)
        score = measure(tmp_path, unit, text)
        if score > target:
            over.append(f"{host}: {unit} exposure {score} > target {target} ({kind})")
    assert not over, "\n".join(over)


def test_the_router_runs_as_its_own_user_and_the_engines_cannot_read_its_key(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    spec = load(str(write_inventory(tmp_path, _keyed_hosts(), {**BASE_CLUSTER, "secrets": {"router_api_key": "rk_x"}})))
    plan = plan_cluster(spec)["gpu01"]
    router = plan.file("/etc/systemd/system/pdkit-router.service").content
    engine = plan.file("/etc/systemd/system/pdkit-engine-decode.service").content
    assert "User=pdkit-router" in router and "User=pdkit\n" in engine
    key = plan.file("/etc/pdkit/router-api-key")
    assert (key.mode, key.owner, key.group, key.secret) == ("0600", "root", "root", True)
    assert "pdkit-router" in plan.users and "pdkit" in plan.users
    # the key is a credential, not an environment variable: /proc/<pid>/environ never holds it
    assert "Environment" not in router and "LoadCredential=router-api-key:/etc/pdkit/router-api-key" in router
    launcher = plan.file("/opt/pdkit/bin/pdkit-router-launch").content
    assert "CREDENTIALS_DIRECTORY" in launcher and "os.environ.pop" not in launcher
