"""The batching loop: one asyncio task that plays SGLang's scheduler.

Requests wait in a FCFS queue; each iteration either runs a prefill batch (admitting what fits:
max running requests, prefill token budget, KV pool) or one decode step over every running
request, sleeping for the modelled step time. The role decides what a request goes through:

- unified: prefill (first token) then decode steps;
- prefill (PD): prefill only; the request ends with its first token and the engine then ships
  its KV to the decode;
- decode (PD): no prefill compute. A request first waits in the prealloc queue until the KV pool
  has room for it by SGLang's admission rule (stepmodel.decode_admits: its prompt plus
  --num-reserved-decode-tokens, beside the reserve of every request held), FCFS; its KV is then
  pre-allocated (held until it finishes) and the engine hands the prefill its slots. Once its KV
  has arrived it joins the running batch and emits the prefill's first token at once, then one
  token per decode step.

Every engine has a prefix cache (pdkit/sim/prefixcache.py, SGLang's radix cache; off with
--disable-radix-cache, and on a PD decode only with --disaggregation-decode-enable-radix-cache):
a request admitted for prefill is matched against it (at most prompt - 1 tokens, whole pages),
only its uncached tokens are computed, and its prompt is stored once prefilled (on a PD decode:
once its KV has arrived). Cached tokens share the KV pool with running requests: the ones no
running request uses are evictable, and are evicted (LRU) when the pool runs short.

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
from typing import Any

from pdkit.sim.args import SimArgs
from pdkit.sim.knobs import Knobs, argv_matches
from pdkit.sim.logs import format_decode_batch, format_prefill_batch
from pdkit.sim.metrics import SimMetrics
from pdkit.sim.prefixcache import Node, PrefixCache
from pdkit.sim.stepmodel import (
    DEFAULT_NUM_RESERVED_DECODE_TOKENS,
    Decoding,
    Limits,
    decode_admits,
    decode_step_seconds,
    decode_uses_cuda_graph,
    fits,
    prefill_passes,
    prefill_step_seconds,
    prefill_uses_cuda_graph,
)
from pdkit.sim.textgen import VOCAB, Drift, TokenStream

VOCAB_SIZE = len(VOCAB)


# eager gauges the scheduler loop keeps up to date (every other eager one stays at its idle 0)
_SCHEDULER_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
                     "sglang:kv_used_tokens", "sglang:kv_available_tokens", "sglang:token_usage",
                     "sglang:full_token_usage", "sglang:utilization", "sglang:kv_evictable_tokens")


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
        "counted", "streaming", "prompt_ids", "cached_tokens", "node", "tree_tokens", "released",
        "lp", "max_prefix", "first_token", "first_report", "admitted",
    )

    def __init__(self, rid: str, prompt_ids: list[int], max_new_tokens: int, seed: int,
                 limit_finish: str = "length", arrival: float | None = None) -> None:
        self.rid = rid
        self.prompt_tokens = len(prompt_ids)
        self.prompt_ids = prompt_ids
        # prompt tokens reported as cached (meta_info cached_tokens, sglang:cached_tokens_total)
        self.cached_tokens = 0
        # the prefix-cache node this request holds locked, and how many of its tokens live there
        self.node: Node | None = None
        self.tree_tokens = 0
        self.released = False
        self.max_new_tokens = max_new_tokens
        # "length" when the client's limit ended it, "stop" when the sim's default did (as EOS).
        self.limit_finish = limit_finish
        self.tokens = TokenStream(prompt_ids, seed)
        # a request that asked for logprobs (protocol.LogprobRequest): the scheduler tells it the drift and
        # load it ran under; its TokenStream traces the state of every output token
        self.lp: Any = None
        # at most this many prompt tokens may come from the prefix cache: one is always computed, and
        # with input logprobs none from logprob_start_len on (SGLang's Req._compute_max_prefix_len)
        self.max_prefix = len(prompt_ids) - 1
        # a PD decode: the prefill's first token and, with logprobs, its figures (the room report)
        self.first_token: int | None = None
        self.first_report: dict[str, Any] | None = None
        self.output_ids: list[int] = []
        # a PD decode's: set when its KV is pre-allocated (Scheduler.preallocate)
        self.admitted: asyncio.Event | None = None
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
        # admitted, being prefilled (their KV is allocated)
        self.prefilling: list[SimRequest] = []
        self.cache = PrefixCache(args.page_size, args.radix_cache, args.radix_eviction_policy)
        # KV held outside the running batch (prefill engine: prompts whose KV is being sent).
        self.held_kv_tokens = 0
        # a PD decode's prealloc queue (FCFS, waiting for room in the KV pool) and the requests it
        # pre-allocated KV for that are not running yet (KV on its way, or arrived and queued here):
        # SGLang's DecodePreallocQueue and transfer queue (docs/sim.md, "Queueing")
        self.prealloc: deque[SimRequest] = deque()
        self.preallocated: set[SimRequest] = set()
        reserved = args.server.get("num_reserved_decode_tokens")
        self.reserved_decode_tokens = DEFAULT_NUM_RESERVED_DECODE_TOKENS if reserved is None else max(0, int(reserved))
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
        # numerics drift (PDKIT_SIM_DRIFT_WHEN and its knobs): noisy logprobs, and with
        # PDKIT_SIM_DIVERGE_FROM_POSITION another top-1 past a context length under load
        # (PDKIT_SIM_DIVERGE_WHEN, when set, is the divergence's own condition: one lever drifts within a
        # tolerance, another diverges, on the same engines)
        self.drift: Drift | None = None
        noisy = argv_matches(knobs.drift_when, args.argv)
        diverging = argv_matches(knobs.diverge_when or knobs.drift_when, args.argv)
        if noisy or diverging:
            self.drift = Drift(knobs.drift_logprob_per_1k if noisy else 0.0,
                               knobs.drift_logprob_per_req if noisy else 0.0,
                               knobs.diverge_after_tokens if diverging else 0, knobs.diverge_min_batch)
        self.diverge = self.drift if self.drift is not None and self.drift.diverge_after > 0 else None
        self.wedge_armed = argv_matches(knobs.wedge_when, args.argv)
        self.wedged_at: float | None = None
        # the eager scheduler gauges this loop computes, as children (a stand-in for any the release lacks)
        self._gauges = {n: metrics.child(n) or _NoSeries() for n in _SCHEDULER_GAUGES}
        # set once at startup by a real engine too (lazy in the catalogue: not an idle stats log)
        self.metrics.set("sglang:max_total_num_tokens", args.max_total_tokens)
        # and the pool's size in GiB (SGLang: the K and V buffers, max_total_num_tokens + one padding page,
        # mem_cache/memory_pool.py mem_usage): over max_total_num_tokens, the KV bytes of one token (doctor's
        # prefix_cache row, the PD dashboard's hand-off panel)
        self.metrics.set("sglang:kv_cache_memory_usage_gb",
                         (args.max_total_tokens + args.page_size) * knobs.kv_bytes_per_token / 2**30)

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
        self.preallocated.discard(req)
        if req.counted:
            self.metrics.inc("sglang:num_aborted_requests_total")
        self._wake.set()

    def release_kv(self, tokens: int) -> None:
        self.held_kv_tokens -= tokens
        self._wake.set()

    def exceeds_pool(self, req: SimRequest) -> str | None:
        """Why a PD decode refuses a request at once (400), before any handshake: a prompt longer than
        its whole KV pool (SGLang's DecodePreallocQueue `_check_if_req_exceed_kv_capacity`, 0.5.17
        decode.py:653, 0.5.23 decode.py:962). A shorter one that cannot fit with its reserved decode
        tokens is not refused: it waits in the prealloc queue."""
        if req.prompt_tokens > self.args.max_total_tokens:
            return (f"Request {req.rid} exceeds the maximum number of tokens: {req.prompt_tokens} > "
                    f"{self.args.max_total_tokens}")
        return None

    async def preallocate(self, req: SimRequest) -> int:
        """A PD decode's request, handshake done: wait in the prealloc queue until the loop pre-allocates
        its KV (`_preallocate`), and return its `decode_prefix_len` (the radix-cache hit it locked then).
        Cancelled, it leaves the queue (or frees what was pre-allocated)."""
        req.admitted = asyncio.Event()
        self.prealloc.append(req)
        self._wake.set()
        try:
            await req.admitted.wait()
        except BaseException:
            self.forget(req)
            raise
        return req.tree_tokens

    def forget(self, req: SimRequest) -> None:
        """A PD decode's request whose hand-off ended without reaching the running batch (failed, or its
        client went away): out of the prealloc queue, its pre-allocated KV freed. Idempotent; the engine
        calls it once a request is over, whatever happened (a running request is not affected)."""
        try:
            self.prealloc.remove(req)
        except ValueError:
            pass
        if req in self.preallocated:
            self.preallocated.discard(req)
            self._update_gauges()
        self._wake.set()

    def release(self, req: SimRequest) -> None:
        """The request no longer uses its cached prefix (finished, aborted, or its KV sent): unlock it,
        leaving it evictable. Idempotent; the engine calls it once a request is over, whatever happened."""
        if req.released:
            return
        req.released = True
        if req.node is not None:
            self.cache.unlock(req.node)
            req.node = None
        self._wake.set()

    def flush_cache(self) -> bool:
        """/flush_cache: only an idle engine drops its cache (SGLang: not with requests running or waiting)."""
        if self.waiting or self.running or self.prefilling or self.prealloc or self.preallocated:
            return False
        return self.cache.reset()

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
        """KV pool tokens in use and not evictable (SGLang: max_total - available - evictable): the KV
        held for transfers, each running request's tokens outside the cache, and the cached tokens a
        running request locks."""
        private = sum(r.kv_tokens - r.tree_tokens for r in self.running)
        private += sum(r.kv_tokens - r.tree_tokens for r in self.prefilling)
        # a PD decode's pre-allocated prompts, not running yet
        private += sum(r.prompt_tokens - r.tree_tokens for r in self.preallocated)
        return self.held_kv_tokens + private + self.cache.protected_size

    @property
    def preallocated_tokens(self) -> int:
        """KV a PD decode pre-allocated for requests not running yet (its log's `pre-allocated usage`)."""
        return sum(r.prompt_tokens - r.tree_tokens for r in self.preallocated)

    def _make_room(self) -> None:
        """Evict unused cached tokens while the pool holds more than it has (SGLang evicts on allocation)."""
        over = self.used_tokens + self.cache.evictable_size - self.args.max_total_tokens
        if over > 0:
            self.cache.evict(over)

    def _cache_prompt(self, req: SimRequest) -> None:
        """Store the request's prompt (whole pages) in the cache and hold it locked while it runs."""
        if not self.cache.enabled or req.released:
            return
        length, node = self.cache.insert(req.prompt_ids)
        self.cache.lock(node)
        if req.node is not None:
            self.cache.unlock(req.node)
        req.node, req.tree_tokens = node, length

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if self.stalled():
                # A wedged engine: accepts requests, makes no progress (the watchdog may fire).
                await asyncio.sleep(0.05)
                continue
            if self.mode == "decode":
                # SGLang's decode loop pops its prealloc queue every iteration (process_decode_queue)
                self._preallocate()
            if not self.waiting and not self.running:
                self.last_progress = time.monotonic()
                self._update_gauges()
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            if admitted:
                if self.mode == "decode":
                    self._join_running(admitted, time.perf_counter(), self._scheduled(admitted))
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

    def _preallocate(self) -> list[SimRequest]:
        """A PD decode admits from the head of its prealloc queue while the pool has room by SGLang's rule
        (stepmodel.decode_admits; FCFS, stopping at the first that does not fit: pop_preallocated, 0.5.17
        decode.py:894, 0.5.23 decode.py:1333). With a decode radix cache the prompt is matched (whole
        pages) and the hit locked first, the `decode_prefix_len` the prefill is told (0.5.23
        `_match_prefix_and_lock`: no `input - 1` cap there); a request that does not fit unlocks it."""
        admitted: list[SimRequest] = []
        if not self.prealloc:
            return admitted
        running = [Decoding(r.prompt_tokens, len(r.output_ids), r.max_new_tokens)
                   for r in self.running if not r.aborted]
        while self.prealloc:
            req = self.prealloc[0]
            if req.done or req.released:
                self.prealloc.popleft()  # gone meanwhile
                continue
            hit, node = 0, self.cache.root  # no hit: the root, as match() answers with the cache off
            if self.args.decode_radix_cache:
                hit, node = self.cache.match(req.prompt_ids)
                if hit:
                    self.cache.lock(node)
            available = self.args.max_total_tokens - self.used_tokens  # free and evictable
            active = len(self.running) + len(self.preallocated)
            if not decode_admits(req.prompt_tokens, req.max_new_tokens, hit, available, active, running,
                                 self.reserved_decode_tokens, self.args.page_size):
                if hit:
                    self.cache.unlock(node)
                break
            if hit:
                req.node, req.tree_tokens = node, hit
            self.prealloc.popleft()
            self.preallocated.add(req)
            admitted.append(req)
            assert req.admitted is not None
            req.admitted.set()
        if admitted:
            self._make_room()
            self._update_gauges()
        return admitted

    def _admit(self) -> list[SimRequest]:
        """FCFS admission (stepmodel.fits). Unified and prefill engines match each head against the
        prefix cache first (at most prompt - 1 tokens: SGLang's Req._compute_max_prefix_len) and lock
        the hit; a PD decode matched its cache when it pre-allocated the request's KV (`_preallocate`),
        which it holds already: only the running slots bound it here."""
        if not self.waiting:
            return []
        cache = self.cache
        prefill = self.mode != "decode"
        admitted: list[SimRequest] = []
        batch_tokens = 0
        kv = self.used_tokens
        for req in self.waiting:
            if prefill:
                hit, node = cache.match(req.prompt_ids, limit=req.max_prefix)
                delta = cache.lock_delta(node) if hit else 0
            else:
                # matched and locked at pre-allocation: the root (no prefix) stands for its node here
                hit, node, delta = req.tree_tokens, cache.root, 0
            new = req.prompt_tokens - hit
            reserve = new + req.max_new_tokens + delta
            if req in self.preallocated:
                # its KV is pre-allocated (counted in `kv` already)
                if not fits(len(admitted), len(self.running), 0, 0, 0, 0, self.limits, False):
                    break
                admitted.append(req)
                continue
            if not fits(len(admitted), len(self.running), batch_tokens, kv, new, reserve, self.limits, prefill):
                break
            if prefill and hit:
                cache.lock(node)
                req.node, req.tree_tokens, req.cached_tokens = node, hit, hit
            admitted.append(req)
            batch_tokens += new
            kv += reserve
        for _ in admitted:
            self.waiting.popleft()
        now = time.perf_counter()
        for req in admitted:
            self.metrics.observe("sglang:queue_time_seconds", now - req.queued_at)
        return admitted

    async def _prefill(self, batch: list[SimRequest]) -> None:
        # only the tokens past each cached prefix are computed
        cached = sum(r.cached_tokens for r in batch)
        new_tokens = sum(r.prompt_tokens for r in batch) - cached
        graph = prefill_uses_cuda_graph(self.plan, new_tokens)
        passes = prefill_passes(new_tokens, self.args.chunked_prefill_size)
        self.metrics.count_pass("prefill_cuda_graph" if graph else "prefill_none", passes)
        self.metrics.count_tokens("prefill_compute", new_tokens)
        self.metrics.count_tokens("prefill_cache", cached)
        # per prefill batch, as SGLang's metrics_reporter sets it (decode batches leave it alone)
        self.metrics.set("sglang:cache_hit_rate", cached / (cached + new_tokens) if cached + new_tokens else 0.0)
        self.prefilling = batch
        running = self._scheduled(batch)
        self._make_room()
        self._log_prefill(batch, new_tokens, graph, cached)
        try:
            await asyncio.sleep(prefill_step_seconds(self.knobs, new_tokens))
        finally:
            self.prefilling = []
        now = time.perf_counter()
        batch = [r for r in batch if not r.aborted]
        for req in batch:
            self._cache_prompt(req)  # SGLang checkpoints the prefilled prompt into the tree
        if self.mode == "prefill":
            for req in batch:
                self._emit(req, now, running)
                self._finish(req, now, "length")
        else:
            self._join_running(batch, now, running)
        self._update_gauges()

    def _scheduled(self, batch: list[SimRequest]) -> int:
        """A batch starts: the requests running with it, itself included. Each one that asked for
        logprobs learns the drift it runs under and its load (the others running when it was scheduled)."""
        running = len(self.running) + len(batch)
        for req in batch:
            if req.lp is not None:
                req.lp.drift = self.drift
                req.lp.load = running - 1
                req.lp.running = running
        return running

    def _join_running(self, batch: list[SimRequest], now: float, running: int) -> None:
        """First token for each request (computed by prefill, here or on the PD prefill engine)."""
        for req in batch:
            self.preallocated.discard(req)  # a PD decode's: its KV is the running request's now
            if req.aborted:
                continue
            if self.mode == "decode":
                # the KV has arrived: SGLang's decode checkpoints the prompt into its tree (a no-op
                # without --disaggregation-decode-enable-radix-cache)
                self._cache_prompt(req)
            self._emit(req, now, running)
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
        diverge = self.diverge
        still_running = []
        produced = 0
        for req in self.running:
            if req.aborted:
                continue
            if req.counted:
                if itl is None:
                    itl = self.metrics.child("sglang:inter_token_latency_seconds")
                itl.observe(now - req.last_token_at)
            if diverge is None:
                token = req.tokens.next_id()
            else:  # another top-1 at or past the context length, while enough requests decode together
                token = req.tokens.next_id(diverge.diverges(req.prompt_tokens + len(req.output_ids), batch))
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
        self._make_room()
        self._decode_passes += 1
        self._tokens_since_log += produced
        if self._decode_passes % self.args.decode_log_interval == 0:
            self._log_decode(batch, graph)
        self._update_gauges()

    def _emit(self, req: SimRequest, now: float, running: int) -> None:
        """The first output token: computed by this prefill (diverged when the drift says so at the
        prompt's length with `running` requests), or on a PD decode the prefill's, taken as it came."""
        if req.first_token is not None:
            token = req.tokens.accept(req.first_token, req.first_report)
        else:
            diverge = self.diverge
            token = req.tokens.next_id(diverge is not None and self.mode != "decode"
                                       and diverge.diverges(req.prompt_tokens, running))
        req.output_ids.append(token)
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
        if self.mode != "prefill":
            self.release(req)  # a PD prefill's request keeps its prefix until its KV is sent (the engine)
        if not req.counted:
            return
        self.metrics.request_finished(req.streaming, req.prompt_tokens, len(req.output_ids), now - req.arrival,
                                      req.cached_tokens)

    # ---- reporting --------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        g = self._gauges
        used = self.used_tokens
        total = self.args.max_total_tokens
        g["sglang:num_running_reqs"].set(len(self.running))
        g["sglang:num_queue_reqs"].set(len(self.waiting))
        g["sglang:num_used_tokens"].set(used)
        g["sglang:kv_used_tokens"].set(used)
        evictable = self.cache.evictable_size
        g["sglang:kv_available_tokens"].set(max(0, total - used - evictable))
        g["sglang:kv_evictable_tokens"].set(evictable)
        g["sglang:token_usage"].set(used / total)
        g["sglang:full_token_usage"].set(used / total)
        g["sglang:utilization"].set(min(1.0, len(self.running) / self.args.max_running_requests))

    def _log_prefill(self, batch: list[SimRequest], new_tokens: int, graph: bool, cached: int = 0) -> None:
        now = time.perf_counter()
        gap = max(now - self._last_prefill_log, 1e-6)
        self._last_prefill_log = now
        pd = self.pd_queues() if (self.pd_queues and self.mode == "prefill") else None
        self.log.info(format_prefill_batch(
            len(batch), new_tokens, self.used_tokens / self.args.max_total_tokens, len(self.running),
            len(self.waiting), graph, new_tokens / gap, pd, cached))

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
            len(self.waiting), pd, self.preallocated_tokens / self.args.max_total_tokens))
