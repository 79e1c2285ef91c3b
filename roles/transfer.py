"""How a bundle reaches a node: fetched by the node over HTTP from this machine, or uploaded over SFTP.

`pdkit_cluster.wheelhouse_transfer`: `http` and `auto` serve the bundle from the deploying
process (pdkit/wheels/bundleserver.py) on the address this machine has on the node's SSH connection;
`auto` first checks, from the node, that it can open that port and falls back to SFTP (saying
so) when it cannot; `http` fails the run before any change instead. docs/benchmarks.md has the
measured speeds of both.
"""

from __future__ import annotations

import shlex
import socket
import sys
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import FactBase

from pdkit.wheels import bundleserver
from pdkit.wheels.wheelhouse import Bundle

# pip unpacking ~4 GB of engine wheels on a slow disk; a small bundle takes seconds
INSTALL_TIMEOUT_S = 3600
# how long the node waits to connect back to this machine before auto falls back to SFTP
_PROBE_TIMEOUT_S = 5

_DECIDED: WeakKeyDictionary = WeakKeyDictionary()


class ReachesAddress(FactBase):
    """Whether this node can open a TCP connection to ADDRESS:PORT (True / False)."""

    def command(self, address: str, port: int) -> str:
        probe = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection((sys.argv[1], int(sys.argv[2])), {_PROBE_TIMEOUT_S}).close(); print('yes')\n"
            "except OSError as e:\n"
            "    print('no', e)\n"
        )
        return f"python3 -c {shlex.quote(probe)} {shlex.quote(address)} {int(port)}"

    def process(self, output):
        return bool(output) and output[0].strip() == "yes"


def local_address() -> str | None:
    """This machine's address on the current host's SSH connection (what the node sees us as)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None and hasattr(client, "get_transport") else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock.getsockname()[0]


def _note(message: str) -> None:
    print(f"pdkit: {host.name}: {message}", file=sys.stderr, flush=True)


def bundle_url(bundle: Bundle, mode: str) -> str | None:
    """The URL the node installs BUNDLE from, or None to upload it over SFTP."""
    if mode == "sftp":
        return None
    decided = _DECIDED.setdefault(host.state, {})
    key = (host.name, bundle.digest)
    if key in decided:
        return decided[key]
    url, why = None, None
    address = local_address()
    if address is None:
        why = "the host is not reached over a TCP SSH connection, so it has no address to fetch from"
    else:
        try:
            url = bundleserver.serve(bundle, address)
        except OSError as exc:
            why = f"cannot serve on {address} ({exc.strerror or exc})"
        else:
            port = urlsplit(url).port
            if not host.get_fact(ReachesAddress, address=address, port=port):
                why = f"the node cannot connect to {address}:{port} (a firewall between it and this machine?)"
                url = None
    if url is None:
        if mode == "http":
            raise SystemExit(
                f"pdkit: {host.name}: pdkit_cluster.wheelhouse_transfer is http but {why}; "
                f"set it to sftp (or auto) or open the port. No host was changed."
            )
        _note(f"{bundle.name} wheels go over SFTP: {why}")
    decided[key] = url
    return url
