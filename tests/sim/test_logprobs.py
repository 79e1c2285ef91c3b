"""Logprobs on native /generate (issue 44): SGLang's shapes, a model teacher forcing can score, drift.

Shapes follow the pinned wheels (sglang-0.5.17 and 0.5.23, sglang/srt/...):
- managers/io_struct.py GenerateReqInput: return_logprob (False), logprob_start_len (-1), top_logprobs_num (0),
  token_ids_logprob (None; [] is None), return_text_in_logprobs (False);
- managers/scheduler.py handle_generate_request: logprob_start_len -1 with return_logprob means len(prompt)
  (no input logprobs); above len(prompt) the request is aborted with 400 "... Please use a smaller
  logprob_start_len.";
- managers/scheduler_components/logprob_result_processor.py _process_input_token_logprobs: input values are
  [None] + computed[:-1] (the first position from logprob_start_len has no logprob), ids origin_input_ids[start:];
  _process_input_top_logprobs: the first top row None too; no input positions: [] (_initialize_empty_...);
- managers/tokenizer_manager.py add_logprob_to_meta_info / detokenize_logprob_tokens: [logprob, id, text-or-None]
  per position, output_token_logprobs_length, top rows as lists of top_logprobs_num entries (an empty row: None);
- managers/scheduler_components/output_streamer.py: "Decode server does not send input logprobs" (a PD
  decode's input_token_logprobs is []); disaggregation/decode.py _commit_transfer_to_req: the decode's first
  output logprob and top logprobs are the prefill's, its token_ids_logprob row for it empty (None).
"""

from __future__ import annotations

import json
import math
import statistics
import threading

import pytest

from pdkit.sim.textgen import (
    MODEL_VOCAB_SIZE,
    TOP_RANKS,
    Drift,
    TokenStream,
    advance,
    detokenize,
    expected_ids,
    prefix_state,
    prompt_scores,
    score,
    tokenize,
)

from .conftest import start_pd_stack
from .support import Processes, free_ports, post, start_sim

SEED = 0
PROMPT = "the quick brown fox jumps over the lazy dog"
TORCH_COMPILE = "--enable-torch-compile"


# ---- the model, pure --------------------------------------------------------------------------

def test_teacher_forced_top1_is_the_greedy_output_and_scores_it_as_generated():
    prompt = tokenize(PROMPT)
    out = expected_ids(prompt, SEED, 40)
    # from len(prompt) - 1: the first entry (the prompt's last token) is None, then one per output token
    scores = prompt_scores(prompt + out, SEED, len(prompt) - 1, top_n=3)
    assert scores[0] is None and len(scores) == 41
    assert [s.top[0][1] for s in scores[1:]] == out
    assert all(s.logprob == s.top[0][0] for s in scores[1:])
    # the text tokenises back to the output ids, so teacher forcing by text scores the same ids
    assert tokenize(PROMPT + detokenize(out)) == prompt + out
    # a wrong token is not top-1 and scores lower
    wrong = out[:10] + [(out[10] + 1) % 512] + out[11:]
    forced = prompt_scores(prompt + wrong, SEED, len(prompt) - 1, top_n=1)
    assert forced[11].top[0][1] != wrong[10] and forced[11].logprob < forced[11].top[0][0]


def test_the_distribution_is_a_distribution():
    state = prefix_state(tokenize(PROMPT), SEED)
    pos = score(state, 0, top_n=TOP_RANKS)
    values = [r[0] for r in pos.top]
    assert -0.6 <= values[0] <= -0.1
    assert values == sorted(values, reverse=True) and len({r[1] for r in pos.top}) == TOP_RANKS
    floor = score(state, MODEL_VOCAB_SIZE - 1).logprob  # an id outside the output vocabulary
    assert floor < min(values) - 2
    total = sum(math.exp(v) for v in values) + (MODEL_VOCAB_SIZE - TOP_RANKS) * math.exp(floor)
    assert total == pytest.approx(1.0, abs=1e-9)
    # a top-k token's logprob is its top-k value, whichever way it is asked
    for lp, tid, _ in pos.top:
        assert score(state, tid).logprob == lp
        assert score(state, 0, token_ids=[tid]).ids == [[lp, tid, None]]


@pytest.mark.parametrize("drift", [None, Drift(0.3, 0.02, 150, 2)])
@pytest.mark.parametrize("running", [1, 3])
def test_the_inlined_prompt_scoring_is_the_per_position_model(drift, running):
    ids = tokenize(" ".join(f"w{i}" for i in range(300))) + expected_ids([1, 2, 3], SEED, 50)
    state, slow = prefix_state(ids[:4], SEED), [None]
    for i in range(4, len(ids)):
        slow.append(score(state, ids[i], 5, None, bool(drift and drift.diverges(i, running)),
                          drift.sigma(i, 2) if drift else 0.0))
        state = advance(state, ids[i])
    assert prompt_scores(ids, SEED, 3, 5, None, drift, 2, running) == slow


def test_the_output_depends_on_the_whole_prefix_and_the_seed():
    a = tokenize("one two three four")
    b = tokenize("zero two three four")  # only the first word differs
    assert expected_ids(a, 0, 8) != expected_ids(b, 0, 8)
    assert expected_ids(a, 0, 8) != expected_ids(a, 1, 8)
    assert expected_ids(a, 0, 8)[:3] == expected_ids(a, 0, 3)


def test_noise_grows_with_the_position_and_the_load():
    prompt = tokenize(" ".join(f"w{i}" for i in range(4000)))
    clean = prompt_scores(prompt, SEED, 0, top_n=2)

    def spread(drift: Drift, load: int, lo: int, hi: int) -> float:
        noisy = prompt_scores(prompt, SEED, 0, top_n=2, drift=drift, load=load)
        return statistics.pstdev(n.top[1][0] - c.top[1][0] for n, c in zip(noisy[lo:hi], clean[lo:hi]))

    by_length = Drift(0.02, 0.0, 0, 1)
    assert spread(by_length, 0, 1, 500) < 0.012 < 0.05 < spread(by_length, 0, 3000, 4000)
    by_load = Drift(0.0, 0.01, 0, 1)
    assert spread(by_load, 0, 1, 4000) == 0.0
    assert spread(by_load, 2, 1, 4000) == pytest.approx(0.02, rel=0.15)
    assert spread(by_load, 8, 1, 4000) == pytest.approx(0.08, rel=0.15)
    # the same figures again at the same load, and the ranking never moves
    assert prompt_scores(prompt, SEED, 0, top_n=2, drift=by_load, load=8) == \
        prompt_scores(prompt, SEED, 0, top_n=2, drift=by_load, load=8)
    assert all(n.top[0][1] == c.top[0][1] for n, c in
               zip(prompt_scores(prompt, SEED, 0, top_n=2, drift=by_load, load=8)[1:], clean[1:]))


def test_divergence_only_past_the_threshold_and_only_under_load():
    prompt = tokenize(" ".join(f"w{i}" for i in range(300)))
    clean = prompt_scores(prompt, SEED, 0, top_n=1)
    drift = Drift(0.0, 0.0, 200, 4)
    alone = prompt_scores(prompt, SEED, 0, top_n=1, drift=drift, running=3)
    assert alone == clean
    loaded = prompt_scores(prompt, SEED, 0, top_n=1, drift=drift, running=4)
    assert loaded[:200] == clean[:200]
    assert all(x.top[0][1] != c.top[0][1] for x, c in zip(loaded[200:], clean[200:]))
    # greedy output diverges at the same position
    stream = TokenStream(prompt[:200], SEED)
    assert stream.next_id(drift.diverges(200, 4)) != TokenStream(prompt[:200], SEED).next_id()


# ---- engines over HTTP --------------------------------------------------------------------------

def _gen(url: str, body: dict, **extra) -> dict:
    resp = post(f"{url}/generate", {**body, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Two unified engines with the same argv (one with the drift armed on a flag it does not have), and
    one whose argv matches the drift (noise per 1k tokens, and divergence past 40 tokens under load)."""
    group = Processes(tmp_path_factory.mktemp("logprobs"))
    a, b, c = free_ports(3)
    extra = ["--context-length", "4096", "--random-seed", str(SEED)]
    drift_env = {"PDKIT_SIM_DRIFT_WHEN": TORCH_COMPILE, "PDKIT_SIM_DRIFT_LOGPROB_PER_1K": "0.5",
                 "PDKIT_SIM_DIVERGE_FROM_POSITION": "40", "PDKIT_SIM_DIVERGE_MIN_BATCH": "4",
                 "PDKIT_SIM_DECODE_BASE_MS": "5"}
    try:
        start_sim(group, "plain", "null", a, extra=extra, env={"PDKIT_SIM_DECODE_BASE_MS": "5"})
        start_sim(group, "armed", "null", b, extra=extra, env=drift_env)
        start_sim(group, "drifting", "null", c, extra=[*extra, TORCH_COMPILE], env=drift_env)
        yield tuple(f"http://127.0.0.1:{p}" for p in (a, b, c))
    finally:
        group.stop_all()


def test_shapes_by_default_and_with_top_logprobs(engines):
    url = engines[0]
    prompt = tokenize(PROMPT)
    plain = _gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 5}})
    assert not any("logprob" in k for k in plain["meta_info"])
    body = _gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 5}}, return_logprob=True)
    meta = body["meta_info"]
    # logprob_start_len -1: output logprobs only
    assert meta["input_token_logprobs"] == [] and "input_top_logprobs" not in meta
    assert [e[1] for e in meta["output_token_logprobs"]] == body["output_ids"] == expected_ids(prompt, SEED, 5)
    assert all(len(e) == 3 and e[2] is None and -0.6 <= e[0] <= -0.1 for e in meta["output_token_logprobs"])
    assert meta["output_token_logprobs_length"] == 5
    top = _gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 5}}, return_logprob=True,
               top_logprobs_num=3, logprob_start_len=0)["meta_info"]
    assert [e[1] for e in top["input_token_logprobs"]] == prompt
    assert top["input_token_logprobs"][0] == [None, prompt[0], None] and top["input_top_logprobs"][0] is None
    assert all(isinstance(e[0], float) for e in top["input_token_logprobs"][1:])
    assert all(len(row) == 3 and row[0][0] >= row[1][0] >= row[2][0] for row in top["input_top_logprobs"][1:])
    assert len(top["output_top_logprobs"]) == 5
    assert all(row[0][:2] == e[:2] for row, e in zip(top["output_top_logprobs"], top["output_token_logprobs"]))
    # the first scored position is None from any start; the whole prompt: no input positions
    mid = _gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}, return_logprob=True,
               logprob_start_len=4, top_logprobs_num=1)["meta_info"]
    assert [e[1] for e in mid["input_token_logprobs"]] == prompt[4:] and mid["input_token_logprobs"][0][0] is None
    assert mid["input_token_logprobs"][1:] == top["input_token_logprobs"][5:]
    end = _gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}, return_logprob=True,
               logprob_start_len=len(prompt), top_logprobs_num=2)["meta_info"]
    assert end["input_token_logprobs"] == [] and end["input_top_logprobs"] == []
    over = post(f"{url}/generate", {"input_ids": prompt, "return_logprob": True, "logprob_start_len": len(prompt) + 1})
    assert over.status_code == 400 and "Please use a smaller logprob_start_len" in over.json()["error"]["message"]


def test_token_ids_logprob_and_text(engines):
    url = engines[0]
    prompt = tokenize(PROMPT)
    meta = _gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3}}, return_logprob=True,
                logprob_start_len=0, token_ids_logprob=[5, 7], return_text_in_logprobs=True)["meta_info"]
    assert meta["input_token_ids_logprobs"][0] is None
    assert all([e[1] for e in row] == [5, 7] for row in meta["input_token_ids_logprobs"][1:])
    assert all([e[1] for e in row] == [5, 7] for row in meta["output_token_ids_logprobs"])
    assert [e[2] for e in meta["output_token_logprobs"]] == [" " + w for w in detokenize(
        [e[1] for e in meta["output_token_logprobs"]]).split(" ")[1:]]
    bad = post(f"{url}/generate", {"input_ids": prompt, "return_logprob": True, "token_ids_logprob": [MODEL_VOCAB_SIZE]})
    assert bad.status_code == 400 and "out-of-vocabulary" in bad.text


def test_streamed_events_carry_the_logprobs_so_far(engines):
    url = engines[0]
    resp = post(f"{url}/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}, "stream": True,
                                    "return_logprob": True}, stream=True)
    events = [line[6:] for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    bodies = [json.loads(e) for e in events if e != "[DONE]"]
    lengths = [len(b["meta_info"]["output_token_logprobs"]) for b in bodies]
    assert lengths == [len(b["output_ids"]) for b in bodies] and lengths[-1] == 4


def test_teacher_forcing_agrees_with_greedy_and_engines_agree(engines):
    plain, armed, drifting = engines
    prompt = tokenize(PROMPT)
    gen = _gen(plain, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 30}}, return_logprob=True,
               top_logprobs_num=2)
    out = gen["output_ids"]
    forced = {"input_ids": prompt + out, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
              "logprob_start_len": len(prompt) - 1, "top_logprobs_num": 2}
    scored = _gen(plain, forced)["meta_info"]
    assert [row[0][1] for row in scored["input_top_logprobs"][1:]] == out
    assert [e[0] for e in scored["input_token_logprobs"][1:]] == [e[0] for e in gen["meta_info"]["output_token_logprobs"]]
    # an engine whose argv does not match the drift is exactly the same
    assert _strip(_gen(armed, forced)) == _strip({"meta_info": scored})
    assert _gen(armed, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 30}})["output_ids"] == out
    # the drifting engine: the same ranking here (alone: no divergence), other figures
    drifted = _gen(drifting, forced)["meta_info"]
    assert [row[0][1] for row in drifted["input_top_logprobs"][1:]] == out
    assert [e[0] for e in drifted["input_token_logprobs"]] != [e[0] for e in scored["input_token_logprobs"]]


def _strip(body: dict) -> dict:
    meta = dict(body["meta_info"])
    for key in ("id", "e2e_latency", "cached_tokens"):
        meta.pop(key, None)
    return meta


def test_divergence_under_load_only(engines):
    plain, _, drifting = engines
    prompt = tokenize(" ".join(f"w{i}" for i in range(30)))  # 31 tokens: outputs from position 31
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 30}}
    clean = _gen(plain, body)["output_ids"]
    assert _gen(drifting, body)["output_ids"] == clean  # alone: below DIVERGE_MIN_BATCH
    results: list[list[int]] = []

    def one() -> None:
        results.append(_gen(drifting, body)["output_ids"])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first_off = [next((k for k, (x, y) in enumerate(zip(r, clean)) if x != y), None) for r in results]
    # never before the threshold (position 40 = output token 9), and some request ran with 4 others
    assert all(k is None or k >= 40 - len(prompt) for k in first_off), first_off
    assert any(k is not None for k in first_off), first_off


# ---- PD ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    group = Processes(tmp_path_factory.mktemp("logprobs_pd"))
    try:
        yield start_pd_stack(group)
    finally:
        group.stop_all()


def test_pd_prefill_and_decode_shapes(pd):
    prompt = tokenize(PROMPT)
    n = len(prompt)
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6}, "return_logprob": True,
            "logprob_start_len": 2, "top_logprobs_num": 2, "token_ids_logprob": [3]}
    routed = _gen(pd.router_url, body)
    out = routed["output_ids"]
    assert out == expected_ids(prompt, SEED, 6)
    meta = routed["meta_info"]
    # the router puts the prefill's input logprobs in front of the decode's (which are []) ...
    assert [e[1] for e in meta["input_token_logprobs"]] == prompt[2:] and meta["input_token_logprobs"][0][0] is None
    # ... but not its input top logprobs (smg 1.13, observed): the decode's [] comes through
    assert meta["input_top_logprobs"] == []
    assert [e[1] for e in meta["output_token_logprobs"]] == out
    assert meta["output_token_ids_logprobs"][0] is None  # the prefill's token: no token_ids_logprob row
    assert all([e[1] for e in row] == [3] for row in meta["output_token_ids_logprobs"][1:])
    # the figures are the unified model's: teacher forcing prompt + output scores the same
    forced = prompt_scores(prompt + out, SEED, n - 1, top_n=2)
    assert [e[0] for e in meta["output_token_logprobs"]] == pytest.approx([s.logprob for s in forced[1:]])
    assert [[e[1] for e in row] for row in meta["output_top_logprobs"]] == [[r[1] for r in s.top] for s in forced[1:]]
    # each side's own answer, asked as the router asks (the same body to both, with bootstrap fields)
    pd_body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": pd.bootstrap_port, "bootstrap_room": 4242}
    answers: dict[str, dict] = {}

    def ask(side: str, url: str) -> None:
        answers[side] = _gen(url, pd_body)

    threads = [threading.Thread(target=ask, args=a) for a in (("prefill", pd.prefill_url), ("decode", pd.decode_url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p_meta, d_meta = answers["prefill"]["meta_info"], answers["decode"]["meta_info"]
    # (the router re-prints floats: the last digit may differ)
    assert [e[1] for e in p_meta["input_token_logprobs"]] == [e[1] for e in meta["input_token_logprobs"]]
    assert [e[0] for e in p_meta["input_token_logprobs"][1:]] == \
        pytest.approx([e[0] for e in meta["input_token_logprobs"][1:]], rel=1e-12)
    assert [row and [e[1] for e in row] for row in p_meta["input_top_logprobs"]] == \
        [None] + [[r[1] for r in s.top] for s in prompt_scores(prompt, SEED, 2, top_n=2)[1:]]
    assert p_meta["output_token_logprobs"][0][1] == out[0]
    assert p_meta["output_token_logprobs"][0][0] == pytest.approx(meta["output_token_logprobs"][0][0], rel=1e-12)
    assert d_meta["input_token_logprobs"] == [] and d_meta["input_top_logprobs"] == []
    assert d_meta["input_token_ids_logprobs"] == []
    assert [e[1] for e in d_meta["output_token_logprobs"]] == out
    assert d_meta["output_token_logprobs"][0] == p_meta["output_token_logprobs"][0]
    assert d_meta["output_top_logprobs"][0] == p_meta["output_top_logprobs"][0]


@pytest.mark.parametrize("env,argv_extra,want", [
    # one condition for both: noise and divergence on the lever's engine
    ({"PDKIT_SIM_DRIFT_WHEN": "--chunked-prefill-size=4096"}, ["--chunked-prefill-size", "4096"], (0.01, 100)),
    # the divergence's own condition: this lever drifts, the divergence waits for the other
    ({"PDKIT_SIM_DRIFT_WHEN": "--chunked-prefill-size=4096", "PDKIT_SIM_DIVERGE_WHEN": "--enable-torch-compile"},
     ["--chunked-prefill-size", "4096"], (0.01, 0)),
    ({"PDKIT_SIM_DRIFT_WHEN": "--chunked-prefill-size=4096", "PDKIT_SIM_DIVERGE_WHEN": "--enable-torch-compile"},
     ["--enable-torch-compile"], (0.0, 100)),
    ({"PDKIT_SIM_DRIFT_WHEN": "--chunked-prefill-size=4096"}, [], None),
])
def test_diverge_when_gives_the_divergence_its_own_lever(env, argv_extra, want):
    import logging

    from pdkit.sim.args import parse_args
    from pdkit.sim.knobs import load_knobs
    from pdkit.sim.metrics import SimMetrics
    from pdkit.sim.scheduler import Scheduler

    args = parse_args(["--model-path", "/m", "--port", "30000", *argv_extra])
    knobs = load_knobs({**env, "PDKIT_SIM_DRIFT_LOGPROB_PER_1K": "0.01", "PDKIT_SIM_DIVERGE_FROM_POSITION": "100"})
    sched = Scheduler(args, knobs, SimMetrics("m", "unified"), logging.LoggerAdapter(logging.getLogger("t"), {}))
    got = None if sched.drift is None else (sched.drift.per_1k, sched.drift.diverge_after)
    assert got == want
