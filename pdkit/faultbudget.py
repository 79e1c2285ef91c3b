"""The fault budget: how long a request may wait on a failed engine or node, and the settings that bound it.

A PD request touches a prefill, a decode and the router, and each has its own waits. Left at
their defaults they are minutes long: SGLang's decode waits 300 s for KV that a dead prefill
will never send and its prefill 300 s for a decode that died (SGLANG_DISAGGREGATION_WAITING_TIMEOUT
and _BOOTSTRAP_TIMEOUT, sglang/srt/environ.py of 0.5.17 and 0.5.23), and the routers time a
request out after 1800 s (--request-timeout-secs). On the lent H200 a killed prefill left
requests hanging until the client gave up at 120 s (docs/gpu.md).

`pdkit_cluster.fault_budget` (the model below) names every one of those settings with a default
chosen for a budget of seconds, not minutes; this module decides, once:

- `engine_env`: the SGLANG_DISAGGREGATION_* variables of a PD engine (pdkit.flags.engine_env);
- `router_args`: the router's request timeout, retries and PD admission wait (pdkit.flags.router_args);
- `problems`: that the settings nest (admission wait < bootstrap timeout < request timeout <
  what clients are told to use) and that every fault's worst wait (`fault_waits`) fits the budget;
- `fault_waits`: for each fault, the longest a request can wait, and why, from the settings and
  SGLang's fixed constants (printed by `pdkit validate`, asserted by the lab's fault tests).

What SGLang does with each variable is read from the pinned releases' code; the defaults come
from pdkit/parser_table.json (generated from the wheels, `parsertable.sglang_environment`), so a
release that changes one shows up as a table diff in CI. docs/rolling.md, "The fault budget".
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdkit.parsertable import router_has_flag

# what SGLang's code does, in a module the node venv (and so the sim) can import without pydantic
from pdkit.sglang_pd import (
    ENGINE_VARIABLES,
    SGLANG_ENSURE_ATTEMPTS,
    SGLANG_ENSURE_INTERVAL_S,
    SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S,
    SGLANG_MIN_HEARTBEAT_INTERVAL_S,
)

# The router flag behind each field, and the router packages whose parser has it (pdkit/parser_table.json).
ROUTER_FLAGS = {
    "router_request_timeout_s": "--request-timeout-secs",
    "router_max_retries": "--retry-max-retries",
    "router_max_backoff_ms": "--retry-max-backoff-ms",
    "router_health_check_timeout_s": "--health-check-timeout-secs",
    "router_admission_wait_s": "--pd-admission-wait-secs",
}


class FaultBudget(BaseModel):
    """`pdkit_cluster.fault_budget`: the longest a request may wait on a killed or unreachable engine or
    node, and the engine and router settings that bound it (docs/rolling.md, "The fault budget")."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # the longest a request may wait on a killed prefill, decode or node before it gets an error
    # status; `pdkit validate` checks every fault's worst wait (fault_waits) against it
    budget_s: float = Field(default=20.0, gt=0)
    # a PD decode checks each prefill's bootstrap server this often (SGLang: 5 s, at least 2)
    heartbeat_interval_s: float = Field(default=2.0, ge=SGLANG_MIN_HEARTBEAT_INTERVAL_S)
    # missed checks in a row before the decode fails that prefill's requests (SGLang: 2)
    heartbeat_max_failures: int = Field(default=2, ge=1)
    # seconds a decode waits for a request's KV once it handed the prefill its slots: the bound on
    # a prefill that is up but never sends (SGLang: 300). Above the longest prefill queue you accept
    waiting_timeout_s: int = Field(default=60, ge=1)
    # seconds a prefill keeps a request whose decode never sent its KV slots (SGLang: 300)
    bootstrap_timeout_s: int = Field(default=60, ge=1)
    # smg: seconds a PD request waits for room in the decode's running window before a 503 (smg: 30)
    router_admission_wait_s: int = Field(default=20, ge=0)
    # the router's limit on a whole request, streaming included (both routers: 1800): above the
    # longest generation you serve
    router_request_timeout_s: int = Field(default=1800, ge=1)
    # attempts the router makes at a request whose worker failed, the first included (both routers: 5)
    router_max_retries: int = Field(default=3, ge=1)
    # longest pause between two attempts, ms (both routers: 30000)
    router_max_backoff_ms: int = Field(default=1000, ge=0)
    # a router health check of a worker gives up after this long (both routers: 5); SGLang's /health
    # answers after 1 s at the earliest (it waits for a scheduler step: http_server.py health_generate),
    # so below 2 s a busy engine reads as down
    router_health_check_timeout_s: int = Field(default=3, ge=2)
    # what pdkit's docs and clients (pdkit bench, pdkit chat) use as the client's timeout: above the
    # router's request timeout, so that the router, not the client, ends a request that takes too long
    client_timeout_s: int = Field(default=1830, ge=1)

    @model_validator(mode="after")
    def _nested(self) -> FaultBudget:
        # each wait must end before the one that contains it, or the outer one fires first and the
        # inner setting never does anything (and the client sees a timeout, not the engine's error)
        for inner, outer, why in NESTING:
            if getattr(self, inner) >= getattr(self, outer):
                raise ValueError(f"{inner} ({getattr(self, inner)}) must be below {outer} ({getattr(self, outer)}): "
                                 f"{why}")
        return self


# (inner, outer, why): every pair fault_budget checks, the order docs/rolling.md explains
NESTING: tuple[tuple[str, str, str], ...] = (
    ("router_admission_wait_s", "bootstrap_timeout_s",
     "a request the router holds for the decode's room must reach the decode before the prefill stops waiting for it"),
    ("bootstrap_timeout_s", "router_request_timeout_s",
     "the prefill must give up on a lost decode before the router gives up on the request"),
    ("waiting_timeout_s", "router_request_timeout_s",
     "the decode must give up on a silent prefill (and answer with its error) before the router gives up on the "
     "request"),
    ("router_request_timeout_s", "client_timeout_s",
     "the router must end an overlong request with an error before the client hangs up on it"),
)


def engine_env(budget: FaultBudget) -> dict[str, str]:
    """SGLang's PD waits for a prefill or decode engine (unified engines have none)."""
    return {var: _env_text(getattr(budget, field)) for field, var in ENGINE_VARIABLES.items()}


def _env_text(value: float | int) -> str:
    # SGLang reads the two timeouts with int(): "60", not "60.0"
    return str(int(value)) if float(value).is_integer() else str(value)


def router_flags(package: str, version: str) -> dict[str, str]:
    """{field: flag} of the budget's router settings that the parser of PACKAGE VERSION has (from
    pdkit/parser_table.json: sglang-router 0.3.2 has no --pd-admission-wait-secs, smg 1.13.0 has)."""
    return {f: flag for f, flag in ROUTER_FLAGS.items() if router_has_flag(package, version, flag)}


def router_args(budget: FaultBudget, package: str, version: str, pd: bool) -> list[str]:
    """The router flags of the budget for a PACKAGE VERSION router (PD: with the admission wait)."""
    args: list[str] = []
    for field, flag in router_flags(package, version).items():
        if flag == "--pd-admission-wait-secs" and not pd:
            continue
        args += [flag, str(getattr(budget, field))]
    return args


@dataclass(frozen=True)
class FaultWait:
    """The longest a request waits on one fault before it gets an error, and what bounds it."""

    fault: str
    seconds: float
    bound_by: str


def fault_waits(budget: FaultBudget, health_check_interval_s: int, health_failure_threshold: int,
                pd: bool = True) -> list[FaultWait]:
    """Each fault's worst wait, from the budget and the router's health checks (its interval and
    failure threshold live on pdkit_router); PD: with the prefill/decode hand-off's own waits. The
    router-side wait is until its health checks mark a dead worker down."""
    hb, misses = budget.heartbeat_interval_s, budget.heartbeat_max_failures
    router_detect = health_failure_threshold * (health_check_interval_s + budget.router_health_check_timeout_s)
    router_wait = FaultWait("engine or node down, new requests through the router", float(router_detect),
                            f"the router's health checks: {health_failure_threshold} failures, "
                            f"{health_check_interval_s} s apart, "
                            f"each up to router_health_check_timeout_s ({budget.router_health_check_timeout_s} s)")
    if not pd:
        return [router_wait]
    return [
        FaultWait("prefill killed, request already handed to the decode", hb * misses,
                  f"the decode's heartbeat: {misses} missed checks {hb:g} s apart (heartbeat_interval_s x "
                  "heartbeat_max_failures)"),
        FaultWait("prefill's node unreachable, request already handed to the decode",
                  misses * (hb + SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S),
                  f"the decode's heartbeat: {misses} checks {hb:g} s apart, each giving up after SGLang's "
                  f"{SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S:g} s connect timeout"),
        FaultWait("prefill killed, new request reaching the decode", SGLANG_ENSURE_ATTEMPTS * SGLANG_ENSURE_INTERVAL_S,
                  f"SGLang's decode: {SGLANG_ENSURE_ATTEMPTS} tries at the prefill's bootstrap server, "
                  f"{SGLANG_ENSURE_INTERVAL_S:g} s apart (fixed in decode.py)"),
        router_wait,
    ]


def problems(budget: FaultBudget, health_check_interval_s: int, health_failure_threshold: int,
             pd: bool = True) -> list[tuple[str, str]]:
    """(field, message) for each fault whose worst wait exceeds the budget, and for a heartbeat
    that cannot fire before the waiting timeout. Nesting is checked by the model itself."""
    out: list[tuple[str, str]] = []
    for wait in fault_waits(budget, health_check_interval_s, health_failure_threshold, pd):
        if wait.seconds > budget.budget_s:
            field = ("pdkit_router.health_check_interval_secs" if "router" in wait.bound_by
                     else "pdkit_cluster.fault_budget.heartbeat_interval_s")
            out.append((field, f"{wait.fault}: can wait {wait.seconds:g} s, over fault_budget.budget_s "
                               f"({budget.budget_s:g} s); "
                               f"bound by {wait.bound_by}: lower those settings or raise budget_s"))
    detect = budget.heartbeat_interval_s * budget.heartbeat_max_failures
    if detect >= budget.waiting_timeout_s:
        out.append(("pdkit_cluster.fault_budget.waiting_timeout_s",
                    f"{budget.waiting_timeout_s} s ends before the heartbeat can notice a dead prefill ({detect:g} s): "
                    "raise waiting_timeout_s or lower heartbeat_interval_s / heartbeat_max_failures"))
    return out


def summary_lines(budget: FaultBudget, health_check_interval_s: int, health_failure_threshold: int,
                  pd: bool = True) -> list[str]:
    """What `pdkit validate` prints: the budget and each fault's worst wait."""
    lines = [f"fault budget {budget.budget_s:g} s (pdkit_cluster.fault_budget; clients: timeout "
             f"{budget.client_timeout_s} s)"]
    for wait in fault_waits(budget, health_check_interval_s, health_failure_threshold, pd):
        lines.append(f"  {wait.fault}: at most {wait.seconds:g} s ({wait.bound_by})")
    return lines
