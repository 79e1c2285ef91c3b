"""The GPU-tier inventories take the card the lent machine has (gpu/card.py), and the preflight still refuses a
mismatch: an `nvidia-h200` device call is often served by an H100 80GB (issue 42 item 7).

Fixtures: the H100 lines are verbatim nvidia-smi output of a lent H100 (tests/fixtures/nvidia-smi/README.md); the
H200's figures are those its preflight recorded (tests/node/facts/NvidiaGpus/h200-2x.json).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest

from pdkit.hosts.preflight import check_host
from pdkit.inventory.loader import load, load_with_problems
from pdkit.spec import shared_gpu_mem_fraction
from tests.conftest import REPO

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
H100_CARD = (SMI / "h100-80gb-card.csv").read_text()  # "NVIDIA H100 80GB HBM3, 81559 MiB, 9.0"
H200_CARD = "NVIDIA H200, 143771 MiB, 9.0\n"
NODE_FACTS = REPO / "tests" / "node" / "facts"
# every GPU-tier inventory, and the rehearsals built on them
INVENTORIES = ["h200", "h200-1gpu", "h200-nspawn", "h200-local", "h200x8", "h200-nspawn-pair",
               "nspawn-rehearsal", "nspawn-pair-rehearsal"]


def _card_module():
    spec = importlib.util.spec_from_file_location("pdkit_gpu_card_test", REPO / "gpu" / "card.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


card = _card_module()
DECLARED = {"model": "NVIDIA H200", "count": 2, "memory_gib": 141, "compute_capability": "9.0"}


def test_a_recorded_h100_line_becomes_the_inventorys_card():
    gpus = card.machine_gpus(DECLARED, environ={}, smi=lambda: H100_CARD)
    assert gpus == {"model": "NVIDIA H100 80GB HBM3", "count": 2, "memory_gib": 80, "compute_capability": "9.0"}
    # the H200's own line gives back exactly what the inventories declared by hand
    assert card.machine_gpus(DECLARED, environ={}, smi=lambda: H200_CARD) == DECLARED


def test_without_gpus_or_with_declared_the_inventory_keeps_its_card():
    assert card.machine_gpus(DECLARED, environ={}, smi=lambda: None) == DECLARED
    assert card.machine_gpus(DECLARED, environ={"PDKIT_GPU_CARD": "declared"}, smi=lambda: H100_CARD) == DECLARED


def test_the_environment_wins_over_nvidia_smi_and_a_bad_value_is_named():
    gpus = card.machine_gpus(DECLARED, environ={"PDKIT_GPU_CARD": H100_CARD.strip()}, smi=lambda: H200_CARD)
    assert gpus["model"] == "NVIDIA H100 80GB HBM3" and gpus["memory_gib"] == 80
    # the brief form without the compute capability keeps the declared one
    assert card.machine_gpus(DECLARED, environ={"PDKIT_GPU_CARD": "NVIDIA H100 80GB HBM3, 81559 MiB"},
                             smi=lambda: None)["compute_capability"] == "9.0"
    with pytest.raises(card.CardError, match=r"PDKIT_GPU_CARD='H100'.*valid is one line of `nvidia-smi"):
        card.machine_gpus(DECLARED, environ={"PDKIT_GPU_CARD": "H100"}, smi=lambda: None)
    with pytest.raises(card.CardError, match="PDKIT_GPU_CARD=detect: nvidia-smi is absent"):
        card.machine_gpus(DECLARED, environ={"PDKIT_GPU_CARD": "detect"}, smi=lambda: None)
    with pytest.raises(card.CardError, match="different models"):
        card.machine_gpus(DECLARED, environ={}, smi=lambda: H100_CARD + H200_CARD)


@pytest.mark.parametrize("name", INVENTORIES)
@pytest.mark.parametrize(("line", "model", "gib"), [(H100_CARD, "NVIDIA H100 80GB HBM3", 80), (H200_CARD, "NVIDIA H200", 141)])
def test_every_gpu_inventory_loads_and_validates_on_either_card(name, line, model, gib, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PDKIT_GPU_CARD", line.strip())
    spec, found = load_with_problems(f"inventories/{name}.py", cwd=str(REPO))
    assert spec is not None and not [p for p in found if p.severity == "error"], found
    for host in spec.gpu_hosts:
        assert (host.node.gpus.model, host.node.gpus.memory_gib, host.node.gpus.compute_capability) == (model, gib, "9.0")


def _fake_nvidia_smi(tmp_path: Path, text: str) -> str:
    """A directory whose nvidia-smi prints TEXT, as the lent machine's does for the card query."""
    binary = tmp_path / "nvidia-smi"
    binary.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text.strip()}\nEOF\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


def test_on_the_gpu_machine_the_inventory_reads_nvidia_smi_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("PDKIT_GPU_CARD", raising=False)
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, H100_CARD) + os.pathsep + os.environ["PATH"])
    spec = load("inventories/h200-nspawn.py")
    assert spec.gpu_hosts[0].node.gpus.model == "NVIDIA H100 80GB HBM3"


def test_the_shares_fit_an_80_gb_card(monkeypatch):
    """The one-GPU pair's fractions on an H100 80GB: the model (1.8 GB) and a KV pool fit each share."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PDKIT_GPU_CARD", H100_CARD.strip())
    for name in ("h200-1gpu", "h200-nspawn"):
        host = load(f"inventories/{name}.py").gpu_hosts[0]
        total_gb = 81559 / 1024
        shares = [e.gpu_share for e in host.node.engines]
        assert sum(shares) <= 0.9
        # each engine's share of the card leaves room beside the 1.8 GB of weights for a KV pool of >= 25 GB
        assert all(s * total_gb - 1.8 >= 25 for s in shares)
        assert [shared_gpu_mem_fraction(host, e) for e in host.node.engines] == [0.4, 0.75]


def _facts(nvidia_gpus_case: str) -> dict:
    """One-GPU facts: the recorded NvidiaGpus case, the PCI listing of its one GPU, the H200's driver."""
    smi = json.loads((NODE_FACTS / "NvidiaGpus" / f"{nvidia_gpus_case}.json").read_text())["fact"]
    smi = {**smi, "gpus": smi["gpus"][:1]}
    pci = [{"bus_id": "0000:00:06.0", "class": "0x030200", "numa_node": -1}]
    return {"os": {"id": "ubuntu", "version_id": "24.04"}, "arch": "x86_64", "kernel": "6.8.0", "gpus": smi,
            "driver": "580.159.04", "module": {"loaded": True, "open": True, "version": "580.159.04"},
            "pci_gpus": pci, "numa_cpus": {0: "0-15"}, "nics": [], "topology": None, "reboot_required": None}


def _gpu_findings(monkeypatch, setting: str, facts_case: str) -> list[str]:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PDKIT_GPU_CARD", setting)
    spec = load("inventories/h200-1gpu.py")
    host = spec.gpu_hosts[0]
    return [f"{f.check} {f.severity}: {f.message}" for f in check_host(spec, host, _facts(facts_case))
            if f.check.startswith("gpu")]


@pytest.mark.parametrize(("setting", "facts_case"), [(H100_CARD.strip(), "h100-80gb-1x"), (H200_CARD.strip(), "h200-2x"),
                                                     ("declared", "h200-2x")])
def test_preflight_accepts_the_matching_card(setting, facts_case, monkeypatch):
    assert _gpu_findings(monkeypatch, setting, facts_case) == []


@pytest.mark.parametrize(("setting", "facts_case", "declared", "reported"), [
    # the inventory as written (or told `declared`) on an H100: refused, naming both
    ("declared", "h100-80gb-1x", "NVIDIA H200", "NVIDIA H100 80GB HBM3"),
    (H200_CARD.strip(), "h100-80gb-1x", "NVIDIA H200", "NVIDIA H100 80GB HBM3"),
    # a card taken from elsewhere than the node: still compared with the node's own nvidia-smi
    (H100_CARD.strip(), "h200-2x", "NVIDIA H100 80GB HBM3", "NVIDIA H200"),
])
def test_preflight_refuses_a_card_the_node_does_not_have(setting, facts_case, declared, reported, monkeypatch):
    found = _gpu_findings(monkeypatch, setting, facts_case)
    assert any(f.startswith("gpu-model error") and repr(declared) in f and repr(reported) in f for f in found), found
    assert any(f.startswith("gpu-memory warning") for f in found), found
