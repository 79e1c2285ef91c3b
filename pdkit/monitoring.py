"""Spec -> Prometheus configuration, alert rules, promtool rule tests, Grafana provisioning and dashboards.

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

Every metric name the rules and panels use comes from pdkit.metricnames (`SGLANG`, `ROUTER`,
`EXPORTER`, `NODE`, `DCGM`); tests/test_metric_queries.py checks each query against the metric
catalogue generated from the pinned SGLang releases and routers (pdkit/catalogue.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import yaml

from pdkit import flags
from pdkit.metricnames import DCGM, EXPORTER, NODE, ROUTER, SGLANG
from pdkit.spec import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT, ClusterSpec, HostSpec, Monitoring, dcgm_enabled

# ---------------------------------------------------------------------------
# Where the files live on the monitoring host (Debian's prometheus package; Grafana's own)

PROMETHEUS_CONFIG_PATH = "/etc/prometheus/prometheus.yml"
# prometheus.yml names it relative to its own directory (Prometheus resolves rule_files
# against the config file's directory), so the same text checks in a temp dir too
RULES_RELATIVE_PATH = "rules/pdkit.yml"
RULES_PATH = "/etc/prometheus/rules/pdkit.yml"
# promtool unit tests for the rules; beside the rules, naming them relative to itself
RULE_TESTS_PATH = "/etc/prometheus/rules/pdkit.test.yml"
GRAFANA_DATASOURCE_PATH = "/etc/grafana/provisioning/datasources/pdkit.yaml"
GRAFANA_PROVIDER_PATH = "/etc/grafana/provisioning/dashboards/pdkit.yaml"
GRAFANA_DASHBOARDS_DIR = "/var/lib/grafana/dashboards/pdkit"

MONITORING_PATHS = {
    "prometheus_config": PROMETHEUS_CONFIG_PATH,
    "rules": RULES_PATH,
    "rule_tests": RULE_TESTS_PATH,
    "grafana_datasource": GRAFANA_DATASOURCE_PATH,
    "grafana_provider": GRAFANA_PROVIDER_PATH,
    "grafana_dashboards_dir": GRAFANA_DASHBOARDS_DIR,
}


DATASOURCE_UID = "pdkit-prometheus"
DATASOURCE = {"type": "prometheus", "uid": DATASOURCE_UID}

# Job names (the `job` label)
JOB_ENGINE = "sglang"
JOB_ROUTER = "router"
JOB_EXPORTER = "pdkit-exporter"
JOB_NODE = "node"
JOB_DCGM = "dcgm"
JOB_PROMETHEUS = "prometheus"

# ---------------------------------------------------------------------------
# Metric names: pdkit.metricnames (one module for the whole kit, checked against the catalogue)

# ---------------------------------------------------------------------------
# Alert thresholds and windows

ENGINE_DOWN_FOR = "2m"  # a real SGLang restart takes ~60-106 s: a 1m window would fire on every roll
ROUTER_DOWN_FOR = "1m"
TARGET_DOWN_FOR = "5m"
WORKER_UNHEALTHY_FOR = "1m"
QUEUE_GROWING_FOR = "10m"
QUEUE_MIN_DEPTH = 1
FAILURES_FOR = "1m"
# an engine holding requests (running or queued) that generates no token for this long is wedged
WEDGED_FOR = "1m"
CUDA_GRAPH_RATIO_MIN = 0.9
CUDA_GRAPH_RATIO_FOR = "10m"
TTFT_FOR = "5m"
DRIFT_FOR = "5m"
ENV_MISSING_FOR = "5m"

# labels that name one engine, after aggregation
ENGINE_BY = ("cluster", "node", "instance", "engine", "role", "pd_group")
# the exporter's per-engine series (its `instance` is the node)
EXPORTER_BY = ("cluster", "node", "engine", "role")
WORKER_BY = ("cluster", "node", "instance", "role", "worker", "worker_instance", "worker_role")

# the PD and waiting queues the queue-growing alert watches: (queue label, metric key)
QUEUES = (
    ("waiting", "waiting"),
    ("prefill_bootstrap", "prefill_bootstrap_queue"),
    ("prefill_inflight", "prefill_inflight_queue"),
    ("decode_prealloc", "decode_prealloc_queue"),
    ("decode_transfer", "decode_transfer_queue"),
)
# which roles run each queue (rule tests and docs; the alert itself watches every engine)
QUEUE_ROLES = {
    "waiting": ("prefill", "decode", "unified"),
    "prefill_bootstrap": ("prefill",),
    "prefill_inflight": ("prefill",),
    "decode_prealloc": ("decode",),
    "decode_transfer": ("decode",),
}


# ---------------------------------------------------------------------------
# Targets


@dataclass(frozen=True)
class Target:
    """One scrape target: job, host:port and the labels every series it yields carries."""

    job: str
    host: str
    address: str
    labels: dict[str, str]


def monitoring_host(spec: ClusterSpec) -> HostSpec:
    hosts = spec.monitoring_hosts
    if not hosts:
        raise ValueError("no host declares pdkit_monitoring: monitoring files need a monitoring host")
    return hosts[0]


def _monitoring(spec: ClusterSpec) -> Monitoring:
    mon = monitoring_host(spec).monitoring
    assert mon is not None
    return mon


def scraped_hosts(spec: ClusterSpec) -> list[HostSpec]:
    """The hosts Prometheus scrapes: `scrape_hosts`, else every host, in inventory order."""
    wanted = _monitoring(spec).scrape_hosts
    return [h for h in spec.hosts if wanted is None or h.name in wanted]


def engine_instance(host: HostSpec, engine_name: str) -> str:
    """The `instance` label of an engine's series: `<host>/<engine>`."""
    return f"{host.name}/{engine_name}"


def targets(spec: ClusterSpec) -> list[Target]:
    """Every scrape target, in job order then inventory order."""
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
            out.append(Target(JOB_EXPORTER, host.name, f"{spec.engine_address(host)}:{host.node.exporter_port}",
                              {"cluster": cluster, "node": host.name, "instance": host.name}))
    for host in hosts:
        out.append(Target(JOB_NODE, host.name, f"{host.address}:{NODE_EXPORTER_PORT}",
                          {"cluster": cluster, "node": host.name, "instance": host.name}))
    for host in hosts:
        if dcgm_enabled(host):
            out.append(Target(JOB_DCGM, host.name, f"{spec.engine_address(host)}:{DCGM_EXPORTER_PORT}",
                              {"cluster": cluster, "node": host.name, "instance": host.name}))
    mon = monitoring_host(spec)
    out.append(Target(JOB_PROMETHEUS, mon.name, f"{mon.address}:{_monitoring(spec).prometheus_port}",
                      {"cluster": cluster, "node": mon.name, "instance": mon.name}))
    return out


def _worker_relabels(spec: ClusterSpec, router_host: HostSpec) -> list[dict]:
    """metric_relabel_configs naming each router worker (worker="<engine URL>") by its engine."""
    rules: list[dict] = []
    for host, engine in spec.router_workers(router_host):
        regex = regex_literal(flags.engine_url(spec, host, engine)) + "/?"
        for label, value in (("worker_instance", engine_instance(host, engine.name)), ("worker_role", engine.role)):
            rules.append({"source_labels": ["worker"], "regex": regex, "target_label": label, "replacement": value})
    return rules


def _seconds(s: int) -> str:
    return f"{s // 60}m" if s % 60 == 0 else f"{s}s"


def prometheus_config(spec: ClusterSpec) -> str:
    """prometheus.yml for the monitoring host (see the module docstring for the jobs)."""
    mon = _monitoring(spec)
    interval = mon.scrape_interval_s
    all_targets = targets(spec)
    scrape_configs: list[dict] = []
    for job in (JOB_ENGINE, JOB_ROUTER, JOB_EXPORTER, JOB_NODE, JOB_DCGM, JOB_PROMETHEUS):
        job_targets = [t for t in all_targets if t.job == job]
        if not job_targets:
            continue
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
            "scrape_interval": _seconds(interval),
            "scrape_timeout": _seconds(min(10, interval)),
            "evaluation_interval": _seconds(interval),
            "external_labels": {"cluster": spec.cluster.name},
        },
        "rule_files": [RULES_RELATIVE_PATH],
        "scrape_configs": scrape_configs,
    }
    header = (f"# Generated by pdkit for cluster {spec.cluster.name}; "
              "do not edit: change the inventory and redeploy.\n")
    return header + to_yaml(doc)


# ---------------------------------------------------------------------------
# Alert rules


@dataclass(frozen=True)
class Alert:
    name: str
    # the full alert condition
    expr: str
    # the quantity the condition tests, without the threshold: returns series on a healthy,
    # loaded cluster (the lab's live query check runs this one)
    value: str
    for_: str
    severity: str
    summary: str
    description: str
    # promtool cases: each subject is one thing that can alert on its own
    subjects: tuple[dict[str, str], ...] = ()
    case: Callable[[dict[str, str], bool], list[tuple[str, str]]] | None = field(default=None, compare=False)
    exp_labels: Callable[[dict[str, str]], dict[str, str]] | None = field(default=None, compare=False)
    eval_time: str = "20m"
    # series that must NOT alert even when "bad" (present in the non-firing case)
    decoys: tuple[dict[str, str], ...] = ()
    # lazily created families whose absence is this alert's healthy answer (no request yet: no TTFT
    # over the SLO); any other lazy family must be handled in `expr` (tests/test_catalogue.py)
    absent_ok: tuple[str, ...] = ()
    # more promtool tests of this alert: subjects -> [test dict] (shapes one case per subject cannot say)
    extra_tests: Callable[[tuple[dict[str, str], ...]], list[dict]] | None = field(default=None, compare=False)


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def _sel(name: str, matchers: str = "") -> str:
    return f"{name}{{{matchers}}}" if matchers else name


def _alt(template: str, key: str, table: dict = SGLANG) -> str:
    """`template` applied to a metric that may have two names, joined with `or`."""
    names = table[key]
    if isinstance(names, str):
        return template.format(m=names)
    return " or ".join(f"({template.format(m=n)})" for n in names)


def _window(spec: ClusterSpec) -> str:
    """Rate window for alerts: 5m, or 4 scrapes when scrapes are slower than 75 s."""
    return _seconds(max(300, 4 * _monitoring(spec).scrape_interval_s))


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _pick(labels: dict[str, str], keys: tuple[str, ...]) -> dict[str, str]:
    return {k: labels[k] for k in keys if k in labels}


def graph_expected_instances(spec: ClusterSpec) -> list[str]:
    """Engines that must run decode steps in CUDA graphs: decode/unified with graphs on."""
    out = []
    for host, engine in spec.engines():
        if engine.role != "prefill" and spec.engine_tuning(engine).value("cuda_graph"):
            out.append(engine_instance(host, engine.name))
    return out


def _fmt(x: float) -> str:
    """A number for people (annotations, panel text)."""
    return f"{x:g}"


def _num(x: float) -> str:
    """A number for PromQL / promtool: exact."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


_RE_SPECIAL = set(".^$*+?()[]{}|\\")


def regex_literal(text: str) -> str:
    """`text` as an RE2 regex that matches exactly it (for relabel configs)."""
    return "".join("\\" + c if c in _RE_SPECIAL else c for c in text)


def promql_regex(values: list[str]) -> str:
    """An alternation matching exactly these values, ready to sit inside a PromQL "..." string."""
    return "|".join(regex_literal(v) for v in values).replace("\\", "\\\\")


def _engine_labels(s: dict[str, str], **extra: str) -> dict[str, str]:
    """An engine series' labels as Prometheus stores them: the target's and SGLang's scheduler labels."""
    return {"job": JOB_ENGINE, **_pick(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
            "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0", **extra}


def _alert_test(name: str, alert: str, series: list[tuple[str, str]], eval_time: str,
                exp: list[dict[str, str]]) -> dict:
    return {"name": name, "interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": eval_time, "alertname": alert,
                                 "exp_alerts": [{"exp_labels": dict(sorted(e.items()))} for e in exp]}]}


def _more_failures_test(alert: str, metric: str, subjects: tuple[dict[str, str], ...]) -> list[dict]:
    """Failures that go on (increase() sees them) on the first subject, an old count that does not move
    on every other (quiet)."""
    if not subjects:
        return []
    first, rest = subjects[0], subjects[1:]
    series = [(_series(metric, _engine_labels(first)), "3+1x20")]
    series += [(_series(metric, _engine_labels(s)), "2x20") for s in rest]
    exp = [{**_pick(first, ENGINE_BY), "severity": "warning"}]
    return [_alert_test(f"{alert} fires on failures that go on, not on an old count", alert, series, "15m", exp)]


def _graph_none_only_tests(subjects: tuple[dict[str, str], ...], passes: str) -> list[dict]:
    """The seeds' worst case: the decode never runs a graph, so only mode="decode_none" exists."""
    out = []
    for s in subjects[:1]:
        series = [(_series(passes, _engine_labels(s, mode="decode_none")), "0+10x30")]
        out.append(_alert_test(f"PdkitDecodeCudaGraphRatioLow fires for {s['instance']} when only decode_none exists",
                               "PdkitDecodeCudaGraphRatioLow", series, "20m",
                               [{**_pick(s, ENGINE_BY), "severity": "warning"}]))
        series = [(_series(passes, _engine_labels(s, mode="decode_cuda_graph")), "0+10x30")]
        out.append(_alert_test(f"PdkitDecodeCudaGraphRatioLow stays quiet for {s['instance']} when only "
                               "decode_cuda_graph exists", "PdkitDecodeCudaGraphRatioLow", series, "20m", []))
    return out


def _wedge_window(spec: ClusterSpec) -> str:
    """Rate window of the wedge alert: 2m, or 4 scrapes when scrapes are slower than 30 s (it must fire
    well before SGLang's own 300 s scheduler watchdog would end a wedged process)."""
    return _seconds(max(120, 4 * _monitoring(spec).scrape_interval_s))


def _wedge_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
    labels = _engine_labels(s)
    running = [(_series(SGLANG["running"], labels), "2x30"), (_series(SGLANG["waiting"], labels), "1x30")]
    tokens = _series(SGLANG["realtime_tokens"], {**labels, "mode": "decode" if s["role"] != "prefill" else
                                                 "prefill_compute"})
    # bad: tokens stop at minute 5 while requests stay; healthy: tokens keep coming
    return running + [(tokens, "0+100x5 500x25" if bad else "0+100x30")]


def _wedge_extra_tests(subjects: tuple[dict[str, str], ...]) -> list[dict]:
    out = []
    for s in subjects[:1]:
        labels = _engine_labels(s)
        # wedged before its first step: requests held, no token series at all
        series = [(_series(SGLANG["running"], labels), "0x3 2x27"), (_series(SGLANG["waiting"], labels), "0x30")]
        out.append(_alert_test(f"PdkitEngineWedged fires for {s['instance']} wedged before its first step",
                               "PdkitEngineWedged", series, "10m", [{**_pick(s, ENGINE_BY), "severity": "critical"}]))
        # idle: nothing held, no tokens
        tokens = _series(SGLANG["realtime_tokens"], {**labels, "mode": "decode"})
        series = [(_series(SGLANG["running"], labels), "0x30"), (_series(SGLANG["waiting"], labels), "0x30"),
                  (tokens, "500x30")]
        out.append(_alert_test(f"PdkitEngineWedged stays quiet for {s['instance']} while idle",
                               "PdkitEngineWedged", series, "20m", []))
    return out


def alerts(spec: ClusterSpec) -> list[Alert]:
    """Every alert rule for this spec, with its promtool cases."""
    mon = _monitoring(spec)
    w = _window(spec)
    tgt = targets(spec)
    engines = [t for t in tgt if t.job == JOB_ENGINE]
    model_of = {engine_instance(h, e.name): spec.engine_model(e).name for h, e in spec.engines()}
    by = _by(ENGINE_BY)
    out: list[Alert] = []

    # -- engine down
    def up_case(subject: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        # healthy still has a one-scrape blip: shorter than `for`, it must not alert
        return [(_series("up", subject), "1x3 0x20" if bad else "1x3 0 1x19")]

    out.append(Alert(
        name="PdkitEngineDown",
        expr=f'up{{job="{JOB_ENGINE}"}} == 0',
        value=f'up{{job="{JOB_ENGINE}"}}',
        for_=ENGINE_DOWN_FOR, severity="critical",
        summary="SGLang engine {{ $labels.instance }} ({{ $labels.role }}) is down",
        description=(
            "Prometheus cannot scrape /metrics of engine {{ $labels.engine }} on {{ $labels.node }} "
            f"for {ENGINE_DOWN_FOR}: the process is stopped, crashed, or hung.\n"
            "What to do: on {{ $labels.node }} run `systemctl status pdkit-engine-{{ $labels.engine }}` and "
            "`journalctl -u pdkit-engine-{{ $labels.engine }} -n 200` (look for CUDA out of memory, NCCL errors, "
            "the watchdog timeout, a Python traceback); check `nvidia-smi` and `dmesg` for Xid errors. "
            "A PD pair stalls while either side is down: the router keeps sending it requests until its health "
            "checks fail. Fix the cause, then re-run the deploy (`pyinfra INVENTORY deploy/pd.py`: it restarts "
            "the engine behind the health gate)."),
        subjects=tuple({"job": JOB_ENGINE, **t.labels} for t in engines),
        case=up_case,
        exp_labels=lambda s: dict(s),
        eval_time="10m",
    ))

    # -- router down
    routers = [t for t in tgt if t.job == JOB_ROUTER]
    if routers:
        out.append(Alert(
            name="PdkitRouterDown",
            expr=f'up{{job="{JOB_ROUTER}"}} == 0',
            value=f'up{{job="{JOB_ROUTER}"}}',
            for_=ROUTER_DOWN_FOR, severity="critical",
            summary="Router on {{ $labels.node }} is down",
            description=(
                "Prometheus cannot scrape the router's metrics port on {{ $labels.node }}: clients get "
                "connection errors.\nWhat to do: `systemctl status pdkit-router` and "
                "`journalctl -u pdkit-router -n 200` on {{ $labels.node }}; restart it with the deploy. "
                "The engines keep running; nothing else needs a restart."),
            subjects=tuple({"job": JOB_ROUTER, **t.labels} for t in routers),
            case=up_case,
            exp_labels=lambda s: dict(s),
            eval_time="10m",
        ))

    # -- other scrape targets down (monitoring blind spots)
    others = [t for t in tgt if t.job in (JOB_EXPORTER, JOB_NODE, JOB_DCGM, JOB_PROMETHEUS)]
    other_jobs = "|".join((JOB_EXPORTER, JOB_NODE, JOB_DCGM, JOB_PROMETHEUS))
    out.append(Alert(
        name="PdkitScrapeTargetDown",
        expr=f'up{{job=~"{other_jobs}"}} == 0',
        value=f'up{{job=~"{other_jobs}"}}',
        for_=TARGET_DOWN_FOR, severity="warning",
        summary="{{ $labels.job }} on {{ $labels.node }} cannot be scraped",
        description=(
            "The {{ $labels.job }} target on {{ $labels.node }} has been down for " + TARGET_DOWN_FOR + ": "
            "its dashboards and the alerts built on it (drift, NCCL env, node and GPU figures) are blind.\n"
            "What to do: on {{ $labels.node }} check the service (pdkit-exporter, prometheus-node-exporter, "
            "dcgm-exporter or prometheus) with systemctl status / journalctl, and that its port is reachable "
            "from the monitoring host. Serving is not affected."),
        subjects=tuple({"job": t.job, **t.labels} for t in others),
        case=up_case,
        exp_labels=lambda s: dict(s),
        eval_time="10m",
    ))

    # -- router worker unhealthy
    worker_subjects = []
    for rt in routers:
        host = spec.host(rt.host)
        for h, e in spec.router_workers(host):
            worker_subjects.append({"job": JOB_ROUTER, **rt.labels, "worker": flags.engine_url(spec, h, e),
                                    "worker_instance": engine_instance(h, e.name), "worker_role": e.role})
    if worker_subjects:
        out.append(Alert(
            name="PdkitRouterWorkerUnhealthy",
            expr=f'min by ({_by(WORKER_BY)}) ({ROUTER["worker_health"]}) == 0',
            value=f'min by ({_by(WORKER_BY)}) ({ROUTER["worker_health"]})',
            for_=WORKER_UNHEALTHY_FOR, severity="critical",
            summary="Router on {{ $labels.node }} marks worker {{ $labels.worker_instance }} unhealthy",
            description=(
                "The router on {{ $labels.node }} counts {{ $labels.worker }} ({{ $labels.worker_instance }}, "
                "{{ $labels.worker_role }}) unhealthy: it failed the router's health checks and gets no new "
                "requests; in PD mode its partner side loses capacity.\n"
                "What to do: check PdkitEngineDown for the same engine; if the engine is up, "
                "`curl <worker>/health` from the router host (a firewall, a wrong --host, or an engine stuck in "
                "a long generate shows here), and read the engine's journal. The router takes the worker back "
                "on its own once health checks pass again (pdkit runs it without --remove-unhealthy-workers)."),
            subjects=tuple(worker_subjects),
            case=lambda s, bad: [(_series(ROUTER["worker_health"], s), "1x3 0x20" if bad else "1x25")],
            exp_labels=lambda s: _pick(s, WORKER_BY),
            eval_time="10m",
        ))

    # -- queue growing (waiting queue and the PD queues)
    def queue_clause(queue: str, key: str, fn: str) -> str:
        if fn == "deriv":
            growing = _alt(f"sum by ({by}) (deriv({{m}}[{w}]))", key)
            depth = _alt(f"sum by ({by}) ({{m}})", key)
            inner = f"({growing}) > 0 and ({depth}) >= {QUEUE_MIN_DEPTH}"
        else:
            inner = _alt(f"sum by ({by}) ({{m}})", key)
        return f'label_replace({inner}, "queue", "{queue}", "", "")'

    queue_subjects = []
    for t in engines:
        for queue, _ in QUEUES:
            if t.labels["role"] in QUEUE_ROLES[queue]:
                queue_subjects.append({**t.labels, "queue": queue, "model_name": model_of[t.labels["instance"]]})

    def queue_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        key = dict(QUEUES)[s["queue"]]
        names = SGLANG[key]
        name = names if isinstance(names, str) else names[0]
        labels = {"job": JOB_ENGINE, **_pick(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
                  "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        return [(_series(name, labels), "0+1x30" if bad else "3x30")]

    out.append(Alert(
        name="PdkitQueueGrowing",
        expr="\nor\n".join(queue_clause(q, k, "deriv") for q, k in QUEUES),
        value="\nor\n".join(queue_clause(q, k, "value") for q, k in QUEUES),
        for_=QUEUE_GROWING_FOR, severity="warning",
        summary="The {{ $labels.queue }} queue of {{ $labels.instance }} has grown for " + QUEUE_GROWING_FOR,
        description=(
            "The {{ $labels.queue }} queue of {{ $labels.instance }} ({{ $labels.role }}) has kept growing for "
            + QUEUE_GROWING_FOR + ": requests arrive faster than this engine drains them.\n"
            "What to do, by queue: waiting - the engine is at capacity (check KV cache usage and the "
            "decode CUDA-graph ratio on the tuning dashboard; add engines or lower the load); "
            "prefill_bootstrap - prefill waits for its decode partner's handshake (is the decode up? same "
            "model and SGLang version?); prefill_inflight / decode_transfer - KV transfers are slow or stuck "
            "(UCX lane, UCX_NET_DEVICES across nodes, transfer failures on the PD dashboard); "
            "decode_prealloc - decode has no KV memory free for new requests (decode is the bottleneck)."),
        subjects=tuple(queue_subjects),
        case=queue_case,
        exp_labels=lambda s: {**_pick(s, ENGINE_BY), "queue": s["queue"]},
        eval_time="20m",
    ))

    # -- KV transfer / bootstrap failures. The counters exist in every pinned release but are
    # created by their first increment (the catalogue's `lazy`): a healthy engine has no series,
    # and increase() over a series that appears at 1 is 0. So each alert also fires on a series
    # that is new within the window (present now, absent `w` ago).
    pd_engines = [t for t in engines if t.labels["role"] in ("prefill", "decode")]
    pd_up = f'up{{job="{JOB_ENGINE}", role=~"prefill|decode"}}'
    for name, key, what, todo in (
        ("PdkitKvTransferFailures", "transfer_failed", "KV transfers",
         "KV cache transfers between prefill and decode fail: the requests error out.\n"
         "What to do: read both engines' journals around the failures (NIXL/UCX errors, timeouts after 300 s); "
         "across nodes set pdkit_node.ucx_net_devices (without it cross-node transfers hang); on one node "
         "UCX must keep cuda_ipc (UCX_TLS); check that the pair runs the same model and SGLang version. "
         "UCX_PROTO_INFO=y in the engine's environment logs the lane UCX picked."),
        ("PdkitBootstrapFailures", "bootstrap_failed", "PD bootstrap handshakes",
         "Decode could not bootstrap requests with their prefill (the handshake on the prefill's bootstrap "
         "port): requests fail before any KV moves.\n"
         "What to do: check that the prefill is up and its bootstrap port (pdkit_node.engines[].bootstrap_port, "
         "default 8998) is reachable from the decode node, that the router passes that port "
         "(`--prefill URL PORT`), and that a prefill replaced behind the same address did not leave the decode "
         "waiting (restart the decode)."),
    ):
        if not pd_engines:
            continue
        metric = SGLANG[key]
        out.append(Alert(
            name=name,
            expr=(f"(sum by ({by}) (increase({metric}[{w}])) > 0)\nor\n"
                  f"(sum by ({by}) ({metric}) unless sum by ({by}) ({metric} offset {w}))"),
            value=f"sum by ({by}) (increase({metric}[{w}]))\nor\nsum by ({by}) ({pd_up}) * 0",
            for_=FAILURES_FOR, severity="warning",
            summary=f"{what} fail on {{{{ $labels.instance }}}}",
            description=f"{todo}",
            subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in pd_engines),
            # bad: the engine's first failure (the series appears at 1 and stays); healthy: no series at all
            case=lambda s, bad, metric=metric: [(_series(metric, {
                "job": JOB_ENGINE, **_pick(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
                "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}), "_x5 1x15")] if bad else [],
            exp_labels=lambda s: _pick(s, ENGINE_BY),
            eval_time="8m",
            extra_tests=lambda subjects, metric=metric, name=name: _more_failures_test(name, metric, subjects),
        ))

    # -- decode CUDA-graph ratio (only engines whose spec turns decode graphs on)
    expected = graph_expected_instances(spec)
    if expected:
        passes = SGLANG["cuda_graph_passes"]
        inst = promql_regex(expected)
        # each mode's child is created by its first pass: an engine whose decode never runs a graph has
        # only mode="decode_none", so the numerator falls back to 0 for it
        ratio = (f'(\n  sum by ({by}) (rate({passes}{{mode="decode_cuda_graph", instance=~"{inst}"}}[{w}]))\n'
                 f'  or\n  sum by ({by}) (rate({passes}{{mode="decode_none", instance=~"{inst}"}}[{w}])) * 0\n)\n'
                 f'/\nsum by ({by}) (rate({passes}{{mode=~"decode_cuda_graph|decode_none", instance=~"{inst}"}}[{w}]))')

        def graph_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
            base = {"job": JOB_ENGINE, **_pick(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
                    "pp_rank": "0", "moe_ep_rank": "0"}
            rows = []
            for tp in ("0", "1"):
                rows.append((_series(passes, {**base, "tp_rank": tp, "mode": "decode_cuda_graph"}), "0+10x30"))
                rows.append((_series(passes, {**base, "tp_rank": tp, "mode": "decode_none"}),
                             "0+10x30" if bad else "0x30"))
            return rows

        subjects = tuple({**t.labels, "model_name": model_of[t.labels["instance"]]}
                         for t in engines if t.labels["instance"] in expected)
        out.append(Alert(
            name="PdkitDecodeCudaGraphRatioLow",
            expr=f"(\n{ratio}\n) < {_num(CUDA_GRAPH_RATIO_MIN)}",
            value=ratio,
            for_=CUDA_GRAPH_RATIO_FOR, severity="warning",
            summary="{{ $labels.instance }} runs decode steps without CUDA graphs",
            description=(
                f"Fewer than {CUDA_GRAPH_RATIO_MIN:.0%} of the decode passes of {{{{ $labels.instance }}}} ran in a "
                f"CUDA graph over the last {w} although its spec turns decode graphs on. Without graphs a decode "
                "step is CPU-launch bound (the seeds measured 3-5x less throughput).\n"
                "What to do: the usual cause is decode batches larger than the largest captured graph: compare "
                "#running-req in the decode log lines with cuda_graph_max_bs (set it >= the target concurrency, "
                "`pdkit validate` warns); also check the engine's log for a graph capture failure and that "
                "--cuda-graph-backend-decode is not disabled (flags drift alert)."),
            subjects=subjects,
            case=graph_case,
            exp_labels=lambda s: _pick(s, ENGINE_BY),
            eval_time="20m",
            extra_tests=lambda subjects: _graph_none_only_tests(subjects, passes),
        ))

    # -- wedged engine: holds requests (running or queued) and generates no token. Tokens are
    # counted per scheduler step by sglang:realtime_tokens_total{mode} (lazy: created by the
    # first step), so an engine that wedged before its first step has no series at all.
    tokens = SGLANG["realtime_tokens"]
    ww = _wedge_window(spec)
    held = f'sum by ({by}) ({SGLANG["running"]}) + sum by ({by}) ({SGLANG["waiting"]})'
    stepping = f"sum by ({by}) (rate({tokens}[{ww}])) > 0"
    out.append(Alert(
        name="PdkitEngineWedged",
        expr=f"({held}) > 0\nunless on ({by})\n({stepping})",
        value=f"{held}",
        for_=WEDGED_FOR, severity="critical",
        summary="Engine {{ $labels.instance }} holds requests and generates no tokens",
        description=(
            "Engine {{ $labels.instance }} ({{ $labels.role }}) has had requests running or queued for "
            f"{WEDGED_FOR} while its scheduler generated no token over the last {ww} "
            "(sglang:realtime_tokens_total did not move): its HTTP server answers, the scheduler does not step. "
            "Clients wait until their timeout; the router keeps routing to it while /health answers.\n"
            "What to do: `journalctl -u pdkit-engine-{{ $labels.engine }} -n 300` on {{ $labels.node }} (the "
            "last Prefill/Decode batch line, NCCL or NIXL errors); `py-spy dump --pid <scheduler pid>` shows "
            "where it hangs. Restart the engine (`systemctl restart pdkit-engine-{{ $labels.engine }}`, or the "
            "deploy). The seeds hit this with the overlap schedule: consider --disable-overlap-schedule."),
        subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in engines),
        case=lambda s, bad: _wedge_case(s, bad),
        exp_labels=lambda s: _pick(s, ENGINE_BY),
        eval_time="20m",
        extra_tests=lambda subjects: _wedge_extra_tests(subjects),
    ))

    # -- TTFT p99 over the SLO (user-facing TTFT: decode and unified engines)
    slo = mon.ttft_p99_slo_s
    ttft = (f'histogram_quantile(0.99, sum by ({by}, le) '
            f'(rate({SGLANG["ttft"]}_bucket{{role=~"decode|unified"}}[{w}])))')
    ttft_engines = [t for t in engines if t.labels["role"] in ("decode", "unified")]

    def ttft_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        base = {"job": JOB_ENGINE, **_pick(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"]}
        # all observations in (slo, 2 slo] -> p99 ~ 1.99 slo; in (slo/2, slo] -> p99 ~ 0.995 slo
        counts = {slo / 2: "0x30", slo: "0x30" if bad else "0+10x30", slo * 2: "0+10x30", "+Inf": "0+10x30"}
        return [(_series(SGLANG["ttft"] + "_bucket", {**base, "le": le if isinstance(le, str) else _num(le)}), v)
                for le, v in counts.items()]

    if ttft_engines:
        out.append(Alert(
            name="PdkitTtftP99OverSlo",
            expr=f"{ttft} > {_num(slo)}",
            value=ttft,
            for_=TTFT_FOR, severity="warning",
            summary=f"TTFT p99 of {{{{ $labels.instance }}}} is over the {_fmt(slo)} s SLO",
            description=(
                f"The 99th percentile time to first token measured by {{{{ $labels.instance }}}} over the last {w} "
                f"is above pdkit_monitoring.ttft_p99_slo_s = {_fmt(slo)} s. In PD mode this decode-side TTFT "
                "includes the prefill and the KV transfer.\n"
                "What to do: on the PD dashboard find where the time goes: a growing prefill waiting queue "
                "(prefill capacity: chunked_prefill_size, more prefill engines), bootstrap/inflight queues (the "
                "handshake), transfer latency (the UCX lane, page_size), or decode prealloc (decode KV memory "
                "full). Compare with the load: the SLO may simply be exceeded by more traffic than planned."),
            subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in ttft_engines),
            case=ttft_case,
            exp_labels=lambda s: _pick(s, ENGINE_BY),
            eval_time="20m",
            decoys=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]}
                         for t in engines if t.labels["role"] == "prefill"),
            absent_ok=(SGLANG["ttft"],),
        ))

    # -- exporter: flags drift and NCCL/UCX env
    exp_subjects = tuple({"job": JOB_EXPORTER, "cluster": spec.cluster.name, "instance": h.name, "node": h.name,
                          "engine": e.name, "role": e.role}
                         for h, e in spec.engines() if h in scraped_hosts(spec))
    out.append(Alert(
        name="PdkitConfigDrift",
        expr=f'max by ({_by(EXPORTER_BY)}) ({EXPORTER["flags_drift"]}) > 0',
        value=f'max by ({_by(EXPORTER_BY)}) ({EXPORTER["flags_drift"]})',
        for_=DRIFT_FOR, severity="warning",
        summary="{{ $labels.node }}/{{ $labels.engine }} runs flags that differ from the plan",
        description=(
            "pdkit-exporter found that the flags engine {{ $labels.engine }} on {{ $labels.node }} really runs "
            "with (/server_info and its command line) differ from what the spec renders: someone changed the "
            "unit by hand, a deploy did not restart the engine, or the release on the node is not the planned "
            "one.\nWhat to do: compare `systemctl cat pdkit-engine-{{ $labels.engine }}` on the node with "
            "`pdkit render INVENTORY --out DIR`; re-run the deploy (it rewrites the unit and restarts the engine "
            "behind the health gate). Never fix a node by hand: the next deploy undoes it."),
        subjects=exp_subjects,
        case=lambda s, bad: [(_series(EXPORTER["flags_drift"], s), "0x3 1x20" if bad else "0x25")],
        exp_labels=lambda s: _pick(s, EXPORTER_BY),
        eval_time="15m",
    ))
    out.append(Alert(
        name="PdkitNcclEnvMissing",
        expr=f'min by ({_by(EXPORTER_BY)}) ({EXPORTER["env_present"]}) == 0',
        value=f'min by ({_by(EXPORTER_BY)}) ({EXPORTER["env_present"]})',
        for_=ENV_MISSING_FOR, severity="warning",
        summary="NCCL/UCX environment missing in {{ $labels.node }}/{{ $labels.engine }}",
        description=(
            "The running process of engine {{ $labels.engine }} on {{ $labels.node }} lacks NCCL/UCX variables the "
            "plan sets (read from /proc/<pid>/environ): untuned NCCL on PCIe falls back to host memory, and a "
            "cross-node NIXL transfer without UCX_NET_DEVICES hangs until its 300 s timeout.\n"
            "What to do: check that the unit's EnvironmentFile= lines point at the node's nccl.env / ucx.env "
            "(`systemctl cat pdkit-engine-{{ $labels.engine }}`) and that the engine was restarted after they "
            "changed; re-run the deploy."),
        subjects=exp_subjects,
        case=lambda s, bad: [(_series(EXPORTER["env_present"], s), "1x3 0x20" if bad else "1x25")],
        exp_labels=lambda s: _pick(s, EXPORTER_BY),
        eval_time="15m",
    ))
    return out


def alert_rules(spec: ClusterSpec) -> str:
    """The rules file (RULES_PATH), one group."""
    rules = []
    for a in alerts(spec):
        rules.append({
            "alert": a.name,
            "expr": a.expr,
            "for": a.for_,
            "labels": {"severity": a.severity},
            "annotations": {"summary": a.summary, "description": a.description},
        })
    doc = {"groups": [{"name": "pdkit", "rules": rules}]}
    head = f"# Generated by pdkit (cluster {spec.cluster.name}); see docs/monitoring.md for each alert.\n"
    return head + to_yaml(doc)


_TEMPLATE = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def _expand(text: str, labels: dict[str, str]) -> str:
    """Expand the only template form the annotations use; a typo'd label is an error here."""
    return _TEMPLATE.sub(lambda m: labels[m.group(1)], text)


# subjects per alert in the rule tests laid on the monitoring host: the alert's shape with a
# neighbour (cross-talk), whatever the cluster's size. The test suite runs every subject.
HOST_RULE_TEST_SUBJECTS = 2


def rule_tests(spec: ClusterSpec, rules_file: str = "pdkit.yml", max_subjects: int | None = None) -> str:
    """A `promtool test rules` file. Per alert, three tests over every subject (each engine, worker
    or target the spec declares; the first `max_subjects` of them when given), so the file grows
    linearly with the cluster: every subject bad at once (each fires, with its own labels and
    annotations); only the first bad (it alone fires: no cross-talk through an aggregation);
    every subject healthy (nothing fires, decoys included). Then the alert's own extra tests
    (shapes one case per subject cannot say)."""
    tests = []
    for a in alerts(spec):
        assert a.case is not None and a.exp_labels is not None
        if not a.subjects:
            continue
        if max_subjects is not None:
            a = replace(a, subjects=a.subjects[:max_subjects])

        def expected(s: dict[str, str], a: Alert = a) -> dict:
            exp = {**a.exp_labels(s), "severity": a.severity}
            return {"exp_labels": dict(sorted(exp.items())),
                    "exp_annotations": {"summary": _expand(a.summary, exp), "description": _expand(a.description, exp)}}

        def case_test(name: str, bad: list[dict[str, str]], decoys: bool, a: Alert = a) -> dict:
            series = []
            for s in a.subjects:
                series += a.case(s, any(s is b for b in bad))
            if decoys:
                for d in a.decoys:
                    series += a.case(d, True)
            return {"name": name, "interval": "1m",
                    "input_series": [{"series": s, "values": v} for s, v in series],
                    "alert_rule_test": [{"eval_time": a.eval_time, "alertname": a.name,
                                         "exp_alerts": [expected(b) for b in bad]}]}

        first = a.subjects[0]
        if len(a.subjects) > 1:
            tests.append(case_test(f"{a.name} fires for every subject at once", list(a.subjects), False))
        tests.append(case_test(f"{a.name} fires for {_subject_name(first)} alone", [first], False))
        tests.append(case_test(f"{a.name} stays quiet while every subject is healthy"
                               + (" (and ignores the prefill side)" if a.decoys else ""), [], True))
        if a.extra_tests is not None:
            for t in a.extra_tests(a.subjects):
                for check in t["alert_rule_test"]:
                    for e in check["exp_alerts"]:
                        e["exp_annotations"] = {"summary": _expand(a.summary, e["exp_labels"]),
                                                "description": _expand(a.description, e["exp_labels"])}
                tests.append(t)
    doc = {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}
    return "# Generated by pdkit: `promtool test rules` cases for every alert.\n" + to_yaml(doc)


def _subject_name(s: dict[str, str]) -> str:
    if "worker_instance" in s:
        return f"the router on {s['node']} and worker {s['worker_instance']}"
    if "queue" in s:
        return f"{s['instance']} queue {s['queue']}"
    if s.get("job") == JOB_EXPORTER and "engine" in s:
        return f"{s['node']}/{s['engine']}"
    if s.get("job") in (JOB_NODE, JOB_DCGM, JOB_PROMETHEUS, JOB_EXPORTER):
        return f"{s['job']} on {s['node']}"
    return s["instance"]


def alert_conditions(spec: ClusterSpec) -> list[tuple[str, str]]:
    """(where, full alert expression): parse-check these; they return nothing while all is well."""
    return [(f"alert {a.name}", a.expr) for a in alerts(spec)]


# ---------------------------------------------------------------------------
# Grafana


def grafana_provisioning(spec: ClusterSpec) -> dict[str, str]:
    """{path: text}: the Prometheus datasource and the dashboards-from-files provider."""
    mon_host = monitoring_host(spec)
    mon = _monitoring(spec)
    datasource = {
        "apiVersion": 1,
        "datasources": [{
            "name": f"pdkit {spec.cluster.name}",
            "uid": DATASOURCE_UID,
            "type": "prometheus",
            "access": "proxy",
            "url": f"http://{mon_host.address}:{mon.prometheus_port}",
            "isDefault": True,
            "editable": False,
            "jsonData": {"timeInterval": _seconds(mon.scrape_interval_s), "httpMethod": "POST"},
        }],
    }
    provider = {
        "apiVersion": 1,
        "providers": [{
            "name": "pdkit",
            "orgId": 1,
            "folder": "pdkit",
            "type": "file",
            "disableDeletion": True,
            "allowUiUpdates": False,
            "updateIntervalSeconds": 60,
            "options": {"path": GRAFANA_DASHBOARDS_DIR, "foldersFromFilesStructure": False},
        }],
    }
    head = "# Generated by pdkit; do not edit.\n"
    return {GRAFANA_DATASOURCE_PATH: head + to_yaml(datasource), GRAFANA_PROVIDER_PATH: head + to_yaml(provider)}


SCHEMA_VERSION = 39
RATE = "$__rate_interval"
# the matchers every engine-level panel carries (the dashboard variables)
F = 'node=~"$node", engine=~"$engine", role=~"$role"'


@dataclass
class _Q:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class _P:
    title: str
    queries: list[_Q]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | table | row
    description: str = ""
    w: int = 12
    h: int = 8
    min: float | None = None
    max: float | None = None
    threshold: float | None = None  # red at/above (or below, with below=True)
    below: bool = False
    updown: bool = False  # value mapping 1 UP / 0 DOWN


def _row(title: str) -> _P:
    return _P(title, [], kind="row", w=24, h=1)


def _dashboard(spec: ClusterSpec, uid: str, title: str, panels: list[_P], variables: list[dict],
               description: str) -> dict:
    out_panels = []
    x = y = 0
    row_h = 0
    for i, p in enumerate(panels, start=1):
        if p.kind == "row" or x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        grid = {"h": p.h, "w": p.w, "x": x, "y": y}
        if p.kind == "row":
            out_panels.append({"id": i, "type": "row", "title": p.title, "collapsed": False, "gridPos": grid,
                               "panels": []})
            y += p.h
            continue
        x += p.w
        row_h = max(row_h, p.h)
        out_panels.append(_panel_json(i, p, grid))
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["pdkit", spec.cluster.name],
        "editable": False,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        # every field Grafana's DashboardLink requires (@grafana/schema; tests/test_grafana_schema.py)
        "links": [{"type": "dashboards", "tags": ["pdkit"], "asDropdown": True, "title": "pdkit",
                   "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "templating": {"list": variables},
        "panels": out_panels,
    }


def _panel_json(pid: int, p: _P, grid: dict) -> dict:
    steps: list[dict] = [{"color": "green", "value": None}]
    if p.threshold is not None:
        steps = ([{"color": "red", "value": None}, {"color": "green", "value": p.threshold}] if p.below
                 else [{"color": "green", "value": None}, {"color": "red", "value": p.threshold}])
    defaults: dict = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": steps}, "mappings": []}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    if p.updown:
        defaults["mappings"] = [{"type": "value", "options": {
            "0": {"text": "DOWN", "color": "red", "index": 0}, "1": {"text": "UP", "color": "green", "index": 1}}}]
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                                 {"color": "green", "value": 1}]}
    if p.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                              "spanNulls": False,
                              "thresholdsStyle": {"mode": "line" if p.threshold is not None else "off"}}
        options: dict = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                         "tooltip": {"mode": "multi", "sort": "desc"}}
    elif p.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                   "justifyMode": "auto", "orientation": "auto"}
    else:  # table
        options = {"showHeader": True, "cellHeight": "sm"}
    targets = []
    for ref, q in zip("ABCDEFGHIJ", p.queries):
        t = {"refId": ref, "datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend or "__auto",
             "editorMode": "code", "range": not q.instant, "instant": q.instant}
        if q.table:
            t["format"] = "table"
        targets.append(t)
    panel = {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description, "gridPos": grid,
        "datasource": DATASOURCE, "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
    }
    if p.kind == "table":
        panel["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True,
                                                                                      "__name__": True}}}]
    return panel


def _custom_var(name: str, label: str, values: list[str]) -> dict:
    options = [{"selected": True, "text": "All", "value": "$__all"}]
    options += [{"selected": False, "text": v, "value": v} for v in values]
    return {
        "name": name, "label": label, "type": "custom", "query": ",".join(values),
        "multi": True, "includeAll": True, "allValue": ".*", "hide": 0, "skipUrlSync": False,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": options,
    }


def dashboard_variables(spec: ClusterSpec, engines: bool = True) -> list[dict]:
    """node / engine / role variables, their values listed from the spec."""
    hosts = scraped_hosts(spec)
    pairs = [(h, e) for h, e in spec.engines() if h in hosts]
    if engines:
        out = [_custom_var("node", "Node", [h.name for h in hosts if h.node is not None and h.node.engines])]
    else:
        out = [_custom_var("node", "Node", [h.name for h in hosts])]
    if engines:
        out.append(_custom_var("engine", "Engine", sorted({e.name for _, e in pairs})))
        out.append(_custom_var("role", "Role", sorted({e.role for _, e in pairs})))
    return out


def _q(quantile: float, bucket: str, roles: str) -> str:
    return (f'histogram_quantile({quantile}, sum by (le) (rate({bucket}{{role=~"{roles}", {F}}}[{RATE}])))')


def _hist_mean(name: str, matchers: str) -> str:
    """Mean observation of a histogram per engine over the rate interval."""
    return (f'sum by (instance) (rate({name}_sum{{{matchers}}}[{RATE}])) / '
            f'sum by (instance) (rate({name}_count{{{matchers}}}[{RATE}]))')


def _overview(spec: ClusterSpec) -> dict:
    slo = _monitoring(spec).ttft_p99_slo_s
    S = SGLANG
    panels = [
        _row("Engines"),
        _P("Engines up", [_Q(f'up{{job="{JOB_ENGINE}", {F}}}', "{{instance}}")], kind="stat", updown=True,
           description="Whether Prometheus reaches each engine's /metrics (alert PdkitEngineDown)."),
        _P("Router workers healthy", [_Q(f'{ROUTER["worker_health"]}', "{{worker_instance}}")], kind="stat",
           updown=True, description="The router's own view of each worker (smg_worker_health)."),
        _row("Throughput"),
        _P("Input tokens/s (prefill)", [
            _Q(f'sum(rate({S["prompt_tokens"]}{{role=~"prefill|unified", {F}}}[{RATE}]))', "total"),
            _Q(f'sum by (instance) (rate({S["prompt_tokens"]}{{role=~"prefill|unified", {F}}}[{RATE}]))',
               "{{instance}}")], unit="short",
           description="Prompt tokens processed per second, counted on prefill (and unified) engines only: "
                       "a decode engine counts the same prompts again."),
        _P("Output tokens/s (decode)", [
            _Q(f'sum(rate({S["generation_tokens"]}{{role=~"decode|unified", {F}}}[{RATE}]))', "total"),
            _Q(f'sum by (instance) (rate({S["generation_tokens"]}{{role=~"decode|unified", {F}}}[{RATE}]))',
               "{{instance}}")], unit="short",
           description="Generated tokens per second on decode (and unified) engines."),
        _P("Requests/s", [
            _Q(f'sum(rate({ROUTER["requests"]}[{RATE}]))', "router"),
            _Q(f'sum by (instance) (rate({S["requests"]}{{role=~"decode|unified", {F}}}[{RATE}]))',
               "{{instance}} finished")], unit="reqps",
           description="Requests through the router, and requests finished per decode/unified engine."),
        _P("Router responses by status", [
            _Q(f'sum by (status_code) (rate({ROUTER["responses"]}[{RATE}]))', "{{status_code}}")], unit="reqps",
           description="HTTP responses of the router by status code (5xx: no worker, or a worker failed)."),
        _row("Latency"),
        _P("TTFT p50 / p99", [
            _Q(_q(0.5, S["ttft"] + "_bucket", "decode|unified"), "p50"),
            _Q(_q(0.99, S["ttft"] + "_bucket", "decode|unified"), "p99")], unit="s", threshold=slo,
           description=f"Time to first token as the client sees it (decode side; includes prefill and KV "
                       f"transfer in PD mode). The red line is the SLO, pdkit_monitoring.ttft_p99_slo_s = "
                       f"{_fmt(slo)} s."),
        _P("ITL p50 / p99", [
            _Q(_q(0.5, S["itl"] + "_bucket", "decode|unified"), "p50"),
            _Q(_q(0.99, S["itl"] + "_bucket", "decode|unified"), "p99")], unit="s",
           description="Inter-token latency on decode engines."),
        _P("End-to-end latency p50 / p99", [
            _Q(_q(0.5, S["e2e"] + "_bucket", "decode|unified"), "p50"),
            _Q(_q(0.99, S["e2e"] + "_bucket", "decode|unified"), "p99")], unit="s"),
        _row("Load"),
        _P("Waiting requests per role", [_Q(f'sum by (role) ({S["waiting"]}{{{F}}})', "{{role}}")],
           description="Requests queued inside the engines (alert PdkitQueueGrowing)."),
        _P("Running requests per role", [_Q(f'sum by (role) ({S["running"]}{{{F}}})', "{{role}}")]),
        _P("KV cache usage", [_Q(f'max by (instance) ({S["token_usage"]}{{{F}}})', "{{instance}}")],
           unit="percentunit", min=0, max=1, threshold=0.95,
           description="Share of the KV cache pool in use per engine; near 1 the engine stops admitting."),
        _P("Prefix cache hit rate", [_Q(f'max by (instance) ({S["cache_hit_rate"]}{{{F}}})', "{{instance}}")],
           unit="percentunit", min=0, max=1),
    ]
    return _dashboard(spec, "pdkit-overview", f"pdkit / {spec.cluster.name} / cluster overview", panels,
                      dashboard_variables(spec), "Throughput, latency and load of the whole cluster.")


def _lazy0(agg: str, by: str, matchers: str) -> str:
    """`agg` (a sum by (by) over a lazily created series), or 0 for every engine that has none yet."""
    return f'{agg} or sum by ({by}) (up{{job="{JOB_ENGINE}", {matchers}}}) * 0'


def _failure_queries(matchers: str) -> list[_Q]:
    """The engines' own failure counters (lazy: 0 until an engine's first failure)."""
    S = SGLANG
    return [
        _Q(_lazy0(f'sum by (instance) (increase({S["transfer_failed"]}{{{matchers}}}[{RATE}]))', "instance", matchers),
           "{{instance}} transfer"),
        _Q(_lazy0(f'sum by (instance) (increase({S["bootstrap_failed"]}{{{matchers}}}[{RATE}]))', "instance", matchers),
           "{{instance}} bootstrap"),
    ]


def _pd(spec: ClusterSpec) -> dict:
    S = SGLANG
    pf = f'role="prefill", {F}'
    dc = f'role="decode", {F}'
    pdm = f'role=~"prefill|decode", {F}'
    panels = [
        _row("Prefill side"),
        _P("Prefill bootstrap queue", [_Q(_alt(f"sum by (instance) ({{m}}{{{{{pf}}}}})", "prefill_bootstrap_queue"),
                                          "{{instance}}")],
           description="Requests waiting for the handshake with their decode partner."),
        _P("Prefill inflight queue", [_Q(f'sum by (instance) ({S["prefill_inflight_queue"]}{{{pf}}})', "{{instance}}")],
           description="Prefilled requests whose KV is still being sent to decode."),
        _row("Decode side"),
        _P("Decode prealloc queue", [_Q(f'sum by (instance) ({S["decode_prealloc_queue"]}{{{dc}}})', "{{instance}}")],
           description="Requests waiting for decode KV memory before the transfer can start."),
        _P("Decode transfer queue", [_Q(f'sum by (instance) ({S["decode_transfer_queue"]}{{{dc}}})', "{{instance}}")],
           description="Requests whose KV is arriving from prefill."),
        _row("KV transfer"),
        # histograms observed per transfer by the prefill side; no data until its first transfer
        _P("KV transfer speed (mean per transfer)", [
            _Q(_hist_mean(S["kv_transfer_speed"], pdm), "{{instance}}")],
           unit="GBs", description="Mean KV transfer speed per transfer over the interval, from SGLang's "
                                   "sglang:kv_transfer_speed_gb_s histogram (rate of _sum / rate of _count; page "
                                   "size 1 splits a transfer into many small pieces: a PD lever)."),
        _P("KV transfer latency mean / p99", [
            _Q(_hist_mean(S["kv_transfer_latency"], pdm), "{{instance}} mean"),
            _Q(f'histogram_quantile(0.99, sum by (instance, le) (rate({S["kv_transfer_latency"]}_bucket{{{pdm}}}'
               f'[{RATE}])))', "{{instance}} p99")], unit="ms"),
        _P("KV transferred per request (mean)", [_Q(_hist_mean(S["kv_transfer_total"], pdm), "{{instance}}")],
           unit="decmbytes"),
        _P("Transfer and bootstrap failures", _failure_queries(pdm),
           threshold=1, description="Failed requests per interval, from the engines' own counters (created by "
                                    "an engine's first failure: 0 until then; alerts PdkitKvTransferFailures, "
                                    "PdkitBootstrapFailures)."),
        _row("Router"),
        _P("Router worker health", [_Q(ROUTER["worker_health"], "{{worker_instance}} ({{worker_role}})")],
           min=0, max=1, description="1 healthy, 0 unhealthy (alert PdkitRouterWorkerUnhealthy)."),
        _P("Router active requests per worker", [_Q(ROUTER["worker_active"], "{{worker_instance}} ({{worker_role}})")]),
    ]
    return _dashboard(spec, "pdkit-pd", f"pdkit / {spec.cluster.name} / PD pipeline", panels,
                      dashboard_variables(spec), "Prefill/decode queues, KV transfer and the router's workers.")


def _tuning(spec: ClusterSpec) -> dict:
    S, X = SGLANG, EXPORTER
    passes = S["cuda_graph_passes"]
    ratio = (f'sum by (instance) (rate({passes}{{mode="decode_cuda_graph", role=~"decode|unified", {F}}}[{RATE}]))'
             f' / sum by (instance) (rate({passes}{{mode=~"decode_cuda_graph|decode_none", role=~"decode|unified", '
             f'{F}}}[{RATE}]))')
    pratio = (f'sum by (instance) (rate({passes}{{mode="prefill_cuda_graph", role=~"prefill|unified", {F}}}[{RATE}]))'
              f' / sum by (instance) (rate({passes}{{mode=~"prefill_cuda_graph|prefill_none", '
              f'role=~"prefill|unified", {F}}}[{RATE}]))')
    panels = [
        _row("What each engine really runs"),
        _P("Engine up (exporter)", [_Q(f'{X["up"]}{{{F}}}', "{{node}}/{{engine}}")], kind="stat", updown=True,
           description="pdkit-exporter's view: the engine answers /metrics and /server_info."),
        _P("Release and SGLang version", [_Q(f'{X["info"]}{{{F}}}', instant=True, table=True)], kind="table",
           description="The release (config hash) and SGLang version each engine runs."),
        _P("Flags drift from the plan", [_Q(f'{X["flags_drift"]}{{{F}}}', "{{node}}/{{engine}}")], min=0, max=1,
           threshold=1, description="1: the engine runs flags the spec does not render (alert PdkitConfigDrift)."),
        _P("NCCL/UCX env present in the process", [_Q(f'{X["env_present"]}{{{F}}}', "{{node}}/{{engine}}")],
           min=0, max=1, threshold=1, below=True,
           description="1: every NCCL/UCX variable of the plan is in /proc/<pid>/environ (alert PdkitNcclEnvMissing)."),
        _row("CUDA graphs"),
        _P("Decode CUDA-graph pass ratio", [
            _Q(ratio, "{{instance}}"),
            _Q(f'{X["cuda_graph_ratio"]}{{{F}}}', "{{node}}/{{engine}} (exporter)")],
           unit="percentunit", min=0, max=1, threshold=CUDA_GRAPH_RATIO_MIN, below=True,
           description="Share of decode passes run in a CUDA graph: over the rate window from "
                       "sglang:cuda_graph_passes_total, and as pdkit-exporter reports it. Below "
                       f"{CUDA_GRAPH_RATIO_MIN:.0%} on an engine with graphs on: alert PdkitDecodeCudaGraphRatioLow."),
        _P("Prefill CUDA-graph pass ratio", [_Q(pratio, "{{instance}}")], unit="percentunit", min=0, max=1,
           description="Share of prefill passes run in a (piecewise) CUDA graph."),
        _P("Decode passes/s by mode", [
            _Q(f'sum by (instance, mode) (rate({passes}{{mode=~"decode_cuda_graph|decode_none", '
               f'role=~"decode|unified", {F}}}[{RATE}]))', "{{instance}} {{mode}}")], unit="short"),
        _row("Last decode batch (log lines)"),
        _P("Decode gen throughput (log line)", [_Q(f'{X["log_gen_throughput"]}{{{F}}}', "{{node}}/{{engine}}")],
           unit="short", description="`gen throughput (token/s)` of the engine's last Decode batch log line."),
        _P("Decode #running-req (log line)", [_Q(f'{X["log_running"]}{{{F}}}', "{{node}}/{{engine}}")],
           description="`#running-req` of the last Decode batch log line: compare with cuda_graph_max_bs."),
    ]
    return _dashboard(spec, "pdkit-tuning", f"pdkit / {spec.cluster.name} / tuning health", panels,
                      dashboard_variables(spec),
                      "Whether each engine really runs what the spec says: CUDA graphs, flags, NCCL/UCX env.")


def _nodes(spec: ClusterSpec) -> dict:
    N, D = NODE, DCGM
    n = 'node=~"$node"'
    panels = [
        _row("Hosts (node_exporter)"),
        _P("CPU busy", [_Q(f'1 - avg by (node) (rate({N["cpu"]}{{mode="idle", {n}}}[{RATE}]))', "{{node}}")],
           unit="percentunit", min=0, max=1),
        _P("Memory used", [_Q(f'1 - sum by (node) ({N["mem_available"]}{{{n}}}) / sum by (node) '
                              f'({N["mem_total"]}{{{n}}})', "{{node}}")], unit="percentunit", min=0, max=1),
        _P("Network receive", [_Q(f'sum by (node) (rate({N["net_rx"]}{{device!="lo", {n}}}[{RATE}]))', "{{node}}")],
           unit="Bps"),
        _P("Network transmit", [_Q(f'sum by (node) (rate({N["net_tx"]}{{device!="lo", {n}}}[{RATE}]))', "{{node}}")],
           unit="Bps"),
        _P("Load average (1m)", [_Q(f'{N["load1"]}{{{n}}}', "{{node}}")]),
    ]
    dcgm_hosts = [h for h in scraped_hosts(spec) if dcgm_enabled(h)]
    if dcgm_hosts:
        panels += [
            _row("GPUs (DCGM)"),
            _P("GPU utilisation", [_Q(f'{D["gpu_util"]}{{{n}}}', "{{node}} GPU {{gpu}}")], unit="percent",
               min=0, max=100),
            _P("GPU memory used", [_Q(f'{D["fb_used"]}{{{n}}}', "{{node}} GPU {{gpu}}")], unit="mbytes"),
            _P("GPU power", [_Q(f'{D["power"]}{{{n}}}', "{{node}} GPU {{gpu}}")], unit="watt"),
        ]
    return _dashboard(spec, "pdkit-nodes", f"pdkit / {spec.cluster.name} / nodes", panels,
                      dashboard_variables(spec, engines=False),
                      "CPU, memory and network of every scraped host; GPUs where DCGM runs.")


def dashboards(spec: ClusterSpec) -> dict[str, dict]:
    """{name: dashboard JSON}; the PD dashboard only when the cluster runs PD engines."""
    out = {"overview": _overview(spec)}
    if spec.is_pd():
        out["pd"] = _pd(spec)
    out["tuning"] = _tuning(spec)
    out["nodes"] = _nodes(spec)
    return out


def dashboard_files(spec: ClusterSpec) -> dict[str, str]:
    """{path under GRAFANA_DASHBOARDS_DIR: JSON text}, deterministic."""
    return {f"{GRAFANA_DASHBOARDS_DIR}/pdkit-{name}.json": json.dumps(d, indent=2, sort_keys=True) + "\n"
            for name, d in dashboards(spec).items()}


def monitoring_files(spec: ClusterSpec) -> dict[str, str]:
    """Every file of the monitoring host: {absolute path: text} (Grafana's only when it is enabled)."""
    files = {
        PROMETHEUS_CONFIG_PATH: prometheus_config(spec),
        RULES_PATH: alert_rules(spec),
        # the operator's `promtool test rules` beside the rules: every alert's shape, a bounded number of
        # subjects (the full per-subject file costs ~1 s of YAML at 512 GPUs on every plan; the test
        # suite runs it, tests/test_monitoring.py)
        RULE_TESTS_PATH: rule_tests(spec, max_subjects=HOST_RULE_TEST_SUBJECTS),
    }
    if _monitoring(spec).grafana:
        files.update(grafana_provisioning(spec))
        files.update(dashboard_files(spec))
    return files


# ---------------------------------------------------------------------------
# Every query, for the live check


_GRAFANA_VARS = re.compile(r"\$(node|engine|role)\b")


def rate_interval(spec: ClusterSpec) -> str:
    """What Grafana's $__rate_interval comes to at the default resolution: 4 scrape intervals."""
    return _seconds(4 * _monitoring(spec).scrape_interval_s)


def substitute_variables(spec: ClusterSpec, expr: str) -> str:
    """A panel expression as Prometheus runs it with every variable at "All"."""
    return _GRAFANA_VARS.sub(".*", expr.replace(RATE, rate_interval(spec)))


def all_promql(spec: ClusterSpec) -> list[tuple[str, str]]:
    """(where, expr) for every panel query (variables substituted: All, $__rate_interval = 4
    scrapes) and every alert rule's value (the condition without its threshold). On a loaded
    cluster each returns at least one series; `alert_conditions` lists the full conditions."""
    out: list[tuple[str, str]] = []
    for name, d in dashboards(spec).items():
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((f"dashboard {name} / {p['title']} / {t['refId']}", substitute_variables(spec, t["expr"])))
    for a in alerts(spec):
        out.append((f"alert {a.name} (value)", a.value))
    return out


# ---------------------------------------------------------------------------
# YAML: PyYAML's safe dumper (block style, keys in the order given; strings that span lines as
# literal blocks so the rules read like hand-written ones)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def to_yaml(obj: object) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)
