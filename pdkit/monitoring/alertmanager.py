"""Alertmanager on the monitoring host: spec -> alertmanager.yml (route tree, inhibitions, receivers),
the receivers' credential files, and the daemon's arguments.

Pure: a `ClusterSpec` in, text out, byte-identical for the same spec. Credentials are never in
alertmanager.yml: each receiver's is in its own file (`credential_path`), mode 0600 owned by the
user Debian's unit runs Alertmanager as, and the config names it through Alertmanager 0.25's
`*_file` fields (pdkit.render.plan lays the files down; tests/test_alertmanager.py greps every rendered
file and argv for the secret).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdkit.monitoring.alertrules import ENGINE, HOST, NODE, ROUTER_WORKERS, engines, node, router, scoped
from pdkit.monitoring.common import alertmanager_urls, monitoring_of, to_yaml
from pdkit.spec import NULL_RECEIVER, RECEIVER_KINDS, ClusterSpec, HostSpec, Receiver, receiver_needs_credential

# Debian's prometheus-alertmanager reads this config by default (`--config.file`); beside prometheus.yml
ALERTMANAGER_CONFIG_PATH = "/etc/prometheus/alertmanager.yml"
# one file per receiver credential, named by the receiver
ALERTMANAGER_CREDENTIALS_DIR = "/etc/prometheus/alertmanager-credentials"
# Debian's unit: EnvironmentFile=/etc/default/prometheus-alertmanager, ExecStart=... $ARGS
ALERTMANAGER_DEFAULTS_PATH = "/etc/default/prometheus-alertmanager"
ALERTMANAGER_UNIT = "prometheus-alertmanager.service"
# Debian's unit runs it as User=prometheus (/lib/systemd/system/prometheus-alertmanager.service): the
# credential files are this user's, mode 0600, since nobody else needs to read them
ALERTMANAGER_USER = "prometheus"


@dataclass(frozen=True)
class Inhibition:
    """While SOURCE fires (with SOURCE_MATCH), TARGETS with the same EQUAL labels are not sent."""

    source: str
    targets: tuple[str, ...]
    equal: tuple[str, ...]
    why: str
    # extra matchers on the source / targets (Alertmanager matcher syntax)
    source_match: tuple[str, ...] = ()
    target_match: tuple[str, ...] = ()


# The alerts of each scope, generated from the records (pdkit.monitoring.alertrules: each record's `scope`)
# Alerts that describe one engine (they carry its `instance`, pdkit.monitoring.common.ENGINE_BY)
ENGINE_SYMPTOMS = scoped(ENGINE)
# What a router says about its workers (they carry the router's `node`)
ROUTER_WORKER_ALERTS = scoped(ROUTER_WORKERS)
# Everything else that can fire about one host (they carry its `node`)
NODE_ALERTS = scoped(NODE, ENGINE, ROUTER_WORKERS)

# The inhibition table (docs/monitoring.md "Inhibitions"): each source is a record, each target list a scope's
# alerts; tests/test_alertmanager.py checks every name carries the `equal` labels, and proves each rule on a
# running Alertmanager.
INHIBITIONS: tuple[Inhibition, ...] = (
    Inhibition(
        node.NODE_DOWN.name, NODE_ALERTS, HOST.labels,
        "the host is down or cut off (its node_exporter cannot be scraped; it fires before its engines' "
        "PdkitEngineDown): its engines', exporters' and router's alerts are the same incident, one page for the node",
    ),
    Inhibition(
        router.ROUTER_DOWN.name, ROUTER_WORKER_ALERTS, ROUTER_WORKERS.labels,
        "a router that is down says nothing true about its workers; the router page is the incident",
    ),
    Inhibition(
        engines.ENGINE_DOWN.name, ENGINE_SYMPTOMS, ENGINE.labels,
        "a stopped engine has no throughput, no progress and a queue nobody serves: the down page says it all",
    ),
)


def _duration(seconds: int) -> str:
    """Seconds as Alertmanager's duration (4h, 5m, 30s)."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _matcher(label: str, value: str) -> str:
    # Alertmanager's matcher value is a double-quoted Go-style string: JSON's escaping is that
    return f"{label}={json.dumps(value)}"


def _names(alerts: tuple[str, ...]) -> str:
    return "|".join(alerts)


def credential_path(receiver_name: str, credentials_dir: str = ALERTMANAGER_CREDENTIALS_DIR) -> str:
    """The file holding RECEIVER_NAME's credential on the monitoring host."""
    return f"{credentials_dir}/{receiver_name}"


def _has_credential(spec: ClusterSpec, receiver: Receiver) -> bool:
    return receiver.name in spec.cluster.secrets.alert_receivers and receiver_needs_credential(receiver) is not False


def _receiver_config(spec: ClusterSpec, r: Receiver, credentials_dir: str) -> dict:
    """One receiver's Alertmanager config: its fields, its credential only by file path."""
    cred = credential_path(r.name, credentials_dir) if _has_credential(spec, r) else None
    c: dict = {"send_resolved": r.send_resolved}
    bearer = {"http_config": {"authorization": {"type": "Bearer", "credentials_file": cred}}} if cred else {}
    if r.kind == "webhook":
        c.update({"url": r.url, **bearer})
    elif r.kind == "email":
        c.update({"to": r.to, "from": r.from_address, "smarthost": r.smarthost})
        if r.auth_username is not None:
            c.update({"auth_username": r.auth_username, "auth_password_file": cred})
        if r.require_tls is not None:
            c["require_tls"] = r.require_tls
    elif r.kind == "slack":
        c["api_url_file"] = cred
        if r.channel is not None:
            c["channel"] = r.channel
    elif r.kind == "pagerduty":
        c["routing_key_file"] = cred
    elif r.kind == "opsgenie":
        c["api_key_file"] = cred
    elif r.kind == "victorops":
        c.update({"api_key_file": cred, "routing_key": r.routing_key})
    elif r.kind == "webex":
        c.update({"room_id": r.room_id, **bearer})
    else:  # pragma: no cover - RECEIVER_KINDS and this function change together
        raise AssertionError(f"receiver kind {r.kind} has no rendering")
    return {"name": r.name, RECEIVER_KINDS[r.kind].configs_key: [c]}


def route_tree(spec: ClusterSpec) -> dict:
    """The route: everything of this cluster, then the inventory's routes, then by severity."""
    alerting = monitoring_of(spec).alerting
    root: dict = {
        "receiver": alerting.effective_default(),
        "group_by": list(alerting.group_by),
        "group_wait": _duration(alerting.group_wait_s),
        "group_interval": _duration(alerting.group_interval_s),
        "repeat_interval": _duration(alerting.repeat_interval_s),
    }
    if not alerting.receivers:
        return root
    children = [{"receiver": r.receiver, "matchers": [_matcher(k, v) for k, v in sorted(r.match.items())]}
                for r in alerting.routes]
    for severity, receiver in (("critical", alerting.critical_receiver), ("warning", alerting.warning_receiver)):
        if receiver is not None:
            children.append({"receiver": receiver, "matchers": [_matcher("severity", severity)]})
    # by cluster: every series carries `cluster` (Prometheus' external label); an alert of another
    # cluster (an Alertmanager fed by two) keeps to the default receiver
    if children:
        root["routes"] = [{"receiver": alerting.effective_default(),
                           "matchers": [_matcher("cluster", spec.cluster.name)], "routes": children}]
    return root


def inhibit_rules() -> list[dict]:
    return [{
        "source_matchers": [f'alertname="{i.source}"', *i.source_match],
        "target_matchers": [f'alertname=~"{_names(i.targets)}"', *i.target_match],
        "equal": list(i.equal),
    } for i in INHIBITIONS]


def alertmanager_config(spec: ClusterSpec, credentials_dir: str = ALERTMANAGER_CREDENTIALS_DIR) -> str:
    """alertmanager.yml: the route tree, the inhibitions, the receivers (credentials by file path only)."""
    alerting = monitoring_of(spec).alerting
    receivers = [_receiver_config(spec, r, credentials_dir) for r in alerting.receivers] or [{"name": NULL_RECEIVER}]
    doc = {"route": route_tree(spec), "inhibit_rules": inhibit_rules(), "receivers": receivers}
    header = (f"# Generated by pdkit for cluster {spec.cluster.name}; do not edit: change the inventory and redeploy.\n"
              f"# Credentials are not here: each is in {credentials_dir}/<receiver> (mode 0600).\n")
    return header + to_yaml(doc)


def credential_files(spec: ClusterSpec, credentials_dir: str = ALERTMANAGER_CREDENTIALS_DIR) -> dict[str, str]:
    """{path: secret} for every receiver that has a credential. Values are real: never log or print this."""
    creds = spec.cluster.secrets.alert_receivers
    return {credential_path(r.name, credentials_dir): creds[r.name].get_secret_value()
            for r in monitoring_of(spec).alerting.receivers if _has_credential(spec, r)}


def alertmanager_url(spec: ClusterSpec, host: HostSpec) -> str:
    """This monitoring host's Alertmanager URL (pdkit.monitoring.common.alertmanager_urls decides it)."""
    return alertmanager_urls(spec)[[h.name for h in spec.monitoring_hosts].index(host.name)]


def alertmanager_args(spec: ClusterSpec, host: HostSpec) -> list[str]:
    """The daemon's arguments (ARGS of its /etc/default file): listen on the planned address only, no HA gossip."""
    url = alertmanager_url(spec, host)
    return [
        f"--web.listen-address={urlsplit(url).netloc}",
        # links in notifications point here
        f"--web.external-url={url}",
        # one Alertmanager per cluster: gossip off (its default listens on 0.0.0.0:9094)
        "--cluster.listen-address=",
    ]


def alertmanager_defaults(spec: ClusterSpec, host: HostSpec) -> str:
    return f'# Rendered by pdkit\nARGS="{" ".join(alertmanager_args(spec, host))}"\n'


__all__ = [
    "ALERTMANAGER_CONFIG_PATH", "ALERTMANAGER_CREDENTIALS_DIR", "ALERTMANAGER_DEFAULTS_PATH", "ALERTMANAGER_UNIT",
    "ALERTMANAGER_USER", "INHIBITIONS", "Inhibition", "alertmanager_args", "alertmanager_config",
    "alertmanager_defaults",
    "alertmanager_url", "credential_files", "credential_path", "inhibit_rules", "route_tree",
]
