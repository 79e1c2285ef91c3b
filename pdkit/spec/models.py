"""The inventory's sections as models: pdkit_cluster (Cluster, Model, Secrets), pdkit_node (Node,
GpuLayout, Engine), pdkit_router (Router) and pdkit_monitoring (Monitoring), with their defaults."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from pdkit.agent import journald
from pdkit.agent.weightstore import MANIFEST_NAME
from pdkit.clients import answers
from pdkit.spec.alerting import Alerting
from pdkit.spec.faultbudget import FaultBudget
from pdkit.spec.fields import (
    MAX_GPU_MEMORY_GIB,
    MAX_NUMA_NODES,
    NAME_PATTERN,
    SYSTEM_ACCOUNTS,
    SYSTEM_DIRS,
    BatchSize,
    Frozen,
    IntervalSeconds,
    Port,
    Seconds,
    SglangVersion,
    at_most,
    checked_model_location,
    hidden_from_engines,
)
from pdkit.spec.tuning import RoleTuning, Tuning
from pdkit.upstream.versions import DEFAULT_SGLANG_VERSION, ROUTER_RELEASES

__all__ = [
    "HOST_SECTIONS", "Cluster", "Engine", "GpuLayout", "Model", "Monitoring", "Node", "PcieSlot", "Router", "Secrets",
]


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
        raise ValueError(f"{value!r} has a '..' component: give the environment's plain absolute path, e.g. "
                         "/opt/sglang-env")
    if value.rstrip("/") in SYSTEM_DIRS or value == "/":
        raise ValueError(
            f"{value!r} is a system directory, not a Python environment: give the directory whose bin/python runs the "
            "engines, e.g. /opt/sglang-env (for an SGLang installed into the system Python, make one that sees it: "
            "python3 -m venv --system-site-packages /opt/sglang-env)"
        )
    hidden = hidden_from_engines(value)
    if hidden:
        raise ValueError(
            f"{value!r} is under {hidden}, which the engine units cannot see (ProtectHome=yes / PrivateTmp=yes, "
            "docs/security.md): put the environment elsewhere, e.g. /opt/sglang-env"
        )
    return value.rstrip("/")


class Model(Frozen):
    """The model every engine serves unless an engine names its own."""

    # --model-path: a directory on the GPU nodes, outside /home, /root, /tmp (the engine sandbox hides them; the
    # preflight checks it is there and readable), or a hub id on nodes that may download
    path: str = Field(min_length=1)
    # --served-model-name (no ':' — SGLang rejects it); defaults to the path's last component
    served_name: str | None = None
    # --tokenizer-path
    tokenizer_path: str | None = None
    # --trust-remote-code
    trust_remote_code: bool = False
    # --load-format (e.g. dummy = random weights from config.json, for rehearsals)
    load_format: str | None = None
    # the checkpoint's size on disk, GB: what the page cache holds for fast restarts (validate
    # weighs it with HiCache's host pools against pdkit_node.ram_gb)
    weights_gb: float | None = Field(default=None, gt=0, le=100_000)
    # --model-checksum; off by default: every rank hashes every model file at each start, so each restart is longer
    verify_checksum: bool = False
    # the SHA-256 manifest --model-checksum reads (SGLang's format, a file on the GPU nodes); unset: the one
    # `pdkit stage` keeps in the model directory, <path>/.pdkit-manifest.json (docs/weights.md)
    checksum_manifest: str | None = None

    _locations = field_validator("path", "tokenizer_path")(classmethod(lambda cls, v: checked_model_location(v)))

    @field_validator("checksum_manifest")
    @classmethod
    def _manifest_file(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/") or "/../" in value + "/" or re.search(r"\s", value) or value.endswith("/"):
            raise ValueError(f"{value!r} is not a plain absolute file path: give the manifest's path on the GPU nodes, "
                             "e.g. /srv/manifests/Qwen3-8B.json (SGLang reads a path that is no file as a hub id)")
        hidden = hidden_from_engines(value)
        if hidden:
            raise ValueError(f"{value!r} is under {hidden}, which the engine units cannot see (ProtectHome=yes / "
                             "PrivateTmp=yes, docs/security.md): put the manifest elsewhere, e.g. /srv/manifests/")
        return value

    @model_validator(mode="after")
    def _checksum_source(self) -> Model:
        """verify_checksum needs a manifest pdkit knows (docs/weights.md, "Checking the weights at every start")."""
        if self.checksum_manifest is not None and not self.verify_checksum:
            raise ValueError("checksum_manifest is read only with verify_checksum: true (set it, or remove "
                             "checksum_manifest)")
        if not self.verify_checksum:
            return self
        if self.load_format == "dummy":
            raise ValueError("verify_checksum with load_format: dummy: dummy weights are random and read no file, so "
                             "SGLang verifies nothing; remove one of them")
        if self.checksum_manifest is None and not self.path.startswith("/"):
            raise ValueError(f"verify_checksum: path {self.path!r} is a hub id, and pdkit knows no manifest for it "
                             "(`pdkit stage` stages directories): stage the model "
                             "(`pdkit stage INVENTORY --source DIR`) and set path to its directory on the nodes, or "
                             "give checksum_manifest (a manifest file on the nodes, e.g. from "
                             "`python -m sglang.srt.utils.model_file_verifier generate`)")
        return self

    @property
    def checksum_source(self) -> str | None:
        """What --model-checksum is given: the declared manifest, else the one `pdkit stage` keeps in the model
        directory (pdkit.agent.weightstore.MANIFEST_NAME); None when verify_checksum is off."""
        if not self.verify_checksum:
            return None
        return self.checksum_manifest or f"{self.path.rstrip('/')}/{MANIFEST_NAME}"

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
    # the router's API key (also sent by pdkit's own clients); smg only. Unset: the router takes no key,
    # which pdkit_router.auth must say ("none"), else validate warns
    router_api_key: SecretStr | None = None
    # each alert receiver's credential, by receiver name (pdkit_monitoring.alerting.receivers; what it is:
    # RECEIVER_KINDS); only in a mode-0600 file Alertmanager reads
    alert_receivers: dict[str, SecretStr] = Field(default_factory=dict)


_GATE, _TOL = answers.GateConfig(), answers.Tolerance()
# What the answer gate (pdkit/clients/answers.py) accepts, one set for the inventory's pdkit_cluster.answers and a
# campaign's correctness (pdkit/tune/campaign.py): the share of matched tokens, the graded parts' prompt lengths, the
# forced tokens and top-k per length, the streams of its loaded part
MatchRate = Annotated[float, Field(ge=0, le=1)]
GateLengths = list[Annotated[int, Field(ge=16)]]
ForcedTokens = Annotated[int, Field(ge=1, le=1024)]
TopK = Annotated[int, Field(ge=1, le=20)]
LoadConcurrency = Annotated[int, Field(ge=0)]
# the settings that change the answers by design and must be acknowledged (pdkit/spec/numerics.py)
ByDesign = Literal["kv_cache_quantized", "speculative_accept_below_1", "nccl_ll128_pcie"]


class AnswerTolerance(Frozen):
    """How far the canary's forced scores may move, per length (pdkit.clients.answers.Tolerance: the defaults)."""

    max_mean_abs_delta: float = Field(default=_TOL.max_mean_abs_delta, ge=0)
    max_abs_delta: float = Field(default=_TOL.max_abs_delta, ge=0)
    min_top1: float = Field(default=_TOL.min_top1, ge=0, le=1)
    max_kl: float = Field(default=_TOL.max_kl, ge=0)

    def tolerance(self) -> answers.Tolerance:
        return answers.Tolerance(self.max_mean_abs_delta, self.max_abs_delta, self.min_top1, self.max_kl)


_ACC = answers.Accuracy()


class AnswerAccuracy(Frozen):
    """Part (d) of the answer gate: an accuracy eval through sgl-eval (pdkit.clients.answers.Accuracy: the defaults)."""

    # off by default: each eval costs minutes (the baseline once, every check again)
    enabled: bool = _ACC.enabled
    # a set sgl-eval bundles (offline); with `dataset`, the grader and prompt it uses
    bench: Literal["aime24", "aime25", "aime26"] = _ACC.bench  # type: ignore[assignment]
    # a JSONL of your own problems ({id?, problem, expected_answer}) on the deploying machine
    dataset: str | None = None
    # the first N problems (default: all)
    num_examples: int | None = Field(default=_ACC.num_examples, ge=1)
    # answers per problem (above 1: pass@1 over them, its standard error from sgl-eval; needs a temperature)
    n_repeats: int = Field(default=_ACC.n_repeats, ge=1, le=64)
    # the output limit per answer (a reasoning model's thinking counts)
    max_tokens: int = Field(default=_ACC.max_tokens, ge=1)
    # sampling temperature (0: greedy, one answer per problem is enough)
    temperature: float = Field(default=_ACC.temperature, ge=0, le=2)
    # chat_template_kwargs.thinking (default: the bench's own)
    thinking: bool | None = _ACC.thinking
    # requests at a time
    num_threads: int = Field(default=_ACC.num_threads, ge=1, le=256)
    # the absolute score drop a check may show; a larger one fails when it is also outside the combined 95% interval
    max_drop: float = Field(default=_ACC.max_drop, ge=0, le=1)
    # one eval's limit; past it the run fails the gate
    timeout_s: float = Field(default=_ACC.timeout_s, gt=0)

    @model_validator(mode="after")
    def _repeats_sample(self) -> AnswerAccuracy:
        if self.n_repeats > 1 and self.temperature == 0:
            raise ValueError("n_repeats > 1 at temperature 0 repeats identical greedy answers: set a temperature "
                             "(the model's own, e.g. 0.6) or n_repeats 1")
        return self

    def accuracy(self) -> answers.Accuracy:
        return answers.Accuracy(**self.model_dump())


class AnswerGate(Frozen):
    """`pdkit_cluster.answers`: the graded answer gate of `pdkit roll`'s canary (pdkit/clients/answers.py,
    docs/correctness.md). The baseline is recorded on the release the canary runs before the roll."""

    # off: the canary's smoke requests must only succeed
    enabled: bool = True
    # the change is exact by declaration: short answers token for token and every forced top-1 the same;
    # otherwise a numerics change passes within the tolerance
    exact: bool = False
    # (a) short prompts compared token for token with the baseline's (0: none)
    short_prompts: int = Field(default=8, ge=0, le=256)
    short_tokens: int = Field(default=_GATE.short_tokens, ge=1)
    # share of the baseline's short-answer tokens reproduced before each answer's first divergence
    min_match_rate: MatchRate = _GATE.min_match_rate
    # (b) prompt lengths in tokens, each kept where the context cap allows; [] turns (b) and (c) off
    lengths: GateLengths = list(_GATE.lengths)
    forced_tokens: ForcedTokens = _GATE.forced_tokens
    top_k: TopK = _GATE.top_k
    # (c) concurrent streams while the forced scoring is repeated (0: off)
    load_concurrency: LoadConcurrency = _GATE.load_concurrency
    # a text file on the deploying machine (the user's own code or documents) instead of the kit's corpus
    corpus: str | None = None
    tolerance: AnswerTolerance = AnswerTolerance()
    # (d) an accuracy eval through sgl-eval, off by default (docs/correctness.md)
    accuracy: AnswerAccuracy = AnswerAccuracy()
    # settings this cluster runs that change the answers by design, named to say so (docs/correctness.md)
    acknowledge: list[ByDesign] = []

    def gate_config(self) -> answers.GateConfig:
        return answers.GateConfig(
            short_prompts=self.short_prompts, short_tokens=self.short_tokens, min_match_rate=self.min_match_rate,
            lengths=tuple(self.lengths), forced_tokens=self.forced_tokens, top_k=self.top_k,
            load_concurrency=self.load_concurrency, corpus=self.corpus, tolerance=self.tolerance.tolerance(),
            accuracy=self.accuracy.accuracy())


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
    # the concurrency the cluster is tuned for; each decode DP rank's CUDA graphs must cover its
    # share, ceil(target / DP ranks)
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
    # bound it (pdkit/spec/faultbudget.py; docs/rolling.md, "The fault budget")
    fault_budget: FaultBudget = FaultBudget()
    # how nodes get their wheel bundles: http (fetched from the deploying machine, hash-checked),
    # sftp (uploaded over the SSH connection), auto (http where the node can reach us, else sftp)
    wheelhouse_transfer: Literal["auto", "http", "sftp"] = "auto"
    # what `pdkit roll` checks of the canary's answers before the roll goes past it (docs/correctness.md)
    answers: AnswerGate = AnswerGate()

    @field_validator("service_user")
    @classmethod
    def _unprivileged_user(cls, value: str) -> str:
        if value in SYSTEM_ACCOUNTS or value.startswith("systemd-"):
            raise ValueError(f"{value!r} is a system account: services run as a user of their own, e.g. 'pdkit' (the "
                             "default)")
        return value

    _dirs = field_validator("install_dir", "config_dir")(classmethod(lambda cls, v: _system_dir(v)))


_PCIE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,39}$")


def _pcie_label(value: object, what: str) -> str:
    """A root complex's or switch's label as the user writes it (a number or a name) -> the name the rules compare."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not a {what} label: give a number (0, 1, ...) or a name (e.g. 'pci0000:80', "
                         "'a'); GPUs with the same label share it")
    text = str(value)
    if not _PCIE_LABEL.match(text):
        raise ValueError(f"{value!r} is not a {what} label: give a number or a name of up to 40 letters, digits, "
                         "'_', '.', ':' and '-' (e.g. 0, 'pci0000:80', 'sw-a')")
    return text


class PcieSlot(Frozen):
    """Where one GPU sits on the PCIe tree; the labels are yours, only which GPUs share one matters."""

    # the CPU root complex (host bridge) above the GPU, e.g. 0 or "pci0000:80" (the preflight's `pcie` fact line)
    root: str
    # the PCIe switch right above the GPU, e.g. "a"; unset: the GPU sits on a root port of its own
    switch: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, value: object) -> object:
        if not isinstance(value, (dict, PcieSlot)):
            raise ValueError(f"{value!r} is not a GPU's place: give {{root, switch}} for each GPU, e.g. "
                             "{'root': 0, 'switch': 'a'} (switch left out: the GPU sits on a root port)")
        return value

    @field_validator("root", mode="before")
    @classmethod
    def _root_label(cls, value: object) -> str:
        return _pcie_label(value, "root complex")

    @field_validator("switch", mode="before")
    @classmethod
    def _switch_label(cls, value: object) -> str | None:
        return None if value is None else _pcie_label(value, "switch")


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
    # where each GPU sits on the PCIe tree, by index (length = count; see the pcie[] table): unset, validate has no
    # root complex to judge placement by and only the preflight's probe does (docs/node.md)
    pcie: tuple[PcieSlot, ...] | None = None

    @field_validator("memory_gib")
    @classmethod
    def _gib_not_mib(cls, value: int) -> int:
        if value >= 1024:
            raise ValueError(f"{value} looks like MiB ({value} MiB = {value / 1024:.0f} GiB): give memory_gib in GiB, "
                             f"at most {MAX_GPU_MEMORY_GIB}")
        if value > MAX_GPU_MEMORY_GIB:
            raise ValueError(f"{value} GiB is more than any GPU has: give memory_gib in GiB, at most "
                             f"{MAX_GPU_MEMORY_GIB}")
        return value

    @field_validator("numa")
    @classmethod
    def _numa_ids(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(n < 0 or n >= MAX_NUMA_NODES for n in value):
            raise ValueError(f"NUMA node ids run from 0 to {MAX_NUMA_NODES - 1} (as numactl --hardware lists them), "
                             f"got {list(value)}")
        return value

    @model_validator(mode="after")
    def _numa_per_gpu(self) -> GpuLayout:
        if self.numa is not None and len(self.numa) != self.count:
            raise ValueError(
                f"numa lists {len(self.numa)} entries but count is {self.count}: give one NUMA node per GPU"
            )
        return self

    @model_validator(mode="after")
    def _pcie_per_gpu(self) -> GpuLayout:
        if self.pcie is None:
            return self
        if len(self.pcie) != self.count:
            raise ValueError(f"pcie lists {len(self.pcie)} entries but count is {self.count}: give one "
                             "{root, switch} per GPU, by index (e.g. [{root: 0, switch: a}, ...])")
        roots: dict[str, set[str]] = {}
        for slot in self.pcie:
            if slot.switch is not None:
                roots.setdefault(slot.switch, set()).add(slot.root)
        split = {s: r for s, r in roots.items() if len(r) > 1}
        if split:
            switch, under = sorted(split.items())[0]
            raise ValueError(f"pcie: switch {switch!r} is declared under root complexes {sorted(under)}: a switch "
                             "hangs off one root port; give each switch's GPUs the same root, or name the switches "
                             "apart")
        if self.numa is not None and len(self.numa) == self.count:
            nodes: dict[str, set[int]] = {}
            for slot, n in zip(self.pcie, self.numa):
                nodes.setdefault(slot.root, set()).add(n)
            split_numa = {r: n for r, n in nodes.items() if len(n) > 1}
            if split_numa:
                root, numa_nodes = sorted(split_numa.items())[0]
                raise ValueError(f"pcie: root complex {root!r} has GPUs on NUMA nodes {sorted(numa_nodes)} (numa): a "
                                 "root complex belongs to one NUMA node; correct pcie or numa")
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
    # --dp-size N --enable-dp-attention on 0.5.17 (pdkit.upstream.versions); must divide tp
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
    # the machine's RAM, GB (`free -g`): validate checks HiCache's host pools + the weights' page
    # cache + the OS fit in it
    ram_gb: int | None = Field(default=None, ge=1, le=65_536)
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
    # the node's own SGLang environment (e.g. a vendor image's venv): its bin/python runs the engines, pdkit installs no
    # engine here and preflight checks its sglang (and nixl); unset: SGLang from pdkit's lock
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
    # who may call the router: api_key (clients present pdkit_cluster.secrets.router_api_key; smg only) or
    # none (anyone who reaches its port); unset: api_key when the key is set, else a warning, so that a key
    # read from an unset environment variable never opens the router silently (docs/security.md)
    auth: Literal["api_key", "none"] | None = None
    # seconds between worker health checks (with the threshold and fault_budget.router_health_check_timeout_s:
    # how long new requests keep going to a dead worker; pdkit/spec/faultbudget.py). No "0 = off": smg 1.13.0
    # refuses 0 at start, sglang-router 0.3.2 starts and its health checker panics
    # (pdkit.spec.checks.ROUTER_START_RULES)
    health_check_interval_secs: IntervalSeconds = 5
    # failed checks before a worker counts as unhealthy (the routers take 1 to 4294967295, their u32)
    health_failure_threshold: int = Field(default=2, ge=1)
    # passed checks before an unhealthy worker gets traffic again (the routers' default, 2, keeps a
    # restarted engine idle for a whole extra interval after it is healthy; 1 to 4294967295)
    health_success_threshold: int = Field(default=1, ge=1)
    # seconds between the router's checks on a worker that is not up yet (its default, 30, delays readiness;
    # both routers refuse 0 at start)
    worker_startup_check_interval_secs: IntervalSeconds = 5
    # seconds the router drains in-flight requests on stop (--shutdown-grace-period-secs; the routers'
    # own default, 180, is longer than a unit stop should take); the unit's TimeoutStopSec is set above it.
    # The routers take 0 (no drain: a stop cuts every request in flight); pdkit asks for at least 1
    shutdown_grace_period_secs: IntervalSeconds = 60
    # engines it fronts, as "host/engine"; unset: every engine in the cluster
    workers: tuple[str, ...] | None = None
    # --log-level: at warn a served request logs nothing; at info two lines each, and the host's journal is
    # sized for them (pdkit/agent/journald.py; debug is not measured and sized as info)
    log_level: Literal["error", "warn", "info", "debug"] = journald.ROUTER_LOG_LEVEL  # type: ignore[assignment]
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
    ttft_p99_slo_s: Annotated[float, Field(gt=0), at_most(600, "TTFT objective in seconds",
                                                          "does it look like milliseconds? give seconds")] = 2.0
    # Grafana from its apt repository (off where that repository cannot be reached, e.g. the lab)
    grafana: bool = True
    # receivers, routing, grouping (Alertmanager on this host; docs/monitoring.md "Alertmanager")
    alerting: Alerting = Alerting()
    # lab only (every node `gpu: none`): the alert rules' clock runs this many times faster (1-6: a minute divides
    # evenly), every `for` and rate window divided by it, so the lab sees an alert fire in seconds; 1: the real windows
    lab_alert_speedup: Annotated[int, Field(ge=1, le=6)] = 1


# a host's data key -> its section's model, in the README's order: the loader validates these
# keys, the README's field table (pdkit.inventory.fieldtable) lists them
HOST_SECTIONS: dict[str, type[Frozen]] = {
    "pdkit_cluster": Cluster,
    "pdkit_node": Node,
    "pdkit_router": Router,
    "pdkit_monitoring": Monitoring,
}
