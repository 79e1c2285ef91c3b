"""pdkit.bench.noise: the baseline's spread, and a gain judged against it (issue 43, item 4)."""

from __future__ import annotations

import pytest

from pdkit.bench.noise import band, compare_verdicts, describe, gain, judge, spread_of


def level(c, tok, ttft_p50=100.0, goodput=None):
    lv = {"concurrency": c, "output_tok_s": tok, "requests_s": tok / 10, "ttft_ms": {"p50": ttft_p50, "p99": 2 * ttft_p50},
          "tpot_ms": {"p50": 5.0, "p99": 9.0}}
    if goodput is not None:
        lv["goodput"] = {"requests_s": goodput}
    return lv


def test_spread_is_the_range_over_the_median_and_needs_two_runs():
    assert spread_of([100.0]) is None and spread_of([]) is None
    assert spread_of([100.0, 104.0, 98.0]) == pytest.approx(0.06)
    assert spread_of([0.0, 0.0]) is None  # no median to scale by


def test_band_per_level_and_figure_keeps_the_values_in_run_order():
    runs = [[level(1, 50.0), level(16, 100.0)], [level(1, 52.0), level(16, 104.0, ttft_p50=110.0)], [level(16, 98.0)]]
    b = band(runs)
    assert b[16]["output_tok_s"] == {"values": [100.0, 104.0, 98.0], "median": 100.0, "spread": pytest.approx(0.06), "runs": 3}
    assert b[1]["output_tok_s"]["runs"] == 2 and b[1]["output_tok_s"]["spread"] == pytest.approx(2 / 51)
    assert b[16]["ttft_p50_ms"]["values"] == [100.0, 110.0, 100.0]
    assert "goodput" not in b[16]  # no run judged goodput


@pytest.mark.parametrize("reference, value, higher, expected", [
    (100.0, 110.0, True, 0.10), (100.0, 90.0, True, -0.10), (100.0, 80.0, False, 0.20), (100.0, 120.0, False, -0.20),
])
def test_gain_follows_the_figures_direction(reference, value, higher, expected):
    assert gain(reference, value, higher) == pytest.approx(expected)


def test_judge_needs_the_gain_to_clear_spread_plus_margin():
    ref = {"median": 100.0, "spread": 0.06, "runs": 3}
    assert judge(ref, 108.5, True, 0.02)["beyond"] is True
    assert judge(ref, 107.9, True, 0.02)["beyond"] is False
    assert judge(ref, 50.0, True, 0.02)["beyond"] is False  # worse is never beyond
    one = judge({"median": 100.0, "spread": None, "runs": 1}, 300.0, True)
    assert one["beyond"] is None and "no spread" in one["why"]
    assert judge(ref, None, True)["beyond"] is None


def test_compare_judges_b_against_as_runs_and_says_nothing_from_one_run():
    a = {"levels": [level(16, 100.0)], "repeats": [[level(16, 104.0)], [level(16, 98.0)]]}
    b = {"levels": [level(16, 120.0, ttft_p50=105.0)]}
    v = compare_verdicts(a, b)
    assert v[(16, "output_tok_s")]["beyond"] is True
    assert v[(16, "ttft_p50_ms")]["beyond"] is False  # 5% slower
    assert compare_verdicts({"levels": [level(16, 100.0)]}, b) == {}


def test_describe_says_the_runs():
    assert describe({"median": 100.0, "spread": 0.06, "runs": 3}) == "100.0 (spread 6.0% of 3 runs)"
    assert describe({"median": 100.0, "spread": None, "runs": 1}) == "100.0 (1 run)"
    assert describe(None) == "–"
