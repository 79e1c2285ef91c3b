"""gpu/nspawn/fault.py: each request's outcome from the load client's own verdicts, and a kill's figures.

The outcomes are read from the texts tests/lab/loadclient.py's one_request writes, so these run the
real client against a real HTTP server that answers each way a router can (error status, error
event, an empty 200 stream, a stream that stops sending, a cut connection): a changed text fails here.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "nspawn"))
import fault  # noqa: E402

from tests.lab.loadclient import one_request  # noqa: E402

CHUNK = 'data: {"choices": [{"delta": {"content": "x"}, "finish_reason": null}]}\n\n'


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "503":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"error": "No available servers"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if mode == "ok":
            self.wfile.write((CHUNK + "data: [DONE]\n\n").encode())
        elif mode == "abort":
            self.wfile.write((CHUNK + 'data: {"choices": [{"delta": {}, "finish_reason": "abort"}]}\n\ndata: [DONE]\n\n').encode())
        elif mode == "error event":
            self.wfile.write((CHUNK + 'data: {"error": {"message": "Lost connection with prefill instance"}}\n\n').encode())
        elif mode == "empty":
            self.wfile.write(b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        elif mode == "stall":
            self.wfile.write(CHUNK.encode())
            self.wfile.flush()
            time.sleep(3)
        elif mode == "cut":
            self.wfile.write(CHUNK.encode())


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


@pytest.mark.parametrize("mode,want", [("ok", "ok"), ("503", "error status"), ("error event", "error event"), ("abort", "abort"),
                                        ("empty", "empty stream"), ("stall", "hang"), ("cut", "broken stream")])
def test_outcome_of_each_answer(server, mode, want):
    server.mode = mode
    why = one_request(f"http://127.0.0.1:{server.server_port}", "m", 0, 4, timeout=1.0)
    assert fault.outcome(why is None, why or "") == want, why


def test_report_of_a_kill():
    kill = 1000.0
    requests = [
        [990.0, 991.0, True, ""],                                 # before the kill
        [999.0, 1003.5, False, "aborted: error event 500: Lost connection", {"finish_reason": "error 500", "rid": "r1"}],
        [999.5, 1119.5, False, "hang: timed out after 120 s"],    # the trap: waited the client out
        [1001.0, 1001.2, False, "status 503: no prefill"],
        [1002.0, 1030.0, True, ""],                               # answered, but over the budget
        [1040.0, 1041.0, True, ""],
    ]
    r = fault.report(requests, kill, back=1082.0, budget_s=20)
    assert r["outcomes"] == {"ok": 3, "error status": 1, "error event": 1, "abort": 0, "hang": 1, "empty stream": 0,
                             "broken stream": 0}
    assert r["failures"][0]["finish_reason"] == "error 500" and r["failures"][0]["rid"] == "r1"
    assert r["failed"] == 3 and r["slowest_failure_s"] == 120.0
    assert [f["outcome"] for f in r["over_budget"]] == ["hang"]
    assert r["ok_over_budget_s"] == [28.0]
    assert r["back_after_s"] == 82.0
    assert [f["start_after_kill_s"] for f in r["failures"]] == [-1.0, -0.5, 1.0]


def test_report_cli(tmp_path, capsys):
    load = tmp_path / "load-fault-pdkit-b.json"
    load.write_text(json.dumps({"requests": [[1.0, 2.0, True, ""], [10.0, 12.5, False, "status 503: x"]]}))
    assert fault.main(["report", str(load), "--kill", "9", "--back", "50", "--json", str(tmp_path / "r.json")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "2 requests, 1 failed (error status 1); slowest failure 2.5 s" in first and "back after 41.0 s" in first
    assert json.loads((tmp_path / "r.json").read_text())["failed"] == 1
