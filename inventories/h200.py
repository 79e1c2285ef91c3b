"""The GPU tier: one lent 2x H200 (NVLink) machine serving real SGLang 0.5.17 in PD mode.

Prefill on GPU 0, decode on GPU 1, KV over NIXL/UCX (cuda_ipc between the two GPUs), the
router (sglang-router 0.3.2, which pdkit pairs with 0.5.17) on the same host, everything on
127.0.0.1. The model is the small Llama-architecture directory that gpu/make_model.py writes
(config.json + a locally trained tokenizer) with random weights (`load_format: dummy`).

The device image lacks FlashAttention 3 (trimmed from the carried sglang-kernel), hence the
triton attention backend and the pytorch sampler. docs/gpu.md has the measured figures;
gpu/run_gpu_tier.py renders this inventory and runs exactly its ExecStart lines there.

    pdkit validate inventories/h200.py
    python gpu/run_gpu_tier.py --dry

The GPU card (model, memory, compute capability) is the one this machine has when it has one:
`PDKIT_GPU_CARD`, else nvidia-smi, else the H200 written below (gpu/card.py; docs/gpu.md, "Whichever
card the lent machine has"). An `nvidia-h200` call served by an H100 80GB needs no edit here.

`PDKIT_GPU_WEIGHTS=safetensors`: the engines load real-format weights (random, seeded, bf16 shards
that gpu/make_weights.py writes into the model directory) through SGLang's normal loader instead
of inventing them with `--load-format dummy` (docs/gpu.md, "Real-format weights").
"""

import importlib.util
import os
from pathlib import Path


def _card_module():
    """gpu/card.py (standard library), loaded by path: inventories are not a package."""
    spec = importlib.util.spec_from_file_location("pdkit_gpu_card", Path(__file__).resolve().parents[1] / "gpu" / "card.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CARD = _card_module()

# where gpu/run_gpu_tier.py places the generated model directory on the GPU machine
MODEL_DIR = "/models/pdkit-llama-0.9b"

_CLUSTER = {
    "name": "h200",
    "engine": "sglang",
    # the newest release whose pins accept the device image's torch 2.11
    "sglang_version": "0.5.17",
    # dummy: random weights made in GPU memory, no file read; safetensors: gpu/make_weights.py's shards
    "model": {"path": MODEL_DIR, "load_format": os.environ.get("PDKIT_GPU_WEIGHTS", "dummy")},
    "transfer_backend": "nixl",
    # the seeds benchmark at C=16 and C=64: decode CUDA graphs must cover 64
    "target_concurrency": 64,
    # first start ~106 s (kernel JIT + graph capture), warm ~60 s: generous but bounded
    "ready_timeout_s": 420,
    "tuning": {
        "all": {
            "attention_backend": "triton",
            "sampling_backend": "pytorch",
            # a 1.8 GB model on a 141 GiB GPU: the rest is KV cache, leave headroom for graphs
            "mem_fraction_static": 0.85,
            "context_length": 4096,
        },
        "decode": {
            "cuda_graph": True,
            "cuda_graph_max_bs": 64,
        },
    },
}

# the card declared where this machine shows none (and with PDKIT_GPU_CARD=declared)
H200 = {"model": "NVIDIA H200", "memory_gib": 141, "compute_capability": "9.0"}
_H200_X2 = CARD.machine_gpus({**H200, "count": 2})

gpu_nodes = [
    (
        "h200",
        {
            "ssh_hostname": "127.0.0.1",
            "pdkit_node": {
                "gpus": _H200_X2,
                "address": "127.0.0.1",
                # NVLink between the two GPUs: NCCL's own choice, nothing to force
                "nccl_profile": "nvlink",
                "engines": [
                    {"name": "prefill", "role": "prefill", "gpus": [0], "port": 30000, "bootstrap_port": 8998},
                    {"name": "decode", "role": "decode", "gpus": [1], "port": 30001},
                ],
            },
            "pdkit_router": {
                "address": "127.0.0.1",
                "port": 8000,
                "prometheus_port": 29000,
                # the lent machine's loopback only, no key: said, not left to an unset variable
                "auth": "none",
                # sglang-router 0.3.2 refuses to start with the kit's default decode policy and one
                # decode worker: "Power-of-two policy for decode requires at least 2 decode workers"
                "decode_policy": "round_robin",
            },
        },
    ),
]

# pyinfra's `all` group: cluster-wide settings every host resolves identically.
all = (["h200"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
