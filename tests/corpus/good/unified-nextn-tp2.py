# Shape: no PD, one unified TP2 engine with NEXTN (multi-token prediction) speculative decoding, 3 steps, topk 1, 4 draft tokens.
# Source: README.md "The inventory format" (inventories/a6000.py: 2x A6000, TP2, NEXTN); sgl-project/sglang docs/advanced_features/speculative_decoding.md "Multi Token Prediction" (v0.5.23)
# Release: SGLang 0.5.23
# Warnings: none

gpu_nodes = [("ct129", {
    "ssh_hostname": "10.0.0.129",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA RTX A6000", "count": 2, "memory_gib": 48, "compute_capability": "8.6", "numa": [0, 0]},
        "nccl_profile": "pcie",
        "engines": [{"name": "main", "role": "unified", "gpus": [0, 1], "port": 30000}],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["ct129", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/Qwen3.6-27B", "served_name": "qwen3.6-27b"},
    "target_concurrency": 16,
    "tuning": {"all": {"mem_fraction_static": 0.88, "max_running_requests": 16,
                       "speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}},
}})
