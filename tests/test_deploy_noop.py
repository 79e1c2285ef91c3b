"""deploy/pd.py's prepare on a converged lab, no host contacted (benchmarks/noop_cost.py's harness:
pyinfra's own loader, every fact answered as a converged host answers it): a no-op re-run plans
each host once, reads each host in one round trip, and would run nothing."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host

import pdkit.hosts.deploy
from pdkit.inventory.loader import load
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, REPO, load_script, write_inventory

noop = load_script("benchmarks/noop_cost.py", "pdkit_bench_noop_cost")


@pytest.fixture()
def lab_checkout(tmp_path, monkeypatch):
    """The planned lab (none running), run from the checkout as `pyinfra inventories/lab.py deploy/pd.py`."""
    monkeypatch.setenv("PDKIT_LAB_DIR", str(tmp_path / "no-lab"))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", list(noop.ARGV))


def test_a_converged_no_op_plans_each_host_once_reads_it_once_and_runs_nothing(lab_checkout, tmp_path):
    row = noop._prepare_once(REPO, 4, tmp_path)
    assert row["hosts"] == 5  # 4 GPU hosts (the router on the first) and lab-mon
    # the roles ask for a host's plan seven times: it is computed once per host
    assert row["plans"] == 5
    # one round trip per host: on a `gpu: none` host the host-state probe reads the preflight's
    # facts itself (roles/node_facts.py PROBE_TEXTS); lab-mon has no preflight
    assert row["facts"] == {"PdkitHostState": 5}
    # no operation at all: nothing changes, so not even the release record is declared
    assert (row["ops"], row["would_run"]) == (0, 0)


def test_a_host_on_another_release_records_one_and_only_it(lab_checkout, tmp_path, monkeypatch):
    converged = noop._converged

    def one_host_behind(spec, plan, kwargs, digest):
        state = converged(spec, plan, kwargs, digest)
        if plan.host == "lab-gpu2":
            state["release"] = dict(state["release"], hash="an-older-release")
        return state

    monkeypatch.setattr(noop, "_converged", one_host_behind)
    row = noop._prepare_once(REPO, 4, tmp_path)
    # the release record, on lab-gpu2 alone, and it runs
    assert (row["ops"], row["would_run"]) == (1, 1)


class _State:
    """Stands for a pyinfra State (the plans are kept per State)."""


def test_a_plan_is_made_again_for_another_spec_or_another_state(tmp_path, monkeypatch):
    specs = [load(str(write_inventory(tmp_path, BASE_HOSTS, BASE_CLUSTER))) for _ in range(2)]
    calls = []
    monkeypatch.setattr(pdkit.hosts.deploy, "plan_host", lambda spec, host: calls.append((spec, host.name)) or object())
    current = {"spec": specs[0]}
    monkeypatch.setattr(pdkit.hosts.deploy, "current_spec", lambda: current["spec"])
    first, second = _State(), _State()
    with ctx_host.use(SimpleNamespace(name="gpu01", state=first)):
        plan = pdkit.hosts.deploy.current_plan()
        assert pdkit.hosts.deploy.current_plan() is plan
        current["spec"] = specs[1]  # another spec (another inventory): planned again
        assert pdkit.hosts.deploy.current_plan() is not plan
    with ctx_host.use(SimpleNamespace(name="gpu02", state=first)):
        pdkit.hosts.deploy.current_plan()
    with ctx_host.use(SimpleNamespace(name="gpu01", state=second)):  # another State (a roll's next batch)
        pdkit.hosts.deploy.current_plan()
    assert calls == [(specs[0], "gpu01"), (specs[1], "gpu01"), (specs[1], "gpu02"), (specs[1], "gpu01")]
