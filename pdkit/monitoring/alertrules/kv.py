"""Alerts on the KV cache's way from prefill to decode: transfers and bootstrap handshakes that fail, hand-offs
slower than the floor of their path (pdkit.spec.kvcost)."""

from __future__ import annotations

from collections.abc import Callable

from pdkit.monitoring.alertrules.base import (
    ENGINE,
    JOURNAL,
    Alert,
    AlertRecord,
    Context,
    Runbook,
    alert_test,
    counted_alert,
    engine_labels,
)
from pdkit.monitoring.common import (
    ENGINE_BY,
    JOB_ENGINE,
    engine_instance,
    fmt_num,
    fmt_value,
    pick_labels,
    promql_regex,
    series_text,
)
from pdkit.spec import prefill_kv_paths
from pdkit.spec.kvcost import KV_PATHS, KV_RATE_MIN_MB, kv_floor
from pdkit.upstream.metricnames import SGLANG

FAILURES_FOR = "1m"
# a prefill's KV hand-offs slower than its path's floor (pdkit.spec.kvcost.KV_PATHS) for this long while they happen:
# longer than a burst that queues hand-offs for a minute or two
KV_SLOW_FOR = "10m"
# PdkitKvHandoffSlow's labels: the engine's and the floor it is judged by
KV_SLOW_BY = (*ENGINE_BY, "floor")


# KV transfer / bootstrap failures. The counters exist in every pinned release but are
# created by their first increment (the catalogue's `lazy`): a healthy engine has no series,
# and increase() over a series that appears at 1 is 0. So each alert also fires on a series
# that is new within the window (present now, absent `w` ago).
def _pd_failures(key: str, what: str, description: str) -> Callable[[Context, AlertRecord], Alert | None]:
    """The builder of a PD failure alert: SGLANG[KEY] counts WHAT that failed; DESCRIPTION says what that does
    (the record's runbook adds what to do)."""

    def build(c: Context, r: AlertRecord) -> Alert | None:
        pd_engines = [t for t in c.engines if t.labels["role"] in ("prefill", "decode")]
        if not pd_engines:
            return None
        pd_up = f'up{{job="{JOB_ENGINE}", role=~"prefill|decode"}}'
        metric = SGLANG[key]
        return counted_alert(
            c, r, labels=ENGINE_BY, counted=metric, what="failures", zero=f"sum by ({c.by}) ({pd_up}) * 0",
            # bad: the engine's first failure (the series appears at 1 and stays); healthy: no series at all
            series_of=lambda s: series_text(metric, engine_labels(s)),
            subjects=tuple({**t.labels, "model_name": c.model_of[t.labels["instance"]]} for t in pd_engines),
            summary=f"{what} fail on {{{{ $labels.instance }}}}",
            description=description,
            fires_when=f"`increase({metric}[{c.w}]) > 0`, or the series is new (first failure)",
        )

    return build


KV_TRANSFER_FAILURES = AlertRecord(
    name="PdkitKvTransferFailures", severity="warning", for_=FAILURES_FOR, scope=ENGINE,
    build=_pd_failures("transfer_failed", "KV transfers",
                       "KV cache transfers between prefill and decode fail: the requests error out."),
    runbook=Runbook(
        means="KV transfers between prefill and decode fail and their requests error out. The counter is created "
              "by its first failure, so the alert also fires on a new series (the first failure).",
        causes=("cross-node transfers without `pdkit_node.ucx_net_devices` (they hang until the 300 s timeout)",
                "on one node, `UCX_TLS` without `cuda_ipc`",
                "the pair runs different models or SGLang versions", "a NIXL/UCX error on either side"),
        run=("`pdkit doctor INVENTORY`: the `kv_transfer` and `version` rows of both engines",
             "both engines' journals: " + JOURNAL + " (NIXL/UCX errors, 300 s timeouts); `UCX_PROTO_INFO=y` "
             "in the engine's environment logs the lane UCX picked",
             "set the missing node fields in the inventory and `pdkit roll INVENTORY --limit {node}`")),
)


BOOTSTRAP_FAILURES = AlertRecord(
    name="PdkitBootstrapFailures", severity="warning", for_=FAILURES_FOR, scope=ENGINE,
    build=_pd_failures("bootstrap_failed", "PD bootstrap handshakes",
                       "Decode could not bootstrap requests with their prefill (the handshake on the prefill's "
                       "bootstrap port): requests fail before any KV moves."),
    runbook=Runbook(
        means="Decode could not complete the bootstrap handshake with its prefill (the prefill's bootstrap "
              "port): requests fail before any KV moves. A new series (the first failure) fires too.",
        causes=("the prefill is down or restarting", "the bootstrap port (pdkit_node.engines[].bootstrap_port, "
                "default 8998) is not reachable from the decode node",
                "the router does not pass the port (`--prefill URL PORT`)",
                "a prefill replaced behind the same address left the decode waiting"),
        run=("`pdkit doctor INVENTORY`: the `kv_transfer` rows of the pair",
             "from the decode node: `nc -vz <prefill node> <bootstrap port>`",
             "the decode's journal: " + JOURNAL,
             "restart the decode (`pdkit roll INVENTORY --limit {node}`) if the prefill was replaced")),
)


def kv_effective_gb_s(by: str, w: str, instances: str | None = None) -> str:
    """PromQL: a prefill's effective KV hand-off rate over W in SGLang's unit (pdkit.spec.kvcost: a ratio of sums, MiB
    moved / 1024 over seconds spent moving them), per BY; INSTANCES: an `instance=~` regex, or every prefill."""
    sel = f'instance=~"{instances}"' if instances is not None else 'role="prefill"'
    mb, ms = SGLANG["kv_transfer_total"], SGLANG["kv_transfer_latency"]
    return (f"(sum by ({by}) (rate({mb}_sum{{{sel}}}[{w}])) / 1024)\n"
            f"/\n(sum by ({by}) (rate({ms}_sum{{{sel}}}[{w}])) / 1000)")


def kv_floors_text() -> str:
    """The floors of pdkit.spec.kvcost.KV_PATHS in words, for the alert's annotations, table line and runbook."""
    return ", ".join(f"{p.name} {p.floor_gb_s:g}" for p in KV_PATHS.values()) + " GB/s"


def _kv_rows(s: dict[str, str], gb_s: float | None, n: int = 25) -> list[tuple[str, str]]:
    """A prefill's KV histogram series for promtool: 10 hand-offs a minute of 1 s each, with MiB a minute so
    that the effective rate is GB_S; None: idle (old totals that do not move)."""
    labels = engine_labels(s)
    ms, mb = SGLANG["kv_transfer_latency"], SGLANG["kv_transfer_total"]
    if gb_s is None:
        return [(series_text(f"{ms}_count", labels), f"100x{n}"), (series_text(f"{ms}_sum", labels), f"100000x{n}"),
                (series_text(f"{mb}_count", labels), f"100x{n}"), (series_text(f"{mb}_sum", labels), f"50000x{n}")]
    return [(series_text(f"{ms}_count", labels), f"0+10x{n}"), (series_text(f"{ms}_sum", labels), f"0+10000x{n}"),
            (series_text(f"{mb}_count", labels), f"0+10x{n}"),
            (series_text(f"{mb}_sum", labels), f"0+{fmt_num(gb_s * 1024 * 10)}x{n}")]



# a prefill's KV hand-offs slower than the floor of its path (same host, across hosts over RDMA or TCP:
# pdkit.spec.kvcost.kv_path per pair, the lowest floor among the decodes it may hand to) while hand-offs happen.
# The floor is rendered per instance from the spec: one clause per distinct floor.
def _kv_handoff_slow(c: Context, r: AlertRecord) -> Alert | None:
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
        return None
    ms = SGLANG["kv_transfer_latency"]
    clauses = []
    for floor in sorted(set(floors.values()), reverse=True):
        inst = promql_regex(sorted(i for i, f in floors.items() if f == floor))
        moving = f'sum by ({by}) (rate({ms}_count{{instance=~"{inst}"}}[{w}])) > 0'
        # small hand-offs are latency-bound: not judged by their rate (pdkit.spec.kvcost.KV_RATE_MIN_MB)
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
            exp = [{**pick_labels(s, KV_SLOW_BY), "severity": r.severity}]
            out.append(alert_test(f"{r.name} stays quiet for {s['instance']} while it hands nothing off",
                                   r.name, _kv_rows(s, None, 30), "25m", []))
            # far below the floor, but hand-offs of ~10 MiB: latency-bound, not judged by rate
            small = min(float(s["floor"]) * 0.5, (KV_RATE_MIN_MB / 1024) * 0.3)
            out.append(alert_test(f"{r.name} stays quiet for {s['instance']} at {fmt_value(small)} GB/s "
                                   f"with hand-offs under {fmt_num(KV_RATE_MIN_MB)} MiB", r.name,
                                   _kv_rows(s, small, 30), "25m", []))
            # half the floor for 20 minutes, then twice it: firing at 18m, resolved by 40m
            slow, fast = float(s["floor"]) * 0.5 * 10240, float(s["floor"]) * 2 * 10240
            rows = _kv_rows(s, 1.0, 45)[:3]
            rows.append((series_text(f"{SGLANG['kv_transfer_total']}_sum", engine_labels(s)),
                         f"0+{fmt_num(slow)}x20 {fmt_num(slow * 20 + fast)}+{fmt_num(fast)}x24"))
            test = alert_test(f"{r.name} fires for {s['instance']} while slow and resolves once fast",
                               r.name, rows, "18m", exp)
            test["alert_rule_test"].append({"eval_time": "40m", "alertname": r.name, "exp_alerts": []})
            out.append(test)
        # one rate between two instances' floors: it fires for the one with the higher floor only
        by_floor = {s["floor"]: s for s in subjects}
        if len(by_floor) > 1:
            low = by_floor[min(by_floor, key=float)]
            high = by_floor[max(by_floor, key=float)]
            between = (float(low["floor"]) + float(high["floor"])) / 2
            out.append(alert_test(f"{r.name} at {fmt_value(between)} GB/s fires for {high['instance']} "
                                   f"(floor {high['floor']}), not {low['instance']} (floor {low['floor']})",
                                   r.name, _kv_rows(high, between) + _kv_rows(low, between), "20m",
                                   [{**pick_labels(high, KV_SLOW_BY), "severity": r.severity}]))
        return out

    return r.make(
        c,
        expr=expr,
        value=kv_effective_gb_s(by, w),
        summary="KV hand-offs from {{ $labels.instance }} are slower than {{ $labels.floor }} GB/s",
        description=(
            "The prefill {{ $labels.instance }} moved KV to its decodes at an effective rate (MiB moved / 1024 over "
            f"seconds spent moving them, over {w}: a ratio of sums, not SGLang's mean of per-request speeds) below "
            "{{ $labels.floor }} GB/s, the floor of the slowest path it may take (pdkit.kvcost.KV_PATHS: "
            + kv_floors_text() + "), for " + c.for_(r.for_) + " while hand-offs happened. "
            "Requests wait for their KV: TTFT grows."),
        subjects=subjects,
        case=case,
        exp_labels=lambda s: pick_labels(s, KV_SLOW_BY),
        eval_time="20m",
        absent_ok=(SGLANG["kv_transfer_latency"], SGLANG["kv_transfer_total"]),
        extra_tests=extra,
        fires_when=("a prefill's effective KV rate (ratio of sums) is below the floor of the slowest path it may "
                    f"take (`pdkit.spec.kvcost.KV_PATHS`: {kv_floors_text()}; a sim: the lowest) while hand-offs "
                    f"happen and hand-offs average {fmt_num(KV_RATE_MIN_MB)} MiB or more, for {c.for_(r.for_)}"),
    )


KV_HANDOFF_SLOW = AlertRecord(
    name="PdkitKvHandoffSlow", severity="warning", for_=KV_SLOW_FOR, scope=ENGINE,
    build=_kv_handoff_slow,
    runbook=Runbook(
        means="A prefill's KV hand-offs to its decodes ran below the floor of the slowest path it may take, for "
              f"{KV_SLOW_FOR} while hand-offs happened. The rate is effective: MiB moved / 1024 over the seconds spent "
              "moving them (a ratio of sums over the rate window, queueing behind other hand-offs included), not "
              "SGLang's `kv_transfer_speed_gb_s` mean of per-request speeds, which a few fast hand-offs keep "
              "looking healthy. The floor (label `floor`) is rendered per prefill from the spec: the lowest of "
              "the paths to the decodes it may pair with (`pdkit.spec.kvcost.KV_PATHS`: " + kv_floors_text() + "; "
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
)
