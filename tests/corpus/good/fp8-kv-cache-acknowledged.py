# Shape: an FP8 KV cache (kv_cache_dtype fp8_e4m3 on both roles of a PD pair), acknowledged as a by-design numerics change.
# Source: docs/correctness.md "Settings that change the answers by design" (kv_cache_quantized, pdkit_cluster.answers.acknowledge); sgl-project/sglang docs/advanced_features/quantized_kv_cache.md (v0.5.23)
# Release: SGLang 0.5.23
# Warnings (the acknowledged lever is named, once per engine: prefill, decode):
#   gpu01: pdkit_cluster.tuning.all.kv_cache_dtype
#   gpu01: pdkit_cluster.tuning.all.kv_cache_dtype

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
    "answers": {"acknowledge": ["kv_cache_quantized"]},
    "tuning": {"all": {"context_length": 32768, "kv_cache_dtype": "fp8_e4m3"},
               "decode": {"cuda_graph_max_bs": 64}},
}})
