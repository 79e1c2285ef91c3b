"""The fault budget: how long a request may wait on a failed engine or node, and the settings that bound it.

A PD request touches a prefill, a decode and the router, and each has its own waits. Left at
their defaults they are minutes long: SGLang's decode waits 300 s for KV that a dead prefill
will never send and its prefill 300 s for a decode that died (SGLANG_DISAGGREGATION_WAITING_TIMEOUT
and _BOOTSTRAP_TIMEOUT, sglang/srt/environ.py of 0.5.17 and 0.5.23), and the routers time a
request out after 1800 s (--request-timeout-secs). On the lent H200 a killed prefill left
requests hanging until the client gave up at 120 s (docs/gpu.md).

`pdkit_cluster.fault_budget` (the model below) names every one of those settings with a default
chosen for a budget of seconds, not minutes; this module decides, once:

- `engine_env`: the SGLANG_DISAGGREGATION_* variables of a PD engine (pdkit.render.flags.engine_env);
- `router_args`: the router's request timeout, retries and PD admission wait (pdkit.render.flags.router_args);
- `problems`: that the settings nest (admission wait < bootstrap timeout < request timeout <
  what clients are told to use) and that every fault's worst wait (`fault_waits`) fits the budget;
- `fault_waits`: for each fault, the longest a request can wait, and why, from the settings and
  SGLang's fixed constants (printed by `pdkit validate`, asserted by the lab's fault tests);
- `queue_wait_warnings`: where a burst of the declared workload would run a PD timeout out with
  nothing dead, queueing at the decode or the prefill (`burst_wait`, `burst_problems`).

What SGLang does with each variable is read from the pinned releases' code; the defaults come
from pdkit/upstream/parser_table.json (generated from the wheels, `parsertable.sglang_environment`), so a
release that changes one shows up as a table diff in CI. docs/rolling.md, "The fault budget".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdkit.upstream.parsertable import router_default, router_has_flag

# what SGLang's code does, in a module the node venv (and so the sim) can import without pydantic
from pdkit.upstream.sglang_pd import (
    ENGINE_VARIABLES,
    NO_PREFILL_BOOTSTRAP_TIMEOUT,
    SGLANG_ENSURE_ATTEMPTS,
    SGLANG_ENSURE_INTERVAL_S,
    SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S,
    SGLANG_MIN_HEARTBEAT_INTERVAL_S,
)

# The router flag behind each field, and the router packages whose parser has it (pdkit/upstream/parser_table.json).
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
    # seconds a prefill keeps a request whose decode never sent its KV slots: SGLang's own 300. Its
    # clock runs from registration, so a burst queued behind a full decode KV pool spends its wait
    # on it with nothing dead (docs/rolling.md "Queueing vs the fault budget"); no fault's wait in
    # fault_waits depends on it (heartbeats and the routers' health checks bound those)
    bootstrap_timeout_s: int = Field(default=300, ge=1)
    # smg: seconds a PD request waits for room in the decode's running window before a 503 (smg: 30);
    # 0: the 503 comes at once when the window is full (smg 1.13.0's --pd-admission-wait-secs: "0 sheds
    # immediately"), never "no limit"; engines that report no running window are never held
    router_admission_wait_s: int = Field(default=20, ge=0)
    # the router's limit on a whole request, streaming included (both routers: 1800): above the
    # longest generation you serve. No "0 = no timeout": both routers refuse 0 at start
    router_request_timeout_s: int = Field(default=1800, ge=1)
    # attempts the router makes at a request whose worker failed, the first included (both routers: 5);
    # 1: one attempt, no retry (the routers' own spelling of "off"; both refuse 0 at start)
    router_max_retries: int = Field(default=3, ge=1)
    # the cap on each pause between two attempts, ms, before the routers' jitter (both routers: 30000).
    # The pauses grow from --retry-initial-backoff-ms (50) x1.5 per retry up to this cap, and each is
    # then moved by up to +-20% (--retry-jitter-factor 0.2), the cap included (RetrySchedule). Never 0
    # ("no pause"): both routers refuse a cap below the initial backoff at start
    router_max_backoff_ms: int = Field(default=1000, ge=0)
    # a router health check of a worker gives up after this long (both routers: 5); SGLang's /health
    # answers after 1 s at the earliest (it waits for a scheduler step: http_server.py health_generate),
    # so below 2 s a busy engine reads as down
    router_health_check_timeout_s: int = Field(default=3, ge=2)
    # a prefill engine's rate on prompts at the context cap (tokens/s), measured (pdkit bench) or stated:
    # validate then estimates the wait of a burst of target_concurrency such prompts against both
    # timeouts above (queue_wait_warnings); None: no estimate for SGLang engines (the sim's is its own)
    prefill_tokens_per_s: float | None = Field(default=None, gt=0)
    # what pdkit's docs and clients (pdkit bench, pdkit chat) use as the client's timeout: above the
    # router's request timeout, so that the router, not the client, ends a request that takes too long
    client_timeout_s: int = Field(default=1830, ge=1)

    @model_validator(mode="after")
    def _units(self) -> FaultBudget:
        # a value past its bound is most often milliseconds written where seconds belong (or the reverse)
        for field, (low, high, hint) in UNIT_BOUNDS.items():
            value = getattr(self, field)
            if value is not None and not low <= value <= high:
                raise ValueError(f"{field} {value:g} is outside {low:g}-{high:g}, the range it can sensibly take: "
                                 f"{hint}")
        return self

    @model_validator(mode="after")
    def _nested(self) -> FaultBudget:
        # each wait must end before the one that contains it, or the outer one fires first and the
        # inner setting never does anything (and the client sees a timeout, not the engine's error)
        for inner, outer, why in NESTING:
            if getattr(self, inner) >= getattr(self, outer):
                raise ValueError(f"{inner} ({getattr(self, inner)}) must be below {outer} ({getattr(self, outer)}): "
                                 f"{why}")
        return self


_MS = "does it look like milliseconds? give seconds"
# field -> (lowest, highest, why a value outside is wrong): the unit mistakes validate catches (issue 46)
UNIT_BOUNDS: dict[str, tuple[float, float, str]] = {
    "budget_s": (0, 3600, _MS),
    "heartbeat_interval_s": (0, 600, _MS),
    "heartbeat_max_failures": (1, 100, "a dead prefill would be noticed after that many heartbeats"),
    "waiting_timeout_s": (1, 86400, _MS),
    "bootstrap_timeout_s": (1, 86400, _MS),
    "router_admission_wait_s": (0, 3600, _MS),
    "router_request_timeout_s": (1, 86400, _MS),
    "router_max_retries": (1, 20, "each attempt after a failure adds its backoff to the request's wait"),
    # milliseconds: above 60,000 it outlasts any budget (below the router's initial backoff, 50 ms, the
    # router refuses to start: pdkit.spec.checks.ROUTER_START_RULES, checked per router host)
    "router_max_backoff_ms": (0, 60000, "milliseconds: e.g. 1000 for one second"),
    "router_health_check_timeout_s": (0, 600, _MS),
    "client_timeout_s": (1, 86400, _MS),
}


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
    pdkit/upstream/parser_table.json: sglang-router 0.3.2 has no --pd-admission-wait-secs, smg 1.13.0 has)."""
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
    field: str = ""  # the setting to lower when it is over the budget (empty: by bound_by)


@dataclass(frozen=True)
class RetrySchedule:
    """How the routers space the attempts at a request whose worker failed, besides the budget's own
    router_max_retries and router_max_backoff_ms: the same code in both pinned routers (smg's
    model_gateway/src/routers/common/retry.rs, sglang-router's sgl-router/src/core/retry.rs:
    BackoffCalculator::calculate_delay and RetryExecutor). After failed attempt n (0-based) the router
    waits min(initial_backoff_ms x multiplier^n, max_backoff_ms), then moves that by a random share of
    up to +-jitter of itself: the jitter comes after the cap, so a pause may exceed max_backoff_ms by
    up to that share. Measured on smg 1.13.0 and sglang-router 0.3.2 (a worker answering 503, 6
    attempts): pauses of ~50, 75, 100, 100, 100 ms (+-20%) with the cap at 100, and up to 1,388 ms with
    initial = cap = 1,000 and jitter 0.5. Defaults: each release's parser (pdkit/upstream/parser_table.json);
    extra_args may change them (pdkit.spec.checks.router_retry_schedule)."""

    initial_backoff_ms: float = 50
    multiplier: float = 1.5
    jitter: float = 0.2
    # --disable-retries: one attempt whatever router_max_retries says (the routers' effective_retry_config)
    disabled: bool = False

    @classmethod
    def of_release(cls, package: str, version: str) -> RetrySchedule:
        return cls(router_default(package, version, "--retry-initial-backoff-ms"),
                   router_default(package, version, "--retry-backoff-multiplier"),
                   router_default(package, version, "--retry-jitter-factor"))

    def attempts(self, max_retries: int) -> int:
        return 1 if self.disabled else max(1, max_retries)

    def capped(self, max_retries: int, max_backoff_ms: float) -> list[bool]:
        """For each pause, whether max_backoff_ms (not the growing schedule) set it."""
        return [self.initial_backoff_ms * self.multiplier ** n >= max_backoff_ms
                for n in range(self.attempts(max_retries) - 1)]

    def worst_pauses_ms(self, max_retries: int, max_backoff_ms: float) -> list[float]:
        """The longest each pause between two attempts can be, ms: the schedule, capped, plus the jitter."""
        jitter = min(max(self.jitter, 0.0), 1.0)
        out = []
        for n in range(self.attempts(max_retries) - 1):
            delay = min(math.floor(self.initial_backoff_ms * self.multiplier ** n), max_backoff_ms)
            out.append(delay + math.floor(delay * jitter + 0.5))  # Rust rounds half away from zero
        return out


# the pinned routers' own (both: 50 ms, x1.5, +-20%; tests/test_faultbudget.py holds them to the parser table)
ROUTER_RETRY_DEFAULTS = RetrySchedule()


def fault_waits(budget: FaultBudget, health_check_interval_s: int, health_failure_threshold: int,
                pd: bool = True, retry: RetrySchedule = ROUTER_RETRY_DEFAULTS) -> list[FaultWait]:
    """Each fault's worst wait, from the budget and the router's health checks (its interval and
    failure threshold live on pdkit_router); PD: with the prefill/decode hand-off's own waits. The
    router-side wait is until its health checks mark a dead worker down; RETRY: how the router spaces
    its retries (its defaults unless extra_args change them)."""
    hb, misses = budget.heartbeat_interval_s, budget.heartbeat_max_failures
    router_detect = health_failure_threshold * (health_check_interval_s + budget.router_health_check_timeout_s)
    router_wait = FaultWait("engine or node down, new requests through the router", float(router_detect),
                            f"the router's health checks: {health_failure_threshold} failures, "
                            f"{health_check_interval_s} s apart, "
                            f"each up to router_health_check_timeout_s ({budget.router_health_check_timeout_s} s)")
    if not pd:
        return [router_wait, retry_wait(budget, retry)]
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
        retry_wait(budget, retry),
    ]


def retry_wait(budget: FaultBudget, retry: RetrySchedule = ROUTER_RETRY_DEFAULTS) -> FaultWait:
    """A request whose worker failed, retried by the router before its health checks mark the worker down:
    the pauses between its attempts as the router spaces them (RetrySchedule: growing from the initial
    backoff, capped at router_max_backoff_ms, then jittered); the attempts themselves fail fast on a dead
    worker (connection refused)."""
    pauses = retry.worst_pauses_ms(budget.router_max_retries, budget.router_max_backoff_ms)
    capped = any(retry.capped(budget.router_max_retries, budget.router_max_backoff_ms))
    attempts = retry.attempts(budget.router_max_retries)
    shown = ", ".join(f"{p:g}" for p in pauses[:6]) + (", ..." if len(pauses) > 6 else "")
    if retry.disabled:
        why = "none: --disable-retries in pdkit_router.extra_args makes one attempt"
    elif not pauses:
        why = f"none: router_max_retries {budget.router_max_retries} is one attempt"
    else:
        why = (f"router_max_retries {budget.router_max_retries} (the first attempt included): {len(pauses)} "
               f"pause(s) of at most {shown} ms, each growing from {retry.initial_backoff_ms:g} ms "
               f"x{retry.multiplier:g} per retry up to router_max_backoff_ms ({budget.router_max_backoff_ms} ms), "
               f"then up to +{retry.jitter:.0%} jitter")
    # the setting that moves it: the cap where it binds, else the number of attempts
    field = "router_max_backoff_ms" if capped else "router_max_retries"
    return FaultWait("worker failed mid-request, the router's retries", sum(pauses) / 1000, why,
                     f"pdkit_cluster.fault_budget.{field}" if attempts > 1 else "")


def problems(budget: FaultBudget, health_check_interval_s: int, health_failure_threshold: int,
             pd: bool = True, retry: RetrySchedule = ROUTER_RETRY_DEFAULTS) -> list[tuple[str, str]]:
    """(field, message) for each fault whose worst wait exceeds the budget, and for a heartbeat
    that cannot fire before the waiting timeout. Nesting is checked by the model itself."""
    out: list[tuple[str, str]] = []
    for wait in fault_waits(budget, health_check_interval_s, health_failure_threshold, pd, retry):
        if wait.seconds > budget.budget_s:
            field = wait.field or ("pdkit_router.health_check_interval_secs" if "router" in wait.bound_by
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
                  pd: bool = True, retry: RetrySchedule = ROUTER_RETRY_DEFAULTS) -> list[str]:
    """What `pdkit validate` prints: the budget and each fault's worst wait."""
    lines = [f"fault budget {budget.budget_s:g} s (pdkit_cluster.fault_budget; clients: timeout "
             f"{budget.client_timeout_s} s)"]
    for wait in fault_waits(budget, health_check_interval_s, health_failure_threshold, pd, retry):
        lines.append(f"  {wait.fault}: at most {wait.seconds:g} s ({wait.bound_by})")
    return lines


# ---- a burst of long prompts against the PD timeouts (issue 45 item 5) -------------------------------
#
# Neither SGLang clock waits for a dead engine only. The prefill's bootstrap clock starts when a request
# registers at the prefill (0.5.23 common/conn.py:2182 "Bootstrap timeout clock starts after the
# registration"; 0.5.17 mooncake/conn.py:2139) and stops when the decode has admitted it, i.e.
# pre-allocated its KV and sent the slots; a decode admits a request only when its KV pool has room for
# the prompt plus --num-reserved-decode-tokens beside every request it holds (pdkit/sim/stepmodel.py
# decode_admits, from disaggregation/decode.py). The decode's waiting clock starts at that admission
# (send_metadata) and stops when the KV has arrived, so it covers the request's wait in the prefill's
# queue. A burst of long prompts therefore spends its whole prefill time on one clock or the other: on
# the bootstrap clock while the decode's pool is full, on the waiting clock once admitted. docs/sim.md,
# "Queueing: bootstrap clock and decode admission".

# what a safe timeout adds to the estimate (which leaves out decode time and scheduling)
QUEUE_MARGIN = 1.25


@dataclass(frozen=True)
class BurstWait:
    """The last request of a burst of REQUESTS prompts of PROMPT_TOKENS each, sent at once to one PD
    group: how long it waits on each clock, prefill-bound (decode time not counted, so a lower bound
    wherever the decode's pool is what holds requests back)."""

    requests: int
    prompt_tokens: int
    prefill_tokens_per_s: float
    # the group's prefills' time for the whole burst
    drain_s: float
    # how many the decode admits at once (None: its pool is not known; 0: one never fits)
    admitted_at_once: int | None
    decode_pool_tokens: int | None
    reserved_decode_tokens: int
    # registration -> admission (the prefill's bootstrap clock); inf: never admitted
    bootstrap_s: float
    # admission -> KV arrived (the decode's waiting clock)
    waiting_s: float


def burst_wait(requests: int, prompt_tokens: int, prefill_tokens_per_s: float, decode_pool_tokens: int | None = None,
               reserved_decode_tokens: int | None = None) -> BurstWait:
    """Estimate a burst's waits. Without the decode's pool either clock may take the whole prefill time:
    a pool that holds the burst puts it all on the waiting clock, a pool of one prompt puts all but one
    prompt's on the bootstrap clock. With it, the decode admits `admitted_at_once` (SGLang's rule, from
    an idle decode) and each later one only once an earlier one finished: the last waits for
    (requests - admitted) prefills before its admission and for up to `admitted` after it."""
    # lazy: the admission rule lives with the sim (pdkit/sim/stepmodel.py), needed only for this estimate
    from pdkit.sim.stepmodel import DEFAULT_NUM_RESERVED_DECODE_TOKENS, decode_admitted_at_once

    reserved = DEFAULT_NUM_RESERVED_DECODE_TOKENS if reserved_decode_tokens is None else reserved_decode_tokens
    per = prompt_tokens / prefill_tokens_per_s
    drain = requests * per
    if decode_pool_tokens is None:
        return BurstWait(requests, prompt_tokens, prefill_tokens_per_s, drain, None, None, reserved, drain, drain)
    at_once = min(requests, decode_admitted_at_once(prompt_tokens, 1, decode_pool_tokens, reserved))
    if at_once == 0:
        bootstrap, waiting = math.inf, 0.0
    else:
        bootstrap, waiting = (requests - at_once) * per, at_once * per
    return BurstWait(requests, prompt_tokens, prefill_tokens_per_s, drain, at_once, decode_pool_tokens, reserved,
                     bootstrap, waiting)


def _safe(seconds: float) -> int:
    return math.ceil(seconds * QUEUE_MARGIN)


def burst_problems(budget: FaultBudget, wait: BurstWait, bootstrap_enforced: bool = True) -> list[tuple[str, str]]:
    """(field, message) for each PD timeout a burst's wait (burst_wait) would run out with nothing dead:
    the message has the numbers and a value that would be safe. BOOTSTRAP_ENFORCED False: the release
    and backend never check the bootstrap timeout (NO_PREFILL_BOOTSTRAP_TIMEOUT)."""
    out: list[tuple[str, str]] = []
    burst = (f"a burst of {wait.requests} prompts of {wait.prompt_tokens:,} tokens (target_concurrency x the "
             f"context cap) takes ~{wait.drain_s:.0f} s to prefill at {wait.prefill_tokens_per_s:,.0f} tokens/s")
    pool = wait.decode_pool_tokens
    if pool is None:
        held = "the decode's KV pool is not known here; if it holds fewer of them than the burst,"
        admitted = "if the decode's KV pool holds the whole burst,"
    else:
        held = (f"the decode's KV pool ({pool:,} tokens, {wait.reserved_decode_tokens} reserved per request) "
                f"admits {wait.admitted_at_once} at once, so")
        admitted = f"the decode's KV pool ({pool:,} tokens) admits {wait.admitted_at_once} at once and"

    def beyond(seconds: int) -> str:
        if seconds < budget.router_request_timeout_s:
            return ""
        return f" (and router_request_timeout_s above it, now {budget.router_request_timeout_s})"

    field = "pdkit_cluster.fault_budget.bootstrap_timeout_s"
    if bootstrap_enforced and math.isinf(wait.bootstrap_s):
        out.append((field, f"a prompt of {wait.prompt_tokens:,} tokens (the context cap) with "
                           f"{wait.reserved_decode_tokens} reserved decode tokens never fits the decode's KV pool "
                           f"({pool:,} tokens): the decode never admits it and the prefill fails it after "
                           f"bootstrap_timeout_s ({budget.bootstrap_timeout_s} s) with nothing dead; lower the "
                           "context cap or give the decode a larger pool"))
    elif bootstrap_enforced and wait.bootstrap_s > budget.bootstrap_timeout_s:
        safe = _safe(wait.bootstrap_s)
        out.append((field, f"{burst}; {held} the last request waits ~{wait.bootstrap_s:.0f} s for the decode to "
                           "admit it, on the prefill's bootstrap clock (SGLang starts it when the request registers "
                           f"at the prefill, not when the decode admits it): bootstrap_timeout_s "
                           f"{budget.bootstrap_timeout_s} fails queued requests with nothing dead; safe: >= {safe} "
                           f"(the estimate + 25%, decode time not counted){beyond(safe)}"))
    field = "pdkit_cluster.fault_budget.waiting_timeout_s"
    if wait.waiting_s > budget.waiting_timeout_s:
        safe = _safe(wait.waiting_s)
        out.append((field, f"{burst}; {admitted} the last one admitted waits ~{wait.waiting_s:.0f} s behind the "
                           "others in the prefill's queue, on the decode's waiting clock (it starts when the decode "
                           f"pre-allocates the KV and sends its slots): waiting_timeout_s {budget.waiting_timeout_s} "
                           f"fails them with nothing dead; safe: >= {safe} (the estimate + 25%){beyond(safe)}"))
    return out


def _flag_int(args: tuple[str, ...] | list[str], flag: str) -> int | None:
    """An int flag's value in an argv (`--flag N` or `--flag=N`, read as the exporter reads argv:
    pdkit.agent.exporter.drift.argv_options), else None."""
    # lazy: only the burst estimate reads extra_args
    from pdkit.agent.exporter.drift import argv_options, flag_key

    option = argv_options(args).get(flag_key(flag))
    try:
        return int(option.values[0]) if option is not None and option.values else None
    except ValueError:
        return None


def _sim_knobs(engine: Any) -> Any:
    # lazy: the sim's knobs matter only for engine: sim clusters
    from pdkit.sim.knobs import KnobError, load_knobs

    try:
        return load_knobs(engine.env)
    except KnobError:
        return None  # validate reports nothing here; the engine itself refuses it at start


def stated_prefill_tokens_per_s(spec: Any, engine: Any, prompt_tokens: int) -> float | None:
    """A prefill engine's rate on prompts of PROMPT_TOKENS, where the inventory states one: for the sim
    (engine: sim), its step model from the engine's PDKIT_SIM_PREFILL_* knobs (the sim's defaults when
    unset), as many prompts a pass as its --max-prefill-tokens budget takes (at least one). SGLang
    engines: fault_budget.prefill_tokens_per_s (None: not stated)."""
    if spec.cluster.engine != "sim":
        stated: float | None = spec.cluster.fault_budget.prefill_tokens_per_s
        return stated
    knobs = _sim_knobs(engine)
    if knobs is None:
        return None
    # lazy: the sim's prefill budget default, only for engine: sim clusters
    from pdkit.sim.args import DEFAULT_MAX_PREFILL_TOKENS

    budget = _flag_int(engine.extra_args, "--max-prefill-tokens") or DEFAULT_MAX_PREFILL_TOKENS
    tokens = max(1, budget // max(1, prompt_tokens)) * prompt_tokens
    step_ms = knobs.prefill_base_ms + knobs.prefill_ms_per_1k_tokens * tokens / 1000.0
    return tokens / step_ms * 1000.0 if step_ms > 0 else None


def stated_decode_pool(spec: Any, engine: Any) -> tuple[int | None, int | None]:
    """(KV pool tokens, reserved decode tokens) of a decode engine, where the inventory states them: the
    sim's pool (--max-total-tokens in extra_args, else its default, times PDKIT_SIM_KV_POOL_FRACTION);
    SGLang's pool is sized from GPU memory at start, so None there. Reserved: --num-reserved-decode-tokens
    in extra_args, else None (SGLang's default)."""
    reserved = _flag_int(engine.extra_args, "--num-reserved-decode-tokens")
    if spec.cluster.engine != "sim":
        return None, reserved
    # lazy: the sim's default pool, only for engine: sim clusters
    from pdkit.sim.args import DEFAULT_MAX_TOTAL_TOKENS

    knobs = _sim_knobs(engine)
    if knobs is None:
        return None, reserved
    tokens = _flag_int(engine.extra_args, "--max-total-tokens") or DEFAULT_MAX_TOTAL_TOKENS
    return max(1, int(tokens * knobs.kv_pool_fraction)), reserved


def queue_wait_warnings(spec: Any) -> list[tuple[str, str, str]]:
    """(host, field, message) for each PD group whose declared workload would run a PD timeout out with
    nothing dead: target_concurrency prompts as long as the context cap, sent at once, against the
    group's stated prefill rate (stated_prefill_tokens_per_s, summed over its prefills) and decode pool
    (stated_decode_pool, summed over its decodes, when every one is stated). A group without a context
    cap or a stated rate gets nothing: there is nothing to estimate. The host is the group's first
    decode's. `pdkit validate` reports these as warnings (pdkit/spec/checks.py)."""
    target = spec.cluster.target_concurrency
    if not target:
        return []
    groups: dict[str, list[tuple[Any, Any]]] = {}
    for host, engine in spec.engines():
        if engine.role != "unified":
            groups.setdefault(engine.pd_group, []).append((host, engine))
    budget = spec.cluster.fault_budget
    out: list[tuple[str, str, str]] = []
    for members in groups.values():
        prefills = [e for _, e in members if e.role == "prefill"]
        decodes = [(h, e) for h, e in members if e.role == "decode"]
        caps = [spec.engine_tuning(e).context_length for _, e in members]
        if not prefills or not decodes or None in caps:
            continue
        prompt = min(caps)
        rates = [stated_prefill_tokens_per_s(spec, e, prompt) for e in prefills]
        if None in rates:
            continue
        pools = [stated_decode_pool(spec, e) for _, e in decodes]
        sizes = [p for p, _ in pools]
        pool = None if any(p is None for p in sizes) else sum(p for p in sizes if p is not None)
        reserved = max((r for _, r in pools if r is not None), default=None)
        wait = burst_wait(target, prompt, sum(rates), pool, reserved)  # type: ignore[arg-type]
        enforced = (spec.engine_version(prefills[0]), spec.cluster.transfer_backend) not in NO_PREFILL_BOOTSTRAP_TIMEOUT
        for field, message in burst_problems(budget, wait, enforced):
            out.append((decodes[0][0].name, field, message))
    return out
