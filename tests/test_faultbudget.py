"""The fault budget (pdkit/faultbudget.py): rendered where SGLang and the routers read it, nested,
checked against each fault's worst wait, and tied to the pinned wheels' own names and defaults."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from pdkit import faultbudget, flags
from pdkit.cli import main
from pdkit.faultbudget import ENGINE_VARIABLES, NESTING, FaultBudget
from pdkit.loader import load
from pdkit.parsertable import router_default, router_has_flag, sglang_environment
from pdkit.sim.knobs import ENV_NAMES, SGLANG_KNOBS, load_knobs
from pdkit.versions import ROUTER_RELEASES, SGLANG_RELEASES
from tests.conftest import REPO, write_inventory


def test_the_defaults_nest_and_fit_the_budget():
    budget = FaultBudget()
    for inner, outer, _ in NESTING:
        assert getattr(budget, inner) < getattr(budget, outer), (inner, outer)
    assert faultbudget.problems(budget, 5, 2) == []
    waits = faultbudget.fault_waits(budget, 5, 2)
    assert max(w.seconds for w in waits) <= budget.budget_s


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_every_rendered_variable_is_one_the_pinned_release_reads(version):
    """A renamed or dropped SGLang variable would be silently ignored by the engine: the table of
    the release's own Envs (pdkit/parser_table.json) must have each one, with the type pdkit writes."""
    environment = sglang_environment(version)
    for field, var in ENGINE_VARIABLES.items():
        assert var in environment, f"SGLang {version} has no {var} (sglang/srt/environ.py)"
        kind = environment[var]["type"]
        assert kind in ("EnvInt", "EnvFloat"), (var, kind)
        rendered = faultbudget.engine_env(FaultBudget())[var]
        # SGLang's EnvInt parses with int(): never write "60.0" to one
        if kind == "EnvInt":
            int(rendered)


@pytest.mark.parametrize("package,version", sorted(ROUTER_RELEASES))
def test_router_flags_exist_in_the_parser_that_gets_them(package, version):
    pd = faultbudget.router_args(FaultBudget(), package, version, pd=True)
    flags_given = pd[::2]
    for flag in flags_given:
        assert router_has_flag(package, version, flag), (package, flag)
    assert ("--pd-admission-wait-secs" in flags_given) == router_has_flag(package, version, "--pd-admission-wait-secs")
    assert "--pd-admission-wait-secs" not in faultbudget.router_args(FaultBudget(), package, version, pd=False)
    # the routers' own defaults are minutes: the budget changes them
    assert router_default(package, version, "--request-timeout-secs") == 1800
    assert router_default(package, version, "--retry-max-backoff-ms") == 30000


def test_sglang_router_has_no_admission_gate_and_smg_has():
    assert not router_has_flag("sglang-router", "0.3.2", "--pd-admission-wait-secs")
    assert router_has_flag("smg", "1.13.0", "--pd-admission-wait-secs")


@pytest.mark.parametrize("inner,outer,_why", NESTING)
def test_each_nesting_pair_is_refused_naming_both_fields(inner, outer, _why):
    values = FaultBudget().model_dump()
    values[inner] = values[outer]
    with pytest.raises(ValidationError) as err:
        FaultBudget(**values)
    assert inner in str(err.value) and outer in str(err.value)


def test_a_heartbeat_below_sglangs_floor_is_refused():
    with pytest.raises(ValidationError, match="greater than or equal to 2"):
        FaultBudget(heartbeat_interval_s=1)


def test_a_budget_too_small_for_a_fault_names_what_bounds_it():
    problems = faultbudget.problems(FaultBudget(budget_s=10), 5, 2)
    text = "\n".join(m for _, m in problems)
    assert "15 tries" in text  # SGLang's fixed pre-handshake retries
    assert "router's health checks" in text
    assert {f for f, _ in problems} == {"pdkit_cluster.fault_budget.heartbeat_interval_s", "pdkit_router.health_check_interval_secs"}


def test_a_heartbeat_slower_than_the_waiting_timeout_is_a_problem():
    budget = FaultBudget(heartbeat_interval_s=20, heartbeat_max_failures=3, budget_s=100, waiting_timeout_s=50)
    fields = [f for f, _ in faultbudget.problems(budget, 5, 2)]
    assert "pdkit_cluster.fault_budget.waiting_timeout_s" in fields


def test_a_unified_cluster_has_only_the_router_wait():
    waits = faultbudget.fault_waits(FaultBudget(), 5, 2, pd=False)
    assert [w.fault for w in waits] == ["engine or node down, new requests through the router",
                                        "worker failed mid-request, the router's retries"]


def test_rendered_into_pd_engines_and_the_router(monkeypatch):
    monkeypatch.chdir(REPO)
    spec = load("inventories/cluster.py")
    for host, engine in spec.engines():
        env = flags.engine_env(spec, host, engine)
        assert env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "60"
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "2"
    argv = flags.router_args(spec, spec.router_hosts[0])
    assert argv[argv.index("--request-timeout-secs") + 1] == "1800"
    assert argv[argv.index("--health-check-timeout-secs") + 1] == "3"
    assert argv[argv.index("--health-check-interval-secs") + 1] == "5"


def test_the_sim_reads_the_same_variables_with_the_releases_defaults():
    for knob, field in SGLANG_KNOBS.items():
        assert ENV_NAMES[knob] == ENGINE_VARIABLES[field]
    for version in SGLANG_RELEASES:
        knobs = load_knobs({"PDKIT_SIM_SGLANG_VERSION": version})
        environment = sglang_environment(version)
        assert knobs.waiting_timeout_s == environment["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"]["default"]
        assert knobs.heartbeat_interval_s == environment["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"]["default"]
    # SGLang's floor on the heartbeat applies in the sim too
    assert load_knobs({"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.3"}).effective_heartbeat_interval_s == 2.0


def _validate(tmp_path, base, capsys, mutate):
    cluster, hosts = base
    mutate(cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)
    code = main(["validate", str(inv)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_validate_names_the_field_of_a_bad_nesting(base, tmp_path, capsys):
    code, text = _validate(tmp_path, base, capsys, lambda c, h: c.update(fault_budget={"waiting_timeout_s": 2000}))
    assert code == 2
    assert "pdkit_cluster.fault_budget" in text and "waiting_timeout_s (2000) must be below router_request_timeout_s (1800)" in text


def test_validate_names_the_router_host_of_a_slow_health_check(base, tmp_path, capsys):
    code, text = _validate(tmp_path, base, capsys, lambda c, h: h["gpu01"]["pdkit_router"].update(health_check_interval_secs=30))
    assert code == 2
    assert "gpu01: pdkit_router.health_check_interval_secs" in text and "over fault_budget.budget_s" in text


def test_validate_prints_each_faults_worst_wait(base, tmp_path, capsys):
    code, text = _validate(tmp_path, base, capsys, lambda c, h: None)
    assert code == 0, text
    assert "fault budget 20 s" in text
    assert "prefill killed, request already handed to the decode: at most 4 s" in text


def test_an_admission_wait_for_sglang_router_warns(base, tmp_path, capsys):
    def mutate(c, h):
        c.update(sglang_version="0.5.17", fault_budget={"router_admission_wait_s": 10})
    code, text = _validate(tmp_path, base, capsys, mutate)
    assert code == 0, text
    assert "pdkit_cluster.fault_budget.router_admission_wait_s" in text and "has no --pd-admission-wait-secs" in text



@pytest.mark.parametrize("field, value, phrase", [
    ("budget_s", 20000, "budget_s 20000 is outside 0-3600, the range it can sensibly take: does it look like milliseconds?"),
    ("heartbeat_interval_s", 2000, "heartbeat_interval_s 2000 is outside 0-600"),
    ("router_health_check_timeout_s", 3000, "does it look like milliseconds? give seconds"),
    ("router_max_backoff_ms", 120000, "milliseconds: e.g. 1000 for one second"),
    ("router_max_retries", 50, "adds its backoff to the request's wait"),
])
def test_a_value_in_the_wrong_unit_is_refused_naming_its_range(field, value, phrase):
    """Issue 46: bounds that catch milliseconds written as seconds (and the reverse), beyond nesting."""
    with pytest.raises(ValueError, match=re.escape(phrase)):
        FaultBudget(**{field: value})


def test_the_routers_retries_count_in_the_worst_wait_and_name_their_setting():
    """Issue 46: 5 attempts with up to 10 s between them wait 40 s on a failed worker: over a 20 s budget."""
    budget = FaultBudget(router_max_retries=5, router_max_backoff_ms=10000)
    wait = faultbudget.retry_wait(budget)
    assert wait.seconds == 40.0 and "4 pause(s) of up to router_max_backoff_ms (10000 ms)" in wait.bound_by
    found = faultbudget.problems(budget, 5, 2)
    assert ("pdkit_cluster.fault_budget.router_max_backoff_ms",) == tuple(f for f, m in found if "retries" in m), found
    assert faultbudget.problems(FaultBudget(), 5, 2) == []
