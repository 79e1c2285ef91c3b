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
from pdkit.sim.textgen import chat_prompt, detokenize, token_text, tokenize

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
    return {
        "text": detokenize(output_ids),
        "output_ids": list(output_ids),
        "meta_info": {
            "id": spec.rid, "finish_reason": reason, "prompt_tokens": len(spec.prompt_ids),
            "completion_tokens": len(output_ids), "cached_tokens": cached_tokens, "e2e_latency": round(e2e_s, 6),
        },
    }


def completion_body(spec: GenSpec, output_ids: list[int], finish: str, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "id": spec.rid, "object": "text_completion", "created": spec.created, "model": spec.model,
        "choices": [{"index": 0, "text": detokenize(output_ids), "logprobs": None,
                     "finish_reason": finish, "matched_stop": _matched_stop(finish)}],
        "usage": usage(spec, len(output_ids), cached_tokens),
    }


def chat_body(spec: GenSpec, output_ids: list[int], finish: str, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "id": spec.rid, "object": "chat.completion", "created": spec.created, "model": spec.model,
        "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": detokenize(output_ids),
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
