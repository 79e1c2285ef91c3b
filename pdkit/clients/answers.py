"""The graded answer gate (issue 44): what a change did to the answers, used by `pdkit roll`'s canary
and by every `pdkit tune` candidate. docs/correctness.md explains it.

Parts, each configurable (`AnswerGate`: the inventory's `pdkit_cluster.answers`, a campaign's
`correctness`), cheapest first:

- **short** (a): fixed short prompts at temperature 0, the candidate's greedy tokens compared with
  the baseline's (pdkit/tune/gates.py `compare`, as the tune gate always did);
- **forced** (b): teacher-forced agreement at the users' lengths. Once per baseline, for each
  length up to the context cap, a slice of real text (the corpus shipped in
  pdkit/clients/data/correctness_corpus.txt.xz, or the user's own file) is answered greedily; the prompt's
  token ids (from `input_token_logprobs`) and the continuation are kept. Baseline and candidate then
  *score* the same ids (`input_ids` = prompt + continuation, `return_logprob`, `logprob_start_len`
  at the continuation, `top_logprobs_num`), so both are measured by the same computation: per
  length, the mean and largest |logprob delta| of the continuation's tokens, the share of positions
  whose top-1 token agrees, and a KL estimate over the returned top-k;
- **loaded** (c): the forced scoring again while LOAD concurrent streams run through the same
  path: batch composition must not move the answers beyond the tolerance;
- **accuracy** (d), off by default (it costs minutes): SGLang's own eval tool, `sgl-eval` (pinned in
  pdkit's own environment: the `eval` extra), on a bundled offline set (AIME 24/25/26) or a JSONL of
  the user's own problems; the baseline's score and 95% interval are recorded once, and a candidate
  fails when its score is more than `max_drop` below the baseline's *and* the drop is outside the
  combined interval, or when the run had request errors, was partial or did not finish.

A lever declared exact must reproduce the short answers token for token and agree on every top-1
of the forced positions at rest; a numerics lever (FP8 KV cache, another kernel) passes within the
stated tolerance, which the report prints beside the measured drift. Under load every lever gets
the tolerance: a batch of another shape is another reduction order.

The scoring is pure functions (tested without a cluster); the HTTP goes through
pdkit.bench.measure.Measured (the router, or the target's own PD pairs, merged as the router does).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdkit.agent.health import http_request

if TYPE_CHECKING:  # the spec reads this module's defaults: it imports no more of pdkit than health's client
    from pdkit.bench.measure import Measured

CORPUS = Path(__file__).parent / "data" / "correctness_corpus.txt.xz"
# the tokens per whitespace word the first cut assumes (BPE on English prose and code: 1.3-1.6);
# the engine's own count then decides, and a prompt over the cap is cut again
TOKENS_PER_WORD_GUESS = 1.5
# the tokens kept free below the context cap beside the continuation (chat templates, BOS)
CAP_MARGIN_TOKENS = 16
# SGLang's refusal of a prompt over the context length (0.5.17 and 0.5.23 managers/tokenizer_manager.py
# _validate_one_request; the sim answers the same words: pdkit/sim/protocol.py)
CONTEXT_REFUSAL = re.compile(r"context length \((\d+) tokens\)")
# the same refusal's count of the prompt's own tokens: the cut after it is exact, not a guess
INPUT_TOKENS_REFUSAL = re.compile(r"input \((\d+) tokens\)")
# a prompt is taken once the engine's own count is within this share of the length asked for
LENGTH_TOLERANCE = 0.2
# part (c)'s streams: short answers, so the load's end (stop waits for the requests in flight) costs
# little beside the scoring it surrounds
LOAD_OUTPUT_LEN = 16
# a top-k entry the other side did not return: this far below that side's lowest returned logprob
MISSING_LOGPROB_GAP = 2.0


@dataclass(frozen=True)
class Tolerance:
    """How far a numerics lever may move the forced scores (each per length)."""

    max_mean_abs_delta: float = 0.05  # mean |logprob delta| over the continuation's tokens
    max_abs_delta: float = 1.0  # the largest single |delta|
    min_top1: float = 0.97  # share of positions whose top-1 token agrees
    max_kl: float = 0.02  # mean KL(baseline || candidate) estimate over the top-k


# part (d): the pinned sgl-eval (pyproject's `eval` extra; the wheel's sha256 as on PyPI)
SGL_EVAL_VERSION = "0.1.3"
SGL_EVAL_WHEEL_SHA256 = "48589b50b8c86a10f869eb8cab1ddd8ff8032c3de13c2d135337c69acc5f1a2c"
# the sets sgl-eval 0.1.3 bundles in its wheel (_vendored/nemo_skills/dataset/<name>/test.txt, 30 problems
# each, graded by its math grader); its other sets (gsm8k, mmlu, gpqa, ...) download at run time
OFFLINE_BENCHES = ("aime24", "aime25", "aime26")
# the endpoint's API key reaches the eval process through this variable, never its argv (pdkit.clients.evalrun)
EVAL_KEY_ENV = "PDKIT_EVAL_API_KEY"
# the two-sided 95% normal quantile
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Accuracy:
    """Part (d): an accuracy eval through sgl-eval (off by default: minutes per run)."""

    enabled: bool = False
    bench: str = "aime25"  # one of OFFLINE_BENCHES (with `dataset`: the grader and prompt it uses)
    dataset: str | None = None  # a JSONL of {id?, problem, expected_answer} on the deploying machine
    num_examples: int | None = None  # the first N problems; None: all
    n_repeats: int = 1
    max_tokens: int = 4096
    temperature: float = 0.0
    thinking: bool | None = None  # chat_template_kwargs.thinking; None: the bench's own default
    num_threads: int = 16
    max_drop: float = 0.05  # the absolute score drop a candidate may show before the interval is asked
    timeout_s: float = 3600.0

    def key(self) -> str:
        """What a recorded baseline score depends on (one recorded with other settings is not reused)."""
        text = json.dumps({"bench": self.bench, "dataset": file_digest(self.dataset) if self.dataset else None,
                           "num_examples": self.num_examples, "n_repeats": self.n_repeats,
                           "max_tokens": self.max_tokens, "temperature": self.temperature, "thinking": self.thinking,
                           "sgl_eval": SGL_EVAL_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class GateConfig:
    """What the gate runs (pure data: the spec's and the campaign's models convert to it)."""

    short_prompts: int = 16
    short_tokens: int = 32
    short_concurrency: int = 4
    min_match_rate: float = 0.9
    lengths: tuple[int, ...] = (1024, 8192, 32768)
    forced_tokens: int = 32
    top_k: int = 5
    load_concurrency: int = 8  # 0: no loaded part
    load_input_len: int = 512
    corpus: str | None = None  # the user's own text file; None: the kit's corpus
    tolerance: Tolerance = field(default_factory=Tolerance)
    timeout_s: float = 300.0
    accuracy: Accuracy = field(default_factory=Accuracy)

    def key(self) -> str:
        """What a recorded baseline depends on (a baseline recorded with other settings is not reused)."""
        text = json.dumps({"lengths": list(self.lengths), "forced_tokens": self.forced_tokens, "top_k": self.top_k,
                           "short": [self.short_prompts, self.short_tokens], "corpus": corpus_digest(self.corpus)},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------ (a) short prompts

# words the fixed prompts are built from: plain text, so any tokenizer takes them
_WORDS = ("river", "copper", "signal", "lantern", "orbit", "meadow", "cipher", "harbor", "quartz", "ember",
          "glacier", "violet", "thunder", "pepper", "saddle", "marble", "falcon", "willow", "anchor", "comet")


def prompts(n: int) -> list[str]:
    """N fixed, distinct prompts (the same on every run: answers are compared across runs)."""
    out = []
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(6 + i % 5)]
        out.append(f"pdkit tune correctness prompt {i}: continue the list " + " ".join(words))
    return out


def answer_tokens(body: dict[str, Any]) -> list[Any]:
    """The output tokens of a native /generate answer: output_ids (SGLang, sim); without them the
    text's characters, so a comparison still locates the first divergence."""
    ids = body.get("output_ids")
    if isinstance(ids, list):
        return ids
    return list(str(body.get("text", "")))


class RouterURL:
    """A router's URL as a target: non-streaming /generate, CONCURRENCY at a time (pdkit.agent.health's
    client: stdlib only, as this module is a leaf the spec imports)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url, self.headers = url.rstrip("/"), dict(headers or {})

    def ask(self, payloads: Sequence[dict[str, Any]], concurrency: int, timeout_s: float) -> list[tuple[int, str]]:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(lambda p: http_request(f"{self.url}/generate", p, timeout=timeout_s,
                                                        headers=self.headers), payloads))

    ask_blocking = ask


def measured_target(target: Any, headers: dict[str, str]) -> Any:
    """A router URL means the router; anything with .ask (pdkit.bench.measure.Measured) is used as it is."""
    return RouterURL(target, headers) if isinstance(target, str) else target


def ask(target: str | Measured, headers: dict[str, str], prompt_set: Sequence[str], max_new_tokens: int,
        concurrency: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every prompt at temperature 0 through the router (TARGET a URL, or a Measured via the router)
    or to the target's own PD pairs in turn (a Measured via engines): [{"tokens"} or {"error"}] in
    prompt order."""
    payloads = [{"text": p, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                                "ignore_eos": True}}
                for p in prompt_set]
    out: list[dict[str, Any]] = []
    for status, body in measured_target(target, headers).ask(payloads, concurrency, timeout_s):
        if status != 200:
            out.append({"error": f"HTTP {status or 'no answer'}: {body.strip()[:200]}"})
            continue
        try:
            out.append({"tokens": answer_tokens(json.loads(body))})
        except ValueError:
            out.append({"error": f"not JSON: {body[:200]}"})
    return out


def first_divergence(base: Sequence[Any], got: Sequence[Any]) -> int | None:
    """Index of the first token that differs (a shorter answer diverges where it ends); None: identical."""
    for i, (a, b) in enumerate(zip(base, got)):
        if a != b:
            return i
    return None if len(base) == len(got) else min(len(base), len(got))


def compare(baseline: Sequence[dict[str, Any]], answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per prompt: its first divergence and matched tokens; overall: the match rate, i.e. the
    share of the baseline's tokens reproduced before each answer's first divergence."""
    per = []
    matched = total = 0
    for i, (base, got) in enumerate(zip(baseline, answers)):
        ref = base.get("tokens") or []
        total += len(ref)
        if "error" in got:
            per.append({"prompt": i, "error": got["error"], "first_divergence": 0, "matched": 0, "tokens": len(ref)})
            continue
        div = first_divergence(ref, got["tokens"])
        n = len(ref) if div is None else min(div, len(ref))
        matched += n
        per.append({"prompt": i, "first_divergence": div, "matched": n, "tokens": len(ref)})
    return {"match_rate": (matched / total) if total else 0.0, "matched": matched, "tokens": total,
            "identical": sum(p.get("first_divergence") is None and "error" not in p for p in per),
            "errors": sum("error" in p for p in per), "prompts": per}


def correctness_verdict(comparison: dict[str, Any], min_match_rate: float, exact: bool) -> tuple[bool, str]:
    n = len(comparison["prompts"])
    diverged = [p for p in comparison["prompts"] if p.get("first_divergence") is not None or "error" in p]
    where = ", ".join(f"#{p['prompt']} at token {p['first_divergence']}" + (f" ({p['error']})" if "error" in p else "")
                      for p in diverged[:4]) + (f" (+{len(diverged) - 4} more)" if len(diverged) > 4 else "")
    summary = (f"match rate {comparison['match_rate']:.3f} ({comparison['matched']}/{comparison['tokens']} baseline "
               f"tokens before the first divergence), {comparison['identical']}/{n} prompts identical")
    if comparison["errors"]:
        return False, f"{comparison['errors']} of {n} prompts failed: {where}"
    if exact and diverged:
        return False, f"exactness required and {len(diverged)} prompt(s) diverge: {where}; {summary}"
    if comparison["match_rate"] < min_match_rate:
        return False, f"{summary}, below the threshold {min_match_rate:g}; first divergences: {where}"
    return True, summary + (f"; first divergences: {where}" if diverged else "")



# ------------------------------------------------------------------ the text


def corpus_text(path: str | None = None) -> str:
    """The corpus: the user's own file, else the kit's (real prose and code, frozen at issue 44)."""
    if path:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    return lzma.decompress(CORPUS.read_bytes()).decode("utf-8")


def corpus_digest(path: str | None = None) -> str:
    return file_digest(path or CORPUS)


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def text_slice(words: Sequence[str], n_words: int, index: int) -> str:
    """N_WORDS consecutive words of the corpus for length INDEX (each length starts elsewhere, so no
    prompt is a prefix of another: a prefix cache must not make one length's check the other's)."""
    n_words = max(1, min(n_words, len(words)))
    start = (index * 7919) % max(1, len(words) - n_words + 1)
    return " ".join(words[start:start + n_words])


def usable_lengths(lengths: Sequence[int], context_length: int, forced_tokens: int) -> tuple[list[int], list[str]]:
    """The lengths a cap allows (a prompt, its continuation and a margin below the context length),
    and a note per length left out."""
    room = context_length - forced_tokens - CAP_MARGIN_TOKENS
    kept, notes = [], []
    for n in sorted(set(lengths)):
        if n <= room:
            kept.append(n)
        else:
            notes.append(f"{n} tokens: above the context cap ({context_length} - {forced_tokens} scored - "
                         f"{CAP_MARGIN_TOKENS} margin = {room})")
    if notes and room >= 64 and (not kept or kept[-1] < room):
        kept.append(room)  # the longest the cap allows: long-context bugs live near the cap
        notes.append(f"{room} tokens: the longest prompt the cap allows, in their place")
    return kept, notes


def describe(cfg: GateConfig, cap: int | None, exact: bool | None) -> list[str]:
    """What the gate will run and what it costs (`pdkit roll --dry`, `pdkit tune --dry`); EXACT None:
    per candidate, by its lever class."""
    lengths, notes = usable_lengths(cfg.lengths, cap, cfg.forced_tokens) if cap else (list(cfg.lengths), [])
    t = cfg.tolerance
    lines = []
    if cfg.short_prompts:
        lines.append(f"(a) short: {cfg.short_prompts} prompt(s) x {cfg.short_tokens} greedy tokens, "
                     + {True: "token for token", False: f"match rate >= {cfg.min_match_rate:g}",
                        None: "exact or match rate by lever class"}[exact])
    if lengths:
        lines.append(f"(b) forced: the baseline's {cfg.forced_tokens}-token continuations scored at "
                     f"{', '.join(map(str, lengths))} prompt tokens (top-{cfg.top_k}); tolerance mean |dlogprob| <= "
                     f"{t.max_mean_abs_delta:g}, max <= {t.max_abs_delta:g}, top-1 >= {t.min_top1:g}, KL <= "
                     f"{t.max_kl:g}" + {True: "; every top-1 the same (exact)", False: "",
                                        None: "; an exact lever: every top-1 the same"}[exact])
        if cfg.load_concurrency:
            lines.append(f"(c) loaded: the same scoring under {cfg.load_concurrency} concurrent streams")
    lines += notes
    lines += accuracy_lines(cfg.accuracy)
    prefill = sum(lengths) * (2 + (1 if cfg.load_concurrency else 0))
    lines.append(f"cost: the baseline prefills {2 * sum(lengths):,} prompt tokens once; each check prefills "
                 f"{prefill:,} and decodes {cfg.short_prompts * cfg.short_tokens:,} tokens"
                 + (f" beside {cfg.load_concurrency} streams" if lengths and cfg.load_concurrency else "")
                 + "; its seconds are in each record")
    return lines


# ------------------------------------------------------------------ SGLang's logprob shapes


def _entries(meta: dict[str, Any], key: str) -> list[Any]:
    value = meta.get(key)
    return value if isinstance(value, list) else []


def prompt_ids(meta: dict[str, Any]) -> list[int]:
    """The prompt's token ids from `input_token_logprobs` asked from position 0 ([logprob, id, text])."""
    return [int(e[1]) for e in _entries(meta, "input_token_logprobs")]


def scored(meta: dict[str, Any], continuation: Sequence[int]) -> tuple[list[float], list[list[tuple[float, int]]]]:
    """The logprob of each continuation token and the top-k at its position, from a scoring answer
    (`input_token_logprobs` / `input_top_logprobs` from logprob_start_len on): the last len(CONTINUATION)
    entries, whose ids must be the continuation's (else ValueError: the engine scored something else)."""
    n = len(continuation)
    tokens = _entries(meta, "input_token_logprobs")[-n:] if n else []
    tops = _entries(meta, "input_top_logprobs")[-n:] if n else []
    ids = [int(e[1]) for e in tokens]
    if ids != list(continuation):
        raise ValueError(f"the engine scored {len(tokens)} position(s) that are not the continuation's {n} "
                         f"(first ids {ids[:4]} vs {list(continuation)[:4]})")
    logprobs = [float(e[0]) if e[0] is not None else float("nan") for e in tokens]
    top = [[(float(x[0]), int(x[1])) for x in (t or []) if x and x[0] is not None] for t in tops]
    top += [[] for _ in range(n - len(top))]
    return logprobs, top


def _probe_payload(ids: Sequence[int], start: int, top_k: int) -> dict[str, Any]:
    # SGLang's first entry from any logprob_start_len has no logprob (logprob_result_processor.py: values
    # are [None] + computed[:-1]): START is the last prompt position, so every continuation token is scored
    return {"input_ids": list(ids), "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": top_k}


# ------------------------------------------------------------------ comparing


def kl_estimate(base: Sequence[tuple[float, int]], cand: Sequence[tuple[float, int]]) -> float:
    """KL(baseline || candidate) over the baseline's top-k plus one bucket for the rest; a token the
    candidate did not return gets its lowest returned logprob minus MISSING_LOGPROB_GAP."""
    if not base:
        return 0.0
    got = dict((i, lp) for lp, i in cand)
    floor = (min(got.values()) if got else -20.0) - MISSING_LOGPROB_GAP
    kl = p_mass = q_mass = 0.0
    for lp, i in base:
        lq = got.get(i, floor)
        p = math.exp(lp)
        kl += p * (lp - lq)
        p_mass += p
        q_mass += math.exp(lq)
    p_rest, q_rest = max(0.0, 1.0 - p_mass), max(1e-12, 1.0 - min(q_mass, 1.0))
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(0.0, kl)


def compare_forced(base: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """One length: the drift of the candidate's scores from the baseline's (both teacher-forced on
    the baseline's continuation)."""
    deltas = [abs(c - b) for b, c in zip(base["logprobs"], cand["logprobs"]) if not (math.isnan(b) or math.isnan(c))]
    top1 = [bool(bt and ct and bt[0][1] == ct[0][1]) for bt, ct in zip(base["top"], cand["top"])]
    kls = [kl_estimate(bt, ct) for bt, ct in zip(base["top"], cand["top"])]
    first_off = next((i for i, same in enumerate(top1) if not same), None)
    return {"length": base["length"], "prompt_tokens": base["prompt_tokens"], "positions": len(deltas),
            "mean_abs_delta": round(sum(deltas) / len(deltas), 6) if deltas else 0.0,
            "max_abs_delta": round(max(deltas), 6) if deltas else 0.0,
            "top1_agreement": round(sum(top1) / len(top1), 6) if top1 else 1.0,
            "first_top1_disagreement": first_off,
            "kl": round(sum(kls) / len(kls), 6) if kls else 0.0}


def forced_verdict(rows: Sequence[dict[str, Any]], tol: Tolerance, exact: bool, part: str) -> tuple[bool, str]:
    """Per length within the tolerance (EXACT: every top-1 agrees too); the text names each length's drift."""
    bad = []
    for r in rows:
        why = []
        if exact and r["top1_agreement"] < 1.0:
            why.append(f"top-1 differs from token {r['first_top1_disagreement']} (exact lever)")
        if r["top1_agreement"] < tol.min_top1:
            why.append(f"top-1 agreement {r['top1_agreement']:.3f} < {tol.min_top1:g}")
        if r["mean_abs_delta"] > tol.max_mean_abs_delta:
            why.append(f"mean |dlogprob| {r['mean_abs_delta']:.4f} > {tol.max_mean_abs_delta:g}")
        if r["max_abs_delta"] > tol.max_abs_delta:
            why.append(f"max |dlogprob| {r['max_abs_delta']:.3f} > {tol.max_abs_delta:g}")
        if r["kl"] > tol.max_kl:
            why.append(f"KL {r['kl']:.4f} > {tol.max_kl:g}")
        if why:
            bad.append(f"{r['prompt_tokens']} tokens: " + ", ".join(why))
    figures = "; ".join(f"{r['prompt_tokens']} tok: mean |d| {r['mean_abs_delta']:.4f}, max {r['max_abs_delta']:.3f}, "
                        f"top-1 {r['top1_agreement']:.3f}, KL {r['kl']:.4f}" for r in rows)
    if bad:
        return False, f"{part}: " + "; ".join(bad) + f" [measured: {figures}]"
    return True, f"{part}: within tolerance ({figures})"


# ------------------------------------------------------------------ talking to the engines


def _meta(status: int, body: str, what: str) -> dict[str, Any]:
    if status != 200:
        raise RuntimeError(f"{what}: HTTP {status or 'no answer'}: {body.strip()[:200]}")
    try:
        answer = json.loads(body)
    except ValueError:
        raise RuntimeError(f"{what}: not JSON: {body[:200]}") from None
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict):
        raise RuntimeError(f"{what}: no meta_info in the answer")
    return {**meta, "_output_ids": answer.get("output_ids")}


def record_forced(measured: Measured, cfg: GateConfig, context_length: int,
                  say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The baseline's part (b) record: per usable length, the prompt ids, the greedy continuation and
    the baseline's own forced scores. Prompts over the cap (the engine's own token count) are cut again."""
    lengths, notes = usable_lengths(cfg.lengths, context_length, cfg.forced_tokens)
    words = corpus_text(cfg.corpus).split()
    room = context_length - cfg.forced_tokens - CAP_MARGIN_TOKENS
    items = []
    for index, length in enumerate(lengths):
        ratio = TOKENS_PER_WORD_GUESS
        for attempt in range(4):
            n_words = max(1, int(length / ratio))
            payload = {"text": text_slice(words, n_words, index),
                       "sampling_params": {"temperature": 0.0, "max_new_tokens": cfg.forced_tokens, "ignore_eos": True},
                       "return_logprob": True, "logprob_start_len": 0}
            status, body = measured.ask_blocking([payload], 1, cfg.timeout_s)[0]
            # any failed status: through a PD router the prefill's 400 comes back as the pair's failure
            # (pdkit/bench/measure.py: status 0, "prefill ...: HTTP 400: ..."), its words intact
            cap = CONTEXT_REFUSAL.search(body) if status != 200 else None
            if cap and attempt < 3:  # over the engine's own limit: its refusal says the cap and the prompt's count
                room = int(cap.group(1)) - cfg.forced_tokens - CAP_MARGIN_TOKENS
                seen = INPUT_TOKENS_REFUSAL.search(body)
                # on the lent H100 (2026-12-07) the corpus ran 3.1 tokens a word: steps of 1.3x never got under
                ratio = int(seen.group(1)) / n_words * 1.02 if seen else ratio * 1.3
                length = min(length, room)
                continue
            meta = _meta(status, body, f"the {length}-token prompt")
            ids = prompt_ids(meta)
            off = abs(len(ids) - length) > LENGTH_TOLERANCE * length and n_words < len(words)
            if len(ids) > room or off:
                if attempt == 3:
                    if len(ids) > room:
                        raise RuntimeError(f"the {length}-token prompt: still {len(ids)} tokens after 4 cuts "
                                           f"(room {room})")
                    break
                # the engine's own count decides: cut again at the tokens per word it saw (2% under)
                ratio = len(ids) / n_words * 1.02
                continue
            break
        continuation = meta.get("_output_ids") or [int(e[1]) for e in _entries(meta, "output_token_logprobs")]
        if not ids or not continuation:
            raise RuntimeError(f"the {length}-token prompt: the engine returned no input_token_logprobs / output ids "
                               "(logprobs unsupported on this path?)")
        item = {"length": length, "prompt_tokens": len(ids), "prompt_ids": ids,
                "continuation": [int(i) for i in continuation]}
        item.update(score(measured, item, cfg))
        say(f"baseline at {len(ids)} prompt tokens recorded")
        items.append(item)
    return {"items": items, "notes": notes, "key": cfg.key()}


def score(measured: Measured, item: dict[str, Any], cfg: GateConfig) -> dict[str, Any]:
    """The forced scores of ITEM's continuation on the engines MEASURED reaches now."""
    ids = item["prompt_ids"] + item["continuation"]
    payload = _probe_payload(ids, len(item["prompt_ids"]) - 1, cfg.top_k)
    status, body = measured.ask_blocking([payload], 1, cfg.timeout_s)[0]
    logprobs, top = scored(_meta(status, body, f"scoring at {item['prompt_tokens']} tokens"), item["continuation"])
    return {"logprobs": logprobs, "top": top}


def forced_rows(measured: Measured, recorded: dict[str, Any], cfg: GateConfig) -> list[dict[str, Any]]:
    rows = []
    for item in recorded["items"]:
        cand = {**item, **score(measured, item, cfg)}
        rows.append(compare_forced(item, cand))
    return rows


@dataclass
class Outcome:
    ok: bool
    failed_part: str | None
    detail: str
    record: dict[str, Any]


def run_parts(measured: Measured, cfg: GateConfig, recorded: dict[str, Any], exact: bool,
              say: Callable[[str, str, float], None] = lambda *_: None,
              load_factory: Callable[[int], Any] | None = None) -> Outcome:
    """Parts (b) and (c) against a recorded baseline (part (a): `compare` on `ask`'s answers, by the
    callers); stops at the first part that fails. LOAD_FACTORY(C) makes part (c)'s load (a
    pdkit.bench.load.LoadThread on the same target; None: no part (c)). The record has each part's
    rows, verdict and seconds."""
    record: dict[str, Any] = {"notes": recorded.get("notes", []), "parts": {}}
    start = time.monotonic()
    rows = forced_rows(measured, recorded, cfg)
    ok, why = forced_verdict(rows, cfg.tolerance, exact, "forced")
    record["parts"]["forced"] = {"ok": ok, "rows": rows, "detail": why, "seconds": round(time.monotonic() - start, 2)}
    say("forced", why, time.monotonic() - start)
    if not ok:
        return Outcome(False, "forced", why, record)
    if cfg.load_concurrency > 0 and recorded["items"] and load_factory is not None:
        start = time.monotonic()
        load = load_factory(cfg.load_concurrency).start()
        try:
            time.sleep(0.3)  # the streams admitted before the scoring, so it is batched with them
            rows = forced_rows(measured, recorded, cfg)
        finally:
            load.stop()
        ok, why = forced_verdict(rows, cfg.tolerance, False, f"loaded (C={cfg.load_concurrency})")
        if load.failed and ok:
            ok, why = False, f"loaded: {len(load.failed)} of the load's requests failed: {load.failed[:2]}"
        record["parts"]["loaded"] = {"ok": ok, "rows": rows, "detail": why, "load_ok": load.ok,
                                     "load_failed": len(load.failed), "seconds": round(time.monotonic() - start, 2)}
        say("loaded", why, time.monotonic() - start)
        if not ok:
            return Outcome(False, "loaded", why, record)
    return Outcome(True, None, "; ".join(p["detail"] for p in record["parts"].values()), record)


# ------------------------------------------------------------------ (d) accuracy through sgl-eval


def accuracy_lines(acc: Accuracy) -> list[str]:
    """Part (d)'s lines of `describe` (none when it is off)."""
    if not acc.enabled:
        return []
    what = (f"{acc.dataset} (graded as {acc.bench})" if acc.dataset else f"{acc.bench} (bundled: offline)")
    problems = f"the first {acc.num_examples}" if acc.num_examples else "every"
    line = (f"(d) accuracy: sgl-eval {SGL_EVAL_VERSION} on {what}, {problems} problem(s) x {acc.n_repeats}, at most "
            f"{acc.max_tokens} tokens at temperature {acc.temperature:g}; fails on a score more than {acc.max_drop:g} "
            "below the baseline's and outside the combined 95% interval, on request errors or a partial run")
    return [line, "(d) sent to the router when it fronts exactly the engines checked, else to their unified engine; "
                  "PD engines checked on their own skip it (said in the record)",
            f"(d) cost: one eval of the baseline, one per check ({acc.num_threads} requests at a time): minutes each, "
            "in the record"]


def accuracy_argv(acc: Accuracy, base_url: str, model: str | None, out_dir: str | Path) -> list[str]:
    """sgl-eval `run`'s arguments (after `run`; no API key: pdkit.clients.evalrun adds it from EVAL_KEY_ENV)."""
    argv = [acc.bench, "--base-url", base_url]
    if model:
        argv += ["--model", model]
    if acc.num_examples:
        argv += ["--num-examples", str(acc.num_examples)]
    argv += ["--n-repeats", str(acc.n_repeats), "--max-tokens", str(acc.max_tokens),
             "--temperature", f"{acc.temperature:g}", "--num-threads", str(acc.num_threads), "--out-dir", str(out_dir)]
    if acc.thinking is not None:
        argv.append("--thinking" if acc.thinking else "--no-thinking")
    if acc.dataset:
        argv += ["--from-dataset", str(Path(acc.dataset).expanduser().resolve())]
    return argv


def accuracy_endpoint(measured: Any) -> tuple[str | None, dict[str, str], str]:
    """(OpenAI base URL, headers, what it is) for sgl-eval, which sends to one URL; (None, {}, why) when
    no URL measures exactly the target. The router when the target is measured through it or the router
    fronts exactly the target's engines; else the target's unified engine (the first: its engines run
    the same settings). A PD pair measured on its own engines takes no single URL (its requests need
    the bootstrap fields the router adds), and a router that also fronts other engines mixes them
    (on a roll, the releases of the batches not yet rolled)."""
    routes = tuple(getattr(measured, "routes", ()))
    router = getattr(measured, "router_url", None)
    engines = sorted({e.label for r in routes for e in (r.prefill, r.engine) if e is not None})
    if router and (not routes or set(getattr(measured, "router_engines", ())) == set(engines)):
        fronted = ", ".join(sorted(getattr(measured, "router_engines", ())) or engines)
        return f"{router.rstrip('/')}/v1", dict(getattr(measured, "headers", {}) or {}), f"the router ({fronted})"
    unified = [r for r in routes if r.prefill is None]
    if routes and len(unified) == len(routes):
        more = f" (the first of {len(unified)})" if len(unified) > 1 else ""
        return f"{unified[0].engine.url.rstrip('/')}/v1", {}, f"the target's engine {unified[0].engine.label}{more}"
    others = sorted(set(getattr(measured, "router_engines", ())) - set(engines))
    return None, {}, ("skipped: the target's PD pairs are measured on their own engines, and "
                      + (f"the router also fronts {', '.join(others)} (an eval through it would mix them)"
                         if others else "no router fronts exactly them")
                      + "; sgl-eval sends to one URL and cannot pair a prefill with a decode")


def binomial_stderr(p: float, n: int) -> float:
    return math.sqrt(max(0.0, p * (1 - p)) / n) if n > 0 else 0.0


def accuracy_result(metrics: dict[str, Any]) -> dict[str, Any]:
    """The figures of one sgl-eval metrics.json (sgl_eval/metrics.py dump_run): the score (pass@1 over
    the repeats, else the score), its standard error (pass@1_sem with repeats, else the binomial one
    over the problems) and its 95% interval, and what says whether the run is whole."""
    agg = metrics.get("aggregate") or {}
    k, n = int(metrics.get("n_repeats") or 1), int(metrics.get("num_examples") or 0)
    score = float(agg["pass@1"] if k > 1 and "pass@1" in agg else agg.get("score", 0.0))
    if k > 1 and "pass@1_sem" in agg:
        stderr, source = float(agg["pass@1_sem"]), f"pass@1_sem over {k} repeats"
    else:
        stderr, source = binomial_stderr(score, n), f"binomial over {n} problem(s)"
    half = Z95 * stderr
    return {"score": round(score, 6), "stderr": round(stderr, 6), "stderr_from": source,
            "ci95": [round(max(0.0, score - half), 6), round(min(1.0, score + half), 6)],
            "num_examples": n, "n_repeats": k, "planned_examples": metrics.get("planned_examples", n),
            "completed_samples": metrics.get("completed_samples"), "partial": bool(metrics.get("partial")),
            "error_rate": float(agg.get("error_rate", 0.0)), "no_answer": agg.get("no_answer"),
            "truncated_rate": agg.get("truncated_rate"), "latency_s": metrics.get("latency_seconds"),
            "model": metrics.get("model"), "sgl_eval_version": metrics.get("sgl_eval_version")}


def accuracy_problems(result: dict[str, Any], exit_code: int | None, metrics_found: bool) -> list[str]:
    """Why a run cannot be judged by its score: it did not finish, was partial or had request errors."""
    out = []
    if exit_code is None:
        out.append("sgl-eval did not finish in time")
    elif exit_code:
        out.append(f"sgl-eval exited with status {exit_code}" + (" (aborted)" if exit_code == 130 else ""))
    if not metrics_found:
        out.append("no metrics.json written")
        return out
    if result.get("partial"):
        out.append(f"partial run: {result.get('completed_samples')} of {result.get('planned_examples')} x "
                   f"{result.get('n_repeats')} samples")
    if result.get("error_rate", 0.0) > 0:
        out.append(f"{result['error_rate']:.1%} of the requests failed")
    if result.get("sgl_eval_version") not in (None, SGL_EVAL_VERSION):
        out.append(f"sgl-eval {result['sgl_eval_version']} ran, not the pinned {SGL_EVAL_VERSION}")
    return out


def _figure(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{r['score']:.3f} (95% CI {lo:.3f}-{hi:.3f})"


def accuracy_verdict(base: dict[str, Any], cand: dict[str, Any], max_drop: float) -> tuple[bool, str]:
    """Fails on a run that cannot be judged, or a score more than MAX_DROP below the baseline's whose drop
    is also outside the combined 95% interval (Z95 x the root of the summed squared standard errors)."""
    if cand.get("problems"):
        return False, "accuracy: " + "; ".join(cand["problems"])
    drop = base["score"] - cand["score"]
    half = Z95 * math.hypot(base["stderr"], cand["stderr"])
    figures = (f"score {_figure(cand)} vs the baseline's {_figure(base)}: drop {drop:+.3f} (max_drop {max_drop:g}, "
               f"combined 95% half-width {half:.3f})")
    if drop > max_drop and drop > half:
        return False, f"accuracy: {figures}, beyond both"
    return True, f"accuracy: {figures}"


def run_accuracy(acc: Accuracy, base_url: str, model: str | None, headers: dict[str, str], out_dir: Path,
                 python: str = sys.executable) -> dict[str, Any]:
    """One sgl-eval run (pdkit.clients.evalrun, in this environment's Python) against BASE_URL, its run directory
    under OUT_DIR: the figures of accuracy_result, the exit status, the seconds and the problems that
    keep it from being judged. The key in HEADERS goes through the environment, never argv."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix="eval-", dir=out_dir))
    argv = accuracy_argv(acc, base_url, model, parent)
    key = (headers.get("Authorization") or "").removeprefix("Bearer ").strip()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", EVAL_KEY_ENV: key}
    start = time.monotonic()
    try:
        proc = subprocess.run([python, "-m", "pdkit.clients.evalrun", *argv], env=env, capture_output=True, text=True,
                              timeout=acc.timeout_s, check=False)
        exit_code: int | None = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        exit_code, output = None, f"timed out after {acc.timeout_s:.0f} s"
    seconds = round(time.monotonic() - start, 2)
    found = sorted(parent.glob("sgl_eval_*/metrics.json"))
    try:
        metrics = json.loads(found[-1].read_text()) if found else None
    except ValueError:
        metrics = None
    result = accuracy_result(metrics) if metrics else {}
    result.update(bench=acc.bench, dataset=acc.dataset, key=acc.key(), endpoint=base_url, exit_code=exit_code,
                  seconds=seconds, run_dir=str(found[-1].parent if found else parent))
    result["problems"] = accuracy_problems(result, exit_code, metrics is not None)
    if result["problems"]:
        result["output_tail"] = output[-2000:]
    return result


def eval_accuracy(measured: Any, acc: Accuracy, model: str | None, out_dir: Path) -> dict[str, Any]:
    """Part (d) on what MEASURED reaches now: run_accuracy's record with `via`, or {"skipped": why}."""
    url, headers, via = accuracy_endpoint(measured)
    if url is None:
        return {"skipped": via, "problems": []}
    return {**run_accuracy(acc, url, model, headers, out_dir), "via": via}


def accuracy_check(base: dict[str, Any], cand: dict[str, Any], acc: Accuracy) -> tuple[bool, str]:
    """The verdict of a check's record CAND against the baseline's BASE (either skipped: passes, saying why)."""
    if base.get("skipped") or cand.get("skipped"):
        return True, f"accuracy: {base.get('skipped') or cand.get('skipped')}"
    return accuracy_verdict(base, cand, acc.max_drop)
