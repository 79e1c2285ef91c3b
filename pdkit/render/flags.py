"""Spec -> command lines and environments. Every flag a pdkit service runs with comes from here.

Pure functions: (spec, host, engine) in, lists and dicts out, keyed on the pinned SGLang
release (`pdkit.upstream.versions`). Units, env files, the exporter's drift check and the contract
tests all call these; nothing else derives a flag.
"""

from __future__ import annotations

from pdkit.agent import jitcache
from pdkit.clients.router_api import REGULAR, worker_type
from pdkit.spec import (
    ClusterSpec,
    Engine,
    HostSpec,
    custom_all_reduce_enabled,
    faultbudget,
    prefill_kv_paths,
    shared_gpu_mem_fraction,
)
from pdkit.spec.kvcost import KvPath
from pdkit.upstream import parsertable, sglang_pd
from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES

ENGINE_MODULES = {"sglang": "sglang.launch_server", "sim": "pdkit.sim"}


def venv_dir(spec: ClusterSpec) -> str:
    """pdkit's own node venv (pdkit and its ~15 runtime pins): health gates, pdkit-exporter,
    releases. No engine runs from it, so a pdkit upgrade restarts only pdkit's own daemons."""
    return f"{spec.cluster.install_dir}/venv"


def venv_python(venv: str) -> str:
    """The interpreter of the Python environment at VENV (pdkit's venvs and a node's own engine_venv)."""
    return f"{venv}/bin/python"


def node_python(spec: ClusterSpec) -> str:
    """argv[0] of pdkit's own commands on a node (health gates, pdkit-exporter, releases): the node venv's python."""
    return venv_python(venv_dir(spec))


def engine_venv_dir(spec: ClusterSpec) -> str:
    """The kit-managed engine environment's link (`<install_dir>/engine-venv` -> venvs/engine-<hash>):
    SGLang from its lock, or the sim from its own sources (`pdkit.wheels.wheelhouse.engine_bundle`). Only
    what the engine runs identifies it, so an edit elsewhere in pdkit leaves it, and the engines
    running from it, alone."""
    return f"{spec.cluster.install_dir}/engine-venv"


def managed_engine_env(spec: ClusterSpec, host: HostSpec) -> tuple[str, str | None] | None:
    """What HOST's kit-managed engine environment is built from: ("sglang", release) or
    ("sim", None); None where HOST runs no engine process, or provides its own engine
    environment (pdkit_node.engine_venv: pdkit installs no engine there).

    The release is the one the node's engine processes are rendered for (an engine's own
    sglang_version, else the cluster's); a node whose engines want different releases gets the
    cluster's (one engine environment per node)."""
    if host.node is None or host.node.engine_venv or not spec.placements(host):
        return None
    if spec.cluster.engine != "sglang":
        return (spec.cluster.engine, None)
    releases = {spec.engine_version(p.engine) for p in spec.placements(host)}
    return ("sglang", releases.pop() if len(releases) == 1 else spec.cluster.sglang_version)


def engine_python(spec: ClusterSpec, node: HostSpec) -> str:
    """argv[0] of every engine process on NODE (the host it runs on, for a rank of an engine
    spanning nodes too): `<engine_venv>/bin/python` where the node provides its own engine
    environment (pdkit_node.engine_venv), else the kit-managed engine environment's python
    (`engine_venv_dir`). The units, the GPU tier and the tests take it from here; pdkit's own
    services (health gates, pdkit-exporter, releases) always run from the node venv."""
    if node.node is not None and node.node.engine_venv:
        return venv_python(node.node.engine_venv)
    return venv_python(engine_venv_dir(spec))


def engine_service_venv(spec: ClusterSpec, node: HostSpec) -> str | None:
    """The venv link of pdkit's that NODE's engines run from, so that a new venv there restarts
    them (pdkit/agent/changes.py): the engine environment's link, or None where the node provides its
    own engine environment (pdkit never changes it). Never the node venv: a new node venv
    restarts only pdkit-exporter."""
    if node.node is not None and node.node.engine_venv:
        return None
    return engine_venv_dir(spec)


def venv_links(spec: ClusterSpec) -> tuple[str, ...]:
    """Every venv link pdkit switches on a host (a release keeps their targets for a rollback;
    the host-state fact reads their bundle markers): node, engine, router."""
    return (venv_dir(spec), engine_venv_dir(spec), router_venv_dir(spec))


def router_venv_dir(spec: ClusterSpec) -> str:
    # smg and sglang-router both install an `smg` command: the router gets its own venv
    return f"{spec.cluster.install_dir}/router-venv"


def sglang_args(spec: ClusterSpec, host: HostSpec, engine: Engine, rank: int = 0) -> list[str]:
    """The flags after `python -m sglang.launch_server` for one engine (HOST declares it); for
    an engine spanning nodes, of its rank RANK: every rank's argv is the same but --node-rank."""
    model = spec.engine_model(engine)
    tuning = spec.engine_tuning(engine)
    args: list[str] = ["--model-path", model.path]
    if model.tokenizer_path:
        args += ["--tokenizer-path", model.tokenizer_path]
    args += ["--served-model-name", model.name]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if model.load_format:
        args += ["--load-format", model.load_format]
    args += model_checksum_args(spec.engine_version(engine), model.checksum_source)

    args += ["--host", spec.engine_address(host), "--port", str(engine.port)]
    args += ["--tp-size", str(engine.tp_size)]
    if engine.dp != 1:
        args += ["--dp-size", str(engine.dp)]
    args += parallel_args(spec, host, engine, rank)
    # all GPUs stay visible to every engine (cgroup/device isolation breaks CUDA IPC for NIXL)
    args += ["--base-gpu-id", str(engine.gpus[0]), "--gpu-id-step", str(engine.gpu_step)]

    if engine.role != "unified":
        args += ["--disaggregation-mode", engine.role]
        args += ["--disaggregation-transfer-backend", spec.cluster.transfer_backend]
        if engine.role == "prefill":
            args += ["--disaggregation-bootstrap-port", str(engine.effective_bootstrap_port)]

    args += _cuda_graph_args(spec, engine)
    shared_fraction = shared_gpu_mem_fraction(host, engine)
    for name, flag in _VALUE_FLAGS:
        value = (shared_fraction if name == "mem_fraction_static" and shared_fraction is not None
                 else getattr(tuning, name))
        if value is not None:
            args += [flag, str(value)]
    # the switches, spelled once in LEVER_FLAGS
    if tuning.value("overlap_schedule") is False:
        args.append(LEVER_FLAGS["overlap_schedule"])
    if tuning.value("torch_compile"):
        args.append(LEVER_FLAGS["torch_compile"])
    if tuning.radix_cache is False:
        args.append(LEVER_FLAGS["radix_cache"])
    if tuning.decode_radix_cache and engine.role == "decode":
        args.append(LEVER_FLAGS["decode_radix_cache"])
    if tuning.hicache:
        args.append(LEVER_FLAGS["hicache"])
    if not custom_all_reduce_enabled(spec, host, engine):
        args.append("--disable-custom-all-reduce")
    spec_dec = tuning.speculative
    if spec_dec is not None:
        args += ["--speculative-algorithm", spec_dec.algorithm]
        if spec_dec.draft_model_path:
            args += ["--speculative-draft-model-path", spec_dec.draft_model_path]
        if spec_dec.num_steps is not None:
            args += ["--speculative-num-steps", str(spec_dec.num_steps)]
        if spec_dec.eagle_topk is not None:
            args += ["--speculative-eagle-topk", str(spec_dec.eagle_topk)]
        if spec_dec.num_draft_tokens is not None:
            args += ["--speculative-num-draft-tokens", str(spec_dec.num_draft_tokens)]
    if tuning.value("enable_metrics"):
        args.append("--enable-metrics")
    args += expert_args(spec, engine)
    args += list(engine.extra_args)
    return args


def model_checksum_args(version: str, source: str | None) -> list[str]:
    """The model's verification at start (pdkit_cluster.model.verify_checksum): `--model-checksum SOURCE`, spelled as
    SGLang VERSION's own parser has it (pdkit/upstream/parser_table.json, the option whose dest is model_checksum:
    the same `--model-checksum`, nargs '?', in 0.5.17's server_args.py and 0.5.23's arg_groups/fields/model.py).
    SOURCE is always given: without a value SGLang takes the model path for a hub id and asks the hub for its hashes."""
    if source is None:
        return []
    option = next((o for o in parsertable.table()["sglang"][version]["options"] if o["dest"] == "model_checksum"), None)
    if option is None:
        raise ValueError(f"SGLang {version} has no --model-checksum: remove verify_checksum from the model, or pin a "
                         f"release that has it ({', '.join(sorted(SGLANG_RELEASES))})")
    return [option["flags"][0], source]


def dist_init_addr(spec: ClusterSpec, host: HostSpec, engine: Engine) -> str:
    """host:port where the ranks of an engine spanning nodes meet: rank 0's address (HOST)."""
    address = spec.engine_address(host)
    return f"[{address}]:{engine.dist_init_port}" if ":" in address else f"{address}:{engine.dist_init_port}"


def parallel_args(spec: ClusterSpec, host: HostSpec, engine: Engine, rank: int = 0) -> list[str]:
    """Pipeline, expert and attention-DP sizes, and the multi-node rendezvous, per release."""
    release = SGLANG_RELEASES[spec.engine_version(engine)]
    args: list[str] = []
    if engine.pp != 1:
        args += ["--pp-size", str(engine.pp)]
    if engine.ep is not None:
        args += ["--ep-size", str(engine.ep)]
    attn_dp = engine.attn_dp or 1
    if attn_dp > 1:
        if release.attn_dp_size_flag:
            args += ["--attn-dp-size", str(attn_dp)]
        else:
            args += ["--dp-size", str(attn_dp), "--enable-dp-attention"]
    if engine.spans_nodes:
        args += ["--nnodes", str(engine.nnodes), "--node-rank", str(rank),
                 "--dist-init-addr", dist_init_addr(spec, host, engine)]
    return args


def expert_args(spec: ClusterSpec, engine: Engine) -> list[str]:
    """EPLB (same spelling in 0.5.17 and 0.5.23; --moe-a2a-backend is a _VALUE_FLAGS lever, its
    choices checked against the release's parser by pdkit.render.argvcheck)."""
    tuning = spec.engine_tuning(engine)
    args: list[str] = []
    if tuning.enable_eplb:
        args.append("--enable-eplb")
    if tuning.ep_num_redundant_experts is not None:
        args += ["--ep-num-redundant-experts", str(tuning.ep_num_redundant_experts)]
    return args


# tuning field -> SGLang flag, for the levers that are a plain "--flag value"
_VALUE_FLAGS: tuple[tuple[str, str], ...] = (
    ("num_continuous_decode_steps", "--num-continuous-decode-steps"),
    ("context_length", "--context-length"),
    ("mem_fraction_static", "--mem-fraction-static"),
    ("max_running_requests", "--max-running-requests"),
    ("max_queued_requests", "--max-queued-requests"),
    ("chunked_prefill_size", "--chunked-prefill-size"),
    ("page_size", "--page-size"),
    ("attention_backend", "--attention-backend"),
    ("sampling_backend", "--sampling-backend"),
    ("moe_runner_backend", "--moe-runner-backend"),
    ("moe_a2a_backend", "--moe-a2a-backend"),
    ("quantization", "--quantization"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("radix_eviction_policy", "--radix-eviction-policy"),
    ("hicache_ratio", "--hicache-ratio"),
    ("hicache_size_gb", "--hicache-size"),
    ("watchdog_timeout", "--watchdog-timeout"),
    ("decode_log_interval", "--decode-log-interval"),
    ("log_level", "--log-level"),
)


# tuning field -> the SGLang flag it renders when set (the plain values above, and the switches
# sglang_args renders from here): pdkit.render.argvcheck offers a lever only on a release whose parser has its flag
LEVER_FLAGS: dict[str, str] = {
    **dict(_VALUE_FLAGS),
    "torch_compile": "--enable-torch-compile",
    "overlap_schedule": "--disable-overlap-schedule",
    "radix_cache": "--disable-radix-cache",
    "decode_radix_cache": "--disaggregation-decode-enable-radix-cache",
    "hicache": "--enable-hierarchical-cache",
}


def _cuda_graph_args(spec: ClusterSpec, engine: Engine) -> list[str]:
    tuning = spec.engine_tuning(engine)
    release = SGLANG_RELEASES[spec.engine_version(engine)]
    assert release.per_phase_cuda_graph_flags, "only per-phase CUDA-graph releases are pinned"
    args: list[str] = []
    # a prefill engine never runs the decode graph (SGLang turns it off in PD prefill mode)
    if engine.role != "prefill":
        if not tuning.value("cuda_graph"):
            args += ["--cuda-graph-backend-decode", "disabled"]
        else:
            if tuning.cuda_graph_bs:
                args += ["--cuda-graph-bs-decode", *(str(b) for b in tuning.cuda_graph_bs)]
            if tuning.cuda_graph_max_bs is not None:
                args += ["--cuda-graph-max-bs-decode", str(tuning.cuda_graph_max_bs)]
    if engine.role != "decode" and tuning.prefill_cuda_graph is False:
        args += ["--cuda-graph-backend-prefill", "disabled"]
    return args


def engine_command(spec: ClusterSpec, host: HostSpec, engine: Engine, rank: int = 0,
                   node: HostSpec | None = None) -> list[str]:
    """The full ExecStart argv of an engine HOST declares (of its rank RANK, running on NODE,
    default HOST): the engine's python (`engine_python`), the engine module, the flags."""
    module = ENGINE_MODULES[spec.cluster.engine]
    return [engine_python(spec, node or host), "-m", module, *sglang_args(spec, host, engine, rank)]


def engine_env(spec: ClusterSpec, host: HostSpec, engine: Engine, node: HostSpec | None = None) -> dict[str, str]:
    """The engine's own environment (NCCL and UCX live in the node's env files); NODE is where
    this rank runs (default HOST, which declares the engine)."""
    node = node or host
    tuning = spec.engine_tuning(engine)
    model = spec.engine_model(engine)
    env = {
        "HOME": f"/var/lib/{spec.cluster.service_user}",
        "XDG_CACHE_HOME": f"/var/cache/{spec.cluster.service_user}",
        # log lines reach the journal as they are written (the health gate reads them)
        "PYTHONUNBUFFERED": "1",
        # every JIT/compile cache on a persistent path of this engine and release: never the unit's
        # private /tmp, never shared with the engine starting beside it (pdkit/agent/jitcache.py)
        **jitcache.cache_env(spec.cluster.service_user, engine.name, spec.engine_version(engine)),
    }
    if engine.role != "unified":
        # each rank's own address: its KV transfer endpoints are registered there
        env["SGLANG_HOST_IP"] = spec.engine_address(node)
        if spec.cluster.transfer_backend == "nixl":
            env["SGLANG_DISAGGREGATION_NIXL_BACKEND"] = "UCX"
        # the PD waits and heartbeats of the fault budget (pdkit/spec/faultbudget.py)
        env.update(faultbudget.engine_env(spec.cluster.fault_budget))
    if model.path.startswith("/"):
        # weights and tokenizer are on local disk: never wait on hub lookups (air-gapped nodes
        # stalled ~25 s per lookup on the GPU tier)
        env["HF_HUB_OFFLINE"] = "1"
    if tuning.value("allow_longer_context"):
        env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    if tuning.value("pcie_ipc_allreduce"):
        env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "1"
    if spec.cluster.engine == "sim":
        # the sim exports the metric families of the release the engine plans (pdkit.sim.metrics)
        env["PDKIT_SIM_SGLANG_VERSION"] = spec.engine_version(engine)
    env.update(engine.env)
    return dict(sorted(env.items()))


# The field that decides each variable pdkit renders into an engine's environment or its node's: an
# engine's `env` is read last and would silently override it, and every rule built on the rendered
# value with it (issue 46). Only variables a field owns: pdkit's own defaults without a field stay
# overridable by design (a JIT cache on another disk, tests/test_jitcache.py), and NCCL_PROTO is the
# acknowledged numerics lever `nccl_ll128_pcie` (pdkit/spec/numerics.py checks its effective value).
# Decided once here, beside the renderers.
RENDERED_ENV_OWNERS: dict[str, str] = {
    "HOME": "pdkit_cluster.service_user (its home directory)",
    "XDG_CACHE_HOME": "pdkit_cluster.service_user (its cache directory)",
    "SGLANG_HOST_IP": "pdkit_node.address (each rank's own address: its KV transfer endpoints)",
    "SGLANG_DISAGGREGATION_NIXL_BACKEND": "pdkit_cluster.transfer_backend",
    "HF_HUB_OFFLINE": "pdkit_cluster.model.path (a local path runs offline)",
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "tuning.allow_longer_context",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "tuning.pcie_ipc_allreduce",
    "PDKIT_SIM_SGLANG_VERSION": "sglang_version",
    "NCCL_P2P_LEVEL": "pdkit_node.nccl_p2p_level (or pdkit_node.nccl_profile)",
    "NCCL_P2P_DISABLE": "pdkit_node.nccl_profile (pcie-p2p-off)",
    "NCCL_IB_HCA": "pdkit_node.nccl_ib_hca",
    "NCCL_IB_DISABLE": "pdkit_node.nccl_net",
    "NCCL_SOCKET_IFNAME": "pdkit_node.nic",
    "UCX_NET_DEVICES": "pdkit_node.ucx_net_devices",
    "UCX_TLS": "pdkit_node.ucx_net_devices (unset: same-node PD over cuda_ipc)",
    **{var: f"pdkit_cluster.fault_budget.{field}" for field, var in sglang_pd.ENGINE_VARIABLES.items()},
}


def rendered_env(spec: ClusterSpec, host: HostSpec, engine: Engine) -> dict[str, str]:
    """Pure: the environment pdkit itself renders for ENGINE (declared by HOST), its `env` left out: the
    engine's own variables and those of every node it runs on (NCCL, UCX)."""
    bare = engine.model_copy(update={"env": {}})
    env = engine_env(spec, host, bare)
    for node in spec.engine_hosts(host, engine):
        env.update({**nccl_env(spec, node), **ucx_env(spec, node)})
    return env


def nccl_env(spec: ClusterSpec, host: HostSpec) -> dict[str, str]:
    """NCCL settings for a node, from its NCCL profile and engine layout (docs/tuning.md)."""
    node = host.node
    assert node is not None
    env: dict[str, str] = {}
    has_ib = bool(node.ucx_net_devices and node.ucx_net_devices.startswith("mlx"))
    if node.nccl_profile == "pcie":
        # NCCL's default P2P level (PXB) only allows P2P through PCIe switches; engines inside one
        # NUMA node need PHB, engines spanning sockets need SYS, else traffic bounces via host memory
        env["NCCL_P2P_LEVEL"] = default_p2p_level(host) if node.nccl_p2p_level is None else node.nccl_p2p_level
        # never LL128 on PCIe: it can corrupt data there
        env["NCCL_PROTO"] = "LL,Simple"
    elif node.nccl_profile == "pcie-p2p-off":
        # IOMMU/ACS on: init completes, then the first all-reduce spins forever (nccl#1999)
        env["NCCL_P2P_DISABLE"] = "1"
        env["NCCL_PROTO"] = "LL,Simple"
    if node.nccl_net == "ib":
        # across nodes over InfiniBand/RoCE: only the HCAs named
        env["NCCL_IB_HCA"] = node.nccl_ib_hca or ""
    elif node.nccl_net == "socket" or (node.nccl_profile in ("pcie", "pcie-p2p-off") and not has_ib):
        env["NCCL_IB_DISABLE"] = "1"
    if node.nic:
        env["NCCL_SOCKET_IFNAME"] = node.nic
    return dict(sorted(env.items()))


def default_p2p_level(host: HostSpec) -> str:
    """The pcie profile's NCCL_P2P_LEVEL without an explicit one: SYS if an engine spans NUMA nodes, else PHB."""
    return "SYS" if _any_engine_spans_numa(host) else "PHB"


def _any_engine_spans_numa(host: HostSpec) -> bool:
    node = host.node
    assert node is not None
    numa = node.gpus.numa
    if numa is None:
        return True  # unknown topology: allow P2P everywhere rather than fall back to host memory
    return any(len({numa[g] for g in e.gpus if g < len(numa)}) > 1 for e in node.engines)


def ucx_env(spec: ClusterSpec, host: HostSpec) -> dict[str, str]:
    """UCX settings for NIXL KV transfer on a node that runs PD engines."""
    node = host.node
    assert node is not None
    if spec.cluster.transfer_backend != "nixl" or all(p.engine.role == "unified" for p in spec.placements(host)):
        return {}
    env: dict[str, str] = {}
    if node.ucx_net_devices:
        # cross-node PD: without it transfers hang until the 300 s timeout
        env["UCX_NET_DEVICES"] = node.ucx_net_devices
    else:
        # same-node PD: prefill writes into decode memory over cuda_ipc (PUT works without NVLink)
        env["UCX_TLS"] = "cuda_ipc,cuda_copy,sm,self,tcp"
    # the profile of every KV path a hand-off from or to this host's engines takes (both ends need it)
    for path in kv_paths_touching(spec, host.name):
        env.update(path.ucx_env)
    return dict(sorted(env.items()))


def kv_paths_touching(spec: ClusterSpec, host_name: str) -> list[KvPath]:
    """The KV paths (pdkit.spec.kvcost.KV_PATHS) of the hand-offs a prefill or a decode on HOST_NAME takes part in."""
    found: dict[str, KvPath] = {}
    for (prefill_host, _engine), paths in prefill_kv_paths(spec).items():
        for decode_host, path in paths:
            if host_name in (prefill_host, decode_host):
                found[path.name] = path
    return [found[name] for name in sorted(found)]


def secrets_env(spec: ClusterSpec) -> dict[str, str]:
    """Secrets for the mode-0600 env file. Values are real: never log or print this dict."""
    secrets = spec.cluster.secrets
    env: dict[str, str] = {}
    if secrets.hf_token is not None:
        env["HF_TOKEN"] = secrets.hf_token.get_secret_value()
    return env


def router_api_key_text(spec: ClusterSpec) -> str | None:
    """The router's API key file (mode 0600 root; systemd hands it to the router as a credential), or None."""
    secrets = spec.cluster.secrets
    if secrets.router_api_key is None:
        return None
    return secrets.router_api_key.get_secret_value() + "\n"


# the credential name the router unit loads the key file as (LoadCredential=); the launcher
# reads $CREDENTIALS_DIRECTORY/<this> and hands the key to smg in-process, so it never reaches
# argv or the environment (smg has no variable for it)
ROUTER_API_KEY_CREDENTIAL = "router-api-key"


def router_api_key_path(spec: ClusterSpec) -> str:
    return f"{spec.cluster.config_dir}/router-api-key"


def router_user(spec: ClusterSpec) -> str:
    """The router's own user: an engine (the service user) cannot read the router's process or key."""
    return f"{spec.cluster.service_user}-router"


def router_launcher_path(spec: ClusterSpec) -> str:
    return f"{spec.cluster.install_dir}/bin/pdkit-router-launch"


def engine_url(spec: ClusterSpec, host: HostSpec, engine: Engine) -> str:
    return f"http://{spec.engine_address(host)}:{engine.port}"


def router_address(host: HostSpec) -> str:
    assert host.router is not None
    return host.router.address or host.address


def router_args(spec: ClusterSpec, host: HostSpec) -> list[str]:
    """The router's own arguments (after `smg launch` / `python -m sglang_router.launch_router`)."""
    router = host.router
    assert router is not None
    workers = spec.router_workers(host)
    args: list[str] = []
    if any(worker_type(e.role) != REGULAR for _, e in workers):
        args.append("--pd-disaggregation")
        for h, e in workers:
            if e.role == "prefill":
                # an explicit bootstrap port always: without one the router sends none
                args += ["--prefill", engine_url(spec, h, e), str(e.effective_bootstrap_port)]
        for h, e in workers:
            if e.role == "decode":
                args += ["--decode", engine_url(spec, h, e)]
        args += ["--prefill-policy", router.prefill_policy, "--decode-policy", spec.router_decode_policy(host)]
    else:
        args += ["--worker-urls", *(engine_url(spec, h, e) for h, e in workers)]
        args += ["--policy", router.policy]
    address = router_address(host)
    args += ["--host", address, "--port", str(router.port)]
    args += ["--prometheus-host", address, "--prometheus-port", str(router.prometheus_port)]
    args += ["--health-check-interval-secs", str(router.health_check_interval_secs)]
    args += ["--health-failure-threshold", str(router.health_failure_threshold)]
    args += ["--health-success-threshold", str(router.health_success_threshold)]
    args += ["--worker-startup-check-interval", str(router.worker_startup_check_interval_secs)]
    # smg and sglang-router drain in-flight requests this long on SIGTERM (both parsers:
    # pdkit/upstream/parser_table.json)
    args += ["--shutdown-grace-period-secs", str(router.shutdown_grace_period_secs)]
    # no --remove-unhealthy-workers: smg 1.13 never takes a removed worker back on the same address
    args += router_breaker_args()
    # a served request logs nothing at warn, the default (pdkit/agent/journald.py): the journal keeps the kit's evidence
    args += ["--log-level", router.log_level]
    # request timeout, retries, health-check timeout, PD admission wait: the fault budget (pdkit/spec/faultbudget.py)
    args += faultbudget.router_args(spec.cluster.fault_budget, *spec.router_release(host),
                                    pd="--pd-disaggregation" in args)
    if ROUTER_RELEASES[spec.router_release(host)].dp_aware and any((e.attn_dp or 1) > 1 for _, e in workers):
        # attention-DP workers: route each request to one DP rank of the worker
        args.append("--dp-aware")
    args += list(router.extra_args)
    return args


# The routers' circuit breaker (smg 1.13.0 and sglang-router 0.3.2 take the same flags, defaults
# failure 10, success 3, timeout 60 s, window 120 s: smg/router_args.py, sglang_router/router_args.py).
# With a 60 s timeout a worker that was killed and came back in 7 s sat idle until ~62 s while
# /workers called it healthy (issue #18 item 6): its breaker stays open for the whole timeout.
# A 3 s timeout lets the breaker try the worker again (half-open) 3 s after it opened, and two
# successful requests close it, so a recovered worker gets traffic seconds after it is healthy (readmission_bound_s);
# a worker still down fails its trial request and the breaker opens again for another 3 s.
ROUTER_BREAKER = {"cb-failure-threshold": 10, "cb-success-threshold": 2, "cb-timeout-duration-secs": 3,
                  "cb-window-duration-secs": 60}


def readmission_bound_s(router, health_check_timeout_s: float) -> float:
    """Worst time from a restarted worker answering /health to the router sending it requests again.

    Two things gate it. The router's health checks may have marked it down just before it came back
    (a sim engine restarts in ~6.5 s, right at 2 failed checks 5 s apart); then it needs
    `health_success_threshold` passing checks, `health_check_interval_secs` apart, each up to the
    check timeout. And its breaker, opened by the requests the kill failed, lets one trial through
    per cb-timeout; a trial that fails (one that lands in the engine's start-up window answers 503:
    seen in smg's journal, tests/lab/test_router_recovery_lab.py) opens it again. Allowed: one check
    missed beyond the threshold and two failed trials. Measured on the lab: 0.3-5.6 s idle in 18
    kills; once 14.6 s in CI (cause not captured; the test now prints the router's view over time).
    """
    checks = (router.health_success_threshold + 1) * router.health_check_interval_secs + health_check_timeout_s
    return checks + 2 * ROUTER_BREAKER["cb-timeout-duration-secs"]


def router_breaker_args() -> list[str]:
    return [a for name, value in ROUTER_BREAKER.items() for a in (f"--{name}", str(value))]



# seconds systemd waits beyond the router's drain before SIGKILL: the process' own exit after the drain
ROUTER_STOP_MARGIN_S = 30


def router_stop_timeout_s(host: HostSpec) -> int:
    """The router unit's TimeoutStopSec: above --shutdown-grace-period-secs, so that systemd never
    SIGKILLs a router that is still draining."""
    assert host.router is not None
    return host.router.shutdown_grace_period_secs + ROUTER_STOP_MARGIN_S


def router_command(spec: ClusterSpec, host: HostSpec) -> list[str]:
    release = ROUTER_RELEASES[spec.router_release(host)]
    bin_dir = f"{router_venv_dir(spec)}/bin"
    if spec.cluster.secrets.router_api_key is not None:
        # validation allows a key only with smg: its launcher takes the key from the environment
        return [f"{bin_dir}/python", router_launcher_path(spec), *release.launcher[1:], *router_args(spec, host)]
    launcher = [f"{bin_dir}/{release.launcher[0]}", *release.launcher[1:]]
    return [*launcher, *router_args(spec, host)]
