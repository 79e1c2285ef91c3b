"""Sim-only settings, read from the environment.

The sim must run with exactly the argv generated for `python -m sglang.launch_server`, so
anything SGLang has no flag for (start-up delay, the step-time model, failure injection) comes
from `PDKIT_SIM_*` environment variables. The SGLang PD timeouts are read from SGLang's own
variable names so that a unit file written for SGLang means the same thing to the sim.
docs/sim.md lists every knob.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields

from pdkit.upstream.catalogue import SGLANG_VERSIONS
from pdkit.upstream.parsertable import sglang_environment, table
from pdkit.upstream.sglang_pd import ENGINE_VARIABLES, SGLANG_ENSURE_INTERVAL_S, SGLANG_MIN_HEARTBEAT_INTERVAL_S

# the knobs that are SGLang's own PD variables: knob -> pdkit.spec.faultbudget.FaultBudget field
SGLANG_KNOBS = {
    "waiting_timeout_s": "waiting_timeout_s",
    "bootstrap_timeout_s": "bootstrap_timeout_s",
    "heartbeat_interval_s": "heartbeat_interval_s",
    "heartbeat_max_failure": "heartbeat_max_failures",
}


@dataclass(frozen=True)
class Knobs:
    # Seconds between start and readiness; everything answers 503 until then.
    startup_delay_s: float = 1.0
    # Decode step time = (base + per_req * batch) ms, times no_cuda_graph_factor without graphs.
    decode_base_ms: float = 20.0
    decode_per_req_ms: float = 0.3
    no_cuda_graph_factor: float = 3.0
    # Prefill step time = base + per-1k-tokens * new_tokens / 1000 (ms).
    prefill_base_ms: float = 10.0
    prefill_ms_per_1k_tokens: float = 20.0
    # KV transfer prefill -> decode: bytes per prompt token and link speed.
    kv_bytes_per_token: int = 65536
    kv_transfer_gb_s: float = 1.2
    # Output length when a request sets no limit (chat without max_tokens): ends as if by EOS.
    default_max_tokens: int = 128
    # Scheduler overhead per scheduling iteration (batch building, bookkeeping), paid once per
    # `--num-continuous-decode-steps` decode steps, as SGLang amortises it.
    schedule_ms: float = 2.0
    # A sparse-attention indexer (the seeds' DeepSeek-V4) scores every position up to the
    # *configured* context length each decode step: ms per request per step per 1M tokens of
    # --context-length. 0: a model without such an indexer.
    indexer_ms_per_1m_ctx: float = 0.0
    # Failure injection.
    # Share of the KV pool the engine allocates and reports (/server_info max_total_num_tokens, the
    # sglang:max_total_num_tokens gauge, its `KV Cache is allocated` line): below 1, an engine that came
    # back short of GPU memory, as the issue 42 decode did (7,452 tokens instead of 531,636)
    kv_pool_fraction: float = 1.0
    transfer_fail_rate: float = 0.0
    health_fail_file: str = ""
    stall_file: str = ""
    # Lever faults (docs/sim.md): conditions on the engine's own argv, e.g. "--enable-torch-compile"
    # or "!--disable-overlap-schedule"; when every one holds, output is corrupted / the scheduler wedges.
    corrupt_when: str = ""
    wedge_when: str = ""
    # the wedge strikes once this many requests decode together (a desync under load)
    wedge_min_batch: int = 8
    # instead (when > 0): once the engine holds this many requests at once, queued, in the PD
    # hand-off (a decode's prealloc/transfer queues, a prefill's bootstrap/inflight) or running,
    # one of them at least running.
    # A PD decode holds every request of its pair from the moment it is sent, so a client keeping C
    # in flight makes it hold C whatever the step timing: the strike is decided by the load, not by
    # how many happen to be in one decode batch (pdkit tune's lab campaign uses it)
    wedge_min_held: int = 0
    # seconds the wedge holds before the engine steps again; 0: until the process restarts, as a
    # real wedge. smg does not cancel a decode's request when its client hangs up, so only a hold
    # lets the requests the wedge caught finish (the lab's zero-failed-requests campaign uses one)
    wedge_hold_s: float = 0.0
    # Numerics drift (issue 44, docs/correctness.md): conditions on the engine's argv as corrupt_when;
    # when every one holds, the logprobs the engine reports are off by Gaussian noise whose sigma is
    # drift_logprob_per_1k per 1,000 tokens of context before the position plus drift_logprob_per_req per
    # request running beside it (a numerics lever: FP8 KV cache, another kernel), and, when
    # diverge_after_tokens > 0, every position at or past that context length (and only while at least
    # diverge_min_batch requests run: a load-dependent bug) gets another top-1 token, so greedy answers diverge there
    drift_when: str = ""
    drift_logprob_per_1k: float = 0.0
    drift_logprob_per_req: float = 0.0
    diverge_after_tokens: int = 0
    diverge_min_batch: int = 1
    # the divergence's own condition (same form); empty: drift_when's
    diverge_when: str = ""
    # Mixed into the /weights_checker checksums: a rank that loaded other weights than it did before
    weights_salt: str = ""
    # A rehearsal of accuracy evals (the answer gate's part (d), docs/correctness.md): a chat completion's
    # answer ends with ` \boxed{N}`, N derived from its own output tokens (pdkit.sim.textgen.boxed_answer), so
    # an eval's grader reads an answer, and a diverging engine (PDKIT_SIM_DIVERGE_*) answers otherwise
    answer_boxed: bool = False
    # The SGLang release whose metrics the sim exports (its families from the metric catalogue);
    # empty: the newest catalogued release. pdkit renders the engine's planned sglang_version here.
    sglang_version: str = ""
    # How often a decode retries a prefill bootstrap server it cannot reach before the handshake;
    # SGLang's decode: 1 s, 15 tries (pdkit.upstream.sglang_pd.SGLANG_ENSURE_*). A knob for unit tests only.
    bootstrap_retry_s: float = SGLANG_ENSURE_INTERVAL_S
    # SGLang's own PD variables (same names; unset: the default of the release the sim imitates,
    # from pdkit/upstream/parser_table.json, read in load_knobs)
    waiting_timeout_s: float = 300.0
    bootstrap_timeout_s: float = 300.0
    heartbeat_interval_s: float = 5.0
    heartbeat_max_failure: int = 2

    @property
    def effective_heartbeat_interval_s(self) -> float:
        """What SGLang's decode uses: `max(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, 2.0)`."""
        return max(self.heartbeat_interval_s, SGLANG_MIN_HEARTBEAT_INTERVAL_S)


# Environment variable for each field. SGLang's names are kept verbatim.
ENV_NAMES = {
    "startup_delay_s": "PDKIT_SIM_STARTUP_DELAY_S",
    "decode_base_ms": "PDKIT_SIM_DECODE_BASE_MS",
    "decode_per_req_ms": "PDKIT_SIM_DECODE_PER_REQ_MS",
    "no_cuda_graph_factor": "PDKIT_SIM_NO_CUDA_GRAPH_FACTOR",
    "prefill_base_ms": "PDKIT_SIM_PREFILL_BASE_MS",
    "prefill_ms_per_1k_tokens": "PDKIT_SIM_PREFILL_MS_PER_1K_TOKENS",
    "kv_bytes_per_token": "PDKIT_SIM_KV_BYTES_PER_TOKEN",
    "kv_transfer_gb_s": "PDKIT_SIM_KV_TRANSFER_GB_S",
    "default_max_tokens": "PDKIT_SIM_DEFAULT_MAX_TOKENS",
    "kv_pool_fraction": "PDKIT_SIM_KV_POOL_FRACTION",
    "transfer_fail_rate": "PDKIT_SIM_TRANSFER_FAIL_RATE",
    "health_fail_file": "PDKIT_SIM_HEALTH_FAIL_FILE",
    "stall_file": "PDKIT_SIM_STALL_FILE",
    "schedule_ms": "PDKIT_SIM_SCHEDULE_MS",
    "indexer_ms_per_1m_ctx": "PDKIT_SIM_INDEXER_MS_PER_1M_CTX",
    "corrupt_when": "PDKIT_SIM_CORRUPT_WHEN",
    "wedge_when": "PDKIT_SIM_WEDGE_WHEN",
    "wedge_min_batch": "PDKIT_SIM_WEDGE_MIN_BATCH",
    "wedge_min_held": "PDKIT_SIM_WEDGE_MIN_HELD",
    "wedge_hold_s": "PDKIT_SIM_WEDGE_HOLD_S",
    "drift_when": "PDKIT_SIM_DRIFT_WHEN",
    "drift_logprob_per_1k": "PDKIT_SIM_DRIFT_LOGPROB_PER_1K",
    "drift_logprob_per_req": "PDKIT_SIM_DRIFT_LOGPROB_PER_REQ",
    "diverge_after_tokens": "PDKIT_SIM_DIVERGE_FROM_POSITION",
    "diverge_min_batch": "PDKIT_SIM_DIVERGE_MIN_BATCH",
    "diverge_when": "PDKIT_SIM_DIVERGE_WHEN",
    "weights_salt": "PDKIT_SIM_WEIGHTS_SALT",
    "answer_boxed": "PDKIT_SIM_ANSWER_BOXED",
    "bootstrap_retry_s": "PDKIT_SIM_BOOTSTRAP_RETRY_S",
    "sglang_version": "PDKIT_SIM_SGLANG_VERSION",
    # SGLang's names, as pdkit renders them (one table: pdkit.upstream.sglang_pd.ENGINE_VARIABLES)
    **{knob: ENGINE_VARIABLES[field] for knob, field in SGLANG_KNOBS.items()},
}


class KnobError(ValueError):
    """An environment knob that does not parse or is out of range."""


def load_knobs(environ: Mapping[str, str] | None = None) -> Knobs:
    """Read every knob from `environ` (default os.environ); unset ones keep their defaults."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = _release_defaults(env.get(ENV_NAMES["sglang_version"]) or "")
    for f in fields(Knobs):
        name = ENV_NAMES[f.name]
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        if f.default is MISSING:  # the value's type is read off the default: every knob has one
            raise TypeError(f"Knobs.{f.name} has no default: load_knobs cannot tell what {name} holds")
        kind = type(f.default)
        try:
            values[f.name] = kind(raw) if kind is not bool else raw not in ("0", "false", "")
        except ValueError:
            raise KnobError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
    knobs = Knobs(**values)  # type: ignore[arg-type]
    _check(knobs)
    return knobs


def _release_defaults(version: str) -> dict[str, object]:
    """SGLang's own defaults for its PD variables in release VERSION (default: the newest pinned),
    from pdkit/upstream/parser_table.json (generated from the wheels: sglang/srt/environ.py)."""
    releases = sorted(table()["sglang"], key=lambda v: tuple(int(x) for x in v.split(".")))
    if version not in releases:
        version = releases[-1]
    environment = sglang_environment(version)
    out: dict[str, object] = {}
    for knob, field in SGLANG_KNOBS.items():
        default = environment[ENGINE_VARIABLES[field]]["default"]
        out[knob] = type(getattr(Knobs, knob))(default)
    return out


def _check(k: Knobs) -> None:
    if k.sglang_version and k.sglang_version not in SGLANG_VERSIONS:
        raise KnobError(f"{ENV_NAMES['sglang_version']}={k.sglang_version} has no metric catalogue "
                        f"(catalogued: {', '.join(SGLANG_VERSIONS)})")
    if not 0.0 < k.kv_pool_fraction <= 1.0:
        raise KnobError(f"{ENV_NAMES['kv_pool_fraction']} must be within (0, 1]")
    if not 0.0 <= k.transfer_fail_rate <= 1.0:
        raise KnobError(f"{ENV_NAMES['transfer_fail_rate']} must be within [0, 1]")
    if k.no_cuda_graph_factor < 1.0:
        raise KnobError(f"{ENV_NAMES['no_cuda_graph_factor']} must be >= 1 (graphs never slow decode down)")
    for name in ("startup_delay_s", "decode_base_ms", "decode_per_req_ms", "prefill_base_ms",
                 "prefill_ms_per_1k_tokens", "bootstrap_retry_s", "schedule_ms", "indexer_ms_per_1m_ctx",
                 "wedge_hold_s", "drift_logprob_per_1k", "drift_logprob_per_req", "diverge_after_tokens"):
        if getattr(k, name) < 0:
            raise KnobError(f"{ENV_NAMES[name]} must be >= 0")
    for name in ("kv_transfer_gb_s", "waiting_timeout_s", "bootstrap_timeout_s", "heartbeat_interval_s"):
        if getattr(k, name) <= 0:
            raise KnobError(f"{ENV_NAMES[name]} must be > 0")
    if k.wedge_min_batch < 1:
        raise KnobError(f"{ENV_NAMES['wedge_min_batch']} must be >= 1")
    if k.wedge_min_held < 0:
        raise KnobError(f"{ENV_NAMES['wedge_min_held']} must be >= 0 (0: the wedge counts the decode batch, "
                        "PDKIT_SIM_WEDGE_MIN_BATCH)")
    if k.diverge_min_batch < 1:
        raise KnobError(f"{ENV_NAMES['diverge_min_batch']} must be >= 1")
    for name in ("corrupt_when", "wedge_when", "drift_when", "diverge_when"):
        for cond in conditions(getattr(k, name)):
            if not cond.lstrip("!").startswith("--"):
                raise KnobError(f"{ENV_NAMES[name]}: {cond!r} is not a condition: give --flag, --flag=value or "
                                "!--flag, comma-separated")
    if k.default_max_tokens < 1 or k.heartbeat_max_failure < 1:
        raise KnobError("PDKIT_SIM_DEFAULT_MAX_TOKENS and SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE must be >= 1")


def conditions(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def argv_matches(text: str, argv: list[str] | tuple[str, ...]) -> bool:
    """True when TEXT names at least one condition and every one holds for ARGV.

    `--flag`: the argv has it; `--flag=value`: the argv has it followed by exactly that value
    (a multi-value flag: its values joined by spaces); `!--flag`: the argv lacks it.
    """
    conds = conditions(text)
    if not conds:
        return False
    argv = list(argv)

    def values(flag: str) -> str | None:
        if flag not in argv:
            return None
        i = argv.index(flag) + 1
        out = []
        while i < len(argv) and not argv[i].startswith("--"):
            out.append(argv[i])
            i += 1
        return " ".join(out)

    for cond in conds:
        if cond.startswith("!"):
            if values(cond[1:]) is not None:
                return False
            continue
        flag, _, want = cond.partition("=")
        got = values(flag)
        if got is None or ("=" in cond and got != want):
            return False
    return True
