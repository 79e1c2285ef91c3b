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
- goodput (when SLOs are given: `pdkit tune`'s goodput objective): completed requests whose TTFT
  and own TPOT are both within their SLOs, per second of the level's wall time (SGLang 0.5.23's
  `--goodput ttft:X tpot:Y`, sglang/benchmark/goodput.py).

How a streamed request failed is decided here once, for `pdkit bench` and the load clients
(tests/lab/loadclient.py, gpu/nspawn/outage_client.py): `StreamEnd` gathers what a stream said
(any of SGLang's three APIs), `stream_failure` names the failure's kind, `failure_kind` reads the
kind back from the text every failure starts with. What SGLang 0.5.17 and 0.5.23 send, and why
each rule: docs/bench/README.md "How a failed request is classified".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
    # a failure's kind (failure_kind), the finish reason its stream named, the worker that served
    # it (the router's header, when it sends one) and SGLang's request id (the rid its logs name)
    kind: str | None = None
    finish_reason: str | None = None
    worker: str | None = None
    rid: str | None = None


# ---- how a streamed request ended ------------------------------------------------------------

# The engine aborted the request: an error event in the stream (SGLang sends one for an abort
# that carries an HTTP status: a PD transfer or handshake failure is a 500), or finish_reason
# "abort" (an abort without a status: /abort_request, a grammar failure).
ABORTED = "aborted"
# The connection ended before `data: [DONE]` (an engine or router gone mid-stream).
NO_DONE = "no [DONE]"
# `empty (<finish reason>)`: [DONE] came but no output did. With finish_reason "stop" the model
# ended at once (a random-weight model can sample EOS first); "length" with max_tokens >= 1 and no
# text is a detokenizer oddity; "none": the stream never named a finish reason.
EMPTY = "empty"

# Headers that name who served a request. smg 1.13.0 answers with x-smg-routed-worker-id (in PD
# mode the decode worker's URL); sglang-router 0.3.2 sends no such header. Both send
# x-request-id, the router's own id (not the rid SGLang logs: that is the body's `id`).
WORKER_HEADER = "x-smg-routed-worker-id"
REQUEST_ID_HEADER = "x-request-id"
# SGLang's PD abort messages name the request (decode.py: "... decode_req.req.rid='<rid>' ..."):
# the error chunk has no `id`, so the rid is read from there
_RID_IN_MESSAGE = re.compile(r"\brid='([^']+)'")


def empty_kind(finish_reason: str | None) -> str:
    return f"{EMPTY} ({finish_reason or 'none'})"


def failure_kind(why: str) -> str:
    """The kind a failure's text starts with: `status 503`, `hang`, `aborted`, `empty (stop)`,
    `no [DONE]`, or an exception's type. Every client writes a failure as "<kind>: <detail>"."""
    return why.split(":", 1)[0].strip()[:60]


@dataclass
class StreamEnd:
    """What a stream said about how it ended, gathered event by event (`see`).

    content: output seen: chat/completions chunks that carried text (or reasoning text), or the
    native API's meta_info.completion_tokens. finish_reason: the last one named (the chunk's
    choices[0].finish_reason, or meta_info.finish_reason.type). error: the error event's body.
    rid: SGLang's request id (`id`, or meta_info.id). abort: an abort's message and status."""

    done: bool = False
    content: int = 0
    finish_reason: str | None = None
    error: Any = None
    rid: str | None = None
    abort: dict[str, Any] | None = None

    def see(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.error = event["error"]
            message = self.error.get("message") if isinstance(self.error, dict) else self.error
            found = _RID_IN_MESSAGE.search(str(message or ""))
            self.rid = self.rid or (found.group(1) if found else None)
            return
        meta = event.get("meta_info")
        if isinstance(meta, dict):  # native /generate
            self.rid = meta.get("id") or self.rid
            self.content = max(self.content, int(meta.get("completion_tokens") or 0))
            reason = meta.get("finish_reason")
            if isinstance(reason, dict):
                self.finish_reason = reason.get("type")
                if reason.get("type") == "abort":
                    self.abort = reason
            return
        self.rid = event.get("id") or self.rid
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or choice.get("text"):
                self.content += 1
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def error_code(self) -> str | None:
        """The error event's code (SGLang: the abort's HTTP status), or None."""
        if isinstance(self.error, dict) and self.error.get("code") is not None:
            return str(self.error["code"])
        return None

    def shown_finish(self) -> str:
        """The finish reason to count a failure under: as streamed, `error <code>` for an error
        event (SGLang's abort with a status sends no finish_reason, only the error), else `none`."""
        if self.error is not None:
            return f"error {self.error_code() or '?'}"
        return self.finish_reason or "none"


def stream_failure(end: StreamEnd) -> str | None:
    """None when the stream answered, else "<kind>: <detail>" (kinds: ABORTED, NO_DONE, EMPTY)."""
    if end.error is not None:
        error = end.error if isinstance(end.error, dict) else {"message": str(end.error)}
        label = " ".join(["error event", *(str(error[k]) for k in ("code", "type") if error.get(k) is not None)])
        return f"{ABORTED}: {label}: {str(error.get('message', ''))[:200]}"
    if end.finish_reason == "abort":
        message = (end.abort or {}).get("message")
        return f"{ABORTED}: finish_reason abort after {end.content} output" + (
            f": {str(message)[:200]}" if message else "")
    if not end.done:
        return (f"{NO_DONE}: the stream ended without [DONE] after {end.content} output, "
                f"finish_reason {end.finish_reason}")
    if not end.content:
        return f"{empty_kind(end.finish_reason)}: [DONE] without any output"
    return None


def count(values: Sequence[str | None], missing: str = "none") -> dict[str, int]:
    """{value: how many}, most frequent first."""
    out: dict[str, int] = {}
    for v in values:
        key = v if v is not None else missing
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


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


# The SLOs goodput is judged by (ms), as `pdkit tune`'s objective names them
GOODPUT_SLOS = ("ttft_ms", "tpot_ms")


def goodput(results: Sequence[RequestResult], duration_s: float, slo: dict[str, float]) -> dict:
    """Requests/s that met every SLO, SGLang's definition (0.5.23 sglang/benchmark/goodput.py
    `calculate_goodput`): a request is good when it completed, its TTFT <= slo["ttft_ms"] and its
    own TPOT ((latency - TTFT) / (output tokens - 1); 0 for a one-token answer) <= slo["tpot_ms"];
    goodput = good requests / the level's wall time; attainment = good requests / requests sent."""
    unknown = set(slo) - set(GOODPUT_SLOS)
    if unknown:
        raise ValueError(f"goodput SLOs are {', '.join(GOODPUT_SLOS)}; got {sorted(unknown)}")
    good = 0
    for r in results:
        if not r.ok or r.ttft is None:
            continue
        observed = {"ttft_ms": r.ttft * 1000.0, "tpot_ms": (tpot(r) or 0.0) * 1000.0}
        good += all(observed[name] <= limit for name, limit in slo.items())
    return {"requests_s": _round(throughput(good, duration_s), 4), "good": good,
            "attainment": _round(good / len(results), 4) if results else None, "slo_ms": dict(slo)}


def summarize_level(results: Sequence[RequestResult], duration_s: float, concurrency: int,
                    goodput_slo: dict[str, float] | None = None) -> dict:
    """One concurrency level's figures (the `levels[]` entry of a bench record); with GOODPUT_SLO
    also `goodput` (goodput())."""
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
    kinds = [r.kind or failure_kind(r.error or "unknown") for r in failed]
    out = {
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(done),
        "errors": len(failed),
        "error_samples": samples,
        # the failures by kind, by the finish reason their stream named, by the worker that served them
        "failures": count(kinds),
        "failed_finish_reasons": count([r.finish_reason for r in failed if r.finish_reason]),
        "failed_workers": count([r.worker for r in failed], missing="unknown"),
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
    if goodput_slo:
        out["goodput"] = goodput(results, duration_s, goodput_slo)
    return out


def ratio(after: float | None, before: float | None) -> float | None:
    """after / before, None when either is missing or before is zero."""
    if after is None or before is None or before == 0:
        return None
    return after / before


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
