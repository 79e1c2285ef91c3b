"""Serve wheel bundles from the control machine over HTTP, for the nodes to fetch.

An engine bundle is ~4 GB; paramiko's SFTP moves it at tens of MB/s per node, one node after
another competing for the control machine's CPU (docs/benchmarks.md). Over plain HTTP a node
fetches at wire or disk speed, and pip checks every file against the bundle's hashes
(`--require-hashes`), so the channel needs no integrity of its own. The server lives in the
deploying process (a daemon thread), binds only the address the nodes reached us from (their
`SSH_CONNECTION`), answers only under a random per-process path, serves only the bundles the
deploy registered, and is gone when the deploy ends.

    url = serve(bundle, "10.0.0.1")   # http://10.0.0.1:PORT/<token>/<digest>/ (a pip --find-links page)
"""

from __future__ import annotations

import html
import os
import secrets
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pdkit.wheels.wheelhouse import Bundle

_TOKEN = secrets.token_urlsafe(18)
_LOCK = threading.Lock()
_SERVERS: dict[str, _Server] = {}
_BUNDLES: dict[str, Bundle] = {}


class _Handler(BaseHTTPRequestHandler):
    server_version = "pdkit-bundles"

    def log_message(self, format, *args):  # noqa: A002 - quiet: pyinfra owns the terminal
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) < 2 or not secrets.compare_digest(parts[0], _TOKEN) or parts[1] not in _BUNDLES:
            self.send_error(404)
            return
        bundle = _BUNDLES[parts[1]]
        if len(parts) == 2:
            self._send_bytes(_index(bundle).encode(), "text/html")
        elif len(parts) == 3 and parts[2] == "requirements.txt":
            self._send_bytes(bundle.requirements.encode(), "text/plain")
        elif len(parts) == 3 and parts[2] in (shards := bundle.shard_files()):
            self._send_bytes(shards[parts[2]].encode(), "text/plain")
        elif len(parts) == 3 and (wheel := next((w for w in bundle.wheels if w.name == parts[2]), None)) is not None:
            self._send_file(wheel)
        else:
            self.send_error(404)

    def _send_bytes(self, data: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_file(self, path: Path) -> None:
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self.wfile.flush()
        with path.open("rb") as fh:
            send_whole_file(self.connection, fh.fileno(), size)


# how long a node may take to make room for more of a file before the server gives up on it
_STALLED_S = 300.0


def send_whole_file(sock: socket.socket, fd: int, size: int) -> None:
    """SIZE bytes of file FD to SOCK by os.sendfile: the kernel copies them, no Python loop does.

    Under pyinfra the socket is gevent's (pyinfra_cli patches the standard library), whose
    sendfile() reads and sends 8 KiB at a time in Python: ~500k turns of the deploy's one event
    loop per engine bundle, 30-40 s of CPU taken from the node's pip on a shared machine
    (docs/benchmarks.md). gevent sockets are non-blocking underneath, so when the socket is full
    this waits in select(), which gevent makes cooperative; on a plain blocking socket sendfile
    blocks in its own thread and select() is never reached.
    """
    out = sock.fileno()
    offset = 0
    while offset < size:
        try:
            sent = os.sendfile(out, fd, offset, size - offset)
        except BlockingIOError:
            if not select.select([], [out], [], _STALLED_S)[1]:
                raise TimeoutError(f"the client took no data for {_STALLED_S:.0f} s") from None
            continue
        if sent == 0:
            raise OSError(f"the file ended at {offset} of {size} bytes")
        offset += sent


def _index(bundle: Bundle) -> str:
    links = "\n".join(f'<a href="{html.escape(w.name)}">{html.escape(w.name)}</a><br>' for w in bundle.wheels)
    return f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # a node that gave up (pip killed, disk full) closes mid-file: its own error says why
        pass

    def __init__(self, address: str):
        self.address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        super().__init__((address, 0), _Handler)


def serve(bundle: Bundle, address: str) -> str:
    """Serve BUNDLE on ADDRESS (started on first use) and return its base URL (pip's --find-links)."""
    with _LOCK:
        _BUNDLES[bundle.digest[:16]] = bundle
        server = _SERVERS.get(address)
        if server is None:
            server = _Server(address)  # OSError when ADDRESS is not this machine's: the caller falls back
            threading.Thread(target=server.serve_forever, name=f"pdkit-bundles-{address}", daemon=True).start()
            _SERVERS[address] = server
    port = server.server_address[1]
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/{_TOKEN}/{bundle.digest[:16]}/"


def stop_all() -> None:
    with _LOCK:
        for server in _SERVERS.values():
            server.shutdown()
            server.server_close()
        _SERVERS.clear()
        _BUNDLES.clear()
