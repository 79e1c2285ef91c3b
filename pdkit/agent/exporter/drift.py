"""Planned argv vs what the engine really runs. Pure functions.

Two views of the running engine are compared with the argv pdkit planned (release.json / the
exporter config):

- /server_info: SGLang's resolved arguments, one key per ServerArgs field (the flag without
  its dashes, `-` -> `_`, except the flags listed in FLAG_DEST / NEGATED, taken from SGLang's
  own parsers). Only the flags pdkit planned are compared: /server_info holds every
  field with its default, so "a flag nobody planned" cannot be told from a default there.
  Values are compared after normalising both sides (numbers as numbers, `--flag` alone as
  True, several values as a list, JSON as JSON). A few fields SGLang legitimately rewrites at
  start-up are compared with that rule (`RESOLVED`), and per-engine `drift_ignore` keys are
  skipped. A planned flag that /server_info does not report is "unverified", never "drifted".
- the process command line (/proc/PID/cmdline of the unit's main PID): the flags after
  `-m <module>` must be exactly the planned ones, so a flag added or removed by hand shows even
  when /server_info cannot tell it from a default.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Flags whose ServerArgs field (argparse dest, the /server_info key) is not the flag's own name
# (`--tp-size` -> tp_size needs no entry), read from the parsers of the pinned SGLang releases
# (0.5.17, 0.5.23; pdkit.contract describe mode). tests/exporter/test_drift_contract.py checks
# every flag of every pinned release against these tables: when a pin moves, it names what to add.
FLAG_DEST: dict[str, str] = {
    "--attention-context-parallel-size": "attn_cp_size",
    "--attention-data-parallel-size": "attn_dp_size",
    "--context-bucket": "cuda_graph_prefill_max_context",
    "--cuda-graph-bs": "cuda_graph_bs_decode",
    "--cuda-graph-max-bs": "cuda_graph_max_bs_decode",
    "--data-parallel-size": "dp_size",
    "--decode-context-parallel-size": "dcp_size",
    "--elastic-ep-join-mode": "ep_join_mode",
    "--elastic-ep-join-rank-offset": "ep_join_rank_offset",
    "--enable-gdn-replayssm-spec": "enable_linear_replayssm_spec",
    "--enable-hicache": "enable_hierarchical_cache",
    "--enable-nsa-prefill-context-parallel": "enable_dsa_prefill_context_parallel",
    "--ep": "ep_size",
    "--expert-parallel-size": "ep_size",
    "--fp4-gemm-backend": "fp4_gemm_runner_backend",
    "--fp8-gemm-backend": "fp8_gemm_runner_backend",
    "--grpc-http-sidecar-port": "smg_http_sidecar_port",
    "--hierarchical-sparse-attention-extra-config": "hisparse_config",
    "--mamba-scheduler-strategy": "mamba_radix_cache_strategy",
    "--model": "model_path",
    "--moe-data-parallel-size": "moe_dp_size",
    "--nccl-init-addr": "dist_init_addr",
    "--nsa-decode-backend": "dsa_decode_backend",
    "--nsa-prefill-backend": "dsa_prefill_backend",
    "--nsa-prefill-cp-mode": "dsa_prefill_cp_mode",
    "--piecewise-cuda-graph-compiler": "cuda_graph_tc_compiler",
    "--piecewise-cuda-graph-max-tokens": "cuda_graph_max_bs_prefill",
    "--piecewise-cuda-graph-tokens": "cuda_graph_bs_prefill",
    "--pipeline-parallel-size": "pp_size",
    "--speculative-dflash-draft-window-size": "speculative_draft_window_size",
    "--speculative-draft-model": "speculative_draft_model_path",
    "--stream-output": "incremental_streaming_output",
    "--tensor-parallel-size": "tp_size",
    # the sim's explicit short forms (SGLang takes them as unambiguous prefixes)
    "--tp": "tp_size",
    "--dp": "dp_size",
}
# BooleanOptionalAction's `--no-X` form: sets the field to False.
NEGATED: dict[str, str] = {
    "--no-dcp-replicate-q-proj": "dcp_replicate_q_proj",
    "--no-dllm-fdfo": "dllm_fdfo",
    "--no-enable-decoder-swa-bounded-replay": "enable_decoder_swa_bounded_replay",
    "--no-enable-dsa-fused-indexer": "enable_dsa_fused_indexer",
    "--no-enable-fused-qk-norm-rope": "enable_fused_qk_norm_rope",
    "--no-enable-tf32-matmul": "enable_tf32_matmul",
    "--no-enable-tp-lm-head-all-to-all": "enable_tp_lm_head_all_to_all",
    "--no-experts-shared-outer-loras": "experts_shared_outer_loras",
    "--no-lora-strict-loading": "lora_strict_loading",
    "--no-mm-enable-dp-encoder": "mm_enable_dp_encoder",
    "--no-ple-offload-embedding": "ple_offload_embedding",
    "--no-speculative-enable-w4a4-mxfp4-megamoe": "speculative_enable_w4a4_mxfp4_megamoe",
}
# Flags whose resolved value cannot be derived from the argv (store_const, custom actions,
# deprecated no-ops): reported as unverified, never as drift (the argv check still sees them).
UNCOMPARABLE = frozenset({
    "--collect-tokens-histogram", "--disable-piecewise-cuda-graph", "--enable-breakable-cuda-graph",
    "--enforce-piecewise-cuda-graph", "--lora-paths", "--monokernel-backend", "--prefill-round-robin-balance",
})

# Fields SGLang may lower at start-up without that being drift: the decode graph max bs is
# clamped to --max-running-requests, and the scheduler may cap max_running_requests by memory.
_MAY_BE_LOWERED = frozenset({"max_running_requests", "cuda_graph_max_bs_decode", "cuda_graph_max_bs"})
# Values SGLang renames at start-up (server_args: NEXTN is run as EAGLE).
_SAME_VALUE: dict[str, dict[str, str]] = {"speculative_algorithm": {"NEXTN": "EAGLE"}}

_SECRET_KEY = re.compile(r"key|token|secret|password", re.IGNORECASE)


def flag_key(flag: str) -> str:
    """`--tp-size` / `--tensor-parallel-size` / `--no-enable-tf32-matmul` / `tp_size` -> the
    /server_info key (`tp_size`, `enable_tf32_matmul`)."""
    name = flag.split("=", 1)[0]
    dashed = "--" + name.lstrip("-").replace("_", "-")
    dest = NEGATED.get(dashed) or FLAG_DEST.get(dashed)
    return dest if dest is not None else dashed[2:].replace("-", "_")


@dataclass(frozen=True)
class Option:
    flag: str  # as written, e.g. "--tp-size"
    values: tuple[str, ...]  # () for a bare `--flag`


def argv_options(argv: Sequence[str]) -> dict[str, Option]:
    """`--flag [values...]` / `--flag=value` -> {field key: Option}. The last occurrence wins (argparse)."""
    out: dict[str, Option] = {}
    key: str | None = None
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            key = flag_key(name)
            flag = f"--{name}"
            if flag in NEGATED:
                out[key] = Option(flag, ("False",))
                key = None  # takes no values
                continue
            out[key] = Option(flag, (value,) if eq else ())
            if eq:
                key = None  # `--flag=value` takes no further values
        elif key is not None:
            opt = out[key]
            out[key] = Option(opt.flag, opt.values + (token,))
        # a value before any flag is a stray positional: nothing to compare it with
    return out


def engine_args(cmdline: Sequence[str]) -> list[str]:
    """The engine's own flags from a process command line: what follows `-m <module>`,
    else from the first `--flag` on (a wrapper without -m)."""
    args = list(cmdline)
    for i, token in enumerate(args[:-1]):
        if token == "-m":
            return args[i + 2:]
    for i, token in enumerate(args):
        if token.startswith("--"):
            return args[i:]
    return []


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _scalar_matches(planned: str, running: Any) -> bool:
    if running is None:
        return planned.lower() in ("none", "null")
    if isinstance(running, bool):
        return planned.lower() in (("true", "1", "yes") if running else ("false", "0", "no"))
    a, b = _number(planned), _number(running)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(running, (dict, list)):
        try:
            decoded: object = json.loads(planned)
            return decoded == running
        except ValueError:
            return False
    return planned == str(running)


def values_match(values: Sequence[str], running: Any) -> bool:
    """Whether a planned flag's values equal a resolved /server_info value."""
    if not values:  # a bare --flag (store_true)
        return running is True or (isinstance(running, str) and running.lower() == "true")
    if isinstance(running, (list, tuple)):
        if len(values) == 1 and values[0].lstrip().startswith("["):
            return _scalar_matches(values[0], list(running))
        return len(values) == len(running) and all(_scalar_matches(v, r) for v, r in zip(values, running))
    if len(values) != 1:
        return False
    return _scalar_matches(values[0], running)


def _resolved_matches(key: str, values: Sequence[str], running: Any) -> bool:
    if values_match(values, running):
        return True
    if key in _MAY_BE_LOWERED and len(values) == 1:
        planned, actual = _number(values[0]), _number(running)
        return planned is not None and actual is not None and actual <= planned
    renames = _SAME_VALUE.get(key)
    if renames and len(values) == 1 and isinstance(running, str):
        return renames.get(values[0], values[0]) == running
    return False


@dataclass(frozen=True)
class FlagCheck:
    drifted: tuple[str, ...]  # planned flags whose running value differs (as planned: "--tp-size")
    unverified: tuple[str, ...]  # planned flags /server_info does not report


def compare_server_info(planned_argv: Sequence[str], server_info: dict[str, Any],
                        ignore: Iterable[str] = ()) -> FlagCheck:
    """Compare the planned flags with /server_info's resolved arguments."""
    skip = {flag_key(k) for k in ignore}
    # the sim lists the SGLang flags it does not model (and so cannot resolve) verbatim
    ignored = server_info.get("ignored_sglang_args")
    ignored_opts = argv_options(ignored) if isinstance(ignored, list) else {}
    drifted, unverified = [], []
    for key, opt in argv_options(planned_argv).items():
        if key in skip:
            continue
        if opt.flag in UNCOMPARABLE:
            unverified.append(opt.flag)
            continue
        if key in server_info:
            if not _resolved_matches(key, opt.values, server_info[key]):
                drifted.append(opt.flag)
        elif key in ignored_opts:
            if ignored_opts[key].values != opt.values:
                drifted.append(opt.flag)
        else:
            unverified.append(opt.flag)
    return FlagCheck(tuple(drifted), tuple(unverified))


def drift(planned_argv: Sequence[str], server_info: dict[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """The planned flags that the running engine's /server_info contradicts."""
    return list(compare_server_info(planned_argv, server_info, ignore).drifted)


def cmdline_drift(planned_argv: Sequence[str], running_argv: Sequence[str], ignore: Iterable[str] = ()) -> list[str]:
    """Flags added, removed or changed between the planned argv and the process's own argv."""
    skip = {flag_key(k) for k in ignore}
    planned, running = argv_options(planned_argv), argv_options(running_argv)
    out = []
    for key in sorted(set(planned) | set(running), key=lambda k: (k not in planned, k)):
        if key in skip:
            continue
        p, r = planned.get(key), running.get(key)
        if p is None or r is None or p.values != r.values:
            out.append((p or r).flag)  # type: ignore[union-attr]
    return out


def describe(flag: str, planned_argv: Sequence[str], running: Any) -> str:
    """`--flag planned X, running Y` for a log line; values of secret-looking flags masked."""
    opt = argv_options(planned_argv).get(flag_key(flag))
    planned = " ".join(opt.values) if opt else "(not planned)"
    if _SECRET_KEY.search(flag):
        return f"{flag} (value hidden)"
    return f"{flag}: planned {planned or '(set)'!r}, running {running!r}"


__all__ = [
    "FLAG_DEST",
    "NEGATED",
    "UNCOMPARABLE",
    "FlagCheck",
    "Option",
    "argv_options",
    "cmdline_drift",
    "compare_server_info",
    "describe",
    "drift",
    "engine_args",
    "flag_key",
    "values_match",
]
