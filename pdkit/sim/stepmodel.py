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
    return max(1, math.ceil(new_tokens / max(1, chunked_prefill_size)))


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


def kv_tokens_to_send(prompt_tokens: int, decode_prefix: int, page_size: int = 1) -> int:
    """Prompt tokens whose KV a PD prefill sends: everything past the prefix the decode already holds
    (`decode_prefix_len`, 0 without a decode radix cache), in whole pages (0.5.23
    disaggregation/prefill.py `_num_pages_to_send`: kv_to_page_num(len(origin_input_ids) -
    decode_prefix_len, page_size))."""
    rest = max(0, prompt_tokens - decode_prefix)
    page = max(1, page_size)
    return math.ceil(rest / page) * page
