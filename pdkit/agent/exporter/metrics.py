"""An engine's /metrics text -> the figures pdkit-exporter re-exposes. Pure functions.

SGLang writes one series per scheduler rank: `cuda_graph_passes_total` has a series per TP rank
(every rank runs every forward pass), and depending on the release the scheduler gauges may be
written by every rank of a TP group too. Summing those would multiply by the TP size, so series
that differ only in a replica label (tp_rank, pp_rank, moe_ep_rank, ...) are collapsed with max,
and what remains (dp_rank, model_name, ...) is summed.

Only the sample lines of the families the exporter uses are handed to prometheus_client's
parser: a real engine's page carries dozens of histograms (hundreds of bucket lines) that would
cost ~1 ms per 50 lines to parse for nothing. The filter is a prefix test per line; the parsing
itself is `prometheus_client.parser.text_string_to_metric_families`.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pdkit.upstream.metricnames import SGLANG

# Labels whose values name a replica of the same figure (collapsed with max, never summed).
REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_dp_rank", "attn_cp_rank"})

# sample name -> (section, key). Section None: a top-level figure. Names: pdkit.upstream.metricnames.
_SAMPLES: dict[str, tuple[str | None, str]] = {
    SGLANG["running"]: (None, "running_requests"),
    SGLANG["waiting"]: (None, "queued_requests"),
    SGLANG["token_usage"]: (None, "token_usage"),
    SGLANG["gen_throughput"]: (None, "gen_throughput"),
    SGLANG["prompt_tokens"]: (None, "prompt_tokens"),
    SGLANG["generation_tokens"]: (None, "generation_tokens"),
    SGLANG["prefill_bootstrap_queue"]: ("pd_queues", "bootstrap"),
    SGLANG["prefill_inflight_queue"]: ("pd_queues", "inflight"),
    SGLANG["decode_prealloc_queue"]: ("pd_queues", "prealloc"),
    SGLANG["decode_transfer_queue"]: ("pd_queues", "transfer"),
    # absent until the engine's first failure (both releases): no key in the section then
    SGLANG["bootstrap_failed"]: ("kv_transfer_failures", "bootstrap"),
    SGLANG["transfer_failed"]: ("kv_transfer_failures", "transfer"),
    # key taken from the `mode` label: decode_cuda_graph | decode_none | prefill_cuda_graph | prefill_none
    SGLANG["cuda_graph_passes"]: ("cuda_graph_passes", ""),
}
SECTIONS = ("pd_queues", "kv_transfer_failures", "cuda_graph_passes")
_PREFIXES = tuple(sorted(_SAMPLES))


def wanted_text(text: str) -> str:
    """Only the sample lines of the families the exporter uses.

    HELP and TYPE lines are dropped too: samples are looked up by their own name, so the
    parser's family typing is not needed, and it costs a quarter of the parse.
    """
    keep = [line for line in text.splitlines() if line.startswith(_PREFIXES)]
    keep.append("")
    return "\n".join(keep)


def parse_metrics(text: str) -> dict[str, Any]:
    """The figures of one engine's /metrics page.

    Returns a dict with the top-level figures found (running_requests, queued_requests,
    token_usage, gen_throughput, prompt_tokens, generation_tokens) and the sections
    `pd_queues` {bootstrap, inflight, prealloc, transfer}, `kv_transfer_failures`
    {bootstrap, transfer} and `cuda_graph_passes` {<mode>: passes}, each holding only what the
    page has. Raises ValueError when the text is not in Prometheus' exposition format.
    """
    # (section, key, other labels) -> max over replicas
    collapsed: dict[tuple[str | None, str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(wanted_text(text)):
        for sample in family.samples:
            target = _SAMPLES.get(sample.name)
            if target is None or math.isnan(sample.value):
                continue
            section, key = target
            labels = sample.labels
            if section == "cuda_graph_passes":
                key = labels.get("mode", "")
                if not key:
                    continue
            rest = frozenset((k, v) for k, v in labels.items() if k not in REPLICA_LABELS and k != "mode")
            slot = (section, key, rest)
            old = collapsed.get(slot)
            collapsed[slot] = sample.value if old is None else max(old, sample.value)

    out: dict[str, Any] = {s: {} for s in SECTIONS}
    for (section, key, _), value in collapsed.items():
        holder = out if section is None else out[section]
        holder[key] = holder.get(key, 0.0) + value
    return out


def decode_cuda_graph_ratio(passes: dict[str, float]) -> float | None:
    """Share of decode forward passes that ran as a CUDA graph since the engine started.

    None when the engine has run no decode pass yet (a prefill engine never does).
    """
    graph = passes.get("decode_cuda_graph", 0.0)
    total = graph + passes.get("decode_none", 0.0)
    if total <= 0:
        return None
    return graph / total


__all__ = ["REPLICA_LABELS", "decode_cuda_graph_ratio", "parse_metrics", "wanted_text"]
