"""Grafana dashboards (overview, PD, tuning, nodes) and every PromQL query they run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pdkit.monitoring.common import (
    DATASOURCE,
    GRAFANA_DASHBOARDS_DIR,
    JOB_ENGINE,
    alt_metric,
    fmt_seconds,
    fmt_value,
    monitoring_of,
    scraped_hosts,
)
from pdkit.monitoring.rules import CUDA_GRAPH_RATIO_MIN, alerts
from pdkit.spec import ClusterSpec, dcgm_enabled
from pdkit.spec.kvcost import KV_RESEND_MIN_MB, KV_RESEND_WARN
from pdkit.upstream.metricnames import DCGM, EXPORTER, NODE, ROUTER, SGLANG

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
    names = {h.name for h in hosts}  # by name: comparing HostSpecs compares every field
    pairs = [(h, e) for h, e in spec.engines() if h.name in names]
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


def _kv_effective(matchers: str) -> str:
    """Effective KV hand-off rate per engine over the rate interval, GB/s as SGLang writes it (a ratio of sums)."""
    return (f'(sum by (instance) (rate({SGLANG["kv_transfer_total"]}_sum{{{matchers}}}[{RATE}])) / 1024) / '
            f'(sum by (instance) (rate({SGLANG["kv_transfer_latency"]}_sum{{{matchers}}}[{RATE}])) / 1000)')


def _hit_rate(by: str, matchers: str) -> str:
    """Cached over prompt tokens over the rate interval, summed by `by` ("" for one total). The cached counter is
    created by the first hit (lazy): until then the rate is 0 where prompt tokens were counted."""
    S, grouping = SGLANG, f" by ({by})" if by else ""
    prompt = f'sum{grouping} (rate({S["prompt_tokens"]}{{{matchers}}}[{RATE}]))'
    cached = f'sum{grouping} (rate({S["cached_tokens"]}{{{matchers}}}[{RATE}]))'
    return f"({cached} or {prompt} * 0) / {prompt}"


def _uncached_kv_mb(matchers: str) -> str:
    """Per prefill over the rate interval: the KV its requests' uncached prompt tokens need, MiB per hand-off
    ((prompt - cached tokens) per hand-off x one token's KV, the KV pool's GiB x 1024 over its tokens:
    pdkit.spec.kvcost.handoff_need)."""
    S = SGLANG
    prompt = f'sum by (instance) (rate({S["prompt_tokens"]}{{{matchers}}}[{RATE}]))'
    cached = f'sum by (instance) (rate({S["cached_tokens"]}{{{matchers}}}[{RATE}]))'
    handoffs = f'sum by (instance) (rate({S["kv_transfer_total"]}_count{{{matchers}}}[{RATE}]))'
    per_token = (f'sum by (instance) ({S["kv_cache_memory"]}{{{matchers}}}) * 1024 / '
                 f'sum by (instance) ({S["max_total_tokens"]}{{{matchers}}})')
    return f"({prompt} - ({cached} or {prompt} * 0)) / {handoffs} * {per_token}"


def _overview(spec: ClusterSpec) -> dict:
    slo = monitoring_of(spec).ttft_p99_slo_s
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
                       f"{fmt_value(slo)} s."),
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
        _P("Prefix cache hit rate", [
            _Q(_hit_rate("", f'role=~"prefill|unified", {F}'), "total"),
            _Q(_hit_rate("instance", f'role=~"prefill|unified", {F}'), "{{instance}}")],
           unit="percentunit", min=0, max=1,
           description="Prompt tokens served from the prefix cache over prompt tokens, per prefill (and unified) "
                       "engine over the interval (rate of sglang:cached_tokens_total, every cache_source, over "
                       "rate of sglang:prompt_tokens_total): the rule of bench's levels and doctor's prefix_cache "
                       "row (pdkit.kvcost). A PD decode counts the prefill's hits again, so decodes are left out. "
                       "No value while no prompt arrives; 0 until the first hit creates the cached counter."),
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
        _P("Prefill bootstrap queue", [_Q(alt_metric(f"sum by (instance) ({{m}}{{{{{pf}}}}})",
                                                     "prefill_bootstrap_queue"),
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
        _P("KV transfer rate: effective / SGLang's mean per transfer", [
            _Q(_kv_effective(pdm), "{{instance}} effective"),
            _Q(_hist_mean(S["kv_transfer_speed"], pdm), "{{instance}} SGLang mean")],
           unit="GBs", description="Effective: MiB moved / 1024 over the seconds spent moving them in the "
                                   "interval (rate of kv_transfer_total_mb_sum / 1024 over rate of "
                                   "kv_transfer_latency_ms_sum / 1000: a ratio of sums, pdkit.kvcost), the figure "
                                   "doctor's kv_path row and the PdkitKvHandoffSlow alert judge against the path's "
                                   "floor. SGLang mean: the mean of sglang:kv_transfer_speed_gb_s, a mean of "
                                   "per-request speeds that a few fast transfers keep high while queued ones wait "
                                   "seconds. Page size 1 splits a transfer into many small pieces: a PD lever."),
        _P("KV transfer latency mean / p99", [
            _Q(_hist_mean(S["kv_transfer_latency"], pdm), "{{instance}} mean"),
            _Q(f'histogram_quantile(0.99, sum by (instance, le) (rate({S["kv_transfer_latency"]}_bucket{{{pdm}}}'
               f'[{RATE}])))', "{{instance}} p99")], unit="ms"),
        _P("KV handed off per request vs the uncached prompt's KV", [
            _Q(_hist_mean(S["kv_transfer_total"], pdm), "{{instance}} handed off"),
            _Q(_uncached_kv_mb(pf), "{{instance}} uncached part")],
           unit="mbytes",
           description="Handed off: the mean of sglang:kv_transfer_total_mb, the KV each hand-off carried (MiB). "
                       "Uncached part: the prefill's prompt tokens less those its prefix cache served, per hand-off, "
                       "times one token's KV (sglang:kv_cache_memory_usage_gb x 1024 / sglang:max_total_num_tokens). "
                       f"A decode without a radix cache (SGLang's default) receives every prompt token's KV, so with "
                       f"a warm prefix cache the first line runs far above the second: past "
                       f"{KV_RESEND_WARN:g}x (and {KV_RESEND_MIN_MB:g} MiB a request sent again) doctor's "
                       "prefix_cache row warns; tuning.decode_radix_cache (experimental) sends only what the decode "
                       "lacks: compare with pdkit tune."),
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


_GRAFANA_VARS = re.compile(r"\$(node|engine|role)\b")


def rate_interval(spec: ClusterSpec) -> str:
    """What Grafana's $__rate_interval comes to at the default resolution: 4 scrape intervals."""
    return fmt_seconds(4 * monitoring_of(spec).scrape_interval_s)


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
