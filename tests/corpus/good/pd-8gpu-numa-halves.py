# Shape: the users' own box: one 8-GPU node, prefill TP4 on GPUs 0-3 (NUMA 0) + decode TP4 on GPUs 4-7 (NUMA 1), router on the node.
# Source: README.md "The inventory format" (inventories/cluster.py: TP4 prefill on GPUs 0-3 / TP4 decode on GPUs 4-7); docs/architecture.md
# Release: SGLang 0.5.23 (pdkit's default)
# Warnings: none

_GPUS = {"model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "count": 8, "memory_gib": 96,
         "compute_capability": "12.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]}

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": _GPUS,
        "numa_nodes": 2,
        "nccl_profile": "pcie",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
            {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
        ],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/DeepSeek-V4-Flash", "served_name": "deepseek-v4-flash", "trust_remote_code": True},
    "target_concurrency": 64,
    "tuning": {"all": {"context_length": 8192, "mem_fraction_static": 0.88},
               "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64}},
}})
