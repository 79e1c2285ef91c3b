"""Spec -> Prometheus config, alert rules, promtool rule tests, Grafana provisioning and dashboards.

The promtool tests run Debian's `promtool` (package `prometheus`, installed by
.ci/monitoring-prereqs.sh) on the generated files: `check config`, `check rules`, `test rules`.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pdkit.inventory.loader import load
from pdkit.monitoring import monitoring_files
from pdkit.monitoring.alertrules import ALERT_NAMES
from pdkit.monitoring.alertrules.engines import ENGINE_DOWN_FOR, graph_expected_instances, wedge_window
from pdkit.monitoring.common import (
    DATASOURCE,
    DATASOURCE_UID,
    GRAFANA_DASHBOARDS_DIR,
    GRAFANA_DATASOURCE_PATH,
    GRAFANA_PROVIDER_PATH,
    PROMETHEUS_CONFIG_PATH,
    RULE_TESTS_PATH,
    RULES_PATH,
    RULES_RELATIVE_PATH,
    _duration_s,
    _scaled,
    to_yaml,
)
from pdkit.monitoring.dashboards import all_promql, dashboard_files, dashboards
from pdkit.monitoring.grafana import grafana_provisioning
from pdkit.monitoring.rules import RUNBOOKS, alert_conditions, alert_rules, alerts, rule_tests
from pdkit.monitoring.scrape import prometheus_config, targets
from pdkit.render import flags
from pdkit.spec import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT
from pdkit.upstream.metricnames import DCGM, EXPORTER, NODE
from tests.conftest import REPO, require, write_inventory

PROMTOOL = shutil.which("promtool")
PROMTOOL_REASON = ("promtool is missing: install Debian's `prometheus` package "
                   "(sudo .ci/monitoring-prereqs.sh, or apt-get install prometheus)")


def _load_example(name: str):
    old = os.getcwd()
    os.chdir(REPO)
    try:
        return load(f"inventories/{name}.py")
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def lab_spec():
    return _load_example("lab")


@pytest.fixture(scope="module")
def cluster_spec():
    return _load_example("cluster")


@pytest.fixture(scope="module")
def multinode_spec():
    return _load_example("multinode")


# multinode: a decode spanning two nodes (the rank alert)
@pytest.fixture(params=["lab", "cluster", "multinode"])
def example(request, lab_spec, cluster_spec, multinode_spec):
    return {"lab": lab_spec, "cluster": cluster_spec, "multinode": multinode_spec}[request.param]


def _spec(tmp_path, cluster, hosts):
    return load(write_inventory(tmp_path, hosts, cluster))


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    require(PROMTOOL is not None, PROMTOOL_REASON)
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _write_monitoring_dir(spec, directory: Path) -> Path:
    """prometheus.yml and its rules laid out as on the host (rules/ beside the config)."""
    (directory / "rules").mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(prometheus_config(spec))
    (directory / RULES_RELATIVE_PATH).write_text(alert_rules(spec))
    (directory / "rules" / Path(RULE_TESTS_PATH).name).write_text(rule_tests(spec))
    return directory


def _unified(base):
    cluster, hosts = base
    for h in ("gpu01", "gpu02"):
        for e in hosts[h]["pdkit_node"]["engines"]:
            e["role"] = "unified"
            e.pop("pd_group", None)
    hosts["gpu01"]["pdkit_router"] = {}
    return cluster, hosts


# ---------------------------------------------------------------------------
# promtool on the generated files


def test_prometheus_config_passes_promtool_check_config(example, tmp_path):
    d = _write_monitoring_dir(example, tmp_path)
    res = _promtool("check", "config", "prometheus.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr
    # check config follows rule_files: it really found and checked the rules file
    assert "1 rule files found" in res.stdout + res.stderr


def test_alert_rules_pass_promtool_check_rules(example, tmp_path):
    d = _write_monitoring_dir(example, tmp_path)
    res = _promtool("check", "rules", RULES_RELATIVE_PATH, cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(alerts(example))} rules found" in res.stdout


def test_every_alert_passes_its_promtool_unit_tests(example, tmp_path):
    d = _write_monitoring_dir(example, tmp_path)
    res = _promtool("test", "rules", f"rules/{Path(RULE_TESTS_PATH).name}", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_firing_and_quiet_cases(example):
    doc = yaml.safe_load(rule_tests(example))
    firing: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for case in doc["tests"]:
        for check in case["alert_rule_test"]:
            bucket = firing if check["exp_alerts"] else quiet
            bucket[check["alertname"]] = bucket.get(check["alertname"], 0) + 1
    names = [a.name for a in alerts(example)]
    for name in names:
        assert firing.get(name, 0) >= 1, f"{name} has no firing case"
        assert quiet.get(name, 0) >= 1, f"{name} has no non-firing case"


def test_rule_tests_catch_a_wrong_expectation(lab_spec, tmp_path):
    """The promtool cases really compare labels and data: a flipped severity or a quiet series fails."""
    d = _write_monitoring_dir(lab_spec, tmp_path)
    text = (d / "rules" / "pdkit.test.yml").read_text()
    for broken in (text.replace('severity: critical', 'severity: warning', 1),
                   text.replace('values: 1x3 0x20', 'values: 1x25', 1)):
        assert broken != text
        (d / "rules" / "broken.test.yml").write_text(broken)
        res = _promtool("test", "rules", "rules/broken.test.yml", cwd=d)
        assert res.returncode != 0, "promtool accepted a broken expectation"


def test_every_panel_and_alert_query_parses_in_promtool(example, tmp_path):
    """Each all_promql() expression (variables substituted) and alert condition, as a recording rule."""
    exprs = all_promql(example) + alert_conditions(example)
    rules = [{"record": f"pdkit:check_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)]
    (tmp_path / "check.yml").write_text(to_yaml({"groups": [{"name": "check", "rules": rules}]}))
    res = _promtool("check", "rules", "check.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(rules)} rules found" in res.stdout


def test_unified_cluster_passes_promtool(base, tmp_path):
    spec = _spec(tmp_path, *_unified(base))
    assert not spec.is_pd()
    d = _write_monitoring_dir(spec, tmp_path / "mon")
    names = {a.name for a in alerts(spec)}
    assert "PdkitKvTransferFailures" not in names and "PdkitBootstrapFailures" not in names
    for args in (("check", "config", "prometheus.yml"), ("test", "rules", "rules/pdkit.test.yml")):
        res = _promtool(*args, cwd=d)
        assert res.returncode == 0, res.stdout + res.stderr


def test_short_scrape_interval_keeps_the_timeout_inside_it(base, tmp_path):
    cluster, hosts = base
    hosts["mon01"]["pdkit_monitoring"] = {"scrape_interval_s": 5}
    spec = _spec(tmp_path, cluster, hosts)
    doc = yaml.safe_load(prometheus_config(spec))
    assert doc["global"]["scrape_interval"] == "5s" and doc["global"]["scrape_timeout"] == "5s"
    d = _write_monitoring_dir(spec, tmp_path / "mon")
    res = _promtool("check", "config", "prometheus.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------------------
# Targets and labels


def _configs(spec):
    doc = yaml.safe_load(prometheus_config(spec))
    return doc, {c["job_name"]: c for c in doc["scrape_configs"]}


def _targets(job_config):
    return {sc["targets"][0]: sc["labels"] for sc in job_config["static_configs"]}


def test_targets_come_from_the_spec(lab_spec):
    doc, jobs = _configs(lab_spec)
    # the lab inventory's own interval (inventories/lab.py; the default is 15 s)
    assert doc["global"]["scrape_interval"] == "10s"
    assert doc["global"]["evaluation_interval"] == "10s"
    assert doc["rule_files"] == [RULES_RELATIVE_PATH]
    assert PROMETHEUS_CONFIG_PATH.rsplit("/", 1)[0] + "/" + RULES_RELATIVE_PATH == RULES_PATH

    engines = _targets(jobs["sglang"])
    assert len(engines) == len(lab_spec.engines())
    for host, engine in lab_spec.engines():
        labels = engines[f"{lab_spec.engine_address(host)}:{engine.port}"]
        assert labels == {"cluster": "lab", "node": host.name, "engine": engine.name, "role": engine.role,
                          "instance": f"{host.name}/{engine.name}", "pd_group": engine.pd_group}

    router_host = lab_spec.router_hosts[0]
    routers = _targets(jobs["router"])
    assert list(routers) == [f"{flags.router_address(router_host)}:{router_host.router.prometheus_port}"]
    assert routers[next(iter(routers))]["role"] == "router"

    exporters = _targets(jobs["pdkit-exporter"])
    assert jobs["pdkit-exporter"]["honor_labels"] is True
    assert set(exporters) == {f"{lab_spec.engine_address(h)}:{h.node.exporter_port}" for h in lab_spec.gpu_hosts}

    nodes = _targets(jobs["node"])
    assert set(nodes) == {f"{h.address}:{NODE_EXPORTER_PORT}" for h in lab_spec.hosts}
    assert {labels["node"] for labels in nodes.values()} == {h.name for h in lab_spec.hosts}

    # lab hosts are gpu: none: no DCGM
    assert "dcgm" not in jobs
    mon_host = lab_spec.monitoring_hosts[0]
    assert list(_targets(jobs["prometheus"])) == [f"{mon_host.address}:{mon_host.monitoring.prometheus_port}"]

    # every target carries cluster and node
    for job in jobs.values():
        for labels in _targets(job).values():
            assert labels["cluster"] == "lab" and labels["node"]


def test_the_jobs_are_named_and_ordered_as_dashboards_and_queries_expect(cluster_spec, lab_spec):
    """The `job` label is what every panel, rule and hand-written query selects by: its values are pinned here
    as text, in prometheus.yml's order (targets' order, a job without targets left out)."""
    assert list(_configs(cluster_spec)[1]) == ["sglang", "router", "pdkit-exporter", "node", "dcgm", "prometheus"]
    assert list(_configs(lab_spec)[1]) == ["sglang", "router", "pdkit-exporter", "node", "prometheus"]
    # a host job's target is the host itself
    for t in targets(cluster_spec):
        assert (t.labels["instance"] == t.host) == (t.job not in ("sglang", "router")), t


def test_targets_match_targets_function(example):
    _, jobs = _configs(example)
    listed = sorted((t.job, t.address) for t in targets(example))
    in_config = sorted((job, addr) for job, c in jobs.items() for addr in _targets(c))
    assert listed == in_config


def test_dcgm_on_real_nvidia_nodes_on_its_own_port(cluster_spec):
    _, jobs = _configs(cluster_spec)
    dcgm = _targets(jobs["dcgm"])
    assert set(dcgm) == {f"{cluster_spec.engine_address(h)}:{DCGM_EXPORTER_PORT}" for h in cluster_spec.gpu_hosts}
    # pdkit-exporter holds DCGM's own default port
    assert all(h.node.exporter_port != DCGM_EXPORTER_PORT for h in cluster_spec.gpu_hosts)


def test_router_workers_are_named_by_their_engine(lab_spec):
    _, jobs = _configs(lab_spec)
    relabels = jobs["router"]["metric_relabel_configs"]
    router_host = lab_spec.router_hosts[0]
    for host, engine in lab_spec.router_workers(router_host):
        url = flags.engine_url(lab_spec, host, engine)
        hits = {r["target_label"]: r["replacement"] for r in relabels if re.fullmatch(r["regex"], url)}
        assert hits == {"worker_instance": f"{host.name}/{engine.name}", "worker_role": engine.role}
        # a different port on the same host does not match
        assert not any(re.fullmatch(r["regex"], url + "0") for r in relabels)


def test_scrape_hosts_limits_every_job(base, tmp_path):
    cluster, hosts = base
    hosts["mon01"]["pdkit_monitoring"] = {"scrape_hosts": ["gpu01", "mon01"]}
    spec = _spec(tmp_path, cluster, hosts)
    assert {t.host for t in targets(spec)} == {"gpu01", "mon01"}


def test_output_is_deterministic(example):
    for fn in (prometheus_config, alert_rules, rule_tests, grafana_provisioning,
               dashboard_files, all_promql):
        assert fn(example) == fn(example)


def test_monitoring_files_land_where_the_roles_expect(cluster_spec, lab_spec):
    files = monitoring_files(cluster_spec)
    assert PROMETHEUS_CONFIG_PATH in files and RULES_PATH in files and RULE_TESTS_PATH in files
    assert GRAFANA_DATASOURCE_PATH in files and GRAFANA_PROVIDER_PATH in files
    dash = [p for p in files if p.startswith(GRAFANA_DASHBOARDS_DIR + "/")]
    assert sorted(dash) == sorted(f"{GRAFANA_DASHBOARDS_DIR}/pdkit-{n}.json" for n in dashboards(cluster_spec))
    for p in dash:
        json.loads(files[p])
    # the lab turns Grafana off (its repository is unreachable there): Prometheus files only
    lab_files = monitoring_files(lab_spec)
    assert PROMETHEUS_CONFIG_PATH in lab_files
    assert not [p for p in lab_files if "grafana" in p]


def test_no_monitoring_host_is_an_error(base, tmp_path):
    cluster, hosts = base
    del hosts["mon01"]
    spec = _spec(tmp_path, cluster, hosts)
    with pytest.raises(ValueError, match="pdkit_monitoring"):
        prometheus_config(spec)


# ---------------------------------------------------------------------------
# Alerts follow the spec


def test_alert_set_and_annotations(example):
    names = {a.name for a in alerts(example)}
    assert {"PdkitEngineDown", "PdkitRouterWorkerUnhealthy", "PdkitQueueGrowing", "PdkitKvTransferFailures",
            "PdkitBootstrapFailures", "PdkitDecodeCudaGraphRatioLow", "PdkitTtftP99OverSlo", "PdkitConfigDrift",
            "PdkitNcclEnvMissing"} <= names
    doc = yaml.safe_load(alert_rules(example))
    for rule in doc["groups"][0]["rules"]:
        assert rule["for"] and rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
        # what to do is written once, in the record's runbook: the description is the spec's lead and then the
        # runbook's steps, each {label} a template of the alert's label
        lead, todo = rule["annotations"]["description"].split("\nWhat to do:\n")
        assert lead and "What to do" not in lead, rule["alert"]
        steps = RUNBOOKS[rule["alert"]].run
        assert todo.splitlines() == [f"{i}. " + re.sub(r"\{(\w+)\}", r"{{ $labels.\1 }}", step)
                                     for i, step in enumerate(steps, 1)], rule["alert"]


def test_ttft_alert_uses_the_spec_slo(base, tmp_path):
    cluster, hosts = base
    hosts["mon01"]["pdkit_monitoring"] = {"ttft_p99_slo_s": 0.75}
    spec = _spec(tmp_path, cluster, hosts)
    ttft = next(a for a in alerts(spec) if a.name == "PdkitTtftP99OverSlo")
    assert ttft.expr.endswith("> 0.75") and "sglang:time_to_first_token_seconds_bucket" in ttft.expr
    d = _write_monitoring_dir(spec, tmp_path / "mon")
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr


def test_cuda_graph_alert_covers_only_engines_with_decode_graphs_on(base, tmp_path):
    cluster, hosts = base
    hosts["gpu02"]["pdkit_node"]["engines"][1]["tuning"] = {"cuda_graph": False}
    spec = _spec(tmp_path, cluster, hosts)
    assert graph_expected_instances(spec) == ["gpu01/decode"]
    alert = next(a for a in alerts(spec) if a.name == "PdkitDecodeCudaGraphRatioLow")
    assert 'instance=~"gpu01/decode"' in alert.expr and "gpu02" not in alert.expr

    cluster["tuning"] = {"all": {"cuda_graph": False}}
    cluster["target_concurrency"] = None
    spec = _spec(tmp_path, cluster, hosts)
    assert "PdkitDecodeCudaGraphRatioLow" not in {a.name for a in alerts(spec)}


def test_adding_a_gpu_node_adds_targets_rule_coverage_and_variables(base, tmp_path):
    cluster, hosts = base
    before = _spec(tmp_path, cluster, hosts)
    hosts2 = copy.deepcopy(hosts)
    hosts2["gpu03"] = copy.deepcopy(hosts["gpu02"])
    hosts2["gpu03"]["ssh_hostname"] = "10.9.0.4"
    for e in hosts2["gpu03"]["pdkit_node"]["engines"]:
        e["pd_group"] = "g3"
    after = _spec(tmp_path, cluster, hosts2)

    # targets: both engines, the exporter, node_exporter (and DCGM: a real nvidia node)
    new = {(t.job, t.address) for t in targets(after)} - {(t.job, t.address) for t in targets(before)}
    assert new == {("sglang", "10.9.0.4:30000"), ("sglang", "10.9.0.4:30001"),
                   ("pdkit-exporter", "10.9.0.4:9400"), ("node", "10.9.0.4:9100"),
                   ("dcgm", f"10.9.0.4:{DCGM_EXPORTER_PORT}")}

    # rules: gpu03's decode joins the CUDA-graph rule, and the promtool cases fire for gpu03's engines
    graph = next(a for a in alerts(after) if a.name == "PdkitDecodeCudaGraphRatioLow")
    assert "gpu03/decode" in graph.expr
    tests_after = yaml.safe_load(rule_tests(after))["tests"]
    fired_for = {(c["alert_rule_test"][0]["alertname"], e["exp_labels"].get("node"), e["exp_labels"].get("engine"))
                 for c in tests_after for e in c["alert_rule_test"][0]["exp_alerts"]}
    for name in ("PdkitEngineDown", "PdkitQueueGrowing", "PdkitKvTransferFailures", "PdkitBootstrapFailures",
                 "PdkitConfigDrift", "PdkitNcclEnvMissing"):
        assert (name, "gpu03", "prefill") in fired_for and (name, "gpu03", "decode") in fired_for, name
    for name in ("PdkitDecodeCudaGraphRatioLow", "PdkitTtftP99OverSlo"):
        assert (name, "gpu03", "decode") in fired_for, name
    assert ("PdkitScrapeTargetDown", "gpu03", None) in fired_for
    def n_series(tests):
        return sum(len(t["input_series"]) for t in tests)

    assert n_series(tests_after) > n_series(yaml.safe_load(rule_tests(before))["tests"])

    # dashboards: gpu03 is a value of every node variable
    for name, d in dashboards(after).items():
        node_var = next(v for v in d["templating"]["list"] if v["name"] == "node")
        assert "gpu03" in [o["value"] for o in node_var["options"]], name
        assert "gpu03" in node_var["query"].split(",")
    for d in dashboards(before).values():
        assert "gpu03" not in json.dumps(d["templating"])

    d = _write_monitoring_dir(after, tmp_path / "mon")
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------------------
# Grafana


PANEL_TYPES = {"timeseries", "stat", "table", "row"}
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__all"}


def _check_dashboard(name: str, d: dict) -> None:
    """Structural check of a Grafana dashboard (what Grafana needs to load a provisioned file)."""
    problems: list[str] = []

    def need(cond: bool, what: str) -> None:
        if not cond:
            problems.append(what)

    for key, typ in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list),
                     ("templating", dict), ("time", dict), ("tags", list), ("version", int)):
        need(isinstance(d.get(key), typ), f"{key} missing or not {typ.__name__}")
    need("id" not in d or d["id"] is None, "provisioned dashboards carry no numeric id")
    need(0 < len(d.get("uid", "")) <= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", d.get("uid", "")) is not None,
         "uid: 1-40 of [A-Za-z0-9_-]")
    need(d.get("schemaVersion", 0) >= 36, "schemaVersion >= 36 (datasource references by uid)")
    variables = d["templating"]["list"]
    var_names = [v["name"] for v in variables]
    need(len(var_names) == len(set(var_names)), "duplicate variable")
    for v in variables:
        need(v.get("type") == "custom" and isinstance(v.get("query"), str), f"variable {v.get('name')}: custom")
        values = [o["value"] for o in v.get("options", [])]
        need(values[:1] == ["$__all"] and values[1:] == v["query"].split(","), f"variable {v['name']}: options")
    ids = [p.get("id") for p in d["panels"]]
    need(all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), "panel ids: unique ints")
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        where = f"panel {p.get('id')} {p.get('title')!r}"
        need(p.get("type") in PANEL_TYPES, f"{where}: type")
        need(isinstance(p.get("title"), str) and p["title"], f"{where}: title")
        g = p.get("gridPos", {})
        need(all(isinstance(g.get(k), int) for k in "hwxy"), f"{where}: gridPos h/w/x/y ints")
        need(g.get("w", 0) >= 1 and g.get("x", 0) >= 0 and g.get("x", 0) + g.get("w", 0) <= 24, f"{where}: width")
        for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
            for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
                need((x, y) not in cells, f"{where}: overlaps another panel at {(x, y)}")
                cells.add((x, y))
        if p.get("type") == "row":
            need(p.get("panels") == [] and "targets" not in p, f"{where}: an open row holds no panels")
            continue
        need(p.get("datasource") == DATASOURCE, f"{where}: datasource by uid")
        need(isinstance(p.get("fieldConfig", {}).get("defaults"), dict), f"{where}: fieldConfig.defaults")
        need(isinstance(p.get("options"), dict), f"{where}: options")
        queries = p.get("targets", [])
        need(len(queries) >= 1, f"{where}: no targets")
        refs = [t.get("refId") for t in queries]
        need(len(refs) == len(set(refs)) and all(isinstance(r, str) and r for r in refs), f"{where}: refIds")
        for t in queries:
            need(t.get("datasource") == DATASOURCE, f"{where}: target datasource")
            expr = t.get("expr")
            need(isinstance(expr, str) and expr.strip() != "", f"{where}: expr")
            for var in re.findall(r"\$\{?(\w+)", expr or ""):
                need(var in var_names or var in BUILTIN_VARS, f"{where}: ${var} is not a dashboard variable")
            need(expr is None or expr.count("(") == expr.count(")"), f"{where}: unbalanced parentheses")
    assert not problems, f"dashboard {name}:\n" + "\n".join(problems)


def test_every_dashboard_is_valid_grafana_json(example):
    boards = dashboards(example)
    assert {"overview", "pd", "tuning", "nodes"} <= set(boards)
    uids = [d["uid"] for d in boards.values()]
    assert len(set(uids)) == len(uids)
    for name, d in boards.items():
        _check_dashboard(name, json.loads(json.dumps(d)))


def test_dashboards_show_what_the_issue_asks(lab_spec):
    boards = dashboards(lab_spec)

    def exprs(name):
        return " ".join(t["expr"] for p in boards[name]["panels"] for t in p.get("targets", []))

    overview = exprs("overview")
    for metric in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "smg_router_requests_total",
                   "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
                   "sglang:num_queue_reqs", "sglang:token_usage"):
        assert metric in overview, metric
    assert "sum by (role) (sglang:num_queue_reqs" in overview
    pd = exprs("pd")
    for metric in ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
                   "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
                   "sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_latency_ms",
                   "sglang:num_transfer_failed_reqs_total", "sglang:num_bootstrap_failed_reqs_total"):
        assert metric in pd, metric
    tuning = exprs("tuning")
    for metric in EXPORTER.values():
        assert metric in tuning, metric
    assert "sglang:cuda_graph_passes_total" in tuning
    nodes = exprs("nodes")
    assert all(m in nodes for m in NODE.values())
    # lab hosts have no DCGM: no GPU panels that could never show data
    assert not any(m in nodes for m in DCGM.values())
    # issue 43 item 5: the prefix cache's hit rate from the engines' counters (prefill and unified engines), and on
    # the PD dashboard what each hand-off carried against the KV of the uncached prompt tokens
    from pdkit.upstream.metricnames import SGLANG

    hit = next(p for p in boards["overview"]["panels"] if p["title"] == "Prefix cache hit rate")
    hit_exprs = " ".join(t["expr"] for t in hit["targets"])
    assert SGLANG["cached_tokens"] in hit_exprs and SGLANG["prompt_tokens"] in hit_exprs
    assert 'role=~"prefill|unified"' in hit_exprs and hit["fieldConfig"]["defaults"]["unit"] == "percentunit"
    kv = next(p for p in boards["pd"]["panels"] if p["title"] == "KV handed off per request vs the uncached prompt's KV")
    assert [t["legendFormat"] for t in kv["targets"]] == ["{{instance}} handed off", "{{instance}} uncached part"]
    uncached = kv["targets"][1]["expr"]
    for key in ("prompt_tokens", "cached_tokens", "kv_cache_memory", "max_total_tokens"):
        assert SGLANG[key] in uncached, key
    assert f'{SGLANG["kv_transfer_total"]}_count' in uncached and 'role="prefill"' in uncached
    # the TTFT panel draws the spec's SLO
    ttft = next(p for p in boards["overview"]["panels"] if p["title"].startswith("TTFT"))
    steps = ttft["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == lab_spec.monitoring_hosts[0].monitoring.ttft_p99_slo_s


def test_gpu_panels_where_dcgm_runs(cluster_spec):
    nodes = dashboards(cluster_spec)["nodes"]
    exprs = " ".join(t["expr"] for p in nodes["panels"] for t in p.get("targets", []))
    assert all(m in exprs for m in DCGM.values())


def test_no_pd_dashboard_without_pd_engines(base, tmp_path):
    spec = _spec(tmp_path, *_unified(base))
    assert "pd" not in dashboards(spec)
    for name, d in dashboards(spec).items():
        _check_dashboard(name, d)


def test_grafana_provisioning_points_at_the_monitoring_prometheus(example):
    files = grafana_provisioning(example)
    assert set(files) == {GRAFANA_DATASOURCE_PATH, GRAFANA_PROVIDER_PATH}
    ds = yaml.safe_load(files[GRAFANA_DATASOURCE_PATH])
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    host = example.monitoring_hosts[0]
    assert source["uid"] == DATASOURCE_UID and source["type"] == "prometheus"
    assert source["url"] == f"http://{host.address}:{host.monitoring.prometheus_port}"
    assert source["jsonData"]["timeInterval"] == f"{host.monitoring.scrape_interval_s}s"
    provider = yaml.safe_load(files[GRAFANA_PROVIDER_PATH])
    (p,) = provider["providers"]
    assert p["type"] == "file" and p["options"]["path"] == GRAFANA_DASHBOARDS_DIR


# ---------------------------------------------------------------------------
# all_promql and the YAML writer


def test_all_promql_lists_every_panel_query_and_alert(example):
    listed = all_promql(example)
    n_targets = sum(len(p.get("targets", [])) for d in dashboards(example).values() for p in d["panels"])
    assert len(listed) == n_targets + len(alerts(example))
    wheres = [w for w, _ in listed]
    assert len(wheres) == len(set(wheres))
    for where, expr in listed:
        # runnable as is against Prometheus: no Grafana variables left
        assert "$" not in expr, where
    assert {f"alert {a.name} (value)" for a in alerts(example)} <= set(wheres)
    assert [w for w, _ in alert_conditions(example)] == [f"alert {a.name}" for a in alerts(example)]


@pytest.mark.parametrize("value", [
    "plain", 'quo"te', "it's", 'both \' and "', "multi\nline", "trailing space \nx", "ends with newline\n",
    "", "true", "123", "a: b", "- dash", "#hash", "{{ $labels.node }}", "tab\there", "ünïcode",
])
def test_yaml_writer_round_trips(value):
    doc = {"k": value, "list": [value, {"inner": value}], "true": [], "n": 1.5, "b": False, "none": None}
    assert yaml.safe_load(to_yaml(doc)) == doc


_EMITTER_EDGES = [
    "plain", 'quo"te', "it's", "multi\nline", "trailing space \nx", "ends with newline\n", "", " ", "true", "123",
    "a: b", "- dash", "#hash", "{{ $labels.node }}", "tab\there", "ünïcode", "emoji \U0001F680", "x\x85y", "\n",
    "x\n\ny", "\nlead", "cr\r\nlf", "k" * 100, "k" * 127, "k" * 128, "w " * 3000,
] + [f"a{chr(i)}b" for i in range(128)] + [chr(i) for i in range(128)]


@pytest.mark.parametrize("value", _EMITTER_EDGES)
def test_libyaml_writes_what_the_python_emitter_writes(value):
    """to_yaml takes libyaml's emitter only where both write the same bytes (inputs outside that
    go through the Python emitter, as every plan did before)."""
    from pdkit.monitoring import common

    for doc in ({"k": value, "list": [value, {"inner": value}], "n": 1.5, "b": False, "none": None},
                {value: 1, "shared": [{"a": value}] * 2}):
        assert to_yaml(doc) == common.to_yaml(doc, dumper=common._Dumper)


@pytest.mark.parametrize("name", ["lab", "cluster", "multinode"])
def test_monitoring_files_are_the_python_emitters_bytes_and_take_libyaml(name, monkeypatch):
    from pdkit.monitoring import common

    spec = _load_example(name)
    fast = monitoring_files(spec)
    fast_tests = rule_tests(spec)
    monkeypatch.setattr(common, "_FAST_DUMPER", None)
    assert monitoring_files(spec) == fast
    assert rule_tests(spec) == fast_tests
    if yaml.__with_libyaml__:
        # the speed is real: the documents pdkit writes are inside what libyaml may write
        prometheus = yaml.safe_load(fast[PROMETHEUS_CONFIG_PATH])
        assert common._libyaml_agrees(prometheus) and common._libyaml_agrees(yaml.safe_load(fast_tests))


# ---------------------------------------------------------------------------
# PD failure alerts per SGLang version (0.5.17 exports no failure counters: the router's view stands in)


def _failure_alerts(spec):
    return {a.name: a for a in alerts(spec) if a.name in
            ("PdkitKvTransferFailures", "PdkitBootstrapFailures", "PdkitPdRequestFailures")}


def test_failure_alerts_are_one_form_for_every_release(base, tmp_path):
    """The catalogue: both releases export the failure counters (created on their first increment), so
    0.5.17 and mixed clusters get the same engine-side alerts as 0.5.23, and no router stand-in."""
    cluster, hosts = base
    exprs = []
    for versions in (("0.5.17", "0.5.17"), ("0.5.17", "0.5.23")):
        for host, version in zip(("gpu01", "gpu02"), versions):
            for e in hosts[host]["pdkit_node"]["engines"]:
                e["sglang_version"] = version
        (tmp_path / "-".join(versions)).mkdir()
        spec = _spec(tmp_path / "-".join(versions), cluster, hosts)
        failures = _failure_alerts(spec)
        assert set(failures) == {"PdkitKvTransferFailures", "PdkitBootstrapFailures"}
        for a in failures.values():
            assert {s["instance"] for s in a.subjects} == {"gpu01/prefill", "gpu01/decode", "gpu02/prefill",
                                                          "gpu02/decode"}
            assert "offset" in a.expr  # the first failure of a fresh series
        exprs.append({n: a.expr for n, a in failures.items()})
        d = _write_monitoring_dir(spec, tmp_path / "mon" / "-".join(versions))
        res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
        assert res.returncode == 0, res.stdout + res.stderr
    assert exprs[0] == exprs[1]


def test_a_0523_cluster_keeps_the_engine_counters(example):
    assert "PdkitPdRequestFailures" not in _failure_alerts(example)


def test_the_docs_alert_table_is_generated_from_the_alerts():
    """docs/monitoring.md carries exactly the table pdkit.contract.alerttable writes, and it names every
    alert the rules can declare (ALERT_NAMES: the example cluster declares all but the spanning engine's
    own, which the multinode example adds)."""
    from pdkit.contract import alerttable

    doc = (REPO / "docs" / "monitoring.md").read_text()
    table = alerttable.table()
    assert table in doc, "docs/monitoring.md's alert table is stale: python -m pdkit.contract.alerttable --write docs/monitoring.md"
    assert alerttable.runbooks() in doc, "docs/monitoring.md's runbooks are stale: python -m pdkit.contract.alerttable --write docs/monitoring.md"
    for name in ALERT_NAMES:
        assert f"| [`{name}`](#{name.lower()}) |" in table, name
        assert f"\n### {name}\n" in doc, name
    cluster = [a.name for a in alerts(_load_example("cluster"))]
    multinode = [a.name for a in alerts(_load_example("multinode"))]
    assert cluster == [n for n in ALERT_NAMES if n != "PdkitEngineRankDown"]
    assert multinode == list(ALERT_NAMES)


def test_the_alert_table_check_can_fail():
    from pdkit.contract import alerttable

    lab, multinode = _load_example("lab"), _load_example("multinode")
    assert "PdkitEngineWedged" in alerttable.markdown(lab, multinode)
    a6000 = _load_example("a6000")  # no PD pair: no failure alerts, so not the whole table
    with pytest.raises(ValueError, match="PdkitKvTransferFailures"):
        alerttable.markdown(a6000)
    # no engine spanning nodes: no rank alert, so not the whole table either
    with pytest.raises(ValueError, match="PdkitEngineRankDown"):
        alerttable.markdown(_load_example("cluster"))


# ---------------------------------------------------------------------------
# A rank of an engine spanning nodes down (pdkit-exporter's pdkit_engine_rank_up)


def _spanning(base, nodes=("gpu01", "gpu02", "gpu03")):
    """gpu01's decode spans NODES (2 GPUs each, TP = 2 x nodes); gpu03 is a copy of gpu02; the nodes
    after the first run no engine of their own."""
    cluster, hosts = base
    hosts["gpu03"] = copy.deepcopy(hosts["gpu02"])
    hosts["gpu03"]["ssh_hostname"] = "10.9.0.4"
    for name in nodes[1:]:
        hosts[name]["pdkit_node"]["engines"] = []
    hosts["gpu01"]["pdkit_node"]["engines"][1].update(nodes=list(nodes), dist_init_port=25000, tp=2 * len(nodes))
    for name in nodes:
        hosts[name]["pdkit_node"].update(nic="eth0", nccl_net="socket", ucx_net_devices="eth0")
    return cluster, hosts


def _rank_down(spec):
    return next((a for a in alerts(spec) if a.name == "PdkitEngineRankDown"), None)


def test_rank_down_alert_only_for_an_engine_spanning_nodes(base, tmp_path, cluster_spec, lab_spec):
    assert _rank_down(_spec(tmp_path, *copy.deepcopy(base))) is None
    assert _rank_down(cluster_spec) is None and _rank_down(lab_spec) is None
    spec = _spec(tmp_path, *_spanning(base))
    alert = _rank_down(spec)
    assert alert is not None and alert.severity == "critical" and alert.for_ == ENGINE_DOWN_FOR
    assert 'pdkit_engine_rank_up{rank!="0"}' in alert.expr and alert.expr.endswith("== 0")
    # every rank above 0, on its own node, named by its engine and rank 0's host; rank 0 is the decoy
    assert [(s["node"], s["engine"], s["rank"], s["nnodes"], s["head"]) for s in alert.subjects] == [
        ("gpu02", "decode", "1", "3", "gpu01"), ("gpu03", "decode", "2", "3", "gpu01")]
    assert [(s["node"], s["rank"]) for s in alert.decoys] == [("gpu01", "0")]
    rule = next(r for r in yaml.safe_load(alert_rules(spec))["groups"][0]["rules"]
                if r["alert"] == "PdkitEngineRankDown")
    assert rule["labels"] == {"severity": "critical"} and rule["for"] == "2m"
    summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
    for label in ("engine", "rank", "node"):
        assert f"{{{{ $labels.{label} }}}}" in summary, label
    assert "Rank 0 cannot serve without it" in description and "systemd restarts" in description
    # the runbook's steps, for this rank: its node, its engine, rank 0's host
    assert "journalctl -u pdkit-engine-{{ $labels.engine }}" in description and "What to do" in description
    assert "`pdkit roll INVENTORY --limit {{ $labels.head }} --limit {{ $labels.node }}`" in description
    assert "`{engine} rank {rank}`" not in description and "`{{ $labels.engine }} rank {{ $labels.rank }}`" in description
    # a rank's node outside scrape_hosts has no exporter series to read: no subject there
    hosts = _spanning(base)[1]
    hosts["mon01"]["pdkit_monitoring"] = {"scrape_hosts": ["gpu01", "gpu02", "mon01"]}
    limited = _rank_down(_spec(tmp_path, base[0], hosts))
    assert [s["node"] for s in limited.subjects] == ["gpu02"]


def test_rank_down_promtool_cases_pass_and_can_fail(base, tmp_path):
    """promtool runs the rank alert's generated cases (every rank down at once, one alone, all healthy
    with a one-scrape restart and rank 0 down as the decoy), and each of them can fail: a healthy firing
    case, a quiet case that expects an alert, the quiet case with a rank really down, and the rule
    without its rank 0 exclusion."""
    spec = _spec(tmp_path, *_spanning(base))
    d = _write_monitoring_dir(spec, tmp_path / "mon")
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(rule_tests(spec))
    mine = [t for t in doc["tests"] if t["alert_rule_test"][0]["alertname"] == "PdkitEngineRankDown"]
    assert [t["name"] for t in mine] == [
        "PdkitEngineRankDown fires for every subject at once",
        "PdkitEngineRankDown fires for gpu02/decode rank 1 alone",
        "PdkitEngineRankDown stays quiet while every subject is healthy (and ignores rank 0, which PdkitEngineDown "
        "covers)"]
    every, alone, quiet = mine
    assert [e["exp_labels"]["rank"] for e in every["alert_rule_test"][0]["exp_alerts"]] == ["1", "2"]
    assert {e["exp_labels"]["node"] for e in alone["alert_rule_test"][0]["exp_alerts"]} == {"gpu02"}
    assert quiet["alert_rule_test"][0]["exp_alerts"] == []

    def run(tests, rules=None):
        sub = tmp_path / f"case{next(_cases)}"
        (sub / "rules").mkdir(parents=True)
        (sub / RULES_RELATIVE_PATH).write_text(rules if rules is not None else alert_rules(spec))
        (sub / "rules" / "t.yml").write_text(to_yaml({**doc, "tests": tests}))
        return _promtool("test", "rules", "rules/t.yml", cwd=sub)

    assert run(mine).returncode == 0
    # the firing case fires for real: with the rank healthy the expected alert is missing
    healthy = copy.deepcopy(alone)
    for s in healthy["input_series"]:
        s["values"] = "1x25"
    assert run([healthy]).returncode != 0
    # the quiet case is quiet for real: expecting rank 1's alert there fails
    expecting = copy.deepcopy(quiet)
    expecting["alert_rule_test"][0]["exp_alerts"] = copy.deepcopy(alone["alert_rule_test"][0]["exp_alerts"])
    assert run([expecting]).returncode != 0
    # ... and a rank above 0 down for good in it fires
    down = copy.deepcopy(quiet)
    down["input_series"][0]["values"] = "1x3 0x20"
    assert run([down]).returncode != 0
    # the decoy holds the rule to ranks above 0: without `rank!="0"` rank 0's series fires in the quiet case
    rules = alert_rules(spec)
    assert rules.count('pdkit_engine_rank_up{rank!="0"}') == 1
    assert run([quiet], rules.replace('pdkit_engine_rank_up{rank!="0"}', "pdkit_engine_rank_up")).returncode != 0


_cases = itertools.count()


# ---------------------------------------------------------------------------
# the lab's faster alert clock (pdkit_monitoring.lab_alert_speedup): the real windows are
# covered above by the example clusters (cluster, multinode); the lab's are those / the speedup

def _lab_clock(base, speedup):
    cluster, hosts = copy.deepcopy(base)
    for data in hosts.values():
        if "pdkit_node" in data:
            data["pdkit_node"]["gpu"] = "none"
    # scrapes often enough that no window is held up by its floor of 4 scrapes
    hosts["mon01"]["pdkit_monitoring"] = {"lab_alert_speedup": speedup, "scrape_interval_s": 5}
    return cluster, hosts


def _rescaled(text: str, speedup: int) -> str:
    """TEXT with every PromQL range and offset divided by SPEEDUP."""
    return re.sub(r"(\[|offset )(\d+[sm])", lambda m: m.group(1) + _scaled(m.group(2), speedup), text)


def test_the_lab_alert_clock_divides_every_window_and_keeps_every_case(base, tmp_path):
    real = _spec(tmp_path, *_lab_clock(base, 1))
    fast = _spec(tmp_path, *_lab_clock(base, 4))
    r, f = alerts(real), alerts(fast)
    assert [a.name for a in r] == [a.name for a in f] and len(r) >= 10
    for a, b in zip(r, f):
        assert _duration_s(a.for_) == 4 * _duration_s(b.for_), (a.name, a.for_, b.for_)
        assert _rescaled(a.expr, 4) == b.expr, a.name  # the same condition, only its windows shorter
        assert (a.subjects, a.decoys, a.severity) == (b.subjects, b.decoys, b.severity)
    assert [wedge_window(s) for s in (real, fast)] == ["2m", "30s"]
    assert _configs(real)[0]["global"] == _configs(fast)[0]["global"]  # scrapes and evaluation: own settings

    # the promtool cases: the same series and expectations on a time axis divided by the speedup
    rt, ft = yaml.safe_load(rule_tests(real)), yaml.safe_load(rule_tests(fast))
    assert (rt["evaluation_interval"], ft["evaluation_interval"]) == ("1m", "15s")
    assert len(rt["tests"]) == len(ft["tests"]) > 20
    for x, y in zip(rt["tests"], ft["tests"]):
        assert (x["name"], x["input_series"]) == (y["name"], y["input_series"])
        assert _duration_s(x["interval"]) == 4 * _duration_s(y["interval"])
        for cx, cy in zip(x["alert_rule_test"], y["alert_rule_test"], strict=True):
            assert _duration_s(cx["eval_time"]) == 4 * _duration_s(cy["eval_time"])
            assert [e["exp_labels"] for e in cx["exp_alerts"]] == [e["exp_labels"] for e in cy["exp_alerts"]]
    # and promtool runs them against the fast rules
    d = _write_monitoring_dir(fast, tmp_path / "fast")
    res = _promtool("test", "rules", f"rules/{Path(RULE_TESTS_PATH).name}", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_lab_alert_clock_is_refused_on_real_nodes_and_bounded(base, tmp_path):
    from pdkit.inventory.loader import load_with_problems

    cluster, hosts = _lab_clock(base, 4)
    hosts["gpu02"]["pdkit_node"]["gpu"] = "nvidia"
    _, problems = load_with_problems(str(write_inventory(tmp_path, hosts, cluster)))
    found = [p for p in problems if p.field == "pdkit_monitoring.lab_alert_speedup"]
    assert len(found) == 1 and found[0].host == "mon01" and found[0].severity == "error", problems
    assert "gpu02 is a real node" in found[0].message and "valid: 1" in found[0].message
    cluster, hosts = _lab_clock(base, 7)
    _, problems = load_with_problems(str(write_inventory(tmp_path, hosts, cluster)))
    assert [p.field for p in problems if p.severity == "error"] == ["pdkit_monitoring.lab_alert_speedup"], problems
    # the real windows anywhere
    cluster, hosts = copy.deepcopy(base)
    hosts["mon01"]["pdkit_monitoring"] = {"lab_alert_speedup": 1}
    spec, problems = load_with_problems(str(write_inventory(tmp_path, hosts, cluster)))
    assert spec is not None and not [p for p in problems if p.severity == "error"], problems


def test_kv_handoff_alert_renders_each_prefill_s_floor_from_its_path(base, tmp_path):
    """PdkitKvHandoffSlow: gpu01's prefill hands KV only to its own host's decode (same-host floor), gpu02's
    pd_group also holds a decode on gpu03 reached over TCP (ucx_net_devices a netdev: the TCP floor); promtool runs
    the generated cases, one of which puts both prefills at a rate between the two floors."""
    from pdkit.spec.kvcost import KV_PATHS

    cluster, hosts = base
    hosts["gpu02"]["pdkit_node"]["ucx_net_devices"] = "eth0"
    hosts["gpu03"] = {"ssh_hostname": "10.9.0.4", "pdkit_node": {
        "gpus": hosts["gpu02"]["pdkit_node"]["gpus"], "ucx_net_devices": "eth0",
        "engines": [{"name": "decode", "role": "decode", "gpus": [0, 1], "port": 30001, "pd_group": "g2"}]}}
    spec = _spec(tmp_path, cluster, hosts)
    alert = next(a for a in alerts(spec) if a.name == "PdkitKvHandoffSlow")
    floors = {s["instance"]: s["floor"] for s in alert.subjects}
    same, tcp = KV_PATHS["same-host"].floor_gb_s, KV_PATHS["cross-host-tcp"].floor_gb_s
    assert floors == {"gpu01/prefill": f"{same:g}", "gpu02/prefill": f"{tcp:g}"}
    assert 'instance=~"gpu01/prefill"' in alert.expr and 'instance=~"gpu02/prefill"' in alert.expr
    assert f'"floor", "{same:g}"' in alert.expr and f'"floor", "{tcp:g}"' in alert.expr
    names = [t["name"] for t in yaml.safe_load(rule_tests(spec))["tests"]]
    assert any(n.startswith("PdkitKvHandoffSlow at ") and "fires for gpu01/prefill" in n for n in names), names
    assert "PdkitKvHandoffSlow stays quiet for gpu01/prefill while it hands nothing off" in names
    assert "PdkitKvHandoffSlow fires for gpu01/prefill while slow and resolves once fast" in names
    d = _write_monitoring_dir(spec, tmp_path / "mon")
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr


def test_kv_handoff_alert_cases_can_fail(lab_spec, tmp_path):
    """The generated cases really test the floor: the same cases against rules whose floor is 100x lower stop
    firing, and promtool says so."""
    d = _write_monitoring_dir(lab_spec, tmp_path / "mon")
    rules = (d / RULES_RELATIVE_PATH).read_text()
    from pdkit.spec.kvcost import KV_PATHS

    floor = f") < {min(p.floor_gb_s for p in KV_PATHS.values()):g},\n"  # the lab's sim: the lowest floor
    assert floor in rules
    (d / RULES_RELATIVE_PATH).write_text(rules.replace(floor, ") < 0.001,\n"))
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode != 0 and "PdkitKvHandoffSlow" in res.stdout + res.stderr
