"""The seeds' DeepSeek-V4-Flash node: 8x RTX PRO 6000 Blackwell (96 GB, sm_120, PCIe only).

Prefill TP4 on GPUs 0-3 (NUMA 0), decode TP4 on GPUs 4-7 (NUMA 1), KV over NIXL/UCX
(cuda_ipc across the NUMA halves), the router on the same node, one monitoring host.

    pdkit validate inventories/cluster.py
    pyinfra inventories/cluster.py deploy/pd.py
"""

_CLUSTER = {
    "name": "dsv4-flash",
    "engine": "sglang",
    "sglang_version": "0.5.23",
    "model": {
        "path": "/models/DeepSeek-V4-Flash",
        "served_name": "deepseek-v4-flash",
        "trust_remote_code": True,
    },
    "transfer_backend": "nixl",
    # the seeds benchmark at C=16 and C=64: decode CUDA graphs must cover 64
    "target_concurrency": 64,
    "tuning": {
        "all": {
            # the model's 1M default made the indexer scan 1M tokens a step
            "context_length": 8192,
            "mem_fraction_static": 0.88,
        },
        "decode": {
            "cuda_graph": True,
            "cuda_graph_max_bs": 64,
            "num_continuous_decode_steps": 4,
        },
    },
}

_RTX_PRO_6000_X8 = {
    "model": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "count": 8,
    "memory_gib": 96,
    "compute_capability": "12.0",
    "numa": [0, 0, 0, 0, 1, 1, 1, 1],
    # where each GPU sits on PCIe, for validate's placement rules (docs/node.md): each NUMA half's four GPUs behind
    # one switch on its own root complex; copy your box's from the preflight's `pcie` fact line (the labels are yours)
    "pcie": [{"root": 0, "switch": "a"}] * 4 + [{"root": 1, "switch": "b"}] * 4,
}

gpu_nodes = [
    (
        "gpu01",
        {
            "ssh_hostname": "10.0.0.11",
            "ssh_user": "ubuntu",
            "_sudo": True,
            "pdkit_node": {
                "gpus": _RTX_PRO_6000_X8,
                # two root complexes, no NVLink: NCCL must be allowed P2P across the host bridge
                "nccl_profile": "pcie",
                # custom all-reduce stays "auto": off only at TP 2 on sm_12x, so on for these TP4 engines
                "engines": [
                    {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
                    {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
                ],
            },
            "pdkit_router": {"port": 8000, "prometheus_port": 29000, "auth": "none"},
        },
    ),
]

monitoring = [
    ("mon01", {"ssh_hostname": "10.0.0.20", "ssh_user": "ubuntu", "_sudo": True, "pdkit_monitoring": {}}),
]

# pyinfra's `all` group: cluster-wide settings every host resolves identically.
all = (["gpu01", "mon01"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
