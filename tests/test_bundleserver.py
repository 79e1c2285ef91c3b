"""pdkit/wheels/bundleserver.py sends a wheel with os.sendfile, also on the gevent sockets pyinfra runs it on.

gevent's socket.sendfile() is a Python loop of 8 KiB reads and sends; under pyinfra it took 30-40 s
of the control machine's CPU per engine bundle (docs/benchmarks.md). These tests make that loop
unusable and check that a whole file still arrives, byte for byte, through the real server.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import textwrap
import threading

from pdkit.wheels import bundleserver
from tests.conftest import REPO


def test_a_file_arrives_whole_through_a_small_non_blocking_socket(tmp_path):
    data = os.urandom(6 << 20)
    path = tmp_path / "blob"
    path.write_bytes(data)
    sender, receiver = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    sender.setblocking(False)  # as gevent leaves its sockets: sendfile meets a full socket often
    got = bytearray()

    def read_all() -> None:
        while chunk := receiver.recv(1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=read_all)
    reader.start()
    with path.open("rb") as fh:
        bundleserver.send_whole_file(sender, fh.fileno(), len(data))
    sender.close()
    reader.join(timeout=30)
    receiver.close()
    assert bytes(got) == data


def test_a_file_that_shrank_is_an_error_not_a_short_reply(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 1000)
    sender, receiver = socket.socketpair()
    try:
        with path.open("rb") as fh:
            try:
                bundleserver.send_whole_file(sender, fh.fileno(), 2000)
            except OSError as exc:
                assert "ended at 1000 of 2000" in str(exc)
            else:
                raise AssertionError("a file shorter than its Content-Length was sent as if whole")
    finally:
        sender.close()
        receiver.close()


# Run in its own process: gevent patches the standard library the way pyinfra_cli does, and gevent's
# own sendfile paths then raise, so only a server that never calls them serves the file.
UNDER_GEVENT = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()

    import hashlib, os, sys, urllib.request
    from pathlib import Path
    import gevent._socket3 as gsock

    def refused(*args, **kwargs):
        raise AssertionError("gevent's Python sendfile loop was used")

    gsock.socket.sendfile = gsock.socket._sendfile_use_send = refused

    from pdkit.wheels import bundleserver, wheelhouse

    wheel = Path(sys.argv[1])
    bundle = wheelhouse.Bundle(name="router", wheels=(wheel,), requirements="", digest="ab" * 32)
    url = bundleserver.serve(bundle, "127.0.0.1")
    with urllib.request.urlopen(url + wheel.name, timeout=60) as reply:
        body = reply.read()
    bundleserver.stop_all()
    print(len(body), hashlib.sha256(body).hexdigest())
""")


def test_the_server_under_gevent_sends_a_wheel_whole_without_gevents_python_loop(tmp_path):
    data = os.urandom(24 << 20)
    wheel = tmp_path / "big-1.0-py3-none-any.whl"
    wheel.write_bytes(data)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", UNDER_GEVENT, str(wheel)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(len(data)), hashlib.sha256(data).hexdigest()], proc.stdout + proc.stderr[-2000:]
