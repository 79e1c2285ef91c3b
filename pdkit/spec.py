"""The cluster spec: pydantic models for what the user writes, and the cross-host rules.

A pyinfra inventory describes the cluster; each host's resolved data holds pdkit's
sections (all keys start with ``pdkit_``):

- ``pdkit_cluster``   cluster-wide: model, engine kind, SGLang version, tuning defaults.
                      May be set on any group or host; every host that resolves it must
                      see the same value.
- ``pdkit_node``      a GPU node: its GPUs, NUMA layout, NCCL profile and engines.
- ``pdkit_router``    this host runs the router.
- ``pdkit_monitoring`` this host runs Prometheus and Grafana.

`pdkit.loader.load()` turns an inventory into a frozen `ClusterSpec` or a list of
`Problem`s; this module holds the models and `cross_checks()`, the rules that need
more than one section to decide.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from pdkit.faultbudget import ROUTER_FLAGS as ROUTER_BUDGET_FLAGS
from pdkit.faultbudget import FaultBudget, router_flags
from pdkit.faultbudget import problems as fault_budget_problems
from pdkit.kvcost import KV_PATHS, KvPath, kv_path, net_devices_are_rdma
from pdkit.parsertable import all_speculative_algorithms
from pdkit.versions import DEFAULT_SGLANG_VERSION, ROUTER_RELEASES, SGLANG_RELEASES

# A systemd unit name fragment and a Prometheus label value at once.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
Port = Annotated[int, Field(ge=1, le=65535)]
SglangVersion = Literal["0.5.17", "0.5.23"]


# Bounds that catch unit mistakes (a MiB figure where GiB is asked, milliseconds for seconds):
# each is far above any real setting and is named in the error.
MAX_GPU_MEMORY_GIB = 320  # the largest GPUs shipping (B300, MI355X: 288 GB = 268 GiB)
MAX_NUMA_NODES = 64
MAX_CONTEXT_LENGTH = 16 * 1024 * 1024  # 16M tokens; the longest released contexts are 10M
MAX_BATCH = 65536
MAX_TIMEOUT_S = 86400  # a day
MAX_INTERVAL_S = 3600


def at_most(limit: int | float, what: str, too_big_hint: str = ""):
    """An AfterValidator: the value must be <= limit; the message names the bound."""

    def check(value):
        if value is not None and value > limit:
            hint = f" ({too_big_hint})" if too_big_hint else ""
            raise ValueError(f"{value} is above {limit}, the most a {what} can sensibly be{hint}")
        return value

    return AfterValidator(check)


Seconds = Annotated[int, Field(ge=1), at_most(MAX_TIMEOUT_S, "timeout in seconds", "does it look like milliseconds? give seconds")]
IntervalSeconds = Annotated[int, Field(ge=1), at_most(MAX_INTERVAL_S, "interval in seconds", "does it look like milliseconds? give seconds")]
BatchSize = Annotated[int, Field(ge=1), at_most(MAX_BATCH, "batch size or request count")]

# Accounts Debian and Ubuntu create for the system itself (base-passwd's passwd.master, plus
# the daemons pdkit installs beside its services): a service must never run as one of them.
SYSTEM_ACCOUNTS = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "nobody", "_apt", "messagebus", "sshd", "syslog",
    "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-coredump", "polkitd",
    "prometheus", "grafana", "node-exp", "nvidia-persistenced", "ubuntu", "debian",
})
# Directories pdkit must not take over as its install or config dir.
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/opt", "/proc", "/root", "/run",
                         "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def model_location_problem(value: str) -> str | None:
    """Why a model/tokenizer/draft location is unusable, or None: an absolute path on the GPU
    nodes, or a Hugging Face hub id ("org/name", downloaded by nodes that may reach the hub)."""
    if value.startswith("/"):
        if "/../" in value + "/" or re.search(r"\s", value):
            return f"{value!r} is not a plain absolute path: no '..' components or spaces"
        return None
    if _HUB_ID.match(value) and ".." not in value:
        return None
    return (f"{value!r} is neither an absolute path nor a hub id: give the directory on the GPU nodes "
            "(e.g. /models/Llama-3.1-8B-Instruct) or a Hugging Face id 'org/name' (e.g. meta-llama/Llama-3.1-8B-Instruct); "
            "a relative path would resolve against the service's working directory")


def _model_location(value: str | None) -> str | None:
    if value is not None:
        problem = model_location_problem(value)
        if problem:
            raise ValueError(problem)
    return value


def _system_dir(value: str) -> str:
    if "/../" in value + "/" or value.endswith("/.."):
        raise ValueError(f"{value!r} has a '..' component: give a plain absolute path such as /opt/pdkit")
    if value.rstrip("/") in SYSTEM_DIRS or value == "/":
        raise ValueError(f"{value!r} is a system directory: give one of pdkit's own, such as /opt/pdkit or /etc/pdkit")
    return value


def _engine_venv_dir(value: str | None) -> str | None:
    """pdkit_node.engine_venv: the directory of a Python environment (its bin/python), never a system directory."""
    if value is None:
        return None
    if "/../" in value + "/" or value.endswith("/.."):
        raise ValueError(f"{value!r} has a '..' component: give the environment's plain absolute path, e.g. /opt/sglang-env")
    if value.rstrip("/") in SYSTEM_DIRS or value == "/":
        raise ValueError(
            f"{value!r} is a system directory, not a Python environment: give the directory whose bin/python runs the engines, "
            "e.g. /opt/sglang-env (for an SGLang installed into the system Python, make one that sees it: "
            "python3 -m venv --system-site-packages /opt/sglang-env)"
        )
    hidden = hidden_from_engines(value)
    if hidden:
        raise ValueError(
            f"{value!r} is under {hidden}, which the engine units cannot see (ProtectHome=yes / PrivateTmp=yes, docs/security.md): "
            "put the environment elsewhere, e.g. /opt/sglang-env"
        )
    return value.rstrip("/")


# directories the engine units' sandbox hides (templates/systemd/engine.service.j2: ProtectHome=yes
# makes /home, /root and /run/user empty and inaccessible; PrivateTmp=yes gives the unit its own
# empty /tmp and /var/tmp). The one list for every path an engine reads: engine_venv, the model,
# its tokenizer and a speculative draft (validate), and the preflight's model checks.
_HIDDEN_FROM_ENGINES = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")


def hidden_from_engines(path: str) -> str | None:
    """The directory of _HIDDEN_FROM_ENGINES that PATH is in (the engine units cannot see it), or None."""
    return next((d for d in _HIDDEN_FROM_ENGINES if (path.rstrip("/") + "/").startswith(d + "/")), None)


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


# How SGLang's speculative hook treats a missing --speculative-draft-model-path
# (sglang/srt/arg_groups/speculative_hook.py of 0.5.17 and 0.5.23: _handle_dflash raises,
# _handle_uno refuses a draft; EAGLE-family algorithms load the draft from the path and only
# default it to the target for a model with a built-in MTP head, which SGLang names NEXTN).
DRAFT_REQUIRED = {
    "EAGLE": "for a model's own multi-token-prediction head use algorithm NEXTN instead",
    "EAGLE3": "an EAGLE3 draft is always a separate checkpoint",
    "STANDALONE": "STANDALONE runs a separate small draft model",
    "DFLASH": "SGLang: 'DFLASH speculative decoding requires setting --speculative-draft-model-path'",
}
DRAFT_REFUSED = {
    "UNO": "SGLang: 'UNO reuses the target model and does not accept --speculative-draft-model-path'",
    "NGRAM": "NGRAM drafts from an n-gram cache of the prompt; SGLang never loads a draft for it",
}


class Speculative(Frozen):
    """Speculative decoding, checked the way SGLang's speculative_hook checks it."""

    # EAGLE | EAGLE3 | NEXTN | STANDALONE | NGRAM | DFLASH | DSPARK | UNO (multi-token prediction is NEXTN)
    algorithm: str
    # --speculative-num-steps; unset means SGLang picks, and then topk/draft tokens must be unset too
    num_steps: int | None = Field(default=None, ge=1)
    # --speculative-eagle-topk
    eagle_topk: int | None = Field(default=None, ge=1)
    # --speculative-num-draft-tokens; with topk 1 it must equal num_steps + 1
    num_draft_tokens: int | None = Field(default=None, ge=1)
    # --speculative-draft-model-path; unset for NEXTN (the model's own MTP head)
    draft_model_path: str | None = None

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        known = all_speculative_algorithms()
        if value.upper() == "MTP":
            raise ValueError(
                "'MTP' is not an SGLang algorithm name: multi-token prediction is 'NEXTN'"
            )
        if value not in known:
            raise ValueError(f"unknown algorithm {value!r}; valid: {', '.join(known)}")
        return value

    _draft_location = field_validator("draft_model_path")(classmethod(lambda cls, v: _model_location(v)))

    @model_validator(mode="after")
    def _draft_model(self) -> Speculative:
        need = DRAFT_REQUIRED.get(self.algorithm)
        if need and self.draft_model_path is None:
            raise ValueError(f"{self.algorithm} needs a draft model: set draft_model_path ({need})")
        if self.algorithm in DRAFT_REFUSED and self.draft_model_path is not None:
            raise ValueError(f"{self.algorithm} takes no draft model ({DRAFT_REFUSED[self.algorithm]}): remove draft_model_path")
        return self

    @model_validator(mode="after")
    def _consistent_counts(self) -> Speculative:
        if self.num_steps is None and (
            self.eagle_topk is not None or self.num_draft_tokens is not None
        ):
            raise ValueError(
                "num_steps is unset, so eagle_topk and num_draft_tokens must be unset too "
                "(SGLang picks all three together)"
            )
        if (
            self.eagle_topk == 1
            and self.num_steps is not None
            and self.num_draft_tokens is not None
            and self.num_draft_tokens != self.num_steps + 1
        ):
            raise ValueError(
                f"with eagle_topk 1, num_draft_tokens must be num_steps + 1 = {self.num_steps + 1} "
                f"(got {self.num_draft_tokens})"
            )
        return self


class Tuning(Frozen):
    """The seeds' levers. Unset (None) means SGLang's own default; each maps to one flag or env var."""

    # decode-phase CUDA graphs (the seeds' first lever); False -> --cuda-graph-backend-decode disabled
    cuda_graph: bool | None = None
    # prefill-phase (piecewise) CUDA graphs; False -> --cuda-graph-backend-prefill disabled
    prefill_cuda_graph: bool | None = None
    # --cuda-graph-max-bs-decode: largest decode batch captured; must cover the target concurrency per DP rank (ceil(target / dp or attn_dp))
    cuda_graph_max_bs: BatchSize | None = None
    # --cuda-graph-bs-decode: explicit capture buckets (finer buckets cut padding waste)
    cuda_graph_bs: tuple[int, ...] | None = None
    # --num-continuous-decode-steps
    num_continuous_decode_steps: Annotated[int, Field(ge=1), at_most(1024, "number of decode steps")] | None = None
    # --context-length: cap it (an uncapped 1M context made the indexer scan 1M tokens a step)
    context_length: Annotated[int, Field(ge=1), at_most(MAX_CONTEXT_LENGTH, "context length in tokens")] | None = None
    # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: needed for a context above the model's maximum
    allow_longer_context: bool | None = None
    # --mem-fraction-static
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    # --max-running-requests
    max_running_requests: BatchSize | None = None
    # --max-queued-requests
    max_queued_requests: Annotated[int, Field(ge=1), at_most(10_000_000, "queue length")] | None = None
    # --chunked-prefill-size (a multiple of page_size)
    chunked_prefill_size: Annotated[int, Field(ge=1), at_most(MAX_CONTEXT_LENGTH, "prefill chunk in tokens")] | None = None
    # --page-size (KV page size; a PD transfer lever)
    page_size: Annotated[int, Field(ge=1), at_most(4096, "KV page size in tokens")] | None = None
    # False -> --disable-overlap-schedule
    overlap_schedule: bool | None = None
    # True -> --enable-torch-compile
    torch_compile: bool | None = None
    # --attention-backend
    attention_backend: str | None = None
    # --sampling-backend
    sampling_backend: str | None = None
    # --moe-runner-backend
    moe_runner_backend: str | None = None
    # --quantization
    quantization: str | None = None
    # --kv-cache-dtype
    kv_cache_dtype: str | None = None
    # --speculative-*
    speculative: Speculative | None = None
    # auto: off at TP 2 on sm_12x (crashes at graph capture) and with the P2P-disabled NCCL profile
    custom_all_reduce: Literal["auto", "on", "off"] | None = None
    # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (SGLang >= 0.5.23, TP 2/4/8, bf16, needs working P2P)
    pcie_ipc_allreduce: bool | None = None
    # --watchdog-timeout seconds
    watchdog_timeout: Seconds | None = None
    # --enable-metrics (pdkit's monitoring needs it; on unless turned off)
    enable_metrics: bool | None = None
    # --decode-log-interval
    decode_log_interval: int | None = Field(default=None, ge=1)
    # --log-level
    log_level: Literal["debug", "info", "warning", "error", "critical"] | None = None
    # --moe-a2a-backend (expert-parallel all-to-all: deepep, mooncake, ...; choices from the release's parser)
    moe_a2a_backend: str | None = None
    # True -> --enable-eplb (expert-parallel load balancer; needs an engine with ep > 1)
    enable_eplb: bool | None = None
    # --ep-num-redundant-experts (extra expert replicas EPLB may place; needs ep > 1)
    ep_num_redundant_experts: Annotated[int, Field(ge=0), at_most(4096, "number of redundant experts")] | None = None

    @field_validator("cuda_graph_bs")
    @classmethod
    def _sorted_buckets(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None:
            if not value or any(b < 1 for b in value):
                raise ValueError("give a non-empty list of positive batch sizes, e.g. [1, 2, 4, 8, 16]")
            if max(value) > MAX_BATCH:
                raise ValueError(f"{max(value)} is above {MAX_BATCH}, the most a batch size can sensibly be")
            if list(value) != sorted(set(value)):
                raise ValueError("batch sizes must be strictly increasing, e.g. [1, 2, 4, 8, 16]")
        return value

    def merged(self, override: Tuning) -> Tuning:
        """This tuning with every field the override sets explicitly taking its value."""
        return self.model_copy(update={k: getattr(override, k) for k in override.model_fields_set})

    def value(self, name: str):
        """A field's effective value: the explicit setting, else pdkit's default."""
        explicit = getattr(self, name)
        return TUNING_DEFAULTS.get(name) if explicit is None else explicit


# pdkit's defaults where they differ from "leave it to SGLang".
TUNING_DEFAULTS: dict[str, object] = {
    # graphs are the single largest lever in the seeds (3.8x, 5.2x): on unless turned off
    "cuda_graph": True,
    # the exporter, doctor and dashboards read /metrics
    "enable_metrics": True,
    "overlap_schedule": True,
    "torch_compile": False,
    "custom_all_reduce": "auto",
    "pcie_ipc_allreduce": False,
    "allow_longer_context": False,
}


class RoleTuning(Frozen):
    """Cluster-wide tuning: `all` first, then the engine's role, then the engine's own."""

    all: Tuning = Tuning()
    prefill: Tuning = Tuning()
    decode: Tuning = Tuning()
    unified: Tuning = Tuning()


class Model(Frozen):
    """The model every engine serves unless an engine names its own."""

    # --model-path: a directory on the GPU nodes, outside /home, /root, /tmp (the engine sandbox hides them; the preflight checks it is there and readable), or a hub id on nodes that may download
    path: str = Field(min_length=1)
    # --served-model-name (no ':' — SGLang rejects it); defaults to the path's last component
    served_name: str | None = None
    # --tokenizer-path
    tokenizer_path: str | None = None
    # --trust-remote-code
    trust_remote_code: bool = False
    # --load-format (e.g. dummy = random weights from config.json, for rehearsals)
    load_format: str | None = None

    _locations = field_validator("path", "tokenizer_path")(classmethod(lambda cls, v: _model_location(v)))

    @field_validator("served_name")
    @classmethod
    def _no_colon(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            raise ValueError(f"{value!r} contains ':', which SGLang rejects in a served model name")
        return value

    @property
    def name(self) -> str:
        return self.served_name or self.path.rstrip("/").rsplit("/", 1)[-1]


class Secrets(Frozen):
    """Secrets reach nodes only through mode-0600 files, never unit files, argv or logs."""

    # HF_TOKEN for engines that download from the hub
    hf_token: SecretStr | None = None
    # the router's API key (also sent by pdkit's own clients)
    router_api_key: SecretStr | None = None
    # each alert receiver's credential, by receiver name (pdkit_monitoring.alerting.receivers; what it is: RECEIVER_KINDS); only in a mode-0600 file Alertmanager reads
    alert_receivers: dict[str, SecretStr] = Field(default_factory=dict)


class Cluster(Frozen):
    """`pdkit_cluster`: what every host of the cluster agrees on."""

    # cluster name: a label in Prometheus and the prefix of nothing else
    name: str = Field(pattern=NAME_PATTERN)
    # sglang: python -m sglang.launch_server; sim: python -m pdkit.sim with the same argv
    engine: Literal["sglang", "sim"] = "sglang"
    # the SGLang release the flags are rendered for
    sglang_version: SglangVersion = DEFAULT_SGLANG_VERSION  # type: ignore[assignment]
    # the model every engine serves (see the model table)
    model: Model
    # --disaggregation-transfer-backend for PD engines
    transfer_backend: Literal["nixl", "mooncake", "fake"] = "nixl"
    # the concurrency the cluster is tuned for; each decode DP rank's CUDA graphs must cover its share, ceil(target / DP ranks)
    target_concurrency: BatchSize | None = None
    # tuning layers: `all`, then the engine's role (prefill/decode/unified), then the engine's own
    tuning: RoleTuning = RoleTuning()
    # the unprivileged user every service runs as
    service_user: str = Field(default="pdkit", pattern=r"^[a-z_][a-z0-9_-]{0,30}$")
    # venv, wheelhouse and releases live here on every host
    install_dir: str = Field(default="/opt/pdkit", pattern=r"^/[A-Za-z0-9_./-]+$")
    # env files and configuration live here on every host
    config_dir: str = Field(default="/etc/pdkit", pattern=r"^/[A-Za-z0-9_./-]+$")
    # how long a restarted engine may take to become ready (a real engine: 1-2 minutes)
    ready_timeout_s: Seconds = 600
    # secrets, written only to mode-0600 env files (see the secrets table)
    secrets: Secrets = Secrets()
    # how long a request may wait on a failed engine or node, and the PD and router waits that
    # bound it (pdkit/faultbudget.py; docs/rolling.md, "The fault budget")
    fault_budget: FaultBudget = FaultBudget()
    # how nodes get their wheel bundles: http (fetched from the deploying machine, hash-checked),
    # sftp (uploaded over the SSH connection), auto (http where the node can reach us, else sftp)
    wheelhouse_transfer: Literal["auto", "http", "sftp"] = "auto"

    @field_validator("service_user")
    @classmethod
    def _unprivileged_user(cls, value: str) -> str:
        if value in SYSTEM_ACCOUNTS or value.startswith("systemd-"):
            raise ValueError(f"{value!r} is a system account: services run as a user of their own, e.g. 'pdkit' (the default)")
        return value

    _dirs = field_validator("install_dir", "config_dir")(classmethod(lambda cls, v: _system_dir(v)))


class GpuLayout(Frozen):
    """The GPUs of a node as the plan sees them (real, or virtual on lab hosts)."""

    # model name as nvidia-smi prints it
    model: str = Field(min_length=1)
    # number of GPUs; engine GPU indices must be below it
    count: int = Field(ge=1, le=64)
    # memory per GPU, GiB; decides SGLang's memory-class defaults
    memory_gib: int = Field(ge=1)
    # compute capability, e.g. "12.0" for RTX PRO 6000 Blackwell, "9.0" for H200
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    # NUMA node of each GPU, by index (length = count); e.g. [0,0,0,0,1,1,1,1]
    numa: tuple[int, ...] | None = None

    @field_validator("memory_gib")
    @classmethod
    def _gib_not_mib(cls, value: int) -> int:
        if value >= 1024:
            raise ValueError(f"{value} looks like MiB ({value} MiB = {value / 1024:.0f} GiB): give memory_gib in GiB, at most {MAX_GPU_MEMORY_GIB}")
        if value > MAX_GPU_MEMORY_GIB:
            raise ValueError(f"{value} GiB is more than any GPU has: give memory_gib in GiB, at most {MAX_GPU_MEMORY_GIB}")
        return value

    @field_validator("numa")
    @classmethod
    def _numa_ids(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(n < 0 or n >= MAX_NUMA_NODES for n in value):
            raise ValueError(f"NUMA node ids run from 0 to {MAX_NUMA_NODES - 1} (as numactl --hardware lists them), got {list(value)}")
        return value

    @model_validator(mode="after")
    def _numa_per_gpu(self) -> GpuLayout:
        if self.numa is not None and len(self.numa) != self.count:
            raise ValueError(
                f"numa lists {len(self.numa)} entries but count is {self.count}: give one NUMA node per GPU"
            )
        return self

    @property
    def sm_major(self) -> int:
        return int(self.compute_capability.split(".")[0])


class Engine(Frozen):
    """One SGLang server process (one systemd unit) on one node."""

    # unit pdkit-engine-<name>.service; unique on its node
    name: str = Field(pattern=NAME_PATTERN)
    # prefill | decode (a PD pair) or unified (no disaggregation)
    role: Literal["prefill", "decode", "unified"]
    # GPU indices on this node: evenly spaced (rendered as --base-gpu-id / --gpu-id-step)
    gpus: tuple[int, ...] = Field(min_length=1)
    # --tp-size; defaults to the GPU count / dp
    tp: int | None = Field(default=None, ge=1)
    # --dp-size: data-parallel replicas (not across nodes: SGLang refuses that; use attn_dp)
    dp: int = Field(default=1, ge=1)
    # --pp-size: pipeline stages
    pp: int = Field(default=1, ge=1)
    # --ep-size: expert parallelism for MoE models; unset: SGLang's default (1)
    ep: int | None = Field(default=None, ge=1)
    # attention data parallelism (MoE models): --attn-dp-size N on 0.5.23,
    # --dp-size N --enable-dp-attention on 0.5.17 (pdkit.versions); must divide tp
    attn_dp: int | None = Field(default=None, ge=1)
    # the hosts this engine spans, in rank order; the first is the host that declares it (rank 0,
    # the only one serving HTTP); each runs the same GPU indices (`gpus`) -> --nnodes/--node-rank
    nodes: tuple[str, ...] | None = None
    # the port on rank 0's host where the ranks meet (--dist-init-addr); required with nodes
    dist_init_port: Port | None = None
    # --port: the engine's HTTP port (serves /metrics too)
    port: Port
    # --disaggregation-bootstrap-port (prefill only; 8998 when unset)
    bootstrap_port: Port | None = None
    # engines of one group pair up behind the router
    pd_group: str = Field(default="default", pattern=NAME_PATTERN)
    # NUMA node to bind CPU and memory to; defaults to the NUMA node of all its GPUs
    numa_node: int | None = Field(default=None, ge=0, lt=MAX_NUMA_NODES)
    # share of each of its GPUs' memory, for engines that share GPUs (e.g. a PD pair on one GPU):
    # they start one after another in declaration order and pdkit derives --mem-fraction-static
    gpu_share: float | None = Field(default=None, gt=0, lt=1)
    # per-engine overrides of the cluster's model / version / transfer backend
    model: Model | None = None
    # per-engine SGLang version (a PD group must agree; rolled pairwise)
    sglang_version: SglangVersion | None = None
    # this engine's own tuning, over the cluster's `all` and role layers
    tuning: Tuning = Tuning()
    # escape hatch: extra sglang flags, checked against the flags pdkit generates
    extra_args: tuple[str, ...] = ()
    # extra environment for this engine (no secrets: use pdkit_cluster.secrets)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("gpus")
    @classmethod
    def _evenly_spaced(cls, gpus: tuple[int, ...]) -> tuple[int, ...]:
        if any(g < 0 for g in gpus):
            raise ValueError("GPU indices start at 0")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU list {list(gpus)} repeats an index")
        if len(gpus) > 1:
            steps = {b - a for a, b in zip(gpus, gpus[1:])}
            if len(steps) != 1 or next(iter(steps)) < 1:
                raise ValueError(
                    f"GPU list {list(gpus)} must be increasing and evenly spaced "
                    "(SGLang places a server with --base-gpu-id and --gpu-id-step), e.g. [0, 1, 2, 3]"
                )
        return gpus

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if re.search(r"TOKEN|SECRET|PASSWORD|API_KEY", key):
                raise ValueError(
                    f"{key!r} looks like a secret: put it under pdkit_cluster.secrets so that it "
                    "only reaches a mode-0600 env file"
                )
        return env

    @property
    def nnodes(self) -> int:
        return len(self.nodes) if self.nodes else 1

    @property
    def spans_nodes(self) -> bool:
        return self.nnodes > 1

    @property
    def total_gpus(self) -> int:
        """GPUs of every rank: the per-node `gpus` times the nodes it spans."""
        return len(self.gpus) * self.nnodes

    @property
    def tp_size(self) -> int:
        return self.tp if self.tp is not None else max(1, self.total_gpus // (self.dp * self.pp))

    @property
    def gpu_step(self) -> int:
        return self.gpus[1] - self.gpus[0] if len(self.gpus) > 1 else 1

    @property
    def unit_name(self) -> str:
        return f"pdkit-engine-{self.name}.service"

    @property
    def effective_bootstrap_port(self) -> int | None:
        if self.role != "prefill":
            return None
        return self.bootstrap_port if self.bootstrap_port is not None else 8998


class Node(Frozen):
    """`pdkit_node`: a GPU node and the engines it runs."""

    # nvidia: real GPUs (preflight checks them); none: a lab host with a virtual GPU layout
    gpu: Literal["nvidia", "none"] = "nvidia"
    # the node's GPUs (see the gpus table)
    gpus: GpuLayout
    # the address engines listen on and the router reaches; defaults to the host's ssh_hostname
    address: str | None = None
    # pcie: NCCL tuned for PCIe; pcie-p2p-off: IOMMU/ACS workaround; nvlink / default: NCCL's own choice
    nccl_profile: Literal["pcie", "pcie-p2p-off", "nvlink", "default"] = "default"
    # NCCL_SOCKET_IFNAME (required on every node of an engine that spans nodes)
    nic: str | None = None
    # how NCCL crosses nodes, for engines spanning nodes: ib (InfiniBand/RoCE through nccl_ib_hca)
    # or socket (TCP over `nic`, NCCL_IB_DISABLE=1); required on every node of such an engine
    nccl_net: Literal["ib", "socket"] | None = None
    # NCCL_IB_HCA: the HCAs NCCL may use, e.g. "mlx5_0,mlx5_1" or "=mlx5_0:1" (nccl_net ib)
    nccl_ib_hca: str | None = Field(default=None, pattern=r"^[\^=]?[A-Za-z0-9_]+(:[0-9]+)?(,[A-Za-z0-9_]+(:[0-9]+)?)*$")
    # UCX_NET_DEVICES, needed when a PD pair spans nodes (e.g. "mlx5_0:1")
    ucx_net_devices: str | None = None
    # NUMA nodes the machine has (numactl --hardware); every NUMA id of the node must be below it
    numa_nodes: int | None = Field(default=None, ge=1, le=MAX_NUMA_NODES)
    # the SGLang servers on this node (see the engines table)
    engines: tuple[Engine, ...] = ()
    # port of pdkit-exporter on this node
    exporter_port: Port = 9400
    # NVIDIA's DCGM exporter (port 9401); unset: on for gpu nvidia, off on lab hosts
    dcgm_exporter: bool | None = None
    # NCCL_P2P_LEVEL for the pcie profile; unset: PHB, or SYS when an engine spans NUMA nodes
    # (the preflight reads `nvidia-smi topo -m` and names the level the topology needs)
    nccl_p2p_level: Literal["PIX", "PXB", "PHB", "SYS"] | None = None
    # install: pdkit lays down NVIDIA's repository, driver R580, CUDA 13.0 and NCCL (gpu nvidia);
    # provided: the machine brings them (a container bound to its host's driver, a vendor image):
    # pdkit installs none, and the preflight still checks the driver, the GPUs and the topology
    nvidia_stack: Literal["install", "provided"] = "install"
    # kernel modules: nvidia-dkms (NVIDIA's nvidia-open, built by DKMS) or ubuntu-prebuilt
    # (Ubuntu's signed linux-modules-nvidia-580-open-<flavour>, Secure Boot friendly; Ubuntu only)
    driver_modules: Literal["nvidia-dkms", "ubuntu-prebuilt"] = "nvidia-dkms"
    # never: a driver change only marks the node "reboot required"; when-drained: reboot it too,
    # but only in a run that declares the node drained (pdkit roll sets node_drained)
    reboot: Literal["never", "when-drained"] = "never"
    # the node's own SGLang environment (e.g. a vendor image's venv): its bin/python runs the engines, pdkit installs no engine here and preflight checks its sglang (and nixl); unset: SGLang from pdkit's lock
    engine_venv: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9_./-]+$")

    _engine_venv = field_validator("engine_venv")(classmethod(lambda cls, v: _engine_venv_dir(v)))

    def engine(self, name: str) -> Engine:
        return next(e for e in self.engines if e.name == name)


class Router(Frozen):
    """`pdkit_router`: this host runs the router in front of the engines."""

    # smg (SGLang Model Gateway) or the last standalone sglang-router; unset: the one that pairs
    # with the cluster's SGLang version
    package: Literal["smg", "sglang-router"] | None = None
    # the pinned version of that package (smg 1.13.0, sglang-router 0.3.2)
    version: str | None = None
    # the router's HTTP port (clients talk here)
    port: Port = 8000
    # the router's Prometheus port
    prometheus_port: Port = 29000
    # where it listens; defaults to the host's address
    address: str | None = None
    # worker selection without PD
    policy: str = "cache_aware"
    # PD worker selection
    prefill_policy: str = "cache_aware"
    # PD decode worker selection; unset: power_of_two with 2+ decode workers, else round_robin
    decode_policy: str | None = None
    # seconds between worker health checks (with the threshold and fault_budget.router_health_check_timeout_s:
    # how long new requests keep going to a dead worker; pdkit/faultbudget.py)
    health_check_interval_secs: IntervalSeconds = 5
    # failed checks before a worker counts as unhealthy
    health_failure_threshold: int = Field(default=2, ge=1)
    # passed checks before an unhealthy worker gets traffic again (the routers' default, 2, keeps a
    # restarted engine idle for a whole extra interval after it is healthy)
    health_success_threshold: int = Field(default=1, ge=1)
    # seconds between the router's checks on a worker that is not up yet (its default, 30, delays readiness)
    worker_startup_check_interval_secs: IntervalSeconds = 5
    # seconds the router drains in-flight requests on stop (--shutdown-grace-period-secs; the routers'
    # own default, 180, is longer than a unit stop should take); the unit's TimeoutStopSec is set above it
    shutdown_grace_period_secs: IntervalSeconds = 60
    # engines it fronts, as "host/engine"; unset: every engine in the cluster
    workers: tuple[str, ...] | None = None
    # escape hatch: extra router flags
    extra_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _known_release(self) -> Router:
        if self.package is not None and self.version is not None:
            if (self.package, self.version) not in ROUTER_RELEASES:
                valid = ", ".join(f"{p} {v}" for p, v in ROUTER_RELEASES)
                raise ValueError(f"{self.package} {self.version} is not a pinned router; valid: {valid}")
        elif self.version is not None:
            raise ValueError("version given without package: name the package (smg or sglang-router) too")
        return self


@dataclass(frozen=True)
class ReceiverKind:
    """What a receiver kind needs: its own fields, and its credential (pdkit_cluster.secrets.alert_receivers)."""

    # Alertmanager's list under a receiver (`webhook_configs`, ...)
    configs_key: str
    # Receiver fields it must have / may have (beside name, kind, send_resolved)
    required: tuple[str, ...]
    optional: tuple[str, ...]
    # "required"; "optional"; or "with auth_username" (email: SMTP auth only when a user is set)
    credential: str
    # what the credential is, for errors and the docs
    credential_is: str


# The receiver kinds pdkit renders: the integrations Alertmanager 0.25 (Debian bookworm's) has
# natively AND can read their credential from a file (`*_file`, or http_config's
# `credentials_file`), so the secret sits only in a mode-0600 file and never in alertmanager.yml.
# 0.25 also has telegram, discord, pushover, sns and wechat, but reads their token only inline
# (checked with amtool 0.25: bot_token_file, webhook_url_file, token_file are unknown fields);
# reach those through a webhook bridge. The one table validation, rendering and docs read.
RECEIVER_KINDS: dict[str, ReceiverKind] = {
    "webhook": ReceiverKind("webhook_configs", ("url",), (), "optional", "a bearer token (sent as `Authorization: Bearer`)"),
    "email": ReceiverKind("email_configs", ("to", "from_address", "smarthost"), ("auth_username", "require_tls"), "with auth_username", "the SMTP password of auth_username"),
    "slack": ReceiverKind("slack_configs", (), ("channel",), "required", "the Slack incoming-webhook URL"),
    "pagerduty": ReceiverKind("pagerduty_configs", (), (), "required", "the PagerDuty Events API v2 routing (integration) key"),
    "opsgenie": ReceiverKind("opsgenie_configs", (), (), "required", "the Opsgenie API key"),
    "victorops": ReceiverKind("victorops_configs", ("routing_key",), (), "required", "the VictorOps (Splunk On-Call) API key"),
    "webex": ReceiverKind("webex_configs", ("room_id",), (), "required", "the Webex bot's access token"),
}
RECEIVER_FIELDS = ("url", "to", "from_address", "smarthost", "auth_username", "require_tls", "channel", "routing_key", "room_id")
# the receiver every alert goes to when none is configured: Alertmanager needs one; it notifies no one
NULL_RECEIVER = "pdkit-null"
# label names a route may match on (Prometheus' label name syntax)
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


class Receiver(Frozen):
    """One place alerts go (pdkit_monitoring.alerting.receivers[]): a kind and its fields; its credential is in the secrets table."""

    # the receiver's name: routes and pdkit_cluster.secrets.alert_receivers name it
    name: str = Field(pattern=NAME_PATTERN)
    # webhook, email, slack, pagerduty, opsgenie, victorops or webex (see RECEIVER_KINDS)
    kind: Literal["webhook", "email", "slack", "pagerduty", "opsgenie", "victorops", "webex"]
    # webhook: the URL Alertmanager POSTs to (http or https; Alertmanager 0.25 has no url_file, so no secret in it: use the credential)
    url: str | None = None
    # email: recipient address(es), comma separated
    to: str | None = None
    # email: sender address
    from_address: str | None = None
    # email: the SMTP server, host:port
    smarthost: str | None = None
    # email: SMTP user (its password is the credential)
    auth_username: str | None = None
    # email: STARTTLS required (Alertmanager's default: true)
    require_tls: bool | None = None
    # slack: channel (#name) or user (@name); unset: the webhook's own channel
    channel: str | None = None
    # victorops: the routing key
    routing_key: str | None = None
    # webex: the room id
    room_id: str | None = None
    # also notify when the alert resolves
    send_resolved: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL (Alertmanager's webhook POSTs to one)")
        return url

    @field_validator("smarthost")
    @classmethod
    def _host_port(cls, smarthost: str | None) -> str | None:
        if smarthost is not None and not re.fullmatch(r"[A-Za-z0-9_.\[\]:-]+:\d{1,5}", smarthost):
            raise ValueError(f"{smarthost!r} is not host:port (e.g. smtp.example.com:587)")
        return smarthost

    @model_validator(mode="after")
    def _fields_of_kind(self) -> Receiver:
        kind = RECEIVER_KINDS[self.kind]
        missing = [f for f in kind.required if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} receiver needs {', '.join(missing)} (required for {self.kind}: {', '.join(kind.required)}; optional: {', '.join(kind.optional) or 'none'})")
        stray = [f for f in RECEIVER_FIELDS if getattr(self, f) is not None and f not in kind.required + kind.optional]
        if stray:
            raise ValueError(f"{', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not a {self.kind} receiver's field; valid for {self.kind}: {', '.join(kind.required + kind.optional) or 'none besides name, kind, send_resolved'}")
        return self


def receiver_needs_credential(receiver: Receiver) -> bool | None:
    """True: must have a credential; None: may; False: must not (email without auth_username)."""
    rule = RECEIVER_KINDS[receiver.kind].credential
    if rule == "required":
        return True
    if rule == "with auth_username":
        return receiver.auth_username is not None or False
    return None


class AlertRoute(Frozen):
    """A route of pdkit_monitoring.alerting.routes: alerts whose labels equal MATCH go to RECEIVER."""

    # label: value, all must equal (e.g. {"role": "decode"} or {"alertname": "PdkitEngineWedged"})
    match: dict[str, str] = Field(min_length=1)
    # the receiver's name
    receiver: str

    @field_validator("match")
    @classmethod
    def _label_names(cls, match: dict[str, str]) -> dict[str, str]:
        for label in match:
            if not re.fullmatch(LABEL_NAME, label):
                raise ValueError(f"{label!r} is not a label name (letters, digits, _; not starting with a digit)")
        return match


class Alerting(Frozen):
    """`pdkit_monitoring.alerting`: where Alertmanager sends alerts (docs/monitoring.md, "Alertmanager")."""

    # where alerts go: each a kind (webhook, email, slack, pagerduty, opsgenie, victorops, webex) and its fields; none: alerts reach no one
    receivers: tuple[Receiver, ...] = ()
    # severity=critical alerts (pages) go here; unset: default_receiver
    critical_receiver: str | None = None
    # severity=warning alerts go here; unset: default_receiver
    warning_receiver: str | None = None
    # whatever no other route takes; unset: the first receiver
    default_receiver: str | None = None
    # routes tried before the severity routes, first match wins (e.g. {"match": {"role": "decode"}, "receiver": "decode-team"})
    routes: tuple[AlertRoute, ...] = ()
    # one notification per group: per alert per node, so a node's engines wedging together page once
    group_by: tuple[Annotated[str, Field(pattern=LABEL_NAME)], ...] = ("cluster", "alertname", "node")
    # how long a new group waits for more alerts before its first notification (Alertmanager's default)
    group_wait_s: Annotated[int, Field(ge=1), at_most(MAX_INTERVAL_S, "wait in seconds")] = 30
    # how long before a group's next notification about new or resolved alerts (Alertmanager's default)
    group_interval_s: Annotated[int, Field(ge=1), at_most(MAX_TIMEOUT_S, "interval in seconds")] = 300
    # how long before a still-firing group is sent again (Alertmanager's default: 4 h)
    repeat_interval_s: Annotated[int, Field(ge=1), at_most(7 * MAX_TIMEOUT_S, "interval in seconds")] = 14400

    @model_validator(mode="after")
    def _repeat_after_group(self) -> Alerting:
        if self.repeat_interval_s < self.group_interval_s:
            raise ValueError(f"repeat_interval_s ({self.repeat_interval_s}) is below group_interval_s ({self.group_interval_s}): a group is only re-sent at a group interval; give repeat_interval_s >= group_interval_s")
        return self

    def receiver_names(self) -> list[str]:
        return [r.name for r in self.receivers]

    def effective_default(self) -> str:
        """Where alerts no route takes go: default_receiver, the first receiver, or the null receiver."""
        return self.default_receiver or (self.receivers[0].name if self.receivers else NULL_RECEIVER)


class Monitoring(Frozen):
    """`pdkit_monitoring`: this host runs Prometheus (and Grafana)."""

    # Prometheus' port
    prometheus_port: Port = 9090
    # Grafana's port
    grafana_port: Port = 3000
    # Alertmanager's port (on this host, beside Prometheus)
    alertmanager_port: Port = 9093
    # where each alert's `runbook_url` points: this page (your hosted copy of the repository's
    # docs/monitoring.md) plus `#<alert name, lower case>`; the default is the repository-relative path
    runbook_base_url: str = Field(default="docs/monitoring.md", pattern=r"^(https?://\S+|[A-Za-z0-9_./-]+\.md)$")
    # seconds between scrapes
    scrape_interval_s: IntervalSeconds = 15
    # hosts to scrape; unset: every host in the inventory
    scrape_hosts: tuple[str, ...] | None = None
    # TTFT p99 SLO for the alert rule, seconds
    ttft_p99_slo_s: Annotated[float, Field(gt=0), at_most(600, "TTFT objective in seconds", "does it look like milliseconds? give seconds")] = 2.0
    # Grafana from its apt repository (off where that repository cannot be reached, e.g. the lab)
    grafana: bool = True
    # receivers, routing, grouping (Alertmanager on this host; docs/monitoring.md "Alertmanager")
    alerting: Alerting = Alerting()
    # lab only (every node `gpu: none`): the alert rules' clock runs this many times faster (1-6: a minute divides evenly), every `for` and rate window divided by it, so the lab sees an alert fire in seconds; 1: the real windows
    lab_alert_speedup: Annotated[int, Field(ge=1, le=6)] = 1


# Every host runs node_exporter on this port.
NODE_EXPORTER_PORT = 9100
# DCGM exporter's own default (9400) is pdkit-exporter's: DCGM moves one up.
DCGM_EXPORTER_PORT = 9401


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the inventory, said so that the user can fix it without reading code."""

    host: str
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.host}: {self.field}: {self.message}"


class SpecError(Exception):
    """The inventory has errors; `problems` lists every one of them."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class HostSpec(Frozen):
    name: str
    # the address pdkit and other hosts reach this host on
    address: str
    # pyinfra's ssh_port (None: the connector's default, 22; or not an SSH host)
    ssh_port: int | None = None
    groups: tuple[str, ...] = ()
    node: Node | None = None
    router: Router | None = None
    monitoring: Monitoring | None = None


@dataclass(frozen=True)
class Placement:
    """One engine process: ENGINE's rank RANK, running on HOST; HEAD declares it (rank 0)."""

    host: HostSpec
    engine: Engine
    rank: int
    head: HostSpec


class ClusterSpec(Frozen):
    """The whole validated cluster. Everything else in pdkit reads this."""

    cluster: Cluster
    hosts: tuple[HostSpec, ...]
    inventory: str = ""

    def _memo(self, name: str, source: object, build):
        """A lookup table built once per spec from SOURCE (one of its fields), built again when
        that field is another object (model_copy(update=...) copies the instance's __dict__)."""
        hit = self.__dict__.get(name)
        if hit is None or hit[0] is not source:
            hit = (source, build())
            self.__dict__[name] = hit
        return hit[1]

    @property
    def _by_name(self) -> dict[str, HostSpec]:
        def build() -> dict[str, HostSpec]:
            # the first host of each name, as the search it replaces found it (loader names are unique)
            out: dict[str, HostSpec] = {}
            for h in self.hosts:
                out.setdefault(h.name, h)
            return out

        return self._memo("_by_name_memo", self.hosts, build)

    def host(self, name: str) -> HostSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def check_limit(self, names) -> None:
        """Refuse a `--limit` that names a host the inventory lacks (pdkit roll, pdkit bench)."""
        known = [h.name for h in self.hosts]
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"--limit names unknown host(s) {unknown}; the inventory has {known}")

    @property
    def gpu_hosts(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.node is not None]

    @property
    def router_hosts(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.router is not None]

    @property
    def monitoring_hosts(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.monitoring is not None]

    def engines(self) -> list[tuple[HostSpec, Engine]]:
        """Every engine with the host that declares it (rank 0 of an engine spanning nodes: the
        one router worker, health, bench and scrape target of the engine)."""
        return [(h, e) for h in self.gpu_hosts for e in h.node.engines]  # type: ignore[union-attr]

    @cached_property
    def _placements(self) -> dict[str, list[Placement]]:
        # one pass over the engines: a host's ranks are looked up, never searched for (512 nodes)
        out: dict[str, list[Placement]] = {h.name: [] for h in self.hosts}
        names = {h.name: h for h in self.hosts}
        for head, engine in self.engines():
            for rank, name in enumerate(engine.nodes or (head.name,)):
                node = names.get(name)
                if rank == 0:
                    out[head.name].append(Placement(head, engine, 0, head))
                elif node is not None and node.node is not None and name != head.name:
                    out[name].append(Placement(node, engine, rank, head))
        return out

    def placements(self, host: HostSpec) -> list[Placement]:
        """Every engine process HOST runs: its own engines (rank 0) first, then the ranks it
        serves of engines declared on other hosts."""
        return self._placements.get(host.name, [])

    def engine_hosts(self, host: HostSpec, engine: Engine) -> list[HostSpec]:
        """The hosts an engine declared on HOST runs on, in rank order ([host] if it spans none)."""
        if not engine.nodes:
            return [host]
        names = self._by_name
        return [names[n] for n in engine.nodes if n in names]

    def engine_tuning(self, engine: Engine) -> Tuning:
        """Cluster `all`, then the role's, then the engine's own settings."""
        # merged once per engine (~17 lookups per engine in validate + render; the spec and its
        # engines are frozen): keyed by identity, the engine kept so that its id cannot be reused
        merged_for: dict[int, tuple[Engine, Tuning]] = self._memo("_tuning_memo", self.cluster, dict)
        hit = merged_for.get(id(engine))
        if hit is not None and hit[0] is engine:
            return hit[1]
        tuning = self.cluster.tuning
        merged = tuning.all.merged(getattr(tuning, engine.role)).merged(engine.tuning)
        merged_for[id(engine)] = (engine, merged)
        return merged

    def engine_model(self, engine: Engine) -> Model:
        return engine.model or self.cluster.model

    def engine_version(self, engine: Engine) -> str:
        return engine.sglang_version or self.cluster.sglang_version

    def engine_address(self, host: HostSpec) -> str:
        assert host.node is not None
        return host.node.address or host.address

    def router_release(self, host: HostSpec) -> tuple[str, str]:
        router = host.router
        assert router is not None
        if router.package is not None and router.version is not None:
            return router.package, router.version
        default = SGLANG_RELEASES[self.cluster.sglang_version].default_router
        if router.package is not None and router.package != default[0]:
            # a package without a version: the one pinned release of that package
            return next(k for k in ROUTER_RELEASES if k[0] == router.package)
        return default

    def router_decode_policy(self, host: HostSpec) -> str:
        """The decode policy: explicit, else power_of_two when there are 2+ decode workers to pick from."""
        assert host.router is not None
        if host.router.decode_policy is not None:
            return host.router.decode_policy
        decodes = [e for _, e in self.router_workers(host) if e.role == "decode"]
        return "power_of_two" if len(decodes) >= 2 else "round_robin"

    def router_workers(self, host: HostSpec) -> list[tuple[HostSpec, Engine]]:
        router = host.router
        assert router is not None
        engines = self.engines()
        if router.workers is None:
            return engines
        wanted = set(router.workers)
        return [(h, e) for h, e in engines if f"{h.name}/{e.name}" in wanted]

    def is_pd(self) -> bool:
        return any(e.role != "unified" for _, e in self.engines())


# ---------------------------------------------------------------------------
# Rules that need more than one section


def sglang_decode_graph_default_max_bs(gpus: GpuLayout, tp: int) -> int | None:
    """SGLang's memory-class default for the decode graph max batch (memory_hook.py), None if unknown."""
    if 90 <= gpus.memory_gib <= 160:
        return 256 if tp < 4 else 512
    if 35 <= gpus.memory_gib <= 60:
        return 32 if tp < 4 else 160
    return None


def decode_graph_required_bs(engine: Engine, target: int | None) -> int | None:
    """The batch one decode CUDA graph must cover for ENGINE to run TARGET concurrent requests
    inside graphs: ceil(target / DP ranks), where the DP ranks are the data-parallel replicas
    (dp) or the attention-DP ranks (attn_dp); None for a prefill engine or without a target.
    `pdkit validate` (cuda_graph_max_bs) and `pdkit doctor` (graph_buckets) both use it.

    Why per rank: each DP rank is a scheduler of its own and the data-parallel controller deals
    requests out among them (sglang/srt/managers/data_parallel_controller.py of 0.5.17 and 0.5.23:
    launch_dp_schedulers / launch_dp_attention_schedulers, round_robin_scheduler), and the decode
    graph runner compares the rank's own batch with its captured max_bs: the local batch_size, or
    with attention DP (require_mlp_tp_gather) the largest per-rank request count of the round
    (sglang/srt/model_executor/runner/decode_cuda_graph_runner.py can_run_graph: 0.5.17 line 526,
    `max(forward_batch.original_global_num_tokens_cpu)`; 0.5.23 line 845, `_max_dp_batch_size`),
    never the engine's total. Round robin deals TARGET requests ceil(target / ranks) at most to a rank.
    """
    if engine.role == "prefill" or target is None:
        return None
    ranks = max(engine.dp, engine.attn_dp or 1)
    return -(-target // ranks)


def effective_decode_graph_max_bs(spec: ClusterSpec, host: HostSpec, engine: Engine) -> int | None:
    """The largest decode batch that will run inside a CUDA graph, or None if graphs are off/unknown."""
    tuning = spec.engine_tuning(engine)
    if engine.role == "prefill" or not tuning.value("cuda_graph"):
        return None
    if tuning.cuda_graph_bs:
        max_bs: int | None = max(tuning.cuda_graph_bs)
    elif tuning.cuda_graph_max_bs is not None:
        max_bs = tuning.cuda_graph_max_bs
    else:
        assert host.node is not None
        max_bs = sglang_decode_graph_default_max_bs(host.node.gpus, engine.tp_size)
    if max_bs is not None and tuning.max_running_requests is not None:
        max_bs = min(max_bs, tuning.max_running_requests)
    return max_bs


# what the engines sharing a GPU may take together: the rest is CUDA contexts, graphs, activations
MAX_SHARED_GPU_FRACTION = 0.9


def gpu_share_group(host: HostSpec, engine: Engine) -> list[Engine]:
    """The engines of HOST that share ENGINE's GPUs, in declaration (= start) order; [] if none."""
    assert host.node is not None
    group = [e for e in host.node.engines if e.gpu_share is not None and e.gpus == engine.gpus]
    return group if engine.gpu_share is not None and len(group) > 1 else []


def shared_gpu_mem_fraction(host: HostSpec, engine: Engine) -> float | None:
    """--mem-fraction-static for an engine on shared GPUs, or None.

    SGLang counts the fraction against the memory free when the engine starts, not the GPU's
    total: its KV budget is the free memory minus `pre_model_load_memory * (1 - fraction)`
    (sglang/srt/mem_cache/kv_cache_configurator.py `_profile_available_bytes`, 0.5.17 and
    0.5.23). Engines sharing a GPU start one after another, so engine k finds about
    total x (1 - share_0 - ... - share_k-1) free, and share_k of the total is
    share_k / (1 - the earlier shares) of that. Measured on one H200 (docs/gpu.md).
    """
    group = gpu_share_group(host, engine)
    if not group:
        return None
    index = [e.name for e in group].index(engine.name)
    earlier = sum(e.gpu_share for e in group[:index])  # type: ignore[misc]
    return round(engine.gpu_share / (1 - earlier), 4)  # type: ignore[operator]


def shared_gpu_predecessor(host: HostSpec, engine: Engine) -> Engine | None:
    """The engine that must be serving before ENGINE starts (the one before it on its shared GPUs)."""
    group = gpu_share_group(host, engine)
    index = [e.name for e in group].index(engine.name) if group else 0
    return group[index - 1] if index > 0 else None


def engine_numa_node(host: HostSpec, engine: Engine) -> int | None:
    """The NUMA node an engine is bound to: explicit, else the one all of its GPUs share."""
    if engine.numa_node is not None:
        return engine.numa_node
    assert host.node is not None
    numa = host.node.gpus.numa
    if numa is None or any(g >= len(numa) for g in engine.gpus):
        return None
    nodes = {numa[g] for g in engine.gpus}
    return nodes.pop() if len(nodes) == 1 else None


def custom_all_reduce_enabled(spec: ClusterSpec, host: HostSpec, engine: Engine) -> bool:
    """auto: off at TP 2 on sm_12x (custom all-reduce crashed at graph capture) and with P2P off."""
    setting = spec.engine_tuning(engine).value("custom_all_reduce")
    if setting != "auto":
        return setting == "on"
    assert host.node is not None
    if host.node.nccl_profile == "pcie-p2p-off":
        return False
    return not (engine.tp_size == 2 and host.node.gpus.sm_major == 12)


def dcgm_enabled(host: HostSpec) -> bool:
    """Whether a host runs the DCGM exporter: `Node.dcgm_exporter` when set, else on for real
    NVIDIA nodes (`gpu: nvidia`), never on lab hosts (`gpu: none`)."""
    node = host.node
    if node is None:
        return False
    if node.dcgm_exporter is not None:
        return node.dcgm_exporter
    return node.gpu == "nvidia"


def host_ports(spec: ClusterSpec, host: HostSpec) -> list[tuple[int, str]]:
    """Every port a host's services listen on, with the field that sets it."""
    ports: list[tuple[int, str]] = [(NODE_EXPORTER_PORT, "node_exporter (fixed)")]
    if host.node is not None:
        ports.append((host.node.exporter_port, "pdkit_node.exporter_port"))
        if dcgm_enabled(host):
            ports.append((DCGM_EXPORTER_PORT, "pdkit_node.dcgm_exporter (port 9401)"))
        for i, engine in enumerate(host.node.engines):
            ports.append((engine.port, f"pdkit_node.engines[{i}].port"))
            if engine.effective_bootstrap_port is not None:
                ports.append((engine.effective_bootstrap_port, f"pdkit_node.engines[{i}].bootstrap_port"))
            for port in dist_init_ports(engine):
                ports.append((port, f"pdkit_node.engines[{i}].dist_init_port" + ("" if port == engine.dist_init_port else f" (+{port - engine.dist_init_port}: SGLang's attention-DP ports)")))
    if host.router is not None:
        ports.append((host.router.port, "pdkit_router.port"))
        ports.append((host.router.prometheus_port, "pdkit_router.prometheus_port"))
    if host.monitoring is not None:
        ports.append((host.monitoring.prometheus_port, "pdkit_monitoring.prometheus_port"))
        ports.append((host.monitoring.alertmanager_port, "pdkit_monitoring.alertmanager_port"))
        if host.monitoring.grafana:  # off: nothing listens there, so it cannot clash
            ports.append((host.monitoring.grafana_port, "pdkit_monitoring.grafana_port"))
    return ports


def pairing_sets(spec: ClusterSpec) -> list[tuple[str, list[tuple[HostSpec, Engine]]]]:
    """Every set of engines among which any prefill may be paired with any decode: each
    router's PD workers (the router picks both at random or by policy), and each pd_group."""
    sets: list[tuple[str, list[tuple[HostSpec, Engine]]]] = []
    for host in spec.router_hosts:
        workers = [(h, e) for h, e in spec.router_workers(host) if e.role != "unified"]
        if workers:
            sets.append((f"the router on {host.name}", workers))
    groups: dict[str, list[tuple[HostSpec, Engine]]] = {}
    for host, engine in spec.engines():
        if engine.role != "unified":
            groups.setdefault(engine.pd_group, []).append((host, engine))
    sets += [(f"PD group {name!r}", members) for name, members in groups.items()]
    return sets


def prefill_kv_paths(spec: ClusterSpec) -> dict[tuple[str, str], tuple[tuple[str, KvPath], ...]]:
    """(prefill host, prefill engine) -> ((decode host, path), ...): the KV path to every host holding a decode
    the prefill may hand KV to (any decode of a pairing set it is in: pdkit.spec.pairing_sets), one per decode
    host, by kv_path with the prefill node's ucx_net_devices. doctor's kv_path row and the
    PdkitKvHandoffSlow alert read the same paths."""
    out: dict[tuple[str, str], dict[str, KvPath]] = {}
    for _label, members in pairing_sets(spec):
        decode_hosts = [h.name for h, e in members if e.role == "decode"]
        for host, engine in members:
            if engine.role != "prefill":
                continue
            devices = host.node.ucx_net_devices if host.node is not None else None
            slot = out.setdefault((host.name, engine.name), {})
            for d in decode_hosts:
                slot.setdefault(d, kv_path(host.name, d, devices))
    return {k: tuple(sorted(v.items())) for k, v in out.items()}


_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def address_problem(address: str) -> str | None:
    """Why `address` is neither an IP address nor a DNS host name (RFC 1123), or None."""
    import ipaddress

    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    labels = address.rstrip(".").split(".")
    if len(address) <= 253 and all(_HOSTNAME_LABEL.match(label) for label in labels) and not labels[-1].isdigit():
        return None
    return f"{address!r} is neither an IP address nor a host name: give e.g. 10.0.0.12 or gpu01.example.net"


def local_only(address: str) -> str | None:
    """What `address` is when no other host can reach a service on it (else None): the
    wildcard 0.0.0.0 / ::, loopback, or a pyinfra connector name such as @local."""
    import ipaddress

    if address.startswith("@"):
        return f"the pyinfra connector {address}"
    if address.lower() in ("localhost", "localhost.localdomain"):
        return "loopback"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_unspecified:
        return "the wildcard address"
    if ip.is_loopback:
        return "loopback"
    return None


def _address_field(host: HostSpec, kind: str) -> str:
    """The field that sets the address a service of `host` is reached on."""
    if kind == "engine" and host.node is not None and host.node.address is not None:
        return "pdkit_node.address"
    if kind == "router" and host.router is not None and host.router.address is not None:
        return "pdkit_router.address"
    return "ssh_hostname"


def _router_address(host: HostSpec) -> str:
    """pdkit.flags.router_address without importing flags (it imports this module)."""
    assert host.router is not None
    return host.router.address or host.address


# Which address a service listens on: an engine's (pdkit_node.address, else ssh_hostname), the
# router's (pdkit_router.address, else ssh_hostname) or the host's own (ssh_hostname).
SERVICE_ADDRESS = {
    "engine": lambda spec, host: spec.engine_address(host),
    "router": lambda spec, host: _router_address(host),
    "host": lambda spec, host: host.address,
}


def _router_clients(spec: ClusterSpec):
    for router_host in spec.router_hosts:
        for h in {h.name: h for h, _ in spec.router_workers(router_host)}.values():
            yield h, router_host.name, f"the router on {router_host.name} connects to this node's engines"


def _pd_peer_clients(spec: ClusterSpec):
    for label, members in pairing_sets(spec):
        hosts = {h.name: h for h, e in members}
        if len(hosts) < 2:
            continue  # no other host reaches these engines
        # the first 3 other hosts by name, from one sort of the set (not one per host: 512 nodes)
        first = sorted(hosts)[:4]
        for h in hosts.values():
            others = [n for n in first if n != h.name][:3]
            yield h, others[0], f"{label} pairs its PD engines with engines on {', '.join(others)}, which reach it for the KV transfer (bootstrap port, NIXL/Mooncake)"


def _dist_init_clients(spec: ClusterSpec):
    for host, engine in spec.engines():
        nodes = list(engine.nodes or ())
        if len(set(nodes)) >= 2 and nodes[0] == host.name:
            yield host, nodes[1], f"the other ranks of {engine.name} ({', '.join(nodes[1:])}) connect to rank 0 there (--dist-init-addr)"


def _scrape_clients(has_service):
    """Prometheus on each monitoring host scrapes the service on every scraped host that has it."""
    def clients(spec: ClusterSpec):
        by_name = {x.name: x for x in spec.hosts}
        for mon in spec.monitoring_hosts:
            assert mon.monitoring is not None
            for name in mon.monitoring.scrape_hosts or tuple(by_name):
                h = by_name.get(name)
                if h is not None and has_service(h):
                    yield h, mon.name, f"Prometheus on {mon.name} scrapes it there"
    return clients


def _alertmanager_clients(spec: ClusterSpec):
    for am in spec.monitoring_hosts:
        for mon in spec.monitoring_hosts:
            yield am, mon.name, f"Prometheus on {mon.name} sends its alerts to this host's Alertmanager"


@dataclass(frozen=True)
class CrossHostService:
    """One service of a host that another host connects to: the rule (README, "Errors") refuses
    loopback, the wildcard and pyinfra connectors (@local) as its address when a client is
    another host."""

    service: str
    # which address it listens on: a key of SERVICE_ADDRESS
    address: Literal["engine", "router", "host"]
    # who connects: (the service's host, a client host's name, why) for each connection
    clients: object


# Every address one host of the cluster uses to reach another. A new service another host
# connects to belongs here; tests/test_validate_addresses.py fails when a rendered cross-host
# target (prometheus.yml, the router's workers, --dist-init-addr, Alertmanager) is not covered.
# Not here: the router's HTTP port (clients are outside the cluster), Prometheus and Grafana
# (only the monitoring host itself reaches them).
CROSS_HOST_SERVICES: tuple[CrossHostService, ...] = (
    CrossHostService("engine HTTP (router worker)", "engine", _router_clients),
    CrossHostService("engine bootstrap port and KV transfer", "engine", _pd_peer_clients),
    CrossHostService("dist-init (rank 0 of an engine spanning nodes)", "engine", _dist_init_clients),
    CrossHostService("engine /metrics", "engine", _scrape_clients(lambda h: h.node is not None and bool(h.node.engines))),
    CrossHostService("pdkit-exporter", "engine", _scrape_clients(lambda h: h.node is not None)),
    CrossHostService("DCGM exporter", "engine", _scrape_clients(lambda h: dcgm_enabled(h))),
    CrossHostService("router metrics (prometheus_port)", "router", _scrape_clients(lambda h: h.router is not None)),
    CrossHostService("node_exporter", "host", _scrape_clients(lambda h: True)),
    # one monitoring host today (loader refuses a second), so no other host reaches it yet
    CrossHostService("Alertmanager", "host", _alertmanager_clients),
)


def cross_host_connections(spec: ClusterSpec) -> list[tuple[HostSpec, str, str, str, str]]:
    """(host, address, field, client, why) for each service of CROSS_HOST_SERVICES a host other
    than its own connects to."""
    out = []
    for service in CROSS_HOST_SERVICES:
        for host, client, why in service.clients(spec):  # type: ignore[operator]
            if client != host.name:
                out.append((host, SERVICE_ADDRESS[service.address](spec, host), _address_field(host, service.address), client, why))
    return out



@dataclass(frozen=True)
class IgnoredByMode:
    """Fields the kit ignores in one mode: set anyway, they warn (errors under --strict)."""

    mode: str
    # whether the mode holds: called (spec, host) per GPU host for pdkit_node fields, (spec, None) once for pdkit_cluster fields
    applies: object
    # paths of fields ("pdkit_node.<field>" or "pdkit_cluster.<field>[.<field>]"), ignored in that mode
    fields: tuple[str, ...]
    # why, in one line, with where the code skips them
    why: str


# Per mode, every field the kit then ignores (issue 32, class 4). A field counts as set when the
# inventory gives it, even at its default value. Modes with nothing listed here:
# - a node's own engine environment (pdkit_node.engine_venv): flags, env files and the preflight
#   still read every node field (engine_venv without engines: _check_engine_venv warns);
# - spanning: dist_init_port on an engine that spans no nodes is already an error
#   (parallel_problems); nccl_net / nccl_ib_hca / nic on a node without a spanning engine are
#   rendered into nccl.env (pdkit/flags.py nccl_env, tests/golden/multinode/gpu-p0) and read by
#   NCCL at init, so the kit does not ignore them;
# - the router's policies in or out of PD mode and role-only tuning: ignored_settings and the
#   router checks in cross_checks warn about them already.
# Under the sim the NCCL/UCX settings a spanning engine or a cross-host PD pair needs are still
# required (the rehearsal renders the same files as the real cluster), so only what no check
# requires is listed for it.
IGNORED_BY_MODE: tuple[IgnoredByMode, ...] = (
    IgnoredByMode(
        "nvidia_stack: provided",
        lambda spec, host: host.node.gpu == "nvidia" and host.node.nvidia_stack == "provided",
        ("pdkit_node.driver_modules", "pdkit_node.reboot"),
        "the machine brings the NVIDIA stack: the node layer installs no driver and reboots nothing (roles/node.py installs_nvidia_stack; only roles/nvidia_driver.py acts on them)"),
    IgnoredByMode(
        "gpu: none",
        lambda spec, host: host.node.gpu == "none",
        ("pdkit_node.nvidia_stack", "pdkit_node.driver_modules", "pdkit_node.reboot"),
        "a host without NVIDIA GPUs gets no NVIDIA stack and no driver checks (roles/node.py installs_nvidia_stack; pdkit/preflight.py returns before the driver checks)"),
    IgnoredByMode(
        "pdkit_cluster.engine: sim",
        lambda spec, host: spec.cluster.engine == "sim",
        ("pdkit_node.nccl_p2p_level",),
        "the sim runs no NCCL: NCCL_P2P_LEVEL is rendered but nothing reads it (pdkit/sim/ reads no NCCL variable)"),
    IgnoredByMode(
        "pdkit_cluster.engine: sim",
        lambda spec, host: spec.cluster.engine == "sim",
        ("pdkit_cluster.model.trust_remote_code",),
        "the sim parses --trust-remote-code and loads no model code (pdkit/sim/args.py)"),
    IgnoredByMode(
        "no PD engine on the node, or a transfer backend other than nixl",
        lambda spec, host: spec.cluster.transfer_backend != "nixl" or all(p.engine.role == "unified" for p in spec.placements(host)),
        ("pdkit_node.ucx_net_devices",),
        "UCX_NET_DEVICES is rendered only for NIXL KV transfer on a node that runs prefill or decode engines (pdkit/flags.py ucx_env)"),
    IgnoredByMode(
        "unified only: no PD engine in the cluster",
        lambda spec, host: bool(spec.engines()) and all(e.role == "unified" for _, e in spec.engines()),
        ("pdkit_cluster.transfer_backend",),
        "--disaggregation-transfer-backend is given only to prefill and decode engines (pdkit/flags.py engine_args)"),
)


def _field_is_set(spec: ClusterSpec, host: HostSpec | None, path: str) -> bool:
    section, *names = path.split(".")
    model: object = spec.cluster if section == "pdkit_cluster" else (host.node if host is not None else None)
    for name in names:
        if not isinstance(model, BaseModel) or name not in model.model_fields_set:
            return False
        model = getattr(model, name)
    return True


def ignored_by_mode_problems(spec: ClusterSpec) -> list[Problem]:
    """A warning for each field IGNORED_BY_MODE says the mode at hand ignores, where it is set."""
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for row in IGNORED_BY_MODE:
        for path in row.fields:
            scopes = [None] if path.startswith("pdkit_cluster.") else spec.gpu_hosts
            for host in scopes:
                name = "<inventory>" if host is None else host.name
                if (name, path) in seen or not _field_is_set(spec, host, path) or not row.applies(spec, host):  # type: ignore[operator]
                    continue
                seen.add((name, path))
                out.append(Problem(name, path, f"ignored ({row.mode}): {row.why}; remove {path.rsplit('.', 1)[1]}", "warning"))
    return out


def _check_addresses(spec: ClusterSpec, add) -> None:
    """Valid addresses; no loopback or wildcard where another host must connect; one SSH
    target per host; ports unique per address (two hosts on one address are one machine)."""
    for host in spec.hosts:
        for field, value in (("pdkit_node.address", host.node.address if host.node else None),
                             ("pdkit_router.address", host.router.address if host.router else None)):
            if value is not None and (problem := address_problem(value)):
                add(Problem(host.name, field, problem))

    refused: set[tuple[str, str]] = set()
    for host, address, field, _client, why in cross_host_connections(spec):
        what = local_only(address)
        if what and (host.name, field) not in refused:
            refused.add((host.name, field))
            add(Problem(host.name, field, f"{address} is {what}, but {why}: give an address the other host can reach (its LAN IP or DNS name)"))

    targets: dict[tuple[str, int], str] = {}
    for host in spec.hosts:
        if host.address.startswith("@"):
            continue
        target = (host.address, host.ssh_port or 22)
        if target in targets:
            add(Problem(host.name, "ssh_hostname", f"{target[0]} port {target[1]} is already the SSH target of {targets[target]}: pyinfra would deploy both hosts onto one machine; give each host its own ssh_hostname (or ssh_port)"))
        else:
            targets[target] = host.name

    on_address: dict[tuple[str, int], tuple[str, str]] = {}
    for host in spec.hosts:
        addresses = {host.address}
        if host.node is not None:
            addresses.add(spec.engine_address(host))
        for port, field in host_ports(spec, host):
            for address in sorted(addresses):
                if local_only(address):
                    continue  # loopback is per machine: the per-host check covers it
                owner = on_address.setdefault((address, port), (host.name, field))
                if owner[0] != host.name:
                    add(Problem(host.name, field, f"port {port} on {address} is already used by {owner[0]}'s {owner[1]} ({host.name} and {owner[0]} share the address {address}); ports must be unique per address"))


def alerting_problems(host: HostSpec, secrets: Secrets) -> list[Problem]:
    """pdkit_monitoring.alerting against itself and the secrets table: names, routes, credentials."""
    assert host.monitoring is not None
    alerting = host.monitoring.alerting
    out: list[Problem] = []
    at = "pdkit_monitoring.alerting"
    names: dict[str, int] = {}
    for i, receiver in enumerate(alerting.receivers):
        if receiver.name in names:
            out.append(Problem(host.name, f"{at}.receivers[{i}].name", f"receiver name {receiver.name!r} is already used by receivers[{names[receiver.name]}]; names must be unique"))
        names.setdefault(receiver.name, i)
    if not alerting.receivers:
        out.append(Problem(host.name, f"{at}.receivers", f"no receiver: Alertmanager sends every alert to {NULL_RECEIVER!r}, so alerts reach no one (they show only on its and Prometheus' alert pages); add a receiver (README, \"Alerts: adding a receiver\")", "warning"))
    valid = ", ".join(names) or f"none (no receiver is declared: add one to {at}.receivers)"
    named = [(f"{at}.{field}", getattr(alerting, field)) for field in ("default_receiver", "critical_receiver", "warning_receiver")]
    named += [(f"{at}.routes[{i}].receiver", route.receiver) for i, route in enumerate(alerting.routes)]
    for field, name in named:
        if name is not None and name not in names:
            out.append(Problem(host.name, field, f"{name!r} is not a receiver; valid: {valid}"))
    creds = secrets.alert_receivers
    secret_at = "pdkit_cluster.secrets.alert_receivers"
    for i, receiver in enumerate(alerting.receivers):
        need = receiver_needs_credential(receiver)
        what = RECEIVER_KINDS[receiver.kind].credential_is
        if need and receiver.name not in creds:
            out.append(Problem(host.name, f"{secret_at}.{receiver.name}", f"receiver {receiver.name!r} ({at}.receivers[{i}], {receiver.kind}) needs its credential, {what}: set {secret_at} = {{{receiver.name!r}: ...}} (never inline in the receiver)"))
        if need is False and receiver.name in creds:
            out.append(Problem(host.name, f"{secret_at}.{receiver.name}", f"receiver {receiver.name!r} (email) has no auth_username, so its SMTP password would never be sent: set auth_username, or remove the credential"))
    for name in creds:
        if name not in names:
            out.append(Problem(host.name, f"{secret_at}.{name}", f"no receiver is named {name!r}, so this credential is unused; receivers: {valid}", "warning"))
    return out


# What each secret can hold, from what reads it (issue 32 class 3). Measured against the pinned
# programs (never printing a value back: a Problem names the secret, never its value):
# - smg 1.13.0 (the router): an empty --api-key stops it at start ("an empty credential would
#   switch authentication on with a key nothing can present"), and pdkit's router launcher
#   (templates/router-launch.py.j2) exits on an empty key; a key with leading or trailing
#   whitespace is answered 401 however a client sends it (the launcher strips the key file, HTTP
#   trims the header), as is a key with a line break or any non-ASCII character (sent as UTF-8 or
#   Latin-1); spaces and tabs inside the key work. pdkit's own clients (Python's http.client)
#   refuse a header value with a line break ("Invalid header value").
# - Alertmanager 0.25 (receiver credentials, read from *_file): strips the file's surrounding
#   whitespace, so an empty or blank credential is sent as nothing ("Authorization: Bearer"), and
#   a line break inside fails every notification ("net/http: invalid header field value").
# - HF_TOKEN: an empty one authenticates nothing; requests (in the engines' environment) refuses a
#   header value with a line break ("InvalidHeader").
def _blank(value: str) -> bool:
    return not value.strip()


def _control_chars(value: str) -> list[str]:
    """The control characters in VALUE, named (never the value itself); a tab is allowed."""
    names = {"\n": "a line break (\\n)", "\r": "a carriage return (\\r)", "\x00": "a NUL byte"}
    return sorted({names.get(c, f"control character U+{ord(c):04X}") for c in value if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F})


def secret_problems(spec: ClusterSpec) -> list[Problem]:
    """Secrets whose value cannot work where pdkit hands it: blank ones, and ones the reader
    (the chosen router package, Alertmanager, the engines' hub client) cannot take."""
    out: list[Problem] = []
    secrets = spec.cluster.secrets
    at = "pdkit_cluster.secrets"
    blank_hint = "an empty value usually means the environment variable the inventory reads it from is unset"
    fallback = spec.hosts[0].name if spec.hosts else "<inventory>"
    if secrets.hf_token is not None:
        host = spec.gpu_hosts[0].name if spec.gpu_hosts else fallback
        value = secrets.hf_token.get_secret_value()
        if _blank(value):
            out.append(Problem(host, f"{at}.hf_token", f"is empty or only whitespace, so the engines would reach the hub without a token ({blank_hint}): set the token (hf_...), or remove hf_token"))
        elif bad := _control_chars(value):
            out.append(Problem(host, f"{at}.hf_token", f"contains {', '.join(bad)}: the token goes into an HTTP header, which cannot carry it (requests refuses it); give the token alone on one line, e.g. hf_AbC123..."))
    if secrets.router_api_key is not None:
        hosts = spec.router_hosts
        smg = [h for h in hosts if spec.router_release(h)[0] == "smg"]
        host = (smg or hosts)[0].name if hosts else fallback
        value = secrets.router_api_key.get_secret_value()
        valid = "valid: printable ASCII without surrounding whitespace, e.g. the output of `openssl rand -hex 32`"
        if _blank(value):
            out.append(Problem(host, f"{at}.router_api_key", f"is empty or only whitespace: the router refuses to start with it (smg: 'an empty credential would switch authentication on with a key nothing can present'; pdkit's launcher: 'credential ... is empty') ({blank_hint}); set a key, or remove router_api_key; {valid}"))
        elif bad := _control_chars(value):
            out.append(Problem(host, f"{at}.router_api_key", f"contains {', '.join(bad)}: no client can present it (an HTTP header cannot carry it, and smg answers 401); {valid}"))
        elif value != value.strip():
            out.append(Problem(host, f"{at}.router_api_key", f"has leading or trailing whitespace: smg answers 401 to such a key however a client sends it (HTTP trims the header; pdkit's launcher strips the key file): remove the whitespace; {valid}"))
        elif not value.isascii():
            out.append(Problem(host, f"{at}.router_api_key", f"contains non-ASCII characters: smg never matches such a key (401 whether it is sent as UTF-8 or Latin-1) and pdkit's clients cannot send most of them; {valid}"))
    mon = spec.monitoring_hosts[0].name if spec.monitoring_hosts else fallback
    for name, secret in secrets.alert_receivers.items():
        value = secret.get_secret_value()
        field = f"{at}.alert_receivers.{name}"
        if _blank(value):
            out.append(Problem(mon, field, f"is empty or only whitespace: Alertmanager would send receiver {name!r} no credential (a service that needs one refuses every notification) ({blank_hint}); set the credential, or remove it"))
        elif bad := _control_chars(value.strip()):
            out.append(Problem(mon, field, f"contains {', '.join(bad)} inside the value: Alertmanager fails every notification with it ('invalid header field value'); give the credential alone on one line"))
    return out


def cross_checks(spec: ClusterSpec) -> list[Problem]:
    """Rules across sections and hosts. Returns every problem, errors and warnings."""
    problems: list[Problem] = []
    add = problems.append
    cluster = spec.cluster

    if not spec.gpu_hosts:
        add(Problem("<inventory>", "pdkit_node", "no host declares pdkit_node: a cluster needs at least one GPU node"))
    if spec.gpu_hosts and not spec.engines():
        add(Problem("<inventory>", "pdkit_node.engines", "no GPU node declares an engine: give at least one pdkit_node.engines entry (e.g. a prefill and a decode)"))
    if not spec.router_hosts and spec.gpu_hosts:
        add(Problem("<inventory>", "pdkit_router", "no host declares pdkit_router: name the host that runs the router"))

    for host in spec.gpu_hosts:
        node = host.node
        assert node is not None
        names: dict[str, int] = {}
        used_gpus: dict[int, str] = {}
        for i, engine in enumerate(node.engines):
            at = f"pdkit_node.engines[{i}]"
            if engine.name in names:
                add(Problem(host.name, f"{at}.name", f"engine name {engine.name!r} is already used by engines[{names[engine.name]}]; names must be unique on a node"))
            names.setdefault(engine.name, i)
            for gpu in engine.gpus:
                if gpu >= node.gpus.count:
                    add(Problem(host.name, f"{at}.gpus", f"GPU {gpu} does not exist: the node declares {node.gpus.count} GPUs (valid indices 0-{node.gpus.count - 1})"))
                elif gpu in used_gpus and (engine.gpu_share is None or node.engine(used_gpus[gpu]).gpu_share is None):
                    add(Problem(host.name, f"{at}.gpus", f"GPU {gpu} is already used by engine {used_gpus[gpu]!r}; engines may share a GPU only when each sets gpu_share (its share of the GPU's memory, e.g. 0.4 and 0.45)"))
                elif gpu in used_gpus and node.engine(used_gpus[gpu]).gpus != engine.gpus:
                    add(Problem(host.name, f"{at}.gpus", f"shares GPU {gpu} with engine {used_gpus[gpu]!r} but their GPU lists differ ({list(engine.gpus)} vs {list(node.engine(used_gpus[gpu]).gpus)}); engines that share GPUs must list the same GPUs"))
                else:
                    used_gpus.setdefault(gpu, engine.name)
            if engine.gpu_share is not None:
                group = gpu_share_group(host, engine)
                if not group:
                    add(Problem(host.name, f"{at}.gpu_share", f"gpu_share is for engines that share their GPUs, but no other engine on {host.name} lists GPUs {list(engine.gpus)} with a gpu_share; remove it (use tuning.mem_fraction_static for an engine alone on its GPUs)"))
                elif spec.engine_tuning(engine).mem_fraction_static is not None:
                    add(Problem(host.name, f"{at}.tuning.mem_fraction_static", "an engine on shared GPUs gets --mem-fraction-static from the gpu_share of the engines started before it (pdkit.spec.shared_gpu_mem_fraction); remove mem_fraction_static from its tuning layers (all / role / engine)"))
                elif group[-1].name == engine.name and sum(e.gpu_share for e in group) > MAX_SHARED_GPU_FRACTION:  # type: ignore[misc]
                    total = sum(e.gpu_share for e in group)  # type: ignore[misc]
                    add(Problem(host.name, f"{at}.gpu_share", f"the engines sharing GPUs {list(engine.gpus)} ({', '.join(e.name for e in group)}) take {total:.2f} of their memory together; at most {MAX_SHARED_GPU_FRACTION} leaves room for CUDA contexts, graphs and activations"))
            if engine.pp == 1 and not engine.spans_nodes and engine.tp_size * engine.dp != len(engine.gpus):
                add(Problem(host.name, f"{at}.tp", f"tp {engine.tp_size} x dp {engine.dp} = {engine.tp_size * engine.dp} but the engine has {len(engine.gpus)} GPUs {list(engine.gpus)}; tp x dp must equal the GPU count"))
            for field, why in parallel_problems(spec, engine) + startup_check_problems(spec, engine, node):
                add(Problem(host.name, field if field.startswith("pdkit_cluster") else f"{at}.{field}", why))
            if engine.bootstrap_port is not None and engine.role != "prefill":
                add(Problem(host.name, f"{at}.bootstrap_port", f"only prefill engines serve a bootstrap port; this engine's role is {engine.role!r} (remove bootstrap_port)"))
            numa = node.gpus.numa
            if engine.numa_node is not None and numa is not None:
                gpu_nodes = {numa[g] for g in engine.gpus if g < len(numa)}
                if gpu_nodes and gpu_nodes != {engine.numa_node}:
                    add(Problem(host.name, f"{at}.numa_node", f"numa_node {engine.numa_node} but its GPUs {list(engine.gpus)} sit on NUMA node(s) {sorted(gpu_nodes)}; bind to the GPUs' NUMA node"))
            elif engine.numa_node is None and numa is not None and engine_numa_node(host, engine) is None and all(g < len(numa) for g in engine.gpus):
                add(Problem(host.name, f"{at}.gpus", f"GPUs {list(engine.gpus)} span NUMA nodes {sorted({numa[g] for g in engine.gpus})}: the engine is not NUMA-bound (cross-NUMA TP runs over the inter-socket link)", "warning"))
            _check_engine_tuning(spec, host, engine, at, add)

        if node.numa_nodes is not None:
            for i, n in enumerate(node.gpus.numa or ()):
                if n >= node.numa_nodes:
                    add(Problem(host.name, f"pdkit_node.gpus.numa[{i}]", f"NUMA node {n} does not exist: the node declares numa_nodes {node.numa_nodes} (valid ids 0-{node.numa_nodes - 1})"))
            for i, engine in enumerate(node.engines):
                if engine.numa_node is not None and engine.numa_node >= node.numa_nodes:
                    add(Problem(host.name, f"pdkit_node.engines[{i}].numa_node", f"NUMA node {engine.numa_node} does not exist: the node declares numa_nodes {node.numa_nodes} (valid ids 0-{node.numa_nodes - 1})"))
        if node.nccl_p2p_level is not None and node.nccl_profile != "pcie":
            add(Problem(host.name, "pdkit_node.nccl_p2p_level", f"nccl_p2p_level is only used by the 'pcie' NCCL profile; this node's profile is {node.nccl_profile!r} (remove nccl_p2p_level or set nccl_profile: pcie)"))
        if node.nccl_profile == "pcie-p2p-off":
            for i, engine in enumerate(node.engines):
                if spec.engine_tuning(engine).custom_all_reduce == "on":
                    add(Problem(host.name, f"pdkit_node.engines[{i}].tuning.custom_all_reduce", "custom all-reduce needs GPU peer-to-peer, but the 'pcie-p2p-off' profile disables it (NCCL_P2P_DISABLE=1): use 'auto' or 'off'"))
        if node.gpu == "nvidia" and node.gpus.sm_major >= 10 and node.nccl_profile == "default" and node.gpus.count > 1:
            add(Problem(host.name, "pdkit_node.nccl_profile", "Blackwell node with the default NCCL profile: on PCIe-only nodes choose 'pcie' (NCCL's default P2P level falls back to host memory across root complexes)", "warning"))
        if node.engine_venv is not None:
            _check_engine_venv(spec, host, add)

    for host in spec.hosts:
        seen: dict[int, str] = {}
        for port, field in host_ports(spec, host):
            if port < 1024:
                add(Problem(host.name, field, f"port {port} is privileged: pdkit's services run as {cluster.service_user} and no unit grants CAP_NET_BIND_SERVICE; use a port from 1024 to 65535"))
            if port in seen:
                add(Problem(host.name, field, f"port {port} is already used by {seen[port]}; every port on a host must be unique"))
            else:
                seen[port] = field

    _check_spanning(spec, add)
    _check_model_visibility(spec, add)
    _check_pd_groups(spec, add)
    _check_kv_over_tcp(spec, add)
    _check_addresses(spec, add)
    problems += ignored_by_mode_problems(spec)

    declared = {f"{h.name}/{e.name}" for h, e in spec.engines()}
    for host in spec.router_hosts:
        router = host.router
        assert router is not None
        for i, ref in enumerate(router.workers or ()):
            if ref not in declared:
                valid = ", ".join(sorted(declared)) or "none declared"
                add(Problem(host.name, f"pdkit_router.workers[{i}]", f"{ref!r} is not a declared engine; valid: {valid}"))
        if router.workers is not None and not router.workers:
            add(Problem(host.name, "pdkit_router.workers", "the router lists no engine: name its engines as 'host/engine', or leave workers unset for every engine of the cluster"))
        workers = spec.router_workers(host)
        roles = {e.role for _, e in workers}
        pd_mode = any(e.role != "unified" for _, e in workers)
        ignored = ("prefill_policy", "decode_policy") if not pd_mode else ("policy",)
        for field in ignored:
            if field in router.model_fields_set and workers:
                mode, used = ("PD", "prefill_policy and decode_policy") if pd_mode else ("plain (non-PD)", "policy")
                add(Problem(host.name, f"pdkit_router.{field}", f"ignored: this router runs in {mode} mode, where only {used} apply; remove {field}", "warning"))
        if "unified" in roles and roles - {"unified"}:
            add(Problem(host.name, "pdkit_router.workers", "the router mixes unified and prefill/decode engines; a router runs either in PD mode or not"))
        pd_hosts = sorted({h.name: h for h, e in workers if e.role != "unified"}.values(), key=lambda h: h.name)
        if len(pd_hosts) > 1 and cluster.transfer_backend == "nixl":
            # the router pairs any prefill with any decode, so KV crosses nodes
            for h in pd_hosts:
                if h.node is not None and h.node.gpu == "nvidia" and not h.node.ucx_net_devices:
                    names = [x.name for x in pd_hosts]
                    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                    add(Problem(h.name, "pdkit_node.ucx_net_devices", f"the router on {host.name} pairs prefill and decode engines across hosts ({shown}): set ucx_net_devices (e.g. 'mlx5_0:1'), without it cross-node NIXL transfers hang until the 300 s timeout; or give each node its own router (pdkit_router.workers)"))
        decodes = [e for _, e in workers if e.role == "decode"]
        if router.decode_policy == "power_of_two" and len(decodes) < 2:
            add(Problem(host.name, "pdkit_router.decode_policy", f"power_of_two needs at least 2 decode workers (the router refuses to start); this router has {len(decodes)}: use round_robin, or leave it unset"))
        if roles and roles <= {"prefill", "decode"} and roles != {"prefill", "decode"}:
            add(Problem(host.name, "pdkit_router.workers", f"the router fronts only {sorted(roles)} engines; PD mode needs at least one prefill and one decode"))

    names = {h.name for h in spec.hosts}
    for host in spec.monitoring_hosts:
        assert host.monitoring is not None
        for i, target in enumerate(host.monitoring.scrape_hosts or ()):
            if target not in names:
                add(Problem(host.name, f"pdkit_monitoring.scrape_hosts[{i}]", f"{target!r} is not a host in this inventory; valid: {', '.join(sorted(names))}"))
        real = [h.name for h in spec.gpu_hosts if h.node is not None and h.node.gpu != "none"]
        if host.monitoring.lab_alert_speedup > 1 and real:
            add(Problem(host.name, "pdkit_monitoring.lab_alert_speedup", f"{host.monitoring.lab_alert_speedup} shortens every alert window for the lab, but {', '.join(real)} {'is a real node' if len(real) == 1 else 'are real nodes'} (gpu: nvidia): an alert would page on a normal engine restart; valid: 1 (the real windows), or more only where every node is gpu: none"))
        problems += alerting_problems(host, cluster.secrets)
    if len(spec.monitoring_hosts) > 1:
        add(Problem(spec.monitoring_hosts[1].name, "pdkit_monitoring", f"only one monitoring host is supported; {spec.monitoring_hosts[0].name} already declares pdkit_monitoring"))

    if cluster.secrets.router_api_key is not None and any(spec.router_release(h)[0] == "sglang-router" for h in spec.router_hosts):
        add(Problem(spec.router_hosts[0].name, "pdkit_cluster.secrets.router_api_key", "sglang-router 0.3.2 only takes its API key on the command line, which would leak it; use package smg or drop the key"))
    problems += secret_problems(spec)
    budget = cluster.fault_budget
    for host in spec.router_hosts:
        router = host.router
        assert router is not None
        for field, message in fault_budget_problems(budget, router.health_check_interval_secs, router.health_failure_threshold, spec.is_pd()):
            add(Problem(host.name, field, message))
        for field in budget.model_fields_set - set(router_flags(*spec.router_release(host))):
            if field.startswith("router_"):
                flag = ROUTER_BUDGET_FLAGS[field]
                add(Problem(host.name, f"pdkit_cluster.fault_budget.{field}",
                            f"ignored: {' '.join(spec.router_release(host))} has no {flag} (pdkit/parser_table.json); remove it, or use a router that has it (smg)", "warning"))
    # a cluster-wide setting reached through several engines of one host is one problem
    return list(dict.fromkeys(problems))


def engine_model_paths(spec: ClusterSpec, host: HostSpec, engine: Engine) -> list[tuple[str, str, str]]:
    """(what, field path, location) for each model location ENGINE reads: its model, tokenizer
    and speculative draft, where set; the field path is where the inventory sets it."""
    assert host.node is not None
    at = f"pdkit_node.engines[{host.node.engines.index(engine)}]"
    model = spec.engine_model(engine)
    where = f"{at}.model" if engine.model is not None else "pdkit_cluster.model"
    out = [("model", f"{where}.path", model.path)]
    if model.tokenizer_path is not None:
        out.append(("tokenizer", f"{where}.tokenizer_path", model.tokenizer_path))
    speculative = spec.engine_tuning(engine).speculative
    if speculative is not None and speculative.draft_model_path is not None:
        layers = [(engine.tuning, f"{at}.tuning"), (getattr(spec.cluster.tuning, engine.role), f"pdkit_cluster.tuning.{engine.role}"),
                  (spec.cluster.tuning.all, "pdkit_cluster.tuning.all")]
        tuning_at = next((f for t, f in layers if t.speculative is not None), f"{at}.tuning")
        out.append(("draft model", f"{tuning_at}.speculative.draft_model_path", speculative.draft_model_path))
    return out


def _check_model_visibility(spec: ClusterSpec, add) -> None:
    """A model, tokenizer or draft directory the engine units' sandbox hides (ProtectHome=yes,
    PrivateTmp=yes): SGLang would not find it. The rest (exists, config.json, weights, readable by
    the service user) is the preflight's, on each node (pdkit.preflight.model_dir_problems)."""
    if spec.cluster.engine != "sglang":
        return  # the sim never reads the model directory
    for host, engine in spec.engines():
        for what, field, path in engine_model_paths(spec, host, engine):
            hidden = hidden_from_engines(path) if path.startswith("/") else None
            if hidden:
                add(Problem(host.name, field, f"{path} is under {hidden}, which the engine units cannot see (ProtectHome=yes / PrivateTmp=yes, "
                            f"templates/systemd/engine.service.j2, docs/security.md): SGLang would not find the {what}; "
                            f"move it outside {', '.join(_HIDDEN_FROM_ENGINES)}, e.g. /models/{path.rstrip('/').rsplit('/', 1)[-1]}"))


def _check_engine_venv(spec: ClusterSpec, host: HostSpec, add) -> None:
    """pdkit_node.engine_venv: a real engine's environment, outside pdkit's own venvs, one SGLang
    release for every engine process it runs (the preflight checks the environment itself)."""
    node = host.node
    assert node is not None and node.engine_venv is not None
    venv, field = node.engine_venv, "pdkit_node.engine_venv"
    if spec.cluster.engine != "sglang":
        add(Problem(host.name, field, f"engine_venv {venv} is the node's own SGLang environment, but pdkit_cluster.engine is "
                    f"{spec.cluster.engine!r} (the rehearsal engine runs from the engine environment pdkit builds for it: <install_dir>/engine-venv): remove engine_venv, or set pdkit_cluster.engine: sglang"))
        return
    install = spec.cluster.install_dir.rstrip("/")
    if venv == install or venv.startswith(install + "/"):
        add(Problem(host.name, field, f"engine_venv {venv} is inside pdkit_cluster.install_dir ({install}), whose venvs pdkit replaces: "
                    "give the engine's own environment outside it, e.g. /opt/sglang-env (or remove engine_venv and let pdkit install the engine)"))
    placements = spec.placements(host)
    if not placements:
        add(Problem(host.name, field, f"ignored: engine_venv {venv} is set but {host.name} runs no engine; remove it", "warning"))
    versions: dict[str, list[str]] = {}
    for p in placements:
        versions.setdefault(spec.engine_version(p.engine), []).append(p.engine.name)
    if len(versions) > 1:
        shown = "; ".join(f"{v} for {', '.join(names)}" for v, names in sorted(versions.items()))
        add(Problem(host.name, field, f"the engines on {host.name} want different SGLang releases ({shown}) but all run from the one engine_venv {venv}: "
                    "give them one sglang_version, or remove engine_venv"))


def _check_engine_tuning(spec: ClusterSpec, host: HostSpec, engine: Engine, at: str, add) -> None:
    tuning = spec.engine_tuning(engine)
    release = SGLANG_RELEASES[spec.engine_version(engine)]
    assert host.node is not None
    # choices (backends, dtypes, algorithm names) are the release parser's: pdkit.argvcheck
    speculative = tuning.speculative
    if speculative is not None and speculative.algorithm == "UNO" and not any(a.split("=", 1)[0] == "--uno-lora-path" for a in engine.extra_args):
        add(Problem(host.name, f"{at}.extra_args", "speculative algorithm UNO needs --uno-lora-path (SGLang: 'UNO requires --uno-lora-path'): add ['--uno-lora-path', '/path/to/lora'] to extra_args"))
    if speculative is not None and speculative.algorithm == "DSPARK" and speculative.draft_model_path is None:
        add(Problem(host.name, f"{at}.tuning.speculative.draft_model_path", "DSPARK without draft_model_path works only when the target checkpoint bundles the DSpark draft (SGLang otherwise refuses to start): set draft_model_path unless it does", "warning"))
    for field, why in ignored_settings(spec, engine):
        add(Problem(host.name, field if field.startswith("pdkit_cluster") else f"{at}.{field}", why, "warning"))
    if tuning.max_queued_requests is not None and engine.role != "unified":
        add(Problem(host.name, f"{at}.tuning.max_queued_requests", "SGLang ignores --max-queued-requests in disaggregation mode", "warning"))
    page = tuning.page_size or 1
    if tuning.chunked_prefill_size is not None and tuning.chunked_prefill_size % page:
        add(Problem(host.name, f"{at}.tuning.chunked_prefill_size", f"{tuning.chunked_prefill_size} is not a multiple of page_size {page} (SGLang rejects it); e.g. {tuning.chunked_prefill_size // page * page or page}"))
    if tuning.value("pcie_ipc_allreduce") and not release.has_pcie_ipc_allreduce:
        add(Problem(host.name, f"{at}.tuning.pcie_ipc_allreduce", f"SGLang {release.version} has no PCIe IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is 0.5.23+); valid: false, or sglang_version 0.5.23"))
    if tuning.value("pcie_ipc_allreduce") and host.node.nccl_profile == "pcie-p2p-off":
        add(Problem(host.name, f"{at}.tuning.pcie_ipc_allreduce", "PCIe IPC all-reduce needs working P2P, but the node's NCCL profile is 'pcie-p2p-off'"))
    if tuning.value("pcie_ipc_allreduce") and engine.tp_size not in (2, 4, 8):
        add(Problem(host.name, f"{at}.tuning.pcie_ipc_allreduce", f"PCIe IPC all-reduce supports TP 2, 4 or 8; this engine has tp {engine.tp_size}"))
    if tuning.cuda_graph_bs and tuning.cuda_graph_max_bs is not None and max(tuning.cuda_graph_bs) != tuning.cuda_graph_max_bs:
        add(Problem(host.name, f"{at}.tuning.cuda_graph_max_bs", f"cuda_graph_max_bs {tuning.cuda_graph_max_bs} disagrees with the largest bucket in cuda_graph_bs ({max(tuning.cuda_graph_bs)}); set one of the two"))
    if engine.role == "prefill":
        return
    max_bs = effective_decode_graph_max_bs(spec, host, engine)
    target = spec.cluster.target_concurrency
    required = decode_graph_required_bs(engine, target)
    if tuning.value("cuda_graph") and max_bs is not None and required is not None and max_bs < required:
        ranks = max(engine.dp, engine.attn_dp or 1)
        per_rank = f" over {ranks} DP ranks: {required} per rank" if ranks > 1 else ""
        add(Problem(host.name, f"{at}.tuning.cuda_graph_max_bs", f"decode CUDA graphs cover batches up to {max_bs} but target_concurrency is {target}{per_rank}: larger batches run without graphs (the seeds' 40x gap); set cuda_graph_max_bs >= {required}"))
    explicit = max(tuning.cuda_graph_bs) if tuning.cuda_graph_bs else tuning.cuda_graph_max_bs
    if explicit is not None and tuning.max_running_requests is not None and explicit > tuning.max_running_requests:
        add(Problem(host.name, f"{at}.tuning.cuda_graph_max_bs", f"{explicit} is above max_running_requests {tuning.max_running_requests}: SGLang clamps it, so graphs above {tuning.max_running_requests} are never captured", "warning"))


# Settings a role never uses: SGLang's prefill server runs no decode loop (no decode CUDA
# graph, no continuous decode steps) and pdkit renders none of them for it; a decode server
# runs no prefill-phase graph.
DECODE_ONLY = ("cuda_graph", "cuda_graph_bs", "cuda_graph_max_bs", "num_continuous_decode_steps")
PREFILL_ONLY = ("prefill_cuda_graph",)


def ignored_settings(spec: ClusterSpec, engine: Engine) -> list[tuple[str, str]]:
    """(field, why) for each setting the engine's combination ignores. A knob set on the `all`
    layer is meant for every role and is only reported when nothing could use it."""
    cluster_tuning = spec.cluster.tuning
    role_layer = getattr(cluster_tuning, engine.role)
    explicit = {**{f: f"pdkit_cluster.tuning.{engine.role}.{f}" for f in role_layer.model_fields_set},
                **{f: f"tuning.{f}" for f in engine.tuning.model_fields_set}}
    # where a setting that applies to every role comes from (the engine's own layer wins)
    anywhere = {**{f: f"pdkit_cluster.tuning.all.{f}" for f in cluster_tuning.all.model_fields_set}, **explicit}
    tuning = spec.engine_tuning(engine)
    out: list[tuple[str, str]] = []
    unused = DECODE_ONLY if engine.role == "prefill" else PREFILL_ONLY if engine.role == "decode" else ()
    for name in unused:
        if name in explicit and getattr(tuning, name) is not None:
            out.append((explicit[name], f"ignored: a {engine.role} engine never uses {name} (pdkit renders no flag for it); set it on the {'decode' if engine.role == 'prefill' else 'prefill'} role instead"))
    if engine.role != "prefill" and tuning.value("cuda_graph") is False:
        for name in ("cuda_graph_bs", "cuda_graph_max_bs"):
            if getattr(tuning, name) is not None:
                where = anywhere.get(name, f"tuning.{name}")
                out.append((where, f"ignored: decode CUDA graphs are off (cuda_graph false), so {name} captures nothing; remove it or turn cuda_graph on"))
    if tuning.value("allow_longer_context") and tuning.context_length is None:
        out.append((anywhere.get("allow_longer_context", "tuning.allow_longer_context"), "ignored: allow_longer_context only matters with a context_length above the model's; set context_length or remove it"))
    if tuning.speculative is not None and tuning.speculative.algorithm == "NGRAM" and tuning.speculative.eagle_topk is not None:
        out.append((anywhere.get("speculative", "tuning.speculative") + ".eagle_topk", "ignored: NGRAM has no EAGLE tree; remove eagle_topk"))
    return out


def _check_pd_groups(spec: ClusterSpec, add) -> None:
    groups: dict[str, list[tuple[HostSpec, Engine]]] = {}
    for host, engine in spec.engines():
        if engine.role != "unified":
            groups.setdefault(engine.pd_group, []).append((host, engine))
    for group, members in groups.items():
        roles = {e.role for _, e in members}
        first_host, first = members[0]
        for missing in ("prefill", "decode"):
            if missing not in roles:
                add(Problem(first_host.name, f"pdkit_node.engines[{first_host.node.engines.index(first)}].pd_group", f"PD group {group!r} has no {missing} engine; each PD group needs at least one prefill and one decode"))
        # what a pair must agree on (model, release, page size, ...) is pdkit.argvcheck's
        hosts = {h.name for h, _ in members}
        if len(hosts) > 1 and spec.cluster.transfer_backend == "nixl":
            for host in sorted({h.name: h for h, _ in members}.values(), key=lambda h: h.name):
                if host.node is not None and not host.node.ucx_net_devices:
                    add(Problem(host.name, "pdkit_node.ucx_net_devices", f"PD group {group!r} spans hosts {sorted(hosts)}: set ucx_net_devices (e.g. 'mlx5_0:1'), without it cross-node NIXL transfers hang until the 300 s timeout"))


def _check_kv_over_tcp(spec: ClusterSpec, add) -> None:
    """Warn where PD pairs cross hosts and the node's ucx_net_devices is not an RDMA device: UCX
    then moves GPU KV as emulated puts over TCP sockets (pdkit.kvcost.kv_path; docs/gpu.md,
    "KV hand-off at long prompts")."""
    if spec.cluster.transfer_backend != "nixl":
        return
    warned: set[str] = set()
    for label, members in pairing_sets(spec):
        hosts = sorted({h.name: h for h, _ in members}.values(), key=lambda h: h.name)
        if len(hosts) < 2:
            continue
        for host in hosts:
            node = host.node
            if node is None or node.gpu != "nvidia" or not node.ucx_net_devices or host.name in warned:
                continue
            # the set spans hosts, so the host's pairs cross hosts: RDMA devices or TCP (pdkit.kvcost.kv_path)
            if not net_devices_are_rdma(node.ucx_net_devices):
                path = KV_PATHS["cross-host-tcp"]
                warned.add(host.name)
                add(Problem(host.name, "pdkit_node.ucx_net_devices",
                            f"{label} pairs prefill and decode across hosts, and {node.ucx_net_devices!r} is not an RDMA device: "
                            f"KV moves over TCP ({path.why}); expect KV hand-offs far slower than on one host (docs/gpu.md, "
                            "\"KV hand-off at long prompts\"). Valid: an RDMA device such as 'mlx5_0:1', or prefill and decode on one host "
                            "(a router per node, pdkit_router.workers)", "warning"))


# ---------------------------------------------------------------------------
# Engines that span nodes, and their parallel layout (issue 20)

# With attention DP SGLang binds its ZMQ ports at dist-init port + 1 .. + 6 on rank 0
# (sglang/srt/server_args.py PortArgs.init_new of 0.5.17 and 0.5.23: port_base = dist_init_port
# + 1, then port_base + 1 .. + 5; 6 + one per DP rank with SGLANG_RUST_SERVER).
ATTN_DP_DERIVED_PORTS = 6


def dist_init_ports(engine: Engine) -> list[int]:
    """The ports an engine spanning nodes takes on rank 0's host: the dist-init port (torch's
    TCP store, where the ranks meet) and, with attention DP, the ones SGLang derives from it."""
    if not engine.spans_nodes or engine.dist_init_port is None:
        return []
    extra = ATTN_DP_DERIVED_PORTS if (engine.attn_dp or 1) > 1 else 0
    return [engine.dist_init_port + k for k in range(extra + 1) if engine.dist_init_port + k <= 65535]


def parallel_problems(spec: ClusterSpec, engine: Engine) -> list[tuple[str, str]]:
    """(field, why) for a parallel layout SGLang refuses, checked as its server args check it
    (0.5.23 sglang/srt/arg_groups/validation_hook.py check_server_args and parallel_hook.py
    handle_data_parallelism / handle_eplb_and_dispatch; 0.5.17 server_args.py check_server_args)."""
    out: list[tuple[str, str]] = []
    total = engine.total_gpus
    where = f"{len(engine.gpus)} GPUs x {engine.nnodes} nodes" if engine.spans_nodes else f"{len(engine.gpus)} GPUs {list(engine.gpus)}"
    tp, pp, dp = engine.tp_size, engine.pp, engine.dp
    if (pp != 1 or engine.spans_nodes) and tp * pp * dp != total:
        out.append(("tp", f"tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp} but the engine has {total} GPUs ({where}); tp x pp x dp must equal the GPU count"))
    if engine.spans_nodes and (tp * pp) % engine.nnodes:
        out.append(("tp", f"tp {tp} x pp {pp} = {tp * pp} is not divisible by the {engine.nnodes} nodes the engine spans (SGLang: 'tp_size must be divisible by number of nodes')"))
    if engine.spans_nodes and dp > 1:
        out.append(("dp", f"dp {dp} across {engine.nnodes} nodes: SGLang refuses data-parallel replicas that span nodes ('multi-node data-parallel replicas are not supported'); use attn_dp (attention data parallelism) or one engine per node"))
    attn_dp = engine.attn_dp or 1
    if attn_dp > 1 and dp > 1:
        out.append(("attn_dp", f"attn_dp {attn_dp} with dp {dp}: SGLang refuses data-parallel replicas combined with attention data parallelism; set one of the two"))
    if attn_dp > 1 and tp % attn_dp:
        out.append(("attn_dp", f"attn_dp {attn_dp} does not divide tp {tp} (SGLang asserts tp_size % attn_dp_size == 0); valid: a divisor of {tp}, e.g. {tp}"))
    if engine.ep is not None and engine.ep > 1 and tp % engine.ep:
        out.append(("ep", f"ep {engine.ep} does not divide tp {tp}: SGLang splits each expert-parallel group out of the tensor-parallel ranks (moe tp = tp / ep); valid: a divisor of {tp}"))
    tuning = spec.engine_tuning(engine)
    if (tuning.enable_eplb or tuning.ep_num_redundant_experts) and (engine.ep or 1) <= 1:
        knob = "enable_eplb" if tuning.enable_eplb else "ep_num_redundant_experts"
        out.append(("ep", f"tuning.{knob} needs expert parallelism (SGLang asserts ep_size > 1 with EPLB): set ep (e.g. ep {tp}) or drop {knob}"))
    if engine.spans_nodes and engine.dist_init_port is None:
        out.append(("dist_init_port", f"an engine spanning {engine.nnodes} nodes needs dist_init_port: the TCP port on rank 0's host where its ranks meet (--dist-init-addr), e.g. 25000"))
    if not engine.spans_nodes and engine.dist_init_port is not None:
        out.append(("dist_init_port", "dist_init_port is only used by an engine spanning nodes (nodes lists 2 or more hosts): remove it, or list the nodes"))
    return out


# ---------------------------------------------------------------------------
# What SGLang checks on its server arguments at start (issue 32). pdkit/data/startup_checks.json
# lists every such check of the pinned releases (python -m pdkit.startchecks); the rules below are
# the ones pdkit/data/startup_check_coverage.json names for the flags pdkit renders.

# SGLang's EnvBool reads these as true (sglang/srt/environ.py, 0.5.17 and 0.5.23)
_ENV_TRUE = ("true", "1", "yes", "y")
# what 0.5.23's check_pipeline_parallel_compat accepts with pp > 1 (NEXTN is EAGLE there:
# speculative_hook._resolve_speculative_algorithm_alias)
PP_SPECULATIVE = ("EAGLE", "NEXTN")
# moe runners whose expert-parallel size must be 1 or tp (server_args.py / moe_hook handle_moe_kernel_config)
EP_ONE_OR_TP_RUNNERS = ("flashinfer_cutlass", "flashinfer_cutedsl")
CUTEDSL_A2A = ("none", "deepep", "flashinfer")
# an explicit --quantization each flashinfer MoE runner takes (handle_moe_kernel_config; unset
# means bf16 or the checkpoint's own quantization_config, which SGLang reads at start)
RUNNER_QUANTIZATION: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": {
        "flashinfer_cutlass": ("modelopt_fp4", "modelopt_fp8", "modelopt_mixed"),
        "flashinfer_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed", "compressed-tensors"),
        "experimental_sgl_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed", "compressed-tensors"),
        "flashinfer_trtllm_routed": ("fp8", "mxfp8", "modelopt_fp4", "modelopt_mixed", "nvfp4_online"),
    },
    "0.5.23": {
        "flashinfer_cutlass": ("modelopt_fp4", "modelopt_fp8", "modelopt_mixed"),
        "flashinfer_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed", "compressed-tensors"),
        "experimental_sgl_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed", "compressed-tensors"),
        "flashinfer_trtllm_routed": ("fp8", "mxfp8", "modelopt_fp4", "modelopt_mixed", "nvfp4_online", "minimax_m3_nvfp4"),
    },
}
# the runners --quantization nvfp4_online takes (moe_hook _moe_runner_backend_quant_constraints)
NVFP4_ONLINE_RUNNERS = {"0.5.17": ("flashinfer_trtllm", "flashinfer_trtllm_routed"),
                        "0.5.23": ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutedsl", "flashinfer_megamoe")}
# the runners an all-to-all backend takes (handle_a2a_moe); "auto" is always accepted
A2A_RUNNERS: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": {"flashinfer": ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm_routed"), "pplx": ("deep_gemm",)},
    "0.5.23": {"flashinfer": ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_trtllm_routed", "deep_gemm"),
               "pplx": ("deep_gemm",), "flashinfer_megamoe": ("flashinfer_megamoe",), "deepep_v2": ("deep_gemm",)},
}
# all-to-all backends that need attention DP: "tp" (as many attention-DP groups as TP ranks) or a minimum
A2A_ATTN_DP: dict[str, dict[str, object]] = {
    "0.5.17": {"flashinfer": "tp", "pplx": 2},
    "0.5.23": {"flashinfer_megamoe": "tp", "pplx": 2, "flashinfer": "tp"},
}
# the attention backends a --kv-cache-dtype nvfp4 prefill runs on (0.5.23 kv_cache_hook
# handle_nvfp4_prefill_kv_dequant_dtype: flashinfer with an FP8 workspace, trtllm_mha natively)
NVFP4_PREFILL_BACKENDS = {"0.5.23": ("flashinfer", "trtllm_mha")}


def tuning_origin(spec: ClusterSpec, engine: Engine, at: str, name: str) -> str:
    """The field path a tuning setting of ENGINE comes from (its own layer, its role's, `all`)."""
    if name in engine.tuning.model_fields_set:
        return f"tuning.{name}"
    layers = spec.cluster.tuning
    for layer in (engine.role, "all"):
        if name in getattr(layers, layer).model_fields_set:
            return f"pdkit_cluster.tuning.{layer}.{name}"
    return f"tuning.{name}"


# attention backends that take an EAGLE tree (topk > 1) over pages > 1 (speculative_hook._handle_eagle_family)
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")
# the KV cache dtypes an MLA attention backend takes (attention_hook._mla_kv_cache_dtype_checks,
# _cutedsl_prefill_backend_fill of 0.5.17 and 0.5.23)
MLA_BACKEND_KV_DTYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": {"trtllm_mla": ("fp8_e4m3", "fp4_e2m1", "bf16", "auto"), "tokenspeed_mla": ("fp8_e4m3",), "cutedsl_mla": ("fp8_e4m3", "bf16", "bfloat16", "auto")},
    "0.5.23": {"trtllm_mla": ("fp8_e4m3", "bf16", "auto"), "cutedsl_mla": ("fp8_e4m3", "bf16", "bfloat16", "auto")},
}
# moe_a2a_backend DSPARK takes with attention DP (speculative_hook._handle_dspark)
DSPARK_ATTN_DP_A2A = {"0.5.17": ("none",), "0.5.23": ("none", "megamoe", "mori")}


def _speculative_layout_problems(engine: Engine, tuning: Tuning, version: str, algorithm: str, origin) -> list[tuple[str, str]]:
    """Speculative decoding against attention DP, TP/PP and the attention backend, as each
    algorithm's handler checks it (speculative_hook._handle_dflash / _dspark / _eagle_family /
    _ngram / _uno of 0.5.17 and 0.5.23)."""
    out: list[tuple[str, str]] = []
    spec_at = origin("speculative")
    attn_dp = engine.attn_dp or 1
    extra = {a.split("=", 1)[0] for a in engine.extra_args}
    topk = tuning.speculative.eagle_topk if tuning.speculative is not None else None
    refuses_attn_dp = {"NGRAM": "ngram", "STANDALONE": "standalone"}
    if version == "0.5.17":
        refuses_attn_dp["DFLASH"] = "DFLASH"
    if algorithm in ("UNO",):
        refuses_attn_dp["UNO"] = "UNO"
    if attn_dp > 1 and algorithm in refuses_attn_dp:
        out.append(("attn_dp", f"attn_dp {attn_dp} with speculative algorithm {algorithm}: SGLang {version} refuses it at start ('Currently {refuses_attn_dp[algorithm]} speculative decoding does not support dp attention'); "
                               f"valid: attn_dp 1 for this engine, or an algorithm that runs with attention DP (EAGLE, EAGLE3, NEXTN{', DFLASH' if version != '0.5.17' else ''}, DSPARK)"))
    if attn_dp > 1 and algorithm in ("DFLASH", "DSPARK") and "--enable-dp-lm-head" not in extra and not (algorithm == "DFLASH" and version == "0.5.17"):
        out.append(("extra_args", f"attn_dp {attn_dp} with speculative algorithm {algorithm}: SGLang {version} requires --enable-dp-lm-head at start ('{'DSpark' if algorithm == 'DSPARK' else 'DFLASH'} with dp attention requires --enable-dp-lm-head'); "
                                  "valid: add '--enable-dp-lm-head' to extra_args, or attn_dp 1"))
    if attn_dp > 1 and algorithm == "DSPARK" and tuning.moe_a2a_backend is not None and tuning.moe_a2a_backend not in DSPARK_ATTN_DP_A2A[version]:
        out.append((origin("moe_a2a_backend"), f"moe_a2a_backend {tuning.moe_a2a_backend} with DSPARK and attn_dp {attn_dp}: SGLang {version} refuses it at start; valid: {', '.join(DSPARK_ATTN_DP_A2A[version])}"))
    if algorithm == "DFLASH" and engine.pp != 1:
        out.append(("pp", f"pp {engine.pp} with speculative algorithm DFLASH: SGLang {version} refuses it at start ('Currently DFLASH speculative decoding only supports pp_size == 1'); valid: pp 1"))
    if algorithm == "UNO" and (engine.tp_size, engine.pp) != (1, 1):
        out.append(("tp" if engine.tp_size != 1 else "pp", f"tp {engine.tp_size} / pp {engine.pp} with speculative algorithm UNO: SGLang {version} refuses it at start ('UNO requires TP=PP=1'); valid: tp 1 and pp 1 (one GPU per engine)"))
    if algorithm == "UNO" and tuning.attention_backend not in (None, "fa3"):
        out.append((origin("attention_backend"), f"attention_backend {tuning.attention_backend} with speculative algorithm UNO: SGLang {version} refuses it at start ('UNO requires FA3 for both prefill and decode attention'); valid: fa3, or leave it unset"))
    if algorithm == "DSPARK" and tuning.speculative is not None and tuning.speculative.num_draft_tokens is not None and tuning.speculative.num_draft_tokens < 2:
        out.append((spec_at + ".num_draft_tokens", f"num_draft_tokens {tuning.speculative.num_draft_tokens} with DSPARK: SGLang {version} refuses it at start ('DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1)'); valid: 2 or more"))
    if topk is not None and topk > 1 and tuning.attention_backend == "trtllm_mha":
        out.append((spec_at + ".eagle_topk", f"eagle_topk {topk} with attention_backend trtllm_mha: SGLang {version} refuses it at start ('trtllm_mha backend only supports topk = 1 for speculative decoding'); valid: eagle_topk 1, or another attention_backend"))
    page = tuning.page_size or 1
    if topk is not None and topk > 1 and page > 1 and tuning.attention_backend is not None:
        allowed = ("flashinfer",) if algorithm == "NGRAM" else PAGE_TREE_SPEC_BACKENDS
        if tuning.attention_backend not in allowed:
            out.append((spec_at + ".eagle_topk", f"eagle_topk {topk} with page_size {page} and attention_backend {tuning.attention_backend}: SGLang {version} refuses it at start; "
                                                 f"valid: eagle_topk 1, page_size 1, or attention_backend {' / '.join(allowed)}"))
    return out


# settings SGLang accepts only on some GPU generations (by the compute capability's major):
# (tuning field, value, majors, what SGLang says) from attention_hook / kv_cache_hook / moe_hook
# (_handle_kv4_compatibility, _handle_mxfp8_kv_cache_compatibility, _moe_runner_backend_quant_constraints,
# handle_a2a_moe, _mla_kv_cache_dtype_checks, _cutedsl_prefill_backend_fill) of 0.5.17 and 0.5.23
GPU_GENERATION_SETTINGS: tuple[tuple[str, str, tuple[int, ...], str], ...] = (
    ("kv_cache_dtype", "nvfp4", (10, 12), "--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120"),
    ("kv_cache_dtype", "mxfp8", (10, 11, 12), "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU"),
    ("quantization", "nvfp4_online", (10,), "--quantization nvfp4_online is supported only on NVIDIA Blackwell SM100/SM103 GPUs"),
    ("moe_a2a_backend", "flashinfer_megamoe", (10,), "FlashInfer MegaMOE currently requires an SM100-family CUDA device"),
    ("attention_backend", "trtllm_mla", (10, 12), "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)"),
    ("attention_backend", "tokenspeed_mla", (10, 12), "tokenspeed_mla backend is only supported on Blackwell GPUs (SM100/SM12x)"),
    ("attention_backend", "cutedsl_mla", (10,), "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"),
)


def startup_check_problems(spec: ClusterSpec, engine: Engine, node: Node | None = None) -> list[tuple[str, str]]:
    """(field, why) for what the engine's SGLang release refuses at start (its ServerArgs checks),
    for combinations of the flags pdkit renders and the GPUs NODE declares. Field paths are the
    engine's unless they start with pdkit_cluster."""
    out: list[tuple[str, str]] = []
    version = spec.engine_version(engine)
    tuning = spec.engine_tuning(engine)
    spec_cfg = tuning.speculative
    algorithm = spec_cfg.algorithm if spec_cfg is not None else None
    origin = functools.partial(tuning_origin, spec, engine, "")
    env_on = lambda name: str(engine.env.get(name, "")).lower() in _ENV_TRUE  # noqa: E731
    pp = engine.pp
    if pp > 1 and tuning.value("overlap_schedule") is not False:
        out.append((origin("overlap_schedule"), f"pp {pp} with the overlap schedule: SGLang {version} refuses it at start ('Pipeline parallelism is not compatible with overlap schedule'); "
                                               "valid: overlap_schedule false (--disable-overlap-schedule), or pp 1"))
    if pp > 1 and algorithm is not None:
        if version == "0.5.17":
            out.append(("pp", f"pp {pp} with speculative decoding ({algorithm}): SGLang 0.5.17 refuses it at start ('Pipeline parallelism is not compatible with overlap schedule, speculative decoding'); "
                              "valid: pp 1, no tuning.speculative, or sglang_version 0.5.23 on a prefill engine with EAGLE/NEXTN or DSPARK"))
        elif algorithm == "DSPARK":
            if engine.role != "prefill":
                out.append(("pp", f"pp {pp} with speculative algorithm DSPARK on a {engine.role} engine: SGLang {version} refuses it at start ('Pipeline parallel DSPARK requires disaggregation-mode=prefill'); "
                                  "valid: pp 1, or DSPARK with pp only on a prefill engine"))
            if env_on("SGLANG_ENABLE_PP_SPEC"):
                out.append(("env.SGLANG_ENABLE_PP_SPEC", f"SGLANG_ENABLE_PP_SPEC with DSPARK and pp {pp}: SGLang {version} refuses it at start ('SGLANG_ENABLE_PP_SPEC does not support DSPARK PD prefill'); valid: remove it"))
        else:
            if algorithm not in PP_SPECULATIVE:
                out.append((origin("speculative") + ".algorithm", f"pp {pp} with speculative algorithm {algorithm}: SGLang {version} refuses it at start ('Pipeline parallelism currently only supports EAGLE (non-multi-layer) speculative decoding'); "
                                                                f"valid with pp > 1: {', '.join(PP_SPECULATIVE)} or DSPARK (prefill engines), or pp 1"))
            if env_on("SGLANG_ENABLE_PP_SPEC"):
                if engine.role != "unified":
                    out.append(("env.SGLANG_ENABLE_PP_SPEC", f"SGLANG_ENABLE_PP_SPEC on a {engine.role} engine: SGLang {version} refuses it with PD disaggregation ('SGLANG_ENABLE_PP_SPEC is not compatible with --disaggregation-mode'); "
                                                             "valid: remove it (PP + speculative decoding then runs on prefill engines only), or a unified engine"))
                if (engine.attn_dp or 1) > 1:
                    out.append(("attn_dp", f"attn_dp {engine.attn_dp} with SGLANG_ENABLE_PP_SPEC, pp {pp} and speculative decoding: SGLang {version} refuses it at start ('SGLANG_ENABLE_PP_SPEC is not compatible with attention DP'); "
                                           "valid: attn_dp 1, or remove SGLANG_ENABLE_PP_SPEC"))
            elif engine.role != "prefill":
                out.append(("pp", f"pp {pp} with speculative decoding ({algorithm}) on a {engine.role} engine: SGLang {version} refuses it at start ('PP + speculative decoding (MTP) is only supported on prefill nodes'); "
                                  "valid: pp 1 on this engine, speculative decoding without pp, or pp with speculative decoding only on prefill engines"))
    if algorithm is not None:
        out += _speculative_layout_problems(engine, tuning, version, algorithm, origin)
    if algorithm is not None and tuning.attention_backend == "flex_attention":
        out.append((origin("attention_backend"), f"attention_backend flex_attention with speculative decoding ({algorithm}): SGLang {version} refuses it at start ('Speculative decoding is currently not supported with Flex Attention backend'); "
                                                 "valid: another attention_backend (e.g. fa3, flashinfer, triton), or no tuning.speculative"))
    if engine.role == "prefill" and spec.cluster.transfer_backend == "fake" and spec.cluster.engine == "sglang":
        out.append(("pdkit_cluster.transfer_backend", f"transfer_backend 'fake' with a prefill engine ({engine.name}): SGLang {version} refuses it at start (\"Prefill server does not support 'fake' as the transfer backend\"); "
                                                       "valid: nixl or mooncake (fake only discards KV on decode engines, for benchmarks)"))
    if node is not None and node.gpu == "nvidia" and spec.cluster.engine == "sglang":
        major = node.gpus.sm_major
        for name, value, majors, says in GPU_GENERATION_SETTINGS:
            if getattr(tuning, name) == value and major not in majors:
                out.append((origin(name), f"{name} {value} on {node.gpus.model} (compute capability {node.gpus.compute_capability}): SGLang {version} refuses it at start ('{says}'); "
                                          f"valid on this GPU: another {name}, or an engine on a node with compute capability {' / '.join(f'{m}.x' for m in majors)}"))
    if engine.role != "unified" and spec.cluster.transfer_backend not in ("mooncake", "nixl") and env_on("SGLANG_DISAGG_STAGING_BUFFER"):
        out.append(("env.SGLANG_DISAGG_STAGING_BUFFER", f"SGLANG_DISAGG_STAGING_BUFFER with transfer_backend {spec.cluster.transfer_backend!r}: SGLang {version} refuses it at start; "
                                                       "valid: remove it, or pdkit_cluster.transfer_backend nixl or mooncake"))
    kv_dtypes = MLA_BACKEND_KV_DTYPES.get(version, {}).get(tuning.attention_backend or "")
    if kv_dtypes is not None and tuning.kv_cache_dtype is not None and tuning.kv_cache_dtype not in kv_dtypes:
        out.append((origin("kv_cache_dtype"), f"kv_cache_dtype {tuning.kv_cache_dtype} with attention_backend {tuning.attention_backend}: SGLang {version} refuses it at start; valid: {', '.join(kv_dtypes)}"))
    runner = tuning.moe_runner_backend
    tp = engine.tp_size
    if runner in EP_ONE_OR_TP_RUNNERS and engine.ep is not None and engine.ep not in (1, tp):
        out.append(("ep", f"ep {engine.ep} with moe_runner_backend {runner}: SGLang {version} refuses it at start ('The expert parallel size must be 1 or the same as the tensor parallel size'); valid: ep 1 or ep {tp}"))
    if runner == "flashinfer_cutedsl" and tuning.moe_a2a_backend is not None and tuning.moe_a2a_backend not in CUTEDSL_A2A:
        out.append((origin("moe_a2a_backend"), f"moe_a2a_backend {tuning.moe_a2a_backend} with moe_runner_backend flashinfer_cutedsl: SGLang {version} refuses it at start; valid: {', '.join(CUTEDSL_A2A)}"))
    quant = tuning.quantization
    allowed = RUNNER_QUANTIZATION.get(version, {}).get(runner or "")
    if quant is not None and allowed is not None and quant not in allowed:
        out.append((origin("quantization"), f"quantization {quant} with moe_runner_backend {runner}: SGLang {version} refuses it at start (\"Invalid quantization '{quant}'\"); "
                                            f"valid: {', '.join(allowed)}, or leave quantization unset (bf16 / the checkpoint's own)"))
    if quant == "nvfp4_online" and runner not in (None, "auto") and runner not in NVFP4_ONLINE_RUNNERS.get(version, ()):
        out.append((origin("moe_runner_backend"), f"moe_runner_backend {runner} with quantization nvfp4_online: SGLang {version} refuses it at start; valid: {', '.join(NVFP4_ONLINE_RUNNERS[version])} or auto"))
    if runner == "cutlass" and quant in ("fp8", "mxfp8") and (engine.ep or 1) > 1:
        out.append(("ep", f"ep {engine.ep} with moe_runner_backend cutlass and quantization {quant}: SGLang {version} refuses it at start ('FP8/MXFP8 Cutlass MoE is only supported with ep_size == 1'); valid: ep 1, or another moe_runner_backend"))
    a2a = tuning.moe_a2a_backend
    runners = A2A_RUNNERS.get(version, {}).get(a2a or "")
    if runners is not None and runner not in (None, "auto") and runner not in runners:
        out.append((origin("moe_runner_backend"), f"moe_runner_backend {runner} with moe_a2a_backend {a2a}: SGLang {version} refuses it at start; valid: {', '.join(runners)} or auto"))
    need = A2A_ATTN_DP.get(version, {}).get(a2a or "")
    attn_dp = engine.attn_dp or 1
    extra = {a.split("=", 1)[0] for a in engine.extra_args}
    if a2a == "flashinfer" and "--enable-layernorm-sp" in extra:
        need = None  # 0.5.23's Muse Spark prefill sequence parallelism: its own topology rule (on the checkpoint)
    if need == "tp" and attn_dp != tp:
        out.append(("attn_dp", f"moe_a2a_backend {a2a} needs attention DP over every TP rank: SGLang {version} refuses attn_dp {attn_dp} with tp {tp} at start; valid: attn_dp {tp}"))
    elif isinstance(need, int) and attn_dp < need:
        out.append(("attn_dp", f"moe_a2a_backend {a2a} needs attention DP with at least {need} groups: SGLang {version} refuses attn_dp {attn_dp} at start; valid: attn_dp >= {need} dividing tp {tp}"))
    if a2a == "deepep_v2" and engine.spans_nodes and "--deepep-v2-mode" not in extra:
        out.append((origin("moe_a2a_backend"), f"moe_a2a_backend deepep_v2 on an engine spanning {engine.nnodes} nodes: SGLang {version} refuses it at start with its default --deepep-v2-mode direct "
                                               "('--deepep-v2-mode direct is NVLink-only and cannot run across nodes'); valid: add ['--deepep-v2-mode', 'hybrid'] to extra_args, or an engine on one node"))
    backend = tuning.attention_backend
    if tuning.kv_cache_dtype == "nvfp4" and version in NVFP4_PREFILL_BACKENDS and backend is not None and backend not in NVFP4_PREFILL_BACKENDS[version] \
            and "--prefill-attention-backend" not in extra:
        out.append((origin("attention_backend"), f"attention_backend {backend} with kv_cache_dtype nvfp4: SGLang {version} refuses it at start "
                                                 f"(\"NVFP4 prefill supports an FP8 E4M3 workspace or native NVFP4, but backend '{backend}' provides neither.\"); "
                                                 f"valid: {' or '.join(NVFP4_PREFILL_BACKENDS[version])}, or leave attention_backend unset"))
    return out


def _check_spanning(spec: ClusterSpec, add) -> None:
    """Engines spanning nodes: their nodes exist, are alike, are free where the ranks run, and
    have cross-node NCCL settings."""
    names = {h.name: h for h in spec.hosts}
    units: dict[tuple[str, str], str] = {}  # (host, engine name) -> who runs it there
    gpus_taken: dict[tuple[str, int], str] = {}
    for host, engine in spec.engines():
        for g in engine.gpus:
            gpus_taken.setdefault((host.name, g), f"{host.name}/{engine.name}")
        units.setdefault((host.name, engine.name), f"{host.name}/{engine.name}")
    for host, engine in spec.engines():
        if engine.nodes is None:
            continue
        assert host.node is not None
        at = f"pdkit_node.engines[{host.node.engines.index(engine)}]"
        nodes = list(engine.nodes)
        if not nodes or nodes[0] != host.name:
            add(Problem(host.name, f"{at}.nodes", f"nodes must start with {host.name!r}, the host that declares the engine (rank 0, the one serving HTTP), got {nodes}"))
            continue
        if len(nodes) < 2:
            add(Problem(host.name, f"{at}.nodes", f"nodes lists only {host.name!r}: an engine spanning nodes lists 2 or more hosts; remove nodes for an engine on one node"))
            continue
        if len(set(nodes)) != len(nodes):
            add(Problem(host.name, f"{at}.nodes", f"nodes {nodes} repeats a host: each rank runs on a host of its own"))
            continue
        for rank, name in enumerate(nodes[1:], start=1):
            other = names.get(name)
            if other is None or other.node is None:
                what = "not a host in this inventory" if other is None else "a host without pdkit_node"
                gpu_hosts = sorted(h.name for h in spec.gpu_hosts)
                add(Problem(host.name, f"{at}.nodes[{rank}]", f"{name!r} is {what}; valid: {', '.join(gpu_hosts)}"))
                continue
            if other.node.gpus.model != host.node.gpus.model or other.node.gpus.memory_gib != host.node.gpus.memory_gib:
                add(Problem(name, "pdkit_node.gpus", f"runs rank {rank} of {host.name}/{engine.name} but has {other.node.gpus.model} ({other.node.gpus.memory_gib} GiB) where rank 0 has {host.node.gpus.model} ({host.node.gpus.memory_gib} GiB): every node of an engine needs the same GPU model"))
            if other.node.gpu != host.node.gpu:
                add(Problem(name, "pdkit_node.gpu", f"runs rank {rank} of {host.name}/{engine.name} but is gpu {other.node.gpu!r} where rank 0 is {host.node.gpu!r}"))
            for g in engine.gpus:
                if g >= other.node.gpus.count:
                    add(Problem(name, "pdkit_node.gpus.count", f"runs rank {rank} of {host.name}/{engine.name} on GPUs {list(engine.gpus)}, but GPU {g} does not exist here (valid indices 0-{other.node.gpus.count - 1})"))
                    break
                owner = gpus_taken.setdefault((name, g), f"{host.name}/{engine.name} rank {rank}")
                if owner != f"{host.name}/{engine.name} rank {rank}":
                    add(Problem(name, "pdkit_node.engines", f"GPU {g} runs rank {rank} of {host.name}/{engine.name} but is already used by {owner}; engines may not share a GPU"))
                    break
            owner = units.setdefault((name, engine.name), f"{host.name}/{engine.name} rank {rank}")
            if owner != f"{host.name}/{engine.name} rank {rank}":
                add(Problem(host.name, f"{at}.name", f"{name} runs rank {rank} of this engine as unit {engine.unit_name}, which {owner} already uses there: give the engine a name unused on {name}"))
        nets = {}
        for name in nodes:
            other = names.get(name)
            if other is None or other.node is None:
                continue
            node = other.node
            if node.nic is None:
                add(Problem(name, "pdkit_node.nic", f"runs a rank of {host.name}/{engine.name}, which spans {len(nodes)} nodes: set nic (NCCL_SOCKET_IFNAME, the interface the ranks reach each other on, e.g. 'eth0'), without it NCCL may bootstrap over docker0 or lo and hang"))
            if node.nccl_net is None:
                add(Problem(name, "pdkit_node.nccl_net", f"runs a rank of {host.name}/{engine.name}, which spans {len(nodes)} nodes: set nccl_net, how NCCL crosses nodes: 'ib' (InfiniBand/RoCE, with nccl_ib_hca) or 'socket' (TCP over nic)"))
            else:
                nets[name] = node.nccl_net
        # rank 0's address: CROSS_HOST_SERVICES (dist-init), checked by _check_addresses
        if engine.role != "unified" and spec.cluster.transfer_backend == "nixl":
            for name in nodes:
                other = names.get(name)
                if other is not None and other.node is not None and not other.node.ucx_net_devices:
                    add(Problem(name, "pdkit_node.ucx_net_devices", f"runs a rank of the {engine.role} {host.name}/{engine.name}, which spans {len(nodes)} nodes, so KV crosses nodes: set ucx_net_devices (e.g. 'mlx5_0:1'), without it cross-node NIXL transfers hang until the 300 s timeout"))
        if len(set(nets.values())) > 1:
            add(Problem(host.name, f"{at}.nodes", f"the nodes of {engine.name} disagree on nccl_net ({', '.join(f'{k}: {v}' for k, v in sorted(nets.items()))}): every rank must reach the others the same way"))
    for host in spec.gpu_hosts:
        node = host.node
        assert node is not None
        if node.nccl_net == "ib" and not node.nccl_ib_hca:
            add(Problem(host.name, "pdkit_node.nccl_ib_hca", "nccl_net 'ib' needs nccl_ib_hca (NCCL_IB_HCA), the HCAs NCCL may use, e.g. 'mlx5_0,mlx5_1' (ibv_devices lists them); or use nccl_net 'socket'"))
        if node.nccl_ib_hca and node.nccl_net != "ib":
            add(Problem(host.name, "pdkit_node.nccl_ib_hca", f"nccl_ib_hca is only used with nccl_net 'ib'; this node's nccl_net is {node.nccl_net!r} (remove nccl_ib_hca or set nccl_net: ib)"))
