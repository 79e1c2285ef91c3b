"""2x RTX A6000 serving a 27B model at TP2 without PD, with NEXTN (MTP) speculative decoding.

The seeds' second setup: 3 draft steps, topk 1, 4 draft tokens, max 16 running requests.

    pdkit validate inventories/a6000.py
"""

_CLUSTER = {
    "name": "a6000",
    "engine": "sglang",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/Qwen3.6-27B", "served_name": "qwen3.6-27b"},
    "target_concurrency": 16,
    "tuning": {
        "all": {
            "mem_fraction_static": 0.88,
            "max_running_requests": 16,
            # 'MTP' is not an SGLang algorithm name: multi-token prediction is NEXTN
            "speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
        },
    },
}

gpu_nodes = [
    (
        "ct129",
        {
            "ssh_hostname": "10.0.0.129",
            "ssh_user": "ubuntu",
            "_sudo": True,
            "pdkit_node": {
                "gpus": {"model": "NVIDIA RTX A6000", "count": 2, "memory_gib": 48, "compute_capability": "8.6", "numa": [0, 0]},
                "nccl_profile": "pcie",
                "engines": [{"name": "main", "role": "unified", "gpus": [0, 1], "port": 30000}],
            },
            "pdkit_router": {"port": 8000, "auth": "none"},
            "pdkit_monitoring": {},
        },
    ),
]

all = (["ct129"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
