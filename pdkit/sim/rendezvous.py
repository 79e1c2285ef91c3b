"""Ranks of a sim engine spanning nodes meet the way SGLang's do, and fail the way NCCL fails.

SGLang with `--nnodes N --node-rank R --dist-init-addr HOST:PORT` starts one server per node;
torch.distributed's TCP store on rank 0 (HOST:PORT) waits for every rank, and only rank 0 runs
the HTTP server, so rank 0 becomes ready only once all N ranks joined. When a rank dies later,
the next collective on the others never completes: NCCL's watchdog times out and the process
exits (`ProcessGroupNCCL's watchdog caught collective operation timeout`), systemd restarts it,
and the ranks meet again.

The sim reproduces that over one TCP connection per rank > 0 to rank 0 at --dist-init-addr:

- rank R > 0 connects (retrying while rank 0 is not listening, up to --dist-timeout), sends
  {"rank": R, "nnodes": N}; rank 0 answers {"ok": true}, or {"error": ...} and closes (a rank
  already joined, a wrong N, a rank out of range);
- when the N - 1 ranks have joined, rank 0 sends {"start": true} to each, stops listening
  (a late joiner finds no rendezvous, as a late rank finds torch's store gone) and is ready;
- afterwards both ends send a heartbeat line every HEARTBEAT_S; a closed connection, or
  silence for PDKIT_SIM_RANK_LOSS_TIMEOUT_S (the NCCL timeout stand-in, default 5 s), is a
  lost rank: rank 0 and every other rank log NCCL's watchdog error and exit 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

HEARTBEAT_S = 0.5
LOSS_TIMEOUT_ENV = "PDKIT_SIM_RANK_LOSS_TIMEOUT_S"
DEFAULT_LOSS_TIMEOUT_S = 5.0
# torch.distributed's default store timeout when --dist-timeout is unset
DEFAULT_DIST_TIMEOUT_S = 600.0


def loss_timeout_s(environ=os.environ) -> float:
    raw = environ.get(LOSS_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_LOSS_TIMEOUT_S
    value = float(raw)
    if not value > 0:
        raise ValueError(f"{LOSS_TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def parse_addr(addr: str) -> tuple[str, int]:
    """HOST:PORT or [IPV6]:PORT, as SGLang's NetworkAddress.parse reads --dist-init-addr."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--dist-init-addr {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def nccl_timeout_line(rank: int, lost: str, waited_s: float) -> str:
    return (f"[rank{rank}]:[E] ProcessGroupNCCL's watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for {int(waited_s * 1000)} milliseconds before timing out "
            f"({lost}). To avoid data inconsistency, we are taking the entire process down.")


class Link:
    """One established rank-to-rank connection: heartbeats out, loss detection in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, timeout_s: float):
        self.reader, self.writer, self.peer, self.timeout_s = reader, writer, peer, timeout_s

    async def watch(self) -> str:
        """Return why the peer is lost (never returns while it is alive)."""
        async def beat() -> None:
            while True:
                self.writer.write(b"ping\n")
                await self.writer.drain()
                await asyncio.sleep(HEARTBEAT_S)

        beater = asyncio.create_task(beat())
        try:
            while True:
                try:
                    line = await asyncio.wait_for(self.reader.readline(), self.timeout_s)
                except TimeoutError:
                    return f"{self.peer} silent for {self.timeout_s:g} s"
                if not line:
                    return f"{self.peer} closed the connection"
        except (ConnectionError, OSError) as exc:
            return f"{self.peer}: {exc}"
        finally:
            beater.cancel()

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a dead socket
            pass


async def _send(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write((json.dumps(message) + "\n").encode())
    await writer.drain()


async def host_rendezvous(host: str, port: int, nnodes: int, log: logging.Logger | logging.LoggerAdapter,
                          timeout_s: float) -> list[Link]:
    """Rank 0: listen at HOST:PORT until ranks 1..N-1 joined; return their links (listener closed)."""
    joined: dict[int, Link] = {}
    all_in = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = json.loads(await asyncio.wait_for(reader.readline(), 10))
            rank, their_n = int(hello.get("rank", -1)), int(hello.get("nnodes", -1))
        except (TimeoutError, ValueError, ConnectionError, AttributeError):
            writer.close()
            return
        error = None
        if their_n != nnodes:
            error = f"rank {rank} was started with --nnodes {their_n}, rank 0 with {nnodes}"
        elif not 1 <= rank < nnodes:
            error = f"--node-rank {rank} is out of range for --nnodes {nnodes}"
        elif all_in.is_set():
            error = f"rank {rank} came after every rank had joined"
        if error:
            log.error(f"dist init: refused a rank from {writer.get_extra_info('peername')}: {error}")
            await _send(writer, {"error": error})
            writer.close()
            return
        await _send(writer, {"ok": True})
        if rank in joined:
            # the same rank again before the start: its earlier process died and systemd restarted it
            joined.pop(rank).close()
            log.warning(f"dist init: rank {rank} joined again; dropping its earlier connection")
        joined[rank] = Link(reader, writer, f"rank {rank}", timeout_s)
        log.info(f"dist init: rank {rank} joined ({len(joined) + 1}/{nnodes})")
        if len(joined) == nnodes - 1:
            all_in.set()

    server = await asyncio.start_server(handle, host, port, reuse_address=True)
    log.info(f"dist init: rank 0 waiting for {nnodes - 1} rank(s) at {host}:{port}")
    try:
        await all_in.wait()
    finally:
        server.close()
    for link in joined.values():
        await _send(link.writer, {"start": True})
    return [joined[r] for r in sorted(joined)]


async def join_rendezvous(host: str, port: int, rank: int, nnodes: int, log: logging.Logger,
                          timeout_s: float, dist_timeout_s: float) -> Link:
    """Rank R > 0: connect to rank 0 (retrying while it is not there) and wait for the start."""
    deadline = time.monotonic() + dist_timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            last = str(exc)
            await asyncio.sleep(0.2)
            continue
        try:
            await _send(writer, {"rank": rank, "nnodes": nnodes})
            reply = json.loads(await reader.readline() or b"{}")
            if reply.get("ok"):
                log.info(f"dist init: rank {rank} joined rank 0 at {host}:{port}; waiting for the other ranks")
                start = await reader.readline()  # rank 0 sends it when every rank is in
                if start and json.loads(start).get("start"):
                    return Link(reader, writer, "rank 0", timeout_s)
                last = "rank 0 went away before every rank joined"
            else:
                last = reply.get("error", "refused")
                log.warning(f"dist init: rank 0 refused rank {rank}: {last}")
        except (ConnectionError, OSError, ValueError) as exc:
            last = str(exc) or type(exc).__name__
        writer.close()
        await asyncio.sleep(0.5)
    raise TimeoutError(f"rank {rank} could not join rank 0 at {host}:{port} within {dist_timeout_s:g} s: {last}")


async def watch_all(links: list[Link]) -> str:
    """Until one link is lost: why."""
    tasks = [asyncio.create_task(link.watch()) for link in links]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return next(iter(done)).result()
