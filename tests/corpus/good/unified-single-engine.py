# Shape: no PD: one unified engine (TP2) on a 2-GPU box, router and monitoring on the same host.
# Source: README.md "The inventory format" (inventories/a6000.py: 2x A6000, TP2, no PD); docs/tune.md "PD or unified on my box"
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
    "pdkit_monitoring": {"alerting": {"receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}},
})]

all = (["ct129"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/Qwen3-8B", "served_name": "qwen3-8b"},
    "target_concurrency": 16,
    "tuning": {"all": {"mem_fraction_static": 0.88, "max_running_requests": 16}},
}})
