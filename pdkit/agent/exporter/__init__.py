"""pdkit-exporter: what SGLang's own metrics do not say, per engine of one GPU node.

    python -m pdkit.exporter --config /etc/pdkit/exporter.json          # serve /metrics
    python -m pdkit.exporter --config /etc/pdkit/exporter.json --once   # one scrape to stdout
    python -m pdkit.exporter --config /etc/pdkit/exporter.json --check  # validate the config

A prometheus-client custom collector (pdkit.agent.exporter.collector). On each scrape it reads every
engine's /metrics (and /server_info once per engine process), the engines' journal and their
main processes' /proc entries. Series, per engine with labels node, engine, role:

    pdkit_engine_up                              1: /metrics answered now, /server_info for this process
    pdkit_engine_scrape_error{endpoint}          1: GET metrics|server_info failed in this scrape
    pdkit_engine_info{cluster,release,sglang_version,planned_sglang_version,unit,model}   1
    pdkit_engine_flags_drift                     0/1 (absent: neither /server_info nor argv readable)
    pdkit_engine_flag_drift_info{flag}           1 per drifted planned flag ("--page-size")
    pdkit_engine_flags_unverified                planned flags /server_info does not report
    pdkit_engine_env_present                     0/1 (absent when the environment was not readable)
    pdkit_engine_env_check_error                 0/1
    pdkit_engine_env_mismatch_info{var,problem}  1 per planned variable missing|different
    pdkit_engine_running_requests, pdkit_engine_queued_requests, pdkit_engine_token_usage_ratio,
    pdkit_engine_gen_throughput_tokens_per_second
    pdkit_engine_pd_queue_requests{queue}        bootstrap|inflight|prealloc|transfer
    pdkit_engine_prompt_tokens_total, pdkit_engine_generation_tokens_total   (rate() them)
    pdkit_engine_kv_transfer_failures_total{stage}   bootstrap|transfer
    pdkit_engine_forward_passes_total{phase,cuda_graph}  decode|prefill, true|false
    pdkit_decode_cuda_graph_ratio                since the engine started (absent before a decode pass)
    pdkit_decode_batch_{gen_throughput_tokens_per_second,running_requests,queued_requests,
                        cuda_graph,token_usage_ratio,timestamp_seconds}      last `Decode batch` line
    pdkit_prefill_batch_{input_throughput_tokens_per_second,running_requests,queued_requests,
                         cuda_graph,timestamp_seconds}                       last `Prefill batch` line

    pdkit_engine_gpu_wedged{gpu,bdf,seen}        1 wedged / 0 healthy, per GPU the engine uses (gpu_health on)

and per node: pdkit_exporter_journal_error, pdkit_exporter_collect_duration_seconds,
pdkit_exporter_gpu_probe_error{why} (gpu_health on), process_*.

The GPU health probe (pdkit.agent.exporter.gpuhealth) runs the preflight's pdkit/agent/topology_probe.py in the
background, at most once a minute, as a child process with a timeout: a scrape publishes its last answer.

Imports only the standard library, requests and prometheus_client (never pdkit.spec, pydantic
or pyinfra): it runs next to the engines on every GPU node with a small memory budget.

This file exports nothing: its command is __main__.py, and other packages import the module that
holds what they use (pdkit.agent.exporter.config.reads_gpu_health: the plan, the roles, doctor, the alert
rules; pdkit.agent.exporter.drift and pdkit.agent.exporter.metrics: doctor, the fault budget, residency).
"""
