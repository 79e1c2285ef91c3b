"""PCIe topology and GPU health facts, parsed from pdkit/agent/topology_probe.py's JSON, and the rules the
preflight runs on them (issue 47). Pure functions: tests/test_topology.py feeds them the box shapes
under tests/fixtures/topology/ (the probe's JSON, recorded or constructed: see their README).

Per GPU: its PCIe path (root complex = the sysfs root bus pci<domain>:<bus>, root port, switches,
NUMA node), ACS control on the bridges of that path, the IOMMU's mode, nvidia_uvm's HMM switch, and
health (Xid lines in the kernel log, GPU recovery action, pending page retirement / row remap,
a busy GPU with no process). The rules:
- posted-write collapse (warning): GPUs behind one PCIe switch writing concurrently to GPUs behind
  two or more CPU root complexes fall from ~52 to 6-13 GB/s per pair on AMD I/O dies; reads and
  single-destination-root patterns keep full rate (voipmonitor/rtx6kpro hardware/collapse-report.md);
- ACS redirect on the P2P path (error): peer requests go up to the root complex and, through a
  translating IOMMU, fault or hang (NVIDIA's NCCL troubleshooting guide, "PCI Access Control
  Services"; nccl#1999);
- HMM on with NCCL P2P (error): NCCL P2P lock-ups cleared by `options nvidia_uvm uvm_disable_hmm=1`
  (voipmonitor/rtx6kpro troubleshooting/common-issues.md, "NCCL P2P Lockups");
- wedged GPU (`wedged_gpus`): what needs a reset before an engine may start on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the probe, read as text and run on the node with its python3 (roles/node_facts.py PcieTopology)
PROBE_PATH = Path(__file__).with_name("topology_probe.py")
PROBE_MARK = "pdkit-topology: "


def probe_source() -> str:
    return PROBE_PATH.read_text()


# ---------------------------------------------------------------------------------------------- parsing

# ACSCtl bits that send peer-to-peer requests/completions up to the root complex (PCIe base spec 6.12)
ACS_REDIRECT = ("ReqRedir", "CmpltRedir")
_ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
# PCI Express capability's device/port type (PCIe base spec 7.5.3.2) as lspci names it
_PORT_TYPES = {
    0: "Endpoint",
    1: "Legacy Endpoint",
    4: "Root Port",
    5: "Upstream Port",
    6: "Downstream Port",
    7: "PCI-Express to PCI/PCI-X Bridge",
    8: "PCI/PCI-X to PCI-Express Bridge",
    9: "Root Complex Integrated Endpoint",
    10: "Root Complex Event Collector",
}
_LSPCI_PORT = re.compile(r"Express \(v\d\) (Root Port|Upstream Port|Downstream Port|Endpoint|Legacy Endpoint)")


def parse_lspci_bridge(text: str | None) -> dict[str, Any]:
    """`lspci -vvv -s BDF` -> {"port_type", "acs_ctl": {bit: bool} | None, "acs_hidden": bool}."""
    if not text:
        return {"port_type": None, "acs_ctl": None, "acs_hidden": False}
    port = _LSPCI_PORT.search(text)
    acs = None
    match = re.search(r"ACSCtl:\s*(.*)", text)
    if match:
        acs = {
            m.group(1): m.group(2) == "+"
            for m in re.finditer(r"(\w+)([+-])", match.group(1))
            if m.group(1) in _ACS_BITS
        }
    return {
        "port_type": port.group(1) if port else None,
        "acs_ctl": acs,
        "acs_hidden": "Capabilities: <access denied>" in text,
    }


def parse_config_bridge(hexdump: str | None) -> dict[str, Any]:
    """A bridge's config space (hex, as the probe reads /sys/bus/pci/devices/BDF/config) -> the same
    shape as parse_lspci_bridge: the PCI Express capability's port type and the ACS capability's
    control register, walked from the capability lists (PCIe base spec 7.5.3, 7.7.8)."""
    data = bytes.fromhex(hexdump or "")
    out: dict[str, str | dict[str, bool] | bool | None] = {"port_type": None, "acs_ctl": None,
                                                          "acs_hidden": len(data) <= 256}

    def word(off: int) -> int:
        return int.from_bytes(data[off : off + 2], "little") if off + 2 <= len(data) else 0

    if len(data) >= 64 and data[6] & 0x10:  # status: capabilities list
        ptr, seen = data[0x34] & 0xFC, set()
        while ptr and ptr not in seen and ptr + 4 <= len(data):
            seen.add(ptr)
            if data[ptr] == 0x10:  # PCI Express
                out["port_type"] = _PORT_TYPES.get((word(ptr + 2) >> 4) & 0xF)
            ptr = data[ptr + 1] & 0xFC
    off, seen = 0x100, set()
    while len(data) >= off + 8 and off not in seen:
        seen.add(off)
        header = int.from_bytes(data[off : off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == 0x000D:  # Access Control Services
            ctl = word(off + 6)
            out["acs_ctl"] = {bit: bool(ctl >> i & 1) for i, bit in enumerate(_ACS_BITS)}
            break
        off = header >> 20
        if off < 0x100:
            break
    return out


# the header of one GPU's part of `nvidia-smi -q`: "GPU 00000000:06:00.0"
_SMI_GPU = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]{2}:")


def smi_q_sections(text: str | None) -> dict[str, list[tuple[str, str, str]]]:
    """`nvidia-smi -q` -> {bus id as sysfs writes it ('0000:06:00.0'): [(section, key, value), ...]}: each line
    under the GPU's header, in order. SECTION is the innermost heading above the line by indent ("" at the
    GPU's top level); a heading itself (a key with no value, `Utilization`, `Processes`) comes with value ""."""
    gpus: dict[str, list[tuple[str, str, str]]] = {}
    lines: list[tuple[str, str, str]] | None = None
    stack: list[tuple[int, str]] = []
    for raw in (text or "").splitlines():
        if _SMI_GPU.match(raw):
            lines = gpus[bus_id(raw[4:])] = []
            stack = []
            continue
        if lines is None or not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        lines.append((stack[-1][1] if stack else "", key, value))
        if not value:
            stack.append((indent, key))
    return gpus


def parse_smi_q(text: str | None) -> dict[str, dict[str, Any]]:
    """`nvidia-smi -q` -> {bus id as sysfs writes it ('0000:06:00.0'): {"addressing_mode", "recovery_action",
    "utilization_gpu", "processes" (count, 0 for None), "retired_pending", "remap_pending", "remap_failure"}}.
    Keys it does not print (older drivers) stay None."""
    gpus: dict[str, dict[str, Any]] = {}
    for bdf, lines in smi_q_sections(text).items():
        current: dict[str, Any] = {
            "addressing_mode": None,
            "recovery_action": None,
            "utilization_gpu": None,
            "processes": None,
            "retired_pending": None,
            "remap_pending": None,
            "remap_failure": None,
        }
        gpus[bdf] = current
        for section, key, value in lines:
            if section == "" and key == "Processes":
                current["processes"] = 0  # 'None', or the entries below (a heading), each with a Process ID
            elif not value:
                continue  # another heading
            elif section == "" and key == "Addressing Mode":
                current["addressing_mode"] = value
            elif section == "" and key == "GPU Recovery Action":
                current["recovery_action"] = value
            elif section == "Utilization" and key == "GPU":
                current["utilization_gpu"] = _percent(value)
            elif section == "Processes" and key == "Process ID":
                current["processes"] += 1
            elif section == "Retired Pages" and key == "Pending Page Blacklist":
                current["retired_pending"] = _yes(value)
            elif section == "Retired Pages" and key == "Pending":
                current["retired_pending"] = _yes(value)
            elif section == "Remapped Rows" and key == "Pending":
                current["remap_pending"] = _yes(value)
            elif section == "Remapped Rows" and key == "Remapping Failure Occurred":
                current["remap_failure"] = _yes(value)
    return gpus


def _percent(value: str) -> int | None:
    match = re.match(r"(\d+)\s*%", value)
    return int(match.group(1)) if match else None


def _yes(value: str) -> bool | None:
    return True if value == "Yes" else False if value == "No" else None


def bus_id(text: str) -> str:
    """nvidia-smi's or the kernel log's bus id -> sysfs' '0000:06:00.0' ('00000000:06:00.0', 'PCI:0000:06:00')."""
    text = text.strip().lower().removeprefix("pci:")
    domain, _, rest = text.partition(":")
    if "." not in rest:
        rest += ".0"
    return f"{domain[-4:]:0>4}:{rest}"


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): (\d+), (.*)")
_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")


def parse_xid_lines(lines: list[str]) -> list[dict[str, Any]]:
    """Kernel-log lines -> [{"bdf", "xid", "text", "t" (seconds since boot, dmesg's stamp, or None)}]."""
    found = []
    for line in lines:
        match = _XID.search(line)
        if not match:
            continue
        stamp = _STAMP.search(line)
        found.append(
            {
                "bdf": bus_id(match.group(1)),
                "xid": int(match.group(2)),
                "text": match.group(3).strip(),
                "t": float(stamp.group(1)) if stamp else None,
            }
        )
    return found


@dataclass(frozen=True)
class Bridge:
    bdf: str
    port_type: str | None  # Root Port, Upstream Port, Downstream Port, ... (None: unknown)
    acs_redirect: tuple[str, ...]  # the ACS redirect bits set (ReqRedir, CmpltRedir)
    acs_known: bool  # ACSCtl was read (or the bridge has no ACS capability, which lspci shows)


@dataclass(frozen=True)
class GpuPlace:
    """Where one GPU sits on the PCIe tree."""

    index: int
    bdf: str
    root_complex: str  # the sysfs root bus, e.g. 'pci0000:80' (one per host bridge / IOHUB)
    numa_node: int | None
    bridges: tuple[Bridge, ...]  # root port first, the GPU's own downstream port last
    iommu_group: str | None = None
    # the switch as the user declared it (pdkit_node.gpus.pcie, `declared_topology`): no bridges to read it from
    declared_switch: str | None = None

    @property
    def root_port(self) -> str | None:
        return self.bridges[0].bdf if self.bridges else None

    @property
    def switch(self) -> str | None:
        """The PCIe switch right above the GPU, named by its upstream port (None: on a root port)."""
        if self.declared_switch is not None:
            return self.declared_switch
        ups = [b for b in self.bridges[1:] if b.port_type in ("Upstream Port", None)]
        if any(b.port_type for b in self.bridges[1:]):
            return ups[-1].bdf if ups else None
        # no port types read: a switch is an upstream/downstream pair below the root port
        return self.bridges[-2].bdf if len(self.bridges) >= 3 else None

    def describe(self) -> str:
        where = f"switch {self.switch}" if self.switch else f"root port {self.root_port or '-'}"
        numa = "?" if self.numa_node is None else self.numa_node
        return f"GPU {self.index} ({self.bdf}: {where}, root complex {self.root_complex}, NUMA {numa})"


@dataclass(frozen=True)
class Topology:
    """The parsed probe: GPU places, IOMMU, HMM and health, and what the probe could not read."""

    gpus: dict[int, GpuPlace]
    iommu: dict[str, Any]  # {"enabled": bool | None, "passthrough": bool | None, "why": str}
    hmm: dict[str, Any]  # {"state": "on" | "off" | "unknown", "why": str}
    health: dict[int, dict[str, Any]]  # index -> parse_smi_q's entry + "xids": [...]
    unread: tuple[str, ...] = ()
    error: str | None = None
    xids_unattached: tuple[dict[str, Any], ...] = field(default=())


def _index_map(probe: dict[str, Any], smi_gpus: list[dict[str, Any]] | None) -> dict[str, int]:
    """bdf -> GPU index: nvidia-smi's (facts["gpus"]["gpus"]) when the driver is up, else PCI order."""
    if smi_gpus:
        return {bus_id(g["pci_bus_id"]): int(g["index"]) for g in smi_gpus}
    return {g["bdf"]: i for i, g in enumerate(sorted(probe.get("gpus") or [], key=lambda g: g["bdf"]))}


def parse_probe(probe: dict[str, Any] | None, smi_gpus: list[dict[str, Any]] | None = None) -> Topology:
    """The probe's JSON (roles/node_facts.py PcieTopology's value, or a fixture) -> Topology."""
    if not probe or probe.get("error"):
        return Topology(
            {},
            {"enabled": None, "passthrough": None, "why": "not probed"},
            {"state": "unknown", "why": "not probed"},
            {},
            (),
            (probe or {}).get("error") or "the topology probe did not run",
        )
    index = _index_map(probe, smi_gpus)
    bridges_raw = probe.get("bridges") or {}
    parsed_bridges: dict[str, Bridge] = {}
    for bdf, entry in bridges_raw.items():
        info = parse_lspci_bridge(entry.get("lspci"))
        if info["port_type"] is None and info["acs_ctl"] is None and entry.get("config"):
            info = parse_config_bridge(entry["config"])
        elif info["acs_hidden"] and entry.get("config"):
            info = {**parse_config_bridge(entry["config"]), "port_type": info["port_type"]}
        acs = info["acs_ctl"] or {}
        known = info["acs_ctl"] is not None or (bool(entry.get("lspci")) and not info["acs_hidden"])
        parsed_bridges[bdf] = Bridge(bdf, info["port_type"], tuple(b for b in ACS_REDIRECT if acs.get(b)), known)
    gpus: dict[int, GpuPlace] = {}
    for g in probe.get("gpus") or []:
        parts = g["sysfs_path"].strip("/").split("/")  # sys devices pci0000:00 <bridges...> <gpu>
        root = next((p for p in parts if p.startswith("pci")), "?")
        chain = parts[parts.index(root) + 1 : -1] if root in parts else []
        numa = g.get("numa_node")
        numa = int(numa) if numa not in (None, "") and int(numa) >= 0 else None
        i = index.get(g["bdf"], len(index) + len(gpus))
        gpus[i] = GpuPlace(
            i,
            g["bdf"],
            root,
            numa,
            tuple(parsed_bridges.get(b, Bridge(b, None, (), False)) for b in chain),
            g.get("iommu_group"),
        )
    smi = parse_smi_q(probe.get("nvidia_smi_q"))
    xids = parse_xid_lines(probe.get("xid_lines") or [])
    by_bdf = {p.bdf: i for i, p in gpus.items()}
    health = {i: {**(smi.get(p.bdf) or {}), "xids": [x for x in xids if x["bdf"] == p.bdf]} for i, p in gpus.items()}
    loose = tuple(x for x in xids if x["bdf"] not in by_bdf)
    unread = tuple(f"{u['what']}: {u['why']}" for u in probe.get("unread") or [])
    return Topology(gpus, iommu_state(probe, gpus), hmm_state(probe, smi), health, unread, None, loose)


def iommu_state(probe: dict[str, Any], gpus: dict[int, GpuPlace]) -> dict[str, Any]:
    """Is the IOMMU on for the GPUs, and in passthrough (identity) or translating (DMA, DMA-FQ)?"""
    info = probe.get("iommu") or {}
    cmdline = info.get("cmdline") or ""
    devices = info.get("devices")
    types = {t for t in (info.get("group_types") or {}).values() if t}
    args = " ".join(a for a in cmdline.split() if "iommu" in a)
    if devices == [] and not any(p.iommu_group for p in gpus.values()):
        return {
            "enabled": False,
            "passthrough": None,
            "why": f"no IOMMU in /sys/class/iommu ({args or 'no iommu kernel argument'})",
        }
    passthrough: bool | None  # None: not known
    if types:
        passthrough = types == {"identity"}
        return {
            "enabled": True,
            "passthrough": passthrough,
            "why": f"GPU IOMMU group type {', '.join(sorted(types))} ({args or 'no iommu kernel argument'})",
        }
    if devices is None:
        return {"enabled": None, "passthrough": None, "why": "/sys/class/iommu unreadable"}
    passthrough = True if "iommu=pt" in cmdline.split() else None
    return {
        "enabled": bool(devices),
        "passthrough": passthrough,
        "why": f"{', '.join(devices) or 'no IOMMU'} ({args or 'no iommu kernel argument'})",
    }


_TRUE = ("1", "y", "yes", "true", "on")


def hmm_state(probe: dict[str, Any], smi: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """nvidia_uvm's HMM: 'off' when uvm_disable_hmm is set (loaded module, else the modprobe option) or
    nvidia-smi's Addressing Mode says it is not HMM; 'on' when nvidia-smi says HMM or the loaded module
    has uvm_disable_hmm=N; 'unknown' when neither could be read."""
    uvm = probe.get("uvm") or {}
    modes = {mode for g in smi.values() if (mode := g.get("addressing_mode")) is not None and mode != "N/A"}
    param = (uvm.get("uvm_disable_hmm") or "").strip()
    option = None
    for line in uvm.get("modprobe") or []:
        match = re.search(r"uvm_disable_hmm=(\S+)", line.split(":", 1)[-1])
        if match and not line.split(":", 1)[-1].strip().startswith("#"):
            option = (match.group(1), line.split(":", 1)[0])
    if "HMM" in modes:
        return {"state": "on", "why": "nvidia-smi -q: Addressing Mode HMM"}
    if param:
        if param.lower() in _TRUE:
            return {"state": "off", "why": f"/sys/module/nvidia_uvm/parameters/uvm_disable_hmm = {param}"}
        if modes:
            return {
                "state": "off",
                "why": f"uvm_disable_hmm = {param}, but nvidia-smi -q reports Addressing Mode "
                f"{', '.join(sorted(modes))} (HMM unsupported by this kernel)",
            }
        return {
            "state": "on",
            "why": f"/sys/module/nvidia_uvm/parameters/uvm_disable_hmm = {param} "
            "(HMM enabled when the kernel supports it)",
        }
    if option:
        state = "off" if option[0].lower() in _TRUE else "on"
        return {"state": state, "why": f"nvidia_uvm not loaded; {option[1]} sets uvm_disable_hmm={option[0]}"}
    if modes:
        return {"state": "off", "why": f"nvidia-smi -q: Addressing Mode {', '.join(sorted(modes))}"}
    if uvm.get("loaded") is False:
        return {
            "state": "unknown",
            "why": "nvidia_uvm is not loaded and no modprobe option sets uvm_disable_hmm "
            "(the driver's default is HMM on where the kernel supports it)",
        }
    return {"state": "unknown", "why": "uvm_disable_hmm unreadable"}


# ---------------------------------------------------------------------------------------------- declared


def declared_topology(slots: list[tuple[str, str | None]], numa: list[int] | tuple[int, ...] | None = None) -> Topology:
    """The layout the user declares (pdkit_node.gpus.pcie: per GPU index, its root complex and switch labels) as
    a Topology the same rules read: validate's facts, where the preflight has the probe's. Root complexes
    read 'root <label>' in messages; the declaration says nothing of ACS, the IOMMU, HMM or health."""
    gpus = {
        i: GpuPlace(i, f"GPU {i}", f"root {root}", numa[i] if numa and i < len(numa) else None, (),
                    declared_switch=switch)
        for i, (root, switch) in enumerate(slots)
    }
    unknown = {"enabled": None, "passthrough": None, "why": "not declared"}
    return Topology(gpus, unknown, {"state": "unknown", "why": "not declared"}, {},
                    ("ACS, IOMMU, HMM and GPU health: not declared (the preflight reads them)",))


def _gpu_list(gpus: Iterable[int]) -> str:
    ordered = sorted(gpus)
    return f"GPU{'s' if len(ordered) > 1 else ''} {', '.join(map(str, ordered))}"


def _shared(topo: Topology, gpus: list[int], kind: str) -> dict[str, list[int]]:
    """{label: GPUs} of the root complexes (KIND 'root') or switches ('switch') GPUS sit behind; a GPU on a
    root port shares no switch."""
    found: dict[str, list[int]] = {}
    for i in gpus:
        label = topo.gpus[i].root_complex if kind == "root" else topo.gpus[i].switch
        if label is not None:
            found.setdefault(label, []).append(i)
    return found


def _where(kind: str, found: dict[str, list[int]]) -> str:
    named = "switch " if kind == "switch" else ""
    return " and ".join(f"{named}{label} ({_gpu_list(g)})" for label, g in found.items())


def layout_disagreements(declared: Topology, probed: Topology) -> list[str]:
    """Where the declared layout (declared_topology) and the probe's (parse_probe) place the GPUs differently,
    one phrase each. Labels are the user's own: what is compared is which GPUs share a root complex or a
    switch, and which GPUs sit on a switch at all."""
    out = []
    only_declared = sorted(set(declared.gpus) - set(probed.gpus))
    only_probed = sorted(set(probed.gpus) - set(declared.gpus))
    if only_declared:
        out.append(f"{_gpu_list(only_declared)} declared but not on the PCI bus")
    if only_probed:
        out.append(f"{_gpu_list(only_probed)} on the PCI bus but not declared")
    common = sorted(set(declared.gpus) & set(probed.gpus))
    for i in common:
        mine, seen = declared.gpus[i].switch, probed.gpus[i].switch
        if (mine is None) != (seen is None):
            out.append(f"GPU {i} is declared {'on a root port' if mine is None else f'behind switch {mine}'} but sits "
                       f"{'on a root port' if seen is None else f'behind switch {seen}'}")
    for kind, what in (("root", "root complex"), ("switch", "switch")):
        for label, gpus in _shared(declared, common, kind).items():
            there = _shared(probed, gpus, kind)
            if len(gpus) > 1 and len(there) > 1:
                out.append(f"{_gpu_list(gpus)} are declared behind one {what} ({label}) but sit behind "
                           f"{_where(kind, there)}")
        for label, gpus in _shared(probed, common, kind).items():
            here = _shared(declared, gpus, kind)
            if len(gpus) > 1 and len(here) > 1:
                out.append(f"{_gpu_list(gpus)} sit behind one {what} ({label}) but are declared behind "
                           f"{_where(kind, here)}")
    return out


# ---------------------------------------------------------------------------------------------- rules


def collapse_flows(
    topo: Topology, flows: list[tuple[int, int]]
) -> list[tuple[str, str, tuple[int, ...], dict[str, tuple[int, ...]]]]:
    """Posted-write collapse: for every PCIe switch whose GPUs write (FLOWS: (source, destination)
    GPU indices, concurrently) to GPUs outside that switch behind two or more root complexes, return
    (switch, its root complex, the writing GPUs, {destination root complex: destination GPUs})."""
    by_switch: dict[str, list[tuple[int, int]]] = {}
    for src, dst in flows:
        a, b = topo.gpus.get(src), topo.gpus.get(dst)
        if a is None or b is None or a.switch is None or b.switch == a.switch:
            continue
        by_switch.setdefault(a.switch, []).append((src, dst))
    found = []
    for switch, pairs in sorted(by_switch.items()):
        roots: dict[str, set[int]] = {}
        for _, dst in pairs:
            roots.setdefault(topo.gpus[dst].root_complex, set()).add(dst)
        if len(roots) >= 2:
            root = topo.gpus[pairs[0][0]].root_complex
            found.append(
                (
                    switch,
                    root,
                    tuple(sorted({s for s, _ in pairs})),
                    {r: tuple(sorted(d)) for r, d in sorted(roots.items())},
                )
            )
    return found


def pd_flows(prefill_gpus: tuple[int, ...], decode_gpus: tuple[int, ...], same_shape: bool) -> list[tuple[int, int]]:
    """The KV writes of one prefill engine into one decode engine on the same node, GPU to GPU: rank i
    writes to the decode rank(s) holding its heads (SGLang's PD transfer maps TP ranks by head slice);
    without a rank-for-rank shape (dp or pp > 1), every prefill GPU to every decode GPU."""
    p, d = len(prefill_gpus), len(decode_gpus)
    if not same_shape:
        return [(a, b) for a in prefill_gpus for b in decode_gpus]
    if p >= d:
        return [(a, decode_gpus[i * d // p]) for i, a in enumerate(prefill_gpus)]
    k = d // p
    return [(a, decode_gpus[i * k + j]) for i, a in enumerate(prefill_gpus) for j in range(k)]


def tp_flows(gpus: tuple[int, ...]) -> list[tuple[int, int]]:
    """A TP group's collectives, every GPU writing to every other (NCCL's tree, all-gather, all-to-all)."""
    return [(a, b) for a in gpus for b in gpus if a != b]


# the measured collapse, for the message (voipmonitor/rtx6kpro hardware/collapse-report.md)
COLLAPSE = "posted writes fall from ~52 to 6-13 GB/s per pair when one switch writes to two or more root complexes"


@dataclass(frozen=True)
class Placed:
    """One engine's GPUs on a node as the placement rules see them (pdkit.spec.placed_engines builds them)."""

    index: int  # its place in pdkit_node.engines, for the advice
    name: str
    gpus: tuple[int, ...]
    rank_shape: bool  # dp and pp 1: TP rank i holds the i-th head slice (pd_flows)


def _spread(dests: dict[str, tuple[int, ...]]) -> str:
    return "; ".join(f"{r}: GPUs {', '.join(map(str, g))}" for r, g in dests.items())


def pd_collapse(topo: Topology, prefill: Placed, decode: Placed) -> list[str]:
    """The collapse pattern in PREFILL's KV writes into DECODE (one sentence per switch, with what to change).
    The one rule for both sources of facts: the preflight's probe and validate's declared layout (TOPO)."""
    flows = pd_flows(prefill.gpus, decode.gpus, prefill.rank_shape and decode.rank_shape)
    return [f"prefill {prefill.name!r} GPUs {', '.join(map(str, writers))} behind switch {switch} ({root}) write KV "
            f"into decode {decode.name!r} GPUs behind {len(dests)} root complexes ({_spread(dests)}): {COLLAPSE}. "
            f"Give decode {decode.name!r} GPUs behind one root complex for each prefill switch (a rank-for-rank pair, "
            "or one pd_group per prefill/decode pair), or move the prefill so each of its switches writes to one root "
            "complex"
            for switch, root, writers, dests in collapse_flows(topo, flows)]


def tp_collapse(topo: Topology, engine: Placed) -> list[str]:
    """The collapse pattern in ENGINE's TP collectives (one sentence per switch, with what to change); as pd_collapse,
    for the probe's facts and the declared layout alike."""
    return [f"engine {engine.name!r}'s TP group: GPUs {', '.join(map(str, writers))} behind switch {switch} ({root}) "
            f"write to peers behind {len(dests)} root complexes ({_spread(dests)}): {COLLAPSE} (NCCL's tree and "
            f"all-to-all do, its ring does not). Regroup pdkit_node.engines[{engine.index}].gpus so each switch's "
            "peers sit behind one root complex, or set pdkit_node.nccl_profile: pcie-p2p-off if the P2P probe measures "
            "less than host-memory copies"
            for switch, root, writers, dests in collapse_flows(topo, tp_flows(engine.gpus))]


def path_between(topo: Topology, a: int, b: int) -> list[Bridge]:
    """The bridges a peer request from GPU A to GPU B crosses: up from A to the bridge both paths
    share (a switch's upstream port, or none: through the root complex), and down to B."""
    pa, pb = topo.gpus[a].bridges, topo.gpus[b].bridges
    common = 0
    if topo.gpus[a].root_complex == topo.gpus[b].root_complex:
        while common < min(len(pa), len(pb)) and pa[common].bdf == pb[common].bdf:
            common += 1
    return list(pa[common:]) + list(pb[common:])


def acs_redirects(topo: Topology, pairs: list[tuple[int, int]]) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """Bridges with ACS redirect on the P2P path of PAIRS: bdf -> (port type, bits, the GPUs whose path crosses it).
    A root port's redirect counts only when the IOMMU translates (its requests then fault); a switch
    port's always (P2P inside the switch goes up to the root complex instead)."""
    translating = topo.iommu.get("enabled") and topo.iommu.get("passthrough") is False
    found: dict[str, tuple[str, str, set[int]]] = {}
    for a, b in pairs:
        if a not in topo.gpus or b not in topo.gpus:
            continue
        for bridge in path_between(topo, a, b):
            if not bridge.acs_redirect:
                continue
            if bridge.port_type == "Root Port" and not translating:
                continue
            entry = found.setdefault(
                bridge.bdf, (bridge.port_type or "bridge", "+ ".join(bridge.acs_redirect) + "+", set())
            )
            entry[2].update((a, b))
    return {bdf: (t, bits, tuple(sorted(g))) for bdf, (t, bits, g) in sorted(found.items())}


# ---------------------------------------------------------------------------------------------- health

# Xids whose recovery is a GPU reset (or a reboot), from NVIDIA's Xid catalog
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and the dynamic page retirement
# guide (docs.nvidia.com/deploy/dynamic-page-retirement): xid -> what it means
RESET_XIDS = {
    48: "double-bit ECC error (DBE): reset the GPU",
    62: "internal micro-controller halt: reset the GPU",
    63: "ECC page retirement / row remapping recorded: takes effect after a GPU reset",
    64: "ECC page retirement / row remapping failed: reset the GPU, replace it if it recurs",
    74: "NVLink error: reset the GPU",
    79: "GPU has fallen off the bus: reset or power-cycle, reseat if it recurs",
    94: "contained ECC error: the row remap it needs takes effect after a GPU reset",
    95: "uncontained ECC error: reset the GPU",
    119: "GSP RPC timeout: reset the GPU",
    120: "GSP error: reset the GPU",
    140: "unrecovered ECC error: reset the GPU",
}
# a GPU busy at this utilisation with no process on it: a hung P2P collective (it stays until a reset)
BUSY_NO_PROCESS_PERCENT = 95


@dataclass(frozen=True)
class WedgedGpu:
    """A GPU an engine must not be (re)started on, and what said so."""

    index: int
    bdf: str
    seen: tuple[str, ...]

    def message(self, host: str) -> str:
        return f"{host}: GPU {self.index} ({self.bdf}) is wedged: {'; '.join(self.seen)}"


def wedged_gpus(topo: Topology, engines_serving: bool = False) -> list[WedgedGpu]:
    """Every GPU whose health facts say it needs a reset before an engine may use it, naming what was
    seen. The driver's own GPU Recovery Action (nvidia-smi -q, R550+) is authoritative where reported:
    'None' there means an Xid in the log since boot was already dealt with (a reset does not clear the
    log); without it, a reset-class Xid since boot counts."""
    found = []
    for i, place in sorted(topo.gpus.items()):
        h = topo.health.get(i) or {}
        seen: list[str] = []
        action = h.get("recovery_action")
        if action and action not in ("None", "N/A"):
            seen.append(f"nvidia-smi reports GPU Recovery Action {action!r}")
        if h.get("retired_pending"):
            seen.append("retired pages pending (Pending Page Blacklist: Yes): reset the GPU to retire them")
        if h.get("remap_pending"):
            seen.append("row remapping pending (Remapped Rows Pending: Yes): reset the GPU to apply it")
        if h.get("remap_failure"):
            seen.append(
                "row remapping failed (Remapping Failure Occurred: Yes): the GPU's memory is failing; replace it"
            )
        if "recovery_action" not in h and any("recovery_action" in o for o in topo.health.values()):
            seen.append("nvidia-smi -q does not list it, though it is on the PCI bus")
        util, procs = h.get("utilization_gpu"), h.get("processes")
        # ENGINES_SERVING (a roll, before its drain): the node's own engines keep the GPUs busy, and
        # nvidia-smi in a container lists no process of another PID namespace: not a sign there
        if util is not None and util >= BUSY_NO_PROCESS_PERCENT and procs == 0 and not engines_serving:
            seen.append(f"{util}% utilisation with no process (a hung P2P collective stays so until a reset)")
        if action in (None, "N/A"):
            for x in h.get("xids") or []:
                if x["xid"] in RESET_XIDS:
                    when = f" at {x['t']:.0f} s after boot" if x["t"] is not None else ""
                    seen.append(f"Xid {x['xid']}{when} ({RESET_XIDS[x['xid']]}): {x['text']}")
        if seen:
            found.append(WedgedGpu(i, place.bdf, tuple(dict.fromkeys(seen))))
    return found
