"""A steady load through the router or a target's own PD pairs, in a thread: the tune soak's load and
the answer gate's part (c) (pdkit/clients/answers.py)."""

from __future__ import annotations

import asyncio
import threading

from pdkit.bench.client import generate_body
from pdkit.bench.measure import Measured


def measured_target(target: str | Measured, headers: dict[str, str]) -> Measured:
    """A router URL means the router (its engines unnamed); a Measured is used as it is."""
    return target if isinstance(target, Measured) else Measured((), target, headers)


class LoadThread:
    """CONCURRENCY streaming /generate requests until stopped (pdkit.bench's client), through the
    router or to the target's own PD pairs in turn (TARGET: a router URL or a Measured)."""

    def __init__(self, target: str | Measured, headers: dict[str, str], concurrency: int, input_len: int,
                 output_len: int,
                 timeout_s: float = 120.0, seed: int = 7_000_000) -> None:
        self.measured, self.concurrency = measured_target(target, headers), concurrency
        self.input_len, self.output_len, self.timeout_s, self.seed = input_len, output_len, timeout_s, seed
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="pdkit-tune-soak")

    def start(self) -> LoadThread:
        self.thread.start()
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        # lazy: aiohttp costs ~130 ms more than `pdkit --help` (which imports this module) loads; the soak only
        import aiohttp

        self._loop = asyncio.get_running_loop()
        counter = iter(range(10**9))

        async def worker(session) -> None:
            while not self._stop.is_set():
                n = next(counter)
                result = await self.measured.stream(session, n,
                                                    generate_body(self.seed + n, self.input_len, self.output_len),
                                                    self.output_len, self.timeout_s)
                if self._cancelled and not result.ok:
                    return  # hung up by stop(cancel=True): not a failure of the engine
                if result.ok:
                    self.ok += 1
                else:
                    self.failed.append(result.error or "failed")

        # two connections per request: one to a PD pair's prefill and one to its decode at once
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * self.concurrency)) as session:
            self._tasks = [asyncio.ensure_future(worker(session)) for _ in range(self.concurrency)]
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self, cancel: bool = False) -> None:
        """Stop sending; CANCEL: also hang up the requests in flight (a wedged engine never ends them)."""
        self._cancelled = cancel
        self._stop.set()
        if cancel and self._loop is not None:
            for task in self._tasks:
                self._loop.call_soon_threadsafe(task.cancel)
        self.thread.join(timeout=self.timeout_s + 10)
