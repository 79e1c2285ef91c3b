"""One decode engine spanning two 8-GPU nodes (TP16), a prefill node, the router and monitoring.

A MoE model too large for one node's decode: `gpu-d0` and `gpu-d1` (8x H200 each, NVLink
inside, InfiniBand between) run ONE SGLang decode server, TP16 with expert parallelism 16 and
attention DP 8: one systemd unit per node, the same argv but --node-rank, rank 0 (gpu-d0) the
only HTTP server, router worker, health, bench and scrape target. `gpu-p0` runs a TP8 prefill.
KV moves over NIXL/UCX on the IB NICs; the ranks of the decode meet at gpu-d0:25000
(--dist-init-addr) and all-reduce over NCCL/IB (nccl_net ib, nccl_ib_hca).

    pdkit validate inventories/multinode.py
    pdkit roll inventories/multinode.py --dry      # the decode is one step covering both nodes

docs/architecture.md ("Engines that span nodes") explains the layout; its argv passes both
pinned SGLang parsers (tests/test_contract_generated.py).
"""

_CLUSTER = {
    "name": "multinode",
    "engine": "sglang",
    "sglang_version": "0.5.23",
    "model": {
        "path": "/models/DeepSeek-V3",
        "served_name": "deepseek-v3",
        "trust_remote_code": True,
    },
    "transfer_backend": "nixl",
    "target_concurrency": 128,
    # two nodes load and capture graphs together: more time than one node's engine
    "ready_timeout_s": 1200,
    "tuning": {
        "all": {"context_length": 32768, "mem_fraction_static": 0.85},
        "decode": {"cuda_graph_max_bs": 128, "enable_eplb": True, "ep_num_redundant_experts": 32},
    },
}

_H200_X8 = {
    "model": "NVIDIA H200",
    "count": 8,
    "memory_gib": 141,
    "compute_capability": "9.0",
}


def _node(address: str, engines: list) -> dict:
    return {
        "ssh_hostname": address,
        "ssh_user": "ubuntu",
        "_sudo": True,
        "pdkit_node": {
            "gpus": _H200_X8,
            "nccl_profile": "nvlink",
            # across nodes: NCCL over the IB HCAs, bootstrap over the cluster network
            "nic": "ens1f0",
            "nccl_net": "ib",
            "nccl_ib_hca": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
            # NIXL/UCX moves prefill KV to the decode over IB
            "ucx_net_devices": "mlx5_0:1",
            "engines": engines,
        },
    }


gpu_nodes = [
    ("gpu-p0", _node("10.0.1.10", [
        {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "port": 30000, "bootstrap_port": 8998},
    ])),
    # the decode is declared once, on rank 0's host; gpu-d1 runs rank 1 on the same GPUs
    ("gpu-d0", _node("10.0.1.20", [
        {"name": "decode", "role": "decode", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "port": 30001,
         "nodes": ["gpu-d0", "gpu-d1"], "dist_init_port": 25000,
         "tp": 16, "ep": 16, "attn_dp": 8},
    ])),
    ("gpu-d1", _node("10.0.1.21", [])),
]

others = [
    ("router01", {"ssh_hostname": "10.0.1.5", "ssh_user": "ubuntu", "_sudo": True, "pdkit_router": {"port": 8000, "auth": "none"}}),
    ("mon01", {"ssh_hostname": "10.0.1.6", "ssh_user": "ubuntu", "_sudo": True, "pdkit_monitoring": {}}),
]

# pyinfra's `all` group: cluster-wide settings every host resolves identically.
all = (["gpu-p0", "gpu-d0", "gpu-d1", "router01", "mon01"], {"pdkit_cluster": _CLUSTER})  # noqa: A001 - pyinfra's group name
