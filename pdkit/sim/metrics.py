"""Prometheus metrics exactly as the emulated SGLang release defines them.

The families, their types, label names and histogram buckets are read from the metric
catalogue (pdkit/upstream/data/metric_catalogue.json, generated from each pinned SGLang wheel's own
SchedulerMetricsCollector / TokenizerMetricsCollector, sglang/srt/observability/
metrics_collector.py; see pdkit/contract/catalogue_gen.py), never listed here. The release is the
engine's planned `sglang_version` (PDKIT_SIM_SGLANG_VERSION, rendered by pdkit.render.flags.engine_env).

What a real engine shows, the sim shows:
- a family the catalogue calls `eager` has its child from the start (value 0 until the sim
  computes it), including the extra-label children SGLang creates up front (`eager_children`);
- every other family is lazy: its child is created by the first event that touches it (the
  failure counters on the first failure, `cuda_graph_passes_total{mode}` on the first pass of
  that mode, the request counters and histograms on the first finished request, the KV transfer
  histograms on the first transfer), so a healthy engine has no failure series at all;
- a family without a child is not on the page at all (SGLang runs prometheus_client in
  multiprocess mode, which writes no HELP/TYPE for a family without samples);
- gauges whose multiprocess mode keeps one series per process carry `pid`; request series carry
  `is_streaming` where the release has it ("true"/"false", as SGLang writes it).

Each labelled child is looked up once and kept: `.labels()` is the expensive part of
prometheus-client and the decode loop updates these on every step.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from pdkit.upstream import catalogue

DEFAULT_SGLANG_VERSION = catalogue.SGLANG_VERSIONS[-1]
_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}

# The sample names an engine's scheduler writes for its PD queues, per sim queue
PD_QUEUE_GAUGES = {
    "prefill_bootstrap": "sglang:num_prefill_bootstrap_queue_reqs",
    "prefill_inflight": "sglang:num_prefill_inflight_queue_reqs",
    "decode_prealloc": "sglang:num_decode_prealloc_queue_reqs",
    "decode_transfer": "sglang:num_decode_transfer_queue_reqs",
}


def exposed_names(version: str = DEFAULT_SGLANG_VERSION) -> tuple[str, ...]:
    """Every family the emulated release can put on /metrics (names as on the page)."""
    return tuple(sorted(catalogue.sglang_families(version)))


class _Present:
    """A registry view without the families that have no child yet (multiprocess mode's page)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        return (f for f in self.registry.collect() if f.samples)


# sglang/srt/model_executor/graph_memory_usage.py GRAPH_MEMORY_USAGE_KEYS (0.5.17 and 0.5.23): the phases of
# sglang:startup_cuda_graph_time_seconds
GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")


class SimMetrics:
    """The sim's registry, built from the catalogue for one SGLang release.

    `child(name, **extra)` is the one way to reach a series: it creates the child on first use
    (lazy creation is the first event) and caches it. Updating a family the release does not
    export is a no-op, so the sim's events can name every family any release has.
    """

    def __init__(self, model_name: str, engine_type: str, tp_size: int = 1,
                 version: str = DEFAULT_SGLANG_VERSION) -> None:
        # SGLang's multiprocess pages have no *_created series (the sim's own registry would add them)
        disable_created_metrics()
        self.version = version
        self.tp_size = max(1, tp_size)
        self.registry = CollectorRegistry(auto_describe=False)
        self.families: dict[str, dict[str, Any]] = catalogue.sglang_families(version)
        self._base = {"model_name": model_name, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0",
                      "moe_ep_rank": "0", "pid": str(os.getpid())}
        self._metrics: dict[str, Any] = {}
        self._children: dict[tuple, Any] = {}
        for name, fam in self.families.items():
            self._metrics[name] = self._make(name, fam)
        for name, fam in self.families.items():
            if fam["eager"]:
                for extra in fam.get("eager_children") or [{}]:
                    self.child(name, **extra)
        self._page = _Present(self.registry)

    def _make(self, name: str, fam: dict[str, Any]):
        kind = _KINDS[fam["type"]]
        base = name[: -len("_total")] if fam["type"] == "counter" else name
        kwargs: dict[str, Any] = {"registry": self.registry}
        if fam["type"] == "histogram":
            kwargs["buckets"] = tuple(fam["buckets"]) + (float("inf"),)
        return kind(base, f"{name} (pdkit.sim, SGLang {self.version})", tuple(fam["labels"]), **kwargs)

    def has(self, name: str) -> bool:
        return name in self.families

    def child(self, name: str, **extra: str):
        """The series of `name` with the engine's labels (+ `extra`), created on first use; None
        when the release has no such family."""
        key = (name, tuple(sorted(extra.items())))
        got = self._children.get(key)
        if got is None:
            fam = self.families.get(name)
            if fam is None:
                return None
            values = {**self._base, **extra}
            got = self._children[key] = self._metrics[name].labels(**{k: values[k] for k in fam["labels"]})
        return got

    # ---- events (each a no-op for a family the release does not have) ----------------------

    def set(self, name: str, value: float) -> None:
        c = self.child(name)
        if c is not None:
            c.set(value)

    def inc(self, name: str, amount: float = 1.0, **extra: str) -> None:
        c = self.child(name, **self._only(name, extra))
        if c is not None:
            c.inc(amount)

    def observe(self, name: str, value: float, **extra: str) -> None:
        c = self.child(name, **self._only(name, extra))
        if c is not None:
            c.observe(value)

    def _only(self, name: str, extra: dict[str, str]) -> dict[str, str]:
        """The extra labels the release's family has (is_streaming exists only where SGLang has it)."""
        fam = self.families.get(name)
        if fam is None or not extra:
            return extra
        return {k: v for k, v in extra.items() if k in fam["labels"]}

    def startup_time(self, total_s: float, scheduler_s: float, plan) -> None:
        """SGLang's start-up gauges, set once when start-up completes (TokenizerManager.set_startup_time,
        0.5.17 and 0.5.23): load_weight and kv_cache_allocation 0 (the sim reads no weights), the
        scheduler's and the whole start's seconds, and every CUDA-graph phase of
        sglang/srt/model_executor/graph_memory_usage.py GRAPH_MEMORY_USAGE_KEYS, 0 where none was captured."""
        for phase, value in (("load_weight", 0.0), ("kv_cache_allocation", 0.0), ("scheduler_e2e", scheduler_s),
                             ("tokenizer_e2e", total_s)):
            c = self.child("sglang:startup_time_seconds", phase=phase)
            if c is not None:
                c.set(round(value, 3))
        # the sim captures nothing: a phase it "captures" takes no time, as one not run
        for phase in GRAPH_PHASES:
            c = self.child("sglang:startup_cuda_graph_time_seconds", phase=phase)
            if c is not None:
                c.set(0.0)

    def count_pass(self, mode: str, passes: int = 1) -> None:
        """cuda_graph_passes_total{mode}: every TP rank runs every forward pass, one series per rank."""
        if not self.has("sglang:cuda_graph_passes_total"):
            return
        for tp in range(self.tp_size):
            self.child("sglang:cuda_graph_passes_total", mode=mode, tp_rank=str(tp)).inc(passes)

    def count_tokens(self, mode: str, tokens: int) -> None:
        if tokens > 0:
            self.inc("sglang:realtime_tokens_total", tokens, mode=mode)

    def request_finished(self, streaming: bool, prompt_tokens: int, output_tokens: int, e2e_s: float,
                         cached_tokens: int = 0) -> None:
        """The tokenizer's observe_one_finished_request (0.5.17 and 0.5.23 metrics_collector.py).
        Cached tokens count only when there are some, under cache_source="device": the scheduler
        reports a radix hit as {"device": N, "host": 0} (output_streamer.get_cached_tokens_details),
        and a source of 0 is not incremented; the sim has no host or storage tier."""
        s = "true" if streaming else "false"
        self.inc("sglang:prompt_tokens_total", prompt_tokens, is_streaming=s)
        self.inc("sglang:generation_tokens_total", output_tokens, is_streaming=s)
        if cached_tokens > 0:
            self.inc("sglang:cached_tokens_total", cached_tokens, cache_source="device")
        self.inc("sglang:num_requests_total", is_streaming=s)
        self.observe("sglang:e2e_request_latency_seconds", e2e_s, is_streaming=s)
        self.observe("sglang:prompt_tokens_histogram", prompt_tokens)
        self.observe("sglang:uncached_prompt_tokens_histogram", prompt_tokens - cached_tokens)
        self.observe("sglang:generation_tokens_histogram", output_tokens)
        if output_tokens > 1:
            self.observe("sglang:request_time_per_output_token_seconds", e2e_s / output_tokens, is_streaming=s)

    def exposition(self) -> bytes:
        return generate_latest(self._page)
