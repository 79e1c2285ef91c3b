"""No change onto a wedged GPU (issue 47 item 4): before a roll or a tune candidate drains a node, the
node's GPU health as the preflight's probe reads it (pdkit/agent/topology_probe.py, parsed and judged by
pdkit.agent.topology.wedged_gpus); a GPU an engine of the node uses that needs a reset refuses the change,
naming the GPU and what was seen. The deploy refuses the same through the preflight
(pdkit.hosts.preflight._check_pcie)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

from pdkit.agent import topology
from pdkit.agent.exporter.config import reads_gpu_health
from pdkit.spec import ClusterSpec

# what to do, in every refusal
RESET_HINT = ("drain the node and reset the GPU (`nvidia-smi -r -i INDEX`) or reboot, then run the change again "
              "(`pdkit preflight` shows the node's GPU health)")


def probe_command() -> str:
    """The probe, sent as source to the node's python3 (it exits 0 and lists what it could not read)."""
    return f"python3 -c {shlex.quote(topology.probe_source())} || true"


def read_probe(stdout: str) -> dict:
    """The probe's JSON from its output (the line after topology.PROBE_MARK), or {"error": why}."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(topology.PROBE_MARK):
            try:
                return json.loads(line[len(topology.PROBE_MARK):])
            except ValueError as exc:
                return {"error": f"unreadable probe output: {exc}"}
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    return {"error": f"the probe printed no result: {lines[-1] if lines else 'no output'}"}


def restart_check(spec: ClusterSpec, host_name: str,
                  run: Callable[[str], tuple[bool, str, str]]) -> tuple[list[topology.WedgedGpu], str]:
    """(GPUs of HOST_NAME's engines that are wedged, what was read) before its engines restart. RUN runs a
    shell command on the node: (ok, stdout, stderr). A node with no NVIDIA GPU, or the sim engine: nothing
    to read. A probe that cannot run is said, never a refusal (the preflight reads the same at the deploy)."""
    host = spec.host(host_name)
    node = host.node
    if node is None or not reads_gpu_health(node.gpu, spec.cluster.engine) or not node.engines:
        return [], ""
    try:
        ok, stdout, stderr = run(probe_command())
    except Exception as exc:  # noqa: BLE001 - evidence only: a node that cannot tell is said, not refused
        return [], f"GPU health not read ({exc})"
    probe = read_probe(stdout) if ok else {"error": (stderr or stdout).strip()[-300:] or "the probe failed"}
    if probe.get("error"):
        return [], f"GPU health not read ({probe['error']})"
    topo = topology.parse_probe(probe)
    used = {g for e in node.engines for g in e.gpus}
    wedged = [w for w in topology.wedged_gpus(topo, engines_serving=True) if w.index in used]
    if wedged:
        return wedged, "; ".join(w.message(host_name) for w in wedged)
    healthy = sorted(used & set(topo.gpus))
    said = f"GPU {', '.join(map(str, healthy))}: no reset-class Xid, no pending page retirement or row remap"
    if topo.unread:
        said += f" (not read: {'; '.join(topo.unread[:2])})"
    return [], said
