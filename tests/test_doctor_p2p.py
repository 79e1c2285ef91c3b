"""Doctor's `p2p` row (issue 47 item 3, `pdkit doctor --bench`): the verdicts as rows, and the node read over
SSH with pyinfra's connection faked (the command it sends, what it makes of the answer). No GPU, no SSH."""

from __future__ import annotations

import json

import pytest

import pdkit.roll.pyinfra_api as pyinfra_api
from pdkit.agent import topology
from pdkit.doctor.checks_p2p import check_p2p, p2p_hosts, read_p2p
from pdkit.doctor.model import INFO, PASS, WARN
from pdkit.hosts import p2p
from pdkit.hosts.gpuhealth import probe_command as topology_probe_command
from pdkit.inventory.loader import load
from pdkit.render import flags
from tests.conftest import REPO
from tests.test_p2p import FIXTURES, figs, pair, smi_q

CORPUS = REPO / "tests/corpus/good"


def test_each_verdict_is_a_node_row_named_p2p():
    ok = check_p2p("gpu01", p2p.Verdict(p2p.PASS, "4 pair(s) at >= 50% of their link's rate", "ignored on a pass"))
    assert (ok.host, ok.target, ok.check, ok.status, ok.hint) == ("gpu01", "node", "p2p", PASS, "ignored on a pass")
    slow = check_p2p("gpu01", p2p.Verdict(p2p.WARN, "1 slow: GPU 1 -> 5 write 11.0 GB/s", "regroup the GPUs"))
    assert (slow.status, slow.reason, slow.hint) == (WARN, "1 slow: GPU 1 -> 5 write 11.0 GB/s", "regroup the GPUs")
    one = check_p2p("gpu01", p2p.Verdict(p2p.INFO, "one GPU on this node: no GPU pair exists; device copy ..."))
    assert one.status == INFO


def test_only_nvidia_nodes_with_a_real_engine_are_measured():
    assert [h.name for h in p2p_hosts(load(str(CORPUS / "pd-8gpu-numa-halves.py")))] == ["gpu01"]
    assert p2p_hosts(load(str(CORPUS / "sim-engine.py"))) == []


def node_answer(write: float) -> str:
    """What the node prints for node_read_command on the users' box: the topology probe (with each GPU's
    link in nvidia-smi -q), topo -m, and the P2P probe's line."""
    probe = json.loads((FIXTURES / "numa-halves-own-root.json").read_text())
    t = topology.parse_probe(probe, probe["fixture"]["smi_gpus"])
    probe["nvidia_smi_q"] = smi_q({i: g.bdf[4:] for i, g in t.gpus.items()})
    answer = {"pairs": [pair(a, b, write, write - 2) for a, b in ((0, 4), (1, 5), (2, 6), (3, 7))],
              "concurrent": {"pairs": [{"src": a, "dst": b, "write_gbps": figs(write)} for a, b in
                                       ((0, 4), (1, 5), (2, 6), (3, 7))], "error": None}}
    return (f"{topology.PROBE_MARK}{json.dumps(probe)}\n{p2p.TOPO_BEGIN}\n\tGPU0\tGPU4\n"
            f"GPU0\t X \tSYS\nGPU4\tSYS\t X \n{p2p.TOPO_END}\n{p2p.MARK}{json.dumps(answer)}\n")


class FakePyinfra:
    def __init__(self, inventory, reachable=True):
        self.inventory = inventory
        self.reachable = reachable

    def connect(self, hosts):
        if self.reachable:
            return None, {h: f"conn-{h}" for h in hosts}, {}
        return None, {}, {h: "Connection refused" for h in hosts}


@pytest.mark.parametrize(("write", "status"), [(50.0, PASS), (9.0, WARN)])
def test_doctor_reads_each_node_over_ssh_with_the_engine_python_and_judges_it(monkeypatch, write, status):
    spec = load(str(CORPUS / "pd-8gpu-numa-halves.py"))
    sent = []

    def run_remote(conn, command, timeout=900):
        sent.append((conn, command, timeout))
        return True, node_answer(write), ""

    monkeypatch.setattr(pyinfra_api, "Pyinfra", FakePyinfra)
    monkeypatch.setattr(pyinfra_api, "run_remote", run_remote)
    said = []
    rows = read_p2p(spec, "inv.py", said.append)
    assert [(r.host, r.check, r.status) for r in rows] == [("gpu01", "p2p", status)]
    conn, command, timeout = sent[0]
    assert conn == "conn-gpu01" and timeout == p2p.PROBE_TIMEOUT_S + 120
    # one round trip: the topology probe, topo -m and the P2P probe with the engine environment's python
    assert command.startswith(topology_probe_command())
    assert f"{flags.engine_python(spec, spec.host('gpu01'))} -c " in command and "nvidia-smi topo -m" in command
    assert said == ["measuring GPU-to-GPU copies on gpu01 (pdkit/hosts/p2p_probe.py over SSH)"]
    if status == PASS:
        assert rows[0].reason == "4 pair(s) at >= 50% of their link's rate (writes 50.0-50.0 GB/s median)"
    else:
        assert rows[0].reason.startswith("4 pair(s): 12 slow: GPU 0 -> 4 write 9.0 GB/s < 50% of 51.7 GB/s "
                                         "(PCIe Gen5 x16)")
        assert "pdkit_node.engines[].gpus" in rows[0].hint


def test_a_node_doctor_cannot_reach_warns_naming_why(monkeypatch):
    spec = load(str(CORPUS / "pd-8gpu-numa-halves.py"))
    monkeypatch.setattr(pyinfra_api, "Pyinfra", lambda inventory: FakePyinfra(inventory, reachable=False))
    rows = read_p2p(spec, "inv.py")
    assert [(r.host, r.status, r.reason) for r in rows] == [
        ("gpu01", WARN, "not measured: no SSH connection (Connection refused)")]
    assert rows[0].hint == "make gpu01 reachable over SSH as the inventory says and re-run"


def test_a_node_without_the_engine_environment_warns_not_measured(monkeypatch):
    spec = load(str(CORPUS / "pd-8gpu-numa-halves.py"))
    monkeypatch.setattr(pyinfra_api, "Pyinfra", FakePyinfra)
    monkeypatch.setattr(pyinfra_api, "run_remote", lambda conn, command, timeout=900: (
        True, "timeout: failed to run command '/opt/pdkit/engine-venv/bin/python': No such file or directory\n", ""))
    rows = read_p2p(spec, "inv.py")
    assert rows[0].status == WARN
    assert rows[0].reason == ("not measured: the probe printed no result: timeout: failed to run command "
                              "'/opt/pdkit/engine-venv/bin/python': No such file or directory")


def test_the_sim_cluster_gets_no_row_and_never_connects(monkeypatch):
    def refuse(inventory):
        raise AssertionError("connected for a cluster with nothing to measure")

    monkeypatch.setattr(pyinfra_api, "Pyinfra", refuse)
    assert read_p2p(load(str(CORPUS / "sim-engine.py")), "inv.py") == []
