"""The cluster spec: pydantic models for what the user writes, and the cross-host rules.

A pyinfra inventory describes the cluster; each host's resolved data holds pdkit's
sections (all keys start with ``pdkit_``):

- ``pdkit_cluster``   cluster-wide: model, engine kind, SGLang version, tuning defaults.
                      May be set on any group or host; every host that resolves it must
                      see the same value.
- ``pdkit_node``      a GPU node: its GPUs, NUMA layout, NCCL profile and engines.
- ``pdkit_router``    this host runs the router.
- ``pdkit_monitoring`` this host runs Prometheus and Grafana.

`pdkit.inventory.loader.load()` turns an inventory into a frozen `ClusterSpec` or a list of
`Problem`s; this package holds the models and `cross_checks()`, the rules that need
more than one section to decide. Declarations and rules live apart, as SGLang keeps its
server arguments apart from its `*_hook.py` checks:

- fields       field types, bounds and value rules the models share (Frozen, Port, at_most, paths)
- tuning       the tuning layers and speculative decoding (Tuning, RoleTuning, TUNING_DEFAULTS)
- alerting     Alertmanager receivers, routes and the alerting section (RECEIVER_KINDS)
- models       the sections: Cluster, Model, Secrets, Node, GpuLayout, Engine, Router, Monitoring;
               HOST_SECTIONS (host data key -> section model: the loader and the README table)
- cluster      ClusterSpec and HostSpec with their lookups; Problem and SpecError
- facts        what flags, plan, doctor and validation derive alike (decode graphs, shared GPUs, ...)
- spanning     engines spanning nodes and their parallel layout (parallel_problems)
- addresses    ports and addresses (host_ports, CROSS_HOST_SERVICES, check_addresses)
- pcie         a node's declared PCIe layout judged by pdkit.agent.topology's placement rules (declared_pcie_problems)
- ignored      settings a mode or role ignores (IGNORED_BY_MODE, ignored_settings)
- credentials  secrets and alert receivers against what reads them
- startup      what SGLang refuses at start (startup_check_problems)
- checks       cross_checks(), which runs all of the rules

`pdkit.spec` itself exports what other packages use, and nothing else: the spec types (ClusterSpec, HostSpec,
Problem, SpecError) nearly everywhere; the loader's models, HOST_SECTIONS, cross_checks and address_problem
(pdkit.inventory.loader); the models the README's field table documents, FaultBudget and TUNING_DEFAULTS
(pdkit.inventory.fieldtable); the derived facts that pdkit.render, pdkit.hosts, pdkit.doctor, pdkit.inventory.summary
and pdkit.monitoring take (ports, decode graphs, shared GPUs, PCIe, receivers). Tests and the modules here import
every other name from the submodule that holds it (`from pdkit.spec.models import Router`);
tests/test_surfaces.py keeps the list equal to what is used.
"""

from __future__ import annotations

from pdkit.spec.addresses import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT, address_problem
from pdkit.spec.alerting import NULL_RECEIVER, RECEIVER_KINDS, Alerting, AlertRoute, Receiver, receiver_needs_credential
from pdkit.spec.checks import cross_checks
from pdkit.spec.cluster import ClusterSpec, HostSpec, Problem, SpecError
from pdkit.spec.facts import (
    DECODE_GRAPH_RULE,
    custom_all_reduce_enabled,
    dcgm_enabled,
    decode_graph_required_bs,
    decode_graphs_expected,
    effective_decode_graph_max_bs,
    engine_model_paths,
    engine_numa_node,
    gpu_share_group,
    pairing_sets,
    prefill_kv_paths,
    shared_gpu_mem_fraction,
    shared_gpu_predecessor,
)
from pdkit.spec.faultbudget import FaultBudget
from pdkit.spec.models import HOST_SECTIONS, Cluster, Engine, GpuLayout, Model, Monitoring, PcieSlot, Secrets
from pdkit.spec.pcie import collapse_findings, declared_topology, pd_pairs_on_node
from pdkit.spec.tuning import TUNING_DEFAULTS, Speculative, Tuning

__all__ = [
    "DCGM_EXPORTER_PORT", "DECODE_GRAPH_RULE", "HOST_SECTIONS", "NODE_EXPORTER_PORT", "NULL_RECEIVER", "RECEIVER_KINDS",
    "TUNING_DEFAULTS", "AlertRoute", "Alerting", "Cluster", "ClusterSpec", "Engine", "FaultBudget", "GpuLayout",
    "HostSpec", "Model", "Monitoring", "PcieSlot", "Problem", "Receiver", "Secrets", "SpecError", "Speculative",
    "Tuning", "address_problem", "collapse_findings", "cross_checks", "custom_all_reduce_enabled", "dcgm_enabled",
    "declared_topology", "decode_graph_required_bs", "decode_graphs_expected", "effective_decode_graph_max_bs",
    "engine_model_paths", "engine_numa_node", "gpu_share_group", "pairing_sets", "pd_pairs_on_node",
    "prefill_kv_paths", "receiver_needs_credential", "shared_gpu_mem_fraction", "shared_gpu_predecessor",
]
