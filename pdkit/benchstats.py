"""Benchmark maths (pure): percentiles, throughput, TPOT and ITL from per-request timings.

Definitions, the same as SGLang's own `sglang.benchmark.serving` (0.5.23 `calculate_metrics`):

- percentile: linear interpolation between closest ranks (numpy's default method "linear"):
  for sorted values v[0..n-1] and q in [0, 100], rank r = (n - 1) * q / 100, then
  v[floor(r)] + (v[ceil(r)] - v[floor(r)]) * (r - floor(r)).
- TTFT: time from sending the request to the first chunk that carries output text.
- TPOT (time per output token, first token excluded): (latency - ttft) / (output_tokens - 1),
  only for requests with more than one output token.
- ITL (inter-token latency): every gap between consecutive output chunks of a request,
  pooled over all requests (a chunk may carry several tokens when the server batches them).
- output tok/s: output tokens of the completed requests / wall time of the level;
  requests/s: completed requests / wall time of the level. Failed requests count as errors
  and add no tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# The percentiles reported per metric (besides the mean).
REPORTED_PERCENTILES = (50, 99)


@dataclass(frozen=True)
class RequestResult:
    """What one streamed request measured; times are seconds from sending it."""

    ok: bool
    ttft: float | None = None
    latency: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    chunk_times: tuple[float, ...] = field(default_factory=tuple)
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation, numpy's default; None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, None when empty."""
    return sum(values) / len(values) if values else None


def tpot(result: RequestResult) -> float | None:
    """Time per output token after the first, in seconds; None with fewer than two tokens."""
    if not result.ok or result.latency is None or result.ttft is None or result.output_tokens < 2:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


def itls(result: RequestResult) -> list[float]:
    """Gaps between consecutive output chunks of one request, in seconds."""
    times = result.chunk_times
    return [later - earlier for earlier, later in zip(times, times[1:])]


def distribution_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """Mean and the reported percentiles of values given in seconds, as milliseconds."""
    values_ms = [v * 1000.0 for v in values_s]
    out: dict[str, float | None] = {"mean": _round(mean(values_ms))}
    for q in REPORTED_PERCENTILES:
        out[f"p{q}"] = _round(percentile(values_ms, q))
    return out


def throughput(count: float, duration_s: float) -> float:
    """count per second over a wall time; 0 for a zero or negative duration."""
    return count / duration_s if duration_s > 0 else 0.0


def summarize_level(results: Sequence[RequestResult], duration_s: float, concurrency: int) -> dict:
    """One concurrency level's figures (the `levels[]` entry of a bench record)."""
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    input_tokens = sum(r.prompt_tokens for r in done)
    tpots = [t for t in (tpot(r) for r in done) if t is not None]
    gaps = [gap for r in done for gap in itls(r)]
    samples: list[str] = []
    for r in failed:
        if r.error and r.error not in samples and len(samples) < 3:
            samples.append(r.error)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(done),
        "errors": len(failed),
        "error_samples": samples,
        "duration_s": _round(duration_s, 4),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "output_tok_s": _round(throughput(output_tokens, duration_s)),
        "requests_s": _round(throughput(len(done), duration_s), 4),
        "ttft_ms": distribution_ms([r.ttft for r in done if r.ttft is not None]),
        "tpot_ms": distribution_ms(tpots),
        "itl_ms": distribution_ms(gaps),
        "e2e_ms": distribution_ms([r.latency for r in done if r.latency is not None]),
    }


def ratio(after: float | None, before: float | None) -> float | None:
    """after / before, None when either is missing or before is zero."""
    if after is None or before is None or before == 0:
        return None
    return after / before


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
