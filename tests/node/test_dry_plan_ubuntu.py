"""`pyinfra INV deploy/node.py --dry --json` for a fresh Ubuntu 24.04 Blackwell node, through the real CLI.

The host is pyinfra 3.10's `@fake` connector: the facts' commands get the answers a fresh
8x RTX PRO 6000 node gives before any NVIDIA software is installed (os-release, uname, the GPUs
on the PCI bus with their NUMA nodes from sysfs; no nvidia-smi, no keyring, no packages), every
other command succeeds with no output. The plan must show exactly the repository, key, pins and
packages, in order, and the preflight must pass (a fresh node only warns that the driver is missing).
"""

from __future__ import annotations

import json
import pprint
import subprocess
import sys
from pathlib import Path

from roles.node_facts import MODEL_DIRS_MARK, NODE_FACTS, NODE_FACTS_MARK
from tests.conftest import REPO
from tests.node.runner import CLUSTER, NODE

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
FACTS = Path(__file__).parent / "facts"


def _output(fact: str, case: str) -> list[str]:
    return json.loads((FACTS / fact / f"{case}.json").read_text())["output"]


def test_fresh_ubuntu2404_blackwell_node_plan(tmp_path):
    # what each preflight fact's command prints on that node (the rest print nothing) ...
    printed = {
        "os": ["ID=ubuntu", 'VERSION_ID="24.04"', "VERSION_CODENAME=noble", 'PRETTY_NAME="Ubuntu 24.04.3 LTS"'],
        "arch": ["x86_64"],
        "kernel": ["6.8.0-51-generic"],
        "pci_gpus": _output("PciNvidiaGpus", "rtx-pro-6000-8x"),
        "numa_cpus": _output("NumaCpus", "rtx-pro-6000-two-sockets"),
        "nics": _output("NetworkInterfaces", "rtx-pro-6000-with-rdma"),
    }
    # ... and so what the preflight's one bundled command prints (its first marker picks it out)
    bundled = [line for name in NODE_FACTS for line in (NODE_FACTS_MARK + name, *printed.get(name, []))]
    # ... and the model check's part: the engines' one directory, a complete checkpoint the service user can read
    fine = {"exists": True, "is_dir": True, "config": True, "indexes": ["model.safetensors.index.json"], "weights": [],
            "safetensors": 2, "missing_shards": [], "missing_count": 0, "unreadable": []}
    bundled += [NODE_FACTS_MARK + "model_dirs", MODEL_DIRS_MARK + json.dumps({"user": "pdkit", "user_exists": False, "how": "mode bits", "paths": {"/models/m": fine}})]
    responses = {NODE_FACTS_MARK + next(iter(NODE_FACTS)): bundled}
    data = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0, "pdkit_node": NODE, "pdkit_router": {}}
    inventory = tmp_path / "fresh_ubuntu.py"
    inventory.write_text(f"gpu_nodes = {pprint.pformat([('@fake/gpu01', data)])}\nall = (['@fake/gpu01'], {pprint.pformat({'pdkit_cluster': CLUSTER})})\n")
    proc = subprocess.run([PYINFRA, str(inventory), "deploy/node.py", "--dry", "--json"], cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = [(op["name"], "always" if op["hosts_with_change"] else "if" if op["hosts_with_conditional_change"] else "no") for op in json.loads(proc.stdout)["plan"]]
    repo = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
    layer = "pdkit node layer | pdkit NVIDIA driver | "
    assert plan == [
        (f"{layer}pdkit NVIDIA apt repository | Directory /var/cache/pdkit-node", "always"),
        (f"{layer}pdkit NVIDIA apt repository | cuda-keyring from {repo}cuda-keyring_1.1-1_all.deb", "always"),
        (f"{layer}pdkit NVIDIA apt repository | Install cuda-keyring (/usr/share/keyrings/cuda-archive-keyring.gpg)", "always"),
        (f"{layer}pdkit NVIDIA apt repository | No duplicate NVIDIA source /etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list", "no"),
        (f"{layer}pdkit NVIDIA apt repository | NVIDIA apt source /etc/apt/sources.list.d/pdkit-nvidia-cuda.sources ({repo}, Signed-By /usr/share/keyrings/cuda-archive-keyring.gpg)", "always"),
        (f"{layer}pdkit NVIDIA apt repository | apt update (the NVIDIA source changed)", "if"),
        (f"{layer}Keep the NVIDIA stack out of unattended upgrades (/etc/apt/apt.conf.d/51pdkit-nvidia-no-unattended-upgrades)", "always"),
        (f"{layer}Lock the driver to branch 580 (nvidia-driver-pinning-580)", "always"),
        (f"{layer}NVIDIA driver R580 (nvidia-dkms): linux-headers-6.8.0-51-generic, nvidia-open", "always"),
        (f"{layer}Directory /var/lib/pdkit-node", "always"),
        (f"{layer}Mark reboot required (/var/lib/pdkit-node/reboot-required) when the driver changed", "if"),
        (f"{layer}Enable nvidia-persistenced.service", "always"),
        (f"{layer}Start nvidia-persistenced.service", "if"),
        ("pdkit node layer | pdkit CUDA toolkit | CUDA toolkit: cuda-toolkit-13-0", "always"),
        ("pdkit node layer | pdkit NCCL | Hold NCCL at its pinned version (/etc/apt/preferences.d/pdkit-nccl)", "always"),
        ("pdkit node layer | pdkit NCCL | NCCL: libnccl2=2.28.9-1+cuda13.0, libnccl-dev=2.28.9-1+cuda13.0", "always"),
    ]
    # warnings only: the driver is not installed yet, and the node has RDMA devices while the pcie profile disables IB
    assert "pdkit preflight @fake/gpu01: passed (2 warning(s))" in proc.stderr
    assert "no NVIDIA driver yet" in proc.stderr
