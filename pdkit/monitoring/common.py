"""What the monitoring modules share: file paths on the monitoring host, scrape job names, the
label sets that name an engine, the spec accessors, PromQL helpers, and the YAML writer."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import yaml

from pdkit.spec import ClusterSpec, HostSpec, Monitoring
from pdkit.upstream.metricnames import SGLANG

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
# the jobs whose target is a whole host: its `instance` is the node's name (pdkit.monitoring.scrape.targets)
HOST_JOBS = (JOB_EXPORTER, JOB_NODE, JOB_DCGM, JOB_PROMETHEUS)

# labels that name one engine, after aggregation
ENGINE_BY = ("cluster", "node", "instance", "engine", "role", "pd_group")
# the exporter's per-engine series (its `instance` is the node)
EXPORTER_BY = ("cluster", "node", "engine", "role")
# a router's own series (its target's labels): the router alerts that are not per worker
ROUTER_BY = ("cluster", "node", "instance", "role")
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


def monitoring_host(spec: ClusterSpec) -> HostSpec:
    hosts = spec.monitoring_hosts
    if not hosts:
        raise ValueError("no host declares pdkit_monitoring: monitoring files need a monitoring host")
    return hosts[0]


def monitoring_of(spec: ClusterSpec) -> Monitoring:
    mon = monitoring_host(spec).monitoring
    assert mon is not None
    return mon


def alertmanager_urls(spec: ClusterSpec) -> list[str]:
    """Each monitoring host's Alertmanager (beside its Prometheus), as pdkit's own clients reach it:
    the one place its URL is decided (Prometheus' `alerting:`, silences, tests)."""
    return [f"http://{h.address}:{h.monitoring.alertmanager_port}" for h in spec.monitoring_hosts
            if h.monitoring is not None]


def alertmanager_targets(spec: ClusterSpec) -> list[str]:
    """host:port of each Alertmanager, for prometheus.yml's `alerting:`."""
    return [urlsplit(u).netloc for u in alertmanager_urls(spec)]


def scraped_hosts(spec: ClusterSpec) -> list[HostSpec]:
    """The hosts Prometheus scrapes: `scrape_hosts`, else every host, in inventory order."""
    wanted = monitoring_of(spec).scrape_hosts
    if wanted is None:
        return list(spec.hosts)
    names = set(wanted)
    return [h for h in spec.hosts if h.name in names]


def engine_instance(host: HostSpec, engine_name: str) -> str:
    """The `instance` label of an engine's series: `<host>/<engine>`."""
    return f"{host.name}/{engine_name}"


def fmt_seconds(s: int) -> str:
    return f"{s // 60}m" if s % 60 == 0 else f"{s}s"


def by_labels(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def _sel(name: str, matchers: str = "") -> str:
    return f"{name}{{{matchers}}}" if matchers else name


def alt_metric(template: str, key: str, table: dict = SGLANG) -> str:
    """`template` applied to a metric that may have two names, joined with `or`."""
    names = table[key]
    if isinstance(names, str):
        return template.format(m=names)
    return " or ".join(f"({template.format(m=n)})" for n in names)


def speedup_of(spec: ClusterSpec) -> int:
    """`pdkit_monitoring.lab_alert_speedup`: 1, or how many times faster the lab's alert clock runs."""
    return monitoring_of(spec).lab_alert_speedup


def duration_seconds(duration: str) -> int:
    """A duration as fmt_seconds writes it ("2m", "75s") in seconds."""
    m = re.fullmatch(r"(\d+)([sm])", duration)
    assert m is not None, f"not a duration pdkit writes: {duration!r}"
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def scaled_duration(duration: str, speedup: int) -> str:
    """DURATION divided by SPEEDUP (the lab's faster alert clock); itself at 1."""
    if speedup == 1:
        return duration
    s = duration_seconds(duration)
    assert s % speedup == 0, f"{duration} is not a whole number of seconds divided by {speedup}"
    return fmt_seconds(s // speedup)


def alert_window(spec: ClusterSpec) -> str:
    """Rate window for alerts: 5m, or 4 scrapes when scrapes are slower than 75 s (the lab: 5m / its
    lab_alert_speedup, still at least 4 scrapes)."""
    return fmt_seconds(max(300 // speedup_of(spec), 4 * monitoring_of(spec).scrape_interval_s))


def series_text(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def pick_labels(labels: dict[str, str], keys: tuple[str, ...]) -> dict[str, str]:
    return {k: labels[k] for k in keys if k in labels}


def fmt_value(x: float) -> str:
    """A number for people (annotations, panel text)."""
    return f"{x:g}"


def fmt_num(x: float) -> str:
    """A number for PromQL / promtool: exact."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


_RE_SPECIAL = set(".^$*+?()[]{}|\\")


def regex_literal(text: str) -> str:
    """`text` as an RE2 regex that matches exactly it (for relabel configs)."""
    return "".join("\\" + c if c in _RE_SPECIAL else c for c in text)


def promql_regex(values: list[str]) -> str:
    """An alternation matching exactly these values, ready to sit inside a PromQL "..." string."""
    return "|".join(regex_literal(v) for v in values).replace("\\", "\\\\")


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)

# The same representers over libyaml's emitter where PyYAML was built with it: the pure-Python
# emitter was most of the monitoring host's plan at 512 nodes (prometheus.yml and the rule
# tests: ~70k YAML nodes, 1.2 s; libyaml: 0.2 s). The two emitters write different bytes for a
# few inputs (characters outside printable ASCII, a key of 127+ characters, a string that starts
# with a newline or holds an empty line), so libyaml only writes a document made of what they
# are known to agree on (`_libyaml_agrees`); anything else goes through the Python emitter, as
# before. tests/test_monitoring.py compares the two on the example inventories and the edge cases.
if getattr(yaml, "__with_libyaml__", False):
    class _CDumper(yaml.CSafeDumper):  # type: ignore[name-defined,misc]
        pass

    _CDumper.add_representer(str, _str)
    _FAST_DUMPER: type | None = _CDumper
else:  # pragma: no cover - PyYAML without libyaml
    _FAST_DUMPER = None

# printable ASCII, lines joined by single newlines, at most one trailing newline
_AGREED_TEXT = re.compile(r"(?:[ -~]+(?:\n[ -~]+)*\n?)?")
_AGREED_KEY = re.compile(r"[ -~]{1,100}")


def _libyaml_agrees(obj: object) -> bool:
    """Whether both emitters write OBJ the same: plain data whose strings are in `_AGREED_TEXT`."""
    stack = [obj]
    text, key = _AGREED_TEXT.fullmatch, _AGREED_KEY.fullmatch
    while stack:
        o = stack.pop()
        # type(o) is X, not isinstance: a str or dict subclass may dump otherwise (and mypy narrows on it)
        if type(o) is str:
            if text(o) is None:
                return False
        elif type(o) is dict:
            for k, v in o.items():
                if type(k) is str:
                    if key(k) is None:
                        return False
                elif not (type(k) in (int, float, bool) or k is None):
                    return False
                stack.append(v)
        elif type(o) is list:
            stack.extend(o)
        elif not (type(o) in (int, float, bool) or o is None):
            return False
    return True


def to_yaml(obj: object, dumper: type | None = None) -> str:
    if dumper is None:
        dumper = _FAST_DUMPER if _FAST_DUMPER is not None and _libyaml_agrees(obj) else _Dumper
    return yaml.dump(obj, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)


# the old names, kept: tests/test_monitoring.py and the lab's monitoring test import them
_duration_s = duration_seconds
_scaled = scaled_duration
