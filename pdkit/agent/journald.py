"""journald on every host the kit manages: sized so the kit's own evidence survives a day (issue 42 item 2).

On the lent GPU box the container's journal was capped at 32 MB and the router logged every request
and every 503 (36,663 of the 43,317 lines kept were the router's): engine starts and the readiness
line rotated away within minutes. Two levers, both decided here and in pdkit.render.flags:

- the routers run at `--log-level warn` (ROUTER_LOG_LEVEL; pdkit_router.log_level may say otherwise,
  and the journal is then sized for the router's request lines too): a served request then logs
  nothing (measured below), so request logging is the engines' alone;
- a journald drop-in (JOURNALD_DROPIN_PATH) sizes the journal for a day of that at the cluster's
  target concurrency, sorting after the lab's and the GPU rig's `pdkit-lab.conf` (SystemMaxUse=32M,
  pdkit/lab/rootfs.py, gpu/nspawn/build.py): drop-ins are read in file-name order, the last wins.

Every figure is measured; docs/rolling.md "Evidence that survives" has the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# sorts after every `pdkit-*.conf` and distribution `NN-*.conf` drop-in: journald reads them by name, the last wins
JOURNALD_DROPIN_PATH = "/etc/systemd/journald.conf.d/zz-pdkit.conf"
JOURNALD_UNIT = "systemd-journald.service"


def restart_needed(paths: set[str] | list[str]) -> bool:
    """Pure: journald (systemd 252 reads its drop-ins only at start) restarts only when its drop-in
    was written or removed: by a deploy (roles/services.py) or a restore (pdkit/agent/releases.py)."""
    return JOURNALD_DROPIN_PATH in set(paths)

# the routers' level unless pdkit_router.log_level says otherwise; both pinned routers' parsers take these
# (pdkit/upstream/parser_table.json). At info each served request is 2 lines (868 B smg 1.13.0, 886 B sglang-router
# 0.3.2), at warn none (benchmarks/router_log_bytes.py; docs/rolling.md "Evidence that survives");
# failures (503s, dead workers) still log at warn and error
ROUTER_LOG_LEVEL = "warn"
ROUTER_LOG_LEVELS = ("error", "warn", "info", "debug")
# a served request's router lines at info (the larger router's) and how many; debug is not measured: sized as info
ROUTER_INFO_REQUEST_B, ROUTER_INFO_LINES = 886, 2
ROUTER_LOGS_REQUESTS = ("info", "debug")

# journal bytes per entry beyond its message: 60,382 stdout entries of 430 B grew system.journal by
# 41.9 MB (695 B each) under systemd 252's journald (compact, keyed-hash, zstd files: systemd-cat into
# a private systemd-journald, docs/rolling.md "Evidence that survives"); the GPU box's 32 MiB held
# 43,317 lines (774 B each, mostly ~430 B router lines)
ENTRY_OVERHEAD_B = 265
# what one served request logs through the router at --log-level warn: nothing (smg 1.13.0 and
# sglang-router 0.3.2 both; benchmarks/router_log_bytes.py: at info 868 B / 886 B in 2 lines)
ROUTER_REQUEST_B = 0
# SGLang 0.5.17's lines per request on a PD pair, from the H200 logs in
# tests/fixtures/sglang-0.5.17-h200-pd-one-gpu/: one uvicorn access line ("POST /generate", ~80 B)
# on the prefill and one on the decode per request, and a "Prefill batch" line (~300 B) per 3.4
# requests at C=1/16/64 (258 batches for 886 requests)
ENGINE_LINES_PER_REQUEST = ((80, 2.0), (300, 258 / 886))
# "Decode batch" lines (~250 B) come every --decode-log-interval steps (SGLang's default 40), not per
# request: at ~100 decode steps a second (10 ms a step), 2.5 lines a second per decode engine
DECODE_LINE_B = 250
DECODE_LINES_PER_S = 100 / 40
# the shortest mean request the sizing assumes: shorter requests mean more of them (the H200's
# 128-in/256-out requests at C=64 took longer; a shorter mean only raises the figure)
REQUEST_S = 2.0
# the concurrency sized for when pdkit_cluster.target_concurrency is unset: the kit's bench's top level
DEFAULT_CONCURRENCY = 64
# how long the evidence must survive (issue 42: "a day of request logging")
KEEP_S = 86_400
# never below what a busy start-up logs (an engine's start is ~1,000 lines; every unit's starts over a day of rolls)
FLOOR_MB = 1024
# journald's own rate limit (journald.conf(5): 10,000 messages per 30 s per service) is kept unless a
# unit's lines per interval at the target rate come within half of it
RATE_INTERVAL_S = 30
RATE_BURST = 10_000


@dataclass(frozen=True)
class JournalSize:
    requests_per_s: float
    bytes_per_request: float
    engine_step_bytes_per_s: float
    bytes_per_day: float
    max_use_mb: int
    rate_burst: int


def entry_bytes(message_b: float) -> float:
    """Journal bytes of one entry whose message is MESSAGE_B bytes."""
    return message_b + ENTRY_OVERHEAD_B


def journal_size(concurrency: int | None, decode_engines: int = 1,
                 router_log_level: str | None = None) -> JournalSize:
    """Pure: the journal a host needs for KEEP_S of request logging at CONCURRENCY (the whole cluster's
    rate on one host: on a one-box cluster that is exact, elsewhere it errs on the large side).
    ROUTER_LOG_LEVEL: the host's router's level (None: no router); at info or debug its request lines count."""
    rps = (concurrency or DEFAULT_CONCURRENCY) / REQUEST_S
    router_b: float
    if router_log_level in ROUTER_LOGS_REQUESTS:
        router_b = ROUTER_INFO_REQUEST_B + ROUTER_INFO_LINES * ENTRY_OVERHEAD_B
    else:
        router_b = entry_bytes(ROUTER_REQUEST_B) if ROUTER_REQUEST_B else 0.0
    per_request = router_b + sum(entry_bytes(size) * count for size, count in ENGINE_LINES_PER_REQUEST)
    step = entry_bytes(DECODE_LINE_B) * DECODE_LINES_PER_S * decode_engines
    per_day = (rps * per_request + step) * KEEP_S
    max_use_mb = max(FLOOR_MB, math.ceil(per_day / 2**20 / 256) * 256)
    # the busiest unit's lines in one rate-limit interval, with room to spare
    lines = rps * max(count for _, count in ENGINE_LINES_PER_REQUEST) * RATE_INTERVAL_S
    burst = max(RATE_BURST, math.ceil(2 * lines / 1000) * 1000)
    return JournalSize(rps, per_request, step, per_day, max_use_mb, burst)


def journald_conf(size: JournalSize) -> str:
    """The drop-in's text: a persistent journal of SIZE, journald's rate limit stated."""
    return (
        "# Rendered by pdkit (pdkit/journald.py; docs/rolling.md \"Evidence that survives\")\n"
        f"# a day of request logging: {size.requests_per_s:g} requests/s x {size.bytes_per_request:.0f} B"
        f" + {size.engine_step_bytes_per_s:.0f} B/s of decode lines = {size.bytes_per_day / 2**20:.0f} MiB\n"
        "[Journal]\n"
        "Storage=persistent\n"
        f"SystemMaxUse={size.max_use_mb}M\n"
        f"RateLimitIntervalSec={RATE_INTERVAL_S}s\n"
        f"RateLimitBurst={size.rate_burst}\n"
    )
