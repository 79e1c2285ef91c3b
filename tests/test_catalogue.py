"""The metric catalogue (pdkit/upstream/data/metric_catalogue.json) against its generator, the real pages
recorded from SGLang 0.5.17, and every query the kit runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdkit.contract import catalogue_gen as gen
from pdkit.monitoring.dashboards import all_promql
from pdkit.monitoring.rules import alert_conditions, alerts
from pdkit.upstream import catalogue as cat
from pdkit.upstream import metricnames
from pdkit.upstream.venvs import ContractEnvMissing, env_python
from tests.conftest import require
from tests.test_monitoring import _load_example

REAL = Path(__file__).parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"
# labels every series gets from its scrape target or the router's relabelling, not from the engine
TARGET_LABELS = {"job", "instance", "cluster", "node", "engine", "role", "pd_group", "worker_instance", "worker_role",
                 "queue"}


@pytest.mark.contract
def test_catalogue_is_what_the_generator_writes():
    for name in [f"sglang-{v}" for v in cat.SGLANG_VERSIONS] + [f"{p}-{v}" for p, v in cat.ROUTERS
                                                               if (p, v) not in gen.RECORDED_ROUTER_PAGES]:
        try:
            env_python(name)
        except ContractEnvMissing as exc:
            require(False, str(exc))
    assert gen.render(gen.generate()) == cat.CATALOGUE_PATH.read_text(), \
        "the catalogue differs from the pinned releases: run python -m pdkit.contract.catalogue_gen and review the diff"


def _real_families(glob: str) -> dict[str, tuple[str, set[str]]]:
    out: dict[str, tuple[str, set[str]]] = {}
    for f in sorted(REAL.glob(glob)):
        for fam in text_string_to_metric_families(f.read_text()):
            name = fam.name + ("_total" if fam.type == "counter" else "")
            labels = {k for s in fam.samples for k in s.labels} - {"le", "quantile"}
            if fam.samples:
                out.setdefault(name, (fam.type, set()))[1].update(labels)
    return out


def test_catalogue_agrees_with_the_real_0517_pages():
    """Every family the two collectors define that a real engine put on its page has the catalogue's type
    and labels; the families the catalogue calls lazy are the ones absent from a fresh, failure-free page."""
    families = cat.sglang_families("0.5.17")
    real = _real_families("metrics-*-[bp]*-[pd]*.txt")
    real = {n: v for n, v in real.items() if n.startswith("sglang:") and "router" not in n}
    checked = 0
    for name, (kind, labels) in real.items():
        if name not in families:
            continue  # http_*, process_cpu_seconds_total, routing_key_*: other modules, not read by the kit
        assert families[name]["type"] == kind, name
        assert set(families[name]["labels"]) == labels, name
        checked += 1
    assert checked >= 60
    for name in ("sglang:num_transfer_failed_reqs_total", "sglang:num_bootstrap_failed_reqs_total",
                 "sglang:num_aborted_requests_total"):
        assert not families[name]["eager"] and name not in real, name
    for name in ("sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_total_mb"):
        assert families[name]["type"] == "histogram"
    # graphs off: the decode engine has only the decode_none child
    modes = {s.labels["mode"] for f in text_string_to_metric_families((REAL / "metrics-nograph-after-decode.txt")
                                                                      .read_text())
             for s in f.samples if s.name == "sglang:cuda_graph_passes_total"}
    assert modes == {"decode_none"}


def test_router_catalogue_agrees_with_the_recorded_router_pages():
    families = cat.router_families("sglang-router", "0.3.2")
    for name, (kind, labels) in _real_families("metrics-*-router.txt").items():
        assert families[name]["type"] == kind and set(families[name]["labels"]) == labels, name


# smg 1.13.0's PD and overload fault families (issue 31 item 4): the names are in its library, and the router
# creates each series only on its first event
SMG_FAULT_FAMILIES = ("smg_pd_rendezvous_failures_total", "smg_pd_bootstrap_failures_total", "smg_worker_stalled",
                      "smg_worker_stall_transitions_total", "smg_workers_overloaded",
                      "smg_admission_queue_rejected_total", "smg_pd_prefill_admission_rejections_total")


def test_the_fault_phase_catalogues_the_pd_rendezvous_counter():
    """The generator's fault phase (a prefill registered with a bootstrap port that refuses) recorded smg's
    rendezvous counter from the live page: lazy, by leg and phase; so the rendezvous alert may read it."""
    smg = cat.router_families("smg", "1.13.0")
    assert smg["smg_pd_rendezvous_failures_total"] == {"type": "counter", "labels": ["leg", "phase"], "eager": False}
    for name in gen.FAULT_FAMILIES[("smg", "1.13.0")]:
        assert name in SMG_FAULT_FAMILIES and smg[name]["eager"] is False, name
    assert "smg_pd_rendezvous_failures_total" not in cat.router_families("sglang-router", "0.3.2")


def test_every_smg_fault_family_is_catalogued_or_explained():
    """Each fault family is either made by the fault phase, or the generator's comment says why not; none is
    catalogued by another route (it would have been seen on a healthy page)."""
    source = Path(gen.__file__).read_text()
    why_not = source[source.index("# Not here, and why"):source.index("FAULT_FAMILIES = {")]
    made = set(gen.FAULT_FAMILIES[("smg", "1.13.0")])
    smg = cat.router_families("smg", "1.13.0")
    for name in SMG_FAULT_FAMILIES:
        if name in made:
            assert name in smg and name not in why_not, name
        else:
            assert name not in smg, f"{name} is catalogued but not by the fault phase"
            assert re.search(rf"\b{name}\b", why_not), f"{name}: neither made by the fault phase nor explained"


@pytest.mark.contract
def test_the_fault_families_are_in_the_smg_library():
    try:
        library = gen._router_library("smg", "1.13.0").read_bytes()
    except ContractEnvMissing as exc:
        require(False, str(exc))
    for name in SMG_FAULT_FAMILIES:
        assert name.encode() in library, name


_NAME = re.compile(r"(?<![A-Za-z0-9_:\"$.])((?:sglang:|smg_)[A-Za-z0-9_:]+)(\{[^}]*\})?")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def _family(name: str, families: dict[str, dict]) -> tuple[str, str]:
    """(family, suffix) of a sample name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)], suffix
    return name, ""


def _queries(spec) -> list[tuple[str, str]]:
    return all_promql(spec) + alert_conditions(spec)


def _engine_versions(spec) -> set[str]:
    return {spec.engine_version(e) for _, e in spec.engines()}


def _router_families(spec) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p, v in cat.ROUTERS:
        out.update(cat.router_families(p, v))
    return out


@pytest.mark.parametrize("example", ["lab", "cluster"])
def test_every_query_uses_what_the_engines_and_routers_export(example):
    """Names, types (a histogram only through _bucket/_sum/_count, nothing else through them) and label
    matchers of every dashboard query and alert expression, for every SGLang version the spec runs; a lazily
    created family needs its absence handled (`or`/`unless`/absent()) in every alert condition."""
    spec = _load_example(example)
    routers = _router_families(spec)
    absent_ok = {f"alert {a.name}": set(a.absent_ok) for a in alerts(spec)}
    problems = []
    for version in sorted(_engine_versions(spec)):
        engine = cat.sglang_families(version)
        for where, expr in _queries(spec):
            for m in _NAME.finditer(expr):
                sample, matchers = m.group(1), m.group(2) or ""
                families = engine if sample.startswith("sglang:") else routers
                fam, suffix = _family(sample, families)
                info = families.get(fam)
                if info is None:
                    problems.append(f"{version} {where}: {sample} is not exported")
                    continue
                if (info["type"] == "histogram") != bool(suffix):
                    problems.append(f"{version} {where}: {sample} reads a {info['type']} as "
                                    f"{'a histogram' if suffix else 'a plain series'}")
                for label in _MATCHER.findall(matchers):
                    if label not in info["labels"] and label not in TARGET_LABELS and label != "le":
                        problems.append(f"{version} {where}: {sample} has no label {label}")
                if (where.startswith("alert ") and not where.endswith("(value)") and not info["eager"]
                        and fam not in absent_ok.get(where, ())
                        and not re.search(r"\bor\b|\bunless\b|absent\(", expr)):
                    problems.append(f"{version} {where}: {sample} is created lazily and its absence is not handled")
    assert not problems, "\n".join(problems)


def test_the_query_check_can_fail():
    """The checker sees a gauge read of a histogram, a name no release exports and an unhandled lazy series."""
    engine = cat.sglang_families("0.5.23")
    assert _family("sglang:kv_transfer_speed_gb_s", engine) == ("sglang:kv_transfer_speed_gb_s", "")
    assert engine["sglang:kv_transfer_speed_gb_s"]["type"] == "histogram"
    assert "sglang:num_prefill_prealloc_queue_reqs" not in engine
    assert not engine[metricnames.SGLANG["transfer_failed"]]["eager"]


def test_every_name_the_kit_reads_is_in_the_catalogue_for_every_release():
    for version in cat.SGLANG_VERSIONS:
        families = cat.sglang_families(version)
        for key, name in metricnames.SGLANG.items():
            assert name in families, (version, key, name)
    routers = {}
    for p, v in cat.ROUTERS:
        routers[(p, v)] = cat.router_families(p, v)
    for key, name in metricnames.ROUTER.items():
        assert any(name in f for f in routers.values()), (key, name)
