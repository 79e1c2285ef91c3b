# Shape: multi-token prediction spelled the way SGLang's own doc spells it: --speculative-algorithm EAGLE with no
# --speculative-draft-model-path (1 step, topk 1, 2 draft tokens) on a unified engine serving an MTP model.
# Source: sgl-project/sglang docs/advanced_features/speculative_decoding.md, "Multi Token Prediction" (MiMo-7B-RL recipe; v0.5.23)
# Release: SGLang 0.5.23
# SGLang 0.5.23 loads the draft from --model-path when no draft path is given (configs/model_config.py
# ModelConfig.from_server_args; arg_groups/speculative_hook.py _handle_eagle_family for the MTP checkpoints it
# names). Refused by pdkit until 2026-12-07 (found by this corpus); now a warning that the checkpoint must bundle the head.
# Warnings (the draft comes from the target checkpoint: it must bundle an MTP head):
#   mimo: pdkit_node.engines[0].tuning.speculative.draft_model_path

gpu_nodes = [("mimo", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpus": {"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory_gib": 80, "compute_capability": "9.0", "numa": [0]},
        "engines": [{"name": "main", "role": "unified", "gpus": [0], "port": 30000}],
    },
    "pdkit_router": {"port": 8000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["mimo", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "XiaomiMiMo/MiMo-7B-RL", "served_name": "mimo-7b-rl", "trust_remote_code": True},
    "target_concurrency": 8,
    "tuning": {"all": {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 8,
                       "speculative": {"algorithm": "EAGLE", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 2}}},
}})
