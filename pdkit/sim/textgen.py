"""Deterministic tokenisation, a made-up next-token model, output text and logprobs.

There is no real model. A prompt is split on whitespace (one token per word, plus a BOS token, so
an empty prompt still costs one); a word of the sim's output vocabulary is its own id, any other
word is hashed into the rest of the model vocabulary, so the text of an answer tokenises back to
its output ids (teacher forcing by text works as by ids).

The "model": the next-token distribution at position i (predicting ids[i]) is a deterministic
function of the prefix ids[:i] and the request seed. A rolling crc32 over the prefix (seeded by
the request seed) is the state; the state gives the top-1 token, an odd step that orders the rest
of the output vocabulary (rank j is `top1 + j * step` mod the vocabulary), and the top-1 logprob
(-0.1 .. -0.6). The other ranks share the rest of the probability on a fixed Zipf-like shape over
`TOP_RANKS` ranks; everything below those ranks (and every id outside the output vocabulary) has
one floor value, so the distribution sums to 1 over the whole model vocabulary. Greedy decoding
takes the top-1 after prompt + the outputs so far, one crc32 step per token (O(1)), so a
teacher-forced score of an answer agrees with it at every position. The same prompt and seed give
the same text on every engine, which is what lets a PD decode continue exactly where its
prefill's first token left off, and lets tests check what came back.

Numerics drift (knobs PDKIT_SIM_DRIFT_*, PDKIT_SIM_DIVERGE_*: `Drift`) adds Gaussian noise to the
reported logprobs (never to the ranking) and, past a context length and under load, swaps the
top-1 for another token (the ranking changes there, so greedy output diverges).
"""

from __future__ import annotations

import math
import zlib
from array import array
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

# Reported vocabulary size of the imaginary model (input ids are hashed into it).
MODEL_VOCAB_SIZE = 32000
BOS_TOKEN_ID = 1


def _make_vocab() -> tuple[str, ...]:
    onsets = "b d f g k l m n p r s t v z".split()
    vowels = "a e i o u".split()
    codas = ["", "n", "r", "s"]
    # 14 * 5 * 4 = 280 syllables; words of one or two syllables, first 512 of them in order.
    syllables = [o + v + c for o in onsets for v in vowels for c in codas]
    words = syllables + [a + b for a in syllables[:16] for b in syllables]
    return tuple(words[:512])


VOCAB: tuple[str, ...] = _make_vocab()
V = len(VOCAB)  # the output vocabulary: ids 0 .. V-1 (a power of two: every odd step orders it)
_VOCAB_ID = {w: i for i, w in enumerate(VOCAB)}
_HASHED = MODEL_VOCAB_SIZE - V  # other words hash into V .. MODEL_VOCAB_SIZE-1


def tokenize(text: str) -> list[int]:
    """BOS plus one id per whitespace-separated word: an output-vocabulary word is its own id (so an
    answer's text tokenises back to its output ids), any other word is hashed past the vocabulary."""
    ids = [BOS_TOKEN_ID]
    get = _VOCAB_ID.get
    crc = zlib.crc32
    for w in text.split():
        i = get(w)
        ids.append(V + crc(w.encode()) % _HASHED if i is None else i)
    return ids


def chat_prompt(messages: Iterable[dict[str, Any]]) -> str:
    """A plain chat template: one `<|role|> content` line per message, then the assistant tag."""
    lines = []
    for message in messages:
        content = message.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        lines.append(f"<|{message.get('role', 'user')}|> {content}")
    lines.append("<|assistant|>")
    return "\n".join(lines)


# ---- the model --------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLD = 0x9E3779B97F4A7C15
_MIX2 = 0xBF58476D1CE4E5B9
# ranks 0 .. TOP_RANKS-1 have their own probability; the rest of the model vocabulary shares a floor
TOP_RANKS = 20
# share of the non-top-1 probability left to the floor (spread over MODEL_VOCAB_SIZE - TOP_RANKS ids)
_FLOOR_SHARE = 0.05
_W = [j ** -1.2 for j in range(1, TOP_RANKS)]
# log of each rank's share of the non-top-1 probability (index j: rank j; index 0 unused)
_RANK_LOGSHARE = [0.0] + [math.log((1 - _FLOOR_SHARE) * w / sum(_W)) for w in _W]
_FLOOR_LOGSHARE = math.log(_FLOOR_SHARE / (MODEL_VOCAB_SIZE - TOP_RANKS))
# the inverse of every odd step modulo V (the rank of a token is (token - top1) * inverse(step) mod V)
_INV = {b: pow(b, -1, V) for b in range(1, V, 2)}


def seed_state(seed: int) -> int:
    """The model state before any token: a crc32 of the request seed."""
    return zlib.crc32((seed & _MASK64).to_bytes(8, "little"))


def _pack(ids: Sequence[int]) -> bytes:
    try:
        return array("I", ids).tobytes()
    except (OverflowError, TypeError):  # ids outside 0 .. 2**32-1: their low 32 bits
        return array("I", [i & 0xFFFFFFFF for i in ids]).tobytes()


def prefix_state(ids: Sequence[int], seed: int) -> int:
    """The state after ids (one crc32 pass: the same as stepping `advance` id by id)."""
    return zlib.crc32(_pack(ids), seed_state(seed))


def advance(state: int, token_id: int) -> int:
    """The state after one more token."""
    return zlib.crc32((token_id & 0xFFFFFFFF).to_bytes(4, "little"), state)


def _dist(state: int, diverged: bool = False) -> tuple[int, int, float]:
    """(top-1 id, odd step ordering the other ranks, top-1 logprob) at this state. Diverged: the
    ranking is reflected around rank 1, so the old rank 1 is the top-1 (and the old top-1 rank 1)."""
    z = (state * _GOLD) & _MASK64
    a = ((z >> 32) * V) >> 32
    b = (((z >> 16) & 0xFF) << 1) | 1
    top = -(0.1 + 0.5 * ((z & 0xFFFF) / 65536.0))
    if diverged:
        a, b = (a + b) % V, V - b
    return a, b, top


def top1(state: int, diverged: bool = False) -> int:
    return _dist(state, diverged)[0]


def _rank_of(token: int, a: int, b: int) -> int:
    if 0 <= token < V:
        return ((token - a) * _INV[b]) % V
    return TOP_RANKS  # outside the output vocabulary: the floor


class Drift(NamedTuple):
    """An engine's numerics drift (the PDKIT_SIM_DRIFT_* / DIVERGE_* knobs), when its argv matches."""

    per_1k: float  # logprob noise sigma per 1,000 tokens of context before the position
    per_req: float  # logprob noise sigma per request running beside this one when it was scheduled
    diverge_after: int  # 0: never; else positions at or past this context length get another top-1 ...
    diverge_min_batch: int  # ... while at least this many requests run (this one included)

    def sigma(self, position: int, load: int) -> float:
        return self.per_1k * position / 1000.0 + self.per_req * load

    def diverges(self, position: int, running: int) -> bool:
        return 0 < self.diverge_after <= position and running >= self.diverge_min_batch


# standard normal quantiles at 4096 evenly spaced probabilities: a deterministic draw is one lookup
_NORMAL = [NormalDist().inv_cdf((i + 0.5) / 4096) for i in range(4096)]


def _gauss(state: int, token: int) -> float:
    """A standard normal draw (to 1/4096 in probability), deterministic per (prefix state, token id)."""
    z = ((((state << 32) | (token & 0xFFFFFFFF)) * _GOLD) & _MASK64) ^ state
    return _NORMAL[((z * _MIX2) & _MASK64) >> 52]


class Position(NamedTuple):
    """What the engine reports at one position, as SGLang's rows: the scored token's logprob, the
    top-k as [logprob, id, None] (None unless asked) and the asked ids' [logprob, id, None] (None
    unless asked). The text slot is filled when the answer is rendered (return_text_in_logprobs)."""

    logprob: float
    top: list[list[Any]] | None
    ids: list[list[Any]] | None


def _value(state: int, tok: int, a: int, b: int, top: float, log_rest: float, sigma: float) -> float:
    if tok == a:
        lp = top
    else:
        rank = ((tok - a) * _INV[b]) % V if 0 <= tok < V else TOP_RANKS
        lp = log_rest + (_RANK_LOGSHARE[rank] if rank < TOP_RANKS else _FLOOR_LOGSHARE)
    return min(0.0, lp + sigma * _gauss(state, tok)) if sigma > 0.0 else lp


def score(state: int, token: int, top_n: int = 0, token_ids: Sequence[int] | None = None,
          diverged: bool = False, sigma: float = 0.0) -> Position:
    """The logprob of `token` at this state, with the top_n ranks and the asked ids' logprobs.

    Noise (sigma > 0) shifts each value by sigma * N(0, 1), drawn per (state, id), and clips it at 0;
    it never reorders the top-k (the ranking is the model's: only divergence changes it)."""
    a, b, top = _dist(state, diverged)
    log_rest = math.log1p(-math.exp(top))
    tops = None
    if top_n > 0:
        k = min(top_n, MODEL_VOCAB_SIZE)
        if sigma > 0.0 or k > TOP_RANKS:
            tops = [[_value(state, t, a, b, top, log_rest, sigma), t, None] for t in _ranked(a, b, k)]
        else:
            tops = [[top, a, None]]
            tops += [[log_rest + share, (a + j * b) % V, None] for j, share in _SHARES[k]]
    asked = None if token_ids is None else [[_value(state, t, a, b, top, log_rest, sigma), t, None]
                                            for t in token_ids]
    return Position(_value(state, token, a, b, top, log_rest, sigma), tops, asked)


# (rank, log share) of ranks 1 .. k-1, for each k up to TOP_RANKS
_SHARES = [list(enumerate(_RANK_LOGSHARE[1:k], 1)) for k in range(TOP_RANKS + 1)]


def _ranked(a: int, b: int, k: int) -> list[int]:
    """The ids of ranks 0 .. k-1 (past the output vocabulary: ids V.. in order)."""
    return [(a + j * b) % V if j < V else j for j in range(k)]


def prompt_scores(ids: Sequence[int], seed: int, start: int, top_n: int = 0,
                  token_ids: Sequence[int] | None = None, drift: Drift | None = None, load: int = 0,
                  running: int = 1) -> list[Position | None]:
    """Teacher-forced scores of a prompt from `start` on, as SGLang reports input logprobs: one
    entry per position start .. len(ids)-1, the first None (nothing scores it: SGLang prepends None
    and drops the last, sampling position). `load` (requests beside it when scheduled) and
    `running` (requests the prefill ran with, this one included) feed the drift."""
    n = len(ids)
    if start >= n:
        return []
    out: list[Position | None] = [None]
    state = prefix_state(ids[:start + 1], seed)
    crc = zlib.crc32
    if token_ids is not None or top_n > TOP_RANKS:
        for i in range(start + 1, n):
            tok = ids[i]
            if drift is None:
                out.append(score(state, tok, top_n, token_ids))
            else:
                out.append(score(state, tok, top_n, token_ids, drift.diverges(i, running), drift.sigma(i, load)))
            state = crc((tok & 0xFFFFFFFF).to_bytes(4, "little"), state)
        return out
    # the common case (no asked ids, at most TOP_RANKS top logprobs), inlined: a 32K-token prompt is
    # scored in well under a second
    shares = _SHARES[top_n] if top_n > 0 else None
    inv, rank_share, log1p, exp, gauss = _INV, _RANK_LOGSHARE, math.log1p, math.exp, _gauss
    append = out.append
    sigma = 0.0
    tops: list[list[Any]] | None
    for i in range(start + 1, n):
        tok = ids[i]
        z = (state * _GOLD) & _MASK64
        a = ((z >> 32) * V) >> 32
        b = (((z >> 16) & 0xFF) << 1) | 1
        top = -(0.1 + 0.5 * ((z & 0xFFFF) / 65536.0))
        if drift is not None:
            if drift.diverges(i, running):
                a, b = (a + b) % V, V - b
            sigma = drift.sigma(i, load)
        log_rest = log1p(-exp(top))
        if tok == a:
            lp = top
        else:
            rank = ((tok - a) * inv[b]) % V if 0 <= tok < V else TOP_RANKS
            lp = log_rest + (rank_share[rank] if rank < TOP_RANKS else _FLOOR_LOGSHARE)
        if shares is None:
            tops = None
        else:
            tops = [[top, a, None]]
            tops += [[log_rest + share, (a + j * b) % V, None] for j, share in shares]
        if sigma > 0.0:
            lp = min(0.0, lp + sigma * gauss(state, tok))
            if tops is not None:
                for row in tops:
                    row[0] = min(0.0, row[0] + sigma * gauss(state, row[1]))
        append(Position(lp, tops, None))
        state = crc((tok & 0xFFFFFFFF).to_bytes(4, "little"), state)
    return out


class Trace:
    """What a request that asked for logprobs records per output token: the state it was drawn from
    and whether it diverged (the load that decides it varies step to step). A PD decode's first
    token comes from the prefill, with the prefill's figures (`first`)."""

    __slots__ = ("states", "diverged", "first")

    def __init__(self) -> None:
        self.states: list[int] = []
        self.diverged: list[bool] = []
        self.first: dict[str, Any] | None = None


_PACKED = [t.to_bytes(4, "little") for t in range(V)]


class TokenStream:
    """Greedy output of one request, one token at a time: the top-1 after prompt + outputs so far."""

    __slots__ = ("state", "trace")

    def __init__(self, prompt_ids: Sequence[int], seed: int) -> None:
        self.state = prefix_state(prompt_ids, seed)
        self.trace: Trace | None = None

    def next_id(self, diverged: bool = False) -> int:
        state = self.state
        z = (state * _GOLD) & _MASK64
        token = ((z >> 32) * V) >> 32
        if diverged:
            token = (token + ((((z >> 16) & 0xFF) << 1) | 1)) % V  # as _dist(state, True)
        if self.trace is not None:
            self.trace.states.append(state)
            self.trace.diverged.append(diverged)
        self.state = zlib.crc32(_PACKED[token], state)
        return token

    def accept(self, token: int, first: dict[str, Any] | None = None) -> int:
        """Take a token computed elsewhere (a PD decode: the prefill's first token) into the context."""
        if self.trace is not None:
            self.trace.states.append(self.state)
            self.trace.diverged.append(False)
            self.trace.first = first
        self.state = advance(self.state, token)
        return token


def token_text(token_id: int) -> str:
    """Text of one output token (a leading space: tokens join into words)."""
    return " " + VOCAB[token_id]


def logprob_text(token_id: int) -> str:
    """A token's text in logprobs (return_text_in_logprobs): an output word (BOS is id 1, the word
    " ban" too), or a placeholder for a hashed prompt word (the sim keeps no reverse map)."""
    if 0 <= token_id < V:
        return " " + VOCAB[token_id]
    return f"<tok{token_id}>"


def detokenize(token_ids: Iterable[int]) -> str:
    return "".join(" " + VOCAB[i] for i in token_ids)


def boxed_answer(output_ids: Sequence[int]) -> str:
    """The answer a sim states at the end of a chat completion with PDKIT_SIM_ANSWER_BOXED: ` \\boxed{N}`,
    N in 0..999 from the state after its output ids, so the same answer gives the same N and a diverged
    one (another token anywhere) almost surely another."""
    return f" \\boxed{{{prefix_state(output_ids, 0) % 1000}}}"


def expected_ids(prompt_ids: Sequence[int], seed: int, n: int) -> list[int]:
    """The output ids of a request with these prompt ids and seed after n tokens (for tests)."""
    stream = TokenStream(prompt_ids, seed)
    return [stream.next_id() for _ in range(n)]


def expected_output(prompt_ids: Sequence[int], seed: int, n: int) -> str:
    """What a request with these prompt ids and seed returns after n tokens (for tests)."""
    return detokenize(expected_ids(prompt_ids, seed, n))
