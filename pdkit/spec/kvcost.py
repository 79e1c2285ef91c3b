"""What a PD KV hand-off costs, from the prefill's own histograms; and which path it takes.

One home for the KV figures that `pdkit bench`, `pdkit doctor`, `pdkit tune` and the alert
rules report (issue 33), so "effective GB/s" means the same thing everywhere; and for the prefix
cache's hit rate (cached / prompt tokens from the engines' own counters) and what a hand-off
carried against the KV the uncached prompt tokens need (issue 43 item 5: bench's levels, doctor's
prefix_cache row, the dashboards' panels).

Where the numbers come from (sglang 0.5.17 and 0.5.23 alike): the prefill observes, per finished
request, `sglang:kv_transfer_latency_ms` (from its sender's first send to the poll that saw the
transfer done: queueing in the sender included), `sglang:kv_transfer_total_mb` (bytes / 2**20) and
`sglang:kv_transfer_speed_gb_s` = (MiB / 1024) / latency_s, all histograms on the prefill side
(`sglang/srt/observability/req_time_stats.py` `compute_and_observe_kv_transfer_metrics`,
`sglang/srt/disaggregation/prefill.py`). SGLang's speed histogram is a mean of per-request ratios:
a few fast transfers make it look healthy while queued ones wait seconds (measured on the H200,
docs/gpu.md: ~10 GB/s "speed" beside 8-10 s mean latency). The figure the kit reports is the
ratio of sums instead: bytes moved / time spent moving them, in SGLang's unit (GiB/s, written GB/s).

Example:

    before = kv_histograms(page_before)       # one prefill's /metrics text
    after = kv_histograms(page_after)
    figures = kv_figures(before, after, ttft_mean_ms=240.0)
    figures.effective_gb_s, figures.ttft_share
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pdkit.upstream.metricnames import SGLANG

# The three histograms, by the short names used below
KV_HISTOGRAMS = {
    "latency_ms": SGLANG["kv_transfer_latency"],
    "total_mb": SGLANG["kv_transfer_total"],
    "speed_gb_s": SGLANG["kv_transfer_speed"],
}


@dataclass(frozen=True)
class Histogram:
    """One histogram summed over its children (TP ranks, label sets): sum, count, cumulative buckets."""

    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier` (a restarted engine, whose counts fell, starts from zero)."""
        if earlier is None or self.count < earlier.count:
            return self
        before = dict(earlier.buckets)
        return Histogram(self.sum - earlier.sum, self.count - earlier.count,
                         tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets))


def kv_histograms(text: str) -> dict[str, Histogram]:
    """Pure: the KV histograms of one /metrics page, keyed like KV_HISTOGRAMS; absent ones left out
    (SGLang creates them on the first transfer: pdkit/upstream/data/metric_catalogue.json, eager false)."""
    wanted = {name: key for key, name in KV_HISTOGRAMS.items()}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            base, _, suffix = sample.name.rpartition("_")
            key = wanted.get(base)
            if key is None:
                continue
            if suffix == "sum":
                sums[key] = sums.get(key, 0.0) + sample.value
            elif suffix == "count":
                counts[key] = counts.get(key, 0.0) + sample.value
            elif suffix == "bucket":
                le = float(sample.labels["le"])
                slot = buckets.setdefault(key, {})
                slot[le] = slot.get(le, 0.0) + sample.value
    return {key: Histogram(sums[key], counts.get(key, 0.0), tuple(sorted(buckets.get(key, {}).items())))
            for key in sums}


def quantile(h: Histogram, q: float) -> tuple[float | None, bool]:
    """(value, above_top_bucket): Prometheus' histogram_quantile on one histogram. When the rank
    falls in the +Inf bucket the value is the highest finite bound and the flag says it is a floor:
    SGLang's latency buckets stop at 5,000 ms, below what a queued cross-host hand-off takes."""
    if h.count <= 0 or not h.buckets:
        return None, False
    rank = q * h.count
    lower_bound, lower_count = 0.0, 0.0
    finite = [b for b in h.buckets if not math.isinf(b[0])]
    for le, n in h.buckets:
        if n >= rank:
            if math.isinf(le):
                return (finite[-1][0] if finite else None), True
            if n == lower_count:
                return le, False
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (n - lower_count), False
        lower_bound, lower_count = le, n
    return (finite[-1][0] if finite else None), True


@dataclass(frozen=True)
class KvFigures:
    """The KV cost of the hand-offs one or more prefills made over a window."""

    transfers: int
    mb_per_request: float | None
    latency_mean_ms: float | None
    latency_p99_ms: float | None
    latency_p99_above_buckets: bool  # p99 is past SGLang's top bucket: the value is a floor
    effective_gb_s: float | None  # sum of MiB / 1024 / sum of seconds (ratio of sums)
    sglang_speed_mean_gb_s: float | None  # SGLang's own histogram mean (mean of per-request ratios)
    ttft_share: float | None  # latency mean / TTFT mean (TTFT from the client or the engine)

    def as_record(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def kv_figures(before: Mapping[str, Histogram], after: Mapping[str, Histogram],
               ttft_mean_ms: float | None = None) -> KvFigures:
    """Pure: the hand-offs between two samples of the same prefill(s), keyed like KV_HISTOGRAMS."""
    delta = {key: h.minus(before.get(key)) for key, h in after.items()}
    latency, total, speed = delta.get("latency_ms"), delta.get("total_mb"), delta.get("speed_gb_s")
    n = int(round(latency.count)) if latency is not None else 0
    if latency is None or n <= 0:
        return KvFigures(0, None, None, None, False, None, None, None)
    mean_ms = latency.sum / latency.count
    p99, above = quantile(latency, 0.99)
    mb = total.sum / total.count if total and total.count > 0 else None
    effective = (total.sum / 1024) / (latency.sum / 1000) if total and latency.sum > 0 else None
    sglang_speed = speed.sum / speed.count if speed and speed.count > 0 else None
    share = mean_ms / ttft_mean_ms if ttft_mean_ms else None
    return KvFigures(n, mb, mean_ms, p99, above, effective, sglang_speed, share)


def combine(pages: Iterable[Mapping[str, Histogram]]) -> dict[str, Histogram]:
    """Pure: several prefills' histograms as one (sums of sums, counts and buckets)."""
    out: dict[str, Histogram] = {}
    for page in pages:
        for key, h in page.items():
            prev = out.get(key)
            if prev is None:
                out[key] = h
                continue
            merged = dict(prev.buckets)
            for le, n in h.buckets:
                merged[le] = merged.get(le, 0.0) + n
            out[key] = Histogram(prev.sum + h.sum, prev.count + h.count, tuple(sorted(merged.items())))
    return out


# ---------------------------------------------------------------- which path a hand-off takes

# An RDMA (verbs) device as UCX names it: mlx5_0:1, ibp3s0:1, bnxt_re0:1, rxe0:1, irdma0:1, efa0. An
# `ib*` name without a port is the kernel's IP-over-InfiniBand netdev (ib0): TCP to UCX, not verbs
_RDMA_DEVICE = re.compile(
    r"^((mlx\d+_\d+|mlx5_bond_\d+|bnxt_re\d+|rxe\w*|irdma\d+|hfi\d+_\d+|qedr\d+|efa\d+|erdma\d+)(:\d+)?"
    r"|ib\w*:\d+)$")
# a verbs device written without the port UCX lists it with (mlx5_0 for mlx5_0:1)
_PORTLESS_VERBS = re.compile(r"^(mlx\d+_\d+|mlx5_bond_\d+|bnxt_re\d+|irdma\d+|qedr\d+|erdma\d+)$")


@dataclass(frozen=True)
class KvPath:
    """One class of KV path, and the effective rate below which the kit calls it slow."""

    name: str
    transport: str  # what UCX can use on it
    floor_gb_s: float  # effective GB/s (ratio of sums) below which doctor warns and the alert fires
    why: str
    # UCX settings the engines at both ends get when one of their hand-offs takes this path
    # (pdkit.render.flags.ucx_env); names and defaults checked against the pinned UCX
    # (pdkit/upstream/data/ucx_config.json)
    ucx_env: tuple[tuple[str, str], ...] = ()


# Floors are for the pair's effective rate over a window, queueing included: well under what a healthy
# path of that class moves under load, well over what the next-worse class moves. Decided once here:
# doctor's kv_path row, the PdkitKvHandoffSlow alert and docs/doctor.md read them. Measured on the
# H200 (docs/gpu.md, "KV hand-off levers"), effective GB/s over a run, 64-192 MiB hand-offs:
# one host (cuda_ipc) 24-34 at C=1 and 0.81-2.96 at C=16, where SGLang's one transfer thread per
# decode queues the hand-offs; the TCP lane 0.02-0.36 with UCX's 8 KiB fragments at any load, and
# 0.15-0.32 at C=16 with the kit's 512 KiB fragments
KV_PATHS = {
    # same host: prefill writes decode's GPU memory over cuda_ipc (pdkit.render.flags.ucx_env)
    "same-host": KvPath("same-host", "cuda_ipc", 0.5, "prefill writes the decode's GPU memory directly (cuda_ipc)"),
    # across hosts over InfiniBand/RoCE: GPUDirect RDMA, one NIC at 200-400 Gb/s is 25-50 GB/s; not
    # measured here (no RDMA on the lent machine): the same floor as one host
    "cross-host-rdma": KvPath("cross-host-rdma", "rc/ud verbs (GPUDirect RDMA)", 0.5,
                              "across hosts over RDMA (ucx_net_devices names a verbs device)"),
    # across hosts over TCP: UCX emulates the GPU-to-GPU put in software over sockets, 8 KiB fragments
    # each copied GPU -> host -> socket -> host -> GPU (UCX_PROTO_INFO: "software emulation | tcp");
    # 0.35 GB/s for one hand-off at a time on the H200, and one prefill thread per decode serialises
    # them, so 16 concurrent hand-offs wait ~8 s each: the floor catches that queue
    #
    # UCX fragments that put at UCX_TCP_TX_SEG_SIZE (8K by default), each with its own synchronous
    # copies and acknowledgement; 512 KiB fragments on both ends (the receiver's RX size caps what the
    # sender may send, and TX must not exceed RX) cut a 3072-token hand-off on the H200's TCP lane
    # from 521 to 87 ms, and TTFT p50 at C=16 from 6.8 s to 1.1 s (docs/gpu.md, "KV hand-off levers")
    "cross-host-tcp": KvPath("cross-host-tcp",
                             "tcp (software-emulated put, GPU memory staged through host memory)", 0.2,
                             "across hosts over TCP sockets: every byte is copied GPU -> host -> socket -> host -> GPU",
                             ucx_env=(("UCX_TCP_RX_SEG_SIZE", "512k"), ("UCX_TCP_TX_SEG_SIZE", "512k"))),
}

# Below this mean hand-off size (MiB) the rate is not judged: small hand-offs are bound by per-transfer
# latency, not bandwidth (the H200 one-host pair moved 8 MiB hand-offs at 0.23 GB/s effective while
# healthy, 22% of TTFT); their cost shows in the TTFT share instead
KV_RATE_MIN_MB = 32.0

# KV hand-off latency over mean TTFT above which doctor warns: past half, TTFT is mostly the
# hand-off and the prefill's compute is no longer what a user waits for
KV_TTFT_SHARE_WARN = 0.5


def rate_judged(mb_per_request: float | None) -> bool:
    """Whether hand-offs of this mean size are judged by their rate (KV_RATE_MIN_MB)."""
    return mb_per_request is not None and mb_per_request >= KV_RATE_MIN_MB


def kv_floor(paths: tuple[tuple[str, KvPath], ...], sim: bool = False) -> float | None:
    """The effective GB/s below which a prefill's hand-offs are slow: the lowest floor among its paths (its
    histograms mix every decode it hands to, so the slowest path it may take sets the bar); None without one.
    A sim engine moves KV at its kv_transfer_gb_s knob, not over a transport: the lowest floor of any path."""
    if not paths:
        return None
    if sim:
        return min(p.floor_gb_s for p in KV_PATHS.values())
    return min(p.floor_gb_s for _, p in paths)


def net_devices_are_rdma(ucx_net_devices: str | None) -> bool:
    """Whether a UCX_NET_DEVICES value names only RDMA (verbs) devices; None or a netdev is TCP."""
    if not ucx_net_devices:
        return False
    devices = [d.strip() for d in ucx_net_devices.split(",") if d.strip()]
    return bool(devices) and all(_RDMA_DEVICE.match(d) for d in devices)


def portless_verbs_devices(ucx_net_devices: str | None) -> list[str]:
    """The verbs devices in a UCX_NET_DEVICES value written without their port: UCX lists a verbs
    resource as device:port (mlx5_0:1, `ucx_info -d`), and a bare mlx5_0 matches none of them."""
    return [d.strip() for d in (ucx_net_devices or "").split(",") if _PORTLESS_VERBS.match(d.strip())]


def kv_path(prefill_host: str, decode_host: str, ucx_net_devices: str | None) -> KvPath:
    """The path a hand-off from a prefill on `prefill_host` to a decode on `decode_host` takes,
    given the prefill node's ucx_net_devices (pdkit_node.ucx_net_devices)."""
    if prefill_host == decode_host:
        return KV_PATHS["same-host"]
    return KV_PATHS["cross-host-rdma" if net_devices_are_rdma(ucx_net_devices) else "cross-host-tcp"]


# ---------------------------------------------------------------- the prefix cache, and the KV a hand-off needs

# The engines' own token counters (pdkit.upstream.metricnames; in pdkit/upstream/data/metric_catalogue.json for 0.5.17
# and
# 0.5.23, both lazy): prompt tokens of finished requests, and those of them served from the prefix cache
# (label cache_source: device, host, storage). Read by bench (a level's hit rate) and doctor (prefix_cache).
CACHE_COUNTERS = {"cached": SGLANG["cached_tokens"], "prompt": SGLANG["prompt_tokens"]}

# A PD prefill's hand-offs over what the uncached part of the prompts needs, above which doctor's
# prefix_cache row warns: past 2x, most of what crosses is KV the prefill already had cached, which the
# decode receives again because it has no radix cache of its own (SGLang turns it off on a decode unless
# --disaggregation-decode-enable-radix-cache; docs/sim.md "Decode radix cache (PD)")
KV_RESEND_WARN = 2.0
# ... and only when the KV re-sent per request is at least this (MiB): below, hand-offs are latency-bound
# (KV_RATE_MIN_MB), so sending a short cached prefix again costs little
KV_RESEND_MIN_MB = KV_RATE_MIN_MB


def cache_counts(text: str) -> dict[str, float]:
    """Pure: {"cached", "prompt"}: every sample of the two counters of one /metrics page summed
    (all labels: cache_source, is_streaming); an absent family (created lazily) counts 0."""
    wanted = {name: key for key, name in CACHE_COUNTERS.items()}  # sample names: the _total is theirs
    sums = dict.fromkeys(CACHE_COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                sums[key] += sample.value
    return sums


def cache_window(before: Mapping[str, float] | None, after: Mapping[str, float]) -> dict[str, float]:
    """Pure: each counter's increase from `before` to `after` (cache_counts of one engine); a counter that
    went back (the engine restarted) counts from zero, and without `before` the totals since start."""
    out = {}
    for key, now in after.items():
        then = (before or {}).get(key, 0.0)
        out[key] = now - then if now >= then else now
    return out


def hit_rate(counts: Mapping[str, float]) -> float | None:
    """cached / prompt tokens (a cache_counts or cache_window dict); None when no prompt token was counted."""
    prompt = counts.get("prompt", 0.0)
    return counts.get("cached", 0.0) / prompt if prompt > 0 else None


def kv_bytes_per_token(text: str) -> float | None:
    """Pure: the KV bytes of one token on one rank, from one /metrics page: sglang:kv_cache_memory_usage_gb
    (the pool's K and V buffers in GiB, mem_cache/memory_pool.py mem_usage) over sglang:max_total_num_tokens,
    summed over the ranks' children (so the per-rank figure, as each rank's kv_transfer_total_mb counts its own
    bytes). Both are set once at start-up (lazy in the catalogue): None when either is absent or zero. SGLang's
    pool holds one padding page more than max_total_num_tokens: a 1e-6 error at page size 1."""
    names = {SGLANG["kv_cache_memory"]: "gb", SGLANG["max_total_tokens"]: "tokens"}
    sums = {"gb": 0.0, "tokens": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = names.get(sample.name)
            if key is not None:
                sums[key] += sample.value
    if sums["gb"] <= 0 or sums["tokens"] <= 0:
        return None
    return sums["gb"] * 2**30 / sums["tokens"]


@dataclass(frozen=True)
class HandoffNeed:
    """A prefill's hand-offs over a window against the KV its prompts' uncached tokens need."""

    transfers: int
    mb_per_request: float  # MiB handed off per request (kv_transfer_total_mb)
    uncached_tokens_per_request: float  # (prompt - cached tokens) / transfers
    need_mb_per_request: float  # the uncached tokens' KV: tokens x kv_bytes_per_token / 2**20
    ratio: float | None  # mb_per_request / need_mb_per_request (None when nothing uncached: all cached)

    @property
    def resent_mb_per_request(self) -> float:
        return max(0.0, self.mb_per_request - self.need_mb_per_request)

    @property
    def too_much(self) -> bool:
        """More than KV_RESEND_WARN x the uncached part, and at least KV_RESEND_MIN_MB per request sent again."""
        over = self.ratio is None or self.ratio > KV_RESEND_WARN
        return over and self.resent_mb_per_request >= KV_RESEND_MIN_MB


def handoff_need(fig: KvFigures, cache: Mapping[str, float], bytes_per_token: float) -> HandoffNeed | None:
    """Pure: the hand-offs of `fig` (kv_figures over a window) against the uncached prompt tokens of the same
    window (`cache`: cache_window of the prefill's cache_counts), at `bytes_per_token` (kv_bytes_per_token).
    None without a hand-off or a MiB figure in the window."""
    if fig.transfers <= 0 or fig.mb_per_request is None:
        return None
    uncached = max(0.0, cache.get("prompt", 0.0) - cache.get("cached", 0.0)) / fig.transfers
    need = uncached * bytes_per_token / 2**20
    return HandoffNeed(fig.transfers, fig.mb_per_request, uncached, need,
                       fig.mb_per_request / need if need > 0 else None)
