"""A constant-concurrency streaming load through the router, counting every failed request.

    python -m tests.lab.loadclient --url http://ROUTER:8000 --model sim-llama --concurrency 16 \
        --out result.json --stop-file STOP [--max-seconds 900]

Runs in its own process (stdlib threads and urllib: no gevent from pyinfra's import), keeps
CONCURRENCY streaming chat completions in flight until STOP exists (or MAX_SECONDS pass),
then writes {"ok", "failed", "errors", "seconds", "failures", "slowest_failure_s", "slowest_ok_s"}
to OUT. A request fails when the answer is not 200, the connection breaks, an error event arrives,
or the stream ends without [DONE] or without any content. `failures` counts the failures by kind
(`status 503`, `hang`: not done within --timeout, ...) and `slowest_failure_s` is the longest a failed request took to
fail: an outage clients see as quick error statuses, not hangs. --pause-after-failure S makes a
worker wait S before its next request after a failure (a client backing off, not a tight loop
against a router that answers 503 at once). Progress is rewritten to OUT every second.

--keys-file F (a JSON list of API keys, null for none) is a client across a router key change:
each worker sends the key the router last accepted and, on a 401, tries the others in order at
once (`key_switches` counts those; a request fails only when every key is refused).
`failure_times` holds when each failure ended (time.monotonic(): CLOCK_MONOTONIC, the clock of
systemd's *TimestampMonotonic on the lab's hosts, which share this kernel).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

# a request not finished within --timeout: a hang, counted apart from a quick error
HANG = "hang"


def failure_kind(why: str) -> str:
    """`status 503` for an HTTP error status, `hang` for a request cut at the client's timeout, else the error's type."""
    if why.startswith("status "):
        return why.split(":", 1)[0]
    if why.startswith(HANG):
        return HANG
    return why.split(":", 1)[0][:60]


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.errors: list[str] = []
        self.failures: dict[str, int] = {}
        self.slowest_failure_s = 0.0
        self.slowest_ok_s = 0.0
        self.key_switches = 0
        self.failure_times: list[float] = []

    def success(self, took: float = 0.0) -> None:
        with self.lock:
            self.ok += 1
            self.slowest_ok_s = max(self.slowest_ok_s, took)

    def failure(self, why: str, took: float = 0.0) -> None:
        with self.lock:
            self.failed += 1
            kind = failure_kind(why)
            self.failures[kind] = self.failures.get(kind, 0) + 1
            self.slowest_failure_s = max(self.slowest_failure_s, took)
            if len(self.failure_times) < 50000:
                self.failure_times.append(round(time.monotonic(), 3))
            if len(self.errors) < 50:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {why} (after {took:.2f} s)")

    def snapshot(self, started: float) -> dict:
        with self.lock:
            return {"ok": self.ok, "failed": self.failed, "errors": list(self.errors), "seconds": round(time.monotonic() - started, 1),
                    "failures": dict(self.failures), "slowest_failure_s": round(self.slowest_failure_s, 3), "slowest_ok_s": round(self.slowest_ok_s, 3),
                    "key_switches": self.key_switches, "failure_times": list(self.failure_times)}


def one_request(url: str, model: str, n: int, max_tokens: int, timeout: float, key: str | None = None) -> str | None:
    """None on success, else why it failed."""
    body = {"model": model, "messages": [{"role": "user", "content": f"load request {n}"}], "max_tokens": max_tokens, "stream": True}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    chunks = 0
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if response.status != 200:
                return f"status {response.status}"
            for raw in response:
                if time.monotonic() > deadline:
                    return f"{HANG}: still streaming after {timeout:.0f} s"
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return None if chunks else "stream ended without content"
                event = json.loads(line[6:])
                if "error" in event:
                    return f"error event: {str(event['error'])[:160]}"
                if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                    chunks += 1
    except urllib.error.HTTPError as exc:
        return f"status {exc.code}: {exc.read().decode(errors='replace')[:160]}"
    except TimeoutError as exc:
        return f"{HANG}: {exc or 'timed out'} after {timeout:.0f} s"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None)
        if isinstance(reason, TimeoutError) or "timed out" in str(exc):
            return f"{HANG}: {exc} after {timeout:.0f} s"
        return f"{type(exc).__name__}: {exc}"[:200]
    return f"stream ended without [DONE] after {chunks} chunks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-seconds", type=float, default=900)
    parser.add_argument("--pause-after-failure", type=float, default=0.0, metavar="S")
    parser.add_argument("--keys-file", help="a JSON list of API keys (null: none), tried in order on a 401")
    args = parser.parse_args(argv)
    keys = json.loads(Path(args.keys_file).read_text()) if args.keys_file else [None]
    counts = Counts()
    started = time.monotonic()
    stop = threading.Event()
    numbers = iter(range(10**9))
    number_lock = threading.Lock()

    def worker() -> None:
        key = keys[0]
        while not stop.is_set():
            with number_lock:
                n = next(numbers)
            start = time.monotonic()
            why = one_request(args.url, args.model, n, args.max_tokens, args.timeout, key)
            if why is not None and why.startswith("status 401"):
                # the router restarted on another key: the others, in order, at once
                for other in [k for k in keys if k != key]:
                    again = one_request(args.url, args.model, n, args.max_tokens, args.timeout, other)
                    if again is None or not again.startswith("status 401"):
                        key, why = other, again
                        with counts.lock:
                            counts.key_switches += 1
                        break
            if why is None:
                counts.success(time.monotonic() - start)
            else:
                counts.failure(why, time.monotonic() - start)
                stop.wait(args.pause_after_failure)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    out = Path(args.out)
    stop_file = Path(args.stop_file)
    while not stop_file.exists() and time.monotonic() - started < args.max_seconds:
        out.write_text(json.dumps(counts.snapshot(started)))
        time.sleep(1)
    stop.set()
    for t in threads:
        t.join(timeout=args.timeout + 5)  # requests in flight finish and are counted
    out.write_text(json.dumps(counts.snapshot(started) | {"done": True}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
