"""PCIe topology and GPU health facts (pdkit/agent/topology_probe.py -> pdkit/agent/topology.py) and the preflight's
rules on them (pdkit/hosts/preflight.py _check_pcie), on the box shapes of tests/fixtures/topology/ (issue 47)."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.agent import topology
from pdkit.hosts.preflight import check_host, format_report, suggest_profile
from pdkit.inventory.loader import load
from roles.node_facts import NODE_FACTS_MARK, NodeFacts, PcieTopology
from tests.conftest import REPO, write_inventory
from tests.node.runner import CLUSTER, NODE

FIXTURES = REPO / "tests/fixtures/topology"
SHAPES = ("numa-halves-own-root", "switch-two-roots", "acs-on-switch", "wedged-gpus")


def probe(shape: str) -> dict:
    return json.loads((FIXTURES / f"{shape}.json").read_text())


def parsed(shape: str) -> topology.Topology:
    p = probe(shape)
    return topology.parse_probe(p, p["fixture"]["smi_gpus"])


def facts(shape: str) -> dict:
    """A healthy 8 x RTX PRO 6000 node's preflight facts, the GPUs and PCIe facts of SHAPE."""
    p = probe(shape)
    smi = p["fixture"]["smi_gpus"]
    return {
        "os": {"id": "ubuntu", "version_id": "24.04", "codename": "noble", "pretty_name": "Ubuntu 24.04.3 LTS"},
        "arch": "x86_64", "kernel": "6.8.0-51-generic",
        "gpus": {"available": True, "error": None, "gpus": smi}, "driver": "580.95.05",
        "module": {"loaded": True, "open": True, "version": "580.95.05"},
        "pci_gpus": [{"bus_id": g["bdf"], "class": g["class"], "numa_node": int(g["numa_node"])} for g in p["gpus"]],
        "numa_cpus": {0: {"cpulist": "0-63,128-191", "cpus": 128}, 1: {"cpulist": "64-127,192-255", "cpus": 128}},
        "nics": {"interfaces": ["lo", "eno1"], "rdma": []}, "topology": links(shape), "reboot_required": None, "pcie": p,
        "model_dirs": {"user": "pdkit", "user_exists": True, "how": "runuser", "paths": {"/models/m": {
            "exists": True, "is_dir": True, "config": True, "indexes": ["model.safetensors.index.json"], "weights": [],
            "safetensors": 1, "missing_shards": [], "missing_count": 0, "unreadable": []}}},
    }


def links(shape: str) -> dict:
    """`nvidia-smi topo -m` as NvidiaTopology parses it, for SHAPE: PIX under one switch, NODE within a NUMA node, else SYS."""
    t = parsed(shape)
    link = lambda a, b: ("PIX" if a.switch == b.switch else "NODE" if a.numa_node == b.numa_node else "SYS")  # noqa: E731
    return {"error": None, "gpus": [str(i) for i in t.gpus], "cpu_affinity": {}, "numa_affinity": {},
            "links": {str(i): {str(j): link(a, b) for j, b in t.gpus.items() if j != i} for i, a in t.gpus.items()}}


def spec_host(tmp_path, **changes):
    node = copy.deepcopy(NODE)
    node.update(changes)
    hosts = {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": node, "pdkit_router": {}}}
    spec = load(str(write_inventory(tmp_path, hosts, CLUSTER)))
    return spec, spec.host("gpu01")


def found(findings, severity: str, check: str = "pcie") -> list[str]:
    return [f.message for f in findings if f.severity == severity and f.check == check]


# ------------------------------------------------------------------------------------- parsing the facts


def test_every_fixture_says_where_it_comes_from_and_parses():
    readme = (FIXTURES / "README.md").read_text()
    for shape in SHAPES:
        p = probe(shape)
        assert p["format"] == 1 and p["fixture"]["source"] and shape in readme
        t = parsed(shape)
        assert t.error is None and len(t.gpus) == 8


def test_numa_halves_box_places_each_half_under_its_own_root_complex_and_switch():
    t = parsed("numa-halves-own-root")
    assert {i: (g.root_complex, g.switch, g.numa_node) for i, g in t.gpus.items() if i in (0, 3, 4, 7)} == {
        0: ("pci0000:00", "0000:01:00.0", 0), 3: ("pci0000:00", "0000:01:00.0", 0),
        4: ("pci0000:80", "0000:81:00.0", 1), 7: ("pci0000:80", "0000:81:00.0", 1)}
    assert [b.port_type for b in t.gpus[0].bridges] == ["Root Port", "Upstream Port", "Downstream Port"]
    assert t.gpus[0].root_port == "0000:00:01.1"
    assert not any(b.acs_redirect for g in t.gpus.values() for b in g.bridges)
    assert t.iommu == {"enabled": True, "passthrough": True, "why": "GPU IOMMU group type identity (amd_iommu=on iommu=pt)"}
    assert t.hmm["state"] == "off" and "uvm_disable_hmm = Y" in t.hmm["why"]
    assert topology.wedged_gpus(t) == []


def test_acs_box_reads_redirect_on_switch_ports_a_translating_iommu_and_hmm_on():
    t = parsed("acs-on-switch")
    last = t.gpus[1].bridges[-1]
    assert (last.bdf, last.port_type, last.acs_redirect) == ("0000:02:01.0", "Downstream Port", ("ReqRedir", "CmpltRedir"))
    assert t.iommu["enabled"] is True and t.iommu["passthrough"] is False and "DMA-FQ" in t.iommu["why"]
    assert t.hmm == {"state": "on", "why": "nvidia-smi -q: Addressing Mode HMM"}


def test_iommu_off_box():
    assert parsed("switch-two-roots").iommu["enabled"] is False


def test_gpu_indices_follow_nvidia_smi_not_pci_order():
    p = probe("numa-halves-own-root")
    smi = [dict(g, index=7 - g["index"]) for g in p["fixture"]["smi_gpus"]]
    t = topology.parse_probe(p, smi)
    assert t.gpus[7].bdf == "0000:03:00.0" and t.gpus[0].bdf == "0000:86:00.0"


@pytest.mark.parametrize("uvm, smi_mode, state", [
    ({"loaded": True, "uvm_disable_hmm": "Y", "modprobe": []}, "None", "off"),
    ({"loaded": True, "uvm_disable_hmm": "N", "modprobe": []}, "HMM", "on"),
    ({"loaded": True, "uvm_disable_hmm": "N", "modprobe": []}, None, "on"),
    # HMM not enabled although the switch allows it: the kernel lacks HMM support, nvidia-smi says so
    ({"loaded": True, "uvm_disable_hmm": "N", "modprobe": []}, "None", "off"),
    ({"loaded": False, "uvm_disable_hmm": None, "modprobe": ["/etc/modprobe.d/uvm.conf: options nvidia_uvm uvm_disable_hmm=1"]}, None, "off"),
    ({"loaded": False, "uvm_disable_hmm": None, "modprobe": ["/etc/modprobe.d/uvm.conf: #options nvidia_uvm uvm_disable_hmm=1"]}, None, "unknown"),
    ({"loaded": False, "uvm_disable_hmm": None, "modprobe": []}, None, "unknown"),
])
def test_hmm_state(uvm, smi_mode, state):
    smi = {"0000:03:00.0": {"addressing_mode": smi_mode}} if smi_mode else {}
    assert topology.hmm_state({"uvm": uvm}, smi)["state"] == state


def _config(port_type: int, acs_ctl: int | None) -> str:
    """A bridge's 4096-byte config space: a PCI Express capability at 0x40 and, optionally, ACS at 0x100."""
    data = bytearray(4096)
    data[6] = 0x10  # status: capability list
    data[0x34] = 0x40
    data[0x40:0x44] = bytes([0x10, 0x00, 0x02 | (port_type << 4), 0x00])
    if acs_ctl is not None:
        data[0x100:0x104] = (0x000D | 1 << 16).to_bytes(4, "little")  # ACS, version 1, last capability
        data[0x104:0x106] = (0x5F).to_bytes(2, "little")
        data[0x106:0x108] = acs_ctl.to_bytes(2, "little")
    return data.hex()


def test_config_space_gives_port_type_and_acs_where_lspci_is_missing():
    assert topology.parse_config_bridge(_config(6, 0b1101)) == {
        "port_type": "Downstream Port", "acs_hidden": False,
        "acs_ctl": {"SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True, "UpstreamFwd": False,
                    "EgressCtrl": False, "DirectTrans": False}}
    assert topology.parse_config_bridge(_config(4, None))["acs_ctl"] is None
    # not root: 64 bytes only, no extended capabilities to read ACS from
    assert topology.parse_config_bridge(_config(6, 0b1101)[:128])["acs_hidden"] is True


def test_lspci_without_root_hides_the_capabilities():
    text = "0000:02:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)\n\tCapabilities: <access denied>\n"
    assert topology.parse_lspci_bridge(text) == {"port_type": None, "acs_ctl": None, "acs_hidden": True}


def test_xid_lines_and_bus_ids():
    lines = ["[10233.017388] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
             "Dec 07 09:12:44 gpu01 kernel: NVRM: Xid (PCI:0000:a3:00): 95, pid=1234, name=python3, Uncontained: FBHUB.",
             "[  12.000001] nvidia-nvswitch: probe of 0000:05:00.0 failed"]
    assert topology.parse_xid_lines(lines) == [
        {"bdf": "0000:05:00.0", "xid": 79, "text": "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", "t": 10233.017388},
        {"bdf": "0000:a3:00.0", "xid": 95, "text": "pid=1234, name=python3, Uncontained: FBHUB.", "t": None}]
    assert topology.bus_id("00000000:A3:00.0") == "0000:a3:00.0"


# ------------------------------------------------------------------------------------- the wedged-GPU function


def test_wedged_gpus_names_each_gpu_and_what_was_seen():
    wedged = {w.index: w for w in topology.wedged_gpus(parsed("wedged-gpus"))}
    assert sorted(wedged) == [2, 5, 6, 7]
    assert any("Xid 79" in s and "fallen off the bus" in s for s in wedged[2].seen)
    assert any("nvidia-smi -q does not list it" in s for s in wedged[2].seen)
    assert wedged[5].seen == ("row remapping pending (Remapped Rows Pending: Yes): reset the GPU to apply it",)
    assert wedged[6].seen == ("100% utilisation with no process (a hung P2P collective stays so until a reset)",)
    assert wedged[7].seen == ("nvidia-smi reports GPU Recovery Action 'GPU Reset'",)
    assert wedged[6].message("gpu01").startswith("gpu01: GPU 6 (0000:85:00.0) is wedged: 100% utilisation")


def test_an_application_xid_and_a_recovered_one_do_not_wedge_a_gpu():
    t = parsed("wedged-gpus")
    assert [x["xid"] for x in t.health[0]["xids"]] == [13] and [x["xid"] for x in t.health[1]["xids"]] == [48]
    assert t.health[0]["processes"] == 1 and t.health[0]["utilization_gpu"] == 31
    assert {w.index for w in topology.wedged_gpus(t)}.isdisjoint({0, 1})


def test_without_a_recovery_action_a_reset_class_xid_counts():
    p = probe("wedged-gpus")
    p["nvidia_smi_q"] = None  # an older driver, or nvidia-smi hung: the log is what is left
    wedged = {w.index: w for w in topology.wedged_gpus(topology.parse_probe(p, p["fixture"]["smi_gpus"]))}
    assert sorted(wedged) == [1, 2]  # Xid 48 on GPU 1 counts now; Xid 13 on GPU 0 never does
    assert "double-bit ECC" in wedged[1].seen[0]


# ------------------------------------------------------------------------------------- the placement rules


def test_numa_halves_box_passes_with_the_seed_layout(tmp_path):
    spec, host = spec_host(tmp_path)
    findings = check_host(spec, host, facts("numa-halves-own-root"))
    assert [f for f in findings if f.severity in ("error", "warning")] == []
    report = format_report("gpu01", findings, facts("numa-halves-own-root"))
    assert ("  fact     pcie pci0000:00 switch 0000:01:00.0 GPUs 0,1,2,3; pci0000:80 switch 0000:81:00.0 GPUs 4,5,6,7; "
            "iommu passthrough; hmm off") in report.splitlines()


def test_rank_for_rank_pd_over_two_switches_does_not_collapse(tmp_path):
    # prefill TP4 on GPUs 0-3 (switches on pci0000:00 and pci0000:20), decode TP4 on 4-7: GPU i writes to
    # GPU i+4, so each prefill switch writes to one root complex
    spec, host = spec_host(tmp_path)
    findings = check_host(spec, host, facts("switch-two-roots"))
    assert found(findings, "warning") == [] and found(findings, "error") == []


def test_one_prefill_switch_writing_to_two_root_complexes_warns_and_says_what_to_change(tmp_path):
    engines = [{"name": "p0", "role": "prefill", "gpus": [0, 1], "port": 30000},
               {"name": "d0", "role": "decode", "gpus": [4, 5], "port": 30001},
               {"name": "d1", "role": "decode", "gpus": [6, 7], "port": 30002}]
    spec, host = spec_host(tmp_path, engines=engines)
    warnings = found(check_host(spec, host, facts("switch-two-roots")), "warning")
    # each decode engine alone lies behind one root complex: the pattern is the prefill's switch writing to both
    assert warnings == []
    # a decode engine whose TP ranks sit behind two root complexes
    engines = [{"name": "p0", "role": "prefill", "gpus": [0, 1], "port": 30000},
               {"name": "d0", "role": "decode", "gpus": [4, 6], "port": 30001}]
    spec, host = spec_host(tmp_path, engines=engines)
    warnings = found(check_host(spec, host, facts("switch-two-roots")), "warning")
    assert len(warnings) == 1, warnings
    w = warnings[0]
    assert w.startswith("gpu01: prefill 'p0' GPUs 0, 1 behind switch 0000:01:00.0 (pci0000:00) write KV into decode 'd0'")
    assert "pci0000:80: GPUs 4; pci0000:a0: GPUs 6" in w and "~52 to 6-13 GB/s" in w
    assert "behind one root complex" in w and "pd_group" in w


def test_a_prefill_tp_smaller_than_decode_fans_out(tmp_path):
    # prefill TP2 -> decode TP4: rank 0 writes to decode ranks 0-1 (pci0000:80), rank 1 to 2-3 (pci0000:a0)
    engines = [{"name": "p0", "role": "prefill", "gpus": [0, 1], "port": 30000},
               {"name": "d0", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001}]
    spec, host = spec_host(tmp_path, engines=engines)
    assert len(found(check_host(spec, host, facts("switch-two-roots")), "warning")) == 1
    assert topology.pd_flows((0, 1), (4, 5, 6, 7), True) == [(0, 4), (0, 5), (1, 6), (1, 7)]
    assert topology.pd_flows((0, 1, 2, 3), (4, 5), True) == [(0, 4), (1, 4), (2, 5), (3, 5)]


def test_separate_pd_groups_keep_each_prefill_switch_on_one_root(tmp_path):
    engines = [{"name": "p0", "role": "prefill", "gpus": [0, 1], "port": 30000, "pd_group": "a"},
               {"name": "d0", "role": "decode", "gpus": [4, 5], "port": 30001, "pd_group": "a"},
               {"name": "p1", "role": "prefill", "gpus": [2, 3], "port": 30002, "pd_group": "b", "bootstrap_port": 8999},
               {"name": "d1", "role": "decode", "gpus": [6, 7], "port": 30003, "pd_group": "b"}]
    spec, host = spec_host(tmp_path, engines=engines)
    assert found(check_host(spec, host, facts("switch-two-roots")), "warning") == []


def test_a_tp_group_over_three_root_complexes_warns(tmp_path):
    engines = [{"name": "tp8", "role": "unified", "gpus": list(range(8)), "port": 30000}]
    spec, host = spec_host(tmp_path, engines=engines, nccl_p2p_level="SYS")
    warnings = found(check_host(spec, host, facts("switch-two-roots")), "warning")
    assert len(warnings) == 4 and all("engine 'tp8''s TP group" in w for w in warnings)
    assert "pdkit_node.engines[0].gpus" in warnings[0] and "pcie-p2p-off" in warnings[0]
    # TP4 over two switches on two root complexes: each switch's peers sit behind one root
    engines = [{"name": "tp4", "role": "unified", "gpus": [0, 1, 2, 3], "port": 30000}]
    spec, host = spec_host(tmp_path, engines=engines)
    assert found(check_host(spec, host, facts("switch-two-roots")), "warning") == []


def test_acs_redirect_and_hmm_with_p2p_are_errors(tmp_path):
    spec, host = spec_host(tmp_path)
    findings = check_host(spec, host, facts("acs-on-switch"))
    errors = found(findings, "error")
    assert any(e.startswith("gpu01: engine 'prefill': ACS ReqRedir+ CmpltRedir+ on Downstream Port 0000:02:00.0")
               and "pcie-p2p-off" in e for e in errors), errors
    assert any(e.startswith("gpu01: engine 'decode': ACS ReqRedir+ CmpltRedir+ on Downstream Port 0000:82:00.0") for e in errors)
    assert any("on the KV path of prefill 'prefill' -> decode 'decode'" in e for e in errors)
    hmm = [e for e in errors if "HMM on" in e]
    assert len(hmm) == 2 and "options nvidia_uvm uvm_disable_hmm=1" in hmm[0]
    assert any("the IOMMU translates" in w for w in found(findings, "warning"))
    assert format_report("gpu01", findings, facts("acs-on-switch")).startswith("pdkit preflight gpu01: FAILED")


def test_with_p2p_off_only_the_kv_path_stays_an_error_and_the_profile_note_names_the_reasons(tmp_path):
    spec, host = spec_host(tmp_path, nccl_profile="pcie-p2p-off")
    f = facts("acs-on-switch")
    findings = check_host(spec, host, f)
    errors = found(findings, "error")
    assert errors and all("KV path" in e for e in errors)
    note = next(x.message for x in findings if x.check == "nccl" and "'prefill'" in x.message)
    assert "as this node needs: ACS ReqRedir+ CmpltRedir+ on Downstream Port 0000:02:00.0" in note and "HMM on" in note
    # the same profile on the healthy box: the facts say P2P would be safe
    f = facts("numa-halves-own-root")
    note = next(x.message for x in check_host(spec, host, f) if x.check == "nccl" and "'prefill'" in x.message)
    assert "the facts show no trap" in note and "nccl_profile: pcie" in note


def test_a_declared_layout_the_probe_contradicts_is_named_and_a_matching_one_is_not(tmp_path):
    """pdkit_node.gpus.pcie (validate's facts) against the probe's: the preflight says where they disagree."""
    halves = [{"root": 0, "switch": "a"}] * 4 + [{"root": 1, "switch": "b"}] * 4
    spec, host = spec_host(tmp_path, gpus={**NODE["gpus"], "pcie": halves})
    assert not [w for w in found(check_host(spec, host, facts("numa-halves-own-root")), "warning")
                if "pdkit_node.gpus.pcie" in w]
    [w] = [w for w in found(check_host(spec, host, facts("switch-two-roots")), "warning") if "pdkit_node.gpus.pcie" in w]
    assert w.startswith("gpu01: pdkit_node.gpus.pcie disagrees with the PCIe probe: GPUs 0, 1, 2, 3 are declared "
                        "behind one root complex (root 0) but sit behind pci0000:00 (GPUs 0, 1) and pci0000:20 "
                        "(GPUs 2, 3); ")
    assert ("GPUs 4, 5, 6, 7 are declared behind one switch (b) but sit behind switch 0000:81:00.0 (GPUs 4, 5) and "
            "switch 0000:a1:00.0 (GPUs 6, 7)") in w
    assert "correct pdkit_node.gpus.pcie to the probe's" in w


def test_layout_disagreements_name_switches_root_ports_and_missing_gpus():
    probed = parsed("numa-halves-own-root")
    split = topology.declared_topology([("0", "a")] * 2 + [("0", "b")] * 2 + [("1", "c")] * 4)
    assert topology.layout_disagreements(split, probed) == [
        "GPUs 0, 1, 2, 3 sit behind one switch (0000:01:00.0) but are declared behind switch a (GPUs 0, 1) and "
        "switch b (GPUs 2, 3)"]
    on_port = topology.declared_topology([("0", "a"), ("0", None)] + [("0", "a")] * 2 + [("1", "c")] * 4)
    assert topology.layout_disagreements(on_port, probed) == [
        "GPU 1 is declared on a root port but sits behind switch 0000:01:00.0"]
    short = topology.declared_topology([("0", "a")] * 4 + [("1", "c")] * 3)
    assert topology.layout_disagreements(short, probed) == ["GPU 7 on the PCI bus but not declared"]


def test_suggest_profile_follows_the_hazards():
    assert suggest_profile(["PIX", "NODE"]) == ("pcie", "PHB")
    assert suggest_profile(["PIX", "NODE"], ["ACS ReqRedir+ on Downstream Port 0000:02:00.0"]) == ("pcie-p2p-off", None)


def test_a_wedged_gpu_an_engine_uses_is_an_error(tmp_path):
    spec, host = spec_host(tmp_path)
    findings = check_host(spec, host, facts("wedged-gpus"))
    errors = found(findings, "error", "gpu-health")
    assert [e.split(" is wedged")[0] for e in errors] == [
        "gpu01: GPU 2 (0000:05:00.0)", "gpu01: GPU 5 (0000:84:00.0)", "gpu01: GPU 6 (0000:85:00.0)", "gpu01: GPU 7 (0000:86:00.0)"]
    assert all("nvidia-smi -r" in e for e in errors)
    # GPUs no engine uses: a warning
    spec, host = spec_host(tmp_path, engines=[{"name": "u", "role": "unified", "gpus": [0, 1], "port": 30000}])
    assert len(found(check_host(spec, host, facts("wedged-gpus")), "warning", "gpu-health")) == 4
    assert found(check_host(spec, host, facts("wedged-gpus")), "error", "gpu-health") == []


def test_facts_without_the_probe_add_nothing_and_a_failed_probe_warns(tmp_path):
    spec, host = spec_host(tmp_path)
    f = facts("numa-halves-own-root")
    del f["pcie"]
    assert [x for x in check_host(spec, host, f) if x.check in ("pcie", "gpu-health")] == []
    f["pcie"] = PcieTopology.default()
    assert [x.severity for x in check_host(spec, host, f) if x.check == "pcie"] == ["warning"]


# ------------------------------------------------------------------------------------- the probe itself


def _run_probe(env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(topology.PROBE_PATH), "--plain"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_probe_runs_here_without_gpus_and_the_preflight_does_not_fail(tmp_path):
    out = _run_probe()
    assert out["format"] == 1 and out["gpus"] == [] and isinstance(out["unread"], list)
    spec, host = spec_host(tmp_path)
    f = {**facts("numa-halves-own-root"), "pcie": out, "gpus": {"available": False, "error": None, "gpus": []},
         "pci_gpus": [], "driver": None}
    pcie = [(x.severity, x.message) for x in check_host(spec, host, f) if x.check == "pcie"]
    assert pcie == [("note", "gpu01: no NVIDIA GPU on the PCI bus: PCIe placement rules skipped")]


def test_the_probe_reads_a_sysfs_tree_and_says_what_it_could_not_read(tmp_path):
    """A fake root (PDKIT_TOPOLOGY_ROOT): one GPU behind a switch, no lspci, an nvidia-smi and a dmesg."""
    root = tmp_path / "root"
    chain = ["pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:00.0", "0000:43:00.0"]
    dev = root / "sys/devices" / "/".join(chain)
    for i, name in enumerate(chain[1:]):
        d = root / "sys/devices" / "/".join(chain[:i + 2])
        d.mkdir(parents=True, exist_ok=True)
        (d / "config").write_bytes(bytes.fromhex(_config(6, 0b1101))[:4096])
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    (dev / "device").write_text("0x2bb5\n")
    (dev / "numa_node").write_text("1\n")
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:43:00.0").symlink_to(dev)
    (root / "sys/class/iommu").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro iommu=off\n")
    (root / "sys/module/nvidia_uvm/parameters").mkdir(parents=True)
    (root / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm").write_text("N\n")
    (root / "etc/modprobe.d").mkdir(parents=True)
    (root / "etc/modprobe.d/nvidia.conf").write_text("options nvidia NVreg_OpenRmEnableUnsupportedGpus=1\n")
    bin_ = root / "bin"
    bin_.mkdir()
    smi = probe("numa-halves-own-root")["nvidia_smi_q"].replace("0000:03:00.0", "0000:43:00.0")
    (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi}\nEOF\n")
    (bin_ / "dmesg").write_text("#!/bin/sh\necho '[ 77.1] NVRM: Xid (PCI:0000:43:00): 79, pid=1, name=x, GPU has fallen off the bus.'\n"
                                "echo '[ 77.2] something else'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    out = _run_probe({"PDKIT_TOPOLOGY_ROOT": str(root)})
    assert out["gpus"] == [{"bdf": "0000:43:00.0", "sysfs_path": "/sys/devices/" + "/".join(chain), "class": "0x030200",
                            "device": "0x2bb5", "numa_node": "1", "iommu_group": None}]
    assert sorted(out["bridges"]) == chain[1:4] and all(b["lspci"] is None and b["config"] for b in out["bridges"].values())
    assert any(u["what"].startswith("lspci") and "not installed" in u["why"] for u in out["unread"])
    assert out["xid_lines"] == ["[ 77.1] NVRM: Xid (PCI:0000:43:00): 79, pid=1, name=x, GPU has fallen off the bus."]
    assert out["uvm"] == {"loaded": True, "uvm_disable_hmm": "N", "modprobe": []}
    t = topology.parse_probe(out)
    g = t.gpus[0]
    assert (g.root_complex, g.root_port, g.numa_node) == ("pci0000:40", "0000:40:01.1", 1)
    # the config-space port types all read Downstream Port here, so the switch is the pair rule's
    assert all(b.acs_redirect == ("ReqRedir", "CmpltRedir") for b in g.bridges)
    # uvm_disable_hmm=N, but nvidia-smi says Addressing Mode None: HMM is not in use (the kernel lacks it)
    assert t.iommu["enabled"] is False and t.hmm["state"] == "off" and "Addressing Mode None" in t.hmm["why"]
    assert [w.index for w in topology.wedged_gpus(t)] == []  # the smi text says recovery action None


def test_node_facts_bundle_the_probe_only_when_asked(tmp_path):
    assert "pdkit-topology" not in NodeFacts().command(("arch",))
    command = NodeFacts().command(("arch",), pcie=True)
    assert command.endswith(f"echo '{NODE_FACTS_MARK}pcie' && {{ {PcieTopology().command()} ; }}")
    assert shlex.quote(topology.probe_source()) in command
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
    values = NodeFacts().process(proc.stdout.splitlines())
    assert values["pcie"]["format"] == 1 and "arch" in values
    assert NodeFacts().process([NODE_FACTS_MARK + "pcie"])["pcie"] == PcieTopology.default()
    assert PcieTopology().process(["Traceback", "SyntaxError: bad"]) == {"error": "the probe failed: SyntaxError: bad"}


def test_the_probe_is_standard_library_only():
    import ast

    tree = ast.parse(topology.PROBE_PATH.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names), names
    assert Path(topology.PROBE_PATH).parent.name == "agent"


def test_the_recorded_h100_vm_parses_as_what_it_is():
    """The first RECORDED capture (the lent H100, 2026-12-07): a VM with one GPU straight on a virtual root bus,
    no bridges, no NUMA node, no IOMMU; uvm_disable_hmm N but HMM unsupported by the kernel; healthy."""
    t = parsed("h100-vm-recorded")
    assert probe("h100-vm-recorded")["fixture"]["source"].startswith("RECORDED") and "h100-vm-recorded" in \
        (FIXTURES / "README.md").read_text()
    assert t.error is None and list(t.gpus) == [0]
    g = t.gpus[0]
    assert (g.bdf, g.root_complex, g.numa_node, g.bridges) == ("0000:00:06.0", "pci0000:00", None, ())
    assert t.iommu["enabled"] is False
    assert t.hmm["state"] == "off" and "HMM unsupported" in t.hmm["why"]
    assert topology.wedged_gpus(t) == []
    # the box the lent GPU gives: prefill and decode sharing GPU 0, so its KV writes cross no link
    shared = topology.Placed(0, "prefill", (0,), True), topology.Placed(1, "decode", (0,), True)
    assert topology.pd_collapse(t, *shared) == []
