# Shape: one 2-GPU box in PD mode: prefill TP1 on GPU 0 + decode TP1 on GPU 1 (--base-gpu-id 1), NIXL, router beside them.
# Source: sgl-project/sglang docs/advanced_features/pd_disaggregation.md, "NIXL" / "Llama Single Node" (v0.5.23); inventories/h200.py (pdkit's GPU tier)
# Release: SGLang 0.5.23
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 2, "memory_gib": 80, "compute_capability": "9.0", "numa": [0, 0]},
        "nccl_profile": "nvlink",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0], "port": 30000},
            {"name": "decode", "role": "decode", "gpus": [1], "port": 30001},
        ],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "served_name": "llama-3.1-8b"},
    "transfer_backend": "nixl",
    "target_concurrency": 16,
    "tuning": {"all": {"context_length": 8192}, "decode": {"cuda_graph_max_bs": 16}},
}})
