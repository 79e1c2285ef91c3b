"""Alertmanager on the monitoring host (pdkit/monitoring/alertmanager.py, pdkit_monitoring.alerting).

`amtool check-config` (Debian's prometheus-alertmanager 0.25, installed by .ci/monitoring-prereqs.sh)
on the rendered config of every example inventory with a monitoring host and on one with every
receiver kind; the validation errors; the credential only in its 0600 file; and a real
Alertmanager on 127.0.0.1 started with the rendered config: ready, its route tree, a grouped
webhook notification, and every inhibition rule muting what it should and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from pdkit.inventory.loader import load, load_with_problems
from pdkit.monitoring.alertmanager import (
    ALERTMANAGER_CONFIG_PATH,
    ALERTMANAGER_CREDENTIALS_DIR,
    ALERTMANAGER_DEFAULTS_PATH,
    INHIBITIONS,
    alertmanager_config,
    credential_files,
    credential_path,
)
from pdkit.monitoring.common import PROMETHEUS_CONFIG_PATH, alertmanager_urls
from pdkit.monitoring.grafana import GRAFANA_DROPIN_PATH
from pdkit.monitoring.rules import ALERT_NAMES, alerts, rule_tests
from pdkit.render.plan import host_packages, plan_host
from pdkit.spec import RECEIVER_KINDS, SpecError
from pdkit.upstream.versions import APT_PINS
from roles.packages import install_spec
from tests.conftest import REPO, require, write_inventory
from tests.test_monitoring import _load_example

AMTOOL = shutil.which("amtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager")
AM_REASON = ("amtool / prometheus-alertmanager missing: install Debian's `prometheus-alertmanager` "
             "(sudo .ci/monitoring-prereqs.sh)")

# one receiver of every kind, each with the fields its kind needs
EVERY_KIND = [
    {"name": "hook", "kind": "webhook", "url": "https://hooks.example.com/pdkit"},
    {"name": "mail", "kind": "email", "to": "oncall@example.com", "from_address": "pdkit@example.com",
     "smarthost": "smtp.example.com:587", "auth_username": "pdkit", "require_tls": True},
    {"name": "chat", "kind": "slack", "channel": "#gpu-oncall"},
    {"name": "pager", "kind": "pagerduty"},
    {"name": "genie", "kind": "opsgenie"},
    {"name": "vo", "kind": "victorops", "routing_key": "gpu"},
    {"name": "room", "kind": "webex", "room_id": "Y2lzY29zcGFyazovL3Vz"},
]
# distinct values, so a leak names its receiver
SECRETS = {r["name"]: f"s3cret-{r['name']}-7f3a9c" for r in EVERY_KIND}
# Slack's credential is its incoming-webhook URL (validate refuses a bare token there)
SECRETS["chat"] = f"https://hooks.slack.com/services/{SECRETS['chat']}"


def _examples_with_monitoring() -> list[str]:
    return sorted(p.stem for p in (REPO / "inventories").glob("*.py") if "pdkit_monitoring" in p.read_text())


def _spec(tmp_path, base, alerting=None, secrets=None, **mon_fields):
    cluster, hosts = base
    if alerting is not None:
        hosts["mon01"]["pdkit_monitoring"]["alerting"] = alerting
    hosts["mon01"]["pdkit_monitoring"].update(mon_fields)
    if secrets is not None:
        cluster["secrets"] = {"alert_receivers": secrets}
    return load(write_inventory(tmp_path, hosts, cluster))


def _problems(tmp_path, base, alerting=None, secrets=None):
    cluster, hosts = base
    if alerting is not None:
        hosts["mon01"]["pdkit_monitoring"]["alerting"] = alerting
    if secrets is not None:
        cluster["secrets"] = {"alert_receivers": secrets}
    _, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    return problems


def _amtool_check(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    require(AMTOOL is not None, AM_REASON)
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    return subprocess.run([AMTOOL, "check-config", str(path)], capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------------------
# amtool check-config


@pytest.mark.parametrize("name", _examples_with_monitoring())
def test_every_example_inventorys_config_passes_amtool(name, tmp_path):
    spec = _load_example(name)
    res = _amtool_check(alertmanager_config(spec), tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(INHIBITIONS)} inhibit rules" in res.stdout


def test_the_examples_include_the_lab_and_a_real_cluster():
    assert {"lab", "cluster", "multinode"} <= set(_examples_with_monitoring())


def test_every_receiver_kind_passes_amtool(tmp_path, base):
    assert {r["kind"] for r in EVERY_KIND} == set(RECEIVER_KINDS)
    spec = _spec(tmp_path, base, {"receivers": EVERY_KIND, "critical_receiver": "pager", "warning_receiver": "chat",
                                  "routes": [{"match": {"role": "decode"}, "receiver": "vo"}]}, SECRETS)
    text = alertmanager_config(spec, credentials_dir=str(tmp_path / "creds"))
    res = _amtool_check(text, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(EVERY_KIND)} receivers" in res.stdout
    doc = yaml.safe_load(text)
    for r in EVERY_KIND:
        (got,) = [x for x in doc["receivers"] if x["name"] == r["name"]]
        key = RECEIVER_KINDS[r["kind"]].configs_key
        # the credential by path only, to the receiver's own file
        assert str(tmp_path / "creds" / r["name"]) in json.dumps(got[key]), got


def test_no_receiver_goes_to_the_null_receiver_with_a_warning(tmp_path, base):
    problems = _problems(tmp_path, base, {})
    (warning,) = [p for p in problems if p.field == "pdkit_monitoring.alerting.receivers"]
    assert warning.severity == "warning" and warning.host == "mon01" and "reach" in str(warning) and "no one" in str(warning)
    spec = load(write_inventory(tmp_path, base[1], base[0]))
    doc = yaml.safe_load(alertmanager_config(spec))
    assert doc["route"]["receiver"] == "pdkit-null" and doc["receivers"] == [{"name": "pdkit-null"}]
    res = _amtool_check(alertmanager_config(spec), tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_route_tree_by_cluster_then_routes_then_severity(tmp_path, base):
    spec = _spec(tmp_path, base, {"receivers": EVERY_KIND[:3], "critical_receiver": "chat", "warning_receiver": "mail",
                                  "routes": [{"match": {"alertname": "PdkitConfigDrift"}, "receiver": "hook"}],
                                  "group_wait_s": 10, "group_interval_s": 120, "repeat_interval_s": 7200}, SECRETS_FOR(EVERY_KIND[:3]))
    route = yaml.safe_load(alertmanager_config(spec))["route"]
    assert route["receiver"] == "hook"  # the first receiver, default_receiver being unset
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == ("10s", "2m", "2h")
    assert route["group_by"] == ["cluster", "alertname", "node"]
    (cluster_route,) = route["routes"]
    assert cluster_route["matchers"] == ['cluster="test"']
    assert [(r["receiver"], r["matchers"]) for r in cluster_route["routes"]] == [
        ("hook", ['alertname="PdkitConfigDrift"']), ("chat", ['severity="critical"']), ("mail", ['severity="warning"'])]


def SECRETS_FOR(receivers):  # noqa: N802 - reads like a constant at the call
    return {r["name"]: SECRETS[r["name"]] for r in receivers if r["kind"] != "webhook"}


# ---------------------------------------------------------------------------
# validation: every class of mistake, naming host and field


@pytest.mark.parametrize("alerting, secrets, field, words", [
    # a receiver without its credential
    ({"receivers": [{"name": "pager", "kind": "pagerduty"}]}, {},
     "pdkit_cluster.secrets.alert_receivers.pager", ["needs its credential", "routing (integration) key"]),
    ({"receivers": [EVERY_KIND[1]]}, {}, "pdkit_cluster.secrets.alert_receivers.mail", ["SMTP password"]),
    # an email credential that would never be sent
    ({"receivers": [{**EVERY_KIND[1], "auth_username": None}]}, {"mail": "x"},
     "pdkit_cluster.secrets.alert_receivers.mail", ["no auth_username"]),
    # an unknown receiver named in a route, and in each severity / default field
    ({"receivers": [EVERY_KIND[0]], "routes": [{"match": {"role": "decode"}, "receiver": "nobody"}]}, {},
     "pdkit_monitoring.alerting.routes[0].receiver", ["'nobody' is not a receiver", "valid: hook"]),
    ({"receivers": [EVERY_KIND[0]], "critical_receiver": "pagr"}, {},
     "pdkit_monitoring.alerting.critical_receiver", ["'pagr' is not a receiver"]),
    ({"receivers": [EVERY_KIND[0]], "warning_receiver": "x"}, {}, "pdkit_monitoring.alerting.warning_receiver", ["valid: hook"]),
    ({"receivers": [EVERY_KIND[0]], "default_receiver": "x"}, {}, "pdkit_monitoring.alerting.default_receiver", ["valid: hook"]),
    # duplicate names
    ({"receivers": [EVERY_KIND[0], {**EVERY_KIND[0], "url": "http://other:9/"}]}, {},
     "pdkit_monitoring.alerting.receivers[1].name", ["already used by receivers[0]"]),
])
def test_alerting_mistakes_are_errors_naming_host_and_field(tmp_path, base, alerting, secrets, field, words):
    problems = _problems(tmp_path, base, alerting, secrets)
    hits = [p for p in problems if p.field == field]
    assert hits, "\n".join(map(str, problems))
    assert hits[0].severity == "error" and hits[0].host == "mon01"
    for w in words:
        assert w in hits[0].message, hits[0]
    with pytest.raises(SpecError):
        load(write_inventory(tmp_path, base[1], base[0]))


@pytest.mark.parametrize("receiver, words", [
    ({"name": "hook", "kind": "webhook", "url": "ftp://x/"}, ["not an http:// or https:// URL"]),
    ({"name": "hook", "kind": "webhook", "url": "hooks.example.com"}, ["not an http:// or https:// URL"]),
    ({"name": "hook", "kind": "webhook"}, ["webhook receiver needs url"]),
    ({"name": "mail", "kind": "email", "to": "a@b.c"}, ["an email receiver needs from_address, smarthost"]),
    ({"name": "mail", "kind": "email", "to": "a@b", "from_address": "a@b", "smarthost": "smtp.example.com"}, ["not host:port"]),
    ({"name": "vo", "kind": "victorops", "routing_key": "r", "channel": "#x"}, ["channel is not a victorops receiver's field", "valid for victorops: routing_key"]),
    ({"name": "tg", "kind": "telegram"}, ["kind", "webhook"]),
    ({"name": "Bad Name", "kind": "pagerduty"}, ["name"]),
])
def test_a_bad_receiver_is_an_error_naming_its_field(tmp_path, base, receiver, words):
    problems = _problems(tmp_path, base, {"receivers": [receiver]}, {})
    hits = [p for p in problems if p.field.startswith("pdkit_monitoring.alerting.receivers") and p.severity == "error"]
    assert hits, "\n".join(map(str, problems))
    assert hits[0].host == "mon01"
    for w in words:
        assert w in str(hits[0]), hits[0]


def test_repeat_interval_below_group_interval_is_an_error(tmp_path, base):
    problems = _problems(tmp_path, base, {"group_interval_s": 600, "repeat_interval_s": 300})
    assert any(p.field.startswith("pdkit_monitoring.alerting") and "repeat_interval_s" in p.message for p in problems), problems


def test_an_unused_credential_is_a_warning(tmp_path, base):
    problems = _problems(tmp_path, base, {"receivers": [EVERY_KIND[0]]}, {"pagr": "x"})
    (hit,) = [p for p in problems if p.field == "pdkit_cluster.secrets.alert_receivers.pagr"]
    assert hit.severity == "warning" and "unused" in hit.message and "hook" in hit.message


def test_alertmanager_port_clash_is_an_error(tmp_path, base):
    cluster, hosts = base
    hosts["mon01"]["pdkit_monitoring"]["alertmanager_port"] = 9090
    _, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    assert any("alertmanager_port" in str(p) and p.severity == "error" for p in problems), problems


# ---------------------------------------------------------------------------
# inhibitions: only real alerts, each proven on a running Alertmanager below


def test_the_inhibition_table_names_only_real_alerts():
    for rule in INHIBITIONS:
        for name in (rule.source, *rule.targets):
            assert name in ALERT_NAMES, f"{name} is not an alert of pdkit.monitoring.rules"


def test_inhibition_equal_labels_are_on_source_and_targets(cluster_spec_alerts):
    """Each `equal` label is carried by the source alert and every target alert (else the rule never matches)."""
    for rule in INHIBITIONS:
        for name in (rule.source, *rule.targets):
            if name not in cluster_spec_alerts:
                continue  # not rendered for this inventory (e.g. rank alerts without spanning engines)
            for label in rule.equal:
                assert label in cluster_spec_alerts[name], f"{name} has no {label} label: {rule}"


@pytest.mark.parametrize("example", ["cluster", "multinode"])
def test_router_down_mutes_every_alert_about_its_workers(example):
    """Every alert whose subjects are all a router's (its scrape job: the labels of its host) but the down alert
    itself is one of PdkitRouterDown's targets: a router alert added later without joining the table fails here."""
    from pdkit.monitoring.alertmanager import ROUTER_WORKER_ALERTS
    from pdkit.monitoring.common import JOB_ROUTER

    per_router = {a.name for a in alerts(_load_example(example))
                  if a.subjects and all(s.get("job") == JOB_ROUTER for s in a.subjects)}
    assert "PdkitRouterPdRendezvousFailed" in per_router  # the check sees the router's PD alerts
    down = next(r for r in INHIBITIONS if r.source == "PdkitRouterDown")
    assert down.targets == ROUTER_WORKER_ALERTS
    assert per_router - {"PdkitRouterDown"} <= set(down.targets), per_router - set(down.targets)


@pytest.fixture(scope="module")
def cluster_spec_alerts():
    """{alert name: the labels of its first promtool firing case} over the multinode example."""
    spec = _load_example("multinode")
    doc = yaml.safe_load(rule_tests(spec))
    out: dict[str, set[str]] = {}
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            for exp in case.get("exp_alerts", []):
                out.setdefault(case["alertname"], set()).update(exp["exp_labels"])
    return out


# ---------------------------------------------------------------------------
# the plan: package pin, files, modes, the secret nowhere else


def test_monitoring_host_gets_alertmanager_pinned(tmp_path, base):
    spec = _spec(tmp_path, base)
    packages = host_packages(spec, spec.host("mon01"))
    assert "prometheus-alertmanager" in packages
    assert install_spec("prometheus-alertmanager") == f"prometheus-alertmanager={APT_PINS['prometheus-alertmanager']}"
    assert install_spec("prometheus") == "prometheus"
    assert "prometheus-alertmanager" not in host_packages(spec, spec.host("gpu01"))


def test_ci_installs_the_pinned_alertmanager():
    script = (REPO / ".ci" / "monitoring-prereqs.sh").read_text()
    assert f"ALERTMANAGER_VERSION={APT_PINS['prometheus-alertmanager']}\n" in script
    if ALERTMANAGER is not None:  # what this machine runs the tests with
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "prometheus-alertmanager"], capture_output=True, text=True)
        assert version.stdout == APT_PINS["prometheus-alertmanager"], version


def test_plan_files_service_and_daemon_args(tmp_path, base):
    spec = _spec(tmp_path, base, {"receivers": [EVERY_KIND[3]]}, SECRETS_FOR([EVERY_KIND[3]]))
    plan = plan_host(spec, spec.host("mon01"))
    cfg = plan.file(ALERTMANAGER_CONFIG_PATH)
    assert (cfg.mode, cfg.owner, cfg.group, cfg.secret) == ("0640", "root", "prometheus", False)
    cred = plan.file(credential_path("pager"))
    assert (cred.mode, cred.owner, cred.group, cred.secret) == ("0600", "prometheus", "prometheus", True)
    assert cred.content == SECRETS["pager"]
    defaults = plan.file(ALERTMANAGER_DEFAULTS_PATH).content
    assert 'ARGS="--web.listen-address=10.9.0.3:9093 --web.external-url=http://10.9.0.3:9093 --cluster.listen-address="' in defaults
    (svc,) = [s for s in plan.services if s.unit == "prometheus-alertmanager.service"]
    assert svc.health_url == "http://10.9.0.3:9093/-/ready"
    assert set(svc.files) == {ALERTMANAGER_CONFIG_PATH, ALERTMANAGER_DEFAULTS_PATH, credential_path("pager")}
    # an Alertmanager change does not restart Prometheus, and the other way round
    (prom,) = [s for s in plan.services if s.unit == "prometheus.service"]
    assert not set(prom.files) & set(svc.files) and PROMETHEUS_CONFIG_PATH in prom.files
    # Prometheus sends to it: prometheus.yml's alerting section, from alertmanager_urls
    prom_doc = yaml.safe_load(plan.file(PROMETHEUS_CONFIG_PATH).content)
    assert prom_doc["alerting"]["alertmanagers"][0]["static_configs"] == [{"targets": ["10.9.0.3:9093"]}]
    assert alertmanager_urls(spec) == ["http://10.9.0.3:9093"]


def test_the_credential_is_only_in_its_0600_file(tmp_path, base):
    spec = _spec(tmp_path, base, {"receivers": EVERY_KIND}, SECRETS)
    for host in spec.hosts:
        plan = plan_host(spec, host)
        for f in plan.files:
            leaked = [name for name, value in SECRETS.items() if value in f.content]
            if host.name == "mon01" and f.path.startswith(ALERTMANAGER_CREDENTIALS_DIR + "/"):
                assert leaked == [Path(f.path).name], f.path
                assert (f.mode, f.owner, f.secret) == ("0600", "prometheus", True)
            else:
                assert not leaked, f"{host.name}:{f.path} holds the credential of {leaked}"
        for s in plan.services:
            assert not any(v in json.dumps(s.__dict__, default=str) for v in SECRETS.values()), s.unit
    assert sorted(credential_files(spec)) == sorted(credential_path(n) for n in SECRETS)


def test_grafana_alerting_is_off_where_grafana_runs(tmp_path, base):
    spec = _spec(tmp_path, base, grafana=True)
    plan = plan_host(spec, spec.host("mon01"))
    dropin = plan.file(GRAFANA_DROPIN_PATH).content
    assert "Environment=GF_UNIFIED_ALERTING_ENABLED=false" in dropin
    (svc,) = [s for s in plan.services if s.unit == "grafana-server.service"]
    assert GRAFANA_DROPIN_PATH in svc.files
    off = _spec(tmp_path, base, grafana=False)
    assert not any(f.path == GRAFANA_DROPIN_PATH for f in plan_host(off, off.host("mon01")).files)


# ---------------------------------------------------------------------------
# a real Alertmanager with the rendered config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Sink:
    """A webhook receiver: records each notification's body."""

    def __init__(self, port: int = 0):
        self.bodies: list[dict] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                sink.bodies.append({"auth": self.headers.get("Authorization"), **json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read()) if "json" in r.headers.get("Content-Type", "") else r.read().decode()


def _post(url: str, data) -> None:
    req = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).close()


@pytest.fixture
def running(tmp_path, base):
    """A real prometheus-alertmanager on 127.0.0.1 with the config pdkit renders (credentials in temp files)."""
    require(ALERTMANAGER is not None, AM_REASON)
    # the spec first: pdkit.inventory.loader imports pyinfra's CLI, whose gevent-patched importer must not
    # meet the sink's thread
    sink_port = _free_port()
    receivers = [{"name": "sink", "kind": "webhook", "url": f"http://127.0.0.1:{sink_port}/"}, EVERY_KIND[3]]
    spec = _spec(tmp_path, base, {"receivers": receivers, "warning_receiver": "sink", "critical_receiver": "sink",
                                  "group_wait_s": 1, "group_interval_s": 2, "repeat_interval_s": 3600},
                 {"sink": "bearer-b7c1", "pager": SECRETS["pager"]})
    sink = _Sink(sink_port)
    creds = tmp_path / "creds"
    creds.mkdir()
    for path, secret in credential_files(spec, credentials_dir=str(creds)).items():
        Path(path).write_text(secret)
        os.chmod(path, 0o600)
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(alertmanager_config(spec, credentials_dir=str(creds)))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "w"))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"{url}/-/ready")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "am.log").read_text()
                time.sleep(0.2)
        yield url, sink, spec
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _alert(name: str, **labels: str) -> dict:
    return {"labels": {"alertname": name, "cluster": "test", **labels}}


def test_real_alertmanager_runs_the_rendered_config(running):
    url, _, _ = running
    status = _get(f"{url}/api/v2/status")
    assert status["cluster"]["status"] == "disabled"  # no HA gossip
    loaded = yaml.safe_load(status["config"]["original"])
    assert loaded["route"]["routes"][0]["matchers"] == ['cluster="test"']
    assert len(loaded["inhibit_rules"]) == len(INHIBITIONS)
    assert {r["name"] for r in _get(f"{url}/api/v2/receivers")} == {"sink", "pager"}


def test_one_grouped_webhook_notification_per_node(running):
    url, sink, _ = running
    # both engines of one node wedge: one notification carrying both, with the bearer credential
    _post(f"{url}/api/v2/alerts", [_alert("PdkitEngineWedged", node="gpu01", instance=f"gpu01/{e}", severity="critical")
                                   for e in ("prefill", "decode")])
    deadline = time.monotonic() + 15
    while not sink.bodies and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # a second notification, if any, would come within a group interval
    assert len(sink.bodies) == 1, sink.bodies
    (body,) = sink.bodies
    assert body["auth"] == "Bearer bearer-b7c1" and body["receiver"] == "sink"
    assert sorted(a["labels"]["instance"] for a in body["alerts"]) == ["gpu01/decode", "gpu01/prefill"]


def _statuses_once_suppressed(url: str, expected: list[dict], timeout_s: float = 10.0) -> dict:
    """Every alert's status (by its label set), read once EXPECTED are all marked suppressed or after
    TIMEOUT_S. Alertmanager's inhibitor takes posted alerts from its own subscription, so a read right
    after the post can show a target not yet marked (seen once on a busy machine); every alert is then
    judged on that same read."""
    keys = [frozenset(a["labels"].items()) for a in expected]
    deadline = time.monotonic() + timeout_s
    while True:
        got = {frozenset(a["labels"].items()): a["status"] for a in _get(f"{url}/api/v2/alerts")}
        if all(k in got and got[k]["state"] == "suppressed" for k in keys) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


@pytest.mark.parametrize("rule", INHIBITIONS, ids=lambda r: f"{r.source}-{r.targets[0]}")
def test_each_inhibition_mutes_its_targets_and_nothing_else(running, rule):
    url, _, _ = running

    def labels(matchers: tuple[str, ...]) -> dict[str, str]:
        out = {}
        for m in matchers:
            if "!=" in m:  # a negative matcher: any other value
                k, v = m.split("!=")
                out[k] = "other-than-" + json.loads(v)
            else:
                k, v = m.split("=", 1)
                out[k] = json.loads(v)
        return out

    same = {"node": "gpu01", "instance": "gpu01/decode"}
    source = _alert(rule.source, **same, **labels(rule.source_match))
    # every target, and each again elsewhere: its `equal` labels differ (and its instance, so that no
    # two of them name one engine, where one's inhibition would reach the other)
    targets = [_alert(t, **same, **labels(rule.target_match)) for t in rule.targets if t != rule.source]

    def away(t: str) -> dict[str, str]:
        return {**same, "instance": f"elsewhere/{t}", **{k: f"elsewhere-{t}" for k in rule.equal if k != "cluster"}}

    elsewhere = [_alert(t, **away(t), **labels(rule.target_match)) for t in rule.targets]
    _post(f"{url}/api/v2/alerts", [source, *targets, *elsewhere])
    got = _statuses_once_suppressed(url, targets)

    def status(alert: dict) -> dict:
        return got[frozenset(alert["labels"].items())]

    for target in targets:
        assert status(target)["state"] == "suppressed" and status(target)["inhibitedBy"], (target, got)
    for other in elsewhere:
        assert status(other)["state"] == "active", (other, got)
    assert status(source)["state"] == "active", got


def test_a_down_engine_mutes_only_its_own_symptoms(running):
    """PdkitEngineDown of gpu01/decode mutes its own wedge, not the wedge of gpu01/prefill beside it
    (the rule's scope is the engine, not the node: a node-wide `equal` would hide a second incident)."""
    url, _, _ = running
    down = _alert("PdkitEngineDown", node="gpu01", instance="gpu01/decode", job="sglang")
    own = _alert("PdkitEngineWedged", node="gpu01", instance="gpu01/decode")
    beside = _alert("PdkitEngineWedged", node="gpu01", instance="gpu01/prefill")
    _post(f"{url}/api/v2/alerts", [down, own, beside])
    got = {k: v["state"] for k, v in _statuses_once_suppressed(url, [own]).items()}
    assert got[frozenset(own["labels"].items())] == "suppressed", got
    assert got[frozenset(beside["labels"].items())] == "active", got


@pytest.mark.parametrize("group_by", [["..."], []])
def test_alertmanagers_own_grouping_forms_are_accepted_and_amtool_takes_them(group_by, tmp_path, base):
    """Issue 46: ['...'] (group by every label) and [] (one group) are Alertmanager's documented forms."""
    spec = _spec(tmp_path, base, {"receivers": EVERY_KIND[:1], "group_by": group_by}, {"hook": SECRETS["hook"]})
    text = alertmanager_config(spec, credentials_dir=str(tmp_path / "creds"))
    assert yaml.safe_load(text)["route"]["group_by"] == group_by
    res = _amtool_check(text, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_grouping_wildcard_beside_labels_is_refused_as_alertmanager_does(tmp_path, base):
    problems = _problems(tmp_path, base, {"receivers": EVERY_KIND[:1], "group_by": ["...", "node"]})
    assert any("'...' (group by every label) stands alone" in str(p) for p in problems), problems


@pytest.mark.parametrize("field, value, phrase", [
    ("to", "a@example.com; b@example.com", "a semicolon does not separate addresses there"),
    ("to", "oncall", "'oncall' is not an email address Alertmanager can parse"),
    ("from_address", "pdkit at example.com", "valid: name@example.com or Name <name@example.com>"),
])
def test_an_email_address_list_alertmanager_cannot_parse_is_refused(field, value, phrase, tmp_path, base):
    """Issue 46: Alertmanager reads `to` with Go's mail.ParseAddressList; Outlook's semicolons fail every mail."""
    mail = {**EVERY_KIND[1], field: value}
    problems = _problems(tmp_path, base, {"receivers": [mail]}, {"mail": SECRETS["mail"]})
    assert any(phrase in str(p) for p in problems), problems


def test_a_comma_list_with_display_names_passes_amtool(tmp_path, base):
    mail = {**EVERY_KIND[1], "to": "oncall@example.com, GPU team <gpu@example.com>"}
    spec = _spec(tmp_path, base, {"receivers": [mail]}, {"mail": SECRETS["mail"]})
    res = _amtool_check(alertmanager_config(spec, credentials_dir=str(tmp_path / "creds")), tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
