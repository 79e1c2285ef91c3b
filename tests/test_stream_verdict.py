"""How a failed streamed request is classified (pdkit.bench.stats.stream_failure), over the bytes
SGLang really sends (tests/fixtures/sse/README.md says where each stream comes from).

Before this rule the load clients called an EOS-first answer, an abort without a status and a
truncated answer alike "stream ended without content" (issue 30 item 6: one such request of 17,452
in a GPU roll, cause unknown); now each is its own kind with its finish reason, worker and rid.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdkit.bench.client import stream_one
from pdkit.bench.report import render_markdown
from pdkit.bench.stats import RequestResult, StreamEnd, failure_kind, stream_failure, summarize_level
from tests.conftest import load_script, require
from tests.lab import loadclient

SSE = Path(__file__).parent / "fixtures" / "sse"
CONTRACT = Path.home() / ".cache/pdkit/contract"
WORKER = "http://10.214.0.3:30001"  # what smg 1.13.0 puts in x-smg-routed-worker-id: the decode's URL
RID = "5f0c1d2e3a4b4c6d8e9fa0b1c2d3e4f5"


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_chat_fixtures_are_the_bytes_the_pinned_wheel_writes(version):
    python = CONTRACT / f"sglang-{version}" / "bin" / "python"
    require(python.exists(), f"no sglang {version} contract env at {python} (make contract-env)")
    site = CONTRACT / f"sglang-{version}" / "lib/python3.11/site-packages"
    made = json.loads(subprocess.run([str(python), str(SSE / "make_streams.py"), str(site)], check=True,
                                     capture_output=True, text=True, timeout=120).stdout)
    assert sorted(made) == sorted(p.stem for p in SSE.glob("chat-*.sse"))
    for name, text in made.items():
        assert (SSE / f"{name}.sse").read_bytes() == text.encode(), name


class Served:
    """A stand-in router answering every POST with one fixture's bytes (and smg's worker header)."""

    def __init__(self) -> None:
        self.body = b""
        self.headers: dict[str, str] = {}
        served = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                for k, v in served.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(served.body)

        class Server(ThreadingHTTPServer):
            daemon_threads = False  # server_close() joins every handler
            # the load client opens a connection per request, as fast as failures come back: with
            # socketserver's backlog of 5 a full accept queue left one connection unanswered until
            # the client's 120 s timeout (CI 2026-12-02: this test took 126 s)
            request_queue_size = 256

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def serve(self, body: bytes, headers: dict[str, str] | None = None) -> str:
        self.body, self.headers = body, headers or {}
        return self.url

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    try:
        yield s
    finally:
        s.close()


def fixture(name: str) -> bytes:
    return (SSE / f"{name}.sse").read_bytes()


# fixture -> (kind, finish reason as counted, rid) through the load client
CHAT_CASES = {
    "chat-ok-length": (None, None, None),
    "chat-empty-stop": ("empty (stop)", "stop", RID),
    "chat-abort-no-status": ("aborted", "abort", RID),
    "chat-abort-transfer-failed": ("aborted", "error 500", RID),  # no id: the rid from decode.py's message
    "chat-abort-after-output": ("aborted", "error 503", RID),
}


@pytest.mark.parametrize("name", sorted(CHAT_CASES))
def test_the_load_client_names_each_end_of_a_chat_stream(served, name):
    kind, finish, rid = CHAT_CASES[name]
    url = served.serve(fixture(name), {"x-smg-routed-worker-id": WORKER, "x-request-id": "chatcmpl-router1"})
    out = loadclient.request(url, "m", 1, 4, 10)
    assert (out.kind, out.finish_reason) == (kind, finish), out
    if kind is None:
        return
    assert (out.worker, out.rid, out.request_id) == (WORKER, rid, "chatcmpl-router1"), out
    assert out.raw.endswith("data: [DONE]\n"), out.raw  # the stream as received (up to [DONE]), to read later


def test_a_stream_cut_before_done_is_no_done_and_no_worker_header_is_none(served):
    """sglang-router 0.3.2 names no worker: recorded as None, never guessed."""
    cut = fixture("chat-ok-length").replace(b"data: [DONE]\n\n", b"")
    out = loadclient.request(served.serve(cut), "m", 1, 4, 10)
    assert (out.kind, out.finish_reason, out.worker) == ("no [DONE]", "length", None), out
    # the error detail says what was seen; the kind is read back from it by the one rule
    assert failure_kind(out.why) == "no [DONE]" and "after 2 output" in out.why


def test_the_error_chunk_keeps_sglangs_message():
    end = StreamEnd(done=True)
    for line in fixture("chat-abort-transfer-failed").decode().split("\n\n"):
        if line.startswith("data: {"):
            end.see(json.loads(line[6:]))
    why = stream_failure(end)
    assert why.startswith("aborted: error event 500 INTERNAL_SERVER_ERROR: Decode transfer failed for request"), why


def test_the_load_clients_counts_and_summary_line(tmp_path):
    counts = loadclient.Counts(tmp_path / "failures.jsonl")
    counts.success(0.1)
    counts.failure(loadclient.Outcome(why="empty (stop): [DONE] without any output", finish_reason="stop",
                                      worker=WORKER, rid=RID, request_id="r1"), 0.2)
    counts.failure(loadclient.Outcome(why="aborted: finish_reason abort after 0 output", finish_reason="abort",
                                      worker=WORKER, rid=RID), 0.3)
    counts.failure("status 503: no workers", 0.01)  # a plain why (older callers): no stream, no finish reason
    snap = counts.snapshot(0.0)
    assert snap["failures"] == {"aborted": 1, "empty (stop)": 1, "status 503": 1}
    assert snap["finish_reasons"] == {"abort": 1, "stop": 1}
    assert snap["workers"] == {WORKER: 2, "unknown": 1}
    first = snap["failure_records"][0]
    assert (first["kind"], first["finish_reason"], first["worker"], first["rid"], first["request_id"]) == \
        ("empty (stop)", "stop", WORKER, RID, "r1")
    assert [json.loads(x)["kind"] for x in (tmp_path / "failures.jsonl").read_text().splitlines()] == \
        ["empty (stop)", "aborted", "status 503"]
    assert f"[worker {WORKER}, rid {RID}]" in snap["errors"][0]
    line = loadclient.summary_line(snap, "load-roll")
    assert line.startswith("load-roll: 1 ok, 3 failed in ")
    assert "by kind {'aborted': 1, 'empty (stop)': 1, 'status 503': 1}" in line
    assert "by finish reason {'abort': 1, 'stop': 1}" in line and f"by worker {{'{WORKER}': 2, 'unknown': 1}}" in line


def test_summary_reads_an_older_out_file(tmp_path, capsys):
    """OUT files written before the finish reasons (docs/bench/h200-nspawn-pair/call4-load-roll.json)."""
    old = tmp_path / "load-old.json"
    old.write_text(json.dumps({"ok": 16108, "failed": 1, "errors": [], "seconds": 285.4,
                               "failures": {"stream ended without content": 1}}))
    assert loadclient.main(["--summary", str(old)]) == 0
    assert capsys.readouterr().out.strip() == \
        "load-old: 16108 ok, 1 failed in 285.4 s; by kind {'stream ended without content': 1}"


def test_the_load_client_prints_its_counts_at_the_end(served, tmp_path, capsys):
    url = served.serve(fixture("chat-empty-stop"), {"x-smg-routed-worker-id": WORKER})
    stop = tmp_path / "stop"
    threading.Timer(1.0, stop.touch).start()
    assert loadclient.main(["--url", url, "--model", "m", "--concurrency", "2", "--out", str(tmp_path / "load.json"),
                            "--stop-file", str(stop), "--failure-log", str(tmp_path / "f.jsonl"),
                            "--pause-after-failure", "0.01", "--timeout", "30"]) == 0
    data = json.loads((tmp_path / "load.json").read_text())
    assert data["ok"] == 0 and data["failed"] > 0 and set(data["failures"]) == {"empty (stop)"}
    assert data["finish_reasons"] == {"stop": data["failed"]} and data["workers"] == {WORKER: data["failed"]}
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) == data["failed"]
    assert f"by kind {{'empty (stop)': {data['failed']}}}" in capsys.readouterr().out


def test_the_outage_client_counts_finish_reasons_and_workers_and_reads_old_files():
    oc = load_script("gpu/nspawn/outage_client.py", "pdkit_outage_client_verdict")
    detail = {"kind": "aborted", "finish_reason": "error 500", "worker": WORKER, "rid": None, "request_id": "r", "raw": ""}
    new = [[0.0, 1.0, True, ""], [1.0, 1.1, False, "aborted: error event 500 INTERNAL_SERVER_ERROR: x", detail],
           [1.2, 1.3, False, "status 503: no workers", {**detail, "kind": "status 503", "finish_reason": None, "worker": None}]]
    s = oc.summarise(new, 0.0, 2.0)
    assert s["why"] == {"aborted": 1, "status 503": 1}
    assert s["finish_reasons"] == {"error 500": 1} and s["workers"] == {WORKER: 1, "unknown": 1}
    assert "by finish reason {'error 500': 1}" in oc.line(s)
    old = oc.summarise([[0.0, 1.0, True, ""], [1.0, 1.1, False, "stream ended without content"]], 0.0, 2.0)
    assert old["why"] == {"stream ended without content": 1} and "finish_reasons" not in old
    assert "by finish reason" not in oc.line(old)


def _bench(url: str, output_len: int) -> RequestResult:
    import aiohttp

    async def go() -> RequestResult:
        async with aiohttp.ClientSession() as session:
            return await stream_one(session, f"{url}/generate", {}, {"input_ids": [1]}, output_len, 10)

    return asyncio.run(go())


def test_pdkit_bench_names_an_aborted_and_a_short_generate_stream(served):
    aborted = _bench(served.serve(fixture("generate-abort-transfer-failed"), {"x-smg-routed-worker-id": WORKER}), 4)
    assert (aborted.ok, aborted.kind, aborted.finish_reason, aborted.worker, aborted.rid) == \
        (False, "aborted", "abort", WORKER, RID), aborted
    assert "Decode transfer failed" in aborted.error
    # EOS first: on /generate the EOS is one completion token with empty text; bench sets
    # ignore_eos, so a real run cannot end so, but a stream that does is short, not a success
    short = _bench(served.serve(fixture("generate-eos-first")), 4)
    assert (short.kind, short.finish_reason, short.worker) == ("short (stop)", "stop", None), short
    level = summarize_level([aborted, short, RequestResult(ok=False, error="status 503: busy")], 1.0, 4)
    assert level["failures"] == {"aborted": 1, "short (stop)": 1, "status 503": 1}
    assert level["failed_finish_reasons"] == {"abort": 1, "stop": 1}
    assert level["failed_workers"] == {"unknown": 2, WORKER: 1}


def test_bench_markdown_shows_the_counts_and_reads_records_without_them():
    from tests.test_bench import _record

    record = _record("r1", "x", 1.0, [])
    record["levels"][0].update(errors=2, failures={"aborted": 2}, failed_finish_reasons={"error 500": 2},
                               failed_workers={WORKER: 2})
    assert f"- C=16 failures by kind aborted 2; by finish reason error 500 2; by worker {WORKER} 2" in render_markdown(record)
    old = _record("r0", "x", 1.0, [])
    old["levels"][0]["errors"] = 1  # a record from before the counts: no line, no error
    assert "failures by kind" not in render_markdown(old)


@pytest.mark.parametrize("argv", [["-m", "tests.lab.loadclient", "--help"], ["gpu/nspawn/outage_client.py", "--help"]])
def test_the_load_clients_run_on_a_bare_python(argv):
    """The lent machine runs them with its own python3 (no site-packages): the rule they import
    from pdkit.bench.stats must need only the standard library."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(["python3", "-S", *argv], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
