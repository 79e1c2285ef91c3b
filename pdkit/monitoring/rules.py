"""Alert rules as data: ALERT_TABLE, one builder per alert (or pair of alerts), each declaring its
alerts once: condition, the value the lab's live query check runs, severity, annotations, the line
of docs/monitoring.md's table, and its promtool cases beside them. The rules file, the
`promtool test rules` file and the doc's table (`python -m pdkit.monitoring.alerttable --write
docs/monitoring.md`) are generated from it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from pdkit import flags
from pdkit.catalogue import router_families
from pdkit.exporter.config import reads_gpu_health
from pdkit.kvcost import KV_PATHS, KV_RATE_MIN_MB, kv_floor
from pdkit.metricnames import EXPORTER, EXPORTER_GPU_WEDGED, EXPORTER_RANK_UP, ROUTER, SGLANG
from pdkit.monitoring.common import (
    ENGINE_BY,
    EXPORTER_BY,
    JOB_DCGM,
    JOB_ENGINE,
    JOB_EXPORTER,
    JOB_NODE,
    JOB_PROMETHEUS,
    JOB_ROUTER,
    QUEUE_ROLES,
    QUEUES,
    ROUTER_BY,
    WORKER_BY,
    alert_window,
    alt_metric,
    by_labels,
    duration_seconds,
    engine_instance,
    fmt_num,
    fmt_seconds,
    fmt_value,
    monitoring_of,
    pick_labels,
    promql_regex,
    scaled_duration,
    scraped_hosts,
    series_text,
    speedup_of,
    to_yaml,
)
from pdkit.monitoring.scrape import Target, targets
from pdkit.spec import ClusterSpec, Monitoring, prefill_kv_paths

ENGINE_DOWN_FOR = "2m"  # a real SGLang restart takes ~60-106 s: a 1m window would fire on every roll
# a rank's process is gone only between a stop and the next start: systemd restarts a crashed rank after
# 5 s (RestartSec), a deploy stops every rank of the engine together (up to TimeoutStopSec=60 s each);
# the same window as a whole engine's so that a roll never pages
RANK_DOWN_FOR = ENGINE_DOWN_FOR
ROUTER_DOWN_FOR = "1m"
TARGET_DOWN_FOR = "5m"
# a host's node_exporter unreachable: the whole node is down or cut off. Shorter than ENGINE_DOWN_FOR on
# purpose: the node's page must be firing before its engines' would, so that Alertmanager's inhibition
# (pdkit/monitoring/alertmanager.py) holds theirs back and the node pages once
NODE_DOWN_FOR = "1m"
# a GPU an engine uses needs a reset (pdkit-exporter's probe, once a minute): short, since it does not heal by
# itself; three probes a minute apart that say so page, one odd reading (a probe cut short) does not
GPU_WEDGED_FOR = "2m"
WORKER_UNHEALTHY_FOR = "1m"
QUEUE_GROWING_FOR = "10m"
QUEUE_MIN_DEPTH = 1
FAILURES_FOR = "1m"
# an engine holding requests (running or queued) that generates no token for this long is wedged
WEDGED_FOR = "1m"
# a prefill's KV hand-offs slower than its path's floor (pdkit.kvcost.KV_PATHS) for this long while they happen:
# longer than a burst that queues hand-offs for a minute or two
KV_SLOW_FOR = "10m"
# PdkitKvHandoffSlow's labels: the engine's and the floor it is judged by
KV_SLOW_BY = (*ENGINE_BY, "floor")
CUDA_GRAPH_RATIO_MIN = 0.9
CUDA_GRAPH_RATIO_FOR = "10m"
TTFT_FOR = "5m"
DRIFT_FOR = "5m"
ENV_MISSING_FOR = "5m"
# a worker whose breaker keeps opening: opened again within every CB_WINDOW for this long. A single trip
# (an engine restart; pdkit's 3 s breaker timeout, pdkit/flags.py ROUTER_BREAKER) holds the condition for
# one window only, shorter than this `for`, so it never pages; a worker that keeps failing requests re-opens
# its breaker within seconds of each half-open trial while traffic comes.
CB_OPEN_FOR = "5m"
CB_WINDOW = "2m"
ROUTER_FAILURES_FOR = FAILURES_FOR
# every worker overloaded: a capacity problem, as long as a queue must grow before PdkitQueueGrowing
OVERLOAD_FOR = QUEUE_GROWING_FOR


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
    # one line for docs/monitoring.md's alert table (pdkit.monitoring.alerttable): when it fires
    fires_when: str = ""
    # what the decoys are, for the name of the quiet test
    decoys_are: str = "the prefill side"


def graph_expected_instances(spec: ClusterSpec) -> list[str]:
    """Engines that must run decode steps in CUDA graphs: decode/unified with graphs on."""
    out = []
    for host, engine in spec.engines():
        if engine.role != "prefill" and spec.engine_tuning(engine).value("cuda_graph"):
            out.append(engine_instance(host, engine.name))
    return out


def _engine_labels(s: dict[str, str], **extra: str) -> dict[str, str]:
    """An engine series' labels as Prometheus stores them: the target's and SGLang's scheduler labels."""
    return {"job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
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
    series = [(series_text(metric, _engine_labels(first)), "3+1x20")]
    series += [(series_text(metric, _engine_labels(s)), "2x20") for s in rest]
    exp = [{**pick_labels(first, ENGINE_BY), "severity": "warning"}]
    return [_alert_test(f"{alert} fires on failures that go on, not on an old count", alert, series, "15m", exp)]


def _graph_none_only_tests(subjects: tuple[dict[str, str], ...], passes: str) -> list[dict]:
    """The seeds' worst case: the decode never runs a graph, so only mode="decode_none" exists."""
    out = []
    for s in subjects[:1]:
        series = [(series_text(passes, _engine_labels(s, mode="decode_none")), "0+10x30")]
        out.append(_alert_test(f"PdkitDecodeCudaGraphRatioLow fires for {s['instance']} when only decode_none exists",
                               "PdkitDecodeCudaGraphRatioLow", series, "20m",
                               [{**pick_labels(s, ENGINE_BY), "severity": "warning"}]))
        series = [(series_text(passes, _engine_labels(s, mode="decode_cuda_graph")), "0+10x30")]
        out.append(_alert_test(f"PdkitDecodeCudaGraphRatioLow stays quiet for {s['instance']} when only "
                               "decode_cuda_graph exists", "PdkitDecodeCudaGraphRatioLow", series, "20m", []))
    return out


def wedge_window(spec: ClusterSpec) -> str:
    """Rate window of the wedge alert: 2m, or 4 scrapes when scrapes are slower than 30 s (it must fire
    well before SGLang's own 300 s scheduler watchdog would end a wedged process); the lab: 2m / its
    lab_alert_speedup, still at least 4 scrapes."""
    return fmt_seconds(max(120 // speedup_of(spec), 4 * monitoring_of(spec).scrape_interval_s))


def _wedge_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
    labels = _engine_labels(s)
    running = [(series_text(SGLANG["running"], labels), "2x30"), (series_text(SGLANG["waiting"], labels), "1x30")]
    tokens = series_text(SGLANG["realtime_tokens"], {**labels, "mode": "decode" if s["role"] != "prefill" else
                                                 "prefill_compute"})
    # bad: tokens stop at minute 5 while requests stay; healthy: tokens keep coming
    return running + [(tokens, "0+100x5 500x25" if bad else "0+100x30")]


def _wedge_extra_tests(subjects: tuple[dict[str, str], ...]) -> list[dict]:
    out = []
    for s in subjects[:1]:
        labels = _engine_labels(s)
        # wedged before its first step: requests held, no token series at all
        series = [(series_text(SGLANG["running"], labels), "0x3 2x27"),
                  (series_text(SGLANG["waiting"], labels), "0x30")]
        out.append(_alert_test(f"PdkitEngineWedged fires for {s['instance']} wedged before its first step",
                               "PdkitEngineWedged", series, "10m",
                               [{**pick_labels(s, ENGINE_BY), "severity": "critical"}]))
        # idle: nothing held, no tokens
        tokens = series_text(SGLANG["realtime_tokens"], {**labels, "mode": "decode"})
        series = [(series_text(SGLANG["running"], labels), "0x30"), (series_text(SGLANG["waiting"], labels), "0x30"),
                  (tokens, "500x30")]
        out.append(_alert_test(f"PdkitEngineWedged stays quiet for {s['instance']} while idle",
                               "PdkitEngineWedged", series, "20m", []))
    return out

class _Context(NamedTuple):
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


def _context(spec: ClusterSpec) -> _Context:
    tgt = targets(spec)
    return _Context(spec, monitoring_of(spec), alert_window(spec), tgt, [t for t in tgt if t.job == JOB_ENGINE],
                    [t for t in tgt if t.job == JOB_ROUTER],
                    {engine_instance(h, e.name): spec.engine_model(e).name for h, e in spec.engines()},
                    by_labels(ENGINE_BY),
                    speedup_of(spec))


# The alert table: (the alerts a builder declares, in rule order; the builder). Each builder declares its
# alerts once, with their promtool cases beside them; a spec may leave some out (no router, no PD pair, no
# decode graphs planned). docs/monitoring.md's alert table lists every one (pdkit.monitoring.alerttable).
ALERT_TABLE: list[tuple[tuple[str, ...], Callable[[_Context], list[Alert]]]] = []


def _declares(*names: str):
    def register(build: Callable[[_Context], list[Alert]]) -> Callable[[_Context], list[Alert]]:
        ALERT_TABLE.append((names, build))
        return build
    return register


def _up_case(subject: dict[str, str], bad: bool) -> list[tuple[str, str]]:
    # healthy still has a one-scrape blip: shorter than `for`, it must not alert
    return [(series_text("up", subject), "1x3 0x20" if bad else "1x3 0 1x19")]


# engine down
@_declares("PdkitEngineDown")
def _engine_down(c: _Context) -> list[Alert]:
    engines = c.engines
    out: list[Alert] = []
    out.append(Alert(
        name="PdkitEngineDown",
        expr=f'up{{job="{JOB_ENGINE}"}} == 0',
        value=f'up{{job="{JOB_ENGINE}"}}',
        for_=c.for_(ENGINE_DOWN_FOR), severity="critical",
        summary="SGLang engine {{ $labels.instance }} ({{ $labels.role }}) is down",
        description=(
            "Prometheus cannot scrape /metrics of engine {{ $labels.engine }} on {{ $labels.node }} "
            f"for {c.for_(ENGINE_DOWN_FOR)}: the process is stopped, crashed, or hung.\n"
            "What to do: on {{ $labels.node }} run `systemctl status pdkit-engine-{{ $labels.engine }}` and "
            "`journalctl -u pdkit-engine-{{ $labels.engine }} -n 200` (look for CUDA out of memory, NCCL errors, "
            "the watchdog timeout, a Python traceback); check `nvidia-smi` and `dmesg` for Xid errors. "
            "A PD pair stalls while either side is down: the router keeps sending it requests until its health "
            "checks fail. Fix the cause, then re-run the deploy (`pyinfra INVENTORY deploy/pd.py`: it restarts "
            "the engine behind the health gate)."),
        subjects=tuple({"job": JOB_ENGINE, **t.labels} for t in engines),
        case=_up_case,
        exp_labels=lambda s: dict(s),
        eval_time="10m",
        fires_when=f"`up{{job=\"{JOB_ENGINE}\"}} == 0`",
    ))
    return out


# a rank above 0 of an engine spanning nodes down (pdkit-exporter on the rank's node: its unit has no
# running process). Such a rank serves no HTTP, so PdkitEngineDown cannot see it; rank 0 is PdkitEngineDown's
# (its process gone, its /metrics is too): rank 0's series are the decoys.
RANK_BY = (*EXPORTER_BY, "rank", "nnodes", "head")


@_declares("PdkitEngineRankDown")
def _engine_rank_down(c: _Context) -> list[Alert]:
    spec = c.spec
    out: list[Alert] = []
    scraped = {h.name for h in scraped_hosts(spec)}
    ranks = []
    for head, e in spec.engines():
        if not e.spans_nodes:
            continue
        for rank, node in enumerate(spec.engine_hosts(head, e)):
            if node.name in scraped:
                ranks.append({"job": JOB_EXPORTER, "cluster": spec.cluster.name, "instance": node.name,
                              "node": node.name, "engine": e.name, "role": e.role, "rank": str(rank),
                              "nnodes": str(e.nnodes), "head": head.name})
    if ranks:
        up = f'{EXPORTER_RANK_UP}{{rank!="0"}}'
        out.append(Alert(
            name="PdkitEngineRankDown",
            expr=f"min by ({by_labels(RANK_BY)}) ({up}) == 0",
            value=f"min by ({by_labels(RANK_BY)}) ({up})",
            for_=c.for_(RANK_DOWN_FOR), severity="critical",
            summary="Rank {{ $labels.rank }} of engine {{ $labels.engine }} on {{ $labels.node }} is down",
            description=(
                "pdkit-exporter on {{ $labels.node }} finds no running process of rank {{ $labels.rank }} "
                "(of {{ $labels.nnodes }}) of engine {{ $labels.engine }} ({{ $labels.role }}, rank 0 on "
                f"{{{{ $labels.head }}}}) for {c.for_(RANK_DOWN_FOR)}. Rank 0 cannot serve without it: "
                "{{ $labels.head }}/{{ $labels.engine }} stalls or exits like an NCCL timeout, and "
                "PdkitEngineDown follows for it.\n"
                "What to do: systemd restarts the unit on its own (Restart=on-failure), so a rank down this long "
                "keeps failing or was stopped: on {{ $labels.node }} run `systemctl status "
                "pdkit-engine-{{ $labels.engine }}` and `journalctl -u pdkit-engine-{{ $labels.engine }} -n 200` "
                "(NCCL errors, CUDA out of memory, a rank that cannot reach rank 0's --dist-init-addr on "
                "{{ $labels.head }}, a Python traceback); check `nvidia-smi` and `dmesg` for Xid errors. "
                "Fix the cause, then re-run the deploy over every node of the engine (it restarts the ranks "
                "together behind rank 0's health gate)."),
            subjects=tuple(s for s in ranks if s["rank"] != "0"),
            case=lambda s, bad: [(series_text(EXPORTER_RANK_UP, s), "1x3 0x20" if bad else "1x3 0 1x19")],
            exp_labels=lambda s: pick_labels(s, RANK_BY),
            eval_time="10m",
            decoys=tuple(s for s in ranks if s["rank"] == "0"),
            decoys_are="rank 0, which PdkitEngineDown covers",
            fires_when=f"`{EXPORTER_RANK_UP} == 0` for a rank above 0 of an engine spanning nodes",
        ))
    return out


# router down
@_declares("PdkitRouterDown")
def _router_down(c: _Context) -> list[Alert]:
    routers = c.routers
    out: list[Alert] = []
    if routers:
        out.append(Alert(
            name="PdkitRouterDown",
            expr=f'up{{job="{JOB_ROUTER}"}} == 0',
            value=f'up{{job="{JOB_ROUTER}"}}',
            for_=c.for_(ROUTER_DOWN_FOR), severity="critical",
            summary="Router on {{ $labels.node }} is down",
            description=(
                "Prometheus cannot scrape the router's metrics port on {{ $labels.node }}: clients get "
                "connection errors.\nWhat to do: `systemctl status pdkit-router` and "
                "`journalctl -u pdkit-router -n 200` on {{ $labels.node }}; restart it with the deploy. "
                "The engines keep running; nothing else needs a restart."),
            subjects=tuple({"job": JOB_ROUTER, **t.labels} for t in routers),
            case=_up_case,
            exp_labels=lambda s: dict(s),
            eval_time="10m",
            fires_when=f"`up{{job=\"{JOB_ROUTER}\"}} == 0`",
        ))
    return out


# a whole host down: its node_exporter cannot be scraped
@_declares("PdkitNodeDown")
def _node_down(c: _Context) -> list[Alert]:
    nodes = [t for t in c.tgt if t.job == JOB_NODE]
    if not nodes:
        return []
    return [Alert(
        name="PdkitNodeDown",
        expr=f'up{{job="{JOB_NODE}"}} == 0',
        value=f'up{{job="{JOB_NODE}"}}',
        for_=c.for_(NODE_DOWN_FOR), severity="critical",
        summary="Host {{ $labels.node }} is down or cut off",
        description=(
            "Prometheus cannot scrape node_exporter on {{ $labels.node }} for " + c.for_(NODE_DOWN_FOR) + ": the host "
            "is down, cut off the network, or its node_exporter stopped. Its engines' alerts are held back while "
            "this fires (one page for the node).\n"
            "What to do: reach the host (ssh, its BMC console); `systemctl status prometheus-node-exporter` on it."),
        subjects=tuple({"job": JOB_NODE, **t.labels} for t in nodes),
        case=_up_case,
        exp_labels=lambda s: dict(s),
        eval_time="10m",
        fires_when=f"`up{{job=\"{JOB_NODE}\"}} == 0`",
    )]


# a GPU an engine uses is wedged (pdkit-exporter's GPU health probe: pdkit/exporter/gpuhealth.py). The alert is
# one per GPU: `seen` (what the probe saw) is left out of its labels, since a new kernel-log line would
# otherwise end the alert and start another; the doctor row and the exporter's series name it.
GPU_BY = (*EXPORTER_BY, "gpu", "bdf")


def _gpu_subjects(c: _Context) -> list[dict[str, str]]:
    """Each GPU of each engine on a scraped node whose exporter reads GPU health (NVIDIA GPUs, a real engine)."""
    spec = c.spec
    out = []
    for h in scraped_hosts(spec):
        if h.node is None or not reads_gpu_health(h.node.gpu, spec.cluster.engine):
            continue
        for p in spec.placements(h):
            for g in p.engine.gpus:
                out.append({"job": JOB_EXPORTER, "cluster": spec.cluster.name, "instance": h.name, "node": h.name,
                            "engine": p.engine.name, "role": p.engine.role, "gpu": str(g),
                            "bdf": f"0000:{0x18 + g:02x}:00.0", "seen": ""})
    return out


@_declares("PdkitGpuWedged")
def _gpu_wedged(c: _Context) -> list[Alert]:
    subjects = _gpu_subjects(c)
    if not subjects:
        return []

    def case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        # the probe's answer changes its `seen` label: the healthy series, then the wedged one
        healthy = series_text(EXPORTER_GPU_WEDGED, s)
        if not bad:
            return [(healthy, "0x25")]
        wedged = series_text(EXPORTER_GPU_WEDGED, {**s, "seen": "Xid 79 (GPU has fallen off the bus)"})
        return [(healthy, "0x3 stale"), (wedged, "_x4 1x20")]

    def one_reading(subjects: tuple[dict[str, str], ...]) -> list[dict]:
        s = subjects[0]
        # minute 4 alone says wedged (the series of that answer goes stale with the next answer)
        series = [(series_text(EXPORTER_GPU_WEDGED, s), "0x3 stale 0x20"),
                  (series_text(EXPORTER_GPU_WEDGED, {**s, "seen": "retired pages pending"}), "_x4 1 stale")]
        test = _alert_test(f"PdkitGpuWedged stays quiet for {_subject_name(s)} on one probe's reading",
                           "PdkitGpuWedged", series, "4m", [])
        # while the reading stands, and after
        test["alert_rule_test"].append({"eval_time": "6m", "alertname": "PdkitGpuWedged", "exp_alerts": []})
        return [test]

    return [Alert(
        name="PdkitGpuWedged",
        expr=f"max by ({by_labels(GPU_BY)}) ({EXPORTER_GPU_WEDGED}) > 0",
        value=f"max by ({by_labels(GPU_BY)}) ({EXPORTER_GPU_WEDGED})",
        for_=c.for_(GPU_WEDGED_FOR), severity="critical",
        summary="GPU {{ $labels.gpu }} of {{ $labels.node }}/{{ $labels.engine }} is wedged",
        description=(
            "pdkit-exporter's GPU health probe on {{ $labels.node }} finds GPU {{ $labels.gpu }} "
            "({{ $labels.bdf }}), which engine {{ $labels.engine }} ({{ $labels.role }}) uses, in need of a reset "
            f"for {c.for_(GPU_WEDGED_FOR)}: a reset-class Xid in the kernel log, retired pages or a row remap "
            "pending, or the driver's GPU Recovery Action. It does not heal by itself; the engine on it fails or "
            "hangs, and `pdkit roll` refuses any change onto it.\n"
            "What to do: `pdkit doctor INVENTORY` (the engine's `gpu_health` row says what was seen); drain the "
            "node, then on {{ $labels.node }} `nvidia-smi -r -i {{ $labels.gpu }}` with no process on the GPU, "
            "or reboot it; re-apply the node afterwards."),
        subjects=tuple(subjects),
        case=case,
        exp_labels=lambda s: pick_labels(s, GPU_BY),
        eval_time="10m",
        extra_tests=one_reading,
        fires_when=f"`{EXPORTER_GPU_WEDGED} > 0` for a GPU an engine uses (pdkit-exporter's GPU health probe)",
    )]


# other scrape targets down (monitoring blind spots; node_exporter has PdkitNodeDown)
@_declares("PdkitScrapeTargetDown")
def _scrape_target_down(c: _Context) -> list[Alert]:
    tgt = c.tgt
    out: list[Alert] = []
    others = [t for t in tgt if t.job in (JOB_EXPORTER, JOB_DCGM, JOB_PROMETHEUS)]
    other_jobs = "|".join((JOB_EXPORTER, JOB_DCGM, JOB_PROMETHEUS))
    out.append(Alert(
        name="PdkitScrapeTargetDown",
        expr=f'up{{job=~"{other_jobs}"}} == 0',
        value=f'up{{job=~"{other_jobs}"}}',
        for_=c.for_(TARGET_DOWN_FOR), severity="warning",
        summary="{{ $labels.job }} on {{ $labels.node }} cannot be scraped",
        description=(
            "The {{ $labels.job }} target on {{ $labels.node }} has been down for " + c.for_(TARGET_DOWN_FOR) + ": "
            "its dashboards and the alerts built on it (drift, NCCL env, node and GPU figures) are blind.\n"
            "What to do: on {{ $labels.node }} check the service (pdkit-exporter, dcgm-exporter or prometheus) "
            "with systemctl status / journalctl, and that its port is reachable "
            "from the monitoring host. Serving is not affected."),
        subjects=tuple({"job": t.job, **t.labels} for t in others),
        case=_up_case,
        exp_labels=lambda s: dict(s),
        eval_time="10m",
        fires_when="pdkit-exporter, DCGM or Prometheus itself is down (node_exporter: `PdkitNodeDown`)",
    ))
    return out


# router worker unhealthy
@_declares("PdkitRouterWorkerUnhealthy")
def _router_worker_unhealthy(c: _Context) -> list[Alert]:
    routers = c.routers
    out: list[Alert] = []
    worker_subjects = _worker_subjects(c, routers)
    if worker_subjects:
        out.append(Alert(
            name="PdkitRouterWorkerUnhealthy",
            expr=f'min by ({by_labels(WORKER_BY)}) ({ROUTER["worker_health"]}) == 0',
            value=f'min by ({by_labels(WORKER_BY)}) ({ROUTER["worker_health"]})',
            for_=c.for_(WORKER_UNHEALTHY_FOR), severity="critical",
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
            case=lambda s, bad: [(series_text(ROUTER["worker_health"], s), "1x3 0x20" if bad else "1x25")],
            exp_labels=lambda s: pick_labels(s, WORKER_BY),
            eval_time="10m",
            fires_when=f"`{ROUTER['worker_health']} == 0` for a worker",
        ))
    return out


def _routers_exporting(c: _Context, *families: str) -> list[Target]:
    """The routers whose pinned release exports every one of FAMILIES (pdkit/data/metric_catalogue.json, per
    release): an alert on a family that another release lacks (sglang-router 0.3.2 has none of smg 1.13.0's
    overload and breaker-transition counters) is declared for these routers only, so that it never sits in
    the rules unable to fire; a spec whose routers all lack one has no such alert (docs/monitoring.md)."""
    out = []
    for t in c.routers:
        exported = router_families(*c.spec.router_release(c.spec.host(t.host)))
        if all(f in exported for f in families):
            out.append(t)
    return out


def _worker_subjects(c: _Context, routers: list[Target]) -> list[dict[str, str]]:
    """One subject per (router, worker): the router's target labels and the worker labels the router's scrape
    relabelling adds (WORKER_BY)."""
    out = []
    for rt in routers:
        host = c.spec.host(rt.host)
        for h, e in c.spec.router_workers(host):
            out.append({"job": JOB_ROUTER, **rt.labels, "worker": flags.engine_url(c.spec, h, e),
                        "worker_instance": engine_instance(h, e.name), "worker_role": e.role})
    return out


# a worker's circuit breaker keeps opening (smg 1.13.0): its requests fail although health checks may pass
@_declares("PdkitRouterCircuitOpen")
def _router_circuit_open(c: _Context) -> list[Alert]:
    metric = ROUTER["worker_cb_transitions"]
    subjects = _worker_subjects(c, _routers_exporting(c, metric))
    if not subjects:
        return []
    # at least 4 scrapes, like every rate window (a slow scrape interval or the lab's faster clock)
    w = fmt_seconds(max(duration_seconds(CB_WINDOW) // c.speedup, 4 * c.mon.scrape_interval_s))
    opened = f'sum by ({by_labels(WORKER_BY)}) (increase({metric}{{to="open"}}[{w}]))'

    def case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        opens = series_text(metric, {**s, "from": "half_open", "to": "open"})
        closes = series_text(metric, {**s, "from": "half_open", "to": "closed"})
        if bad:  # re-opens every minute after each half-open trial: the worker keeps failing
            return [(opens, "0x3 1+1x20"), (closes, "0x25")]
        # tripped twice long ago and recovered (closed since): nothing to do now
        return [(opens, "0 1 2x23"), (closes, "0 0 1x23")]

    def one_trip_test(subjects: tuple[dict[str, str], ...]) -> list[dict]:
        out = []
        for s in subjects[:1]:
            series = [(series_text(metric, {**s, "from": "closed", "to": "open"}), "0x5 1x20"),
                      (series_text(metric, {**s, "from": "half_open", "to": "closed"}), "0x6 1x19")]
            out.append(_alert_test(f"PdkitRouterCircuitOpen stays quiet for {s['worker_instance']} after one trip "
                                   "(a restart) that recovered", "PdkitRouterCircuitOpen", series, "12m", []))
        return out

    return [Alert(
        name="PdkitRouterCircuitOpen",
        expr=f"{opened} > 0",
        value=opened,
        for_=c.for_(CB_OPEN_FOR), severity="critical",
        summary="Router on {{ $labels.node }} keeps opening the circuit breaker of {{ $labels.worker_instance }}",
        description=(
            "The router on {{ $labels.node }} opened its circuit breaker for {{ $labels.worker }} "
            "({{ $labels.worker_instance }}, {{ $labels.worker_role }}) again and again for "
            f"{c.for_(CB_OPEN_FOR)}: requests sent to it keep failing (each trip is "
            f"{flags.ROUTER_BREAKER['cb-failure-threshold']} failures), so the router keeps pulling it out of "
            "routing, and its health checks may still pass (then PdkitRouterWorkerUnhealthy stays quiet).\n"
            "What to do: `pdkit doctor INVENTORY` (its kv_transfer and router_workers rows for the worker); "
            "on the worker's node `journalctl -u pdkit-engine-<engine> -n 300` (NIXL/UCX errors, CUDA out of "
            "memory, a traceback per request); PdkitKvTransferFailures / PdkitBootstrapFailures / "
            "PdkitEngineWedged on the same engine name the cause. Restart the engine if it does not recover."),
        subjects=tuple(subjects),
        case=case,
        exp_labels=lambda s: pick_labels(s, WORKER_BY),
        eval_time="15m",
        extra_tests=one_trip_test,
        fires_when=(f"`increase({metric}{{to=\"open\"}}[{w}]) > 0` for a worker, for {c.for_(CB_OPEN_FOR)} "
                    "(smg 1.13.0)"),
    )]


# requests that failed on every retry (smg 1.13.0): the client got the error
@_declares("PdkitRouterRetriesExhausted")
def _router_retries_exhausted(c: _Context) -> list[Alert]:
    metric = ROUTER["retries_exhausted"]
    routers = _routers_exporting(c, metric)
    if not routers:
        return []
    by = by_labels((*ROUTER_BY, "worker_type"))
    failed = f"sum by ({by}) (increase({metric}[{c.w}]))"
    subjects = tuple({"job": JOB_ROUTER, **t.labels, "worker_type": kind}
                     for t in routers for kind in _router_worker_types(c, t))
    return [Alert(
        name="PdkitRouterRetriesExhausted",
        expr=f"{failed} > 0",
        value=failed,
        for_=c.for_(ROUTER_FAILURES_FOR), severity="warning",
        summary="Requests through the router on {{ $labels.node }} fail after every retry ({{ $labels.worker_type }})",
        description=(
            "The router on {{ $labels.node }} gave up on requests to its {{ $labels.worker_type }} workers after "
            f"every retry in the last {c.w}: those clients got an error.\n"
            "What to do: see which worker fails: PdkitRouterCircuitOpen, PdkitRouterWorkerUnhealthy, "
            "PdkitEngineDown, PdkitKvTransferFailures for the same role; `pdkit doctor INVENTORY`; "
            "`journalctl -u pdkit-router -n 300` on {{ $labels.node }} names the worker and the error of each "
            "failed attempt (a timeout: the fault budget, pdkit_cluster.fault_budget, may be shorter than a "
            "long generate)."),
        subjects=subjects,
        # bad: exhausted retries go on; healthy: an old count, and retries that keep succeeding
        case=lambda s, bad: [(series_text(metric, {**s, "endpoint": "chat"}), "0x3 1+1x20" if bad else "4x25"),
                             (series_text(ROUTER["retries"], {**s, "endpoint": "chat"}), "0+3x25")],
        exp_labels=lambda s: pick_labels(s, (*ROUTER_BY, "worker_type")),
        eval_time="10m",
        fires_when=f"`increase({metric}[{c.w}]) > 0` (smg 1.13.0)",
    )]


def _router_worker_types(c: _Context, router: Target) -> list[str]:
    """The worker_type values the router labels its workers with: prefill and decode in PD mode, else
    regular."""
    roles = {e.role for _, e in c.spec.router_workers(c.spec.host(router.host))}
    return sorted(roles & {"prefill", "decode"}) or ["regular"]


# every worker overloaded (smg 1.13.0): shed (503) or routed to an overloaded one anyway
@_declares("PdkitRouterWorkersOverloaded")
def _router_workers_overloaded(c: _Context) -> list[Alert]:
    shed, fallback = ROUTER["overload_shed"], ROUTER["overload_fallback"]
    routers = _routers_exporting(c, shed, fallback)
    if not routers:
        return []
    by = by_labels(ROUTER_BY)
    overloaded = (f"sum by ({by}) (increase({shed}[{c.w}]))\n+\n"
                  f"sum by ({by}) (increase({fallback}[{c.w}]))")

    def case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        rows = [(series_text(shed, {**s, "stage": stage}), "0x30") for stage in ("selection", "dispatch")]
        return rows + [(series_text(fallback, {**s, "stage": "selection"}), "0+5x30" if bad else "40x30")]

    return [Alert(
        name="PdkitRouterWorkersOverloaded",
        expr=f"(\n{overloaded}\n) > 0",
        value=overloaded,
        for_=c.for_(OVERLOAD_FOR), severity="warning",
        summary="Every worker behind the router on {{ $labels.node }} has been overloaded for "
                + c.for_(OVERLOAD_FOR),
        description=(
            "For " + c.for_(OVERLOAD_FOR) + " the router on {{ $labels.node }} found every worker it could use "
            "overloaded (a waiting queue at --worker-overload-waiting-requests, default 8, or KV usage at "
            "--worker-overload-token-usage, default 0.8): it routed requests to the least-loaded one anyway "
            "(or shed them with a 503 under --worker-overload-shed). The cluster is past its capacity: TTFT "
            "grows and queues build.\n"
            "What to do: compare the offered load with the capacity measured by `pdkit bench` (docs/bench/); "
            "on the PD dashboard see which side saturates (prefill waiting queue, decode KV usage); add engines "
            "(and `pdkit roll` them in), or lower the load. PdkitQueueGrowing and PdkitTtftP99OverSlo name the "
            "engine."),
        subjects=tuple({"job": JOB_ROUTER, **t.labels} for t in routers),
        case=case,
        exp_labels=lambda s: pick_labels(s, ROUTER_BY),
        eval_time="20m",
        fires_when=f"`{shed}` or `{fallback}` grows for {c.for_(OVERLOAD_FOR)} (smg 1.13.0)",
    )]


# admission rejections (smg 1.13.0): past --max-concurrent-requests and its queue, clients get a 429
@_declares("PdkitRouterAdmissionRejected")
def _router_admission_rejected(c: _Context) -> list[Alert]:
    metric = ROUTER["admission"]
    routers = _routers_exporting(c, metric)
    if not routers:
        return []
    by, w = by_labels(ROUTER_BY), c.w
    rejected = f'{metric}{{result="rejected"}}'
    return [Alert(
        name="PdkitRouterAdmissionRejected",
        # the rejected child is created by the first rejection: a new series counts as one too
        expr=(f"(sum by ({by}) (increase({rejected}[{w}])) > 0)\nor\n"
              f"(sum by ({by}) ({rejected}) unless sum by ({by}) ({rejected} offset {w}))"),
        value=f"sum by ({by}) (increase({rejected}[{w}]))\nor\nsum by ({by}) (up{{job=\"{JOB_ROUTER}\"}}) * 0",
        for_=c.for_(ROUTER_FAILURES_FOR), severity="warning",
        summary="The router on {{ $labels.node }} rejects requests (admission limit)",
        description=(
            "The router on {{ $labels.node }} refused requests at admission in the last " + w + ": more than "
            "--max-concurrent-requests were in flight and its queue (--queue-size) was full or timed out, so "
            "clients got a 429.\n"
            "What to do: compare the offered load with the cluster's capacity (`pdkit bench`); if the limit is "
            "lower than the engines can hold, raise it (pdkit_router.extra_args) and roll the router host; "
            "else add engines or lower the load."),
        subjects=tuple({"job": JOB_ROUTER, **t.labels} for t in routers),
        # bad: the first rejection (the child appears at 1 and stays); healthy: only allowed requests
        case=lambda s, bad: ([(series_text(metric, {**s, "result": "rejected"}), "_x5 1x15")] if bad else [])
        + [(series_text(metric, {**s, "result": "allowed"}), "0+50x20")],
        exp_labels=lambda s: pick_labels(s, ROUTER_BY),
        eval_time="8m",
        extra_tests=lambda subjects: _counting_on_test("PdkitRouterAdmissionRejected", "rejections", "warning",
                                                       ROUTER_BY, subjects,
                                                       lambda s: series_text(metric, {**s, "result": "rejected"})),
        fires_when=f"`increase({rejected}[{w}]) > 0`, or the series is new (first rejection; smg 1.13.0)",
    )]


def _counting_on_test(alert: str, what: str, severity: str, by: tuple[str, ...], subjects: tuple[dict[str, str], ...],
                      series_of: Callable[[dict[str, str]], str]) -> list[dict]:
    """A counter alert that also fires on a new series: counts that go on fire for the first subject; an old
    count that does not move (the other subjects) does not."""
    if not subjects:
        return []
    first, rest = subjects[0], subjects[1:]
    series = [(series_of(first), "3+1x20")] + [(series_of(s), "2x20") for s in rest]
    exp = [{**pick_labels(first, by), "severity": severity}]
    return [_alert_test(f"{alert} fires on {what} that go on, not on an old count", alert, series, "15m", exp)]


def _router_pd_legs(c: _Context, router: Target) -> list[str]:
    """The PD legs (worker types) behind a router: none for a router of regular workers."""
    return [t for t in _router_worker_types(c, router) if t in ("prefill", "decode")]


# a PD leg the router cannot rendezvous with (smg 1.13.0): its pair cannot hand the KV cache off. A roll does
# not fire it: smg probes at registration, after the worker's health passes, and a healthy SGLang prefill
# already serves its bootstrap port (started in TokenizerManager's constructor, before HTTP answers)
@_declares("PdkitRouterPdRendezvousFailed")
def _router_pd_rendezvous_failed(c: _Context) -> list[Alert]:
    metric = ROUTER["pd_rendezvous_failures"]
    routers = [t for t in _routers_exporting(c, metric) if _router_pd_legs(c, t)]
    if not routers:
        return []
    labels = (*ROUTER_BY, "leg")
    by, w = by_labels(labels), c.w
    # summed over `phase`: the HTTP path counts only `probe` (a refused bootstrap port at registration), the
    # gRPC path `bootstrap` and `transfer`; any of them is a pair that cannot hand off
    failed = f"sum by ({by}) (increase({metric}[{w}]))"
    seen = f"sum by ({by}) ({metric})"
    return [Alert(
        name="PdkitRouterPdRendezvousFailed",
        # smg counts a refused probe once, when it registers the worker: the child it creates is a failure too
        expr=f"({failed} > 0)\nor\n({seen} unless sum by ({by}) ({metric} offset {w}))",
        value=f"{failed}\nor\nsum by ({by_labels(ROUTER_BY)}) (up{{job=\"{JOB_ROUTER}\"}}) * 0",
        for_=c.for_(ROUTER_FAILURES_FOR), severity="critical",
        summary="The router on {{ $labels.node }} cannot rendezvous with a PD {{ $labels.leg }} worker",
        description=(
            "The router on {{ $labels.node }} counted PD rendezvous failures on its {{ $labels.leg }} leg in the "
            f"last {w}: over HTTP that is a {{{{ $labels.leg }}}} worker registered with a bootstrap port that "
            "refused the router's probe, so the engines of the other leg cannot reach it for the KV hand-off and "
            "the requests routed to that pair fail or stall until the handshake times out. smg counts the probe "
            "once, at registration: the alert resolves by itself after " + w + ", the worker stays broken until "
            "it is registered again with a bootstrap port that answers.\n"
            "What to do: `pdkit doctor INVENTORY` (its router_workers and kv_transfer rows); `journalctl -u "
            "pdkit-router -n 300 | grep -i bootstrap` on {{ $labels.node }} names the worker and its port; on "
            "the worker's node check that the engine serves its --disaggregation-bootstrap-port (`ss -ltnp`) and "
            "that the firewall lets the router and the decode engines reach it; then roll the worker's node "
            "(`pdkit roll INVENTORY --limit <node>`), which re-registers it."),
        subjects=tuple({"job": JOB_ROUTER, **t.labels, "leg": leg} for t in routers for leg in _router_pd_legs(c, t)),
        # bad: the first refused probe (the child appears at 1 and stays); healthy: an old count from long ago
        case=lambda s, bad: [(series_text(metric, {**s, "phase": "probe"}), "_x5 1x15" if bad else "1x20")],
        exp_labels=lambda s: pick_labels(s, labels),
        eval_time="8m",
        extra_tests=lambda subjects: _counting_on_test("PdkitRouterPdRendezvousFailed", "failed probes", "critical",
                                                       labels, subjects,
                                                       lambda s: series_text(metric, {**s, "phase": "probe"})),
        fires_when=f"`increase({metric}[{w}]) > 0` for a leg, or the series is new (a refused bootstrap probe at "
                   "registration; smg 1.13.0)",
    )]


# queue growing (waiting queue and the PD queues)
@_declares("PdkitQueueGrowing")
def _queue_growing(c: _Context) -> list[Alert]:
    w, engines, model_of, by = c.w, c.engines, c.model_of, c.by
    out: list[Alert] = []
    def queue_clause(queue: str, key: str, fn: str) -> str:
        if fn == "deriv":
            growing = alt_metric(f"sum by ({by}) (deriv({{m}}[{w}]))", key)
            depth = alt_metric(f"sum by ({by}) ({{m}})", key)
            inner = f"({growing}) > 0 and ({depth}) >= {QUEUE_MIN_DEPTH}"
        else:
            inner = alt_metric(f"sum by ({by}) ({{m}})", key)
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
        labels = {"job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"],
                  "model_name": s["model_name"],
                  "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        return [(series_text(name, labels), "0+1x30" if bad else "3x30")]

    out.append(Alert(
        name="PdkitQueueGrowing",
        expr="\nor\n".join(queue_clause(q, k, "deriv") for q, k in QUEUES),
        value="\nor\n".join(queue_clause(q, k, "value") for q, k in QUEUES),
        for_=c.for_(QUEUE_GROWING_FOR), severity="warning",
        summary="The {{ $labels.queue }} queue of {{ $labels.instance }} has grown for " + c.for_(QUEUE_GROWING_FOR),
        description=(
            "The {{ $labels.queue }} queue of {{ $labels.instance }} ({{ $labels.role }}) has kept growing for "
            + c.for_(QUEUE_GROWING_FOR) + ": requests arrive faster than this engine drains them.\n"
            "What to do, by queue: waiting - the engine is at capacity (check KV cache usage and the "
            "decode CUDA-graph ratio on the tuning dashboard; add engines or lower the load); "
            "prefill_bootstrap - prefill waits for its decode partner's handshake (is the decode up? same "
            "model and SGLang version?); prefill_inflight / decode_transfer - KV transfers are slow or stuck "
            "(UCX lane, UCX_NET_DEVICES across nodes, transfer failures on the PD dashboard); "
            "decode_prealloc - decode has no KV memory free for new requests (decode is the bottleneck)."),
        subjects=tuple(queue_subjects),
        case=queue_case,
        exp_labels=lambda s: {**pick_labels(s, ENGINE_BY), "queue": s["queue"]},
        eval_time="20m",
        fires_when=f"a waiting or PD queue keeps growing (`deriv > 0` and depth >= {QUEUE_MIN_DEPTH})",
    ))
    return out


# KV transfer / bootstrap failures. The counters exist in every pinned release but are
# created by their first increment (the catalogue's `lazy`): a healthy engine has no series,
# and increase() over a series that appears at 1 is 0. So each alert also fires on a series
# that is new within the window (present now, absent `w` ago).
@_declares("PdkitKvTransferFailures", "PdkitBootstrapFailures")
def _pd_failures(c: _Context) -> list[Alert]:
    w, engines, model_of, by = c.w, c.engines, c.model_of, c.by
    out: list[Alert] = []
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
            for_=c.for_(FAILURES_FOR), severity="warning",
            summary=f"{what} fail on {{{{ $labels.instance }}}}",
            description=f"{todo}",
            subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in pd_engines),
            # bad: the engine's first failure (the series appears at 1 and stays); healthy: no series at all
            case=lambda s, bad, metric=metric: [(series_text(metric, {
                "job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"],
                "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}), "_x5 1x15")] if bad else [],
            exp_labels=lambda s: pick_labels(s, ENGINE_BY),
            eval_time="8m",
            extra_tests=lambda subjects, metric=metric, name=name: _more_failures_test(name, metric, subjects),
            fires_when=f"`increase({metric}[{w}]) > 0`, or the series is new (first failure)",
        ))
    return out


def kv_effective_gb_s(by: str, w: str, instances: str | None = None) -> str:
    """PromQL: a prefill's effective KV hand-off rate over W in SGLang's unit (pdkit.kvcost: a ratio of sums, MiB
    moved / 1024 over seconds spent moving them), per BY; INSTANCES: an `instance=~` regex, or every prefill."""
    sel = f'instance=~"{instances}"' if instances is not None else 'role="prefill"'
    mb, ms = SGLANG["kv_transfer_total"], SGLANG["kv_transfer_latency"]
    return (f"(sum by ({by}) (rate({mb}_sum{{{sel}}}[{w}])) / 1024)\n"
            f"/\n(sum by ({by}) (rate({ms}_sum{{{sel}}}[{w}])) / 1000)")


def kv_floors_text() -> str:
    """The floors of pdkit.kvcost.KV_PATHS in words, for the alert's annotations, table line and runbook."""
    return ", ".join(f"{p.name} {p.floor_gb_s:g}" for p in KV_PATHS.values()) + " GB/s"


def _kv_rows(s: dict[str, str], gb_s: float | None, n: int = 25) -> list[tuple[str, str]]:
    """A prefill's KV histogram series for promtool: 10 hand-offs a minute of 1 s each, with MiB a minute so
    that the effective rate is GB_S; None: idle (old totals that do not move)."""
    labels = _engine_labels(s)
    ms, mb = SGLANG["kv_transfer_latency"], SGLANG["kv_transfer_total"]
    if gb_s is None:
        return [(series_text(f"{ms}_count", labels), f"100x{n}"), (series_text(f"{ms}_sum", labels), f"100000x{n}"),
                (series_text(f"{mb}_count", labels), f"100x{n}"), (series_text(f"{mb}_sum", labels), f"50000x{n}")]
    return [(series_text(f"{ms}_count", labels), f"0+10x{n}"), (series_text(f"{ms}_sum", labels), f"0+10000x{n}"),
            (series_text(f"{mb}_count", labels), f"0+10x{n}"),
            (series_text(f"{mb}_sum", labels), f"0+{fmt_num(gb_s * 1024 * 10)}x{n}")]


# a prefill's KV hand-offs slower than the floor of its path (same host, across hosts over RDMA or TCP:
# pdkit.kvcost.kv_path per pair, the lowest floor among the decodes it may hand to) while hand-offs happen.
# The floor is rendered per instance from the spec: one clause per distinct floor.
@_declares("PdkitKvHandoffSlow")
def _kv_handoff_slow(c: _Context) -> list[Alert]:
    spec, w, by = c.spec, c.w, c.by
    sim = spec.cluster.engine == "sim"
    floors: dict[str, float] = {}
    for (host, engine), paths in prefill_kv_paths(spec).items():
        floor = kv_floor(paths, sim=sim)
        if floor is not None:
            instance = engine_instance(spec.host(host), engine)
            floors[instance] = floor
    subjects = tuple({**t.labels, "model_name": c.model_of[t.labels["instance"]],
                      "floor": fmt_num(floors[t.labels["instance"]])}
                     for t in c.engines if t.labels["instance"] in floors)
    if not subjects:
        return []
    ms = SGLANG["kv_transfer_latency"]
    clauses = []
    for floor in sorted(set(floors.values()), reverse=True):
        inst = promql_regex(sorted(i for i, f in floors.items() if f == floor))
        moving = f'sum by ({by}) (rate({ms}_count{{instance=~"{inst}"}}[{w}])) > 0'
        # small hand-offs are latency-bound: not judged by their rate (pdkit.kvcost.KV_RATE_MIN_MB)
        mb = SGLANG["kv_transfer_total"]
        sized = (f'sum by ({by}) (rate({mb}_sum{{instance=~"{inst}"}}[{w}]))\n/\n'
                 f'sum by ({by}) (rate({mb}_count{{instance=~"{inst}"}}[{w}])) >= {fmt_num(KV_RATE_MIN_MB)}')
        slow = f"(\n{kv_effective_gb_s(by, w, inst)}\n) < {fmt_num(floor)}"
        # the floor as a label: the annotations name it
        clauses.append(f'label_replace(\n{slow},\n"floor", "{fmt_num(floor)}", "", ""\n)\nand on ({by})\n{moving}\nand '
                       f'on ({by})\n({sized})')
    expr = "\nor\n".join(clauses)

    def case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        # bad: half the instance's floor; healthy: twice it
        return _kv_rows(s, float(s["floor"]) * (0.5 if bad else 2))

    def extra(subjects: tuple[dict[str, str], ...]) -> list[dict]:
        out = []
        for s in subjects[:1]:
            exp = [{**pick_labels(s, KV_SLOW_BY), "severity": "warning"}]
            out.append(_alert_test(f"PdkitKvHandoffSlow stays quiet for {s['instance']} while it hands nothing off",
                                   "PdkitKvHandoffSlow", _kv_rows(s, None, 30), "25m", []))
            # far below the floor, but hand-offs of ~10 MiB: latency-bound, not judged by rate
            small = min(float(s["floor"]) * 0.5, (KV_RATE_MIN_MB / 1024) * 0.3)
            out.append(_alert_test(f"PdkitKvHandoffSlow stays quiet for {s['instance']} at {fmt_value(small)} GB/s "
                                   f"with hand-offs under {fmt_num(KV_RATE_MIN_MB)} MiB", "PdkitKvHandoffSlow",
                                   _kv_rows(s, small, 30), "25m", []))
            # half the floor for 20 minutes, then twice it: firing at 18m, resolved by 40m
            slow, fast = float(s["floor"]) * 0.5 * 10240, float(s["floor"]) * 2 * 10240
            rows = _kv_rows(s, 1.0, 45)[:3]
            rows.append((series_text(f"{SGLANG['kv_transfer_total']}_sum", _engine_labels(s)),
                         f"0+{fmt_num(slow)}x20 {fmt_num(slow * 20 + fast)}+{fmt_num(fast)}x24"))
            test = _alert_test(f"PdkitKvHandoffSlow fires for {s['instance']} while slow and resolves once fast",
                               "PdkitKvHandoffSlow", rows, "18m", exp)
            test["alert_rule_test"].append({"eval_time": "40m", "alertname": "PdkitKvHandoffSlow", "exp_alerts": []})
            out.append(test)
        # one rate between two instances' floors: it fires for the one with the higher floor only
        by_floor = {s["floor"]: s for s in subjects}
        if len(by_floor) > 1:
            low = by_floor[min(by_floor, key=float)]
            high = by_floor[max(by_floor, key=float)]
            between = (float(low["floor"]) + float(high["floor"])) / 2
            out.append(_alert_test(f"PdkitKvHandoffSlow at {fmt_value(between)} GB/s fires for {high['instance']} "
                                   f"(floor {high['floor']}), not {low['instance']} (floor {low['floor']})",
                                   "PdkitKvHandoffSlow", _kv_rows(high, between) + _kv_rows(low, between), "20m",
                                   [{**pick_labels(high, KV_SLOW_BY), "severity": "warning"}]))
        return out

    return [Alert(
        name="PdkitKvHandoffSlow",
        expr=expr,
        value=kv_effective_gb_s(by, w),
        for_=c.for_(KV_SLOW_FOR), severity="warning",
        summary="KV hand-offs from {{ $labels.instance }} are slower than {{ $labels.floor }} GB/s",
        description=(
            "The prefill {{ $labels.instance }} moved KV to its decodes at an effective rate (MiB moved / 1024 over "
            f"seconds spent moving them, over {w}: a ratio of sums, not SGLang's mean of per-request speeds) below "
            "{{ $labels.floor }} GB/s, the floor of the slowest path it may take (pdkit.kvcost.KV_PATHS: "
            + kv_floors_text() + "), for " + c.for_(KV_SLOW_FOR) + " while hand-offs happened. "
            "Requests wait for their KV: TTFT grows.\n"
            "What to do: `pdkit doctor INVENTORY` (its `kv_path` row names the path, the rate and the share of "
            "TTFT); across hosts over TCP set pdkit_node.ucx_net_devices to the RDMA NIC, or a larger page_size, "
            "or keep PD pairs on one host; on one host UCX_TLS must keep cuda_ipc (UCX_PROTO_INFO=y logs the "
            "lane UCX picked)."),
        subjects=subjects,
        case=case,
        exp_labels=lambda s: pick_labels(s, KV_SLOW_BY),
        eval_time="20m",
        absent_ok=(SGLANG["kv_transfer_latency"], SGLANG["kv_transfer_total"]),
        extra_tests=extra,
        fires_when=("a prefill's effective KV rate (ratio of sums) is below the floor of the slowest path it may "
                    f"take (`pdkit.kvcost.KV_PATHS`: {kv_floors_text()}; a sim: the lowest) while hand-offs "
                    f"happen and hand-offs average {fmt_num(KV_RATE_MIN_MB)} MiB or more, for {c.for_(KV_SLOW_FOR)}"),
    )]


# decode CUDA-graph ratio (only engines whose spec turns decode graphs on)
@_declares("PdkitDecodeCudaGraphRatioLow")
def _decode_graph_ratio(c: _Context) -> list[Alert]:
    spec, w, engines, model_of, by = c.spec, c.w, c.engines, c.model_of, c.by
    out: list[Alert] = []
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
            base = {"job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"],
                    "model_name": s["model_name"],
                    "pp_rank": "0", "moe_ep_rank": "0"}
            rows = []
            for tp in ("0", "1"):
                rows.append((series_text(passes, {**base, "tp_rank": tp, "mode": "decode_cuda_graph"}), "0+10x30"))
                rows.append((series_text(passes, {**base, "tp_rank": tp, "mode": "decode_none"}),
                             "0+10x30" if bad else "0x30"))
            return rows

        subjects = tuple({**t.labels, "model_name": model_of[t.labels["instance"]]}
                         for t in engines if t.labels["instance"] in expected)
        out.append(Alert(
            name="PdkitDecodeCudaGraphRatioLow",
            expr=f"(\n{ratio}\n) < {fmt_num(CUDA_GRAPH_RATIO_MIN)}",
            value=ratio,
            for_=c.for_(CUDA_GRAPH_RATIO_FOR), severity="warning",
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
            exp_labels=lambda s: pick_labels(s, ENGINE_BY),
            eval_time="20m",
            extra_tests=lambda subjects: _graph_none_only_tests(subjects, passes),
            fires_when=(f"decode passes in a CUDA graph < {CUDA_GRAPH_RATIO_MIN:.0%} on an engine whose spec turns "
                        "graphs on (also when only `mode=\"decode_none\"` exists)"),
        ))
    return out


# wedged engine: holds requests (running or queued) and generates no token. Tokens are
# counted per scheduler step by sglang:realtime_tokens_total{mode} (lazy: created by the
# first step), so an engine that wedged before its first step has no series at all.
@_declares("PdkitEngineWedged")
def _engine_wedged(c: _Context) -> list[Alert]:
    spec, engines, model_of, by = c.spec, c.engines, c.model_of, c.by
    out: list[Alert] = []
    tokens = SGLANG["realtime_tokens"]
    ww = wedge_window(spec)
    held = f'sum by ({by}) ({SGLANG["running"]}) + sum by ({by}) ({SGLANG["waiting"]})'
    stepping = f"sum by ({by}) (rate({tokens}[{ww}])) > 0"
    out.append(Alert(
        name="PdkitEngineWedged",
        expr=f"({held}) > 0\nunless on ({by})\n({stepping})",
        value=f"{held}",
        for_=c.for_(WEDGED_FOR), severity="critical",
        summary="Engine {{ $labels.instance }} holds requests and generates no tokens",
        description=(
            "Engine {{ $labels.instance }} ({{ $labels.role }}) has had requests running or queued for "
            f"{c.for_(WEDGED_FOR)} while its scheduler generated no token over the last {ww} "
            "(sglang:realtime_tokens_total did not move): its HTTP server answers, the scheduler does not step. "
            "Clients wait until their timeout; the router keeps routing to it while /health answers.\n"
            "What to do: `journalctl -u pdkit-engine-{{ $labels.engine }} -n 300` on {{ $labels.node }} (the "
            "last Prefill/Decode batch line, NCCL or NIXL errors); `py-spy dump --pid <scheduler pid>` shows "
            "where it hangs. Restart the engine (`systemctl restart pdkit-engine-{{ $labels.engine }}`, or the "
            "deploy). The seeds hit this with the overlap schedule: consider --disable-overlap-schedule."),
        subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in engines),
        case=lambda s, bad: _wedge_case(s, bad),
        exp_labels=lambda s: pick_labels(s, ENGINE_BY),
        eval_time="20m",
        extra_tests=lambda subjects: _wedge_extra_tests(subjects),
        fires_when=f"requests running or queued and no token computed (`{tokens}`) over {ww}",
    ))
    return out


# TTFT p99 over the SLO (user-facing TTFT: decode and unified engines)
@_declares("PdkitTtftP99OverSlo")
def _ttft_over_slo(c: _Context) -> list[Alert]:
    mon, w, engines, model_of, by = c.mon, c.w, c.engines, c.model_of, c.by
    out: list[Alert] = []
    slo = mon.ttft_p99_slo_s
    ttft = (f'histogram_quantile(0.99, sum by ({by}, le) '
            f'(rate({SGLANG["ttft"]}_bucket{{role=~"decode|unified"}}[{w}])))')
    ttft_engines = [t for t in engines if t.labels["role"] in ("decode", "unified")]

    def ttft_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        base = {"job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"]}
        # all observations in (slo, 2 slo] -> p99 ~ 1.99 slo; in (slo/2, slo] -> p99 ~ 0.995 slo
        counts = {slo / 2: "0x30", slo: "0x30" if bad else "0+10x30", slo * 2: "0+10x30", "+Inf": "0+10x30"}
        return [(series_text(SGLANG["ttft"] + "_bucket", {**base, "le": le if isinstance(le, str) else fmt_num(le)}), v)
                for le, v in counts.items()]

    if ttft_engines:
        out.append(Alert(
            name="PdkitTtftP99OverSlo",
            expr=f"{ttft} > {fmt_num(slo)}",
            value=ttft,
            for_=c.for_(TTFT_FOR), severity="warning",
            summary=f"TTFT p99 of {{{{ $labels.instance }}}} is over the {fmt_value(slo)} s SLO",
            description=(
                f"The 99th percentile time to first token measured by {{{{ $labels.instance }}}} over the last {w} "
                f"is above pdkit_monitoring.ttft_p99_slo_s = {fmt_value(slo)} s. In PD mode this decode-side TTFT "
                "includes the prefill and the KV transfer.\n"
                "What to do: on the PD dashboard find where the time goes: a growing prefill waiting queue "
                "(prefill capacity: chunked_prefill_size, more prefill engines), bootstrap/inflight queues (the "
                "handshake), transfer latency (the UCX lane, page_size), or decode prealloc (decode KV memory "
                "full). Compare with the load: the SLO may simply be exceeded by more traffic than planned."),
            subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in ttft_engines),
            case=ttft_case,
            exp_labels=lambda s: pick_labels(s, ENGINE_BY),
            eval_time="20m",
            decoys=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]}
                         for t in engines if t.labels["role"] == "prefill"),
            absent_ok=(SGLANG["ttft"],),
            fires_when=f"decode-side TTFT p99 > `pdkit_monitoring.ttft_p99_slo_s` ({fmt_value(slo)} s)",
        ))
    return out


# exporter: flags drift and NCCL/UCX env
@_declares("PdkitConfigDrift", "PdkitNcclEnvMissing")
def _exporter(c: _Context) -> list[Alert]:
    spec = c.spec
    out: list[Alert] = []
    scraped = {h.name for h in scraped_hosts(spec)}
    exp_subjects = tuple({"job": JOB_EXPORTER, "cluster": spec.cluster.name, "instance": h.name, "node": h.name,
                          "engine": e.name, "role": e.role}
                         for h, e in spec.engines() if h.name in scraped)
    out.append(Alert(
        name="PdkitConfigDrift",
        expr=f'max by ({by_labels(EXPORTER_BY)}) ({EXPORTER["flags_drift"]}) > 0',
        value=f'max by ({by_labels(EXPORTER_BY)}) ({EXPORTER["flags_drift"]})',
        for_=c.for_(DRIFT_FOR), severity="warning",
        summary="{{ $labels.node }}/{{ $labels.engine }} runs flags that differ from the plan",
        description=(
            "pdkit-exporter found that the flags engine {{ $labels.engine }} on {{ $labels.node }} really runs "
            "with (/server_info and its command line) differ from what the spec renders: someone changed the "
            "unit by hand, a deploy did not restart the engine, or the release on the node is not the planned "
            "one.\nWhat to do: compare `systemctl cat pdkit-engine-{{ $labels.engine }}` on the node with "
            "`pdkit render INVENTORY --out DIR`; re-run the deploy (it rewrites the unit and restarts the engine "
            "behind the health gate). Never fix a node by hand: the next deploy undoes it."),
        subjects=exp_subjects,
        case=lambda s, bad: [(series_text(EXPORTER["flags_drift"], s), "0x3 1x20" if bad else "0x25")],
        exp_labels=lambda s: pick_labels(s, EXPORTER_BY),
        eval_time="15m",
        fires_when=f"`{EXPORTER['flags_drift']} > 0`",
    ))
    out.append(Alert(
        name="PdkitNcclEnvMissing",
        expr=f'min by ({by_labels(EXPORTER_BY)}) ({EXPORTER["env_present"]}) == 0',
        value=f'min by ({by_labels(EXPORTER_BY)}) ({EXPORTER["env_present"]})',
        for_=c.for_(ENV_MISSING_FOR), severity="warning",
        summary="NCCL/UCX environment missing in {{ $labels.node }}/{{ $labels.engine }}",
        description=(
            "The running process of engine {{ $labels.engine }} on {{ $labels.node }} lacks NCCL/UCX variables the "
            "plan sets (read from /proc/<pid>/environ): untuned NCCL on PCIe falls back to host memory, and a "
            "cross-node NIXL transfer without UCX_NET_DEVICES hangs until its 300 s timeout.\n"
            "What to do: check that the unit's EnvironmentFile= lines point at the node's nccl.env / ucx.env "
            "(`systemctl cat pdkit-engine-{{ $labels.engine }}`) and that the engine was restarted after they "
            "changed; re-run the deploy."),
        subjects=exp_subjects,
        case=lambda s, bad: [(series_text(EXPORTER["env_present"], s), "1x3 0x20" if bad else "1x25")],
        exp_labels=lambda s: pick_labels(s, EXPORTER_BY),
        eval_time="15m",
        fires_when=f"`{EXPORTER['env_present']} == 0`",
    ))
    return out


# ---------------------------------------------------------------------------------------------
# Runbooks: one entry per alert, spec-independent text (docs/monitoring.md's "Runbooks" section is generated
# from it by pdkit.monitoring.alerttable; each rule's `runbook_url` annotation links to its entry).
# INVENTORY stands for the cluster's inventory file (inventories/<cluster>.py); {node}, {engine} for the
# alert's labels of those names.

@dataclass(frozen=True)
class Runbook:
    # what the alert says is wrong, and what it does to serving
    means: str
    # the usual causes, most likely first
    causes: tuple[str, ...]
    # in order: the doctor check, what to read on the node, the fix
    run: tuple[str, ...]


_JOURNAL = "`journalctl -u pdkit-engine-{engine} -n 300` on {node}"
_REDEPLOY = ("re-apply the plan to the node: `pdkit roll INVENTORY --limit {node}` (drains it, applies, restarts "
             "behind the health gate, re-adds it; a failed node is rolled back), or "
             "`pyinfra INVENTORY deploy/pd.py --limit {node}` where the node serves nothing")

RUNBOOKS: dict[str, Runbook] = {
    "PdkitEngineDown": Runbook(
        means="Prometheus cannot scrape an engine's /metrics: the process is stopped, crashed or hung. A PD pair "
              "stalls while either side is down; the router keeps sending the engine requests until its health "
              "checks fail (then PdkitRouterWorkerUnhealthy). The 2m `for` is longer than a real SGLang restart "
              "(~60-106 s): a roll does not page.",
        causes=("the engine crashed: CUDA out of memory, an NCCL error, SGLang's 300 s scheduler watchdog, a "
                "Python traceback", "a GPU fault (Xid in dmesg), the node rebooted",
                "someone stopped the unit by hand, or a deploy's restart failed its health gate"),
        run=("`pdkit doctor INVENTORY`: the engine's `reachable` row (and `rank_process` for an engine spanning "
             "nodes)",
             "`systemctl status pdkit-engine-{engine}` and " + _JOURNAL,
             "`nvidia-smi` and `dmesg -T | grep -i xid` on {node}",
             "fix the cause, then " + _REDEPLOY)),
    "PdkitEngineRankDown": Runbook(
        means="pdkit-exporter on a rank's node finds no running process for a rank above 0 of an engine spanning "
              "nodes (`pdkit_engine_rank_up{rank!=\"0\"} == 0`). Such a rank serves no HTTP, so "
              "PdkitEngineDown cannot see it; rank 0 cannot serve without it (it stalls, or exits like an NCCL "
              "timeout, and then PdkitEngineDown fires for it). Labels: `node` (the rank's host), `engine`, "
              "`role`, `rank`, `nnodes`, `head` (rank 0's host).",
        causes=("the rank keeps crashing: systemd restarts it after 5 s (`Restart=on-failure`), so one down for 2m "
                "keeps failing or was stopped",
                "it cannot reach rank 0's `--dist-init-addr` on {head} (firewall, NCCL_SOCKET_IFNAME)",
                "CUDA out of memory, an NCCL error, a GPU fault on {node}"),
        run=("`pdkit doctor INVENTORY`: the `rank_process` row of `{engine} rank {rank}`",
             "`systemctl status pdkit-engine-{engine}` and " + _JOURNAL,
             "`nvidia-smi`, `dmesg -T | grep -i xid` on {node}",
             "fix it and re-run the deploy over every node of the engine: `pdkit roll INVENTORY --limit {head} "
             "--limit {node}` (the ranks restart together behind rank 0's health gate)")),
    "PdkitRouterDown": Runbook(
        means="Prometheus cannot scrape the router's metrics port: clients get connection errors. The engines "
              "keep running; every worker alert of this router is inhibited while it is down.",
        causes=("the router crashed or was stopped", "a bad router flag after a change (it exits at start)",
                "the metrics port is firewalled from the monitoring host (then clients may still be served)"),
        run=("`systemctl status pdkit-router` and `journalctl -u pdkit-router -n 200` on {node}",
             "`curl -s http://{node}:<router port>/health` from a client host",
             "`pdkit doctor INVENTORY`: the `router_workers` row",
             "restart it with the deploy: `pyinfra INVENTORY deploy/pd.py --limit {node}`; nothing else needs a "
             "restart")),
    "PdkitNodeDown": Runbook(
        means="Prometheus cannot reach node_exporter on the host for 1m: the host is down, cut off the network, or "
              "only its node_exporter stopped. While it fires, Alertmanager holds back the alerts of the host's "
              "engines and exporters (inhibition), so a dead node pages once.",
        causes=("the host crashed, rebooted or lost power", "a network cut between it and the monitoring host (its "
                "engines may still serve clients on another path)", "prometheus-node-exporter stopped"),
        run=("reach the host: `ssh {node}` (or its BMC console); `uptime`, `journalctl -b -1 -n 100` after a reboot",
             "on it: `systemctl status prometheus-node-exporter`",
             "`pdkit doctor INVENTORY`: the host's rows say whether its engines still serve",
             "once it is back: `pyinfra INVENTORY deploy/pd.py --limit {node}` re-applies it; the router takes its "
             "engines back on its own")),
    "PdkitGpuWedged": Runbook(
        means="pdkit-exporter's GPU health probe (the preflight's: `nvidia-smi -q` and the kernel log's Xid lines, "
              "at most once a minute) finds a GPU an engine uses in need of a reset "
              "(`pdkit_engine_gpu_wedged == 1`; its `seen` label says why). A wedged GPU does not heal by itself: "
              "the engine on it fails, hangs, or will not start again, and `pdkit roll` and `pdkit tune` refuse "
              "any change onto it. Labels: `node`, `engine`, `role`, `gpu` (the node's index), `bdf`.",
        causes=("a reset-class Xid in the kernel log (`pdkit.topology.RESET_XIDS`): 79 (fallen off the bus), "
                "48/63/64/94/95/140 (memory errors), 62, 74, 119/120 (GSP)",
                "a hung P2P collective: the GPU busy with no process (judged only while the node's engines are "
                "stopped: in a container nvidia-smi lists no process of another PID namespace)",
                "retired pages or a row remap pending: they apply at the next reset",
                "row remapping failed: the GPU's memory is failing (replace it)"),
        run=("`pdkit doctor INVENTORY`: the engine's `gpu_health` row names the GPU and what was seen "
             "(`pdkit preflight INVENTORY` reads the same facts)",
             "on {node}: `nvidia-smi -q -i {gpu}` and `dmesg -T | grep -i xid`",
             "drain the node (`pdkit roll` refuses changes onto the GPU until then; stop its engines), then "
             "`nvidia-smi -r -i {gpu}` on {node} with no process on the GPU, or reboot it; "
             "`journalctl -u pdkit-exporter -n 50` if the probe itself hangs",
             "once the probe reads it healthy (within a minute): " + _REDEPLOY)),
    "PdkitScrapeTargetDown": Runbook(
        means="pdkit-exporter, the DCGM exporter or Prometheus itself cannot be scraped for 5m: "
              "the dashboards and the alerts built on it (drift, NCCL env, GPU figures) are blind. "
              "Serving is not affected. (node_exporter down is `PdkitNodeDown`.)",
        causes=("the exporter service stopped or crashed", "its port is not reachable from the monitoring host"),
        run=("on {node}: `systemctl status pdkit-exporter` (or dcgm-exporter, prometheus) and "
             "`journalctl -u <that unit> -n 100`",
             "from the monitoring host: `curl -s http://{node}:<port>/metrics | head`",
             "re-apply the node: `pyinfra INVENTORY deploy/pd.py --limit {node}` (it serves nothing new: no roll "
             "needed)")),
    "PdkitRouterWorkerUnhealthy": Runbook(
        means="The router failed a worker's health checks and sends it no new requests; in PD mode its partner "
              "side loses capacity. The router takes it back on its own once health checks pass (pdkit runs it "
              "without --remove-unhealthy-workers).",
        causes=("the engine is down (PdkitEngineDown for the same engine)",
                "the engine is up but /health does not answer the router: a firewall, a wrong --host, an engine "
                "stuck in a long generate or wedged (PdkitEngineWedged)"),
        run=("`pdkit doctor INVENTORY`: the `router_workers` row and the engine's `reachable` and `queues` rows",
             "`curl -s {worker}/health` from the router host {node}",
             "the engine's journal: `journalctl -u pdkit-engine-{engine} -n 300` on the worker's node",
             "fix the engine (restart it, or " + _REDEPLOY + ")")),
    "PdkitRouterCircuitOpen": Runbook(
        means="The router keeps opening its circuit breaker for one worker: requests sent to it keep failing "
              "(each trip is 10 failures, pdkit/flags.py ROUTER_BREAKER), and it is pulled out of routing every "
              "few seconds, while its health checks may still pass (then PdkitRouterWorkerUnhealthy stays "
              "quiet). One trip that recovers (a restart) does not fire: the breaker must open again within "
              "every 2m for 5m. smg 1.13.0 only (sglang-router 0.3.2 exports no breaker transitions).",
        causes=("the worker's requests fail: KV transfers or the PD bootstrap (PdkitKvTransferFailures, "
                "PdkitBootstrapFailures), CUDA out of memory per request, a traceback per request",
                "the worker is wedged and requests time out (PdkitEngineWedged)",
                "a request timeout shorter than the worker needs (pdkit_cluster.fault_budget)"),
        run=("`pdkit doctor INVENTORY`: the worker's `kv_transfer` row (it counts the router's failed requests "
             "per worker) and `router_workers`",
             "`journalctl -u pdkit-engine-{engine} -n 300` on the worker's node and `journalctl -u pdkit-router "
             "-n 300 | grep {worker}` on {node}",
             "restart the engine if it does not recover: `pdkit roll INVENTORY --limit <worker's node>`")),
    "PdkitRouterRetriesExhausted": Runbook(
        means="The router gave up on requests after every retry (`smg_worker_retries_exhausted_total` moved): "
              "those clients got an error. smg 1.13.0 only.",
        causes=("workers of that type are down, unhealthy or failing requests (the engine and router worker "
                "alerts name which)", "every worker of that type is overloaded or draining at once",
                "request timeouts shorter than a long generate (pdkit_cluster.fault_budget)"),
        run=("`pdkit doctor INVENTORY` (its `router_workers`, `kv_transfer` and `queues` rows)",
             "`journalctl -u pdkit-router -n 300` on {node}: each failed attempt names its worker and error",
             "fix the failing worker (its own alert's runbook); a timeout: raise the fault budget in the "
             "inventory and `pdkit roll INVENTORY --limit {node}`")),
    "PdkitRouterWorkersOverloaded": Runbook(
        means="For 10m the router found every worker it could use overloaded (waiting queue at "
              "--worker-overload-waiting-requests, default 8, or KV usage at --worker-overload-token-usage, "
              "default 0.8) and routed requests to the least-loaded one anyway (or shed them with a 503 under "
              "--worker-overload-shed). The cluster is past its capacity: TTFT grows, queues build. smg 1.13.0 "
              "only.",
        causes=("more traffic than the cluster was sized for",
                "lost capacity: an engine down or pulled out of routing (its own alerts)",
                "an engine slower than planned: decode without CUDA graphs, drifted flags "
                "(PdkitDecodeCudaGraphRatioLow, PdkitConfigDrift)"),
        run=("`pdkit doctor INVENTORY --bench`: throughput against the last recorded run, and which engine is "
             "slow (`decode_speed_c16`)",
             "the PD dashboard: which side saturates (prefill waiting queue, decode KV usage)",
             "add engines to the inventory and `pdkit roll INVENTORY`, or lower the load")),
    "PdkitRouterAdmissionRejected": Runbook(
        means="The router refused requests at admission: more than --max-concurrent-requests were in flight and "
              "its queue (--queue-size) was full or timed out, so clients got a 429. The rejected series is "
              "created by the first rejection, so a new series fires too. smg 1.13.0 only.",
        causes=("a load spike past the admission limit (default 1024 per core, at least 4096)",
                "a limit set lower than the engines can hold (pdkit_router.extra_args)",
                "slow engines hold their permits longer (the overload and queue alerts)"),
        run=("`pdkit doctor INVENTORY` and the router dashboard's request rate",
             "`journalctl -u pdkit-router -n 200` on {node}",
             "raise the limit in pdkit_router.extra_args and roll the router host "
             "(`pdkit roll INVENTORY --limit {node}`), or add engines, or lower the load")),
    "PdkitRouterPdRendezvousFailed": Runbook(
        means="The router counted a PD rendezvous failure on one leg (label `leg`, the worker type that failed; "
              "`smg_pd_rendezvous_failures_total`). Over HTTP, pdkit's path, that is a worker whose bootstrap "
              "port refused the router's probe when the router registered it: the worker is in routing, but the "
              "engines of the other leg cannot reach it for the KV hand-off, so the requests sent to that pair "
              "fail or wait for the PD handshake timeout (then PdkitBootstrapFailures, PdkitRouterCircuitOpen). "
              "smg counts the probe once, at registration: the alert resolves by itself after its window while "
              "the worker stays broken until it is registered again. smg 1.13.0 only.",
        causes=("the engine's --disaggregation-bootstrap-port is not the port the router was given (a "
                "hand-edited unit or router argument: PdkitConfigDrift)",
                "a firewall between the router host (and the other leg's engines) and the worker's bootstrap port",
                "the engine's bootstrap server was not up yet, or died, when the router registered it"),
        run=("`pdkit doctor INVENTORY` (its `router_workers` and `kv_transfer` rows)",
             "`journalctl -u pdkit-router -n 300 | grep -i bootstrap` on {node}: the worker and the port it probed",
             "on the worker's node: `ss -ltnp | grep <bootstrap port>` and the engine's journal; from {node}: "
             "`nc -zv <worker host> <bootstrap port>`",
             "fix the port or the firewall, then `pdkit roll INVENTORY --limit <worker's node>`, which "
             "re-registers the worker")),
    "PdkitQueueGrowing": Runbook(
        means="One of an engine's queues (label `queue`) has kept growing for 10m: requests arrive faster than "
              "the engine drains them. A queue that is stuck but not growing does not fire this; the TTFT, "
              "wedge and failure alerts catch it.",
        causes=("`waiting`: the engine is at capacity (KV cache usage, decode without CUDA graphs)",
                "`prefill_bootstrap`: prefill waits for the handshake with its decode (decode down, another "
                "model or SGLang version)",
                "`prefill_inflight` / `decode_transfer`: KV transfers are slow or stuck (the UCX lane, "
                "`ucx_net_devices` across nodes)",
                "`decode_prealloc`: decode has no KV memory for new requests (decode is the bottleneck)"),
        run=("`pdkit doctor INVENTORY`: the engine's `queues` row (growing while producing tokens: capacity; "
             "with no token: stuck) and `decode_cuda_graph`",
             "the tuning and PD dashboards for the queue's engine",
             "capacity: add engines and `pdkit roll INVENTORY`; stuck transfers: the KV failure runbooks below")),
    "PdkitKvTransferFailures": Runbook(
        means="KV transfers between prefill and decode fail and their requests error out. The counter is created "
              "by its first failure, so the alert also fires on a new series (the first failure).",
        causes=("cross-node transfers without `pdkit_node.ucx_net_devices` (they hang until the 300 s timeout)",
                "on one node, `UCX_TLS` without `cuda_ipc`",
                "the pair runs different models or SGLang versions", "a NIXL/UCX error on either side"),
        run=("`pdkit doctor INVENTORY`: the `kv_transfer` and `version` rows of both engines",
             "both engines' journals: " + _JOURNAL + " (NIXL/UCX errors, 300 s timeouts); `UCX_PROTO_INFO=y` "
             "in the engine's environment logs the lane UCX picked",
             "set the missing node fields in the inventory and `pdkit roll INVENTORY --limit {node}`")),
    "PdkitBootstrapFailures": Runbook(
        means="Decode could not complete the bootstrap handshake with its prefill (the prefill's bootstrap "
              "port): requests fail before any KV moves. A new series (the first failure) fires too.",
        causes=("the prefill is down or restarting", "the bootstrap port (pdkit_node.engines[].bootstrap_port, "
                "default 8998) is not reachable from the decode node",
                "the router does not pass the port (`--prefill URL PORT`)",
                "a prefill replaced behind the same address left the decode waiting"),
        run=("`pdkit doctor INVENTORY`: the `kv_transfer` rows of the pair",
             "from the decode node: `nc -vz <prefill node> <bootstrap port>`",
             "the decode's journal: " + _JOURNAL,
             "restart the decode (`pdkit roll INVENTORY --limit {node}`) if the prefill was replaced")),
    "PdkitKvHandoffSlow": Runbook(
        means="A prefill's KV hand-offs to its decodes ran below the floor of the slowest path it may take, for "
              "10m while hand-offs happened. The rate is effective: MiB moved / 1024 over the seconds spent "
              "moving them (a ratio of sums over the rate window, queueing behind other hand-offs included), not "
              "SGLang's `kv_transfer_speed_gb_s` mean of per-request speeds, which a few fast hand-offs keep "
              "looking healthy. The floor (label `floor`) is rendered per prefill from the spec: the lowest of "
              "the paths to the decodes it may pair with (`pdkit.kvcost.KV_PATHS`: " + kv_floors_text() + "; "
              "same-host is cuda_ipc, cross-host-tcp is `ucx_net_devices` unset or not an RDMA device); a sim: "
              "the lowest. Requests wait for their KV: TTFT grows (an H200 pair across two hosts over TCP took "
              "8-10 s per 192 MB hand-off, TTFT 15 s at C=16).",
        causes=("KV crosses hosts over TCP: `pdkit_node.ucx_net_devices` unset or a netdev, so UCX stages every "
                "byte through host memory and sockets",
                "on one host, `UCX_TLS` without `cuda_ipc` (the lane UCX picked: `UCX_PROTO_INFO=y`)",
                "hand-offs queue behind each other: long prompts at high concurrency, small pages "
                "(`tuning.page_size`)",
                "over RDMA, the NIC named is not the GPUs' nearest, or its link is down"),
        run=("`pdkit doctor INVENTORY` (or `--bench`): the prefill's `kv_path` row names the path, the effective "
             "rate beside SGLang's mean, the p99 latency and the hand-off's share of TTFT",
             "the PD dashboard: KV transfer effective rate and latency, the prefill inflight queue",
             "across hosts: set `pdkit_node.ucx_net_devices` to the RDMA NIC (e.g. `mlx5_0:1`) if the hosts have "
             "one, else a larger `tuning.page_size`, or keep PD pairs on one host (a pd_group per host and a "
             "router per node); then `pdkit roll INVENTORY --limit {node}`")),
    "PdkitDecodeCudaGraphRatioLow": Runbook(
        means="Fewer than 90% of an engine's decode passes ran in a CUDA graph although its spec turns decode "
              "graphs on: decode is CPU-launch bound (the seeds measured 3-5x less throughput). Only engines "
              "with graphs on are watched; an idle engine does not fire.",
        causes=("decode batches larger than the largest captured graph (`cuda_graph_max_bs` below the target "
                "concurrency)", "a graph capture failure at start (the journal)",
                "the running engine has graphs off although planned on (PdkitConfigDrift)"),
        run=("`pdkit doctor INVENTORY`: the engine's `decode_cuda_graph` and `graph_buckets` rows",
             "`#running-req` in the decode log lines (tuning dashboard) against `cuda_graph_max_bs`",
             "set `tuning.cuda_graph_max_bs` to at least the target concurrency and `pdkit roll INVENTORY --limit "
             "{node}`")),
    "PdkitEngineWedged": Runbook(
        means="An engine holds requests (running or queued) and its scheduler computed no token over the wedge "
              "window (2m): its HTTP server answers and /health may pass, clients wait. It fires well inside "
              "SGLang's 300 s scheduler watchdog.",
        causes=("a scheduler hang with the overlap schedule (the seeds hit it)",
                "an NCCL or NIXL call that never returns", "a GPU fault"),
        run=("`pdkit doctor INVENTORY`: the engine's `queues` row says \"wedged\"",
             _JOURNAL + " (the last Prefill/Decode batch line, NCCL or NIXL errors)",
             "`py-spy dump --pid <scheduler pid>` on {node} shows where it hangs",
             "`systemctl restart pdkit-engine-{engine}` on {node} (or `pdkit roll INVENTORY --limit {node}`); "
             "if it recurs, consider `--disable-overlap-schedule`")),
    "PdkitTtftP99OverSlo": Runbook(
        means="The p99 time to first token measured by decode (and unified) engines over the rate window is "
              "above `pdkit_monitoring.ttft_p99_slo_s`. In PD mode it includes the prefill and the KV transfer.",
        causes=("more traffic than planned", "prefill capacity (a growing prefill waiting queue)",
                "slow handshakes or transfers (bootstrap/inflight queues, the UCX lane)",
                "decode KV memory full (decode prealloc queue)"),
        run=("`pdkit doctor INVENTORY --bench` (throughput against the recorded run)",
             "the PD dashboard: where the time goes (queues, transfer latency)",
             "`pdkit tune` the levers (docs/tune.md), or add capacity and `pdkit roll INVENTORY`")),
    "PdkitConfigDrift": Runbook(
        means="pdkit-exporter finds that an engine runs flags that differ from what the spec renders.",
        causes=("someone changed the unit by hand", "a deploy did not restart the engine",
                "the release on the node is not the planned one"),
        run=("`pdkit doctor INVENTORY`: the engine's `flags` row names each drifted flag",
             "compare `systemctl cat pdkit-engine-{engine}` on {node} with `pdkit render INVENTORY --out DIR`",
             _REDEPLOY + "; never fix a node by hand: the next deploy undoes it")),
    "PdkitNcclEnvMissing": Runbook(
        means="The engine's running process lacks NCCL/UCX variables the plan sets (read from "
              "`/proc/<pid>/environ`): untuned NCCL on PCIe falls back to host memory, and cross-node NIXL "
              "without UCX_NET_DEVICES hangs for 300 s.",
        causes=("the engine was not restarted after its env files changed",
                "the unit's EnvironmentFile= lines do not point at the node's nccl.env / ucx.env"),
        run=("`pdkit doctor INVENTORY`: the engine's `process_env` row names the variable",
             "`systemctl cat pdkit-engine-{engine}` on {node}",
             _REDEPLOY + " (an env file only takes effect on restart)")),
}


def runbook_url(spec: ClusterSpec, name: str) -> str:
    """An alert's `runbook_url` annotation: pdkit_monitoring.runbook_base_url plus the anchor of the alert's
    heading in docs/monitoring.md's runbooks (`### <name>`: GitHub's anchor is the name lower-cased)."""
    return f"{monitoring_of(spec).runbook_base_url}#{name.lower()}"


def alert_annotations(spec: ClusterSpec, a: Alert, labels: dict[str, str] | None = None) -> dict[str, str]:
    """An alert's annotations: as in the rules file (templates), or expanded for LABELS (promtool's
    exp_annotations)."""
    out = {"summary": a.summary, "description": a.description, "runbook_url": runbook_url(spec, a.name)}
    return out if labels is None else {k: _expand(v, labels) for k, v in out.items()}


def alerts(spec: ClusterSpec) -> list[Alert]:
    """Every alert rule for this spec, with its promtool cases: ALERT_TABLE's builders in order."""
    c = _context(spec)
    out: list[Alert] = []
    for names, build in ALERT_TABLE:
        made = build(c)
        assert {a.name for a in made} <= set(names), f"{build.__name__} declares {[a.name for a in made]}, not {names}"
        out += made
    return out


# every alert the table can declare, in rule order
ALERT_NAMES = tuple(n for names, _ in ALERT_TABLE for n in names)


def alert_rules(spec: ClusterSpec) -> str:
    """The rules file (RULES_PATH), one group."""
    rules = []
    for a in alerts(spec):
        rules.append({
            "alert": a.name,
            "expr": a.expr,
            "for": a.for_,
            "labels": {"severity": a.severity},
            "annotations": alert_annotations(spec, a),
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
            return {"exp_labels": dict(sorted(exp.items())), "exp_annotations": alert_annotations(spec, a, exp)}

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
                               + (f" (and ignores {a.decoys_are})" if a.decoys else ""), [], True))
        if a.extra_tests is not None:
            for t in a.extra_tests(a.subjects):
                for check in t["alert_rule_test"]:
                    for e in check["exp_alerts"]:
                        e["exp_annotations"] = alert_annotations(spec, a, e["exp_labels"])
                tests.append(t)
    k = speedup_of(spec)
    if k > 1:
        # the lab's faster alert clock: every case on the same time axis divided by the speedup, so each
        # case says exactly what it says at the real windows (tests/test_monitoring.py runs both)
        for t in tests:
            t["interval"] = scaled_duration(t["interval"], k)
            for check in t["alert_rule_test"]:
                check["eval_time"] = scaled_duration(check["eval_time"], k)
    doc = {"rule_files": [rules_file], "evaluation_interval": scaled_duration("1m", k), "tests": tests}
    return "# Generated by pdkit: `promtool test rules` cases for every alert.\n" + to_yaml(doc)


def _subject_name(s: dict[str, str]) -> str:
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
    if s.get("job") in (JOB_NODE, JOB_DCGM, JOB_PROMETHEUS, JOB_EXPORTER):
        return f"{s['job']} on {s['node']}"
    return s["instance"]


def alert_conditions(spec: ClusterSpec) -> list[tuple[str, str]]:
    """(where, full alert expression): parse-check these; they return nothing while all is well."""
    return [(f"alert {a.name}", a.expr) for a in alerts(spec)]
