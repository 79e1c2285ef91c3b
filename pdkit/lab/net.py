"""Lab networking: one bridge on the control machine, one network namespace + veth per host."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pdkit.lab.model import LabConfig, LabError, LabHost
from pdkit.lab.system import run

GUEST_IFACE = "host0"
NETNS_DIR = Path("/run/netns")


def bridge_marker(cfg: LabConfig) -> str:
    return f"pdkit-lab {cfg.state_dir}"


def link_names() -> list[str]:
    out = run(["ip", "-j", "link", "show"], timeout=20).stdout
    return [link["ifname"] for link in json.loads(out or "[]")]


def link_alias(name: str) -> str | None:
    proc = run(["ip", "-j", "link", "show", "dev", name], timeout=20, check=False)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout or "[]")
    return data[0].get("ifalias", "") if data else None


def netns_names() -> list[str]:
    out = run(["ip", "netns", "list"], timeout=20).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ensure_bridge(cfg: LabConfig) -> None:
    alias = link_alias(cfg.bridge)
    if alias is not None:
        if alias != bridge_marker(cfg):
            raise LabError(
                f"interface {cfg.bridge} exists and is not this lab's ({alias or 'no alias'}): "
                f"another lab on {cfg.subnet}? choose another PDKIT_LAB_SUBNET or run its `lab down`"
            )
        return
    run(["ip", "link", "add", cfg.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"], timeout=20)
    run(["ip", "link", "set", "dev", cfg.bridge, "alias", bridge_marker(cfg)], timeout=20)
    run(["ip", "addr", "add", f"{cfg.bridge_address}/{cfg.subnet.prefixlen}", "dev", cfg.bridge], timeout=20)
    run(["ip", "link", "set", "dev", cfg.bridge, "up"], timeout=20)


def add_host(cfg: LabConfig, host: LabHost) -> None:
    """Namespace + veth for ``host``: ``<veth>`` on the bridge, ``host0`` with the address inside."""
    ns, veth = cfg.netns(host.name), cfg.veth(host.name)
    remove_host(cfg, host.name)
    run(["ip", "netns", "add", ns], timeout=20)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", GUEST_IFACE, "netns", ns], timeout=20)
    run(["ip", "link", "set", "dev", veth, "master", cfg.bridge], timeout=20)
    run(["ip", "link", "set", "dev", veth, "up"], timeout=20)
    run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"], timeout=20)
    run(["ip", "-n", ns, "addr", "add", f"{host.address}/{cfg.subnet.prefixlen}", "dev", GUEST_IFACE], timeout=20)
    run(["ip", "-n", ns, "link", "set", "dev", GUEST_IFACE, "up"], timeout=20)


def remove_host(cfg: LabConfig, host_name: str) -> None:
    ns, veth = cfg.netns(host_name), cfg.veth(host_name)
    if ns in netns_names():
        run(["ip", "netns", "delete", ns], timeout=20)  # takes host0, and with it the veth pair
    if veth in link_names():
        run(["ip", "link", "delete", "dev", veth], timeout=20, check=False)


def remove_all(cfg: LabConfig) -> None:
    """Delete every namespace and link carrying this lab's tag, the bridge last."""
    prefix = cfg.tag + "-"
    for ns in netns_names():
        if ns.startswith(prefix):
            run(["ip", "netns", "delete", ns], timeout=20, check=False)
    links = [n for n in link_names() if n.startswith(prefix)]
    for name in sorted(links, key=lambda n: n == cfg.bridge):
        run(["ip", "link", "delete", "dev", name], timeout=20, check=False)


def netns_inode(ns: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / ns).st_ino
    except OSError:
        return None


def pids_in_netns(ns: str) -> list[int]:
    ino = netns_inode(ns)
    if ino is None:
        return []
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if os.stat(f"/proc/{p}/ns/net").st_ino == ino:
                out.append(int(p))
        except OSError:
            pass
    return out


def leader_pid(ns: str) -> int | None:
    """The container's PID 1 (as seen from the control machine), found through its netns."""
    for pid in pids_in_netns(ns):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                if len(ids) >= 2 and ids[-1] == "1":
                    return pid
    return None


def leftovers(cfg: LabConfig) -> list[str]:
    prefix = cfg.tag + "-"
    found = [f"netns {n}" for n in netns_names() if n.startswith(prefix)]
    found += [f"link {n}" for n in link_names() if n.startswith(prefix)]
    return found
