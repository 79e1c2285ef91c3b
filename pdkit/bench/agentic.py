"""The agentic workload of `pdkit bench`: multi-turn sessions replayed turn by turn, as coding agents
send them (a long system prompt and tool schema shared by every session, tool output and a user
message appended each turn, the engine's own reply fed back into the history).

Two sources, one format: SGLang's agentic-trace JSON (sglang/benchmark/datasets/agentic_trace.py,
identical in 0.5.17 and 0.5.23):

    {"metadata": {...},
     "conversations": [[{"messages": [{"role": "system", ...}, {"role": "user", ...}], "prompt_tokens": N},
                        {"messages": [{"role": "user", ...}], "prompt_tokens": N2}, ...], ...]}

Each turn's `messages` holds only the turn's NEW non-assistant messages; the replayer appends the
server's real assistant reply to the history before the next turn (SGLang's
`wrap_multi_turn_request_func` in sglang/benchmark/serving.py does the same). `load_trace` reads a
user's own trace; `generate_trace` writes one from a few parameters (AgenticParams), so SGLang's
bench can replay exactly the sessions `pdkit bench` sent (pdkit.bench.sglang).

Token counts without a tokenizer: the generator writes lowercase common English words, one
whitespace-separated word per token. That is EXACT for the sim (pdkit/sim/textgen.py: BOS, then
one token per word of `<|role|> content` lines, then `<|assistant|>`), and approximate for real
tokenizers (a short common word with its leading space is one token in Llama/Qwen-style BPE
vocabularies; the model's chat template adds its own few tokens per message). `prompt_tokens` of
each turn is that estimate, with every earlier reply taken as exactly reply_tokens long.

Replay: per concurrency level C, C sessions in flight; each session plays its turns in order
(streamed /v1/chat/completions through the router, max_tokens = reply tokens, ignore_eos, then
think_s of sleep), so the history grows by about turn_tokens + reply_tokens a turn. Each level
plays fresh sessions (like SGLang's --dataset-offset): replaying a level's sessions again would
find their whole history in the prefix cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdkit.bench.client import Progress, router_target, run_pool, stream_events
from pdkit.bench.record import LevelPages, check_context, context_cap, record_head, served_model
from pdkit.bench.stats import (
    RequestResult,
    distribution_ms,
    failure_kind,
    summarize_level,
    tpot,
)
from pdkit.clients.answers import CONTEXT_REFUSAL, INPUT_TOKENS_REFUSAL

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

# ---- the generator's parameters ----------------------------------------------------------------


@dataclass(frozen=True)
class AgenticParams:
    """What the generator makes: SESSIONS sessions (per level) of TURNS turns each."""

    sessions: int = 8
    turns: int = 6
    # the shared system prompt + tool schema, in tokens (words): the cross-session prefix
    system_tokens: int = 2000
    # added per turn (tool output + user message); turn 1's user message too
    turn_tokens: int = 600
    # max_tokens per turn (EOS ignored: every reply is exactly this long)
    reply_tokens: int = 128
    # seconds a session waits after a reply before its next turn (the agent's own work)
    think_s: float = 0.5
    seed: int = 0

    def problems(self) -> list[str]:
        """Every invalid field, named with what would be valid."""
        out = []
        for name, least in (("sessions", 1), ("turns", 1), ("system_tokens", 0), ("turn_tokens", 1),
                            ("reply_tokens", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                out.append(f"{name} must be an integer >= {least}, got {value!r}")
        if isinstance(self.think_s, bool) or not isinstance(self.think_s, int | float) or not 0 <= self.think_s <= 3600:
            out.append(f"think_s must be seconds within 0..3600, got {self.think_s!r}")
        return out

    def check(self) -> AgenticParams:
        problems = self.problems()
        if problems:
            raise ValueError("agentic workload: " + "; ".join(problems))
        return self

    def prompt_tokens(self, turn: int) -> int:
        """Turn TURN's (1-based) prompt in the sim's tokens: BOS, the system message (tag + words),
        TURN new messages and TURN-1 replies (tag + words each), the assistant tag."""
        return 1 + (1 + self.system_tokens) + turn * (1 + self.turn_tokens) + (turn - 1) * (1 + self.reply_tokens) + 1

    def largest_context(self) -> int:
        """The last turn's prompt plus its reply: what must fit the served context length."""
        return self.prompt_tokens(self.turns) + self.reply_tokens


# ---- the generated text ------------------------------------------------------------------------

# Short common English words: with a leading space each is one token in the usual BPE vocabularies
# (and exactly one in the sim). Coding-agent flavoured, so a trace reads like one.
WORDS = tuple("""
the a to of and in is it for on with as at by from or be this that not are was you we can if
file line code test run call read write open path name type value data list item key map set get
add new old end use make find show fix bug error fail pass true false none null void int str
def class func self main init load save send copy move edit diff patch tool step plan next last
first user agent task goal note text word page view log info warn time date size count index
node host port loop case break return yield import module build check state cache hash sort
merge split join trim push pull fetch query table row field block shell input output result
""".split())
SYSTEM_HEAD = "you are a coding agent . these are your tools and their schema :"


def words(rng: random.Random, n: int) -> str:
    """N words drawn from WORDS (N tokens in the sim, about N in a real tokenizer)."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompt(params: AgenticParams) -> str:
    """The system prompt and tool schema every session shares: system_tokens words."""
    head = SYSTEM_HEAD.split()[: params.system_tokens]
    rest = words(random.Random(f"pdkit-agentic:{params.seed}:system"), params.system_tokens - len(head))
    return " ".join([*head, rest]).strip()


def turn_text(params: AgenticParams, session: int, turn: int) -> str:
    """Session SESSION's new message at TURN: turn_tokens words of its own (tool output + user)."""
    return words(random.Random(f"pdkit-agentic:{params.seed}:session:{session}:turn:{turn}"), params.turn_tokens)


def generate_trace(params: AgenticParams, conversations: int | None = None) -> dict[str, Any]:
    """SGLang's agentic-trace JSON from PARAMS, deterministic (same params: the same JSON).
    CONVERSATIONS: how many sessions (default params.sessions; `pdkit bench` writes sessions x
    levels, each level playing fresh ones)."""
    params.check()
    count = params.sessions if conversations is None else conversations
    if count < 1:
        raise ValueError(f"conversations must be at least 1, got {count}")
    system = {"role": "system", "content": system_prompt(params)}
    out = []
    for s in range(count):
        turns = []
        for t in range(1, params.turns + 1):
            new = [{"role": "user", "content": turn_text(params, s, t)}]
            turns.append({"messages": ([system] if t == 1 else []) + new, "prompt_tokens": params.prompt_tokens(t)})
        out.append(turns)
    metadata = {
        "generator": "pdkit.bench.agentic",
        "format": "sglang agentic-trace (sglang/benchmark/datasets/agentic_trace.py)",
        "params": asdict(params), "conversations": count, "reply_tokens": params.reply_tokens,
        "prompt_tokens": "estimate: one token per whitespace-separated word, the sim's chat template (exact on "
                         "the sim; approximate on a real tokenizer and template), each reply reply_tokens long",
    }
    return {"metadata": metadata, "conversations": out}


def trace_bytes(trace: dict[str, Any]) -> bytes:
    """The trace file's bytes: compact JSON, keys in the order written (deterministic)."""
    return (json.dumps(trace, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def write_trace(trace: dict[str, Any], path: str | Path) -> str:
    """Write the trace; return its sha256."""
    data = trace_bytes(trace)
    Path(path).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


# ---- a trace read back -------------------------------------------------------------------------

ROLES = ("system", "user", "tool", "developer")


@dataclass(frozen=True)
class Trace:
    """A loaded trace: per conversation, per turn, the turn's new messages and its prompt_tokens (or None)."""

    conversations: tuple[tuple[tuple[dict[str, str], ...], ...], ...]
    prompt_tokens: tuple[tuple[int | None, ...], ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def capped(self, max_turns: int | None) -> Trace:
        """At most MAX_TURNS turns per conversation (SGLang's --agentic-max-turns)."""
        if not max_turns:
            return self
        return Trace(tuple(c[:max_turns] for c in self.conversations),
                     tuple(p[:max_turns] for p in self.prompt_tokens), self.metadata)

    def largest_context(self, reply_tokens: int) -> int:
        """The largest turn prompt plus a reply: the trace's prompt_tokens where given, else the
        sim-exact estimate (a word a token) with replies of REPLY_TOKENS."""
        largest = 0
        for turns, counts in zip(self.conversations, self.prompt_tokens):
            history = 1  # BOS
            for k, (messages, given) in enumerate(zip(turns, counts)):
                history += sum(1 + len(m["content"].split()) for m in messages) + (k and 1 + reply_tokens)
                largest = max(largest, (given if given else history + 1) + reply_tokens)
        return largest

    def turns(self) -> int:
        return max(len(c) for c in self.conversations)


def trace_problems(data: Any) -> list[str]:
    """Every way DATA is not an agentic trace SGLang's loader and replayer take, by conversation,
    turn and message index (the first 20)."""
    if not isinstance(data, dict):
        return [f"the trace must be a JSON object with 'conversations', got {type(data).__name__}"]
    conversations = data.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        return ["'conversations' must be a non-empty list of conversations (each a list of turns)"]
    out = []
    for c, turns in enumerate(conversations):
        if not isinstance(turns, list) or not turns:
            out.append(f"conversations[{c}]: must be a non-empty list of turns")
            continue
        for t, turn in enumerate(turns):
            where = f"conversations[{c}][{t}]"
            if not isinstance(turn, dict):
                out.append(f"{where}: a turn must be an object with 'messages', got {type(turn).__name__}")
                continue
            tokens = turn.get("prompt_tokens")
            if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
                out.append(f"{where}.prompt_tokens: must be an integer >= 0, got {tokens!r}")
            messages = turn.get("messages")
            if not isinstance(messages, list) or not messages:
                out.append(f"{where}.messages: must be a non-empty list of the turn's new messages")
                continue
            for m, message in enumerate(messages):
                if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                    out.append(f"{where}.messages[{m}]: must be an object with a string 'content'")
                elif message.get("role") not in ROLES:
                    out.append(f"{where}.messages[{m}].role: {message.get('role')!r} is not one of {', '.join(ROLES)}"
                               " (assistant replies come from the engine; a trace holds only the new messages)")
    return out[:20]


def trace_from_dict(data: Any, source: str = "trace") -> Trace:
    """A validated Trace; ValueError listing every problem (SOURCE names the file)."""
    problems = trace_problems(data)
    if problems:
        raise ValueError(f"{source}: not an agentic trace (SGLang's agentic-trace format): " + "; ".join(problems))
    convs = tuple(tuple(tuple({"role": m["role"], "content": m["content"]} for m in turn["messages"]) for turn in c)
                  for c in data["conversations"])
    counts = tuple(tuple(turn.get("prompt_tokens") for turn in c) for c in data["conversations"])
    return Trace(convs, counts, dict(data.get("metadata") or {}))


def load_trace(path: str | Path, max_turns: int | None = None) -> tuple[Trace, str]:
    """(the trace at PATH, capped to MAX_TURNS turns, its sha256)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"--trace {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"--trace {path}: not JSON: {exc}") from None
    return trace_from_dict(data, f"--trace {path}").capped(max_turns), hashlib.sha256(raw).hexdigest()


# ---- the workload: what each level plays -----------------------------------------------------

# SGLang's own default per-turn output for agentic traces (agentic_trace.py DEFAULT_AGENTIC_OUTPUT_LEN)
SGLANG_DEFAULT_REPLY_TOKENS = 220


@dataclass(frozen=True)
class AgenticWorkload:
    """A trace and how to play it: SESSIONS fresh conversations per level, each turn REPLY_TOKENS
    long, THINK_S between turns. PARAMS when generated; PATH when a user's trace file."""

    trace: Trace
    sha256: str
    sessions: int
    reply_tokens: int
    think_s: float
    params: AgenticParams | None = None
    path: str | None = None
    max_turns: int | None = None

    @classmethod
    def generated(cls, params: AgenticParams, levels: int = 1) -> AgenticWorkload:
        trace = generate_trace(params, params.sessions * max(1, levels))
        return cls(trace_from_dict(trace, "generated"), hashlib.sha256(trace_bytes(trace)).hexdigest(),
                   params.sessions, params.reply_tokens, params.think_s, params=params)

    @classmethod
    def from_file(cls, path: str, sessions: int | None, reply_tokens: int | None, think_s: float,
                  max_turns: int | None = None) -> AgenticWorkload:
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"--max-turns must be at least 1, got {max_turns}")
        trace, sha = load_trace(path, max_turns)
        if reply_tokens is None:  # pdkit's own trace says its reply length; else SGLang's default
            reply_tokens = int(trace.metadata.get("reply_tokens") or SGLANG_DEFAULT_REPLY_TOKENS)
        sessions = min(sessions or len(trace.conversations), len(trace.conversations))
        for name, value, least in (("--sessions", sessions, 1), ("--reply-tokens", reply_tokens, 1)):
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")
        if not 0 <= think_s <= 3600:
            raise ValueError(f"--think-s must be seconds within 0..3600, got {think_s}")
        return cls(trace, sha, sessions, reply_tokens, think_s, path=path, max_turns=max_turns)

    def offset(self, level_index: int) -> int:
        """Where level LEVEL_INDEX starts in the conversation list (SGLang's --dataset-offset)."""
        return level_index * self.sessions

    def level_conversations(self, level_index: int) -> list[tuple[tuple[dict[str, str], ...], ...]]:
        """The conversations level LEVEL_INDEX plays: the list rotated by offset(), the first
        `sessions` (SGLang's AgenticTraceDataset.load with --dataset-offset and --num-prompts)."""
        convs = list(self.trace.conversations)
        start = self.offset(level_index) % len(convs)
        return (convs[start:] + convs[:start])[: self.sessions]

    def turns_per_level(self, level_index: int) -> int:
        return sum(len(c) for c in self.level_conversations(level_index))

    def largest_context(self) -> int:
        return self.trace.largest_context(self.reply_tokens)

    def describe(self) -> dict[str, Any]:
        """The record's `workload` block."""
        out: dict[str, Any] = {"kind": "agentic", "source": "generated" if self.params else "trace",
                               "sessions": self.sessions, "turns": self.trace.turns(),
                               "conversations": len(self.trace.conversations), "reply_tokens": self.reply_tokens,
                               "think_s": self.think_s, "largest_context": self.largest_context(),
                               "trace_sha256": self.sha256}
        if self.params:
            out["params"] = asdict(self.params)
        if self.path:
            out["trace"] = self.path
        if self.max_turns:
            out["max_turns"] = self.max_turns
        return out


# ---- the replayer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnResult:
    """One turn of one session: its request's result, its depth (1-based), the server's cached tokens."""

    session: int
    turn: int
    result: RequestResult
    cached_tokens: int | None = None


def chat_body(model: str, messages: Sequence[dict[str, str]], reply_tokens: int) -> dict[str, Any]:
    """A streamed chat completion of exactly REPLY_TOKENS tokens (SGLang's ChatCompletionRequest
    takes ignore_eos, 0.5.17 and 0.5.23; usage asked for in the stream, as SGLang's replayer does)."""
    return {"model": model, "messages": list(messages), "max_tokens": reply_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def stream_chat(session, url: str, headers: dict[str, str], body: dict[str, Any], reply_tokens: int,
                      timeout_s: float) -> tuple[RequestResult, str, int | None]:
    """One streamed chat completion timed chunk by chunk: (result, the reply's text, the server's
    usage.prompt_tokens_details.cached_tokens or None). Output tokens are the server's
    usage.completion_tokens (chunks with text when it sends no usage); a reply of another length
    than asked for is an error, as in pdkit.bench.client.stream_one."""
    start = time.perf_counter()
    chunk_times: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] = {}

    def see(event: Any) -> None:
        nonlocal usage
        if isinstance(event, dict):
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
                    chunk_times.append(time.perf_counter() - start)

    end, worker, failure = await stream_events(session, url, headers, body, timeout_s, see)
    latency = time.perf_counter() - start

    def failed(why: str, finish: str | None = None) -> tuple[RequestResult, str, None]:
        return (RequestResult(ok=False, error=why, kind=failure_kind(why), finish_reason=finish, worker=worker,
                              rid=end.rid), "", None)

    if failure is not None:
        return failed(*failure)
    tokens = int(usage.get("completion_tokens") or len(chunk_times))
    if tokens != reply_tokens:
        return failed(f"{'short' if tokens < reply_tokens else 'long'} ({end.shown_finish()}): got {tokens} output "
                      f"tokens, asked for {reply_tokens}", end.shown_finish())
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    result = RequestResult(ok=True, ttft=chunk_times[0], latency=latency, output_tokens=tokens,
                           prompt_tokens=int(usage.get("prompt_tokens") or 0), chunk_times=tuple(chunk_times),
                           finish_reason=end.finish_reason, worker=worker, rid=end.rid)
    return result, "".join(text), cached if isinstance(cached, int) else None


async def play_session(session, url: str, headers: dict[str, str], model: str, index: int,
                       turns: Sequence[Sequence[dict[str, str]]], reply_tokens: int, think_s: float,
                       timeout_s: float, progress: Progress | None = None) -> list[TurnResult]:
    """One session, turn by turn: history + the turn's new messages, the real reply appended,
    THINK_S between turns. A failed turn ends the session: its later turns would replay a history
    the engine never produced (they are reported as skipped)."""
    history: list[dict[str, str]] = []
    out = []
    last_prompt = 0  # the engine's own count of the previous turn's prompt
    for depth, new in enumerate(turns, start=1):
        if depth > 1 and think_s:
            await asyncio.sleep(think_s)
        history.extend(new)
        result, reply, cached = await stream_chat(session, url, headers, chat_body(model, history, reply_tokens),
                                                  reply_tokens, timeout_s)
        if not result.ok and (why := over_cap(result.error or "", index, depth, last_prompt, reply_tokens)):
            result = replace(result, error=why)
        last_prompt = result.prompt_tokens or last_prompt
        out.append(TurnResult(index, depth, result, cached))
        if progress is not None:
            progress.step(result.ok)
        if not result.ok:
            break
        history.append({"role": "assistant", "content": reply})
    return out


def over_cap(error: str, session: int, depth: int, last_prompt: int, reply_tokens: int) -> str | None:
    """A turn the engine refused for length, said with the engine's own counts first (the workload's
    sizes are estimates: the tokenizer's rate, and each reply counted again as text; docs/tune.md,
    "PD or unified on my box"); None for any other failure."""
    cap = CONTEXT_REFUSAL.search(error)
    if not cap:
        return None
    seen = INPUT_TOKENS_REFUSAL.search(error)
    counted = f"{seen.group(1)} prompt tokens by the engine's count" if seen else "a prompt"
    before = (f" (turn {depth - 1} was {last_prompt} and its reply {reply_tokens} tokens)"
              if depth > 1 and last_prompt else "")
    return (f"over the context cap: session {session} turn {depth}: {counted}, cap {cap.group(1)}{before}: the "
            "history grew past the workload's estimate (replies re-counted as text, the tokenizer's rate): fewer "
            f"or shorter turns fit; the engine said: {error}")


async def run_sessions(url: str, headers: dict[str, str], model: str,
                       conversations: Sequence[Sequence[Sequence[dict[str, str]]]], concurrency: int,
                       reply_tokens: int, think_s: float, timeout_s: float,
                       progress: Progress | None = None) -> tuple[list[TurnResult], float]:
    """Every conversation played, CONCURRENCY sessions in flight at any time: (turns, wall time)."""

    def one(session, i: int) -> Awaitable[list[TurnResult]]:
        return play_session(session, url, headers, model, i, conversations[i], reply_tokens, think_s, timeout_s,
                            progress)

    return await run_pool(len(conversations), concurrency, max(1, concurrency), one)


# ---- a level's figures -------------------------------------------------------------------------

# Turn-depth buckets (first turn, lower bound, upper bound or None): the first turn pays the whole
# prefill of a cold session; later turns mostly hit the cache and prefill only the new messages.
DEPTH_BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, None))


def bucket_name(low: int, high: int | None) -> str:
    return str(low) if high == low else f"{low}+" if high is None else f"{low}-{high}"


def depth_stats(turns: Sequence[TurnResult]) -> list[dict[str, Any]]:
    """Per turn-depth bucket that has turns: requests, errors, TTFT and TPOT (ms), the server's
    prompt tokens (mean) and, when it reports them, its cached tokens (sum)."""
    out = []
    for low, high in DEPTH_BUCKETS:
        mine = [t for t in turns if t.turn >= low and (high is None or t.turn <= high)]
        if not mine:
            continue
        done = [t.result for t in mine if t.result.ok]
        prompts = [r.prompt_tokens for r in done if r.prompt_tokens]
        cached = [t.cached_tokens for t in mine if t.result.ok and t.cached_tokens is not None]
        out.append({
            "depth": bucket_name(low, high), "requests": len(mine), "errors": len(mine) - len(done),
            "prompt_tokens_mean": round(sum(prompts) / len(prompts), 1) if prompts else None,
            "cached_tokens": sum(cached) if cached else None,
            "ttft_ms": distribution_ms([r.ttft for r in done if r.ttft is not None]),
            "tpot_ms": distribution_ms([t for t in (tpot(r) for r in done) if t is not None]),
        })
    return out


def agentic_level(turns: Sequence[TurnResult], duration_s: float, concurrency: int, planned_turns: int,
                  goodput_slo: dict[str, float] | None = None) -> dict[str, Any]:
    """A level's `levels[]` entry: the usual figures over every turn (a turn is a request), plus
    `sessions`, `turns_skipped` (after a failed turn), `by_depth` and the server-reported cache
    (`reported_cached_tokens`, None when the server reports none: SGLang needs --enable-cache-report)."""
    level = summarize_level([t.result for t in turns], duration_s, concurrency, goodput_slo)
    cached = [t.cached_tokens for t in turns if t.result.ok and t.cached_tokens is not None]
    level.update({
        "sessions": len({t.session for t in turns}),
        "turns_skipped": planned_turns - len(turns),
        "by_depth": depth_stats(turns),
        "reported_cached_tokens": sum(cached) if cached else None,
    })
    return level


# ---- a run -------------------------------------------------------------------------------------

# The warm-up's own user message: one turn after the shared system prompt, so the level's first
# turns meet a warm system prompt (as a serving cluster's do) without caching any session's own turns
WARMUP_MESSAGE = {"role": "user", "content": "warm up"}


def warmup_messages(workload: AgenticWorkload) -> list[dict[str, str]]:
    """The first conversation's system messages (the shared prefix) and WARMUP_MESSAGE."""
    first = workload.trace.conversations[0][0]
    return [m for m in first if m["role"] == "system"] + [WARMUP_MESSAGE]


def check_agentic(spec: ClusterSpec, workload: AgenticWorkload, warmup: int) -> None:
    """Refuse, before any request, a workload whose largest context exceeds the planned cap."""
    if warmup < 0:
        raise ValueError(f"--warmup must be at least 0, got {warmup}")
    what = ("the agentic workload's largest context (system + turns x (turn + reply) tokens)" if workload.params
            else f"the trace's largest context (largest prompt_tokens + --reply-tokens {workload.reply_tokens})")
    check_context(spec, workload.largest_context(), what)


def estimated_tokens(messages: Sequence[dict[str, str]]) -> int:
    """MESSAGES' prompt by the workload's estimate (the sim's template: BOS, a tag and one token per
    word a message, the assistant tag; AgenticParams.prompt_tokens counts the same way)."""
    return 1 + sum(1 + len(m["content"].split()) for m in messages) + 1


def check_counted(spec: ClusterSpec, workload: AgenticWorkload, warmup: Sequence[TurnResult]) -> float | None:
    """The engine's own count of the warm-up prompt over the workload's estimate of it; refuse, before
    the first level, a workload whose largest context at that rate exceeds the planned cap (on the lent
    H100 the rate was 1.9 and the first sessions were refused at turn 4, docs/tune.md). None when no
    warm-up answered with a count."""
    counted = sorted(t.result.prompt_tokens for t in warmup if t.result.ok and t.result.prompt_tokens)
    if not counted:
        return None
    median, estimate = counted[len(counted) // 2], estimated_tokens(warmup_messages(workload))
    rate = median / estimate
    cap = context_cap(spec)
    largest = workload.largest_context() - workload.reply_tokens
    projected = math.ceil(largest * max(rate, 1.0)) + workload.reply_tokens
    if cap is not None and projected > cap:
        raise ValueError(
            f"the engine counts {rate:.2f}x the agentic workload's token estimate (the warm-up prompt: "
            f"{median} tokens by the engine's count, {estimate} "
            f"estimated): its largest context would be ~{projected} tokens, over the planned context length {cap} "
            f"(cluster tuning context_length); scale the system, turn and reply sizes (or the turns) by "
            f"{cap / projected:.2f} or less")
    return round(rate, 3)


def run_agentic_bench(spec: ClusterSpec, workload: AgenticWorkload, concurrency: Sequence[int] = (8,),
                      warmup: int = 4, label: str = "", timeout_s: float = 300.0, probe_drivers: bool = True,
                      progress: bool = True, goodput_slo: dict[str, float] | None = None) -> dict[str, Any]:
    """Replay the workload through the spec's router at each concurrency (sessions in flight);
    return the record: per level the usual figures over its turns, by turn depth, the prefix-cache
    hit rate from the engines' own counters and the KV hand-offs (PD)."""
    check_agentic(spec, workload, warmup)
    router_url, headers = router_target(spec)
    model = served_model(spec)
    record = record_head(spec, "pdkit", label, workload.largest_context() - workload.reply_tokens,
                         workload.reply_tokens, workload.turns_per_level(0), warmup, probe_drivers, router_url,
                         workload=workload.describe())
    pages = LevelPages.named_in(spec, record)
    url = f"{router_url}/v1/chat/completions"
    if warmup:
        bar = Progress("warm-up", warmup, progress)
        first = [[warmup_messages(workload)]] * warmup
        turns, _ = asyncio.run(run_sessions(url, headers, model, first, max(concurrency), workload.reply_tokens, 0.0,
                                            timeout_s, bar))
        bar.close()
        if turns and not any(t.result.ok for t in turns):
            raise RuntimeError(f"every warm-up request through {router_url} failed: {turns[0].result.error}")
        record["workload"]["token_rate"] = check_counted(spec, workload, turns)
    for level_index, c in enumerate(concurrency):
        conversations = workload.level_conversations(level_index)
        planned = sum(len(conv) for conv in conversations)
        bar = Progress(f"C={c:<4}", planned, progress)
        before = pages.sample()
        turns, duration = asyncio.run(run_sessions(url, headers, model, conversations, c, workload.reply_tokens,
                                                   workload.think_s, timeout_s, bar))
        after = pages.sample()
        bar.close()
        level = agentic_level(turns, duration, c, planned, goodput_slo)
        level.update(pages.figures(c, before, after, level["ttft_ms"]["mean"]))
        record["levels"].append(level)
    return record
