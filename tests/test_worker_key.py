"""A router worker's identity is decided once (issue 48 item 5: `rstrip("/")` 22 times in 7 modules):
pdkit.agent.health.worker_key; the roll, doctor, the router client and the gates compare worker URLs through it."""

from __future__ import annotations

import ast

import pytest

from pdkit.agent.health import worker_key
from tests.conftest import REPO


def test_a_trailing_slash_does_not_make_another_worker():
    assert worker_key("http://10.0.0.1:30000/") == worker_key("http://10.0.0.1:30000") == "http://10.0.0.1:30000"


@pytest.mark.parametrize("module", ["pdkit/roll/roller.py", "pdkit/roll/planning.py", "pdkit/doctor/observe.py",
                                    "pdkit/doctor/checks.py", "pdkit/doctor/checks_cluster.py"])
def test_worker_urls_are_compared_through_worker_key(module):
    """No `.rstrip("/")` left in the modules that compare a router's workers with the plan."""
    tree = ast.parse((REPO / module).read_text())
    stripped = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "rstrip" and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "/"]
    assert stripped == [], f"{module}: lines {stripped} strip a slash themselves; use pdkit.agent.health.worker_key"
