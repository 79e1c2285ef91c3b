"""The GPU tier on one lent H200: the PD pair of inventories/h200.py sharing GPU 0.

`nvidia-h200` (one GPU) is the kind most often lent. SGLang sizes an engine's static memory
pool against the memory free when it starts, so two engines started together on one GPU race
(one died with "no GPU memory for the KV cache" at 0.4 + 0.4) and their split changed from
restart to restart. Here each engine declares its share of the GPU (`gpu_share`); pdkit starts
the decode only once the prefill serves (`After=`, `PartOf=`, an ExecStartPre waiting for the
prefill's /health) and derives each one's --mem-fraction-static from its share and the shares of
the engines started before it, since SGLang counts the fraction against the memory free at its
start (pdkit.spec.shared_gpu_mem_fraction): prefill 0.40, decode 0.45 / (1 - 0.40) = 0.75.

    pdkit validate inventories/h200-1gpu.py
    python gpu/run_gpu_tier.py --single-gpu --dry
"""

import copy
import runpy
from pathlib import Path

_H200 = runpy.run_path(str(Path(__file__).with_name("h200.py")))
MODEL_DIR = _H200["MODEL_DIR"]

_CLUSTER = copy.deepcopy(_H200["_CLUSTER"])
_CLUSTER["name"] = "h200-1gpu"
# the shares decide each engine's fraction: a cluster-wide mem_fraction_static would contradict them
del _CLUSTER["tuning"]["all"]["mem_fraction_static"]

_data = copy.deepcopy(_H200["gpu_nodes"][0][1])
_node = _data["pdkit_node"]
_node["gpus"] = {**_node["gpus"], "count": 1}
_node["nccl_profile"] = "default"  # one GPU: no NCCL peer to tune for
_node["engines"][0].update(gpus=[0], gpu_share=0.40)  # prefill: weights + a short-lived KV pool
_node["engines"][1].update(gpus=[0], gpu_share=0.45)  # decode: weights + the KV cache it holds

gpu_nodes = [("h200-1gpu", _data)]

all = (["h200-1gpu"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
