"""Prometheus metrics under SGLang's exact names and labels.

Names, types and labels follow SGLang's SchedulerMetricsCollector / TokenizerMetricsCollector
(see FIELD_NOTES.md), so the kit's Prometheus rules, dashboards and exporter can be tested
against the sim unchanged. Scheduler series carry model_name, engine_type (unified | prefill |
decode), tp_rank, pp_rank and moe_ep_rank; request-level series carry model_name and
engine_type. Scheduler gauges are reported by TP rank 0 only; cuda_graph_passes_total has a
series per TP rank, as every rank runs every forward pass.

Each labelled child is looked up once and kept: `.labels()` is the expensive part of
prometheus-client and the decode loop updates these on every step.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
REQUEST_LABELS = ("model_name", "engine_type")
CUDA_GRAPH_MODES = ("decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none")

# SGLang's bucket choices (seconds).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)
QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100,
                 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)

# Every metric family the sim exposes (the names as they appear in /metrics, counters with
# their _total suffix). Tests and the kit's rules can import this list.
EXPOSED_NAMES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
    "sglang:utilization",
    "sglang:max_total_num_tokens",
    "sglang:spec_accept_length",
    "sglang:is_cuda_graph",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_prealloc_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:kv_transfer_speed_gb_s",
    "sglang:kv_transfer_latency_ms",
    "sglang:kv_transfer_total_mb",
    "sglang:num_bootstrap_failed_reqs_total",
    "sglang:num_transfer_failed_reqs_total",
    "sglang:cuda_graph_passes_total",
    "sglang:realtime_tokens_total",
    "sglang:queue_time_seconds",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_requests_total",
    "sglang:num_aborted_requests_total",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
)


class SimMetrics:
    """The sim's registry. Attribute names match what the scheduler and server update."""

    def __init__(self, model_name: str, engine_type: str, tp_size: int = 1) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        rank0 = dict(model_name=model_name, engine_type=engine_type, tp_rank="0", pp_rank="0", moe_ep_rank="0")
        req = dict(model_name=model_name, engine_type=engine_type)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, SCHEDULER_LABELS, registry=r).labels(**rank0)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, SCHEDULER_LABELS, registry=r).labels(**rank0)

        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.utilization = gauge("sglang:utilization", "The utilization.")
        self.max_total_num_tokens = gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.")
        self.spec_accept_length = gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.")
        self.is_cuda_graph = gauge("sglang:is_cuda_graph", "Whether the batch is using CUDA graph.")
        self.num_prefill_bootstrap_queue_reqs = gauge(
            "sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.")
        # Newer SGLang calls the same queue "prealloc"; both names carry the same value.
        self.num_prefill_prealloc_queue_reqs = gauge(
            "sglang:num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue.")
        self.num_prefill_inflight_queue_reqs = gauge(
            "sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.")
        self.num_decode_prealloc_queue_reqs = gauge(
            "sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.")
        self.num_decode_transfer_queue_reqs = gauge(
            "sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.")
        self.kv_transfer_speed_gb_s = gauge("sglang:kv_transfer_speed_gb_s", "The transfer speed of the KV cache in GB/s.")
        self.kv_transfer_latency_ms = gauge("sglang:kv_transfer_latency_ms", "The transfer latency of the KV cache in ms.")
        self.kv_transfer_total_mb = gauge("sglang:kv_transfer_total_mb", "The total size of the last KV transfer in MB.")
        self.num_bootstrap_failed_reqs = counter("sglang:num_bootstrap_failed_reqs", "The number of bootstrap failed requests.")
        self.num_transfer_failed_reqs = counter("sglang:num_transfer_failed_reqs", "The number of transfer failed requests.")
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", SCHEDULER_LABELS,
            buckets=QUEUE_BUCKETS, registry=r).labels(**rank0)

        passes = Counter("sglang:cuda_graph_passes", "Total number of forward passes categorized by CUDA graph.",
                         SCHEDULER_LABELS + ("mode",), registry=r)
        # {mode: [child per tp rank]}; all series exist from the start so the names are always there.
        self.cuda_graph_passes = {
            mode: [passes.labels(**{**rank0, "tp_rank": str(tp)}, mode=mode) for tp in range(max(1, tp_size))]
            for mode in CUDA_GRAPH_MODES
        }

        # SGLang's per-step token counter (SchedulerMetricsCollector.increment_realtime_tokens): one child
        # per mode, created on the first step that computes such tokens (lazy, as in the catalogue)
        self._realtime_tokens = Counter("sglang:realtime_tokens", "Total number of tokens processed (updated on "
                                        "each log interval).", SCHEDULER_LABELS + ("mode",), registry=r)
        self._rank0 = rank0
        self._realtime_children: dict[str, Counter] = {}

        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                                     REQUEST_LABELS, registry=r).labels(**req)
        self.generation_tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.",
                                         REQUEST_LABELS, registry=r).labels(**req)
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed.",
                                    REQUEST_LABELS, registry=r).labels(**req)
        self.num_aborted_requests = Counter("sglang:num_aborted_requests", "Number of requests aborted.",
                                            REQUEST_LABELS, registry=r).labels(**req)
        self.time_to_first_token = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            REQUEST_LABELS, buckets=TTFT_BUCKETS, registry=r).labels(**req)
        self.inter_token_latency = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            REQUEST_LABELS, buckets=ITL_BUCKETS, registry=r).labels(**req)
        self.e2e_request_latency = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
            REQUEST_LABELS, buckets=E2E_BUCKETS, registry=r).labels(**req)

    def count_pass(self, mode: str, passes: int = 1) -> None:
        for child in self.cuda_graph_passes[mode]:
            child.inc(passes)

    def count_tokens(self, mode: str, tokens: int) -> None:
        if tokens <= 0:
            return
        child = self._realtime_children.get(mode)
        if child is None:
            child = self._realtime_children[mode] = self._realtime_tokens.labels(**self._rank0, mode=mode)
        child.inc(tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
