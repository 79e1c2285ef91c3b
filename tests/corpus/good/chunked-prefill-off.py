# Shape: chunked prefill turned off (chunked_prefill_size -1, "-1 disables chunked prefill" in SGLang's help) on a PD pair.
# Source: README.md "Errors" (values SGLang documents as off are valid: chunked_prefill_size -1); SGLang 0.5.23's own help for --chunked-prefill-size (sglang/srt/arg_groups/fields/schedule.py: -1 disables chunked prefill)
# Release: SGLang 0.5.23
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
        "numa_nodes": 2,
        "nccl_profile": "nvlink",
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
    "target_concurrency": 64,
    "tuning": {"all": {"context_length": 32768}, "prefill": {"chunked_prefill_size": -1},
               "decode": {"cuda_graph_max_bs": 64}},
}})
