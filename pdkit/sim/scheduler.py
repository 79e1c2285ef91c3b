"""The batching loop: one asyncio task that plays SGLang's scheduler.

Requests wait in a FCFS queue; each iteration either runs a prefill batch (admitting what fits:
max running requests, prefill token budget, KV pool) or one decode step over every running
request, sleeping for the modelled step time. The role decides what a request goes through:

- unified: prefill (first token) then decode steps;
- prefill (PD): prefill only; the request ends with its first token and the engine then ships
  its KV to the decode;
- decode (PD): no prefill compute; a request whose KV has arrived joins the running batch and
  emits the prefill's first token at once, then one token per decode step.

Handlers never block the loop: they await a per-request event that the loop sets when new
tokens are appended, and write whatever accumulated since they last looked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable

from pdkit.sim.args import SimArgs
from pdkit.sim.knobs import Knobs, argv_matches
from pdkit.sim.logs import format_decode_batch, format_prefill_batch
from pdkit.sim.metrics import SimMetrics
from pdkit.sim.stepmodel import (
    Limits,
    admit_count,
    decode_step_seconds,
    decode_uses_cuda_graph,
    prefill_passes,
    prefill_step_seconds,
    prefill_uses_cuda_graph,
)
from pdkit.sim.textgen import VOCAB, TokenStream

VOCAB_SIZE = len(VOCAB)


# eager gauges the scheduler loop keeps up to date (every other eager one stays at its idle 0)
_SCHEDULER_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
                     "sglang:kv_used_tokens", "sglang:kv_available_tokens", "sglang:token_usage",
                     "sglang:full_token_usage", "sglang:utilization")


class _NoSeries:
    def set(self, value: float) -> None:
        pass


class QueueFull(Exception):
    """--max-queued-requests reached."""


class SimRequest:
    """One generation inside the engine."""

    __slots__ = (
        "rid", "prompt_tokens", "max_new_tokens", "limit_finish", "tokens", "output_ids", "event",
        "done", "aborted", "finish_type", "arrival", "queued_at", "first_token_at", "last_token_at",
        "counted", "streaming",
    )

    def __init__(self, rid: str, prompt_ids: list[int], max_new_tokens: int, seed: int,
                 limit_finish: str = "length", arrival: float | None = None) -> None:
        self.rid = rid
        self.prompt_tokens = len(prompt_ids)
        self.max_new_tokens = max_new_tokens
        # "length" when the client's limit ended it, "stop" when the sim's default did (as EOS).
        self.limit_finish = limit_finish
        self.tokens = TokenStream(prompt_ids, seed)
        self.output_ids: list[int] = []
        self.event = asyncio.Event()
        self.done = False
        self.aborted = False
        self.finish_type = ""
        now = time.perf_counter()
        # When the HTTP request arrived (TTFT and e2e count from here, PD waits included).
        self.arrival = now if arrival is None else arrival
        self.queued_at = now
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        # Health-check generations run through the loop but stay out of the request metrics.
        self.counted = True
        # SGLang's is_streaming label on the request series
        self.streaming = False

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + len(self.output_ids)


class Scheduler:
    def __init__(self, args: SimArgs, knobs: Knobs, metrics: SimMetrics, log: logging.LoggerAdapter,
                 pd_queues: Callable[[], tuple[int, int]] | None = None) -> None:
        self.args = args
        self.knobs = knobs
        self.metrics = metrics
        self.log = log
        self.mode = args.mode
        self.plan = args.cuda_graphs
        self.limits = Limits(args.max_running_requests, args.max_prefill_tokens, args.max_total_tokens)
        # PD queue sizes for the log line: (prealloc/bootstrap, inflight/transfer).
        self.pd_queues = pd_queues
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        # KV held outside the running batch (prefill engine: prompts whose KV is being sent).
        self.held_kv_tokens = 0
        self._wake = asyncio.Event()
        self.last_progress = time.monotonic()
        self._decode_passes = 0
        self._tokens_since_log = 0
        self._last_decode_log = time.perf_counter()
        self._last_prefill_log = time.perf_counter()
        self.last_gen_throughput = 0.0
        # --num-continuous-decode-steps: decode steps run back to back per scheduling iteration
        self.continuous_steps = max(1, int(args.server.get("num_continuous_decode_steps") or 1))
        # lever faults (knobs PDKIT_SIM_CORRUPT_WHEN / PDKIT_SIM_WEDGE_WHEN), decided from the argv
        self.corrupt = argv_matches(knobs.corrupt_when, args.argv)
        self.wedge_armed = argv_matches(knobs.wedge_when, args.argv)
        self.wedged_at: float | None = None
        # the eager scheduler gauges this loop computes, as children (a stand-in for any the release lacks)
        self._gauges = {n: metrics.child(n) or _NoSeries() for n in _SCHEDULER_GAUGES}
        # set once at startup by a real engine too (lazy in the catalogue: not an idle stats log)
        self.metrics.set("sglang:max_total_num_tokens", args.max_total_tokens)

    # ---- called by the engine -------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        limit = self.args.max_queued_requests
        if limit is not None and len(self.waiting) >= limit:
            raise QueueFull("The request queue is full.")
        req.queued_at = time.perf_counter()
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        """The client went away: drop the request wherever it is."""
        if req.done:
            return
        req.aborted = True
        req.done = True
        try:
            self.waiting.remove(req)
        except ValueError:
            pass  # running: the next step filters it out
        if req.counted:
            self.metrics.inc("sglang:num_aborted_requests_total")
        self._wake.set()

    def release_kv(self, tokens: int) -> None:
        self.held_kv_tokens -= tokens
        self._wake.set()

    def stalled(self) -> bool:
        path = self.knobs.stall_file
        if path and os.path.exists(path):
            return True
        # the wedge lever: once this many requests decode together (a PD/TP desync under load) the
        # scheduler stops stepping, until the process restarts or, with a hold, for that long
        if not self.wedge_armed:
            return False
        now = time.monotonic()
        if self.wedged_at is None:
            running = sum(not r.aborted for r in self.running)
            if self.knobs.wedge_min_held:
                # every request the engine holds: queued here, in the PD hand-off, or running
                held = running + len(self.waiting) + (sum(self.pd_queues()) if self.pd_queues else 0)
                # and one of them running: what a wedge is (doctor's and the soak's condition), not a queue
                if held < self.knobs.wedge_min_held or running == 0:
                    return False
                what = f"{held} requests held, {running} running"
            else:
                if running < self.knobs.wedge_min_batch:
                    return False
                what = f"{running} running requests"
            self.wedged_at = now
            self.log.warning(f"pdkit.sim: wedged (lever fault PDKIT_SIM_WEDGE_WHEN, {what})")
            # the gauges show what it holds from now on (a batch admitted this iteration included):
            # the wedge condition is running requests and no progress
            self._update_gauges()
        if self.knobs.wedge_hold_s and now - self.wedged_at >= self.knobs.wedge_hold_s:
            self.wedge_armed = False  # let go for good: the requests it held finish
            self.log.warning(f"pdkit.sim: the wedge let go after {self.knobs.wedge_hold_s:g} s "
                             "(PDKIT_SIM_WEDGE_HOLD_S)")
            return False
        return True

    @property
    def used_tokens(self) -> int:
        return self.held_kv_tokens + sum(r.kv_tokens for r in self.running)

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if self.stalled():
                # A wedged engine: accepts requests, makes no progress (the watchdog may fire).
                await asyncio.sleep(0.05)
                continue
            if not self.waiting and not self.running:
                self.last_progress = time.monotonic()
                self._update_gauges()
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            if admitted:
                if self.mode == "decode":
                    self._join_running(admitted, time.perf_counter())
                else:
                    await self._prefill(admitted)
                    self.last_progress = time.monotonic()
                    continue  # like SGLang, a new prefill batch goes before the next decode step
            if self.running and self.mode != "prefill":
                # one scheduling overhead, then up to --num-continuous-decode-steps steps with no
                # admission in between (SGLang's trade: cheaper per token, later joins)
                await asyncio.sleep(self.knobs.schedule_ms / 1000.0)
                for _ in range(self.continuous_steps):
                    if not self.running or self.stalled():
                        break
                    await self._decode_step()
                self.last_progress = time.monotonic()
            elif not admitted:
                # Queued work that does not fit and nothing running here: wait for room.
                self.last_progress = time.monotonic()
                self._update_gauges()
                self._wake.clear()
                await self._wake.wait()

    def _admit(self) -> list[SimRequest]:
        if not self.waiting:
            return []
        heads = [(r.prompt_tokens, r.max_new_tokens) for r in self.waiting]
        n = admit_count(heads, len(self.running), self.used_tokens, self.limits,
                        prefill_budget=self.mode != "decode")
        admitted = [self.waiting.popleft() for _ in range(n)]
        now = time.perf_counter()
        for req in admitted:
            self.metrics.observe("sglang:queue_time_seconds", now - req.queued_at)
        return admitted

    async def _prefill(self, batch: list[SimRequest]) -> None:
        new_tokens = sum(r.prompt_tokens for r in batch)
        graph = prefill_uses_cuda_graph(self.plan, new_tokens)
        passes = prefill_passes(new_tokens, self.args.chunked_prefill_size)
        self.metrics.count_pass("prefill_cuda_graph" if graph else "prefill_none", passes)
        self.metrics.count_tokens("prefill_compute", new_tokens)
        self._log_prefill(batch, new_tokens, graph)
        await asyncio.sleep(prefill_step_seconds(self.knobs, new_tokens))
        now = time.perf_counter()
        batch = [r for r in batch if not r.aborted]
        if self.mode == "prefill":
            for req in batch:
                self._emit(req, now)
                self._finish(req, now, "length")
        else:
            self._join_running(batch, now)
        self._update_gauges()

    def _join_running(self, batch: list[SimRequest], now: float) -> None:
        """First token for each request (computed by prefill, here or on the PD prefill engine)."""
        for req in batch:
            if req.aborted:
                continue
            self._emit(req, now)
            if len(req.output_ids) >= req.max_new_tokens:
                self._finish(req, now, req.limit_finish)
            else:
                self.running.append(req)

    async def _decode_step(self) -> None:
        batch = len(self.running)
        graph = decode_uses_cuda_graph(self.plan, batch)
        await asyncio.sleep(decode_step_seconds(self.knobs, batch, graph, self.args.context_length))
        now = time.perf_counter()
        self.metrics.count_pass("decode_cuda_graph" if graph else "decode_none")
        self.metrics.count_tokens("decode", batch)
        self.metrics.set("sglang:is_cuda_graph", 1 if graph else 0)
        itl = None  # lazy: created by the first counted token, then kept for the step
        still_running = []
        produced = 0
        for req in self.running:
            if req.aborted:
                continue
            if req.counted:
                if itl is None:
                    itl = self.metrics.child("sglang:inter_token_latency_seconds")
                itl.observe(now - req.last_token_at)
            token = req.tokens.next_id()
            if self.corrupt:
                # the corrupting lever: every decoded token is off by one in the vocabulary (the
                # prefill's first token stays right, as a broken decode kernel would leave it)
                token = (token + 1) % VOCAB_SIZE
            req.output_ids.append(token)
            req.last_token_at = now
            produced += 1
            if len(req.output_ids) >= req.max_new_tokens:
                self._finish(req, now, req.limit_finish)
            else:
                still_running.append(req)
                req.event.set()
        self.running = still_running
        self._decode_passes += 1
        self._tokens_since_log += produced
        if self._decode_passes % self.args.decode_log_interval == 0:
            self._log_decode(batch, graph)
        self._update_gauges()

    def _emit(self, req: SimRequest, now: float) -> None:
        req.output_ids.append(req.tokens.next_id())
        req.first_token_at = now
        req.last_token_at = now
        # a PD prefill's first token is not the client's: SGLang's prefill records no TTFT (real pages)
        if req.counted and self.mode != "prefill":
            self.metrics.observe("sglang:time_to_first_token_seconds", now - req.arrival,
                                 is_streaming="true" if req.streaming else "false")
        req.event.set()

    def _finish(self, req: SimRequest, now: float, finish_type: str) -> None:
        req.finish_type = finish_type
        req.done = True
        req.event.set()
        if not req.counted:
            return
        self.metrics.request_finished(req.streaming, req.prompt_tokens, len(req.output_ids), now - req.arrival)

    # ---- reporting --------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        g = self._gauges
        used = self.used_tokens
        total = self.args.max_total_tokens
        g["sglang:num_running_reqs"].set(len(self.running))
        g["sglang:num_queue_reqs"].set(len(self.waiting))
        g["sglang:num_used_tokens"].set(used)
        g["sglang:kv_used_tokens"].set(used)
        g["sglang:kv_available_tokens"].set(total - used)
        g["sglang:token_usage"].set(used / total)
        g["sglang:full_token_usage"].set(used / total)
        g["sglang:utilization"].set(min(1.0, len(self.running) / self.args.max_running_requests))

    def _log_prefill(self, batch: list[SimRequest], new_tokens: int, graph: bool) -> None:
        now = time.perf_counter()
        gap = max(now - self._last_prefill_log, 1e-6)
        self._last_prefill_log = now
        pd = self.pd_queues() if (self.pd_queues and self.mode == "prefill") else None
        self.log.info(format_prefill_batch(
            len(batch), new_tokens, self.used_tokens / self.args.max_total_tokens, len(self.running),
            len(self.waiting), graph, new_tokens / gap, pd))

    def _log_decode(self, batch: int, graph: bool) -> None:
        now = time.perf_counter()
        gap = max(now - self._last_decode_log, 1e-6)
        self.last_gen_throughput = self._tokens_since_log / gap
        self.metrics.set("sglang:gen_throughput", self.last_gen_throughput)
        self._tokens_since_log = 0
        self._last_decode_log = now
        pd = self.pd_queues() if (self.pd_queues and self.mode == "decode") else None
        used = self.used_tokens
        self.log.info(format_decode_batch(
            batch, used, used / self.args.max_total_tokens, graph, self.last_gen_throughput,
            len(self.waiting), pd))
