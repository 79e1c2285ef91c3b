"""`pdkit tune INVENTORY CAMPAIGN [--dry] [--resume]`: the campaign on a live cluster.

Order: validate everything (campaign, every candidate's derived spec, workloads) before any
host is touched; then the baseline (rolled as the inventory says, its answers recorded), then
each candidate: roll (pdkit.roll's Roller: drain, apply, ready, router, smoke; a failed gate
puts the node back on its release), correctness, soak, doctor, bench. A candidate that fails
after its roll is put back, byte for byte, on the releases its nodes ran before it (the same
drain/restore/ready/router/smoke steps as `pdkit rollback`). One record is appended per
candidate the moment it finishes and the report is regenerated. At the end the chosen
configuration is rolled on and the inventory fields to keep it are printed; the inventory file
itself is never written.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pdkit.bench import check_workload
from pdkit.bench.agentic import check_agentic
from pdkit.bench.load import LoadThread
from pdkit.bench.measure import Measured, engines_for, measured_for
from pdkit.bench.noise import band as noise_band
from pdkit.bench.noise import describe as noise_describe
from pdkit.bench.record import context_cap
from pdkit.clients import answers
from pdkit.inventory.loader import load_with_problems, read_inventory
from pdkit.render import flags
from pdkit.render.outages import batch_outages
from pdkit.render.plan import plan_cluster
from pdkit.roll import (
    Progress,
    Roller,
    RollError,
    make_batches,
    pairing_units,
    patch_gevent,
    read_node_state,
    rollout_order,
    router_state_words,
    unchanged_hosts,
    version_changes,
)
from pdkit.tune import gates
from pdkit.tune.campaign import (
    BASELINE,
    Applied,
    Campaign,
    CampaignError,
    Candidate,
    agentic_workload,
    apply_overlay,
    campaign_problems,
    derive,
    expand,
    flag_diff,
    keep_lines,
    load_campaign,
    render_inventory,
    resolve_targets,
    spec_diff,
)
from pdkit.tune.results import (
    ASSUMED_ROLL_S,
    REMEASURE,
    SCHEMA,
    ResumeError,
    append_record,
    choose_kept,
    estimate,
    load_records,
    paths,
    rank_by,
    resume_plan,
    workload_text,
    write_report,
)

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_INTERRUPTED = 130


@dataclass
class Prepared:
    """Everything decided before a host is touched."""

    campaign: Campaign
    inventory: str  # absolute path of the user's inventory (read, never written)
    base_spec: Any
    host_data: list
    targets: list[str]
    candidates: list[Candidate]
    specs: dict[str, Any]  # candidate name -> derived ClusterSpec (BASELINE: the inventory's)
    applied: dict[str, Applied]
    target_concurrency: int
    # what the correctness gate, the soak and the bench send to: the router for the whole cluster,
    # else the target's own PD pairs (pdkit.bench.measure); the same for the baseline and every candidate
    measured: Measured
    restarts: dict[str, int] = field(default_factory=dict)  # hosts each candidate restarts, in campaign order
    # hosts whose roll takes a router's last workers of a kind out -> the routers and kinds (pdkit.roll.batch_outages)
    outages: dict[str, list] = field(default_factory=dict)
    # candidate -> validate's warnings it has and the baseline has not ("experimental: ..."), shown
    # in --dry, kept in its record and the report
    warnings: dict[str, list[str]] = field(default_factory=dict)
    # the agentic workload (campaign.workload.agentic), built once: every candidate replays the same sessions
    agentic: Any = None


def candidate_inventory(campaign: Campaign, name: str) -> Path:
    return paths(campaign)["state"] / f"{name}.py"


def target_concurrency(campaign: Campaign, spec) -> int:
    """The objective's level: the campaign's, else the inventory's target_concurrency when it is a
    bench level, else the largest level."""
    levels = campaign.workload.concurrency
    if campaign.target_concurrency is not None:
        return campaign.target_concurrency
    if spec.cluster.target_concurrency in levels:
        return spec.cluster.target_concurrency
    return max(levels)


def prepare(inventory: str, campaign_path: str) -> Prepared:
    """Load and validate everything. Raises CampaignError with every problem found."""
    campaign = load_campaign(campaign_path)
    inv = os.path.abspath(inventory)
    problems: list[str] = []
    if campaign.inventory is not None and os.path.abspath(campaign.inventory) != inv:
        problems.append(f"campaign.inventory: the campaign starts from {campaign.inventory}, not {inventory}: give "
                        "that inventory")
    base, base_problems = load_with_problems(inv)
    errors = [p for p in base_problems if p.severity == "error"]
    if errors or base is None:
        raise CampaignError(inventory, [f"the inventory itself: {p}" for p in errors])
    hosts = read_inventory(inv, os.getcwd())
    candidates = expand(campaign)
    problems += campaign_problems(campaign, candidates)
    targets = resolve_targets(campaign, base)
    specs: dict[str, Any] = {BASELINE: base}
    applied: dict[str, Applied] = {BASELINE: apply_overlay(hosts, {}, targets)}
    base_warnings = {str(p) for p in base_problems if p.severity == "warning"}
    warnings: dict[str, list[str]] = {}
    for c in candidates:
        spec, found, app = derive(hosts, c, targets, str(candidate_inventory(campaign, c.name).resolve()),
                                  campaign.acknowledge)
        warnings[c.name] = [str(p) for p in found if p.severity == "warning" and str(p) not in base_warnings]
        for p in found:
            if p.severity == "error":
                problems.append(f"candidate {c.name}: {p}")
        if spec is not None:
            specs[c.name], applied[c.name] = spec, app
    w = campaign.workload
    agentic = None
    if w.agentic is not None:
        try:
            agentic = agentic_workload(w.agentic, len(w.concurrency), Path(campaign_path).resolve().parent)
        except (OSError, ValueError) as exc:
            problems.append(f"campaign.workload.agentic: {exc}")
    for name, spec in specs.items():
        for what, (inp, out, req, warm) in (("workload", (w.input_len, w.output_len, w.requests, w.warmup)),
                                             ("correctness", (64, campaign.correctness.max_new_tokens, 1, 0))):
            try:
                if what == "workload" and w.agentic is not None:
                    if agentic is not None:  # the longest session must fit every candidate's context cap
                        check_agentic(spec, agentic, w.warmup)
                    continue
                check_workload(spec, inp, out, req, warm)
            except ValueError as exc:
                where = "workload.agentic" if what == "workload" and agentic is not None else what
                problems.append(f"candidate {name}: campaign.{where}: {exc}")
    # the baseline rolls every host (those already on the inventory stay serving), a candidate its targets
    outages = {h.name: found for h in base.hosts if (found := batch_outages(base, [h.name]))}
    if outages and not campaign.downtime:
        for host, found in outages.items():
            lost = "; ".join(o.lost() for o in found)
            what = "rolling a candidate onto" if host in targets else "the baseline's roll of every host reaches"
            problems.append(f"campaign.downtime: {what} {host}, a service outage ({lost} while its engines restart): "
                            "set `downtime: true` to accept it (the router serves nothing during that roll), or give "
                            "every kind of worker a second node")
    measured = None
    if not base.router_hosts:
        problems.append("the inventory declares no router: the rolls drain and re-add engines through the router")
    else:
        try:
            measured = measured_for(base, targets)
        except ValueError as exc:
            problems.append(f"campaign.target: {exc}")
        if measured is not None and w.agentic is not None and measured.via != "router":
            problems.append("campaign.workload.agentic: the agentic workload replays sessions through the router, "
                            f"but the target is measured on its own PD pairs ({measured_text(measured)}); valid: a "
                            "target that is every engine the router fronts (one node, or target: all)")
    if problems:
        raise CampaignError(campaign_path, problems)
    assert measured is not None  # each way it stays None above added a problem
    # hosts whose rendered release changes from one candidate to the next (the previous one passed)
    restarts = {}
    previous = plan_cluster(base)
    for c in candidates:
        plans = plan_cluster(specs[c.name])
        restarts[c.name] = sum(plans[h].release_hash != previous[h].release_hash for h in targets)
        previous = plans
    return Prepared(campaign, inv, base, hosts, targets, candidates, specs, applied, target_concurrency(campaign, base),
                    measured, restarts, outages, warnings, agentic)


def measured_text(measured: Measured) -> str:
    """One line: what the gates and the bench send their requests to."""
    if measured.via == "router":
        return f"measured through the router ({measured.router_url}): the target is every engine it fronts"
    return (f"measured on the target's own engines, each request to one PD pair in turn, not through the router: "
            f"{', '.join(r.label for r in measured.routes)}")


def measured_problem(measured: Measured, records: list[dict[str, Any]]) -> str | None:
    """Why recorded results cannot be continued with this measurement (another target or engines)."""
    base = next((r for r in records if r.get("kind") == BASELINE), None)
    if base is None:
        return None
    recorded = base.get("measured")
    if recorded != measured.describe():
        was = ("not recorded (a campaign from before pdkit tune measured the target's own engines)" if recorded is None
               else json.dumps(recorded))
        return (f"the recorded baseline was measured on {was}, this run would "
                f"measure {json.dumps(measured.describe())}: "
                "results would not compare; start a new campaign (another name)")
    return None


def expected_downtime(prep: Prepared, records: list[dict[str, Any]]) -> tuple[float | None, str]:
    """(seconds the cluster serves nothing per restarted host, where the figure comes from), or
    (None, "") when no roll of the campaign is an outage: the mean outage in this campaign's records,
    else the roll time the estimate assumes."""
    if not (prep.outages and set(prep.outages) & set(prep.targets)):
        return None, ""
    seen = [r["timings"]["outage_s"] / max(1, r["timings"].get("restarts") or 1) for r in records
            if (r.get("timings") or {}).get("outage_s")]
    if seen:
        return sum(seen) / len(seen), f"the mean outage per restart in this campaign's records ({len(seen)})"
    return ASSUMED_ROLL_S, "assumed, not yet measured: the estimate's roll time per restart"


def accuracy_where(prep: Prepared) -> str:
    """Where part (d) sends its eval on this campaign's target (the baseline's layout), or why it is skipped."""
    try:
        url, _, via = answers.accuracy_endpoint(engines_for(prep.base_spec, prep.targets))
    except ValueError as exc:
        return f"skipped: {exc}"
    return via if url is None else f"{via}, {url}"


def dry_text(prep: Prepared, records: list[dict[str, Any]], todo: list[Candidate]) -> str:
    c = prep.campaign
    lines = [f"pdkit tune --dry: campaign {c.name!r} on {prep.inventory}: nothing will be changed", "",
             f"target: {', '.join(prep.targets)}; objective {c.objective.metric} at C={prep.target_concurrency} "
             f"{c.objective.describe()}",
             f"correctness, soak and bench: {measured_text(prep.measured)}",
             "correctness gate (pdkit/clients/answers.py, docs/correctness.md):",
             *(f"  {line}" for line in answers.describe(c.correctness.gate_config(), context_cap(prep.base_spec),
                                                        None)),
             *([f"  (d) here: {accuracy_where(prep)}"] if c.correctness.accuracy.enabled else []),
             f"bench: {workload_text(c.workload)}" + (
                 f", largest context {prep.agentic.largest_context()} tokens (fits every candidate's cap)"
                 if prep.agentic is not None else ""), ""]
    done = {r["candidate"] for r in records if r.get("kind") in ("baseline", "candidate")}
    down_s, down_source = expected_downtime(prep, records)
    if down_s is not None:
        hosts = ", ".join(sorted(prep.outages))
        lines.append(f"downtime accepted (campaign.downtime): each roll onto {hosts} takes the router's last workers "
                     "of a kind out")
    lines.append("  baseline: the inventory as it is" + (" (recorded)" if BASELINE in done else ""))
    for cand in prep.candidates:
        mark = " (recorded)" if cand.name in done else ""
        overlay = ", ".join(f"{k}={v!r}" for k, v in cand.overlay.items())
        lines.append(f"  {cand.name}{mark}: {overlay}; restarts {prep.restarts[cand.name]} host(s) after the one "
                     f"before it; correctness {'exact' if cand.exact else f'match rate >= {cand.min_match_rate:g}'}")
        if down_s is not None and prep.restarts[cand.name]:
            lines.append(f"      downtime: ~{down_s:.0f} s with the cluster serving nothing ({down_source}); "
                         f"~{down_s:.0f} s more if it fails and is put back")
        for line in (flag_diff(prep.base_spec, prep.specs[cand.name])
                     or ["no engine flag changes (environment or node settings only)"]):
            lines.append(f"      {line}")
        for line in prep.warnings.get(cand.name, []):
            lines.append(f"      warning: {line}")
    n = len(todo) + (BASELINE not in done)
    restarts = round(sum(prep.restarts[t.name] for t in todo) / max(1, len(todo))) if todo else 0
    est = estimate(n, restarts, c, records)
    per = ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in est["per_candidate"].items())
    assumed = [k for k, v in est["measured"].items() if not v]
    noise = c.noise
    lines += ["", f"noise: the baseline benched {noise.baseline_repeats} times"
              + (" and once more after the last candidate (rolled back onto the targets: one more restart)"
                 if noise.remeasure_at_end else "")
              + f"; a candidate is kept only when its gain clears the baseline's spread + {noise.margin:.1%}"]
    lines += [f"estimate: {est['total_s'] / 60:.1f} min for {n} run(s) to go ({per} each"
              + (f"; {est['noise_s']:.0f} s for the baseline's band" if est["noise_s"] else "") + ")"
              + (f"; assumed, not yet measured: {', '.join(assumed)} time" if assumed
                 else "; from this campaign's records")]
    return "\n".join(lines)


def bench_figures(lv: dict[str, Any]) -> str:
    """One bench level in a progress line: tok/s, TTFT p99, goodput when judged, the KV share of TTFT."""
    text = f"C={lv['concurrency']} {lv['output_tok_s']:.0f} tok/s"
    ttft = (lv.get("ttft_ms") or {}).get("p99")
    if ttft is not None:
        text += f" TTFT p99 {ttft:.0f} ms"
    if lv.get("goodput"):
        text += f" goodput {lv['goodput']['requests_s']:.2f} req/s"
    share = (lv.get("kv") or {}).get("ttft_share")
    if share is not None:
        text += f" KV {share:.0%} of TTFT"
    return text


# ------------------------------------------------------------------ talking to the cluster


class Interrupted(Exception):
    pass


class Session:
    """One campaign run: the records so far, the progress printer, the stop flag."""

    def __init__(self, prep: Prepared, records: list[dict[str, Any]]) -> None:
        self.prep = prep
        self.records = records
        self.progress = Progress()
        self.stop_requested = False
        self.paths = paths(prep.campaign)
        self.gate = "roll"  # the gate in progress: an unexpected error is that gate's failure
        # whose spec the targets run: the last candidate (or baseline) that passed stays applied until
        # the next one rolls over it, and a failed one is put back onto it
        self.on_node = next((r["candidate"] for r in reversed(records)
                             if r.get("kind") in ("baseline", "candidate") and r.get("verdict") == "pass"), BASELINE)

    def say(self, step: str, message: str, took: float | None = None) -> None:
        self.progress("tune", step, message, took)

    # ---- rolls
    def roller(self, name: str):
        inv = self.prep.inventory if name == BASELINE else str(self.write_inventory(name))
        return Roller(inv, self.prep.specs[name], self.progress, allow_downtime=self.prep.campaign.downtime,
                      command="tune")

    def write_inventory(self, name: str) -> Path:
        path = candidate_inventory(self.prep.campaign, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        text = render_inventory(self.prep.applied[name].hosts, self.prep.inventory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the inventory's secrets
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path.resolve()

    def releases(self, roller, hosts: list[str]) -> dict[str, str | None]:
        state, connected, unreachable = roller.pyinfra.connect(hosts)
        if unreachable:
            h, why = next(iter(unreachable.items()))
            raise RollError(h, "connect", f"cannot reach it over SSH ({why})")
        return roller.current_releases(state, connected)[0]

    def roll(self, roller, rolled: list[str], hosts: list[str] | None = None) -> int:
        """Roll HOSTS (default: the targets) as pdkit roll does (order, pairing, batches of one after
        the canary). Appends each host to ROLLED once its batch passed; returns how many hosts changed."""
        spec = roller.spec
        order = rollout_order(spec, limit=hosts or self.prep.targets)
        diffs, versions, unreachable = read_node_state(roller, order)
        if unreachable:
            h, why = next(iter(unreachable.items()))
            raise RollError(h, "connect", f"cannot reach it over SSH ({why}); nothing was changed")
        units, _ = pairing_units(spec, version_changes(spec, versions))
        roller.unchanged = unchanged_hosts(diffs)
        for batch in make_batches(order, 1, units):
            roller.roll_batch(batch)
            rolled.extend(batch)
        return sum(h not in roller.unchanged for h in order)

    def put_back(self, roller, hosts: list[str], before: dict[str, str | None]) -> list[str]:
        """Each host back on the release it ran before the candidate (`pdkit rollback`'s steps);
        the lines say what happened to each. The drain and restore are the candidate's (ROLLER: its
        workers as listed, its release); the gates, re-add and smoke are those of the spec restored
        (self.on_node): after a layout candidate the unified unit is gone and the PD pair is back
        (the lent H100, 2026-12-07: the candidate's `ready` watched the stopped unified unit)."""
        restored = self.prep.specs.get(self.on_node)
        back = roller if restored is None or restored is roller.spec else self.roller(self.on_node)
        if back is not roller:
            back.silencer, back.pyinfra = roller.silencer, roller.pyinfra
        out = []
        for h in reversed(hosts):
            if not before.get(h):
                out.append(f"{h}: no earlier release recorded: left as it is")
                continue
            steps = []
            roller.removed = []  # the last roll's drain is not this put-back's: nothing is out until it drains
            # silenced like `pdkit rollback`: from the drain to the smoke, expired either way (a
            # host the put-back left broken pages)
            with roller.silenced([h],
                                 "put back on its release before the candidate (drain, restore, gates, re-add, smoke)",
                                 done="back on its release, ready and in the router",
                                 failed="its put-back failed: expired, so whatever is still wrong pages") as silenced:
                try:
                    _, connected, unreachable = roller.pyinfra.connect([h])
                    if unreachable:
                        raise RuntimeError(f"cannot reach it over SSH: {unreachable[h]}")
                    for step, fn in (("drain", roller.drain),
                                     ("restore", lambda b: roller.restore(h, connected[h], before[h])),
                                     ("ready", back.ready), ("router", back.readd), ("smoke", back.smoke)):
                        start = time.monotonic()
                        handed = step == "router" and back is not roller
                        if handed:  # the outage the candidate's drain began ends at the restored spec's re-add
                            back.outage_since = roller.outage_since
                        message = fn([h])
                        if handed:
                            roller.outage_since, roller.last_outage_s = back.outage_since, back.last_outage_s
                        steps.append(step)
                        self.progress(h, step, message, time.monotonic() - start)
                    out.append(f"{h}: back on release {before[h]}")
                except Exception as exc:  # noqa: BLE001 - say it and go on with the other hosts
                    silenced.failed = True
                    self.progress(h, "FAILED", f"rollback: {exc}")
                    # any step failed (the drain included): what the drain took out goes back in
                    # the router if healthy (pdkit.roll's one put-back), and the line says so
                    recovery = roller.put_back_in_service([h])
                    where = router_state_words(None if recovery is None else recovery.back,
                                               None if recovery is None else recovery.left_out)
                    out.append(f"{h}: rollback FAILED after {', '.join(steps) or 'nothing'}: {exc}; {where}")
        return out

    # ---- gates
    def engine_urls(self, spec) -> dict[str, str]:
        return {f"{h.name}/{e.name}": flags.engine_url(spec, h, e) for h, e in spec.engines()}

    def ask(self) -> list[dict[str, Any]]:
        c = self.prep.campaign.correctness
        return answers.ask(self.prep.measured, {}, answers.prompts(c.prompts), c.max_new_tokens, c.concurrency)

    def answer_parts(self, spec, record: dict[str, Any], cand: Candidate | None) -> None:
        """The graded gate's parts (b) and (c) (pdkit/clients/answers.py): the baseline records its greedy
        continuations at the campaign's lengths (kept in the campaign's state, not in the records:
        prompt ids are long) and checks itself against them, the noise floor every candidate meets;
        a candidate is scored against the baseline's, exact or within the tolerance by its lever class."""
        cfg = self.prep.campaign.correctness.gate_config()
        target = engines_for(spec, self.prep.targets)  # the candidate's own engines (a layout lever changes them)
        path = self.paths["state"] / f"forced-{cfg.key()}.json"
        t = record["timings"]
        if cand is None:
            start = time.monotonic()
            recorded = answers.record_forced(target, cfg, context_cap(spec) or 1 << 30,
                                             say=lambda m: self.say("correct", m))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(recorded))
            t["forced_record_s"] = round(time.monotonic() - start, 2)
            for note in recorded["notes"]:
                self.say("correct", f"length left out: {note}")
        elif path.exists():
            recorded = json.loads(path.read_text())
        else:
            raise GateFailed("correctness", f"the baseline's forced continuations are not in {path}: run the campaign "
                                            "again without --resume")
        outcome = answers.run_parts(target, cfg, recorded, exact=bool(cand and cand.exact),
                                    say=lambda part, why, took: self.say(part, why, took),
                                    load_factory=lambda c: LoadThread(target, {}, c, cfg.load_input_len,
                                                                      answers.LOAD_OUTPUT_LEN, timeout_s=cfg.timeout_s))
        record["answer_gate"] = {**outcome.record, "exact": bool(cand and cand.exact),
                                 "tolerance": vars(cfg.tolerance)}
        for part, figures in outcome.record["parts"].items():
            t[f"{part}_s"] = figures["seconds"]
        record["gates"]["correctness"] = {"ok": outcome.ok, "detail": record["gates"]["correctness"]["detail"]
                                          + "; " + outcome.detail}
        if not outcome.ok:
            raise GateFailed("correctness", outcome.detail)

    def accuracy_part(self, spec, record: dict[str, Any], cand: Candidate | None) -> None:
        """The graded gate's part (d) (pdkit/clients/answers.py): sgl-eval on the target's endpoint (the router
        when it fronts exactly the target, else a target unified engine; a PD target measured on its
        own engines is skipped, said why). The baseline's score is kept in the campaign's state; a
        candidate fails on a drop beyond max_drop and the combined 95% interval."""
        acc = self.prep.campaign.correctness.gate_config().accuracy
        target = engines_for(spec, self.prep.targets)
        path = self.paths["state"] / f"accuracy-{acc.key()}.json"
        result = answers.eval_accuracy(target, acc, spec.cluster.model.name, self.paths["state"] / "eval")
        if "seconds" in result:
            record["timings"]["accuracy_s"] = result["seconds"]
        if cand is None:
            if result["problems"]:
                why = "accuracy: the baseline's eval cannot be judged: " + "; ".join(result["problems"])
                record["accuracy"] = {**result, "ok": False, "detail": why}
                raise GateFailed("correctness", why)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
            base = result
        elif path.exists():
            base = json.loads(path.read_text())
        else:
            raise GateFailed("correctness", f"the baseline's accuracy is not in {path}: run the campaign again "
                                            "without --resume")
        ok, why = answers.accuracy_check(base, result, acc)
        if cand is None and not result.get("skipped"):
            why = f"accuracy: baseline {result['score']:.3f} (95% CI {result['ci95'][0]:.3f}-{result['ci95'][1]:.3f})"
        record["accuracy"] = {**result, "ok": ok, "detail": why,
                              "baseline": {k: base.get(k) for k in ("score", "stderr", "ci95", "skipped")}}
        self.say("accuracy", why, result.get("seconds", 0.0))
        record["gates"]["correctness"] = {"ok": ok, "detail": record["gates"]["correctness"]["detail"] + "; " + why}
        if not ok:
            raise GateFailed("correctness", why)

    def run_gates(self, name: str, spec, record: dict[str, Any], baseline_answers: list[dict[str, Any]] | None,
                  cand: Candidate | None) -> None:
        """correctness, soak, doctor, bench, in that order; raises GateFailed at the first that fails."""
        # lazy: looked up per call, so tests/test_tune.py's stand-in for pdkit.doctor.run_doctor
        # (set on that module) is the one run
        from pdkit.doctor import FAIL, run_doctor

        c = self.prep.campaign
        t = record["timings"]
        start = time.monotonic()
        self.gate = "correctness"
        if baseline_answers is None:
            # the baseline against itself: an engine that is not deterministic at temperature 0 here
            # makes every candidate's match rate meaningless, so it is measured first
            first = self.ask()
            errors = [a["error"] for a in first if "error" in a]
            if errors:
                raise GateFailed("correctness", f"{len(errors)} baseline prompts failed: {errors[:2]}")
            record["answers"] = first
            baseline_answers, exact, threshold = first, False, c.correctness.min_match_rate
        elif cand is None:
            raise TypeError(f"run_gates({name!r}): baseline answers to compare with, but no candidate")
        else:
            exact, threshold = cand.exact, cand.min_match_rate
        comparison = answers.compare(baseline_answers, self.ask())
        ok, why = answers.correctness_verdict(comparison, threshold, exact)
        record["correctness"] = {**comparison, "threshold": threshold, "exact": exact, "verdict": why}
        t["correctness_s"] = round(time.monotonic() - start, 2)
        self.say("correct", why, t["correctness_s"])
        record["gates"]["correctness"] = {"ok": ok, "detail": why}
        if not ok:
            raise GateFailed("correctness", why)
        if c.correctness.lengths:
            start = time.monotonic()
            self.answer_parts(spec, record, cand)
            t["correctness_s"] = round(t["correctness_s"] + time.monotonic() - start, 2)
        if c.correctness.accuracy.enabled:
            start = time.monotonic()
            self.accuracy_part(spec, record, cand)
            t["correctness_s"] = round(t["correctness_s"] + time.monotonic() - start, 2)

        start = time.monotonic()
        self.gate = "soak"
        soak_c = c.soak.concurrency or self.prep.target_concurrency
        # the load goes to the target (prep.measured); every engine is watched: a lever on the target
        # may hurt the engines it pairs with
        ok, why, soak_figures = gates.soak(self.prep.measured, {}, self.engine_urls(spec), c.soak.seconds, soak_c,
                                           c.workload.input_len, c.soak.max_new_tokens, c.soak.wedge_window_s)
        t["soak_s"] = round(time.monotonic() - start, 2)
        record["soak"] = soak_figures
        record["gates"]["soak"] = {"ok": ok, "detail": why}
        self.say("soak", why, t["soak_s"])
        if not ok:
            raise GateFailed("soak", why)

        start = time.monotonic()
        self.gate = "doctor"
        results = run_doctor(spec, window_s=c.doctor.window_s, probe_requests=c.doctor.probe_requests)
        # throughput_c16 compares with docs/bench's last run: the campaign's own bench replaces it
        # a FAIL that reports the candidate's own plan (graphs off by its overlay) is the lever in effect
        failed = [r for r in results if r.status == FAIL and r.check != "throughput_c16" and not r.as_planned]
        t["doctor_s"] = round(time.monotonic() - start, 2)
        record["doctor"] = [r.to_dict() for r in results if r.status != "PASS"]
        if failed:
            why = "; ".join(f"{r.host}/{r.target} {r.check}: {r.reason}" for r in failed[:4])
            record["gates"]["doctor"] = {"ok": False, "detail": why}
            self.say("doctor", f"FAIL: {why}", t["doctor_s"])
            raise GateFailed("doctor", why)
        why = f"{sum(r.status == 'PASS' for r in results)} checks pass, no FAIL"
        record["gates"]["doctor"] = {"ok": True, "detail": why}
        self.say("doctor", why, t["doctor_s"])

        start = time.monotonic()
        self.gate = "bench"
        bench = self.bench(spec, f"tune {c.name} {name}")
        t["bench_s"] = round(time.monotonic() - start, 2)
        record["bench"] = bench
        self.check_bench(bench, record)
        figures = ", ".join(bench_figures(lv) for lv in bench["levels"])
        if cand is None:
            # the baseline again, back to back: each figure's spread is the band a candidate must clear
            repeats = c.noise.baseline_repeats
            self.say("bench", f"run 1/{repeats}: {figures}", t["bench_s"])
            record["bench_repeats"] = []
            began = time.monotonic()
            for i in range(2, repeats + 1):
                start = time.monotonic()
                again = self.bench(spec, f"tune {c.name} {name} run {i}/{repeats}")
                self.check_bench(again, record)
                record["bench_repeats"].append(again["levels"])
                self.say("bench", f"run {i}/{repeats}: " + ", ".join(bench_figures(lv) for lv in again["levels"]),
                         round(time.monotonic() - start, 2))
            t["bench_repeats_s"] = round(time.monotonic() - began, 2)
            spread = (noise_band([bench["levels"], *record["bench_repeats"]]).get(self.prep.target_concurrency)
                      or {}).get(c.objective.metric)
            figures = (f"{repeats} runs; {c.objective.metric} at C={self.prep.target_concurrency}: "
                       + (noise_describe(spread) if spread else "no figure"))
        record["gates"]["bench"] = {"ok": True, "detail": figures}
        self.say("bench", figures, t["bench_s"])

    def bench(self, spec, label: str) -> dict[str, Any]:
        """One bench of the campaign's workload on what prepare chose to measure."""
        # lazy: looked up per call, so tests/test_tune.py's stand-in for pdkit.bench.run_bench is the one run
        from pdkit.bench import run_bench

        c, measured = self.prep.campaign, self.prep.measured
        w = c.workload
        if self.prep.agentic is not None:
            # lazy: looked up per call, as run_bench above (tests/test_tune.py's stand-in)
            from pdkit.bench.agentic import run_agentic_bench

            return run_agentic_bench(spec, self.prep.agentic, concurrency=list(w.concurrency), warmup=w.warmup,
                                     label=label, progress=False, goodput_slo=c.objective.goodput_slo)
        return run_bench(spec, concurrency=list(w.concurrency), input_len=w.input_len, output_len=w.output_len,
                         requests=w.requests, warmup=w.warmup, label=label, progress=False, send=measured.stream,
                         measured=measured.describe(), goodput_slo=c.objective.goodput_slo)

    @staticmethod
    def check_bench(bench: dict[str, Any], record: dict[str, Any]) -> None:
        """A failed request fails the bench gate."""
        errors = {lv["concurrency"]: lv["errors"] for lv in bench["levels"] if lv["errors"]}
        if errors:
            why = f"requests failed at C={errors} ({[s for lv in bench['levels'] for s in lv['error_samples']][:2]})"
            record["gates"]["bench"] = {"ok": False, "detail": why}
            raise GateFailed("bench", why)

    def run_one(self, name: str, cand: Candidate | None,
                baseline_answers: list[dict[str, Any]] | None) -> dict[str, Any]:
        prep = self.prep
        spec = prep.specs[name]
        record: dict[str, Any] = {
            "schema": SCHEMA, "campaign": prep.campaign.name, "candidate": name,
            "kind": BASELINE if cand is None else "candidate", "origin": cand.origin if cand else BASELINE,
            "overlay": cand.overlay if cand else {}, "overlay_hash": cand.overlay_hash if cand else None,
            "inventory": prep.inventory, "target": prep.targets, "engine": spec.cluster.engine,
            "measured": prep.measured.describe(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "spec_diff": spec_diff(prep.base_spec, spec) if cand else {},
            "flag_diff": flag_diff(prep.base_spec, spec) if cand else [],
            "warnings": prep.warnings.get(name, []) if cand else [],
            "gates": {}, "timings": {},
        }
        self.say("start", f"{name}: " + (", ".join(f"{k}={v!r}" for k, v in cand.overlay.items()) if cand
                                         else "the inventory as it is"))
        roller = self.roller(name)
        rolled: list[str] = []
        before: dict[str, str | None] = {}
        start = time.monotonic()
        self.gate = "roll"
        # the baseline is the whole inventory: every host is rolled onto it (those already on it
        # stay serving); a candidate differs from it only on the targets
        hosts = [h.name for h in spec.hosts] if cand is None else prep.targets
        try:
            before = self.releases(roller, hosts)
            record["releases_before"] = before
            restarts = self.roll(roller, rolled, hosts)
            record["timings"].update(roll_s=round(time.monotonic() - start, 2), restarts=restarts)
            outages = [t.outage_s for t in roller.timings if t.outage_s is not None]
            if outages:
                record["timings"]["outage_s"] = round(sum(outages), 2)
            # each restarted engine's restart-to-ready and SGLang's own start-up phases
            # (pdkit.agent.health.startup_phases)
            phases = {t.host: t.engine_phases for t in roller.timings if t.engine_phases}
            if phases:
                record["timings"]["engine_phases"] = phases
            record["gates"]["roll"] = {"ok": True, "detail": f"{restarts} host(s) changed and passed drain, apply, "
                                                             "ready, router, smoke"}
            self.run_gates(name, spec, record, baseline_answers, cand)
            record.update(verdict="pass", failed_gate=None, reason="")
            self.on_node = name
        except Exception as exc:  # noqa: BLE001 - any failure fails the candidate at its gate and is rolled back
            if isinstance(exc, GateFailed):
                gate, why = exc.gate, exc.why
            elif isinstance(exc, RollError):
                gate, why = "roll", str(exc)
            else:
                gate, why = self.gate, f"{type(exc).__name__}: {exc}"
            record["gates"].setdefault(gate, {"ok": False, "detail": why})
            record.update(verdict="fail", failed_gate=gate, reason=why)
            self.say("FAILED", f"{name}: gate {gate}: {why}")
            # the batch whose roll gate failed was put back by the roll itself; the hosts rolled
            # before it (and every host, when a later gate failed) go back here
            if roller.last_outage_s is not None:  # a failed roll's own restore ended an outage too
                record["timings"].setdefault("outage_s", round(roller.last_outage_s, 2))
            roller.last_outage_s = None
            record["rollback"] = (self.put_back(roller, rolled, before) if rolled
                                  else ["the roll put the failed node back on its release"])
            if roller.last_outage_s is not None:
                record["timings"]["rollback_outage_s"] = round(roller.last_outage_s, 2)
        try:
            record["releases_after"] = self.releases(roller, prep.targets)
        except RollError as exc:
            record["releases_after"] = {"error": str(exc)}
        # the Alertmanager silences of this candidate's rolls and put-backs (pdkit/hosts/silences.py)
        record["silences"] = roller.silencer.records
        record["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        return record

    def remeasure(self) -> None:
        """The baseline rolled back onto the targets and benched once more (campaign.noise.remeasure_at_end):
        drift over the campaign then widens the band. A failure here leaves the band as it was."""
        prep = self.prep
        record: dict[str, Any] = {"schema": SCHEMA, "campaign": prep.campaign.name, "candidate": BASELINE,
                                  "kind": REMEASURE, "started": datetime.now(UTC).isoformat(timespec="seconds"),
                                  "timings": {}}
        self.say("remeasure", "the baseline back on the targets, benched once more for the band")
        roller = self.roller(BASELINE)
        start = time.monotonic()
        try:
            record["timings"]["restarts"] = self.roll(roller, [])
            record["timings"]["roll_s"] = round(time.monotonic() - start, 2)
            start = time.monotonic()
            bench = self.bench(prep.specs[BASELINE], f"tune {prep.campaign.name} baseline remeasured")
            record["timings"]["bench_s"] = round(time.monotonic() - start, 2)
            self.check_bench(bench, {"gates": {}})
        except (RollError, GateFailed) as exc:
            record.update(verdict="fail", reason=str(exc))
            self.say("remeasure", f"FAILED, the band stays the start's: {exc}")
        else:
            record.update(verdict="pass", bench=bench)
            self.say("remeasure", ", ".join(bench_figures(lv) for lv in bench["levels"]), record["timings"]["bench_s"])
        record["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        self.finish(record)

    def finish(self, record: dict[str, Any]) -> None:
        append_record(self.paths["records"], record)
        self.records.append(record)
        pending = [c.name for c in self.prep.candidates if c.name not in {r["candidate"] for r in self.records}]
        write_report(self.prep.campaign, self.records, self.prep.target_concurrency, pending)


class GateFailed(Exception):
    def __init__(self, gate: str, why: str) -> None:
        super().__init__(f"{gate}: {why}")
        self.gate, self.why = gate, why


def run_campaign(prep: Prepared, records: list[dict[str, Any]], todo: list[Candidate],
                 done: dict[str, dict[str, Any]]) -> int:
    session = Session(prep, records)

    def on_signal(signum, _frame) -> None:
        if session.stop_requested:
            raise KeyboardInterrupt
        session.stop_requested = True
        session.say("signal", f"{signal.Signals(signum).name}: stopping after the current candidate "
                    "(again to stop at once); `--resume` continues")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        base = done.get(BASELINE)
        if base is None:
            base = session.run_one(BASELINE, None, None)
            session.finish(base)
            if base["verdict"] != "pass":
                session.say("stop", f"the baseline failed gate {base['failed_gate']}: nothing to compare candidates "
                            "with")
                return EXIT_FAILED
        elif base["verdict"] != "pass":
            session.say("stop", "the recorded baseline failed: start a new campaign once the cluster is fixed")
            return EXIT_FAILED
        baseline_answers = base["answers"]
        for cand in todo:
            if session.stop_requested:
                session.say("stop", f"interrupted before {cand.name}; records and report are up to date; run again "
                            "with --resume")
                return EXIT_INTERRUPTED
            session.finish(session.run_one(cand.name, cand, baseline_answers))
        return end(session)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def end(session: Session) -> int:
    prep = session.prep
    c = prep.campaign
    if c.noise.remeasure_at_end and any(r.get("kind") == "candidate" and r["verdict"] == "pass"
                                        for r in session.records):
        session.remeasure()
    ranked = rank_by(session.records, prep.target_concurrency, c.objective, c.noise.margin)
    kept, why = choose_kept(c.keep, ranked, session.records)
    session.say("keep", f"{kept}: {why}")
    roller = session.roller(kept)
    rolled: list[str] = []
    try:
        session.roll(roller, rolled)
    except RollError as exc:
        session.say("FAILED", f"leaving {kept} applied: {exc}")
        return EXIT_FAILED
    engine_hosts = [h.name for h in prep.base_spec.gpu_hosts if h.node is not None and h.node.engines]
    cand = next((x for x in prep.candidates if x.name == kept), None)
    fields = keep_lines(cand, prep.applied[kept], engine_hosts) if cand else []
    record = {"schema": SCHEMA, "campaign": c.name, "kind": "end", "candidate": kept, "reason": why,
              "keep_fields": fields,
              "releases_after": session.releases(roller, prep.targets), "silences": roller.silencer.records,
              "finished": datetime.now(UTC).isoformat(timespec="seconds")}
    session.finish(record)
    print(f"\npdkit tune: {c.name}: left applied: {kept} ({why})")
    if fields:
        print(f"to keep it, set in {prep.inventory} (pdkit tune never edits it):")
        for line in fields:
            print(f"  {line}")
    else:
        print("the inventory already describes it: nothing to change")
    print(f"report: {session.paths['markdown']}  records: {session.paths['records']}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    patch_gevent()
    try:
        prep = prepare(args.inventory, args.campaign)
    except CampaignError as exc:
        print(f"pdkit tune: {exc.path}: {len(exc.problems)} problem(s); no host was contacted:", file=sys.stderr)
        for p in exc.problems:
            print(f"  error   {p}", file=sys.stderr)
        return EXIT_INVALID
    try:
        records = load_records(paths(prep.campaign)["records"])
        done, todo = resume_plan(prep.candidates, records, args.resume or args.dry, prep.campaign.name)
        why = measured_problem(prep.measured, [r for r in records if r.get("campaign") == prep.campaign.name])
        if why:
            raise ResumeError(why)
    except ResumeError as exc:
        print(f"pdkit tune: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.dry:
        print(dry_text(prep, records, todo))
        return 0
    return run_campaign(prep, records, todo, done)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help="run a lever campaign: per candidate roll, correctness, soak, doctor, "
                              "bench; keep the best")
    p.add_argument("inventory")
    p.add_argument("campaign", help="campaign file (.yaml or .py; docs/tune.md)")
    p.add_argument("--dry", action="store_true", help="print the candidates, their flag diffs and a time estimate; "
                   "change nothing")
    p.add_argument("--resume", action="store_true", help="continue an interrupted campaign from its records")
    p.set_defaults(func=cmd_tune)
