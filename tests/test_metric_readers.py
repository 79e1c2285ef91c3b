"""Every metric read outside the PromQL (doctor, roll's gates, pdkit-exporter; bench reads none) against
the metric catalogue, for every SGLang version and router a spec runs: the type it is read as, the labels
it is read through, and what its absence means where the release creates it lazily. Then the readers on
real SGLang 0.5.17 pages (tests/fixtures/), where the lazy families are absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdkit.agent.exporter import metrics as exporter_metrics
from pdkit.agent.exporter.metrics import decode_cuda_graph_ratio, parse_metrics
from pdkit.doctor.observe import router_outcomes
from pdkit.roll.planning import metric_sums
from pdkit.upstream import catalogue as cat
from pdkit.upstream import metricnames as mn
from tests.test_monitoring import _load_example

REAL = Path(__file__).parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"


def problems(reads, engine: dict[str, dict], router: dict[str, dict], where: str) -> list[str]:
    out = []
    for r in reads:
        families = engine if r.metric.startswith("sglang:") else router
        fam = families.get(r.metric)
        if fam is None:
            out.append(f"{where}: {r.reader} reads {r.metric}, which is not exported")
            continue
        if fam["type"] != r.kind:
            out.append(f"{where}: {r.reader} reads {r.metric} as a {r.kind}; it is a {fam['type']}")
        missing = set(r.labels) - set(fam["labels"])
        if missing:
            out.append(f"{where}: {r.reader} reads {r.metric} through {sorted(missing)}, which it lacks")
        if not fam["eager"] and not r.absent:
            out.append(f"{where}: {r.reader} needs {r.metric}, which is created lazily: say what its absence means")
    return out


@pytest.mark.parametrize("example", ["lab", "cluster"])
def test_every_reader_matches_the_catalogue_for_the_specs_releases(example):
    spec = _load_example(example)
    versions = sorted({spec.engine_version(e) for _, e in spec.engines()})
    routers = sorted({spec.router_release(h) for h in spec.router_hosts})
    assert versions and routers
    found = []
    for v in versions:
        for package, rv in routers:
            found += problems(mn.READS, cat.sglang_families(v), cat.router_families(package, rv),
                              f"sglang {v} / {package} {rv}")
    assert not found, "\n".join(found)


def test_every_release_in_the_catalogue_too():
    found = []
    for v in cat.SGLANG_VERSIONS:
        for package, rv in cat.ROUTERS:
            found += problems(mn.READS, cat.sglang_families(v), cat.router_families(package, rv), f"{v}/{package}")
    assert not found, "\n".join(found)


def test_the_table_lists_what_the_readers_really_read():
    """The names each reader takes from its own module constants are all in READS under that reader."""
    by_reader: dict[str, set[str]] = {}
    for r in mn.READS:
        by_reader.setdefault(r.reader.split(" (")[0], set()).add(r.metric)
    assert set(exporter_metrics._SAMPLES) <= by_reader["pdkit-exporter"]
    assert set(mn.DRAIN_GAUGES) | set(mn.FAILURE_COUNTERS) | {mn.ROUTER["worker_cb_state"]} <= by_reader["roll"]
    assert set(mn.FAILURE_COUNTERS) | {mn.ROUTER["worker_outcomes"]} <= by_reader["doctor"]


def test_the_check_can_fail():
    engine = cat.sglang_families("0.5.17")
    router = cat.router_families("smg", "1.13.0")
    wrong = (mn.Read("x", mn.SGLANG["kv_transfer_speed"], "gauge"),  # a histogram
             mn.Read("x", "sglang:num_prefill_prealloc_queue_reqs", "gauge"),  # no release has it
             mn.Read("x", mn.SGLANG["running"], "gauge", ("mode",)),  # no such label
             mn.Read("x", mn.SGLANG["transfer_failed"], "counter"))  # lazy, absence unhandled
    assert len(problems(wrong, engine, router, "t")) == 5  # the histogram is lazy too


def test_the_readers_on_real_pages_without_the_lazy_families():
    """Real 0.5.17 pages: no failure counter exists on a healthy engine; a decode without graphs has only
    cuda_graph_passes_total{mode="decode_none"}. Each reader gives its documented "not seen yet" state."""
    after = (REAL / "metrics-base-after-decode.txt").read_text()
    assert not set(mn.FAILURE_COUNTERS) & {line.split("{")[0] for line in after.splitlines()}
    assert metric_sums(after, mn.FAILURE_COUNTERS) == {n: 0.0 for n in mn.FAILURE_COUNTERS}
    drained = metric_sums((REAL / "metrics-base-before-decode.txt").read_text(), mn.DRAIN_GAUGES)
    assert set(drained) == set(mn.DRAIN_GAUGES) and not any(drained.values())
    figures = parse_metrics(after)
    assert figures["kv_transfer_failures"] == {} and figures["generation_tokens"] > 0
    nograph = parse_metrics((REAL / "metrics-nograph-after-decode.txt").read_text())
    assert set(nograph["cuda_graph_passes"]) == {"decode_none"}
    assert decode_cuda_graph_ratio(nograph["cuda_graph_passes"]) == 0.0
    fresh = parse_metrics((REAL / "metrics-base-before-prefill.txt").read_text())
    assert decode_cuda_graph_ratio(fresh["cuda_graph_passes"]) is None  # a prefill never decodes
    outcomes = router_outcomes((REAL / "metrics-base-after-router.txt").read_text())
    assert outcomes and all(set(o) <= {"success", "failure"} for o in outcomes.values())
