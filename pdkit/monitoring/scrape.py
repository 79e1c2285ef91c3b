"""Scrape configuration: every target (job, host, address, labels) and prometheus.yml."""

from __future__ import annotations

from dataclasses import dataclass

from pdkit.monitoring.common import (
    HOST_JOBS,
    JOB_DCGM,
    JOB_ENGINE,
    JOB_EXPORTER,
    JOB_NODE,
    JOB_PROMETHEUS,
    JOB_ROUTER,
    RULES_RELATIVE_PATH,
    alertmanager_targets,
    engine_instance,
    fmt_seconds,
    monitoring_host,
    monitoring_of,
    regex_literal,
    scraped_hosts,
    to_yaml,
)
from pdkit.render import flags
from pdkit.spec import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT, ClusterSpec, HostSpec, dcgm_enabled


@dataclass(frozen=True)
class Target:
    """One scrape target: job, host:port and the labels every series it yields carries."""

    job: str
    host: str
    address: str
    labels: dict[str, str]


def _host_target(spec: ClusterSpec, job: str, host: HostSpec, address: str) -> Target:
    """The target of a job of HOST_JOBS on HOST: the host is the instance."""
    assert job in HOST_JOBS, job
    return Target(job, host.name, address, {"cluster": spec.cluster.name, "node": host.name, "instance": host.name})


def targets(spec: ClusterSpec) -> list[Target]:
    """Every scrape target, in job order (prometheus.yml's) then inventory order."""
    cluster = spec.cluster.name
    hosts = scraped_hosts(spec)
    out: list[Target] = []
    for host in hosts:
        if host.node is None:
            continue
        for engine in host.node.engines:
            out.append(Target(JOB_ENGINE, host.name, f"{spec.engine_address(host)}:{engine.port}", {
                "cluster": cluster, "node": host.name, "instance": engine_instance(host, engine.name),
                "engine": engine.name, "role": engine.role, "pd_group": engine.pd_group,
            }))
    for host in hosts:
        if host.router is not None:
            out.append(Target(JOB_ROUTER, host.name, f"{flags.router_address(host)}:{host.router.prometheus_port}", {
                "cluster": cluster, "node": host.name, "instance": f"{host.name}/router", "role": "router",
            }))
    for host in hosts:
        if host.node is not None:
            out.append(_host_target(spec, JOB_EXPORTER, host, f"{spec.engine_address(host)}:{host.node.exporter_port}"))
    for host in hosts:
        out.append(_host_target(spec, JOB_NODE, host, f"{host.address}:{NODE_EXPORTER_PORT}"))
    for host in hosts:
        if dcgm_enabled(host):
            out.append(_host_target(spec, JOB_DCGM, host, f"{spec.engine_address(host)}:{DCGM_EXPORTER_PORT}"))
    mon = monitoring_host(spec)
    out.append(_host_target(spec, JOB_PROMETHEUS, mon, f"{mon.address}:{monitoring_of(spec).prometheus_port}"))
    return out


def _worker_relabels(spec: ClusterSpec, router_host: HostSpec) -> list[dict]:
    """metric_relabel_configs naming each router worker (worker="<engine URL>") by its engine."""
    rules: list[dict] = []
    for host, engine in spec.router_workers(router_host):
        regex = regex_literal(flags.engine_url(spec, host, engine)) + "/?"
        for label, value in (("worker_instance", engine_instance(host, engine.name)), ("worker_role", engine.role)):
            rules.append({"source_labels": ["worker"], "regex": regex, "target_label": label, "replacement": value})
    return rules


def prometheus_config(spec: ClusterSpec) -> str:
    """prometheus.yml for the monitoring host (see the module docstring for the jobs)."""
    mon = monitoring_of(spec)
    interval = mon.scrape_interval_s
    all_targets = targets(spec)
    scrape_configs: list[dict] = []
    # the jobs that have a target, in targets' order
    for job in dict.fromkeys(t.job for t in all_targets):
        job_targets = [t for t in all_targets if t.job == job]
        config: dict = {"job_name": job}
        if job == JOB_EXPORTER:
            # the exporter's series name their engine (node, engine, role): keep its labels
            config["honor_labels"] = True
        config["metrics_path"] = "/metrics"
        config["static_configs"] = [{"targets": [t.address], "labels": dict(sorted(t.labels.items()))}
                                    for t in job_targets]
        if job == JOB_ROUTER:
            relabels: list[dict] = []
            for h in scraped_hosts(spec):
                if h.router is not None:
                    relabels += [r for r in _worker_relabels(spec, h) if r not in relabels]
            if relabels:
                config["metric_relabel_configs"] = relabels
        scrape_configs.append(config)
    doc = {
        "global": {
            "scrape_interval": fmt_seconds(interval),
            "scrape_timeout": fmt_seconds(min(10, interval)),
            "evaluation_interval": fmt_seconds(interval),
            "external_labels": {"cluster": spec.cluster.name},
        },
        # the Alertmanager beside Prometheus (pdkit.monitoring.common.alertmanager_urls decides its address)
        "alerting": {"alertmanagers": [{"api_version": "v2",
                                        "static_configs": [{"targets": alertmanager_targets(spec)}]}]},
        "rule_files": [RULES_RELATIVE_PATH],
        "scrape_configs": scrape_configs,
    }
    header = (f"# Generated by pdkit for cluster {spec.cluster.name}; "
              "do not edit: change the inventory and redeploy.\n")
    return header + to_yaml(doc)
