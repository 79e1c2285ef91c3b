"""What the pinned routers refuse at start, refused by `pdkit validate` first (issue 46).

pdkit.spec.checks.ROUTER_START_RULES tables, per rendered router flag and release, the values smg 1.13.0 and
sglang-router 0.3.2 refuse in Router.start() (their ConfigValidator, or the Python binding's integer
conversion); the power_of_two rules (a policy with fewer than two workers of its kind) live in
pdkit/spec/checks.py. Here:

- each row, at a value it refuses: `pdkit validate` exits 2 naming the host and the field (and, where pdkit's
  own rule is the row's, what is valid); at its least accepted value: no start problem;
- values that must stay valid (a max backoff at the initial backoff, an initial backoff lowered in
  extra_args, an admission wait of 0, power_of_two over two workers);
- the live part: the real routers (the contract virtualenvs, .ci/contract-env.sh) run with pdkit's rendered
  argv, each row's refused value on its own (the router exits before it serves, naming the row's setting),
  and every row's accepted value together (it serves its port: past the start-up check); where the
  releases differ, the release that does not refuse a row starts with it.
"""

from __future__ import annotations

import copy
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pdkit.cli import main
from pdkit.inventory.loader import load
from pdkit.render import flags
from pdkit.spec.checks import ROUTER_START_RULES, U32_MAX, RouterStartRule, router_start_problems, router_values
from pdkit.upstream.venvs import router_python
from pdkit.upstream.versions import ROUTER_RELEASES
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, require, write_inventory

SMG, SGLANG_ROUTER = "smg 1.13.0", "sglang-router 0.3.2"
FLOAT_FLAGS = ("--retry-backoff-multiplier", "--retry-jitter-factor")


def _step(rule: RouterStartRule) -> float:
    return 0.01 if rule.flag in FLOAT_FLAGS else 1


def refused_value(rule: RouterStartRule, floor: float = 50) -> float:
    """A value the row refuses: just below its floor, else just above its ceiling."""
    if rule.low_flag is not None:
        return floor - 1
    if rule.low is not None:
        return rule.low - _step(rule)
    assert rule.high is not None
    return rule.high + _step(rule)


def accepted_value(rule: RouterStartRule, floor: float = 50) -> float:
    """The row's least accepted value (its ceiling where it has only one)."""
    if rule.low_flag is not None:
        return floor
    return rule.low if rule.low is not None else rule.high  # type: ignore[return-value]


def _text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _inventory(tmp_path, package: str = "smg", mutate=None) -> Path:
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    router = hosts["gpu01"]["pdkit_router"]
    router["auth"] = "none"
    if package == "sglang-router":
        router["package"] = "sglang-router"
    if mutate is not None:
        mutate(cluster, hosts, router)
    return write_inventory(tmp_path, hosts, cluster)


def _set(rule: RouterStartRule, value: float):
    """A mutation writing VALUE into the row's field (extra_args rows: the flag in extra_args)."""
    number: float | int = int(value) if float(value).is_integer() and rule.flag not in FLOAT_FLAGS else value

    def mutate(cluster, hosts, router):
        section, _, name = rule.field.rpartition(".")
        if rule.field == "pdkit_router.extra_args":
            router["extra_args"] = [rule.flag, _text(value)]
        elif section == "pdkit_router":
            router[name] = number
        else:
            assert section == "pdkit_cluster.fault_budget", rule.field
            cluster.setdefault("fault_budget", {})[name] = number
    return mutate


def _validate(path: Path, capsys) -> tuple[int, str]:
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _errors(text: str) -> list[tuple[str, str, str]]:
    """(host, field, message) of each error line validate printed."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^\s*error\s+(\S+): (\S+): (.*)$", line)
        if match:
            out.append(match.groups())
    return out


def _id(rule: RouterStartRule) -> str:
    side = "floor" if rule.low is not None or rule.low_flag else "ceiling"
    return f"{rule.flag.removeprefix('--')}-{side}"


def _package(rule: RouterStartRule) -> str:
    return rule.refused_by[0].split()[0]


# ---- validate refuses each row; its least accepted value passes ---------------------------------------

@pytest.mark.parametrize("rule", ROUTER_START_RULES, ids=_id)
def test_validate_refuses_each_rows_value_naming_host_and_field(rule, tmp_path, capsys):
    package = _package(rule)
    code, text = _validate(_inventory(tmp_path, package, _set(rule, refused_value(rule))), capsys)
    assert code == 2, text
    fields = [re.sub(r"\[\d+\]$", "", f) for h, f, _ in _errors(text) if h == "gpu01"]
    assert rule.field in fields, text


@pytest.mark.parametrize("rule", [r for r in ROUTER_START_RULES if r.high is not None or r.low_flag is not None
                                  or r.field == "pdkit_router.extra_args"], ids=_id)
def test_a_row_pdkits_model_lets_through_says_what_the_router_refuses_and_what_is_valid(rule, tmp_path, capsys):
    """The rows no model bound covers: the message is the row's, with the release, its words and the valid range."""
    code, text = _validate(_inventory(tmp_path, _package(rule), _set(rule, refused_value(rule))), capsys)
    assert code == 2, text
    message = next(m for h, f, m in _errors(text) if f.startswith(rule.field) and "refuses to start" in m)
    assert f"{rule.refused_by[0]} refuses to start" in message and rule.says in message and "valid: " in message


def _spec_with(tmp_path, package: str, rule: RouterStartRule | None = None, value: float | None = None):
    """The base cluster's spec with one row's field at VALUE, set past the models (a value of a row that no
    model bound covers may also break the fault budget: the rows are checked on their own here)."""
    spec = load(str(_inventory(tmp_path, package)))
    if rule is None:
        return spec
    host = spec.router_hosts[0]
    router, budget = host.router, spec.cluster.fault_budget
    section, _, name = rule.field.rpartition(".")
    number = value if rule.flag in FLOAT_FLAGS else int(value)
    if rule.field == "pdkit_router.extra_args":
        router = router.model_copy(update={"extra_args": (rule.flag, _text(value))})
    elif section == "pdkit_router":
        router = router.model_copy(update={name: number})
    else:
        budget = budget.model_copy(update={name: number})
    hosts = tuple(h.model_copy(update={"router": router}) if h.name == host.name else h for h in spec.hosts)
    return spec.model_copy(update={"hosts": hosts, "cluster": spec.cluster.model_copy(update={"fault_budget": budget})})


# each row with each router that renders its flag (sglang-router 0.3.2 has no --pd-admission-wait-secs: pdkit
# renders it for smg only)
ROWS_BY_ROUTER = [pytest.param(rule, package, id=f"{_id(rule)}-{package}") for rule in ROUTER_START_RULES
                  for package in ("smg", "sglang-router")
                  if not (rule.flag == "--pd-admission-wait-secs" and package != "smg")]


@pytest.mark.parametrize("rule, package", ROWS_BY_ROUTER)
def test_each_rows_least_accepted_value_is_no_start_problem_and_its_refused_value_is_one(rule, package, tmp_path):
    spec = _spec_with(tmp_path, package, rule, accepted_value(rule))
    assert router_start_problems(spec, spec.router_hosts[0]) == []
    spec = _spec_with(tmp_path, package, rule, refused_value(rule))
    found = router_start_problems(spec, spec.router_hosts[0])
    release = " ".join(spec.router_release(spec.router_hosts[0]))
    if release in rule.refused_by:
        assert [f for f, _ in found] == [rule.field if rule.field != "pdkit_router.extra_args"
                                         else "pdkit_router.extra_args[0]"], found
        assert "valid: " in found[0][1] and release in found[0][1]
    else:
        assert found == [], "pdkit refuses it through the model for this release (the row's `otherwise`)"


def test_the_rows_name_real_fields_and_flags_pdkit_renders(tmp_path):
    from pdkit.spec.faultbudget import FaultBudget
    from pdkit.spec.models import Router

    for package in ("smg", "sglang-router"):
        spec = _spec_with(tmp_path, package)
        argv = flags.router_args(spec, spec.router_hosts[0])
        release = " ".join(spec.router_release(spec.router_hosts[0]))
        for rule in ROUTER_START_RULES:
            section, _, name = rule.field.rpartition(".")
            model = {"pdkit_router": Router, "pdkit_cluster.fault_budget": FaultBudget}[section]
            assert name in model.model_fields, rule
            assert set(rule.refused_by) <= {SMG, SGLANG_ROUTER} and rule.says and rule.source, rule
            if name != "extra_args" and not (rule.otherwise.startswith(release) and "no such flag" in rule.otherwise):
                assert rule.flag in argv, f"{release}: {rule.flag} is not rendered (pdkit.render.flags.router_args)"
            if set(rule.refused_by) != {SMG, SGLANG_ROUTER}:
                assert rule.otherwise, f"{rule.flag}: say what the other release does and why pdkit refuses it"
        # the checker reads the fields, pdkit.render.flags renders them: the same values
        for flag, (value, _field) in router_values(spec, spec.router_hosts[0]).items():
            assert float(argv[argv.index(flag) + 1]) == value, flag


# ---- values that must stay valid ---------------------------------------------------------------------

@pytest.mark.parametrize("label,package,mutate", [
    ("backoff cap at the initial backoff", "smg",
     lambda c, h, r: c.update(fault_budget={"router_max_backoff_ms": 50})),
    ("backoff cap at the initial backoff, sglang-router", "sglang-router",
     lambda c, h, r: c.update(fault_budget={"router_max_backoff_ms": 50})),
    ("initial backoff lowered in extra_args below the cap", "smg",
     lambda c, h, r: (c.update(fault_budget={"router_max_backoff_ms": 20}),
                      r.update(extra_args=["--retry-initial-backoff-ms", "10"]))),
    ("one attempt", "smg", lambda c, h, r: c.update(fault_budget={"router_max_retries": 1})),
    ("admission wait 0: a 503 at once", "smg", lambda c, h, r: c.update(fault_budget={"router_admission_wait_s": 0})),
    ("power_of_two over two decodes", "smg",
     lambda c, h, r: (r.pop("workers"), r.update(decode_policy="power_of_two", prefill_policy="power_of_two"),
                      h["gpu02"]["pdkit_node"].update(ucx_net_devices="mlx5_0:1"),
                      h["gpu01"]["pdkit_node"].update(ucx_net_devices="mlx5_0:1"))),
    ("jitter and multiplier at their bounds", "sglang-router",
     lambda c, h, r: r.update(extra_args=["--retry-jitter-factor", "1.0", "--retry-backoff-multiplier", "1.0"])),
])
def test_what_the_routers_accept_stays_valid(label, package, mutate, tmp_path, capsys):
    code, text = _validate(_inventory(tmp_path, package, mutate), capsys)
    assert code == 0, f"{label}: {text}"
    assert "refuses to start" not in text


def test_a_max_backoff_below_an_initial_backoff_raised_in_extra_args_names_both(tmp_path, capsys):
    def mutate(cluster, hosts, router):
        router["extra_args"] = ["--retry-initial-backoff-ms", "2000"]
    code, text = _validate(_inventory(tmp_path, "smg", mutate), capsys)
    assert code == 2, text
    assert ("gpu01", "pdkit_cluster.fault_budget.router_max_backoff_ms",
            "1000 is below the router's initial backoff (--retry-initial-backoff-ms 2000, pdkit_router.extra_args[0]): "
            "smg 1.13.0 refuses to start") in [(h, f, m[:133]) for h, f, m in _errors(text)], text


@pytest.mark.parametrize("package", ["smg", "sglang-router"])
@pytest.mark.parametrize("field,role,mutate", [
    ("policy", "workers", lambda c, h, r: (h["gpu01"]["pdkit_node"].update(engines=[
        {"name": "one", "role": "unified", "gpus": [0], "port": 30000}]), r.update(workers=["gpu01/one"],
                                                                                      policy="power_of_two"),
        h["gpu02"]["pdkit_node"].update(engines=[]))),
    ("prefill_policy", "prefill workers", lambda c, h, r: r.update(prefill_policy="power_of_two")),
    ("decode_policy", "decode workers", lambda c, h, r: r.update(decode_policy="power_of_two")),
])
def test_power_of_two_over_one_worker_is_refused_for_each_policy(field, role, mutate, package, tmp_path, capsys):
    code, text = _validate(_inventory(tmp_path, package, mutate), capsys)
    assert code == 2, text
    assert any(h == "gpu01" and f == f"pdkit_router.{field}" and m.startswith(f"power_of_two needs at least 2 {role}")
               for h, f, m in _errors(text)), text


# ---- the real routers -----------------------------------------------------------------------------------

# a router serves its port only once its start-up check has passed (a refused one exits before it
# binds: measured on both); neither within this long is a hang, not a verdict
VERDICT_WITHIN_S = 60.0


def _launcher(release: str) -> list[str]:
    package, version = release.split()
    python = router_python(package, version)
    require(python is not None, f"no {release} contract env (make contract-env)")
    launcher = ROUTER_RELEASES[(package, version)].launcher
    binary = python.parent / launcher[0] if launcher[0] != "python" else python
    return [str(binary), *launcher[1:]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_argv(release: str, tmp_path: Path, mutate=None) -> list[str]:
    """pdkit's rendered router argv for RELEASE, pointed at this machine: workers on closed local ports,
    the router and its metrics on free ones."""
    spec = load(str(_inventory(tmp_path, release.split()[0], mutate)))
    argv = flags.router_args(spec, spec.router_hosts[0])
    out, closed = [], iter(range(1, 100))
    for i, token in enumerate(argv):
        if token.startswith("http://"):
            token = f"http://127.0.0.1:{next(closed)}"
        elif argv[i - 1] in ("--host", "--prometheus-host") and i > 0:
            token = "127.0.0.1"
        elif argv[i - 1] in ("--port", "--prometheus-port") and i > 0:
            token = str(_free_port())
        out.append(token)
    return out


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def _run(release: str, argv: list[str]) -> tuple[bool, str]:
    """(started, its output): started once the router accepts a connection on its --port (past its
    start-up check), refused when it exits first."""
    port = int(argv[argv.index("--port") + 1])
    proc = subprocess.Popen([*_launcher(release), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    started = False
    try:
        deadline = time.monotonic() + VERDICT_WITHIN_S
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                started = True
                break
            except OSError:
                time.sleep(0.1)
        else:
            assert proc.poll() is not None, f"{release} neither served its port nor exited in {VERDICT_WITHIN_S:g} s"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        out, _ = proc.communicate(timeout=30)
    return started, re.sub(r"\x1b\[[0-9;]*m", "", out)


def _quoted(rule: RouterStartRule) -> str:
    """What the router prints verbatim when it refuses the row: the name of its own setting, quoted."""
    if rule.says.startswith("OverflowError"):
        return rule.says.split(" while ")[0]  # smg adds "while processing '<name>'", sglang-router 0.3.2 does not
    return "'" + rule.says.split(":", 1)[0] + "'"


_CASES = [(release, rule) for rule in ROUTER_START_RULES for release in rule.refused_by]


@pytest.mark.parametrize("release,rule", _CASES, ids=[f"{r.split()[0]}-{_id(x)}" for r, x in _CASES])
def test_the_router_refuses_the_rows_value_at_start(release, rule, tmp_path):
    argv = _local_argv(release, tmp_path)
    started, out = _run(release, _with(argv, rule.flag, _text(refused_value(rule))))
    assert not started, f"{release} started with {rule.flag} {_text(refused_value(rule))}: the row is wrong\n{out[-2000:]}"
    assert _quoted(rule) in out, f"{release} refused it, but not with the row's words ({rule.says!r}):\n{out[-2000:]}"


@pytest.mark.parametrize("release", [SMG, SGLANG_ROUTER])
def test_the_router_starts_with_every_rows_least_accepted_value_and_power_of_two_over_two(release, tmp_path):
    def two_each(cluster, hosts, router):
        router.pop("workers")
        router.update(prefill_policy="power_of_two", decode_policy="power_of_two")
        for host in ("gpu01", "gpu02"):
            hosts[host]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"

    argv = _local_argv(release, tmp_path, two_each)
    assert argv.count("--prefill") == 2 and argv.count("--decode") == 2
    for rule in ROUTER_START_RULES:
        if release.startswith("sglang-router") and rule.flag == "--pd-admission-wait-secs":
            continue
        if rule.flag in ("--port", "--prometheus-port"):
            continue  # port 1 is privileged (and pdkit refuses below 1024): the free ports stay
        argv = _with(argv, rule.flag, _text(accepted_value(rule)))
    # the ceilings of the two thresholds and the floors cannot all hold at once: one argv each
    ceilings = {r.flag: _text(r.high) for r in ROUTER_START_RULES if r.high is not None and r.flag not in FLOAT_FLAGS}
    for flag, value in [(None, None), *ceilings.items()]:
        started, out = _run(release, argv if flag is None else _with(argv, flag, value))
        assert started, f"{release} refused {flag or 'the least accepted values'}:\n{out[-2000:]}"


def test_sglang_router_starts_with_what_only_smg_refuses(tmp_path):
    """Where the releases differ: sglang-router 0.3.2 starts with the smg-only rows' values (pdkit refuses
    them for both, the row's `otherwise` says why)."""
    argv = _local_argv(SGLANG_ROUTER, tmp_path)
    for rule in ROUTER_START_RULES:
        if SGLANG_ROUTER not in rule.refused_by and rule.flag in argv:
            argv = _with(argv, rule.flag, _text(refused_value(rule)))
    started, out = _run(SGLANG_ROUTER, argv)
    assert started, out[-2000:]


@pytest.mark.parametrize("release", [SMG, SGLANG_ROUTER])
def test_the_router_refuses_power_of_two_over_one_worker(release, tmp_path):
    argv = _local_argv(release, tmp_path)
    for flag, kind in (("--prefill-policy", "prefill"), ("--decode-policy", "decode")):
        started, out = _run(release, _with(argv, flag, "power_of_two"))
        assert not started and f"Power-of-two policy for {kind} requires at least 2 {kind} workers" in out, out[-2000:]

    def one_unified(cluster, hosts, router):
        hosts["gpu01"]["pdkit_node"]["engines"] = [{"name": "one", "role": "unified", "gpus": [0], "port": 30000}]
        hosts["gpu02"]["pdkit_node"]["engines"] = [{"name": "one", "role": "unified", "gpus": [0], "port": 30000}]
        router["workers"] = ["gpu01/one"]

    argv = _local_argv(release, tmp_path, one_unified)
    assert "--worker-urls" in argv
    started, out = _run(release, _with(argv, "--policy", "power_of_two"))
    assert not started and "Power-of-two policy requires at least 2 workers" in out, out[-2000:]


def test_u32_max_is_the_routers_threshold_ceiling():
    assert U32_MAX == 2**32 - 1
    assert {r.flag for r in ROUTER_START_RULES if r.high == U32_MAX} == {"--health-failure-threshold",
                                                                        "--health-success-threshold"}
