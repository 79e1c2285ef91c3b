"""pdkit.hosts.preflight's checks on real captured facts (H200) and documented layouts (RTX PRO 6000, A6000)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pdkit.hosts.preflight import check_host, format_report, has_errors, suggest_profile
from pdkit.inventory.loader import load
from tests.conftest import REPO, write_inventory
from tests.node.runner import CLUSTER, NODE
from tests.node.runner import load as load_case

FACTS = Path(__file__).parent / "facts"


def fact(name: str, case: str):
    return load_case(FACTS / name / f"{case}.json")["fact"]


def h200_facts() -> dict:
    return {
        "os": fact("NodeOsRelease", "h200-ubuntu2404"), "arch": fact("NodeArch", "h200-x86_64"), "kernel": fact("NodeKernel", "h200"),
        "gpus": fact("NvidiaGpus", "h200-2x"), "driver": fact("NvidiaDriverVersion", "h200"), "module": fact("NvidiaKernelModule", "h200-open"),
        "pci_gpus": fact("PciNvidiaGpus", "h200-2x-vm"), "numa_cpus": {int(k): v for k, v in fact("NumaCpus", "h200-one-node").items()},
        "nics": fact("NetworkInterfaces", "h200-no-rdma"), "topology": fact("NvidiaTopology", "h200-nvlink"), "reboot_required": None,
    }


def rtx_facts() -> dict:
    return {
        "os": {"id": "ubuntu", "version_id": "24.04", "codename": "noble", "pretty_name": "Ubuntu 24.04.3 LTS"}, "arch": "x86_64", "kernel": "6.8.0-51-generic",
        "gpus": fact("NvidiaGpus", "rtx-pro-6000-8x"), "driver": "580.95.05", "module": {"loaded": True, "open": True, "version": "580.95.05"},
        "pci_gpus": fact("PciNvidiaGpus", "rtx-pro-6000-8x"), "numa_cpus": {int(k): v for k, v in fact("NumaCpus", "rtx-pro-6000-two-sockets").items()},
        "nics": fact("NetworkInterfaces", "rtx-pro-6000-with-rdma"), "topology": fact("NvidiaTopology", "rtx-pro-6000-8x-pcie"), "reboot_required": None,
    }


def spec_host(tmp_path, node: dict | None = None):
    hosts = {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": node or copy.deepcopy(NODE), "pdkit_router": {}}}
    spec = load(str(write_inventory(tmp_path, hosts, CLUSTER)))
    return spec, spec.host("gpu01")


def errors(findings) -> list[str]:
    return [f"{f.check}: {f.message}" for f in findings if f.severity == "error"]


def test_the_real_h200_capture_passes_the_h200_local_inventory(monkeypatch):
    # the inventory as written (gpu/card.py: on a machine with another card it would take that one)
    monkeypatch.setenv("PDKIT_GPU_CARD", "declared")
    spec = load(str(REPO / "inventories/h200-local.py"))
    host = spec.gpu_hosts[0]
    findings = check_host(spec, host, h200_facts())
    assert errors(findings) == []
    report = format_report(host.name, findings, h200_facts())
    assert report.splitlines()[0].startswith(f"pdkit preflight {host.name}: passed")
    assert "topology 0-1 NV18" in report and "driver 580.159.04 (open kernel module)" in report


def test_rtx_pro_6000_seed_layout_passes(tmp_path):
    spec, host = spec_host(tmp_path)
    assert errors(check_host(spec, host, rtx_facts())) == []


def test_every_problem_is_reported_at_once(tmp_path):
    node = copy.deepcopy(NODE)
    node["gpus"]["model"] = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    node["engines"] = [{"name": "tp4", "role": "unified", "gpus": [2, 3, 4, 5], "port": 30000, "numa_node": 0}]
    node["gpus"]["numa"] = [0] * 8
    node["nccl_p2p_level"] = "PHB"
    node["nic"] = "eth9"
    facts = rtx_facts()
    facts["module"] = {"loaded": True, "open": False, "version": "580.95.05"}
    spec, host = spec_host(tmp_path, node)
    found = errors(check_host(spec, host, facts))
    checks = {f.split(":")[0] for f in found}
    assert {"gpu-model", "driver", "numa", "nccl", "nic"} <= checks, found
    assert any("set pdkit_node.nccl_p2p_level: SYS" in f for f in found)
    assert any("Open Kernel Module" in f for f in found)


def test_closed_module_on_blackwell_is_an_error(tmp_path):
    facts = rtx_facts()
    facts["gpus"] = fact("NvidiaGpus", "blackwell-closed-module")
    spec, host = spec_host(tmp_path)
    assert any("No devices were found" in f for f in errors(check_host(spec, host, facts)))


def test_old_driver_is_an_error_and_fresh_node_only_a_warning(tmp_path):
    spec, host = spec_host(tmp_path)
    facts = rtx_facts()
    facts["driver"] = "570.86.15"
    facts["module"] = {"loaded": True, "open": True, "version": "570.86.15"}
    assert any("older than 580.65.06" in f for f in errors(check_host(spec, host, facts)))
    fresh = {**rtx_facts(), "gpus": fact("NvidiaGpus", "no-driver"), "driver": None, "module": fact("NvidiaKernelModule", "not-loaded"), "topology": {}}
    findings = check_host(spec, host, fresh)
    assert not has_errors(findings), errors(findings)
    assert any(f.check == "driver" and f.severity == "warning" for f in findings)


def test_lab_host_skips_gpu_checks_and_says_so(tmp_path):
    node = {**copy.deepcopy(NODE), "gpu": "none"}
    spec, host = spec_host(tmp_path, node)
    findings = check_host(spec, host, {"os": {"id": "debian", "version_id": "12"}, "arch": "x86_64", "kernel": "6.1.0-28-amd64"})
    assert [(f.severity, f.check) for f in findings] == [("note", "gpu"), ("note", "engines")]
    assert "skipped" in findings[0].message
    # real SGLang cannot start without a GPU: the report says the engines are laid down only
    assert spec.cluster.engine == "sglang" and "not started" in findings[1].message and "no GPU" in findings[1].message


def test_a_lab_host_running_the_sim_gets_no_engines_note(tmp_path):
    node = {**copy.deepcopy(NODE), "gpu": "none"}
    spec, host = spec_host(tmp_path, node)
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"engine": "sim"})})
    findings = check_host(spec, host, {"os": {"id": "debian", "version_id": "12"}, "arch": "x86_64", "kernel": "6.1.0-28-amd64"})
    assert [(f.severity, f.check) for f in findings] == [("note", "gpu")]


def test_nvlink_profile_on_pcie_gpus_is_an_error_with_a_suggestion(tmp_path):
    node = {**copy.deepcopy(NODE), "nccl_profile": "nvlink"}
    spec, host = spec_host(tmp_path, node)
    found = errors(check_host(spec, host, rtx_facts()))
    assert any("set pdkit_node.nccl_profile: pcie (nccl_p2p_level PHB)" in f for f in found), found


@pytest.mark.parametrize("links, expected", [
    (["NV18"], ("nvlink", None)), (["PIX", "NODE"], ("pcie", "PHB")), (["PXB"], ("pcie", "PXB")), (["SYS", "PIX"], ("pcie", "SYS")),
])
def test_suggest_profile(links, expected):
    assert suggest_profile(links) == expected


def test_unsupported_os_is_an_error(tmp_path):
    spec, host = spec_host(tmp_path)
    facts = {**rtx_facts(), "os": {"id": "ubuntu", "version_id": "22.04"}}
    assert any("ubuntu 22.04 has no supported NVIDIA repository" in f for f in errors(check_host(spec, host, facts)))


def test_a_provided_stack_is_not_held_to_the_driver_install_os_rules(tmp_path):
    """nvidia_stack: provided: pdkit installs no NVIDIA repository or modules, so an OS without one
    (here Ubuntu 22.04) is no preflight error; the same OS with the stack installed is."""
    node = copy.deepcopy(NODE)
    node["nvidia_stack"] = "provided"
    spec, host = spec_host(tmp_path, node)
    facts = {**rtx_facts(), "os": {"id": "ubuntu", "version_id": "22.04"}}
    assert not any(f.startswith("os:") for f in errors(check_host(spec, host, facts)))
