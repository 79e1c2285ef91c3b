"""One request's path through the engine, per role, on top of the scheduler.

unified  -> scheduler (prefill, then decode steps)
prefill  -> bootstrap queue (from registration until the decode hands over its KV slots, at most
            SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT) -> scheduler (prefill only, first token) ->
            inflight queue (KV transfer time) -> room reported done to the decode
decode   -> prealloc queue (reach the prefill's bootstrap server, then wait for room in the KV
            pool and pre-allocate) -> transfer queue (slots sent; wait for the room's KV, at most
            SGLANG_DISAGGREGATION_WAITING_TIMEOUT) -> scheduler (first token at once, then decode steps)

Failures end the request with SGLang's wording and move SGLang's counters: a prefill whose decode
never sent the slots in time, or a decode that never reaches its prefill or loses it before
admission, counts num_bootstrap_failed_reqs_total; a room that times out, is reported failed, or
whose prefill dies after admission counts num_transfer_failed_reqs_total. docs/sim.md, "Queueing".
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass

import aiohttp

from pdkit.sim.args import SimArgs
from pdkit.sim.bootstrap import (
    PREFILL_MIGHT_BE_DEAD,
    BootstrapFailed,
    KVTransferError,
    Room,
    RoomTable,
    wait_for_kv,
)
from pdkit.sim.knobs import Knobs
from pdkit.sim.metrics import DEFAULT_SGLANG_VERSION, PD_QUEUE_GAUGES, SimMetrics
from pdkit.sim.protocol import GenSpec
from pdkit.sim.scheduler import QueueFull, Scheduler, SimRequest
from pdkit.sim.stepmodel import kv_tokens_to_send, kv_transfer_bytes, kv_transfer_seconds, sglang_kv_units
from pdkit.sim.textgen import Trace
from pdkit.upstream.sglang_pd import NO_PREFILL_BOOTSTRAP_TIMEOUT


class EngineError(Exception):
    """A request that failed inside the engine; status and message go back to the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Outcome:
    """Filled in as a generation runs; read by the HTTP layer when building the last chunk."""

    finish: str = ""
    started: float = 0.0
    # prompt tokens served from a prefix cache (meta_info cached_tokens, usage.prompt_tokens_details)
    cached_tokens: int = 0


class Engine:
    def __init__(self, args: SimArgs, knobs: Knobs, metrics: SimMetrics, log: logging.LoggerAdapter) -> None:
        self.args = args
        self.knobs = knobs
        self.metrics = metrics
        self.log = log
        self.mode = args.mode
        self.ready = False
        # SGLang's tokenizer_manager: rid_to_state (requests from receipt to finish, health
        # probes included there but not here), gracefully_exit (SIGTERM seen) and the UnHealthy
        # status a timed-out /health_generate sets, which makes a SIGTERM exit without draining
        self.in_flight = 0
        self.draining = False
        self.unhealthy = False
        self.scheduler = Scheduler(args, knobs, metrics, log, pd_queues=self.pd_queue_sizes)
        # a room lives at most the prefill's wait for the slots plus the decode's wait for the KV
        self.rooms = RoomTable(knobs.bootstrap_timeout_s + knobs.waiting_timeout_s)
        self.session: aiohttp.ClientSession | None = None
        self._fail_rng = random.Random(args.random_seed)
        # PD queue lengths (SGLang's bootstrap/inflight on prefill, prealloc/transfer on decode).
        self.prefill_bootstrap_q = 0
        self.prefill_inflight_q = 0
        self.decode_prealloc_q = 0
        self.decode_transfer_q = 0
        self._tasks: list[asyncio.Task] = []

    def pd_queue_sizes(self) -> tuple[int, int]:
        if self.mode == "prefill":
            return self.prefill_bootstrap_q, self.prefill_inflight_q
        return self.decode_prealloc_q, self.decode_transfer_q

    def _pd_gauges(self) -> None:
        m = self.metrics
        m.set(PD_QUEUE_GAUGES["prefill_bootstrap"], self.prefill_bootstrap_q)
        m.set(PD_QUEUE_GAUGES["prefill_inflight"], self.prefill_inflight_q)
        m.set(PD_QUEUE_GAUGES["decode_prealloc"], self.decode_prealloc_q)
        m.set(PD_QUEUE_GAUGES["decode_transfer"], self.decode_transfer_q)

    async def start(self, on_fatal: Callable[[], None] = lambda: None) -> None:
        """Start the scheduler loop (and the room sweeper on a prefill).

        If one of them dies, the engine can make no progress any more: log why and call
        `on_fatal`, which ends the process like a crashed SGLang scheduler would.
        """
        self._tasks.append(asyncio.create_task(self.scheduler.run(), name="scheduler"))
        if self.mode == "decode":
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))
        if self.mode == "prefill":
            self._tasks.append(asyncio.create_task(self._sweep_rooms(), name="room-sweeper"))

        def check(task: asyncio.Task) -> None:
            if task.cancelled():
                return
            self.log.error(f"{task.get_name()} stopped: {task.exception()!r}", exc_info=task.exception())
            on_fatal()

        for task in self._tasks:
            task.add_done_callback(check)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    async def _sweep_rooms(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.rooms.sweep()

    # ---- generation ---------------------------------------------------------------------------

    async def generate(self, spec: GenSpec, outcome: Outcome, local: bool = False) -> AsyncGenerator[list[int], None]:
        """`_generate`, counted in `in_flight` from receipt to finish (what a SIGTERM drain waits for)."""
        if not local:
            self.in_flight += 1
        try:
            async with aclosing(self._generate(spec, outcome, local)) as gen:
                async for ids in gen:
                    yield ids
        finally:
            if not local:
                self.in_flight -= 1

    async def _generate(self, spec: GenSpec, outcome: Outcome, local: bool = False) -> AsyncGenerator[list[int], None]:
        """Yield the new output token ids as they are produced; raise EngineError on failure.

        `local` skips the PD handshake (SGLang does the same for its own health checks, with a
        fake bootstrap host). Closing the generator early (client gone) aborts the request.
        """
        outcome.started = time.perf_counter()
        pd = self.mode != "null" and not local
        if pd and spec.bootstrap is None:
            raise EngineError(400, (
                f"This server runs with --disaggregation-mode {self.mode}: a request needs bootstrap_host, "
                "bootstrap_port and bootstrap_room, which the PD router adds. Send requests through the router."))
        max_new = 1 if self.mode == "prefill" else spec.max_new_tokens
        req = SimRequest(spec.rid, spec.prompt_ids, max_new, spec.seed, spec.limit_finish, arrival=outcome.started)
        req.streaming = spec.stream
        if local:
            req.counted = False
        lp = spec.logprobs
        if lp is not None:
            # trace every output token's state; no prefix-cache hit past logprob_start_len (SGLang's
            # Req._compute_max_prefix_len); a PD decode reports no input logprobs (SGLang's output
            # streamer: "Decode server does not send input logprobs")
            lp.trace = req.tokens.trace = Trace()
            lp.decode = pd and self.mode == "decode"
            req.lp = lp
            req.max_prefix = min(req.max_prefix, lp.start)
        room: Room | None = None
        handed_over = False  # to the scheduler (a request that failed its PD hand-off never was)
        try:
            if pd and self.mode == "prefill":
                room = await self._await_decode_handshake(spec)
            if pd and self.mode == "decode":
                await self._await_kv(spec, req)
            pd_ready = time.perf_counter()
            handed_over = True
            try:
                self.scheduler.submit(req)
            except QueueFull as exc:
                raise EngineError(503, str(exc)) from None
            sent = 0
            # --stream-interval: hand tokens on in groups of this size (the last group may be short).
            interval = max(1, self.args.stream_interval)
            while True:
                req.event.clear()
                produced = len(req.output_ids)
                if produced > sent and (produced - sent >= interval or req.done):
                    new = req.output_ids[sent:produced]
                    sent = produced
                    if room is None:  # a PD prefill answers only once its KV has been sent
                        outcome.cached_tokens = req.cached_tokens
                        yield new
                elif req.done:
                    break
                else:
                    await req.event.wait()
            outcome.finish = req.finish_type
            outcome.cached_tokens = req.cached_tokens
            if room is not None:
                prefilled = time.perf_counter()
                await self._transfer(spec, room, req)
                # a room comes only from a handshake, which needs spec.bootstrap
                if spec.bootstrap is not None and self.log.isEnabledFor(logging.DEBUG):
                    self.log.debug(f"PD prefill rid={spec.rid} room={spec.bootstrap.room}: bootstrap "
                                   f"{(pd_ready - outcome.started) * 1e3:.1f}ms, queue+prefill "
                                   f"{(prefilled - pd_ready) * 1e3:.1f}ms, transfer "
                                   f"{(time.perf_counter() - prefilled) * 1e3:.1f}ms")
                yield req.output_ids[:]
        finally:
            if handed_over and not req.done:
                self.scheduler.abort(req)
            self.scheduler.forget(req)  # a PD decode's: out of its prealloc queue, pre-allocated KV freed
            self.scheduler.release(req)  # its cached prefix becomes evictable

    async def _await_decode_handshake(self, spec: GenSpec) -> Room:
        """Hold a PD prefill's request from its registration until its decode hands over the KV slots,
        i.e. has admitted it (SGLang's bootstrap queue: the sender's bootstrap clock starts when it is
        created, 0.5.23 common/conn.py:2182, and a request still Bootstrapping after
        SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT fails, 2385-2409). A decode whose KV pool stays full
        that long fails it with nothing dead. The decode is not told (SGLang's prefill knows no decode
        endpoint for a room before its slots): one that admits the request later waits for the KV until
        its waiting timeout. 0.5.17's NIXL sender never checks this timeout (nixl/conn.py
        NixlKVSender.poll; pdkit.upstream.sglang_pd.NO_PREFILL_BOOTSTRAP_TIMEOUT): there the request waits
        until the decode sends its slots or the client goes away, as the real one does."""
        assert spec.bootstrap is not None
        room_id = spec.bootstrap.room
        room = self.rooms.get(room_id)
        self.prefill_bootstrap_q += 1
        self._pd_gauges()
        started = time.monotonic()
        enforced = ((self.knobs.sglang_version or DEFAULT_SGLANG_VERSION),
                    self.args.server["disaggregation_transfer_backend"]) not in NO_PREFILL_BOOTSTRAP_TIMEOUT
        try:
            await asyncio.wait_for(room.decode_ready.wait(), self.knobs.bootstrap_timeout_s if enforced else None)
        except TimeoutError:
            waited = time.monotonic() - started
            message = (f"Prefill bootstrap failed for request rank=0 req.rid='{spec.rid}' "
                       f"req.bootstrap_room={room_id} with exception KVTransferError(bootstrap_room={room_id}): "
                       f"Request {room_id} timed out after {waited:.1f}s in KVPoll.Bootstrapping")
            self.log.error(message)
            self.metrics.inc("sglang:num_bootstrap_failed_reqs_total")
            raise EngineError(500, message) from None
        finally:
            self.prefill_bootstrap_q -= 1
            self._pd_gauges()
        # both sides observe their bootstrap and KV allocation times (the real pages have them on both)
        self.metrics.observe("sglang:kv_transfer_bootstrap_ms", (time.monotonic() - started) * 1000.0)
        self.metrics.observe("sglang:kv_transfer_alloc_ms", 0.0)
        return room

    async def _transfer(self, spec: GenSpec, room: Room, req: SimRequest) -> None:
        """Hold the prompt's KV while it is 'sent', then tell the waiting decode how it went.

        What is sent is the prompt past the prefix the decode said it holds (`decode_prefix_len`, 0
        unless the decode runs --disaggregation-decode-enable-radix-cache), in whole pages: SGLang
        0.5.23 disaggregation/prefill.py (start_send_idx = decode_prefix_len). The prefill computed
        the whole uncached prompt all the same: the decode's cache saves the transfer, not the prefill."""
        prompt = len(spec.prompt_ids)
        tokens = kv_tokens_to_send(prompt, room.decode_prefix_len, self.args.page_size)
        nbytes = kv_transfer_bytes(self.knobs, tokens)
        seconds = kv_transfer_seconds(self.knobs, tokens)
        # the KV is held until sent: the cached part stays locked in the tree (released by the caller)
        private = req.kv_tokens - req.tree_tokens
        self.prefill_inflight_q += 1
        self.scheduler.held_kv_tokens += private
        self._pd_gauges()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.prefill_inflight_q -= 1
            self.scheduler.release_kv(private)
            self._pd_gauges()
        room_id = spec.bootstrap.room if spec.bootstrap else 0
        if self.knobs.transfer_fail_rate and self._fail_rng.random() < self.knobs.transfer_fail_rate:
            message = (f"Prefill transfer failed for request rank=0 req.rid='{spec.rid}' req.bootstrap_room={room_id} "
                       f"with exception KVTransferError(bootstrap_room={room_id}): KV transfer to the decode "
                       "failed (injected by PDKIT_SIM_TRANSFER_FAIL_RATE)")
            self.log.error(message)
            room.end({"status": "failed", "error": PREFILL_MIGHT_BE_DEAD})
            self.metrics.inc("sglang:num_transfer_failed_reqs_total")
            raise EngineError(500, message)
        self._record_transfer(nbytes, seconds)
        # the prefill's own radix hit travels with the KV (SGLang's metadata buffer, cached_tokens[0]), and
        # so do its first token and, with logprobs, that token's logprob and top logprobs (output_ids,
        # output_token_logprobs, output_top_logprobs: 0.5.23 disaggregation/utils.py set_buf)
        first = spec.logprobs.first_report(prompt, req.output_ids) if spec.logprobs is not None else None
        room.end({"status": "transferred", "kv_bytes": nbytes, "kv_tokens": tokens, "transfer_s": seconds,
                  "cached_tokens": req.cached_tokens, "decode_prefix_len": room.decode_prefix_len,
                  "first_token": req.output_ids[0] if req.output_ids else None, "first_logprobs": first})

    def _record_transfer(self, nbytes: int, seconds: float) -> None:
        """The prefill side observes each finished KV send (as SGLang's prefill does: the real
        pages have kv_transfer_{speed,latency,total} on the prefill only), in SGLang's units
        (sglang/srt/observability/req_time_stats.py compute_and_observe_kv_transfer_metrics):
        total "MB" is MiB (bytes / 2**20), speed "GB/s" is (MiB / 1024) / seconds, and a transfer
        of no measurable latency is not observed at all."""
        if seconds <= 0:
            return
        total_mb, speed_gb_s = sglang_kv_units(nbytes, seconds)
        m = self.metrics
        m.observe("sglang:kv_transfer_total_mb", total_mb)
        m.observe("sglang:kv_transfer_latency_ms", seconds * 1000.0)
        m.observe("sglang:kv_transfer_speed_gb_s", speed_gb_s)

    async def _await_kv(self, spec: GenSpec, req: SimRequest) -> None:
        """Handshake with the prefill, wait in the prealloc queue until the KV pool has room for the
        request (Scheduler.preallocate; SGLang's rule: stepmodel.decode_admits), hand the prefill the
        slots and wait for the room's KV. With a decode radix cache the prompt is matched against it
        when the KV is pre-allocated, and the hit (locked) is the `decode_prefix_len` the prefill skips.
        The request then reports as cached the prefill's hit plus whatever more the decode held
        (0.5.23 disaggregation/decode.py `_commit_transfer_to_req` and decode_schedule_batch_mixin.py:
        cached_tokens += max(0, prefix_len - already_computed)). A prompt longer than the whole pool is
        refused at once (400), as SGLang's decode refuses it."""
        assert spec.bootstrap is not None and self.session is not None
        too_long = self.scheduler.exceeds_pool(req)
        if too_long is not None:
            self.log.error(too_long)
            raise EngineError(400, too_long)
        room_id = spec.bootstrap.room
        admitted = False
        decode_prefix = 0
        started = handshake_at = admitted_at = time.perf_counter()

        def on_handshake() -> None:
            nonlocal handshake_at
            handshake_at = time.perf_counter()

        async def admit() -> int:
            nonlocal admitted, admitted_at, decode_prefix
            decode_prefix = await self.scheduler.preallocate(req)
            admitted, admitted_at = True, time.perf_counter()
            self.decode_prealloc_q -= 1
            self.decode_transfer_q += 1
            self._pd_gauges()
            # SGLang's decode observes its bootstrap (handshake) and KV allocation waits as it moves the
            # request to its transfer queue (0.5.23 req_time_stats.py set_decode_transfer_queue_entry_time)
            self.metrics.observe("sglang:kv_transfer_bootstrap_ms", (handshake_at - started) * 1000.0)
            self.metrics.observe("sglang:kv_transfer_alloc_ms", (admitted_at - handshake_at) * 1000.0)
            return decode_prefix

        self.decode_prealloc_q += 1
        self._pd_gauges()
        try:
            report = await wait_for_kv(self.session, spec.bootstrap, self.knobs, on_handshake, admit)
        except KVTransferError as exc:  # a BootstrapFailed is the handshake's
            what, counter = (("handshake", "sglang:num_bootstrap_failed_reqs_total") if isinstance(exc, BootstrapFailed)
                             else ("transfer", "sglang:num_transfer_failed_reqs_total"))
            message = (f"Decode {what} failed for request rank=0 decode_req.req.rid='{spec.rid}' "
                       f"decode_req.req.bootstrap_room={room_id} with exception {exc}")
            self.log.error(message)
            self.metrics.inc(counter)
            raise EngineError(500, message) from None
        finally:
            if admitted:
                self.decode_transfer_q -= 1
            else:
                self.decode_prealloc_q -= 1
            self._pd_gauges()
        prefill_cached = int(report.get("cached_tokens") or 0)
        # the decode emits the prefill's first token, as it came (0.5.23 disaggregation/decode.py
        # _commit_transfer_to_req: output_ids, output_token_logprobs, output_top_logprobs from the buffer)
        if isinstance(report.get("first_token"), int):
            req.first_token = report["first_token"]
            req.first_report = report.get("first_logprobs")
        req.cached_tokens = prefill_cached + max(0, decode_prefix - prefill_cached)
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug(f"PD decode rid={spec.rid} room={room_id}: handshake "
                           f"{(handshake_at - started) * 1e3:.1f}ms, admission "
                           f"{(admitted_at - handshake_at) * 1e3:.1f}ms, "
                           f"KV wait {(time.perf_counter() - admitted_at) * 1e3:.1f}ms")
