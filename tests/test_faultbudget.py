"""The fault budget (pdkit/spec/faultbudget.py): rendered where SGLang and the routers read it, nested,
checked against each fault's worst wait, and tied to the pinned wheels' own names and defaults."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from pdkit.cli import main
from pdkit.inventory.loader import load
from pdkit.render import flags
from pdkit.sim.knobs import ENV_NAMES, SGLANG_KNOBS, load_knobs
from pdkit.spec import faultbudget
from pdkit.spec.faultbudget import ENGINE_VARIABLES, NESTING, FaultBudget
from pdkit.upstream.parsertable import router_default, router_has_flag, sglang_environment
from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES
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
    the release's own Envs (pdkit/upstream/parser_table.json) must have each one, with the type pdkit writes."""
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
    """Issue 46: the router's retries, spaced as the routers space them (RetrySchedule): 20 attempts with the
    cap at 10 s wait ~95 s on a failed worker, over a 20 s budget; the setting named is the cap, which binds."""
    budget = FaultBudget(router_max_retries=20, router_max_backoff_ms=10000)
    wait = faultbudget.retry_wait(budget)
    # 50 x 1.5^n for n = 0..13 (the last below the cap), then 5 pauses at the cap, each + 20% jitter
    expected = sum(min(int(50 * 1.5 ** n), 10000) * 1.2 for n in range(19)) / 1000
    assert wait.seconds == pytest.approx(expected, abs=0.01) and 90 < wait.seconds < 100
    assert "19 pause(s) of at most 60, 90, 134, 202, 304, 455, ... ms" in wait.bound_by
    found = faultbudget.problems(budget, 5, 2)
    assert ("pdkit_cluster.fault_budget.router_max_backoff_ms",) == tuple(f for f, m in found if "retries" in m), found
    assert faultbudget.problems(FaultBudget(), 5, 2) == []


def test_the_default_retries_wait_a_fraction_of_a_second():
    """3 attempts: pauses of 50 and 75 ms from the routers' schedule, + 20% jitter each: the cap (1,000 ms)
    never binds. The old arithmetic said 2 s (2 pauses of the whole cap)."""
    wait = faultbudget.retry_wait(FaultBudget())
    assert wait.seconds == pytest.approx(0.15) and "2 pause(s) of at most 60, 90 ms" in wait.bound_by
    assert wait.field == "pdkit_cluster.fault_budget.router_max_retries"  # the cap does not bind: more attempts do


def test_the_jitter_comes_after_the_cap():
    """smg's and sglang-router's BackoffCalculator: min(initial x mult^n, cap), then +-jitter of that. Measured
    on both (initial = cap = 1000, jitter 0.5): pauses up to 1,388 ms."""
    schedule = faultbudget.RetrySchedule(initial_backoff_ms=1000, multiplier=1, jitter=0.5)
    assert schedule.worst_pauses_ms(6, 1000) == [1500] * 5
    assert faultbudget.RetrySchedule().worst_pauses_ms(6, 100) == [60, 90, 120, 120, 120]


def test_one_attempt_or_disabled_retries_wait_nothing():
    assert faultbudget.retry_wait(FaultBudget(router_max_retries=1)).seconds == 0
    wait = faultbudget.retry_wait(FaultBudget(router_max_retries=5), faultbudget.RetrySchedule(disabled=True))
    assert wait.seconds == 0 and "--disable-retries" in wait.bound_by


@pytest.mark.parametrize("package,version", sorted(ROUTER_RELEASES))
def test_the_retry_schedules_defaults_are_each_routers_own(package, version):
    assert faultbudget.RetrySchedule.of_release(package, version) == faultbudget.ROUTER_RETRY_DEFAULTS


def test_extra_args_that_change_the_schedule_change_the_worst_wait(base, tmp_path):
    """--retry-initial-backoff-ms 5000 in extra_args (the cap at 5000 too, or the router refuses to start):
    5 attempts pause 4 x (5 s + 20%) = 24 s, over the 20 s budget, which validate counts."""
    from pdkit.inventory.loader import load_with_problems

    cluster, hosts = base
    hosts["gpu01"]["pdkit_router"]["extra_args"] = ["--retry-initial-backoff-ms", "5000"]
    cluster["fault_budget"] = {"router_max_backoff_ms": 5000, "router_max_retries": 5}
    spec, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    errors = [p for p in problems if p.severity == "error"]
    assert [p.field for p in errors] == ["pdkit_cluster.fault_budget.router_max_backoff_ms"], problems
    assert "can wait 24 s" in errors[0].message and "4 pause(s) of at most 6000, 6000, 6000, 6000 ms" in errors[0].message


@pytest.mark.parametrize("value", [0, 49])
def test_a_max_backoff_below_the_initial_backoff_is_refused_by_validate(value, base, tmp_path, capsys):
    """Issue 46: 0 read as "no pause" in the old arithmetic; both routers refuse a cap below the initial backoff
    (50 ms) at start (retry.max_backoff_ms: Must be >= initial_backoff_ms)."""
    code, text = _validate(tmp_path, base, capsys, lambda c, h: c.update(fault_budget={"router_max_backoff_ms": value}))
    assert code == 2
    assert "pdkit_cluster.fault_budget.router_max_backoff_ms" in text and "valid: 50 to 60000" in text


def test_an_admission_wait_of_0_stays_valid(base, tmp_path, capsys):
    """smg 1.13.0: 0 sheds at once (a 503 when the decode's window is full), a meaning the budget can take."""
    code, text = _validate(tmp_path, base, capsys, lambda c, h: c.update(fault_budget={"router_admission_wait_s": 0}))
    assert code == 0, text


@pytest.mark.parametrize("field", ["router_request_timeout_s", "router_max_retries"])
def test_zero_where_the_routers_refuse_it_is_refused(field):
    """No "0 = no timeout" and no "0 retries": both routers refuse 0 at start (pdkit.spec.checks.ROUTER_START_RULES)."""
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        FaultBudget(**{field: 0})
