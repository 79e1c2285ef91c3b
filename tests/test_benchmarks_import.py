"""Every benchmark script under benchmarks/ imports (its top level runs; its __main__ does not):
a script that names a function pdkit no longer has fails here, not when someone needs the figure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_the_benchmark_script_imports(path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # scripts insert the repository root
    spec = importlib.util.spec_from_file_location(f"pdkit_benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    assert hasattr(module, "main") or callable(getattr(module, "run", None)) or module.__doc__, path


def test_there_are_benchmark_scripts():
    assert len(BENCHMARKS) >= 5
