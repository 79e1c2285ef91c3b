# Shape: PD across two nodes: a TP8 prefill on gpu01, a TP8 decode on gpu02, KV over NIXL/UCX on the RDMA NICs, router and monitoring apart.
# Source: sgl-project/sglang docs/advanced_features/pd_disaggregation.md, "NIXL" (prefill and decode on separate hosts, v0.5.23); docs/kv-handoff.md (the cross-host KV path); README.md pdkit_node.ucx_net_devices
# Release: SGLang 0.5.23
# Warnings (layout advice: a TP8 engine on an 8-GPU box spans both NUMA halves):
#   gpu01: pdkit_node.engines[0].gpus
#   gpu02: pdkit_node.engines[0].gpus

def _node(address, engines):
    return {"ssh_hostname": address, "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0",
                 "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
        "numa_nodes": 2,
        "nccl_profile": "nvlink",
        "ucx_net_devices": "mlx5_0:1",
        "engines": engines}}


gpu_nodes = [
    ("gpu01", _node("10.0.1.10", [{"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "port": 30000}])),
    ("gpu02", _node("10.0.1.20", [{"name": "decode", "role": "decode", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "port": 30001}])),
]
others = [("router01", {"ssh_hostname": "10.0.1.5", "pdkit_router": {"port": 8000, "auth": "none"}})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "gpu02", "router01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/Qwen3-32B", "served_name": "qwen3-32b"},
    "transfer_backend": "nixl",
    "target_concurrency": 64,
    "tuning": {"all": {"context_length": 32768}, "decode": {"cuda_graph_max_bs": 64}},
}})
