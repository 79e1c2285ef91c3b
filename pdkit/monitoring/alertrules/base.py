"""The shape of an alert record and what every concern module builds its alerts with.

`AlertRecord` is one alert, whole: its name, severity, `for`, scope (what Alertmanager inhibits it by),
runbook (what it means, the likely causes, what to run) and `build`, which renders for one spec the rest:
expression, value, threshold(s), annotations, promtool cases and the line of docs/monitoring.md's table.
`Alert` is what `build` returns: the record rendered for one spec's subjects.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pdkit.monitoring.common import (
    ENGINE_BY,
    HOST_JOBS,
    JOB_ENGINE,
    JOB_EXPORTER,
    JOB_ROUTER,
    alert_window,
    by_labels,
    engine_instance,
    monitoring_of,
    pick_labels,
    scaled_duration,
    series_text,
    speedup_of,
)
from pdkit.monitoring.scrape import Target, targets
from pdkit.spec import ClusterSpec, Engine, HostSpec, Monitoring

SEVERITIES = ("critical", "warning")


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
    # one line for docs/monitoring.md's alert table (pdkit.contract.alerttable): when it fires
    fires_when: str = ""
    # what the decoys are, for the name of the quiet test
    decoys_are: str = "the prefill side"


@dataclass(frozen=True)
class Scope:
    """What an alert is about, as Alertmanager's inhibitions see it (pdkit.monitoring.alertmanager.INHIBITIONS
    is generated from the scopes): which alert, firing, makes it the same incident."""

    name: str
    # the labels that name the thing it is about (the inhibitions' `equal`)
    labels: tuple[str, ...]
    about: str


# the host itself (node_exporter unreachable): the source of the node's inhibition, inhibited by nothing
HOST = Scope("host", ("cluster", "node"), "a whole host")
# one service or part of one host (an engine's process, a GPU, an exporter, the router): held back while its
# host is down
NODE = Scope("node", ("cluster", "node"), "something on one host, named by its `node`")
# a symptom of one engine (it carries the engine's `instance`, pdkit.monitoring.common.ENGINE_BY): held back
# while the engine is down, and while its host is
ENGINE = Scope("engine", ("cluster", "instance"), "one engine's symptom, named by its `instance`")
# what a router says about its workers (it carries the router's `node`): held back while the router is down,
# and while its host is
ROUTER_WORKERS = Scope("router-workers", ("cluster", "node"), "a router's word on its workers, by the router's `node`")
SCOPES = (HOST, NODE, ENGINE, ROUTER_WORKERS)


# Runbooks: spec-independent text (docs/monitoring.md's "Runbooks" section is generated from the records by
# pdkit.contract.alerttable; each rule's `runbook_url` annotation links to its entry). INVENTORY stands for
# the cluster's inventory file (inventories/<cluster>.py); {node}, {engine} for the alert's labels of those names.
@dataclass(frozen=True)
class Runbook:
    # what the alert says is wrong, and what it does to serving
    means: str
    # the usual causes, most likely first
    causes: tuple[str, ...]
    # in order: the doctor check, what to read on the node, the fix
    run: tuple[str, ...]


# a runbook step's {label}: the alert's label of that name (in the notification: its value)
RUNBOOK_LABEL = re.compile(r"\{(\w+)\}")


def what_to_do(runbook: Runbook) -> str:
    """The "What to do" part of an alert's `description` annotation: RUNBOOK's steps (`run`), numbered, each
    {label} as the template of the alert's label (`{{ $labels.node }}`), so the notification names this alert's
    node, engine or worker.

    Why the steps and not only a pointer to the runbook: an Alertmanager notification is what the on-call
    engineer reads first, often on a phone, and what they need from it is the first command to type, for this
    node; a link alone is one more hop, to a page that may not open where the pager rings. The steps are the
    record's `run`, the same text docs/monitoring.md's runbook lists (one source: nothing to keep in step);
    the annotation `runbook_url` beside it links to the rest (what it means, the likely causes). A step's
    {label} must be a label of the alert: the promtool cases expand every annotation for the labels each
    alert carries (pdkit.monitoring.rules.alert_annotations), and an unknown label fails there."""
    steps = [RUNBOOK_LABEL.sub(r"{{ $labels.\1 }}", step) for step in runbook.run]
    return "What to do:\n" + "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))


JOURNAL = "`journalctl -u pdkit-engine-{engine} -n 300` on {node}"
REDEPLOY = ("re-apply the plan to the node: `pdkit roll INVENTORY --limit {node}` (drains it, applies, restarts "
            "behind the health gate, re-adds it; a failed node is rolled back), or "
            "`pyinfra INVENTORY deploy/pd.py --limit {node}` where the node serves nothing")


class Context(NamedTuple):
    """What every alert builder reads from the spec, computed once per alerts() call."""

    spec: ClusterSpec
    mon: Monitoring
    w: str  # the rate window
    tgt: list[Target]
    engines: list[Target]
    routers: list[Target]
    model_of: dict[str, str]  # engine instance -> served model name
    by: str  # the engine labels, for `by (...)`
    speedup: int  # pdkit_monitoring.lab_alert_speedup (1 but in the lab)

    def for_(self, duration: str) -> str:
        """An alert's `for` as the rules say it: DURATION, divided by the lab's speedup."""
        return scaled_duration(duration, self.speedup)


def context(spec: ClusterSpec) -> Context:
    tgt = targets(spec)
    return Context(spec, monitoring_of(spec), alert_window(spec), tgt, [t for t in tgt if t.job == JOB_ENGINE],
                   [t for t in tgt if t.job == JOB_ROUTER],
                   {engine_instance(h, e.name): spec.engine_model(e).name for h, e in spec.engines()},
                   by_labels(ENGINE_BY),
                   speedup_of(spec))


@dataclass(frozen=True)
class AlertRecord:
    """One alert, declared once (its concern module, registered in pdkit.monitoring.alertrules.ALERTS)."""

    name: str
    severity: str
    # the `for` at real windows (the lab's rules divide it by pdkit_monitoring.lab_alert_speedup)
    for_: str
    scope: Scope
    runbook: Runbook
    # the rest, for one spec: expression, value, threshold(s), annotations, promtool cases, fires_when; None where
    # the spec gives the alert nothing to watch (no router, no PD pair, no decode graphs planned)
    build: Callable[[Context, AlertRecord], Alert | None] = field(compare=False)

    def make(self, c: Context, description: str, **fields: Any) -> Alert:
        """This record's Alert for the spec of C: its name, severity and `for` (scaled), FIELDS, and the
        `description` annotation: DESCRIPTION (what is wrong, for this spec) and then what to do, from the
        runbook (`what_to_do`)."""
        return Alert(name=self.name, for_=c.for_(self.for_), severity=self.severity,
                     description=f"{description}\n{what_to_do(self.runbook)}", **fields)

    def render(self, c: Context) -> Alert | None:
        return self.build(c, self)


# ---------------------------------------------------------------------------------------------
# promtool case helpers shared by the concern modules

def engine_labels(s: dict[str, str], **extra: str) -> dict[str, str]:
    """An engine series' labels as Prometheus stores them: the target's and SGLang's scheduler labels."""
    return {"job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
            "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0", **extra}


def exporter_subject(spec: ClusterSpec, host: HostSpec, engine: Engine, **more: str) -> dict[str, str]:
    """pdkit-exporter's series of ENGINE on HOST, as a promtool subject: the exporter's target labels (its
    `instance` is the node), the engine's (EXPORTER_BY), and MORE."""
    return {"job": JOB_EXPORTER, "cluster": spec.cluster.name, "instance": host.name, "node": host.name,
            "engine": engine.name, "role": engine.role, **more}


def alert_test(name: str, alert: str, series: list[tuple[str, str]], eval_time: str,
               exp: list[dict[str, str]]) -> dict:
    return {"name": name, "interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": eval_time, "alertname": alert,
                                 "exp_alerts": [{"exp_labels": dict(sorted(e.items()))} for e in exp]}]}


def flag_case(metric: str, *, ok: int, blip: bool = False) -> Callable[[dict[str, str], bool], list[tuple[str, str]]]:
    """The promtool case of a 0/1 gauge METRIC per subject whose healthy value is OK: bad, it flips at minute 3
    and stays; healthy, it stays OK (with BLIP, but for one scrape at minute 3: shorter than `for`, it must not
    alert)."""
    broken = 1 - ok

    def case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        healthy = f"{ok}x3 {broken} {ok}x19" if blip else f"{ok}x25"
        return [(series_text(metric, s), f"{ok}x3 {broken}x20" if bad else healthy)]

    return case


def flag_alert(c: Context, r: AlertRecord, *, metric: str, ok: int, by: tuple[str, ...],
               subjects: tuple[dict[str, str], ...], summary: str, description: str, eval_time: str,
               fires_when: str = "", selector: str = "", blip: bool = False, **more: Any) -> Alert:
    """R's alert on a 0/1 gauge METRIC (SELECTOR: its series to watch, default all) that says per subject whether
    it is well: OK=1 (a health or `up`-like gauge: the min by BY is 0, so one rank or series down is down) or OK=0
    (a trouble flag: the max by BY is 1). Its promtool case is `flag_case`; its labels BY; FIRES_WHEN defaults to
    the condition. MORE: the Alert's other fields (decoys, its own case, extra tests)."""
    agg, broken = ("min", "== 0") if ok else ("max", "> 0")
    flagged = f"{agg} by ({by_labels(by)}) ({selector or metric})"
    more.setdefault("case", flag_case(metric, ok=ok, blip=blip))
    return r.make(
        c,
        expr=f"{flagged} {broken}",
        value=flagged,
        summary=summary,
        description=description,
        subjects=subjects,
        exp_labels=lambda s: pick_labels(s, by),
        eval_time=eval_time,
        fires_when=fires_when or f"`{metric} {broken}`",
        **more,
    )


def up_alert(c: Context, r: AlertRecord, jobs: tuple[str, ...], summary: str, description: str,
             fires_when: str = "") -> Alert:
    """R's alert on the scrape targets of JOBS that Prometheus cannot scrape (`up == 0`, each series on its own):
    one promtool subject per target, whose healthy case has a one-scrape blip (`flag_case`); FIRES_WHEN defaults
    to the condition."""
    up = f'up{{job="{jobs[0]}"}}' if len(jobs) == 1 else f'up{{job=~"{"|".join(jobs)}"}}'
    return r.make(
        c,
        expr=f"{up} == 0",
        value=up,
        summary=summary,
        description=description,
        subjects=tuple({"job": t.job, **t.labels} for t in c.tgt if t.job in jobs),
        case=flag_case("up", ok=1, blip=True),
        exp_labels=lambda s: dict(s),
        eval_time="10m",
        fires_when=fires_when or f"`{up} == 0`",
    )


def counted_alert(c: Context, r: AlertRecord, *, labels: tuple[str, ...], counted: str, zero: str, what: str,
                  series_of: Callable[[dict[str, str]], str], subjects: tuple[dict[str, str], ...], summary: str,
                  description: str, fires_when: str,
                  more_rows: Callable[[dict[str, str], bool], list[tuple[str, str]]] = lambda s, bad: []) -> Alert:
    """R's alert on a counter of WHAT (COUNTED, a series selector) that moved over the rate window, by LABELS.
    The counter is created by its first increment (the catalogue's `lazy`) and increase() over a series that
    appears at 1 is 0, so it also fires on a series that is new within the window (present now, absent `w`
    ago). Its value is the increase, or ZERO (a series of every subject at 0) where there is none. Promtool:
    bad is the first count (SERIES_OF's series appears at 1 and stays), plus MORE_ROWS; and counts that go on
    fire, an old count does not (`counting_on_test`)."""
    by, w = by_labels(labels), c.w
    return r.make(
        c,
        expr=(f"(sum by ({by}) (increase({counted}[{w}])) > 0)\nor\n"
              f"(sum by ({by}) ({counted}) unless sum by ({by}) ({counted} offset {w}))"),
        value=f"sum by ({by}) (increase({counted}[{w}]))\nor\n{zero}",
        summary=summary,
        description=description,
        subjects=subjects,
        case=lambda s, bad: ([(series_of(s), "_x5 1x15")] if bad else []) + more_rows(s, bad),
        exp_labels=lambda s: pick_labels(s, labels),
        eval_time="8m",
        extra_tests=lambda subjects: counting_on_test(r.name, what, r.severity, labels, subjects, series_of),
        fires_when=fires_when,
    )


def counting_on_test(alert: str, what: str, severity: str, by: tuple[str, ...], subjects: tuple[dict[str, str], ...],
                     series_of: Callable[[dict[str, str]], str]) -> list[dict]:
    """A counter alert that also fires on a new series: counts that go on fire for the first subject; an old
    count that does not move (the other subjects) does not."""
    if not subjects:
        return []
    first, rest = subjects[0], subjects[1:]
    series = [(series_of(first), "3+1x20")] + [(series_of(s), "2x20") for s in rest]
    exp = [{**pick_labels(first, by), "severity": severity}]
    return [alert_test(f"{alert} fires on {what} that go on, not on an old count", alert, series, "15m", exp)]


def subject_name(s: dict[str, str]) -> str:
    if "rank" in s:
        return f"{s['node']}/{s['engine']} rank {s['rank']}"
    if "worker_instance" in s:
        return f"the router on {s['node']} and worker {s['worker_instance']}"
    if "queue" in s:
        return f"{s['instance']} queue {s['queue']}"
    if s.get("job") == JOB_EXPORTER and "gpu" in s:
        return f"{s['node']}/{s['engine']} GPU {s['gpu']}"
    if s.get("job") == JOB_EXPORTER and "engine" in s:
        return f"{s['node']}/{s['engine']}"
    if s.get("job") in HOST_JOBS:
        return f"{s['job']} on {s['node']}"
    return s["instance"]
