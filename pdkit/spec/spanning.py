"""Engines that span nodes, and their parallel layout (issue 20): the ports rank 0 takes, the
tp x pp x dp rules SGLang enforces, and the checks on the nodes a spanning engine runs on."""

from __future__ import annotations

from collections.abc import Callable

from pdkit.spec.cluster import ClusterSpec, Problem
from pdkit.spec.models import Engine
from pdkit.spec.startup import A2A_EP_SPANNING

__all__ = [
    "ATTN_DP_DERIVED_PORTS", "check_spanning", "dist_init_ports", "parallel_problems",
]

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
    where = (f"{len(engine.gpus)} GPUs x {engine.nnodes} nodes" if engine.spans_nodes
             else f"{len(engine.gpus)} GPUs {list(engine.gpus)}")
    tp, pp, dp = engine.tp_size, engine.pp, engine.dp
    if (pp != 1 or engine.spans_nodes) and tp * pp * dp != total:
        out.append(("tp", f"tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp} but the engine has {total} GPUs ({where}); tp "
                    "x pp x dp must equal the GPU count"))
    if engine.spans_nodes and (tp * pp) % engine.nnodes:
        out.append(("tp", f"tp {tp} x pp {pp} = {tp * pp} is not divisible by the {engine.nnodes} nodes the engine "
                    "spans (SGLang: 'tp_size must be divisible by number of nodes')"))
    if engine.spans_nodes and dp > 1:
        out.append(("dp", f"dp {dp} across {engine.nnodes} nodes: SGLang refuses data-parallel replicas that span "
                    "nodes ('multi-node data-parallel replicas are not supported'); use attn_dp (attention data "
                    "parallelism) or one engine per node"))
    attn_dp = engine.attn_dp or 1
    if attn_dp > 1 and dp > 1:
        out.append(("attn_dp", f"attn_dp {attn_dp} with dp {dp}: SGLang refuses data-parallel replicas combined with "
                    "attention data parallelism; set one of the two"))
    if attn_dp > 1 and tp % attn_dp:
        out.append(("attn_dp", f"attn_dp {attn_dp} does not divide tp {tp} (SGLang asserts tp_size % attn_dp_size == "
                    f"0); valid: a divisor of {tp}, e.g. {tp}"))
    if engine.ep is not None and engine.ep > 1 and tp % engine.ep:
        out.append(("ep", f"ep {engine.ep} does not divide tp {tp}: SGLang splits each expert-parallel group out of "
                    f"the tensor-parallel ranks (moe tp = tp / ep); valid: a divisor of {tp}"))
    tuning = spec.engine_tuning(engine)
    # an all-to-all backend that spans EP over TP sets ep_size = tp_size before the EPLB assert runs
    # (arg_groups/overrides.py _a2a_ep_size, from handle_a2a_moe, which both releases run before
    # handle_eplb_and_dispatch; tests/test_startcheck_order.py)
    ep = tp if tuning.moe_a2a_backend in A2A_EP_SPANNING.get(spec.engine_version(engine), ()) else (engine.ep or 1)
    if (tuning.enable_eplb or tuning.ep_num_redundant_experts) and ep <= 1:
        knob = "enable_eplb" if tuning.enable_eplb else "ep_num_redundant_experts"
        out.append(("ep", f"tuning.{knob} needs expert parallelism (SGLang asserts ep_size > 1 with EPLB): set ep "
                    f"(e.g. ep {tp}) or drop {knob}"))
    if engine.spans_nodes and engine.dist_init_port is None:
        out.append(("dist_init_port", f"an engine spanning {engine.nnodes} nodes needs dist_init_port: the TCP port on "
                    "rank 0's host where its ranks meet (--dist-init-addr), e.g. 25000"))
    if not engine.spans_nodes and engine.dist_init_port is not None:
        out.append(("dist_init_port", "dist_init_port is only used by an engine spanning nodes (nodes lists 2 or more "
                    "hosts): remove it, or list the nodes"))
    return out


def check_spanning(spec: ClusterSpec, add: Callable[[Problem], None]) -> None:
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
            add(Problem(host.name, f"{at}.nodes", f"nodes must start with {host.name!r}, the host that declares the "
                        f"engine (rank 0, the one serving HTTP), got {nodes}"))
            continue
        if len(nodes) < 2:
            add(Problem(host.name, f"{at}.nodes", f"nodes lists only {host.name!r}: an engine spanning nodes lists 2 "
                        "or more hosts; remove nodes for an engine on one node"))
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
                add(Problem(name, "pdkit_node.gpus",
                            f"runs rank {rank} of {host.name}/{engine.name} but has {other.node.gpus.model} "
                            f"({other.node.gpus.memory_gib} GiB) where rank 0 has {host.node.gpus.model} "
                            f"({host.node.gpus.memory_gib} GiB): every node of an engine needs the same GPU model"))
            if other.node.gpu != host.node.gpu:
                add(Problem(name, "pdkit_node.gpu",
                            f"runs rank {rank} of {host.name}/{engine.name} but is gpu {other.node.gpu!r} where rank 0 "
                            f"is {host.node.gpu!r}"))
            for g in engine.gpus:
                if g >= other.node.gpus.count:
                    add(Problem(name, "pdkit_node.gpus.count",
                                f"runs rank {rank} of {host.name}/{engine.name} on GPUs {list(engine.gpus)}, but GPU "
                                f"{g} does not exist here (valid indices 0-{other.node.gpus.count - 1})"))
                    break
                owner = gpus_taken.setdefault((name, g), f"{host.name}/{engine.name} rank {rank}")
                if owner != f"{host.name}/{engine.name} rank {rank}":
                    add(Problem(name, "pdkit_node.engines",
                                f"GPU {g} runs rank {rank} of {host.name}/{engine.name} but is already used by "
                                f"{owner}; engines may not share a GPU"))
                    break
            owner = units.setdefault((name, engine.name), f"{host.name}/{engine.name} rank {rank}")
            if owner != f"{host.name}/{engine.name} rank {rank}":
                add(Problem(host.name, f"{at}.name",
                            f"{name} runs rank {rank} of this engine as unit {engine.unit_name}, which {owner} already "
                            f"uses there: give the engine a name unused on {name}"))
        nets = {}
        for name in nodes:
            other = names.get(name)
            if other is None or other.node is None:
                continue
            node = other.node
            if node.nic is None:
                add(Problem(name, "pdkit_node.nic",
                            f"runs a rank of {host.name}/{engine.name}, which spans {len(nodes)} nodes: set nic "
                            "(NCCL_SOCKET_IFNAME, the interface the ranks reach each other on, e.g. 'eth0'), without "
                            "it NCCL may bootstrap over docker0 or lo and hang"))
            if node.nccl_net is None:
                add(Problem(name, "pdkit_node.nccl_net",
                            f"runs a rank of {host.name}/{engine.name}, which spans {len(nodes)} nodes: set nccl_net, "
                            "how NCCL crosses nodes: 'ib' (InfiniBand/RoCE, with nccl_ib_hca) or 'socket' (TCP over "
                            "nic)"))
            else:
                nets[name] = node.nccl_net
        # rank 0's address: CROSS_HOST_SERVICES (dist-init), checked by check_addresses
        if engine.role != "unified" and spec.cluster.transfer_backend == "nixl":
            for name in nodes:
                other = names.get(name)
                if other is not None and other.node is not None and not other.node.ucx_net_devices:
                    add(Problem(name, "pdkit_node.ucx_net_devices",
                                f"runs a rank of the {engine.role} {host.name}/{engine.name}, which spans {len(nodes)} "
                                "nodes, so KV crosses nodes: set ucx_net_devices (e.g. 'mlx5_0:1'), without it "
                                "cross-node NIXL transfers hang until the 300 s timeout"))
        if len(set(nets.values())) > 1:
            add(Problem(host.name, f"{at}.nodes", f"the nodes of {engine.name} disagree on nccl_net "
                        f"({', '.join(f'{k}: {v}' for k, v in sorted(nets.items()))}): every rank must reach the "
                        "others the same way"))
    for host in spec.gpu_hosts:
        gpu_node = host.node
        assert gpu_node is not None
        if gpu_node.nccl_net == "ib" and not gpu_node.nccl_ib_hca:
            add(Problem(host.name, "pdkit_node.nccl_ib_hca",
                        "nccl_net 'ib' needs nccl_ib_hca (NCCL_IB_HCA), the HCAs NCCL may use, e.g. 'mlx5_0,mlx5_1' "
                        "(ibv_devices lists them); or use nccl_net 'socket'"))
        if gpu_node.nccl_ib_hca and gpu_node.nccl_net != "ib":
            add(Problem(host.name, "pdkit_node.nccl_ib_hca",
                        f"nccl_ib_hca is only used with nccl_net 'ib'; this node's nccl_net is {gpu_node.nccl_net!r} "
                        "(remove nccl_ib_hca or set nccl_net: ib)"))
