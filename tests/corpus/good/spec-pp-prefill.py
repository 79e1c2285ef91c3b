# Shape: speculative decoding (NEXTN) with pipeline parallelism on the prefill (pp 2 x tp 2) and without it on the decode (TP4): 0.5.23 accepts PP + MTP on prefill engines.
# Source: SGLang 0.5.23's sglang/srt/arg_groups/validation_hook.py check_pipeline_parallel_compat (PP + speculative decoding on disaggregation-mode prefill); sgl-project/sglang docs/advanced_features/pipeline_parallelism.md; pdkit/spec/startup.py PP_SPECULATIVE
# Release: SGLang 0.5.23
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
        "numa_nodes": 2,
        "nccl_profile": "nvlink",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "tp": 2, "pp": 2},
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
    "model": {"path": "/models/DeepSeek-V3", "served_name": "deepseek-v3", "trust_remote_code": True},
    "target_concurrency": 64,
    "tuning": {"all": {"context_length": 32768,
                       "speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}},
               "decode": {"cuda_graph_max_bs": 64}},
}})
