"""The seeds' PD layout on a lent 8x H200 (NVLink/NVSwitch): prefill TP4 on GPUs 0-3, decode TP4 on 4-7.

inventories/h200.py (the 2-GPU GPU tier: model, engine pin, tuning, router) with eight GPUs and
TP4 engines, for the run that needs `nvidia-h200-x8`, a kind not lent when this was written:
it is validated (`pdkit validate inventories/h200x8.py`) and its argv passes SGLang's own
parsers (tests/test_contract_generated.py); gpu/run_gpu_tier.py renders inventories/h200.py.

    pdkit validate inventories/h200x8.py
"""

import copy
import runpy
from pathlib import Path

_H200 = runpy.run_path(str(Path(__file__).with_name("h200.py")))
MODEL_DIR = _H200["MODEL_DIR"]

# TP4 engines load and capture graphs across four GPUs: more time than the 2-GPU tier's 420 s
_CLUSTER = {**copy.deepcopy(_H200["_CLUSTER"]), "name": "h200x8", "ready_timeout_s": 600}

_data = copy.deepcopy(_H200["gpu_nodes"][0][1])
_node = _data["pdkit_node"]
_node["gpus"] = {**_node["gpus"], "count": 8}
_node["engines"][0]["gpus"] = [0, 1, 2, 3]  # prefill
_node["engines"][1]["gpus"] = [4, 5, 6, 7]  # decode

gpu_nodes = [("h200x8", _data)]

all = (["h200x8"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
