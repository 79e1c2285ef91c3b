"""Request parsing and response bodies for SGLang's native and OpenAI-compatible APIs (pure).

Bodies follow SGLang's shapes closely enough for the router, bench clients and OpenAI SDKs:
native /generate (`text`, `output_ids`, `meta_info`), /v1/completions and
/v1/chat/completions with `usage`, SSE chunks ending in `data: [DONE]`. Batched prompts and
n > 1 are refused: nothing the kit sends needs them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pdkit.sim.bootstrap import BootstrapTarget
from pdkit.sim.textgen import (
    MODEL_VOCAB_SIZE,
    Drift,
    Position,
    Trace,
    boxed_answer,
    chat_prompt,
    detokenize,
    logprob_text,
    prompt_scores,
    score,
    token_text,
    tokenize,
)

# The id reported as the matched stop when the sim's default length ends a request "by EOS".
EOS_TOKEN_ID = 2
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams default for native /generate
OPENAI_COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class RequestError(Exception):
    """A request the engine refuses; status and message go back to the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Defaults:
    model: str
    context_length: int
    seed: int
    default_max_tokens: int  # chat without max_tokens: the sim's stand-in for "until EOS"
    # --enable-cache-report: OpenAI usage carries prompt_tokens_details.cached_tokens
    cache_report: bool = False


class LogprobRequest:
    """A native /generate request's logprob fields (SGLang's GenerateReqInput: return_logprob,
    logprob_start_len, top_logprobs_num, token_ids_logprob, return_text_in_logprobs; 0.5.17 and 0.5.23
    managers/io_struct.py), and what the engine fills in while the request runs (the output trace,
    the drift and load it ran under). `meta()` renders meta_info's logprob fields as SGLang's
    tokenizer manager does (managers/tokenizer_manager.py add_logprob_to_meta_info)."""

    __slots__ = ("start", "top_n", "token_ids", "text", "trace", "drift", "load", "running", "decode",
                 "_input", "_output", "_rendered")

    def __init__(self, start: int, top_n: int, token_ids: list[int] | None, text: bool) -> None:
        self.start = start  # resolved: input logprobs from here (len(prompt): none)
        self.top_n = top_n
        self.token_ids = token_ids
        self.text = text
        # filled by the engine
        self.trace: Trace | None = None
        self.drift: Drift | None = None
        self.load = 0  # requests running beside this one when it was scheduled
        self.running = 1  # requests its prefill ran with (itself included)
        self.decode = False  # a PD decode: no input logprobs (the prefill sends them)
        self._input: list[Position | None] | None = None
        self._output: list[Position | None] = []
        self._rendered: dict[str, list] = {}

    def output_positions(self, prompt_len: int, output_ids: list[int]) -> list[Position | None]:
        """Scores of the output tokens so far (each once: streamed events repeat the whole list)."""
        out = self._output
        trace = self.trace
        for k in range(len(out), len(output_ids)):
            if trace is None or k >= len(trace.states):
                out.append(None)
                continue
            if k == 0 and trace.first is not None:  # a PD decode: the prefill's figures for its token
                first = trace.first
                out.append(Position(first["logprob"], [[lp, tid, None] for lp, tid, *_ in first["top"]] or None,
                                    None))
                continue
            pos = prompt_len + k
            sigma = self.drift.sigma(pos, self.load) if self.drift is not None else 0.0
            out.append(score(trace.states[k], output_ids[k], self.top_n, self.token_ids, trace.diverged[k], sigma))
        return out

    def input_positions(self, prompt_ids: list[int], seed: int) -> list[Position | None]:
        if self._input is None:
            self._input = [] if self.decode else prompt_scores(
                prompt_ids, seed, self.start, self.top_n, self.token_ids, self.drift, self.load, self.running)
        return self._input

    def first_report(self, prompt_len: int, output_ids: list[int]) -> dict[str, Any] | None:
        """A PD prefill's first-token figures for the decode (SGLang's metadata buffer carries the
        first token's logprob and top logprobs, not its token_ids_logprob: disaggregation/utils.py)."""
        positions = self.output_positions(prompt_len, output_ids[:1])
        if not positions or positions[0] is None:
            return None
        p = positions[0]
        return {"logprob": p.logprob, "top": p.top or []}

    def _entry(self, lp: float | None, tid: int) -> list[Any]:
        return [lp, tid, logprob_text(tid) if self.text else None]

    def _rows(self, rows: list[list[Any]] | None) -> list[list[Any]] | None:
        # SGLang's detokenize_top_logprobs_tokens: an empty or missing row is None
        if not rows:
            return None
        return [[lp, tid, logprob_text(tid)] for lp, tid, _ in rows] if self.text else rows

    def _render(self, positions: list[Position | None], ids: list[int], side: str, into: dict[str, list]) -> None:
        """Append the entries of positions not rendered yet to the lists in `into`."""
        done = len(into.setdefault(f"{side}_token_logprobs", []))
        new = range(done, len(positions))
        fresh = list(zip(new, positions[done:]))
        into[f"{side}_token_logprobs"].extend(
            self._entry(p.logprob if p else None, ids[k]) for k, p in fresh)
        if self.top_n > 0:
            into.setdefault(f"{side}_top_logprobs", []).extend(
                self._rows(p.top) if p else None for _, p in fresh)
        if self.token_ids is not None:
            into.setdefault(f"{side}_token_ids_logprobs", []).extend(
                self._rows(p.ids) if p else None for _, p in fresh)

    def meta(self, spec: GenSpec, output_ids: list[int]) -> dict[str, Any]:
        """meta_info's logprob fields, in SGLang's shapes (tokenizer_manager.py add_logprob_to_meta_info and
        detokenize_logprob_tokens): `input_token_logprobs` / `output_token_logprobs` as [logprob, id, text]
        per position (text None without return_text_in_logprobs; the first input position's logprob None),
        `output_token_logprobs_length`; with top_logprobs_num > 0 `input_top_logprobs` / `output_top_logprobs`
        (per position a list of top_logprobs_num [logprob, id, text], or None); with token_ids_logprob
        `input_token_ids_logprobs` / `output_token_ids_logprobs` (per position the asked ids, or None)."""
        prompt = spec.prompt_ids
        inputs = self.input_positions(prompt, spec.seed)
        outputs = self.output_positions(len(prompt), output_ids)
        rendered = self._rendered
        self._render(inputs, prompt[self.start:], "input", rendered)
        self._render(outputs, output_ids, "output", rendered)
        meta: dict[str, Any] = {
            "input_token_logprobs": rendered["input_token_logprobs"],
            "output_token_logprobs": rendered["output_token_logprobs"],
            "output_token_logprobs_length": len(outputs),
        }
        if self.top_n > 0:
            meta["input_top_logprobs"] = rendered["input_top_logprobs"]
            meta["output_top_logprobs"] = rendered["output_top_logprobs"]
        if self.token_ids is not None:
            meta["input_token_ids_logprobs"] = rendered["input_token_ids_logprobs"]
            meta["output_token_ids_logprobs"] = rendered["output_token_ids_logprobs"]
        return meta


@dataclass(frozen=True)
class GenSpec:
    api: str  # generate | completion | chat
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    limit_finish: str  # finish reason when max_new_tokens is reached: length | stop
    seed: int
    stream: bool
    include_usage: bool
    model: str
    bootstrap: BootstrapTarget | None
    created: int
    cache_report: bool = False
    # native /generate with return_logprob (SGLang's fields; the engine fills in what it ran under)
    logprobs: LogprobRequest | None = None


def _int(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestError(400, f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _bootstrap(body: dict[str, Any]) -> BootstrapTarget | None:
    host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
    if host is None and room is None:
        return None
    if isinstance(host, list) or isinstance(room, list):
        raise RequestError(400, "sim: batched PD requests (bootstrap lists) are not supported")
    if not isinstance(host, str) or port is None or room is None:
        raise RequestError(400, "bootstrap_host, bootstrap_port and bootstrap_room must come together")
    return BootstrapTarget(host, _int(port, "bootstrap_port", 1), _int(room, "bootstrap_room"))


def _limit(prompt_len: int, requested: int | None, fallback: int, fallback_finish: str, d: Defaults) -> tuple[int, str]:
    if prompt_len >= d.context_length:
        raise RequestError(400, f"The input ({prompt_len} tokens) is longer than the model's context length "
                                f"({d.context_length} tokens).")
    room = d.context_length - prompt_len
    if requested is None:
        return max(1, min(fallback, room)), fallback_finish
    if requested > room:
        return max(1, room), "length"
    return max(1, requested), "length"


def _seed(value: Any, d: Defaults) -> int:
    return d.seed if value is None else _int(value, "seed")


def _logprobs(body: dict[str, Any], prompt_len: int) -> LogprobRequest | None:
    """SGLang's logprob fields (0.5.17 / 0.5.23 managers/io_struct.py GenerateReqInput, defaults in
    _normalize: return_logprob False, logprob_start_len -1, top_logprobs_num 0, token_ids_logprob None,
    [] taken as None). logprob_start_len -1 means no input logprobs, and so does len(prompt); above it
    SGLang aborts the request with 400 (managers/scheduler.py handle_generate_request). Only read with
    return_logprob, as SGLang ignores logprob_start_len otherwise."""
    want = body.get("return_logprob")
    if isinstance(want, list):
        raise RequestError(400, "sim: batched return_logprob is not supported")
    if not want:
        return None
    start = body.get("logprob_start_len")
    start = -1 if start is None else start
    if isinstance(start, bool) or not isinstance(start, int) or start < -1:
        raise RequestError(400, f"sim: logprob_start_len must be -1 or an integer >= 0, got {start!r}")
    if start > prompt_len:
        raise RequestError(400, f"req.logprob_start_len={start} is higher than the number of input tokens "
                                f"len(req.origin_input_ids)={prompt_len}. Please use a smaller logprob_start_len.")
    top_n = body.get("top_logprobs_num")
    top_n = 0 if top_n is None else _int(top_n, "top_logprobs_num")
    token_ids = body.get("token_ids_logprob") or None
    if token_ids is not None:
        # managers/tokenizer_manager.py _validate_token_ids_logprob (0.5.23)
        if not isinstance(token_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                      for t in token_ids):
            raise RequestError(400, "token_ids_logprob must be a flat list of integers.")
        for t in token_ids:
            if not 0 <= t < MODEL_VOCAB_SIZE:
                raise RequestError(400, f"token_ids_logprob contains out-of-vocabulary token id {t}; "
                                        f"valid range is [0, {MODEL_VOCAB_SIZE}).")
    return LogprobRequest(prompt_len if start == -1 else start, top_n, token_ids,
                          bool(body.get("return_text_in_logprobs")))


def parse_generate(body: dict[str, Any], d: Defaults) -> GenSpec:
    if "input_ids" in body and body["input_ids"] is not None:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise RequestError(400, "sim: input_ids must be one list of ints (batches are not supported)")
        prompt_ids = ids
    elif isinstance(body.get("text"), str):
        prompt_ids = tokenize(body["text"])
    else:
        raise RequestError(400, "Either text or input_ids should be provided (one prompt; batches are not supported).")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise RequestError(400, "sampling_params must be an object")
    requested = params.get("max_new_tokens")
    requested = None if requested is None else _int(requested, "max_new_tokens")
    max_new, finish = _limit(len(prompt_ids), requested, SGLANG_DEFAULT_MAX_NEW_TOKENS, "length", d)
    return GenSpec(
        api="generate", rid=str(body.get("rid") or uuid.uuid4().hex), prompt_ids=prompt_ids,
        max_new_tokens=max_new, limit_finish=finish,
        seed=_seed(params.get("sampling_seed", params.get("seed")), d),
        stream=bool(body.get("stream")), include_usage=False, model=d.model,
        bootstrap=_bootstrap(body), created=int(time.time()), cache_report=d.cache_report,
        logprobs=_logprobs(body, len(prompt_ids)),
    )


def _openai_common(body: dict[str, Any]) -> tuple[bool, bool]:
    n = body.get("n", 1)
    if n not in (None, 1):
        raise RequestError(400, "sim: n > 1 is not supported")
    options = body.get("stream_options") or {}
    return bool(body.get("stream")), bool(isinstance(options, dict) and options.get("include_usage"))


def parse_completion(body: dict[str, Any], d: Defaults) -> GenSpec:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_ids = tokenize(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
        prompt_ids = prompt
    else:
        raise RequestError(400, "sim: prompt must be one string or one list of token ids")
    stream, include_usage = _openai_common(body)
    requested = body.get("max_tokens")
    requested = OPENAI_COMPLETIONS_DEFAULT_MAX_TOKENS if requested is None else _int(requested, "max_tokens")
    max_new, finish = _limit(len(prompt_ids), requested, requested, "length", d)
    return GenSpec(
        api="completion", rid=f"cmpl-{uuid.uuid4().hex}", prompt_ids=prompt_ids,
        max_new_tokens=max_new, limit_finish=finish, seed=_seed(body.get("seed"), d),
        stream=stream, include_usage=include_usage, model=str(body.get("model") or d.model),
        bootstrap=_bootstrap(body), created=int(time.time()), cache_report=d.cache_report,
    )


def parse_chat(body: dict[str, Any], d: Defaults) -> GenSpec:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError(400, "messages must be a non-empty list of message objects")
    prompt_ids = tokenize(chat_prompt(messages))
    stream, include_usage = _openai_common(body)
    requested = body.get("max_completion_tokens", body.get("max_tokens"))
    requested = None if requested is None else _int(requested, "max_tokens")
    max_new, finish = _limit(len(prompt_ids), requested, d.default_max_tokens, "stop", d)
    return GenSpec(
        api="chat", rid=f"chatcmpl-{uuid.uuid4().hex}", prompt_ids=prompt_ids,
        max_new_tokens=max_new, limit_finish=finish, seed=_seed(body.get("seed"), d),
        stream=stream, include_usage=include_usage, model=str(body.get("model") or d.model),
        bootstrap=_bootstrap(body), created=int(time.time()), cache_report=d.cache_report,
    )


# ---- response bodies -------------------------------------------------------------------------

def usage(spec: GenSpec, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI usage as SGLang's UsageProcessor writes it (0.5.17 and 0.5.23
    entrypoints/openai/usage_processor.py): prompt_tokens_details is null unless the server runs
    --enable-cache-report, then {"cached_tokens": N} (N may be 0)."""
    prompt = len(spec.prompt_ids)
    details = {"cached_tokens": cached_tokens} if spec.cache_report else None
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens, "prompt_tokens_details": details}


def _matched_stop(finish: str | None) -> int | None:
    return EOS_TOKEN_ID if finish == "stop" else None


def generate_body(spec: GenSpec, output_ids: list[int], finish: str | None, e2e_s: float,
                  cached_tokens: int = 0) -> dict[str, Any]:
    """meta_info carries cached_tokens always, flag or not (0.5.23 tokenizer_manager.py)."""
    reason = None
    if finish == "length":
        reason = {"type": "length", "length": len(output_ids)}
    elif finish == "stop":
        reason = {"type": "stop", "matched": EOS_TOKEN_ID}
    meta: dict[str, Any] = {"id": spec.rid, "finish_reason": reason, "prompt_tokens": len(spec.prompt_ids)}
    if spec.logprobs is not None:
        meta.update(spec.logprobs.meta(spec, output_ids))
    meta.update(completion_tokens=len(output_ids), cached_tokens=cached_tokens, e2e_latency=round(e2e_s, 6))
    return {"text": detokenize(output_ids), "output_ids": list(output_ids), "meta_info": meta}


def completion_body(spec: GenSpec, output_ids: list[int], finish: str, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "id": spec.rid, "object": "text_completion", "created": spec.created, "model": spec.model,
        "choices": [{"index": 0, "text": detokenize(output_ids), "logprobs": None,
                     "finish_reason": finish, "matched_stop": _matched_stop(finish)}],
        "usage": usage(spec, len(output_ids), cached_tokens),
    }


def chat_body(spec: GenSpec, output_ids: list[int], finish: str, cached_tokens: int = 0,
              boxed: bool = False) -> dict[str, Any]:
    """BOXED (knob PDKIT_SIM_ANSWER_BOXED): the content ends with the answer the sim states (textgen.boxed_answer)."""
    return {
        "id": spec.rid, "object": "chat.completion", "created": spec.created, "model": spec.model,
        "choices": [{"index": 0,
                     "message": {"role": "assistant",
                                 "content": detokenize(output_ids) + (boxed_answer(output_ids) if boxed else ""),
                                 "reasoning_content": None, "tool_calls": None},
                     "logprobs": None, "finish_reason": finish, "matched_stop": _matched_stop(finish)}],
        "usage": usage(spec, len(output_ids), cached_tokens),
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class StreamEncoder:
    """Turns newly produced token ids into SSE events for one streaming request.

    The per-token OpenAI chunk is built from a pre-rendered prefix and suffix around the
    JSON-escaped token text: the decode loop streams thousands of these per second.
    """

    def __init__(self, spec: GenSpec) -> None:
        self.spec = spec
        self.sent_ids: list[int] = []
        # the request's cached prompt tokens, set by the server as the engine learns them
        self.cached_tokens = 0
        if spec.api == "completion":
            head = {"id": spec.rid, "object": "text_completion", "created": spec.created, "model": spec.model}
            self._prefix = ("data: " + json.dumps(head, separators=(",", ":"))[:-1]
                            + ',"choices":[{"index":0,"text":').encode()
            self._suffix = b',"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
        elif spec.api == "chat":
            head = {"id": spec.rid, "object": "chat.completion.chunk", "created": spec.created, "model": spec.model}
            self._prefix = ("data: " + json.dumps(head, separators=(",", ":"))[:-1]
                            + ',"choices":[{"index":0,"delta":{"content":').encode()
            self._suffix = b'},"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'

    def opening(self) -> bytes:
        if self.spec.api != "chat":
            return b""
        head = self._chunk_head()
        return sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None, "matched_stop": None}]})

    def _chunk_head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.spec.api == "chat" else "text_completion"
        return {"id": self.spec.rid, "object": obj, "created": self.spec.created, "model": self.spec.model}

    def tokens(self, new_ids: list[int], e2e_s: float = 0.0) -> bytes:
        if self.spec.api == "generate":
            # Native streaming repeats the whole text so far, as SGLang does by default.
            self.sent_ids.extend(new_ids)
            return sse(generate_body(self.spec, self.sent_ids, None, e2e_s, self.cached_tokens))
        self.sent_ids.extend(new_ids)
        prefix, suffix = self._prefix, self._suffix
        return b"".join(prefix + json.dumps(token_text(t)).encode() + suffix for t in new_ids)

    def closing(self, finish: str, e2e_s: float) -> bytes:
        spec = self.spec
        if spec.api == "generate":
            return sse(generate_body(spec, self.sent_ids, finish, e2e_s, self.cached_tokens)) + SSE_DONE
        head = self._chunk_head()
        empty = {"content": ""} if spec.api == "chat" else None
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish,
                                  "matched_stop": _matched_stop(finish)}
        if spec.api == "chat":
            choice["delta"] = empty
        else:
            choice["text"] = ""
        out = sse({**head, "choices": [choice]})
        if spec.include_usage:
            out += sse({**head, "choices": [], "usage": usage(spec, len(self.sent_ids), self.cached_tokens)})
        return out + SSE_DONE


def error_body(api: str, status: int, message: str) -> dict[str, Any]:
    """SGLang's error shapes: {"error": {"message"}} natively, OpenAI ErrorResponse otherwise."""
    if api == "generate":
        return {"error": {"message": message}}
    kind = {400: "BadRequestError", 404: "NotFoundError",
            503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def stream_error(api: str, status: int, message: str) -> bytes:
    """An abort with an HTTP status inside a 200 stream, as SGLang 0.5.17 / 0.5.23 write it
    (tests/fixtures/sse/: serving_chat.py's create_streaming_error_response, whose `type` is the
    HTTPStatus name; natively a normal event whose finish_reason is the abort), then [DONE]."""
    if api == "generate":
        reason = {"type": "abort", "message": message, "status_code": status, "err_type": None}
        return sse({"text": "", "output_ids": [], "meta_info": {"finish_reason": reason,
                                                                "completion_tokens": 0}}) + SSE_DONE
    body = {"object": "error", "message": message, "type": HTTPStatus(status).name, "param": None, "code": status}
    return sse({"error": body}) + SSE_DONE
