"""The PD handshake between a sim prefill and a sim decode, over the prefill's bootstrap port.

SGLang's prefill runs a small HTTP bootstrap server on --disaggregation-bootstrap-port; a decode
that receives a request carrying bootstrap_host/bootstrap_port/bootstrap_room (the router
injects the same three into both legs) contacts it, waits in its prealloc queue until its KV pool
has room for the request, pre-allocates that KV, hands the prefill the KV slots ("send_metadata")
and waits until the prefill has pushed that room's KV. The prefill holds the request from the
moment it registers until the slots arrive, for at most SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT:
a decode whose pool stays full for that long fails the request with nothing dead (docs/sim.md,
"Queueing: bootstrap clock and decode admission"). A dead or unreachable prefill stalls the decode
until a timeout or its heartbeat, and both sides count the failure.

The sim keeps that shape over plain HTTP: the decode POSTs `/sim/kv/{room}?wait=S` to the
prefill's bootstrap port. The first POST (wait=0) is the handshake: the decode knows the prefill
was reached. Once the decode has admitted the request it POSTs `metadata=1` (SGLang's
send_metadata): the prefill stops waiting for a decode. It carries `decode_prefix_len`, the prompt
tokens a decode with a radix cache already holds (SGLang's KV metadata field of that name), which
the prefill then does not send. Later POSTs (with `metadata=1` too, until one gets through) are
long-polls, answered when the prefill has prefilled and "transferred" the room, reports it failed,
or S seconds pass (then the decode polls again).
`GET /health` and `GET /route` answer like SGLang's bootstrap server does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from pdkit.sim.knobs import Knobs
from pdkit.upstream.sglang_pd import (
    SGLANG_ENSURE_ATTEMPTS,
    SGLANG_ENSURE_TRY_TIMEOUT_S,
    SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S,
    SGLANG_HEARTBEAT_READ_TIMEOUT_S,
)

# Longest single long-poll; the decode polls again until its own deadline.
MAX_POLL_WAIT_S = 10.0
# Rooms are forgotten this long after they ended (or after the longest PD timeout if they never did).
ROOM_GRACE_S = 30.0
# SGLang's words for a decode whose prefill stopped answering or reported the room failed.
PREFILL_MIGHT_BE_DEAD = "Failed to get kvcache from prefill instance, it might be dead"


class KVTransferError(Exception):
    """Raised on the decode side; str() reads like SGLang's KVTransferError."""

    kind = "transfer"

    def __init__(self, room: int, message: str) -> None:
        super().__init__(f"KVTransferError(bootstrap_room={room}): {message}")
        self.room = room


class BootstrapFailed(KVTransferError):
    """The decode never reached the prefill's bootstrap server (counts as a bootstrap failure)."""

    kind = "bootstrap"


@dataclass
class Room:
    created: float = field(default_factory=time.monotonic)
    decode_ready: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    ended: float = 0.0
    # prompt tokens the decode already holds (its radix-cache hit); the prefill sends the rest
    decode_prefix_len: int = 0

    def end(self, result: dict[str, Any]) -> None:
        if not self.outcome.done():
            self.outcome.set_result(result)
            self.ended = time.monotonic()


class RoomTable:
    """Prefill-side state of every room it has heard of, from either side."""

    def __init__(self, max_age_s: float) -> None:
        self._rooms: dict[int, Room] = {}
        self._max_age_s = max_age_s

    def get(self, room: int) -> Room:
        state = self._rooms.get(room)
        if state is None:
            state = self._rooms[room] = Room()
        return state

    def __len__(self) -> int:
        return len(self._rooms)

    def sweep(self) -> None:
        now = time.monotonic()
        stale = [
            k for k, r in self._rooms.items()
            if (r.ended and now - r.ended > ROOM_GRACE_S) or now - r.created > self._max_age_s + ROOM_GRACE_S
        ]
        for k in stale:
            del self._rooms[k]


def build_bootstrap_app(rooms: RoomTable, route_info: dict[str, Any]) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def route(_: web.Request) -> web.Response:
        return web.json_response(route_info)

    async def kv(request: web.Request) -> web.Response:
        try:
            room_id = int(request.match_info["room"])
            wait = min(float(request.query.get("wait", "0")), MAX_POLL_WAIT_S)
        except ValueError:
            return web.json_response({"error": "bad room or wait"}, status=400)
        room = rooms.get(room_id)
        if request.query.get("metadata") == "1" and not room.decode_ready.is_set():
            # the decode pre-allocated the room's KV and sends its slots (SGLang's send_metadata): the
            # prefill's bootstrap clock stops and the request may be prefilled
            try:
                room.decode_prefix_len = max(0, int(request.query.get("decode_prefix_len", "0")))
            except ValueError:
                return web.json_response({"error": "bad decode_prefix_len"}, status=400)
            room.decode_ready.set()
        if not room.outcome.done() and wait > 0:
            try:
                await asyncio.wait_for(asyncio.shield(room.outcome), wait)
            except TimeoutError:
                pass
        if room.outcome.done():
            return web.json_response({"room": room_id, **room.outcome.result()})
        return web.json_response({"room": room_id, "status": "pending"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/route", route)
    app.router.add_post("/sim/kv/{room}", kv)
    return app


@dataclass(frozen=True)
class BootstrapTarget:
    host: str
    port: int
    room: int


async def wait_for_kv(
    session: aiohttp.ClientSession,
    target: BootstrapTarget,
    knobs: Knobs,
    on_handshake: Callable[[], None],
    admit: Callable[[], Awaitable[int]] | None = None,
    decode_prefix_len: int = 0,
) -> dict[str, Any]:
    """Decode side: handshake with the prefill, wait for admission (`admit`: the decode's prealloc
    queue, which returns the decode_prefix_len once KV is pre-allocated; None: admitted at once with
    DECODE_PREFIX_LEN), hand the prefill the KV slots and wait until it has sent this room's KV,
    bounded the way SGLang's decode bounds it (sglang/srt/disaggregation/decode.py and common/conn.py
    of 0.5.17 and 0.5.23; the constants in pdkit/upstream/sglang_pd.py):

    - Before the handshake the decode asks the prefill's bootstrap server for its parallel info:
      SGLANG_ENSURE_ATTEMPTS tries, `bootstrap_retry_s` (SGLang: 1 s) apart, each up to
      SGLANG_ENSURE_TRY_TIMEOUT_S, then BootstrapFailed. The waiting timeout plays no part.
    - From the handshake on a heartbeat asks the prefill's bootstrap server every
      max(HEARTBEAT_INTERVAL, 2) s (connect timeout 2 s, read 3 s); HEARTBEAT_MAX_FAILURE misses in a
      row fail the room ("Lost connection with prefill instance"), and an answer resets the count.
      Waiting for admission, that is a handshake failure (BootstrapFailed: 0.5.23's
      `_update_handshake_waiters` polls the receivers "while KV allocation is blocked"); no other
      clock bounds that wait on the decode (the prefill's bootstrap timeout bounds it on the prefill).
    - Once admitted, the decode sends the slots and waits for the KV up to
      SGLANG_DISAGGREGATION_WAITING_TIMEOUT, counted from the admission (SGLang's receiver sets
      init_time in send_metadata): KVTransferError "... in KVPoll.WaitingForInput", or the
      heartbeat's verdict. So a prefill restarted on the same port before the misses add up (its
      bootstrap server answers long before its model is loaded, as SGLang's tokenizer manager starts
      it first) leaves the room waiting for the waiting timeout, as in SGLang; and so does a room
      whose prefill gave up on it (its bootstrap timeout) before the decode admitted it: SGLang's
      prefill does not tell the decode, which holds the KV it pre-allocated until the waiting timeout.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    addr = f"{target.host}:{target.port}"
    url = f"http://{addr}/sim/kv/{target.room}"

    # 1. the handshake (SGLang: try_ensure_parallel_info, then the receiver's init)
    last_error = ""
    for attempt in range(1, SGLANG_ENSURE_ATTEMPTS + 1):
        try:
            async with session.post(url, params={"wait": "0"},
                                    timeout=aiohttp.ClientTimeout(total=SGLANG_ENSURE_TRY_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                                      message=resp.reason or "")
                await resp.json()
            break
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {exc}".strip()
            if attempt == SGLANG_ENSURE_ATTEMPTS:
                raise BootstrapFailed(
                    target.room,
                    f"Could not fetch prefill parallel info from {addr} after {attempt} attempts "
                    f"({loop.time() - start:.1f}s; last: {last_error})",
                ) from None
            await asyncio.sleep(knobs.bootstrap_retry_s)
    on_handshake()

    # 2. admission and the KV wait, watched by the heartbeat
    lost = asyncio.Event()
    lost_message = f"Lost connection with prefill instance (bootstrap_addr: {addr})"

    async def heartbeat() -> None:
        misses = 0
        health = f"http://{addr}/health"
        timeout = aiohttp.ClientTimeout(sock_connect=SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S,
                                        sock_read=SGLANG_HEARTBEAT_READ_TIMEOUT_S)
        while True:
            await asyncio.sleep(knobs.effective_heartbeat_interval_s)
            try:
                async with session.get(health, timeout=timeout) as resp:
                    ok = resp.status == 200
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            misses = 0 if ok else misses + 1
            if misses >= knobs.heartbeat_max_failure:
                lost.set()
                return

    watcher = asyncio.create_task(heartbeat())
    try:
        if admit is not None:
            admission = asyncio.ensure_future(admit())
            verdict = asyncio.create_task(lost.wait())
            try:
                await asyncio.wait({admission, verdict}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                verdict.cancel()
                if not admission.done():
                    admission.cancel()  # the prealloc queue forgets the request
            if not admission.done() or admission.cancelled():
                raise BootstrapFailed(target.room, lost_message)
            decode_prefix_len = admission.result()
        # 3. the slots go to the prefill (SGLang's send_metadata); the waiting clock starts now
        metadata = {"metadata": "1", "decode_prefix_len": str(decode_prefix_len)}
        waiting_since = loop.time()
        deadline = waiting_since + knobs.waiting_timeout_s
        report = await _poll(session, url, 0.0, metadata) or {"status": "pending"}
        while True:
            if lost.is_set():
                raise KVTransferError(target.room, lost_message)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise KVTransferError(target.room, f"Request {target.room} timed out after "
                                                   f"{loop.time() - waiting_since:.1f}s in KVPoll.WaitingForInput")
            status = report.get("status")
            if status == "transferred":
                return report
            if status == "failed":
                raise KVTransferError(target.room, report.get("error") or PREFILL_MIGHT_BE_DEAD)
            # long-poll the room, racing the heartbeat's verdict; a dropped poll is no verdict
            # (SGLang's decode learns of a dead prefill from its heartbeat only)
            poll = asyncio.create_task(_poll(session, url, min(remaining, MAX_POLL_WAIT_S), metadata))
            verdict = asyncio.create_task(lost.wait())
            await asyncio.wait({poll, verdict}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            verdict.cancel()
            if not poll.done():
                poll.cancel()
                continue
            answered = poll.result()
            if answered is None:
                # the prefill did not answer: wait for the heartbeat (or the deadline) before asking again
                try:
                    await asyncio.wait_for(lost.wait(),
                                           min(knobs.effective_heartbeat_interval_s, max(0.0, deadline - loop.time())))
                except TimeoutError:
                    pass
            report = answered if answered is not None else {"status": "pending"}
    finally:
        watcher.cancel()


async def _poll(session: aiohttp.ClientSession, url: str, wait: float,
                params: dict[str, str] | None = None) -> dict[str, Any] | None:
    """One long-poll of a room at the prefill's bootstrap server (PARAMS: the decode's slots, sent
    with every poll until one gets through; the prefill takes the first); None when it did not answer."""
    try:
        async with session.post(url, params={"wait": f"{wait:.3f}", **(params or {})},
                                timeout=aiohttp.ClientTimeout(total=wait + 5.0)) as resp:
            if resp.status != 200:
                return None
            return await resp.json()
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
