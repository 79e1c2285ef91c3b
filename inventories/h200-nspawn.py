"""The one-H200 PD pair (inventories/h200-1gpu.py) on a systemd host inside the lent machine.

The lent machine has no systemd and no sshd; `gpu/nspawn/host.py up` boots a Debian trixie
container there with systemd as PID 1, the GPU, the driver's libraries and the machine's own
Python with torch bound in, and sshd on 127.0.0.1:2222 (the container shares the machine's
network). This inventory reaches it over real SSH with the launcher's key and known_hosts
(strict host-key checking); everything runs on that one host: both engines sharing GPU 0
(prefill 0.40 / decode 0.45), the router and Prometheus. docs/gpu.md ("A systemd host on the
lent machine") has the device calls.

    PDKIT_OFFLINE=1 /root/pdkit-venv/bin/pyinfra -y inventories/h200-nspawn.py deploy/pd.py

Without a running container it still validates (the launcher's fixed address, port and paths).
Where the machine's state lives (host.json, known_hosts, the client key) is
gpu/nspawn/machine_state.py's rule, the one host.py writes by: `$PDKIT_NSPAWN_DIR/pdkit-h200/`.
inventories/nspawn-rehearsal.py is the same host on a machine without a GPU (the sim engine);
gpu/nspawn/device_one.sh runs the whole one-node sequence (deploy, roll with downtime, tune).
"""

import copy
import importlib.util
import runpy
import sys
from pathlib import Path

from pdkit.lab.model import LabHost, pyinfra_host_data

NAME = "pdkit-h200"
# what `host.py up` gives a host sharing the lent machine's network: sshd on 127.0.0.1:2222
SSH_ADDRESS, SSH_PORT = "127.0.0.1", 2222


def _machine_state():
    """gpu/nspawn/machine_state.py: where host.py keeps each machine's state."""
    name = "pdkit_nspawn_machine_state"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "gpu" / "nspawn" / "machine_state.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


MS = _machine_state()
# the provided engine environment host.py assembles inside the container: the image's python3.12
# with the carried SGLang payload first on its path
ENGINE_VENV = "/opt/engine-venv"


def ssh_data(name: str = NAME, address: str = SSH_ADDRESS, port: int = SSH_PORT) -> dict:
    """pyinfra's SSH settings for machine NAME, from what `host.py --machine NAME up` wrote."""
    ssh = MS.ssh_settings(name, address, port)
    host = LabHost(name=name, address=ssh["ssh_hostname"], role="gpu", ssh_port=ssh["ssh_port"])
    return pyinfra_host_data(host, ssh["ssh_key"], ssh["ssh_known_hosts_file"])


_BASE = runpy.run_path(str(Path(__file__).with_name("h200-1gpu.py")))
MODEL_DIR = _BASE["MODEL_DIR"]

_CLUSTER = copy.deepcopy(_BASE["_CLUSTER"])
_CLUSTER["name"] = "h200-nspawn"
# the engines run seeded random weights (gpu/make_weights.py): their top logits sit close together, and a roll
# that changes the decode's CUDA graphs flipped greedy argmaxes at 0.637 token for token (docs/gpu.md, "Fifth
# session of 2026-12-07"); the exact part of the answer gate is kept, at a bar random weights can meet, while
# the forced scores at the users' lengths carry the real check
_CLUSTER["answers"] = {"min_match_rate": 0.5}

_data = copy.deepcopy(_BASE["gpu_nodes"][0][1])
_data.update(ssh_data())
_node = _data["pdkit_node"]
# DCGM comes from NVIDIA's apt repository, which the container cannot reach
_node["dcgm_exporter"] = False
# the provided engine environment gpu/nspawn/host.py assembles (pdkit_node.engine_venv)
_node["engine_venv"] = ENGINE_VENV
# the driver, CUDA and NCCL come from the lent machine (bound in): nothing NVIDIA to install
_node["nvidia_stack"] = "provided"
# Prometheus on the same host (the container has it preinstalled: no package source there);
# Grafana's apt repository cannot be reached either
_data["pdkit_monitoring"] = {"grafana": False}

gpu_nodes = [(NAME, _data)]

all = ([NAME], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
