"""Constant streaming load through a router, every request timed: what a roll with downtime costs.

    python3 gpu/nspawn/outage_client.py --url http://127.0.0.1:8000 --model NAME --concurrency 8 \
        --out load.json --stop-file STOP [--max-tokens 32] [--timeout 60] [--max-seconds 900]
    python3 gpu/nspawn/outage_client.py --summary load.json     # the figures again, one line

On a one-node cluster `pdkit roll --allow-downtime` takes the router's only prefill and decode out
(docs/rolling.md), so requests must fail while the node is out. What the users need to know is
how long, and how: every request either answers or gets an error quickly, none hangs. This client
(stdlib only: it runs on the lent machine's own Python) keeps CONCURRENCY streaming chat
completions in flight until STOP exists and records each one: start and end (Unix time, so the
figures line up with `pdkit roll --report`), the outcome, and why it failed. A request fails on a
non-200 answer, a broken connection, or a stream that is not a complete answer, judged by the
rule every client shares (pdkit.bench.stats stream_failure: `aborted`, `no [DONE]`,
`empty (<finish reason>)`, see tests/lab/loadclient.py); one not finished after --timeout
seconds is a **hang** (counted apart). After a failure the worker waits
--backoff seconds (default 0.25) before its next request, as a client would, so a down router is
not hammered by a tight loop; the failed-request count therefore measures the outage's length,
not the router's speed at saying no.

OUT (rewritten every second, then once more at the end) holds the counts and a summary:

- `outage_s`: the longest stretch with no successful answer, from the end of the last success
  before a failure to the end of the first success after it (what a user sees);
- `failure_span_s`: first failed request's start to last failed request's end;
- `failed_latency_s`: how long failed requests took to fail (max, p50): "quickly" is this;
- `hangs`: requests cut at --timeout; `max_request_s`: the longest request of all;
- `why`: the failures by kind; `finish_reasons`: by the finish reason their streams named
  (`error 500` for an error event); `workers`: by the worker that served them (smg's
  x-smg-routed-worker-id; `unknown` where the router names none);
- `requests`: every request as [start, end, ok, why] (why empty on success), start/end rounded to ms;
  a failure adds a fifth element {kind, finish_reason, worker, rid, request_id, raw}: SGLang's rid
  (grep the engines' journals for it), the router's x-request-id, a failed stream's last 2 KB.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

# one streaming request and its verdict, as the lab's load client makes it (run from the repo root)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pdkit.bench.stats import count, failure_kind  # noqa: E402
from tests.lab.loadclient import HANG, request  # noqa: E402


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def summarise(requests: list[list], started: float, ended: float) -> dict:
    """Pure: the figures of OUT from [start, end, ok, why] per request (Unix seconds)."""
    done = sorted(requests, key=lambda r: r[1])
    ok_ends = [r[1] for r in done if r[2]]
    failed = [r for r in done if not r[2]]
    hangs = [r for r in failed if str(r[3]).startswith(HANG)]
    out: dict = {
        "requests_total": len(done), "ok": len(ok_ends), "failed": len(failed), "hangs": len(hangs),
        "seconds": round(ended - started, 1),
        "max_request_s": round(max((r[1] - r[0] for r in done), default=0.0), 3),
        "failed_latency_s": {"max": None, "p50": None},
        "outage_s": 0.0, "outage_from": None, "outage_to": None, "failure_span_s": 0.0, "why": {},
    }
    if failed:
        latencies = [r[1] - r[0] for r in failed]
        out["failed_latency_s"] = {"max": round(max(latencies), 3), "p50": round(_pct(latencies, 0.5) or 0.0, 3)}
        out["failure_span_s"] = round(max(r[1] for r in failed) - min(r[0] for r in failed), 3)
        out["why"] = count([failure_kind(str(r[3])) for r in failed])
        # older files have no fifth element: their finish reasons and workers are not known
        details = [r[4] for r in failed if len(r) > 4 and isinstance(r[4], dict)]
        if details:
            out["finish_reasons"] = count([d.get("finish_reason") for d in details if d.get("finish_reason")])
            out["workers"] = count([d.get("worker") for d in details], missing="unknown")
        # the longest stretch without a successful answer that holds a failure: between consecutive
        # successful ends (the load's start and end close the first and last stretch)
        marks = [started, *ok_ends, ended]
        best = (0.0, None, None)
        for a, b in zip(marks, marks[1:]):
            if any(a <= r[1] <= b for r in failed) and b - a > best[0]:
                best = (b - a, a, b)
        out["outage_s"] = round(best[0], 3)
        out["outage_from"] = best[1] and round(best[1], 3)
        out["outage_to"] = best[2] and round(best[2], 3)
    return out


def line(summary: dict, name: str = "load") -> str:
    f = summary["failed_latency_s"]
    return (f"{name}: {summary['ok']} ok, {summary['failed']} failed, {summary['hangs']} hung in {summary['seconds']} s; "
            f"outage {summary['outage_s']} s (no successful answer), failures spanning {summary['failure_span_s']} s, "
            f"each failed in max {f['max']} s / p50 {f['p50']} s; longest request {summary['max_request_s']} s; why {summary['why']}"
            + (f"; by finish reason {summary['finish_reasons']}, by worker {summary.get('workers', {})}"
               if "finish_reasons" in summary else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=60.0, help="a request still open after this is a hang")
    ap.add_argument("--backoff", type=float, default=0.25, help="a worker's pause after a failed request")
    ap.add_argument("--out")
    ap.add_argument("--stop-file")
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--summary", metavar="OUT", help="print the summary line of a finished run and exit")
    args = ap.parse_args(argv)
    if args.summary:
        data = json.loads(Path(args.summary).read_text())
        print(line(data["summary"], Path(args.summary).stem))
        return 0
    if not (args.url and args.model and args.out and args.stop_file):
        ap.error("--url, --model, --out and --stop-file are required")
    lock = threading.Lock()
    requests: list[list] = []
    started = time.time()
    stop = threading.Event()
    numbers = iter(range(10**9))

    def worker() -> None:
        while not stop.is_set():
            with lock:
                n = next(numbers)
            t0 = time.time()
            outcome = request(args.url, args.model, n, args.max_tokens, args.timeout)
            entry = [round(t0, 3), round(time.time(), 3), outcome.ok, outcome.why or ""]
            if not outcome.ok:
                entry.append({"kind": outcome.kind, "finish_reason": outcome.finish_reason, "worker": outcome.worker,
                              "rid": outcome.rid, "request_id": outcome.request_id, "raw": outcome.raw})
            with lock:
                requests.append(entry)
            if not outcome.ok:
                stop.wait(args.backoff)

    out = Path(args.out)

    def write(final: bool) -> None:
        with lock:
            snapshot = list(requests)
        data = {"url": args.url, "concurrency": args.concurrency, "max_tokens": args.max_tokens, "timeout_s": args.timeout,
                "backoff_s": args.backoff, "started": round(started, 3), "done": final,
                "summary": summarise(snapshot, started, time.time()), "requests": snapshot}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(out)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    stop_file = Path(args.stop_file)
    while not stop_file.exists() and time.time() - started < args.max_seconds:
        write(False)
        time.sleep(1)
    stop.set()
    for t in threads:
        t.join(timeout=args.timeout + 5)  # requests in flight finish and are counted
    write(True)
    print(line(json.loads(out.read_text())["summary"], out.stem))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
