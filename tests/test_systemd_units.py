"""`systemd-analyze verify` on every rendered unit, in a scratch root holding the rendered files."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from pdkit.inventory.loader import load
from pdkit.render.plan import plan_cluster
from tests.conftest import REPO, write_inventory

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (Debian package systemd)")


def _exec_start_binary(unit_text: str) -> str:
    line = next(l for l in unit_text.splitlines() if l.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").rstrip("\\"))[0]


def verify_host_units(plan, root: Path) -> list[tuple[str, subprocess.CompletedProcess]]:
    """Lay a host's rendered files into ROOT as the host would have them and verify each unit."""
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", dirs_exist_ok=True, symlinks=True)
    results = []
    for f in plan.files:
        target = root / f.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
    for f in plan.files:
        if f.path.endswith(".service"):
            # the venv is laid down by the deploy; verify checks that ExecStart is executable
            binary = root / _exec_start_binary(f.content).lstrip("/")
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text("#!/bin/sh\n")
            binary.chmod(0o755)
    for f in plan.files:
        if f.path.endswith(".service"):
            proc = subprocess.run(
                [SYSTEMD_ANALYZE, "verify", f"--root={root}", f.path],
                capture_output=True, text=True, timeout=60,
            )
            results.append((f.path, proc))
    return results


def _assert_clean(results):
    assert results, "no unit was verified"
    for path, proc in results:
        # unknown keys and bad values are only warnings (exit 0): any output is a failure
        assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), f"{path}:\n{proc.stderr}{proc.stdout}"


@pytest.mark.parametrize("name", ["cluster", "a6000", "h200-1gpu", "provided-env"])
def test_every_rendered_unit_verifies(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plans = plan_cluster(load(f"inventories/{name}.py"))
    units = 0
    for host, plan in plans.items():
        results = verify_host_units(plan, tmp_path / host)
        units += len(results)
        if results:
            _assert_clean(results)
    assert units >= 2


def test_units_with_secrets_sim_engine_and_no_numa_verify(base, tmp_path):
    cluster, hosts = base
    cluster.update(engine="sim", secrets={"hf_token": "x", "router_api_key": "y"})
    hosts["gpu01"]["pdkit_router"].pop("auth")  # the base runs without a key (auth: none); this one has one
    hosts["gpu01"]["pdkit_node"]["gpu"] = "none"
    plans = plan_cluster(load(write_inventory(tmp_path, hosts, cluster)))
    _assert_clean(verify_host_units(plans["gpu01"], tmp_path / "root"))


def test_verify_catches_a_broken_unit(base, tmp_path):
    """The check itself must be able to fail: a misspelt directive is reported."""
    cluster, hosts = base
    plan = plan_cluster(load(write_inventory(tmp_path, hosts, cluster)))["gpu01"]
    verify_host_units(plan, tmp_path / "root")  # lays the units out under root
    unit = tmp_path / "root" / "etc/systemd/system/pdkit-engine-decode.service"
    unit.write_text(unit.read_text().replace("NUMAPolicy=bind", "NUMAPolicy=bogus"))
    proc = subprocess.run([SYSTEMD_ANALYZE, "verify", f"--root={tmp_path / 'root'}", "/etc/systemd/system/pdkit-engine-decode.service"], capture_output=True, text=True, timeout=60)
    assert "NUMA policy" in proc.stderr
    with pytest.raises(AssertionError):
        _assert_clean([("decode", proc)])
