"""Every fact and operation case under tests/node/ (see tests/node/runner.py for the format)."""

from __future__ import annotations

import json

import pytest

from roles import node_facts
from tests.node.runner import FACT_CASES, OPERATION_CASES, load, run_operation_case


@pytest.mark.parametrize("path", FACT_CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fact_case(path):
    case = load(path)
    cls = getattr(node_facts, path.parent.name)
    fact = cls()
    assert fact.command() == case["command"]
    value = fact.process(case["output"]) if case["output"] else cls.default()
    assert json.loads(json.dumps(value)) == case["fact"]


def test_every_custom_fact_has_a_case():
    covered = {p.parent.name for p in FACT_CASES}
    assert set(c.__name__ for c in node_facts.NODE_FACTS.values()) <= covered


@pytest.mark.parametrize("path", OPERATION_CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_operation_case(path, monkeypatch):
    case = load(path)
    assert run_operation_case(case, monkeypatch) == case["commands"]


def test_h200_cases_are_the_real_output_of_their_own_commands():
    """Each h200-* case's output is what its exact command printed on the lent 2x H200."""
    from tests.node.runner import HERE

    real = json.loads((HERE / "data" / "h200-x2-fact-commands.json").read_text())
    cases = [p for p in FACT_CASES if p.stem.startswith("h200")]
    assert len(cases) >= 10
    for path in cases:
        case, captured = load(path), real[path.parent.name]
        assert (case["command"], case["output"]) == (captured["command"], captured["output"]), path.name


def test_the_shared_repository_deploy_is_laid_down_once_per_host():
    from tests.node.runner import HERE

    ops = [op["op"] for op in load(HERE / "operations" / "node" / "ubuntu2404-fresh.json")["commands"]]
    assert sum("Install cuda-keyring" in op for op in ops) == 1
    assert sum("NVIDIA apt source" in op for op in ops) == 1
    assert load(HERE / "operations" / "node" / "lab-host-gpu-none.json")["commands"] == []
