"""Issue 45 item 5: the sim queues like SGLang at a PD decode whose KV pool is full, and the prefill's
bootstrap clock runs from registration, not from the decode's admission (docs/sim.md, "Queueing:
bootstrap clock and decode admission").

A sim prefill and a sim decode run in this process (their engines, and the prefill's bootstrap server on
loopback); each request is sent to both, as the router does. Times are scaled down with the sim's knobs:
a decode wave of 20 tokens at 20 ms a step, timeouts of a second or less.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from aiohttp import web

from pdkit.sim.args import parse_args
from pdkit.sim.bootstrap import BootstrapTarget, build_bootstrap_app
from pdkit.sim.engine import Engine, EngineError, Outcome
from pdkit.sim.knobs import Knobs
from pdkit.sim.metrics import SimMetrics
from pdkit.sim.protocol import GenSpec
from pdkit.sim.scheduler import SimRequest
from pdkit.sim.stepmodel import (
    Decoding,
    decode_admits,
    decode_admitted_at_once,
    decode_allocatable_tokens,
    decode_prealloc_tokens,
)

POOL = 2000  # the decode's --max-total-tokens
RESERVED = 100  # its --num-reserved-decode-tokens
PROMPT = 900  # tokens per prompt: two fit the pool with their reserve, three do not
MAX_NEW = 20
STEP_MS = 20.0  # decode step: a wave of MAX_NEW tokens takes ~0.4 s
BURST = 6
LOG = logging.LoggerAdapter(logging.getLogger("pdkit.sim.test_queueing"), {})
BOOTSTRAP_TIMED_OUT = "in KVPoll.Bootstrapping"


def _knobs(bootstrap_timeout_s: float, waiting_timeout_s: float) -> Knobs:
    return Knobs(startup_delay_s=0.0, decode_base_ms=STEP_MS, decode_per_req_ms=0.0, schedule_ms=0.0,
                 prefill_base_ms=1.0, prefill_ms_per_1k_tokens=1.0, kv_transfer_gb_s=100.0,
                 bootstrap_timeout_s=bootstrap_timeout_s, waiting_timeout_s=waiting_timeout_s,
                 heartbeat_interval_s=2.0, bootstrap_retry_s=0.05)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Pair:
    prefill: Engine
    decode: Engine
    bootstrap_port: int
    started: float

    def spec(self, i: int, prompt: int = PROMPT) -> GenSpec:
        return GenSpec("generate", f"r{i}", list(range(1, prompt + 1)), MAX_NEW, "length", 0, False, False, "m",
                       BootstrapTarget("127.0.0.1", self.bootstrap_port, 1000 + i), 0)


@asynccontextmanager
async def pd_pair(bootstrap_timeout_s: float, waiting_timeout_s: float, pool: int = POOL) -> AsyncIterator[Pair]:
    knobs = _knobs(bootstrap_timeout_s, waiting_timeout_s)
    bootstrap_port = _port()
    prefill_args = parse_args(["--model-path", "/m", "--port", "1", "--disaggregation-mode", "prefill",
                               "--disaggregation-bootstrap-port", str(bootstrap_port)])
    decode_args = parse_args(["--model-path", "/m", "--port", "2", "--disaggregation-mode", "decode",
                              "--max-total-tokens", str(pool), "--num-reserved-decode-tokens", str(RESERVED)])
    prefill = Engine(prefill_args, knobs, SimMetrics("m", "prefill"), LOG)
    decode = Engine(decode_args, knobs, SimMetrics("m", "decode"), LOG)
    await prefill.start()
    await decode.start()
    runner = web.AppRunner(build_bootstrap_app(prefill.rooms, {}))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", bootstrap_port).start()
    try:
        yield Pair(prefill, decode, bootstrap_port, time.monotonic())
    finally:
        await decode.stop()
        await prefill.stop()
        await runner.cleanup()


@dataclass
class Leg:
    ok: bool
    at: float  # seconds after the pair started
    tokens: int = 0
    status: int = 0
    message: str = ""


async def leg(pair: Pair, engine: Engine, spec: GenSpec) -> Leg:
    out: list[int] = []
    try:
        async for ids in engine.generate(spec, Outcome()):
            out += ids
    except EngineError as exc:
        return Leg(False, time.monotonic() - pair.started, status=exc.status, message=exc.message)
    return Leg(True, time.monotonic() - pair.started, tokens=len(out))


async def burst(pair: Pair, n: int = BURST) -> list[tuple[Leg, Leg]]:
    """N requests at once, each to the prefill and the decode (the router's two legs)."""
    return await asyncio.gather(*(asyncio.gather(leg(pair, pair.prefill, pair.spec(i)),
                                                 leg(pair, pair.decode, pair.spec(i))) for i in range(n)))


class Peaks:
    """The decode's prealloc queue and KV pool use, sampled while a burst runs."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.prealloc = 0
        self.used = 0
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        decode = self.pair.decode
        while True:
            self.prealloc = max(self.prealloc, decode.decode_prealloc_q)
            self.used = max(self.used, decode.scheduler.used_tokens)
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self._task.cancel()


def counter(engine: Engine, name: str) -> float:
    return sum(s.value for f in engine.metrics.registry.collect() for s in f.samples if s.name == name)


# ---- the admission rule, pure ---------------------------------------------------------------------

def test_the_decode_admits_prompt_plus_reserve_for_every_request_it_holds():
    # idle: one needs its prompt and its reserved decode tokens
    assert decode_admits(PROMPT, MAX_NEW, 0, available=PROMPT + RESERVED, active=0, running=(), reserved=RESERVED)
    assert not decode_admits(PROMPT, MAX_NEW, 0, available=PROMPT + RESERVED - 1, active=0, running=(),
                             reserved=RESERVED)
    # each request held keeps its own reserve free
    assert decode_allocatable_tokens(1000, active=3, running=(), reserved=RESERVED) == 700
    # a prompt that fits the pool but not with its reserve is never admitted, even by an idle decode
    assert decode_admitted_at_once(POOL - 50, MAX_NEW, POOL, reserved=RESERVED) == 0
    assert decode_admitted_at_once(PROMPT, MAX_NEW, POOL, reserved=RESERVED) == 2
    assert decode_admitted_at_once(PROMPT, MAX_NEW, 10 * POOL, reserved=RESERVED) == 10 * POOL // (PROMPT + RESERVED)
    # whole pages past the decode's cached prefix
    assert decode_prealloc_tokens(65, 1, 0, (), reserved=0, page_size=64) == 128
    assert decode_prealloc_tokens(65, 1, 64, (), reserved=0, page_size=64) == 64
    # the running request that needs the most to finish keeps its room (SGLang's need_space_for_single_req)
    long_runner = Decoding(prompt_tokens=100, output_tokens=0, max_new_tokens=5000)
    assert decode_allocatable_tokens(5000, active=1, running=(long_runner,), reserved=RESERVED) == 5000 - 4096
    # and a request whose prompt and (clipped) output do not fit beside what retracting the batch frees
    # waits, though its prompt and reserve alone would fit
    short_runner = (Decoding(10, 0, 1),)
    assert decode_prealloc_tokens(100, 8000, 0, short_runner, reserved=RESERVED) == 100 + 4096 - 10
    assert not decode_admits(100, 8000, 0, available=4000, active=1, running=short_runner, reserved=RESERVED)
    assert decode_admits(100, 8000, 0, available=4300, active=1, running=short_runner, reserved=RESERVED)


def test_a_prompt_longer_than_the_pool_is_refused_at_once():
    async def run() -> None:
        async with pd_pair(5.0, 5.0) as pair:
            started = time.monotonic()
            got = await leg(pair, pair.decode, pair.spec(0, prompt=POOL + 1))
            assert not got.ok and got.status == 400, got
            assert got.message == f"Request r0 exceeds the maximum number of tokens: {POOL + 1} > {POOL}"
            assert time.monotonic() - started < 1.0

    asyncio.run(run())


# ---- (a) a burst over the pool queues, and completes within a generous bootstrap timeout -----------

def test_a_burst_over_the_decode_pool_queues_and_completes():
    async def run() -> None:
        async with pd_pair(bootstrap_timeout_s=5.0, waiting_timeout_s=5.0) as pair:
            peaks = Peaks(pair)
            results = await burst(pair)
            peaks.stop()
            at_once = decode_admitted_at_once(PROMPT, MAX_NEW, POOL, reserved=RESERVED)
            assert at_once == 2
            assert all(p.ok and d.ok and d.tokens == MAX_NEW for p, d in results), results
            # the rest waited in the decode's prealloc queue, the pool never overcommitted
            assert peaks.prealloc >= BURST - at_once, peaks.prealloc
            assert peaks.used <= POOL, peaks.used
            # in waves: each wave's prefill leg ends when the decode admitted it (its slots reached the
            # prefill), so the last wave's prefills end after the first wave's decodes
            decode_ends = sorted(d.at for _, d in results)
            prefill_ends = sorted(p.at for p, _ in results)
            assert prefill_ends[-1] >= decode_ends[at_once - 1] - 0.05, (prefill_ends, decode_ends)
            assert decode_ends[-1] >= (BURST // at_once) * MAX_NEW * STEP_MS / 1000 * 0.9, decode_ends
            # nothing failed, and every pre-allocated token came back
            assert counter(pair.prefill, "sglang:num_bootstrap_failed_reqs_total") == 0
            assert pair.decode.scheduler.used_tokens == 0 and not pair.decode.scheduler.preallocated
            assert pair.decode.pd_queue_sizes() == (0, 0)

    asyncio.run(run())


# ---- (b) a bootstrap timeout shorter than the queue fails the queued requests, nothing dead ------

def test_a_bootstrap_timeout_shorter_than_the_queue_fails_the_queued_ones():
    bootstrap_timeout_s, waiting_timeout_s = 0.63, 1.0

    async def run() -> None:
        async with pd_pair(bootstrap_timeout_s, waiting_timeout_s) as pair:
            results = await burst(pair)
            at_once = decode_admitted_at_once(PROMPT, MAX_NEW, POOL, reserved=RESERVED)
            # which requests the decode admits first is the order their handshakes end (FCFS, as in SGLang)
            done = [i for i, (p, _) in enumerate(results) if p.ok]
            failed = [i for i, (p, _) in enumerate(results) if not p.ok]
            # the first wave at once, maybe the second (~0.42 s); never the third (a wave is >= 0.4 s of steps)
            assert at_once <= len(done) <= 2 * at_once, results
            for i in done:
                prefill, decode = results[i]
                assert decode.ok and decode.tokens == MAX_NEW, (i, prefill, decode)
            for i in failed:
                prefill, decode = results[i]
                # SGLang's prefill: the request registered and no decode slots came within the timeout
                assert prefill.status == 500, (i, prefill)
                assert prefill.message.startswith(f"Prefill bootstrap failed for request rank=0 req.rid='r{i}' "
                                                  f"req.bootstrap_room={1000 + i} with exception "
                                                  f"KVTransferError(bootstrap_room={1000 + i}): Request {1000 + i} "
                                                  "timed out after "), prefill.message
                assert prefill.message.endswith(BOOTSTRAP_TIMED_OUT), prefill.message
                # from registration, not from an admission that never came
                assert bootstrap_timeout_s - 0.05 <= prefill.at <= bootstrap_timeout_s + 0.6, prefill.at
                # its decode leg is not told: once admitted it waits for KV that never comes, holding the
                # pool until its waiting timeout (SGLang's prefill knows no decode for the room)
                assert not decode.ok and decode.status == 500, (i, decode)
                assert decode.message.endswith("in KVPoll.WaitingForInput"), decode.message
                assert decode.at >= bootstrap_timeout_s + waiting_timeout_s, decode.at
            assert counter(pair.prefill, "sglang:num_bootstrap_failed_reqs_total") == len(failed)
            assert counter(pair.decode, "sglang:num_transfer_failed_reqs_total") == len(failed)
            assert pair.decode.scheduler.used_tokens == 0 and not pair.decode.scheduler.preallocated

    asyncio.run(run())


# ---- (c) a request the decode never admits, because it is dead, fails by the timeout ----------------

def test_a_request_no_live_decode_admits_fails_by_the_bootstrap_timeout():
    bootstrap_timeout_s = 0.5

    async def run() -> None:
        async with pd_pair(bootstrap_timeout_s, 5.0) as pair:
            # no decode at all (its process gone before the request reached it)
            alone = await leg(pair, pair.prefill, pair.spec(0))
            assert not alone.ok and alone.status == 500 and alone.message.endswith(BOOTSTRAP_TIMED_OUT), alone
            assert bootstrap_timeout_s - 0.05 <= alone.at <= bootstrap_timeout_s + 0.6, alone.at

            # a decode killed mid-burst: the wave it admitted has its KV slots on the prefill, the queued
            # ones never will; each of those fails one bootstrap timeout after it registered
            started = time.monotonic() - pair.started
            prefill_legs = [asyncio.create_task(leg(pair, pair.prefill, pair.spec(i))) for i in range(1, 5)]
            decode_legs = [asyncio.create_task(leg(pair, pair.decode, pair.spec(i))) for i in range(1, 5)]
            decode = pair.decode
            while decode.decode_transfer_q < 2 or decode.decode_prealloc_q < 2:
                await asyncio.sleep(0.005)
            admitted = {r.rid for r in decode.scheduler.preallocated}
            assert len(admitted) == 2, admitted
            # and their slots reached the prefill (SGLang sends them in the same scheduler step)
            rooms = [pair.prefill.rooms.get(1000 + int(rid[1:])) for rid in admitted]
            while not all(room.decode_ready.is_set() for room in rooms):
                await asyncio.sleep(0.005)
            for task in decode_legs:
                task.cancel()
            await decode.stop()
            results = await asyncio.gather(*prefill_legs)
            for i, r in enumerate(results, start=1):
                if f"r{i}" in admitted:
                    assert r.ok, (i, r)
                    continue
                assert r.status == 500 and r.message.endswith(BOOTSTRAP_TIMED_OUT), (i, r)
                assert bootstrap_timeout_s - 0.05 <= r.at - started <= bootstrap_timeout_s + 0.6, (i, r.at, started)
            assert counter(pair.prefill, "sglang:num_bootstrap_failed_reqs_total") == 3

    asyncio.run(run())


def test_a_cancelled_request_leaves_the_prealloc_queue_and_frees_its_kv():
    async def run() -> None:
        async with pd_pair(5.0, 5.0) as pair:
            sched = pair.decode.scheduler
            reqs = [SimRequest(f"x{i}", list(range(1, PROMPT + 1)), MAX_NEW, 0) for i in range(3)]
            waits = [asyncio.create_task(sched.preallocate(r)) for r in reqs]
            await asyncio.wait(waits, timeout=0.5)
            assert [w.done() for w in waits] == [True, True, False]
            assert sched.used_tokens == 2 * PROMPT and list(sched.prealloc) == [reqs[2]]
            waits[2].cancel()
            await asyncio.gather(waits[2], return_exceptions=True)
            assert not sched.prealloc
            sched.forget(reqs[0])
            assert sched.used_tokens == PROMPT

    asyncio.run(run())


@pytest.mark.parametrize("pool,admitted", [(POOL, 2), (PROMPT + RESERVED - 1, 0)])
def test_the_scheduler_admits_what_the_rule_admits(pool, admitted):
    async def run() -> None:
        async with pd_pair(5.0, 5.0, pool=pool) as pair:
            sched = pair.decode.scheduler
            reqs = [SimRequest(f"x{i}", list(range(1, PROMPT + 1)), MAX_NEW, 0) for i in range(4)]
            waits = [asyncio.create_task(sched.preallocate(r)) for r in reqs]
            await asyncio.wait(waits, timeout=0.3)
            assert sum(w.done() for w in waits) == admitted == decode_admitted_at_once(PROMPT, MAX_NEW, pool,
                                                                                       reserved=RESERVED)
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    asyncio.run(run())
