"""Planned argv vs /server_info and the process argv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdkit.agent.exporter.drift import (
    FlagCheck,
    argv_options,
    cmdline_drift,
    compare_server_info,
    drift,
    engine_args,
    values_match,
)
from pdkit.sim.args import parse_args

from .support import data_json

REPO_GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_captured_sim_matches_its_argv(role):
    argv, info = data_json(f"sim_{role}_argv.json"), data_json(f"sim_{role}_server_info.json")
    check = compare_server_info(argv, info)
    assert check.drifted == () and check.unverified == ()


@pytest.mark.parametrize("key, running, flag", [
    ("tp_size", 4, "--tp-size"),
    ("page_size", 32, "--page-size"),
    ("mem_fraction_static", 0.9, "--mem-fraction-static"),
    ("numa_node", [0, 0, 0, 0], "--numa-node"),
    ("enable_metrics", False, "--enable-metrics"),
    ("served_model_name", "other", "--served-model-name"),
    ("disaggregation_mode", "null", "--disaggregation-mode"),
])
def test_a_changed_running_value_is_drift(key, running, flag):
    argv, info = data_json("sim_decode_argv.json"), data_json("sim_decode_server_info.json")
    info[key] = running
    assert drift(argv, info) == [flag]
    assert drift(argv, info, ignore=[flag]) == []


def test_an_ignored_flag_is_compared_in_the_sims_list():
    argv, info = data_json("sim_decode_argv.json"), data_json("sim_decode_server_info.json")
    assert "--disable-custom-all-reduce" in info["ignored_sglang_args"]
    info["ignored_sglang_args"] = []
    assert compare_server_info(argv, info).unverified == ("--disable-custom-all-reduce",)
    info["ignored_sglang_args"] = ["--disable-custom-all-reduce", "x"]
    assert drift(argv, info) == ["--disable-custom-all-reduce"]


def test_rules_for_values_sglang_rewrites():
    info = {"max_running_requests": 12, "cuda_graph_max_bs_decode": 12, "speculative_algorithm": "EAGLE",
            "watchdog_timeout": 300.0, "cuda_graph_config": {"decode": {"backend": "full"}}, "tp_size": 2}
    argv = ["--max-running-requests", "16", "--cuda-graph-max-bs-decode", "32", "--speculative-algorithm", "NEXTN",
            "--watchdog-timeout", "300", "--cuda-graph-config", '{"decode": {"backend": "full"}}', "--tp", "2"]
    assert compare_server_info(argv, info).drifted == ()
    # lowered is fine, raised is not; EAGLE planned but something else running is drift
    info.update(max_running_requests=20, speculative_algorithm="NGRAM")
    assert drift(argv, info) == ["--max-running-requests", "--speculative-algorithm"]


def test_value_normalisation():
    assert values_match([], True) and not values_match([], False) and not values_match([], None)
    assert values_match(["2"], 2) and values_match(["0.85"], 0.85) and values_match(["300"], 300.0)
    assert values_match(["1", "2", "4"], [1, 2, 4]) and not values_match(["1", "2"], [1, 2, 4])
    assert values_match(["true"], True) and not values_match(["2"], True)
    assert values_match(["None"], None) and not values_match(["x"], None)
    assert not values_match(["1", "2"], 1)


def test_argv_parsing():
    opts = argv_options(["--tp", "2", "--model=/m", "--numa-node", "0", "1", "--flag", "--neg", "-1"])
    assert {k: o.values for k, o in opts.items()} == {
        "tp_size": ("2",), "model_path": ("/m",), "numa_node": ("0", "1"), "flag": (), "neg": ("-1",)}
    assert opts["tp_size"].flag == "--tp"
    assert engine_args(["/v/bin/python", "-m", "sglang.launch_server", "--tp-size", "2"]) == ["--tp-size", "2"]
    assert engine_args(["/v/bin/sglang", "serve", "--tp-size", "2"]) == ["--tp-size", "2"]
    assert engine_args(["/v/bin/python"]) == []


def test_cmdline_drift_sees_added_removed_and_changed_flags():
    planned = ["--model-path", "/m", "--tp-size", "2", "--enable-metrics"]
    assert cmdline_drift(planned, list(planned)) == []
    assert cmdline_drift(planned, ["--model-path", "/m", "--tp", "2", "--enable-metrics"]) == []
    running = ["--model-path", "/m", "--tp-size", "4", "--disable-cuda-graph"]
    assert cmdline_drift(planned, running) == ["--enable-metrics", "--tp-size", "--disable-cuda-graph"]
    assert cmdline_drift(planned, running, ignore=["--disable-cuda-graph", "enable_metrics"]) == ["--tp-size"]


def _golden_engines():
    for path in sorted(REPO_GOLDEN.glob("*/*/etc/pdkit/release.json")):
        for name, engine in json.loads(path.read_text()).get("engines", {}).items():
            yield pytest.param(engine["argv"], id=f"{path.parts[-5]}-{path.parts[-4]}-{name}")


@pytest.mark.parametrize("argv", list(_golden_engines()))
def test_argv_pdkit_renders_round_trips_through_the_sim(argv):
    """The argv in the rendered release.json, run by the sim: its /server_info shows no drift."""
    info = parse_args(argv).server_info()
    info = json.loads(json.dumps(info, default=str))  # as the HTTP endpoint serialises it
    check = compare_server_info(argv, info)
    assert check.drifted == ()
    # change one planned value and it shows
    info["port"] = int(info["port"]) + 1
    assert drift(argv, info) == ["--port"]


def test_sglang_flags_with_other_dests_and_negations():
    opts = argv_options(["--no-enable-tf32-matmul", "--enable-hicache", "--tensor-parallel-size", "4"])
    assert {k: o.values for k, o in opts.items()} == {
        "enable_tf32_matmul": ("False",), "enable_hierarchical_cache": (), "tp_size": ("4",)}
    argv = ["--no-enable-tf32-matmul", "--enable-hicache", "--lora-paths", "a=/x"]
    info = {"enable_tf32_matmul": False, "enable_hierarchical_cache": True, "lora_paths": [{"name": "a"}]}
    assert compare_server_info(argv, info) == FlagCheck((), ("--lora-paths",))
    info["enable_tf32_matmul"] = True
    assert drift(argv, info) == ["--no-enable-tf32-matmul"]
