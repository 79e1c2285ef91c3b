"""Reading a live engine, node exporter or router from the control machine: every HTTP GET goes through
`http_get` (tests replace it here), and the parsers of the pages it returns, pure so they run on captures."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pdkit.agent.exporter.metrics import parse_metrics
from pdkit.agent.health import http_request, worker_key
from pdkit.doctor.model import EnginePlan, ExporterView, Sample
from pdkit.spec.kvcost import Histogram, cache_counts, kv_bytes_per_token, kv_histograms
from pdkit.upstream.metricnames import (
    EXPORTER_FAMILIES,
    ROUTER,
    SGLANG,
)

# ------------------------------------------------------------------------------------------------
# Pages (pure: text in)


def histogram_mean(text: str, name: str) -> tuple[float, float] | None:
    """Pure: (sum, count) of histogram NAME summed over its children in one /metrics page, None when absent."""
    total, count, seen = 0.0, 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += sample.value
                seen = True
            elif sample.name == f"{name}_count":
                count += sample.value
    return (total, count) if seen else None


def router_outcomes(text: str) -> dict[str, dict[str, float]]:
    """A router's /metrics text -> {worker url: {outcome: requests}} (smg_worker_cb_outcomes_total)."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(ROUTER["worker_outcomes"])) + "\n"
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(wanted):
        for s in family.samples:
            worker, outcome = s.labels.get("worker"), s.labels.get("outcome")
            if worker and outcome:
                slot = out.setdefault(worker_key(worker), {})
                slot[outcome] = slot.get(outcome, 0.0) + s.value
    return out


def reboot_pending(text: str) -> float | None:
    """pdkit_node_reboot_required from a pdkit-exporter page (None: the exporter does not report it)."""
    name = EXPORTER_FAMILIES["node_reboot_required"]
    wanted = "\n".join(l for l in text.splitlines() if l.startswith((name, "# TYPE " + name))) + "\n"
    for family in text_string_to_metric_families(wanted):
        for s in family.samples:
            return s.value
    return None


def exporter_views(text: str) -> dict[str, ExporterView]:
    """pdkit-exporter's /metrics text -> {engine name: ExporterView}."""
    views: dict[str, ExporterView] = {}
    probe_error: tuple[float, str] | None = None  # the node's, given to each engine's view
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            engine = s.labels.get("engine")
            if s.name == EXPORTER_FAMILIES["exporter_gpu_probe_error"]:
                probe_error = (s.value, s.labels.get("why", ""))
            if engine is None:
                continue
            view = views.setdefault(engine, ExporterView())
            if s.name == EXPORTER_FAMILIES["engine_env_present"]:
                view.env_present = s.value
            elif s.name == EXPORTER_FAMILIES["engine_env_check_error"]:
                view.env_check_error = s.value
            elif s.name == EXPORTER_FAMILIES["engine_env_mismatch_info"]:
                view.env_mismatch[s.labels.get("var", "?")] = s.labels.get("problem", "?")
            elif s.name == EXPORTER_FAMILIES["engine_flags_drift"]:
                view.flags_drift = s.value
            elif s.name == EXPORTER_FAMILIES["engine_flag_drift_info"]:
                view.drift_flags = (*view.drift_flags, s.labels.get("flag", "?"))
            elif s.name == EXPORTER_FAMILIES["decode_cuda_graph_ratio"]:
                view.decode_graph_ratio = s.value
            elif s.name == EXPORTER_FAMILIES["decode_batch_cuda_graph"]:
                view.decode_batch_cuda_graph = s.value
            elif s.name == EXPORTER_FAMILIES["engine_info"]:
                view.sglang_version = s.labels.get("sglang_version") or None
            elif s.name == EXPORTER_FAMILIES["engine_shape_recorded"]:
                view.recorded_shape[s.labels.get("figure", "?")] = s.value
            elif s.name == EXPORTER_FAMILIES["engine_weights_info"]:
                view.weights = {k: s.labels.get(k, "") for k in ("status", "recorded", "now", "problem")}
            elif s.name in (cached_ratio := EXPORTER_FAMILIES["engine_weights_page_cache_ratio"],
                            EXPORTER_FAMILIES["engine_weights_bytes"]):
                model_dir, ratio, size = view.weights_cached or (s.labels.get("model_dir", "?"), 0.0, 0.0)
                view.weights_cached = ((model_dir, s.value, size) if s.name == cached_ratio
                                       else (model_dir, ratio, s.value))
            elif s.name == EXPORTER_FAMILIES["engine_jit_caches_warm"]:
                view.jit_caches = (s.labels.get("dir", "?"), s.value, s.labels.get("why", ""))
            elif s.name == EXPORTER_FAMILIES["engine_jit_cold_start_extra_seconds"]:
                view.jit_cold_extra = (s.value, s.labels.get("source", ""))
            elif s.name == EXPORTER_FAMILIES["engine_gpu_wedged"] and s.labels.get("gpu", "").isdigit():
                view.gpu_wedged[int(s.labels["gpu"])] = (s.labels.get("bdf", "?"), s.value, s.labels.get("seen", ""))
            elif s.name == EXPORTER_FAMILIES["engine_rank_up"]:
                view.rank_up = s.value
                rank = s.labels.get("rank", "")
                view.rank = int(rank) if rank.isdigit() else None
    for view in views.values():
        view.gpu_probe_error = probe_error
    return views


# ------------------------------------------------------------------------------------------------
# Reads (HTTP, with timeouts)


def http_get(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(body, None) on a 200, else (None, why)."""
    status, body = http_request(url, timeout=timeout_s, headers=headers)
    if status == 200:
        return body, None
    if status:
        return None, f"HTTP {status}: {body.strip()[:120]}"
    # urllib says "<urlopen error [Errno 111] Connection refused>": keep the reason
    reason = body.strip().removeprefix("<urlopen error ").removesuffix(">")
    return None, reason[:160] or "no answer"


def read_server_info(url: str, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """An engine's /server_info (URL: the engine's base): (the JSON object, None), else (None, why)."""
    body, error = http_get(f"{url}/server_info", timeout_s)
    if body is None:
        return None, error
    try:
        info = json.loads(body)
    except ValueError as exc:
        return None, f"unreadable: {exc}"
    return (info, None) if isinstance(info, dict) else (None, "not a JSON object")


def page_sample(at: float, text: str) -> Sample:
    """Pure: an engine's /metrics page read at `at` as the checks take it (ValueError: unreadable)."""
    return Sample(at, parse_metrics(text), kv=kv_histograms(text), ttft=histogram_mean(text, SGLANG["ttft"]),
                  cache=cache_counts(text), kv_bytes_per_token=kv_bytes_per_token(text))


def sample(url: str, timeout_s: float) -> Sample:
    """One GET of an engine's /metrics (URL: the engine's base), parsed; the error when it gave nothing."""
    at = time.monotonic()
    body, error = http_get(f"{url}/metrics", timeout_s)
    if body is None:
        return Sample(at, None, error)
    try:
        return page_sample(at, body)
    except ValueError as exc:
        return Sample(at, None, f"unreadable /metrics: {str(exc)[:120]}")


def read_router_outcomes(url: str, timeout_s: float) -> dict[str, dict[str, float]] | None:
    """A router's worker outcomes now (router_outcomes), None when its /metrics did not answer or did not parse."""
    body, _error = http_get(url, timeout_s)
    if body is None:
        return None
    try:
        return router_outcomes(body)
    except ValueError:
        return None


def probe(router_url: str, model: str, requests_n: int, timeout_s: float, headers: dict[str, str]) -> list[int]:
    """A few short completions through the router, concurrently: decode passes and KV hand-offs to observe."""

    def one(i: int) -> int:
        payload = {"model": model, "prompt": f"pdkit doctor probe {i} {time.time_ns()}", "max_tokens": 16}
        return http_request(f"{router_url}/v1/completions", payload, timeout=timeout_s, headers=headers)[0]

    with ThreadPoolExecutor(max(1, requests_n)) as pool:
        return list(pool.map(one, range(requests_n)))


def kv_pages(plans: Sequence[EnginePlan], timeout_s: float) -> dict[tuple[str, str], dict[str, Histogram] | None]:
    """(host, engine) -> each prefill's KV histograms now (None: its /metrics did not answer)."""
    out: dict[tuple[str, str], dict[str, Histogram] | None] = {}
    for p in plans:
        body, _ = http_get(f"{p.url}/metrics", timeout_s)
        try:
            out[(p.host, p.engine)] = kv_histograms(body) if body is not None else None
        except ValueError:
            out[(p.host, p.engine)] = None
    return out


def itl_sums(plans: Sequence[EnginePlan], timeout_s: float) -> dict[tuple[str, str], tuple[float, float] | None]:
    """(host, engine) -> (sum, count) of each engine's inter-token latency histogram now."""
    out = {}
    for p in plans:
        body, _ = http_get(f"{p.url}/metrics", timeout_s)
        out[(p.host, p.engine)] = histogram_mean(body, SGLANG["itl"]) if body is not None else None
    return out
