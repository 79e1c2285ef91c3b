"""The tuning layers (cluster `all`, then the role's, then the engine's own) and speculative
decoding, with pdkit's defaults (TUNING_DEFAULTS); each field is one SGLang flag or env var."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pdkit.spec.fields import MAX_BATCH, MAX_CONTEXT_LENGTH, BatchSize, Frozen, Seconds, at_most, checked_model_location
from pdkit.upstream.parsertable import all_speculative_algorithms

__all__ = [
    "DRAFT_REFUSED", "DRAFT_REQUIRED", "EAGLE_FAMILY", "TUNING_DEFAULTS", "RoleTuning", "Speculative", "Tuning",
]

# the algorithms speculative_hook._handle_eagle_family handles (NEXTN is EAGLE there), 0.5.17 and 0.5.23
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")

# How SGLang's speculative hook treats a missing --speculative-draft-model-path
# (sglang/srt/arg_groups/speculative_hook.py of 0.5.17 and 0.5.23: _handle_dflash raises,
# _handle_uno refuses a draft; EAGLE-family algorithms load the draft from the path and only
# default it to the target for a model with a built-in MTP head, which SGLang names NEXTN).
# EAGLE without one is accepted, as SGLang accepts it: the draft then comes from the model path (0.5.23
# _handle_eagle_family for the checkpoints with a built-in MTP head; ModelConfig.from_server_args falls
# back to the model path, as SGLang's own MiMo-7B-RL recipe runs it): a warning in pdkit/spec/checks.py.
DRAFT_REQUIRED = {
    "EAGLE3": "an EAGLE3 draft is always a separate checkpoint",
    "STANDALONE": "STANDALONE runs a separate small draft model",
    "DFLASH": "SGLang: 'DFLASH speculative decoding requires setting --speculative-draft-model-path'",
}
DRAFT_REFUSED = {
    "UNO": "SGLang: 'UNO reuses the target model and does not accept --speculative-draft-model-path'",
    "NGRAM": "NGRAM drafts from an n-gram cache of the prompt; SGLang never loads a draft for it",
}


class Speculative(Frozen):
    """Speculative decoding, checked the way SGLang's speculative_hook checks it."""

    # EAGLE | EAGLE3 | NEXTN | STANDALONE | NGRAM | DFLASH | DSPARK | UNO (multi-token prediction is NEXTN)
    algorithm: str
    # --speculative-num-steps; unset means SGLang picks, and then topk/draft tokens must be unset too
    num_steps: int | None = Field(default=None, ge=1)
    # --speculative-eagle-topk
    eagle_topk: int | None = Field(default=None, ge=1)
    # --speculative-num-draft-tokens; with topk 1 it must equal num_steps + 1
    num_draft_tokens: int | None = Field(default=None, ge=1)
    # --speculative-draft-model-path; unset for NEXTN (the model's own MTP head)
    draft_model_path: str | None = None

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        known = all_speculative_algorithms()
        if value.upper() == "MTP":
            raise ValueError(
                "'MTP' is not an SGLang algorithm name: multi-token prediction is 'NEXTN'"
            )
        if value not in known:
            raise ValueError(f"unknown algorithm {value!r}; valid: {', '.join(known)}")
        return value

    _draft_location = field_validator("draft_model_path")(classmethod(lambda cls, v: checked_model_location(v)))

    @model_validator(mode="after")
    def _draft_model(self) -> Speculative:
        need = DRAFT_REQUIRED.get(self.algorithm)
        if need and self.draft_model_path is None:
            raise ValueError(f"{self.algorithm} needs a draft model: set draft_model_path ({need})")
        if self.algorithm in DRAFT_REFUSED and self.draft_model_path is not None:
            raise ValueError(f"{self.algorithm} takes no draft model ({DRAFT_REFUSED[self.algorithm]}): remove "
                             "draft_model_path")
        return self

    @model_validator(mode="after")
    def _consistent_counts(self) -> Speculative:
        # only the EAGLE family asserts it (speculative_hook._handle_eagle_family); DFLASH / DSPARK set
        # num_steps and topk to 1 themselves, NGRAM derives num_steps from the draft tokens, and UNO
        # needs num_steps only for a tree (topk > 1: _handle_uno), of 0.5.17 and 0.5.23 alike
        if self.num_steps is None and (
            (self.algorithm in EAGLE_FAMILY and (self.eagle_topk is not None or self.num_draft_tokens is not None))
            or (self.algorithm == "UNO" and (self.eagle_topk or 1) > 1)
        ):
            raise ValueError(
                "num_steps is unset, so eagle_topk and num_draft_tokens must be unset too "
                "(SGLang picks all three together)" if self.algorithm != "UNO" else
                "UNO with eagle_topk > 1 (tree mode) needs num_steps (SGLang: 'UNO tree mode requires "
                "--speculative-num-steps')"
            )
        # eagle_topk 1 with num_draft_tokens other than num_steps + 1 is valid: SGLang adjusts the draft tokens to
        # num_steps + 1 with a warning (speculative_hook.py _handle_eagle_family, 0.5.17 and 0.5.23), and so does
        # validate (pdkit.upstream.startchecks.derivation_problems)
        return self


class Tuning(Frozen):
    """The seeds' levers. Unset (None) means SGLang's own default; each maps to one flag or env var."""

    # decode-phase CUDA graphs (the seeds' first lever); False -> --cuda-graph-backend-decode disabled
    cuda_graph: bool | None = None
    # prefill-phase (piecewise) CUDA graphs; False -> --cuda-graph-backend-prefill disabled
    prefill_cuda_graph: bool | None = None
    # --cuda-graph-max-bs-decode: largest decode batch captured; must cover the target concurrency per DP rank
    # (ceil(target / dp or attn_dp))
    cuda_graph_max_bs: BatchSize | None = None
    # --cuda-graph-bs-decode: explicit capture buckets (finer buckets cut padding waste)
    cuda_graph_bs: tuple[int, ...] | None = None
    # --num-continuous-decode-steps
    num_continuous_decode_steps: Annotated[int, Field(ge=1), at_most(1024, "number of decode steps")] | None = None
    # --context-length: cap it (an uncapped 1M context made the indexer scan 1M tokens a step)
    context_length: Annotated[int, Field(ge=1), at_most(MAX_CONTEXT_LENGTH, "context length in tokens")] | None = None
    # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: needed for a context above the model's maximum
    allow_longer_context: bool | None = None
    # --mem-fraction-static
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    # --max-running-requests
    max_running_requests: BatchSize | None = None
    # --max-queued-requests
    max_queued_requests: Annotated[int, Field(ge=1), at_most(10_000_000, "queue length")] | None = None
    # --chunked-prefill-size (a multiple of page_size; -1: chunked prefill off, as SGLang's help says)
    chunked_prefill_size: Annotated[int, Field(ge=-1),
                                    at_most(MAX_CONTEXT_LENGTH, "prefill chunk in tokens")] | None = None
    # --page-size (KV page size; a PD transfer lever)
    page_size: Annotated[int, Field(ge=1), at_most(4096, "KV page size in tokens")] | None = None
    # False -> --disable-overlap-schedule
    overlap_schedule: bool | None = None
    # True -> --enable-torch-compile
    torch_compile: bool | None = None
    # --attention-backend
    attention_backend: str | None = None
    # --sampling-backend
    sampling_backend: str | None = None
    # --moe-runner-backend
    moe_runner_backend: str | None = None
    # --quantization
    quantization: str | None = None
    # --kv-cache-dtype
    kv_cache_dtype: str | None = None
    # --speculative-*
    speculative: Speculative | None = None
    # auto: off at TP 2 on sm_12x (crashes at graph capture) and with the P2P-disabled NCCL profile
    custom_all_reduce: Literal["auto", "on", "off"] | None = None
    # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (SGLang >= 0.5.23, TP 2/4/8, bf16, needs working P2P)
    pcie_ipc_allreduce: bool | None = None
    # --watchdog-timeout seconds
    watchdog_timeout: Seconds | None = None
    # --enable-metrics (pdkit's monitoring needs it; on unless turned off)
    enable_metrics: bool | None = None
    # --decode-log-interval
    decode_log_interval: int | None = Field(default=None, ge=1)
    # --log-level
    log_level: Literal["debug", "info", "warning", "error", "critical"] | None = None
    # False -> --disable-radix-cache: no prefix cache (SGLang's default keeps it on; a PD decode turns
    # it off itself unless decode_radix_cache is set)
    radix_cache: bool | None = None
    # --radix-eviction-policy (which cached prefixes go first; choices from the release's parser)
    radix_eviction_policy: str | None = None
    # True -> --disaggregation-decode-enable-radix-cache (decode engines only; SGLang logs it as
    # EXPERIMENTAL): the decode keeps a radix cache, so the KV of a prefix it already holds is not
    # sent again each turn
    decode_radix_cache: bool | None = None
    # True -> --enable-hierarchical-cache: HiCache, a host-memory KV tier behind the GPU radix cache
    hicache: bool | None = None
    # --hicache-ratio: each rank's host pool = ratio x its GPU KV pool (SGLang's default 2.0); needs hicache
    hicache_ratio: float | None = Field(default=None, gt=0, le=100)
    # --hicache-size: each rank's host pool in GB (overrides the ratio); needs hicache
    hicache_size_gb: Annotated[int, Field(ge=1), at_most(4096, "host pool in GB")] | None = None
    # --moe-a2a-backend (expert-parallel all-to-all: deepep, mooncake, ...; choices from the release's parser)
    moe_a2a_backend: str | None = None
    # True -> --enable-eplb (expert-parallel load balancer; needs an engine with ep > 1)
    enable_eplb: bool | None = None
    # --ep-num-redundant-experts (extra expert replicas EPLB may place; needs ep > 1)
    ep_num_redundant_experts: Annotated[int, Field(ge=0), at_most(4096, "number of redundant experts")] | None = None

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk_not_zero(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("0 is not a chunk size: valid: a positive number of tokens, or -1 for no chunked prefill "
                             "(SGLang 0.5.17 server_args.py, 0.5.23 arg_groups/fields/schedule.py: "
                             "'Setting this to -1 means disabling chunked prefill')")
        return v

    @field_validator("cuda_graph_bs")
    @classmethod
    def _sorted_buckets(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None:
            if not value or any(b < 1 for b in value):
                raise ValueError("give a non-empty list of positive batch sizes, e.g. [1, 2, 4, 8, 16]")
            if max(value) > MAX_BATCH:
                raise ValueError(f"{max(value)} is above {MAX_BATCH}, the most a batch size can sensibly be")
            if list(value) != sorted(set(value)):
                raise ValueError("batch sizes must be strictly increasing, e.g. [1, 2, 4, 8, 16]")
        return value

    def merged(self, override: Tuning) -> Tuning:
        """This tuning with every field the override sets explicitly taking its value."""
        return self.model_copy(update={k: getattr(override, k) for k in override.model_fields_set})

    def value(self, name: str) -> Any:  # the field's own type, which varies by name
        """A field's effective value: the explicit setting, else pdkit's default."""
        explicit = getattr(self, name)
        return TUNING_DEFAULTS.get(name) if explicit is None else explicit


# pdkit's defaults where they differ from "leave it to SGLang".
TUNING_DEFAULTS: dict[str, object] = {
    # graphs are the single largest lever in the seeds (3.8x, 5.2x): on unless turned off
    "cuda_graph": True,
    # the exporter, doctor and dashboards read /metrics
    "enable_metrics": True,
    "overlap_schedule": True,
    "torch_compile": False,
    "custom_all_reduce": "auto",
    "pcie_ipc_allreduce": False,
    "allow_longer_context": False,
}


class RoleTuning(Frozen):
    """Cluster-wide tuning: `all` first, then the engine's role, then the engine's own."""

    all: Tuning = Tuning()
    prefill: Tuning = Tuning()
    decode: Tuning = Tuning()
    unified: Tuning = Tuning()
