"""Facts derived from a spec that validation, flags, plan, doctor and monitoring share: the decode
CUDA graph batch, shared-GPU memory fractions, NUMA binding, DCGM, PD pairing sets, KV paths, model paths."""

from __future__ import annotations

from pdkit.spec.cluster import ClusterSpec, HostSpec
from pdkit.spec.kvcost import KvPath, kv_path
from pdkit.spec.models import Engine, GpuLayout

__all__ = [
    "DECODE_GRAPH_RULE", "MAX_SHARED_GPU_FRACTION", "custom_all_reduce_enabled", "dcgm_enabled",
    "decode_graph_required_bs", "decode_graphs_expected",
    "effective_decode_graph_max_bs", "engine_model_paths", "engine_numa_node", "gpu_share_group", "pairing_sets",
    "prefill_kv_paths", "sglang_decode_graph_default_max_bs", "shared_gpu_mem_fraction", "shared_gpu_predecessor",
]


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


# Which engines must run their decode steps in CUDA graphs (the seeds' "on but not used" trap): the one
# statement of the rule that flags, doctor, validation and the PdkitDecodeCudaGraphRatioLow alert all use.
DECODE_GRAPH_RULE = "decode and unified engines whose spec turns CUDA graphs on"


def decode_graphs_expected(spec: ClusterSpec, engine: Engine) -> bool:
    """DECODE_GRAPH_RULE for one engine: a decode or unified engine (a prefill runs no decode step) with
    `tuning.cuda_graph` on."""
    return engine.role != "prefill" and bool(spec.engine_tuning(engine).value("cuda_graph"))


def effective_decode_graph_max_bs(spec: ClusterSpec, host: HostSpec, engine: Engine) -> int | None:
    """The largest decode batch that will run inside a CUDA graph, or None if graphs are off/unknown."""
    if not decode_graphs_expected(spec, engine):
        return None
    tuning = spec.engine_tuning(engine)
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
    setting: str = spec.engine_tuning(engine).value("custom_all_reduce")
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
        layers = [(engine.tuning, f"{at}.tuning"),
                  (getattr(spec.cluster.tuning, engine.role), f"pdkit_cluster.tuning.{engine.role}"),
                  (spec.cluster.tuning.all, "pdkit_cluster.tuning.all")]
        tuning_at = next((f for t, f in layers if t.speculative is not None), f"{at}.tuning")
        out.append(("draft model", f"{tuning_at}.speculative.draft_model_path", speculative.draft_model_path))
    return out
