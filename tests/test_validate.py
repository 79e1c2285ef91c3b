"""`pdkit validate`: good inventories pass, every bad one names the host and the field."""

from __future__ import annotations

import copy
import socket

import pytest

from pdkit.cli import main
from pdkit.loader import load_with_problems
from tests.conftest import REPO, write_inventory


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
    ("topk1-draft-tokens", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 3}}), "gpu01", "pdkit_node.engines[1].tuning.speculative", "num_steps + 1"),
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
    ("attention-backend-typo", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"attention_backend": "flashinfr"}), "gpu01", "pdkit_node.engines[1].tuning.attention_backend", "valid: triton"),
    ("kv-dtype-gone-in-0523", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"kv_cache_dtype": "fp4_e2m1"}), "gpu02", "pdkit_node.engines[1].tuning.kv_cache_dtype", "0.5.23"),
    ("uno-needs-0523", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "UNO"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative.algorithm", "SGLang 0.5.17 has no algorithm"),
    ("transfer-backend-typo", lambda c, h: c.update(transfer_backend="nixel"), "gpu01", "pdkit_cluster.transfer_backend", "'nixl'"),
    ("port-out-of-range", lambda c, h: _engine(h, "gpu02", 1).update(port=70000), "gpu02", "pdkit_node.engines[1].port", "65535"),
    ("compute-capability-format", lambda c, h: h["gpu01"]["pdkit_node"]["gpus"].update(compute_capability="sm120"), "gpu01", "pdkit_node.gpus.compute_capability", "'12.0'"),
    ("duplicate-engine-name", lambda c, h: _engine(h, "gpu02", 1).update(name="prefill"), "gpu02", "pdkit_node.engines[1].name", "unique"),
    ("unified-and-pd-behind-one-router", lambda c, h: _engine(h, "gpu02", 0).update(role="unified", pd_group="default") or _engine(h, "gpu02", 1).update(role="unified", pd_group="default") or h["gpu01"]["pdkit_router"].update(workers=["gpu01/prefill", "gpu01/decode", "gpu02/prefill"]), "gpu01", "pdkit_router.workers", "either in PD mode"),
    ("two-monitoring-hosts", lambda c, h: h["gpu02"].update(pdkit_monitoring={"prometheus_port": 9091}), "mon01", "pdkit_monitoring", "only one monitoring host"),
]


def test_the_base_inventory_is_valid(base, tmp_path, capsys):
    """Every bad case is the base plus one mistake, so the base itself must pass."""
    cluster, hosts = base
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize("case", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_inventory_names_host_and_field(case, base, tmp_path, capsys):
    _, mutate, host, field, phrase = case
    cluster, hosts = base
    if mutate is None:
        cluster = None
    else:
        mutate(cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)

    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    matching = [line for line in err.splitlines() if line.strip().startswith("error") and f"{host}: {field}" in line]
    assert matching, f"no error names {host}: {field}; got:\n{err}"
    assert any(phrase in line for line in matching), f"expected {phrase!r} in:\n" + "\n".join(matching)


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


def test_graph_max_bs_above_max_running_is_a_warning_not_an_error(base, tmp_path, capsys):
    cluster, hosts = base
    cluster["tuning"]["decode"].update(max_running_requests=24, cuda_graph_max_bs=32)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0
    out = capsys.readouterr().out
    assert "warning gpu01: pdkit_node.engines[1].tuning.cuda_graph_max_bs" in out
    assert "clamps" in out


def test_broken_python_in_inventory_is_reported_without_traceback(tmp_path, capsys):
    inv = tmp_path / "broken.py"
    inv.write_text("gpu_nodes = [('a', {})\n")
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "pyinfra could not load it" in err and "Traceback" not in err


def test_missing_inventory_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.py")]) == 2
    assert "no such inventory file" in capsys.readouterr().err


@pytest.mark.parametrize("inventory", ["inventories/cluster.py", "inventories/a6000.py"])
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
    from pdkit.fieldtable import markdown

    readme = (REPO / "README.md").read_text()
    assert markdown() in readme, "README.md's field table is stale: regenerate with `python -m pdkit.fieldtable`"


def test_every_model_field_has_a_one_line_comment():
    from pdkit.fieldtable import SECTIONS, field_comments

    missing = [f"{model.__name__}.{name}" for _, model in SECTIONS for name in model.model_fields if not field_comments(model).get(name)]
    assert not missing, f"fields without a comment above them: {missing}"
