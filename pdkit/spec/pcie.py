"""A node's PCIe placement from what the user declares (pdkit_node.gpus.pcie), judged by the rules the preflight
runs on the probe's facts (issue 47 item 2): pdkit.agent.topology holds the rules and their advice once; this module
turns a node's spec into their inputs (the engines' GPUs, the PD pairs whose KV goes GPU to GPU, the declared
layout) for validate, and the preflight (pdkit/hosts/preflight.py `_check_pcie`) takes the same inputs from here."""

from __future__ import annotations

from pdkit.agent import topology
from pdkit.spec.cluster import HostSpec, Problem
from pdkit.spec.models import Engine, Node

__all__ = [
    "collapse_findings", "declared_pcie_problems", "declared_topology", "pd_pair_indices", "pd_pairs_on_node",
    "placed_engines",
]


def pd_pair_indices(node: Node) -> list[tuple[int, int]]:
    """(prefill, decode) positions in NODE's engines of one pd_group, neither spanning nodes: the prefill's KV
    writes go GPU to GPU over this node's PCIe."""
    engines = node.engines
    return [(i, j) for i, p in enumerate(engines) if p.role == "prefill" for j, d in enumerate(engines)
            if d.role == "decode" and d.pd_group == p.pd_group and not p.nodes and not d.nodes]


def pd_pairs_on_node(host: HostSpec) -> list[tuple[Engine, Engine]]:
    """(prefill, decode) engines of one pd_group on HOST: the prefill's KV writes go GPU to GPU over PCIe."""
    node = host.node
    assert node is not None
    return [(node.engines[i], node.engines[j]) for i, j in pd_pair_indices(node)]


def placed_engines(node: Node) -> list[topology.Placed]:
    """NODE's engines as the placement rules see them, in pdkit_node.engines' order."""
    return [topology.Placed(i, e.name, e.gpus, e.dp == 1 and e.pp == 1) for i, e in enumerate(node.engines)]


def declared_topology(node: Node) -> topology.Topology | None:
    """NODE's declared PCIe layout (pdkit_node.gpus.pcie) as pdkit.agent.topology reads facts; None when not
    declared."""
    slots = node.gpus.pcie
    if slots is None:
        return None
    return topology.declared_topology([(s.root, s.switch) for s in slots], node.gpus.numa)


def collapse_findings(node: Node, topo: topology.Topology) -> list[tuple[str, str]]:
    """(field, sentence) for every collapse pattern on NODE under TOPO (declared or probed): the PD pairs' KV
    writes (named on the decode engine's gpus), then the TP groups."""
    placed = placed_engines(node)
    found = [(f"pdkit_node.engines[{j}].gpus", message) for i, j in pd_pair_indices(node)
             for message in topology.pd_collapse(topo, placed[i], placed[j])]
    found += [(f"pdkit_node.engines[{e.index}].gpus", message) for e in placed
              for message in topology.tp_collapse(topo, e)]
    return found


def declared_pcie_problems(host: HostSpec) -> list[Problem]:
    """validate's placement warnings from the declared layout, worded as the preflight words them from the probe."""
    node = host.node
    topo = declared_topology(node) if node is not None else None
    if node is None or topo is None:
        return []
    return [Problem(host.name, field, message, "warning") for field, message in collapse_findings(node, topo)]
