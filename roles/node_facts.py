"""Custom pyinfra facts the preflight reads from a GPU node, each with a small pure parser.

Every command succeeds with empty output where its source is absent (no nvidia-smi before the
driver is installed, no /proc/driver/nvidia without a loaded module): `process()` only sees
real output, and `default()` says "absent". nvidia-smi failures (e.g. "No devices were found"
from the closed module on Blackwell) are kept as an error string instead of failing the host,
so the preflight can report them with everything else. Cases: tests/node/facts/<Fact>/*.json.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from pyinfra.api import FactBase

import pdkit
from pdkit.agent import topology
from pdkit.render.node import REBOOT_MARKER_PATH
from pdkit.spec.modelconfig import CONFIG_KEYS, TEXT_CONFIG_KEYS
from pdkit.upstream.versions import NIXL_IMPORT

# the probes these facts send to the node's python3 (`python3 -c TEXT`): programs kept as files of their own
PROBES = Path(pdkit.__file__).parent / "hosts"

# marks the line pdkit appends when nvidia-smi ran and failed (its own message comes before it)
NVIDIA_SMI_FAILED = "pdkit: nvidia-smi failed, exit code"


def _nvidia_smi(args: str) -> str:
    # absent: no output; failed: its message plus our marker line with the exit code
    return f"if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi {args} 2>&1 || echo \"{NVIDIA_SMI_FAILED} $?\"; fi"


def _smi_error(lines: list[str]) -> str | None:
    if lines and lines[-1].startswith(NVIDIA_SMI_FAILED):
        return " ".join(line.strip() for line in lines if line.strip())
    return None


# where the OS says what it is (os-release(5))
OS_RELEASE_PATH = "/etc/os-release"


class NodeOsRelease(FactBase):
    """/etc/os-release: ID, VERSION_ID, VERSION_CODENAME, PRETTY_NAME."""

    def command(self) -> str:
        return f"cat {OS_RELEASE_PATH}"

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        values = {}
        for line in output:
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"')
        return {
            "id": values.get("ID", ""),
            "version_id": values.get("VERSION_ID", ""),
            "codename": values.get("VERSION_CODENAME", ""),
            "pretty_name": values.get("PRETTY_NAME", ""),
        }


class NodeArch(FactBase):
    """`uname -m`."""

    def command(self) -> str:
        return "uname -m"

    def process(self, output: list[str]) -> str:
        return output[0].strip()


class NodeKernel(FactBase):
    """`uname -r` (DKMS builds against this kernel's headers)."""

    def command(self) -> str:
        return "uname -r"

    def process(self, output: list[str]) -> str:
        return output[0].strip()


class NvidiaGpus(FactBase):
    """nvidia-smi's GPUs: index, name, memory (MiB), compute capability, PCI bus id."""

    def command(self) -> str:
        return _nvidia_smi("--query-gpu=index,name,memory.total,compute_cap,pci.bus_id --format=csv,noheader,nounits")

    @staticmethod
    def default() -> dict:
        return {"available": False, "error": None, "gpus": []}

    def process(self, output: list[str]) -> dict:
        error = _smi_error(output)
        if error:
            return {"available": True, "error": error, "gpus": []}
        gpus = []
        for line in output:
            if not line.strip():
                continue
            index, name, memory, cc, bus = (f.strip() for f in line.split(","))
            gpus.append({"index": int(index), "name": name, "memory_mib": int(memory), "compute_cap": cc, "pci_bus_id": bus})
        return {"available": True, "error": None, "gpus": gpus}


class NvidiaDriverVersion(FactBase):
    """The loaded driver's version as nvidia-smi reports it (one line per GPU, all equal)."""

    def command(self) -> str:
        return _nvidia_smi("--query-gpu=driver_version --format=csv,noheader")

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> str | None:
        if _smi_error(output):
            return None
        versions = sorted({line.strip() for line in output if line.strip()})
        return versions[0] if len(versions) == 1 else ",".join(versions) or None


class NvidiaKernelModule(FactBase):
    """/proc/driver/nvidia/version: is a module loaded, is it the open one, which version."""

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    @staticmethod
    def default() -> dict:
        return {"loaded": False, "open": False, "version": None}

    def process(self, output: list[str]) -> dict:
        first = next((line for line in output if line.startswith("NVRM version:")), "")
        match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", first + " ")
        return {"loaded": bool(first), "open": "Open Kernel Module" in first, "version": match.group(1) if match else None}


class PciNvidiaGpus(FactBase):
    """NVIDIA display/3D controllers on the PCI bus, with their sysfs NUMA node (no driver needed)."""

    def command(self) -> str:
        # class 0x0300 (VGA) and 0x0302 (3D controller); NVSwitches (0x0680) and audio are not GPUs
        return (
            "for d in /sys/bus/pci/devices/*; do "
            "[ \"$(cat \"$d/vendor\" 2>/dev/null)\" = 0x10de ] || continue; "
            "c=$(cat \"$d/class\"); case \"$c\" in 0x0300*|0x0302*) "
            "echo \"${d##*/} $c $(cat \"$d/numa_node\" 2>/dev/null || echo -1)\";; esac; done"
        )

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[dict]:
        devices = []
        for line in output:
            fields = line.split()
            if len(fields) == 3:
                devices.append({"bus_id": fields[0].lower(), "class": fields[1], "numa_node": int(fields[2])})
        return sorted(devices, key=lambda d: d["bus_id"])


class NumaCpus(FactBase):
    """CPUs of each NUMA node, from /sys/devices/system/node/node*/cpulist."""

    def command(self) -> str:
        return "for n in /sys/devices/system/node/node[0-9]*; do [ -e \"$n/cpulist\" ] && echo \"$n $(cat \"$n/cpulist\")\"; done; true"

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        nodes = {}
        for line in output:
            path, _, cpulist = line.strip().partition(" ")
            match = re.search(r"node(\d+)$", path)
            if match:
                nodes[int(match.group(1))] = {"cpulist": cpulist, "cpus": cpu_count(cpulist)}
        return nodes


def cpu_count(cpulist: str) -> int:
    """'0-31,64-95' -> 64."""
    total = 0
    for part in filter(None, cpulist.split(",")):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total


class NetworkInterfaces(FactBase):
    """Network interfaces (/sys/class/net) and RDMA devices (/sys/class/infiniband)."""

    def command(self) -> str:
        return "ls -1 /sys/class/net; echo ---; ls -1 /sys/class/infiniband 2>/dev/null; true"

    @staticmethod
    def default() -> dict:
        return {"interfaces": [], "rdma": []}

    def process(self, output: list[str]) -> dict:
        names = [line.strip() for line in output]
        split = names.index("---") if "---" in names else len(names)
        return {"interfaces": [n for n in names[:split] if n], "rdma": [n for n in names[split + 1:] if n]}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^(GPU|NIC)\d+$")


class NvidiaTopology(FactBase):
    """`nvidia-smi topo -m`: the link between every pair of GPUs (X, NV#, PIX, PXB, PHB, NODE, SYS)."""

    def command(self) -> str:
        return _nvidia_smi("topo -m")

    @staticmethod
    def default() -> dict:
        return {"error": None, "gpus": [], "links": {}, "cpu_affinity": {}, "numa_affinity": {}}

    def process(self, output: list[str]) -> dict:
        error = _smi_error(output)
        if error:
            return {**self.default(), "error": error}
        lines = [_ANSI.sub("", line) for line in output]
        header = next((line for line in lines if line.startswith(("\t", " ")) and "GPU0" in line), None)
        if header is None:
            return self.default()
        columns = [c.strip() for c in header.split("\t")[1:]]
        devices = [c for c in columns if _DEVICE.match(c)]
        links: dict[str, dict[str, str]] = {}
        cpu_affinity: dict[str, str] = {}
        numa_affinity: dict[str, str] = {}
        for line in lines:
            cells = line.split("\t")
            if not re.match(r"^GPU\d+$", cells[0].strip()):
                continue
            gpu = cells[0].strip()[3:]
            values = [c.strip() for c in cells[1:]]
            links[gpu] = {d[3:]: v for d, v in zip(devices, values) if d.startswith("GPU") and d[3:] != gpu}
            rest = values[len(devices):]
            cpu_affinity[gpu] = rest[0] if rest else ""
            numa_affinity[gpu] = rest[1] if len(rest) > 1 else ""
        return {"error": None, "gpus": sorted(links, key=int), "links": links, "cpu_affinity": cpu_affinity, "numa_affinity": numa_affinity}


class RebootRequired(FactBase):
    """pdkit's reboot-required marker (pdkit.render.node.REBOOT_MARKER_PATH): its reason, or None."""

    def command(self) -> str:
        return f"cat {REBOOT_MARKER_PATH} 2>/dev/null || true"

    @staticmethod
    def default() -> None:
        return None

    def process(self, output: list[str]) -> str | None:
        return " ".join(line.strip() for line in output if line.strip()) or None


class _MarkedProbe(FactBase):
    """A probe run by the node's python3 whose result is the JSON on the one line of its output that starts
    with MARK (its command always exits 0): that JSON, else an error naming the probe's last line."""

    mark = ""

    @staticmethod
    def default() -> dict:
        return {"error": "the probe printed nothing (is python3 installed on the node?)"}

    def process(self, output: list[str]) -> dict:
        for line in reversed(output):
            if line.startswith(self.mark):
                return json.loads(line[len(self.mark):])
        lines = [line.strip() for line in output if line.strip()]
        return {"error": f"the probe failed: {lines[-1] if lines else 'no output'}"}


# the one line of EngineEnv's output that carries its result
ENGINE_ENV_MARK = "pdkit-engine-env: "

# Runs under the node's python3 (any 3.x): checks the file, then runs the provided python once
# (-B: it writes no bytecode into an environment pdkit does not own) with _ENGINE_ENV_INNER.
_ENGINE_ENV_OUTER = PROBES.joinpath("engineenv_probe.py").read_text()
# Runs under the provided python: its version, sglang (distribution and import), NIXL as SGLang
# imports it (pdkit.upstream.versions.NIXL_IMPORT).
_ENGINE_ENV_INNER = PROBES.joinpath("engineenv_probe_inner.py").read_text().replace("__NIXL_IMPORT__", NIXL_IMPORT)


class EngineEnv(_MarkedProbe):
    """A node's own engine environment (pdkit_node.engine_venv) as the preflight checks it, in one
    command: does VENV/bin/python exist and run, which sglang it has (`import sglang;
    sglang.__version__`, or the error), and whether NIXL imports the way SGLang imports it.
    The decision is pdkit.hosts.preflight.engine_env_problems (pure)."""

    mark = ENGINE_ENV_MARK

    def command(self, venv: str) -> str:
        # always exits 0: a missing or broken environment is a finding, not a failed fact
        return f"python3 -c {shlex.quote(_ENGINE_ENV_OUTER)} {shlex.quote(venv)} {shlex.quote(_ENGINE_ENV_INNER)} || true"


# the one line of ModelDirs' output that carries its result
MODEL_DIRS_MARK = "pdkit-model-dirs: "

# Runs under the node's python3 (any 3.x), as root in a deploy: for each directory, what is there
# (config.json, weight indexes and files, the shards an index names that are missing) and what the
# service user cannot read of it. Readability: `runuser -u USER -- test ...` where the probe is
# root and the user exists (ACLs included); else the mode bits along the path, as that user, or,
# before the deploy has created the user, as a user outside every file's owner and group.
_MODEL_DIRS_PROBE = PROBES.joinpath("modeldirs_probe.py").read_text()


class ModelDirs(_MarkedProbe):
    """The model directories a node's engines read (pdkit.hosts.preflight.model_dirs_wanted), as the
    preflight checks them, in one command: each one's existence, config.json, weight index or
    files, shards its index names but lacks, and what of it the service user USER cannot read.
    The decision is pdkit.hosts.preflight.model_dir_problems (pure)."""

    mark = MODEL_DIRS_MARK

    def command(self, user: str, paths: tuple[str, ...]) -> str:
        # always exits 0: a missing or unreadable directory is a finding, not a failed fact
        keys, subs = ",".join(CONFIG_KEYS), ",".join(TEXT_CONFIG_KEYS)
        return (f"python3 -c {shlex.quote(_MODEL_DIRS_PROBE)} {shlex.quote(keys)} {shlex.quote(subs)} {shlex.quote(user)} "
                f"{' '.join(shlex.quote(p) for p in paths)} || true")


# the one line of PcieTopology's output that carries its result
PCIE_TOPOLOGY_MARK = topology.PROBE_MARK


class PcieTopology(_MarkedProbe):
    """Per GPU its PCIe path (root complex, root port, switches, NUMA node), ACS on the bridges of that
    path, the IOMMU's mode, nvidia_uvm's HMM switch and GPU health (Xid lines, recovery action, pending
    retired pages / row remaps, utilisation with no process): pdkit/agent/topology_probe.py, one program run
    by the node's python3, read as the raw texts it gathered (issue 47). pdkit.agent.topology parses and
    judges them (pure); the preflight's rules are pdkit.hosts.preflight._check_pcie."""

    mark = PCIE_TOPOLOGY_MARK

    def command(self) -> str:
        # always exits 0: what it cannot read (no nvidia-smi, no lspci, no sysfs file) is in its "unread"
        return f"python3 -c {shlex.quote(topology.probe_source())} || true"


# name -> fact class, in the order the preflight reads them
NODE_FACTS: dict[str, type[FactBase]] = {
    "os": NodeOsRelease,
    "arch": NodeArch,
    "kernel": NodeKernel,
    "gpus": NvidiaGpus,
    "driver": NvidiaDriverVersion,
    "module": NvidiaKernelModule,
    "pci_gpus": PciNvidiaGpus,
    "numa_cpus": NumaCpus,
    "nics": NetworkInterfaces,
    "topology": NvidiaTopology,
    "reboot_required": RebootRequired,
}


# Facts a node's python3 can answer as their commands would, without a shell command of their
# own: the host-state probe (roles/facts.py) reads them in its round trip. A `gpu: none` host's
# four shell facts cost its CPU ~9 ms per deploy (docs/benchmarks.md, "No-op re-run on the lab:
# a CPU profile"). name -> (what the probe reads: PdkitHostState's texts, whether an unreadable
# source fails the fact: `cat /etc/os-release` fails, the marker's command never does).
PROBE_TEXTS: dict[str, tuple[tuple[str, str], bool]] = {
    "os": (("file", OS_RELEASE_PATH), True),
    "arch": (("uname", "machine"), True),
    "kernel": (("uname", "release"), True),
    "reboot_required": (("file", REBOOT_MARKER_PATH), False),
}


def probe_texts(names: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """PdkitHostState's `texts` argument for NAMES (all in PROBE_TEXTS): (name, kind, source) each."""
    return tuple((name, *PROBE_TEXTS[name][0]) for name in names)


def output_lines(text: str) -> list[str]:
    """TEXT as pyinfra hands a command's stdout to a fact: split at newlines, without the last empty piece."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def facts_from_texts(names: tuple[str, ...], texts: dict[str, str | None]) -> dict | None:
    """NodeFacts' value for NAMES (all in PROBE_TEXTS) from the probe's TEXTS, each parsed by its own
    fact as when read alone; None when a source whose command would fail could not be read (the
    caller reads NodeFacts itself then, and it fails as it would have)."""
    values = {}
    for name in names:
        (_, required), text = PROBE_TEXTS[name], texts.get(name)
        if text is None and required:
            return None
        lines = output_lines(text or "")
        fact = NODE_FACTS[name]()
        values[name] = fact.process(lines) if lines else fact.default()
    return values


# a line no fact's own output can start with: it opens the next fact's part of NodeFacts' output
NODE_FACTS_MARK = "--- pdkit node fact: "


class NodeFacts(FactBase):
    """The facts above named in NAMES, in one round trip: name -> that fact's value.

    Eleven facts one after another are eleven SSH round trips in every deploy and every node
    of a roll; run together they are one. Each part is parsed by its own fact's `process()`
    (its `default()` when it printed nothing), exactly as when read alone. ENGINE_VENV (a node's
    pdkit_node.engine_venv) adds EngineEnv's probe of it to the same round trip, as "engine_env";
    MODEL_DIRS (the service user and the engines' model directories) adds ModelDirs', as "model_dirs";
    PCIE (a GPU node) adds PcieTopology's probe, as "pcie".
    """

    def command(self, names: tuple[str, ...], engine_venv: str | None = None,
                model_dirs: tuple[str, tuple[str, ...]] | None = None, pcie: bool = False) -> str:
        # `&&`: a fact command that fails fails this one, as it would alone
        parts = [f"echo '{NODE_FACTS_MARK}{name}' && {{ {NODE_FACTS[name]().command()} ; }}" for name in names]
        if engine_venv:
            # the node's own engine environment, in the same round trip (value under "engine_env")
            parts.append(f"echo '{NODE_FACTS_MARK}engine_env' && {{ {EngineEnv().command(engine_venv)} ; }}")
        if model_dirs:
            # the engines' model directories as the service user sees them (value under "model_dirs")
            user, paths = model_dirs
            parts.append(f"echo '{NODE_FACTS_MARK}model_dirs' && {{ {ModelDirs().command(user, tuple(paths))} ; }}")
        if pcie:
            # the PCIe topology and GPU health probe (value under "pcie"; a GPU node's preflight only)
            parts.append(f"echo '{NODE_FACTS_MARK}pcie' && {{ {PcieTopology().command()} ; }}")
        return " && ".join(parts)

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        parts: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in output:
            if line.startswith(NODE_FACTS_MARK):
                current = parts.setdefault(line[len(NODE_FACTS_MARK):].strip(), [])
            elif current is not None:
                current.append(line)
        values = {}
        for name, lines in parts.items():
            fact = (EngineEnv() if name == "engine_env" else ModelDirs() if name == "model_dirs"
                    else PcieTopology() if name == "pcie" else NODE_FACTS[name]())
            values[name] = fact.process(lines) if lines else fact.default()
        return values
