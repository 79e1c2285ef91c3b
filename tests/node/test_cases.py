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


def test_the_bundled_node_facts_read_each_fact_as_it_reads_alone():
    """NodeFacts runs every fact's own command in one round trip and parses each part with that
    fact's own parser: over every recorded case (one case per fact at a time, the H200's where
    there is one), the bundle's values equal the facts' values read one by one."""
    by_fact: dict[str, list] = {}
    for path in FACT_CASES:
        by_fact.setdefault(path.parent.name, []).append(load(path))
    names = tuple(node_facts.NODE_FACTS)
    bundle = node_facts.NodeFacts()
    command = bundle.command(names)
    for name, cls in node_facts.NODE_FACTS.items():
        assert cls().command() in command  # each fact's exact command, unchanged
    rounds = max(len(cases) for cases in by_fact.values())
    for i in range(rounds):
        cases = {name: by_fact[cls.__name__][i % len(by_fact[cls.__name__])] for name, cls in node_facts.NODE_FACTS.items()}
        output = [line for name in names for line in (node_facts.NODE_FACTS_MARK + name, *cases[name]["output"])]
        values = json.loads(json.dumps(bundle.process(output)))
        assert values == {name: cases[name]["fact"] for name in names}


def test_the_bundled_command_runs_here_and_agrees_with_each_fact_alone():
    """The real shell on this machine: one bundled command, the same values as eleven commands."""
    import subprocess

    def run(command: str) -> list[str]:
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    together = node_facts.NodeFacts().process(run(node_facts.NodeFacts().command(tuple(node_facts.NODE_FACTS))))
    for name, cls in node_facts.NODE_FACTS.items():
        lines = run(cls().command())
        assert together[name] == (cls().process(lines) if lines else cls.default()), name
