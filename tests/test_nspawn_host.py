"""gpu/nspawn/host.py's pure parts: the network of several container hosts on one lent machine.

The whole launcher ran on the H200 (docs/gpu.md, "Two hosts on one GPU") and in the CPU rehearsal
(inventories/nspawn-pair-rehearsal.py); these pin what it writes and decides.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tests.conftest import REPO, load_script


@pytest.fixture(scope="module")
def host():
    return load_script("gpu/nspawn/host.py", "pdkit_nspawn_host")


def test_the_veth_nspawn_makes_is_named_as_nspawn_names_it(host):
    assert host.host_veth("pdkit-a", "bridge") == "vb-pdkit-a"
    assert host.host_veth("pdkit-a", "routed") == "ve-pdkit-a"
    assert len(host.host_veth("a-very-long-machine-name", "bridge")) == 15  # IFNAMSIZ - 1


def test_the_machine_keeps_the_first_address_of_the_network(host):
    assert str(host.gateway_of(ipaddress.IPv4Interface("10.214.0.3/24"))) == "10.214.0.1/24"
    with pytest.raises(SystemExit, match="10.214.0.1 is the lent machine's own end"):
        host.gateway_of(ipaddress.IPv4Interface("10.214.0.1/24"))


@pytest.mark.parametrize("mode, steps", [
    ("bridge", ["addr replace 10.214.0.3/24 dev host0", "link set dev host0 up", "route replace default via 10.214.0.1"]),
    ("routed", ["addr replace 10.214.0.3/32 dev host0", "link set dev host0 up", "route replace 10.214.0.1/32 dev host0",
                "route replace 10.214.0.0/24 via 10.214.0.1", "route replace default via 10.214.0.1"]),
])
def test_the_container_gets_its_address_before_sshd_starts(host, tmp_path, mode, steps):
    host.guest_network(tmp_path, ipaddress.IPv4Interface("10.214.0.3/24"), mode)
    unit = (tmp_path / "etc/systemd/system/pdkit-nspawn-net.service").read_text()
    assert [line.removeprefix("ExecStart=/usr/sbin/ip ") for line in unit.splitlines() if line.startswith("ExecStart=")][1:] == steps
    assert "Before=network.target ssh.service sshd.service" in unit and "DefaultDependencies=no" in unit
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants/pdkit-nspawn-net.service"
    assert wants.is_symlink() and str(wants.readlink()) == "/etc/systemd/system/pdkit-nspawn-net.service"
    dropin = (tmp_path / "etc/systemd/system/ssh.service.d/pdkit-nspawn-net.conf").read_text()
    assert "After=pdkit-nspawn-net.service" in dropin and "Wants=pdkit-nspawn-net.service" in dropin
    host.guest_network(tmp_path, ipaddress.IPv4Interface("10.214.0.3/24"), mode)  # again: replaces, no error


def test_an_empty_mount_point_left_by_an_earlier_boot_does_not_block_the_image_bind(host, tmp_path):
    """On the H200 a second `up` after a failed boot refused: nspawn had left an empty
    /usr/bin/python3.12 in the tree as the bind's mount point."""
    image = tmp_path / "image"
    (image / "bin").mkdir(parents=True)
    exe = image / "bin" / "python3.12"
    exe.write_text("#!/bin/false\n")
    root = tmp_path / "tree"
    info = {"base_prefix": "/usr", "prefix": "/usr", "real_executable": str(exe), "executable": str(exe), "version": "3.12.3",
            "torch": None, "stdlib": [], "include": [], "sys_path": []}
    twin = root / str(exe).lstrip("/")
    twin.parent.mkdir(parents=True)
    twin.write_text("")  # the mount point nspawn created
    flags, _, _ = host.image_binds(root, info)
    assert flags == [f"--bind-ro={exe}"]
    twin.write_text("a real file of the tree's own\n")
    with pytest.raises(SystemExit, match="is also a path the container uses"):
        host.image_binds(root, info)


def test_the_pair_inventory_takes_the_probed_ucx_tls_or_tcp(tmp_path, monkeypatch):
    import json
    import runpy

    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path))
    monkeypatch.delenv("PDKIT_NSPAWN_UCX_TLS", raising=False)
    inv = str(REPO / "inventories" / "h200-nspawn-pair.py")

    def tls() -> set[str]:
        nodes = runpy.run_path(inv)["gpu_nodes"]
        return {e["env"]["UCX_TLS"] for _, d in nodes for e in d["pdkit_node"]["engines"]}

    assert tls() == {"tcp,cuda_copy,self"}
    (tmp_path / "ucx_tls.json").write_text(json.dumps({"chosen": "cuda_ipc,cuda_copy,tcp,self"}))
    assert tls() == {"cuda_ipc,cuda_copy,tcp,self"}
    (tmp_path / "ucx_tls.json").write_text(json.dumps({"chosen": None}))  # the probe found none
    assert tls() == {"tcp,cuda_copy,self"}
    nodes = dict(runpy.run_path(inv)["gpu_nodes"])
    assert "pdkit_router" in nodes["pdkit-a"] and "pdkit_router" not in nodes["pdkit-b"]
    assert nodes["pdkit-b"]["ssh_known_hosts_file"] == str(Path(tmp_path) / "pdkit-b" / "known_hosts")
