"""The DCGM exporter on GPU nodes: planned packages, the unit drop-in, the service and its scrape target.

NVIDIA's repository cannot be reached from the lab, so this is plan-tested (here and as a --dry
run in tests/lab/test_monitoring_lab.py); the drop-in is checked by `systemd-analyze verify`
over a stand-in for the packaged unit.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from pdkit.inventory.loader import load
from pdkit.monitoring.common import JOB_DCGM
from pdkit.monitoring.scrape import targets
from pdkit.render.plan import DCGM_DROPIN_PATH, DCGM_PACKAGES, DCGM_UNIT, plan_cluster
from pdkit.spec import DCGM_EXPORTER_PORT
from tests.conftest import write_inventory

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _plans(tmp_path, base, **node):
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"].update(node)
    return plan_cluster(load(write_inventory(tmp_path, hosts, cluster)))


def test_nvidia_nodes_get_dcgm_by_default(base, tmp_path):
    plans = _plans(tmp_path, base)
    gpu = plans["gpu01"]
    assert set(DCGM_PACKAGES) <= set(gpu.packages)
    service = next(s for s in gpu.services if s.unit == DCGM_UNIT)
    assert service.files == (DCGM_DROPIN_PATH,)
    assert service.health_url == f"http://10.9.0.1:{DCGM_EXPORTER_PORT}/metrics"
    dropin = gpu.file(DCGM_DROPIN_PATH)
    assert dropin.mode == "0644" and not dropin.secret
    # unprivileged, against the node's host engine, on the node's address only
    assert "User=pdkit" in dropin.content and "--remote-hostengine-info localhost:5555" in dropin.content
    assert f"--address 10.9.0.1:{DCGM_EXPORTER_PORT}" in dropin.content
    # the packaged ExecStart is reset before ours (a drop-in otherwise adds a second command)
    lines = dropin.content.splitlines()
    assert lines.index("ExecStart=") + 1 == next(i for i, l in enumerate(lines) if l.startswith("ExecStart=/usr/bin/dcgm-exporter"))
    # the monitoring host gets neither packages nor the unit
    assert not set(DCGM_PACKAGES) & set(plans["mon01"].packages)
    # and Prometheus scrapes exactly the nodes that run it
    dcgm_targets = [t.address for t in targets(load(write_inventory(tmp_path, base[1], base[0]))) if t.job == JOB_DCGM]
    assert dcgm_targets == [f"10.9.0.1:{DCGM_EXPORTER_PORT}", f"10.9.0.2:{DCGM_EXPORTER_PORT}"]


@pytest.mark.parametrize("node", [{"dcgm_exporter": False}, {"gpu": "none"}])
def test_dcgm_off_when_disabled_or_without_gpus(base, tmp_path, node):
    gpu = _plans(tmp_path, base, **node)["gpu01"]
    assert not set(DCGM_PACKAGES) & set(gpu.packages)
    assert DCGM_UNIT not in {s.unit for s in gpu.services}
    with pytest.raises(KeyError):
        gpu.file(DCGM_DROPIN_PATH)


# A stand-in for the unit datacenter-gpu-manager-exporter installs (same directives that matter:
# root, an append: log file, the packaged ExecStart), so the drop-in is verified as systemd merges it.
PACKAGED_UNIT = """[Unit]
Description=NVIDIA DCGM-exporter service (stand-in for the packaged unit)
Wants=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
User=root
StandardOutput=append:/var/dcgm-exporter.log
ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""


def test_dropin_verifies_over_the_packaged_unit(base, tmp_path):
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    gpu = _plans(tmp_path, base)["gpu01"]
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", dirs_exist_ok=True, symlinks=True)
    (root / "lib/systemd/system").mkdir(parents=True, exist_ok=True)
    (root / f"lib/systemd/system/{DCGM_UNIT}").write_text(PACKAGED_UNIT)
    (root / "lib/systemd/system/nvidia-dcgm.service").write_text("[Service]\nExecStart=/usr/bin/nv-hostengine -n\n")
    dropin = root / DCGM_DROPIN_PATH.lstrip("/")
    dropin.parent.mkdir(parents=True)
    dropin.write_text(gpu.file(DCGM_DROPIN_PATH).content)
    for binary in ("usr/bin/dcgm-exporter", "usr/bin/nv-hostengine"):
        (root / binary).parent.mkdir(parents=True, exist_ok=True)
        (root / binary).write_text("#!/bin/sh\n")
        (root / binary).chmod(0o755)

    def verify():
        return subprocess.run([SYSTEMD_ANALYZE, "verify", f"--root={root}", DCGM_UNIT], capture_output=True, text=True, timeout=60)

    proc = verify()
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
    # the check can fail: without the ExecStart= reset the merged unit has two commands
    dropin.write_text(dropin.read_text().replace("ExecStart=\n", "", 1))
    proc = verify()
    assert proc.returncode != 0 or "ExecStart" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
