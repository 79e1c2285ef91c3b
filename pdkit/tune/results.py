"""Campaign results, written as they come in: records, ranking, the report, the plot, resume.

Pure functions over record dicts (one JSONL line per candidate, appended the moment it
finishes); the runner calls `write_report` after every record.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# the same number formatting as pdkit bench's tables
from pdkit.bench import describe_measured, fmt_cell, render_plot
from pdkit.bench.noise import DEFAULT_MARGIN, band, judge, spread_of
from pdkit.tune.campaign import BASELINE, GOODPUT, OBJECTIVE_METRICS, Campaign, Candidate, Objective

SCHEMA = 1
# gate order of one candidate; a record's failed_gate is one of these
GATES = ("roll", "correctness", "soak", "doctor", "bench")
# What an unmeasured restart or bench is assumed to take in an estimate (seconds), until records
# of this campaign measured them; the estimate says which figures were assumed.
ASSUMED_ROLL_S = 60.0
ASSUMED_REQUEST_S = 0.5
# one accuracy eval (answer gate part (d)) until the campaign has measured one: 30 AIME problems at a few
# thousand tokens each, 16 at a time, on one engine
ASSUMED_EVAL_S = 300.0


class ResumeError(ValueError):
    pass


def paths(campaign: Campaign) -> dict[str, Path]:
    out = Path(campaign.out_dir)
    return {"records": out / f"{campaign.name}.jsonl", "markdown": out / f"{campaign.name}.md",
            "plot": out / f"{campaign.name}.png", "state": Path(campaign.state_dir) / campaign.name}


def load_records(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            # a line cut by an interruption mid-write: everything before it stands
            raise ResumeError(f"{p}:{i}: not a JSON record (cut short?): remove that line and run again with "
                              "--resume") from None
    return out


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()


def resume_plan(candidates: Sequence[Candidate], records: Sequence[dict[str, Any]], resume: bool,
                campaign: str) -> tuple[dict[str, dict[str, Any]], list[Candidate]]:
    """(finished records by candidate name, baseline included; candidates still to run).

    Without --resume, existing records stop the run (results are never mixed silently); with it,
    a record whose overlay no longer matches the campaign's candidate stops it too.
    """
    mine = [r for r in records if r.get("campaign") == campaign]
    if mine and not resume:
        raise ResumeError(f"campaign {campaign!r} already has {len(mine)} record(s): pass --resume to continue it, "
                          "or move its records file away to start again")
    done: dict[str, dict[str, Any]] = {}
    by_name = {c.name: c for c in candidates}
    for r in mine:
        if r.get("kind") not in ("baseline", "candidate"):
            continue  # the end-of-campaign record: what was left applied last time
        name = r["candidate"]
        if name != BASELINE:
            c = by_name.get(name)
            if c is None:
                raise ResumeError(f"the records hold candidate {name!r}, which the campaign no longer defines: "
                                  "restore it in the campaign or start a new campaign (another name)")
            if r.get("overlay_hash") != c.overlay_hash:
                raise ResumeError(f"candidate {name!r} changed since it was recorded ({r.get('overlay')} -> "
                                  f"{c.overlay}): give the changed candidate a new name")
        done[name] = r
    if done and BASELINE not in done:
        raise ResumeError("the records have candidates but no baseline: the campaign cannot compare them; start a new "
                          "campaign")
    return done, [c for c in candidates if c.name not in done]


def level(record: dict[str, Any], concurrency: int) -> dict[str, Any] | None:
    bench = record.get("bench") or {}
    return next((lv for lv in bench.get("levels") or [] if lv.get("concurrency") == concurrency), None)


def _level_figure(lv: dict[str, Any], metric: str, goodput_slo: dict[str, float] | None) -> Any:
    """The objective's figure of one bench level (campaign.OBJECTIVE_METRICS)."""
    if metric in ("ttft_p50_ms", "ttft_p99_ms"):
        return (lv.get("ttft_ms") or {}).get(metric.removeprefix("ttft_").removesuffix("_ms"))
    if metric == GOODPUT:
        g = lv.get("goodput") or {}
        # goodput judged by other SLOs (a resumed campaign whose SLOs changed) is not this objective's
        if goodput_slo is not None and g.get("slo_ms") != goodput_slo:
            return None
        return g.get("requests_s")
    return lv.get(metric)


def objective_value(record: dict[str, Any], concurrency: int, metric: str,
                    goodput_slo: dict[str, float] | None = None) -> float | None:
    lv = level(record, concurrency)
    value = _level_figure(lv, metric, goodput_slo) if lv else None
    return float(value) if isinstance(value, (int, float)) else None


def tpot_p99(record: dict[str, Any], concurrency: int) -> float | None:
    lv = level(record, concurrency)
    value = (lv or {}).get("tpot_ms", {}).get("p99")
    return float(value) if isinstance(value, (int, float)) else None


# a record of the baseline benched again after the last candidate (campaign.noise.remeasure_at_end)
REMEASURE = "remeasure"


def baseline_runs(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every bench of the passed baseline, as `levels` lists: its bench, its repeats, the remeasure at the end."""
    base = next((r for r in records if r.get("kind") == BASELINE and r.get("verdict") == "pass"), None)
    if base is None or not (base.get("bench") or {}).get("levels"):
        return []
    runs = [base["bench"]["levels"], *(base.get("bench_repeats") or [])]
    runs += [r["bench"]["levels"] for r in records
             if r.get("kind") == REMEASURE and (r.get("bench") or {}).get("levels")]
    return runs


def baseline_band(records: Sequence[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """The baseline's spread per level and figure (pdkit.bench.noise.band over baseline_runs)."""
    return band(baseline_runs(records))


def objective_reference(records: Sequence[dict[str, Any]], concurrency: int, metric: str,
                        goodput_slo: dict[str, float] | None = None) -> dict[str, Any] | None:
    """The baseline's objective figure at CONCURRENCY over all its runs: values, median, spread (None: no figure)."""
    values = []
    for levels in baseline_runs(records):
        lv = next((x for x in levels if x.get("concurrency") == concurrency), None)
        value = _level_figure(lv, metric, goodput_slo) if lv else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    if not values:
        return None
    return {"values": values, "median": statistics.median(values), "spread": spread_of(values), "runs": len(values)}


def rank(records: Sequence[dict[str, Any]], concurrency: int, metric: str,
         slo_ms: float | None = None, goodput_slo: dict[str, float] | None = None,
         margin: float = DEFAULT_MARGIN) -> list[dict[str, Any]]:
    """Passed records best first: within the TPOT p99 SLO (when set) before those over it, then
    by the objective (higher first; lower first for TTFT; no figure last). Rows carry value, ratio
    to the baseline's median, the SLO verdict and `noise`: the candidate's gain judged against the
    baseline's band + MARGIN (pdkit.bench.noise.judge; the baseline's own row: its band).
    GOODPUT_SLO: the SLOs a goodput figure must have been judged by."""
    reference = objective_reference(records, concurrency, metric, goodput_slo)
    base_value = reference["median"] if reference else None
    higher = OBJECTIVE_METRICS[metric]
    rows = []
    for r in records:
        if r.get("kind") not in ("baseline", "candidate") or r["verdict"] != "pass":
            continue
        is_base = r["candidate"] == BASELINE
        value = base_value if is_base else objective_value(r, concurrency, metric, goodput_slo)
        p99 = tpot_p99(r, concurrency)
        within = slo_ms is None or (p99 is not None and p99 <= slo_ms)
        noise = ({"gain": 0.0, "spread": reference.get("spread") if reference else None, "margin": margin,
                  "beyond": None, "why": "the baseline: its median over its runs"} if is_base
                 else judge(reference, value, higher, margin))
        rows.append({"candidate": r["candidate"], "value": value, "tpot_p99_ms": p99, "within_slo": within,
                     "ratio": (value / base_value) if value is not None and base_value else None, "noise": noise,
                     "record": r})
    rows.sort(key=lambda row: (not row["within_slo"], row["value"] is None,
                               0.0 if row["value"] is None else (-row["value"] if higher else row["value"])))
    return rows


def rank_by(records: Sequence[dict[str, Any]], concurrency: int, objective: Objective,
            margin: float = DEFAULT_MARGIN) -> list[dict[str, Any]]:
    """rank() with a campaign's objective."""
    return rank(records, concurrency, objective.metric, objective.tpot_p99_slo_ms, objective.goodput_slo, margin)


def choose_kept(keep: str, ranked: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """(candidate to leave applied, why). `best`: the top-ranked candidate within the TPOT SLO whose
    gain clears the baseline's band + margin; when none does, the baseline, and the reason says "no
    candidate beat the noise". A named candidate that failed falls back to the baseline, and says so."""
    if keep == "best":
        candidates = [row for row in ranked if row["candidate"] != BASELINE]
        if not candidates:
            return BASELINE, "no candidate passed every gate: the baseline is restored"
        winners = [row for row in candidates if row["within_slo"] and row["noise"].get("beyond") is True]
        if not winners:
            top = candidates[0]
            return BASELINE, (f"no candidate beat the noise: the best, {top['candidate']}, "
                              f"{top['noise'].get('why') or 'could not be judged'}; the baseline is kept")
        top = winners[0]
        return top["candidate"], (f"best by the objective ({top['value']} at the target concurrency): "
                                  f"{top['noise']['why']}")
    if keep == BASELINE:
        return BASELINE, "keep: baseline"
    named = [r for r in records if r.get("kind") == "candidate" and (r["candidate"] == keep or r.get("origin") == keep)]
    passed = [r for r in named if r["verdict"] == "pass"]
    if passed:
        best = [row for row in ranked if row["candidate"] in {r["candidate"] for r in passed}]
        why = best[0]["noise"].get("why")
        return best[0]["candidate"], f"keep: {keep}" + (f" ({why})" if why else "")
    return BASELINE, f"keep: {keep}, but it did not pass every gate: the baseline is restored"


def estimate(n_candidates: int, restarts_per_candidate: int, campaign: Campaign,
             records: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Seconds the campaign should take: restarts x measured ready time + bench, soak, correctness.

    Measured figures come from this campaign's records (a resumed or repeated campaign); without
    them the roll and per-request times are assumptions and the estimate says so."""
    rolls = [r["timings"]["roll_s"] / max(1, r["timings"].get("restarts", 1))
             for r in records if (r.get("timings") or {}).get("roll_s") and (r.get("timings") or {}).get("restarts")]
    benches = [r["timings"]["bench_s"] for r in records if (r.get("timings") or {}).get("bench_s")]
    roll_s = sum(rolls) / len(rolls) if rolls else ASSUMED_ROLL_S
    w = campaign.workload
    if w.agentic is not None:  # every turn a request, each session's think time between its turns
        a = w.agentic
        per_level = a.sessions * a.turns * ASSUMED_REQUEST_S / 4 + a.turns * a.think_s
        assumed = per_level * len(w.concurrency) + ASSUMED_REQUEST_S * w.warmup
    else:
        assumed = ASSUMED_REQUEST_S * (w.requests * len(w.concurrency) + w.warmup)
    bench_s = (sum(benches) / len(benches)) if benches else assumed
    per = {
        "roll_s": restarts_per_candidate * roll_s,
        "correctness_s": 2 * campaign.correctness.prompts / campaign.correctness.concurrency * ASSUMED_REQUEST_S,
        "soak_s": campaign.soak.seconds,
        "doctor_s": campaign.doctor.window_s,
        "bench_s": bench_s,
    }
    if campaign.correctness.accuracy.enabled:  # part (d): this campaign's measured evals, else an assumption
        evals = [r["timings"]["accuracy_s"] for r in records if (r.get("timings") or {}).get("accuracy_s")]
        per["accuracy_s"] = sum(evals) / len(evals) if evals else ASSUMED_EVAL_S
    each = sum(per.values())
    # the band: the baseline's extra benches (when the baseline is still to run), and the
    # remeasure at the end (a roll of the targets back onto the baseline, then a bench)
    noise = campaign.noise
    baseline_todo = not any(r.get("kind") == BASELINE for r in records)
    noise_s = (bench_s * (noise.baseline_repeats - 1) if baseline_todo else 0.0)
    noise_s += (restarts_per_candidate * roll_s + bench_s) if noise.remeasure_at_end else 0.0
    return {"total_s": round(each * n_candidates + noise_s, 1),
            "per_candidate": {k: round(v, 1) for k, v in per.items()}, "noise_s": round(noise_s, 1),
            "measured": {"roll": bool(rolls), "bench": bool(benches)}, "candidates": n_candidates}


def _overlay_text(overlay: dict[str, Any]) -> str:
    return ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in overlay.items()) or "(the inventory as it is)"


def workload_text(w) -> str:
    """The campaign's workload in words (the report's header, --dry)."""
    if w.agentic is None:
        return f"workload input {w.input_len} / output {w.output_len} tokens, {w.requests} requests per level"
    a = w.agentic
    if a.trace is not None:
        return (f"agentic workload: {a.sessions} sessions per level from the trace {a.trace}"
                f"{f' (cut to {a.max_turns} turns)' if a.max_turns else ''}, replies {a.reply_tokens} tokens, "
                f"think {a.think_s:g} s")
    return (f"agentic workload: {a.sessions} fresh sessions x {a.turns} turns per level (system {a.system_tokens} "
            f"tokens shared, +{a.turn_tokens} per turn, replies {a.reply_tokens} tokens, think {a.think_s:g} s)")


def render_markdown(campaign: Campaign, records: Sequence[dict[str, Any]], concurrency: int,
                    plot_name: str | None, pending: Sequence[str] = ()) -> str:
    """docs/tune/<campaign>.md: the ranking, the failed candidates with their reasons, the diffs."""
    metric = campaign.objective.metric
    ranked = rank_by(records, concurrency, campaign.objective, campaign.noise.margin)
    first = records[0] if records else {}
    engine = (((first.get("bench") or {}).get("env")) or {}).get("engine", first.get("engine", "?"))
    w = campaign.workload
    lines = [
        f"# pdkit tune: {campaign.name}",
        "",
        f"Inventory `{first.get('inventory', campaign.inventory or '?')}`, target "
        f"{', '.join(first.get('target') or []) or campaign.target}; "
        f"{workload_text(w)} at C={', '.join(map(str, w.concurrency))}; "
        f"objective `{metric}` at C={concurrency} {campaign.objective.describe()}.",
        "",
    ]
    if first.get("measured"):
        lines += [f"Correctness, soak and bench measured {describe_measured(first['measured'])}.", ""]
    if engine == "sim":
        lines += ["**Engine `sim`: a rehearsal. These figures describe the sim's step formula, never SGLang, a GPU or "
                  "a model.**", ""]
    lines += [f"| rank | candidate | overlay | {metric} @C={concurrency} | x baseline | beyond the noise? "
              "| TPOT p99 ms | KV share of TTFT | match rate | verdict |",
              "|---:|---|---|---:|---:|---|---:|---:|---:|---|"]
    for i, row in enumerate(ranked, 1):
        r = row["record"]
        verdict = "pass" + ("" if row["within_slo"] else " (over the TPOT SLO)")
        # the level's KV hand-off latency mean / its TTFT mean (pdkit bench's kv block; – without one)
        share = ((level(r, concurrency) or {}).get("kv") or {}).get("ttft_share")
        lines.append(f"| {i} | {r['candidate']} | {_overlay_text(r.get('overlay') or {})} | {fmt_cell(row['value'])} | "
                     f"{fmt_cell(row['ratio'], 3)} | {_noise_cell(row)} | {fmt_cell(row['tpot_p99_ms'])} | "
                     f"{'–' if share is None else f'{share:.0%}'} | "
                     f"{fmt_cell((r.get('correctness') or {}).get('match_rate'), 3)} | {verdict} |")
    lines += _band_section(records, campaign)
    failed = [r for r in records if r.get("kind") in ("baseline", "candidate") and r["verdict"] != "pass"]
    if failed:
        lines += ["", "## Failed (rolled back to the release before them)", "",
                  "| candidate | overlay | gate | reason |", "|---|---|---|---|"]
        for r in failed:
            reason = str(r.get("reason", "")).replace("|", "\\|").replace("\n", " ")[:400]
            lines.append(f"| {r['candidate']} | {_overlay_text(r.get('overlay') or {})} | {r.get('failed_gate')} | "
                         f"{reason} |")
    if pending:
        lines += ["", "Not run yet: " + ", ".join(pending) + " (`pdkit tune ... --resume` continues)."]
    if plot_name and any(r.get("bench") for r in records):
        lines += ["", f"![output tok/s and TPOT against concurrency per candidate]({plot_name})"]
    lines += ["", "## Flags against the baseline", ""]
    for r in records:
        if r.get("kind") != "candidate":
            continue
        diff = r.get("flag_diff") or []
        lines.append(f"- **{r['candidate']}**: " + ("; ".join(diff) if diff
                                                    else "no engine flag changes (environment or node settings only)"))
        # validate's warnings the baseline has not: an experimental lever says so where it is ranked
        lines += [f"  - warning: {w}" for w in r.get("warnings") or []]
    kept = next((r for r in reversed(records) if r.get("kind") == "end"), None)
    if kept:
        lines += ["", f"## Left applied: {kept['candidate']}", "", kept.get("reason", ""), ""]
        lines += [f"    {line}" for line in kept.get("keep_fields") or ["(the inventory as it is: nothing to change)"]]
    return "\n".join(lines) + "\n"


def _noise_cell(row: dict[str, Any]) -> str:
    """The ranking's noise column: the gain against spread + margin, and the verdict."""
    n = row["noise"]
    if row["candidate"] == BASELINE:
        return "(the band)" if n.get("spread") is not None else "(1 run: no band)"
    if n.get("gain") is None:
        return "–"
    if n.get("spread") is None:
        return f"{n['gain']:+.1%}, no band to judge by"
    return f"{n['gain']:+.1%} vs {n['spread']:.1%} + {n['margin']:.1%}: {'yes' if n['beyond'] else 'no'}"


def _band_section(records: Sequence[dict[str, Any]], campaign: Campaign) -> list[str]:
    """The baseline's spread per level and figure: what a candidate's gain must clear."""
    bands = baseline_band(records)
    if not bands:
        return []
    runs = len(baseline_runs(records))
    lines = ["", f"## The baseline's spread ({runs} runs)", "",
             f"Each figure's median over the baseline's runs and its spread, (max - min) / median. A candidate is "
             f"kept (`keep: best`) only when its gain on the objective exceeds the spread + {campaign.noise.margin:.1%}"
             " (`noise.margin`); otherwise the baseline is kept and the line above says \"no candidate beat the "
             "noise\" (pdkit/bench/noise.py).", "",
             "| C | figure | runs | median | spread |", "|---:|---|---|---:|---:|"]
    for c, figures in sorted(bands.items()):
        for name, entry in figures.items():
            values = ", ".join(f"{v:.1f}" for v in entry["values"])
            spread = "–" if entry["spread"] is None else f"{entry['spread']:.1%}"
            lines.append(f"| {c} | {name} | {values} | {entry['median']:.1f} | {spread} |")
    return lines


def bench_records_for_plot(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates' bench records labelled with their names, for pdkit.bench.render_plot."""
    out = []
    for r in records:
        bench = r.get("bench")
        if r.get("kind") in ("baseline", "candidate") and bench and bench.get("levels"):
            out.append({**bench, "label": r["candidate"]})
    return out


def write_report(campaign: Campaign, records: Sequence[dict[str, Any]], concurrency: int,
                 pending: Sequence[str] = ()) -> list[Path]:
    """Regenerate the markdown (and the PNG when there is a bench to plot)."""
    p = paths(campaign)
    p["markdown"].parent.mkdir(parents=True, exist_ok=True)
    plotted = bench_records_for_plot(records)
    written = []
    if plotted and importlib.util.find_spec("matplotlib") is None:
        # a control machine without matplotlib (the GPU tier's venv) still gets its records and table
        print(f"pdkit tune: no matplotlib here: {p['plot']} not drawn (pip install matplotlib, then --resume redraws "
              "it)", file=sys.stderr)
        plotted = []
    if plotted:
        render_plot(plotted, p["plot"])
        written.append(p["plot"])
    p["markdown"].write_text(render_markdown(campaign, records, concurrency, p["plot"].name if plotted else None,
                                             pending))
    written.insert(0, p["markdown"])
    return written
