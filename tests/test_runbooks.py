"""Runbooks (issue 31 item 2) and the router's PD/overload alerts (item 4).

Every alert carries a `runbook_url` annotation to its `### <AlertName>` entry in docs/monitoring.md,
generated from the alert records' runbooks (pdkit.monitoring.alertrules; rules.RUNBOOKS by name) with the alert
table; promtool's exp_annotations check the link. The
router alerts on smg 1.13.0's breaker, retry, overload and admission counters are declared only for a
router whose release exports what they read, and each of their generated promtool cases can fail.
"""

from __future__ import annotations

import copy
import itertools
import re
import unicodedata

import pytest
import yaml

from pdkit.contract import alerttable
from pdkit.monitoring.alertrules import ALERT_NAMES
from pdkit.monitoring.common import ROUTER_BY, RULES_RELATIVE_PATH, WORKER_BY, to_yaml
from pdkit.monitoring.rules import RUNBOOKS, alert_rules, alerts, rule_tests
from pdkit.upstream import catalogue as cat
from pdkit.upstream.metricnames import ROUTER
from tests.conftest import REPO
from tests.test_monitoring import _load_example, _promtool, _spec, _write_monitoring_dir

DOC = REPO / "docs" / "monitoring.md"
ROUTER_ALERTS = {
    # alert: (the families it reads, its label set)
    "PdkitRouterCircuitOpen": ((ROUTER["worker_cb_transitions"],), WORKER_BY),
    "PdkitRouterRetriesExhausted": ((ROUTER["retries_exhausted"],), (*ROUTER_BY, "worker_type")),
    "PdkitRouterWorkersOverloaded": ((ROUTER["overload_shed"], ROUTER["overload_fallback"]), ROUTER_BY),
    "PdkitRouterAdmissionRejected": ((ROUTER["admission"],), ROUTER_BY),
    "PdkitRouterPdRendezvousFailed": ((ROUTER["pd_rendezvous_failures"],), (*ROUTER_BY, "leg")),
}
_dirs = itertools.count()


def github_anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = heading.strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(markdown: str) -> list[str]:
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(github_anchor(m.group(1)))
    return out


@pytest.fixture(scope="module")
def cluster_spec():
    return _load_example("cluster")


@pytest.fixture(scope="module", params=["lab", "cluster", "multinode"])
def example(request):
    return _load_example(request.param)


# ---------------------------------------------------------------------------
# runbooks


def test_every_alert_has_exactly_one_runbook_with_something_to_run():
    assert set(RUNBOOKS) == set(ALERT_NAMES)
    for name, rb in RUNBOOKS.items():
        assert rb.means and rb.causes and rb.run, name
        # something to run: a command in backticks
        assert any("`" in step for step in rb.run), name


def _bare_tags(markdown: str) -> list[str]:
    """`<word>` outside code spans and HTML comments: markdown renders it as an (unknown, dropped) HTML tag."""
    text = re.sub(r"<!--.*?-->", "", re.sub(r"`[^`\n]*`", "", markdown))
    return re.findall(r"</?[A-Za-z][^>\n]*>", text)


def test_the_runbooks_render_every_placeholder():
    assert _bare_tags(alerttable.table() + alerttable.runbooks()) == []
    assert _bare_tags("on <node> run `journalctl -u pdkit-engine-<engine>`") == ["<node>"]


def test_the_doc_refuses_an_alert_without_a_runbook(monkeypatch):
    runbooks = dict(RUNBOOKS)
    del runbooks["PdkitEngineWedged"]
    monkeypatch.setattr(alerttable, "RUNBOOKS", runbooks)
    with pytest.raises(ValueError, match="missing \\['PdkitEngineWedged'\\]"):
        alerttable.runbooks()
    runbooks = {**RUNBOOKS, "PdkitNoSuchAlert": RUNBOOKS["PdkitEngineDown"]}
    monkeypatch.setattr(alerttable, "RUNBOOKS", runbooks)
    with pytest.raises(ValueError, match="not an alert \\['PdkitNoSuchAlert'\\]"):
        alerttable.table()


def test_the_doc_carries_the_generated_table_and_runbooks():
    doc = DOC.read_text()
    stale = "docs/monitoring.md is stale: python -m pdkit.contract.alerttable --write docs/monitoring.md"
    assert alerttable.table() in doc, stale
    assert alerttable.runbooks() in doc, stale
    # the table's rows link to the entries
    for name in ALERT_NAMES:
        assert f"| [`{name}`](#{name.lower()}) |" in alerttable.table(), name


def test_write_into_refreshes_every_block(tmp_path):
    page = tmp_path / "monitoring.md"
    page.write_text(f"# x\n\n{alerttable.BEGIN}\nSTALE-TEXT\n{alerttable.END}\n\nmiddle\n\n"
                    f"{alerttable.RUNBOOKS_BEGIN}\nSTALE-TEXT\n{alerttable.RUNBOOKS_END}\n\nlater\n\n"
                    f"{alerttable.INHIBITIONS_BEGIN}\nSTALE-TEXT\n{alerttable.INHIBITIONS_END}\n\ntail\n")
    alerttable.write_into(str(page))
    text = page.read_text()
    assert alerttable.table() in text and alerttable.runbooks() in text and alerttable.inhibitions() in text
    assert "STALE-TEXT" not in text
    assert "\nmiddle\n" in text and "\nlater\n" in text and text.endswith("tail\n")
    page.write_text(f"{alerttable.BEGIN}\n{alerttable.END}\n")
    with pytest.raises(ValueError, match="runbooks:begin"):
        alerttable.write_into(str(page))


def test_every_rule_links_to_a_heading_of_the_doc(example):
    """Each rendered rule's runbook_url is the default base plus the anchor of exactly one heading of
    docs/monitoring.md, the alert's own runbook entry."""
    anchors = _anchors(DOC.read_text())
    rules = yaml.safe_load(alert_rules(example))["groups"][0]["rules"]
    assert rules
    for rule in rules:
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == "docs/monitoring.md" and (REPO / base).is_file(), rule["alert"]
        assert anchors.count(anchor) == 1, (rule["alert"], anchor)
        assert anchor == github_anchor(rule["alert"])
    assert f"### {rules[0]['alert']}" in DOC.read_text()


def test_the_heading_check_can_fail():
    assert github_anchor("PdkitEngineDown") == "pdkitenginedown"
    assert github_anchor("The lab's faster alert clock (`pdkit_monitoring.lab_alert_speedup`)") == \
        "the-labs-faster-alert-clock-pdkit_monitoringlab_alert_speedup"
    assert "pdkitnosuchalert" not in _anchors(DOC.read_text())


def test_runbook_url_follows_the_spec_base(base, tmp_path):
    cluster, hosts = base
    hosts["mon01"]["pdkit_monitoring"] = {"runbook_base_url": "https://git.example.com/ops/pdkit/docs/monitoring.md"}
    spec = _spec(tmp_path, cluster, hosts)
    for rule in yaml.safe_load(alert_rules(spec))["groups"][0]["rules"]:
        assert rule["annotations"]["runbook_url"] == \
            f"https://git.example.com/ops/pdkit/docs/monitoring.md#{rule['alert'].lower()}"
    d = _write_monitoring_dir(spec, tmp_path / "mon")
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_checks_every_alerts_runbook_url(cluster_spec, tmp_path):
    """Every firing case expects the runbook_url, so a rule whose link is wrong fails its promtool cases."""
    doc = yaml.safe_load(rule_tests(cluster_spec))
    expected = {}
    for t in doc["tests"]:
        for check in t["alert_rule_test"]:
            for e in check["exp_alerts"]:
                expected.setdefault(check["alertname"], set()).add(e["exp_annotations"]["runbook_url"])
    assert expected == {a.name: {f"docs/monitoring.md#{a.name.lower()}"} for a in alerts(cluster_spec)}
    d = _write_monitoring_dir(cluster_spec, tmp_path / "mon")
    assert _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d).returncode == 0
    rules = d / RULES_RELATIVE_PATH
    rules.write_text(rules.read_text().replace("docs/monitoring.md#pdkitenginewedged", "docs/monitoring.md#wrong"))
    res = _promtool("test", "rules", "rules/pdkit.test.yml", cwd=d)
    assert res.returncode != 0 and "PdkitEngineWedged" in res.stdout + res.stderr


# ---------------------------------------------------------------------------
# the router's PD and overload alerts


def _router_alerts(spec) -> dict:
    return {a.name: a for a in alerts(spec) if a.name in ROUTER_ALERTS}


def test_router_alerts_read_only_what_the_smg_release_exports(cluster_spec):
    smg, old = cat.router_families("smg", "1.13.0"), cat.router_families("sglang-router", "0.3.2")
    router = _router_alerts(cluster_spec)
    assert set(router) == set(ROUTER_ALERTS)
    for name, (families, labels) in ROUTER_ALERTS.items():
        a = router[name]
        for f in families:
            assert f in smg and f not in old, (name, f)
            assert f in a.expr, (name, f)
        # the labels the inhibitions key on: cluster and node = the router's host
        for s in a.subjects:
            exp = a.exp_labels(s)
            assert tuple(exp) == labels, name
            assert exp["node"] == s["instance"].split("/")[0] and exp["role"] == "router", name
    # the breaker alert: one subject per (router, worker), like PdkitRouterWorkerUnhealthy
    unhealthy = next(a for a in alerts(cluster_spec) if a.name == "PdkitRouterWorkerUnhealthy")
    assert router["PdkitRouterCircuitOpen"].subjects == unhealthy.subjects


def test_no_router_alert_where_the_release_lacks_its_families(base, tmp_path):
    """sglang-router 0.3.2 (SGLang 0.5.17's default) exports none of the families: no rule that can never fire."""
    cluster, hosts = base
    cluster["sglang_version"] = "0.5.17"
    spec = _spec(tmp_path, cluster, hosts)
    assert spec.router_release(spec.router_hosts[0]) == ("sglang-router", "0.3.2")
    assert _router_alerts(spec) == {}
    assert "PdkitRouterWorkerUnhealthy" in {a.name for a in alerts(spec)}  # both releases export health
    cluster["sglang_version"] = "0.5.23"
    hosts["gpu01"]["pdkit_router"]["package"] = "sglang-router"
    hosts["gpu01"]["pdkit_router"]["version"] = "0.3.2"
    explicit = _spec(tmp_path, cluster, hosts)
    assert explicit.router_release(explicit.router_hosts[0]) == ("sglang-router", "0.3.2")
    assert _router_alerts(explicit) == {}


def _run(spec, tests, tmp_path) -> int:
    sub = tmp_path / f"case{next(_dirs)}"
    (sub / "rules").mkdir(parents=True)
    (sub / RULES_RELATIVE_PATH).write_text(alert_rules(spec))
    doc = yaml.safe_load(rule_tests(spec))
    (sub / "rules" / "t.yml").write_text(to_yaml({**doc, "tests": tests}))
    return _promtool("test", "rules", "rules/t.yml", cwd=sub).returncode


@pytest.mark.parametrize("name", sorted(ROUTER_ALERTS))
def test_router_alert_cases_pass_and_can_fail(name, cluster_spec, tmp_path):
    """The alert's generated cases pass; its firing case with the subject healthy fails, and its quiet
    case expecting the alert fails: each case really decides."""
    doc = yaml.safe_load(rule_tests(cluster_spec))
    mine = [t for t in doc["tests"] if t["alert_rule_test"][0]["alertname"] == name]
    alone = next(t for t in mine if " alone" in t["name"])
    quiet = next(t for t in mine if "stays quiet while every subject is healthy" in t["name"])
    assert alone["alert_rule_test"][0]["exp_alerts"] and quiet["alert_rule_test"][0]["exp_alerts"] == []
    assert _run(cluster_spec, mine, tmp_path) == 0
    a = next(a for a in alerts(cluster_spec) if a.name == name)
    healthy = copy.deepcopy(alone)
    healthy["input_series"] = [{"series": s, "values": v} for subj in a.subjects for s, v in a.case(subj, False)]
    assert _run(cluster_spec, [healthy], tmp_path) != 0
    expecting = copy.deepcopy(quiet)
    expecting["alert_rule_test"][0]["exp_alerts"] = copy.deepcopy(alone["alert_rule_test"][0]["exp_alerts"])
    assert _run(cluster_spec, [expecting], tmp_path) != 0


def test_one_breaker_trip_does_not_page(cluster_spec):
    """A restart trips the breaker once and it closes again: the case that says so is generated (and run by
    test_router_alert_cases_pass_and_can_fail's full set)."""
    doc = yaml.safe_load(rule_tests(cluster_spec))
    names = [t["name"] for t in doc["tests"] if t["alert_rule_test"][0]["alertname"] == "PdkitRouterCircuitOpen"]
    assert any("after one trip" in n for n in names), names
