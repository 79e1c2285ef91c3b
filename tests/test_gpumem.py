"""An engine on shared GPUs waits, before it starts, for the free memory its fraction assumes (issue 42 item 5).

On the lent H200 a decode restarted alone while the GPU's memory was still held logged `avail mem=2.87 GB` and
allocated a 7,452-token KV pool instead of 531,636. pdkit.agent.gpumem (the units' ExecStartPre) holds such a start until
nvidia-smi shows the memory back, and fails it past a bound; tests/test_shared_gpu.py has the start order and split.
"""

from __future__ import annotations

import argparse
import re
import stat
import subprocess
import sys

import pytest

from pdkit.agent import gpumem
from pdkit.inventory.loader import load
from pdkit.render.plan import GPU_FREE_WAIT_S, plan_host
from tests.conftest import REPO

# verbatim: `nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader,nounits`, idle H100
H100_IDLE = (REPO / "tests" / "fixtures" / "nvidia-smi" / "h100-80gb-memory-idle.csv").read_text()
# constructed: the H200 (143771 MiB, tests/node/facts/NvidiaGpus/h200-2x.json) with its prefill serving (0.40 + 1.3 GiB)
H200_PREFILL_UP = "0, NVIDIA H200, 143771, 84890\n"
# the decode restarted while its old process still held the memory: 2.87 GB free (docs/gpu.md, issue 42)
H200_STILL_HELD = "0, NVIDIA H200, 143771, 2939\n"


def test_parse_a_recorded_nvidia_smi_line():
    assert gpumem.parse_smi(H100_IDLE) == {0: gpumem.GpuMemory(0, "NVIDIA H100 80GB HBM3", 81559, 81079)}
    with pytest.raises(gpumem.GpuMemError, match="expected 4 fields"):
        gpumem.parse_smi("0, NVIDIA H200, 143771 MiB\n")
    with pytest.raises(gpumem.GpuMemError, match="must be integers"):
        gpumem.parse_smi("0, NVIDIA H200, 143771 MiB, 2939 MiB\n")  # the query without nounits


def test_an_idle_card_lets_both_engines_of_the_one_gpu_pair_start():
    gpus = gpumem.parse_smi(H100_IDLE)
    # prefill: first on the GPU, counts on all of it, less its own CUDA context
    assert gpumem.shortfalls(gpus, [0], 1.0, 1.0, 2048) == []
    assert gpumem.shortfalls(gpumem.parse_smi(H200_PREFILL_UP), [0], 0.6, 1.0, 4096) == []


def test_memory_still_held_is_named_with_the_gpu_the_free_and_the_needed_mib():
    short = gpumem.shortfalls(gpumem.parse_smi(H200_STILL_HELD), [0], 0.6, 1.0, 4096)
    # 143771 x 0.6 = 86262.6 -> 86262 - 4096 = 82166
    assert short == ["GPU 0 (NVIDIA H200): 2939 MiB free, 82166 MiB needed (143771 MiB x 1 x 0.6 - 4096 MiB margin)"]
    # a prefill restarted while the decode it stopped still holds its share
    assert gpumem.shortfalls(gpumem.parse_smi(H200_PREFILL_UP), [0], 1.0, 1.0, 2048)
    # another host's engines on the GPU (PDKIT_GPU_FREE_BASE): counted out of what this host counts on
    assert gpumem.shortfalls(gpumem.parse_smi(H200_PREFILL_UP), [0], 1.0, 0.5, 2048) == []


def test_an_engine_gpu_nvidia_smi_does_not_list_is_an_error():
    with pytest.raises(gpumem.GpuMemError, match=r"lists GPU\(s\) \[0\], not \[1\]"):
        gpumem.shortfalls(gpumem.parse_smi(H100_IDLE), [0, 1], 0.6, 1.0, 0)


@pytest.mark.parametrize(("short", "waited", "verdict"), [([], 0, "go"), ([], 500, "go"), (["x"], 10, "wait"),
                                                           (["x"], 120, "fail"), (["x"], 121, "fail")])
def test_decide(short, waited, verdict):
    assert gpumem.decide(short, waited, 120) == verdict


def test_the_base_from_the_environment():
    assert gpumem.base_from_env({}) == 1.0
    assert gpumem.base_from_env({"PDKIT_GPU_FREE_BASE": "0.5"}) == 0.5
    for bad in ("0", "1.5", "half"):
        with pytest.raises(gpumem.GpuMemError, match=r"PDKIT_GPU_FREE_BASE=.*a number in \(0, 1\]"):
            gpumem.base_from_env({"PDKIT_GPU_FREE_BASE": bad})


def _args(**kw):
    base = dict(gpus="0", assumes=0.6, margin_mib=4096, timeout=120.0, interval=1.0, unit="pdkit-engine-decode.service",
                base=1.0, nvidia_smi="/usr/bin/nvidia-smi")
    return argparse.Namespace(**{**base, **kw})


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_goes_once_the_memory_is_back_and_says_so_every_10_s():
    clock, lines = Clock(), []
    # free memory moves by a few MiB between polls (seen on the H100: 39593, then 39596 MiB)
    held = [f"0, NVIDIA H200, 143771, {2939 + i}\n" for i in range(25)]
    outputs = iter(held + [H200_PREFILL_UP])
    rc = gpumem.wait(_args(), read=lambda smi: next(outputs), sleep=clock.sleep, clock=clock, log=lines.append)
    assert rc == 0
    # waiting lines at 0, 10 and 20 s, then one "starting"
    assert len(lines) == 4, lines
    assert lines[0].startswith("pdkit.gpumem: pdkit-engine-decode.service: waiting up to 120 s for GPU memory: GPU 0")
    assert "2949 MiB free" in lines[1] and "2959 MiB free" in lines[2]
    assert "after 25.0 s, starting" in lines[3]


def test_wait_fails_the_start_past_its_bound_naming_the_gpu_free_and_needed():
    clock, lines = Clock(), []
    rc = gpumem.wait(_args(), read=lambda smi: H200_STILL_HELD, sleep=clock.sleep, clock=clock, log=lines.append)
    assert rc == gpumem.EXIT_TIMEOUT == 1
    assert clock.t == 120
    assert re.search(r"NOT STARTING after 120 s: GPU 0 \(NVIDIA H200\): 2939 MiB free, 82166 MiB needed", lines[-1])


def _fake_smi(tmp_path, text):
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text.strip()}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _run(tmp_path, text, *extra):
    return subprocess.run([sys.executable, "-m", "pdkit.gpumem", "wait", "--gpus", "0", "--assumes", "0.6",
                           "--margin-mib", "4096", "--interval", "0.05", "--unit", "pdkit-engine-decode.service",
                           "--nvidia-smi", _fake_smi(tmp_path, text), *extra],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_the_command_exits_0_1_or_2(tmp_path):
    assert _run(tmp_path, H200_PREFILL_UP, "--timeout", "5").returncode == 0
    held = _run(tmp_path, H200_STILL_HELD, "--timeout", "0.2")
    assert held.returncode == 1 and "2939 MiB free, 82166 MiB needed" in held.stdout
    wrong = _run(tmp_path, H200_STILL_HELD, "--timeout", "1", "--gpus", "1")
    assert wrong.returncode == 2 and "not [1]" in wrong.stderr


def _units(inventory, monkeypatch, card=None):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PDKIT_GPU_CARD", card or "declared")
    spec = load(f"inventories/{inventory}.py")
    return {f.path.rsplit("/", 1)[-1]: f.content for h in spec.hosts for f in plan_host(spec, h).files
            if f.path.endswith(".service") and "engine" in f.path}


def _pre(unit):
    return [line.replace(" \\\n    ", " ") for line in re.findall(r"^ExecStartPre=(.*?(?:\\\n.*?)*)$", unit, re.M)]


def test_the_shared_engines_units_wait_for_their_memory(monkeypatch):
    units = _units("h200-1gpu", monkeypatch)
    prefill, decode = units["pdkit-engine-prefill.service"], units["pdkit-engine-decode.service"]
    assert _pre(prefill) == ["/opt/pdkit/venv/bin/python -m pdkit.gpumem wait --gpus 0 --assumes 1 --margin-mib 2048 "
                             f"--timeout {GPU_FREE_WAIT_S} --unit pdkit-engine-prefill.service"]
    # the decode: first the prefill serves (it holds its share), then the memory the decode's 0.75 assumes
    assert _pre(decode) == ["/opt/pdkit/venv/bin/python -m pdkit.health gates --http http://127.0.0.1:30000/health 420",
                            "/opt/pdkit/venv/bin/python -m pdkit.gpumem wait --gpus 0 --assumes 0.6 --margin-mib 4096 "
                            f"--timeout {GPU_FREE_WAIT_S} --unit pdkit-engine-decode.service"]
    # systemd's start bound covers every wait: 420 + 120 + 60, and 120 + 60 for the prefill
    assert "TimeoutStartSec=600" in decode and "TimeoutStartSec=180" in prefill


def test_the_two_host_pair_counts_on_half_the_gpu(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PDKIT_GPU_CARD", "declared")
    spec = load("inventories/h200-nspawn-pair.py")
    for host in spec.gpu_hosts:
        for engine in host.node.engines:
            assert engine.env["PDKIT_GPU_FREE_BASE"] == "0.5"


@pytest.mark.parametrize("inventory", ["nspawn-rehearsal", "nspawn-pair-rehearsal", "lab", "cluster"])
def test_no_wait_where_there_is_no_nvidia_smi_or_no_sharing(inventory, monkeypatch):
    # gpu: none (the sim rehearsals, the lab), or engines alone on their GPUs (the seeds' cluster)
    for unit in _units(inventory, monkeypatch).values():
        assert "pdkit.agent.gpumem" not in unit
