"""The agentic workload without a cluster: the generator (deterministic, SGLang's format, the sim's
token counts), load_trace's errors, the levels' sessions, the per-depth and cache figures, the
report and compare, the context-cap refusal, and SGLang's own loader and argument parser (the
pinned releases' source, run in the contract virtualenvs) on what pdkit writes and builds."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from pdkit.bench.agentic import (
    AgenticParams,
    AgenticWorkload,
    TurnResult,
    agentic_level,
    check_agentic,
    depth_stats,
    generate_trace,
    load_trace,
    trace_bytes,
    trace_from_dict,
    write_trace,
)
from pdkit.bench.record import level_cache
from pdkit.bench.report import render_compare, render_markdown
from pdkit.bench.sglang import sglang_agentic_command
from pdkit.bench.stats import RequestResult
from pdkit.inventory.loader import load
from pdkit.sim.textgen import chat_prompt, tokenize
from pdkit.spec.kvcost import cache_counts
from pdkit.upstream.venvs import sglang_python
from tests.conftest import write_inventory

SMALL = AgenticParams(sessions=3, turns=4, system_tokens=50, turn_tokens=20, reply_tokens=8, think_s=0.0, seed=1)
SGLANG_VERSIONS = ("0.5.17", "0.5.23")


# ---- the generator -------------------------------------------------------------------------------

def test_same_params_same_bytes_and_another_seed_another_trace():
    assert trace_bytes(generate_trace(SMALL)) == trace_bytes(generate_trace(AgenticParams(**vars(SMALL))))
    other = AgenticParams(**{**vars(SMALL), "seed": 2})
    assert trace_bytes(generate_trace(other)) != trace_bytes(generate_trace(SMALL))


def test_the_trace_has_sglangs_shape_a_shared_system_prompt_and_sessions_of_their_own():
    trace = generate_trace(SMALL, conversations=5)
    assert set(trace) == {"metadata", "conversations"}
    assert trace["metadata"]["params"] == vars(SMALL) and trace["metadata"]["reply_tokens"] == 8
    convs = trace["conversations"]
    assert len(convs) == 5 and all(len(c) == SMALL.turns for c in convs)
    for conv in convs:
        assert [m["role"] for m in conv[0]["messages"]] == ["system", "user"]
        assert all([m["role"] for m in turn["messages"]] == ["user"] for turn in conv[1:])
        assert [turn["prompt_tokens"] for turn in conv] == [SMALL.prompt_tokens(k) for k in range(1, 5)]
    systems = {c[0]["messages"][0]["content"] for c in convs}
    assert len(systems) == 1 and len(systems.pop().split()) == SMALL.system_tokens
    firsts = [c[0]["messages"][1]["content"] for c in convs]
    assert len(set(firsts)) == 5 and all(len(f.split()) == SMALL.turn_tokens for f in firsts)


def test_prompt_tokens_are_exactly_what_the_sim_counts():
    """The sim's tokenizer on each turn's real prompt (history with replies of reply_tokens words)."""
    (conv,) = generate_trace(SMALL, conversations=1)["conversations"]
    history: list[dict[str, str]] = []
    for turn in conv:
        history += turn["messages"]
        assert len(tokenize(chat_prompt(history))) == turn["prompt_tokens"]
        history.append({"role": "assistant", "content": " ".join(["reply"] * SMALL.reply_tokens)})
    assert SMALL.largest_context() == conv[-1]["prompt_tokens"] + SMALL.reply_tokens
    assert AgenticWorkload.generated(SMALL).largest_context() == SMALL.largest_context()


def test_the_growth_per_turn_is_the_turn_and_the_reply():
    p = AgenticParams(turns=5, system_tokens=2000, turn_tokens=600, reply_tokens=64)
    assert [p.prompt_tokens(k + 1) - p.prompt_tokens(k) for k in range(1, 5)] == [600 + 64 + 2] * 4


@pytest.mark.parametrize("field, value, message", [
    ("sessions", 0, "sessions must be an integer >= 1, got 0"),
    ("turns", 1.5, "turns must be an integer >= 1, got 1.5"),
    ("system_tokens", -1, "system_tokens must be an integer >= 0, got -1"),
    ("reply_tokens", 0, "reply_tokens must be an integer >= 1, got 0"),
    ("think_s", -0.5, "think_s must be seconds within 0..3600, got -0.5"),
])
def test_bad_params_name_the_field_and_what_is_valid(field, value, message):
    with pytest.raises(ValueError, match="agentic workload: .*" + message.replace(".", r"\.")):
        generate_trace(AgenticParams(**{field: value}))


# ---- a trace read back --------------------------------------------------------------------------

def test_load_trace_round_trips_and_caps_turns(tmp_path):
    path = tmp_path / "t.json"
    sha = write_trace(generate_trace(SMALL), path)
    trace, read_sha = load_trace(path, max_turns=2)
    assert read_sha == sha and len(trace.conversations) == 3 and {len(c) for c in trace.conversations} == {2}
    w = AgenticWorkload.from_file(str(path), None, None, 0.0)
    assert (w.sessions, w.reply_tokens, w.largest_context()) == (3, 8, SMALL.largest_context())


@pytest.mark.parametrize("data, message", [
    ([], "must be a JSON object with 'conversations', got list"),
    ({"conversations": []}, "'conversations' must be a non-empty list"),
    ({"conversations": [[{"messages": [{"role": "user", "content": "a"}]}], "x"]},
     "conversations[1]: must be a non-empty list of turns"),
    ({"conversations": [[{"messages": [{"role": "user", "content": "a"}]},
                         {"messages": [{"role": "assistant", "content": "b"}]}]]},
     "conversations[0][1].messages[0].role: 'assistant' is not one of system, user, tool, developer"),
    ({"conversations": [[{"messages": [{"role": "user", "content": 3}]}]]},
     "conversations[0][0].messages[0]: must be an object with a string 'content'"),
    ({"conversations": [[{"messages": []}]]}, "conversations[0][0].messages: must be a non-empty list"),
    ({"conversations": [[{"messages": [{"role": "user", "content": "a"}], "prompt_tokens": -3}]]},
     "conversations[0][0].prompt_tokens: must be an integer >= 0, got -3"),
])
def test_trace_errors_name_the_conversation_turn_and_message(data, message):
    with pytest.raises(ValueError) as caught:
        trace_from_dict(data, "--trace t.json")
    assert str(caught.value).startswith("--trace t.json: not an agentic trace")
    assert message in str(caught.value)


def test_load_trace_says_what_is_wrong_with_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"--trace .*missing.json: cannot read it"):
        load_trace(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match=r"--trace .*bad.json: not JSON"):
        load_trace(tmp_path / "bad.json")


def test_a_traces_largest_context_without_prompt_tokens_is_the_sims_count():
    trace = trace_from_dict({"conversations": [[{"messages": [{"role": "system", "content": "a b c"},
                                                              {"role": "user", "content": "d e"}]},
                                                {"messages": [{"role": "tool", "content": "f g h i"}]}]]})
    # turn 2: BOS + (1+3) + (1+2) + reply (1+10) + (1+4) + assistant tag = 25, + a reply of 10
    assert trace.largest_context(10) == 25 + 10


def test_each_level_plays_fresh_sessions_as_sglangs_dataset_offset_does():
    w = AgenticWorkload.generated(SMALL, levels=3)
    convs = w.trace.conversations
    assert len(convs) == 9
    assert w.level_conversations(0) == list(convs[0:3]) and w.level_conversations(2) == list(convs[6:9])
    assert [w.offset(i) for i in range(3)] == [0, 3, 6]
    # a trace shorter than the levels need wraps around, as SGLang rotates by offset % len
    assert w.level_conversations(4) == [convs[3], convs[4], convs[5]]


# ---- figures ---------------------------------------------------------------------------------

def _ok(ttft: float, prompt: int) -> RequestResult:
    return RequestResult(ok=True, ttft=ttft, latency=ttft + 0.07, output_tokens=8, prompt_tokens=prompt,
                         chunk_times=tuple(ttft + 0.01 * i for i in range(8)))


def test_depth_buckets_and_a_failed_turn_ends_its_session():
    turns = [TurnResult(0, k, _ok(0.1 * k, 100 * k), cached_tokens=50 * (k - 1)) for k in range(1, 11)]
    turns.append(TurnResult(1, 1, RequestResult(ok=False, error="status 503: busy", kind="status 503")))
    stats = {d["depth"]: d for d in depth_stats(turns)}
    assert list(stats) == ["1", "2-4", "5-8", "9-16"]
    assert (stats["1"]["requests"], stats["1"]["errors"], stats["2-4"]["requests"]) == (2, 1, 3)
    assert stats["2-4"]["prompt_tokens_mean"] == 300 and stats["9-16"]["cached_tokens"] == 400 + 450
    assert stats["2-4"]["ttft_ms"]["p50"] == pytest.approx(300)
    level = agentic_level(turns, 2.0, 2, planned_turns=20, goodput_slo={"ttft_ms": 550})
    assert (level["requests"], level["errors"], level["sessions"], level["turns_skipped"]) == (11, 1, 2, 9)
    assert level["goodput"]["good"] == 5 and level["reported_cached_tokens"] == sum(50 * k for k in range(10))


PAGE = """# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{cache_source="device",engine_type="prefill",model_name="m"}} {device}
sglang:cached_tokens_total{{cache_source="host",engine_type="prefill",model_name="m"}} {host}
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{engine_type="prefill",is_streaming="true",model_name="m"}} {prompt}
"""


def test_hit_rate_from_the_engines_counters():
    assert cache_counts("# nothing yet\n") == {"cached": 0.0, "prompt": 0.0}  # both created lazily
    before = ({"a": cache_counts(PAGE.format(device=10, host=0, prompt=100)), "b": cache_counts("")}, {})
    after = ({"a": cache_counts(PAGE.format(device=900, host=40, prompt=1100)),
              "b": cache_counts(PAGE.format(device=5, host=0, prompt=50))}, {})
    cache = level_cache(before, after)
    assert (cache["cached_tokens"], cache["prompt_tokens"]) == (935, 1050)
    assert cache["hit_rate"] == round(935 / 1050, 4) and cache["engines"] == ["a", "b"]
    unread = level_cache(before, ({"a": after[0]["a"]}, {"b": "HTTP 503"}))
    assert unread["engines"] == ["a"] and unread["unread"] == {"b": "HTTP 503"}
    assert level_cache(({}, {}), ({}, {}))["hit_rate"] is None


# ---- the report ------------------------------------------------------------------------------

def _record(rid: str, hit: float, ttft_p50: float) -> dict:
    w = AgenticWorkload.generated(SMALL)
    depth = [{"depth": "1", "requests": 3, "errors": 0, "prompt_tokens_mean": 73.0, "cached_tokens": None,
              "ttft_ms": {"mean": ttft_p50, "p50": ttft_p50, "p99": ttft_p50}, "tpot_ms": {"mean": 1, "p50": 1,
                                                                                       "p99": 1}}]
    ms = {"mean": 5.0, "p50": 5.0, "p99": 6.0}
    level = {"concurrency": 3, "requests": 12, "completed": 12, "errors": 0, "output_tok_s": 100.0,
             "requests_s": 4.0, "ttft_ms": ms, "tpot_ms": ms, "itl_ms": ms, "e2e_ms": ms, "by_depth": depth,
             "prefix_cache": {"engines": ["h/prefill"], "hit_rate": hit, "cached_tokens": 9, "prompt_tokens": 10},
             "kv": {"mb_per_request": 2.5, "transfers": 12}}
    env = {"spec_hash": "0" * 64, "engine": "sim", "sglang_versions": ["0.5.23"], "router": "smg 1.13.0",
           "gpus": [], "engine_flags": {}}
    return {"id": rid, "label": "", "time": "t", "tool": "pdkit", "router_url": "http://r", "cluster": "c",
            "model": "m", "input_len": 65, "output_len": 8, "requests": 12, "warmup": 1,
            "workload": w.describe(), "levels": [level], "env": env, "cache_engines": ["h/prefill"]}


def test_markdown_and_compare_of_agentic_runs():
    a, b = _record("A", 0.9, 40.0), _record("B", 0.95, 20.0)
    md = render_markdown(a)
    assert "agentic workload, generated (seed 1): system prompt 50 tokens shared by every session" in md
    assert "| prefix hit | KV MB/turn |" in md and md.count("| 90.0% | 2.5 |") == 1
    assert "| 3 | 1 | 3 | 0 | 73.0 | 40.0 | 40.0 | 1 | 1 |" in md
    text = render_compare(a, b)
    assert "same spec hash, flags and workload" in text
    assert "| 3 | prefix hit | 90.0% | 95.0% | 1.06 |" in text
    assert "| 3 | TTFT p50 ms, turns 1 | 40.0 | 20.0 | 0.50 |" in text
    # an old fixed-length record (no workload key) against an agentic one: said, not hidden
    old = {**_record("O", 0.0, 1.0), "workload": None}
    old.pop("workload")
    assert "workload differs (not like for like)" in render_compare(old, a)


# ---- the context cap -----------------------------------------------------------------------

def test_a_workload_longer_than_the_cap_is_refused_naming_both(tmp_path):
    hosts = {"gpu01": {"ssh_hostname": "10.9.0.1", "pdkit_node": {
        "gpu": "none", "gpus": {"model": "virtual", "count": 1, "memory_gib": 80, "compute_capability": "9.0"},
        "engines": [{"name": "e", "role": "unified", "gpus": [0], "port": 30000}]},
        "pdkit_router": {"port": 8000}}}
    cluster = {"name": "c", "engine": "sim", "sglang_version": "0.5.23", "model": {"path": "/models/m"},
               "tuning": {"all": {"context_length": 8192}}}
    spec = load(str(write_inventory(tmp_path, hosts, cluster)))
    fits = AgenticParams(turns=4, system_tokens=2000, turn_tokens=600, reply_tokens=64)
    check_agentic(spec, AgenticWorkload.generated(fits), warmup=1)
    long = AgenticParams(turns=12, system_tokens=2000, turn_tokens=600, reply_tokens=64)
    with pytest.raises(ValueError) as caught:
        check_agentic(spec, AgenticWorkload.generated(long), warmup=1)
    assert str(caught.value) == (f"the agentic workload's largest context (system + turns x (turn + reply) tokens) = "
                                 f"{long.largest_context()} exceeds the planned context length 8192 (cluster tuning "
                                 "context_length)")


# ---- SGLang's own loader and parser, in the contract virtualenvs -----------------------------

def _contract_python(version: str) -> Path:
    python = sglang_python(version)
    if python is None:
        pytest.skip(f"the sglang {version} contract virtualenv is not built (`make contract-env`)")
    return python


def _run(python: Path, script: str, *args: str) -> dict:
    done = subprocess.run([str(python), "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# Loads the wheel's own sglang/benchmark/datasets/{common,agentic_trace}.py by path: importing the
# package runs sglang/__init__ (torch, triton, transformers: not in a CPU contract env). Only the
# type hint PreTrainedTokenizerBase is taken from transformers, and load() never uses the tokenizer.
# Then the multi-turn check of serving.py (its own _normalize_round_messages, from its source).
LOADER = """
import ast, importlib.util, json, os, sys, types, typing
root = os.path.dirname(importlib.util.find_spec("sglang").origin)
for name in ("sglang", "sglang.benchmark", "sglang.benchmark.datasets"):
    stub = types.ModuleType(name); stub.__path__ = []; sys.modules[name] = stub
if importlib.util.find_spec("transformers") is None:
    tf = types.ModuleType("transformers"); tf.PreTrainedTokenizerBase = object; sys.modules["transformers"] = tf
def load(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, rel))
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod); return mod
load("sglang.benchmark.datasets.common", "benchmark/datasets/common.py")
at = load("sglang.benchmark.datasets.agentic_trace", "benchmark/datasets/agentic_trace.py")
path, num, out_len, offset = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = at.AgenticTraceDataset(dataset_path=path, num_requests=num, fixed_output_len=out_len, offset=offset,
                              max_turns=None).load(tokenizer=None)
serving = os.path.join(root, "benchmark", "serving.py")
tree = ast.parse(open(serving).read())
(fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_normalize_round_messages"]
ns = dict(vars(typing)); exec(compile(ast.Module([fn], []), serving, "exec"), ns)
norm = ns["_normalize_round_messages"]
print(json.dumps({"rows": [[norm(r) for r in row.prompt] for row in rows],
                  "output_len": [row.output_len for row in rows], "prompt_len": [row.prompt_len for row in rows]}))
"""


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglangs_own_loader_replays_exactly_the_sessions_pdkit_sends(version, tmp_path):
    python = _contract_python(version)
    w = AgenticWorkload.generated(SMALL, levels=2)
    path = tmp_path / "trace.json"
    write_trace(generate_trace(SMALL, len(w.trace.conversations)), path)
    for level in (0, 1):
        got = _run(python, LOADER, str(path), str(w.sessions), str(w.reply_tokens), str(w.offset(level)))
        # every round normalised (serving.py's multi-turn test), the same messages pdkit's client sends
        assert got["rows"] == [[list(turn) for turn in conv] for conv in w.level_conversations(level)]
        assert got["output_len"] == [SMALL.reply_tokens] * SMALL.sessions
        assert got["prompt_len"] == [SMALL.prompt_tokens(1)] * SMALL.sessions


# Builds serving.py's cli_main parser from the wheel's source (importing the module needs torch,
# triton and transformers): cli_main and the definitions it uses, with run_benchmark replaced by a
# function that prints the parsed arguments. A bad argv fails the way it would on a GPU node.
PARSER = """
import argparse, ast, importlib.util, json, os, sys, typing
root = os.path.dirname(importlib.util.find_spec("sglang").origin)
def tree_of(rel):
    path = os.path.join(root, "benchmark", rel)
    return path, ast.parse(open(path).read())
path, tree = tree_of("serving.py")
keep, backends = [], None
for node in tree.body:
    names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in (
            "LoRAPathAction", "_finite_positive_float", "_goodput_slo", "_validate_parsed_gsp_args", "cli_main"):
        keep.append(node)
    elif "_DEFAULT_SGLANG_FLUSH_CACHE_TIMEOUT" in names:
        keep.append(node)
    elif "ASYNC_REQUEST_FUNCS" in names:
        backends = [k.value for k in node.value.keys]
ns = dict(vars(typing), argparse=argparse, ArgumentParser=argparse.ArgumentParser,
          ASYNC_REQUEST_FUNCS=dict.fromkeys(backends))
if os.path.exists(os.path.join(root, "benchmark", "goodput.py")):
    for node in tree_of("goodput.py")[1].body:
        if any(getattr(t, "id", "") == "GOODPUT_SLO_METRICS" for t in getattr(node, "targets", [])):
            ns["GOODPUT_SLO_METRICS"] = ast.literal_eval(node.value)
ns["run_benchmark"] = lambda args: print(json.dumps(vars(args), default=str))
exec(compile(ast.Module(keep, []), path, "exec"), ns)
sys.argv = ["sglang.benchmark.serving", *sys.argv[1:]]
try:
    ns["cli_main"]()
except SystemExit as exc:
    print(json.dumps({"exit": exc.code}))
"""


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_the_agentic_argv_is_parsed_by_sglangs_own_parser(version):
    python = _contract_python(version)
    argv = sglang_agentic_command("/venv/bin/python", "http://10.0.0.1:8000", "m", "/models/m", 4, 8, 16, 64, 3,
                                  1, "/tmp/trace.json", "/tmp/out.jsonl")
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.benchmark.serving"]
    args = _run(python, PARSER, *argv[3:])
    assert "exit" not in args, args
    assert (args["backend"], args["dataset_name"], args["dataset_path"]) == ("sglang-oai-chat", "agentic-trace",
                                                                             "/tmp/trace.json")
    assert (args["num_prompts"], args["dataset_offset"], args["max_concurrency"]) == (8, 16, 4)
    assert (args["sharegpt_output_len"], args["agentic_max_turns"], args["warmup_requests"]) == (64, 3, 1)
    assert (args["base_url"], args["model"], args["tokenizer"], args["output_file"]) == (
        "http://10.0.0.1:8000", "m", "/models/m", "/tmp/out.jsonl")
    assert args["disable_ignore_eos"] is False  # every reply exactly reply_tokens long, as pdkit's client asks
    # the parser is the real one: a misspelt dataset is refused
    bad = [a if a != "agentic-trace" else "agentic-traces" for a in argv[3:]]
    assert _run(python, PARSER, *bad) == {"exit": 2}


def test_a_turn_refused_for_length_says_the_engines_counts_first(monkeypatch):
    """On the lent H100 turn 4 reached 4,597 tokens where the workload planned 3,366, and the gate showed
    only SGLang's words, cut at 200 characters. The session's error now leads with the engine's own counts."""
    import asyncio

    from pdkit.bench import agentic
    from pdkit.bench.stats import RequestResult

    refusal = ('status 400: data: {"error": {"message": "The input (4597 tokens) is longer than the model\'s '
               'context length (4096 tokens)."}}')
    answers = iter([(RequestResult(ok=True, ttft=0.1, latency=0.2, output_tokens=64, prompt_tokens=3100), "ok", None),
                    (RequestResult(ok=False, error=refusal), "", None)])

    async def fake_stream(*args, **kwargs):
        return next(answers)

    monkeypatch.setattr(agentic, "stream_chat", fake_stream)
    turns = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}], [{"role": "user", "content": "c"}]]
    out = asyncio.run(agentic.play_session(None, "http://r", {}, "m", 3, turns, 64, 0.0, 5.0))
    assert [t.result.ok for t in out] == [True, False]  # the session ends at the refused turn
    error = out[1].result.error
    assert error.startswith("over the context cap: session 3 turn 2: 4597 prompt tokens by the engine's count, "
                            "cap 4096 (turn 1 was 3100 and its reply 64 tokens)"), error
    assert error.endswith(refusal)
    # any other failure keeps its own words
    assert agentic.over_cap("status 503: no workers", 0, 1, 0, 64) is None


@pytest.mark.parametrize("rate, params, refused", [
    (1.0, dict(system_tokens=1500, turn_tokens=400, reply_tokens=64), False),  # the sim counts as estimated
    (1.93, dict(system_tokens=1500, turn_tokens=400, reply_tokens=64), True),  # the lent H100's first sizes
    (1.93, dict(system_tokens=800, turn_tokens=200, reply_tokens=48), False),  # the sizes that ran there
])
def test_the_engines_count_of_the_warmup_refuses_a_workload_over_the_cap(rate, params, refused):
    """On the lent H100 the engine counted 1.9 tokens a generated word; the 4-turn sessions planned at
    3,366 tokens were refused at turn 4 mid-level. The warm-up's count now scales the plan first."""
    from pdkit.bench.agentic import check_counted, estimated_tokens, warmup_messages
    from pdkit.bench.stats import RequestResult
    from pdkit.inventory.loader import load

    spec = load(str(Path(__file__).parents[1] / "inventories" / "h200-nspawn.py"))  # context_length 4096
    workload = AgenticWorkload.generated(AgenticParams(sessions=2, turns=4, think_s=0.0, **params))
    counted = round(estimated_tokens(warmup_messages(workload)) * rate)
    warmup = [TurnResult(0, 1, RequestResult(ok=True, ttft=0.1, latency=0.2, output_tokens=1, prompt_tokens=counted)),
              TurnResult(1, 1, RequestResult(ok=False, error="status 503"))]
    if refused:
        with pytest.raises(ValueError, match=r"the engine counts 1\.93x .* over the planned context length 4096 "
                                             r".* by 0\.\d\d or less"):
            check_counted(spec, workload, warmup)
    else:
        assert check_counted(spec, workload, warmup) == pytest.approx(rate, abs=0.01)
    assert check_counted(spec, workload, warmup[1:]) is None  # no count: nothing to scale by
