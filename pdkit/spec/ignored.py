"""Settings the kit ignores, reported as warnings: fields a mode skips (IGNORED_BY_MODE) and
tuning an engine's role never uses (ignored_settings)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from pdkit.spec.cluster import ClusterSpec, HostSpec, Problem
from pdkit.spec.facts import decode_graphs_expected
from pdkit.spec.models import Engine

__all__ = [
    "DECODE_ONLY", "IGNORED_BY_MODE", "PREFILL_ONLY", "ignored_by_mode_problems", "ignored_settings",
    "IgnoredByMode",
]


@dataclass(frozen=True)
class IgnoredByMode:
    """Fields the kit ignores in one mode: set anyway, they warn (errors under --strict)."""

    mode: str
    # whether the mode holds: called (spec, host) per GPU host for pdkit_node fields, (spec,
    # None) once for pdkit_cluster fields
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
#   rendered into nccl.env (pdkit/render/flags.py nccl_env, tests/golden/multinode/gpu-p0) and read by
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
        "the machine brings the NVIDIA stack: the node layer installs no driver and reboots nothing (roles/node.py "
        "installs_nvidia_stack; only roles/nvidia_driver.py acts on them)"),
    IgnoredByMode(
        "gpu: none",
        lambda spec, host: host.node.gpu == "none",
        ("pdkit_node.nvidia_stack", "pdkit_node.driver_modules", "pdkit_node.reboot"),
        "a host without NVIDIA GPUs gets no NVIDIA stack and no driver checks (roles/node.py installs_nvidia_stack; "
        "pdkit/hosts/preflight.py returns before the driver checks)"),
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
        lambda spec, host: spec.cluster.transfer_backend != "nixl"
        or all(p.engine.role == "unified" for p in spec.placements(host)),
        ("pdkit_node.ucx_net_devices",),
        "UCX_NET_DEVICES is rendered only for NIXL KV transfer on a node that runs prefill or decode engines "
        "(pdkit/render/flags.py ucx_env)"),
    IgnoredByMode(
        "unified only: no PD engine in the cluster",
        lambda spec, host: bool(spec.engines()) and all(e.role == "unified" for _, e in spec.engines()),
        ("pdkit_cluster.transfer_backend",),
        "--disaggregation-transfer-backend is given only to prefill and decode engines (pdkit/render/flags.py "
        "engine_args)"),
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
                out.append(Problem(name, path, f"ignored ({row.mode}): {row.why}; remove {path.rsplit('.', 1)[1]}",
                                   "warning"))
    return out


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
            out.append((explicit[name], f"ignored: a {engine.role} engine never uses {name} (pdkit renders no flag for "
                        f"it); set it on the {'decode' if engine.role == 'prefill' else 'prefill'} role instead"))
    if engine.role != "prefill" and not decode_graphs_expected(spec, engine):
        for name in ("cuda_graph_bs", "cuda_graph_max_bs"):
            if getattr(tuning, name) is not None:
                where = anywhere.get(name, f"tuning.{name}")
                out.append((where, f"ignored: decode CUDA graphs are off (cuda_graph false), so {name} captures "
                            "nothing; remove it or turn cuda_graph on"))
    if tuning.value("allow_longer_context") and tuning.context_length is None:
        out.append((anywhere.get("allow_longer_context", "tuning.allow_longer_context"),
                    "ignored: allow_longer_context only matters with a context_length above the model's; set "
                    "context_length or remove it"))
    if (tuning.speculative is not None and tuning.speculative.algorithm == "NGRAM"
        and tuning.speculative.eagle_topk is not None):
        out.append((anywhere.get("speculative", "tuning.speculative") + ".eagle_topk",
                    "ignored: NGRAM has no EAGLE tree; remove eagle_topk"))
    return out
