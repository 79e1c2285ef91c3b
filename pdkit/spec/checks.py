"""cross_checks(): the rules that need more than one section or host (pdkit.inventory.loader runs it once
every section has validated on its own), and the per-node and per-engine checks it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdkit.spec.addresses import check_addresses, host_ports
from pdkit.spec.cluster import ClusterSpec, HostSpec, Problem
from pdkit.spec.credentials import alerting_problems, router_auth_problems, secret_problems
from pdkit.spec.facts import (
    MAX_SHARED_GPU_FRACTION,
    decode_graph_required_bs,
    effective_decode_graph_max_bs,
    engine_model_paths,
    engine_numa_node,
    gpu_share_group,
    pairing_sets,
)
from pdkit.spec.faultbudget import ROUTER_FLAGS as ROUTER_BUDGET_FLAGS
from pdkit.spec.faultbudget import UNIT_BOUNDS, RetrySchedule, queue_wait_warnings, router_flags
from pdkit.spec.faultbudget import problems as fault_budget_problems
from pdkit.spec.fields import HIDDEN_FROM_ENGINES, hidden_from_engines
from pdkit.spec.ignored import ignored_by_mode_problems, ignored_settings
from pdkit.spec.kvcost import KV_PATHS, net_devices_are_rdma, portless_verbs_devices
from pdkit.spec.models import Engine
from pdkit.spec.numerics import check_by_design
from pdkit.spec.pcie import declared_pcie_problems
from pdkit.spec.spanning import check_spanning, parallel_problems
from pdkit.spec.startup import effective_page, startup_check_problems, tuning_origin
from pdkit.upstream.parsertable import router_default, router_parser
from pdkit.upstream.versions import SGLANG_RELEASES

__all__ = [
    "ROUTER_START_RULES", "RouterStartRule", "cross_checks", "router_retry_schedule", "router_start_problems",
    "router_values",
]


def cross_checks(spec: ClusterSpec) -> list[Problem]:
    """Rules across sections and hosts. Returns every problem, errors and warnings."""
    problems: list[Problem] = []
    add = problems.append
    cluster = spec.cluster

    if not spec.gpu_hosts:
        add(Problem("<inventory>", "pdkit_node", "no host declares pdkit_node: a cluster needs at least one GPU node"))
    if spec.gpu_hosts and not spec.engines():
        add(Problem("<inventory>", "pdkit_node.engines",
                    "no GPU node declares an engine: give at least one pdkit_node.engines entry (e.g. a prefill and a "
                    "decode)"))
    for h in spec.gpu_hosts:
        portless = portless_verbs_devices(h.node.ucx_net_devices if h.node else None)
        if portless:
            # UCX lists a verbs resource as device:port (`ucx_info -d`); a bare name matches none of them
            add(Problem(h.name, "pdkit_node.ucx_net_devices",
                        f"{', '.join(portless)} without its port: UCX names a verbs device with the port it uses "
                        f"({portless[0]}:1), so the bare name matches no UCX resource and KV falls back to another "
                        f"transport or fails; valid: e.g. {portless[0]}:1 (`ucx_info -d` lists them)", "warning"))
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
                add(Problem(host.name, f"{at}.name",
                            f"engine name {engine.name!r} is already used by engines[{names[engine.name]}]; names must "
                            "be unique on a node"))
            names.setdefault(engine.name, i)
            for gpu in engine.gpus:
                if gpu >= node.gpus.count:
                    add(Problem(host.name, f"{at}.gpus",
                                f"GPU {gpu} does not exist: the node declares {node.gpus.count} GPUs (valid indices "
                                f"0-{node.gpus.count - 1})"))
                elif gpu in used_gpus and (engine.gpu_share is None or node.engine(used_gpus[gpu]).gpu_share is None):
                    add(Problem(host.name, f"{at}.gpus",
                                f"GPU {gpu} is already used by engine {used_gpus[gpu]!r}; engines may share a GPU only "
                                "when each sets gpu_share (its share of the GPU's memory, e.g. 0.4 and 0.45)"))
                elif gpu in used_gpus and node.engine(used_gpus[gpu]).gpus != engine.gpus:
                    add(Problem(host.name, f"{at}.gpus",
                                f"shares GPU {gpu} with engine {used_gpus[gpu]!r} but their GPU lists differ "
                                f"({list(engine.gpus)} vs {list(node.engine(used_gpus[gpu]).gpus)}); engines that "
                                "share GPUs must list the same GPUs"))
                else:
                    used_gpus.setdefault(gpu, engine.name)
            if engine.gpu_share is not None:
                group = gpu_share_group(host, engine)
                if not group:
                    add(Problem(host.name, f"{at}.gpu_share",
                                f"gpu_share is for engines that share their GPUs, but no other engine on {host.name} "
                                f"lists GPUs {list(engine.gpus)} with a gpu_share; remove it (use "
                                "tuning.mem_fraction_static for an engine alone on its GPUs)"))
                elif spec.engine_tuning(engine).mem_fraction_static is not None:
                    add(Problem(host.name, f"{at}.tuning.mem_fraction_static",
                                "an engine on shared GPUs gets --mem-fraction-static from the gpu_share of the engines "
                                "started before it (pdkit.spec.shared_gpu_mem_fraction); remove mem_fraction_static "
                                "from its tuning layers (all / role / engine)"))
                elif group[-1].name == engine.name and sum(e.gpu_share for e in group) > MAX_SHARED_GPU_FRACTION:  # type: ignore[misc]
                    total = sum(e.gpu_share for e in group)  # type: ignore[misc]
                    add(Problem(host.name, f"{at}.gpu_share",
                                f"the engines sharing GPUs {list(engine.gpus)} ({', '.join(e.name for e in group)}) "
                                f"take {total:.2f} of their memory together; at most {MAX_SHARED_GPU_FRACTION} leaves "
                                "room for CUDA contexts, graphs and activations"))
            if engine.pp == 1 and not engine.spans_nodes and engine.tp_size * engine.dp != len(engine.gpus):
                add(Problem(host.name, f"{at}.tp",
                            f"tp {engine.tp_size} x dp {engine.dp} = {engine.tp_size * engine.dp} but the engine has "
                            f"{len(engine.gpus)} GPUs {list(engine.gpus)}; tp x dp must equal the GPU count"))
            for field, why in parallel_problems(spec, engine) + startup_check_problems(spec, engine, node):
                add(Problem(host.name, field if field.startswith("pdkit_cluster") else f"{at}.{field}", why))
            if engine.bootstrap_port is not None and engine.role != "prefill":
                add(Problem(host.name, f"{at}.bootstrap_port",
                            f"only prefill engines serve a bootstrap port; this engine's role is {engine.role!r} "
                            "(remove bootstrap_port)"))
            numa = node.gpus.numa
            if engine.numa_node is not None and numa is not None:
                gpu_nodes = {numa[g] for g in engine.gpus if g < len(numa)}
                if gpu_nodes and gpu_nodes != {engine.numa_node}:
                    add(Problem(host.name, f"{at}.numa_node",
                                f"numa_node {engine.numa_node} but its GPUs {list(engine.gpus)} sit on NUMA node(s) "
                                f"{sorted(gpu_nodes)}; bind to the GPUs' NUMA node"))
            elif (engine.numa_node is None and numa is not None and engine_numa_node(host, engine) is None
                  and all(g < len(numa) for g in engine.gpus)):
                add(Problem(host.name, f"{at}.gpus",
                            f"GPUs {list(engine.gpus)} span NUMA nodes {sorted({numa[g] for g in engine.gpus})}: the "
                            "engine is not NUMA-bound (cross-NUMA TP runs over the inter-socket link)", "warning"))
            _check_engine_tuning(spec, host, engine, at, add)
        for problem in host_memory_problems(spec, host):
            add(problem)
        # the placement rules on the declared PCIe layout (the preflight runs them on the probe's facts)
        problems += declared_pcie_problems(host)

        if node.numa_nodes is not None:
            for i, n in enumerate(node.gpus.numa or ()):
                if n >= node.numa_nodes:
                    add(Problem(host.name, f"pdkit_node.gpus.numa[{i}]",
                                f"NUMA node {n} does not exist: the node declares numa_nodes {node.numa_nodes} (valid "
                                f"ids 0-{node.numa_nodes - 1})"))
            for i, engine in enumerate(node.engines):
                if engine.numa_node is not None and engine.numa_node >= node.numa_nodes:
                    add(Problem(host.name, f"pdkit_node.engines[{i}].numa_node",
                                f"NUMA node {engine.numa_node} does not exist: the node declares numa_nodes "
                                f"{node.numa_nodes} (valid ids 0-{node.numa_nodes - 1})"))
        if node.nccl_p2p_level is not None and node.nccl_profile != "pcie":
            add(Problem(host.name, "pdkit_node.nccl_p2p_level",
                        "nccl_p2p_level is only used by the 'pcie' NCCL profile; this node's profile is "
                        f"{node.nccl_profile!r} (remove nccl_p2p_level or set nccl_profile: pcie)"))
        if node.nccl_profile == "pcie-p2p-off":
            for i, engine in enumerate(node.engines):
                if spec.engine_tuning(engine).custom_all_reduce == "on":
                    add(Problem(host.name, f"pdkit_node.engines[{i}].tuning.custom_all_reduce",
                                "custom all-reduce needs GPU peer-to-peer, but the 'pcie-p2p-off' profile disables it "
                                "(NCCL_P2P_DISABLE=1): use 'auto' or 'off'"))
        if node.gpu == "nvidia" and node.gpus.sm_major >= 10 and node.nccl_profile == "default" and node.gpus.count > 1:
            add(Problem(host.name, "pdkit_node.nccl_profile",
                        "Blackwell node with the default NCCL profile: on PCIe-only nodes choose 'pcie' (NCCL's "
                        "default P2P level falls back to host memory across root complexes)", "warning"))
        if node.engine_venv is not None:
            _check_engine_venv(spec, host, add)

    for host in spec.hosts:
        seen: dict[int, str] = {}
        for port, field in host_ports(spec, host):
            if port < 1024:
                add(Problem(host.name, field, f"port {port} is privileged: pdkit's services run as "
                            f"{cluster.service_user} and no unit grants CAP_NET_BIND_SERVICE; use a port from 1024 to "
                            "65535"))
            if port in seen:
                add(Problem(host.name, field, f"port {port} is already used by {seen[port]}; every port on a host must "
                            "be unique"))
            else:
                seen[port] = field

    check_spanning(spec, add)
    _check_model_visibility(spec, add)
    _check_pd_groups(spec, add)
    _check_kv_over_tcp(spec, add)
    check_addresses(spec, add)
    check_by_design(spec, add)
    problems += ignored_by_mode_problems(spec)

    declared = {f"{h.name}/{e.name}" for h, e in spec.engines()}
    for host in spec.router_hosts:
        router = host.router
        assert router is not None
        for i, ref in enumerate(router.workers or ()):
            if ref not in declared:
                valid = ", ".join(sorted(declared)) or "none declared"
                add(Problem(host.name, f"pdkit_router.workers[{i}]",
                            f"{ref!r} is not a declared engine; valid: {valid}"))
        if router.workers is not None and not router.workers:
            add(Problem(host.name, "pdkit_router.workers",
                        "the router lists no engine: name its engines as 'host/engine', or leave workers unset for "
                        "every engine of the cluster"))
        workers = spec.router_workers(host)
        roles = {e.role for _, e in workers}
        pd_mode = any(e.role != "unified" for _, e in workers)
        ignored = ("prefill_policy", "decode_policy") if not pd_mode else ("policy",)
        for field in ignored:
            if field in router.model_fields_set and workers:
                mode, used = ("PD", "prefill_policy and decode_policy") if pd_mode else ("plain (non-PD)", "policy")
                add(Problem(host.name, f"pdkit_router.{field}",
                            f"ignored: this router runs in {mode} mode, where only {used} apply; remove {field}",
                            "warning"))
        if "unified" in roles and roles - {"unified"}:
            add(Problem(host.name, "pdkit_router.workers",
                        "the router mixes unified and prefill/decode engines; a router runs either in PD mode or not"))
        pd_hosts = sorted({h.name: h for h, e in workers if e.role != "unified"}.values(), key=lambda h: h.name)
        if len(pd_hosts) > 1 and cluster.transfer_backend == "nixl":
            # the router pairs any prefill with any decode, so KV crosses nodes
            for h in pd_hosts:
                if h.node is not None and h.node.gpu == "nvidia" and not h.node.ucx_net_devices:
                    pd_names = [x.name for x in pd_hosts]
                    shown = ", ".join(pd_names[:4]) + (f" and {len(pd_names) - 4} more" if len(pd_names) > 4 else "")
                    add(Problem(h.name, "pdkit_node.ucx_net_devices",
                                f"the router on {host.name} pairs prefill and decode engines across hosts ({shown}): "
                                "set ucx_net_devices (e.g. 'mlx5_0:1'), without it cross-node NIXL transfers hang "
                                "until the 300 s timeout; or give each node its own router (pdkit_router.workers)"))
        _check_power_of_two(spec, host, workers, pd_mode, add)
        # the rendered values the router's own start-up check refuses (ROUTER_START_RULES, below)
        for field, message in router_start_problems(spec, host):
            add(Problem(host.name, field, message))
        if roles and roles <= {"prefill", "decode"} and roles != {"prefill", "decode"}:
            add(Problem(host.name, "pdkit_router.workers",
                        f"the router fronts only {sorted(roles)} engines; PD mode needs at least one prefill and one "
                        "decode"))

    host_names = {h.name for h in spec.hosts}
    for host in spec.monitoring_hosts:
        assert host.monitoring is not None
        for i, target in enumerate(host.monitoring.scrape_hosts or ()):
            if target not in host_names:
                add(Problem(host.name, f"pdkit_monitoring.scrape_hosts[{i}]",
                            f"{target!r} is not a host in this inventory; valid: {', '.join(sorted(host_names))}"))
        real = [h.name for h in spec.gpu_hosts if h.node is not None and h.node.gpu != "none"]
        if host.monitoring.lab_alert_speedup > 1 and real:
            add(Problem(host.name, "pdkit_monitoring.lab_alert_speedup",
                        f"{host.monitoring.lab_alert_speedup} shortens every alert window for the lab, but "
                        f"{', '.join(real)} {'is a real node' if len(real) == 1 else 'are real nodes'} (gpu: nvidia): "
                        "an alert would page on a normal engine restart; valid: 1 (the real windows), or more only "
                        "where every node is gpu: none"))
        problems += alerting_problems(host, cluster.secrets)
    if len(spec.monitoring_hosts) > 1:
        add(Problem(spec.monitoring_hosts[1].name, "pdkit_monitoring",
                    f"only one monitoring host is supported; {spec.monitoring_hosts[0].name} already declares "
                    "pdkit_monitoring"))

    if (cluster.secrets.router_api_key is not None
        and any(spec.router_release(h)[0] == "sglang-router" for h in spec.router_hosts)):
        add(Problem(spec.router_hosts[0].name, "pdkit_cluster.secrets.router_api_key",
                    "sglang-router 0.3.2 only takes its API key on the command line, which would leak it; use package "
                    "smg or drop the key"))
    problems += router_auth_problems(spec)
    problems += secret_problems(spec)
    budget = cluster.fault_budget
    for host in spec.router_hosts:
        router = host.router
        assert router is not None
        for field, message in fault_budget_problems(budget, router.health_check_interval_secs,
                                                    router.health_failure_threshold, spec.is_pd(),
                                                    router_retry_schedule(spec, host)):
            add(Problem(host.name, field, message))
        for field in budget.model_fields_set - set(router_flags(*spec.router_release(host))):
            if field.startswith("router_"):
                flag = ROUTER_BUDGET_FLAGS[field]
                add(Problem(host.name, f"pdkit_cluster.fault_budget.{field}",
                            f"ignored: {' '.join(spec.router_release(host))} has no {flag} "
                            f"(pdkit/upstream/parser_table.json); "
                            "remove it, or use a router that has it (smg)", "warning"))
    # a burst of the declared workload that would run a PD timeout out with nothing dead (queueing)
    for host_name, field, message in queue_wait_warnings(spec):
        add(Problem(host_name, field, message, "warning"))
    # a cluster-wide setting reached through several engines of one host is one problem
    return list(dict.fromkeys(problems))


# ---- what the routers refuse at start (issue 46) ------------------------------------------------------
#
# Both routers check their configuration in Router.start(), before they serve (smg: the Rust
# ConfigValidator, model_gateway/src/config/validation.rs; sglang-router 0.3.2: sgl-router/src/config/
# validation.rs, same name and shape), and the Python binding refuses an integer its Rust field cannot
# hold (OverflowError in Router.from_args: a u32 threshold above 4294967295, a negative value of an
# unsigned one). `pdkit.contract.check_router_argvs` stops before start(), so it sees the overflow but
# not the validator: each rendered setting's refusals are tabled here, per release, and `pdkit validate`
# refuses them (router_start_problems). Every row was run: tests/test_router_start_refusals.py launches
# the real smg 1.13.0 and sglang-router 0.3.2 with pdkit's argv, one row's refused value at a time, and
# with every row's least accepted value. smg 1.13.0's Rust source is not in the snapshots read here
# (smg-project/smg and lightseekorg/smg stop at v1.9.0+, whose validation.rs has the same retry, port,
# request-timeout and start-up interval rules); its health_check.* rules are newer and quoted from the
# 1.13.0 binary's own refusal. Fields whose model bound already refuses a value (pdkit's Port,
# IntervalSeconds, ge=1) keep their row: the row records why, the test proves it. Not a row: smg 1.13.0
# also refuses --prometheus-port equal to --port ("each listener needs its own port"), which the port
# check above refuses first (every port on a host must be unique).


BOTH_ROUTERS = ("smg 1.13.0", "sglang-router 0.3.2")
U32_MAX = 4_294_967_295


@dataclass(frozen=True)
class RouterStartRule:
    """The values of one rendered router flag that a router refuses at start."""

    flag: str
    # the spec field it is rendered from
    field: str
    # the least value accepted (None: no floor), or the flag whose value is the floor
    low: float | None = None
    low_flag: str | None = None
    # the most value accepted (None: no ceiling)
    high: float | None = None
    # the releases ("package version") that refuse it at start
    refused_by: tuple[str, ...] = BOTH_ROUTERS
    # what the router says when it refuses
    says: str = ""
    # where the rule lives in the router's code, per release
    source: str = ""
    # what the releases that do start with it do instead, and why pdkit refuses it for them too
    otherwise: str = ""


_VALIDATION = ("ConfigValidator (smg model_gateway/src/config/validation.rs; sglang-router 0.3.2 "
               "sgl-router/src/config/validation.rs)")


def _binding(rust_type: str) -> str:
    return (f"the Python binding's conversion to the Rust {rust_type} field (smg/router.py Router.from_args -> "
            "smg_rs.Router; sglang_router/router.py -> sglang_router_rs.Router, 0.3.2)")


def _past_u32(flag: str, field: str, rust_field: str) -> RouterStartRule:
    """A value above its Rust u32 field RUST_FIELD: the binding's OverflowError (both routers)."""
    return RouterStartRule(flag, field, high=U32_MAX,
                           says=f"OverflowError: out of range integral type conversion attempted while processing "
                                f"'{rust_field}'", source=_binding("u32"))


def _negative_u64(flag: str, field: str, rust_field: str, refused_by: tuple[str, ...] = BOTH_ROUTERS,
                  otherwise: str = "") -> RouterStartRule:
    """A negative value of its Rust u64 field RUST_FIELD: the binding's OverflowError."""
    return RouterStartRule(flag, field, low=0, refused_by=refused_by,
                           says=f"OverflowError: can't convert negative int to unsigned while processing "
                                f"'{rust_field}'", source=_binding("u64"), otherwise=otherwise)


def _smg_health_check(flag: str, field: str, setting: str, zero: str, otherwise: str,
                      source: str = "smg 1.13.0 Router.start()") -> RouterStartRule:
    """smg 1.13.0 refuses its health_check SETTING below 1 (`FLAG 0` ZERO); OTHERWISE: sglang-router 0.3.2's way."""
    return RouterStartRule(flag, field, low=1, refused_by=("smg 1.13.0",),
                           says=f"health_check.{setting}: Must be >= 1 ({flag} 0 {zero})", source=source,
                           otherwise=otherwise)


ROUTER_START_RULES: tuple[RouterStartRule, ...] = (
    RouterStartRule("--port", "pdkit_router.port", low=1, says="port: Port must be > 0",
                    source=f"{_VALIDATION} validate_server_settings"),
    RouterStartRule("--prometheus-port", "pdkit_router.prometheus_port", low=1, says="metrics.port: Port must be > 0",
                    source=f"{_VALIDATION} validate_metrics"),
    _smg_health_check("--health-check-interval-secs", "pdkit_router.health_check_interval_secs", "check_interval_secs",
                      "would probe every worker in a busy loop; --disable-health-check turns probing off",
                      source="smg 1.13.0 Router.start() (the binary's refusal; newer than the source read)",
                      otherwise="sglang-router 0.3.2 starts, then its health checker panics (src/core/"
                                "worker_registry.rs:653, 'Started health checker for workers with 0s interval') and no "
                                "worker is ever marked down: pdkit refuses 0 for both"),
    _smg_health_check("--health-failure-threshold", "pdkit_router.health_failure_threshold", "failure_threshold",
                      "would fail a worker without a probe",
                      otherwise="sglang-router 0.3.2 starts with 0; pdkit refuses it for both (no probe could fail)"),
    _past_u32("--health-failure-threshold", "pdkit_router.health_failure_threshold", "health_failure_threshold"),
    _smg_health_check("--health-success-threshold", "pdkit_router.health_success_threshold", "success_threshold",
                      "would pass a worker without a probe",
                      otherwise="sglang-router 0.3.2 starts with 0; pdkit refuses it for both"),
    _past_u32("--health-success-threshold", "pdkit_router.health_success_threshold", "health_success_threshold"),
    RouterStartRule("--worker-startup-check-interval", "pdkit_router.worker_startup_check_interval_secs", low=1,
                    says="worker_startup_check_interval_secs: Must be > 0",
                    source=f"{_VALIDATION} validate_server_settings"),
    RouterStartRule("--request-timeout-secs", "pdkit_cluster.fault_budget.router_request_timeout_s", low=1,
                    says="request_timeout_secs: Must be > 0 (no '0 = no timeout')",
                    source=f"{_VALIDATION} validate_server_settings"),
    RouterStartRule("--retry-max-retries", "pdkit_cluster.fault_budget.router_max_retries", low=1,
                    says="retry.max_retries: Must be >= 1 (set to 1 to effectively disable retries)",
                    source=f"{_VALIDATION} validate_retry"),
    RouterStartRule("--retry-max-backoff-ms", "pdkit_cluster.fault_budget.router_max_backoff_ms",
                    low_flag="--retry-initial-backoff-ms", says="retry.max_backoff_ms: Must be >= initial_backoff_ms",
                    source=f"{_VALIDATION} validate_retry"),
    RouterStartRule("--retry-initial-backoff-ms", "pdkit_router.extra_args", low=1,
                    says="retry.initial_backoff_ms: Must be > 0", source=f"{_VALIDATION} validate_retry"),
    RouterStartRule("--retry-backoff-multiplier", "pdkit_router.extra_args", low=1.0,
                    says="retry.backoff_multiplier: Must be >= 1.0 (smg 1.13.0: Must be finite and >= 1.0)",
                    source=f"{_VALIDATION} validate_retry"),
    RouterStartRule("--retry-jitter-factor", "pdkit_router.extra_args", low=0.0, high=1.0,
                    says="retry.jitter_factor: Must be between 0.0 and 1.0", source=f"{_VALIDATION} validate_retry"),
    _negative_u64("--shutdown-grace-period-secs", "pdkit_router.shutdown_grace_period_secs",
                  "shutdown_grace_period_secs"),
    _negative_u64("--pd-admission-wait-secs", "pdkit_cluster.fault_budget.router_admission_wait_s",
                  "pd_admission_wait_secs", refused_by=("smg 1.13.0",),
                  otherwise="sglang-router 0.3.2 has no such flag (pdkit renders it for smg only)"),
    _smg_health_check("--health-check-timeout-secs", "pdkit_cluster.fault_budget.router_health_check_timeout_s",
                      "timeout_secs", "would time every probe out at once",
                      otherwise="sglang-router 0.3.2 starts with 0; pdkit's own floor is 2 for both (SGLang's /health "
                                "answers after 1 s at the earliest, pdkit/spec/faultbudget.py)"),
)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _fmt(value: float) -> str:
    return f"{value:g}" if not float(value).is_integer() else str(int(value))


def router_values(spec: ClusterSpec, host: HostSpec) -> dict[str, tuple[float, str]]:
    """{flag: (value, the field it comes from)} of HOST's router: each row's field, as pdkit.render.flags.router_args
    renders it (str() of the field; a budget field only where the release's parser has its flag), then the
    numeric flags of pdkit_router.extra_args read the way the router's argparse reads them (abbreviations
    resolved, the last one wins), each naming its pdkit_router.extra_args[i]. (Read from the spec, not from
    the rendered argv: pdkit.render.flags renders from this package.)"""
    router = host.router
    assert router is not None
    package, version = spec.router_release(host)
    rendered_budget = router_flags(package, version)
    out: dict[str, tuple[float, str]] = {}
    for rule in ROUTER_START_RULES:
        section, _, name = rule.field.rpartition(".")
        if name == "extra_args" or (section == "pdkit_cluster.fault_budget" and name not in rendered_budget):
            continue
        owner = router if section == "pdkit_router" else spec.cluster.fault_budget
        out[rule.flag] = (float(getattr(owner, name)), rule.field)
    parsed, _ = router_parser(package, version).parse(list(router.extra_args))
    for p in parsed:
        value = _number(p.values[0]) if len(p.values) == 1 else None
        if value is not None:
            out[p.option.name] = (value, f"pdkit_router.extra_args[{p.index}]")
    return out


def router_start_problems(spec: ClusterSpec, host: HostSpec) -> list[tuple[str, str]]:
    """(field, message) for each value of HOST's rendered router argv that its release refuses at start
    (ROUTER_START_RULES)."""
    package, version = spec.router_release(host)
    release = f"{package} {version}"
    values = router_values(spec, host)
    out: list[tuple[str, str]] = []
    for rule in ROUTER_START_RULES:
        if release not in rule.refused_by or rule.flag not in values:
            continue
        value, field = values[rule.flag]
        if rule.low_flag is not None:
            floor, origin = values.get(rule.low_flag, (router_default(package, version, rule.low_flag), ""))
            where = f"{rule.low_flag} {_fmt(floor)}" + (f", {origin}" if origin else ", the router's default")
            bounds = UNIT_BOUNDS.get(field.removeprefix("pdkit_cluster.fault_budget."))
            valid = f"{_fmt(floor)} or more" if bounds is None else f"{_fmt(floor)} to {_fmt(bounds[1])}"
            if value < floor:
                zero = " (0 is not 'no pause')" if value == 0 else ""
                out.append((field, f"{_fmt(value)}{zero} is below the router's initial backoff ({where}): {release} "
                                   f"refuses to start ('{rule.says}'; {rule.source}); valid: {valid}"))
            continue
        if (rule.low is not None and value < rule.low) or (rule.high is not None and value > rule.high):
            if rule.low is not None and rule.high is not None:
                valid = f"{_fmt(rule.low)} to {_fmt(rule.high)}"
            elif rule.low is not None:
                valid = f"{_fmt(rule.low)} or more"
            else:
                valid = f"at most {_fmt(rule.high)}"  # type: ignore[arg-type]
            out.append((field, f"{rule.flag} {_fmt(value)}: {release} refuses to start with it ('{rule.says}'; "
                               f"{rule.source}); valid: {valid}"))
    return out


def router_retry_schedule(spec: ClusterSpec, host: HostSpec) -> RetrySchedule:
    """How HOST's router spaces its retries: its release's defaults, with what extra_args change
    (--retry-initial-backoff-ms, --retry-backoff-multiplier, --retry-jitter-factor, --disable-retries)."""
    router = host.router
    assert router is not None
    package, version = spec.router_release(host)
    default = RetrySchedule.of_release(package, version)
    values = router_values(spec, host)
    parsed, _ = router_parser(package, version).parse(list(router.extra_args))

    def pick(flag: str, fallback: float) -> float:
        return values[flag][0] if flag in values else fallback

    return RetrySchedule(pick("--retry-initial-backoff-ms", default.initial_backoff_ms),
                         pick("--retry-backoff-multiplier", default.multiplier),
                         pick("--retry-jitter-factor", default.jitter),
                         disabled=any(p.option.name == "--disable-retries" for p in parsed))


# The policies each router refuses at start with fewer than two workers to pick from: smg 1.13.0 and
# sglang-router 0.3.2 ConfigValidator::validate_compatibility (smg model_gateway/src/config/validation.rs,
# sgl-router/src/config/validation.rs): "Power-of-two policy requires at least 2 workers" (regular
# mode, --policy), "... for prefill requires at least 2 prefill workers" (--prefill-policy), "... for
# decode requires at least 2 decode workers" (--decode-policy). Both run with pdkit's argv: refused at
# start (tests/test_router_start_refusals.py). In PD mode pdkit renders no --policy, so only the two
# PD policies count there.
def _check_power_of_two(spec: ClusterSpec, host: HostSpec, workers: list[tuple[HostSpec, Engine]], pd_mode: bool,
                        add: Callable[[Problem], None]) -> None:
    router = host.router
    assert router is not None
    if not workers:
        return
    if pd_mode:
        picks = [("prefill_policy", router.prefill_policy, "prefill"),
                 ("decode_policy", spec.router_decode_policy(host), "decode")]
    else:
        picks = [("policy", router.policy, "unified")]
    release = " ".join(spec.router_release(host))
    for field, policy, role in picks:
        count = sum(1 for _, e in workers if e.role == role)
        if policy == "power_of_two" and count < 2:
            kind = f"{role} workers" if pd_mode else "workers"
            instead = "round_robin, or leave it unset" if field == "decode_policy" else "round_robin or cache_aware"
            add(Problem(host.name, f"pdkit_router.{field}",
                        f"power_of_two needs at least 2 {kind} (the router refuses to start: {release}, 'Power-of-two "
                        f"policy ... requires at least 2 {kind}'); this router has {count}: use {instead}"))


def _check_model_visibility(spec: ClusterSpec, add: Callable[[Problem], None]) -> None:
    """A model, tokenizer or draft directory the engine units' sandbox hides (ProtectHome=yes,
    PrivateTmp=yes): SGLang would not find it. The rest (exists, config.json, weights, readable by
    the service user) is the preflight's, on each node (pdkit.hosts.preflight.model_dir_problems)."""
    if spec.cluster.engine != "sglang":
        return  # the sim never reads the model directory
    for host, engine in spec.engines():
        for what, field, path in engine_model_paths(spec, host, engine):
            hidden = hidden_from_engines(path) if path.startswith("/") else None
            if hidden:
                add(Problem(host.name, field, f"{path} is under {hidden}, which the engine units cannot see "
                            "(ProtectHome=yes / PrivateTmp=yes, "
                            "templates/systemd/engine.service.j2, docs/security.md): SGLang would not find the "
                            f"{what}; move it outside {', '.join(HIDDEN_FROM_ENGINES)}, e.g. "
                            f"/models/{path.rstrip('/').rsplit('/', 1)[-1]}"))
        model_local = spec.engine_model(engine).path.startswith("/")
        for what, field, path in engine_model_paths(spec, host, engine):
            if model_local and what != "model" and not path.startswith("/"):
                # issue 46: a local model path makes pdkit run the engine offline (HF_HUB_OFFLINE=1,
                # pdkit.render.flags.engine_env), so a hub id beside it loads only from the engine user's hub cache
                add(Problem(host.name, field, f"{what} {path} is a Hugging Face hub id, but the engine runs offline "
                            "(the model path is a local directory, so pdkit sets HF_HUB_OFFLINE=1): it loads only if "
                            f"it is already in /var/cache/{spec.cluster.service_user}/huggingface on the node; valid: "
                            f"download it to a local directory and give that path (e.g. /models/"
                            f"{path.rstrip('/').rsplit('/', 1)[-1]})", "warning"))


def _check_engine_venv(spec: ClusterSpec, host: HostSpec, add: Callable[[Problem], None]) -> None:
    """pdkit_node.engine_venv: a real engine's environment, outside pdkit's own venvs, one SGLang
    release for every engine process it runs (the preflight checks the environment itself)."""
    node = host.node
    assert node is not None and node.engine_venv is not None
    venv, field = node.engine_venv, "pdkit_node.engine_venv"
    if spec.cluster.engine != "sglang":
        add(Problem(host.name, field, f"engine_venv {venv} is the node's own SGLang environment, but "
                    "pdkit_cluster.engine is "
                    f"{spec.cluster.engine!r} (the rehearsal engine runs from the engine environment pdkit builds for "
                    "it: <install_dir>/engine-venv): remove engine_venv, or set pdkit_cluster.engine: sglang"))
        return
    install = spec.cluster.install_dir.rstrip("/")
    if venv == install or venv.startswith(install + "/"):
        add(Problem(host.name, field, f"engine_venv {venv} is inside pdkit_cluster.install_dir ({install}), whose "
                    "venvs pdkit replaces: "
                    "give the engine's own environment outside it, e.g. /opt/sglang-env (or remove engine_venv and let "
                    "pdkit install the engine)"))
    placements = spec.placements(host)
    if not placements:
        add(Problem(host.name, field, f"ignored: engine_venv {venv} is set but {host.name} runs no engine; remove it",
                    "warning"))
    versions: dict[str, list[str]] = {}
    for p in placements:
        versions.setdefault(spec.engine_version(p.engine), []).append(p.engine.name)
    if len(versions) > 1:
        shown = "; ".join(f"{v} for {', '.join(names)}" for v, names in sorted(versions.items()))
        add(Problem(host.name, field, f"the engines on {host.name} want different SGLang releases ({shown}) but all "
                    f"run from the one engine_venv {venv}: give them one sglang_version, or remove engine_venv"))


def _check_engine_tuning(spec: ClusterSpec, host: HostSpec, engine: Engine, at: str,
                         add: Callable[[Problem], None]) -> None:
    tuning = spec.engine_tuning(engine)
    release = SGLANG_RELEASES[spec.engine_version(engine)]
    assert host.node is not None
    # choices (backends, dtypes, algorithm names) are the release parser's: pdkit.render.argvcheck
    speculative = tuning.speculative
    if (speculative is not None and speculative.algorithm == "UNO"
        and not any(a.split("=", 1)[0] == "--uno-lora-path" for a in engine.extra_args)):
        add(Problem(host.name, f"{at}.extra_args",
                    "speculative algorithm UNO needs --uno-lora-path (SGLang: 'UNO requires --uno-lora-path'): "
                    "add ['--uno-lora-path', '/path/to/lora'] to extra_args"))
    if speculative is not None and speculative.algorithm == "EAGLE" and speculative.draft_model_path is None:
        add(Problem(host.name, f"{at}.tuning.speculative.draft_model_path",
                    "EAGLE without draft_model_path loads the draft from the target checkpoint, which works only "
                    "when it bundles a multi-token-prediction head (SGLang's MiMo-7B-RL recipe; DeepSeek V3, GLM-4 "
                    "MoE): set draft_model_path unless it does (algorithm NEXTN says the same more plainly)",
                    "warning"))
    if speculative is not None and speculative.algorithm == "DSPARK" and speculative.draft_model_path is None:
        add(Problem(host.name, f"{at}.tuning.speculative.draft_model_path",
                    "DSPARK without draft_model_path works only when the target checkpoint bundles the DSpark draft "
                    "(SGLang otherwise refuses to start): set draft_model_path unless it does", "warning"))
    for field, why in ignored_settings(spec, engine):
        add(Problem(host.name, field if field.startswith("pdkit_cluster") else f"{at}.{field}", why, "warning"))
    if tuning.max_queued_requests is not None and engine.role != "unified":
        add(Problem(host.name, f"{at}.tuning.max_queued_requests",
                    "SGLang ignores --max-queued-requests in disaggregation mode", "warning"))
    # as check_server_args sees them: the page as the backend snaps it, the chunk divided by the attention-DP
    # size (handle_data_parallelism), and only off decode engines (tests/test_startcheck_order.py)
    page = effective_page(spec.engine_version(engine), tuning, engine)
    chunk = tuning.chunked_prefill_size
    attn_dp = engine.attn_dp or 1
    per_rank = chunk // attn_dp if chunk is not None and chunk > 0 else chunk
    if (engine.role != "decode" and chunk is not None and per_rank is not None and per_rank > 0  # -1: off
            and per_rank % page):
        step = page * attn_dp
        shown = f"{chunk}" if attn_dp == 1 else f"{chunk} / attn_dp {attn_dp} = {per_rank} (SGLang divides it per rank)"
        snapped = "" if tuning.page_size == page else " (as SGLang snaps it for this attention backend)"
        add(Problem(host.name, f"{at}.tuning.chunked_prefill_size",
                    f"{shown} is not a multiple of page_size {page}{snapped} (SGLang rejects it); e.g. "
                    f"{chunk // step * step or step}"))
    if tuning.value("pcie_ipc_allreduce") and not release.has_pcie_ipc_allreduce:
        add(Problem(host.name, f"{at}.tuning.pcie_ipc_allreduce",
                    f"SGLang {release.version} has no PCIe IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is "
                    "0.5.23+); valid: false, or sglang_version 0.5.23"))
    if tuning.value("pcie_ipc_allreduce") and host.node.nccl_profile == "pcie-p2p-off":
        add(Problem(host.name, f"{at}.tuning.pcie_ipc_allreduce",
                    "PCIe IPC all-reduce needs working P2P, but the node's NCCL profile is 'pcie-p2p-off'"))
    if tuning.value("pcie_ipc_allreduce") and engine.tp_size not in (2, 4, 8):
        add(Problem(host.name, f"{at}.tuning.pcie_ipc_allreduce",
                    f"PCIe IPC all-reduce supports TP 2, 4 or 8; this engine has tp {engine.tp_size}"))
    _check_cache_levers(spec, host, engine, at, add)
    if (tuning.cuda_graph_bs and tuning.cuda_graph_max_bs is not None
        and max(tuning.cuda_graph_bs) != tuning.cuda_graph_max_bs):
        add(Problem(host.name, f"{at}.tuning.cuda_graph_max_bs",
                    f"cuda_graph_max_bs {tuning.cuda_graph_max_bs} disagrees with the largest bucket in cuda_graph_bs "
                    f"({max(tuning.cuda_graph_bs)}); set one of the two"))
    if engine.role == "prefill":
        return
    max_bs = effective_decode_graph_max_bs(spec, host, engine)
    target = spec.cluster.target_concurrency
    required = decode_graph_required_bs(engine, target)
    if tuning.value("cuda_graph") and max_bs is not None and required is not None and max_bs < required:
        ranks = max(engine.dp, engine.attn_dp or 1)
        over_ranks = f" over {ranks} DP ranks: {required} per rank" if ranks > 1 else ""
        add(Problem(host.name, f"{at}.tuning.cuda_graph_max_bs",
                    f"decode CUDA graphs cover batches up to {max_bs} but target_concurrency is {target}{over_ranks}: "
                    f"larger batches run without graphs (the seeds' 40x gap); set cuda_graph_max_bs >= {required}"))
    explicit = max(tuning.cuda_graph_bs) if tuning.cuda_graph_bs else tuning.cuda_graph_max_bs
    if explicit is not None and tuning.max_running_requests is not None and explicit > tuning.max_running_requests:
        add(Problem(host.name, f"{at}.tuning.cuda_graph_max_bs",
                    f"{explicit} is above max_running_requests {tuning.max_running_requests}: SGLang clamps it, so "
                    f"graphs above {tuning.max_running_requests} are never captured", "warning"))


def _check_pd_groups(spec: ClusterSpec, add: Callable[[Problem], None]) -> None:
    groups: dict[str, list[tuple[HostSpec, Engine]]] = {}
    for host, engine in spec.engines():
        if engine.role != "unified":
            groups.setdefault(engine.pd_group, []).append((host, engine))
    for group, members in groups.items():
        roles = {e.role for _, e in members}
        first_host, first = members[0]
        assert first_host.node is not None  # spec.engines() yields only hosts with a pdkit_node
        for missing in ("prefill", "decode"):
            if missing not in roles:
                add(Problem(first_host.name, f"pdkit_node.engines[{first_host.node.engines.index(first)}].pd_group",
                            f"PD group {group!r} has no {missing} engine; each PD group needs at least one prefill and "
                            "one decode"))
        # what a pair must agree on (model, release, page size, ...) is pdkit.render.argvcheck's
        hosts = {h.name for h, _ in members}
        if len(hosts) > 1 and spec.cluster.transfer_backend == "nixl":
            for host in sorted({h.name: h for h, _ in members}.values(), key=lambda h: h.name):
                if host.node is not None and not host.node.ucx_net_devices:
                    add(Problem(host.name, "pdkit_node.ucx_net_devices",
                                f"PD group {group!r} spans hosts {sorted(hosts)}: set ucx_net_devices (e.g. "
                                "'mlx5_0:1'), without it cross-node NIXL transfers hang until the 300 s timeout"))


def _check_kv_over_tcp(spec: ClusterSpec, add: Callable[[Problem], None]) -> None:
    """Warn where PD pairs cross hosts and the node's ucx_net_devices is not an RDMA device: UCX
    then moves GPU KV as emulated puts over TCP sockets (pdkit.spec.kvcost.kv_path; docs/gpu.md,
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
            # the set spans hosts, so the host's pairs cross hosts: RDMA devices or TCP (pdkit.spec.kvcost.kv_path)
            if not net_devices_are_rdma(node.ucx_net_devices):
                path = KV_PATHS["cross-host-tcp"]
                warned.add(host.name)
                add(Problem(host.name, "pdkit_node.ucx_net_devices",
                            f"{label} pairs prefill and decode across hosts, and {node.ucx_net_devices!r} is not an "
                            f"RDMA device: KV moves over TCP ({path.why}); pdkit sets UCX's TCP fragments to 512 KiB "
                            "there, and hand-offs are still about 5x slower than on one host at 3072-token prompts "
                            "(docs/gpu.md, \"KV hand-off levers\"). "
                            "Valid: an RDMA device such as 'mlx5_0:1', or prefill and decode on one host "
                            "(a router per node, pdkit_router.workers)", "warning"))


# What SGLang logs when a decode keeps its own radix cache (0.5.17 and 0.5.23
# sglang/srt/arg_groups/pd_disaggregation_hook.py): the lever is labelled so wherever pdkit shows it
DECODE_RADIX_EXPERIMENTAL = "SGLang marks it EXPERIMENTAL ('Radix cache is enabled for decode server')"


def _check_cache_levers(spec: ClusterSpec, host: HostSpec, engine: Engine, at: str,
                        add: Callable[[Problem], None]) -> None:
    """The prefix-cache levers: where each applies and what SGLang refuses at start (0.5.23
    arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation, speculative_hook.py
    handle_speculative_decoding, kv_cache_hook.py handle_cache_compatibility / handle_kv4_compatibility;
    0.5.17 ServerArgs._handle_pd_disaggregation / _handle_cache_compatibility). Whether the release has
    the flag at all is the parser table's call (pdkit.render.argvcheck)."""
    tuning = spec.engine_tuning(engine)
    version = spec.engine_version(engine)

    def field(name: str) -> str:
        origin = tuning_origin(spec, engine, "", name)
        return origin if origin.startswith("pdkit_cluster") else f"{at}.{origin}"

    algorithm = tuning.speculative.algorithm if tuning.speculative is not None else None
    if tuning.decode_radix_cache:
        if engine.role != "decode":
            add(Problem(host.name, field("decode_radix_cache"),
                        f"applies to decode engines only; this is a {engine.role} engine, whose radix cache is on "
                        "unless radix_cache: false (set it under pdkit_cluster.tuning.decode)", "warning"))
        else:
            add(Problem(host.name, field("decode_radix_cache"), f"experimental: {DECODE_RADIX_EXPERIMENTAL}; "
                        "compare it against the baseline with pdkit tune before keeping it", "warning"))
            if spec.cluster.transfer_backend == "fake":
                add(Problem(host.name, field("decode_radix_cache"),
                            "SGLang refuses --disaggregation-decode-enable-radix-cache with transfer_backend fake; "
                            "valid: transfer_backend nixl or mooncake, or decode_radix_cache unset"))
            if tuning.radix_cache is False:
                add(Problem(host.name, field("decode_radix_cache"),
                            "contradicts radix_cache: false on the same engine; set one of the two"))
            allowed = DECODE_RADIX_SPECULATIVE.get(version, ())
            if algorithm is not None and algorithm not in allowed:
                valid = f"speculative algorithm {', '.join(allowed)}, " if allowed else ""
                add(Problem(host.name, field("decode_radix_cache"),
                            f"SGLang {version} refuses --disaggregation-decode-enable-radix-cache with speculative "
                            f"decoding ({algorithm}) at start; valid: {valid}no tuning.speculative on this decode, or "
                            "decode_radix_cache unset"))
    if tuning.hicache and tuning.radix_cache is False:
        add(Problem(host.name, field("hicache"),
                    "SGLang refuses --enable-hierarchical-cache with --disable-radix-cache (HiCache is a tier behind "
                    "the radix cache); set one of the two"))
    elif tuning.hicache and engine.role == "decode" and not tuning.decode_radix_cache:
        # handle_pd_disaggregation turns the radix cache off on a decode engine before
        # handle_cache_compatibility runs (0.5.17 and 0.5.23; tests/test_startcheck_order.py)
        add(Problem(host.name, field("hicache"),
                    "SGLang turns the radix cache off on a decode engine unless decode_radix_cache is set, "
                    "then refuses --enable-hierarchical-cache with it at start ('enable-hierarchical-cache "
                    "and disable-radix-cache are mutually exclusive'); valid: decode_radix_cache: true on this "
                    "decode, or hicache unset"))
    if tuning.hicache and tuning.value("kv_cache_dtype") in HICACHE_REFUSED_KV_DTYPES:
        add(Problem(host.name, field("hicache"),
                    f"HiCache with kv_cache_dtype {tuning.value('kv_cache_dtype')}: SGLang {version}'s host pools do "
                    "not keep the FP4 block-scale layout ('does not yet support hierarchical KV cache'); valid: "
                    "kv_cache_dtype fp8_e4m3, bf16 or auto with hicache, or hicache off"))
    for name in ("hicache_ratio", "hicache_size_gb"):
        if getattr(tuning, name) is not None and not tuning.hicache:
            add(Problem(host.name, field(name),
                        "sizes HiCache's host pool, which is off: set hicache: true on the same engine, or remove it"))
    if tuning.radix_eviction_policy is not None and engine.role == "decode" and not tuning.decode_radix_cache:
        add(Problem(host.name, field("radix_eviction_policy"),
                    "a PD decode has no radix cache unless decode_radix_cache: true (SGLang turns it off), so "
                    "the policy is ignored", "warning"))


# the speculative algorithms each release takes beside a decode radix cache (0.5.17
# _handle_pd_disaggregation: none; 0.5.23 speculative_hook.handle_speculative_decoding, where NEXTN
# is EAGLE by then)
DECODE_RADIX_SPECULATIVE: dict[str, tuple[str, ...]] = {"0.5.17": (), "0.5.23": ("DSPARK", "EAGLE", "EAGLE3", "NEXTN")}
# KV dtypes whose block scales HiCache's host pools drop (0.5.23 kv_cache_hook.handle_kv4_compatibility;
# nvfp4 runs only on compute capability 10.x/12.x, where SGLang refuses it with a host tier)
HICACHE_REFUSED_KV_DTYPES = ("nvfp4", "fp4_mx_block16")


# RAM the OS and pdkit's own services keep beside the engines' host pools and the weights' page cache
OS_RESERVE_GB = 16.0


def host_memory_problems(spec: ClusterSpec, host: HostSpec) -> list[Problem]:
    """Warn when HiCache's host pools, the weights' page cache and the OS exceed the node's RAM.

    Each rank of a HiCache engine allocates its own host pool (SGLang 0.5.23
    mem_cache/pool_host/base.py: --hicache-size GB per rank, else --hicache-ratio x the rank's GPU KV
    pool, bounded here by the GPU's memory x the static fraction). The checkpoint's page cache is
    what makes an engine restart fast; pools that crowd it out make every restart read the weights
    from disk again, and SGLang refuses to start a pool the free memory cannot hold."""
    node = host.node
    if node is None:
        return []
    pools: list[str] = []
    pool_gb = 0.0
    bounded = False
    for engine in node.engines:
        tuning = spec.engine_tuning(engine)
        if not tuning.hicache:
            continue
        ranks = engine.tp_size * max(1, engine.pp)
        if tuning.hicache_size_gb is not None:
            gb = float(tuning.hicache_size_gb) * ranks
        else:
            fraction = tuning.mem_fraction_static or 0.9
            gb = (tuning.hicache_ratio or 2.0) * node.gpus.memory_gib * fraction * ranks
            bounded = True
        pool_gb += gb
        pools.append(f"{engine.name} {gb:.0f} GB")
    if not pools:
        return []
    weights = {spec.engine_model(e).path: spec.engine_model(e).weights_gb for e in node.engines}
    weights_gb = sum(w for w in weights.values() if w is not None)
    field = "pdkit_node.ram_gb"
    if node.ram_gb is None:
        return [Problem(host.name, field, f"HiCache host pools ({', '.join(pools)}) need host memory: set ram_gb "
                        "(the machine's RAM, `free -g`) so validate can check pools + weights + OS fit", "warning")]
    need = pool_gb + weights_gb + OS_RESERVE_GB
    if need <= node.ram_gb:
        return []
    unknown = [p for p, w in weights.items() if w is None]
    missing = f"; unknown for {', '.join(unknown)}: set model.weights_gb" if unknown else ""
    return [Problem(host.name, field,
                    f"HiCache host pools ({', '.join(pools)}{', at most' if bounded else ''}) + the weights' page "
                    f"cache ({weights_gb:.0f} GB{missing}) + {OS_RESERVE_GB:.0f} GB for the OS = {need:.0f} GB, more "
                    f"than the node's {node.ram_gb} GB: "
                    "the weights fall out of the page cache (slow restarts) or SGLang refuses the pool; lower "
                    "hicache_size_gb / hicache_ratio", "warning")]
