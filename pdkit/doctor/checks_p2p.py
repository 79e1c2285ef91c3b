"""Doctor's `p2p` row (issue 47 item 3, `pdkit doctor --bench`): each GPU node's measured GPU-to-GPU write
and read between the GPUs of its PD pairs and TP groups, judged against the link's expected rate by
pdkit.hosts.p2p.judge. `check_p2p` is pure (a verdict in, a row out); `read_p2p` measures: doctor reads
everything else over HTTP, so this row connects to the nodes over SSH the way `pdkit roll` and
`pdkit stage` do (pdkit.roll.pyinfra_api: Pyinfra(inventory).connect, run_remote) and runs
pdkit/hosts/p2p_probe.py with the engine environment's python there."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pdkit.agent.exporter.config import reads_gpu_health
from pdkit.doctor.model import INFO, PASS, WARN, CheckResult
from pdkit.hosts import p2p
from pdkit.render import flags

_STATUS = {p2p.PASS: PASS, p2p.INFO: INFO, p2p.WARN: WARN}


def check_p2p(host: str, verdict: p2p.Verdict) -> CheckResult:
    """The node's row: PASS (every pair at its link's rate), WARN (a pair slow, without P2P access, or not
    measured), INFO (one GPU: the device copy; or nothing to judge against)."""
    return CheckResult(host, "node", "p2p", _STATUS[verdict.status], verdict.reason, verdict.hint)


def p2p_hosts(spec) -> list:
    """The GPU nodes whose engines the probe measures: NVIDIA nodes running a real engine (not the sim)."""
    return [h for h in spec.gpu_hosts
            if h.node is not None and h.node.engines and reads_gpu_health(h.node.gpu, spec.cluster.engine)]


def read_p2p(spec, inventory: str, progress: Callable[[str], None] = lambda _m: None) -> list[CheckResult]:
    """Connect to every GPU node of SPEC and measure (one SSH round trip each); a node that cannot be
    reached gets a WARN row naming why."""
    hosts = p2p_hosts(spec)
    if not hosts:
        return []
    # lazy: pyinfra's API (gevent, paramiko) loads only for --bench, after cmd_doctor's patch_gevent
    from pdkit.roll.pyinfra_api import Pyinfra, run_remote

    progress(f"measuring GPU-to-GPU copies on {', '.join(h.name for h in hosts)} (pdkit/hosts/p2p_probe.py over SSH)")
    _, connected, unreachable = Pyinfra(inventory).connect([h.name for h in hosts])
    rows = []
    for host in hosts:
        if host.name not in connected:
            rows.append(CheckResult(host.name, "node", "p2p", WARN,
                                    f"not measured: no SSH connection ({unreachable.get(host.name, 'unknown')})",
                                    f"make {host.name} reachable over SSH as the inventory says and re-run"))
            continue
        pairs = p2p.node_pairs(host)
        conn = connected[host.name]
        verdict, _record = p2p.read_node(
            host.name, pairs, flags.engine_python(spec, host),
            partial(run_remote, conn, timeout=p2p.PROBE_TIMEOUT_S + 120),
            partial(p2p.collapse_lines, pairs=pairs))
        rows.append(check_p2p(host.name, verdict))
    return rows
