"""pdkit.bench without a cluster: SGLang result reader, fingerprint, SSH argv, run lookup, compare."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pdkit.bench.cli import parse_concurrency
from pdkit.bench.env import fingerprint, parse_driver_versions, ssh_command
from pdkit.bench.record import find_run, load_runs
from pdkit.bench.report import render_compare, render_markdown, write_outputs
from pdkit.bench.sglang import read_sglang_results, sglang_bench_command
from pdkit.inventory.loader import load
from tests.conftest import require, write_inventory

SGLANG_OUTPUT = Path(__file__).parent / "bench_data" / "sglang-0.5.23-serving-output.jsonl"
SGLANG_SERVING_SOURCE = Path.home() / ".cache/pdkit/contract/sglang-0.5.23/lib/python3.11/site-packages/sglang/benchmark/serving.py"


def _dict_literals_assigned(tree: ast.AST, name: str) -> list[set[str]]:
    """The string keys of every `name = {...}` dict literal in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found.append({k.value for k in node.value.keys if isinstance(k, ast.Constant)})
    return found


def test_fixture_has_exactly_the_keys_sglang_0_5_23_writes():
    """The reader's test file is checked against the real serving.py of the pinned SGLang wheel."""
    require(SGLANG_SERVING_SOURCE.is_file(), f"sglang 0.5.23 contract env not built ({SGLANG_SERVING_SOURCE})")
    tree = ast.parse(SGLANG_SERVING_SOURCE.read_text())
    # the text-generation result (the one with TPOT); serving.py also has other result dicts
    (result,) = [keys for keys in _dict_literals_assigned(tree, "result") if "median_tpot_ms" in keys]
    (details,) = _dict_literals_assigned(tree, "result_details")
    detailed, plain = (json.loads(line) for line in SGLANG_OUTPUT.read_text().splitlines())
    # the plain line is `result`; the detailed one is `result | result_details` (--output-details)
    assert set(plain) == result
    assert set(detailed) == result | details


def test_read_sglang_results_maps_every_metric():
    with_details, plain = read_sglang_results(SGLANG_OUTPUT, requests=64)
    assert (with_details["concurrency"], with_details["requests"], with_details["completed"]) == (16, 64, 63)
    assert with_details["errors"] == 1
    assert with_details["error_samples"] == ["Bad Request: No prefill workers available"]
    assert with_details["output_tok_s"] == pytest.approx(63 * 128 / 4.2)
    assert with_details["requests_s"] == pytest.approx(63 / 4.2)
    assert with_details["ttft_ms"] == {"mean": 41.5, "p50": 39.8, "p99": 88.0}
    assert with_details["tpot_ms"] == {"mean": 7.9, "p50": 7.8, "p99": 9.6}
    assert with_details["itl_ms"] == {"mean": 7.9, "p50": 7.6, "p99": 21.3}
    assert with_details["e2e_ms"] == {"mean": 1045.0, "p50": 1040.2, "p99": 1120.7}
    assert (plain["concurrency"], plain["errors"], plain["output_tokens"]) == (64, 0, 64 * 128)


def test_read_sglang_results_without_the_request_count():
    with_details, plain = read_sglang_results(SGLANG_OUTPUT)
    # the per-request errors list gives the count; without it nothing says a request was lost
    assert (with_details["requests"], with_details["errors"]) == (64, 1)
    assert (plain["requests"], plain["errors"]) == (64, 0)


def test_sglang_bench_command_fixes_lengths_and_keeps_the_key_out_of_argv():
    argv = sglang_bench_command("/venv/bin/python", "http://10.0.0.1:8000", "m", None, 16, 64, 512, 128, 2, "/tmp/o.jsonl")
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.benchmark.serving"]
    assert argv[-1] == "--tokenize-prompt"  # ids sent as drawn: exact input length
    pairs = dict(zip(argv[3:-1:2], argv[4:-1:2]))
    # random-ids draws ids locally; `random` downloads ShareGPT first (fails offline: seen on the H200)
    assert pairs["--dataset-name"] == "random-ids"
    assert pairs["--random-range-ratio"] == "1"  # 1 = fixed lengths (0.0, the default, is uniform)
    assert (pairs["--max-concurrency"], pairs["--num-prompts"], pairs["--output-file"]) == ("16", "64", "/tmp/o.jsonl")
    assert (pairs["--random-input-len"], pairs["--random-output-len"]) == ("512", "128")
    assert not any("Bearer" in a or "key" in a.lower() for a in argv)


def test_engine_bench_sglang_without_sglang_says_how_to_get_it(base, tmp_path):
    import sys

    from pdkit.bench.sglang import run_sglang_bench, sglang_bench_available

    cluster, hosts = base
    spec = load(write_inventory(tmp_path, hosts, cluster))
    assert not sglang_bench_available(sys.executable)  # pdkit's own venv has no sglang
    with pytest.raises(RuntimeError, match="cannot import sglang.benchmark.serving: install sglang there, or give --sglang-python"):
        run_sglang_bench(spec, python=sys.executable, probe_drivers=False)


def test_impossible_workloads_are_refused_before_any_request(base, tmp_path):
    from pdkit.bench.record import run_bench

    cluster, hosts = base
    cluster["tuning"]["all"] = {"context_length": 1024}
    spec = load(write_inventory(tmp_path, hosts, cluster))
    # the router at 10.9.0.1 is never contacted: every case fails before
    with pytest.raises(ValueError, match="exceeds the planned context length 1024"):
        run_bench(spec, input_len=1000, output_len=100, probe_drivers=False)
    with pytest.raises(ValueError, match="--requests must be at least 1"):
        run_bench(spec, requests=0, input_len=8, output_len=8, probe_drivers=False)
    with pytest.raises(ValueError, match="--input-len and --output-len must be at least 1"):
        run_bench(spec, input_len=0, probe_drivers=False)


def test_ssh_command_checks_host_keys():
    argv = ssh_command({"name": "gpu01", "ssh_hostname": "10.9.0.1", "ssh_user": "ops", "ssh_port": 2222,
                        "ssh_key": "/k/id", "ssh_known_hosts_file": "/k/known"}, "nvidia-smi")
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert "UserKnownHostsFile=/k/known" in argv
    assert argv[argv.index("-i") + 1] == "/k/id" and argv[argv.index("-p") + 1] == "2222"
    assert argv[-2:] == ["ops@10.9.0.1", "nvidia-smi"]


def test_parse_driver_versions():
    assert parse_driver_versions("580.95.05\n580.95.05\n") == "580.95.05"
    assert parse_driver_versions("580.95.05\n575.1\n") == "575.1, 580.95.05"
    assert parse_driver_versions("\n").startswith("unknown")


def test_parse_concurrency():
    assert parse_concurrency("1,16,64") == [1, 16, 64]
    for bad in ("", "0,4", "a,b"):
        with pytest.raises(Exception, match="comma-separated positive integers"):
            parse_concurrency(bad)


def test_fingerprint_from_the_spec(base, tmp_path):
    cluster, hosts = base
    spec = load(write_inventory(tmp_path, hosts, cluster))
    env = fingerprint(spec, probe_drivers=False)
    assert len(env["spec_hash"]) == 64
    assert (env["engine"], env["sglang_versions"]) == ("sglang", ["0.5.23"])
    assert env["gpus"][0] == {"host": "gpu01", "gpu": "nvidia", "model": "NVIDIA H200", "count": 4,
                              "driver": "not probed"}
    assert set(env["engine_flags"]) == {"gpu01/prefill", "gpu01/decode", "gpu02/prefill", "gpu02/decode"}
    assert "--disaggregation-mode" in env["engine_flags"]["gpu01/decode"]
    # the same spec hashes the same; a changed plan hashes differently
    assert fingerprint(load(write_inventory(tmp_path, hosts, cluster)), probe_drivers=False)["spec_hash"] == env["spec_hash"]
    cluster["tuning"]["decode"]["cuda_graph_max_bs"] = 16
    assert fingerprint(load(write_inventory(tmp_path, hosts, cluster)), probe_drivers=False)["spec_hash"] != env["spec_hash"]


def _record(run_id: str, label: str, tok_s: float, flags: list[str]) -> dict:
    level = {"concurrency": 16, "requests": 8, "completed": 8, "errors": 0, "error_samples": [], "duration_s": 1.0,
             "input_tokens": 64, "output_tokens": int(tok_s), "output_tok_s": tok_s, "requests_s": 8.0,
             "ttft_ms": {"mean": 10.0, "p50": 10.0, "p99": 20.0}, "tpot_ms": {"mean": 5.0, "p50": 5.0, "p99": 6.0},
             "itl_ms": {"mean": 5.0, "p50": 5.0, "p99": 9.0}, "e2e_ms": {"mean": 50.0, "p50": 50.0, "p99": 60.0}}
    return {"schema": 1, "id": run_id, "label": label, "time": "2026-11-29T00:00:00+00:00", "tool": "pdkit",
            "inventory": "inv.py", "cluster": "c", "model": "m", "router_url": "http://r:8000", "input_len": 8,
            "output_len": 16, "requests": 8, "warmup": 0, "levels": [level],
            "env": {"spec_hash": "a" * 64 if flags == ["--x"] else "b" * 64, "engine": "sim", "sglang_versions": ["0.5.23"],
                    "router": "smg 1.13.0", "gpus": [], "engine_flags": {"h/decode": flags}}}


def test_find_run_by_id_label_and_file(tmp_path):
    out = tmp_path / "bench"
    write_outputs(_record("r1", "before", 100.0, ["--x"]), out, plot=False)
    write_outputs(_record("r2", "after", 50.0, ["--y"]), out, plot=False)
    write_outputs(_record("r3", "after", 60.0, ["--y"]), out, plot=False)
    runs = out / "runs.jsonl"
    assert [r["id"] for r in load_runs(runs)] == ["r1", "r2", "r3"]
    assert find_run("r2", runs)["id"] == "r2"
    assert find_run("after", runs)["id"] == "r3"  # the latest with that label
    assert find_run(str(runs), runs)["id"] == "r3"  # a .jsonl file: its last run
    single = tmp_path / "one.json"
    single.write_text(json.dumps(_record("r9", "", 1.0, [])))
    assert find_run(str(single), runs)["id"] == "r9"
    with pytest.raises(LookupError, match="neither a file nor a run id or label"):
        find_run("nope", runs)
    assert load_runs(tmp_path / "missing.jsonl") == []
    assert "| 16 | 8 | 0 | 100.0 |" in (out / "r1.md").read_text()


def test_render_compare_ratios_and_flag_changes():
    text = render_compare(_record("r1", "before", 100.0, ["--x"]), _record("r2", "after", 50.0, ["--y"]))
    assert "| 16 | output tok/s | 100.0 | 50.0 | 0.50 |" in text
    assert "| 16 | TPOT p50 ms | 5.0 | 5.0 | 1.00 |" in text
    assert "flags h/decode: removed `--x`; added `--y`" in text
    assert "spec hash differs" in text


def test_flag_changes_compare_options_not_tokens():
    from pdkit.bench.report import flag_changes

    a = _record("r1", "", 1.0, ["--tp-size", "4", "--cuda-graph-max-bs-decode", "64", "--steps", "4"])
    b = _record("r2", "", 1.0, ["--tp-size", "4", "--cuda-graph-backend-decode", "disabled", "--steps", "2"])
    assert flag_changes(a, b) == ["h/decode: added `--cuda-graph-backend-decode disabled`; "
                                  "removed `--cuda-graph-max-bs-decode 64`; `--steps 4` -> `--steps 2`"]
    assert flag_changes(a, a) == []


def test_render_markdown_lists_errors():
    record = _record("r1", "x", 1.0, [])
    record["levels"][0]["errors"] = 2
    record["levels"][0]["error_samples"] = ["HTTP 503: busy"]
    text = render_markdown(record)
    assert "Errors (samples): HTTP 503: busy" in text


def test_driver_probe_says_when_there_is_no_ssh_client():
    """The lent GPU machine's image has no OpenSSH client: the fingerprint said only 'FileNotFoundError'."""
    from pdkit.bench.env import probe_driver

    def no_ssh(*_a, **_k):
        raise FileNotFoundError(2, "No such file or directory", "ssh")

    got = probe_driver({"name": "n1", "ssh_hostname": "127.0.0.1"}, run=no_ssh)
    assert got.startswith("unknown: no `ssh` client") and "--no-ssh" in got, got


def test_limit_benches_the_hosts_own_pairs_and_refuses_what_it_cannot_bench(base, tmp_path):
    from pdkit.bench.cli import limited_measure
    from pdkit.bench.report import describe_measured

    cluster, hosts = base
    spec = load(write_inventory(tmp_path, hosts, cluster))
    one = limited_measure(spec, ["gpu02"]).describe()
    assert one == {"via": "engines", "hosts": ["gpu02"], "engines": ["gpu02/prefill", "gpu02/decode"],
                   "routes": ["gpu02/prefill+gpu02/decode"]}, one
    assert describe_measured(one) == "the engines directly, PD pairs gpu02/prefill+gpu02/decode"
    # a repeated name is one target, not two shares
    assert limited_measure(spec, ["gpu01", "gpu01"]).describe()["hosts"] == ["gpu01"]
    with pytest.raises(ValueError, match=r"--limit names unknown host\(s\) \['gpu9'\]; the inventory has \['gpu01', 'gpu02', 'mon01'\]"):
        limited_measure(spec, ["gpu01", "gpu9"])
    with pytest.raises(ValueError, match=r"host\(s\) \['mon01'\] run no engine; hosts with engines: \['gpu01', 'gpu02'\]"):
        limited_measure(spec, ["mon01"])
    with pytest.raises(ValueError, match="--limit needs pdkit's client"):
        limited_measure(spec, ["gpu01"], "sglang")


def test_bench_cli_limit_error_names_the_host_before_any_request(base, tmp_path, capsys):
    from pdkit.cli import main

    cluster, hosts = base
    inventory = write_inventory(tmp_path, hosts, cluster)
    # the engines at 10.9.0.x are never contacted: the name is refused first
    rc = main(["bench", str(inventory), "--limit", "gpu9", "--no-ssh", "--out", str(tmp_path / "out")])
    assert rc == 2  # a usage error, as pdkit roll --limit gives one
    assert "--limit names unknown host(s) ['gpu9']" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_render_markdown_says_where_the_requests_went():
    record = _record("r1", "x", 1.0, [])
    assert f"through {record['router_url']}," in render_markdown(record)
    record["env"]["measured"] = {"via": "engines", "hosts": ["h1"], "engines": ["h1/p", "h1/d"], "routes": ["h1/p+h1/d"]}
    text = render_markdown(record)
    assert "to h1/p+h1/d directly (not through the router)," in text and "through http" not in text
    assert "- measured: the engines directly, PD pairs h1/p+h1/d" in text


def test_bench_cli_refuses_a_level_the_request_count_cannot_reach(base, tmp_path, capsys):
    """Issue 46: 64 in flight with 32 requests would measure at most 32 under the name C=64 (a recorded
    campaign did: docs/tune/h200-one-node.md); refused before any host is contacted."""
    from pdkit.cli import main

    cluster, hosts = base
    inventory = write_inventory(tmp_path, hosts, cluster)
    rc = main(["bench", str(inventory), "--concurrency", "1,64", "--requests", "32", "--no-ssh",
               "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "--concurrency 64 can never be reached with --requests 32" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
