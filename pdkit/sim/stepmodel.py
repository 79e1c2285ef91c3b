"""The engine's decisions and costs, as small pure functions (no clock, no asyncio).

The sim is not a performance model of any GPU. These formulas only have to move in the same
direction as a real engine when the kit pulls a lever: a step gets longer as the batch grows,
decode without CUDA graphs is several times slower (a real engine without graphs is bound by
kernel-launch overhead), a batch bigger than the captured graph size falls back to no graph,
and the scheduler admits no more than max running requests, the prefill token budget and the
KV pool allow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdkit.sim.args import CudaGraphPlan
from pdkit.sim.knobs import Knobs


def decode_uses_cuda_graph(plan: CudaGraphPlan, batch_size: int) -> bool:
    """SGLang replays a decode graph only when one was captured for a batch this large."""
    return plan.decode_enabled and batch_size <= plan.decode_max_bs


def prefill_uses_cuda_graph(plan: CudaGraphPlan, new_tokens: int) -> bool:
    return plan.prefill_enabled and new_tokens <= plan.prefill_max_tokens


def decode_step_seconds(knobs: Knobs, batch_size: int, cuda_graph: bool, context_length: int = 0) -> float:
    """One decode forward pass. The indexer charge scales with the configured context length, not
    the tokens in use: the seeds' indexer scored ~1M positions per step until --context-length
    capped it (17.9x at C=64)."""
    step_ms = knobs.decode_base_ms + knobs.decode_per_req_ms * batch_size
    step_ms += knobs.indexer_ms_per_1m_ctx * batch_size * context_length / 1e6
    if not cuda_graph:
        step_ms *= knobs.no_cuda_graph_factor
    return step_ms / 1000.0


def decode_iteration_seconds(knobs: Knobs, batch_size: int, cuda_graph: bool, steps: int,
                             context_length: int = 0) -> float:
    """A scheduler iteration of STEPS continuous decode steps: the scheduling overhead is paid
    once per iteration (SGLang's --num-continuous-decode-steps), so per token it shrinks as 1/steps."""
    return knobs.schedule_ms / 1000.0 + steps * decode_step_seconds(knobs, batch_size, cuda_graph, context_length)


def prefill_step_seconds(knobs: Knobs, new_tokens: int) -> float:
    """One prefill pass over `new_tokens`: the prompts' tokens less their cached prefixes (a
    radix-cache hit is not recomputed)."""
    return (knobs.prefill_base_ms + knobs.prefill_ms_per_1k_tokens * new_tokens / 1000.0) / 1000.0


def prefill_passes(new_tokens: int, chunked_prefill_size: int) -> int:
    """Forward passes a prefill batch takes: one per chunk of the chunked-prefill size."""
    if chunked_prefill_size <= 0:  # -1: chunked prefill off (SGLang's help text): one pass
        return 1
    return max(1, math.ceil(new_tokens / chunked_prefill_size))


def kv_transfer_bytes(knobs: Knobs, tokens: int) -> int:
    """Bytes of KV a PD prefill sends for `tokens` tokens (kv_tokens_to_send)."""
    return knobs.kv_bytes_per_token * tokens


def kv_transfer_seconds(knobs: Knobs, tokens: int) -> float:
    return kv_transfer_bytes(knobs, tokens) / (knobs.kv_transfer_gb_s * 1e9)


def sglang_kv_units(nbytes: int, seconds: float) -> tuple[float, float]:
    """(kv_transfer_total_mb, kv_transfer_speed_gb_s) as SGLang observes a transfer: MiB
    (bytes / 2**20) and (MiB / 1024) / seconds. The knob PDKIT_SIM_KV_TRANSFER_GB_S is a link
    rate in decimal GB/s: 1.2 reads as 1.2e9 / 2**30 = 1.118 on SGLang's speed histogram."""
    total_mb = nbytes / 2**20
    return total_mb, (total_mb / 1024) / seconds


@dataclass(frozen=True)
class Limits:
    max_running_requests: int
    max_prefill_tokens: int  # per prefill batch; a longer single prompt still goes alone
    max_total_tokens: int  # KV pool


def fits(count: int, running: int, batch_tokens: int, kv: int, new_tokens: int, reserve: int, limits: Limits,
         prefill_budget: bool = True) -> bool:
    """Whether one more request joins a batch that already admitted `count`: running slots, then the
    per-batch prefill token budget over the tokens to compute (`new_tokens`: the prompt less its
    cached prefix; skipped for a PD decode engine, whose prompts were prefilled elsewhere), then the
    KV pool, where it reserves `reserve` more tokens (its uncached prompt, its whole output, and any
    cached prefix it locks that was evictable) on top of `kv` already held."""
    if running + count >= limits.max_running_requests:
        return False
    if prefill_budget and count and batch_tokens + new_tokens > limits.max_prefill_tokens:
        return False
    if kv + reserve > limits.max_total_tokens and (count or running):
        return False  # an idle engine still takes one oversized request rather than deadlock
    return True


def admit_count(
    waiting: Sequence[tuple[int, int]],
    running: int,
    used_tokens: int,
    limits: Limits,
    prefill_budget: bool = True,
) -> int:
    """How many requests from the head of the waiting queue join the next batch.

    `waiting` holds (prompt tokens, max new tokens) per queued request, oldest first (no cached
    prefix: the scheduler applies `fits` itself when its prefix cache has hits). Admission is
    first-come first-served and stops at the first request that does not fit, as SGLang's FCFS
    policy does.
    """
    count = 0
    batch_tokens = 0
    kv = used_tokens
    for prompt_tokens, max_new in waiting:
        reserve = prompt_tokens + max_new
        if not fits(count, running, batch_tokens, kv, prompt_tokens, reserve, limits, prefill_budget):
            break
        count += 1
        batch_tokens += prompt_tokens
        kv += reserve
    return count


# SGLang's `--num-reserved-decode-tokens` default (0.5.17 server_args.py; 0.5.23
# arg_groups/fields/disagg.py): decode KV kept free per active request when a PD decode admits one
DEFAULT_NUM_RESERVED_DECODE_TOKENS = 512
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION's default (environ.py of both releases): a request's max_new_tokens
# counts at most this much in the decode's admission estimate (disaggregation/decode.py CLIP_MAX_NEW_TOKEN)
CLIP_MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class Decoding:
    """A request in a PD decode's running batch, as its admission sees it."""

    prompt_tokens: int
    output_tokens: int
    max_new_tokens: int


def decode_allocatable_tokens(available: int, active: int, running: Sequence[Decoding],
                              reserved: int = DEFAULT_NUM_RESERVED_DECODE_TOKENS,
                              clip: int = CLIP_MAX_NEW_TOKENS) -> int:
    """KV tokens a PD decode may pre-allocate for one more request: SGLang's `_allocatable_token_budgets`
    (disaggregation/decode.py; 0.5.17 line 1371, 0.5.23 line 2083). `available` is the pool's free tokens
    (evictable radix-cache tokens included when the decode has a radix cache); `active` the requests it
    holds already (running, pre-allocated and waiting for their KV, or arrived and not yet running), each
    keeping `reserved` tokens free for its next decode steps; and at least enough for the running request
    that needs the most to finish, beyond what retracting every running request would free."""
    retractable = sum(r.prompt_tokens + r.output_tokens for r in running)
    single = max((min(r.max_new_tokens, clip) + r.prompt_tokens - retractable for r in running), default=0)
    return available - max(reserved * active, single)


def decode_prealloc_tokens(prompt_tokens: int, max_new_tokens: int, prefix_tokens: int, running: Sequence[Decoding],
                           reserved: int = DEFAULT_NUM_RESERVED_DECODE_TOKENS, page_size: int = 1,
                           clip: int = CLIP_MAX_NEW_TOKENS) -> int:
    """What one request needs of `decode_allocatable_tokens` to be admitted: its prompt past the prefix the
    decode's radix cache holds, in whole pages, plus `reserved` decode tokens, and at least its prompt plus
    its (clipped) max_new_tokens beyond what retracting the running batch would free (SGLang 0.5.17
    pop_preallocated, decode.py:1046-1063; 0.5.23 `_required_admission_tokens`, decode.py:508)."""
    page = max(1, page_size)
    # 0.5.23 `_required_alloc_tokens` / utils/common.py get_num_new_pages: the pages past the prefix's pages
    alloc = max(0, math.ceil(prompt_tokens / page) - math.ceil(prefix_tokens / page)) * page
    retractable = sum(r.prompt_tokens + r.output_tokens for r in running)
    return max(alloc + reserved, prompt_tokens - prefix_tokens + min(max_new_tokens, clip) - retractable)


def decode_admits(prompt_tokens: int, max_new_tokens: int, prefix_tokens: int, available: int, active: int,
                  running: Sequence[Decoding], reserved: int = DEFAULT_NUM_RESERVED_DECODE_TOKENS,
                  page_size: int = 1, clip: int = CLIP_MAX_NEW_TOKENS) -> bool:
    """Whether a PD decode pre-allocates KV for the head of its prealloc queue now. There is no exception
    for an idle decode: a prompt that fits the pool but not with its reserved tokens waits for ever (SGLang
    refuses outright only a prompt longer than the whole pool, `_check_if_req_exceed_kv_capacity`)."""
    need = decode_prealloc_tokens(prompt_tokens, max_new_tokens, prefix_tokens, running, reserved, page_size, clip)
    return need <= decode_allocatable_tokens(available, active, running, reserved, clip)


def decode_admitted_at_once(prompt_tokens: int, max_new_tokens: int, pool_tokens: int,
                            reserved: int = DEFAULT_NUM_RESERVED_DECODE_TOKENS, page_size: int = 1,
                            clip: int = CLIP_MAX_NEW_TOKENS) -> int:
    """How many of a burst of equal requests an idle decode with POOL_TOKENS admits before the first
    finishes (the rest wait in its prealloc queue): the rule above applied one by one."""
    page = max(1, page_size)
    held = math.ceil(prompt_tokens / page) * page
    count = 0
    while decode_admits(prompt_tokens, max_new_tokens, 0, pool_tokens - count * held, count, (), reserved,
                        page_size, clip):
        count += 1
    return count


def kv_tokens_to_send(prompt_tokens: int, decode_prefix: int, page_size: int = 1) -> int:
    """Prompt tokens whose KV a PD prefill sends: everything past the prefix the decode already holds
    (`decode_prefix_len`, 0 without a decode radix cache), in whole pages (0.5.23
    disaggregation/prefill.py `_num_pages_to_send`: kv_to_page_num(len(origin_input_ids) -
    decode_prefix_len, page_size))."""
    rest = max(0, prompt_tokens - decode_prefix)
    page = max(1, page_size)
    return math.ceil(rest / page) * page
