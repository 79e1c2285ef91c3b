# Shape: a provided engine environment: the node image's own SGLang venv (engine_venv) runs the engines; NVIDIA stack provided by the machine.
# Source: inventories/provided-env.py; README.md "Every field" (pdkit_node.engine_venv, pdkit_node.nvidia_stack)
# Release: SGLang 0.5.23
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
        "numa_nodes": 2,
        "nccl_profile": "nvlink",
        "engine_venv": "/opt/vendor/sglang-env",
        "nvidia_stack": "provided",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000},
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
    "model": {"path": "/models/Qwen3-32B", "served_name": "qwen3-32b"},
    "transfer_backend": "nixl",
    "target_concurrency": 64,
    "tuning": {"all": {"context_length": 32768}, "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64}},
}})
