# Shape: a PD pair sharing one GPU (gpu_share 0.40 + 0.45): the decode starts once the prefill serves, each --mem-fraction-static derived from its share.
# Source: inventories/h200-1gpu.py; README.md "Every field" (pdkit_node.engines[].gpu_share); docs/gpu.md "Engines sharing a GPU wait for their memory"
# Release: SGLang 0.5.17
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 1, "memory_gib": 141, "compute_capability": "9.0", "numa": [0]},
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0], "port": 30000, "gpu_share": 0.40},
            {"name": "decode", "role": "decode", "gpus": [0], "port": 30001, "gpu_share": 0.45},
        ],
    },
    "pdkit_router": {"port": 8000, "decode_policy": "round_robin", "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.17",
    "model": {"path": "/models/pdkit-llama-0.9b", "load_format": "dummy"},
    "target_concurrency": 64,
    "tuning": {"all": {"attention_backend": "triton", "sampling_backend": "pytorch", "context_length": 4096},
               "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64}},
}})
