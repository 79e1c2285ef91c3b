"""A bench record shown: its markdown table (with the KV hand-off and goodput lines), its PNG, the
files a run writes, and `pdkit compare`'s A / B / ratio table of two records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdkit.agent.changes import keyed_changes
from pdkit.bench import noise
from pdkit.bench.record import NO_PD_HANDOFF, RUNS_FILE, append_run
from pdkit.bench.stats import ratio

# ---- one run ---------------------------------------------------------------------------------

def fmt_cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


# the per-level figures, as the run table and `pdkit compare` show them
METRICS = (
    ("output tok/s", lambda lv: lv["output_tok_s"]),
    ("req/s", lambda lv: lv["requests_s"]),
    ("TTFT p50 ms", lambda lv: lv["ttft_ms"]["p50"]),
    ("TTFT p99 ms", lambda lv: lv["ttft_ms"]["p99"]),
    ("TPOT p50 ms", lambda lv: lv["tpot_ms"]["p50"]),
    ("TPOT p99 ms", lambda lv: lv["tpot_ms"]["p99"]),
    ("ITL p50 ms", lambda lv: lv["itl_ms"]["p50"]),
    ("ITL p99 ms", lambda lv: lv["itl_ms"]["p99"]),
)
ERRORS = ("errors", lambda lv: lv["errors"])
LEVEL_COLUMNS = (
    ("C", lambda lv: lv["concurrency"]),
    ("requests", lambda lv: lv["requests"]),
    ERRORS,
    *METRICS,
)


# The KV hand-off figures of a level (its `kv` block: pdkit.spec.kvcost.KvFigures), as the run table and
# `pdkit compare` show them: (column, key in the block)
KV_COLUMNS = (
    ("KV transfers", "transfers"),
    ("KV MB/request", "mb_per_request"),
    ("KV latency mean ms", "latency_mean_ms"),
    ("KV latency p99 ms", "latency_p99_ms"),
    ("KV effective GB/s", "effective_gb_s"),
    ("SGLang speed mean GB/s", "sglang_speed_mean_gb_s"),
    ("KV share of TTFT", "ttft_share"),
)


def kv_text(kv: dict[str, Any], key: str) -> str:
    """One KV figure as shown: p99 past SGLang's top bucket as ">5000" (a floor), the share in %."""
    value = kv.get(key)
    if key == "latency_p99_ms" and value is not None and kv.get("latency_p99_above_buckets"):
        return f">{value:g}"
    if key == "ttft_share" and value is not None:
        return f"{value:.0%}"
    return fmt_cell(value, 2 if key.endswith("gb_s") else 1)


def kv_has_figures(level: dict[str, Any]) -> bool:
    return "transfers" in (level.get("kv") or {})


def render_kv(record: dict[str, Any]) -> list[str]:
    """The run's KV hand-off section: a table per level from the prefills' histograms; "no PD
    hand-off" for unified engines; nothing for a record from before KV figures."""
    if "kv_prefills" not in record:
        return []
    if not record["kv_prefills"]:
        return ["", f"KV hand-off: none to measure ({NO_PD_HANDOFF})."]
    lines = ["", f"KV hand-off per level, from the prefills' own histograms ({', '.join(record['kv_prefills'])}): "
                 "effective GB/s = MiB moved / 1024 / seconds spent moving them (a ratio of sums, queueing "
                 "included); SGLang's speed mean is its histogram's mean of per-request ratios; MB is MiB; "
                 "share of TTFT = KV latency mean / the level's client-side TTFT mean.", "",
             "| C | " + " | ".join(name for name, _ in KV_COLUMNS) + " |",
             "|---:|" + "|".join("---:" for _ in KV_COLUMNS) + "|"]
    notes = []
    for level in record["levels"]:
        kv = level.get("kv") or {}
        if kv_has_figures(level):
            cells = [kv_text(kv, key) for _, key in KV_COLUMNS]
        else:
            cells = ["not read"] + ["–"] * (len(KV_COLUMNS) - 1)
        lines.append(f"| {level['concurrency']} | " + " | ".join(cells) + " |")
        if kv.get("unread"):
            scope = f"figures from {', '.join(kv['prefills'])} only" if kv.get("prefills") else "no figures"
            notes.append(f"- C={level['concurrency']}: /metrics not read ({scope}): "
                         + "; ".join(f"{label}: {why}" for label, why in kv["unread"].items()))
        if kv.get("warmup_included"):
            notes.append(f"- C={level['concurrency']}: the window includes the run's {kv['warmup_included']} warm-up "
                         "request(s)")
    return lines + ([""] + notes if notes else [])


def render_spread(record: dict[str, Any]) -> list[str]:
    """A record benched more than once (`pdkit bench --repeats`): each figure's median and spread per level."""
    runs = noise.record_runs(record)
    if len(runs) < 2:
        return []
    lines = ["", f"Benched {len(runs)} times (--repeats {len(runs)}): the table is run 1; per level, each figure's "
                 "median and spread ((max - min) / median) over the runs (`pdkit compare` judges a B against it):"]
    for c, figures in noise.band(runs).items():
        lines.append(f"- C={c}: " + "; ".join(f"{label} {noise.describe(figures.get(name))}"
                                             for label, name in noise.REPORT_LABELS.items() if figures.get(name)))
    return lines


def render_goodput(record: dict[str, Any]) -> list[str]:
    """One line per level that recorded goodput (pdkit.bench.stats.goodput)."""
    lines = []
    for level in record["levels"]:
        g = level.get("goodput")
        if g:
            slo = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in g["slo_ms"].items())
            lines.append(f"- C={level['concurrency']} goodput: {fmt_cell(g['requests_s'], 2)} req/s met {slo} "
                         f"({g['good']} of {level['requests']} requests)")
    return [""] + lines if lines else []


# ---- the agentic workload ------------------------------------------------------------------------

def is_agentic(record: dict[str, Any]) -> bool:
    return (record.get("workload") or {}).get("kind") == "agentic"


def hit_rate(level: dict[str, Any]) -> float | None:
    """The level's prefix-cache hit rate from the engines' counters (None: not read or nothing counted)."""
    return (level.get("prefix_cache") or {}).get("hit_rate")


def kv_mb_per_turn(level: dict[str, Any]) -> float | None:
    """MiB handed off per turn: the level's KV MiB per transfer (a turn is one request, one hand-off)."""
    return (level.get("kv") or {}).get("mb_per_request")


# the agentic columns of the run table and `pdkit compare`
AGENTIC_METRICS = (
    ("prefix hit", hit_rate),
    ("KV MB/turn", kv_mb_per_turn),
)


# per turn-depth bucket, what `pdkit compare` shows: (key, name, percentile)
DEPTH_COMPARED = (("ttft_ms", "TTFT", "p50"), ("ttft_ms", "TTFT", "p99"), ("tpot_ms", "TPOT", "p50"))


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def describe_workload(record: dict[str, Any]) -> str:
    """What was sent, in words: fixed lengths, or the agentic sessions and their source."""
    w = record.get("workload") or {"kind": "fixed"}
    if w.get("kind") != "agentic":
        return (f"input {record['input_len']} tokens, output {record['output_len']} tokens, {record['requests']} "
                f"requests per level after {record['warmup']} warm-up requests")
    if w.get("source") == "generated":
        p = w.get("params") or {}
        source = (f"generated (seed {p.get('seed')}): system prompt {p.get('system_tokens')} tokens shared by every "
                  f"session, +{p.get('turn_tokens')} tokens per turn")
    else:
        source = f"trace `{w.get('trace')}`" + (f", at most {w['max_turns']} turns" if w.get("max_turns") else "")
    return (f"agentic workload, {source}; {w['sessions']} sessions per level, up to {w['turns']} turns each, reply "
            f"{w['reply_tokens']} tokens, think {w['think_s']:g} s, largest context {w['largest_context']} tokens "
            f"(trace sha256 `{w['trace_sha256'][:16]}`); {record['warmup']} warm-up requests")


def render_depth(record: dict[str, Any]) -> list[str]:
    """Per level, TTFT and TPOT by turn depth (pdkit.bench.agentic.DEPTH_BUCKETS)."""
    rows = [(lv["concurrency"], d) for lv in record["levels"] for d in lv.get("by_depth") or []]
    if not rows:
        return []
    lines = ["", "By turn depth (turn 1 prefills the whole cold session; later turns the new messages):", "",
             "| C | turns | requests | errors | prompt tokens mean | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
             "TPOT p99 ms |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c, d in rows:
        cells = [c, d["depth"], d["requests"], d["errors"], d["prompt_tokens_mean"], d["ttft_ms"]["p50"],
                 d["ttft_ms"]["p99"], d["tpot_ms"]["p50"], d["tpot_ms"]["p99"]]
        lines.append("| " + " | ".join(fmt_cell(v) for v in cells) + " |")
    notes = []
    for level in record["levels"]:
        cache = level.get("prefix_cache") or {}
        if cache.get("unread"):
            notes.append(f"- C={level['concurrency']}: prefix cache /metrics not read: "
                         + "; ".join(f"{k}: {v}" for k, v in cache["unread"].items()))
        if level.get("turns_skipped"):
            notes.append(f"- C={level['concurrency']}: {level['turns_skipped']} turn(s) not sent: their session's "
                         "earlier turn failed")
    engines = ", ".join(record.get("cache_engines") or []) or "none"
    return lines + ["", f"Prefix hit = cached / prompt tokens over the level, from the engines' own counters "
                        f"(sglang:cached_tokens_total, sglang:prompt_tokens_total) on {engines}."] + notes


def describe_env(record: dict[str, Any]) -> list[str]:
    env = record["env"]
    gpus = "; ".join(f"{g['host']}: {g['count']}x {g['model']} (gpu: {g['gpu']}, driver {g['driver']})"
                     for g in env["gpus"]) or "none"
    return [
        f"- engine: {env['engine']}, sglang {', '.join(env['sglang_versions']) or 'n/a'}, router {env['router']}",
        f"- GPUs: {gpus}",
        f"- spec hash: `{env['spec_hash'][:16]}`",
    ] + ([f"- measured: {describe_measured(env['measured'])}"] if env.get("measured") else [])


def describe_measured(measured: dict[str, Any]) -> str:
    """env.measured in words: the router and its engines, or the engines sent to directly."""
    if measured.get("via") == "router":
        return f"through the router {measured.get('router_url', '')} over {', '.join(measured.get('engines') or [])}"
    return f"the engines directly, PD pairs {', '.join(measured.get('routes') or [])}"


def sent_to(router_url: str, measured: dict[str, Any] | None) -> str:
    """Where a bench's requests went, for its first line: through the router, or to the pairs directly."""
    measured = measured or {}
    if measured.get("via", "router") == "router":
        return f"through {router_url}"
    return f"to {', '.join(measured.get('routes') or measured.get('engines') or [])} directly (not through the router)"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "–"


def render_markdown(record: dict[str, Any]) -> str:
    """A bench record as a markdown section: what was run, then one table row per concurrency."""
    label = f" — {record['label']}" if record.get("label") else ""
    lines = [
        f"## {record['id']}{label}",
        "",
        f"{record['time']}, `{record['tool']}` "
        f"{sent_to(record['router_url'], (record.get('env') or {}).get('measured'))}, cluster `{record['cluster']}`, "
        f"model `{record['model']}`: {describe_workload(record)}.",
        "",
        *describe_env(record),
        "",
    ]
    agentic = is_agentic(record)
    columns = LEVEL_COLUMNS + (AGENTIC_METRICS if agentic else ())
    lines += ["| " + " | ".join(name for name, _ in columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
    for level in record["levels"]:
        cells = [fmt_cell(get(level)) for _, get in LEVEL_COLUMNS]
        if agentic:
            cells += [pct(hit_rate(level)), fmt_cell(kv_mb_per_turn(level))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += render_goodput(record)
    lines += render_spread(record)
    lines += render_depth(record)
    lines += render_kv(record)
    samples = [s for lv in record["levels"] for s in lv.get("error_samples", [])]
    if samples:
        lines += ["", "Errors (samples): " + "; ".join(dict.fromkeys(samples))]
    for level in record["levels"]:
        if level.get("errors") and level.get("failures"):  # absent from records before the counts
            lines.append(f"- C={level['concurrency']} failures by kind {_counts(level['failures'])}; by finish reason "
                         f"{_counts(level.get('failed_finish_reasons') or {})}; by worker "
                         f"{_counts(level.get('failed_workers') or {})}")
    return "\n".join(lines) + "\n"


def render_plot(records: Sequence[dict[str, Any]], path: str | Path) -> None:
    """PNG: output tok/s and TPOT (p50, p99) against concurrency, one line per record."""
    # lazy: matplotlib is the optional [bench] extra (pyproject) and takes ~0.5 s to import
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg"), so no display is needed

    fig, (ax_tput, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
    for record in records:
        levels = sorted(record["levels"], key=lambda lv: lv["concurrency"])
        xs = [lv["concurrency"] for lv in levels]
        name = record.get("label") or record["id"]
        (line,) = ax_tput.plot(xs, [lv["output_tok_s"] for lv in levels], marker="o", label=name)
        color = line.get_color()  # one colour per run on both charts
        ax_tpot.plot(xs, [lv["tpot_ms"]["p50"] for lv in levels], marker="o", color=color, label=f"{name} p50")
        ax_tpot.plot(xs, [lv["tpot_ms"]["p99"] for lv in levels], marker="x", linestyle="--", color=color,
                     label=f"{name} p99")
    ticks = sorted({lv["concurrency"] for record in records for lv in record["levels"]})
    for ax, title, unit in ((ax_tput, "Output throughput", "output tok/s"), (ax_tpot, "TPOT", "ms per token")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    first = records[0]
    shape = ("agentic sessions" if is_agentic(first)
             else f"in {first['input_len']} / out {first['output_len']} tokens")
    fig.suptitle(f"{first['cluster']} ({first['env']['engine']}): {shape}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(record: dict[str, Any], out_dir: str | Path, plot: bool = True) -> list[Path]:
    """Append the record to OUT/runs.jsonl and write OUT/<id>.md (and OUT/<id>.png)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    append_run(out / RUNS_FILE, record)
    written = [out / RUNS_FILE, out / f"{record['id']}.md"]
    written[1].write_text(render_markdown(record))
    if plot:
        written.append(out / f"{record['id']}.png")
        render_plot([record], written[-1])
    return written


# ---- compare ---------------------------------------------------------------------------------

COMPARED_METRICS = (*METRICS, ERRORS)


def compare_levels(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per concurrency present in both runs and per metric: A, B and B/A."""
    b_levels = {lv["concurrency"]: lv for lv in b["levels"]}
    rows = []
    for level_a in sorted(a["levels"], key=lambda lv: lv["concurrency"]):
        level_b = b_levels.get(level_a["concurrency"])
        if level_b is None:
            continue
        for name, get in COMPARED_METRICS:
            va, vb = get(level_a), get(level_b)
            rows.append({"concurrency": level_a["concurrency"], "metric": name, "a": va, "b": vb,
                         "ratio": ratio(vb, va)})
        if is_agentic(a) or is_agentic(b):
            for name, get in AGENTIC_METRICS:
                va, vb = get(level_a), get(level_b)
                rows.append({"concurrency": level_a["concurrency"], "metric": name, "a": va, "b": vb,
                             "ratio": ratio(vb, va),
                             **({"a_text": pct(va), "b_text": pct(vb)} if name == "prefix hit" else {})})
            depth_b = {d["depth"]: d for d in level_b.get("by_depth") or []}
            for d_a in level_a.get("by_depth") or []:
                d_b = depth_b.get(d_a["depth"])
                if d_b is None:
                    continue
                for key, label, q in DEPTH_COMPARED:
                    va, vb = d_a[key][q], d_b[key][q]
                    rows.append({"concurrency": level_a["concurrency"], "a": va, "b": vb, "ratio": ratio(vb, va),
                                 "metric": f"{label} {q} ms, turns {d_a['depth']}"})
        if kv_has_figures(level_a) or kv_has_figures(level_b):
            kv_a, kv_b = level_a.get("kv") or {}, level_b.get("kv") or {}
            for name, key in KV_COLUMNS:
                va, vb = kv_a.get(key), kv_b.get(key)
                # a p99 past the top bucket is a floor: no ratio of floors
                floor = (key == "latency_p99_ms" and (kv_a.get("latency_p99_above_buckets")
                                                      or kv_b.get("latency_p99_above_buckets")))
                rows.append({"concurrency": level_a["concurrency"], "metric": name, "a": va, "b": vb,
                             "ratio": None if floor else ratio(vb, va),
                             "a_text": kv_text(kv_a, key) if kv_has_figures(level_a) else _kv_missing(a, level_a),
                             "b_text": kv_text(kv_b, key) if kv_has_figures(level_b) else _kv_missing(b, level_b)})
    return rows


def _kv_missing(record: dict[str, Any], level: dict[str, Any]) -> str:
    """Why a level has no KV figures, in a compare cell."""
    if "kv_prefills" not in record:
        return "not recorded"
    if not record["kv_prefills"]:
        return "no PD hand-off"
    return "not read"


def argv_options(argv: Sequence[str]) -> dict[str, str]:
    """An argv as {"--flag": "its values"} (a flag takes the tokens up to the next --flag)."""
    options: dict[str, list[str]] = {}
    current = ""
    for token in argv:
        if token.startswith("--"):
            current = token
            options.setdefault(current, [])
        else:
            options.setdefault(current, []).append(token)
    return {flag: " ".join(values) for flag, values in options.items()}


def _option_text(flag: str, value: str) -> str:
    return f"`{flag} {value}`" if value else f"`{flag}`"


def flag_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Engines whose planned argv differs between the runs: options removed, added and changed."""
    flags_a, flags_b = a["env"]["engine_flags"], b["env"]["engine_flags"]
    out = []
    for engine, change in keyed_changes(flags_a, flags_b):
        if change != "changed":
            out.append(f"{engine}: engine {change}")
            continue
        opts_a, opts_b = argv_options(flags_a[engine]), argv_options(flags_b[engine])
        parts = []
        for flag, what in keyed_changes(opts_a, opts_b):
            shown_a, shown_b = _option_text(flag, opts_a.get(flag, "")), _option_text(flag, opts_b.get(flag, ""))
            parts.append({"removed": f"removed {shown_a}", "added": f"added {shown_b}",
                          "changed": f"{shown_a} -> {shown_b}"}[what])
        out.append(f"{engine}: " + ("; ".join(parts) or "same options, another order"))
    return out


def spread_lines(a: dict[str, Any], b: dict[str, Any], margin: float) -> list[str]:
    """What `pdkit compare` says of A's run-to-run spread: per level and figure when A was benched
    more than once (`pdkit bench --repeats`), else that it is unknown."""
    runs_a, runs_b = len(noise.record_runs(a)), len(noise.record_runs(b))
    if runs_a < 2:
        return ["- A's spread: unknown, A was benched once; no verdict on whether B differs beyond the run-to-run "
                "noise (bench A with --repeats 3)"]
    band = noise.band(noise.record_runs(a))
    lines = [f"- A's spread over its {runs_a} runs ((max - min) / median, per level):"]
    for c, figures in band.items():
        cells = [f"{label} {figures[name]['spread']:.1%}" for label, name in noise.REPORT_LABELS.items()
                 if figures.get(name) and figures[name]["spread"] is not None]
        lines.append(f"  - C={c}: " + (", ".join(cells) or "–"))
    of_b = f"B's median over its {runs_b} runs" if runs_b > 1 else "B's figure"
    lines.append(f"- beyond A's spread?: {of_b} against A's median; better or worse only when the difference "
                 f"exceeds A's spread + margin {margin:.1%} (--margin), else within the noise (pdkit/bench/noise.py). "
                 "A, B and B/A are each record's first run")
    return lines


def verdict_cell(judged: dict[str, Any] | None) -> str:
    """One `beyond A's spread?` cell: yes/no, the side, the gain against spread + margin."""
    word = noise.side(judged) if judged else None
    if word is None:
        return "–"
    assert judged is not None
    answer = "no" if word == "within the noise" else "yes"
    return f"{answer}, {word} ({judged['gain']:+.1%}; spread {judged['spread']:.1%} + {judged['margin']:.1%})"


def render_compare(a: dict[str, Any], b: dict[str, Any], margin: float = noise.DEFAULT_MARGIN) -> str:
    """Markdown: the two runs, what differs in their environment, A's run-to-run spread (or that it
    is unknown), then A, B and B/A per level and metric; with a repeated A, whether B lies beyond
    A's spread + MARGIN (pdkit.bench.noise.compare_verdicts)."""
    def name(r: dict[str, Any]) -> str:
        return f"`{r['id']}`" + (f" ({r['label']})" if r.get("label") else "")

    lines = [f"# pdkit compare: A = {name(a)}, B = {name(b)}", ""]
    for key, label in (("spec_hash", "spec hash"), ("engine", "engine"), ("sglang_versions", "sglang"),
                       ("router", "router"), ("gpus", "GPUs"), ("measured", "measured engines")):
        va, vb = a["env"].get(key), b["env"].get(key)
        if key == "measured" and (va is None or vb is None):
            continue  # a record from before env.measured: unknown, not different
        if va != vb:
            if key == "spec_hash":
                va, vb = va[:16], vb[:16]
            lines.append(f"- {label} differs: A {json.dumps(va)} / B {json.dumps(vb)}")
    changes = flag_changes(a, b)
    lines += [f"- flags {c}" for c in changes]
    for key in ("input_len", "output_len", "requests", "tool"):
        if a.get(key) != b.get(key):
            lines.append(f"- {key} differs: A {a.get(key)} / B {b.get(key)} (not like for like)")
    wa, wb = a.get("workload") or {"kind": "fixed"}, b.get("workload") or {"kind": "fixed"}
    if wa != wb:
        keys = sorted(k for k in set(wa) | set(wb) if wa.get(k) != wb.get(k))
        lines.append("- workload differs (not like for like): " + "; ".join(
            f"{k} A {json.dumps(wa.get(k))} / B {json.dumps(wb.get(k))}" for k in keys))
    if len(lines) == 2:
        lines.append("- same spec hash, flags and workload")
    lines += spread_lines(a, b, margin)
    verdicts = noise.compare_verdicts(a, b, margin)  # {} when A was benched once: no column
    rows = compare_levels(a, b)
    if verdicts:
        lines += ["", "| C | metric | A | B | B/A | beyond A's spread? |", "|---:|---|---:|---:|---:|---|"]
    else:
        lines += ["", "| C | metric | A | B | B/A |", "|---:|---|---:|---:|---:|"]
    for row in rows:
        line = (f"| {row['concurrency']} | {row['metric']} | {row.get('a_text') or fmt_cell(row['a'])} | "
                f"{row.get('b_text') or fmt_cell(row['b'])} | {fmt_cell(row['ratio'], 2)} |")
        if verdicts:
            figure = noise.REPORT_LABELS.get(row["metric"])
            line += f" {verdict_cell(verdicts.get((row['concurrency'], figure)) if figure else None)} |"
        lines.append(line)
    if not rows:
        lines.append("| – | no concurrency level in common | | | |" + (" |" if verdicts else ""))
    return "\n".join(lines) + "\n"

