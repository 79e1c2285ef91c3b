"""Alerts on the routers and what they say of their workers: a router down, a worker unhealthy, a breaker that
keeps opening, retries exhausted, every worker overloaded, admission rejections, a PD leg it cannot rendezvous
with. The alerts on smg 1.13.0's counters are declared only for routers whose release exports them."""

from __future__ import annotations

from pdkit.monitoring.alertrules.base import (
    NODE,
    REDEPLOY,
    ROUTER_WORKERS,
    Alert,
    AlertRecord,
    Context,
    Runbook,
    alert_test,
    counted_alert,
    flag_alert,
    up_alert,
)
from pdkit.monitoring.alertrules.engines import QUEUE_GROWING_FOR
from pdkit.monitoring.alertrules.kv import FAILURES_FOR
from pdkit.monitoring.common import (
    JOB_ROUTER,
    ROUTER_BY,
    WORKER_BY,
    by_labels,
    duration_seconds,
    engine_instance,
    fmt_seconds,
    pick_labels,
    series_text,
)
from pdkit.monitoring.scrape import Target
from pdkit.render import flags
from pdkit.upstream.catalogue import router_families
from pdkit.upstream.metricnames import ROUTER

ROUTER_DOWN_FOR = "1m"
WORKER_UNHEALTHY_FOR = "1m"
# a worker whose breaker keeps opening: opened again within every CB_WINDOW for this long. A single trip
# (an engine restart; pdkit's 3 s breaker timeout, pdkit/render/flags.py ROUTER_BREAKER) holds the condition for
# one window only, shorter than this `for`, so it never pages; a worker that keeps failing requests re-opens
# its breaker within seconds of each half-open trial while traffic comes.
CB_OPEN_FOR = "5m"
CB_WINDOW = "2m"
ROUTER_FAILURES_FOR = FAILURES_FOR
# every worker overloaded: a capacity problem, as long as a queue must grow before PdkitQueueGrowing
OVERLOAD_FOR = QUEUE_GROWING_FOR


# router down
def _router_down(c: Context, r: AlertRecord) -> Alert | None:
    if not c.routers:
        return None
    return up_alert(
        c, r, (JOB_ROUTER,),
        summary="Router on {{ $labels.node }} is down",
        description=(
            "Prometheus cannot scrape the router's metrics port on {{ $labels.node }}: clients get "
            "connection errors. The engines keep running."),
    )


ROUTER_DOWN = AlertRecord(
    name="PdkitRouterDown", severity="critical", for_=ROUTER_DOWN_FOR, scope=NODE, build=_router_down,
    runbook=Runbook(
        means="Prometheus cannot scrape the router's metrics port: clients get connection errors. The engines "
              "keep running; every worker alert of this router is inhibited while it is down.",
        causes=("the router crashed or was stopped", "a bad router flag after a change (it exits at start)",
                "the metrics port is firewalled from the monitoring host (then clients may still be served)"),
        run=("`systemctl status pdkit-router` and `journalctl -u pdkit-router -n 200` on {node}",
             "`curl -s http://{node}:<router port>/health` from a client host",
             "`pdkit doctor INVENTORY`: the `router_workers` row",
             "restart it with the deploy: `pyinfra INVENTORY deploy/pd.py --limit {node}`; nothing else needs a "
             "restart")),
)


def _routers_exporting(c: Context, *families: str) -> list[Target]:
    """The routers whose pinned release exports every one of FAMILIES (pdkit/upstream/data/metric_catalogue.json, per
    release): an alert on a family that another release lacks (sglang-router 0.3.2 has none of smg 1.13.0's
    overload and breaker-transition counters) is declared for these routers only, so that it never sits in
    the rules unable to fire; a spec whose routers all lack one has no such alert (docs/monitoring.md)."""
    out = []
    for t in c.routers:
        exported = router_families(*c.spec.router_release(c.spec.host(t.host)))
        if all(f in exported for f in families):
            out.append(t)
    return out


def _worker_subjects(c: Context, routers: list[Target]) -> list[dict[str, str]]:
    """One subject per (router, worker): the router's target labels and the worker labels the router's scrape
    relabelling adds (WORKER_BY)."""
    out = []
    for rt in routers:
        host = c.spec.host(rt.host)
        for h, e in c.spec.router_workers(host):
            out.append({"job": JOB_ROUTER, **rt.labels, "worker": flags.engine_url(c.spec, h, e),
                        "worker_instance": engine_instance(h, e.name), "worker_role": e.role})
    return out


def _router_worker_types(c: Context, router: Target) -> list[str]:
    """The worker_type values the router labels its workers with: prefill and decode in PD mode, else
    regular."""
    roles = {e.role for _, e in c.spec.router_workers(c.spec.host(router.host))}
    return sorted(roles & {"prefill", "decode"}) or ["regular"]


def _router_pd_legs(c: Context, router: Target) -> list[str]:
    """The PD legs (worker types) behind a router: none for a router of regular workers."""
    return [t for t in _router_worker_types(c, router) if t in ("prefill", "decode")]


# router worker unhealthy
def _router_worker_unhealthy(c: Context, r: AlertRecord) -> Alert | None:
    routers = c.routers
    worker_subjects = _worker_subjects(c, routers)
    if worker_subjects:
        return flag_alert(
            c, r, metric=ROUTER["worker_health"], ok=1, by=WORKER_BY,
            summary="Router on {{ $labels.node }} marks worker {{ $labels.worker_instance }} unhealthy",
            description=(
                "The router on {{ $labels.node }} counts {{ $labels.worker }} ({{ $labels.worker_instance }}, "
                "{{ $labels.worker_role }}) unhealthy: it failed the router's health checks and gets no new "
                "requests; in PD mode its partner side loses capacity. The router takes it back on its own once "
                "its health checks pass again (pdkit runs the router without --remove-unhealthy-workers)."),
            subjects=tuple(worker_subjects),
            eval_time="10m",
            fires_when=f"`{ROUTER['worker_health']} == 0` for a worker",
        )
    return None


ROUTER_WORKER_UNHEALTHY = AlertRecord(
    name="PdkitRouterWorkerUnhealthy", severity="critical", for_=WORKER_UNHEALTHY_FOR, scope=ROUTER_WORKERS,
    build=_router_worker_unhealthy,
    runbook=Runbook(
        means="The router failed a worker's health checks and sends it no new requests; in PD mode its partner "
              "side loses capacity. The router takes it back on its own once health checks pass (pdkit runs it "
              "without --remove-unhealthy-workers).",
        causes=("the engine is down (PdkitEngineDown for the same engine)",
                "the engine is up but /health does not answer the router: a firewall, a wrong --host, an engine "
                "stuck in a long generate or wedged (PdkitEngineWedged)"),
        run=("`pdkit doctor INVENTORY`: the `router_workers` row and the engine's `reachable` and `queues` rows",
             "`curl -s {worker}/health` from the router host {node}",
             "the engine's journal on the worker's node ({worker_instance} is `<node>/<engine>`): "
             "`journalctl -u pdkit-engine-<engine> -n 300`",
             "fix the engine (restart it, or " + REDEPLOY + ")")),
)


# a worker's circuit breaker keeps opening (smg 1.13.0): its requests fail although health checks may pass
def _router_circuit_open(c: Context, r: AlertRecord) -> Alert | None:
    metric = ROUTER["worker_cb_transitions"]
    subjects = _worker_subjects(c, _routers_exporting(c, metric))
    if not subjects:
        return None
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
            out.append(alert_test(f"{r.name} stays quiet for {s['worker_instance']} after one trip "
                                  "(a restart) that recovered", r.name, series, "12m", []))
        return out

    return r.make(
        c,
        expr=f"{opened} > 0",
        value=opened,
        summary="Router on {{ $labels.node }} keeps opening the circuit breaker of {{ $labels.worker_instance }}",
        description=(
            "The router on {{ $labels.node }} opened its circuit breaker for {{ $labels.worker }} "
            "({{ $labels.worker_instance }}, {{ $labels.worker_role }}) again and again for "
            f"{c.for_(r.for_)}: requests sent to it keep failing (each trip is "
            f"{flags.ROUTER_BREAKER['cb-failure-threshold']} failures), so the router keeps pulling it out of "
            "routing, and its health checks may still pass (then PdkitRouterWorkerUnhealthy stays quiet)."),
        subjects=tuple(subjects),
        case=case,
        exp_labels=lambda s: pick_labels(s, WORKER_BY),
        eval_time="15m",
        extra_tests=one_trip_test,
        fires_when=(f"`increase({metric}{{to=\"open\"}}[{w}]) > 0` for a worker, for {c.for_(r.for_)} "
                    "(smg 1.13.0)"),
    )


ROUTER_CIRCUIT_OPEN = AlertRecord(
    name="PdkitRouterCircuitOpen", severity="critical", for_=CB_OPEN_FOR, scope=ROUTER_WORKERS,
    build=_router_circuit_open,
    runbook=Runbook(
        means="The router keeps opening its circuit breaker for one worker: requests sent to it keep failing "
              "(each trip is 10 failures, pdkit/render/flags.py ROUTER_BREAKER), and it is pulled out of routing every "
              "few seconds, while its health checks may still pass (then PdkitRouterWorkerUnhealthy stays "
              "quiet). One trip that recovers (a restart) does not fire: the breaker must open again within "
              f"every {CB_WINDOW} for {CB_OPEN_FOR}. smg 1.13.0 only (sglang-router 0.3.2 exports no breaker "
              "transitions).",
        causes=("the worker's requests fail: KV transfers or the PD bootstrap (PdkitKvTransferFailures, "
                "PdkitBootstrapFailures), CUDA out of memory per request, a traceback per request",
                "the worker is wedged and requests time out (PdkitEngineWedged)",
                "a request timeout shorter than the worker needs (pdkit_cluster.fault_budget)"),
        run=("`pdkit doctor INVENTORY`: the worker's `kv_transfer` row (it counts the router's failed requests "
             "per worker) and `router_workers`",
             "on the worker's node ({worker_instance} is `<node>/<engine>`): `journalctl -u pdkit-engine-<engine> "
             "-n 300`; on {node}: `journalctl -u pdkit-router -n 300 | grep {worker}`",
             "restart the engine if it does not recover: `pdkit roll INVENTORY --limit <worker's node>`")),
)


# requests that failed on every retry (smg 1.13.0): the client got the error
def _router_retries_exhausted(c: Context, r: AlertRecord) -> Alert | None:
    metric = ROUTER["retries_exhausted"]
    routers = _routers_exporting(c, metric)
    if not routers:
        return None
    labels = (*ROUTER_BY, "worker_type")
    failed = f"sum by ({by_labels(labels)}) (increase({metric}[{c.w}]))"
    subjects = tuple({"job": JOB_ROUTER, **t.labels, "worker_type": kind}
                     for t in routers for kind in _router_worker_types(c, t))
    return r.make(
        c,
        expr=f"{failed} > 0",
        value=failed,
        summary="Requests through the router on {{ $labels.node }} fail after every retry ({{ $labels.worker_type }})",
        description=(
            "The router on {{ $labels.node }} gave up on requests to its {{ $labels.worker_type }} workers after "
            f"every retry in the last {c.w}: those clients got an error."),
        subjects=subjects,
        # bad: exhausted retries go on; healthy: an old count, and retries that keep succeeding
        case=lambda s, bad: [(series_text(metric, {**s, "endpoint": "chat"}), "0x3 1+1x20" if bad else "4x25"),
                             (series_text(ROUTER["retries"], {**s, "endpoint": "chat"}), "0+3x25")],
        exp_labels=lambda s: pick_labels(s, labels),
        eval_time="10m",
        fires_when=f"`increase({metric}[{c.w}]) > 0` (smg 1.13.0)",
    )


ROUTER_RETRIES_EXHAUSTED = AlertRecord(
    name="PdkitRouterRetriesExhausted", severity="warning", for_=ROUTER_FAILURES_FOR, scope=ROUTER_WORKERS,
    build=_router_retries_exhausted,
    runbook=Runbook(
        means="The router gave up on requests after every retry (`smg_worker_retries_exhausted_total` moved): "
              "those clients got an error. smg 1.13.0 only.",
        causes=("workers of that type are down, unhealthy or failing requests (the engine and router worker "
                "alerts name which)", "every worker of that type is overloaded or draining at once",
                "request timeouts shorter than a long generate (pdkit_cluster.fault_budget)"),
        run=("`pdkit doctor INVENTORY` (its `router_workers`, `kv_transfer` and `queues` rows)",
             "`journalctl -u pdkit-router -n 300` on {node}: each failed attempt names its worker and error",
             "fix the failing worker (its own alert's runbook); a timeout: raise the fault budget in the "
             "inventory and `pdkit roll INVENTORY --limit {node}`")),
)


# every worker overloaded (smg 1.13.0): shed (503) or routed to an overloaded one anyway
def _router_workers_overloaded(c: Context, r: AlertRecord) -> Alert | None:
    shed, fallback = ROUTER["overload_shed"], ROUTER["overload_fallback"]
    routers = _routers_exporting(c, shed, fallback)
    if not routers:
        return None
    by = by_labels(ROUTER_BY)
    overloaded = (f"sum by ({by}) (increase({shed}[{c.w}]))\n+\n"
                  f"sum by ({by}) (increase({fallback}[{c.w}]))")

    def case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        rows = [(series_text(shed, {**s, "stage": stage}), "0x30") for stage in ("selection", "dispatch")]
        return rows + [(series_text(fallback, {**s, "stage": "selection"}), "0+5x30" if bad else "40x30")]

    return r.make(
        c,
        expr=f"(\n{overloaded}\n) > 0",
        value=overloaded,
        summary="Every worker behind the router on {{ $labels.node }} has been overloaded for "
                + c.for_(r.for_),
        description=(
            "For " + c.for_(r.for_) + " the router on {{ $labels.node }} found every worker it could use "
            "overloaded (a waiting queue at --worker-overload-waiting-requests, default 8, or KV usage at "
            "--worker-overload-token-usage, default 0.8): it routed requests to the least-loaded one anyway "
            "(or shed them with a 503 under --worker-overload-shed). The cluster is past its capacity: TTFT "
            "grows and queues build."),
        subjects=tuple({"job": JOB_ROUTER, **t.labels} for t in routers),
        case=case,
        exp_labels=lambda s: pick_labels(s, ROUTER_BY),
        eval_time="20m",
        fires_when=f"`{shed}` or `{fallback}` grows for {c.for_(r.for_)} (smg 1.13.0)",
    )


ROUTER_WORKERS_OVERLOADED = AlertRecord(
    name="PdkitRouterWorkersOverloaded", severity="warning", for_=OVERLOAD_FOR, scope=ROUTER_WORKERS,
    build=_router_workers_overloaded,
    runbook=Runbook(
        means=f"For {OVERLOAD_FOR} the router found every worker it could use overloaded (waiting queue at "
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
             "the PD dashboard: which side saturates (prefill waiting queue, decode KV usage); "
             "PdkitQueueGrowing and PdkitTtftP99OverSlo name the engine",
             "add engines to the inventory and `pdkit roll INVENTORY`, or lower the load")),
)


# admission rejections (smg 1.13.0): past --max-concurrent-requests and its queue, clients get a 429
def _router_admission_rejected(c: Context, r: AlertRecord) -> Alert | None:
    metric = ROUTER["admission"]
    routers = _routers_exporting(c, metric)
    if not routers:
        return None
    w = c.w
    rejected = f'{metric}{{result="rejected"}}'
    # the rejected child is created by the first rejection: a new series counts as one too
    return counted_alert(
        c, r, labels=ROUTER_BY, counted=rejected, what="rejections",
        zero=f"sum by ({by_labels(ROUTER_BY)}) (up{{job=\"{JOB_ROUTER}\"}}) * 0",
        # bad: the first rejection (the child appears at 1 and stays); healthy: only allowed requests
        series_of=lambda s: series_text(metric, {**s, "result": "rejected"}),
        more_rows=lambda s, bad: [(series_text(metric, {**s, "result": "allowed"}), "0+50x20")],
        subjects=tuple({"job": JOB_ROUTER, **t.labels} for t in routers),
        summary="The router on {{ $labels.node }} rejects requests (admission limit)",
        description=(
            "The router on {{ $labels.node }} refused requests at admission in the last " + w + ": more than "
            "--max-concurrent-requests were in flight and its queue (--queue-size) was full or timed out, so "
            "clients got a 429."),
        fires_when=f"`increase({rejected}[{w}]) > 0`, or the series is new (first rejection; smg 1.13.0)",
    )


ROUTER_ADMISSION_REJECTED = AlertRecord(
    name="PdkitRouterAdmissionRejected", severity="warning", for_=ROUTER_FAILURES_FOR, scope=ROUTER_WORKERS,
    build=_router_admission_rejected,
    runbook=Runbook(
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
)


# a PD leg the router cannot rendezvous with (smg 1.13.0): its pair cannot hand the KV cache off. A roll does
# not fire it: smg probes at registration, after the worker's health passes, and a healthy SGLang prefill
# already serves its bootstrap port (started in TokenizerManager's constructor, before HTTP answers)
def _router_pd_rendezvous_failed(c: Context, r: AlertRecord) -> Alert | None:
    metric = ROUTER["pd_rendezvous_failures"]
    routers = [t for t in _routers_exporting(c, metric) if _router_pd_legs(c, t)]
    if not routers:
        return None
    w = c.w
    # summed over `phase`: the HTTP path counts only `probe` (a refused bootstrap port at registration), the
    # gRPC path `bootstrap` and `transfer`; any of them is a pair that cannot hand off. smg counts a refused
    # probe once, when it registers the worker: the child it creates is a failure too
    return counted_alert(
        c, r, labels=(*ROUTER_BY, "leg"), counted=metric, what="failed probes",
        zero=f"sum by ({by_labels(ROUTER_BY)}) (up{{job=\"{JOB_ROUTER}\"}}) * 0",
        # bad: the first refused probe (the child appears at 1 and stays); healthy: an old count from long ago
        series_of=lambda s: series_text(metric, {**s, "phase": "probe"}),
        more_rows=lambda s, bad: [] if bad else [(series_text(metric, {**s, "phase": "probe"}), "1x20")],
        subjects=tuple({"job": JOB_ROUTER, **t.labels, "leg": leg} for t in routers for leg in _router_pd_legs(c, t)),
        summary="The router on {{ $labels.node }} cannot rendezvous with a PD {{ $labels.leg }} worker",
        description=(
            "The router on {{ $labels.node }} counted PD rendezvous failures on its {{ $labels.leg }} leg in the "
            f"last {w}: over HTTP that is a {{{{ $labels.leg }}}} worker registered with a bootstrap port that "
            "refused the router's probe, so the engines of the other leg cannot reach it for the KV hand-off and "
            "the requests routed to that pair fail or stall until the handshake times out. smg counts the probe "
            "once, at registration: the alert resolves by itself after " + w + ", the worker stays broken until "
            "it is registered again with a bootstrap port that answers."),
        fires_when=f"`increase({metric}[{w}]) > 0` for a leg, or the series is new (a refused bootstrap probe at "
                   "registration; smg 1.13.0)",
    )


ROUTER_PD_RENDEZVOUS_FAILED = AlertRecord(
    name="PdkitRouterPdRendezvousFailed", severity="critical", for_=ROUTER_FAILURES_FOR, scope=ROUTER_WORKERS,
    build=_router_pd_rendezvous_failed,
    runbook=Runbook(
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
)


# What the routers say of their workers (scope ROUTER_WORKERS), in the order the rules file and alertmanager.yml
# both list them (pdkit.monitoring.alertrules.ALERTS and SCOPE_ORDER take them as one group)
WORKER_ALERTS = (
    ROUTER_WORKER_UNHEALTHY,
    ROUTER_CIRCUIT_OPEN,
    ROUTER_RETRIES_EXHAUSTED,
    ROUTER_WORKERS_OVERLOADED,
    ROUTER_ADMISSION_REJECTED,
    ROUTER_PD_RENDEZVOUS_FAILED,
)
