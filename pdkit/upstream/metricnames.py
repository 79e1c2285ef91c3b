"""Every metric name the kit reads, in one place.

monitoring (rules, dashboards), doctor, roll's gates, bench and pdkit-exporter import their
names from here; tests/test_metric_queries.py checks each SGLang and router name against the
catalogue generated from the pinned releases (pdkit/upstream/data/metric_catalogue.json, read by
pdkit.upstream.catalogue):
its type, its labels, and whether it is created lazily (then every reader must handle its
absence). A renamed metric is a one-line change here, and the catalogue test says where.
"""

from __future__ import annotations

# SGLang's engine /metrics (SchedulerMetricsCollector / TokenizerMetricsCollector in
# sglang/srt/observability/metrics_collector.py, 0.5.17 and 0.5.23 alike)
SGLANG = {
    "running": "sglang:num_running_reqs",
    "waiting": "sglang:num_queue_reqs",
    "token_usage": "sglang:token_usage",
    "gen_throughput": "sglang:gen_throughput",
    "cache_hit_rate": "sglang:cache_hit_rate",
    "prefill_bootstrap_queue": "sglang:num_prefill_bootstrap_queue_reqs",
    "prefill_inflight_queue": "sglang:num_prefill_inflight_queue_reqs",
    "decode_prealloc_queue": "sglang:num_decode_prealloc_queue_reqs",
    "decode_transfer_queue": "sglang:num_decode_transfer_queue_reqs",
    # histograms, observed by the prefill side per KV transfer (lazy: no child until the first one)
    "kv_transfer_speed": "sglang:kv_transfer_speed_gb_s",
    "kv_transfer_latency": "sglang:kv_transfer_latency_ms",
    "kv_transfer_total": "sglang:kv_transfer_total_mb",
    # lazy counters: created by their first increment
    "bootstrap_failed": "sglang:num_bootstrap_failed_reqs_total",
    "transfer_failed": "sglang:num_transfer_failed_reqs_total",
    "aborted": "sglang:num_aborted_requests_total",
    # lazy, one child per mode on its first pass (an engine without decode graphs has only decode_none)
    "cuda_graph_passes": "sglang:cuda_graph_passes_total",
    # lazy, one child per mode (prefill_compute, prefill_cache, decode) on the first step that
    # computes such tokens: the per-step token counter (the wedge alert)
    "realtime_tokens": "sglang:realtime_tokens_total",
    # lazy, gauges per phase set once when the engine's start-up completes (TokenizerManager
    # set_startup_time): load_weight, kv_cache_allocation, scheduler_e2e, tokenizer_e2e; and one per
    # CUDA-graph phase (the engine gate keeps them in its ready mark: the restart's own phases)
    "startup_time": "sglang:startup_time_seconds",
    "startup_cuda_graph_time": "sglang:startup_cuda_graph_time_seconds",
    # lazy: created by the first finished request
    "prompt_tokens": "sglang:prompt_tokens_total",
    # lazy: the prompt tokens served from the prefix cache (label cache_source), by the tokenizer
    "cached_tokens": "sglang:cached_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    # lazy gauges, set once at start-up (emit_constants): the KV pool in GiB (K and V buffers) and in
    # tokens; their ratio is one token's KV bytes per rank (pdkit.spec.kvcost.kv_bytes_per_token)
    "kv_cache_memory": "sglang:kv_cache_memory_usage_gb",
    "max_total_tokens": "sglang:max_total_num_tokens",
    "requests": "sglang:num_requests_total",
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
}

# The gauges that say an engine still holds work (roll's drain gate, doctor's idle checks)
DRAIN_GAUGES = tuple(SGLANG[k] for k in ("running", "waiting", "prefill_bootstrap_queue", "prefill_inflight_queue",
                                         "decode_prealloc_queue", "decode_transfer_queue"))
# The PD failure counters (roll's no-new-failures gate, doctor's kv_transfer check)
FAILURE_COUNTERS = (SGLANG["transfer_failed"], SGLANG["bootstrap_failed"])

# The router (smg 1.13.0 and sglang-router 0.3.2 both serve smg_*); per-worker series carry
# worker="<engine URL>"
ROUTER = {
    "worker_health": "smg_worker_health",
    "worker_active": "smg_worker_requests_active",
    "requests": "smg_router_requests_total",
    "responses": "smg_http_responses_total",
    # circuit-breaker outcomes per worker (outcome="success"|"failure")
    "worker_outcomes": "smg_worker_cb_outcomes_total",
    # circuit-breaker state per worker (0 closed, 1 open, 2 half-open): roll's gate
    "worker_cb_state": "smg_worker_cb_state",
    # The PD and overload signals below are smg 1.13.0's only (sglang-router 0.3.2 has none of them:
    # the catalogue per release); the alerts that read them are declared only for a router whose
    # release exports them (pdkit/monitoring/rules.py, _routers_exporting).
    # circuit-breaker transitions per worker (labels worker, from, to: closed|open|half_open)
    "worker_cb_transitions": "smg_worker_cb_transitions_total",
    # requests that failed on every retry: the client got the error (labels worker_type, endpoint)
    "retries_exhausted": "smg_worker_retries_exhausted_total",
    # retry attempts (most succeed: no alert on these alone)
    "retries": "smg_worker_retries_total",
    # every worker for the model overloaded (waiting >= --worker-overload-waiting-requests or KV usage >=
    # --worker-overload-token-usage): shed with a 503 (--worker-overload-shed) or, shedding off (pdkit's
    # default), routed to the least-loaded one anyway (labels stage)
    "overload_shed": "smg_worker_overload_shed_total",
    "overload_fallback": "smg_worker_overload_fallback_total",
    # admission decisions (result="allowed"|"rejected": past --max-concurrent-requests and its queue: a 429);
    # lazy: the family appears with the first request, the rejected child with the first rejection
    "admission": "smg_http_rate_limit_total",
    # PD rendezvous failures by leg (prefill|decode) and phase: over HTTP only `probe`, a bootstrap port that
    # refused the router's connection when it registered the worker (counted once, then the pair cannot hand
    # off); `bootstrap`/`transfer` are the gRPC path's. Lazy: the first failure creates it
    # (pdkit/contract/catalogue_gen.py FAULT_FAMILIES makes one to catalogue it)
    "pd_rendezvous_failures": "smg_pd_rendezvous_failures_total",
}

# pdkit-exporter, an engine spanning nodes: 1 while the unit of the rank this node runs has a running
# process, per rank (labels node, engine, role and rank, nnodes, head: rank 0's host). Read by the
# PdkitEngineRankDown alert and doctor's rank_process check; not in EXPORTER (the families the tuning
# dashboard draws for every engine).
EXPORTER_RANK_UP = "pdkit_engine_rank_up"
# pdkit-exporter: the shape the engine gate recorded at the first healthy start of the engine's running
# configuration (pdkit/agent/engineshape.py), one series per figure (labels node, engine, role, figure). Read by
# doctor's engine_shape check, which compares it with the engine's /server_info now.
EXPORTER_SHAPE_RECORDED = "pdkit_engine_shape_recorded"
# pdkit-exporter: the share of the engine's weight files in the node's page cache (pdkit/agent/residency.py, mincore;
# at most once a minute per model directory) and their bytes, labels node, engine, role, model_dir; absent for
# dummy weights, a hub id or a directory without weight files. Read by doctor's weights_cached check.
EXPORTER_WEIGHTS_CACHED = "pdkit_engine_weights_page_cache_ratio"
EXPORTER_WEIGHTS_BYTES = "pdkit_engine_weights_bytes"
# pdkit-exporter: the engine's JIT caches for its next start (pdkit/agent/jitcache.py judge: the warm stamp the engine
# gate writes at ready), 1 warm, 0 cold, labels node, engine, role, dir (its cache directory) and why; what a cold
# start of it cost on this node beyond a warm one (labels dir, source: the stamp it was measured from), when
# measured. Absent where the engine's own env moved SGLANG_CACHE_DIR. Read by doctor's jit_caches check.
EXPORTER_JIT_WARM = "pdkit_engine_jit_caches_warm"
EXPORTER_JIT_COLD_EXTRA = "pdkit_engine_jit_cold_start_extra_seconds"
# pdkit-exporter: the engine gate's last verdict on the engine's weight checksums (issue 44 item 2,
# pdkit/agent/engineshape.py), value 1, labels status (recorded | match | mismatch | unavailable), recorded and
# now (per-engine checksums, first 12 hex digits), problem (the ranks that differ, or why unavailable).
# Read by doctor's weights check.
EXPORTER_WEIGHTS_INFO = "pdkit_engine_weights_info"
# pdkit-exporter: the health of each GPU an engine uses (issue 47 item 4), as the preflight's probe judges it
# (pdkit.agent.topology.wedged_gpus, run at most once a minute: pdkit/agent/exporter/gpuhealth.py), 1 wedged (needs a
# reset),
# 0 healthy, labels node, engine, role, gpu (the node's index), bdf, seen (what said so, "" when healthy); absent
# on a node without NVIDIA GPUs, with the sim, before the first probe, and for a GPU the probe did not find.
# A node-level 0/1 (labels node, why) says the probe could not tell (it hung, failed, or read no nvidia-smi -q).
# Read by the PdkitGpuWedged alert and doctor's gpu_health check.
EXPORTER_GPU_WEDGED = "pdkit_engine_gpu_wedged"
EXPORTER_GPU_PROBE_ERROR = "pdkit_exporter_gpu_probe_error"

# Every family pdkit-exporter writes, by name without the pdkit_ prefix (info families by their sample name,
# `..._info`; counters by their family name, the samples add `_total`): pdkit/agent/exporter/collector.py writes them
# from here and doctor (pdkit/doctor/observe.py) reads them from here, so a name is decided once. The families named
# alone above (EXPORTER_RANK_UP, EXPORTER_GPU_WEDGED, ...: for the alert rules and tests that read one) are in it too.
EXPORTER_FAMILIES = {
    "decode_batch_cuda_graph": "pdkit_decode_batch_cuda_graph",
    "decode_batch_gen_throughput_tokens_per_second": "pdkit_decode_batch_gen_throughput_tokens_per_second",
    "decode_batch_queued_requests": "pdkit_decode_batch_queued_requests",
    "decode_batch_running_requests": "pdkit_decode_batch_running_requests",
    "decode_batch_timestamp_seconds": "pdkit_decode_batch_timestamp_seconds",
    "decode_batch_token_usage_ratio": "pdkit_decode_batch_token_usage_ratio",
    "decode_cuda_graph_ratio": "pdkit_decode_cuda_graph_ratio",
    "engine_env_check_error": "pdkit_engine_env_check_error",
    "engine_env_mismatch_info": "pdkit_engine_env_mismatch_info",
    "engine_env_present": "pdkit_engine_env_present",
    "engine_flag_drift_info": "pdkit_engine_flag_drift_info",
    "engine_flags_drift": "pdkit_engine_flags_drift",
    "engine_flags_unverified": "pdkit_engine_flags_unverified",
    "engine_forward_passes": "pdkit_engine_forward_passes",
    "engine_gen_throughput_tokens_per_second": "pdkit_engine_gen_throughput_tokens_per_second",
    "engine_generation_tokens": "pdkit_engine_generation_tokens",
    "engine_gpu_wedged": EXPORTER_GPU_WEDGED,
    "engine_info": "pdkit_engine_info",
    "engine_jit_caches_warm": EXPORTER_JIT_WARM,
    "engine_jit_cold_start_extra_seconds": EXPORTER_JIT_COLD_EXTRA,
    "engine_kv_transfer_failures": "pdkit_engine_kv_transfer_failures",
    "engine_pd_queue_requests": "pdkit_engine_pd_queue_requests",
    "engine_prompt_tokens": "pdkit_engine_prompt_tokens",
    "engine_queued_requests": "pdkit_engine_queued_requests",
    "engine_rank_up": EXPORTER_RANK_UP,
    "engine_running_requests": "pdkit_engine_running_requests",
    "engine_scrape_error": "pdkit_engine_scrape_error",
    "engine_shape_recorded": EXPORTER_SHAPE_RECORDED,
    "engine_token_usage_ratio": "pdkit_engine_token_usage_ratio",
    "engine_up": "pdkit_engine_up",
    "engine_weights_bytes": EXPORTER_WEIGHTS_BYTES,
    "engine_weights_info": EXPORTER_WEIGHTS_INFO,
    "engine_weights_page_cache_ratio": EXPORTER_WEIGHTS_CACHED,
    "exporter_collect_duration_seconds": "pdkit_exporter_collect_duration_seconds",
    "exporter_gpu_probe_error": EXPORTER_GPU_PROBE_ERROR,
    "exporter_journal_error": "pdkit_exporter_journal_error",
    "node_reboot_required": "pdkit_node_reboot_required",
    "prefill_batch_cuda_graph": "pdkit_prefill_batch_cuda_graph",
    "prefill_batch_input_throughput_tokens_per_second": "pdkit_prefill_batch_input_throughput_tokens_per_second",
    "prefill_batch_queued_requests": "pdkit_prefill_batch_queued_requests",
    "prefill_batch_running_requests": "pdkit_prefill_batch_running_requests",
    "prefill_batch_timestamp_seconds": "pdkit_prefill_batch_timestamp_seconds",
}
# pdkit-exporter: per-engine series with labels node, engine, role (the exporter's own) that the tuning dashboard
# draws for every engine
EXPORTER = {
    "up": EXPORTER_FAMILIES["engine_up"],
    "info": EXPORTER_FAMILIES["engine_info"],  # labels release, sglang_version
    "flags_drift": EXPORTER_FAMILIES["engine_flags_drift"],  # 0/1
    "env_present": EXPORTER_FAMILIES["engine_env_present"],  # 0/1: NCCL/UCX env really in /proc/PID/environ
    "cuda_graph_ratio": EXPORTER_FAMILIES["decode_cuda_graph_ratio"],
    # the last "Decode batch" log line's figures (journal)
    "log_gen_throughput": EXPORTER_FAMILIES["decode_batch_gen_throughput_tokens_per_second"],
    "log_running": EXPORTER_FAMILIES["decode_batch_running_requests"],
}

NODE = {
    "cpu": "node_cpu_seconds_total",
    "mem_available": "node_memory_MemAvailable_bytes",
    "mem_total": "node_memory_MemTotal_bytes",
    "net_rx": "node_network_receive_bytes_total",
    "net_tx": "node_network_transmit_bytes_total",
    "load1": "node_load1",
}

DCGM = {
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL",  # percent
    "fb_used": "DCGM_FI_DEV_FB_USED",  # MiB
    "power": "DCGM_FI_DEV_POWER_USAGE",  # W
}


# ---------------------------------------------------------------------------------------------
# Every metric read outside the PromQL (rules, dashboards): who reads it, as what type, through which
# labels, and what an absent family means to that reader. tests/test_metric_readers.py checks each
# against the catalogue for every engine version a spec runs (type, labels; a lazily created family
# needs an `absent` meaning) and runs the readers on real SGLang pages where the lazy ones are absent.
# bench times its own requests (pdkit/bench/) and reads only the prefills' KV
# histograms (pdkit/spec/kvcost.py), as doctor's kv_path row does, and the prompt and cached token
# counters of the engines that prefill (the prefix-cache hit rate of a level, and doctor's prefix_cache row,
# which also reads the KV pool's size to know one token's KV bytes).

class Read(tuple[str, str, str, tuple[str, ...], str]):
    """(reader, metric, kind, labels, absent): `kind` the type the reader treats it as, `labels` the
    labels it selects or groups by, `absent` what a missing family means ("" = the reader needs it)."""

    __slots__ = ()

    def __new__(cls, reader: str, metric: str, kind: str, labels: tuple[str, ...] = (), absent: str = "") -> Read:
        return super().__new__(cls, (reader, metric, kind, labels, absent))

    reader = property(lambda self: self[0])
    metric = property(lambda self: self[1])
    kind = property(lambda self: self[2])
    labels = property(lambda self: self[3])
    absent = property(lambda self: self[4])


_EXPORTER = "pdkit-exporter (pdkit/agent/exporter/metrics.py parse_metrics)"
_DOCTOR = "doctor (pdkit/doctor/, through parse_metrics)"
_ROLL = "roll (pdkit/roll/)"
_KV = "pdkit/spec/kvcost.py kv_histograms (bench's KV figures, doctor check_kv_path)"
_CACHE = "pdkit/spec/kvcost.py cache_counts (bench's prefix-cache hit rate per level, doctor check_prefix_cache)"
READS: tuple[Read, ...] = (
    # the exporter's figures: a key is simply left out when its family is absent
    *(Read(_EXPORTER, SGLANG[k], "gauge", absent="figure left out")
      for k in ("running", "waiting", "token_usage", "gen_throughput", "prefill_bootstrap_queue",
                "prefill_inflight_queue", "decode_prealloc_queue", "decode_transfer_queue")),
    *(Read(_EXPORTER, SGLANG[k], "counter", absent="figure left out (no request finished yet)")
      for k in ("prompt_tokens", "generation_tokens")),
    *(Read(_EXPORTER, SGLANG[k], "counter", absent="0: none failed yet (collector.KV_FAILURE_STAGES)")
      for k in ("bootstrap_failed", "transfer_failed")),
    Read(_EXPORTER, SGLANG["cuda_graph_passes"], "counter", ("mode",),
         absent="that mode has not run: ratio absent until a decode pass"),
    # doctor's engine checks
    *(Read(_DOCTOR + " check_kv_transfers", n, "counter", absent="not seen yet: no failure") for n in FAILURE_COUNTERS),
    *(Read(_DOCTOR + " check_kv_transfers", SGLANG[k], "counter", absent="0: no hand-off yet (WARN)")
      for k in ("prompt_tokens", "generation_tokens")),
    Read(_DOCTOR + " check_decode_cuda_graph", SGLANG["cuda_graph_passes"], "counter", ("mode",),
         absent="no decode pass seen yet (WARN), or the exporter's log-line figures"),
    *(Read(_DOCTOR + " check_queues", SGLANG[k], "gauge", absent="0")
      for k in ("waiting", "prefill_bootstrap_queue", "prefill_inflight_queue", "decode_prealloc_queue",
                "decode_transfer_queue")),
    *(Read(_KV, SGLANG[k], "histogram", absent="no hand-off yet: no KV figures (0 transfers)")
      for k in ("kv_transfer_latency", "kv_transfer_total", "kv_transfer_speed")),
    *(Read(_CACHE, SGLANG[k], "counter", absent="0: nothing counted yet (no hit rate without prompt tokens)")
      for k in ("cached_tokens", "prompt_tokens")),
    *(Read(_DOCTOR + " check_prefix_cache (pdkit/spec/kvcost.py kv_bytes_per_token)", SGLANG[k], "gauge",
           absent="one token's KV size unknown: the hand-off is not compared with the uncached part")
      for k in ("kv_cache_memory", "max_total_tokens")),
    Read(_DOCTOR + " check_kv_path", SGLANG["ttft"], "histogram",
         absent="TTFT unknown: share of TTFT not judged (a 0.5.17 prefill has none; its decodes' is read)"),
    Read(_DOCTOR + " router_outcomes", ROUTER["worker_outcomes"], "counter", ("worker", "outcome"),
         absent="no outcome recorded for that worker yet"),
    # roll's gates
    *(Read(_ROLL + " drain gate (metric_sums)", n, "gauge", absent="0") for n in DRAIN_GAUGES),
    *(Read(_ROLL + " no-new-failures gate (metric_sums)", n, "counter", absent="0: none failed yet")
      for n in FAILURE_COUNTERS),
    Read(_ROLL + " circuit_states", ROUTER["worker_cb_state"], "gauge", ("worker",),
         absent="judge by /workers alone"),
    # the engine gate's ready mark (pdkit/agent/health.py startup_phases): the phases of the start it saw ready
    *(Read("engine gate (pdkit/agent/health.py startup_phases)", SGLANG[k], "gauge", ("phase",),
           absent="no phases recorded for that start (an engine without --enable-metrics, or the sim's)")
      for k in ("startup_time", "startup_cuda_graph_time")),
)
