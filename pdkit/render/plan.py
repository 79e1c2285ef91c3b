"""Spec -> per-host plan: every file pdkit writes on a host and every service it runs.

Deterministic: the same spec gives byte-identical files (no timestamps, sorted keys), so
pyinfra sees no change on a re-run and a release hash identifies a configuration. Templates
in templates/ only lay out what `pdkit.render.flags` decided.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2

from pdkit.agent import gates, journald
from pdkit.agent.exporter.config import reads_gpu_health
from pdkit.agent.health import READY_LOG_LINE  # the engine gate's line (plan.READY_LOG_LINE stays importable)
from pdkit.agent.releases import release_json_path
from pdkit.render import flags
from pdkit.render.paths import router_url
from pdkit.spec import (
    DCGM_EXPORTER_PORT,
    ClusterSpec,
    Engine,
    HostSpec,
    dcgm_enabled,
    engine_numa_node,
    gpu_share_group,
    shared_gpu_predecessor,
)

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
SYSTEMD_DIR = "/etc/systemd/system"


@dataclass(frozen=True)
class PlannedFile:
    path: str
    content: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    # secret files are never printed, diffed or stored in a release listing in clear
    secret: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


@dataclass(frozen=True)
class Service:
    """One systemd unit and what it needs to be healthy."""

    unit: str
    kind: str  # engine | router | http (a packaged daemon gated on one URL)
    # files whose change means a restart
    files: tuple[str, ...]
    # HTTP URL that answers 200 when healthy
    health_url: str
    ready_timeout_s: int
    # engines: the log line that marks readiness; router: the worker URLs it must list healthy
    ready_log_line: str | None = None
    expected_workers: tuple[str, ...] = ()
    # router: those of expected_workers on other hosts (its gate lets them be pending: pdkit/agent/health.py
    # router_verdict)
    remote_workers: tuple[str, ...] = ()
    # the root-only file the router's health gate reads its API key from
    api_key_file: str | None = None
    # served model name, for the router gate's real completion
    model: str | None = None
    engine: str | None = None
    role: str | None = None
    port: int | None = None
    # the venv link ExecStart runs from (a new venv there restarts it: pdkit/agent/changes.py): the node venv
    # (pdkit-exporter), the engine environment (engines), the router venv; None: none of pdkit's
    # (packaged daemons, and engines on a node with its own engine environment, pdkit_node.engine_venv)
    venv: str | None = None
    # an engine spanning nodes: this unit's rank, the host of rank 0, and every host it runs on
    # in rank order (one unit of rollout; only rank 0 serves HTTP, so a rank above 0 is gated
    # on its unit staying up while rank 0 becomes healthy)
    rank: int = 0
    head: str | None = None
    span: tuple[str, ...] = ()
    # engines sharing GPUs (gpu_share): the group's units in start order. Each sizes its pool against
    # what the earlier ones leave free at its start, and those grow with traffic, so one restarts
    # only with the whole group (pdkit/agent/changes.py): as at the first start, in order
    share_group: tuple[str, ...] = ()


def services_meta(services: tuple[Service, ...] | list[Service]) -> dict[str, dict]:
    """What a release keeps of each service, and what the restart rule reads (pdkit/agent/changes.py): no secrets."""
    return {
        s.unit: {"kind": s.kind, "files": list(s.files), "health_url": s.health_url,
                 "ready_timeout_s": s.ready_timeout_s, "venv": s.venv,
                 # a rank above 0 of an engine spanning nodes is gated through rank 0 (pdkit.agent.health.wait_rank)
                 **({"rank": s.rank} if s.rank else {}),
                 # engines sharing GPUs restart together, in order (pdkit/agent/changes.py)
                 **({"share_group": list(s.share_group)} if s.share_group else {}),
                 # a router's gate (pdkit/agent/gates.py): a restore gates it as the deploy does
                 **gates.meta(s)}
        for s in services
    }


@dataclass(frozen=True)
class HostPlan:
    host: str
    files: tuple[PlannedFile, ...] = ()
    services: tuple[Service, ...] = ()
    # directories to create: (path, mode, owner, group)
    directories: tuple[tuple[str, str, str, str], ...] = field(default_factory=tuple)
    # Debian packages this host needs (from the nodes' own apt sources)
    packages: tuple[str, ...] = ()
    # unprivileged system users (no login) the services run as: the engines' (and exporter's), the router's
    users: tuple[str, ...] = ()

    def file(self, path: str) -> PlannedFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    @property
    def release_hash(self) -> str:
        """One hash of every file pdkit writes on this host (the release id)."""
        digest = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.path):
            digest.update(f"{f.path}\0{f.mode}\0{f.owner}\0{f.group}\0{f.sha256}\n".encode())
        return digest.hexdigest()


@lru_cache(maxsize=1)
def _jinja() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(template: str, **context) -> str:
    return _jinja().get_template(template).render(**context)


_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """Quote one argv element for ExecStart= so systemd hands it over unchanged."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and _SAFE_ARG.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_start(argv: list[str]) -> str:
    # one flag (with its values) per continuation line, so a diff shows which flag moved
    parts: list[str] = []
    for arg in argv:
        if arg.startswith("--") or not parts:
            parts.append(systemd_quote(arg))
        else:
            parts[-1] += " " + systemd_quote(arg)
    return " \\\n    ".join(parts)


def env_file_text(purpose: str, env: dict[str, str]) -> str:
    quoted = {k: _env_value(v) for k, v in env.items()}
    return render_template("env.j2", purpose=purpose, env=quoted)


def _env_value(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]*", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_paths(spec: ClusterSpec) -> dict[str, str]:
    base = spec.cluster.config_dir
    return {
        "nccl": f"{base}/nccl.env",
        "ucx": f"{base}/ucx.env",
        "secrets": f"{base}/secrets.env",
        "release": release_json_path(base),
    }


def engine_env_path(spec: ClusterSpec, engine: Engine) -> str:
    return f"{spec.cluster.config_dir}/engines/{engine.name}.env"


# the bound of an engine's wait for the free GPU memory its fraction assumes (pdkit.agent.gpumem): CUDA
# memory of a stopped engine has outlived its cgroup by seconds, not minutes (docs/gpu.md)
GPU_FREE_WAIT_S = 120
# what the wait allows below total x (1 - the earlier shares), in MiB: the engine's own CUDA context,
# and per earlier engine on the GPU its context and CUDA graphs, taken beyond its share (the H200's
# decode found 2.3 GiB less than its prefill's share left, docs/gpu.md "One H200")
GPU_FREE_MARGIN_MIB, GPU_FREE_MARGIN_PER_EARLIER_MIB = 2048, 2048


def gpu_free_wait(spec: ClusterSpec, host: HostSpec, engine: Engine) -> list[str] | None:
    """The argv that holds ENGINE's start until its shared GPUs have the free memory its fraction
    assumes (pdkit.agent.gpumem), or None: an engine alone on its GPUs, or a node without nvidia-smi
    (`gpu: none`: the lab, the sim rehearsals)."""
    assert host.node is not None
    group = gpu_share_group(host, engine)
    if not group or host.node.gpu != "nvidia":
        return None
    index = [e.name for e in group].index(engine.name)
    assumes = round(1 - sum(e.gpu_share for e in group[:index]), 4)  # type: ignore[misc]
    margin = GPU_FREE_MARGIN_MIB + GPU_FREE_MARGIN_PER_EARLIER_MIB * index
    return [flags.node_python(spec), "-m", "pdkit.gpumem", "wait", "--gpus", ",".join(map(str, engine.gpus)),
            "--assumes", f"{assumes:g}", "--margin-mib", str(margin), "--timeout", str(GPU_FREE_WAIT_S),
            "--unit", engine.unit_name]


def shared_gpu_start(spec: ClusterSpec, host: HostSpec, engine: Engine) -> dict:
    """Unit settings that start an engine on shared GPUs only once the engine before it serves
    and the GPUs have the memory its fraction assumes.

    Its --mem-fraction-static assumes the earlier engines already hold their shares
    (spec.shared_gpu_mem_fraction): `After=` orders the starts, `PartOf=` restarts it whenever
    the earlier one restarts (whose pool would otherwise not fit beside it), and ExecStartPre
    waits for the earlier one's /health, since a Type=simple unit counts as started at once.
    Then (on nvidia nodes) a second ExecStartPre waits, bounded, for the free memory the fraction
    assumes (`gpu_free_wait`): a process of the unit's last start may still hold its memory.
    """
    before = shared_gpu_predecessor(host, engine)
    pre: list[str] = []
    timeout = 0
    if before is not None:
        pre.append(exec_start([flags.node_python(spec), "-m", "pdkit.health", "gates", "--http",
                               f"{flags.engine_url(spec, host, before)}/health", str(spec.cluster.ready_timeout_s)]))
        timeout += spec.cluster.ready_timeout_s
    memory = gpu_free_wait(spec, host, engine)
    if memory is not None:
        pre.append(exec_start(memory))
        timeout += GPU_FREE_WAIT_S
    return {"start_after": before.unit_name if before is not None else None, "exec_start_pre": pre,
            "timeout_start_s": timeout + 60 if pre else None}


def engines_not_started_reason(spec: ClusterSpec, host: HostSpec) -> str | None:
    """Why the deploy lays down this node's engines but does not start them, or None.

    Real SGLang on a `gpu: none` host (the lab rehearsing an engine install) cannot start: it
    would crash-loop looking for a GPU. Its venv, units and env files are still laid down, and
    its argv can be checked by SGLang's own parser in that venv.
    """
    if spec.cluster.engine == "sglang" and host.node is not None and host.node.gpu == "none" and spec.placements(host):
        return ("engine sglang on a gpu: none host (preflight: no GPU): the venv, units and env files are laid down, "
                "the engines are not started")
    return None


def services_not_started(spec: ClusterSpec, host: HostSpec, services: list[Service]) -> dict[str, str]:
    """{unit: why} for the planned services the deploy must not start on HOST: the engines of
    `engines_not_started_reason`, and a router whose workers include such an engine (its health
    gate waits for every worker)."""
    held = {}
    reason = engines_not_started_reason(spec, host)
    for service in services:
        if service.kind == "engine" and reason:
            held[service.unit] = reason
        elif service.kind == "router" and host.router is not None:
            idle = sorted({h.name for h, _ in spec.router_workers(host) if engines_not_started_reason(spec, h)})
            if idle:
                held[service.unit] = (f"its workers on {', '.join(idle)} are not started "
                                      f"({engines_not_started_reason(spec, spec.host(idle[0]))})")
    return held


def staging_dir(spec: ClusterSpec) -> str:
    """Where the deploy uploads changed files before moving them into place (root only; beside
    the config so that the move is a rename on the same filesystem)."""
    return f"{spec.cluster.config_dir}/.staging"


def plan_host(spec: ClusterSpec, host: HostSpec) -> HostPlan:
    """Everything pdkit lays down on one host."""
    user = spec.cluster.service_user
    paths = config_paths(spec)
    files: list[PlannedFile] = []
    services: list[Service] = []
    directories = [
        (spec.cluster.config_dir, "0755", "root", "root"),
        (staging_dir(spec), "0700", "root", "root"),
    ]

    def config_file(path: str, content: str, secret: bool = False) -> PlannedFile:
        # config is root-owned; the service group may read it (exporter drift checks); secrets root-only
        if secret:
            return PlannedFile(path, content, "0600", "root", "root", secret=True)
        return PlannedFile(path, content, "0640", "root", user)

    common = {"cluster": spec.cluster.name, "config_dir": spec.cluster.config_dir, "user": user}

    secret_env = flags.secrets_env(spec)
    if host.node is not None:
        directories.append((f"{spec.cluster.config_dir}/engines", "0755", "root", "root"))
        files.append(config_file(paths["nccl"], env_file_text("NCCL settings for this node (docs/tuning.md)",
                                                              flags.nccl_env(spec, host))))
        files.append(config_file(paths["ucx"], env_file_text("UCX settings for NIXL KV transfer (docs/tuning.md)",
                                                             flags.ucx_env(spec, host))))
        if secret_env:
            files.append(config_file(paths["secrets"], env_file_text("secrets (mode 0600, root only)", secret_env),
                                     secret=True))
        for placement in spec.placements(host):
            engine, head, rank = placement.engine, placement.head, placement.rank
            env_path = engine_env_path(spec, engine)
            files.append(config_file(env_path, env_file_text(f"environment of engine {engine.name}",
                                                             flags.engine_env(spec, head, engine, host))))
            env_files = [paths["nccl"], paths["ucx"], env_path] + ([paths["secrets"]] if secret_env else [])
            numa = engine_numa_node(host, engine) if host.node.gpu == "nvidia" else None
            unit_text = render_template(
                "systemd/engine.service.j2",
                **common,
                engine_kind=(("SGLang (the node's own environment)" if host.node.engine_venv else "SGLang")
                             if spec.cluster.engine == "sglang" else "sim (rehearsal)"),
                role=engine.role,
                name=engine.name + (f" (rank {rank} of {engine.nnodes}, rank 0 on {head.name})" if engine.spans_nodes
                                    else ""),
                env_files=env_files,
                exec_start=exec_start(flags.engine_command(spec, head, engine, rank, node=host)),
                numa_node=numa,
                **shared_gpu_start(spec, host, engine),
            )
            unit_path = f"{SYSTEMD_DIR}/{engine.unit_name}"
            files.append(PlannedFile(unit_path, unit_text, "0644"))
            services.append(
                Service(
                    unit=engine.unit_name,
                    kind="engine",
                    files=tuple(sorted([unit_path, *env_files])),
                    # every rank's gate and drain go through rank 0, the one HTTP server
                    health_url=f"{flags.engine_url(spec, head, engine)}/health",
                    ready_timeout_s=spec.cluster.ready_timeout_s,
                    # SGLang prints it on rank 0 only
                    ready_log_line=READY_LOG_LINE if rank == 0 else None,
                    engine=engine.name,
                    role=engine.role,
                    port=engine.port if rank == 0 else None,
                    # the engine environment's link (a new lock restarts it; a new node venv never does),
                    # None on a node that provides its own engine environment
                    venv=flags.engine_service_venv(spec, host),
                    rank=rank,
                    head=head.name if engine.spans_nodes else None,
                    span=tuple(h.name for h in spec.engine_hosts(head, engine)) if engine.spans_nodes else (),
                    share_group=tuple(e.unit_name for e in gpu_share_group(host, engine)),
                )
            )

    if host.node is not None and spec.placements(host):
        exporter_config = f"{spec.cluster.config_dir}/exporter.json"
        files.append(config_file(exporter_config, exporter_config_text(spec, host)))
        unit_path = f"{SYSTEMD_DIR}/pdkit-exporter.service"
        argv = [flags.node_python(spec), "-m", "pdkit.exporter", "--config", exporter_config]
        files.append(PlannedFile(unit_path, render_template("systemd/exporter.service.j2", **common,
                                                            exec_start=exec_start(argv),
                                                            gpu_health=exporter_reads_gpus(spec, host)), "0644"))
        services.append(
            Service(
                unit="pdkit-exporter.service",
                kind="http",
                files=(exporter_config, unit_path),
                health_url=f"http://{spec.engine_address(host)}:{host.node.exporter_port}/metrics",
                # it binds in ~0.1 s on an idle node, but a cold 32-host lab starting 96 Python
                # services at once on 2 cores bound it after 73 s (docs/benchmarks.md); the gate
                # watches its unit, so a crash still fails at once
                ready_timeout_s=180,
                port=host.node.exporter_port,
                # it runs `python -m pdkit.exporter` from the node venv: a new pdkit wheel must restart it
                venv=flags.venv_dir(spec),
            )
        )

    if dcgm_enabled(host):
        directories.append((DCGM_DROPIN_DIR, "0755", "root", "root"))
        dropin = render_template("systemd/dcgm-exporter.conf.j2", **common,
                                 exec_start=exec_start(dcgm_exporter_argv(spec, host)))
        files.append(PlannedFile(DCGM_DROPIN_PATH, dropin, "0644"))
        services.append(
            Service(
                unit=DCGM_UNIT,
                kind="http",
                files=(DCGM_DROPIN_PATH,),
                health_url=f"http://{spec.engine_address(host)}:{DCGM_EXPORTER_PORT}/metrics",
                ready_timeout_s=120,
                port=DCGM_EXPORTER_PORT,
            )
        )

    if host.router is not None:
        key_text = flags.router_api_key_text(spec)
        key_path = flags.router_api_key_path(spec)
        if key_text is not None:
            # root-only: systemd reads it for the router (LoadCredential=), no engine or other user can
            files.append(PlannedFile(key_path, key_text, "0600", "root", "root", secret=True))
            files.append(PlannedFile(flags.router_launcher_path(spec),
                                     render_template("router-launch.py.j2", credential=flags.ROUTER_API_KEY_CREDENTIAL),
                                     "0755"))
        package, version = spec.router_release(host)
        unit_text = render_template(
            "systemd/router.service.j2",
            **{**common, "user": flags.router_user(spec)},
            package=package,
            version=version,
            api_key_file=key_path if key_text is not None else None,
            credential=flags.ROUTER_API_KEY_CREDENTIAL,
            exec_start=exec_start(flags.router_command(spec, host)),
            stop_timeout_s=flags.router_stop_timeout_s(host),
        )
        unit_path = f"{SYSTEMD_DIR}/pdkit-router.service"
        files.append(PlannedFile(unit_path, unit_text, "0644"))
        services.append(
            Service(
                unit="pdkit-router.service",
                kind="router",
                files=tuple(sorted([unit_path,
                                    *([key_path, flags.router_launcher_path(spec)] if key_text is not None else [])])),
                health_url=router_url(host) + "/health",
                ready_timeout_s=120,
                expected_workers=tuple(flags.engine_url(spec, h, e) for h, e in spec.router_workers(host)),
                remote_workers=tuple(flags.engine_url(spec, h, e) for h, e in spec.router_workers(host)
                                     if h.name != host.name),
                api_key_file=key_path if key_text is not None else None,
                model=spec.cluster.model.name,
                port=host.router.port,
                venv=flags.router_venv_dir(spec),
            )
        )

    if host.monitoring is not None:
        files += monitoring_host_files(spec, host)
        services += monitoring_host_services(spec, host, files)

    # every host: a journal that keeps a day of the kit's evidence (roles/services.py restarts journald on a change)
    directories.append((JOURNALD_DROPIN_DIR, "0755", "root", "root"))
    files.append(PlannedFile(journald.JOURNALD_DROPIN_PATH, journald_dropin_text(spec, host), "0644"))

    files.append(PlannedFile(paths["release"], _release_manifest(spec, host, files, services), "0644"))
    return HostPlan(
        packages=tuple(host_packages(spec, host)),
        users=(user, *([flags.router_user(spec)] if host.router is not None else [])),
        host=host.name,
        files=tuple(sorted(files, key=lambda f: f.path)),
        services=tuple(services),
        directories=tuple(directories),
    )


JOURNALD_DROPIN_DIR = journald.JOURNALD_DROPIN_PATH.rsplit("/", 1)[0]


def journald_dropin_text(spec: ClusterSpec, host: HostSpec) -> str:
    """The journald drop-in of HOST: sized for a day at the cluster's target concurrency (pdkit/agent/journald.py)."""
    decodes = sum(1 for p in spec.placements(host) if p.engine.role == "decode" and p.rank == 0) if host.node else 0
    level = host.router.log_level if host.router is not None else None
    return journald.journald_conf(journald.journal_size(spec.cluster.target_concurrency, decodes, level))


def exporter_reads_gpus(spec: ClusterSpec, host: HostSpec) -> bool:
    """Whether HOST's pdkit-exporter runs the GPU health probe (pdkit/agent/exporter/gpuhealth.py: the GPUs pdkit roll's
    refusal reads, pdkit/hosts/gpuhealth.py), and so needs the NVIDIA devices in its unit: a node with NVIDIA GPUs and a
    real engine; never on a lab host (`gpu: none`) or with the sim."""
    return host.node is not None and reads_gpu_health(host.node.gpu, spec.cluster.engine)


def exporter_config_text(spec: ClusterSpec, host: HostSpec) -> str:
    """/etc/pdkit/exporter.json: what pdkit-exporter compares the running engines against."""
    assert host.node is not None
    node_env = {**flags.nccl_env(spec, host), **flags.ucx_env(spec, host)}
    secret_names = sorted(flags.secrets_env(spec))
    config = {
        "node": host.name,
        "cluster": spec.cluster.name,
        "listen_address": spec.engine_address(host),
        "listen_port": host.node.exporter_port,
        "release_file": config_paths(spec)["release"],
        "gpu_health": exporter_reads_gpus(spec, host),
        "engines": [
            {
                "name": p.engine.name,
                "role": p.engine.role,
                "url": flags.engine_url(spec, p.head, p.engine),
                "unit": p.engine.unit_name,
                "sglang_version": spec.engine_version(p.engine),
                "argv": flags.sglang_args(spec, p.head, p.engine, p.rank),
                # this node's GPUs the engine runs on (rendered as --base-gpu-id / --gpu-id-step)
                "gpus": list(p.engine.gpus),
                # secrets are checked for presence only: their values never leave the 0600 file
                "env": {**node_env, **flags.engine_env(spec, p.head, p.engine, host),
                        **{k: None for k in secret_names}},
                # an engine spanning nodes: which rank this exporter watches (only rank 0 serves
                # HTTP; a rank above 0 is checked by its process' argv and environment)
                **({"rank": p.rank, "nnodes": p.engine.nnodes, "head": p.head.name} if p.engine.spans_nodes else {}),
            }
            for p in spec.placements(host)
        ],
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _release_manifest(spec: ClusterSpec, host: HostSpec, files: list[PlannedFile], services: list[Service]) -> str:
    """release.json: what this host should be running, for drift checks and rollbacks."""
    manifest = {
        "cluster": spec.cluster.name,
        "host": host.name,
        "engine": spec.cluster.engine,
        "files": {f.path: {"sha256": f.sha256, "mode": f.mode} for f in sorted(files, key=lambda f: f.path)},
        "engines": {
            p.engine.name: {
                "role": p.engine.role,
                "sglang_version": spec.engine_version(p.engine),
                "argv": flags.sglang_args(spec, p.head, p.engine, p.rank),
                **({"rank": p.rank, "nodes": list(p.engine.nodes or ())} if p.engine.spans_nodes else {}),
            }
            for p in spec.placements(host)
        },
        "services": [s.unit for s in services],
    }
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


# NVIDIA's DCGM exporter on GPU nodes (pdkit.spec.dcgm_enabled): DCGM 4 for CUDA 13 and the
# exporter package, both from NVIDIA's CUDA repository (roles/nvidia_repo.py lays it down)
DCGM_PACKAGES = ("datacenter-gpu-manager-4-cuda13", "datacenter-gpu-manager-exporter")
DCGM_UNIT = "nvidia-dcgm-exporter.service"
DCGM_DROPIN_DIR = f"{SYSTEMD_DIR}/{DCGM_UNIT}.d"
DCGM_DROPIN_PATH = f"{DCGM_DROPIN_DIR}/pdkit.conf"
# the package's own counter list; nv-hostengine (nvidia-dcgm.service) listens on localhost:5555
DCGM_COLLECTORS = "/etc/dcgm-exporter/default-counters.csv"
DCGM_HOSTENGINE = "localhost:5555"


def dcgm_exporter_argv(spec: ClusterSpec, host: HostSpec) -> list[str]:
    """dcgm-exporter's command line: the packaged counters, the node's address, the local host engine."""
    return [
        "/usr/bin/dcgm-exporter",
        "--collectors", DCGM_COLLECTORS,
        "--address", f"{spec.engine_address(host)}:{DCGM_EXPORTER_PORT}",
        "--remote-hostengine-info", DCGM_HOSTENGINE,
    ]


PROMETHEUS_DEFAULTS_PATH = "/etc/default/prometheus"
# Grafana's apt repository (deb822, key pinned by signed-by)
GRAFANA_KEYRING_PATH = "/etc/apt/keyrings/grafana.asc"
GRAFANA_SOURCES_PATH = "/etc/apt/sources.list.d/grafana.sources"
GRAFANA_KEY_URL = "https://apt.grafana.com/gpg.key"


def monitoring_host_files(spec: ClusterSpec, host: HostSpec) -> list[PlannedFile]:
    """Prometheus config, rules and its listen address; Grafana's source, provisioning and dashboards."""
    # lazy: pdkit.monitoring (rules, dashboards: ~45 ms) is needed only to plan a monitoring host
    from pdkit import monitoring

    assert host.monitoring is not None
    out = []
    for path, text in sorted(monitoring.monitoring_files(spec).items()):
        if path == monitoring.ALERTMANAGER_CONFIG_PATH:
            # no secret in it (receivers name their credential files), but routes and addresses: its user's group only
            out.append(PlannedFile(path, text, "0640", "root", monitoring.ALERTMANAGER_USER))
            continue
        group = "grafana" if path.startswith(("/etc/grafana", "/var/lib/grafana")) else "root"
        out.append(PlannedFile(path, text, "0644" if group == "root" else "0640", "root", group))
    # each receiver's credential: the one place a secret of the monitoring host is written, readable by
    # Alertmanager's user alone (Debian's unit runs it as `prometheus`)
    for path, secret in sorted(monitoring.credential_files(spec).items()):
        out.append(PlannedFile(path, secret, "0600", monitoring.ALERTMANAGER_USER, monitoring.ALERTMANAGER_USER,
                               secret=True))
    # Debian's units read ARGS from here: listen on the planned address and port only
    listen = f"{host.address}:{host.monitoring.prometheus_port}"
    out.append(PlannedFile(PROMETHEUS_DEFAULTS_PATH, f'# Rendered by pdkit\nARGS="--web.listen-address={listen}"\n',
                           "0644"))
    out.append(PlannedFile(monitoring.ALERTMANAGER_DEFAULTS_PATH, monitoring.alertmanager_defaults(spec, host), "0644"))
    if host.monitoring.grafana:
        out.append(PlannedFile(GRAFANA_SOURCES_PATH,
                               render_template("apt/grafana.sources.j2", keyring=GRAFANA_KEYRING_PATH), "0644"))
    return out


def monitoring_host_services(spec: ClusterSpec, host: HostSpec, files: list[PlannedFile]) -> list[Service]:
    # lazy: pdkit.monitoring (rules, dashboards: ~45 ms) is needed only to plan a monitoring host
    from pdkit import monitoring

    assert host.monitoring is not None
    am_files = tuple(sorted(f.path for f in files if f.path in (monitoring.ALERTMANAGER_CONFIG_PATH,
                                                                monitoring.ALERTMANAGER_DEFAULTS_PATH)
                            or f.path.startswith(monitoring.ALERTMANAGER_CREDENTIALS_DIR + "/")))
    prom_files = tuple(sorted(f.path for f in files
                              if (f.path.startswith("/etc/prometheus") or f.path == PROMETHEUS_DEFAULTS_PATH)
                              and f.path not in am_files))
    services = [Service(unit="prometheus.service", kind="http", files=prom_files,
                        health_url=f"http://{host.address}:{host.monitoring.prometheus_port}/-/ready",
                        ready_timeout_s=120)]
    # a config change restarts it (its silences and notification log persist in --storage.path)
    services.append(Service(unit=monitoring.ALERTMANAGER_UNIT, kind="http", files=am_files,
                            health_url=f"{monitoring.alertmanager_url(spec, host)}/-/ready", ready_timeout_s=120))
    if host.monitoring.grafana:
        grafana_files = tuple(sorted(f.path for f in files if f.path.startswith(("/etc/grafana", "/var/lib/grafana"))
                                     or f.path == monitoring.GRAFANA_DROPIN_PATH))
        services.append(Service(unit="grafana-server.service", kind="http", files=grafana_files,
                                health_url=f"http://{host.address}:{host.monitoring.grafana_port}/api/health",
                                ready_timeout_s=120))
    return services


def host_packages(spec: ClusterSpec, host: HostSpec) -> list[str]:
    """Packages: node_exporter everywhere, DCGM on GPU nodes that run it, Prometheus, Alertmanager (and Grafana)
    on the monitoring host. Names only: roles/packages.py installs a pinned one (versions.APT_PINS) at its version."""
    packages = ["prometheus-node-exporter"]
    if dcgm_enabled(host):
        packages += DCGM_PACKAGES
    if host.monitoring is not None:
        packages += ["prometheus", "prometheus-alertmanager"]
        if host.monitoring.grafana:
            packages.append("grafana")
    return packages


def plan_cluster(spec: ClusterSpec) -> dict[str, HostPlan]:
    return {host.name: plan_host(spec, host) for host in spec.hosts}
