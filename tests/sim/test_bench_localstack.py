"""`pdkit bench` and `pdkit compare` for real: the CLI against sim engines behind the real smg router."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from pdkit.sim.localstack import free_ports
from tests.conftest import REPO, write_inventory

from .support import MODEL

INPUT_LEN, OUTPUT_LEN, REQUESTS, WARMUP = 32, 16, 8, 2
LEVELS = [1, 4]


def stack_inventory(directory: Path, router_port: int, prefill_port: int, decode_port: int, bootstrap_port: int) -> Path:
    """An inventory describing the local stack: one `gpu: none` host on loopback, engine sim, its router."""
    cluster = {"name": "local", "engine": "sim", "sglang_version": "0.5.23",
               "model": {"path": "/models/sim-test", "served_name": MODEL},
               "tuning": {"all": {"context_length": 4096}}}
    hosts = {"local": {
        "ssh_hostname": "127.0.0.1",
        "pdkit_node": {
            "gpu": "none",
            "gpus": {"model": "virtual", "count": 2, "memory_gib": 80, "compute_capability": "9.0"},
            "engines": [
                {"name": "prefill", "role": "prefill", "gpus": [0], "port": prefill_port, "bootstrap_port": bootstrap_port},
                {"name": "decode", "role": "decode", "gpus": [1], "port": decode_port},
            ],
        },
        "pdkit_router": {"port": router_port, "prometheus_port": free_ports(1)[0]},
    }}
    return write_inventory(directory, hosts, cluster)


def pdkit(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The real CLI in its own process (loading an inventory gevent-patches the process that does it)."""
    return subprocess.run([sys.executable, "-m", "pdkit.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def bench(inventory: Path, out: Path, label: str) -> subprocess.CompletedProcess:
    return pdkit("bench", str(inventory), "--concurrency", ",".join(map(str, LEVELS)), "--input-len", str(INPUT_LEN),
                 "--output-len", str(OUTPUT_LEN), "--requests", str(REQUESTS), "--warmup", str(WARMUP),
                 "--label", label, "--out", str(out))


@pytest.fixture(scope="module")
def two_runs(pd_stack, tmp_path_factory):
    """Two real bench runs through the router, labelled before and after."""
    tmp = tmp_path_factory.mktemp("bench")
    inventory = stack_inventory(tmp, urlparse(pd_stack.router_url).port, pd_stack.prefill_port,
                                pd_stack.decode_port, pd_stack.bootstrap_port)
    out = tmp / "out"
    runs = []
    for label in ("before", "after"):
        done = bench(inventory, out, label)
        assert done.returncode == 0, f"pdkit bench failed ({done.returncode}):\n{done.stderr}\n{pd_stack.procs.logs()}"
        runs.append(done)
    return out, runs


def test_bench_record_fields_and_consistent_numbers(two_runs):
    out, runs = two_runs
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["label"] for r in records] == ["before", "after"]
    record = records[0]
    assert (record["schema"], record["tool"], record["model"]) == (1, "pdkit", MODEL)
    assert (record["input_len"], record["output_len"], record["requests"], record["warmup"]) == (
        INPUT_LEN, OUTPUT_LEN, REQUESTS, WARMUP)
    env = record["env"]
    assert len(env["spec_hash"]) == 64 and env["spec_hash"] == records[1]["env"]["spec_hash"]
    assert (env["engine"], env["sglang_versions"], env["router"]) == ("sim", ["0.5.23"], "smg 1.13.0")
    assert env["gpus"] == [{"host": "local", "gpu": "none", "model": "virtual", "count": 2, "driver": "n/a"}]
    assert "--disaggregation-mode" in env["engine_flags"]["local/decode"]

    assert [lv["concurrency"] for lv in record["levels"]] == LEVELS
    for lv in record["levels"]:
        assert (lv["requests"], lv["completed"], lv["errors"], lv["error_samples"]) == (REQUESTS, REQUESTS, 0, [])
        # the server's own token counts: exactly the lengths asked for
        assert lv["output_tokens"] == REQUESTS * OUTPUT_LEN
        assert lv["input_tokens"] == REQUESTS * INPUT_LEN
        assert lv["output_tok_s"] == pytest.approx(lv["output_tokens"] / lv["duration_s"], rel=1e-3)
        assert lv["requests_s"] == pytest.approx(lv["completed"] / lv["duration_s"], rel=1e-3)
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert 0 <= lv[metric]["p50"] <= lv[metric]["p99"], (metric, lv[metric])
        assert lv["tpot_ms"]["p50"] > 0
        # TPOT_i = (e2e_i - ttft_i) / (n - 1) for every request, so the means obey it too
        assert lv["e2e_ms"]["mean"] == pytest.approx(lv["ttft_ms"]["mean"] + (OUTPUT_LEN - 1) * lv["tpot_ms"]["mean"],
                                                     abs=0.05)
        # a level cannot finish faster than its requests, run `concurrency` at a time
        assert lv["duration_s"] * 1000 >= lv["e2e_ms"]["mean"] * REQUESTS / lv["concurrency"] * 0.99
    # more requests in flight: more tokens per second through the same engines
    assert record["levels"][1]["output_tok_s"] > record["levels"][0]["output_tok_s"]
    # the KV hand-off of each level, from the prefill's /metrics before and after it: one transfer
    # per request (the warm-up's fall before the first level), in SGLang's units: the sim moves
    # 65,536 bytes per prompt token (PDKIT_SIM_KV_BYTES_PER_TOKEN) at 1.2e9 bytes/s
    assert record["kv_prefills"] == ["local/prefill"]
    mib = INPUT_LEN * 65536 / 2**20
    for lv in record["levels"]:
        kv = lv["kv"]
        assert (kv["prefills"], kv["transfers"], "unread" in kv) == (["local/prefill"], REQUESTS, False), kv
        assert kv["mb_per_request"] == pytest.approx(mib)
        assert kv["latency_mean_ms"] == pytest.approx(mib * 2**20 / 1.2e9 * 1000, rel=1e-3)
        assert kv["effective_gb_s"] == pytest.approx(1.2e9 / 2**30, rel=1e-3) == kv["sglang_speed_mean_gb_s"]
        assert 0 < kv["ttft_share"] < 1 and kv["ttft_share"] == pytest.approx(kv["latency_mean_ms"] / lv["ttft_ms"]["mean"], rel=1e-3, abs=1e-4)  # as_record rounds each figure to 4 places: the share's own 5e-5 and its inputs' (a CI run saw 5.0006e-5)

    md = (out / f"{record['id']}.md").read_text()
    assert f"| 1 | {REQUESTS} | 0 |" in md and f"| 4 | {REQUESTS} | 0 |" in md
    assert f"| 1 | {REQUESTS} | {mib:,.1f} |" in md  # the KV table
    assert (out / f"{record['id']}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "C=4" in runs[0].stderr  # the progress bar
    assert md.strip() in runs[0].stdout


def test_compare_two_real_runs(two_runs):
    out, _ = two_runs
    runs_file = out / "runs.jsonl"
    before, after = (json.loads(line) for line in runs_file.read_text().splitlines())
    done = pdkit("compare", "before", "after", "--runs", str(runs_file), "--out", str(out / "compare.md"),
                 "--plot", str(out / "compare.png"))
    assert done.returncode == 0, done.stderr
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert done.stdout == (out / "compare.md").read_text()
    assert f"A = `{before['id']}` (before), B = `{after['id']}` (after)" in done.stdout
    assert "same spec hash, flags and workload" in done.stdout
    for lv_a, lv_b in zip(before["levels"], after["levels"]):
        ratio = lv_b["output_tok_s"] / lv_a["output_tok_s"]
        row = (f"| {lv_a['concurrency']} | output tok/s | {lv_a['output_tok_s']:,.1f} | "
               f"{lv_b['output_tok_s']:,.1f} | {ratio:,.2f} |")
        assert row in done.stdout


def test_bench_without_a_router_fails_clearly(tmp_path):
    router_port, prefill, decode, bootstrap = free_ports(4)  # nothing listens on any of them
    inventory = stack_inventory(tmp_path, router_port, prefill, decode, bootstrap)
    done = pdkit("bench", str(inventory), "--concurrency", "2", "--requests", "2", "--warmup", "1",
                 "--input-len", "8", "--output-len", "4", "--out", str(tmp_path / "out"), "--timeout", "10")
    assert done.returncode == 1
    assert f"every warm-up request through http://127.0.0.1:{router_port} failed" in done.stderr
    assert not (tmp_path / "out" / "runs.jsonl").exists()
