"""`pdkit bench --workload agentic` for real: multi-turn sessions replayed through the real smg router
onto sim engines (PD), the history growing turn by turn with the engine's own replies."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlparse

import pytest

from pdkit.bench.agentic import AgenticParams, AgenticWorkload, run_sessions

from .support import MODEL
from .test_bench_localstack import pdkit, stack_inventory

# tiny sessions: the whole module runs in a few seconds
PARAMS = AgenticParams(sessions=2, turns=3, system_tokens=40, turn_tokens=12, reply_tokens=6, think_s=0.05, seed=7)
LEVELS = [1, 2]


def test_replayer_grows_each_session_by_its_turn_and_the_real_reply(pd_stack):
    """Turn by turn through the router: the server's prompt tokens of turn k+1 exceed turn k's by
    exactly the new message and the reply (the sim counts a word a token, as the generator writes)."""
    workload = AgenticWorkload.generated(PARAMS)
    turns, duration = asyncio.run(run_sessions(f"{pd_stack.router_url}/v1/chat/completions", {}, MODEL,
                                               workload.level_conversations(0), 2, PARAMS.reply_tokens,
                                               PARAMS.think_s, 30.0))
    assert duration > 2 * PARAMS.think_s  # each session waited between its turns
    assert len(turns) == PARAMS.sessions * PARAMS.turns
    assert all(t.result.ok for t in turns), [t.result.error for t in turns if not t.result.ok]
    for session in range(PARAMS.sessions):
        mine = sorted((t for t in turns if t.session == session), key=lambda t: t.turn)
        assert [t.turn for t in mine] == [1, 2, 3]
        prompts = [t.result.prompt_tokens for t in mine]
        assert prompts == [PARAMS.prompt_tokens(k) for k in (1, 2, 3)], prompts
        # +1 tag +turn_tokens for the new message, +1 tag +reply_tokens for the reply appended
        assert [b - a for a, b in zip(prompts, prompts[1:])] == [PARAMS.turn_tokens + PARAMS.reply_tokens + 2] * 2
        assert all(t.result.output_tokens == PARAMS.reply_tokens for t in mine)


@pytest.fixture(scope="module")
def agentic_run(pd_stack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agentic")
    inventory = stack_inventory(tmp, urlparse(pd_stack.router_url).port, pd_stack.prefill_port,
                                pd_stack.decode_port, pd_stack.bootstrap_port)
    out = tmp / "out"
    done = pdkit("bench", str(inventory), "--workload", "agentic", "--concurrency", ",".join(map(str, LEVELS)),
                 "--sessions", str(PARAMS.sessions), "--turns", str(PARAMS.turns),
                 "--system-tokens", str(PARAMS.system_tokens), "--turn-tokens", str(PARAMS.turn_tokens),
                 "--reply-tokens", str(PARAMS.reply_tokens), "--think-s", str(PARAMS.think_s),
                 "--seed", str(PARAMS.seed), "--warmup", "1", "--label", "agentic", "--out", str(out),
                 "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--no-plot")
    assert done.returncode == 0, f"pdkit bench failed ({done.returncode}):\n{done.stderr}\n{pd_stack.procs.logs()}"
    return inventory, out, done


def test_agentic_record_by_depth_cache_and_kv(agentic_run):
    _, out, done = agentic_run
    (record,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    workload = record["workload"]
    assert (workload["kind"], workload["source"], workload["sessions"], workload["turns"]) == ("agentic", "generated",
                                                                                              2, 3)
    assert workload["params"]["system_tokens"] == PARAMS.system_tokens
    assert workload["largest_context"] == PARAMS.largest_context()
    assert record["cache_engines"] == ["local/prefill"] and record["kv_prefills"] == ["local/prefill"]
    per_level = PARAMS.sessions * PARAMS.turns
    assert [lv["concurrency"] for lv in record["levels"]] == LEVELS
    for lv in record["levels"]:
        assert (lv["requests"], lv["completed"], lv["errors"], lv["turns_skipped"]) == (per_level, per_level, 0, 0)
        assert lv["output_tokens"] == per_level * PARAMS.reply_tokens
        assert lv["input_tokens"] == PARAMS.sessions * sum(PARAMS.prompt_tokens(k) for k in (1, 2, 3))
        assert lv["goodput"]["good"] == per_level
        depth = {d["depth"]: d for d in lv["by_depth"]}
        assert sorted(depth) == ["1", "2-4"]
        assert (depth["1"]["requests"], depth["2-4"]["requests"]) == (2, 4)
        assert depth["1"]["prompt_tokens_mean"] == PARAMS.prompt_tokens(1)
        assert depth["2-4"]["prompt_tokens_mean"] == (PARAMS.prompt_tokens(2) + PARAMS.prompt_tokens(3)) / 2
        assert depth["1"]["ttft_ms"]["p50"] > 0
        cache = lv["prefix_cache"]
        assert cache["engines"] == ["local/prefill"] and "unread" not in cache
        # the prefill's own counter: every prompt token of the level's turns
        assert cache["prompt_tokens"] == lv["input_tokens"]
        assert cache["hit_rate"] == pytest.approx(cache["cached_tokens"] / cache["prompt_tokens"], abs=1e-4)
        assert lv["kv"]["transfers"] == per_level  # one hand-off per turn
        assert lv["kv"]["mb_per_request"] > 0
    md = (out / f"{record['id']}.md").read_text()
    assert "| prefix hit | KV MB/turn |" in md and "By turn depth" in md
    assert "agentic workload, generated (seed 7)" in md
    assert md.strip() in done.stdout


def test_compare_two_agentic_runs(agentic_run):
    _, out, _ = agentic_run
    (record,) = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    done = pdkit("compare", record["id"], record["id"], "--runs", str(out / "runs.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "same spec hash, flags and workload" in done.stdout
    assert "| 2 | prefix hit |" in done.stdout and "| 2 | TTFT p50 ms, turns 2-4 |" in done.stdout


def test_a_workload_past_the_context_cap_is_refused_before_any_request(agentic_run, tmp_path):
    inventory, _, _ = agentic_run
    done = pdkit("bench", str(inventory), "--workload", "agentic", "--sessions", "1", "--turns", "4",
                 "--system-tokens", "3000", "--turn-tokens", "300", "--reply-tokens", "64", "--out", str(tmp_path))
    big = AgenticParams(sessions=1, turns=4, system_tokens=3000, turn_tokens=300, reply_tokens=64).largest_context()
    assert done.returncode == 1
    assert f"largest context (system + turns x (turn + reply) tokens) = {big} exceeds the planned context length 4096" \
        in done.stderr
    assert not (tmp_path / "runs.jsonl").exists()
