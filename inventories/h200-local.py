"""The lent H200 machine, checked from itself: `pyinfra inventories/h200-local.py deploy/preflight.py`.

One `@local` host describing what the capture in docs/tuning.md shows (2x NVIDIA H200, 141 GiB,
compute capability 9.0, NVLink NV18 between them, driver 580 open module, Ubuntu 24.04, a KVM
guest with one NUMA node). A TP2 unified engine spans both GPUs, so the preflight checks the
NVLink between them against the `nvlink` NCCL profile. On a one-GPU machine run it with
PDKIT_H200_GPUS=1 (one engine on GPU 0). Only the preflight is meant to run from here: it
changes nothing. The card is the machine's own (an H100 80GB where one serves the call), as in
inventories/h200.py (gpu/card.py).
"""

import os
import runpy
from pathlib import Path

_COUNT = int(os.environ.get("PDKIT_H200_GPUS", "2"))
_H200 = runpy.run_path(str(Path(__file__).with_name("h200.py")))
_GPUS = _H200["CARD"].machine_gpus({**_H200["H200"], "count": _COUNT, "numa": [0] * _COUNT})

hosts = [
    (
        "@local",
        {
            "pdkit_node": {
                "gpus": _GPUS,
                "address": "127.0.0.1",
                "nccl_profile": "nvlink" if _COUNT > 1 else "default",
                "engines": [{"name": "unified", "role": "unified", "gpus": list(range(_COUNT)), "port": 30000}],
            },
            "pdkit_router": {"address": "127.0.0.1", "port": 8000, "prometheus_port": 29000, "auth": "none"},
        },
    ),
]

all = (  # noqa: A001 - pyinfra's group name
    ["@local"],
    {
        "pdkit_cluster": {
            "name": "h200-local",
            "engine": "sglang",
            "sglang_version": "0.5.23",
            "model": {"path": "/models/pdkit-llama-0.9b", "load_format": "dummy"},
        }
    },
)
