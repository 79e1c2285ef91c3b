"""One record per alert (issue 48 item 4): pdkit/monitoring/alertrules holds each alert whole (rule, `for`,
severity, scope, runbook, promtool cases), and the rules file, the promtool tests, the runbooks, Alertmanager's
inhibitions and docs/monitoring.md's tables are generated from the records. These tests fail when an alert is
declared without a runbook or a scope, when a scope, an inhibition or a runbook names an alert no record has,
and when the decode-graph rule is stated anywhere but its one home."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pdkit.contract import alerttable
from pdkit.monitoring import alertmanager, alertrules
from pdkit.monitoring.alertrules import ALERT_NAMES, base, engines
from pdkit.monitoring.common import engine_instance
from pdkit.monitoring.rules import RUNBOOKS, alerts
from tests.conftest import REPO
from tests.test_monitoring import _load_example

ALERT_NAME = re.compile(r"\bPdkit[A-Z]\w+")
# alerts the doc names as gone, on purpose (docs/monitoring.md "KV transfer and bootstrap failures")
FORMER_ALERTS = {"PdkitPdRequestFailures"}
DOC = REPO / "docs" / "monitoring.md"


def _record(name: str):
    return next(r for r in alertrules.ALERTS if r.name == name)


def test_every_alert_is_one_record_with_a_runbook_and_a_scope():
    names = [r.name for r in alertrules.ALERTS]
    assert len(names) == len(set(names)) == len(ALERT_NAMES) == 21
    assert tuple(names) == ALERT_NAMES
    for r in alertrules.ALERTS:
        assert r.scope in base.SCOPES, r.name
        assert r.severity in base.SEVERITIES, r.name
        assert r.runbook.means and r.runbook.causes and r.runbook.run, r.name
    assert RUNBOOKS == {r.name: r.runbook for r in alertrules.ALERTS}
    # the scope order lists the same records
    assert sorted(r.name for r in alertrules.SCOPE_ORDER) == sorted(names)
    # the router's worker alerts, one group in both orders: exactly the records of that scope
    assert {r.name for r in alertrules.router.WORKER_ALERTS} == {
        r.name for r in alertrules.ALERTS if r.scope == base.ROUTER_WORKERS}


@pytest.mark.parametrize("example", ["lab", "cluster", "multinode", "a6000"])
def test_every_rendered_alert_comes_from_its_record(example):
    """The rendered alert carries its record's name, severity and `for` (scaled by the lab's clock); nothing
    renders an alert the registry does not list."""
    spec = _load_example(example)
    c = base.context(spec)
    for a in alerts(spec):
        r = _record(a.name)
        assert (a.severity, a.for_) == (r.severity, c.for_(r.for_)), a.name


def _bad(record, **fields):
    return dataclasses.replace(record, **fields)


def test_check_records_refuses_a_record_without_a_runbook_or_scope_and_a_name_twice():
    records, order = alertrules.ALERTS, alertrules.SCOPE_ORDER
    alertrules.check_records(records, order)  # the registry as it is passes
    wedged = _record("PdkitEngineWedged")
    i = records.index(wedged)

    def swap(new):
        return records[:i] + (new,) + records[i + 1:], order[:order.index(wedged)] + (new,) + \
            order[order.index(wedged) + 1:]

    for bad, match in (
        (_bad(wedged, runbook=base.Runbook(means="", causes=("x",), run=("`y`",))), "PdkitEngineWedged: its runbook"),
        (_bad(wedged, runbook=base.Runbook(means="m", causes=(), run=("`y`",))), "PdkitEngineWedged: its runbook"),
        (_bad(wedged, runbook=None), "PdkitEngineWedged: its runbook"),
        (_bad(wedged, scope=None), "PdkitEngineWedged: scope None"),
        (_bad(wedged, scope=base.Scope("gpu", ("cluster",), "x")), "PdkitEngineWedged: scope"),
        (_bad(wedged, severity="page"), "PdkitEngineWedged: severity 'page'"),
    ):
        with pytest.raises(ValueError, match=match):
            alertrules.check_records(*swap(bad))
    with pytest.raises(ValueError, match=r"\['PdkitEngineDown'\] declared more than once"):
        alertrules.check_records(records + (records[0],), order + (records[0],))
    with pytest.raises(ValueError, match=r"missing \['PdkitNodeDown'\]"):
        alertrules.check_records(records, tuple(r for r in order if r.name != "PdkitNodeDown"))


def test_the_inhibitions_name_only_records_and_cover_their_scopes():
    names = set(ALERT_NAMES)
    for i in alertmanager.INHIBITIONS:
        assert i.source in names, i.source
        assert set(i.targets) <= names, set(i.targets) - names
        assert i.source not in i.targets
    by_source = {i.source: set(i.targets) for i in alertmanager.INHIBITIONS}
    for r in alertrules.ALERTS:
        muted_by = {s for s, targets in by_source.items() if r.name in targets}
        expected = {base.HOST: set(), base.NODE: {"PdkitNodeDown"},
                    base.ENGINE: {"PdkitNodeDown", "PdkitEngineDown"},
                    base.ROUTER_WORKERS: {"PdkitNodeDown", "PdkitRouterDown"}}[r.scope]
        assert muted_by == expected, (r.name, r.scope.name, muted_by)
    # the scope tuples alertmanager.yml renders are the records', in SCOPE_ORDER
    assert alertmanager.ENGINE_SYMPTOMS == tuple(r.name for r in alertrules.SCOPE_ORDER if r.scope == base.ENGINE)


def _unknown_alert_names(texts: dict[str, str], known: set[str]) -> dict[str, set[str]]:
    """Alert names in TEXTS (where: text) that no record has."""
    out = {}
    for where, text in texts.items():
        stray = set(ALERT_NAME.findall(text)) - known
        if stray:
            out[where] = stray
    return out


def _record_texts(spec) -> dict[str, str]:
    texts = {}
    for r in alertrules.ALERTS:
        texts[f"{r.name} runbook"] = " ".join((r.runbook.means, *r.runbook.causes, *r.runbook.run))
    for a in alerts(spec):
        texts[f"{a.name} annotations"] = " ".join((a.summary, a.description, a.fires_when, a.decoys_are))
    for i in alertmanager.INHIBITIONS:
        texts[f"inhibition {i.source}"] = i.why
    return texts


def test_no_runbook_annotation_or_inhibition_names_an_alert_no_record_has():
    known = set(ALERT_NAMES)
    texts = _record_texts(_load_example("multinode"))
    assert _unknown_alert_names(texts, known) == {}
    # the check can fail: a runbook naming an alert that is gone
    texts["PdkitEngineDown runbook"] += " then PdkitEngineGone fires"
    assert _unknown_alert_names(texts, known) == {"PdkitEngineDown runbook": {"PdkitEngineGone"}}


def test_the_doc_names_no_alert_without_a_record():
    """docs/monitoring.md, generated blocks and prose alike, names only alerts that have a record (a renamed or
    dropped alert leaves no heading, row or mention behind)."""
    known = set(ALERT_NAMES)
    doc = DOC.read_text()
    assert alerttable.inhibitions() in doc, "python -m pdkit.contract.alerttable --write docs/monitoring.md"
    assert _unknown_alert_names({"docs/monitoring.md": doc}, known | FORMER_ALERTS) == {}
    assert _unknown_alert_names({"doc": doc + "\nPdkitOldAlert"}, known | FORMER_ALERTS) == {"doc": {"PdkitOldAlert"}}


def test_the_decode_graph_rule_is_stated_once():
    """The engines that must run decode steps in CUDA graphs: decode and unified engines with `tuning.cuda_graph`
    on (pdkit.spec.decode_graphs_expected, in pdkit/spec/facts.py). The alert watches exactly these, and the runbook and the table line say
    the rule with engines.DECODE_GRAPH_RULE; the old statement (decode engines only) is gone from the doc."""
    seen_unified = False
    for name in ("lab", "cluster", "a6000", "multinode"):
        spec = _load_example(name)
        expected = set(engines.graph_expected_instances(spec))
        for host, engine in spec.engines():
            on = bool(spec.engine_tuning(engine).value("cuda_graph"))
            inst = engine_instance(host, engine.name)
            assert (inst in expected) == (engine.role in ("decode", "unified") and on), inst
            seen_unified |= engine.role == "unified" and inst in expected
        alert = next((a for a in alerts(spec) if a.name == "PdkitDecodeCudaGraphRatioLow"), None)
        if expected:
            assert {s["instance"] for s in alert.subjects} == expected
            assert engines.DECODE_GRAPH_RULE in alert.fires_when
        else:
            assert alert is None
    assert seen_unified, "no example runs a unified engine with graphs on: the rule's unified half is untested"
    rb = _record("PdkitDecodeCudaGraphRatioLow").runbook
    assert engines.DECODE_GRAPH_RULE in rb.means
    doc = DOC.read_text()
    # the table line, the runbook's first line and its "what it means": all three generated
    assert doc.count(engines.DECODE_GRAPH_RULE) == 3
    assert "for decode engines with CUDA graphs on" not in doc
    assert "Only engines with graphs on are watched" not in doc


def test_the_decode_graph_rule_has_one_home_in_the_code():
    """`role != "prefill"` beside `cuda_graph` (the rule written out) appears only in pdkit/spec/facts.py's
    decode_graphs_expected; flags, doctor, validation and the alert call it (issue 48 item 5)."""
    import re

    from tests.conftest import REPO

    written_out = re.compile(r'role\s*!=\s*"prefill"[^\n]*cuda_graph|cuda_graph[^\n]*role\s*!=\s*"prefill"')
    homes = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "pdkit").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if written_out.search(line)]
    assert homes == [f"pdkit/spec/facts.py:{_rule_line()}"], homes


def _rule_line() -> int:
    import inspect

    from pdkit.spec import facts

    lines, start = inspect.getsourcelines(facts.decode_graphs_expected)
    return start + next(i for i, line in enumerate(lines) if "cuda_graph" in line and "prefill" in line)


def test_what_to_do_is_the_runbooks_steps_and_names_only_labels_the_alert_carries(monkeypatch):
    """An alert's description ends with its runbook's steps (written once, in the record: `base.what_to_do`), and
    each {label} of a step is a label of the alert, so the notification fills it in; the promtool cases expand
    every annotation for each subject's labels, and a step naming a label the alert lacks fails there."""
    from pdkit.monitoring import rules

    for name in ("lab", "cluster", "multinode", "a6000"):
        spec = _load_example(name)
        for a in alerts(spec):
            rb = RUNBOOKS[a.name]
            assert a.description.endswith("\n" + base.what_to_do(rb)), a.name
            assert a.description.count("What to do") == 1, a.name
            named = {m for step in rb.run for m in base.RUNBOOK_LABEL.findall(step)}
            for s in a.subjects:
                assert named <= set(a.exp_labels(s)), (a.name, named - set(a.exp_labels(s)))
        rules.rule_tests(spec)  # expands every annotation of every subject
    # the check can fail: a router worker alert's step naming {engine}, a label it does not carry
    circuit = _record("PdkitRouterCircuitOpen")
    bad = _bad(circuit, runbook=dataclasses.replace(circuit.runbook, run=(*circuit.runbook.run,
                                                                          "`journalctl -u pdkit-engine-{engine}`")))
    monkeypatch.setattr(rules, "ALERTS", tuple(bad if r is circuit else r for r in alertrules.ALERTS))
    spec = _load_example("cluster")
    assert "pdkit-engine-{{ $labels.engine }}" in next(a for a in alerts(spec) if a.name == circuit.name).description
    with pytest.raises(KeyError, match="engine"):
        rules.rule_tests(spec)
