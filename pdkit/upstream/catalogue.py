"""The metric catalogue: what each pinned SGLang release and router really export.

The catalogue is data (pdkit/upstream/data/metric_catalogue.json), read here by the kit, the sim and the
tests: per SGLang release and router, each family's type, label names, buckets, and whether
its child exists once the engine has logged its stats (`eager`) or only after the first event
that touches it (`lazy`). pdkit.upstream.metricnames holds the names the kit reads and
tests/test_metric_queries.py checks every query against this file.

Generated, never written by hand: `python -m pdkit.contract.catalogue_gen` rewrites it from the
pinned wheels and the smg binary in the contract virtualenvs (how, and why each family is or is
not there: that module's docstring); CI reruns the generator and fails on any difference
(tests/test_catalogue.py). This module holds only the reader: the sim imports it, so it stays
on the node's rules (standard library and the node lock).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdkit.upstream.tables import read_table

CATALOGUE_PATH = Path(__file__).parent / "data" / "metric_catalogue.json"
SGLANG_VERSIONS = ("0.5.17", "0.5.23")
ROUTERS = (("smg", "1.13.0"), ("sglang-router", "0.3.2"))


def catalogue() -> dict[str, Any]:
    return read_table(CATALOGUE_PATH)


def sglang_families(version: str) -> dict[str, dict[str, Any]]:
    """{family name as on /metrics (counters with _total): {type, labels, eager, ...}}."""
    families: dict[str, dict[str, Any]] = catalogue()["sglang"][version]["families"]
    return families


def router_families(package: str, version: str) -> dict[str, dict[str, Any]]:
    families: dict[str, dict[str, Any]] = catalogue()["routers"][f"{package}-{version}"]["families"]
    return families


def log_formats(version: str) -> dict[str, str]:
    formats: dict[str, str] = catalogue()["sglang"][version]["log_formats"]
    return formats


def series_names(name: str, kind: str) -> tuple[str, ...]:
    """The sample names one family puts on /metrics."""
    if kind == "histogram":
        return (f"{name}_bucket", f"{name}_sum", f"{name}_count")
    if kind == "summary":
        return (name, f"{name}_sum", f"{name}_count")
    return (name,)
