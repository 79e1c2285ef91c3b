"""Alerts on the hosts and what pdkit-exporter reads on them: a host down, a GPU wedged, an exporter or
Prometheus itself that cannot be scraped, an engine running flags or an environment the plan does not render."""

from __future__ import annotations

from collections.abc import Callable

from pdkit.agent.exporter.config import reads_gpu_health
from pdkit.monitoring.alertrules.base import (
    HOST,
    NODE,
    REDEPLOY,
    Alert,
    AlertRecord,
    Context,
    Runbook,
    alert_test,
    exporter_subject,
    flag_alert,
    subject_name,
    up_alert,
)
from pdkit.monitoring.common import (
    EXPORTER_BY,
    JOB_DCGM,
    JOB_EXPORTER,
    JOB_NODE,
    JOB_PROMETHEUS,
    scraped_hosts,
    series_text,
)
from pdkit.upstream.metricnames import EXPORTER, EXPORTER_GPU_WEDGED

TARGET_DOWN_FOR = "5m"
# a host's node_exporter unreachable: the whole node is down or cut off. Shorter than ENGINE_DOWN_FOR
# (pdkit.monitoring.alertrules.engines) on purpose: the node's page must be firing before its engines' would, so
# that Alertmanager's inhibition (pdkit/monitoring/alertmanager.py) holds theirs back and the node pages once
NODE_DOWN_FOR = "1m"
# a GPU an engine uses needs a reset (pdkit-exporter's probe, once a minute): short, since it does not heal by
# itself; three probes a minute apart that say so page, one odd reading (a probe cut short) does not
GPU_WEDGED_FOR = "2m"
DRIFT_FOR = "5m"
ENV_MISSING_FOR = "5m"


# a whole host down: its node_exporter cannot be scraped
def _node_down(c: Context, r: AlertRecord) -> Alert | None:
    if not any(t.job == JOB_NODE for t in c.tgt):
        return None
    return up_alert(
        c, r, (JOB_NODE,),
        summary="Host {{ $labels.node }} is down or cut off",
        description=(
            "Prometheus cannot scrape node_exporter on {{ $labels.node }} for " + c.for_(r.for_) + ": the host "
            "is down, cut off the network, or its node_exporter stopped. Its engines' alerts are held back while "
            "this fires (one page for the node)."),
    )


NODE_DOWN = AlertRecord(
    name="PdkitNodeDown", severity="critical", for_=NODE_DOWN_FOR, scope=HOST, build=_node_down,
    runbook=Runbook(
        means=f"Prometheus cannot reach node_exporter on the host for {NODE_DOWN_FOR}: "
              "the host is down, cut off the network, or "
              "only its node_exporter stopped. While it fires, Alertmanager holds back the alerts of the host's "
              "engines and exporters (inhibition), so a dead node pages once.",
        causes=("the host crashed, rebooted or lost power", "a network cut between it and the monitoring host (its "
                "engines may still serve clients on another path)", "prometheus-node-exporter stopped"),
        run=("reach the host: `ssh {node}` (or its BMC console); `uptime`, `journalctl -b -1 -n 100` after a reboot",
             "on it: `systemctl status prometheus-node-exporter`",
             "`pdkit doctor INVENTORY`: the host's rows say whether its engines still serve",
             "once it is back: `pyinfra INVENTORY deploy/pd.py --limit {node}` re-applies it; the router takes its "
             "engines back on its own")),
)


# a GPU an engine uses is wedged (pdkit-exporter's GPU health probe: pdkit/agent/exporter/gpuhealth.py). The alert is
# one per GPU: `seen` (what the probe saw) is left out of its labels, since a new kernel-log line would
# otherwise end the alert and start another; the doctor row and the exporter's series name it.
GPU_BY = (*EXPORTER_BY, "gpu", "bdf")


def _gpu_subjects(c: Context) -> list[dict[str, str]]:
    """Each GPU of each engine on a scraped node whose exporter reads GPU health (NVIDIA GPUs, a real engine)."""
    spec = c.spec
    out = []
    for h in scraped_hosts(spec):
        if h.node is None or not reads_gpu_health(h.node.gpu, spec.cluster.engine):
            continue
        for p in spec.placements(h):
            for g in p.engine.gpus:
                out.append(exporter_subject(spec, h, p.engine, gpu=str(g), bdf=f"0000:{0x18 + g:02x}:00.0", seen=""))
    return out



def _gpu_wedged(c: Context, r: AlertRecord) -> Alert | None:
    subjects = _gpu_subjects(c)
    if not subjects:
        return None

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
        test = alert_test(f"{r.name} stays quiet for {subject_name(s)} on one probe's reading",
                          r.name, series, "4m", [])
        # while the reading stands, and after
        test["alert_rule_test"].append({"eval_time": "6m", "alertname": r.name, "exp_alerts": []})
        return [test]

    return flag_alert(
        c, r, metric=EXPORTER_GPU_WEDGED, ok=0, by=GPU_BY,
        summary="GPU {{ $labels.gpu }} of {{ $labels.node }}/{{ $labels.engine }} is wedged",
        description=(
            "pdkit-exporter's GPU health probe on {{ $labels.node }} finds GPU {{ $labels.gpu }} "
            "({{ $labels.bdf }}), which engine {{ $labels.engine }} ({{ $labels.role }}) uses, in need of a reset "
            f"for {c.for_(r.for_)}: a reset-class Xid in the kernel log, retired pages or a row remap "
            "pending, or the driver's GPU Recovery Action. It does not heal by itself; the engine on it fails or "
            "hangs, and `pdkit roll` refuses any change onto it."),
        subjects=tuple(subjects),
        case=case,
        eval_time="10m",
        extra_tests=one_reading,
        fires_when=f"`{EXPORTER_GPU_WEDGED} > 0` for a GPU an engine uses (pdkit-exporter's GPU health probe)",
    )


GPU_WEDGED = AlertRecord(
    name="PdkitGpuWedged", severity="critical", for_=GPU_WEDGED_FOR, scope=NODE, build=_gpu_wedged,
    runbook=Runbook(
        means="pdkit-exporter's GPU health probe (the preflight's: `nvidia-smi -q` and the kernel log's Xid lines, "
              "at most once a minute) finds a GPU an engine uses in need of a reset "
              "(`pdkit_engine_gpu_wedged == 1`; its `seen` label says why). A wedged GPU does not heal by itself: "
              "the engine on it fails, hangs, or will not start again, and `pdkit roll` and `pdkit tune` refuse "
              "any change onto it. Labels: `node`, `engine`, `role`, `gpu` (the node's index), `bdf`.",
        causes=("a reset-class Xid in the kernel log (`pdkit.agent.topology.RESET_XIDS`): 79 (fallen off the bus), "
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
             "once the probe reads it healthy (within a minute): " + REDEPLOY)),
)


# other scrape targets down (monitoring blind spots; node_exporter has PdkitNodeDown)
def _scrape_target_down(c: Context, r: AlertRecord) -> Alert | None:
    return up_alert(
        c, r, (JOB_EXPORTER, JOB_DCGM, JOB_PROMETHEUS),
        summary="{{ $labels.job }} on {{ $labels.node }} cannot be scraped",
        description=(
            "The {{ $labels.job }} target on {{ $labels.node }} has been down for " + c.for_(r.for_) + ": "
            "its dashboards and the alerts built on it (drift, NCCL env, node and GPU figures) are blind. "
            "Serving is not affected."),
        fires_when="pdkit-exporter, DCGM or Prometheus itself is down (node_exporter: `PdkitNodeDown`)",
    )


SCRAPE_TARGET_DOWN = AlertRecord(
    name="PdkitScrapeTargetDown", severity="warning", for_=TARGET_DOWN_FOR, scope=NODE, build=_scrape_target_down,
    runbook=Runbook(
        means=f"pdkit-exporter, the DCGM exporter or Prometheus itself cannot be scraped for {TARGET_DOWN_FOR}: "
              "the dashboards and the alerts built on it (drift, NCCL env, GPU figures) are blind. "
              "Serving is not affected. (node_exporter down is `PdkitNodeDown`.)",
        causes=("the exporter service stopped or crashed", "its port is not reachable from the monitoring host"),
        run=("on {node}: `systemctl status pdkit-exporter` (or dcgm-exporter, prometheus) and "
             "`journalctl -u <that unit> -n 100`",
             "from the monitoring host: `curl -s http://{node}:<port>/metrics | head`",
             "re-apply the node: `pyinfra INVENTORY deploy/pd.py --limit {node}` (it serves nothing new: no roll "
             "needed)")),
)


# pdkit-exporter's view of each engine: flags drift and NCCL/UCX env
def _exporter_flag(key: str, ok: int, summary: str, description: str) -> Callable[[Context, AlertRecord], Alert | None]:
    """The builder of an alert on pdkit-exporter's 0/1 gauge EXPORTER[KEY] of each engine on a scraped node (OK:
    its healthy value; `flag_alert`)."""

    def build(c: Context, r: AlertRecord) -> Alert | None:
        scraped = {h.name for h in scraped_hosts(c.spec)}
        return flag_alert(
            c, r, metric=EXPORTER[key], ok=ok, by=EXPORTER_BY, summary=summary, description=description,
            subjects=tuple(exporter_subject(c.spec, h, e) for h, e in c.spec.engines() if h.name in scraped),
            eval_time="15m",
        )

    return build


# why an engine runs other flags than planned: the alert's description says them, its runbook lists them
DRIFT_CAUSES = ("someone changed the unit by hand", "a deploy did not restart the engine",
                "the release on the node is not the planned one")

CONFIG_DRIFT = AlertRecord(
    name="PdkitConfigDrift", severity="warning", for_=DRIFT_FOR, scope=NODE,
    build=_exporter_flag(
        "flags_drift", ok=0,
        summary="{{ $labels.node }}/{{ $labels.engine }} runs flags that differ from the plan",
        description=("pdkit-exporter found that the flags engine {{ $labels.engine }} on {{ $labels.node }} really "
                     "runs with (/server_info and its command line) differ from what the spec renders: "
                     + ", ".join(DRIFT_CAUSES[:-1]) + ", or " + DRIFT_CAUSES[-1] + ".")),
    runbook=Runbook(
        means="pdkit-exporter finds that an engine runs flags that differ from what the spec renders.",
        causes=DRIFT_CAUSES,
        run=("`pdkit doctor INVENTORY`: the engine's `flags` row names each drifted flag",
             "compare `systemctl cat pdkit-engine-{engine}` on {node} with `pdkit render INVENTORY --out DIR`",
             REDEPLOY + "; never fix a node by hand: the next deploy undoes it")),
)


NCCL_ENV_MISSING = AlertRecord(
    name="PdkitNcclEnvMissing", severity="warning", for_=ENV_MISSING_FOR, scope=NODE,
    build=_exporter_flag(
        "env_present", ok=1,
        summary="NCCL/UCX environment missing in {{ $labels.node }}/{{ $labels.engine }}",
        description=(
            "The running process of engine {{ $labels.engine }} on {{ $labels.node }} lacks NCCL/UCX variables the "
            "plan sets (read from /proc/<pid>/environ): untuned NCCL on PCIe falls back to host memory, and a "
            "cross-node NIXL transfer without UCX_NET_DEVICES hangs until its 300 s timeout.")),
    runbook=Runbook(
        means="The engine's running process lacks NCCL/UCX variables the plan sets (read from "
              "`/proc/<pid>/environ`): untuned NCCL on PCIe falls back to host memory, and cross-node NIXL "
              "without UCX_NET_DEVICES hangs for 300 s.",
        causes=("the engine was not restarted after its env files changed",
                "the unit's EnvironmentFile= lines do not point at the node's nccl.env / ucx.env"),
        run=("`pdkit doctor INVENTORY`: the engine's `process_env` row names the variable",
             "`systemctl cat pdkit-engine-{engine}` on {node}",
             REDEPLOY + " (an env file only takes effect on restart)")),
)
