"""The P2P bandwidth probe (issue 47 item 3): pair selection, the link's expected rate, the verdict, the
probe's output read back, the deploy's measurement before the engines first start, and the probe
program itself run for real with a torch that has no CUDA (no test here needs a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.agent import topology
from pdkit.hosts import p2p
from pdkit.inventory.loader import load
from pdkit.render.plan import Service
from roles.services import measures_p2p
from tests.conftest import REPO

CORPUS = REPO / "tests/corpus/good"
FIXTURES = REPO / "tests/fixtures/topology"
# a python whose torch has no CUDA (pdkit's contract environment of SGLang 0.5.17: torch 2.13.0+cpu)
CPU_TORCH = Path("/root/.cache/pdkit/contract/sglang-0.5.17/bin/python")


def smi_link_block(bdf: str, gen: int, width: int, host_max: int | None = None, current_gen: int = 1) -> str:
    """One GPU's `nvidia-smi -q` as R580 prints its PCI part (an idle link at Gen1)."""
    host = f"\n                Host Max                          : {host_max}" if host_max else ""
    return f"""GPU 0000{bdf}
    Product Name                                   : NVIDIA RTX PRO 6000 Blackwell Server Edition
    PCI
        Bus                                        : 0x{bdf[5:7]}
        GPU Link Info
            PCIe Generation
                Max                               : {gen}
                Current                           : {current_gen}
                Device Current                    : {current_gen}
                Device Max                        : {gen}{host}
            Link Width
                Max                               : {width}x
                Current                           : {width}x
        Bridge Chip
            Type                                  : N/A
            Firmware                              : N/A
        Replays Since Reset                       : 0
        Tx Throughput                             : 0 KB/s
    Utilization
        GPU                                        : 0 %
"""


def smi_q(gpus: dict[int, str], gen: int = 5, width: int = 16, **kw) -> str:
    return "==============NVSMI LOG==============\n\nAttached GPUs : 8\n" + "".join(
        smi_link_block(bdf, gen, width, **kw) for bdf in gpus.values())


def topo(shape: str) -> topology.Topology:
    probe = json.loads((FIXTURES / f"{shape}.json").read_text())
    return topology.parse_probe(probe, probe["fixture"]["smi_gpus"])


def gen5_links(gpus=range(8)) -> dict[int, p2p.Link]:
    return {i: p2p.Link(5, 16) for i in gpus}


def figs(median: float, lo: float | None = None, hi: float | None = None) -> dict:
    return {"median": median, "min": lo if lo is not None else median - 1, "max": hi if hi is not None else median + 1,
            "n": 5}


def pair(src: int, dst: int, write: float, read: float | None = None, peer: bool = True, **kw) -> dict:
    return {"src": src, "dst": dst, "peer_access": peer, "write_gbps": figs(write),
            "read_gbps": figs(read) if read is not None else None, "read_error": None, "error": None, **kw}


# ------------------------------------------------------------------------------------ the expected rate


@pytest.mark.parametrize(("gen", "width", "expected"), [
    (5, 16, 51.7),  # the community's ~52 GB/s per pair on these boxes
    (4, 16, 25.8),
    (5, 8, 25.8),
    (3, 16, 12.9),
    (6, 16, 99.2),
    (None, 16, None),
    (5, None, None),
    (9, 16, None),
])
def test_expected_rate_per_generation_and_width(gen, width, expected):
    assert p2p.expected_gbps(gen, width) == expected


def test_link_info_is_read_from_nvidia_smi_q_the_max_not_the_idle_current():
    text = smi_q({0: ":01:00.0"}) + smi_link_block(":81:00.0", 5, 16, host_max=4, current_gen=4)
    info = p2p.parse_link_info(text)
    # an idle link trains down to Gen1: the expectation is the highest it trains to
    assert info["0000:01:00.0"] == {"gen": 5, "width": 16, "gen_current": 1, "width_current": 16}
    # a Gen5 card in a Gen4 slot: the host's max is the link's
    assert info["0000:81:00.0"]["gen"] == 4
    assert p2p.parse_link_info("") == {}


def test_a_pairs_link_is_its_slower_ends():
    links = {0: p2p.Link(5, 16), 4: p2p.Link(4, 16), 5: p2p.Link(5, 8), 6: p2p.Link(None, 16)}
    assert p2p.pair_link(links, 0, 4) == p2p.Link(4, 16)
    assert p2p.pair_link(links, 0, 5) == p2p.Link(5, 8)
    assert p2p.pair_link(links, 0, 6) == p2p.Link(None, 16)
    assert p2p.pair_link(links, 0, 7) == p2p.Link(None, None)


def test_topo_m_links_and_nvlink():
    text = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\tSYS\t0-63\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tSYS\t0-63\t0\t\tN/A\n"
            "GPU2\tSYS\tSYS\t X \t64-127\t1\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    links = p2p.parse_topo_links(text)
    assert links[(0, 1)] == "NV18" and links[(1, 0)] == "NV18"
    assert links[(0, 2)] == "SYS" and (0, 0) not in links
    assert p2p.parse_topo_links("nvidia-smi: command not found") == {}


# ------------------------------------------------------------------------------------ which pairs


def test_the_users_box_measures_rank_for_rank_kv_writes_and_each_tp_group():
    spec = load(str(CORPUS / "pd-8gpu-numa-halves.py"))
    pairs = p2p.node_pairs(spec.host("gpu01"))
    # prefill TP4 on 0-3 writes rank for rank into decode TP4 on 4-7, all at once
    assert pairs.concurrent == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert pairs.flows[(0, 4)] == ("KV prefill -> decode",)
    # each TP4 group: every GPU to every other, inside its NUMA half only
    assert pairs.flows[(1, 2)] == ("TP prefill",) and pairs.flows[(7, 4)] == ("TP decode",)
    assert len(pairs.flows) == 4 + 12 + 12
    assert not any(a < 4 <= b or b < 4 <= a for a, b in pairs.flows if pairs.flows[(a, b)] != ("KV prefill -> decode",))
    assert pairs.gpus == tuple(range(8))


def test_a_pair_both_kv_and_tp_is_measured_once_with_both_reasons():
    pairs = p2p.select_pairs([("p", (0, 1), "d", (1, 0), True)], [("p", (0, 1))])
    assert pairs.flows[(0, 1)] == ("KV p -> d", "TP p")
    assert pairs.pairs == [(0, 1), (1, 0)]


def test_an_engine_with_dp_writes_every_prefill_gpu_to_every_decode_gpu():
    pairs = p2p.select_pairs([("p", (0, 1), "d", (2, 3), False)], [])
    assert sorted(pairs.concurrent) == [(0, 2), (0, 3), (1, 2), (1, 3)]


def test_a_one_gpu_node_has_no_pair_and_the_probe_is_asked_for_the_device_copy():
    spec = load(str(CORPUS / "pd-shared-1gpu.py"))
    pairs = p2p.node_pairs(spec.host("gpu01"))
    assert pairs.flows == {} and pairs.concurrent == () and pairs.gpus == (0,)
    command = p2p.probe_command("/opt/pdkit/engine-venv/bin/python", pairs)
    # the arguments after the source (whose docstring names them too)
    assert command.endswith("' --mib 256 --iters 5 2>&1 || true")


def test_the_probe_command_runs_the_engine_python_bounded_and_never_fails():
    pairs = p2p.select_pairs([("p", (0, 1), "d", (2, 3), True)], [])
    command = p2p.probe_command("/opt/pdkit/engine-venv/bin/python", pairs, mib=64, iters=3)
    assert command.startswith(f"timeout -k 10 {p2p.PROBE_TIMEOUT_S} /opt/pdkit/engine-venv/bin/python -c ")
    assert "--pairs 0:2,1:3 --concurrent 0:2,1:3" in command and "--mib 64 --iters 3" in command
    assert command.endswith("|| true")


# ------------------------------------------------------------------------------------ the probe's output


def test_read_probe_good_error_and_garbage():
    good = {"format": 1, "pairs": [pair(0, 4, 50.0)]}
    assert p2p.read_probe("noise\n" + p2p.MARK + json.dumps(good) + "\n") == good
    assert p2p.read_probe(p2p.MARK + json.dumps({"error": "CUDA is not available"}))["error"] == "CUDA is not available"
    assert p2p.read_probe(p2p.MARK + "{not json")["error"].startswith("unreadable probe output")
    assert p2p.read_probe(p2p.MARK + "[1, 2]")["error"].startswith("unreadable probe output")
    missing = p2p.read_probe("bash: /opt/pdkit/engine-venv/bin/python: No such file or directory\n")
    assert missing["error"] == ("the probe printed no result: bash: /opt/pdkit/engine-venv/bin/python: "
                                "No such file or directory")
    assert p2p.read_probe("")["error"] == "the probe printed no result: no output"


# ------------------------------------------------------------------------------------ the verdict


def test_pairs_at_their_links_rate_pass_with_the_figures():
    probe = {"pairs": [pair(0, 4, 50.3, 48.0), pair(1, 5, 49.1, 47.5)]}
    v = p2p.judge("gpu01", probe, gen5_links())
    assert v.status == p2p.PASS
    assert v.reason == "2 pair(s) at >= 50% of their link's rate (writes 49.1-50.3 GB/s median)"
    assert v.lines[0] == ("GPU 0 -> 4: write 50.3 GB/s (min 49.3, max 51.3) of 51.7 GB/s expected on PCIe Gen5 x16; "
                          "read 48.0 GB/s (min 47.0, max 49.0) of 51.7 GB/s expected on PCIe Gen5 x16")


def test_a_slow_pair_warns_naming_the_pair_the_figures_and_what_to_change():
    pairs = p2p.select_pairs([("prefill", (0, 1), "decode", (4, 5), True)], [])
    probe = {"pairs": [pair(0, 4, 50.0), pair(1, 5, 11.0)]}
    v = p2p.judge("gpu01", probe, gen5_links(), pairs=pairs)
    assert v.status == p2p.WARN
    assert "GPU 1 -> 5 write 11.0 GB/s < 50% of 51.7 GB/s (PCIe Gen5 x16)" in v.reason
    assert "pdkit_node.engines[].gpus" in v.hint and "pcie-p2p-off" in v.hint
    assert any(line.startswith("GPU 1 -> 5 (KV prefill -> decode): write 11.0") and "SLOW" in line for line in v.lines)


def test_the_collapse_shows_in_the_concurrent_writes_and_the_fix_names_the_pattern():
    t = topo("switch-two-roots")
    # prefill's switch 0000:01:00.0 (GPUs 0, 1) writes into decode GPUs behind two root complexes
    pairs = p2p.select_pairs([("prefill", (0, 1, 2, 3), "decode", (4, 6, 5, 7), True)], [])
    collapse = p2p.collapse_lines(t, pairs)
    assert collapse[0] == "switch 0000:01:00.0 (pci0000:00) GPUs 0, 1 write to 2 root complexes"
    probe = {"pairs": [pair(a, b, 51.0) for a, b in pairs.concurrent],
             "concurrent": {"pairs": [{"src": a, "dst": b, "write_gbps": figs(9.0)} for a, b in pairs.concurrent],
                            "error": None}}
    v = p2p.judge("gpu01", probe, gen5_links(), pairs=pairs, collapse=collapse)
    assert v.status == p2p.WARN
    assert "4 slow: GPU 0 -> 4 write together 9.0 GB/s < 50% of 51.7 GB/s" in v.reason
    assert v.hint.startswith("the preflight found the posted-write collapse pattern here (switch 0000:01:00.0")
    assert "decode GPUs behind one root complex" in v.hint


def test_no_peer_access_warns_that_the_copy_goes_through_host_memory():
    v = p2p.judge("gpu01", {"pairs": [pair(0, 4, 40.0, peer=False)]}, gen5_links())
    assert v.status == p2p.WARN
    assert "no P2P access for GPU 0 -> 4 (the copies go through host memory)" in v.reason
    assert "ACS and IOMMU" in v.hint
    assert v.lines[0].endswith("; no P2P access: copied through host memory")


def test_a_probe_that_could_not_run_warns_with_its_reason():
    v = p2p.judge("gpu01", {"error": "CUDA is not available to torch 2.13.0+cpu (built for CUDA None) on this node"})
    assert v.status == p2p.WARN
    assert v.reason == "not measured: CUDA is not available to torch 2.13.0+cpu (built for CUDA None) on this node"
    assert v.hint.startswith("on gpu01: run the engine environment's python with torch and CUDA")


def test_a_pair_that_failed_warns_and_the_others_are_still_judged():
    probe = {"pairs": [pair(0, 4, 50.0), {"src": 1, "dst": 5, "error": "OutOfMemoryError: CUDA out of memory"}]}
    v = p2p.judge("gpu01", probe, gen5_links())
    assert v.status == p2p.WARN
    assert "1 not measured: GPU 1 -> 5: OutOfMemoryError: CUDA out of memory" in v.reason
    assert "free GPU memory" in v.hint


def test_one_gpu_reports_the_device_copy_and_that_no_pair_exists():
    probe = {"pairs": [], "no_pair": "one GPU on this node: no GPU pair exists",
             "device_copy": {"gpu": 0, "gbps": figs(1480.2, 1470.0, 1490.5), "error": None}}
    v = p2p.judge("gpu01", probe)
    assert v.status == p2p.INFO
    assert v.reason == ("one GPU on this node: no GPU pair exists; device copy on GPU 0: "
                        "1480.2 GB/s (min 1470.0, max 1490.5)")


def test_nvlink_pairs_and_unknown_links_are_not_judged_against_pcie():
    probe = {"pairs": [pair(0, 1, 5.0)]}
    v = p2p.judge("h200", probe, gen5_links(), topo_links={(0, 1): "NV18"})
    assert v.status == p2p.INFO and "NVLink NV18: not judged against PCIe" in v.reason
    v = p2p.judge("h200", probe, {})
    assert v.status == p2p.INFO and "link rate unknown: not judged" in v.reason


def test_the_link_from_the_topology_probes_facts():
    t = topo("numa-halves-own-root")
    bdfs = {i: g.bdf[4:] for i, g in t.gpus.items()}
    links = p2p.gpu_links(t, smi_q(bdfs, gen=5, width=16))
    assert links == gen5_links()
    assert p2p.gpu_links(t, None)[0] == p2p.Link(None, None)


# ------------------------------------------------------------------------------------ the deploy


def deploy_facts(shape: str = "numa-halves-own-root") -> dict:
    probe = json.loads((FIXTURES / f"{shape}.json").read_text())
    t = topology.parse_probe(probe, probe["fixture"]["smi_gpus"])
    probe = {**probe, "nvidia_smi_q": smi_q({i: g.bdf[4:] for i, g in t.gpus.items()})}
    return {"pcie": probe, "gpus": {"available": True, "error": None, "gpus": probe["fixture"]["smi_gpus"]},
            "topology": {"links": {"0": {"4": "SYS"}, "4": {"0": "SYS"}}}}


def test_the_deploy_measures_judges_with_the_preflight_facts_and_keeps_the_record():
    pairs = p2p.select_pairs([("prefill", (0, 1), "decode", (4, 5), True)], [])
    sent = []

    def run(command):
        sent.append(command)
        if len(sent) == 1:
            return True, p2p.MARK + json.dumps({"pairs": [pair(0, 4, 50.0, 47.0), pair(1, 5, 12.0, 45.0)]})
        return True, ""

    verdict, line = p2p.measure_before_start("gpu01", pairs, "/opt/pdkit/engine-venv/bin/python", deploy_facts(), run)
    assert verdict.status == p2p.WARN
    assert line.startswith("pdkit: gpu01: p2p WARN: 2 pair(s): 1 slow: GPU 1 -> 5 write 12.0 GB/s < 50% of 51.7 GB/s")
    assert "(kept in /var/lib/pdkit-node/p2p.json)" in line and "\n  fix: " in line
    assert sent[0].startswith("timeout -k 10 300 /opt/pdkit/engine-venv/bin/python -c ")
    assert "> /var/lib/pdkit-node/p2p.json.tmp && mv /var/lib/pdkit-node/p2p.json.tmp /var/lib/pdkit-node/p2p.json" \
        in sent[1]
    # the record the node keeps: the probe's answer and the verdict, readable back as JSON
    written = subprocess.run(["bash", "-c", sent[1].replace("/var/lib/pdkit-node", "/tmp/pdkit-p2p-test")
                              + " && cat /tmp/pdkit-p2p-test/p2p.json"], capture_output=True, text=True, check=True)
    rec = json.loads(written.stdout)
    assert rec["host"] == "gpu01" and rec["verdict"]["status"] == "WARN" and rec["probe"]["pairs"][1]["src"] == 1


def test_the_deploy_goes_on_when_the_probe_cannot_be_run():
    def run(command):
        raise OSError("SSH channel closed")

    verdict, line = p2p.measure_before_start("gpu01", p2p.Pairs({}, (), (0,)), "/x/python", {}, run)
    assert verdict.status == p2p.WARN
    assert line == ("pdkit: gpu01: p2p WARN: not measured: OSError: SSH channel closed (nothing kept)\n"
                    "  fix: `pdkit doctor --bench` measures it")


def _engine(unit: str) -> Service:
    return Service(unit=unit, kind="engine", files=(), health_url="http://x/health", ready_timeout_s=60)


def test_the_deploy_measures_only_before_the_engines_first_start_on_a_real_nvidia_node():
    spec = load(str(CORPUS / "pd-8gpu-numa-halves.py"))
    this = spec.host("gpu01")
    engines = [_engine("pdkit-engine-prefill.service"), _engine("pdkit-engine-decode.service")]
    stopped = {"units": {}}
    running = {"units": {"pdkit-engine-decode.service": ["loaded", "active", "enabled"]}}
    assert measures_p2p(spec, this, engines, stopped)
    # one engine serves: its GPUs' memory and links are taken; doctor --bench measures then
    assert not measures_p2p(spec, this, engines, running)
    # nothing (re)starts: nothing to measure before
    assert not measures_p2p(spec, this, [], stopped)
    sim = load(str(CORPUS / "sim-engine.py"))
    assert not measures_p2p(sim, sim.gpu_hosts[0], engines, stopped)


# ------------------------------------------------------------------------------------ the probe program


def run_probe(python: str, *args: str) -> subprocess.CompletedProcess:
    # as the node runs it: the source through -c
    return subprocess.run([python, "-c", p2p.probe_source(), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not CPU_TORCH.exists(), reason=f"{CPU_TORCH} (a CPU-only torch) is not on this machine")
def test_the_probe_with_a_torch_without_cuda_prints_the_json_error_not_a_traceback():
    done = run_probe(str(CPU_TORCH), "--pairs", "0:4,1:5", "--concurrent", "0:4,1:5")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    probe = p2p.read_probe(done.stdout)
    assert probe["error"].startswith("CUDA is not available to torch 2.") and "(built for CUDA None)" in probe["error"]
    assert probe["pairs"] == [] and probe["bytes"] == 256 << 20 and probe["iters"] == 5
    v = p2p.judge("gpu01", probe)
    assert v.status == p2p.WARN and v.reason.startswith("not measured: CUDA is not available to torch")


def test_the_probe_without_torch_and_with_bad_arguments_says_so():
    done = run_probe(sys.executable, "--pairs", "0:1")
    probe = p2p.read_probe(done.stdout)
    if "torch" in sys.modules or not probe["error"].startswith("torch is not importable"):
        pytest.skip(f"{sys.executable} has torch")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr
    assert probe["error"].startswith(f"torch is not importable by {sys.executable}: ModuleNotFoundError")
    bad = p2p.read_probe(run_probe(sys.executable, "--pairs", "zero:1").stdout)
    assert bad["error"].startswith("bad arguments ['--pairs', 'zero:1']: invalid literal for int()")
