"""Writes the fact cases once (kept for review; the JSON files are the test data, not this script).

H200 outputs are verbatim from /work/notes/h200-samples (captured on the lent 2x H200 machine,
2026-11-29). RTX PRO 6000 and A6000 outputs are BUILT from public documentation (nvidia-smi's
documented CSV/topo formats, the GPUs' published memory sizes and compute capabilities, a typical
dual-socket PCIe layout); they are not captures. The Debian 12 os-release is this control
machine's own file (the lab hosts run the same release).
"""

import json
import sys
from pathlib import Path

from roles import node_facts as nf

SAMPLES = Path("/work/notes/h200-samples")
OUT = Path(__file__).parent / "facts"


def lines(text: str) -> list[str]:
    return text.splitlines()


def section(text: str, index: int) -> list[str]:
    return [line for line in text.split("---\n")[index].splitlines()]


def write(fact: str, case: str, output: list[str], source: str, **kwargs) -> None:
    cls = getattr(nf, fact)
    instance = cls()
    value = instance.process(output) if output else cls.default()
    path = OUT / fact / f"{case}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"source": source, "command": instance.command(**kwargs), "output": output, "fact": value}, indent=2) + "\n")


def main() -> None:
    h200 = "verbatim capture, lent 2x H200 (Ubuntu 24.04.3, KVM guest), /work/notes/h200-samples"
    built = "BUILT from public documentation (not a capture): "
    system = (SAMPLES / "system.txt").read_text()
    write("NodeOsRelease", "h200-ubuntu2404", section(system, 0), h200)
    real_early = json.loads((Path(__file__).parent / "data" / "h200-x2-fact-commands.json").read_text())
    for fact in ("NodeArch", "NodeKernel", "NvidiaGpus", "NvidiaDriverVersion", "NvidiaKernelModule", "NumaCpus", "NvidiaTopology"):
        assert real_early[fact]["command"] == getattr(nf, fact)().command(), f"{fact}: the capture ran another command"
    write("NodeOsRelease", "debian12-bookworm", lines(Path("/etc/os-release").read_text()), "verbatim /etc/os-release of the Debian 12 control machine (the lab's release)")
    write("NodeArch", "h200-x86_64", section(system, 1)[:1], h200)
    write("NodeKernel", "h200", section(system, 1)[1:2], h200)
    real = json.loads((Path(__file__).parent / "data" / "h200-x2-fact-commands.json").read_text())
    ours = "verbatim output of this fact's own command on the lent 2x H200 (tests/node/data/h200-x2-fact-commands.json, tests/node/capture_facts.py)"
    write("NetworkInterfaces", "h200-no-rdma", real["NetworkInterfaces"]["output"], ours)
    write("NetworkInterfaces", "rtx-pro-6000-with-rdma", ["eno1", "enp65s0f0np0", "lo", "---", "mlx5_0", "mlx5_1"], built + "a node with a ConnectX NIC (interface names per systemd predictable naming, RDMA devices per rdma-core)")
    write("NvidiaGpus", "h200-2x", lines((SAMPLES / "query-gpu.txt").read_text()), h200)
    rtx_bus = ["00000000:17:00.0", "00000000:3D:00.0", "00000000:63:00.0", "00000000:89:00.0", "00000000:97:00.0", "00000000:B1:00.0", "00000000:CA:00.0", "00000000:E1:00.0"]
    write("NvidiaGpus", "rtx-pro-6000-8x", [f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 12.0, {b}" for i, b in enumerate(rtx_bus)], built + "nvidia-smi --query-gpu CSV format; 96 GB (97887 MiB) and compute capability 12.0 per NVIDIA's RTX PRO 6000 Blackwell Server Edition datasheet / CUDA GPU list")
    write("NvidiaGpus", "a6000-2x", ["0, NVIDIA RTX A6000, 49140, 8.6, 00000000:01:00.0", "1, NVIDIA RTX A6000, 49140, 8.6, 00000000:21:00.0"], built + "48 GB (49140 MiB) and compute capability 8.6 per NVIDIA's RTX A6000 datasheet / CUDA GPU list")
    write("NvidiaGpus", "blackwell-closed-module", ["No devices were found", f"{nf.NVIDIA_SMI_FAILED} 6"], built + "nvidia-smi's message when the proprietary (closed) module meets a Blackwell GPU (NVIDIA driver docs; exit code 6 = not found)")
    write("NvidiaGpus", "no-driver", [], "no nvidia-smi on the host: the command prints nothing")
    write("NvidiaDriverVersion", "h200", lines((SAMPLES / "driver-version.txt").read_text()), h200)
    write("NvidiaDriverVersion", "no-driver", [], "no nvidia-smi on the host")
    write("NvidiaKernelModule", "h200-open", lines((SAMPLES / "proc-driver-version.txt").read_text()), h200)
    write("NvidiaKernelModule", "a6000-proprietary", ["NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 10:20:00 UTC 2025", "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)"], built + "/proc/driver/nvidia/version of the proprietary module (its first line lacks 'Open')")
    write("NvidiaKernelModule", "not-loaded", [], "no /proc/driver/nvidia/version: no module loaded")
    write("PciNvidiaGpus", "h200-2x-vm", real["PciNvidiaGpus"]["output"], ours)
    write("PciNvidiaGpus", "rtx-pro-6000-8x", [f"{b[4:].lower()} 0x030000 {0 if i < 4 else 1}" for i, b in enumerate(rtx_bus)], built + "a dual-socket node, GPUs 0-3 under socket 0 and 4-7 under socket 1")
    write("NumaCpus", "h200-one-node", lines((SAMPLES / "cpus-per-numa.txt").read_text()), h200)
    write("NumaCpus", "rtx-pro-6000-two-sockets", ["/sys/devices/system/node/node0 0-31,64-95", "/sys/devices/system/node/node1 32-63,96-127"], built + "two 32-core sockets with SMT")
    write("NvidiaTopology", "h200-nvlink", lines((SAMPLES / "topo-m.txt").read_text()), h200 + " (ANSI underline escapes kept)")
    rtx = _rtx_topology()
    write("NvidiaTopology", "rtx-pro-6000-8x-pcie", rtx, built + "nvidia-smi topo -m layout and legend; GPU pairs under one PCIe switch PIX, same socket NODE, across sockets SYS")
    write("NvidiaTopology", "a6000-2x-pcie", ["\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m", "GPU0\t X \tPHB\t0-23\t0\t\tN/A", "GPU1\tPHB\t X \t0-23\t0\t\tN/A", "", "Legend:", "", "  X    = Self"], built + "same layout as the H200 capture, a workstation whose two GPUs meet at the CPU's host bridge (PHB)")
    write("RebootRequired", "marked", ["NVIDIA driver packages changed by pdkit (branch 580, nvidia-dkms)"], "the marker nvidia_driver writes (pdkit.render.node.reboot_marker_text)")
    write("RebootRequired", "absent", [], "no marker file")


def _rtx_topology() -> list[str]:
    def link(a: int, b: int) -> str:
        if a == b:
            return " X "
        if a // 4 != b // 4:
            return "SYS"
        return "PIX" if a // 2 == b // 2 else "NODE"
    header = "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    rows = []
    for a in range(8):
        cpus, numa = ("0-31,64-95", "0") if a < 4 else ("32-63,96-127", "1")
        rows.append("\t".join([f"GPU{a}", *(link(a, b) for b in range(8)), "NODE" if a < 4 else "SYS", cpus, numa, "", "N/A"]))
    rows.append("\t".join(["NIC0", *("NODE" if b < 4 else "SYS" for b in range(8)), " X "]))
    return [header, *rows, "", "Legend:", "", "  X    = Self", "", "NIC Legend:", "", "  NIC0: mlx5_0"]


if __name__ == "__main__":
    sys.exit(main())
