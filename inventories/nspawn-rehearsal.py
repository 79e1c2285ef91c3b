"""The container host of inventories/h200-nspawn.py, rehearsed on a machine without a GPU.

Same host, same address and key (gpu/nspawn/host.py's state directory), same engines, router
and Prometheus, but `gpu: none` with a virtual H200 and `engine: sim` (pdkit.sim takes SGLang's
exact command line), as the lab does. docs/gpu.md ("A systemd host on the lent machine"):

    python3 gpu/nspawn/host.py up --no-gpu --netns pdkn-h200 ...
    nsenter --net=/run/netns/pdkn-h200 env PDKIT_OFFLINE=1 pyinfra -y inventories/nspawn-rehearsal.py deploy/pd.py

The whole one-node sequence of the device (deploy, doctor, bench, rolls with --allow-downtime under
load, a broken change, rollback, the campaign) on this host, under the lab's lock:

    flock /tmp/pdkit-lab.lock env PDKIT_NSPAWN_REHEARSAL=1 PDKIT_CONTROL_VENV=.venv \
        bash gpu/nspawn/device_one.sh up converge check roll tune down
"""

import copy
import runpy
from pathlib import Path

_NSPAWN = runpy.run_path(str(Path(__file__).with_name("h200-nspawn.py")))
NAME = _NSPAWN["NAME"]

_CLUSTER = copy.deepcopy(_NSPAWN["_CLUSTER"])
_CLUSTER.update(name="nspawn-rehearsal", engine="sim", ready_timeout_s=120)

_data = copy.deepcopy(_NSPAWN["gpu_nodes"][0][1])
_node = _data["pdkit_node"]
_node["gpu"] = "none"  # a virtual layout: nothing NVIDIA is installed or checked
_node.pop("engine_venv", None)  # the sim runs from the node venv
_node.pop("nvidia_stack", None)  # gpu: none installs no NVIDIA stack (pdkit.spec.IGNORED_BY_MODE)

gpu_nodes = [(NAME, _data)]

all = ([NAME], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
