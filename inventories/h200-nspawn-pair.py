"""Two systemd hosts sharing the one lent H200: a cluster that `pdkit roll` and `pdkit tune` can roll.

On one node the roll's drain gate refuses every step: taking the only node out of the router
would leave no worker (docs/gpu.md, 2026-12-01). Here `gpu/nspawn/host.py up --address` boots two
Debian containers on the lent machine, each with systemd as PID 1, its own network namespace
and address on a bridge (pdkit-a 10.214.0.2, pdkit-b 10.214.0.3; the machine is 10.214.0.1),
sshd on port 22 of that address, and the GPU bound in. Each runs a prefill and a decode of real
SGLang 0.5.17; the router (smg's sglang-router 0.3.2) and Prometheus run on pdkit-a, which pairs
any prefill with any decode, so KV crosses between the containers.

GPU memory: the four engines share GPU 0. SGLang sizes each engine's static pool against the
memory free when it starts, so the two hosts must not start their engines at the same time: the
first converge runs with `--serial` (pdkit-a's engines are up before pdkit-b's start), and a roll
restarts one node at a time anyway. Each host's own pair is ordered and shared as in
inventories/h200-1gpu.py (gpu_share 0.20 / 0.22 of the memory free at their start).

KV transfer across the containers: UCX's system id is the kernel's boot id, the same in both
containers, so UCX considers CUDA IPC reachable between them although they are separate PID and
IPC namespaces. `host.py xfer-probe` moves GPU memory each way with NIXL per UCX_TLS candidate
and writes the first that works to $PDKIT_NSPAWN_DIR/ucx_tls.json; the engines get that UCX_TLS
(without a probe: TCP with CUDA copies, which works wherever the hosts reach each other).

    python3 gpu/nspawn/host.py --machine pdkit-a up --address 10.214.0.2/24 --engine-payload gpu-payload
    python3 gpu/nspawn/host.py --machine pdkit-b up --address 10.214.0.3/24 --engine-payload gpu-payload
    python3 gpu/nspawn/host.py --machine pdkit-a xfer-probe --peer pdkit-b
    PDKIT_OFFLINE=1 /root/pdkit-venv/bin/pyinfra -y --serial inventories/h200-nspawn-pair.py deploy/pd.py

gpu/nspawn/device_pair.sh runs the whole sequence on the device.
"""

import copy
import json
import os
import runpy
from pathlib import Path

_BASE = runpy.run_path(str(Path(__file__).with_name("h200-nspawn.py")))
# gpu/nspawn/machine_state.py, through the one-host inventory: <PDKIT_NSPAWN_DIR>/<machine>/host.json
# per machine, <PDKIT_NSPAWN_DIR>/ucx_tls.json (the rule host.py writes by)
MS = _BASE["MS"]
# the machines and the addresses `host.py up --address` gives them
ADDRESSES = {"pdkit-a": "10.214.0.2", "pdkit-b": "10.214.0.3"}
# the containers' end of nspawn's veth: what UCX's TCP transport uses across them
UCX_NET_DEVICE = "host0"
# without a probe: TCP with CUDA copies staged through host memory (no CUDA IPC across namespaces)
DEFAULT_UCX_TLS = "tcp,cuda_copy,self"
# the part of GPU 0 each host's engines count on finding free when they start (docs/gpu.md, "Engines
# sharing a GPU wait for their memory"): 1 - 0.42 held by the other host's pair, less its engines' contexts
GPU_FREE_BASE = "0.5"


def ucx_tls() -> str:
    """The UCX_TLS `host.py xfer-probe` found to move GPU memory both ways (or the default)."""
    try:
        chosen = json.loads(MS.ucx_tls_file().read_text()).get("chosen")
    except (OSError, ValueError):
        chosen = None
    return os.environ.get("PDKIT_NSPAWN_UCX_TLS") or chosen or DEFAULT_UCX_TLS


def ssh_data(name: str) -> dict:
    """host.py up --address gives each machine sshd on port 22 of its own address."""
    return _BASE["ssh_data"](name, ADDRESSES[name], 22)


MODEL_DIR = _BASE["MODEL_DIR"]

_CLUSTER = copy.deepcopy(_BASE["_CLUSTER"])
_CLUSTER["name"] = "h200-nspawn-pair"


def node_data(name: str, router: bool) -> dict:
    data = copy.deepcopy(_BASE["gpu_nodes"][0][1])
    for key in ("ssh_hostname", "ssh_port", "ssh_user", "ssh_key", "ssh_known_hosts_file", "ssh_strict_host_key_checking"):
        data.pop(key, None)
    data.update(ssh_data(name))
    node = data["pdkit_node"]
    node["address"] = ADDRESSES[name]
    # the router pairs prefill and decode across the two hosts: KV goes over host0
    node["ucx_net_devices"] = UCX_NET_DEVICE
    prefill, decode = node["engines"]
    prefill["gpu_share"], decode["gpu_share"] = 0.20, 0.22  # four engines on one GPU (two per host)
    for engine in (prefill, decode):
        engine["env"] = {**engine.get("env", {}), "UCX_TLS": ucx_tls(),
                         # the units' wait for free GPU memory (pdkit.agent.gpumem) counts this host's engines on half
                         # the GPU: the other host's pair holds 0.42 of it and ~2.3 GiB per engine beyond that
                         "PDKIT_GPU_FREE_BASE": GPU_FREE_BASE}
    if router:
        data["pdkit_router"]["address"] = ADDRESSES[name]
    else:
        data.pop("pdkit_router", None)
        data.pop("pdkit_monitoring", None)
    return data


gpu_nodes = [("pdkit-a", node_data("pdkit-a", router=True)), ("pdkit-b", node_data("pdkit-b", router=False))]

all = ([name for name, _ in gpu_nodes], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
