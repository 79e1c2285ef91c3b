"""The local lab: systemd-nspawn Debian hosts on this machine (`pdkit lab up`), no GPUs.

Each `lab-gpuN` is declared `gpu: none` with the seed node's virtual layout (8 GPUs, two
NUMA halves) so the same engines as on a real node are planned: a TP4 prefill on GPUs 0-3
and a TP4 decode on GPUs 4-7, run by the rehearsal engine (`engine: sim`, same argv as
SGLang). The router runs on lab-gpu1, Prometheus on lab-mon.

    pdkit lab up && pyinfra inventories/lab.py deploy/pd.py -y

With the lab down this still validates (the hosts' planned addresses are used).
"""

from pdkit.lab import load_lab as _load_lab
from pdkit.lab import planned_lab as _planned_lab

_LAB = _load_lab() or _planned_lab()

_VIRTUAL_GPUS = {
    "model": "RTX PRO 6000 (lab)",
    "count": 8,
    "memory_gib": 96,
    "compute_capability": "12.0",
    "numa": [0, 0, 0, 0, 1, 1, 1, 1],
}


def _node(host):
    return {
        **_LAB.pyinfra_data(host),
        "pdkit_node": {
            "gpu": "none",
            "gpus": _VIRTUAL_GPUS,
            "nccl_profile": "pcie",
            "engines": [
                {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998, "pd_group": host.name},
                {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001, "pd_group": host.name},
            ],
        },
    }


gpu_nodes = [(h.name, _node(h)) for h in _LAB.gpu_hosts]
# 120 s for up to four GPU hosts, 10 s more for each beyond (a failed start still ends the gate at once)
_READY_TIMEOUT_S = 120 + 10 * max(0, len(gpu_nodes) - 4)
# the router sits on the first GPU node, as on the seeds' single-node cluster
gpu_nodes[0][1]["pdkit_router"] = {"port": 8000, "prometheus_port": 29000, "auth": "none"}

# Grafana's apt repository cannot be reached from the lab (docs/monitoring.md): Prometheus only.
# The lab's alert clock runs 4x faster (every `for` and rate window / 4; scrapes and rule evaluation
# every 10 s): its tests see an alert fire in about a minute instead of three (docs/monitoring.md)
# Alertmanager sends everything to `lab-sink`, an HTTP sink the lab's alert tests run on lab-mon itself
# (port 9095, beside Alertmanager's 9093); it groups and re-sends on the lab's faster clock too, so a
# test sees a notification seconds after the alert fires (real defaults: 30 s, 5 m)
_LAB_SINK_PORT = 9095
monitoring = [(_LAB.monitoring_host.name, {**_LAB.pyinfra_data(_LAB.monitoring_host),
                                           "pdkit_monitoring": {
                                               "grafana": False, "scrape_interval_s": 10, "lab_alert_speedup": 4,
                                               "alerting": {
                                                   "receivers": [{"name": "lab-sink", "kind": "webhook",
                                                                  "url": f"http://{_LAB.monitoring_host.address}:{_LAB_SINK_PORT}/"}],
                                                   "group_wait_s": 5, "group_interval_s": 10, "repeat_interval_s": 3600,
                                               },
                                           }})]

all = (  # noqa: A001 - pyinfra's group name
    [h.name for h in _LAB.hosts],
    {
        "pdkit_cluster": {
            "name": "lab",
            "engine": "sim",
            "sglang_version": "0.5.23",
            "model": {"path": "/opt/pdkit/models/sim-llama", "served_name": "sim-llama"},
            "target_concurrency": 64,
            # a sim engine is ready in seconds, but a cold first converge starts every host's engines at once
            # on this machine's cores: at 32 hosts on 2 cores some took over 120 s (docs/benchmarks.md)
            "ready_timeout_s": _READY_TIMEOUT_S,
            # lab-sink's bearer token (a lab value, not a secret): exercises the credential file a real
            # receiver reads, mode 0600 for Alertmanager's user alone (docs/monitoring.md)
            "secrets": {"alert_receivers": {"lab-sink": "lab-sink-bearer"}},
            # the canary's answer gate is on by default; the lab's many rolls test other gates, and the
            # gate's own lab test turns it on (tests/lab/test_one_node_lab.py, docs/correctness.md)
            "answers": {"enabled": False},
            "tuning": {
                "all": {"context_length": 8192, "mem_fraction_static": 0.88},
                "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64, "num_continuous_decode_steps": 4},
            },
        }
    },
)
