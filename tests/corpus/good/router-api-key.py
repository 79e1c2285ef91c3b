# Shape: one 2-GPU box in PD mode behind smg with an API key (pdkit_router.auth api_key), and the router's retries and health checks at the bounds the routers accept at start: a backoff cap at the initial backoff, one attempt, a success threshold of 1.
# Source: docs/security.md; docs/rolling.md; pdkit/spec/checks.py
# Release: SGLang 0.5.23
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
    "pdkit_router": {"port": 8000, "auth": "api_key", "health_success_threshold": 1},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["gpu01", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "sglang_version": "0.5.23",
    "model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "served_name": "llama-3.1-8b"},
    "transfer_backend": "nixl",
    "target_concurrency": 16,
    "tuning": {"all": {"context_length": 8192}, "decode": {"cuda_graph_max_bs": 16}},
    # a real inventory reads it from the environment: os.environ["PDKIT_ROUTER_KEY"] (an unset variable stops it)
    "secrets": {"router_api_key": "0123456789abcdef0123456789abcdef"},
    "fault_budget": {"router_max_backoff_ms": 50, "router_max_retries": 1, "router_admission_wait_s": 0},
}})
