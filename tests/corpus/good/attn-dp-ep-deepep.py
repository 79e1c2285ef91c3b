# Shape: DP attention with expert parallelism for an MoE model: TP8, attention DP 8, EP 8, DeepEP all-to-all, DeepGEMM MoE runner.
# Source: sgl-project/sglang docs/advanced_features/dp_dpa_smg_guide.md, "Recommended setup for DeepSeek" (v0.5.23); sgl-project/sglang docs/advanced_features/expert_parallelism.md
# Release: SGLang 0.5.23
# Warnings (layout advice: a TP8 engine on an 8-GPU box spans both NUMA halves):
#   gpu01: pdkit_node.engines[0].gpus

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H200", "count": 8, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
        "numa_nodes": 2,
        "nccl_profile": "nvlink",
        "engines": [{"name": "main", "role": "unified", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "port": 30000,
                     "tp": 8, "attn_dp": 8, "ep": 8}],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/DeepSeek-V3", "served_name": "deepseek-v3", "trust_remote_code": True},
    "target_concurrency": 128,
    "tuning": {"all": {"context_length": 32768, "moe_a2a_backend": "deepep", "moe_runner_backend": "deep_gemm"},
               "unified": {"cuda_graph_max_bs": 16}},
}})
