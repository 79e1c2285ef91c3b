"""pdkit.bench.stats against hand-computed cases."""

from __future__ import annotations

import pytest

from pdkit.bench.stats import RequestResult, itls, percentile, ratio, summarize_level, throughput, tpot


def test_percentile_linear_interpolation():
    # sorted [1, 2, 3, 4]: p50 rank 1.5 -> 2.5; p99 rank 2.97 -> 3 + 0.97 * (4 - 3)
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([4, 1, 3, 2], 99) == pytest.approx(3.97)
    assert percentile([4, 1, 3, 2], 0) == 1
    assert percentile([4, 1, 3, 2], 100) == 4
    # odd count: the middle value exactly
    assert percentile([5, 1, 9], 50) == 5
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_percentile_rejects_out_of_range_q():
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)


def test_tpot_excludes_the_first_token():
    # 10 tokens in 1.0 s, first after 0.1 s: the other 9 took 0.9 s
    assert tpot(RequestResult(ok=True, ttft=0.1, latency=1.0, output_tokens=10)) == pytest.approx(0.1)
    assert tpot(RequestResult(ok=True, ttft=0.1, latency=0.1, output_tokens=1)) is None
    assert tpot(RequestResult(ok=False, error="HTTP 503")) is None


def test_itl_is_the_gap_between_chunks():
    gaps = itls(RequestResult(ok=True, chunk_times=(0.1, 0.15, 0.3, 0.3)))
    assert gaps == pytest.approx([0.05, 0.15, 0.0])
    assert itls(RequestResult(ok=True, chunk_times=(0.1,))) == []


def test_throughput_over_wall_time():
    assert throughput(150, 3.0) == pytest.approx(50.0)
    assert throughput(10, 0.0) == 0.0


def test_ratio():
    assert ratio(50.0, 100.0) == pytest.approx(0.5)
    assert ratio(1.0, 0.0) is None
    assert ratio(None, 1.0) is None


def test_summarize_level_hand_computed():
    # request 1: 10 tokens, first at 0.1 s, one chunk every 0.1 s up to 1.0 s
    r1 = RequestResult(ok=True, ttft=0.1, latency=1.0, output_tokens=10, prompt_tokens=5,
                       chunk_times=tuple(round(0.1 * i, 10) for i in range(1, 11)))
    # request 2: 5 tokens, first at 0.2 s, irregular gaps 50, 150, 100, 100 ms
    r2 = RequestResult(ok=True, ttft=0.2, latency=0.6, output_tokens=5, prompt_tokens=7,
                       chunk_times=(0.2, 0.25, 0.4, 0.5, 0.6))
    failed = RequestResult(ok=False, error="HTTP 503: no prefill workers")
    level = summarize_level([r1, r2, failed, failed], duration_s=2.0, concurrency=4)

    assert level["concurrency"] == 4
    assert (level["requests"], level["completed"], level["errors"]) == (4, 2, 2)
    assert level["error_samples"] == ["HTTP 503: no prefill workers"]
    assert (level["input_tokens"], level["output_tokens"]) == (12, 15)
    assert level["output_tok_s"] == pytest.approx(7.5)  # 15 tokens / 2 s; failures add none
    assert level["requests_s"] == pytest.approx(1.0)  # 2 completed / 2 s
    # TTFT 100 and 200 ms: mean 150, p50 150, p99 = 100 + 0.99 * 100
    assert level["ttft_ms"] == pytest.approx({"mean": 150.0, "p50": 150.0, "p99": 199.0})
    # TPOT: (1.0 - 0.1) / 9 = 100 ms and (0.6 - 0.2) / 4 = 100 ms
    assert level["tpot_ms"] == pytest.approx({"mean": 100.0, "p50": 100.0, "p99": 100.0})
    # ITL pooled: 9 x 100 ms, then 50, 150, 100, 100 -> sorted 50, 100 x 11, 150 (13 values)
    # p50 = 100; p99 rank 11.88 -> 100 + 0.88 * 50 = 144; mean 1300 / 13 = 100
    assert level["itl_ms"] == pytest.approx({"mean": 100.0, "p50": 100.0, "p99": 144.0})
    assert level["e2e_ms"] == pytest.approx({"mean": 800.0, "p50": 800.0, "p99": 996.0})


def test_summarize_level_all_failed_reports_no_latencies():
    level = summarize_level([RequestResult(ok=False, error="timeout")], duration_s=1.0, concurrency=1)
    assert (level["completed"], level["errors"], level["output_tok_s"]) == (0, 1, 0.0)
    assert level["ttft_ms"] == {"mean": None, "p50": None, "p99": None}
