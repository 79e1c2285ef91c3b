# Shape: the pp 2 engine on the older pinned release: 0.5.17 also turns the overlap schedule off itself for pp > 1 (server_args.py _handle_pipeline_parallelism).
# Source: sgl-project/sglang docs/advanced_features/pipeline_parallelism.md (v0.5.17); README.md "Errors"; pdkit/spec/startup.py startup_check_problems
# Release: SGLang 0.5.17
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 2, "memory_gib": 80, "compute_capability": "9.0", "numa": [0, 0]},
        "nccl_profile": "nvlink",
        "engines": [{"name": "main", "role": "unified", "gpus": [0, 1], "port": 30000, "tp": 1, "pp": 2}],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.17",
    "model": {"path": "/models/Llama-3.1-8B-Instruct", "served_name": "llama-3.1-8b"},
    "target_concurrency": 16,
}})
