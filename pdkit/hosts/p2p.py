"""The P2P bandwidth probe's control side (issue 47 item 3): which GPU pairs of a node to measure, the
command that runs pdkit/hosts/p2p_probe.py there with the engine environment's python, reading its answer,
the link's expected rate from the node's facts, and the verdict. Pure functions, except that the
command is run by a caller's RUN (doctor's SSH connection, the deploy's operation).

Which pairs: the flows the preflight's collapse rule checks (pdkit.agent.topology): a PD pair's KV writes
(`pd_flows`: rank i of the prefill into the decode rank(s) holding its heads) and each TP group's
collectives (`tp_flows`: every GPU to every other). The PD writes are also measured all at once: the
posted-write collapse (~52 -> 6-13 GB/s per pair on PCIe switches behind two or more root complexes)
shows only when flows run together.

Expected rate: per GPU, its PCIe link (generation and width, the highest the link trains to: the
`GPU Link Info` of `nvidia-smi -q`, which the topology probe records; an idle link drops to Gen1, so
the current values say nothing at rest); a pair's link is the slower end's. An NVLink pair (`NV#` in
`nvidia-smi topo -m`) is not judged against PCIe: its rate is reported as INFO.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdkit.agent import topology
from pdkit.hosts import gpuhealth
from pdkit.render.node import NODE_STATE_DIR

PROBE_PATH = Path(__file__).with_name("p2p_probe.py")
MARK = "pdkit-p2p: "
# where the deploy keeps the last measurement, beside the node layer's other records
RECORD_PATH = f"{NODE_STATE_DIR}/p2p.json"
# the probe's own size and count (2 x 256 MiB per pair, 1 warm-up + 5 timed copies each way: well
# under a second per pair on PCIe Gen4/5), and the caller's hard limit on the whole run over SSH
DEFAULT_MIB = 256
DEFAULT_ITERS = 5
PROBE_TIMEOUT_S = 300

# GB/s per lane and direction after line encoding (PCIe base spec: 8b/10b for Gen1-2, 128b/130b for
# Gen3-5, 242/256 FLIT for Gen6)
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# what a GPU's copy engine moves of the link's rate once TLP headers are paid: ~52 GB/s measured per
# pair on Gen5 x16 (63 GB/s) in the community measurements of 8 x RTX PRO 6000 boxes (voipmonitor/
# rtx6kpro hardware/collapse-report.md), i.e. 0.82
TLP_EFFICIENCY = 0.82
# a measured rate below this share of the expected one is a WARN: a healthy P2P path runs at 0.8-1.0
# of it, the collapse pattern at 0.12-0.25 (6-13 of 52 GB/s) and a copy staged through host memory at
# about half or less; half is the line between "the link's rate" and "something is in the way"
SLOW_FRACTION = 0.5


def probe_source() -> str:
    return PROBE_PATH.read_text()


# ---------------------------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class Pairs:
    """The GPU pairs of one node to measure: (src, dst) -> what makes them talk (each a short phrase),
    and the PD writes measured all at once."""

    flows: dict[tuple[int, int], tuple[str, ...]]
    concurrent: tuple[tuple[int, int], ...]
    gpus: tuple[int, ...]  # every GPU the node's engines use

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return list(self.flows)


def select_pairs(pd: Iterable[tuple[str, tuple[int, ...], str, tuple[int, ...], bool]],
                 tp: Iterable[tuple[str, tuple[int, ...]]], gpus: Iterable[int] = ()) -> Pairs:
    """PD: (prefill name, its GPUs, decode name, its GPUs, rank-for-rank shape); TP: (engine name, its GPUs).
    The flows by pdkit.agent.topology's rule, each pair once (PD first, the KV path), and the PD writes
    that happen together."""
    flows: dict[tuple[int, int], list[str]] = {}
    concurrent: list[tuple[int, int]] = []
    used = set(gpus)
    for p_name, p_gpus, d_name, d_gpus, same_shape in pd:
        used.update(p_gpus, d_gpus)
        for pair in topology.pd_flows(tuple(p_gpus), tuple(d_gpus), same_shape):
            if pair[0] == pair[1]:
                continue  # prefill and decode sharing a GPU: the KV copy stays inside it, no pair
            flows.setdefault(pair, []).append(f"KV {p_name} -> {d_name}")
            if pair not in concurrent:
                concurrent.append(pair)
    for name, group in tp:
        used.update(group)
        for pair in topology.tp_flows(tuple(group)):
            flows.setdefault(pair, []).append(f"TP {name}")
    return Pairs({k: tuple(v) for k, v in flows.items()}, tuple(concurrent), tuple(sorted(used)))


def node_pairs(host) -> Pairs:
    """HOST's (a HostSpec with a node) pairs: its prefill/decode engines of one pd_group on this node,
    and every engine with two or more GPUs here (a TP group; an engine spanning nodes, by its GPUs here)."""
    # lazy: pdkit.hosts.preflight loads the spec's checks; only the command that measures needs it
    from pdkit.hosts.preflight import pd_pairs_on_node

    node = host.node
    if node is None:
        return Pairs({}, (), ())
    pd = [(p.name, p.gpus, d.name, d.gpus, p.dp == 1 and p.pp == 1 and d.dp == 1 and d.pp == 1)
          for p, d in pd_pairs_on_node(host)]
    tp = [(e.name, e.gpus) for e in node.engines if len(e.gpus) > 1]
    return select_pairs(pd, tp, (g for e in node.engines for g in e.gpus))


# ---------------------------------------------------------------------------------------------- running


def probe_command(python: str, pairs: Pairs, mib: int = DEFAULT_MIB, iters: int = DEFAULT_ITERS,
                  timeout_s: int = PROBE_TIMEOUT_S) -> str:
    """The probe, sent as source to PYTHON (the engine environment's), bounded by `timeout`; it always
    exits 0 so that a missing python is read as the probe's missing answer, not as a failed command."""
    spell = lambda ps: ",".join(f"{a}:{b}" for a, b in ps)  # noqa: E731
    args = ["--mib", str(mib), "--iters", str(iters)]
    if pairs.flows:
        args += ["--pairs", spell(pairs.pairs)]
    if len(pairs.concurrent) > 1:
        args += ["--concurrent", spell(pairs.concurrent)]
    return (f"timeout -k 10 {int(timeout_s)} {shlex.quote(python)} -c {shlex.quote(probe_source())} "
            f"{' '.join(args)} 2>&1 || true")


# the nvidia-smi texts doctor reads in the same round trip (the deploy has them as preflight facts)
TOPO_BEGIN, TOPO_END = "pdkit-p2p-topo-begin", "pdkit-p2p-topo-end"


def node_read_command(python: str, pairs: Pairs, **kw) -> str:
    """One SSH round trip: the topology probe (GPU places and `nvidia-smi -q`, for each link's rate and
    the collapse rule), `nvidia-smi topo -m` (NVLink) and the P2P probe."""
    return (f"{gpuhealth.probe_command()}; echo {TOPO_BEGIN}; nvidia-smi topo -m 2>&1 || true; echo {TOPO_END}; "
            f"{probe_command(python, pairs, **kw)}")


def read_probe(stdout: str) -> dict:
    """The probe's JSON from its output (the line after MARK), or {"error": why} naming the last line."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(MARK):
            try:
                value = json.loads(line[len(MARK):])
            except ValueError as exc:
                return {"error": f"unreadable probe output: {exc}"}
            return value if isinstance(value, dict) else {"error": f"unreadable probe output: {line[:200]}"}
    lines = [line.strip() for line in (stdout or "").splitlines() if line.strip()]
    return {"error": f"the probe printed no result: {lines[-1][-300:] if lines else 'no output'}"}


def topo_text(stdout: str) -> str:
    """`nvidia-smi topo -m`'s text between node_read_command's marks."""
    text = stdout or ""
    if TOPO_BEGIN not in text:
        return ""
    return text.split(TOPO_BEGIN, 1)[1].split(TOPO_END, 1)[0]


# ---------------------------------------------------------------------------------------------- facts

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_link_info(smi_q: str | None) -> dict[str, dict[str, int | None]]:
    """`nvidia-smi -q` -> {bus id as sysfs writes it: {"gen", "width", "gen_current", "width_current"}} from
    each GPU's `GPU Link Info` (`PCIe Generation`: Max, Current, Device Max, Host Max; `Link Width`: Max,
    Current). "gen" is the highest the link trains to: the least of Max, Device Max and Host Max given."""
    # while parsing, "gen" collects every Max the section gives; the return keeps the least
    found: dict[str, dict[str, Any]] = {}
    for bdf, lines in topology.smi_q_sections(smi_q).items():
        current: dict[str, Any] = {"gen": [], "width": None, "gen_current": None, "width_current": None}
        found[bdf] = current
        for section, key, value in lines:
            if not value:
                continue  # a heading
            number = re.match(r"(\d+)", value)
            n = int(number.group(1)) if number else None
            if section == "PCIe Generation" and key in ("Max", "Device Max", "Host Max") and n:
                current["gen"].append(n)
            elif section == "PCIe Generation" and key == "Current":
                current["gen_current"] = n
            elif section == "Link Width" and key == "Max":
                current["width"] = n
            elif section == "Link Width" and key == "Current":
                current["width_current"] = n
    return {bdf: {**v, "gen": min(v["gen"]) if v["gen"] else None} for bdf, v in found.items()}


def parse_topo_links(text: str | None) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m` -> {(GPU a, GPU b): link} (X, NV#, PIX, PXB, PHB, NODE, SYS)."""
    lines = [_ANSI.sub("", line) for line in (text or "").splitlines()]
    # the header row starts with a tab (its first column, the row names, is empty); each row with its GPU
    header = next((line for line in lines if line.startswith(("\t", " ")) and "GPU0" in line), None)
    if header is None:
        return {}
    columns = [c.strip() for c in header.split("\t")]
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        if not re.match(r"^GPU\d+$", cells[0]):
            continue
        a = int(cells[0][3:])
        for col, value in zip(columns, cells):
            if re.match(r"^GPU\d+$", col) and int(col[3:]) != a:
                links[(a, int(col[3:]))] = value
    return links


def expected_gbps(gen: int | None, width: int | None) -> float | None:
    """The rate a GPU copy moves one way over a PCIe link of GEN and WIDTH lanes (None: unknown)."""
    if not gen or not width or gen not in LANE_GBPS:
        return None
    return round(LANE_GBPS[gen] * width * TLP_EFFICIENCY, 1)


@dataclass(frozen=True)
class Link:
    gen: int | None
    width: int | None

    @property
    def text(self) -> str:
        return f"PCIe Gen{self.gen or '?'} x{self.width or '?'}"


def gpu_links(topo: topology.Topology, smi_q: str | None) -> dict[int, Link]:
    """GPU index (nvidia-smi's) -> its PCIe link, from the topology probe's places and `nvidia-smi -q`."""
    info = parse_link_info(smi_q)
    return {i: Link((info.get(p.bdf) or {}).get("gen"), (info.get(p.bdf) or {}).get("width"))
            for i, p in topo.gpus.items()}


def pair_link(links: dict[int, Link], a: int, b: int) -> Link:
    """The slower end's generation and width."""
    ends = [links.get(a) or Link(None, None), links.get(b) or Link(None, None)]
    gens = [e.gen for e in ends if e.gen]
    widths = [e.width for e in ends if e.width]
    return Link(min(gens) if len(gens) == 2 else None, min(widths) if len(widths) == 2 else None)


# ---------------------------------------------------------------------------------------------- verdict

PASS, INFO, WARN = "PASS", "INFO", "WARN"


@dataclass(frozen=True)
class Verdict:
    """The node's P2P row: status, one-line reason with the figures, the fix, and each pair's line."""

    status: str
    reason: str
    hint: str = ""
    lines: tuple[str, ...] = field(default=())


def _rate(figs: dict | None) -> str:
    if not figs:
        return "-"
    return f"{figs['median']:.1f} GB/s (min {figs['min']:.1f}, max {figs['max']:.1f})"


def judge(host: str, probe: dict, links: dict[int, Link] | None = None,
          topo_links: dict[tuple[int, int], str] | None = None, pairs: Pairs | None = None,
          collapse: list[str] | None = None) -> Verdict:
    """The probe's answer judged: every measured pair's median write (and read, and the concurrent PD
    writes) against SLOW_FRACTION of its link's expected rate. PAIRS labels each pair with what makes it
    talk; COLLAPSE: the preflight's collapse findings for this node (pdkit.agent.topology.collapse_flows), named
    in the fix where the measurement agrees."""
    links, topo_links, collapse = links or {}, topo_links or {}, collapse or []
    labels = pairs.flows if pairs else {}
    if probe.get("error"):
        return Verdict(WARN, f"not measured: {probe['error']}",
                       f"on {host}: run the engine environment's python with torch and CUDA "
                       "(the deploy installs it; `pdkit doctor --bench` again after it)")
    if probe.get("no_pair"):
        copy = probe.get("device_copy") or {}
        figs = _rate(copy.get("gbps")) if not copy.get("error") else f"not measured ({copy['error']})"
        return Verdict(INFO, f"{probe['no_pair']}; device copy on GPU {copy.get('gpu', 0)}: {figs}")
    slow: list[str] = []
    no_peer: list[str] = []
    broken: list[str] = []
    lines: list[str] = []
    judged = 0

    def check(src: int, dst: int, what: str, figs: dict | None) -> str:
        nonlocal judged
        link = topo_links.get((src, dst), "")
        if figs is None:
            return f"{what} -"
        if link.startswith("NV"):
            return f"{what} {_rate(figs)} (NVLink {link}: not judged against PCIe)"
        pl = pair_link(links, src, dst)
        expected = expected_gbps(pl.gen, pl.width)
        if expected is None:
            return f"{what} {_rate(figs)} (link rate unknown: not judged)"
        judged += 1
        line = f"{what} {_rate(figs)} of {expected:.1f} GB/s expected on {pl.text}"
        if figs["median"] < SLOW_FRACTION * expected:
            slow.append(f"GPU {src} -> {dst} {what} {figs['median']:.1f} GB/s < {SLOW_FRACTION:.0%} of "
                        f"{expected:.1f} GB/s ({pl.text})")
            line += " SLOW"
        return line

    for entry in probe.get("pairs") or []:
        src, dst = entry.get("src"), entry.get("dst")
        why = ", ".join(labels.get((src, dst), ()))
        head = f"GPU {src} -> {dst}" + (f" ({why})" if why else "")
        if entry.get("error"):
            broken.append(f"GPU {src} -> {dst}: {entry['error']}")
            lines.append(f"{head}: {entry['error']}")
            continue
        if entry.get("peer_access") is False:
            no_peer.append(f"GPU {src} -> {dst}")
        parts = [check(src, dst, "write", entry.get("write_gbps"))]
        read = entry.get("read_gbps")
        parts.append(check(src, dst, "read", read) if read else f"read - ({entry.get('read_error') or 'not measured'})")
        peer = "" if entry.get("peer_access") is not False else "; no P2P access: copied through host memory"
        lines.append(f"{head}: {'; '.join(parts)}{peer}")
    together = probe.get("concurrent") or {}
    if together.get("error"):
        broken.append(f"PD writes at once: {together['error']}")
    for entry in together.get("pairs") or []:
        lines.append(f"GPU {entry['src']} -> {entry['dst']} (KV, all PD writes at once): "
                     f"{check(entry['src'], entry['dst'], 'write together', entry.get('write_gbps'))}")
    count = len(probe.get("pairs") or [])
    if not count:
        return Verdict(WARN, "the probe measured no pair", f"on {host}: check the probe's output", tuple(lines))
    hints = []
    problems = []
    if slow:
        problems.append(f"{len(slow)} slow: {'; '.join(slow[:4])}{' ...' if len(slow) > 4 else ''}")
        if collapse:
            hints.append("the preflight found the posted-write collapse pattern here ("
                         + "; ".join(collapse[:2]) + "): give each prefill switch decode GPUs behind one root "
                         "complex (pdkit_node.engines[].gpus), docs/node.md \"PCIe topology and GPU health facts\"")
        else:
            hints.append("regroup the engines' GPUs (pdkit_node.engines[].gpus) so each pair sits behind one switch "
                         "or root complex, or set pdkit_node.nccl_profile: pcie-p2p-off where host-memory copies "
                         "are faster; `pdkit preflight` names the switches and root complexes")
    if no_peer:
        problems.append(f"no P2P access for {', '.join(no_peer[:4])}{' ...' if len(no_peer) > 4 else ''} "
                        "(the copies go through host memory)")
        hints.append("enable P2P: check ACS and IOMMU on the path (`pdkit preflight`, docs/node.md), the driver, "
                     "and the BIOS's PCIe P2P / Above 4G settings")
    if broken:
        problems.append(f"{len(broken)} not measured: {'; '.join(broken[:2])}")
        hints.append(f"on {host}: free GPU memory for the probe (2 x {DEFAULT_MIB} MiB per pair) or re-run")
    if problems:
        return Verdict(WARN, f"{count} pair(s): " + "; ".join(problems), "; ".join(hints), tuple(lines))
    if not judged:
        return Verdict(INFO, f"{count} pair(s) measured, none judged (link rate unknown or NVLink): "
                       + "; ".join(lines[:2]), "", tuple(lines))
    best = [e["write_gbps"]["median"] for e in probe["pairs"] if e.get("write_gbps")]
    return Verdict(PASS, f"{count} pair(s) at >= {SLOW_FRACTION:.0%} of their link's rate "
                   f"(writes {min(best):.1f}-{max(best):.1f} GB/s median)", "", tuple(lines))


def record(host: str, probe: dict, verdict: Verdict, when: float) -> dict:
    """What is kept with the node's facts: the probe's answer and its verdict."""
    return {"host": host, "time": when, "probe": probe,
            "verdict": {"status": verdict.status, "reason": verdict.reason, "hint": verdict.hint,
                        "lines": list(verdict.lines)}}


def read_node(host_name: str, pairs: Pairs, python: str, run: Callable[[str], tuple[bool, str, str]],
              collapse_of: Callable[[topology.Topology], list[str]] | None = None) -> tuple[Verdict, dict]:
    """Measure HOST_NAME's PAIRS with PYTHON (the engine environment's) through RUN (a shell command on the
    node: (ok, stdout, stderr)), with the facts that judge it read in the same round trip: (verdict, record)."""
    try:
        ok, stdout, stderr = run(node_read_command(python, pairs))
    except Exception as exc:  # noqa: BLE001 - a node that cannot be read is a WARN row, not a crash
        probe: dict = {"error": f"{type(exc).__name__}: {exc}"}
        stdout = ""
    else:
        probe = read_probe(stdout)
        if not ok and not probe.get("pairs") and not probe.get("device_copy"):
            probe = {"error": probe.get("error") or (stderr or stdout).strip()[-300:] or "the command failed"}
    facts = gpuhealth.read_probe(stdout)
    topo = topology.parse_probe(facts)
    links = gpu_links(topo, facts.get("nvidia_smi_q"))
    collapse = collapse_of(topo) if collapse_of and topo.gpus else []
    verdict = judge(host_name, probe, links, parse_topo_links(topo_text(stdout)), pairs, collapse)
    return verdict, record(host_name, probe, verdict, time.time())


def collapse_lines(topo: topology.Topology, pairs: Pairs) -> list[str]:
    """The collapse pattern among the PD writes of PAIRS, one phrase per switch
    (pdkit.agent.topology.collapse_flows)."""
    return [f"switch {switch} ({root}) GPUs {', '.join(map(str, writers))} write to {len(dests)} root complexes"
            for switch, root, writers, dests in topology.collapse_flows(topo, list(pairs.concurrent))]


# ---------------------------------------------------------------------------------------------- the deploy


def facts_judging(facts: dict) -> tuple[topology.Topology, dict[int, Link], dict[tuple[int, int], str]]:
    """What judges the probe, from the preflight's facts (roles/node_facts.py: "pcie", the topology
    probe's JSON with `nvidia-smi -q`; "gpus"; "topology", `nvidia-smi topo -m` as NvidiaTopology parses it)."""
    probe = facts.get("pcie")
    topo = topology.parse_probe(probe, (facts.get("gpus") or {}).get("gpus") or None)
    links = gpu_links(topo, (probe or {}).get("nvidia_smi_q"))
    raw = (facts.get("topology") or {}).get("links") or {}
    topo_links = {(int(a), int(b)): v for a, row in raw.items() for b, v in (row or {}).items()}
    return topo, links, topo_links


def record_command(rec: dict, path: str = RECORD_PATH) -> str:
    """Write REC (JSON) to PATH on the node: a temporary name, then an atomic rename."""
    tmp = f"{path}.tmp"
    return (f"mkdir -p {shlex.quote(str(Path(path).parent))} && printf '%s\\n' {shlex.quote(json.dumps(rec))} "
            f"> {shlex.quote(tmp)} && mv {shlex.quote(tmp)} {shlex.quote(path)}")


def measure_before_start(host_name: str, pairs: Pairs, python: str, facts: dict,
                         run: Callable[[str], tuple[bool, str]]) -> tuple[Verdict, str]:
    """The deploy's measurement, before a node's engines first start: the probe with PYTHON through RUN
    (a shell command on the node, as the deploy's operations run -> (ok, stdout)), judged with the
    preflight's FACTS, and the record written to RECORD_PATH. Returns (verdict, the line to print).
    Never raises: a probe that fails is said, the deploy goes on (doctor --bench measures again)."""
    try:
        _, stdout = run(probe_command(python, pairs))
        probe = read_probe(stdout)
        topo, links, topo_links = facts_judging(facts)
        verdict = judge(host_name, probe, links, topo_links, pairs,
                        collapse_lines(topo, pairs) if topo.gpus else [])
        written, _ = run(record_command(record(host_name, probe, verdict, time.time())))
        kept = f"kept in {RECORD_PATH}" if written else f"NOT kept: writing {RECORD_PATH} failed"
    except Exception as exc:  # noqa: BLE001 - evidence only: the engines' own gates decide the deploy
        verdict = Verdict(WARN, f"not measured: {type(exc).__name__}: {exc}", "`pdkit doctor --bench` measures it")
        kept = "nothing kept"
    line = f"pdkit: {host_name}: p2p {verdict.status}: {verdict.reason} ({kept})"
    if verdict.hint:
        line += f"\n  fix: {verdict.hint}"
    return verdict, line
