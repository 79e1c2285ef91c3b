"""SGLang's per-batch log lines -> figures. Pure functions.

The scheduler writes, every `--decode-log-interval` decode steps and for every prefill batch
(SGLang's metrics_reporter.py in the pinned wheels; the formats are in pdkit/upstream/data/metric_catalogue.json):

    [2026-11-29 18:58:35 TP0] Decode batch, #running-req: 8, #token: 361, token usage: 0.00,
        cuda graph: True, gen throughput (token/s): 110.70, #queue-req: 0
    [2026-11-29 18:58:35 TP0] Prefill batch, #new-seq: 1, #new-token: 42, #cached-token: 0,
        token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False,
        input throughput (token/s): 1234.56

(one line each). The fields between vary with the release and the mode (PD adds
`#prealloc-req`, `#transfer-req`, `#inflight-req`, speculative decoding `accept len`, newer
releases a trailing `timestamp: ...`), and 0.4.x wrote `Decode batch.` — so the line is split
into `name: value` fields instead of being matched by one fixed pattern, and the known names
are mapped to stable keys.
"""

from __future__ import annotations

import re
from typing import Any

BATCH_LINE = re.compile(r"\b(Prefill|Decode) batch[.,]\s*(.*)$")

# field name as SGLang writes it -> key
FIELDS: dict[str, str] = {
    "#running-req": "running_requests",
    "#queue-req": "queued_requests",
    "gen throughput (token/s)": "gen_throughput",
    "input throughput (token/s)": "input_throughput",
    "cuda graph": "cuda_graph",
    "token usage": "token_usage",
    "#token": "tokens",
    "#new-seq": "new_seqs",
    "#new-token": "new_tokens",
    "#cached-token": "cached_tokens",
    "#prealloc-req": "prealloc_requests",
    "#inflight-req": "inflight_requests",
    "#transfer-req": "transfer_requests",
    "#retracted-req": "retracted_requests",
    "accept len": "accept_length",
}


def _value(text: str) -> bool | float | None:
    text = text.strip()
    if text == "True":
        return True
    if text == "False":
        return False
    try:
        return float(text)
    except ValueError:
        return None


def parse_batch_line(line: str) -> dict[str, Any] | None:
    """{"kind": "decode"|"prefill", <key>: value, ...} for a per-batch line, else None.

    Numbers are floats, `cuda graph` a bool; fields the line does not carry are absent.
    """
    match = BATCH_LINE.search(line)
    if match is None:
        return None
    out: dict[str, Any] = {"kind": match.group(1).lower()}
    for part in match.group(2).split(","):
        name, sep, raw = part.partition(":")
        if not sep:
            continue
        key = FIELDS.get(name.strip())
        if key is None:
            continue
        value = _value(raw)
        if value is not None:
            out[key] = value
    # a line that matched the marker but carries none of the figures is not a batch line
    return out if len(out) > 1 else None


__all__ = ["BATCH_LINE", "FIELDS", "parse_batch_line"]
