"""No change onto a wedged GPU (issue 47 item 4): pdkit.hosts.gpuhealth.restart_check on the probe's recorded
shapes (tests/fixtures/topology/), and the roll's refusal before its drain (pdkit.roll.roller)."""

from __future__ import annotations

import json
import os

import pytest

from pdkit.agent import topology
from pdkit.hosts import gpuhealth
from pdkit.inventory.loader import load
from tests.conftest import REPO, write_inventory

FIXTURES = REPO / "tests" / "fixtures" / "topology"


def _answer(name: str):
    """A node's answer to the probe command: the fixture's JSON after the probe's mark, as the probe prints it."""
    text = f"some stderr noise\n{topology.PROBE_MARK}{(FIXTURES / name).read_text().replace(chr(10), ' ')}\n"

    def run(command: str):
        assert command == gpuhealth.probe_command()
        return True, text, ""
    return run


def _spec(tmp_path, base, gpus=None, engine="sglang", gpu=None):
    cluster, hosts = base
    cluster["engine"] = engine
    node = hosts["gpu01"]["pdkit_node"]
    if gpus is not None:
        node["gpus"] = {**node["gpus"], "count": 8, "numa": [0, 0, 0, 0, 1, 1, 1, 1]}
        node["engines"][0]["gpus"], node["engines"][1]["gpus"] = gpus
    if gpu is not None:
        node["gpu"] = gpu
    return load(str(write_inventory(tmp_path, hosts, cluster)))


def test_an_engine_on_a_gpu_that_fell_off_the_bus_is_refused_naming_the_gpu_and_what_was_seen(tmp_path, base):
    # the wedged box: GPU 2 off the bus (Xid 79), 5 a pending row remap, 7 a recovery action 'GPU Reset'
    spec = _spec(tmp_path, base)  # prefill [0, 1], decode [2, 3]
    wedged, said = gpuhealth.restart_check(spec, "gpu01", _answer("wedged-gpus.json"))
    assert [w.index for w in wedged] == [2]
    assert "gpu01: GPU 2 (" in said and "Xid 79" in said and "fallen off the bus" in said


def test_each_wedged_sign_refuses_the_gpus_engines_use_and_only_those(tmp_path, base):
    spec = _spec(tmp_path, base, gpus=([4, 5], [6, 7]))
    wedged, said = gpuhealth.restart_check(spec, "gpu01", _answer("wedged-gpus.json"))
    assert [w.index for w in wedged] == [5, 7], said
    assert "row remapping pending" in said and "GPU Recovery Action 'GPU Reset'" in said
    # GPU 6 is at 100% with no process: while the node's own engines serve (a roll), that is their load and,
    # in a container, nvidia-smi lists no process of another PID namespace: not a sign of a wedge there
    assert "GPU 6" not in said


def test_the_busy_gpu_with_no_process_counts_where_no_engine_serves():
    topo = topology.parse_probe(json.loads((FIXTURES / "wedged-gpus.json").read_text()))
    assert 6 in [w.index for w in topology.wedged_gpus(topo)]
    assert 6 not in [w.index for w in topology.wedged_gpus(topo, engines_serving=True)]


def test_healthy_gpus_pass_and_say_what_was_read(tmp_path, base):
    spec = _spec(tmp_path, base, gpus=([0, 1], [4, 5]))
    wedged, said = gpuhealth.restart_check(spec, "gpu01", _answer("numa-halves-own-root.json"))
    assert wedged == [] and said.startswith("GPU 0, 1, 4, 5: no reset-class Xid")
    # the same healthy GPUs of the wedged box (0, 1, 3, 4) pass too: a wedge elsewhere is the preflight's warning
    spec = _spec(tmp_path, base, gpus=([0, 1], [3, 4]))
    assert gpuhealth.restart_check(spec, "gpu01", _answer("wedged-gpus.json"))[0] == []


@pytest.mark.parametrize("run, phrase", [
    (lambda cmd: (False, "", "python3: command not found"), "python3: command not found"),
    (lambda cmd: (True, "nothing useful\n", ""), "the probe printed no result: nothing useful"),
    (lambda cmd: (True, f"{topology.PROBE_MARK}{{not json\n", ""), "unreadable probe output"),
])
def test_a_node_that_cannot_tell_is_said_never_refused(tmp_path, base, run, phrase):
    spec = _spec(tmp_path, base)
    wedged, said = gpuhealth.restart_check(spec, "gpu01", run)
    assert wedged == [] and said.startswith("GPU health not read (") and phrase in said


def test_a_broken_connection_is_said_never_refused(tmp_path, base):
    def broken(cmd):
        raise OSError("ssh went away")
    assert gpuhealth.restart_check(_spec(tmp_path, base), "gpu01", broken) == ([], "GPU health not read (ssh went away)")


@pytest.mark.parametrize("kw", [{"engine": "sim"}, {"gpu": "none"}])
def test_the_sim_and_a_node_without_gpus_read_nothing(tmp_path, base, kw):
    def never(cmd):
        raise AssertionError("nothing to read")
    assert gpuhealth.restart_check(_spec(tmp_path, base, **kw), "gpu01", never) == ([], "")


def test_the_roll_stops_before_its_drain_on_a_wedged_gpu(tmp_path, base, monkeypatch):
    """Roller.check_gpu_health_before_drain (roll_batch runs it before the weights step and the drain): a
    wedged GPU raises the roll's own RollError, naming the node, the gate and the GPU; a healthy node says
    what was read."""
    from pdkit.roll import roller as roller_mod
    from pdkit.roll.planning import RollError

    spec = _spec(tmp_path, base)
    inv = str(tmp_path / "inventory.py")
    answer = _answer("wedged-gpus.json")
    monkeypatch.setattr(roller_mod, "run_remote", lambda host, cmd, timeout=900: answer(cmd))
    r = roller_mod.Roller(inv, spec, roller_mod.Progress(open(os.devnull, "w")))
    with pytest.raises(RollError) as err:
        r.check_gpu_health_before_drain("gpu01", object())
    assert err.value.host == "gpu01" and err.value.gate == "gpu-health"
    assert "GPU 2" in err.value.message and "nothing was changed" in err.value.message
    assert "nvidia-smi -r -i INDEX" in err.value.message
    healthy = _answer("numa-halves-own-root.json")
    monkeypatch.setattr(roller_mod, "run_remote", lambda host, cmd, timeout=900: healthy(cmd))
    assert r.check_gpu_health_before_drain("gpu01", object()).startswith("GPU 0, 1, 2, 3: no reset-class Xid")
