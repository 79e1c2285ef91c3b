# Shape: the 2-GPU PD box (prefill TP1 + decode TP1) on the older pinned release, with sglang-router 0.3.2 (what pdkit pairs with 0.5.17).
# Source: sgl-project/sglang docs/advanced_features/pd_disaggregation.md, "NIXL" / "Llama Single Node" (v0.5.17); inventories/h200.py; docs/gpu.md
# Release: SGLang 0.5.17
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 2, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0]},
        "nccl_profile": "nvlink",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0], "port": 30000, "bootstrap_port": 8998},
            {"name": "decode", "role": "decode", "gpus": [1], "port": 30001},
        ],
    },
    # sglang-router 0.3.2 refuses power_of_two with one decode worker (inventories/h200.py)
    "pdkit_router": {"port": 8000, "decode_policy": "round_robin", "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.17",
    "model": {"path": "/models/Llama-3.1-8B-Instruct", "served_name": "llama-3.1-8b"},
    "transfer_backend": "nixl",
    "target_concurrency": 64,
    "tuning": {"all": {"context_length": 4096, "mem_fraction_static": 0.85},
               "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64}},
}})
