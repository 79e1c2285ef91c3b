"""The seeds' PD layout on a lent 8x H200 (NVLink/NVSwitch): prefill TP4 on GPUs 0-3, decode TP4 on 4-7.

Same model, engine pin, tuning and router as inventories/h200.py (the 2-GPU GPU tier), for the
run that needs `nvidia-h200-x8`, a kind not lent when this was written: it is validated only
(`pdkit validate inventories/h200x8.py`); gpu/run_gpu_tier.py renders inventories/h200.py.

    pdkit validate inventories/h200x8.py
"""

MODEL_DIR = "/models/pdkit-llama-0.9b"

_CLUSTER = {
    "name": "h200x8",
    "engine": "sglang",
    "sglang_version": "0.5.17",
    "model": {"path": MODEL_DIR, "load_format": "dummy"},
    "transfer_backend": "nixl",
    "target_concurrency": 64,
    "ready_timeout_s": 600,
    "tuning": {
        "all": {
            "attention_backend": "triton",
            "sampling_backend": "pytorch",
            "mem_fraction_static": 0.85,
            "context_length": 4096,
        },
        "decode": {
            "cuda_graph": True,
            "cuda_graph_max_bs": 64,
        },
    },
}

gpu_nodes = [
    (
        "h200x8",
        {
            "ssh_hostname": "127.0.0.1",
            "pdkit_node": {
                "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0"},
                "address": "127.0.0.1",
                "nccl_profile": "nvlink",
                "engines": [
                    {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
                    {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
                ],
            },
            "pdkit_router": {
                "address": "127.0.0.1",
                "port": 8000,
                "prometheus_port": 29000,
                # sglang-router 0.3.2 refuses to start with the kit's default decode policy and one
                # decode worker: "Power-of-two policy for decode requires at least 2 decode workers"
                "decode_policy": "round_robin",
            },
        },
    ),
]

all = (["h200x8"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
