# Shape: PD where each engine spans two nodes: prefill TP16 over gpu-p0/gpu-p1 and decode TP16 over gpu-d0/gpu-d1, each with attention DP 8 and DeepEP.
# Source: sgl-project/sglang docs/advanced_features/pd_disaggregation.md, "NIXL" / "DeepSeek Multi-Node" (v0.5.23); inventories/multinode.py; docs/architecture.md "Engines that span nodes"
# Release: SGLang 0.5.23
# Warnings: none

def _node(address, engines):
    return {"ssh_hostname": address, "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0"},
        "nccl_profile": "nvlink",
        "nic": "ens1f0",
        "nccl_net": "ib",
        "nccl_ib_hca": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
        "ucx_net_devices": "mlx5_0:1",
        "engines": engines}}


_ALL8 = [0, 1, 2, 3, 4, 5, 6, 7]
gpu_nodes = [
    ("gpu-p0", _node("10.0.1.10", [{"name": "prefill", "role": "prefill", "gpus": _ALL8, "port": 30000,
                                     "nodes": ["gpu-p0", "gpu-p1"], "dist_init_port": 5000, "tp": 16, "attn_dp": 8}])),
    ("gpu-p1", _node("10.0.1.11", [])),
    ("gpu-d0", _node("10.0.1.20", [{"name": "decode", "role": "decode", "gpus": _ALL8, "port": 30001,
                                     "nodes": ["gpu-d0", "gpu-d1"], "dist_init_port": 5000, "tp": 16, "attn_dp": 8,
                                     "tuning": {"max_running_requests": 128}}])),
    ("gpu-d1", _node("10.0.1.21", [])),
]
others = [("router01", {"ssh_hostname": "10.0.1.5", "pdkit_router": {"port": 8000, "auth": "none"}})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu-p0", "gpu-p1", "gpu-d0", "gpu-d1", "router01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/DeepSeek-V3-0324", "served_name": "deepseek-v3", "trust_remote_code": True},
    "transfer_backend": "nixl",
    "target_concurrency": 128,
    "ready_timeout_s": 1200,
    "tuning": {"all": {"context_length": 32768, "mem_fraction_static": 0.8, "moe_a2a_backend": "deepep"},
               "decode": {"cuda_graph_max_bs": 16}},
}})
