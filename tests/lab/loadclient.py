"""A constant-concurrency streaming load through the router, counting every failed request.

    python -m tests.lab.loadclient --url http://ROUTER:8000 --model sim-llama --concurrency 16 \
        --out result.json --stop-file STOP [--max-seconds 900] [--failure-log failures.jsonl]
    python -m tests.lab.loadclient --summary result.json     # the counts again, one line

Runs in its own process (stdlib threads and urllib: no gevent from pyinfra's import), keeps
CONCURRENCY streaming chat completions in flight until STOP exists (or MAX_SECONDS pass),
then writes {"ok", "failed", "errors", "seconds", "failures", "finish_reasons", "workers",
"failure_records", "slowest_failure_s", "slowest_ok_s"} to OUT and prints the summary line.
A request fails when the answer is not 200, the connection breaks, or the stream is not a
complete answer; how a stream is judged is one rule for every client (pdkit.bench.stats
stream_failure): `aborted` (an error event, or finish_reason "abort"), `no [DONE]`, or
`empty (<finish reason>)` ([DONE] without any output: `empty (stop)` is a model that ended at
once, counted, never a silent success). `failures` counts the failures by kind (`status 503`,
`hang`: not done within --timeout, `aborted`, `empty (stop)`, ...), `finish_reasons` the finish
reason their streams named (`error 500` for an error event), `workers` the worker that served
them (smg's x-smg-routed-worker-id header; `unknown` behind sglang-router 0.3.2, which names
none). `failure_records` keeps the first 200 failures with their time, kind, finish reason,
worker, SGLang's rid (the body's `id`: grep the engines' logs for it), the router's
x-request-id and the last 2 KB of the stream as received; --failure-log FILE appends every
failure so, one JSON line each. `slowest_failure_s` is the longest a failed request took to
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
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

# the one rule for a stream's verdict, shared with pdkit bench (stdlib only: runs on any python3)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pdkit.bench.stats import (  # noqa: E402
    REQUEST_ID_HEADER,
    WORKER_HEADER,
    StreamEnd,
    count,
    failure_kind,
    stream_failure,
)

# a request not finished within --timeout: a hang, counted apart from a quick error
HANG = "hang"
# how much of a failed stream is kept, as received (its end: the part that says how it ended)
RAW_TAIL_BYTES = 2048
FAILURE_RECORDS_KEPT = 200

__all__ = ["HANG", "Outcome", "failure_kind", "one_request", "request", "summary_line"]


@dataclass
class Outcome:
    """One request: why it failed (None: it answered) and what says who served it and how it ended."""

    why: str | None = None
    finish_reason: str | None = None  # as its stream named it; `error <code>` for an error event
    worker: str | None = None         # the router's WORKER_HEADER (smg 1.13.0), else None
    rid: str | None = None            # SGLang's request id (the body's `id`), the one its logs name
    request_id: str | None = None     # the router's REQUEST_ID_HEADER
    raw: str = ""                     # a failed stream's last RAW_TAIL_BYTES, as received

    @property
    def ok(self) -> bool:
        return self.why is None

    @property
    def kind(self) -> str | None:
        return None if self.why is None else failure_kind(self.why)

    def record(self, took: float) -> dict:
        """A failure as the failure log and OUT's failure_records keep it."""
        return {"time": round(time.time(), 3), "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "kind": self.kind, "took_s": round(took, 3), **asdict(self)}


class Counts:
    def __init__(self, failure_log: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.errors: list[str] = []
        self.failures: dict[str, int] = {}
        self.finish_reasons: list[str | None] = []
        self.workers: list[str | None] = []
        self.records: list[dict] = []
        self.failure_log = failure_log
        self.slowest_failure_s = 0.0
        self.slowest_ok_s = 0.0
        self.key_switches = 0
        self.failure_times: list[float] = []

    def success(self, took: float = 0.0) -> None:
        with self.lock:
            self.ok += 1
            self.slowest_ok_s = max(self.slowest_ok_s, took)

    def failure(self, why: str | Outcome, took: float = 0.0) -> None:
        outcome = why if isinstance(why, Outcome) else Outcome(why=why)
        assert outcome.why is not None
        record = outcome.record(took)
        with self.lock:
            self.failed += 1
            kind = failure_kind(outcome.why)
            self.failures[kind] = self.failures.get(kind, 0) + 1
            if outcome.finish_reason:
                self.finish_reasons.append(outcome.finish_reason)
            self.workers.append(outcome.worker)
            self.slowest_failure_s = max(self.slowest_failure_s, took)
            if len(self.failure_times) < 50000:
                self.failure_times.append(round(time.monotonic(), 3))
            if len(self.errors) < 50:
                who = f" [worker {outcome.worker or 'unknown'}, rid {outcome.rid or '?'}]" if outcome.finish_reason else ""
                self.errors.append(f"{time.strftime('%H:%M:%S')} {outcome.why}{who} (after {took:.2f} s)")
            if len(self.records) < FAILURE_RECORDS_KEPT:
                self.records.append(record)
            if self.failure_log is not None:
                with self.failure_log.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")

    def snapshot(self, started: float) -> dict:
        with self.lock:
            return {"ok": self.ok, "failed": self.failed, "errors": list(self.errors), "seconds": round(time.monotonic() - started, 1),
                    "failures": dict(sorted(self.failures.items(), key=lambda kv: (-kv[1], kv[0]))),
                    "finish_reasons": count(self.finish_reasons), "workers": count(self.workers, missing="unknown"),
                    "failure_records": list(self.records),
                    "slowest_failure_s": round(self.slowest_failure_s, 3), "slowest_ok_s": round(self.slowest_ok_s, 3),
                    "key_switches": self.key_switches, "failure_times": list(self.failure_times)}


def summary_line(counts: dict, name: str = "load") -> str:
    """One line: the totals, the failures by kind, by finish reason and by worker (older OUT files
    have no finish reasons or workers: shown as such)."""
    line = f"{name}: {counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed in {counts.get('seconds', 0)} s"
    if counts.get("failed"):
        line += f"; by kind {counts.get('failures', {})}"
        if "finish_reasons" in counts:
            line += f", by finish reason {counts['finish_reasons']}, by worker {counts.get('workers', {})}"
    return line


def request(url: str, model: str, n: int, max_tokens: int, timeout: float, key: str | None = None) -> Outcome:
    """One streaming chat completion; its Outcome (why is None on success)."""
    body = {"model": model, "messages": [{"role": "user", "content": f"load request {n}"}], "max_tokens": max_tokens, "stream": True}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    out = Outcome()
    end = StreamEnd()
    tail = bytearray()
    deadline = time.monotonic() + timeout

    def failed(why: str) -> Outcome:
        out.why = why
        out.rid = end.rid
        out.raw = bytes(tail).decode(errors="replace")
        return out

    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            out.worker = response.headers.get(WORKER_HEADER)
            out.request_id = response.headers.get(REQUEST_ID_HEADER)
            if response.status != 200:
                return failed(f"status {response.status}")
            for raw in response:
                tail.extend(raw)
                del tail[:-RAW_TAIL_BYTES]
                if time.monotonic() > deadline:
                    return failed(f"{HANG}: still streaming after {timeout:.0f} s")
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    end.done = True
                    break
                end.see(json.loads(payload))
        why = stream_failure(end)
        if why is None:
            return out
        out.finish_reason = end.shown_finish()
        return failed(why)
    except urllib.error.HTTPError as exc:
        out.worker = exc.headers.get(WORKER_HEADER) if exc.headers else None
        out.request_id = exc.headers.get(REQUEST_ID_HEADER) if exc.headers else None
        return failed(f"status {exc.code}: {exc.read().decode(errors='replace')[:160]}")
    except TimeoutError as exc:
        return failed(f"{HANG}: {exc or 'timed out'} after {timeout:.0f} s")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None)
        if isinstance(reason, TimeoutError) or "timed out" in str(exc):
            return failed(f"{HANG}: {exc} after {timeout:.0f} s")
        return failed(f"{type(exc).__name__}: {exc}"[:200])


def one_request(url: str, model: str, n: int, max_tokens: int, timeout: float) -> str | None:
    """None on success, else why it failed ("<kind>: <detail>")."""
    return request(url, model, n, max_tokens, timeout).why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--model")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--out")
    parser.add_argument("--stop-file")
    parser.add_argument("--max-seconds", type=float, default=900)
    parser.add_argument("--pause-after-failure", type=float, default=0.0, metavar="S")
    parser.add_argument("--failure-log", metavar="FILE", help="append every failed request to FILE, one JSON line each "
                        "(time, kind, finish reason, worker, rid, x-request-id, the stream's last 2 KB)")
    parser.add_argument("--summary", metavar="OUT", help="print the summary line of an OUT file and exit")
    parser.add_argument("--keys-file", help="a JSON list of API keys (null: none), tried in order on a 401")
    args = parser.parse_args(argv)
    keys = json.loads(Path(args.keys_file).read_text()) if args.keys_file else [None]
    if args.summary:
        print(summary_line(json.loads(Path(args.summary).read_text()), Path(args.summary).stem))
        return 0
    if not (args.url and args.model and args.out and args.stop_file):
        parser.error("--url, --model, --out and --stop-file are required")
    counts = Counts(Path(args.failure_log) if args.failure_log else None)
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
            outcome = request(args.url, args.model, n, args.max_tokens, args.timeout, key)
            if not outcome.ok and (outcome.why or "").startswith("status 401"):
                # the router restarted on another key: the others, in order, at once
                for other in [k for k in keys if k != key]:
                    again = request(args.url, args.model, n, args.max_tokens, args.timeout, other)
                    if again.ok or not (again.why or "").startswith("status 401"):
                        key, outcome = other, again
                        with counts.lock:
                            counts.key_switches += 1
                        break
            if outcome.ok:
                counts.success(time.monotonic() - start)
            else:
                counts.failure(outcome, time.monotonic() - start)
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
    final = counts.snapshot(started) | {"done": True}
    out.write_text(json.dumps(final))
    print(summary_line(final, out.stem), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
