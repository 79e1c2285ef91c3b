"""Per-batch log lines -> figures: lines written by the sim and hand-written SGLang lines."""

from __future__ import annotations

import re

import pytest

from pdkit.agent.exporter.logs import parse_batch_line

from .support import data_text


def test_sim_decode_lines():
    lines = data_text("sim_decode_batch.log").splitlines()
    assert lines
    for line in lines:
        got = parse_batch_line(line)
        assert got is not None and got["kind"] == "decode", line
        # the figures, read again with one fixed pattern
        m = re.search(r"#running-req: (\d+), .*cuda graph: (True|False), gen throughput \(token/s\): ([\d.]+), "
                      r"#queue-req: (\d+)", line)
        assert m, line
        assert got["running_requests"] == int(m.group(1))
        assert got["cuda_graph"] is (m.group(2) == "True")
        assert got["gen_throughput"] == float(m.group(3))
        assert got["queued_requests"] == int(m.group(4))
        assert {"prealloc_requests", "transfer_requests", "retracted_requests", "tokens", "token_usage"} <= set(got)


def test_sim_prefill_lines():
    for line in data_text("sim_prefill_batch.log").splitlines():
        got = parse_batch_line(line)
        assert got is not None and got["kind"] == "prefill", line
        m = re.search(r"input throughput \(token/s\): ([\d.]+)", line)
        assert got["input_throughput"] == float(m.group(1))
        assert isinstance(got["cuda_graph"], bool)
        assert "inflight_requests" in got and "new_tokens" in got


@pytest.mark.parametrize("line, expected", [
    # SGLang 0.5.x, DP attention rank prefix, speculative accept length, trailing timestamp
    ("[2026-11-29 10:00:00 DP1 TP0] Decode batch, #running-req: 37, #token: 9216, token usage: 0.08, "
     "accept len: 2.41, cuda graph: True, gen throughput (token/s): 2291.37, #queue-req: 3, "
     "timestamp: 2026-11-29T10:00:00.123456",
     {"kind": "decode", "running_requests": 37, "tokens": 9216, "token_usage": 0.08, "accept_length": 2.41,
      "cuda_graph": True, "gen_throughput": 2291.37, "queued_requests": 3}),
    # PD decode engine
    ("[2026-11-29 10:00:00 TP0] Decode batch, #running-req: 1, #token: 44, token usage: 0.00, "
     "pre-allocated usage: 0.00, #prealloc-req: 2, #transfer-req: 1, #retracted-req: 0, cuda graph: False, "
     "gen throughput (token/s): 45.17, #queue-req: 0",
     {"kind": "decode", "running_requests": 1, "tokens": 44, "token_usage": 0.0, "prealloc_requests": 2,
      "transfer_requests": 1, "retracted_requests": 0, "cuda_graph": False, "gen_throughput": 45.17,
      "queued_requests": 0}),
    # 0.4.x: "batch." and no cuda graph field
    ("[2024-10-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 40, token usage: 0.00, "
     "gen throughput (token/s): 5.69, #queue-req: 0",
     {"kind": "decode", "running_requests": 1, "tokens": 40, "token_usage": 0.0, "gen_throughput": 5.69,
      "queued_requests": 0}),
    ("[2024-10-01 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 1, "
     "cache hit rate: 14.29%, token usage: 0.00, #running-req: 0, #queue-req: 0",
     {"kind": "prefill", "new_seqs": 1, "new_tokens": 6, "cached_tokens": 1, "token_usage": 0.0,
      "running_requests": 0, "queued_requests": 0}),
    ("[2026-11-29 10:00:00 TP0] Prefill batch, #new-seq: 4, #new-token: 8192, #cached-token: 0, token usage: 0.12, "
     "#running-req: 3, #queue-req: 12, #prealloc-req: 5, #inflight-req: 2, cuda graph: False, "
     "input throughput (token/s): 40123.45",
     {"kind": "prefill", "new_seqs": 4, "new_tokens": 8192, "cached_tokens": 0, "token_usage": 0.12,
      "running_requests": 3, "queued_requests": 12, "prealloc_requests": 5, "inflight_requests": 2,
      "cuda_graph": False, "input_throughput": 40123.45}),
])
def test_sglang_lines(line, expected):
    assert parse_batch_line(line) == expected


@pytest.mark.parametrize("line", [
    "",
    '[2026-11-29 10:00:00] INFO:     127.0.0.1:5 - "GET /metrics HTTP/1.1" 200 OK',
    "[2026-11-29 10:00:00] The server is fired up and ready to roll!",
    "[2026-11-29 10:00:00 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='x' "
    "decode_req.req.bootstrap_room=1 with exception KVTransferError(bootstrap_room=1): Failed to get kvcache",
    "[2026-11-29 10:00:00 TP0] Decode batch, nothing we know",
    "Decode batches were slow",
])
def test_other_lines_are_not_batches(line):
    assert parse_batch_line(line) is None
