"""pdkit/agent/residency.py on this machine's real kernel: mincore over a mapping of real files, evicted
with POSIX_FADV_DONTNEED and read back in (issue 45 item 3). tests/lab/ runs it on a lab host."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pdkit.agent import residency


def _model(tmp_path, mib: int = 8):
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")
    for name in ("model-00001-of-00002.safetensors", "sub/model-00002-of-00002.safetensors"):
        with open(d / name, "wb") as f:
            f.write(os.urandom(mib << 20))
            f.flush()
            os.fsync(f.fileno())  # clean pages: DONTNEED can drop them
    return d


def test_only_weight_files_are_counted(tmp_path):
    d = _model(tmp_path, 1)
    assert [p.name for p in residency.weight_files(d)] == ["model-00001-of-00002.safetensors",
                                                          "model-00002-of-00002.safetensors"]


def test_evicted_weights_read_as_cold_and_warming_brings_them_back(tmp_path):
    d = _model(tmp_path)
    files = residency.weight_files(d)
    residency.evict(files)
    cold = residency.residency(files)
    assert cold["bytes"] == 16 << 20 and cold["files"] == 2
    assert cold["ratio"] < 0.5, cold  # the kernel may keep a few pages (readahead of the fsync) but not most
    took = residency.warm(files)
    warm = residency.residency(files)
    assert warm["ratio"] > 0.99 and took >= 0, warm


def test_the_cli_prints_one_json_line_and_warms_only_when_cold(tmp_path):
    d = _model(tmp_path, 2)
    def run(*a):
        return json.loads(subprocess.run([sys.executable, "-m", "pdkit.residency", str(d), *a],
                                         capture_output=True, text=True, check=True).stdout)

    out = run("--evict", "--warm")
    assert out["before"]["ratio"] < 0.5 and out["after"]["ratio"] > 0.99 and "warm_s" in out
    again = run("--warm")
    assert again["before"]["ratio"] > 0.99 and "warm_s" not in again
    bad = subprocess.run([sys.executable, "-m", "pdkit.residency", str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a directory" in json.loads(bad.stdout)["error"]


# ---- the roll's step before the drain (pdkit.roll.roller.Roller.warm_weights) ----------------------

def _roller(tmp_path, base, model_path: str, load_format: str | None = None, engine: str = "sglang"):
    from pdkit.inventory.loader import load
    from pdkit.roll.roller import Progress, Roller
    from tests.conftest import write_inventory

    cluster, hosts = base
    cluster["model"] = {"path": model_path, "served_name": "m", **({"load_format": load_format} if load_format else {})}
    cluster["engine"] = engine
    inv = write_inventory(tmp_path, hosts, cluster)
    return Roller(str(inv), load(str(inv)), Progress(open(os.devnull, "w")))


def _local_run_remote(model_dir):
    """run_remote, on this machine: the node's python is this interpreter, its /models/m MODEL_DIR
    (the spec refuses a model under /tmp: the units could not see it)."""
    def run(host, command, timeout=900):
        done = subprocess.run(["sh", "-c", command.replace("/models/m", str(model_dir))], capture_output=True,
                              text=True, timeout=timeout)
        return done.returncode == 0, done.stdout, done.stderr
    return run


def test_the_roll_reads_cold_weights_in_before_the_drain_and_says_how_much(tmp_path, base, monkeypatch):
    from pdkit.render import flags
    from pdkit.roll import roller as roller_mod

    d = _model(tmp_path, 4)
    residency.evict(residency.weight_files(d))
    monkeypatch.setattr(roller_mod, "run_remote", _local_run_remote(d))
    monkeypatch.setattr(flags, "node_python", lambda spec: sys.executable)
    r = _roller(tmp_path, base, "/models/m")
    record, words = r.warm_weights("gpu01", object())
    got = record["/models/m"]
    assert got["before"]["ratio"] < 0.5 and got["after"]["ratio"] > 0.99, got
    assert "of 0.0 GiB was in the page cache; read in" in words and "before the drain (now 100%)" in words
    record, words = r.warm_weights("gpu01", object())
    assert words == "/models/m: all 0.0 GiB in the page cache" and "warm_s" not in record["/models/m"]


def test_nothing_is_read_for_dummy_weights_or_the_sim_and_a_node_that_cannot_tell_never_stops_the_roll(tmp_path, base, monkeypatch):
    from pdkit.render import flags
    from pdkit.roll import roller as roller_mod

    calls = []
    monkeypatch.setattr(roller_mod, "run_remote", lambda *a, **k: calls.append(a) or (False, "", "No module named pdkit.agent.residency"))
    monkeypatch.setattr(flags, "node_python", lambda spec: "/opt/pdkit/venv/bin/python")
    assert _roller(tmp_path, base, "/models/m", "dummy").warm_weights("gpu01", object()) == ({}, "")
    assert _roller(tmp_path, base, "/models/m", engine="sim").warm_weights("gpu01", object()) == ({}, "")
    assert calls == []
    record, words = _roller(tmp_path, base, "/models/m").warm_weights("gpu01", object())
    assert "residency not measured (No module named pdkit.agent.residency)" in words and "error" in record["/models/m"]


def test_the_roll_times_a_restarted_engine_from_its_stop_and_an_added_one_from_its_first_start(tmp_path, base, monkeypatch):
    """Roller.engines_restart_to_ready over the node's _TIMING_PROBE answer: a running engine restarted
    in this step counts from its stop, one the step added (never active: no stop) from its start, one
    restarted before the step not at all; each keeps SGLang's phases from its gate's mark."""
    from pdkit.roll import roller as roller_mod

    probe = {  # [left active, ready, went inactive, started, phases] (µs, node clock)
        "pdkit-engine-prefill.service": [10_000_000, 70_000_000, 12_000_000, 12_100_000, {"load_weight": 1.0}],
        "pdkit-engine-decode.service": [0, 40_000_000, 0, 20_000_000, {"tokenizer_e2e": 15.0}],
        "pdkit-engine-old.service": [1_000_000, 5_000_000, 1_500_000, 1_600_000, {}],
    }
    monkeypatch.setattr(roller_mod, "run_remote", lambda *a, **k: (True, json.dumps(probe), ""))
    r = _roller(tmp_path, base, "/models/m")
    took = r.engines_restart_to_ready(object(), "gpu01", since_monotonic_us=9_000_000)
    assert took == 60.0  # 10 s -> 70 s, the added decode's 20 -> 40 s inside it
    assert r.engine_phases["gpu01"] == {
        "pdkit-engine-prefill.service": {"restart_to_ready_s": 60.0, "load_weight": 1.0},
        "pdkit-engine-decode.service": {"restart_to_ready_s": 20.0, "tokenizer_e2e": 15.0},
    }
