"""Doctor's engine checks: does each engine run the plan (reachable, its ranks' processes, flags,
context length, environment, SGLang version) and does it make progress (queues). Pure: observations in,
rows out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdkit.agent import engineshape, residency
from pdkit.agent.exporter.drift import compare_server_info, describe, flag_key
from pdkit.doctor.checkbase import (
    cannot_measure,
    counter_delta,
    engine_down,
    engine_row,
    exporter_figure,
    not_measured,
)
from pdkit.doctor.model import FAIL, INFO, PASS, WARN, CheckResult, EngineObservation, ExporterView

# An uncapped context above this many tokens is flagged: the seeds' 1M context made the indexer
# scan 1M tokens per step; 128k is the largest window a seed needed.
UNCAPPED_CONTEXT_WARN = 131072
# A queue must grow by at least this many requests within the window to count as growing.
QUEUE_GROWTH_MIN = 4


def check_reachable(obs: EngineObservation) -> CheckResult:
    plan = obs.plan
    errors = [f"/server_info: {obs.server_info_error}"] if obs.server_info_error else []
    if obs.second.error:
        errors.append(f"/metrics: {obs.second.error}")
    if not errors:
        return engine_row(plan, "reachable", PASS, f"{plan.url} answered /server_info and /metrics")
    if obs.server_info is None and obs.second.figures is None:
        return engine_row(plan, "reachable", FAIL, f"{plan.url} did not answer: {'; '.join(errors)}",
                          f"on {plan.host}: systemctl status pdkit-engine-{plan.engine}; "
                          f"journalctl -u pdkit-engine-{plan.engine} -n 50")
    return engine_row(plan, "reachable", WARN, f"{plan.url} answered only in part: {'; '.join(errors)}",
                      "/metrics needs tuning.enable_metrics (on by default); re-run if the engine was restarting")


def check_rank_process(obs: EngineObservation) -> CheckResult:
    """A rank above 0 of an engine spanning nodes runs: its unit has a process (pdkit-exporter on its
    host, `pdkit_engine_rank_up`). It serves no HTTP (SGLang runs the HTTP server on rank 0), so
    this, not `reachable`, says whether it is up."""
    plan = obs.plan
    name = "rank_process"
    of = f"rank {plan.rank} of {plan.head}/{plan.engine} ({plan.nnodes} nodes)"
    unit = f"pdkit-engine-{plan.engine}"
    ex = obs.exporter
    if ex is None:
        return engine_row(plan, name, WARN, "not measurable: pdkit-exporter on "
                                            f"{plan.host} unreadable ({obs.exporter_error})",
                          f"on {plan.host}: systemctl status pdkit-exporter (it watches {of})")
    if ex.rank_up is None:
        return engine_row(plan, name, WARN, f"pdkit-exporter on {plan.host} does not "
                                            f"report {of} (no pdkit_engine_rank_up)",
                          f"re-apply the plan to {plan.host}: its /etc/pdkit/exporter.json names the rank it watches")
    if ex.rank is not None and ex.rank != plan.rank:
        return engine_row(plan, name, FAIL, f"pdkit-exporter on {plan.host} watches rank {ex.rank} "
                                            f"of {plan.engine}, the plan puts rank {plan.rank} there",
                          f"re-apply the plan to {plan.host} (pyinfra INVENTORY "
                          f"deploy/pd.py --limit {plan.host}, or pdkit roll)")
    if ex.rank_up == 0:
        return engine_row(plan, name, FAIL, f"{of} has no running process on {plan.host}: the "
                                            "engine cannot serve (rank 0 waits for every rank)",
                          f"on {plan.host}: systemctl status {unit}; journalctl "
                          f"-u {unit} -n 50 (a lost rank makes the others exit "
                          "like an NCCL timeout; systemd restarts them and the ranks meet again)")
    return engine_row(plan, name, PASS, f"{of} runs on {plan.host} (no HTTP on this "
                                        f"rank: rank 0 on {plan.head} serves it)")


def check_flags(obs: EngineObservation) -> CheckResult:
    """Running flags equal the plan: /server_info (pdkit.agent.exporter.drift) and the exporter's argv check."""
    plan = obs.plan
    if (early := cannot_measure(obs, "flags")) is not None:
        return early
    if plan.rank > 0:
        return _rank_flags(obs)
    drifted: dict[str, str] = {}
    unverified: tuple[str, ...] = ()
    if obs.server_info is not None:
        found = compare_server_info(plan.argv, obs.server_info)
        unverified = found.unverified
        for flag in found.drifted:
            drifted[flag] = describe(flag, plan.argv, obs.server_info.get(flag_key(flag)))
    if obs.exporter is not None:
        for flag in obs.exporter.drift_flags:
            drifted.setdefault(flag, f"{flag}: the process argv differs from the deployed plan (pdkit-exporter)")
    if obs.server_info is None and (obs.exporter is None or obs.exporter.flags_drift is None):
        return not_measured(plan, "flags", f"/server_info unreadable ({obs.server_info_error})")
    if drifted:
        shown = ("; ".join(drifted[f] for f in sorted(drifted)[:3])
                 + (f" (+{len(drifted) - 3} more)" if len(drifted) > 3 else ""))
        return engine_row(plan, "flags", FAIL, f"{len(drifted)} planned flag(s) not in effect: {shown}",
                          f"re-apply the plan to {plan.host} (pyinfra INVENTORY "
                          f"deploy/pd.py --limit {plan.host}, or pdkit roll); "
                          "a flag changed by hand on the host is overwritten "
                          "by that; an intended change belongs in the inventory")
    checked = len({flag_key(a) for a in plan.argv if a.startswith("--")}) - len(unverified)
    note = f", {len(unverified)} not reported by /server_info ({', '.join(unverified[:3])})" if unverified else ""
    return engine_row(plan, "flags", PASS, f"{checked} planned flags match the running engine{note}")


def _rank_flags(obs: EngineObservation) -> CheckResult:
    """A rank above 0 has no /server_info: its process argv against its planned argv (pdkit-exporter)."""
    plan = obs.plan
    ex = obs.exporter
    if ex is None or ex.flags_drift is None:
        why = obs.exporter_error if ex is None else "it reports no pdkit_engine_flags_drift"
        return engine_row(plan, "flags", WARN, f"not measurable: rank {plan.rank} serves no "
                                               f"/server_info and pdkit-exporter on {plan.host} "
                          f"does not report its process argv ({why})",
                          f"on {plan.host}: systemctl status pdkit-exporter")
    if ex.drift_flags or ex.flags_drift:
        shown = ", ".join(sorted(ex.drift_flags)[:3]) or "see pdkit_engine_flag_drift_info"
        return engine_row(plan, "flags", FAIL, f"the process argv of rank {plan.rank} differs "
                                               f"from the deployed plan (pdkit-exporter): {shown}",
                          f"re-apply the plan to {plan.host} (pyinfra INVENTORY "
                          f"deploy/pd.py --limit {plan.host}, or pdkit roll; "
                          f"the engine's nodes roll together); every rank must run the same argv but --node-rank")
    checked = len({flag_key(a) for a in plan.argv if a.startswith("--")})
    return engine_row(plan, "flags", PASS, f"{checked} planned flags match the process "
                                           f"argv of rank {plan.rank} (pdkit-exporter; "
                      "this rank serves no /server_info)")


def check_context_length(obs: EngineObservation) -> CheckResult:
    plan, name = obs.plan, "context_length"
    if (early := cannot_measure(obs, name, needs="server_info")) is not None:
        return early
    running = obs.read_server_info().get("context_length")
    if not isinstance(running, int) or isinstance(running, bool):
        return engine_row(plan, name, WARN, "/server_info reports no context_length", "not measurable on this version")
    if plan.context_length is None:
        if running > UNCAPPED_CONTEXT_WARN:
            return engine_row(plan, name, WARN, f"not capped by the spec: the engine runs a {running}-token context",
                              "set tuning.context_length to the longest prompt you serve (a "
                              "1M context made the seeds' indexer scan 1M tokens per step)")
        return engine_row(plan, name, PASS, f"not capped by the spec; the engine's context is {running} tokens")
    if running == plan.context_length:
        return engine_row(plan, name, PASS, f"capped at {running} tokens as planned")
    if running < plan.context_length:
        hint = (f"re-apply the plan to {plan.host} (a hand edit is "
                "overwritten); if it stays lower, the model's maximum is: "
                "set tuning.allow_longer_context: true "
                "(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1) or lower tuning.context_length")
    else:
        hint = f"the engine does not run the planned --context-length: re-apply the plan to {plan.host}"
    return engine_row(plan, name, FAIL, f"context length {running}, planned {plan.context_length}", hint)


def check_engine_shape(obs: EngineObservation) -> CheckResult:
    """The engine is the engine it was: its shape now (/server_info) against the one the gate recorded at
    its running configuration's first healthy start (the node's exporter, pdkit_engine_shape_recorded):
    a figure below pdkit.agent.engineshape.MIN_FRACTION of the record fails, naming both numbers."""
    plan, name = obs.plan, "engine_shape"
    if (early := cannot_measure(obs, name, needs="server_info")) is not None:
        return early
    now = engineshape.shape_from_server_info(obs.read_server_info())
    ex = obs.exporter
    if ex is None:
        return engine_row(plan, name, WARN, f"not measurable: {engineshape.describe(now)} now, but the node's "
                                            f"pdkit-exporter was unreadable ({obs.exporter_error})",
                          f"make pdkit-exporter on {plan.host} reachable from this machine and re-run")
    recorded = {k: int(v) for k, v in ex.recorded_shape.items() if k in engineshape.FIGURES}
    if not recorded:
        return engine_row(plan, name, WARN, f"nothing recorded yet for this configuration ({engineshape.describe(now)} "
                                            "now): the engine gate records it at the first healthy start",
                          f"run the deploy or `pdkit roll` once with this kit on {plan.host}: its engine gate "
                          "records the shape (pdkit/agent/engineshape.py)")
    problems = engineshape.compare(recorded, now)
    if problems:
        return engine_row(plan, name, FAIL, "; ".join(problems),
                          f"the engine came back smaller (GPU memory taken by something else at its start?): "
                          f"check `nvidia-smi` on {plan.host}, then restart pdkit-engine-{plan.engine} "
                          "(pdkit rollback/roll, or by hand once the memory is free)")
    return engine_row(plan, name, PASS, f"{engineshape.describe(now)}; each at least "
                                        f"{engineshape.MIN_FRACTION:.0%} of the recorded "
                                        f"{engineshape.describe(recorded)}")


def check_weights(obs: EngineObservation) -> CheckResult:
    """The engine serves the weights it served at its running configuration's first healthy start (issue 44
    item 2): the engine gate's last verdict on its /weights_checker checksums, as the node's exporter
    publishes it (pdkit_engine_weights_info). Doctor never asks /weights_checker itself: every rank hashes
    every tensor, in the scheduler, between batches, so the call stalls serving for its seconds."""
    plan, name = obs.plan, "weights"
    if (early := cannot_measure(obs, name)) is not None:
        return early
    ex = obs.exporter
    if ex is None:
        return engine_row(plan, name, WARN, f"not measurable: the node's pdkit-exporter was unreadable "
                                            f"({obs.exporter_error})",
                          f"make pdkit-exporter on {plan.host} reachable from this machine and re-run")
    verdict = ex.weights
    if verdict is None:
        return engine_row(plan, name, WARN, "nothing recorded yet: no engine gate has checked this engine's weights",
                          f"run the deploy or `pdkit roll` once with this kit on {plan.host}: its engine gate "
                          "records the weight checksums (pdkit/agent/engineshape.py)")
    status = verdict.get("status")
    if status == "mismatch":
        return engine_row(plan, name, FAIL, f"the last start's weights differ from the first healthy start's: "
                                            f"{verdict.get('problem')}",
                          f"the engine loaded other weights than before (a changed or corrupt model directory, "
                          f"another revision?): check the model files on {plan.host}, then restart "
                          f"pdkit-engine-{plan.engine} (pdkit rollback/roll)")
    if status == "unavailable":
        return engine_row(plan, name, INFO, f"not compared: the engine did not answer /weights_checker at its last "
                                            f"start ({verdict.get('problem')}); this never blocks",
                          "SGLang 0.5.17 and 0.5.23 serve it without a key: the next start that answers records "
                          "the checksums (an engine run with --api-key/--admin-api-key keeps the gate out)")
    if status in ("match", "recorded"):
        how = "as recorded at its configuration's first healthy start" if status == "match" else "recorded"
        return engine_row(plan, name, PASS, f"per-engine checksum {verdict.get('now')} at the last start, {how}")
    return engine_row(plan, name, WARN, f"the node's exporter reports an unknown weights verdict {status!r}",
                      "update pdkit on this machine or on the node")


# below this share of the weights in the page cache, a restart reads the rest from disk: WARN
WEIGHTS_CACHED_MIN = 0.95


def reads_weight_files(plan) -> bool:
    """The engine loads weight files from a local directory (not dummy weights, a hub id or the sim):
    where check_weights_cached has something to say."""
    return plan.engine_kind != "sim" and residency.model_dir_of(plan.argv) is not None


def check_weights_cached(obs: EngineObservation) -> CheckResult:
    """A restart of this engine reads its weights from memory, not disk (issue 45 item 3): the share
    of its weight files in the node's page cache, as the node's exporter measures it (mincore,
    pdkit/agent/residency.py). The roll reads cold weights in before its drain; doctor says how cold they are."""
    plan, name = obs.plan, "weights_cached"

    def judge(_: ExporterView, cached: tuple[str, float, float]) -> CheckResult:
        model_dir, ratio, size = cached
        gib = size / 2**30
        if ratio >= WEIGHTS_CACHED_MIN:
            return engine_row(plan, name, PASS, f"{ratio:.0%} of {gib:.1f} GiB of weights under {model_dir} in the "
                                                "page cache: a restart reads them from memory")
        return engine_row(plan, name, WARN, f"only {ratio:.0%} of {gib:.1f} GiB of weights under {model_dir} in the "
                                            f"page cache: a restart now reads {(1 - ratio) * gib:.1f} GiB from disk",
                          f"`pdkit roll` reads them in before its drain; to warm them now: "
                          f"`python3 -m pdkit.residency {model_dir} --warm` on {plan.host} (the node venv's python); "
                          "if they keep going cold, the node lacks the RAM to hold them beside its other use")

    return exporter_figure(obs, name, lambda ex: ex.weights_cached,
                           "not measured: no local weight files (dummy weights, a hub id, the sim), or an exporter "
                           "older than this check", judge)


def check_gpu_health(obs: EngineObservation) -> CheckResult:
    """No engine runs on a wedged GPU unseen (issue 47 item 4): the health of each GPU the engine uses, as
    the node's exporter last read it with the preflight's probe (pdkit_engine_gpu_wedged: a reset-class
    Xid, pending page retirement or row remap, the driver's GPU Recovery Action). Judged whether the
    engine answers or not: a wedged GPU is a common reason it does not. Only where the exporter reads
    GPU health (NVIDIA GPUs, a real engine)."""
    plan, name = obs.plan, "gpu_health"
    ex = obs.exporter
    if ex is None:
        return engine_row(plan, name, WARN, f"not measurable: pdkit-exporter on {plan.host} unreadable "
                                            f"({obs.exporter_error})",
                          f"on {plan.host}: systemctl status pdkit-exporter; `pdkit preflight` reads the GPU "
                          "health too")
    mine = {g: ex.gpu_wedged[g] for g in plan.gpus if g in ex.gpu_wedged}
    wedged = {g: v for g, v in mine.items() if v[1] > 0}
    if wedged:
        gpus = ", ".join(map(str, wedged))
        said = "; ".join(f"GPU {g} ({bdf}) is wedged: {seen or 'no reason given'}"
                         for g, (bdf, _, seen) in wedged.items())
        resets = " and ".join(f"`nvidia-smi -r -i {g}`" for g in wedged)
        return engine_row(plan, name, FAIL, said,
                          f"drain {plan.host} (`pdkit roll` refuses any change onto GPU {gpus} meanwhile), then reset "
                          f"on {plan.host}: {resets} (with no process on the GPU), or reboot it; the row passes once "
                          "the exporter's next probe (within a minute) reads it healthy")
    probe_error = ex.gpu_probe_error
    if probe_error is not None and probe_error[0] > 0:
        return engine_row(plan, name, WARN, f"not measurable: the GPU health probe on {plan.host} could not tell "
                                            f"({probe_error[1] or 'no reason given'})",
                          f"on {plan.host}: `nvidia-smi -q` (one that hangs is itself a sign of a wedged GPU) and "
                          "`journalctl -u pdkit-exporter -n 50`")
    if not mine:
        return engine_row(plan, name, INFO, f"not measured: pdkit-exporter on {plan.host} publishes no GPU health "
                                            "(an exporter older than this check, or its first probe has not "
                                            "ended: it runs within a minute of the exporter's start)", "")
    missing = [g for g in plan.gpus if g not in mine]
    healthy = ", ".join(map(str, mine))
    if missing:
        return engine_row(plan, name, WARN, f"GPU {healthy} healthy, but the probe on {plan.host} does not find GPU "
                                            f"{', '.join(map(str, missing))} on the PCI bus",
                          f"on {plan.host}: `nvidia-smi -L` and `lspci -d 10de:`; a GPU gone from the bus needs a "
                          "reboot or a power cycle, or the spec's engine gpus name a GPU the node lacks")
    return engine_row(plan, name, PASS, f"GPU {healthy} healthy: no reset-class Xid, no pending page retirement or "
                                        "row remap (pdkit-exporter's probe)")


def check_jit_caches(obs: EngineObservation) -> CheckResult:
    """Its next restart finds the JIT kernels it compiled (issue 45 item 2): the warm stamp the engine gate
    wrote at ready with these cache directories on the current engine environment (pdkit/agent/jitcache.py), as
    the node's exporter judges it. Cold is a WARN, never a failure: the next start compiles, and costs
    what the measured cold start says."""
    plan, name = obs.plan, "jit_caches"

    def judge(ex: ExporterView, caches: tuple[str, float, str]) -> CheckResult:
        where, warm, why = caches
        if warm >= 1:
            return engine_row(plan, name, PASS, f"warm under {where}: {why}")
        cost = (f"~{ex.jit_cold_extra[0]:.0f} s more than a warm start (measured from {ex.jit_cold_extra[1]})"
                if ex.jit_cold_extra is not None else "a longer start (no cold start of it measured on this node yet)")
        return engine_row(plan, name, WARN, f"cold under {where}: {why}; its next restart compiles: {cost}",
                          "a start outside the kit's gates (a hand `systemctl restart`) compiled but left no stamp: "
                          "the next restart through the kit (a deploy, roll or rollback that changes the engine) "
                          "writes one; after an install or lock change the first start compiles, and the deploy "
                          "starts a node's cold engines one at a time")

    return exporter_figure(obs, name, lambda ex: ex.jit_caches,
                           "not judged: SGLANG_CACHE_DIR is set by the engine's own env, or the exporter is older "
                           "than this check", judge)


def check_env(obs: EngineObservation) -> CheckResult:
    """The planned NCCL/UCX/SGLANG environment is in the engine process (the exporter reads /proc/PID/environ)."""
    plan, name = obs.plan, "process_env"
    if (early := cannot_measure(obs, name)) is not None:
        return early
    ex = obs.exporter
    if ex is None:
        return engine_row(plan, name, WARN, "not measurable: pdkit-exporter on "
                                            f"{plan.host} unreadable ({obs.exporter_error})",
                          f"on {plan.host}: systemctl status pdkit-exporter "
                          "(it reads /proc/<pid>/environ of the engine)")
    if ex.env_check_error == 1 or ex.env_present is None:
        return engine_row(plan, name, WARN, "pdkit-exporter could not read the engine process's environment",
                          f"is pdkit-engine-{plan.engine} running? the exporter runs "
                          "as the service user and reads its /proc/<pid>/environ")
    if ex.env_present == 0:
        shown = (", ".join(f"{var} {problem}" for var, problem in sorted(ex.env_mismatch.items()))
                 or "see pdkit_engine_env_mismatch_info")
        return engine_row(plan, name, FAIL, f"the engine process lacks planned variables: {shown}",
                          "the unit loads /etc/pdkit/nccl.env, ucx.env and "
                          f"engines/{plan.engine}.env: re-apply the plan to {plan.host} "
                          "and restart the engine (a changed env file takes effect only on restart)")
    names = ", ".join(plan.env_names[:4]) + ("..." if len(plan.env_names) > 4 else "")
    return engine_row(plan, name, PASS, f"every planned variable is in the process ({len(plan.env_names)}: {names})"
                      if names else "every planned variable is in the process")


def check_versions(group: Sequence[EngineObservation]) -> list[CheckResult]:
    """Prefill and decode of one PD group run the same SGLang version (and, on sglang, the planned one)."""
    running = {id(o): (o.server_info or {}).get("version") for o in group}
    known = {str(v) for v in running.values() if v}
    label = f"PD group {group[0].plan.pd_group!r}" if group[0].plan.pd_group else "engine"
    out = []
    for obs in group:
        plan = obs.plan
        version = running[id(obs)]
        if not version:
            last = (f"; last known {obs.exporter.sglang_version} (pdkit-exporter)"
                    if obs.exporter and obs.exporter.sglang_version else "")
            out.append(engine_row(plan, "version", WARN, f"not measured: /server_info gave no version{last}",
                                  "follows from reachable" if engine_down(obs) else "not reported by this engine"))
        elif len(known) > 1:
            members = ", ".join(f"{o.plan.host}/{o.plan.engine} {running[id(o)] or '?'}" for o in group)
            out.append(engine_row(plan, "version", FAIL, f"{label} mixes SGLang versions: {members}",
                                  "roll the whole group to one version "
                                  "(pdkit_cluster.sglang_version or engines[].sglang_version): "
                                  "a mismatched pair fails at the NIXL handshake or corrupts output"))
        elif plan.engine_kind == "sglang" and str(version) != plan.sglang_version:
            out.append(engine_row(plan, "version", WARN, f"runs SGLang {version}, the spec plans {plan.sglang_version}",
                                  f"re-apply the plan to {plan.host} (the wheelhouse installs the pinned version)"))
        else:
            others = f" like the rest of {label}" if len(group) > 1 else ""
            out.append(engine_row(plan, "version", PASS, f"runs {version}{others}"))
    return out


def _queue_depth(figures: dict[str, Any]) -> float:
    return figures.get("queued_requests", 0.0) + sum((figures.get("pd_queues") or {}).values())


def _progress(first: dict[str, Any], second: dict[str, Any]) -> float:
    moved = sum(counter_delta(first.get(k), second.get(k, 0.0)) or 0.0 for k in ("prompt_tokens", "generation_tokens"))
    a, b = first.get("cuda_graph_passes") or {}, second.get("cuda_graph_passes") or {}
    return moved + sum(counter_delta(a.get(k), v) or 0.0 for k, v in b.items())


def check_queues(obs: EngineObservation) -> CheckResult:
    """The waiting and PD queues did not grow between two samples; growing with no progress is stuck."""
    plan, name = obs.plan, "queues"
    if (early := cannot_measure(obs, name, needs="both metrics samples")) is not None:
        return early
    a, b = obs.first.read_figures(), obs.second.read_figures()
    before, after = _queue_depth(a), _queue_depth(b)
    window = obs.second.at - obs.first.at
    held = (min(a.get("running_requests", 0.0) + before, b.get("running_requests", 0.0) + after))
    if held > 0 and _progress(a, b) <= 0:
        return engine_row(plan, name, FAIL, f"wedged: {held:.0f} request(s) running "
                                            "or queued at both samples and no token "
                          f"or forward pass in {window:.0f} s (its HTTP server answers, the scheduler does not step)",
                          f"journalctl -u pdkit-engine-{plan.engine} -n 300 "
                          "(the last batch line); py-spy dump the scheduler; "
                          f"restart the engine (systemctl restart pdkit-engine-{plan.engine}); alert PdkitEngineWedged")
    if after - before >= QUEUE_GROWTH_MIN:
        if _progress(a, b) <= 0:
            return engine_row(plan, name, FAIL, f"queued requests {before:.0f} -> {after:.0f} "
                                                f"in {window:.0f} s with no token produced: stuck",
                              "a prefill queue waits for its decode partner (bootstrap) "
                              "or a decode for KV (transfer): check the pair's "
                              "journals; restart the stuck engine (a prefill "
                              "replaced behind one address stalls its decode)")
        return engine_row(plan, name, WARN, f"queued requests grew {before:.0f} -> {after:.0f} in {window:.0f} s",
                          "requests arrive faster than this engine drains them: "
                          "add engines or lower the load; see KV usage and graphs")
    return engine_row(plan, name, PASS, f"queued requests {before:.0f} -> {after:.0f} over {window:.0f} s")
