"""Alerts on the engines: down, a rank down, queues growing, decode steps without CUDA graphs, wedged, TTFT over
the SLO. Each record holds its rule, its promtool cases and its runbook (pdkit.monitoring.alertrules.base)."""

from __future__ import annotations

from pdkit.monitoring.alertrules.base import (
    ENGINE,
    JOURNAL,
    NODE,
    REDEPLOY,
    Alert,
    AlertRecord,
    Context,
    Runbook,
    alert_test,
    engine_labels,
    exporter_subject,
    flag_alert,
    up_alert,
)
from pdkit.monitoring.common import (
    ENGINE_BY,
    EXPORTER_BY,
    JOB_ENGINE,
    QUEUE_ROLES,
    QUEUES,
    alt_metric,
    engine_instance,
    fmt_num,
    fmt_seconds,
    fmt_value,
    monitoring_of,
    pick_labels,
    promql_regex,
    scraped_hosts,
    series_text,
    speedup_of,
)
from pdkit.spec import DECODE_GRAPH_RULE, ClusterSpec, decode_graphs_expected
from pdkit.upstream.metricnames import EXPORTER_RANK_UP, SGLANG

ENGINE_DOWN_FOR = "2m"  # a real SGLang restart takes ~60-106 s: a 1m window would fire on every roll
# a rank's process is gone only between a stop and the next start: systemd restarts a crashed rank after
# 5 s (RestartSec), a deploy stops every rank of the engine together (up to TimeoutStopSec=60 s each);
# the same window as a whole engine's so that a roll never pages
RANK_DOWN_FOR = ENGINE_DOWN_FOR
QUEUE_GROWING_FOR = "10m"
QUEUE_MIN_DEPTH = 1
# an engine holding requests (running or queued) that generates no token for this long is wedged
WEDGED_FOR = "1m"
# ... over this rate window (seconds; wedge_window)
WEDGE_WINDOW_S = 120
CUDA_GRAPH_RATIO_MIN = 0.9
CUDA_GRAPH_RATIO_FOR = "10m"
TTFT_FOR = "5m"

def graph_expected_instances(spec: ClusterSpec) -> list[str]:
    """Engines that must run decode steps in CUDA graphs (DECODE_GRAPH_RULE), by instance."""
    return [engine_instance(host, engine.name) for host, engine in spec.engines()
            if decode_graphs_expected(spec, engine)]


# engine down
def _engine_down(c: Context, r: AlertRecord) -> Alert | None:
    return up_alert(
        c, r, (JOB_ENGINE,),
        summary="SGLang engine {{ $labels.instance }} ({{ $labels.role }}) is down",
        description=(
            "Prometheus cannot scrape /metrics of engine {{ $labels.engine }} on {{ $labels.node }} "
            f"for {c.for_(r.for_)}: the process is stopped, crashed, or hung. A PD pair stalls while either side "
            "is down: the router keeps sending it requests until its health checks fail."),
    )


ENGINE_DOWN = AlertRecord(
    name="PdkitEngineDown", severity="critical", for_=ENGINE_DOWN_FOR, scope=NODE, build=_engine_down,
    runbook=Runbook(
        means="Prometheus cannot scrape an engine's /metrics: the process is stopped, crashed or hung. A PD pair "
              "stalls while either side is down; the router keeps sending the engine requests until its health "
              f"checks fail (then PdkitRouterWorkerUnhealthy). The {ENGINE_DOWN_FOR} `for` is longer than a real "
              "SGLang restart "
              "(~60-106 s): a roll does not page.",
        causes=("the engine crashed: CUDA out of memory, an NCCL error, SGLang's 300 s scheduler watchdog, a "
                "Python traceback", "a GPU fault (Xid in dmesg), the node rebooted",
                "someone stopped the unit by hand, or a deploy's restart failed its health gate"),
        run=("`pdkit doctor INVENTORY`: the engine's `reachable` row (and `rank_process` for an engine spanning "
             "nodes)",
             "`systemctl status pdkit-engine-{engine}` and " + JOURNAL,
             "`nvidia-smi` and `dmesg -T | grep -i xid` on {node}",
             "fix the cause, then " + REDEPLOY)),
)


# a rank above 0 of an engine spanning nodes down (pdkit-exporter on the rank's node: its unit has no
# running process). Such a rank serves no HTTP, so PdkitEngineDown cannot see it; rank 0 is PdkitEngineDown's
# (its process gone, its /metrics is too): rank 0's series are the decoys.
RANK_BY = (*EXPORTER_BY, "rank", "nnodes", "head")


def _engine_rank_down(c: Context, r: AlertRecord) -> Alert | None:
    spec = c.spec
    scraped = {h.name for h in scraped_hosts(spec)}
    ranks = []
    for head, e in spec.engines():
        if not e.spans_nodes:
            continue
        for rank, node in enumerate(spec.engine_hosts(head, e)):
            if node.name in scraped:
                ranks.append(exporter_subject(spec, node, e, rank=str(rank), nnodes=str(e.nnodes), head=head.name))
    if ranks:
        return flag_alert(
            c, r, metric=EXPORTER_RANK_UP, selector=f'{EXPORTER_RANK_UP}{{rank!="0"}}', ok=1, by=RANK_BY, blip=True,
            summary="Rank {{ $labels.rank }} of engine {{ $labels.engine }} on {{ $labels.node }} is down",
            description=(
                "pdkit-exporter on {{ $labels.node }} finds no running process of rank {{ $labels.rank }} "
                "(of {{ $labels.nnodes }}) of engine {{ $labels.engine }} ({{ $labels.role }}, rank 0 on "
                f"{{{{ $labels.head }}}}) for {c.for_(r.for_)}. Rank 0 cannot serve without it: "
                "{{ $labels.head }}/{{ $labels.engine }} stalls or exits like an NCCL timeout, and "
                "PdkitEngineDown follows for it. systemd restarts a crashed rank on its own (Restart=on-failure): "
                "one down this long keeps failing or was stopped."),
            subjects=tuple(s for s in ranks if s["rank"] != "0"),
            eval_time="10m",
            decoys=tuple(s for s in ranks if s["rank"] == "0"),
            decoys_are="rank 0, which PdkitEngineDown covers",
            fires_when=f"`{EXPORTER_RANK_UP} == 0` for a rank above 0 of an engine spanning nodes",
        )
    return None


ENGINE_RANK_DOWN = AlertRecord(
    name="PdkitEngineRankDown", severity="critical", for_=RANK_DOWN_FOR, scope=NODE, build=_engine_rank_down,
    runbook=Runbook(
        means="pdkit-exporter on a rank's node finds no running process for a rank above 0 of an engine spanning "
              "nodes (`pdkit_engine_rank_up{rank!=\"0\"} == 0`). Such a rank serves no HTTP, so "
              "PdkitEngineDown cannot see it; rank 0 cannot serve without it (it stalls, or exits like an NCCL "
              "timeout, and then PdkitEngineDown fires for it). Labels: `node` (the rank's host), `engine`, "
              "`role`, `rank`, `nnodes`, `head` (rank 0's host).",
        causes=("the rank keeps crashing: systemd restarts it after 5 s (`Restart=on-failure`), so one down for "
                f"{RANK_DOWN_FOR} "
                "keeps failing or was stopped",
                "it cannot reach rank 0's `--dist-init-addr` on {head} (firewall, NCCL_SOCKET_IFNAME)",
                "CUDA out of memory, an NCCL error, a GPU fault on {node}"),
        run=("`pdkit doctor INVENTORY`: the `rank_process` row of `{engine} rank {rank}`",
             "`systemctl status pdkit-engine-{engine}` and " + JOURNAL,
             "`nvidia-smi`, `dmesg -T | grep -i xid` on {node}",
             "fix it and re-run the deploy over every node of the engine: `pdkit roll INVENTORY --limit {head} "
             "--limit {node}` (the ranks restart together behind rank 0's health gate)")),
)


# queue growing (waiting queue and the PD queues)
def _queue_growing(c: Context, r: AlertRecord) -> Alert | None:
    w, engines, model_of, by = c.w, c.engines, c.model_of, c.by
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
        return [(series_text(name, engine_labels(s)), "0+1x30" if bad else "3x30")]

    return r.make(
        c,
        expr="\nor\n".join(queue_clause(q, k, "deriv") for q, k in QUEUES),
        value="\nor\n".join(queue_clause(q, k, "value") for q, k in QUEUES),
        summary="The {{ $labels.queue }} queue of {{ $labels.instance }} has grown for " + c.for_(r.for_),
        description=(
            "The {{ $labels.queue }} queue of {{ $labels.instance }} ({{ $labels.role }}) has kept growing for "
            + c.for_(r.for_) + ": requests arrive faster than this engine drains them."),
        subjects=tuple(queue_subjects),
        case=queue_case,
        exp_labels=lambda s: {**pick_labels(s, ENGINE_BY), "queue": s["queue"]},
        eval_time="20m",
        fires_when=f"a waiting or PD queue keeps growing (`deriv > 0` and depth >= {QUEUE_MIN_DEPTH})",
    )


QUEUE_GROWING = AlertRecord(
    name="PdkitQueueGrowing", severity="warning", for_=QUEUE_GROWING_FOR, scope=ENGINE, build=_queue_growing,
    runbook=Runbook(
        means=f"One of an engine's queues (label `queue`) has kept growing for {QUEUE_GROWING_FOR}: requests arrive "
              "faster than "
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
             "capacity: add engines and `pdkit roll INVENTORY`; stuck transfers: the runbooks of "
             "PdkitKvTransferFailures and PdkitBootstrapFailures")),
)


# decode CUDA-graph ratio (only the engines DECODE_GRAPH_RULE names)
def _graph_none_only_tests(subjects: tuple[dict[str, str], ...], passes: str) -> list[dict]:
    """The seeds' worst case: the decode never runs a graph, so only mode="decode_none" exists."""
    out = []
    for s in subjects[:1]:
        series = [(series_text(passes, engine_labels(s, mode="decode_none")), "0+10x30")]
        out.append(alert_test(f"PdkitDecodeCudaGraphRatioLow fires for {s['instance']} when only decode_none exists",
                               "PdkitDecodeCudaGraphRatioLow", series, "20m",
                               [{**pick_labels(s, ENGINE_BY), "severity": "warning"}]))
        series = [(series_text(passes, engine_labels(s, mode="decode_cuda_graph")), "0+10x30")]
        out.append(alert_test(f"PdkitDecodeCudaGraphRatioLow stays quiet for {s['instance']} when only "
                               "decode_cuda_graph exists", "PdkitDecodeCudaGraphRatioLow", series, "20m", []))
    return out


def _decode_graph_ratio(c: Context, r: AlertRecord) -> Alert | None:
    spec, w, engines, model_of, by = c.spec, c.w, c.engines, c.model_of, c.by
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
        return r.make(
            c,
            expr=f"(\n{ratio}\n) < {fmt_num(CUDA_GRAPH_RATIO_MIN)}",
            value=ratio,
            summary="{{ $labels.instance }} runs decode steps without CUDA graphs",
            description=(
                f"Fewer than {CUDA_GRAPH_RATIO_MIN:.0%} of the decode passes of {{{{ $labels.instance }}}} ran in a "
                f"CUDA graph over the last {w} although its spec turns decode graphs on. Without graphs a decode "
                "step is CPU-launch bound (the seeds measured 3-5x less throughput)."),
            subjects=subjects,
            case=graph_case,
            exp_labels=lambda s: pick_labels(s, ENGINE_BY),
            eval_time="20m",
            extra_tests=lambda subjects: _graph_none_only_tests(subjects, passes),
            fires_when=(f"decode passes in a CUDA graph < {CUDA_GRAPH_RATIO_MIN:.0%} on one of the {DECODE_GRAPH_RULE} "
                        "(also when only `mode=\"decode_none\"` exists)"),
        )
    return None


DECODE_GRAPH_RATIO_LOW = AlertRecord(
    name="PdkitDecodeCudaGraphRatioLow", severity="warning", for_=CUDA_GRAPH_RATIO_FOR, scope=ENGINE,
    build=_decode_graph_ratio,
    runbook=Runbook(
        means=f"Fewer than {CUDA_GRAPH_RATIO_MIN:.0%} of an engine's decode passes ran in a CUDA graph although its "
              "spec turns decode graphs on: decode is CPU-launch bound (the seeds measured 3-5x less throughput). "
              f"Only the {DECODE_GRAPH_RULE} are watched; an idle engine does not fire.",
        causes=("decode batches larger than the largest captured graph (`cuda_graph_max_bs` below the target "
                "concurrency)", "a graph capture failure at start (the journal)",
                "the running engine has graphs off although planned on (PdkitConfigDrift)"),
        run=("`pdkit doctor INVENTORY`: the engine's `decode_cuda_graph` and `graph_buckets` rows",
             "`#running-req` in the decode log lines (tuning dashboard) against `cuda_graph_max_bs`",
             "set `tuning.cuda_graph_max_bs` to at least the target concurrency and `pdkit roll INVENTORY --limit "
             "{node}`")),
)


def wedge_window(spec: ClusterSpec) -> str:
    """Rate window of the wedge alert: 2m, or 4 scrapes when scrapes are slower than 30 s (it must fire
    well before SGLang's own 300 s scheduler watchdog would end a wedged process); the lab: 2m / its
    lab_alert_speedup, still at least 4 scrapes."""
    return fmt_seconds(max(WEDGE_WINDOW_S // speedup_of(spec), 4 * monitoring_of(spec).scrape_interval_s))


def _wedge_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
    labels = engine_labels(s)
    running = [(series_text(SGLANG["running"], labels), "2x30"), (series_text(SGLANG["waiting"], labels), "1x30")]
    tokens = series_text(SGLANG["realtime_tokens"], {**labels, "mode": "decode" if s["role"] != "prefill" else
                                                 "prefill_compute"})
    # bad: tokens stop at minute 5 while requests stay; healthy: tokens keep coming
    return running + [(tokens, "0+100x5 500x25" if bad else "0+100x30")]


def _wedge_extra_tests(subjects: tuple[dict[str, str], ...]) -> list[dict]:
    out = []
    for s in subjects[:1]:
        labels = engine_labels(s)
        # wedged before its first step: requests held, no token series at all
        series = [(series_text(SGLANG["running"], labels), "0x3 2x27"),
                  (series_text(SGLANG["waiting"], labels), "0x30")]
        out.append(alert_test(f"PdkitEngineWedged fires for {s['instance']} wedged before its first step",
                               "PdkitEngineWedged", series, "10m",
                               [{**pick_labels(s, ENGINE_BY), "severity": "critical"}]))
        # idle: nothing held, no tokens
        tokens = series_text(SGLANG["realtime_tokens"], {**labels, "mode": "decode"})
        series = [(series_text(SGLANG["running"], labels), "0x30"), (series_text(SGLANG["waiting"], labels), "0x30"),
                  (tokens, "500x30")]
        out.append(alert_test(f"PdkitEngineWedged stays quiet for {s['instance']} while idle",
                               "PdkitEngineWedged", series, "20m", []))
    return out


# wedged engine: holds requests (running or queued) and generates no token. Tokens are
# counted per scheduler step by sglang:realtime_tokens_total{mode} (lazy: created by the
# first step), so an engine that wedged before its first step has no series at all.
def _engine_wedged(c: Context, r: AlertRecord) -> Alert | None:
    spec, engines, model_of, by = c.spec, c.engines, c.model_of, c.by
    tokens = SGLANG["realtime_tokens"]
    ww = wedge_window(spec)
    held = f'sum by ({by}) ({SGLANG["running"]}) + sum by ({by}) ({SGLANG["waiting"]})'
    stepping = f"sum by ({by}) (rate({tokens}[{ww}])) > 0"
    return r.make(
        c,
        expr=f"({held}) > 0\nunless on ({by})\n({stepping})",
        value=f"{held}",
        summary="Engine {{ $labels.instance }} holds requests and generates no tokens",
        description=(
            "Engine {{ $labels.instance }} ({{ $labels.role }}) has had requests running or queued for "
            f"{c.for_(r.for_)} while its scheduler generated no token over the last {ww} "
            "(sglang:realtime_tokens_total did not move): its HTTP server answers, the scheduler does not step. "
            "Clients wait until their timeout; the router keeps routing to it while /health answers."),
        subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in engines),
        case=lambda s, bad: _wedge_case(s, bad),
        exp_labels=lambda s: pick_labels(s, ENGINE_BY),
        eval_time="20m",
        extra_tests=lambda subjects: _wedge_extra_tests(subjects),
        fires_when=f"requests running or queued and no token computed (`{tokens}`) over {ww}",
    )


ENGINE_WEDGED = AlertRecord(
    name="PdkitEngineWedged", severity="critical", for_=WEDGED_FOR, scope=ENGINE, build=_engine_wedged,
    runbook=Runbook(
        means="An engine holds requests (running or queued) and its scheduler computed no token over the wedge "
              f"window ({fmt_seconds(WEDGE_WINDOW_S)}): its HTTP server answers and /health may pass, clients wait. "
              "It fires well inside "
              "SGLang's 300 s scheduler watchdog.",
        causes=("a scheduler hang with the overlap schedule (the seeds hit it)",
                "an NCCL or NIXL call that never returns", "a GPU fault"),
        run=("`pdkit doctor INVENTORY`: the engine's `queues` row says \"wedged\"",
             JOURNAL + " (the last Prefill/Decode batch line, NCCL or NIXL errors)",
             "`py-spy dump --pid <scheduler pid>` on {node} shows where it hangs",
             "`systemctl restart pdkit-engine-{engine}` on {node} (or `pdkit roll INVENTORY --limit {node}`); "
             "if it recurs, consider `--disable-overlap-schedule`")),
)


# TTFT p99 over the SLO (user-facing TTFT: decode and unified engines)
def _ttft_over_slo(c: Context, r: AlertRecord) -> Alert | None:
    mon, w, engines, model_of, by = c.mon, c.w, c.engines, c.model_of, c.by
    slo = mon.ttft_p99_slo_s
    ttft = (f'histogram_quantile(0.99, sum by ({by}, le) '
            f'(rate({SGLANG["ttft"]}_bucket{{role=~"decode|unified"}}[{w}])))')
    ttft_engines = [t for t in engines if t.labels["role"] in ("decode", "unified")]

    def ttft_case(s: dict[str, str], bad: bool) -> list[tuple[str, str]]:
        base = {"job": JOB_ENGINE, **pick_labels(s, ENGINE_BY), "engine_type": s["role"], "model_name": s["model_name"]}
        # all observations in (slo, 2 slo] -> p99 ~ 1.99 slo; in (slo/2, slo] -> p99 ~ 0.995 slo
        counts: dict[float | str, str] = {slo / 2: "0x30", slo: "0x30" if bad else "0+10x30", slo * 2: "0+10x30",
                                          "+Inf": "0+10x30"}
        return [(series_text(SGLANG["ttft"] + "_bucket", {**base, "le": le if isinstance(le, str) else fmt_num(le)}), v)
                for le, v in counts.items()]

    if ttft_engines:
        return r.make(
            c,
            expr=f"{ttft} > {fmt_num(slo)}",
            value=ttft,
            summary=f"TTFT p99 of {{{{ $labels.instance }}}} is over the {fmt_value(slo)} s SLO",
            description=(
                f"The 99th percentile time to first token measured by {{{{ $labels.instance }}}} over the last {w} "
                f"is above pdkit_monitoring.ttft_p99_slo_s = {fmt_value(slo)} s. In PD mode this decode-side TTFT "
                "includes the prefill and the KV transfer."),
            subjects=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]} for t in ttft_engines),
            case=ttft_case,
            exp_labels=lambda s: pick_labels(s, ENGINE_BY),
            eval_time="20m",
            decoys=tuple({**t.labels, "model_name": model_of[t.labels["instance"]]}
                         for t in engines if t.labels["role"] == "prefill"),
            absent_ok=(SGLANG["ttft"],),
            fires_when=f"decode-side TTFT p99 > `pdkit_monitoring.ttft_p99_slo_s` ({fmt_value(slo)} s)",
        )
    return None


TTFT_P99_OVER_SLO = AlertRecord(
    name="PdkitTtftP99OverSlo", severity="warning", for_=TTFT_FOR, scope=ENGINE, build=_ttft_over_slo,
    runbook=Runbook(
        means="The p99 time to first token measured by decode (and unified) engines over the rate window is "
              "above `pdkit_monitoring.ttft_p99_slo_s`. In PD mode it includes the prefill and the KV transfer.",
        causes=("more traffic than planned", "prefill capacity (a growing prefill waiting queue)",
                "slow handshakes or transfers (bootstrap/inflight queues, the UCX lane)",
                "decode KV memory full (decode prealloc queue)"),
        run=("`pdkit doctor INVENTORY --bench` (throughput against the recorded run)",
             "the PD dashboard: where the time goes (queues, transfer latency)",
             "`pdkit tune` the levers (docs/tune.md), or add capacity and `pdkit roll INVENTORY`")),
)
