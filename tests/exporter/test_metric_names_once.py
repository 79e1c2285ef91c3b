"""pdkit-exporter's family names are written in one place (issue 48 item 5): pdkit/upstream/metricnames.py. The exporter
writes them from there and doctor reads them from there; neither spells one out."""

from __future__ import annotations

import ast

import pytest

from pdkit.upstream.metricnames import EXPORTER, EXPORTER_FAMILIES
from tests.conftest import REPO


@pytest.mark.parametrize("module", ["pdkit/agent/exporter/collector.py", "pdkit/doctor/observe.py"])
def test_no_exporter_family_name_is_spelled_out(module):
    tree = ast.parse((REPO / module).read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    spelled = [f"{module}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
               and any(n.value.startswith(p) for p in ("pdkit_engine", "pdkit_decode_", "pdkit_prefill_", "pdkit_node_",
                                                        "pdkit_exporter_"))]
    assert spelled == [], spelled


def test_the_dashboards_families_are_exporter_families():
    assert set(EXPORTER.values()) <= set(EXPORTER_FAMILIES.values())
    assert all(v.startswith("pdkit_") and k == v.removeprefix("pdkit_") for k, v in EXPORTER_FAMILIES.items())
