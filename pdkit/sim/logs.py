"""Log lines in SGLang's format.

SGLang prefixes every line with `[YYYY-MM-DD HH:MM:SS]`, and scheduler lines with the rank as
well (`[... TP0]`); uvicorn's access lines keep uvicorn's `INFO:     host:port - "..." 200 OK`
body. Tools that scrape engine logs (the kit's exporter, doctor) parse these, so the sim writes
the same shapes to stdout, one flushed line each, as journald expects.
"""

from __future__ import annotations

import logging
import re
import sys
from http import HTTPStatus

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class _SGLangFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = getattr(record, "rank_prefix", "")
        return f"[{self.formatTime(record, DATE_FORMAT)}{prefix}] {record.getMessage()}"


def setup_logging(level: str, http_level: str) -> tuple[logging.Logger, logging.LoggerAdapter, logging.Logger]:
    """Return (server logger, scheduler logger with the TP0 prefix, access logger)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_SGLangFormatter())
    root = logging.getLogger("pdkit.sim")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(_level(level))
    access = logging.getLogger("pdkit.sim.access")
    access.setLevel(_level(http_level))
    scheduler = logging.LoggerAdapter(logging.getLogger("pdkit.sim.scheduler"), {"rank_prefix": " TP0"})
    return root, scheduler, access


def _level(name: str) -> int:
    value = logging.getLevelName(name.upper())
    return value if isinstance(value, int) else logging.INFO


def access_line(peer: str, method: str, path: str, version: str, status: int) -> str:
    """uvicorn's access line body, e.g. `INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK`."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f'INFO:     {peer} - "{method} {path} HTTP/{version}" {status} {phrase}'.rstrip()


def format_prefill_batch(
    new_seq: int,
    new_token: int,
    token_usage: float,
    running: int,
    queued: int,
    cuda_graph: bool,
    input_throughput: float,
    pd_prefill_queues: tuple[int, int] | None = None,
    cached_tokens: int = 0,
) -> str:
    pd = ""
    if pd_prefill_queues is not None:
        # a PD prefill's queues, as SGLang 0.5.17's prefill writes them (tests/fixtures/.../*-prefill.log)
        pd = f"#bootstrap-req: {pd_prefill_queues[0]}, #inflight-req: {pd_prefill_queues[1]}, #optimistic-req: 0, "
    return (
        f"Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_tokens}, "
        f"token usage: {token_usage:.2f}, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, {pd}"
        f"cuda graph: {cuda_graph}, input throughput (token/s): {input_throughput:.2f}"
    )


def format_decode_batch(
    running: int,
    tokens: int,
    token_usage: float,
    cuda_graph: bool,
    gen_throughput: float,
    queued: int,
    pd_decode_queues: tuple[int, int] | None = None,
    prealloc_usage: float = 0.0,
) -> str:
    pd = ""
    if pd_decode_queues is not None:
        # pre-allocated usage: the KV pre-allocated for requests not running yet, over the pool
        pd = (
            f"pre-allocated usage: {prealloc_usage:.2f}, #prealloc-req: {pd_decode_queues[0]}, "
            f"#transfer-req: {pd_decode_queues[1]}, #retracted-req: 0, "
        )
    return (
        f"Decode batch, #running-req: {running}, #token: {tokens}, token usage: {token_usage:.2f}, {pd}"
        f"cuda graph: {cuda_graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queued}"
    )


_KEY = re.compile(r"(#[a-z][a-z-]*|[a-z][a-z ()/-]*[a-z)]): ")


def line_keys(line: str) -> list[str]:
    """The `key: ` labels of a batch log line, in order (`#new-seq`, `token usage`, ...)."""
    body = line.split(" batch", 1)[-1]
    return [k.strip() for k in _KEY.findall(body)]


def format_keys(source: str) -> list[str]:
    """The literal `#key: ` labels of SGLang's batch-line f-string source (the metric catalogue's
    log_formats, read from the wheel by pdkit/contract/sglang_metrics.py), in order. The parts
    SGLang builds elsewhere (`{token_usage_msg}`, `{iter_msg}`) are not in the source: only the
    labels written there are returned."""
    literal = re.sub(r"\{[^{}]*\}", " ", source.split(":", 2)[-1])
    return re.findall(r"#[a-z][a-z-]*(?=: )", literal)
