"""The HTTP API: the parts of SGLang's server that the stack touches.

/health, /health_generate, /ready, /server_info (+ /get_server_info), /model_info
(+ /get_model_info), /v1/models, /generate, /v1/completions, /v1/chat/completions (streaming and
not), /metrics (only with --enable-metrics, as in SGLang), /flush_cache, /weights_checker
(pdkit/sim/weights.py).

Everything but /metrics answers 503 until the start-up delay has passed. Streaming responses
send their headers at once, as SGLang's StreamingResponse does; a failure after that arrives
as an SSE `data: {"error": ...}` event, while a non-streaming failure gets SGLang's status code
and error body. The router relies on both: it waits for the head of both PD legs before it
forwards the decode's body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from pdkit.sim.args import SimArgs, decode_graph_sizes
from pdkit.sim.engine import Engine, EngineError, Outcome
from pdkit.sim.knobs import Knobs
from pdkit.sim.logs import access_line
from pdkit.sim.metrics import DEFAULT_SGLANG_VERSION
from pdkit.sim.protocol import (
    Defaults,
    GenSpec,
    RequestError,
    StreamEncoder,
    chat_body,
    completion_body,
    error_body,
    generate_body,
    parse_chat,
    parse_completion,
    parse_generate,
    stream_error,
)
from pdkit.sim.weights import WeightsChecker

HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's /health and /health_generate budget
SIM_VERSION = "sim"
# Paths that answer before the engine is ready / without the API key.
_ALWAYS_OPEN = ("/metrics",)
_NO_AUTH = ("/health", "/health_generate", "/ready", "/metrics")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SGLangAccessLogger(AbstractAccessLogger):
    """uvicorn-style access lines, honouring --uvicorn-access-log-exclude-prefixes."""

    exclude: tuple[str, ...] = ()

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        path = request.path_qs
        if self.exclude and path.startswith(self.exclude):
            return
        peer = request.transport.get_extra_info("peername") if request.transport else None
        peer_text = f"{peer[0]}:{peer[1]}" if peer else "-"
        version = f"{request.version.major}.{request.version.minor}"
        self.logger.info(access_line(peer_text, request.method, path, version, response.status))

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(20)


class SimServer:
    def __init__(self, args: SimArgs, knobs: Knobs, engine: Engine) -> None:
        self.args = args
        self.knobs = knobs
        self.engine = engine
        self.defaults = Defaults(args.served_model_name, args.context_length, args.random_seed,
                                 knobs.default_max_tokens, args.enable_cache_report)
        self.created = int(time.time())
        self.health_generation_enabled = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1") != "0"
        self.log = logging.getLogger("pdkit.sim")
        self.weights = WeightsChecker(args.model_path, max(1, args.tp_size), max(1, args.dp_size),
                                      max(1, args.pp_size), knobs.weights_salt,
                                      knobs.sglang_version or DEFAULT_SGLANG_VERSION)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._gate], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/ready", self.ready)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_get("/flush_cache", self.flush_cache)
        r.add_get("/weights_checker", self.weights_checker)
        r.add_post("/weights_checker", self.weights_checker)
        r.add_post("/generate", self._generation("generate", parse_generate))
        r.add_post("/v1/completions", self._generation("completion", parse_completion))
        r.add_post("/v1/chat/completions", self._generation("chat", parse_chat))
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if not self.engine.ready and path not in _ALWAYS_OPEN:
            return web.Response(status=503, text="Server is starting up")
        key = self.args.api_key
        if key and path not in _NO_AUTH and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # ---- health -------------------------------------------------------------------------------

    def _health_injected_failure(self) -> bool:
        path = self.knobs.health_fail_file
        return bool(path) and os.path.exists(path)

    async def _one_token(self) -> bool:
        spec = parse_generate({"input_ids": [0], "sampling_params": {"max_new_tokens": 1},
                               "rid": f"HEALTH_CHECK_{time.time_ns()}"}, self.defaults)
        outcome = Outcome()

        async def run() -> None:
            async with aclosing(self.engine.generate(spec, outcome, local=True)) as gen:
                async for _ in gen:
                    pass

        try:
            await asyncio.wait_for(run(), HEALTH_GENERATE_TIMEOUT_S)
        except (TimeoutError, EngineError):
            return False
        return True

    def _shutting_down(self) -> bool:
        if self.engine.draining:
            self.log.info("Health check request received during shutdown. Returning 503.")
        return self.engine.draining

    async def _probe(self) -> bool:
        """A one-token generation; a timeout marks the engine UnHealthy for good, as SGLang's
        http_server.health_generate does (a SIGTERM then exits without draining)."""
        ok = await self._one_token()
        if not ok:
            self.engine.unhealthy = True
        return ok

    async def health(self, request: web.Request) -> web.Response:
        if self._shutting_down() or self._health_injected_failure():
            return web.Response(status=503)
        if not self.health_generation_enabled:
            return web.Response(status=200)
        # Like SGLang: an engine that is visibly making progress needs no probe generation.
        sched = self.engine.scheduler
        if sched.running and not sched.stalled() and time.monotonic() - sched.last_progress < 1.0:
            return web.Response(status=200)
        return web.Response(status=200 if await self._probe() else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        if self._shutting_down() or self._health_injected_failure():
            return web.Response(status=503)
        return web.Response(status=200 if await self._probe() else 503)

    async def ready(self, request: web.Request) -> web.Response:
        # SGLang 0.5.23's /ready: 503 once a SIGTERM started the drain
        if self.engine.draining:
            return web.Response(status=503)
        return web.Response(status=200, text="ready")

    # ---- info ---------------------------------------------------------------------------------

    async def server_info(self, request: web.Request) -> web.Response:
        info = self.args.server_info()
        info.update(
            version=SIM_VERSION,
            max_total_num_tokens=self.args.max_total_tokens,
            max_req_input_len=self.args.context_length - 1,
            # per DP rank, as SGLang's Scheduler.get_internal_state (0.5.17 managers/scheduler.py; 0.5.23
            # managers/scheduler_components/internal_state.py): the effective max running requests, the
            # memory figures with the KV pool's token capacity, the decode CUDA-graph sizes captured (0.5.23)
            internal_states=[{"last_gen_throughput": self.engine.scheduler.last_gen_throughput,
                              "avg_spec_accept_length": None,
                              "effective_max_running_requests_per_dp": self.args.max_running_requests,
                              "memory_usage": {"token_capacity": self.args.max_total_tokens},
                              "decode_cuda_graph_bs": decode_graph_sizes(self.args.cuda_graphs)}
                             for _ in range(max(1, self.args.dp_size))],
            sim_knobs=self.knobs.__dict__,
        )
        return web.json_response(info, dumps=lambda o: json.dumps(o, default=str))

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.server.get("tokenizer_path") or self.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "sim",
            "architectures": ["SimForCausalLM"],
        })

    async def models(self, request: web.Request) -> web.Response:
        # owned_by "sglang" is how the router recognises an SGLang worker.
        return web.json_response({"object": "list", "data": [{
            "id": self.args.served_model_name, "object": "model", "created": self.created,
            "owned_by": "sglang", "root": self.args.model_path, "max_model_len": self.args.context_length,
        }]})

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.args.enable_metrics:
            raise web.HTTPNotFound()
        body = self.engine.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        # SGLang flushes only an idle engine (400 otherwise; the sim's message is its fallback text)
        if not self.engine.scheduler.flush_cache():
            return web.Response(status=400, text="Flush cache failed.\n")
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    async def weights_checker(self, request: web.Request) -> web.Response:
        # SGLang: GET or POST, an optional CheckWeightsReqInput body (absent: action "checksum"); 200 or 400
        raw = await request.read()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            return web.json_response({"detail": f"JSON decode error: {exc}"}, status=422)
        if not isinstance(body, dict) or not isinstance(body.get("action", ""), str):
            return web.json_response({"detail": "the body must be a CheckWeightsReqInput object"}, status=422)
        status, answer = self.weights.answer(body)
        return web.json_response(answer, status=status)

    # ---- generation ---------------------------------------------------------------------------

    def _generation(self, api: str, parse: Callable[[dict[str, Any], Defaults], GenSpec]) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                body = await request.json(loads=json.loads)
                if not isinstance(body, dict):
                    raise RequestError(400, "request body must be a JSON object")
                spec = parse(body, self.defaults)
            except (ValueError, RequestError) as exc:
                status = exc.status if isinstance(exc, RequestError) else 400
                return web.json_response(error_body(api, status, getattr(exc, "message", str(exc))), status=status)
            if self.args.log_requests:
                self.log.info(f"Receive: obj=GenerateReqInput(rid='{spec.rid}', input_len={len(spec.prompt_ids)}, "
                              f"max_new_tokens={spec.max_new_tokens}, stream={spec.stream}, "
                              f"bootstrap_room={spec.bootstrap.room if spec.bootstrap else None})")
            started = time.perf_counter()
            if spec.stream:
                response = await self._stream(request, api, spec)
            else:
                response = await self._complete(api, spec)
            if self.args.log_requests:
                self.log.info(f"Finish: obj=GenerateReqInput(rid='{spec.rid}'), status={response.status}, "
                              f"e2e_latency={time.perf_counter() - started:.3f}")
            return response

        return handle

    async def _complete(self, api: str, spec: GenSpec) -> web.Response:
        outcome = Outcome()
        output: list[int] = []
        try:
            async with aclosing(self.engine.generate(spec, outcome)) as gen:
                async for new in gen:
                    output.extend(new)
        except EngineError as exc:
            return web.json_response(error_body(api, exc.status, exc.message), status=exc.status)
        if api == "generate":
            body = generate_body(spec, output, outcome.finish, time.perf_counter() - outcome.started,
                                 outcome.cached_tokens)
        elif api == "completion":
            body = completion_body(spec, output, outcome.finish, outcome.cached_tokens)
        else:
            body = chat_body(spec, output, outcome.finish, outcome.cached_tokens, self.knobs.answer_boxed)
        return web.json_response(body)

    async def _stream(self, request: web.Request, api: str, spec: GenSpec) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        encoder = StreamEncoder(spec)
        outcome = Outcome()
        first = True
        try:
            try:
                async with aclosing(self.engine.generate(spec, outcome)) as gen:
                    async for new in gen:
                        encoder.cached_tokens = outcome.cached_tokens
                        chunk = encoder.tokens(new, time.perf_counter() - outcome.started)
                        if first:
                            chunk = encoder.opening() + chunk
                            first = False
                        await resp.write(chunk)
                encoder.cached_tokens = outcome.cached_tokens
                await resp.write(encoder.closing(outcome.finish, time.perf_counter() - outcome.started))
            except EngineError as exc:
                await resp.write(stream_error(api, exc.status, exc.message))
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client left; closing the generator above already aborted the request
        return resp
