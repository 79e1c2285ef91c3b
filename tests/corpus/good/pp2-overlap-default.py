# Shape: pipeline parallelism: a unified engine with pp 2 x tp 2 on four GPUs, the overlap schedule left at its default (SGLang turns it off itself for pp > 1).
# Source: sgl-project/sglang docs/advanced_features/pipeline_parallelism.md (v0.5.23); README.md "Errors" (pp > 1 with the overlap schedule left on is valid); pdkit/spec/startup.py startup_check_problems
# Release: SGLang 0.5.23
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 4, "memory_gib": 80, "compute_capability": "9.0", "numa": [0, 0, 0, 0]},
        "nccl_profile": "nvlink",
        "engines": [{"name": "main", "role": "unified", "gpus": [0, 1, 2, 3], "port": 30000, "tp": 2, "pp": 2}],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/Qwen3-32B", "served_name": "qwen3-32b"},
    "target_concurrency": 32,
    "tuning": {"all": {"context_length": 65536, "chunked_prefill_size": 8192}},
}})
