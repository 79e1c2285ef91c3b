"""The node layer against a real lab host (Debian 12 = NVIDIA's debian12 repository), over SSH.

What a lab host can and cannot prove (docs/tuning.md): it has no GPU and cannot reach NVIDIA's
repository, so
- declared `gpu: nvidia`, the `--dry` plan shows exactly the repository, pins and packages the
  node would get, and a real apply stops at the preflight before anything on the host changes;
- declared `gpu: none`, the preflight passes and says the GPU checks were skipped;
- the files of the node roles that need no repository (deb822 source, unattended-upgrades
  blacklist, NCCL apt preferences) are really applied, read back by apt itself, and a second
  run changes nothing.
The keyring download, the package installs, persistenced and the reboot marker are plan-tested
only (here and in tests/node/operations/).
"""

from __future__ import annotations

import hashlib
import json
import pprint
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.lab.lifecycle import ssh_run
from pdkit.render.node import NCCL_PIN_PATH, SOURCES_PATH, UNATTENDED_PATH, nccl_pin_text, sources_text, unattended_text
from tests.conftest import REPO

pytestmark = pytest.mark.lab

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
NODE_FILES = {SOURCES_PATH: sources_text("debian12", "x86_64"), UNATTENDED_PATH: unattended_text(), NCCL_PIN_PATH: nccl_pin_text()}


def run(inventory: Path, deploy: str, *extra: str, timeout: int = 600) -> tuple[int, dict, str]:
    # -y turns pyinfra's change detection off: a --dry plan runs without it to say what would change
    yes = [] if "--dry" in extra else ["-y"]
    proc = subprocess.run([PYINFRA, str(inventory), deploy, *yes, "--json", *extra], cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        out = {}
    return proc.returncode, out, proc.stderr


def write_inventory(directory: Path, lab, gpu: str) -> Path:
    """The lab's first GPU host alone, declared `gpu: <gpu>` with the seed node's 8-GPU layout."""
    host = lab.gpu_hosts[0]
    data = {
        **lab.pyinfra_data(host),
        "ssh_strict_host_key_checking": "yes",
        "pdkit_node": {
            "gpu": gpu,
            "gpus": {"model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "count": 8, "memory_gib": 96, "compute_capability": "12.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
            "nccl_profile": "pcie",
            "engines": [
                {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000},
                {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
            ],
        },
        "pdkit_router": {},
    }
    cluster = {"name": "labnode", "engine": "sim", "sglang_version": "0.5.23", "model": {"path": "/opt/pdkit/models/sim-llama", "served_name": "sim-llama"}}
    path = directory / f"node_{gpu}.py"
    path.write_text(f"gpu_nodes = {pprint.pformat([(host.name, data)])}\nall = ({[host.name]!r}, {pprint.pformat({'pdkit_cluster': cluster})})\n")
    return path


def ssh(lab, command: str) -> subprocess.CompletedProcess:
    return ssh_run(lab, lab.gpu_hosts[0], command, timeout=120)


@pytest.fixture
def clean_node_files(lab):
    """Leave the host's apt as it was: the source without NVIDIA's key would break `apt-get update`."""
    paths = " ".join(NODE_FILES)
    ssh(lab, f"rm -f {paths}")
    yield
    ssh(lab, f"rm -f {paths}")


def test_dry_plan_of_a_debian12_blackwell_node_is_exact(lab, tmp_path):
    inventory = write_inventory(tmp_path, lab, "nvidia")
    kernel = ssh(lab, "uname -r").stdout.strip()
    rc, out, err = run(inventory, "deploy/node.py", "--dry")
    assert rc == 0, err[-3000:]
    name = lab.gpu_hosts[0].name
    plan = [(op["name"], "always" if name in op["hosts_with_change"] else "if" if name in op["hosts_with_conditional_change"] else "no") for op in out["plan"]]
    repo = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    assert plan == [
        ("pdkit preflight | Preflight failed: 1 error(s) (report above); stop before any change", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | pdkit NVIDIA apt repository | Directory /var/cache/pdkit-node", "always"),
        (f"pdkit node layer | pdkit NVIDIA driver | pdkit NVIDIA apt repository | cuda-keyring from {repo}cuda-keyring_1.1-1_all.deb", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | pdkit NVIDIA apt repository | Install cuda-keyring (/usr/share/keyrings/cuda-archive-keyring.gpg)", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | pdkit NVIDIA apt repository | No duplicate NVIDIA source /etc/apt/sources.list.d/cuda-debian12-x86_64.list", "no"),
        (f"pdkit node layer | pdkit NVIDIA driver | pdkit NVIDIA apt repository | NVIDIA apt source /etc/apt/sources.list.d/pdkit-nvidia-cuda.sources ({repo}, Signed-By /usr/share/keyrings/cuda-archive-keyring.gpg)", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | pdkit NVIDIA apt repository | apt update (the NVIDIA source changed)", "if"),
        ("pdkit node layer | pdkit NVIDIA driver | Keep the NVIDIA stack out of unattended upgrades (/etc/apt/apt.conf.d/51pdkit-nvidia-no-unattended-upgrades)", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | Lock the driver to branch 580 (nvidia-driver-pinning-580)", "always"),
        (f"pdkit node layer | pdkit NVIDIA driver | NVIDIA driver R580 (nvidia-dkms): linux-headers-{kernel}, nvidia-open", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | Directory /var/lib/pdkit-node", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | Mark reboot required (/var/lib/pdkit-node/reboot-required) when the driver changed", "if"),
        ("pdkit node layer | pdkit NVIDIA driver | Enable nvidia-persistenced.service", "always"),
        ("pdkit node layer | pdkit NVIDIA driver | Start nvidia-persistenced.service", "if"),
        ("pdkit node layer | pdkit CUDA toolkit | CUDA toolkit: cuda-toolkit-13-0", "always"),
        ("pdkit node layer | pdkit NCCL | Hold NCCL at its pinned version (/etc/apt/preferences.d/pdkit-nccl)", "always"),
        ("pdkit node layer | pdkit NCCL | NCCL: libnccl2=2.28.9-1+cuda13.0, libnccl-dev=2.28.9-1+cuda13.0", "always"),
    ]
    assert f"pdkit preflight {name}: FAILED: 1 error(s)" in err
    assert "gpu-count: the spec declares 8 x 'NVIDIA RTX PRO 6000 Blackwell Server Edition'" in err


def test_a_real_apply_on_a_host_without_gpus_stops_before_any_change(lab, tmp_path, clean_node_files):
    inventory = write_inventory(tmp_path, lab, "nvidia")
    rc, out, err = run(inventory, "deploy/node.py")
    assert rc != 0
    name = lab.gpu_hosts[0].name
    # the failed host is the only one, so pyinfra ends with "No hosts remaining" (and no --json results)
    assert f"pdkit preflight {name}: FAILED: 1 error(s)" in err
    assert "Starting operation: pdkit preflight | Preflight failed" in err and "No hosts remaining" in err, err[-2000:]
    assert "Starting operation: pdkit node layer" not in err
    left = ssh(lab, "ls /usr/share/keyrings/cuda-archive-keyring.gpg /var/cache/pdkit-node /var/lib/pdkit-node " + " ".join(NODE_FILES) + " 2>/dev/null; true").stdout
    assert left.strip() == "", f"the failed preflight left files behind: {left}"


def test_preflight_on_a_lab_host_skips_gpu_checks_and_says_so(lab, tmp_path):
    inventory = write_inventory(tmp_path, lab, "none")
    rc, out, err = run(inventory, "deploy/preflight.py")
    assert rc == 0, err[-3000:]
    name = lab.gpu_hosts[0].name
    assert f"pdkit preflight {name}: passed" in err
    assert "GPU checks skipped: the node declares gpu: none" in err


def test_node_files_apply_and_a_second_run_changes_nothing(lab, tmp_path, clean_node_files):
    inventory = write_inventory(tmp_path, lab, "none")
    rc, first, err = run(inventory, "tests/lab/node_files_deploy.py")
    assert rc == 0, err[-3000:]
    changed = sorted(op["name"] for op in first["results"]["operations"] if op["success"])
    assert len(changed) == 3, changed
    rc, second, err = run(inventory, "tests/lab/node_files_deploy.py")
    assert rc == 0, err[-3000:]
    assert [op["name"] for op in second["results"]["operations"] if op["success"]] == []
    # byte-exact, root-owned, 0644
    paths = " ".join(NODE_FILES)
    stat = ssh(lab, f"stat -c '%n %a %U %G' {paths} && sha256sum {paths}").stdout.splitlines()
    for line in stat[: len(NODE_FILES)]:
        assert line.split()[1:] == ["644", "root", "root"], line
    sums = {line.split()[1]: line.split()[0] for line in stat[len(NODE_FILES):]}
    assert sums == {p: hashlib.sha256(t.encode()).hexdigest() for p, t in NODE_FILES.items()}
    # apt itself reads them: the blacklist is in its configuration, the pin parses without a warning
    dump = ssh(lab, "apt-config dump Unattended-Upgrade::Package-Blacklist").stdout
    assert 'Unattended-Upgrade::Package-Blacklist:: "nvidia-";' in dump and 'Unattended-Upgrade::Package-Blacklist:: "libnccl";' in dump, dump
    policy = ssh(lab, "apt-cache policy libnccl2 2>&1; apt-get -s check 2>&1")
    assert not [line for line in policy.stdout.splitlines() if line.startswith(("E:", "W:"))], policy.stdout
