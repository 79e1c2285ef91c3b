"""inventories/h200-nspawn-pair.py rehearsed on a machine without a GPU.

The same two container hosts (gpu/nspawn/host.py up --address ... --no-gpu), addresses, keys,
engines, router and Prometheus, but `gpu: none` with a virtual H200 and `engine: sim` (pdkit.sim
takes SGLang's exact command line), as the lab does. docs/gpu.md has the sequence:

    python3 gpu/nspawn/host.py --machine pdkit-a up --no-gpu --address 10.214.0.2/24
    python3 gpu/nspawn/host.py --machine pdkit-b up --no-gpu --address 10.214.0.3/24
    PDKIT_OFFLINE=1 pyinfra -y --serial inventories/nspawn-pair-rehearsal.py deploy/pd.py
"""

import copy
import runpy
from pathlib import Path

_PAIR = runpy.run_path(str(Path(__file__).with_name("h200-nspawn-pair.py")))

_CLUSTER = copy.deepcopy(_PAIR["_CLUSTER"])
_CLUSTER.update(name="nspawn-pair-rehearsal", engine="sim", ready_timeout_s=120)

gpu_nodes = copy.deepcopy(_PAIR["gpu_nodes"])
for _name, _data in gpu_nodes:
    _node = _data["pdkit_node"]
    _node["gpu"] = "none"  # a virtual layout: nothing NVIDIA is installed or checked
    _node.pop("engine_venv", None)  # the sim runs from the node venv
    _node.pop("nvidia_stack", None)  # gpu: none installs no NVIDIA stack (pdkit.spec.IGNORED_BY_MODE)

all = ([name for name, _ in gpu_nodes], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
