"""One 8x H200 node whose image already has SGLang: a provided engine environment.

The node comes from a vendor image (an NGC-style stack) with SGLang 0.5.23 and NIXL installed in
/opt/vendor/sglang-env. `engine_venv` hands that environment to pdkit: the engine units run
`/opt/vendor/sglang-env/bin/python -m sglang.launch_server ...` with the flags pdkit renders, and
pdkit installs no engine on the node; its own node venv (/opt/pdkit/venv: health gates,
pdkit-exporter) holds pdkit alone. The preflight checks over SSH, before anything changes, that
the environment's python imports sglang 0.5.23 and NIXL the way SGLang imports it.

TP4 prefill on GPUs 0-3, TP4 decode on GPUs 4-7 (NVLink), KV over NIXL/UCX (cuda_ipc on one
node), the router on the node, a monitoring host.

    pdkit validate inventories/provided-env.py
    pdkit render inventories/provided-env.py --out build/
"""

_CLUSTER = {
    "name": "provided",
    "engine": "sglang",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/Qwen3-32B", "served_name": "qwen3-32b"},
    "transfer_backend": "nixl",
    "target_concurrency": 64,
    "tuning": {
        "all": {"context_length": 32768},
        "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64},
    },
}

_H200_X8 = {
    "model": "NVIDIA H200",
    "count": 8,
    "memory_gib": 141,
    "compute_capability": "9.0",
    "numa": [0, 0, 0, 0, 1, 1, 1, 1],
}

gpu_nodes = [
    (
        "gpu01",
        {
            "ssh_hostname": "10.0.0.21",
            "pdkit_node": {
                "gpus": _H200_X8,
                "numa_nodes": 2,
                "nccl_profile": "nvlink",
                # the image's own SGLang: its bin/python runs the engines (preflight checks it)
                "engine_venv": "/opt/vendor/sglang-env",
                "engines": [
                    {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000},
                    {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
                ],
            },
            "pdkit_router": {"port": 8000, "auth": "none"},
        },
    ),
]

monitoring = [("mon01", {"ssh_hostname": "10.0.0.30", "pdkit_monitoring": {}})]

# pyinfra's `all` group: cluster-wide settings every host resolves identically.
all = (["gpu01", "mon01"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
