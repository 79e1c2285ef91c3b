"""`pdkit bench`'s KV hand-off figures per level, without a cluster: which prefills are read, the
level's `kv` block from canned /metrics pages (pdkit.spec.kvcost does the maths), what an unreadable
/metrics records, the run table and `pdkit compare`; and goodput (pdkit.bench.stats.goodput)."""

from __future__ import annotations

import copy

import pytest

from pdkit.bench.cli import limited_measure
from pdkit.bench.record import kv_prefills, level_kv, scrape_kv
from pdkit.bench.report import render_compare, render_markdown
from pdkit.bench.routes import router_measured
from pdkit.bench.stats import RequestResult, goodput, summarize_level
from pdkit.inventory.loader import load
from pdkit.spec.kvcost import kv_histograms
from tests.conftest import write_inventory
from tests.test_bench import _record
from tests.test_kvcost import page


def sample(pages: dict[str, str], errors: dict[str, str] | None = None):
    """A scrape_kv result from canned /metrics pages."""
    return {label: kv_histograms(text) for label, text in pages.items()}, dict(errors or {})


def test_the_prefills_read_are_the_measured_pd_pairs_prefills(base, tmp_path):
    cluster, hosts = base
    spec = load(write_inventory(tmp_path, hosts, cluster))
    # through gpu01's router: its workers' prefill only
    via_router = router_measured(spec, "http://10.9.0.1:8000")
    assert kv_prefills(spec, via_router) == {"gpu01/prefill": "http://10.9.0.1:30000"}
    limited = limited_measure(spec, ["gpu02"]).describe()
    assert kv_prefills(spec, limited) == {"gpu02/prefill": "http://10.9.0.2:30000"}
    # a route the spec does not name: no address to read, said so when scraped
    unknown = {"via": "engines", "routes": ["x/prefill+x/decode"]}
    assert kv_prefills(spec, unknown) == {"x/prefill": None}
    pages, errors = scrape_kv({"x/prefill": None})
    assert pages == {} and "its /metrics address is unknown" in errors["x/prefill"]


def test_a_unified_cluster_has_no_prefill_to_read(base, tmp_path):
    cluster, hosts = base
    for name in ("gpu01", "gpu02"):
        hosts[name]["pdkit_node"]["engines"] = [{"name": "unified", "role": "unified", "gpus": [0, 1, 2, 3], "port": 30000}]
    hosts["gpu01"]["pdkit_router"] = {"workers": ["gpu01/unified", "gpu02/unified"]}
    spec = load(write_inventory(tmp_path, hosts, cluster))
    assert kv_prefills(spec, router_measured(spec, "http://r:8000")) == {}


def test_level_kv_combines_the_prefills_windows():
    before = sample({"a/prefill": page([30.0] * 4, 8.0), "b/prefill": page([30.0] * 2, 8.0)})
    # a: 2 new hand-offs of 100 ms; b: restarted (its count fell), 1 hand-off of 300 ms since
    after = sample({"a/prefill": page([30.0] * 4 + [100.0] * 2, 8.0), "b/prefill": page([300.0], 8.0)})
    kv = level_kv(before, after, ttft_mean_ms=250.0)
    assert kv["prefills"] == ["a/prefill", "b/prefill"] and "unread" not in kv
    assert kv["transfers"] == 3
    assert kv["mb_per_request"] == pytest.approx(8.0)
    assert kv["latency_mean_ms"] == pytest.approx(500.0 / 3, rel=1e-3)
    assert kv["effective_gb_s"] == pytest.approx(3 * 8.0 / 1024 / 0.5, rel=1e-3)
    assert kv["ttft_share"] == pytest.approx(500.0 / 3 / 250.0, rel=1e-3)
    assert not kv["latency_p99_above_buckets"]


def test_an_unreadable_prefill_is_recorded_with_why_not_a_crash(monkeypatch):
    import pdkit.agent.health

    answers = {"http://p1:30000/metrics": (200, page([50.0], 4.0)),
               "http://p2:30000/metrics": (0, "<urlopen error [Errno 111] Connection refused>")}
    monkeypatch.setattr(pdkit.agent.health, "http_request", lambda url, **_kw: answers[url])
    prefills = {"h1/prefill": "http://p1:30000", "h2/prefill": "http://p2:30000"}
    pages, errors = scrape_kv(prefills)
    assert list(pages) == ["h1/prefill"] and "Connection refused" in errors["h2/prefill"]
    # one of two read: figures from it, and why the other is missing
    kv = level_kv((pages, errors), (pages, errors), 100.0)
    assert kv["prefills"] == ["h1/prefill"] and kv["transfers"] == 0
    assert "http://p2:30000/metrics" in kv["unread"]["h2/prefill"]
    # none read: no figures at all (not "0 transfers")
    kv = level_kv(({}, {"h1/prefill": "HTTP 500: boom"}), ({}, {}), 100.0)
    assert kv == {"prefills": [], "unread": {"h1/prefill": "HTTP 500: boom"}}


def _kv_record(run_id: str, latencies_ms: list[float], mb: float = 192.0, ttft_ms: float = 1000.0) -> dict:
    record = _record(run_id, run_id, 100.0, ["--x"])
    record["kv_prefills"] = ["gpu01/prefill"]
    record["levels"][0]["ttft_ms"]["mean"] = ttft_ms
    record["levels"][0]["kv"] = level_kv(sample({"gpu01/prefill": ""}), sample({"gpu01/prefill": page(latencies_ms, mb)}), ttft_ms)
    return record


def test_the_run_table_shows_the_kv_figures_per_level():
    record = _kv_record("r1", [20.0] * 9 + [8000.0])
    text = render_markdown(record)
    assert "KV hand-off per level, from the prefills' own histograms (gpu01/prefill)" in text
    assert "ratio of sums" in text and "mean of per-request ratios" in text
    header = "| C | KV transfers | KV MB/request | KV latency mean ms | KV latency p99 ms | KV effective GB/s | SGLang speed mean GB/s | KV share of TTFT |"
    assert header in text
    kv = record["levels"][0]["kv"]
    # p99 past SGLang's top bucket (5,000 ms) is a floor
    row = f"| 16 | 10 | 192.0 | 818.0 | >5000 | {kv['effective_gb_s']:,.2f} | {kv['sglang_speed_mean_gb_s']:,.2f} | 82% |"
    assert row in text, text


def test_the_run_table_says_why_there_are_no_kv_figures():
    unified = _record("u", "u", 1.0, [])
    unified["kv_prefills"] = []
    assert "KV hand-off: none to measure (no PD hand-off" in render_markdown(unified)
    old = _record("o", "o", 1.0, [])  # a record from before the KV figures: nothing said
    assert "KV" not in render_markdown(old)
    unread = _record("n", "n", 1.0, [])
    unread["kv_prefills"] = ["gpu01/prefill"]
    unread["levels"][0]["kv"] = {"prefills": [], "unread": {"gpu01/prefill": "http://10.9.0.1:30000/metrics: HTTP 403: no"}}
    text = render_markdown(unread)
    assert "| 16 | not read | – |" in text
    assert "- C=16: /metrics not read (no figures): gpu01/prefill: http://10.9.0.1:30000/metrics: HTTP 403: no" in text


def test_compare_shows_the_kv_figures_and_no_ratio_of_floors():
    a = _kv_record("a", [100.0] * 10)
    b = _kv_record("b", [200.0] * 9 + [9000.0])
    text = render_compare(a, b)
    assert "| 16 | KV transfers | 10 | 10 | 1.00 |" in text, text
    assert "| 16 | KV latency mean ms | 100.0 | 1,080.0 | 10.80 |" in text
    p99 = next(line for line in text.splitlines() if "KV latency p99 ms" in line)
    assert ">5000" in p99 and p99.endswith("| – |"), p99
    assert "| 16 | KV share of TTFT | 10% | 108% |" in text
    # against a run without KV figures: the cell says why
    old = copy.deepcopy(a)
    del old["kv_prefills"], old["levels"][0]["kv"]
    assert "| 16 | KV transfers | not recorded | 10 | – |" in render_compare(old, a)
    unified = copy.deepcopy(old)
    unified["kv_prefills"] = []
    assert "| 16 | KV transfers | no PD hand-off | 10 | – |" in render_compare(unified, a)
    assert "KV" not in render_compare(old, old)


def _ok(ttft_s: float, latency_s: float, tokens: int) -> RequestResult:
    return RequestResult(ok=True, ttft=ttft_s, latency=latency_s, output_tokens=tokens)


def test_goodput_is_sglangs_requests_within_every_slo_per_second():
    results = [
        _ok(0.1, 0.1 + 63 * 0.010, 64),  # TTFT 100 ms, TPOT 10 ms: good
        _ok(0.3, 0.3 + 63 * 0.010, 64),  # TTFT over
        _ok(0.1, 0.1 + 63 * 0.030, 64),  # TPOT over
        _ok(0.2, 0.2, 1),  # one token: TPOT counts as 0 (SGLang's rule): good
        RequestResult(ok=False, error="status 503: busy"),
    ]
    g = goodput(results, 2.0, {"ttft_ms": 200, "tpot_ms": 20})
    assert g == {"requests_s": 1.0, "good": 2, "attainment": 0.4, "slo_ms": {"ttft_ms": 200, "tpot_ms": 20}}
    assert goodput(results, 2.0, {"ttft_ms": 200})["good"] == 3
    with pytest.raises(ValueError, match="goodput SLOs are ttft_ms, tpot_ms"):
        goodput(results, 1.0, {"e2e_ms": 1})
    level = summarize_level(results, 2.0, 4, {"ttft_ms": 200, "tpot_ms": 20})
    assert level["goodput"]["requests_s"] == 1.0
    assert "goodput" not in summarize_level(results, 2.0, 4)
    record = _record("g", "g", 1.0, [])
    record["levels"][0]["goodput"] = level["goodput"]
    assert "- C=16 goodput: 1.00 req/s met TTFT <= 200 ms, TPOT <= 20 ms (2 of 8 requests)" in render_markdown(record)
