# Shape: the sim engine (engine sim: python -m pdkit.sim with SGLang's argv) on a lab host with a virtual 8-GPU layout (gpu none), TP4 + TP4.
# Source: docs/sim.md; inventories/lab.py; README.md "What the lab is"
# Release: SGLang 0.5.23 (the argv the sim takes)
# Warnings: none

gpu_nodes = [("lab-gpu1", {
    "ssh_hostname": "10.0.0.11",
    "pdkit_node": {
        "gpu": "none",
        "gpus": {"model": "RTX PRO 6000 (lab)", "count": 8, "memory_gib": 96, "compute_capability": "12.0",
                 "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
        "nccl_profile": "pcie",
        "engines": [
            {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
            {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
        ],
    },
    "pdkit_router": {"port": 8000, "prometheus_port": 29000, "auth": "none"},
})]
monitoring = [("mon01", {"ssh_hostname": "10.0.0.20", "pdkit_monitoring": {"alerting": {
    "receivers": [{"name": "oncall", "kind": "webhook", "url": "http://10.0.0.20:9095/"}]}}})]

all = (["lab-gpu1", "mon01"], {"pdkit_cluster": {  # noqa: A001 - pyinfra's group name
    "name": "corpus",
    "engine": "sim",
    "sglang_version": "0.5.23",
    "model": {"path": "/opt/pdkit/models/sim-llama", "served_name": "sim-llama"},
    "target_concurrency": 64,
    "ready_timeout_s": 120,
}})
