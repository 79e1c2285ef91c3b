"""pdkit.render.node's decisions and the spec/flags fields of the node layer."""

from __future__ import annotations

import copy

import pytest

from pdkit.inventory.loader import load, load_with_problems
from pdkit.render import flags
from pdkit.render.node import UnsupportedNode, driver_packages, kernel_flavour, node_stack, repo_distro, sources_text
from tests.conftest import write_inventory
from tests.node.runner import CLUSTER, NODE


@pytest.mark.parametrize("os_id, version, distro", [("ubuntu", "24.04", "ubuntu2404"), ("debian", "12", "debian12"), ("debian", "13", "debian13")])
def test_repo_distro(os_id, version, distro):
    assert repo_distro(os_id, version) == distro


def test_unsupported_os_names_the_valid_ones():
    with pytest.raises(UnsupportedNode, match="ubuntu 22.04 has no supported NVIDIA repository; valid: ubuntu 24.04, debian 12, debian 13"):
        repo_distro("ubuntu", "22.04")


def test_deb822_source_text():
    assert sources_text("debian13", "sbsa") == (
        "# NVIDIA CUDA repository (pdkit: pdkit/node.py, docs/tuning.md)\n"
        "Types: deb\n"
        "URIs: https://developer.download.nvidia.com/compute/cuda/repos/debian13/sbsa/\n"
        "Suites: /\n"
        "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg\n"
    )
    assert node_stack(os_id="ubuntu", version_id="24.04", machine="aarch64", kernel="6.8.0-1-generic", modules="nvidia-dkms").arch == "sbsa"


def test_driver_packages():
    assert driver_packages("debian12", "6.1.0-28-amd64", "nvidia-dkms") == ["nvidia-driver-pinning-580", "linux-headers-6.1.0-28-amd64", "nvidia-open"]
    assert driver_packages("ubuntu2404", "6.8.0-1021-aws", "ubuntu-prebuilt") == [
        "nvidia-driver-pinning-580", "linux-modules-nvidia-580-open-aws", "nvidia-headless-no-dkms-580-open", "nvidia-utils-580",
    ]
    with pytest.raises(UnsupportedNode, match="needs Ubuntu"):
        driver_packages("debian12", "6.1.0-28-amd64", "ubuntu-prebuilt")
    with pytest.raises(UnsupportedNode, match="no flavour suffix"):
        kernel_flavour("6.18.44")


def _problems(tmp_path, node):
    hosts = {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": node, "pdkit_router": {}}}
    _, problems = load_with_problems(str(write_inventory(tmp_path, hosts, CLUSTER)))
    return [str(p) for p in problems if p.severity == "error"]


def test_p2p_level_only_with_the_pcie_profile(tmp_path):
    node = {**copy.deepcopy(NODE), "nccl_profile": "nvlink", "nccl_p2p_level": "SYS"}
    assert _problems(tmp_path, node) == ["gpu01: pdkit_node.nccl_p2p_level: nccl_p2p_level is only used by the 'pcie' NCCL profile; this node's profile is 'nvlink' (remove nccl_p2p_level or set nccl_profile: pcie)"]


def test_custom_all_reduce_on_with_p2p_off_is_an_error(tmp_path):
    node = {**copy.deepcopy(NODE), "nccl_profile": "pcie-p2p-off"}
    node["engines"][1]["tuning"] = {"custom_all_reduce": "on"}
    assert _problems(tmp_path, node) == ["gpu01: pdkit_node.engines[1].tuning.custom_all_reduce: custom all-reduce needs GPU peer-to-peer, but the 'pcie-p2p-off' profile disables it (NCCL_P2P_DISABLE=1): use 'auto' or 'off'"]


def test_p2p_off_profile_couples_nccl_and_the_engines(tmp_path):
    node = {**copy.deepcopy(NODE), "nccl_profile": "pcie-p2p-off"}
    spec = load(str(write_inventory(tmp_path, {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": node, "pdkit_router": {}}}, CLUSTER)))
    host = spec.host("gpu01")
    env = flags.nccl_env(spec, host)
    assert env["NCCL_P2P_DISABLE"] == "1" and "LL128" not in env["NCCL_PROTO"]
    assert all("--disable-custom-all-reduce" in flags.sglang_args(spec, host, e) for e in host.node.engines)


def test_explicit_p2p_level_wins_over_the_numa_default(tmp_path):
    node = {**copy.deepcopy(NODE), "nccl_p2p_level": "SYS"}
    spec = load(str(write_inventory(tmp_path, {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": node, "pdkit_router": {}}}, CLUSTER)))
    assert flags.nccl_env(spec, spec.host("gpu01"))["NCCL_P2P_LEVEL"] == "SYS"
    spec = load(str(write_inventory(tmp_path, {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": copy.deepcopy(NODE), "pdkit_router": {}}}, CLUSTER)))
    assert flags.nccl_env(spec, spec.host("gpu01")) == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB", "NCCL_PROTO": "LL,Simple"}
