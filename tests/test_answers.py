"""The graded answer gate's pure parts (pdkit/clients/answers.py): lengths under the cap, SGLang's logprob
shapes, the drift figures and the verdicts per lever class. The HTTP parts run against sim engines
(tests/sim/test_answers_sim.py) and on the lab (tests/lab/test_answers_lab.py)."""

from __future__ import annotations

import json
import math

import pytest

from pdkit.bench.measure import merge_input_logprobs
from pdkit.clients import answers
from pdkit.clients.answers import GateConfig, Tolerance


def test_the_corpus_is_real_text_long_enough_for_32k_prompts():
    words = answers.corpus_text().split()
    assert len(words) > 40_000
    # real text, not one word repeated: the 32K-token slice has thousands of distinct words
    assert len(set(answers.text_slice(words, 30_000, 2).split())) > 5_000


def test_each_length_starts_elsewhere_so_no_prompt_is_a_prefix_of_another():
    words = answers.corpus_text().split()
    a, b = answers.text_slice(words, 700, 0), answers.text_slice(words, 5_000, 1)
    assert not b.startswith(a) and not a.startswith(b[:200])
    assert answers.text_slice(words, 700, 0) == a  # the same on every run


def test_the_users_own_corpus_replaces_the_kits(tmp_path):
    own = tmp_path / "mine.txt"
    own.write_text("alpha beta gamma " * 10)
    assert answers.corpus_text(str(own)).split()[:3] == ["alpha", "beta", "gamma"]
    assert answers.corpus_digest(str(own)) != answers.corpus_digest()
    assert GateConfig(corpus=str(own)).key() != GateConfig().key()


def test_lengths_above_the_cap_are_left_out_and_said():
    kept, notes = answers.usable_lengths([1024, 8192, 32768], 16384, 32)
    room = 16384 - 32 - answers.CAP_MARGIN_TOKENS
    assert kept == [1024, 8192, room]  # the longest the cap allows in place of those above it
    assert notes[0].startswith("32768 tokens: above the context cap (16384 - 32 scored")
    assert answers.usable_lengths([1024, 8192], 16384, 32) == ([1024, 8192], [])
    # a cap below every length: the longest prompt it allows, rather than no long prompt
    kept, notes = answers.usable_lengths([1024], 512, 32)
    assert kept == [512 - 32 - answers.CAP_MARGIN_TOKENS] and "longest prompt the cap allows" in notes[-1]


def test_the_context_refusal_names_the_cap():
    # SGLang's own words (tokenizer_manager.py _validate_one_request, both pinned releases)
    body = ("The input (40000 tokens) is longer than the model's context length (32768 tokens).")
    assert int(answers.CONTEXT_REFUSAL.search(body).group(1)) == 32768


def _entry(lp, i):
    return [lp, i, None]


def test_scored_reads_the_continuation_from_sglangs_input_logprobs():
    meta = {"input_token_logprobs": [_entry(None, 1), _entry(-0.5, 7), _entry(-0.1, 8), _entry(-0.2, 9)],
            "input_top_logprobs": [None, [_entry(-0.5, 7)], [_entry(-0.1, 8), _entry(-3, 4)], [_entry(-0.2, 9)]]}
    logprobs, top = answers.scored(meta, [8, 9])
    assert logprobs == [-0.1, -0.2]
    assert top == [[(-0.1, 8), (-3.0, 4)], [(-0.2, 9)]]
    assert answers.prompt_ids(meta) == [1, 7, 8, 9]
    with pytest.raises(ValueError, match="not the continuation"):
        answers.scored(meta, [9, 9])


def _item(logprobs, tops, length=1000):
    return {"length": length, "prompt_tokens": length, "logprobs": logprobs, "top": tops}


def test_identical_scores_have_zero_drift():
    tops = [[(-0.1, 5), (-2.5, 6)], [(-0.3, 7), (-1.5, 2)]]
    row = answers.compare_forced(_item([-0.1, -0.3], tops), _item([-0.1, -0.3], tops))
    assert row["mean_abs_delta"] == 0 and row["max_abs_delta"] == 0
    assert row["top1_agreement"] == 1.0 and row["kl"] == 0 and row["first_top1_disagreement"] is None


def test_drift_is_measured_per_position_and_the_first_disagreement_located():
    base = _item([-0.1, -0.3, -0.2], [[(-0.1, 5)], [(-0.3, 7)], [(-0.2, 1)]])
    cand = _item([-0.2, -0.3, -1.9], [[(-0.2, 5)], [(-0.3, 7)], [(-0.4, 9), (-1.9, 1)]])
    row = answers.compare_forced(base, cand)
    assert row["max_abs_delta"] == pytest.approx(1.7)
    assert row["mean_abs_delta"] == pytest.approx((0.1 + 0 + 1.7) / 3, abs=1e-6)
    assert row["top1_agreement"] == pytest.approx(2 / 3, abs=1e-6) and row["first_top1_disagreement"] == 2
    assert row["kl"] > 0


def test_kl_estimate():
    same = [(math.log(0.6), 1), (math.log(0.3), 2)]
    assert answers.kl_estimate(same, same) == pytest.approx(0.0, abs=1e-12)
    moved = [(math.log(0.3), 1), (math.log(0.6), 2)]
    expect = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6)  # the rest bucket is the same (0.1)
    assert answers.kl_estimate(same, moved) == pytest.approx(expect, rel=1e-9)
    # a token the candidate did not return counts at its lowest logprob minus the gap: a larger KL
    assert answers.kl_estimate(same, [(math.log(0.6), 1)]) > 0.1


ROWS_OK = [{"prompt_tokens": 1000, "mean_abs_delta": 0.01, "max_abs_delta": 0.2, "top1_agreement": 1.0,
            "first_top1_disagreement": None, "kl": 0.001}]


def test_a_numerics_lever_passes_within_tolerance_and_the_report_prints_the_drift():
    ok, why = answers.forced_verdict(ROWS_OK, Tolerance(), exact=False, part="forced")
    assert ok and "mean |d| 0.0100" in why and "1000 tok" in why


def test_an_exact_lever_fails_at_the_first_top1_disagreement_a_numerics_one_does_not():
    rows = [{**ROWS_OK[0], "top1_agreement": 0.98, "first_top1_disagreement": 17}]
    ok, why = answers.forced_verdict(rows, Tolerance(), exact=True, part="forced")
    assert not ok and "top-1 differs from token 17 (exact lever)" in why
    assert answers.forced_verdict(rows, Tolerance(), exact=False, part="forced")[0]


@pytest.mark.parametrize("field,value,words", [
    ("mean_abs_delta", 0.3, "mean |dlogprob| 0.3000 > 0.05"),
    ("max_abs_delta", 2.5, "max |dlogprob| 2.500 > 1"),
    ("top1_agreement", 0.5, "top-1 agreement 0.500 < 0.97"),
    ("kl", 0.5, "KL 0.5000 > 0.02"),
])
def test_each_tolerance_fails_its_own_figure_and_names_the_length(field, value, words):
    rows = [ROWS_OK[0], {**ROWS_OK[0], "prompt_tokens": 8000, field: value}]
    ok, why = answers.forced_verdict(rows, Tolerance(), exact=False, part="loaded (C=8)")
    assert not ok and why.startswith("loaded (C=8): 8000 tokens: ") and words in why
    assert "1000 tokens:" not in why.split("[measured")[0]


def test_a_pd_answer_gets_the_prefills_input_logprobs_in_front_as_the_router_merges_them():
    prefill = json.dumps({"meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 7, None]],
                                        "input_top_logprobs": [None, [[-0.5, 7, None]]]}})
    decode = json.dumps({"output_ids": [3], "meta_info": {"input_token_logprobs": [],
                                                          "output_token_logprobs": [[-0.2, 3, None]]}})
    merged = json.loads(merge_input_logprobs(prefill, decode))
    assert merged["meta_info"]["input_token_logprobs"] == [[None, 1, None], [-0.5, 7, None]]
    assert merged["meta_info"]["input_top_logprobs"] == [None, [[-0.5, 7, None]]]
    assert merged["meta_info"]["output_token_logprobs"] == [[-0.2, 3, None]] and merged["output_ids"] == [3]


class _Tokenizing:
    """An engine whose tokenizer makes TOKENS_PER_WORD tokens of a word and refuses prompts over CAP with
    SGLang's words (tokenizer_manager.py _validate_one_request); it answers greedy ids and scores."""

    def __init__(self, tokens_per_word: float, cap: int, pd: bool = False):
        self.tokens_per_word, self.cap, self.asked, self.pd = tokens_per_word, cap, [], pd

    def ask_blocking(self, payloads, concurrency, timeout_s):
        (payload,) = payloads
        if "text" in payload:
            n = round(len(payload["text"].split()) * self.tokens_per_word)
            self.asked.append(n)
            if n + payload["sampling_params"]["max_new_tokens"] > self.cap:
                refusal = json.dumps({"error": {"message": f"The input ({n} tokens) is longer than the model's "
                                                           f"context length ({self.cap} tokens)."}})
                # a PD pair's failure as pdkit/bench/measure.py reports it: no status, the prefill's words
                return [(0, f"prefill node/prefill: HTTP 400: {refusal}") if self.pd else (400, refusal)]
            out = list(range(7, 7 + payload["sampling_params"]["max_new_tokens"]))
            meta = {"input_token_logprobs": [[None if i == 0 else -1.0, i % 50, None] for i in range(n)]}
            return [(200, json.dumps({"meta_info": meta, "output_ids": out}))]
        ids, start = payload["input_ids"], payload["logprob_start_len"]
        meta = {"input_token_logprobs": [[-0.5, i, None] for i in ids[start:]],
                "input_top_logprobs": [[[-0.5, i, None]] for i in ids[start:]]}
        return [(200, json.dumps({"meta_info": meta}))]


@pytest.mark.parametrize("pd", [False, True], ids=["unified", "pd-pair"])
@pytest.mark.parametrize("tokens_per_word", [1.3, 3.08])
def test_prompts_are_cut_by_the_engines_own_token_count(tokens_per_word, pd):
    """On the lent H100 the corpus ran 3.08 tokens a word (the 4,048-token prompt was 8,302 tokens, refused,
    and the 1,024-token one 3,020): each length is recorded within 20% of itself and under the cap. Through
    a PD pair the refusal is the prefill's, reported without a status (the same H100, the next session)."""
    engine = _Tokenizing(tokens_per_word, 4096, pd)
    cfg = GateConfig(lengths=(1024, 8192), forced_tokens=32)
    got = answers.record_forced(engine, cfg, 4096)
    room = 4096 - 32 - answers.CAP_MARGIN_TOKENS
    assert [i["length"] for i in got["items"]] == [1024, room]
    for item in got["items"]:
        assert abs(item["prompt_tokens"] - item["length"]) <= 0.2 * item["length"] and item["prompt_tokens"] <= room, item
    assert len(engine.asked) <= 6, engine.asked  # at most one cut after a guess or a refusal, per length
