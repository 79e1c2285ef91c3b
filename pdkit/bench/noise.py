"""The run-to-run spread of bench figures, and whether a difference lies beyond it.

A figure is a claim only with its spread. One bench per configuration cannot tell a lever from
chance: the lab campaign of issue 43 kept `ctx-4096` at 1.011x the baseline and `page-64` came
second at 1.006x, inside the spread of repeated baselines; on a lent H100 the same page-64 phases
gave 245 ms TTFT p50 without the lever and 511 ms with it, where a lent H200 had shown a cut from
285 to 178 ms (docs/gpu.md). So the baseline is measured more than once, each figure's spread is
the band, and a candidate counts as better only when its gain exceeds the band plus a stated
margin. `pdkit tune` (keep: best) and `pdkit compare` decide by the same rule, here.

Standard library only: pdkit.bench.stats' rule applies (the load clients import this package).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

# Every figure a band is kept for: {name: (its value in one bench level, higher is better)}.
# The names are pdkit tune's objective metrics (pdkit.tune.campaign.OBJECTIVE_METRICS) plus TPOT.
FIGURES: dict[str, tuple[Callable[[dict[str, Any]], Any], bool]] = {
    "output_tok_s": (lambda lv: lv.get("output_tok_s"), True),
    "requests_s": (lambda lv: lv.get("requests_s"), True),
    "goodput": (lambda lv: (lv.get("goodput") or {}).get("requests_s"), True),
    "ttft_p50_ms": (lambda lv: (lv.get("ttft_ms") or {}).get("p50"), False),
    "ttft_p99_ms": (lambda lv: (lv.get("ttft_ms") or {}).get("p99"), False),
    "tpot_p50_ms": (lambda lv: (lv.get("tpot_ms") or {}).get("p50"), False),
    "tpot_p99_ms": (lambda lv: (lv.get("tpot_ms") or {}).get("p99"), False),
}
# pdkit compare's metric labels (pdkit.bench.report.METRICS) -> the figure above
REPORT_LABELS = {"output tok/s": "output_tok_s", "req/s": "requests_s", "TTFT p50 ms": "ttft_p50_ms",
                 "TTFT p99 ms": "ttft_p99_ms", "TPOT p50 ms": "tpot_p50_ms", "TPOT p99 ms": "tpot_p99_ms"}
# the margin a gain must clear beyond the band, as a fraction of the baseline's figure (2%): a band
# from two or three runs underestimates the true spread, and a 1% "gain" is nobody's reason to
# restart a box
DEFAULT_MARGIN = 0.02


def figure(level: dict[str, Any], name: str) -> float | None:
    """One figure of one bench level, None when the level lacks it."""
    value = FIGURES[name][0](level)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def spread_of(values: Sequence[float]) -> float | None:
    """Relative spread of repeated measurements: (max - min) / median; None with fewer than two."""
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    if mid == 0:
        return None
    return (max(values) - min(values)) / abs(mid)


def band(runs: Sequence[Sequence[dict[str, Any]]]) -> dict[int, dict[str, dict[str, Any]]]:
    """Per concurrency level and figure, over RUNS (each a bench record's `levels`): the values in
    run order, their median and their relative spread (None from a single run)."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    levels = sorted({lv["concurrency"] for run in runs for lv in run})
    for c in levels:
        per: dict[str, dict[str, Any]] = {}
        for name in FIGURES:
            values = [v for run in runs for lv in run if lv["concurrency"] == c
                      for v in [figure(lv, name)] if v is not None]
            if values:
                per[name] = {"values": values, "median": statistics.median(values), "spread": spread_of(values),
                             "runs": len(values)}
        out[c] = per
    return out


def gain(reference: float, value: float, higher_is_better: bool) -> float:
    """How much better VALUE is than REFERENCE, as a fraction of REFERENCE (negative: worse)."""
    if reference == 0:
        return 0.0
    return (value - reference) / abs(reference) if higher_is_better else (reference - value) / abs(reference)


def judge(reference: dict[str, Any] | None, value: float | None, higher_is_better: bool,
          margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """A candidate's figure against the baseline's band (band()'s entry for the figure).

    beyond: True when the gain exceeds spread + margin (better beyond the noise), False when it
    does not (within the noise, or worse), None when it cannot be told (no figure, or a baseline
    measured once: no spread, no claim)."""
    if reference is None or value is None:
        return {"gain": None, "spread": None, "margin": margin, "beyond": None,
                "why": "no figure to compare" if value is None else "the baseline has no such figure"}
    g = gain(reference["median"], value, higher_is_better)
    spread = reference.get("spread")
    if spread is None:
        return {"gain": g, "spread": None, "margin": margin, "beyond": None,
                "why": f"the baseline was measured {reference.get('runs', 1)} time(s): no spread to judge by"}
    beyond = g > spread + margin
    why = (f"{g:+.1%} against the baseline's median, spread {spread:.1%} + margin {margin:.1%} = "
           f"{spread + margin:.1%}: " + ("beyond the noise" if beyond else "within the noise"))
    return {"gain": g, "spread": spread, "margin": margin, "beyond": beyond, "why": why}


def describe(entry: dict[str, Any] | None) -> str:
    """A band entry as a cell: 'median (spread x% of n runs)', or '–'."""
    if not entry:
        return "–"
    if entry.get("spread") is None:
        return f"{entry['median']:.1f} (1 run)"
    return f"{entry['median']:.1f} (spread {entry['spread']:.1%} of {entry['runs']} runs)"


def record_runs(record: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """A bench record's runs as `levels` lists: its own levels, then its repeats (`pdkit bench --repeats`)."""
    return [record["levels"], *(record.get("repeats") or [])]


def with_repeats(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record of the sweep benched len(RECORDS) times (`pdkit bench --repeats`), as record_runs
    reads it: the first run's record (id, time, levels: the figures the table and every ratio show),
    with `repeats` = the later runs' `levels`, in run order. A single run stays as it was."""
    first = dict(records[0])
    if len(records) > 1:
        first["repeats"] = [r["levels"] for r in records[1:]]
    return first


def side(judged: dict[str, Any]) -> str | None:
    """judge()'s answer in a word: "better" (gain beyond spread + margin), "worse" (loss beyond it),
    "within the noise", or None when it cannot be told."""
    if judged.get("beyond") is None or judged.get("gain") is None:
        return None
    if judged["beyond"]:
        return "better"
    return "worse" if -judged["gain"] > judged["spread"] + judged["margin"] else "within the noise"


def compare_verdicts(a: dict[str, Any], b: dict[str, Any],
                     margin: float = DEFAULT_MARGIN) -> dict[tuple[int, str], dict[str, Any]]:
    """`pdkit compare`'s noise column: per (concurrency, figure), B's median judged against A's band.
    Empty when A was measured once (no spread, no claim either way)."""
    runs_a = record_runs(a)
    if len(runs_a) < 2:
        return {}
    band_a, band_b = band(runs_a), band(record_runs(b))
    out = {}
    for c, figures in band_a.items():
        for name, entry in figures.items():
            other = (band_b.get(c) or {}).get(name)
            if other is not None:
                out[(c, name)] = judge(entry, other["median"], FIGURES[name][1], margin)
    return out
