# Shape: EAGLE speculative decoding with a separate draft model on the decode engine of a 2-GPU PD pair (TP1 + TP1).
# Source: sgl-project/sglang docs/advanced_features/speculative_decoding.md, "EAGLE-2 Decoding" (3 steps, topk 4, 16 draft tokens; v0.5.17); sgl-project/sglang docs/advanced_features/pd_disaggregation.md "NIXL" / "Llama Single Node"
# Release: SGLang 0.5.17
# Warnings: none

gpu_nodes = [("gpu01", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 2, "memory_gib": 80, "compute_capability": "9.0", "numa": [0, 0]},
        "nccl_profile": "nvlink",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0], "port": 30000},
            {"name": "decode", "role": "decode", "gpus": [1], "port": 30001},
        ],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.17",
    "model": {"path": "meta-llama/Llama-2-7b-chat-hf", "served_name": "llama-2-7b-chat"},
    "target_concurrency": 8,
    "tuning": {"all": {"mem_fraction_static": 0.7},
               "decode": {"cuda_graph_max_bs": 8,
                          "speculative": {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 16,
                                          "draft_model_path": "lmsys/sglang-EAGLE-llama2-chat-7B"}}},
}})
