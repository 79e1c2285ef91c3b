"""Deterministic tokenisation and output text.

There is no model: a prompt is split on whitespace (one token per word, plus a BOS token, so an
empty prompt still costs one), and output tokens are drawn from a fixed made-up vocabulary by a
PRNG seeded from the prompt's token ids and the request seed. The same prompt and seed give the
same text on every engine, which is what lets a PD decode continue exactly where its prefill's
first token left off, and lets tests check what came back.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

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


def tokenize(text: str) -> list[int]:
    """BOS plus one id per whitespace-separated word (ids hashed into the model vocabulary)."""
    return [BOS_TOKEN_ID] + [2 + zlib.crc32(w.encode()) % (MODEL_VOCAB_SIZE - 2) for w in text.split()]


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


def stream_seed(prompt_ids: Sequence[int], seed: int) -> int:
    """The PRNG seed for a request's output: a hash of its prompt ids, mixed with its seed."""
    digest = zlib.crc32(array("q", prompt_ids).tobytes())
    return digest * 1_000_003 + seed


class TokenStream:
    """Output token ids of one request, one at a time, reproducible from (prompt ids, seed)."""

    __slots__ = ("_rng",)

    def __init__(self, prompt_ids: Sequence[int], seed: int) -> None:
        self._rng = random.Random(stream_seed(prompt_ids, seed))

    def next_id(self) -> int:
        return self._rng.randrange(len(VOCAB))


def token_text(token_id: int) -> str:
    """Text of one output token (a leading space: tokens join into words)."""
    return " " + VOCAB[token_id]


def detokenize(token_ids: Iterable[int]) -> str:
    return "".join(" " + VOCAB[i] for i in token_ids)


def expected_output(prompt_ids: Sequence[int], seed: int, n: int) -> str:
    """What a request with these prompt ids and seed returns after n tokens (for tests)."""
    stream = TokenStream(prompt_ids, seed)
    return detokenize(stream.next_id() for _ in range(n))
