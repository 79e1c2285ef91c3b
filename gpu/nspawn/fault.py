"""A prefill killed under load: the counters, the time to be back, and every request's outcome.

    python3 gpu/nspawn/fault.py metrics URL... [--raw PREFIX]    # the failure counters of each /metrics
    python3 gpu/nspawn/fault.py wait-health URL --since T --limit S  # waits for URL to answer 200, prints when
    python3 gpu/nspawn/fault.py report LOAD.json --kill T [--back T] [--budget-s 20]

`gpu/nspawn/device_pair.sh fault` runs these on the lent machine around a `systemctl kill -s KILL`
of one prefill (docs/gpu.md, "Prefill kill with the fault budget"); stdlib only (the image's
python3). LOAD.json is gpu/nspawn/outage_client.py's record: [start, end, ok, why] per request.

What the fault budget promises (docs/rolling.md, "The fault budget"): no request waits longer than
`budget_s`, and every failure is an error the client sees (an error status or an error event), not
a hang. `report` sorts each request into one outcome (`outcome`, the one rule) and says which
failures broke it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# the verdict's kinds, one rule for every client (stdlib only; run from the repository root)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pdkit.bench.stats import ABORTED, EMPTY, failure_kind  # noqa: E402
from tests.lab.loadclient import HANG  # noqa: E402

# the counters that say which bounded wait failed a request (engines: SGLang 0.5.17's names with
# and without the `sglang:` prefix; router: sglang-router 0.3.2 / smg's breaker, retries, errors)
WATCHED = re.compile(r"bootstrap_failed|transfer_failed|aborted_requests|num_requests_total|cb_|circuit|retr|error|fail")

OUTCOMES = ("ok", "error status", "error event", "abort", "hang", "empty stream", "broken stream")


def outcome(ok: bool, why: str) -> str:
    """One request's outcome from its verdict (tests/lab/loadclient.py, pdkit.bench.stats' kinds).

    `error status`: a non-200; `error event`: the stream's error event; `abort`: a stream that
    ended with finish_reason "abort"; `hang`: cut at the client's timeout; `empty stream`: [DONE]
    without output (issue 30 item 8); `broken stream`: anything else that did not end with [DONE]
    (connection reset, EOF).
    """
    if ok:
        return "ok"
    kind = failure_kind(why)
    if kind.startswith("status "):
        return "error status"
    if kind == ABORTED:
        return "error event" if why.split(":", 2)[1].strip().startswith("error event") else "abort"
    if kind == HANG:
        return "hang"
    if kind.startswith(EMPTY):
        return "empty stream"
    return "broken stream"


def report(requests: list[list], kill: float, back: float | None, budget_s: float) -> dict:
    """Pure: the figures of one kill from outage_client's [start, end, ok, why, {detail}] per request (Unix seconds)."""
    by: dict[str, int] = {k: 0 for k in OUTCOMES}
    failures = []
    for r in requests:
        start, end, ok, why = r[:4]
        detail = r[4] if len(r) > 4 and isinstance(r[4], dict) else {}
        kind = outcome(ok, why)
        by[kind] += 1
        if kind != "ok":
            failures.append({"start_after_kill_s": round(start - kill, 3), "took_s": round(end - start, 3),
                             "outcome": kind, "why": why, "finish_reason": detail.get("finish_reason"),
                             "rid": detail.get("rid"), "raw": detail.get("raw", "")})
    failures.sort(key=lambda f: f["start_after_kill_s"])
    latencies = sorted(r[1] - r[0] for r in requests)
    # requests that overlap the kill or start after it: the ones the fault could reach
    reached = [r for r in requests if r[1] >= kill]
    slow_ok = [round(r[1] - r[0], 3) for r in reached if r[2] and r[1] - r[0] > budget_s]
    slowest = max(failures, key=lambda f: f["took_s"], default=None)
    return {
        "requests": len(requests), "outcomes": by, "failed": len(failures),
        "slowest_failure_s": slowest and slowest["took_s"],
        "over_budget": [f for f in failures if f["took_s"] > budget_s], "ok_over_budget_s": sorted(slow_ok, reverse=True),
        "longest_request_s": round(latencies[-1], 3) if latencies else None,
        "back_after_s": None if back is None else round(back - kill, 1),
        "budget_s": budget_s, "failures": failures,
    }


def _get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def cmd_metrics(args: argparse.Namespace) -> int:
    for i, url in enumerate(args.urls):
        status, text = _get(url, 5)
        print(f"## {url} {status} {time.time():.3f}")
        if args.raw:  # the whole text too, one file per URL in the order given
            Path(f"{args.raw}-{i}.prom").write_text(f"# {url}\n{text}")
        for line in text.splitlines():
            if line and not line.startswith("#") and WATCHED.search(line.split(" ")[0]):
                print(line)
    return 0


def cmd_wait_health(args: argparse.Namespace) -> int:
    """Print the Unix time URL first answered 200 (and how long after --since); 1 if not within --limit."""
    while time.time() - args.since < args.limit:
        status, _ = _get(args.url, 2)
        if status == 200:
            now = time.time()
            print(f"{now:.3f} {args.url} 200 after {now - args.since:.1f} s")
            return 0
        time.sleep(0.5)
    print(f"{args.url} not 200 within {args.limit:.0f} s")
    return 1


def cmd_report(args: argparse.Namespace) -> int:
    data = json.loads(Path(args.load).read_text())
    out = report(data["requests"], args.kill, args.back, args.budget_s)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    o = out["outcomes"]
    print(f"{Path(args.load).stem}: {out['requests']} requests, {out['failed']} failed "
          f"({', '.join(f'{k} {v}' for k, v in o.items() if v and k != 'ok')}); slowest failure {out['slowest_failure_s']} s; "
          f"{len(out['over_budget'])} failures and {len(out['ok_over_budget_s'])} successes over {args.budget_s:.0f} s; "
          f"longest request {out['longest_request_s']} s; prefill back after {out['back_after_s']} s")
    for f in out["failures"]:
        print(f"  +{f['start_after_kill_s']:7.2f} s  took {f['took_s']:7.3f} s  {f['outcome']:<13}  "
              f"finish {f['finish_reason']}  rid {f['rid']}  {f['why'][:160]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("metrics")
    p.add_argument("urls", nargs="+")
    p.add_argument("--raw", metavar="PREFIX", help="also write each whole /metrics to PREFIX-N.prom")
    p = sub.add_parser("wait-health")
    p.add_argument("url")
    p.add_argument("--since", type=float, default=time.time())
    p.add_argument("--limit", type=float, default=240)
    p = sub.add_parser("report")
    p.add_argument("load")
    p.add_argument("--kill", type=float, required=True)
    p.add_argument("--back", type=float)
    p.add_argument("--budget-s", type=float, default=20)
    p.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    return {"metrics": cmd_metrics, "wait-health": cmd_wait_health, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
