"""SGLang-compatible command line for the sim.

The sim is started with exactly the argv the kit renders for `python -m sglang.launch_server`,
so this parser has to agree with SGLang's on every flag the sim *uses* (same name, type,
choices, default) and must quietly accept every other SGLang flag, whatever number of values
it takes. argparse's `parse_known_args` gives both: known flags are type-checked (a malformed
value exits with status 2 and a usage line, as SGLang does) and the rest land in a leftover
list that we only sanity-check.

Abbreviations are switched off: with unknown flags allowed, a prefix match could silently bind
an unrelated SGLang flag to one of ours. The short spellings people really type (`--tp`, `--dp`,
`--model`) are declared as explicit aliases instead.

Flag facts follow SGLang 0.5.23 (its server_args.py; the generated pdkit/upstream/parser_table.json).
Both CUDA-graph spellings are accepted: the pre-0.5.20 `--cuda-graph-max-bs` / `--cuda-graph-bs` /
`--disable-cuda-graph` and the per-phase 0.5.20+ ones, because the kit keys flag generation on the
pinned SGLang version and the sim must run under either.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pdkit.upstream.parsertable import sglang_parser, table

DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
CUDA_GRAPH_BACKENDS = ("full", "breakable", "disabled")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")

# Used when neither --context-length nor anything else says how long a sequence may be.
DEFAULT_CONTEXT_LENGTH = 32768
DEFAULT_MAX_TOTAL_TOKENS = 262144
DEFAULT_MAX_RUNNING_REQUESTS = 4096
DEFAULT_CHUNKED_PREFILL_SIZE = 8192
# SGLang's --max-prefill-tokens default (server_args.py)
DEFAULT_MAX_PREFILL_TOKENS = 16384
# SGLang's default page size on CUDA (0.5.23 arg_groups/overrides.py _page_size_default)
DEFAULT_PAGE_SIZE = 1


def _newest_release() -> str:
    return max(table()["sglang"], key=lambda v: tuple(int(x) for x in v.split(".")))


# --radix-eviction-policy's choices, from the newest pinned parser (0.5.17 lacks tlru: release_problems)
RADIX_EVICTION_POLICIES = sglang_parser(_newest_release()).choices("--radix-eviction-policy") or ("lru",)
# The prefix-cache flags the sim models. Each is checked against the parser of the release the sim
# imitates (PDKIT_SIM_SGLANG_VERSION): a flag, or a choice, that release lacks is refused as its argparse would.
RELEASE_CHECKED_FLAGS = ("--disable-radix-cache", "--disaggregation-decode-enable-radix-cache",
                         "--enable-cache-report", "--radix-eviction-policy", "--page-size")


def _json_object(text: str) -> dict[str, Any]:
    """argparse type for --cuda-graph-config: a JSON object, else a usage error."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The sim's parser. Other code (e.g. contract tests) may call it to check a rendered argv."""
    parser = argparse.ArgumentParser(
        prog="python -m pdkit.sim",
        description="SGLang-compatible rehearsal engine (no GPU, never a performance claim).",
        allow_abbrev=False,
    )
    add = parser.add_argument

    # Model and identity
    add("--model-path", "--model", dest="model_path", type=str, required=True)
    add("--tokenizer-path", type=str, default=None)
    add("--served-model-name", type=str, default=None)
    add("--trust-remote-code", action="store_true")
    add("--skip-tokenizer-init", action="store_true")

    # HTTP server
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--api-key", type=str, default=None)
    add("--uvicorn-access-log-exclude-prefixes", type=str, nargs="*", default=[])

    # Parallelism (reported, and tp sizes the per-rank metric series)
    add("--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", "--dp", dest="dp_size", type=int, default=1)
    add("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    # an engine spanning nodes (SGLang's names and defaults): the ranks meet at --dist-init-addr
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    add("--dist-timeout", type=int, default=None)
    add("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    add("--base-gpu-id", type=int, default=0)
    add("--gpu-id-step", type=int, default=1)

    # Scheduling limits
    add("--context-length", type=int, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--max-queued-requests", type=int, default=None)
    add("--max-total-tokens", type=int, default=None)
    add("--chunked-prefill-size", type=int, default=None)
    add("--max-prefill-tokens", type=int, default=DEFAULT_MAX_PREFILL_TOKENS)
    add("--page-size", type=int, default=None)
    # Prefix (radix) cache: pdkit/sim/prefixcache.py
    add("--disable-radix-cache", action="store_true")
    add("--radix-eviction-policy", type=str, default="lru", choices=RADIX_EVICTION_POLICIES)
    add("--enable-cache-report", action="store_true")
    add("--stream-interval", type=int, default=1)
    add("--random-seed", type=int, default=None)
    add("--watchdog-timeout", type=float, default=300)

    # Logging and metrics
    add("--log-level", type=str, default="info")
    add("--log-level-http", type=str, default=None)
    add("--log-requests", action="store_true")
    add("--decode-log-interval", type=int, default=40)
    add("--enable-metrics", action="store_true")

    # PD disaggregation
    add("--disaggregation-mode", type=str, default="null", choices=DISAGGREGATION_MODES)
    add("--disaggregation-transfer-backend", type=str, default="mooncake", choices=TRANSFER_BACKENDS)
    add("--disaggregation-bootstrap-port", type=int, default=8998)
    add("--disaggregation-ib-device", type=str, default=None)
    add("--num-reserved-decode-tokens", type=int, default=512)
    add("--disaggregation-decode-enable-radix-cache", action="store_true")

    # CUDA graphs, pre-0.5.20 spelling
    add("--cuda-graph-max-bs", type=int, default=None)
    add("--cuda-graph-bs", type=int, nargs="+", default=None)
    add("--disable-cuda-graph", action="store_true")
    # CUDA graphs, 0.5.20+ per-phase spelling
    add("--cuda-graph-max-bs-decode", type=int, default=None)
    add("--cuda-graph-max-bs-prefill", type=int, default=None)
    add("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    add("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
    add("--cuda-graph-backend-decode", type=str, default=None, choices=CUDA_GRAPH_BACKENDS)
    add("--cuda-graph-backend-prefill", type=str, default=None, choices=CUDA_GRAPH_BACKENDS)
    add("--cuda-graph-config", type=_json_object, default=None)

    # Not modelled, but typed so a malformed value fails here as it would in SGLang.
    add("--mem-fraction-static", type=float, default=None)
    add("--num-continuous-decode-steps", type=int, default=1)
    add("--speculative-algorithm", type=str, default=None, choices=SPECULATIVE_ALGORITHMS)
    add("--speculative-num-steps", type=int, default=None)
    add("--speculative-eagle-topk", type=int, default=None)
    add("--speculative-num-draft-tokens", type=int, default=None)
    add("--numa-node", type=int, nargs="+", default=None)
    return parser


def leftover_error(extras: Sequence[str]) -> str | None:
    """Why the leftover (unknown) tokens are not a run of unknown flags, or None if they are.

    Values after an unknown flag are fine (`--numa-node 0 0 1 1` style); a bare value with no
    flag before it is a stray positional, which SGLang rejects as an unrecognized argument.
    """
    if extras and not extras[0].startswith("-"):
        return f"unrecognized arguments: {' '.join(extras)}"
    return None


@dataclass(frozen=True)
class CudaGraphPlan:
    """Which phases run under CUDA graphs, and up to which batch (decode) / token count (prefill)."""

    decode_enabled: bool
    decode_max_bs: int
    prefill_enabled: bool
    prefill_max_tokens: int


def _phase_backend(config: dict[str, Any] | None, phase: str) -> str | None:
    section = (config or {}).get(phase)
    if isinstance(section, dict) and isinstance(section.get("backend"), str):
        return section["backend"]
    return None


def _phase_max_bs(config: dict[str, Any] | None, phase: str) -> int | None:
    section = (config or {}).get(phase)
    if isinstance(section, dict) and isinstance(section.get("max_bs"), int):
        return section["max_bs"]
    return None


def resolve_cuda_graphs(ns: argparse.Namespace) -> CudaGraphPlan:
    """Resolve both CUDA-graph spellings into one plan, with SGLang's precedence.

    --cuda-graph-config (JSON) wins over the per-phase flags, which win over the deprecated
    --disable-cuda-graph. In PD mode a prefill server never captures decode graphs and a decode
    server never captures prefill graphs. Without an explicit max bs the decode default follows
    SGLang's large-GPU memory class (256 below TP4, 512 from TP4), clamped to
    --max-running-requests when that is set.
    """
    config = ns.cuda_graph_config

    def enabled(phase: str, flag_backend: str | None) -> bool:
        backend = _phase_backend(config, phase) or flag_backend
        if backend is not None:
            return backend != "disabled"
        return not ns.disable_cuda_graph

    decode_enabled = enabled("decode", ns.cuda_graph_backend_decode)
    prefill_enabled = enabled("prefill", ns.cuda_graph_backend_prefill)
    if ns.disaggregation_mode == "prefill":
        decode_enabled = False
    if ns.disaggregation_mode == "decode":
        prefill_enabled = False

    decode_bs_list = ns.cuda_graph_bs_decode or ns.cuda_graph_bs
    decode_max_bs = (
        _phase_max_bs(config, "decode")
        or ns.cuda_graph_max_bs_decode
        or ns.cuda_graph_max_bs
        or (max(decode_bs_list) if decode_bs_list else None)
    )
    if decode_max_bs is None:
        decode_max_bs = 512 if ns.tp_size >= 4 else 256
        if ns.max_running_requests:
            decode_max_bs = min(decode_max_bs, ns.max_running_requests)

    chunk = ns.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
    prefill_max = (
        _phase_max_bs(config, "prefill")
        or ns.cuda_graph_max_bs_prefill
        or (max(ns.cuda_graph_bs_prefill) if ns.cuda_graph_bs_prefill else None)
        or chunk
    )
    return CudaGraphPlan(decode_enabled, decode_max_bs, prefill_enabled, prefill_max)


def decode_graph_sizes(plan: CudaGraphPlan) -> list[int]:
    """The decode batch sizes captured as CUDA graphs, as SGLang generates them up to the max bs (0.5.17
    sglang/srt/server_args.py _generate_decode_cuda_graph_batch_sizes, the normal case); [] when
    decode graphs are off (a PD prefill captures none: 0.5.23 tp_worker.get_decode_cuda_graph_bs)."""
    if not plan.decode_enabled:
        return []
    top = plan.decode_max_bs
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, top + 1, 32))
    sizes = [bs for bs in sizes if bs <= top]
    return sizes if top in sizes else [*sizes, top]


@dataclass(frozen=True)
class SimArgs:
    """The parsed command line plus the values the sim derives from it."""

    server: dict[str, Any]  # every known flag, as parsed (reported by /server_info)
    ignored: tuple[str, ...]  # unknown SGLang flags and their values, accepted and not modelled
    model_path: str
    served_model_name: str
    host: str
    port: int
    api_key: str | None
    tp_size: int
    dp_size: int
    pp_size: int
    mode: str  # null | prefill | decode
    engine_type: str  # unified | prefill | decode (the metric label)
    bootstrap_port: int
    context_length: int
    max_running_requests: int
    max_queued_requests: int | None
    max_total_tokens: int
    max_prefill_tokens: int
    chunked_prefill_size: int
    random_seed: int
    watchdog_timeout: float
    log_level: str
    log_level_http: str
    log_requests: bool
    decode_log_interval: int
    stream_interval: int
    enable_metrics: bool
    access_log_exclude_prefixes: tuple[str, ...]
    cuda_graphs: CudaGraphPlan
    extra: dict[str, Any] = field(default_factory=dict)
    # the argv as given (the lever-fault knobs match conditions on it: pdkit/sim/knobs.py)
    argv: tuple[str, ...] = ()
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    # the prefix cache (docs/sim.md "Prefix cache"): on unless --disable-radix-cache; a PD decode has
    # one only with --disaggregation-decode-enable-radix-cache, which overrides --disable-radix-cache
    # either way (SGLang's arg_groups/pd_disaggregation_hook.py)
    radix_cache: bool = True
    decode_radix_cache: bool = False
    page_size: int = DEFAULT_PAGE_SIZE
    radix_eviction_policy: str = "lru"
    enable_cache_report: bool = False

    def server_info(self) -> dict[str, Any]:
        """Resolved arguments in SGLang's /server_info shape (flat, flag names with underscores)."""
        info = dict(self.server)
        info.update(
            served_model_name=self.served_model_name,
            context_length=self.context_length,
            max_running_requests=self.max_running_requests,
            max_total_tokens=self.max_total_tokens,
            chunked_prefill_size=self.chunked_prefill_size,
            random_seed=self.random_seed,
            disable_cuda_graph=not self.cuda_graphs.decode_enabled and not self.cuda_graphs.prefill_enabled,
            cuda_graph_backend_decode="full" if self.cuda_graphs.decode_enabled else "disabled",
            cuda_graph_backend_prefill="full" if self.cuda_graphs.prefill_enabled else "disabled",
            cuda_graph_max_bs_decode=self.cuda_graphs.decode_max_bs,
            cuda_graph_max_bs_prefill=self.cuda_graphs.prefill_max_tokens,
            disable_radix_cache=not self.radix_cache,
            page_size=self.page_size,
            ignored_sglang_args=list(self.ignored),
        )
        return info


ENGINE_TYPES = {"null": "unified", "prefill": "prefill", "decode": "decode"}


def resolve(ns: argparse.Namespace, ignored: Sequence[str] = ()) -> SimArgs:
    """Derive the sim's settings from a parsed namespace (pure: no environment, no I/O)."""
    chunk = ns.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
    return SimArgs(
        server={k: v for k, v in vars(ns).items()},
        ignored=tuple(ignored),
        model_path=ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        tp_size=ns.tp_size,
        dp_size=ns.dp_size,
        pp_size=ns.pp_size,
        mode=ns.disaggregation_mode,
        engine_type=ENGINE_TYPES[ns.disaggregation_mode],
        bootstrap_port=ns.disaggregation_bootstrap_port,
        context_length=ns.context_length or DEFAULT_CONTEXT_LENGTH,
        max_running_requests=ns.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS,
        max_queued_requests=ns.max_queued_requests,
        max_total_tokens=ns.max_total_tokens or DEFAULT_MAX_TOTAL_TOKENS,
        max_prefill_tokens=ns.max_prefill_tokens,
        chunked_prefill_size=chunk,
        random_seed=ns.random_seed if ns.random_seed is not None else 0,
        watchdog_timeout=ns.watchdog_timeout,
        log_level=ns.log_level.upper(),
        log_level_http=(ns.log_level_http or ns.log_level).upper(),
        log_requests=ns.log_requests,
        decode_log_interval=max(1, ns.decode_log_interval),
        stream_interval=max(1, ns.stream_interval),
        enable_metrics=ns.enable_metrics,
        access_log_exclude_prefixes=tuple(ns.uvicorn_access_log_exclude_prefixes or ()),
        cuda_graphs=resolve_cuda_graphs(ns),
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        dist_timeout=ns.dist_timeout,
        radix_cache=(ns.disaggregation_decode_enable_radix_cache if ns.disaggregation_mode == "decode"
                     else not ns.disable_radix_cache),
        decode_radix_cache=ns.disaggregation_mode == "decode" and ns.disaggregation_decode_enable_radix_cache,
        page_size=max(1, ns.page_size or DEFAULT_PAGE_SIZE),
        radix_eviction_policy=ns.radix_eviction_policy,
        enable_cache_report=ns.enable_cache_report,
    )


def parse_args(argv: Sequence[str] | None = None) -> SimArgs:
    """Parse an SGLang argv. Exits with status 2 and a usage message on a malformed value."""
    parser = build_parser()
    ns, extras = parser.parse_known_args(argv)
    problem = leftover_error(extras)
    if problem:
        parser.error(problem)
    return dataclasses.replace(resolve(ns, extras), argv=tuple(sys.argv[1:] if argv is None else argv))


def release_problems(argv: Sequence[str], version: str) -> list[str]:
    """What SGLang VERSION's own parser (pdkit/upstream/parser_table.json) refuses among the prefix-cache flags
    the sim models (RELEASE_CHECKED_FLAGS): a flag it lacks, or a choice it lacks (0.5.17 has no
    `--radix-eviction-policy tlru`). Other flags keep the sim's release-independent parser."""
    parser = sglang_parser(version)
    _, problems = parser.parse(list(argv))
    out = []
    for p in problems:
        flag = str(argv[p.index]).split("=", 1)[0]
        if flag in RELEASE_CHECKED_FLAGS:
            out.append(p.message)
    return out


def check_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Parse without exiting: raise ValueError for what SGLang would refuse. For contract tests."""
    parser = build_parser()
    messages: list[str] = []

    def fail(message: str) -> NoReturn:  # argparse calls error() and expects it not to return
        messages.append(message)
        raise ValueError(message)

    parser.error = fail  # type: ignore[method-assign]
    ns, extras = parser.parse_known_args(list(argv))
    problem = leftover_error(extras)
    if problem:
        raise ValueError(problem)
    return ns, extras


__all__ = [
    "CudaGraphPlan",
    "SimArgs",
    "build_parser",
    "check_argv",
    "decode_graph_sizes",
    "parse_args",
    "release_problems",
    "resolve",
    "resolve_cuda_graphs",
]
