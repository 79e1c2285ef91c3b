"""gpu/nspawn/outage_client.py's summary: what a roll with downtime is reported to cost.

The client runs on the lent machine during `pdkit roll --allow-downtime` of the one-node cluster
(gpu/nspawn/device_one.sh); docs/gpu.md quotes its figures, so they are pinned here.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def oc():
    return load_script("gpu/nspawn/outage_client.py", "pdkit_outage_client")


def test_no_failure_is_no_outage(oc):
    s = oc.summarise([[0.0, 1.0, True, ""], [0.5, 2.0, True, ""]], 0.0, 3.0)
    assert (s["ok"], s["failed"], s["hangs"], s["outage_s"], s["failure_span_s"]) == (2, 0, 0, 0.0, 0.0)


def test_the_outage_is_the_longest_stretch_without_a_successful_answer_around_the_failures(oc):
    requests = [
        [0.0, 1.0, True, ""], [0.2, 2.0, True, ""],          # served
        [2.1, 2.15, False, "status 503: no workers"],      # the node is out: quick errors
        [2.5, 2.52, False, "status 503: no workers"],
        [9.0, 9.01, False, "URLError: refused"],
        [9.5, 12.0, True, ""],                             # back
        [10.0, 13.0, True, ""],
        [20.0, 21.0, True, ""],                            # a long quiet stretch without failures is no outage
    ]
    s = oc.summarise(requests, 0.0, 30.0)
    assert s["failed"] == 3 and s["hangs"] == 0
    assert s["outage_s"] == 10.0 and (s["outage_from"], s["outage_to"]) == (2.0, 12.0)
    assert s["failure_span_s"] == pytest.approx(9.01 - 2.1, abs=1e-3)
    assert s["failed_latency_s"]["max"] == pytest.approx(0.05, abs=1e-3)
    assert s["why"] == {"status 503": 2, "URLError": 1}


def test_a_request_cut_at_the_timeout_is_a_hang_and_an_outage_to_the_end(oc):
    s = oc.summarise([[0.0, 1.0, True, ""], [1.0, 61.0, False, "hang: timed out after 60 s"]], 0.0, 62.0)
    assert s["hangs"] == 1 and s["max_request_s"] == 60.0 and s["outage_s"] == 61.0


def test_the_client_counts_answers_errors_and_hangs_against_a_real_server(oc, tmp_path):
    """A tiny router stand-in: 200 with a stream, 503 at once, or a stream that never ends."""
    mode = {"now": "ok"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if mode["now"] == "down":
                self.send_response(503)
                self.end_headers()
                self.wfile.write(b'{"error": "no workers"}')
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: ' + json.dumps({"choices": [{"delta": {"content": "x"}}]}).encode() + b"\n\n")
            if mode["now"] == "hang":
                threading.Event().wait(1.5)
                return
            self.wfile.write(b"data: [DONE]\n\n")

    class Server(ThreadingHTTPServer):
        daemon_threads = False  # server_close() joins every handler: no thread outlives the test

    server = Server(("127.0.0.1", 0), Handler)
    serving = threading.Thread(target=server.serve_forever)
    serving.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert oc.request(url, "m", 1, 4, 5).ok
        mode["now"] = "down"
        assert oc.request(url, "m", 2, 4, 5).why.startswith("status 503")
        mode["now"] = "hang"
        assert oc.request(url, "m", 3, 4, 1).kind == "hang"
    finally:
        server.shutdown()
        server.server_close()
        serving.join()
