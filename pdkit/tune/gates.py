"""The soak gate of a candidate (pure HTTP); its correctness gate is pdkit/clients/answers.py.

Soak: load at the target concurrency for a while, watching the engines'
failure counters, the failures the router hands back, and the wedge condition (requests
running, no token produced). Comparison and verdicts are pure functions, tested without a
cluster; the HTTP parts are tested against sim engines behind the real router.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdkit.agent.health import http_request
from pdkit.bench.load import LoadThread, measured_target
from pdkit.bench.measure import Measured
from pdkit.roll import metric_sums
from pdkit.upstream.metricnames import FAILURE_COUNTERS, SGLANG

# a wedge needs work held and no token moved: these counters move with every decode step
PROGRESS_COUNTERS = (SGLANG["realtime_tokens"], SGLANG["cuda_graph_passes"], SGLANG["generation_tokens"])


# ------------------------------------------------------------------ soak


def engine_sample(urls: dict[str, str], timeout_s: float = 5.0) -> dict[str, dict[str, float] | None]:
    """label -> {metric: sum} of the failure, running and progress series (None: /metrics unreadable)."""
    names = (*FAILURE_COUNTERS, SGLANG["running"], *PROGRESS_COUNTERS)
    out: dict[str, dict[str, float] | None] = {}
    for label, url in urls.items():
        status, body = http_request(f"{url}/metrics", timeout=timeout_s)
        out[label] = metric_sums(body, names) if status == 200 else None
    return out


@dataclass
class WedgeWatch:
    """Per engine: since when it has held running requests without a progress counter moving."""

    window_s: float
    stuck_since: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def observe(self, now: float, sample: dict[str, dict[str, float] | None]) -> list[str]:
        """Engines wedged at NOW (running > 0 and no progress for window_s)."""
        wedged = []
        for label, figures in sample.items():
            if figures is None:
                continue
            progress = sum(figures.get(n, 0.0) for n in PROGRESS_COUNTERS)
            running = figures.get(SGLANG["running"], 0.0)
            moved = label not in self.last or progress != self.last[label]
            self.last[label] = progress
            if running <= 0 or moved:
                self.stuck_since.pop(label, None)
                continue
            since = self.stuck_since.setdefault(label, now)
            if now - since >= self.window_s:
                wedged.append(label)
        return wedged


def counter_moves(before: dict[str, dict[str, float] | None],
                  after: dict[str, dict[str, float] | None]) -> dict[str, dict[str, float]]:
    """Failure counters that went up between two samples, per engine."""
    out = {}
    for label, a in before.items():
        b = after.get(label)
        if a is None or b is None:
            continue
        moved = {n: b.get(n, 0.0) - a.get(n, 0.0) for n in FAILURE_COUNTERS if b.get(n, 0.0) > a.get(n, 0.0)}
        if moved:
            out[label] = moved
    return out


def soak(target: str | Measured, headers: dict[str, str], engine_urls: dict[str, str], seconds: float, concurrency: int,
         input_len: int, output_len: int, wedge_window_s: float, interval_s: float = 0.5,
         progress: Callable[[str], None] = lambda _m: None) -> tuple[bool, str, dict[str, Any]]:
    """(ok, why, figures): load for SECONDS (TARGET: the router's URL, or a Measured: the router or
    the target's own PD pairs) while ENGINE_URLS are watched; fails at once on a wedge, at the end
    on failures."""
    watch = WedgeWatch(wedge_window_s)
    before = engine_sample(engine_urls)
    unreadable = [k for k, v in before.items() if v is None]
    if unreadable:
        return False, f"/metrics unreadable before the soak on {', '.join(unreadable)}", {}
    measured = measured_target(target, headers)
    load = LoadThread(measured, headers, concurrency, input_len, output_len).start()
    started = time.monotonic()
    wedged: list[str] = []
    try:
        while time.monotonic() - started < seconds:
            time.sleep(interval_s)
            wedged = watch.observe(time.monotonic(), engine_sample(engine_urls))
            if wedged:
                break
    finally:
        # a wedged engine never finishes what it holds: hang up, so that the router and the
        # engine drop those requests and the rollback's drain can empty it
        load.stop(cancel=bool(wedged))
    after = engine_sample(engine_urls)
    figures = {"seconds": round(time.monotonic() - started, 1), "ok": load.ok, "failed": len(load.failed),
               "errors": load.failed[:5], "concurrency": concurrency, "via": measured.via}
    where = "through the router" if measured.via == "router" else f"to {', '.join(r.label for r in measured.routes)}"
    if wedged:
        figures["wedged"] = wedged
        return False, (f"wedged: {', '.join(wedged)} held running requests and produced no token for "
                       f"{wedge_window_s:g} s (after {figures['seconds']:.0f} s at C={concurrency}); doctor's queues "
                       "check calls this 'wedged'"), figures
    moved = counter_moves(before, after)
    if moved:
        figures["failure_counters"] = moved
        return False, f"engine failure counters moved during the soak: {moved}", figures
    if load.failed:
        return False, (f"{len(load.failed)} of {load.ok + len(load.failed)} soak requests failed {where}: "
                       f"{load.failed[:3]}"), figures
    if load.ok == 0 and seconds > 0:
        return False, f"no soak request finished in {figures['seconds']:.0f} s at C={concurrency}", figures
    return True, (f"{load.ok} requests at C={concurrency} {where} over {figures['seconds']:.0f} s: no failure, "
                  "no failure counter moved, no wedge"), figures
