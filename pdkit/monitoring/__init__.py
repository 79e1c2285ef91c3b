"""Spec -> Prometheus configuration, alert rules, promtool rule tests, Grafana provisioning and dashboards.

A package along its jobs, each module a set of pure functions:

| module | job |
|---|---|
| `pdkit.monitoring.common` | paths on the monitoring host, job names, engine label sets, PromQL helpers, YAML |
| `pdkit.monitoring.scrape` | scrape targets and prometheus.yml |
| `pdkit.monitoring.alertrules` | one record per alert (rule, `for`, severity, scope, runbook, promtool cases), by concern |
| `pdkit.monitoring.rules` | the rules and rule-test files, generated from the records |
| `pdkit.monitoring.dashboards` | the Grafana dashboards and every query they run |
| `pdkit.monitoring.grafana` | Grafana provisioning (datasource, dashboard provider; its own alerting off) |
| `pdkit.monitoring.alertmanager` | alertmanager.yml (routes, inhibitions, receivers), credential files, the daemon's arguments |
| `pdkit.contract.alerttable` | docs/monitoring.md's alert, runbook and inhibition tables, from the records |

This module holds `monitoring_files` (the monitoring host's files) and exports what other packages use:
that function and the names pdkit.render.plan needs to lay the files down and start the services (the
Alertmanager paths, unit, user, defaults, URL and credential files; Grafana's drop-in path). Tests and the
modules here import every other name from the module that holds it (`from pdkit.monitoring.rules import
alerts`); tests/test_surfaces.py keeps the list equal to what is used.

Pure functions: a `ClusterSpec` in, text (or dashboard dicts) out, byte-identical for the same
spec. The roles lay these files down on the monitoring host (`MONITORING_PATHS`); nothing here
touches a host.

What is scraped (one job each; every target carries `cluster` and `node`, engine targets also
`engine`, `role`, `pd_group`, and `instance` is a readable name, not an address):

| job              | target                                    | from the spec                              |
|------------------|-------------------------------------------|--------------------------------------------|
| `sglang`         | each engine's own /metrics (`sglang:*`)    | `engine_address(host):engine.port`         |
| `router`         | the router's Prometheus port (`smg_*`)     | `router_address(host):router.prometheus_port` |
| `pdkit-exporter` | pdkit-exporter on each GPU node           | `engine_address(host):node.exporter_port`  |
| `node`           | node_exporter on every scraped host       | `host.address:NODE_EXPORTER_PORT`          |
| `dcgm`           | DCGM exporter on GPU nodes where enabled  | `engine_address(host):DCGM_EXPORTER_PORT`  |
| `prometheus`     | Prometheus itself                         | `mon.address:monitoring.prometheus_port`   |

`pdkit_monitoring.scrape_hosts` (unset: every host) limits all jobs to those hosts.

Every metric name the rules and panels use comes from pdkit.upstream.metricnames (`SGLANG`, `ROUTER`,
`EXPORTER`, `NODE`, `DCGM`); tests/test_metric_queries.py checks each query against the metric
catalogue generated from the pinned SGLang releases and routers (pdkit/upstream/catalogue.py).
"""

from __future__ import annotations

from pdkit.monitoring.alertmanager import (
    ALERTMANAGER_CONFIG_PATH,
    ALERTMANAGER_CREDENTIALS_DIR,
    ALERTMANAGER_DEFAULTS_PATH,
    ALERTMANAGER_UNIT,
    ALERTMANAGER_USER,
    alertmanager_config,
    alertmanager_defaults,
    alertmanager_url,
    credential_files,
)
from pdkit.monitoring.common import PROMETHEUS_CONFIG_PATH, RULE_TESTS_PATH, RULES_PATH, monitoring_of
from pdkit.monitoring.dashboards import dashboard_files
from pdkit.monitoring.grafana import GRAFANA_DROPIN_PATH, grafana_dropin, grafana_provisioning
from pdkit.monitoring.rules import HOST_RULE_TEST_SUBJECTS, alert_rules, rule_tests
from pdkit.monitoring.scrape import prometheus_config
from pdkit.spec import ClusterSpec

__all__ = [
    "ALERTMANAGER_CONFIG_PATH", "ALERTMANAGER_CREDENTIALS_DIR", "ALERTMANAGER_DEFAULTS_PATH", "ALERTMANAGER_UNIT",
    "ALERTMANAGER_USER", "GRAFANA_DROPIN_PATH", "alertmanager_defaults", "alertmanager_url", "credential_files",
    "monitoring_files",
]


def monitoring_files(spec: ClusterSpec) -> dict[str, str]:
    """Every file of the monitoring host: {absolute path: text} (Grafana's only when it is enabled).
    Not the receivers' credential files: pdkit.render.plan lays those down (mode 0600, Alertmanager's user)."""
    files = {
        PROMETHEUS_CONFIG_PATH: prometheus_config(spec),
        ALERTMANAGER_CONFIG_PATH: alertmanager_config(spec),
        RULES_PATH: alert_rules(spec),
        # the operator's `promtool test rules` beside the rules: every alert's shape, a bounded number of
        # subjects (the full per-subject file costs ~1 s of YAML at 512 GPUs on every plan; the test
        # suite runs it, tests/test_monitoring.py)
        RULE_TESTS_PATH: rule_tests(spec, max_subjects=HOST_RULE_TEST_SUBJECTS),
    }
    if monitoring_of(spec).grafana:
        files.update(grafana_provisioning(spec))
        files[GRAFANA_DROPIN_PATH] = grafana_dropin()
        files.update(dashboard_files(spec))
    return files
