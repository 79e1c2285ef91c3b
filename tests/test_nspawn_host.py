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


# --------------------------------------------------------------------------- where a machine's state lives
# On 2026-12-02 a fresh clone's first one-host deploy failed ("No host key for [127.0.0.1]:2222 found
# in known_hosts"): host.py wrote <dir>/pdkit-h200/{host.json,known_hosts}, inventories/h200-nspawn.py
# read <dir>/host.json and fell back to <dir>/known_hosts. With PDKIT_NSPAWN_DIR pointed at
# <dir>/pdkit-h200 to work around it, host.py looked for the running machine in
# <dir>/pdkit-h200/pdkit-h200/, did not find it, and `unpack` replaced the running machine's tree.

ONE_HOST = ("inventories/h200-nspawn.py", "inventories/nspawn-rehearsal.py")


def _inventory_hosts(relative: str) -> dict:
    import runpy

    return dict(runpy.run_path(str(REPO / relative))["gpu_nodes"])


def _up_record(host, machine: str, address: str, port: int) -> None:
    """What `host.py --machine MACHINE up` writes last: host.json, through host.py's own code."""
    host.CURRENT["machine"] = machine
    try:
        host.write_host_record({"machine": machine, "ssh_address": address, "ssh_port": port, "address": None, "gpu": False}, None)
    finally:
        host.CURRENT["machine"] = host.MACHINE


@pytest.mark.parametrize("inventory", ONE_HOST)
def test_the_one_host_inventory_reads_the_state_host_py_writes(host, tmp_path, monkeypatch, inventory):
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path))
    # before `up`: the fallbacks are the very paths `up` will write
    data = _inventory_hosts(inventory)["pdkit-h200"]
    assert data["ssh_known_hosts_file"] == str(host.machine_state("pdkit-h200") / "known_hosts") == str(tmp_path / "pdkit-h200" / "known_hosts")
    assert data["ssh_key"] == str(host.client_key()) == str(tmp_path / "id_ed25519")
    assert (data["ssh_hostname"], data["ssh_port"]) == (host.SSH_ADDRESS, host.SSH_PORT)
    # after `up` (another port, so the answer can only have come from host.json)
    _up_record(host, "pdkit-h200", "127.0.0.1", 2299)
    assert (tmp_path / "pdkit-h200" / "host.json").is_file() and not (tmp_path / "host.json").exists()
    data = _inventory_hosts(inventory)["pdkit-h200"]
    assert data["ssh_port"] == 2299
    assert data["ssh_known_hosts_file"] == str(tmp_path / "pdkit-h200" / "known_hosts")
    assert data["ssh_strict_host_key_checking"] == "yes"


def test_the_pair_inventory_reads_each_machines_own_state(host, tmp_path, monkeypatch):
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path))
    monkeypatch.delenv("PDKIT_NSPAWN_UCX_TLS", raising=False)
    _up_record(host, "pdkit-a", "10.214.0.2", 22)
    _up_record(host, "pdkit-b", "10.214.0.3", 2201)
    for inventory in ("inventories/h200-nspawn-pair.py", "inventories/nspawn-pair-rehearsal.py"):
        nodes = _inventory_hosts(inventory)
        assert {n: (d["ssh_hostname"], d["ssh_port"]) for n, d in nodes.items()} == {"pdkit-a": ("10.214.0.2", 22), "pdkit-b": ("10.214.0.3", 2201)}
        for name, data in nodes.items():
            assert data["ssh_known_hosts_file"] == str(host.machine_state(name) / "known_hosts")
            assert data["ssh_key"] == str(tmp_path / "id_ed25519")


def test_a_state_dir_that_is_one_machines_own_is_refused_by_host_py_and_the_inventories(host, tmp_path, monkeypatch):
    """The 2026-12-02 workaround (PDKIT_NSPAWN_DIR=<dir>/pdkit-h200) fails loudly, on both sides."""
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path))
    _up_record(host, "pdkit-h200", "127.0.0.1", 2222)
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path / "pdkit-h200"))
    with pytest.raises(SystemExit, match="is a machine's own state directory .* set PDKIT_NSPAWN_DIR to the directory above it"):
        host.machine_state("pdkit-h200")
    for inventory in ONE_HOST:
        with pytest.raises(ValueError, match="is a machine's own state directory"):
            _inventory_hosts(inventory)


def test_a_machine_booted_under_another_state_dir_is_still_running(host, tmp_path, monkeypatch):
    """`unpack`, `up` and `down --purge` look for a systemd-nspawn booting the tree itself, not only
    at runtime.json: a state directory other than `up`'s must not make a running machine look stopped."""
    import argparse

    machines = tmp_path / "machines"
    root = machines / "pdkit-h200"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/systemd-nspawn").write_text("")
    (root / "etc/keep").parent.mkdir(parents=True)
    (root / "etc/keep").write_text("the running machine's file\n")
    proc = tmp_path / "proc"
    argv = [f"{root}/lib64/ld-linux-x86-64.so.2", "--library-path", f"{root}/usr/lib", f"{root}/usr/bin/systemd-nspawn",
            "--quiet", "--boot", f"--directory={root}", "--machine=pdkit-h200"]
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "4243").mkdir()  # another machine's nspawn, and a process that only mentions the path
    (proc / "4243" / "cmdline").write_bytes(b"systemd-nspawn\0--boot\0--directory=" + str(machines / "pdkit-a").encode() + b"\0")
    (proc / "4244").mkdir()
    (proc / "4244" / "cmdline").write_bytes(b"ls\0--directory=" + str(root).encode() + b"\0")
    (proc / "self").mkdir()
    assert host.nspawn_pids(root, proc) == [4242]
    assert host.nspawn_pids(machines / "pdkit-b", proc) == []

    real = host.nspawn_pids
    monkeypatch.setattr(host, "MACHINES", machines)
    monkeypatch.setattr(host, "nspawn_pids", lambda r, p=proc: real(r, p))
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path / "another-state-dir"))  # no runtime.json there
    assert host.running("pdkit-h200")
    with pytest.raises(SystemExit, match=r"pdkit-h200 is running \(systemd-nspawn pid 4242 .*started with another PDKIT_NSPAWN_DIR"):
        host.cmd_unpack(argparse.Namespace(machine="pdkit-h200", artefacts=[str(tmp_path)]))
    assert (root / "etc/keep").read_text() == "the running machine's file\n"
    with pytest.raises(SystemExit, match="before booting it again"):
        host.cmd_up(argparse.Namespace(machine="pdkit-h200"))
    assert not host.running("pdkit-b")


def test_the_unpacked_engine_site_gets_bytecode_for_the_engines_interpreter(host, tmp_path):
    """Issue 45 item 6: the carried payload has no .pyc and the engine user cannot write the site,
    so without this every engine start compiled every module it imported."""
    import importlib.util
    import sys

    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    (site / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    (site / "pkg" / "broken.py").write_text("print 'python 2'\n")  # a vendored py2 file: counted, not fatal
    note = host.compile_site(site, sys.executable)
    for name in ("__init__", "mod"):
        assert Path(importlib.util.cache_from_source(str(site / "pkg" / f"{name}.py"))).is_file()
    assert "bytecode: 2 .pyc" in note and "1 file(s) did not compile" in note
