"""validate's PCIe placement rules from the declared layout (pdkit_node.gpus.pcie; pdkit/spec/pcie.py), the
same rules and advice as the preflight's on the probe's facts (pdkit.agent.topology.pd_collapse / tp_collapse;
issue 47 item 2), and the field's shape errors."""

from __future__ import annotations

import copy

import pytest

from pdkit.agent import topology
from pdkit.hosts.preflight import check_host
from pdkit.inventory.loader import load_with_problems
from tests.conftest import write_inventory
from tests.node.runner import CLUSTER, NODE
from tests.test_topology import facts

# the NUMA-halves box: each half's four GPUs behind one switch on its own root complex
HALVES = [{"root": 0, "switch": "a"}] * 4 + [{"root": 1, "switch": "b"}] * 4
# four switches of two GPUs, each on its own root complex (tests/fixtures/topology/switch-two-roots.json's shape)
FOUR_ROOTS = [{"root": r, "switch": s} for r, s in ((0, "a"), (0, "a"), (1, "b"), (1, "b"),
                                                     (2, "c"), (2, "c"), (3, "d"), (3, "d"))]
NUMA = [0, 0, 0, 0, 1, 1, 1, 1]


def validate(tmp_path, pcie, engines=None, **node_changes):
    node = copy.deepcopy(NODE)
    node["gpus"] = {**node["gpus"], "pcie": pcie}
    if engines is not None:
        node["engines"] = engines
    node.update(node_changes)
    hosts = {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": node, "pdkit_router": {"auth": "none"}}}
    return load_with_problems(write_inventory(tmp_path, hosts, copy.deepcopy(CLUSTER)))


def collapse(problems) -> list:
    return [p for p in problems if p.severity == "warning" and topology.COLLAPSE in p.message]


def errors(problems) -> list:
    return [p for p in problems if p.severity == "error"]


ONE_SWITCH_TO_TWO_ROOTS = [{"name": "p0", "role": "prefill", "gpus": [0, 1], "port": 30000},
                           {"name": "d0", "role": "decode", "gpus": [4, 6], "port": 30001}]


# ------------------------------------------------------------------------------------------- the rules


def test_the_numa_halves_layout_is_clean(tmp_path):
    spec, problems = validate(tmp_path, HALVES)
    assert spec is not None, problems
    assert errors(problems) == [] and collapse(problems) == []
    assert [(s.root, s.switch) for s in spec.host("gpu01").node.gpus.pcie][3:5] == [("0", "a"), ("1", "b")]


def test_a_prefill_switch_writing_kv_to_two_declared_root_complexes_warns_with_the_preflights_advice(tmp_path):
    spec, problems = validate(tmp_path, FOUR_ROOTS, ONE_SWITCH_TO_TWO_ROOTS)
    assert spec is not None, problems
    [w] = collapse(problems)
    assert (w.host, w.field) == ("gpu01", "pdkit_node.engines[1].gpus")
    assert w.message.startswith("prefill 'p0' GPUs 0, 1 behind switch a (root 0) write KV into decode 'd0' GPUs "
                                "behind 2 root complexes (root 2: GPUs 4; root 3: GPUs 6)")
    # one rule, two sources of facts: the probe of the same shape gives the preflight the same sentence, its
    # own names for the root complexes and switches aside
    pre = [f.message for f in check_host(spec, spec.host("gpu01"), facts("switch-two-roots"))
           if f.check == "pcie" and f.severity == "warning"]
    assert len(pre) == 1 and pre[0].startswith("gpu01: prefill 'p0' GPUs 0, 1 behind switch 0000:01:00.0")
    assert pre[0].split(": " + topology.COLLAPSE)[1] == w.message.split(": " + topology.COLLAPSE)[1]
    assert "behind one root complex for each prefill switch" in w.message and "pd_group" in w.message


def test_the_same_engines_on_the_halves_layout_do_not_warn(tmp_path):
    # decode GPUs 4 and 6 are behind one root complex there: the switch of GPUs 0-1 writes to one root
    spec, problems = validate(tmp_path, HALVES, ONE_SWITCH_TO_TWO_ROOTS)
    assert spec is not None and collapse(problems) == []


def test_rank_for_rank_pd_over_two_switches_does_not_warn(tmp_path):
    # the seed layout (prefill TP4 on 0-3, decode TP4 on 4-7) over four switches: GPU i writes to GPU i+4 only
    spec, problems = validate(tmp_path, FOUR_ROOTS)
    assert spec is not None and collapse(problems) == []


def test_a_tp_group_over_declared_root_complexes_warns_per_switch(tmp_path):
    engines = [{"name": "tp8", "role": "unified", "gpus": list(range(8)), "port": 30000}]
    spec, problems = validate(tmp_path, FOUR_ROOTS, engines, nccl_p2p_level="SYS")
    assert spec is not None, problems
    warnings = collapse(problems)
    assert len(warnings) == 4 and {w.field for w in warnings} == {"pdkit_node.engines[0].gpus"}
    assert warnings[0].message.startswith("engine 'tp8''s TP group: GPUs 0, 1 behind switch a (root 0) write to peers "
                                          "behind 3 root complexes")
    assert "Regroup pdkit_node.engines[0].gpus" in warnings[0].message and "pcie-p2p-off" in warnings[0].message


def test_gpus_on_root_ports_never_collapse(tmp_path):
    # no switch declared: each GPU has its own root port, so no switch writes anywhere
    spec, problems = validate(tmp_path, [{"root": r} for r in (0, 0, 0, 0, 1, 1, 1, 1)], ONE_SWITCH_TO_TWO_ROOTS)
    assert spec is not None and collapse(problems) == []


def test_without_a_declaration_validate_says_nothing_of_pcie(tmp_path):
    spec, problems = validate(tmp_path, None, ONE_SWITCH_TO_TWO_ROOTS)
    assert spec is not None and spec.host("gpu01").node.gpus.pcie is None and collapse(problems) == []


# ------------------------------------------------------------------------------------------- the field's shape


@pytest.mark.parametrize("pcie, field, says", [
    (HALVES[:7], "pdkit_node.gpus", "pcie lists 7 entries but count is 8: give one {root, switch} per GPU"),
    (HALVES[:4] + [{"root": 1.5, "switch": "b"}] + HALVES[5:], "pdkit_node.gpus.pcie[4].root",
     "1.5 is not a root complex label: give a number (0, 1, ...) or a name"),
    (HALVES[:4] + [{"root": True}] + HALVES[5:], "pdkit_node.gpus.pcie[4].root", "True is not a root complex label"),
    (HALVES[:2] + [{"root": 0, "switch": "a b"}] + HALVES[3:], "pdkit_node.gpus.pcie[2].switch",
     "'a b' is not a switch label: give a number or a name of up to 40 letters"),
    (HALVES[:1] + [{"switch": "a"}] + HALVES[2:], "pdkit_node.gpus.pcie[1].root", "required field is missing"),
    (HALVES[:1] + [{"root": 0, "rc": 1}] + HALVES[2:], "pdkit_node.gpus.pcie[1].rc",
     "unknown field 'rc'; valid fields: root, switch"),
    ([0, 0, 0, 0, 1, 1, 1, 1], "pdkit_node.gpus.pcie[0]",
     "0 is not a GPU's place: give {root, switch} for each GPU, e.g. {'root': 0, 'switch': 'a'}"),
    (HALVES[:3] + [{"root": 1, "switch": "a"}] + HALVES[4:], "pdkit_node.gpus",
     "pcie: switch 'a' is declared under root complexes ['0', '1']: a switch hangs off one root port"),
    (HALVES[:3] + [{"root": 1, "switch": "c"}] + HALVES[4:], "pdkit_node.gpus",
     "pcie: root complex '1' has GPUs on NUMA nodes [0, 1] (numa): a root complex belongs to one NUMA node"),
])
def test_bad_shapes_are_errors_naming_host_field_and_what_is_valid(tmp_path, pcie, field, says):
    spec, problems = validate(tmp_path, pcie)
    assert spec is None
    found = [p for p in errors(problems) if p.field == field]
    assert found, problems
    assert found[0].host == "gpu01" and says in found[0].message, found[0]


# ------------------------------------------------------------------------------------------- pure pieces


def test_declared_topology_reads_like_the_probes():
    t = topology.declared_topology([("0", "a"), ("0", None), ("1", "b")], [0, 0, 1])
    assert [(g.root_complex, g.switch, g.numa_node) for g in t.gpus.values()] == [
        ("root 0", "a", 0), ("root 0", None, 0), ("root 1", "b", 1)]
    assert t.error is None and t.unread and topology.wedged_gpus(t) == []
