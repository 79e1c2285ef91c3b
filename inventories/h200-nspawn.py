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
"""

import copy
import json
import os
import runpy
from pathlib import Path

from pdkit.lab.model import LabHost, pyinfra_host_data

NAME = "pdkit-h200"
# gpu/nspawn/host.py's state directory and what `up` writes there
STATE = Path(os.environ.get("PDKIT_NSPAWN_DIR", "/var/lib/pdkit-nspawn"))
# the provided engine environment host.py assembles inside the container: the image's python3.12
# with the carried SGLang payload first on its path
ENGINE_VENV = "/opt/engine-venv"


def ssh_data():
    try:
        up = json.loads((STATE / "host.json").read_text())
    except (OSError, ValueError):
        up = {}
    host = LabHost(name=NAME, address=up.get("ssh_hostname", "127.0.0.1"), role="gpu", ssh_port=up.get("ssh_port", 2222))
    return pyinfra_host_data(host, up.get("ssh_key", STATE / "id_ed25519"), up.get("ssh_known_hosts_file", STATE / "known_hosts"))


_BASE = runpy.run_path(str(Path(__file__).with_name("h200-1gpu.py")))
MODEL_DIR = _BASE["MODEL_DIR"]

_CLUSTER = copy.deepcopy(_BASE["_CLUSTER"])
_CLUSTER["name"] = "h200-nspawn"

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
