"""What doctor's halves hand each other: the observations collection gathers for the checks (the plan
of each engine, its pages, its exporter's view, each router's), and the `CheckResult` rows the checks return."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pdkit.spec.kvcost import Histogram

Status = Literal["PASS", "INFO", "WARN", "FAIL"]
PASS: Status = "PASS"
# a figure reported with nothing to judge (no traffic in the window): neither a pass nor a doubt
INFO: Status = "INFO"
WARN: Status = "WARN"
FAIL: Status = "FAIL"


@dataclass(frozen=True)
class CheckResult:
    """One verdict: which host and target (an engine, `router` or `cluster`), which check, why, how to fix."""

    host: str
    target: str
    check: str
    status: Status
    reason: str
    hint: str = ""
    # the FAIL reports what the spec itself plans (e.g. decode graphs off by tuning): the engine
    # runs as written, the spec is what to change; `pdkit tune` counts such a lever as in effect
    as_planned: bool = False

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# Observations (what collection hands to the checks)


@dataclass(frozen=True)
class EnginePlan:
    """What the spec says one engine should be running."""

    host: str
    engine: str
    role: str
    url: str
    pd_group: str | None  # None for unified engines
    argv: tuple[str, ...]
    sglang_version: str
    engine_kind: str  # sglang | sim
    context_length: int | None
    cuda_graph: bool  # decode CUDA graphs planned on (False for prefill engines)
    graph_max_bs: int | None  # spec.effective_decode_graph_max_bs
    # pdkit.spec.decode_graph_required_bs: ceil(target_concurrency / DP ranks), None without a target
    required_bs: int | None
    env_names: tuple[str, ...] = ()  # planned NCCL/UCX/SGLANG variables of the process
    # an engine spanning nodes: the rank this plan is (on `host`), of how many nodes, and rank 0's
    # host. Only rank 0 serves HTTP (`url` is rank 0's); a rank above 0 is read through its own
    # host's pdkit-exporter (the process' argv and environment) and never counts as down for
    # lacking HTTP.
    rank: int = 0
    nnodes: int = 1
    head: str = ""
    # a prefill: the KV path to each host holding a decode it may hand KV to ((decode host, pdkit.spec.kvcost.KV_PATHS
    # name), pdkit.spec.prefill_kv_paths), those decodes (`host/engine`, pdkit.spec.pairing_sets)
    # and its node's ucx_net_devices
    kv_paths: tuple[tuple[str, str], ...] = ()
    kv_decodes: tuple[str, ...] = ()
    ucx_net_devices: str | None = None
    # the node's GPU indices it runs on, and whether its node's exporter reads their health (NVIDIA GPUs and a
    # real engine: no gpu_health row on a lab host or with the sim)
    gpus: tuple[int, ...] = ()
    gpu_health: bool = False

    @property
    def target(self) -> str:
        """The engine as the table names it: `decode`, or `decode rank 1` for a rank above 0."""
        return self.engine if self.rank == 0 else f"{self.engine} rank {self.rank}"


@dataclass
class Sample:
    """One GET of an engine's /metrics: parse_metrics' figures, or why there are none."""

    at: float = 0.0
    figures: dict[str, Any] | None = None
    error: str | None = None
    # the KV hand-off histograms (pdkit.spec.kvcost.kv_histograms: a prefill's; empty before its first hand-off)
    # and (sum, count) of sglang:time_to_first_token_seconds, None where the page has none
    kv: dict[str, Histogram] | None = None
    ttft: tuple[float, float] | None = None
    # the prefix cache's token counters ({"cached", "prompt"}: pdkit.spec.kvcost.cache_counts, 0 while absent)
    # and one token's KV bytes per rank (pdkit.spec.kvcost.kv_bytes_per_token, None where the page does not say)
    cache: dict[str, float] | None = None
    kv_bytes_per_token: float | None = None

    def read_figures(self) -> dict[str, Any]:
        """The figures, for a check that cannot_measure (pdkit.doctor.checkbase) let through: a sample
        without them there is a bug in that check's `needs`, not an engine's state."""
        if self.figures is None:
            raise RuntimeError(f"a /metrics sample without figures reached a check ({self.error})")
        return self.figures


@dataclass
class ExporterView:
    """What the node's pdkit-exporter said about one engine (None fields: series absent)."""

    env_present: float | None = None
    env_check_error: float | None = None
    env_mismatch: dict[str, str] = field(default_factory=dict)  # var -> problem
    flags_drift: float | None = None
    drift_flags: tuple[str, ...] = ()
    decode_graph_ratio: float | None = None
    decode_batch_cuda_graph: float | None = None  # the last `Decode batch` log line
    sglang_version: str | None = None
    rank_up: float | None = None  # pdkit_engine_rank_up: an engine spanning nodes, the rank this node runs
    rank: int | None = None  # which rank that is
    # pdkit_engine_shape_recorded: the shape the gate recorded for the running configuration (figure -> value)
    recorded_shape: dict[str, float] = field(default_factory=dict)
    # pdkit_engine_weights_info: the gate's last weights verdict (status, recorded, now, problem), None: absent
    weights: dict[str, str] | None = None
    # pdkit_engine_weights_page_cache_ratio / _bytes: (model_dir, ratio, bytes), None: not published
    weights_cached: tuple[str, float, float] | None = None
    # pdkit_engine_jit_caches_warm: (dir, warm 1 / cold 0, why), None: not published (an older exporter, or
    # SGLANG_CACHE_DIR set by the engine's own env); pdkit_engine_jit_cold_start_extra_seconds: (seconds, source)
    jit_caches: tuple[str, float, str] | None = None
    jit_cold_extra: tuple[float, str] | None = None
    # pdkit_engine_gpu_wedged: GPU index -> (bdf, 1 wedged / 0 healthy, what was seen); empty: not published
    gpu_wedged: dict[int, tuple[str, float, str]] = field(default_factory=dict)
    # pdkit_exporter_gpu_probe_error (the node's): (1 could not tell / 0, why), None: not published
    gpu_probe_error: tuple[float, str] | None = None


@dataclass
class EngineObservation:
    plan: EnginePlan
    server_info: dict[str, Any] | None = None
    server_info_error: str | None = None
    first: Sample = field(default_factory=Sample)
    second: Sample = field(default_factory=Sample)
    exporter: ExporterView | None = None
    exporter_error: str | None = None  # why the exporter page could not be read

    def read_server_info(self) -> dict[str, Any]:
        """/server_info, for a check that cannot_measure(needs="server_info") let through (as read_figures)."""
        if self.server_info is None:
            raise RuntimeError(f"{self.plan.host} {self.plan.target}: /server_info reached a check unread "
                               f"({self.server_info_error})")
        return self.server_info


@dataclass
class RouterObservation:
    host: str
    url: str
    expected_workers: tuple[str, ...]
    workers: dict[str, bool] | None = None  # url -> healthy
    error: str | None = None
    # smg_worker_cb_outcomes_total at both samples: worker url -> {"success": n, "failure": n}
    outcomes_first: dict[str, dict[str, float]] | None = None
    outcomes_second: dict[str, dict[str, float]] | None = None


@dataclass(frozen=True)
class WorkerOutcomes:
    """What one router recorded for one worker's requests (its circuit breaker), at both samples."""

    router: str
    first: dict[str, float]
    second: dict[str, float]


@dataclass(frozen=True)
class BenchPoint:
    """Output tokens per second at C=16, and the run it comes from (a fresh bench repeats its lengths)."""

    output_tok_s: float
    label: str  # the run's id, or "now"
    input_len: int = 512
    output_len: int = 128
    requests: int = 64
    ttft_mean_ms: float | None = None  # the C=16 level's client-side TTFT mean (a fresh bench)


@dataclass(frozen=True)
class KvBench:
    """One prefill's KV histograms before and after doctor's own C=16 bench, and the bench's TTFT mean."""

    before: dict[str, Histogram]
    after: dict[str, Histogram]
    ttft_mean_ms: float | None

