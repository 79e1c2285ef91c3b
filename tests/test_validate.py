"""`pdkit validate`: good inventories pass, every bad one names the host and the field."""

from __future__ import annotations

import copy
import socket

import pytest

from pdkit.cli import main
from pdkit.inventory.loader import load_with_problems
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, REPO, write_inventory


def _engine(hosts, host, i):
    return hosts[host]["pdkit_node"]["engines"][i]


def _set(path_fn, value):
    def mutate(cluster, hosts):
        target, key = path_fn(cluster, hosts)
        target[key] = value
    return mutate


# (case id, mutate(cluster, hosts), host the message must name, field path it must name, a phrase)
BAD_CASES = [
    ("gpu-index-out-of-range", lambda c, h: _engine(h, "gpu01", 1).update(gpus=[2, 3, 4, 5], tp=4), "gpu01", "pdkit_node.engines[1].gpus", "does not exist"),
    ("gpu-shared", lambda c, h: _engine(h, "gpu01", 1).update(gpus=[1, 2]), "gpu01", "pdkit_node.engines[1].gpus", "already used"),
    ("tp-times-dp-mismatch", lambda c, h: _engine(h, "gpu02", 0).update(tp=4), "gpu02", "pdkit_node.engines[0].tp", "tp x dp"),
    ("duplicate-http-port", lambda c, h: _engine(h, "gpu01", 1).update(port=30000), "gpu01", "pdkit_node.engines[1].port", "already used"),
    ("bootstrap-port-clash", lambda c, h: _engine(h, "gpu02", 0).update(bootstrap_port=30001), "gpu02", "pdkit_node.engines[1].port", "already used"),
    ("router-port-clash", lambda c, h: h["gpu01"]["pdkit_router"].update(port=30001), "gpu01", "pdkit_router.port", "already used"),
    ("metrics-port-clash", lambda c, h: h["gpu01"]["pdkit_router"].update(prometheus_port=9400), "gpu01", "pdkit_router.prometheus_port", "already used"),
    ("bootstrap-port-on-decode", lambda c, h: _engine(h, "gpu01", 1).update(bootstrap_port=9000), "gpu01", "pdkit_node.engines[1].bootstrap_port", "only prefill"),
    ("pd-group-without-decode", lambda c, h: _engine(h, "gpu02", 0).update(pd_group="lonely"), "gpu02", "pdkit_node.engines[0].pd_group", "no decode"),
    ("pd-group-without-prefill", lambda c, h: _engine(h, "gpu02", 1).update(pd_group="lonely"), "gpu02", "pdkit_node.engines[1].pd_group", "no prefill"),
    ("pd-group-mixed-versions", lambda c, h: _engine(h, "gpu02", 1).update(sglang_version="0.5.17"), "gpu02", "pdkit_node.engines[1].sglang_version", "must match"),
    ("pd-group-mixed-models", lambda c, h: _engine(h, "gpu01", 1).update(model={"path": "/models/other"}), "gpu01", "pdkit_node.engines[1].model", "must match"),
    ("mtp-is-not-an-algorithm", lambda c, h: c["tuning"].update(all={"speculative": {"algorithm": "MTP", "num_steps": 3}}), "gpu01", "pdkit_cluster.tuning.all.speculative.algorithm", "NEXTN"),
    ("topk-without-steps", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "EAGLE", "eagle_topk": 2, "draft_model_path": "/models/draft"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative", "num_steps is unset"),
    ("chunked-prefill-not-page-multiple", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"page_size": 64, "chunked_prefill_size": 1000}), "gpu01", "pdkit_node.engines[0].tuning.chunked_prefill_size", "multiple of page_size"),
    ("served-name-with-colon", lambda c, h: c["model"].update(served_name="org:model"), "gpu01", "pdkit_cluster.model.served_name", "':'"),
    ("graph-max-bs-below-target", lambda c, h: c["tuning"]["decode"].update(cuda_graph_max_bs=8), "gpu01", "pdkit_node.engines[1].tuning.cuda_graph_max_bs", "target_concurrency"),
    ("router-lists-undeclared-engine", lambda c, h: h["gpu01"]["pdkit_router"].update(workers=["gpu01/prefill", "gpu03/decode"]), "gpu01", "pdkit_router.workers[1]", "not a declared engine"),
    ("router-pairs-across-hosts-without-ucx-devices", lambda c, h: h["gpu01"]["pdkit_router"].update(workers=None), "gpu02", "pdkit_node.ucx_net_devices", "pairs prefill and decode engines across hosts"),
    ("monitoring-target-missing", lambda c, h: h["mon01"]["pdkit_monitoring"].update(scrape_hosts=["gpu01", "gpu09"]), "mon01", "pdkit_monitoring.scrape_hosts[1]", "not a host"),
    ("engine-name-not-a-unit-name", lambda c, h: _engine(h, "gpu02", 0).update(name="Prefill Main"), "gpu02", "pdkit_node.engines[0].name", "systemd unit name"),
    ("unknown-role", lambda c, h: _engine(h, "gpu02", 1).update(role="both"), "gpu02", "pdkit_node.engines[1].role", "'prefill', 'decode' or 'unified'"),
    ("typo-in-engine-field", lambda c, h: _engine(h, "gpu01", 0).update(tp_size=2), "gpu01", "pdkit_node.engines[0].tp_size", "valid fields"),
    ("unknown-pdkit-section", lambda c, h: h["gpu02"].update(pdkit_nodes={}), "gpu02", "pdkit_nodes", "unknown pdkit section"),
    ("unsupported-sglang-version", lambda c, h: c.update(sglang_version="0.5.9"), "gpu01", "pdkit_cluster.sglang_version", "0.5.17"),
    ("numa-list-length", lambda c, h: h["gpu02"]["pdkit_node"]["gpus"].update(numa=[0, 1]), "gpu02", "pdkit_node.gpus", "one NUMA node per GPU"),
    ("gpus-not-evenly-spaced", lambda c, h: h["gpu02"]["pdkit_node"].update(gpus={**h["gpu02"]["pdkit_node"]["gpus"], "count": 8, "numa": [0] * 8}) or _engine(h, "gpu02", 1).update(gpus=[2, 4, 5]), "gpu02", "pdkit_node.engines[1].gpus", "evenly spaced"),
    ("extra-args-restate-flag", lambda c, h: _engine(h, "gpu01", 1).update(extra_args=["--context-length", "4096"], tuning={"context_length": 8192}), "gpu01", "pdkit_node.engines[1].extra_args[0]", "clashes with --context-length"),
    ("extra-args-abbreviated-flag", lambda c, h: _engine(h, "gpu01", 0).update(extra_args=["--tp", "2"]), "gpu01", "pdkit_node.engines[0].extra_args[0]", "clashes with --tp-size"),
    ("mem-fraction-out-of-range", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"mem_fraction_static": 1.5}), "gpu02", "pdkit_node.engines[1].tuning.mem_fraction_static", "less than 1"),
    ("pcie-ipc-allreduce-on-old-sglang", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu01", 0).update(tuning={"pcie_ipc_allreduce": True}), "gpu01", "pdkit_node.engines[0].tuning.pcie_ipc_allreduce", "0.5.23"),
    ("secret-in-engine-env", lambda c, h: _engine(h, "gpu01", 0).update(env={"HF_TOKEN": "hf_x"}), "gpu01", "pdkit_node.engines[0].env", "secrets"),
    ("numa-node-not-the-gpus", lambda c, h: _engine(h, "gpu01", 1).update(numa_node=0), "gpu01", "pdkit_node.engines[1].numa_node", "NUMA node"),
    ("no-router", lambda c, h: h["gpu01"].pop("pdkit_router"), "<inventory>", "pdkit_router", "no host declares"),
    ("no-cluster-section", None, "<inventory>", "pdkit_cluster", "no host resolves"),
    ("cluster-differs-between-hosts", lambda c, h: h["gpu02"].update(pdkit_cluster={**c, "name": "other"}), "gpu02", "pdkit_cluster", "same value"),
    ("cross-node-pd-without-ucx-devices", lambda c, h: _engine(h, "gpu02", 1).update(pd_group="default"), "gpu02", "pdkit_node.ucx_net_devices", "hang"),
    ("router-api-key-on-argv", lambda c, h: h["gpu01"]["pdkit_router"].update(extra_args=["--api-key", "k"]), "gpu01", "pdkit_router.extra_args[0]", "secrets.router_api_key"),
    ("power-of-two-with-one-decode", lambda c, h: h["gpu01"]["pdkit_router"].update(decode_policy="power_of_two"), "gpu01", "pdkit_router.decode_policy", "at least 2 decode workers"),
    ("unpinned-router-release", lambda c, h: h["gpu01"]["pdkit_router"].update(package="smg", version="1.2.0"), "gpu01", "pdkit_router", "not a pinned router"),
    ("attention-backend-typo", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"attention_backend": "flashinfr"}), "gpu01", "pdkit_node.engines[1].tuning.attention_backend", "valid: aiter, ascend, compressed"),
    ("kv-dtype-gone-in-0523", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"kv_cache_dtype": "fp4_e2m1"}), "gpu02", "pdkit_node.engines[1].tuning.kv_cache_dtype", "0.5.23"),
    ("uno-needs-0523", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "UNO"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative.algorithm", "SGLang 0.5.17 has no algorithm"),
    ("transfer-backend-typo", lambda c, h: c.update(transfer_backend="nixel"), "gpu01", "pdkit_cluster.transfer_backend", "'nixl'"),
    ("port-out-of-range", lambda c, h: _engine(h, "gpu02", 1).update(port=70000), "gpu02", "pdkit_node.engines[1].port", "65535"),
    ("compute-capability-format", lambda c, h: h["gpu01"]["pdkit_node"]["gpus"].update(compute_capability="sm120"), "gpu01", "pdkit_node.gpus.compute_capability", "'12.0'"),
    ("duplicate-engine-name", lambda c, h: _engine(h, "gpu02", 1).update(name="prefill"), "gpu02", "pdkit_node.engines[1].name", "unique"),
    ("unified-and-pd-behind-one-router", lambda c, h: _engine(h, "gpu02", 0).update(role="unified", pd_group="default") or _engine(h, "gpu02", 1).update(role="unified", pd_group="default") or h["gpu01"]["pdkit_router"].update(workers=["gpu01/prefill", "gpu01/decode", "gpu02/prefill"]), "gpu01", "pdkit_router.workers", "either in PD mode"),
    ("two-monitoring-hosts", lambda c, h: h["gpu02"].update(pdkit_monitoring={"prometheus_port": 9091}), "mon01", "pdkit_monitoring", "only one monitoring host"),
]


def _router(h):
    return h["gpu01"]["pdkit_router"]


def _cross_host(h):
    """gpu01's router over both nodes, with the UCX devices cross-node NIXL needs."""
    _router(h).update(workers=None)
    for name in ("gpu01", "gpu02"):
        h[name]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"


def _rename(h, old, new):
    h[new] = h.pop(old)


# Issue 17: one list per class of mistake; each case names the host, the field path and
# (the last item) the part of the message that says what would be valid.
LOADER_CASES = [  # 1. unknown keys wherever they sit (the file-level cases are in test_loader_*)
    ("engines-at-host-level", lambda c, h: h["gpu01"].update(engines=[{"name": "x"}]), "gpu01", "engines", "move it inside that section"),
    ("section-with-a-hyphen", lambda c, h: h["mon01"].update({"pdkit-monitoring": {}}), "mon01", "pdkit-monitoring", "did you mean pdkit_monitoring?"),
    ("misspelt-section", lambda c, h: h["gpu02"].update(pdkit_rooter={}), "gpu02", "pdkit_rooter", "did you mean pdkit_router?"),
    ("unknown-key-in-tuning", lambda c, h: c["tuning"]["decode"].update(cuda_graph_maxbs=8), "gpu01", "pdkit_cluster.tuning.decode.cuda_graph_maxbs", "valid fields: cuda_graph,"),
    ("unknown-key-in-gpus", lambda c, h: h["gpu02"]["pdkit_node"]["gpus"].update(memory_mib=80), "gpu02", "pdkit_node.gpus.memory_mib", "valid fields: model, count, memory_gib"),
]
CHOICE_CASES = [  # 2. choices from the pinned parsers' generated table
    ("sampling-backend-typo", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"sampling_backend": "flashinfr"}), "gpu01", "pdkit_node.engines[0].tuning.sampling_backend", "SGLang 0.5.23 has no sampling_backend 'flashinfr'; valid: "),
    ("moe-runner-typo", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"moe_runner_backend": "deepgemm"}), "gpu02", "pdkit_node.engines[1].tuning.moe_runner_backend", "valid: aiter, auto, cutlass, deep_gemm"),
    ("quantization-gone-in-0523", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"quantization": "marlin"}), "gpu01", "pdkit_node.engines[1].tuning.quantization", "SGLang 0.5.23 has no quantization 'marlin'; valid: auto-round"),
    ("load-format-typo", lambda c, h: c["model"].update(load_format="safetensor"), "gpu01", "pdkit_cluster.model.load_format", "valid: auto, bitsandbytes, dummy"),
    ("router-prefill-policy-typo", lambda c, h: _router(h).update(prefill_policy="cache-aware"), "gpu01", "pdkit_router.prefill_policy", "smg 1.13.0 has no prefill-policy 'cache-aware'; valid: bucket, cache_aware"),
    ("policy-that-only-smg-has", lambda c, h: _router(h).update(package="sglang-router", decode_policy="least_load"), "gpu01", "pdkit_router.decode_policy", "sglang-router 0.3.2 has no decode-policy 'least_load'; valid: cache_aware, manual, power_of_two, random, round_robin"),
    ("lowercase-algorithm", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "nextn"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative.algorithm", "valid: DFLASH"),
]
EXTRA_ARGS_CASES = [  # 3. extra_args read as SGLang's / the router's argparse reads them
    ("several-flags-in-one-string", lambda c, h: _engine(h, "gpu01", 1).update(extra_args=["--enable-p2p-check --disable-radix-cache"]), "gpu01", "pdkit_node.engines[1].extra_args[0]", "['--enable-p2p-check', '--disable-radix-cache']"),
    ("alias-of-a-generated-flag", lambda c, h: _engine(h, "gpu02", 0).update(extra_args=["--tensor-parallel-size", "2"]), "gpu02", "pdkit_node.engines[0].extra_args[0]", "clashes with --tp-size"),
    ("unknown-flag", lambda c, h: _engine(h, "gpu01", 0).update(extra_args=["--enable-p2p-chek"]), "gpu01", "pdkit_node.engines[0].extra_args[0]", "did you mean --enable-p2p-check?"),
    ("ambiguous-prefix", lambda c, h: _engine(h, "gpu01", 0).update(extra_args=["--context", "4096"]), "gpu01", "pdkit_node.engines[0].extra_args[0]", "write the full flag"),
    ("bad-choice-in-extra-args", lambda c, h: _engine(h, "gpu02", 1).update(extra_args=["--grammar-backend", "xgrammer"]), "gpu02", "pdkit_node.engines[1].extra_args[0]", "valid: llguidance, none, outlines, xgrammar"),
    ("value-without-a-flag", lambda c, h: _engine(h, "gpu02", 1).update(extra_args=["--enable-p2p-check", "true"]), "gpu02", "pdkit_node.engines[1].extra_args[1]", "value without a flag"),
    ("engine-api-key", lambda c, h: _engine(h, "gpu01", 1).update(extra_args=["--api-key", "s3cret"]), "gpu01", "pdkit_node.engines[1].extra_args[0]", "pdkit_cluster.secrets (README: the secrets table"),
    ("engine-admin-api-key-with-equals", lambda c, h: _engine(h, "gpu01", 0).update(extra_args=["--admin-api-key=s3cret"]), "gpu01", "pdkit_node.engines[0].extra_args[0]", "the secrets table"),
    ("router-flag-restated", lambda c, h: _router(h).update(extra_args=["--prefill-policy", "random"]), "gpu01", "pdkit_router.extra_args[0]", "set the matching spec field instead"),
    ("router-unknown-flag", lambda c, h: _router(h).update(extra_args=["--max-paylod-size", "1"]), "gpu01", "pdkit_router.extra_args[0]", "did you mean --max-payload-size?"),
]
PATH_CASES = [  # 4. paths, accounts, privileged ports
    ("relative-model-path", lambda c, h: c["model"].update(path="models/llama/8b"), "gpu01", "pdkit_cluster.model.path", "e.g. /models/Llama-3.1-8B-Instruct"),
    ("home-relative-tokenizer", lambda c, h: c["model"].update(tokenizer_path="~/tok"), "gpu01", "pdkit_cluster.model.tokenizer_path", "or a Hugging Face id 'org/name'"),
    ("relative-draft-model", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "EAGLE3", "draft_model_path": "./draft"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative.draft_model_path", "give the directory on the GPU nodes"),
    ("install-dir-is-a-system-dir", lambda c, h: c.update(install_dir="/usr"), "gpu01", "pdkit_cluster.install_dir", "such as /opt/pdkit"),
    ("config-dir-relative", lambda c, h: c.update(config_dir="etc/pdkit"), "gpu01", "pdkit_cluster.config_dir", "an absolute path"),
    ("service-user-root", lambda c, h: c.update(service_user="root"), "gpu01", "pdkit_cluster.service_user", "e.g. 'pdkit'"),
    ("service-user-www-data", lambda c, h: c.update(service_user="www-data"), "gpu01", "pdkit_cluster.service_user", "a user of their own"),
    ("router-on-port-80", lambda c, h: _router(h).update(port=80), "gpu01", "pdkit_router.port", "use a port from 1024 to 65535"),
    ("grafana-on-443", lambda c, h: h["mon01"]["pdkit_monitoring"].update(grafana_port=443), "mon01", "pdkit_monitoring.grafana_port", "from 1024 to 65535"),
]
ADDRESS_CASES = [  # 5. addresses and host identity
    ("node-address-not-an-ip", lambda c, h: h["gpu01"]["pdkit_node"].update(address="10.9.0.300"), "gpu01", "pdkit_node.address", "give e.g. 10.0.0.12"),
    ("router-address-garbage", lambda c, h: _router(h).update(address="router_01!"), "gpu01", "pdkit_router.address", "or gpu01.example.net"),
    ("ssh-hostname-garbage", lambda c, h: h["mon01"].update(ssh_hostname="mon 01"), "mon01", "ssh_hostname", "give e.g. 10.0.0.12"),
    ("loopback-engine-behind-a-remote-router", lambda c, h: _router(h).update(workers=["gpu02/prefill", "gpu02/decode"]) or h["gpu02"]["pdkit_node"].update(address="127.0.0.1"), "gpu02", "pdkit_node.address", "the router on gpu01 connects"),
    ("loopback-host-scraped-by-prometheus", lambda c, h: h["gpu02"].update(ssh_hostname="127.0.0.1"), "gpu02", "ssh_hostname", "its LAN IP or DNS name"),
    ("wildcard-address-in-a-cross-host-pair", lambda c, h: _cross_host(h) or h["gpu02"]["pdkit_node"].update(address="0.0.0.0"), "gpu02", "pdkit_node.address", "is the wildcard address"),
    ("at-local-host-scraped-from-elsewhere", lambda c, h: _rename(h, "gpu02", "@local") or h["@local"].pop("ssh_hostname"), "@local", "ssh_hostname", "the pyinfra connector @local"),
    ("two-hosts-one-ssh-target", lambda c, h: h["mon01"].update(ssh_hostname="10.9.0.1"), "mon01", "ssh_hostname", "give each host its own ssh_hostname"),
    # issue 46: IPv6 literals would be written unbracketed into worker URLs and scrape targets
    ("ipv6-node-address", lambda c, h: h["gpu01"]["pdkit_node"].update(address="fd00::11"), "gpu01", "pdkit_node.address", "give the host's IPv4 address or a DNS name"),
    ("ipv6-router-address", lambda c, h: _router(h).update(address="2001:db8::5"), "gpu01", "pdkit_router.address", "pdkit does not render into the router's worker URLs"),
    ("ipv6-ssh-hostname-of-a-scraped-node", lambda c, h: h["gpu02"].update(ssh_hostname="fd00::12"), "gpu02", "ssh_hostname", "is an IPv6 address"),
    ("same-port-on-a-shared-address", lambda c, h: h["gpu02"]["pdkit_node"].update(address="10.9.0.1"), "gpu02", "pdkit_node.engines[0].port", "ports must be unique per address"),
]
RANGE_CASES = [  # 6. bounds that catch unit mistakes
    ("gpu-memory-in-mib", lambda c, h: h["gpu01"]["pdkit_node"]["gpus"].update(memory_gib=143771), "gpu01", "pdkit_node.gpus.memory_gib", "looks like MiB"),
    ("gpu-memory-too-large", lambda c, h: h["gpu02"]["pdkit_node"]["gpus"].update(memory_gib=800), "gpu02", "pdkit_node.gpus.memory_gib", "at most 320"),
    ("negative-numa-id", lambda c, h: h["gpu01"]["pdkit_node"]["gpus"].update(numa=[0, 0, -1, -1]), "gpu01", "pdkit_node.gpus.numa", "from 0 to 63"),
    ("numa-id-beyond-numa-nodes", lambda c, h: h["gpu02"]["pdkit_node"].update(numa_nodes=1), "gpu02", "pdkit_node.gpus.numa[2]", "valid ids 0-0"),
    ("engine-numa-beyond-numa-nodes", lambda c, h: h["gpu01"]["pdkit_node"].update(numa_nodes=2, gpus={**h["gpu01"]["pdkit_node"]["gpus"], "numa": None}) or _engine(h, "gpu01", 0).update(numa_node=3), "gpu01", "pdkit_node.engines[0].numa_node", "valid ids 0-1"),
    ("context-length-absurd", lambda c, h: c["tuning"].update(all={"context_length": 1_000_000_000}), "gpu01", "pdkit_cluster.tuning.all.context_length", "above 16777216"),
    ("watchdog-in-milliseconds", lambda c, h: _engine(h, "gpu02", 0).update(tuning={"watchdog_timeout": 300000}), "gpu02", "pdkit_node.engines[0].tuning.watchdog_timeout", "look like milliseconds? give seconds"),
    ("ready-timeout-in-milliseconds", lambda c, h: c.update(ready_timeout_s=600000), "gpu01", "pdkit_cluster.ready_timeout_s", "above 86400"),
    ("max-running-requests-absurd", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"max_running_requests": 10_000_000}), "gpu01", "pdkit_node.engines[1].tuning.max_running_requests", "above 65536"),
    ("chunked-prefill-zero", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"chunked_prefill_size": 0}), "gpu01", "pdkit_node.engines[0].tuning.chunked_prefill_size", "-1 for no chunked prefill"),
    ("scrape-interval-in-ms", lambda c, h: h["mon01"]["pdkit_monitoring"].update(scrape_interval_s=15000), "mon01", "pdkit_monitoring.scrape_interval_s", "give seconds"),
]
PAIR_CASES = [  # 7. pairs and groups
    ("page-size-differs-across-a-pair", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"page_size": 16}) or _engine(h, "gpu01", 1).update(tuning={"page_size": 32}), "gpu01", "pdkit_node.engines[1].tuning.page_size", "must match"),
    ("kv-dtype-differs-across-a-pair", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"kv_cache_dtype": "fp8_e4m3"}), "gpu02", "pdkit_node.engines[1].tuning.kv_cache_dtype", "mixes kv_cache_dtype 'fp8_e4m3' with None"),
    ("both-roles-flag-on-one-role", lambda c, h: _engine(h, "gpu01", 0).update(extra_args=["--disaggregation-decode-allocation-policy", "prefill_complete"]), "gpu01", "pdkit_node.engines[1].extra_args", "every prefill/decode pair the router can make must match"),
    ("router-pairs-different-models-across-groups", lambda c, h: _cross_host(h) or _engine(h, "gpu02", 1).update(model={"path": "/models/other"}), "gpu02", "pdkit_node.engines[1].model", "the router on gpu01 mixes model"),
    ("router-with-no-workers", lambda c, h: _router(h).update(workers=[]), "gpu01", "pdkit_router.workers", "leave workers unset for every engine"),
    ("cluster-without-engines", lambda c, h: h["gpu01"]["pdkit_node"].update(engines=[]) or h["gpu02"]["pdkit_node"].update(engines=[]) or h["gpu01"].pop("pdkit_router"), "<inventory>", "pdkit_node.engines", "give at least one pdkit_node.engines entry"),
    ("eagle3-without-draft", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "EAGLE3"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative", "set draft_model_path"),
    ("standalone-without-draft", lambda c, h: c["tuning"].update(all={"speculative": {"algorithm": "STANDALONE"}}), "gpu01", "pdkit_cluster.tuning.all.speculative", "set draft_model_path"),
    ("uno-with-a-draft", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "UNO", "draft_model_path": "/models/d"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative", "remove draft_model_path"),
    ("uno-without-lora", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "UNO"}}), "gpu01", "pdkit_node.engines[1].extra_args", "add ['--uno-lora-path'"),
]


def _span(h, **decode):
    """gpu01's decode spans gpu01 and gpu02 (TP4 as 2 x 2 GPUs; gpu02 runs rank 1 on GPUs 2-3),
    with the cross-node NCCL and UCX settings that needs; DECODE overrides engine fields."""
    h["gpu02"]["pdkit_node"]["engines"] = []
    _engine(h, "gpu01", 1).update({"nodes": ["gpu01", "gpu02"], "dist_init_port": 25000, "tp": 4, **decode})
    for name in ("gpu01", "gpu02"):
        h[name]["pdkit_node"].update(nic="eth0", nccl_net="socket", ucx_net_devices="eth0")


# Issue 20: engines spanning nodes and their parallel layout, checked as SGLang's server args check them
SPAN_CASES = [
    ("span-nodes-not-from-the-declaring-host", lambda c, h: _span(h, nodes=["gpu02", "gpu01"]), "gpu01", "pdkit_node.engines[1].nodes", "must start with 'gpu01'"),
    ("span-nodes-one-host", lambda c, h: _span(h, nodes=["gpu01"]), "gpu01", "pdkit_node.engines[1].nodes", "lists 2 or more hosts"),
    ("span-unknown-host", lambda c, h: _span(h, nodes=["gpu01", "gpu09"]), "gpu01", "pdkit_node.engines[1].nodes[1]", "not a host in this inventory; valid: gpu01, gpu02"),
    ("span-host-without-pdkit-node", lambda c, h: _span(h, nodes=["gpu01", "mon01"]), "gpu01", "pdkit_node.engines[1].nodes[1]", "a host without pdkit_node"),
    ("span-without-dist-init-port", lambda c, h: _span(h) or _engine(h, "gpu01", 1).pop("dist_init_port"), "gpu01", "pdkit_node.engines[1].dist_init_port", "e.g. 25000"),
    ("dist-init-port-on-one-node", lambda c, h: _engine(h, "gpu02", 1).update(dist_init_port=25000), "gpu02", "pdkit_node.engines[1].dist_init_port", "only used by an engine spanning nodes"),
    ("span-tp-not-the-total-gpus", lambda c, h: _span(h, tp=2), "gpu01", "pdkit_node.engines[1].tp", "tp x pp x dp must equal the GPU count"),
    ("span-dp-replicas", lambda c, h: _span(h, tp=2, dp=2), "gpu01", "pdkit_node.engines[1].dp", "use attn_dp"),
    ("span-tp-not-divisible-by-nodes", lambda c, h: _span(h, tp=3), "gpu01", "pdkit_node.engines[1].tp", "not divisible by the 2 nodes"),
    ("attn-dp-not-dividing-tp", lambda c, h: _span(h, attn_dp=3), "gpu01", "pdkit_node.engines[1].attn_dp", "does not divide tp 4"),
    ("attn-dp-with-dp-replicas", lambda c, h: _engine(h, "gpu02", 1).update(tp=1, dp=2, attn_dp=2), "gpu02", "pdkit_node.engines[1].attn_dp", "combined with attention data parallelism"),
    ("ep-not-dividing-tp", lambda c, h: _span(h, ep=3), "gpu01", "pdkit_node.engines[1].ep", "does not divide tp 4"),
    ("eplb-without-ep", lambda c, h: _span(h) or _engine(h, "gpu01", 1).update(tuning={"enable_eplb": True}), "gpu01", "pdkit_node.engines[1].ep", "needs expert parallelism"),
    ("pp-with-speculative", lambda c, h: _span(h, tp=2, pp=2, tuning={"speculative": {"algorithm": "NEXTN"}}), "gpu01", "pdkit_node.engines[1].pp", "speculative"),
    ("span-node-without-nic", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].pop("nic"), "gpu02", "pdkit_node.nic", "NCCL_SOCKET_IFNAME"),
    ("span-node-without-nccl-net", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].pop("nccl_net"), "gpu02", "pdkit_node.nccl_net", "'ib' (InfiniBand/RoCE, with nccl_ib_hca) or 'socket'"),
    ("nccl-ib-without-hca", lambda c, h: _span(h) or h["gpu01"]["pdkit_node"].update(nccl_net="ib"), "gpu01", "pdkit_node.nccl_ib_hca", "e.g. 'mlx5_0,mlx5_1'"),
    ("nccl-hca-with-socket", lambda c, h: h["gpu02"]["pdkit_node"].update(nccl_net="socket", nccl_ib_hca="mlx5_0"), "gpu02", "pdkit_node.nccl_ib_hca", "only used with nccl_net 'ib'"),
    ("nccl-hca-garbage", lambda c, h: h["gpu02"]["pdkit_node"].update(nccl_net="ib", nccl_ib_hca="mlx5 0"), "gpu02", "pdkit_node.nccl_ib_hca", "must match"),
    ("span-nodes-disagree-on-nccl-net", lambda c, h: _span(h) or h["gpu01"]["pdkit_node"].update(nccl_net="ib", nccl_ib_hca="mlx5_0"), "gpu01", "pdkit_node.engines[1].nodes", "disagree on nccl_net"),
    ("span-gpu-model-differs", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].update(gpus={**h["gpu02"]["pdkit_node"]["gpus"], "model": "NVIDIA H100"}), "gpu02", "pdkit_node.gpus", "the same GPU model"),
    ("span-rank-gpu-taken", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].update(engines=[{"name": "other", "role": "unified", "gpus": [2, 3], "port": 31000}]), "gpu02", "pdkit_node.engines", "already used by gpu02/other"),
    ("span-rank-unit-name-taken", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].update(engines=[{"name": "decode", "role": "unified", "gpus": [0, 1], "port": 31000}]), "gpu01", "pdkit_node.engines[1].name", "give the engine a name unused on gpu02"),
    ("span-rank-gpu-missing", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].update(gpus={**h["gpu02"]["pdkit_node"]["gpus"], "count": 2, "numa": [0, 0]}), "gpu02", "pdkit_node.gpus.count", "GPU 2 does not exist here"),
    ("dist-init-port-clash", lambda c, h: _span(h, dist_init_port=30000), "gpu01", "pdkit_node.engines[1].dist_init_port", "already used"),
    ("attn-dp-derived-port-clash", lambda c, h: _span(h, dist_init_port=29996, attn_dp=2), "gpu01", "pdkit_node.engines[1].dist_init_port (+5: SGLang's attention-DP ports)", "already used"),
    ("span-rank-0-on-loopback", lambda c, h: _span(h) or h["gpu01"]["pdkit_node"].update(address="127.0.0.1"), "gpu01", "pdkit_node.address", "connect to rank 0 there"),
    ("span-pd-rank-without-ucx-devices", lambda c, h: _span(h) or h["gpu02"]["pdkit_node"].pop("ucx_net_devices"), "gpu02", "pdkit_node.ucx_net_devices", "KV crosses nodes"),
]
BAD_CASES += SPAN_CASES


def _provided(h, host="gpu01", venv="/opt/sglang-env"):
    """HOST's engines run from the node's own SGLang environment (issue 22 item 1)."""
    h[host]["pdkit_node"]["engine_venv"] = venv


def _third_engine_on_another_release(h):
    """gpu02 gets two more GPUs and a unified engine on SGLang 0.5.17 beside its 0.5.23 PD pair."""
    h["gpu02"]["pdkit_node"]["gpus"] = {**h["gpu02"]["pdkit_node"]["gpus"], "count": 6, "numa": [0, 0, 1, 1, 1, 1]}
    h["gpu02"]["pdkit_node"]["engines"].append({"name": "solo", "role": "unified", "gpus": [4, 5], "port": 30005, "sglang_version": "0.5.17"})


# Issue 22 item 1: a node's own engine environment (pdkit_node.engine_venv)
PROVIDED_ENV_CASES = [
    ("engine-venv-relative", lambda c, h: _provided(h, venv="opt/sglang-env"), "gpu01", "pdkit_node.engine_venv", "an absolute path"),
    ("engine-venv-system-dir", lambda c, h: _provided(h, venv="/usr"), "gpu01", "pdkit_node.engine_venv", "python3 -m venv --system-site-packages /opt/sglang-env"),
    ("engine-venv-dotdot", lambda c, h: _provided(h, venv="/opt/x/../sglang"), "gpu01", "pdkit_node.engine_venv", "'..' component"),
    ("engine-venv-hidden-from-engines", lambda c, h: _provided(h, "gpu02", venv="/home/ml/sglang-env"), "gpu02", "pdkit_node.engine_venv", "ProtectHome=yes"),
    ("engine-venv-with-engine-sim", lambda c, h: c.update(engine="sim") or _provided(h), "gpu01", "pdkit_node.engine_venv", "remove engine_venv, or set pdkit_cluster.engine: sglang"),
    ("engine-venv-inside-install-dir", lambda c, h: _provided(h, venv="/opt/pdkit/venv"), "gpu01", "pdkit_node.engine_venv", "inside pdkit_cluster.install_dir (/opt/pdkit)"),
    ("engine-venv-two-releases-on-one-node", lambda c, h: _third_engine_on_another_release(h) or _provided(h, "gpu02"), "gpu02", "pdkit_node.engine_venv", "0.5.17 for solo; 0.5.23 for prefill, decode"),
]
BAD_CASES += PROVIDED_ENV_CASES

# Issue 46 item 5: an engine's env may not replace what pdkit renders from a field (its env file is read last)
RENDERED_ENV_CASES = [
    ("env-sets-a-fault-budget-wait", lambda c, h: _engine(h, "gpu01", 0).update(env={"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "30"}),
     "gpu01", "pdkit_node.engines[0].env.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "set pdkit_cluster.fault_budget.bootstrap_timeout_s instead"),
    ("env-sets-nccl-p2p-level-on-pcie", lambda c, h: h["gpu02"]["pdkit_node"].update(nccl_profile="pcie") or _engine(h, "gpu02", 1).update(env={"NCCL_P2P_LEVEL": "NVL"}),
     "gpu02", "pdkit_node.engines[1].env.NCCL_P2P_LEVEL", "set pdkit_node.nccl_p2p_level (or pdkit_node.nccl_profile) instead"),
    ("env-sets-ucx-tls-on-same-node-pd", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_TLS": "tcp"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TLS", "pdkit_node.ucx_net_devices"),
    ("env-sets-home", lambda c, h: _engine(h, "gpu01", 1).update(env={"HOME": "/root"}),
     "gpu01", "pdkit_node.engines[1].env.HOME", "set pdkit_cluster.service_user (its home directory) instead"),
    ("env-sets-the-host-ip", lambda c, h: _engine(h, "gpu02", 1).update(env={"SGLANG_HOST_IP": "10.9.0.9"}),
     "gpu02", "pdkit_node.engines[1].env.SGLANG_HOST_IP", "pdkit_node.address"),
]
BAD_CASES += RENDERED_ENV_CASES
# UCX settings the engine's env adds, against the pinned UCX (pdkit/upstream/data/ucx_config.json, pdkit/upstream/ucxcheck.py):
# the GPU pair's shape (ucx_net_devices set, so UCX_TLS is the user's) with a transport UCX has no name for
UCX_ENV_CASES = [
    ("env-ucx-tls-unknown-transport", lambda c, h: h["gpu01"]["pdkit_node"].update(ucx_net_devices="eth1") or _engine(h, "gpu01", 1).update(env={"UCX_TLS": "cuda_ipc,nvlink,tcp"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TLS", "names nvlink, which UCX has no transport for"),
    ("env-ucx-tls-empty", lambda c, h: h["gpu02"]["pdkit_node"].update(ucx_net_devices="eth1") or _engine(h, "gpu02", 0).update(env={"UCX_TLS": " , "}),
     "gpu02", "pdkit_node.engines[0].env.UCX_TLS", "valid: a comma list"),
    ("env-ucx-tls-bad-exclusion", lambda c, h: h["gpu01"]["pdkit_node"].update(ucx_net_devices="eth1") or _engine(h, "gpu01", 0).update(env={"UCX_TLS": "^rdma"}),
     "gpu01", "pdkit_node.engines[0].env.UCX_TLS", "names rdma"),
]
BAD_CASES += UCX_ENV_CASES
# limits between UCX settings that make UCX refuse to open a transport (pdkit.upstream.ucxcheck.related_problems; each
# held to the pinned wheel's UCX by tests/test_contract_ucx.py): against what pdkit renders plus the env
UCX_LIMIT_CASES = [
    ("env-ucx-tcp-tx-above-rx", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_TCP_TX_SEG_SIZE": "128k"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TCP_TX_SEG_SIZE", "UCX requires RX >= TX"),
    ("env-ucx-tcp-max-iov-beyond-the-segment", lambda c, h: _engine(h, "gpu02", 0).update(env={"UCX_TCP_MAX_IOV": "1000"}),
     "gpu02", "pdkit_node.engines[0].env.UCX_TCP_MAX_IOV", "valid: TX_SEG_SIZE >= 16059 or a smaller MAX_IOV"),
    ("env-ucx-tcp-retries-over-8-bits", lambda c, h: _engine(h, "gpu01", 0).update(env={"UCX_TCP_MAX_CONN_RETRIES": "300"}),
     "gpu01", "pdkit_node.engines[0].env.UCX_TCP_MAX_CONN_RETRIES", "valid: 0-255"),
    ("env-ucx-rx-segment-over-its-chunk", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_TCP_RX_SEG_SIZE": "1g"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TCP_RX_SEG_SIZE", "does not fit a UCX_TCP_RX_MAX_CHUNK_SIZE chunk"),
    ("env-ucx-size-with-a-fraction", lambda c, h: _engine(h, "gpu02", 1).update(env={"UCX_TCP_RX_SEG_SIZE": "1.5M"}),
     "gpu02", "pdkit_node.engines[1].env.UCX_TCP_RX_SEG_SIZE", "no fraction"),
    ("env-ucx-fifo-not-a-power-of-two", lambda c, h: _engine(h, "gpu01", 0).update(env={"UCX_POSIX_FIFO_SIZE": "100"}),
     "gpu01", "pdkit_node.engines[0].env.UCX_POSIX_FIFO_SIZE", "needs a power of two above 1"),
]
BAD_CASES += UCX_LIMIT_CASES


@pytest.mark.parametrize("env", [
    {"UCX_TCP_TX_SEG_SIZE": "64k"},  # equal to the default RX: UCX opens it
    {"UCX_TCP_TX_SEG_SIZE": "512K", "UCX_TCP_RX_SEG_SIZE": "1M", "UCX_TCP_MAX_CONN_RETRIES": "255"},
    {"UCX_TCP_MAX_IOV": "1000", "UCX_TCP_TX_SEG_SIZE": "16059", "UCX_TCP_RX_SEG_SIZE": "64kb"},
    {"UCX_POSIX_FIFO_SIZE": "64", "UCX_SYSV_FIFO_SIZE": "1024"},
])
def test_related_ucx_settings_ucx_opens_are_quiet(env, tmp_path, capsys):
    """UCX_LIMIT_CASES' counterparts: values the pinned UCX opens a worker with (tests/test_contract_ucx.py)."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 1).update(env=env)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err


def test_a_ucx_limit_on_a_transport_ucx_tls_leaves_out_is_quiet(tmp_path, capsys):
    """UCX opens only the transports UCX_TLS allows: a TCP limit broken where TLS has no tcp changes nothing."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_node"].update(ucx_net_devices="eth1")
    _engine(hosts, "gpu01", 1).update(env={"UCX_TLS": "cuda_ipc,cuda_copy,sm,self", "UCX_TCP_TX_SEG_SIZE": "128k"})
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err


def test_eagle_topk_1_with_other_draft_tokens_is_valid_as_sglang_adjusts_them(tmp_path, capsys):
    """SGLang sets num_draft_tokens to num_steps + 1 when eagle_topk is 1, with a warning, and starts
    (speculative_hook.py _handle_eagle_family, 0.5.17 and 0.5.23): not a refusal."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 1).update(tuning={"speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1,
                                                              "num_draft_tokens": 3}})
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    # and says what SGLang will run (pdkit.upstream.startchecks.derivation_problems, through pdkit.render.argvcheck)
    out = capsys.readouterr().out
    assert "pdkit_node.engines[1].tuning.speculative" in out and "num_steps + 1 = 4" in out, out


@pytest.mark.parametrize("env, phrase", [
    ({"UCX_RNDV_THRESHOLD": "8k"}, "has no setting UCX_RNDV_THRESHOLD: UCX ignores it with a warning; did you mean UCX_RNDV_THRESH?"),
    ({"UCX_MAX_RNDV_RAIL": "1"}, "did you mean UCX_MAX_RNDV_RAILS?"),
])
def test_an_unknown_ucx_setting_warns_with_the_closest_name(env, phrase, tmp_path, capsys):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 1).update(env=env)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert phrase in out, out
    assert main(["validate", "--strict", str(inv)]) == 2


@pytest.mark.parametrize("env", [
    {"UCX_RNDV_THRESH": "8k", "UCX_MAX_RNDV_RAILS": "1"},  # in the pinned UCX's table
    {"UCX_IB_GID_INDEX": "3", "UCX_RC_TIMEOUT": "10s"},  # verbs transports: not in the wheel's build, not judged here
])
def test_ucx_settings_ucx_has_or_cannot_be_judged_here_are_quiet(env, tmp_path, capsys):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 1).update(env=env)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("env", [
    {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "30", "PDKIT_ANYTHING": "1"},  # a unified engine has no PD waits
    {"NCCL_PROTO": "Simple"},  # no PCIe profile on the node: pdkit renders no NCCL_PROTO there
    {"SGLANG_LOG_LEVEL_X": "1", "CUDA_LAUNCH_BLOCKING": "0"},  # nothing pdkit renders
])
def test_env_pdkit_does_not_render_for_the_engine_stays_the_users(env, tmp_path, capsys):
    """RENDERED_ENV_CASES' counterparts: a variable pdkit does not render for THIS engine is the user's."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    if "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" in env:
        hosts["gpu02"]["pdkit_node"]["gpus"] = {**hosts["gpu02"]["pdkit_node"]["gpus"], "count": 6, "numa": [0, 0, 1, 1, 1, 1]}
        hosts["gpu02"]["pdkit_node"]["engines"].append({"name": "solo", "role": "unified", "gpus": [4, 5], "port": 30005,
                                                        "env": env})
    else:
        _engine(hosts, "gpu01", 1).update(env=env)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err


def test_ucx_tls_beside_ucx_net_devices_stays_the_users():
    """The GPU pair's shape (inventories/h200-nspawn-pair.py): cross-node PD names ucx_net_devices, pdkit
    renders no UCX_TLS then, and the engines' own UCX_TLS is accepted."""
    spec, problems = load_with_problems(str(REPO / "inventories" / "h200-nspawn-pair.py"))
    assert spec is not None and not [p for p in problems if ".env." in p.field], problems
    assert any("UCX_TLS" in e.env for _, e in spec.engines())


def test_a_provided_engine_env_is_valid(base, tmp_path, capsys):
    """The PROVIDED_ENV_CASES base: gpu01 runs its engines from /opt/sglang-env, gpu02 from pdkit's lock."""
    cluster, hosts = base
    _provided(hosts, venv="/opt/sglang-env/")
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "gpu01 (10.9.0.1)" in out and "engines run from the node's own environment /opt/sglang-env/bin/python" in out
    assert out.count("the node's own environment") == 1
    spec, _ = load_with_problems(str(inv))
    assert spec.host("gpu01").node.engine_venv == "/opt/sglang-env"  # the trailing slash is dropped
    assert spec.host("gpu02").node.engine_venv is None


def test_the_third_engine_alone_is_valid(base, tmp_path, capsys):
    """engine-venv-two-releases-on-one-node's layout is valid without engine_venv: only the one environment makes it wrong."""
    cluster, hosts = base
    _third_engine_on_another_release(hosts)
    assert main(["validate", str(write_inventory(tmp_path, hosts, cluster))]) == 0, capsys.readouterr().err


def test_a_spanning_engine_is_valid(base, tmp_path, capsys):
    """The SPAN_CASES base: one decode over two nodes passes, and rank 1 shows on gpu02."""
    cluster, hosts = base
    _span(hosts, ep=4, attn_dp=2)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "warning" not in out
    assert "rank 0 of 2 nodes (gpu01, gpu02), dist-init :25000" in out
    assert "rank 1 of gpu01/decode" in out


BAD_CASES += LOADER_CASES + CHOICE_CASES + EXTRA_ARGS_CASES + PATH_CASES + ADDRESS_CASES + RANGE_CASES + PAIR_CASES

# 8. settings the combination ignores: a warning (exit 0), an error under --strict
IGNORED_CASES = [
    ("bucket-list-with-decode-graphs-off", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"cuda_graph": False, "cuda_graph_bs": [1, 2, 4, 8, 16, 32]}), "gpu01", "pdkit_node.engines[1].tuning.cuda_graph_bs", "remove it or turn cuda_graph on"),
    ("decode-knob-on-a-prefill-engine", lambda c, h: _engine(h, "gpu02", 0).update(tuning={"num_continuous_decode_steps": 4}), "gpu02", "pdkit_node.engines[0].tuning.num_continuous_decode_steps", "set it on the decode role instead"),
    ("decode-knob-on-the-prefill-layer", lambda c, h: c["tuning"].update(prefill={"cuda_graph_max_bs": 64}), "gpu01", "pdkit_cluster.tuning.prefill.cuda_graph_max_bs", "set it on the decode role instead"),
    ("prefill-graph-knob-on-a-decode-engine", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"prefill_cuda_graph": False}), "gpu01", "pdkit_node.engines[1].tuning.prefill_cuda_graph", "set it on the prefill role instead"),
    ("plain-policy-on-a-pd-router", lambda c, h: _router(h).update(policy="random"), "gpu01", "pdkit_router.policy", "only prefill_policy and decode_policy apply"),
    ("allow-longer-context-without-a-context", lambda c, h: c["tuning"].update(all={"allow_longer_context": True}), "gpu01", "pdkit_cluster.tuning.all.allow_longer_context", "set context_length or remove it"),
    ("unknown-host-key", lambda c, h: h["gpu02"].update(gpu_count=4), "gpu02", "gpu_count", "pdkit ignores it"),
    ("engine-venv-on-a-node-without-engines", lambda c, h: h["gpu02"]["pdkit_node"].update(engines=[], engine_venv="/opt/sglang-env"), "gpu02", "pdkit_node.engine_venv", "runs no engine; remove it"),
    ("dspark-without-draft", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "DSPARK"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative.draft_model_path", "set draft_model_path unless it does"),
    # issue 46: SGLang starts EAGLE without a draft path (the draft from the target checkpoint: its MiMo recipe)
    ("eagle-without-draft", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"speculative": {"algorithm": "EAGLE"}}), "gpu02", "pdkit_node.engines[1].tuning.speculative.draft_model_path", "bundles a multi-token-prediction head"),
    # issue 46: a hub id beside a local model: the engine runs offline (HF_HUB_OFFLINE=1)
    ("hub-tokenizer-beside-a-local-model", lambda c, h: c["model"].update(tokenizer_path="meta-llama/Llama-3.1-8B-Instruct"), "gpu01", "pdkit_cluster.model.tokenizer_path", "download it to a local directory"),
    ("hub-draft-beside-a-local-model", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"speculative": {"algorithm": "EAGLE3", "draft_model_path": "org/eagle3-draft"}}), "gpu02", "pdkit_node.engines[1].tuning.speculative.draft_model_path", "the engine runs offline"),
    # issue 46: a verbs device without the port UCX lists it with
    ("ucx-verbs-device-without-its-port", lambda c, h: h["gpu01"]["pdkit_node"].update(ucx_net_devices="mlx5_0"), "gpu01", "pdkit_node.ucx_net_devices", "valid: e.g. mlx5_0:1"),
    # issue 46: settings that stop the engine logging what pdkit reads (SGLang writes both at INFO)
    ("quiet-log-level-hides-the-graph-evidence", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"log_level": "warning"}), "gpu01", "pdkit_node.engines[1].tuning.log_level", "valid: info or debug"),
    ("quiet-log-level-in-extra-args", lambda c, h: _engine(h, "gpu02", 1).update(extra_args=["--log-level", "error"]), "gpu02", "pdkit_node.engines[1].extra_args", "the 'Decode batch' lines"),
    ("decode-log-interval-too-seldom", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"decode_log_interval": 100000}), "gpu01", "pdkit_node.engines[1].tuning.decode_log_interval", "valid: at most 1000"),
]


def test_the_base_inventory_is_valid(base, tmp_path, capsys):
    """Every bad case is the base plus one mistake, so the base itself must pass."""
    cluster, hosts = base
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize("case", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_inventory_names_host_and_field(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


def assert_validate_refuses(case, base, tmp_path, capsys) -> None:
    """CASE = (id, mutate(cluster, hosts) or None for no cluster, host, field path, phrase): `pdkit
    validate` on the mutated base inventory exits 2 with an error line naming host and field that
    says PHRASE (the other validate test modules' cases go through this too)."""
    _, mutate, host, field, phrase = case
    cluster, hosts = base
    if mutate is None:
        cluster = None
    else:
        mutate(cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)

    rc = main(["validate", str(inv)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    matching = [line for line in err.splitlines() if line.strip().startswith("error") and f"{host}: {field}" in line]
    assert matching, f"no error names {host}: {field}; got:\n{err}"
    assert any(phrase in line for line in matching), f"expected {phrase!r} in:\n" + "\n".join(matching)


@pytest.mark.parametrize("case", IGNORED_CASES, ids=[c[0] for c in IGNORED_CASES])
def test_ignored_setting_warns_and_fails_under_strict(case, base, tmp_path, capsys):
    _, mutate, host, field, phrase = case
    cluster, hosts = base
    mutate(cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)

    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    warned = [line for line in out.splitlines() if line.startswith(f"warning {host}: {field}")]
    assert warned and any(phrase in line for line in warned), f"no warning {host}: {field} with {phrase!r}; got:\n{out}"

    assert main(["validate", "--strict", str(inv)]) == 2
    err = capsys.readouterr().err
    assert any(line.strip().startswith(f"error   {host}: {field}") and phrase in line for line in err.splitlines()), err


@pytest.mark.parametrize("cases", [LOADER_CASES, CHOICE_CASES, EXTRA_ARGS_CASES, PATH_CASES, ADDRESS_CASES, RANGE_CASES, PAIR_CASES, IGNORED_CASES],
                         ids=["loader", "choices", "extra_args", "paths", "addresses", "ranges", "pairs", "ignored"])
def test_each_class_of_issue_17_has_three_cases(cases):
    assert len({c[0] for c in cases}) >= 3 and all(c[4] for c in cases)


def test_there_are_at_least_25_distinct_bad_cases():
    assert len({c[0] for c in BAD_CASES}) >= 25
    assert len({(c[2], c[3]) for c in BAD_CASES}) >= 25


def test_every_problem_is_listed_not_just_the_first(base, tmp_path, capsys):
    cluster, hosts = base
    _engine(hosts, "gpu01", 0).update(port=70000)
    _engine(hosts, "gpu02", 1).update(role="both")
    hosts["mon01"]["pdkit_monitoring"].update(grafana_port="x")
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "gpu01: pdkit_node.engines[0].port" in err
    assert "gpu02: pdkit_node.engines[1].role" in err
    assert "mon01: pdkit_monitoring.grafana_port" in err
    assert "3 error(s)" in err


def test_validate_prints_one_line_per_problem_and_the_summary_on_its_own(base, tmp_path, capsys):
    """The summary line and each problem end with a newline: no problem runs into the summary or into
    the next problem (an invalid inventory, on stderr; a valid one with warnings, on stdout)."""
    cluster, hosts = base
    _engine(hosts, "gpu01", 0).update(port=70000)
    _engine(hosts, "gpu02", 1).update(role="both")
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.endswith("\n") and "\n\n" not in err
    lines = err.splitlines()
    assert lines[0] == f"{inv}: 2 error(s); nothing was contacted."
    assert len(lines) == 3, err
    assert lines[1].startswith("  error   gpu01: pdkit_node.engines[0].port: ") and "70000" in lines[1]
    assert lines[2].startswith("  error   gpu02: pdkit_node.engines[1].role: ")
    for line in lines[1:]:
        assert str(inv) not in line and line.count(" error   ") == 1, line

    # valid, with warnings: the summary's last line, then one line per warning
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["tuning"]["decode"].update(max_running_requests=24, cuda_graph_max_bs=32)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    lines = out.splitlines()
    warned = [i for i, line in enumerate(lines) if line.startswith("warning ")]
    assert len(warned) == 2 and warned == list(range(len(lines) - 2, len(lines))), out
    assert lines[warned[0] - 1].startswith("OK: ") and lines[warned[0] - 1].endswith("no host was contacted.")
    assert all(line.count("warning ") == 1 for line in lines[-2:]), out


def test_graph_max_bs_above_max_running_is_a_warning_not_an_error(base, tmp_path, capsys):
    cluster, hosts = base
    cluster["tuning"]["decode"].update(max_running_requests=24, cuda_graph_max_bs=32)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0
    out = capsys.readouterr().out
    assert "warning gpu01: pdkit_node.engines[1].tuning.cuda_graph_max_bs" in out
    assert "clamps" in out


# 1. the loader: the inventory file itself (name -> file text, line the message must name, phrase)
LOADER_FILE_CASES = [
    ("syntax-error", "gpu_nodes = [('a', {})\n", 1, "SyntaxError"),
    ("name-error", "gpu_nodes = [('a', {})]\nx = undefined_name\n", 2, "NameError: name 'undefined_name' is not defined"),
    ("attribute-error", "import os\n\ngpu_nodes = [(os.no_such_attr, {})]\n", 3, "AttributeError"),
    ("key-error", "d = {}\ngpu_nodes = [('a', {})]\nport = d['port']\n", 3, "KeyError: 'port'"),
    ("sys-exit", "import sys\nsys.exit('no cluster today')\n", 2, "calls sys.exit('no cluster today')"),
]


@pytest.mark.parametrize("case", LOADER_FILE_CASES, ids=[c[0] for c in LOADER_FILE_CASES])
def test_loader_reports_an_inventory_that_raises_as_one_line(case, tmp_path, capsys):
    name, text, line, phrase = case
    inv = tmp_path / f"{name}.py"
    inv.write_text(text)
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [x for x in err.splitlines() if x.strip().startswith("error")]
    assert len(errors) == 1, err
    assert f"<inventory>: {inv}:{line}: " in errors[0] and phrase in errors[0], errors[0]
    if name != "sys-exit":
        assert f"python3 {inv}" in errors[0]  # what would make it valid: it must run as plain Python


def _inventory_text(tmp_path, text):
    inv = tmp_path / "inv_text.py"
    cluster = {"name": "t", "model": {"path": "/models/m"}}
    inv.write_text(text + f"\n_cluster = {cluster!r}\n")
    return inv


def test_loader_reports_a_host_missing_from_the_all_group(tmp_path, capsys):
    inv = _inventory_text(tmp_path, "gpu = [('g1', {'pdkit_node': {}}), ('g2', {'pdkit_node': {}})]\nall = (['g1'], {})")
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "error   g2: gpu: host is in group 'gpu' but not in the `all` group" in err and "add 'g2' to all" in err, err


def test_loader_reports_a_host_in_a_group_pyinfra_ignores(tmp_path, capsys):
    inv = _inventory_text(tmp_path, "_gpu = [('g1', {'pdkit_node': {}})]\nrouters = [('r1', {'pdkit_router': {}})]")
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "error   g1: _gpu: pyinfra ignores the variable '_gpu'" in err and "without a leading '_'" in err, err


def test_loader_reports_a_section_given_in_two_groups(tmp_path, capsys):
    inv = _inventory_text(tmp_path, "a = [('g1', {'pdkit_router': {'port': 8000}})]\nb = [('g1', {'pdkit_router': {'port': 8100}})]")
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "error   g1: pdkit_router: given in group 'a' and again in group 'b'" in err and "give pdkit_router once" in err, err


def test_missing_inventory_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.py")]) == 2
    assert "no such inventory file" in capsys.readouterr().err


@pytest.mark.parametrize("inventory", ["inventories/cluster.py", "inventories/a6000.py", "inventories/h200-nspawn-pair.py", "inventories/nspawn-pair-rehearsal.py"])
def test_example_inventories_validate_without_opening_a_connection(inventory, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError(f"validate opened a network connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.chdir(REPO)
    assert main(["validate", inventory]) == 0
    out = capsys.readouterr().out
    assert "no host was contacted" in out


def test_cluster_summary_shows_the_seed_layout(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["validate", "inventories/cluster.py"]) == 0
    out = capsys.readouterr().out
    assert "prefill    prefill  GPUs 0,1,2,3, TP4, NUMA 0, port 30000, bootstrap 8998" in out
    assert "decode     decode   GPUs 4,5,6,7, TP4, NUMA 1, port 30001, decode graphs <= bs 64" in out
    assert "smg 1.13.0" in out


def test_the_summary_and_the_port_check_know_when_grafana_is_off(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["validate", "inventories/cluster.py"]) == 0
    out = capsys.readouterr().out
    assert "every 15s, Grafana :3000" in out
    # the example declares no receiver: the summary says where alerts go, i.e. nowhere
    assert "Alertmanager :9093, receivers: none: alerts reach no one" in out
    # the lab's monitoring host runs no Grafana
    monkeypatch.setenv("PDKIT_LAB_DIR", str(REPO / "build" / "no-lab-here"))
    assert main(["validate", "inventories/lab.py"]) == 0
    out = capsys.readouterr().out
    assert "every 10s, no Grafana (pdkit_monitoring.grafana: false)" in out and "Grafana :3000" not in out
    assert "Alertmanager :9093, receivers: lab-sink (webhook)" in out


def test_grafanas_port_is_free_for_another_service_when_grafana_is_off(monkeypatch):
    from pdkit.inventory.loader import load
    from pdkit.spec.addresses import host_ports

    monkeypatch.chdir(REPO)
    spec = load("inventories/cluster.py")
    mon = next(h for h in spec.hosts if h.monitoring is not None)
    assert mon.monitoring.grafana
    assert (mon.monitoring.grafana_port, "pdkit_monitoring.grafana_port") in host_ports(spec, mon)
    off = mon.model_copy(update={"monitoring": mon.monitoring.model_copy(update={"grafana": False})})
    assert all(field != "pdkit_monitoring.grafana_port" for _, field in host_ports(spec, off))


def test_group_data_precedence_is_pyinfras(tmp_path, base):
    """Host data beats group data beats `all` — as pyinfra itself resolves it."""
    cluster, hosts = base
    (tmp_path / "group_data").mkdir()
    # group_data/gpu_nodes.py sets a router port; gpu01's own host data must still win
    (tmp_path / "group_data" / "gpu_nodes.py").write_text("pdkit_router = {'port': 8100, 'workers': ['gpu02/prefill', 'gpu02/decode']}\n")
    hosts["gpu01"]["pdkit_router"] = {"port": 8200, "workers": ["gpu01/prefill", "gpu01/decode"]}
    inv = write_inventory(tmp_path, hosts, cluster)
    spec, problems = load_with_problems(inv, cwd=str(tmp_path))
    assert spec is not None, problems
    assert spec.host("gpu01").router.port == 8200
    # gpu02 is in gpu_nodes too, so it picks up the group's router
    assert spec.host("gpu02").router.port == 8100


def test_readme_field_table_is_generated_from_the_models():
    from pdkit.inventory.fieldtable import markdown

    readme = (REPO / "README.md").read_text()
    assert markdown() in readme, "README.md's field table is stale: regenerate with `python -m pdkit.inventory.fieldtable`"


def test_every_model_field_has_a_one_line_comment():
    from pdkit.inventory.fieldtable import SECTIONS, field_comments

    missing = [f"{model.__name__}.{name}" for _, model in SECTIONS for name in model.model_fields if not field_comments(model).get(name)]
    assert not missing, f"fields without a comment above them: {missing}"


def test_nvidia_stack_provided_skips_the_node_layer_and_nothing_else(base, tmp_path):
    """Issue 22: a container bound to its host's driver (gpu/nspawn) cannot apt-install R580/CUDA/NCCL."""
    import copy

    from pdkit.inventory.loader import load
    from roles.node import installs_nvidia_stack
    from tests.conftest import write_inventory

    cluster, hosts = base
    tmp = tmp_path
    spec = load(str(write_inventory(tmp, hosts, cluster)))
    nvidia = [h for h in spec.hosts if h.node is not None and h.node.gpu == "nvidia"]
    assert nvidia and all(installs_nvidia_stack(h.node) for h in nvidia)
    provided = copy.deepcopy(hosts)
    for data in provided.values():
        if "pdkit_node" in data:
            data["pdkit_node"]["nvidia_stack"] = "provided"
    spec2 = load(str(write_inventory(tmp, provided, cluster, name="provided")))
    assert not any(installs_nvidia_stack(h.node) for h in spec2.hosts)
    bad = copy.deepcopy(hosts)
    next(d for d in bad.values() if "pdkit_node" in d)["pdkit_node"]["nvidia_stack"] = "bring-your-own"
    with pytest.raises(Exception, match="nvidia_stack"):
        load(str(write_inventory(tmp, bad, cluster, name="bad")))


def _cross_host_over(devices):
    """gpu01's router pairs both nodes' engines, each node's UCX devices set to DEVICES."""
    def mutate(c, h):
        _cross_host(h)
        for name, dev in zip(("gpu01", "gpu02"), devices):
            h[name]["pdkit_node"]["ucx_net_devices"] = dev
    return mutate


# Issue 33: PD pairs across hosts whose UCX devices are not RDMA move KV over TCP sockets: a warning
KV_OVER_TCP_CASES = [
    ("router-pairs-across-hosts-over-ethernet", _cross_host_over(("eth0", "eth0")), "gpu02", "pdkit_node.ucx_net_devices",
     "'eth0' is not an RDMA device: KV moves over TCP"),
    ("one-node-over-ethernet-the-other-rdma", _cross_host_over(("mlx5_0:1", "ens1f0np0")), "gpu02", "pdkit_node.ucx_net_devices",
     "Valid: an RDMA device such as 'mlx5_0:1', or prefill and decode on one host"),
    ("pd-group-across-hosts-over-a-veth", lambda c, h: [_engine(h, "gpu02", i).update(pd_group="default") for i in (0, 1)] and
     h["gpu01"]["pdkit_node"].update(ucx_net_devices="host0") or h["gpu02"]["pdkit_node"].update(ucx_net_devices="host0"),
     "gpu01", "pdkit_node.ucx_net_devices", "PD group 'default' pairs prefill and decode across hosts"),
]


@pytest.mark.parametrize("case", KV_OVER_TCP_CASES, ids=[c[0] for c in KV_OVER_TCP_CASES])
def test_kv_across_hosts_over_tcp_warns(case, base, tmp_path, capsys):
    test_ignored_setting_warns_and_fails_under_strict(case, base, tmp_path, capsys)


def test_kv_across_hosts_over_rdma_does_not_warn(base, tmp_path, capsys):
    cluster, hosts = base
    _cross_host(hosts)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err
    assert "KV moves over TCP" not in capsys.readouterr().out


@pytest.mark.parametrize("page", [None, 64])
def test_chunked_prefill_off_is_valid(page, tmp_path, capsys):
    """-1 is SGLang's documented "chunked prefill off" (0.5.17 server_args.py, 0.5.23
    arg_groups/fields/schedule.py), not a size: accepted, never judged against the page size."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 0).update(tuning={"chunked_prefill_size": -1, **({"page_size": page} if page else {})})
    if page:
        _engine(hosts, "gpu01", 1).update(tuning={"page_size": page})
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err


def test_the_sim_prefills_in_one_pass_with_chunking_off():
    from pdkit.sim.stepmodel import prefill_passes

    assert prefill_passes(10_000, -1) == 1 and prefill_passes(10_000, 4096) == 3



@pytest.mark.parametrize("match, phrase", [
    ({"alertname": "PdkitEngineWedgde"}, "did you mean 'PdkitEngineWedged'?"),
    ({"severity": "page"}, "valid: critical, warning"),
])
def test_an_alert_route_that_can_never_match_warns(match, phrase, tmp_path, capsys):
    """Issue 46: a route on an alert name no rule has (or a severity none sets) pages no one, silently."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    hosts["mon01"]["pdkit_monitoring"]["alerting"]["routes"] = [{"match": match, "receiver": "oncall"}]
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "warning mon01: pdkit_monitoring.alerting.routes[0].match" in out and phrase in out, out
    assert main(["validate", "--strict", str(inv)]) == 2


def test_an_alert_route_on_a_real_alert_is_quiet(tmp_path, capsys):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    hosts["mon01"]["pdkit_monitoring"]["alerting"]["routes"] = [
        {"match": {"alertname": "PdkitEngineWedged"}, "receiver": "oncall"}, {"match": {"severity": "critical"}, "receiver": "oncall"}]
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("prefill, decode, expect", [
    # flashmla on the prefill snaps its page to 64 (overrides.py _mla_backend_page_constraints); the decode says 1
    ({"attention_backend": "flashmla"}, {"page_size": 1}, "error"),
    ({"attention_backend": "flashmla"}, {"page_size": 64}, None),
    ({"attention_backend": "flashmla", "page_size": 16}, {"attention_backend": "flashmla"}, None),  # both snapped
    # one snapped, the other left to SGLang's default for its backend: it may differ
    ({"attention_backend": "flashmla"}, {}, "warning"),
])
def test_a_pd_pair_agrees_on_the_page_size_sglang_really_runs(prefill, decode, expect, tmp_path, capsys):
    """Issue 46: the page size an attention backend forces (SGLang snaps it before start) decides whether
    a PD pair agrees, not only what page_size says."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 0).update(tuning=prefill)
    _engine(hosts, "gpu01", 1).update(tuning={**decode, "cuda_graph_max_bs": 32})
    inv = write_inventory(tmp_path, hosts, cluster)
    rc = main(["validate", str(inv)])
    out, err = capsys.readouterr()
    field = "gpu01: pdkit_node.engines[1].tuning.page_size"
    if expect == "error":
        assert rc == 2 and f"error   {field}" in err and "attention_backend flashmla snaps it to 64" in err, err
    elif expect == "warning":
        assert rc == 0 and f"warning {field}" in out and "set page_size to the snapped value on both" in out, out
    else:
        assert rc == 0 and field not in out + err, out + err


def test_0_5_23s_tokenspeed_alias_is_judged_as_the_backend_it_becomes(tmp_path, capsys):
    """0.5.23 renames tokenspeed_mla to cutedsl_mla before its checks (serving_hook.py handle_deprecated_args),
    which refuses SM12x: on an RTX PRO 6000 node validate refuses it and says the name is deprecated
    (pdkit.upstream.startchecks.derivation_problems through pdkit.render.argvcheck)."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["sglang_version"] = "0.5.23"
    node = hosts["gpu01"]["pdkit_node"]
    node["gpus"] = {**node["gpus"], "model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "compute_capability": "12.0",
                    "memory_gib": 96}
    node["engines"][1]["tuning"] = {"attention_backend": "tokenspeed_mla", "kv_cache_dtype": "fp8_e4m3"}
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "pdkit_node.engines[1].tuning.attention_backend" in err and "runs as cutedsl_mla" in err
    assert "refuses compute capability 12.x" in err
