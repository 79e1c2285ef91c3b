"""pdkit's PCIe topology and GPU health probe: read as text by roles/node_facts.py (PcieTopology) and
run on a GPU node with its own python3 (standard library only, any python 3.5+), as root in a deploy.

It reads, and does not judge (pdkit/agent/topology.py parses and judges, pure, on recorded outputs):
- every NVIDIA GPU on the PCI bus (class 0x0300/0x0302): its sysfs path from the root bus
  (/sys/devices/pci0000:00/0000:00:01.1/.../GPU: the root complex, root port, switch ports), its
  NUMA node and IOMMU group;
- each bridge on those paths: `lspci -vvv -s` (port type, ACSCap/ACSCtl), or its config space
  from sysfs where lspci is missing or hides the capabilities (not root);
- the IOMMU: /proc/cmdline, /sys/class/iommu, each GPU's group type (identity = passthrough);
- nvidia_uvm's HMM switch (/sys/module/nvidia_uvm/parameters/uvm_disable_hmm) and the modprobe
  options that set it;
- `nvidia-smi -q` (addressing mode, recovery action, retired pages, remapped rows, utilisation,
  processes) and the kernel log's `NVRM: Xid` lines.
Anything it cannot read goes to "unread" with why; it never fails (a missing nvidia-smi, lspci or
sysfs file is a fact too). `python3 pdkit/agent/topology_probe.py --plain` prints the JSON alone: that
is the fixture format of tests/fixtures/topology/ (a capture drops in there as it is).
"""

import glob
import json
import os
import subprocess
import sys
from typing import Any  # noqa: F401  # read by the type comments (variable annotations need python 3.6)

MARK = "pdkit-topology: "
# the probe's output format: pdkit/agent/topology.py reads this version
FORMAT = 1
ROOT = os.environ.get("PDKIT_TOPOLOGY_ROOT", "")  # a fake tree for tests; "" on a node
MAX_XID_LINES = 200
MODPROBE_DIRS = ("/etc/modprobe.d", "/lib/modprobe.d", "/usr/lib/modprobe.d", "/run/modprobe.d")

out = {
    "format": FORMAT,
    "gpus": [],
    "bridges": {},
    "iommu": {},
    "uvm": {},
    "nvidia_smi_q": None,
    "xid_lines": [],
    "kernel_log": None,
    "unread": [],
}  # type: dict[str, Any]


def unread(what: str, why: str) -> None:
    out["unread"].append({"what": what, "why": why})


def path(p: str) -> str:
    return ROOT + p


def read(p: str, what: "str | None" = None) -> "str | None":
    try:
        with open(path(p)) as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        if what:
            unread(what, "%s: %s" % (type(e).__name__, e))
        return None


def run(argv: "list[str]", what: str, timeout: int = 60) -> "str | None":
    """stdout of ARGV, or None (noted in unread) when it is missing, fails or hangs."""
    if ROOT:
        argv = [os.path.join(ROOT, "bin", argv[0])] + argv[1:]
        if not os.path.exists(argv[0]):
            unread(what, "%s is not installed" % os.path.basename(argv[0]))
            return None
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, universal_newlines=True
        )
    except OSError as e:
        unread(what, "%s is not installed (%s)" % (argv[0], e.strerror or e))
        return None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        unread(what, "%s did not finish in %d s" % (" ".join(argv), timeout))
        return None
    if proc.returncode != 0:
        lines = [line.strip() for line in (stderr + stdout).splitlines() if line.strip()]
        unread(what, "%s: exit %d: %s" % (" ".join(argv), proc.returncode, lines[-1] if lines else "no output"))
        return None
    return stdout


def gpus() -> None:
    for dev in sorted(glob.glob(path("/sys/bus/pci/devices/*"))):
        bdf = os.path.basename(dev)
        if read("/sys/bus/pci/devices/%s/vendor" % bdf) != "0x10de":
            continue
        cls = read("/sys/bus/pci/devices/%s/class" % bdf) or ""
        if not cls.startswith(("0x0300", "0x0302")):
            continue
        real = os.path.realpath(dev)
        if ROOT and real.startswith(ROOT):
            real = real[len(ROOT) :]
        numa = read("/sys/bus/pci/devices/%s/numa_node" % bdf, "numa_node of %s" % bdf)
        group = None
        try:
            group = os.path.basename(os.readlink(path("/sys/bus/pci/devices/%s/iommu_group" % bdf)))
        except OSError:
            pass  # no IOMMU group: the IOMMU is off (the parser says so from /sys/class/iommu)
        out["gpus"].append(
            {
                "bdf": bdf,
                "sysfs_path": real,
                "class": cls,
                "device": read("/sys/bus/pci/devices/%s/device" % bdf),
                "numa_node": numa,
                "iommu_group": group,
            }
        )


def bridges() -> None:
    wanted = {}  # type: dict[str, str]  # bdf -> its sysfs directory, in path order
    for gpu in out["gpus"]:
        parts = gpu["sysfs_path"].split("/")  # /sys/devices/pci0000:00/<bridges>/<gpu>
        for i in range(4, len(parts) - 1):
            wanted.setdefault(parts[i], "/".join(parts[: i + 1]))
    lspci = True
    for bdf, directory in wanted.items():
        entry = {"lspci": None, "config": None}  # type: dict[str, str | None]
        if lspci:
            text = run(["lspci", "-vvv", "-D", "-s", bdf], "lspci -vvv -s %s" % bdf)
            if text is None and out["unread"] and "not installed" in out["unread"][-1]["why"]:
                lspci = False  # said once
            entry["lspci"] = text
        if entry["lspci"] is None or "Capabilities: <access denied>" in entry["lspci"]:
            try:
                with open(path(directory + "/config"), "rb") as fh:
                    raw = fh.read(4096)
                entry["config"] = "".join("%02x" % b for b in bytearray(raw))
                if len(raw) <= 256:
                    unread(
                        "config space of %s" % bdf,
                        "only %d bytes readable (not root): no extended capabilities, so no ACS" % len(raw),
                    )
            except OSError as e:
                unread("config space of %s" % bdf, "%s: %s" % (type(e).__name__, e))
        out["bridges"][bdf] = entry


def iommu() -> None:
    info = out["iommu"]
    info["cmdline"] = read("/proc/cmdline", "/proc/cmdline")
    try:
        info["devices"] = sorted(os.listdir(path("/sys/class/iommu")))
    except OSError as e:
        info["devices"] = None
        unread("/sys/class/iommu", "%s: %s" % (type(e).__name__, e))
    types = {}  # type: dict[str, str | None]
    for gpu in out["gpus"]:
        if gpu["iommu_group"] is not None:
            types[gpu["iommu_group"]] = read(
                "/sys/kernel/iommu_groups/%s/type" % gpu["iommu_group"], "IOMMU group %s type" % gpu["iommu_group"]
            )
    info["group_types"] = types


def uvm() -> None:
    info = out["uvm"]
    info["loaded"] = os.path.isdir(path("/sys/module/nvidia_uvm"))
    info["uvm_disable_hmm"] = read(
        "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm", "uvm_disable_hmm" if info["loaded"] else None
    )
    options = []
    for d in MODPROBE_DIRS:
        for f in sorted(glob.glob(path(d + "/*.conf"))):
            try:
                with open(f) as fh:
                    for line in fh:
                        if "nvidia_uvm" in line or "nvidia-uvm" in line:
                            options.append("%s: %s" % (f[len(ROOT) :], line.strip()))
            except (OSError, UnicodeDecodeError) as e:
                unread(f, "%s: %s" % (type(e).__name__, e))
    info["modprobe"] = options


def smi() -> None:
    if not out["gpus"]:
        return
    out["nvidia_smi_q"] = run(["nvidia-smi", "-q"], "nvidia-smi -q", timeout=120)


def kernel_log() -> None:
    if not out["gpus"]:
        return
    text = run(["dmesg"], "dmesg")
    source = "dmesg"
    if text is None:
        text = run(["journalctl", "-k", "-b", "0", "--no-pager", "-o", "short-monotonic"], "journalctl -k")
        source = "journalctl -k"
    if text is None:
        return
    out["kernel_log"] = source
    out["xid_lines"] = [line for line in text.splitlines() if "NVRM: Xid" in line][-MAX_XID_LINES:]


def main() -> None:
    for step in (gpus, bridges, iommu, uvm, smi, kernel_log):
        try:
            step()
        except Exception as e:  # a probe that fails says where, and the rest still runs
            unread(step.__name__, "%s: %s" % (type(e).__name__, e))
    text = json.dumps(out, sort_keys=True)
    print(text if "--plain" in sys.argv[1:] else MARK + text)


if __name__ == "__main__":
    main()
