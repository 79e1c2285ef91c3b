"""`pdkit stage INVENTORY --source DIR|URL`: model weights staged onto the nodes, verified, switched atomically.

Per node, over the SSH connection pyinfra opens (no other network service): the node's side is
pdkit/agent/weightstore.py, sent as source and run by the node's `python3` (a node never deployed can be
staged), as root (`sudo -n` when the inventory's SSH user is not root).

1. prepare: the manifest goes to the node; the node says, per file of the staging directory
   (`.NAME.pdkit-w-<id16>.partial` beside the model path), what it has: done (size and SHA-256 match:
   skipped), a prefix (resumed from its end), or nothing.
2. each missing file: a directory on this machine streams its bytes from the offset into the node's
   `receive` (stdin of the SSH channel); an HTTP(S) mirror is read by the node itself (`fetch`, a Range
   request to resume). The node hashes what it writes and discards a file whose SHA-256 differs.
   Progress on stderr: bytes, rate and ETA per file.
3. commit: every file read back from disk and checked against the manifest, owner root, group the
   engines' service group, files 0640, directories 0750, then one rename to `.NAME.pdkit-w-<id16>`.
4. activate: the model path becomes (or is switched to) a symlink to that version, in one rename.
   When the path already serves other weights, only with `--activate`, and on a deployed node that
   is a new release (pdkit/agent/releases.py `weights`): the engines restart onto the new weights and their
   gates must pass, or the node is put back on its previous release, weights included.

The manifest is SGLang's own format (store.py); without `--manifest`, pdkit writes one from the source
directory (`--write-manifest FILE` keeps it; the source itself is never written to). On the node it is
kept in the version directory as `.pdkit-manifest.json`, where `--model-checksum` can read it.

`--source node:HOST[:/path]`: another node's active, verified version is the source, and its own
`.pdkit-manifest.json` the manifest (store.py `offer` refuses anything else). By default each target
pulls the files itself from a one-transfer, read-only HTTP server on the source (store.py `serve`:
bound to the source's address on the nodes' network, only the target's address with a token sent
over SSH stdin, run as nobody); `--via control` streams them through this machine's two SSH
connections instead (store.py `send` into `receive`). docs/weights.md says why the pull is the default.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shlex
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pdkit.agent import weightstore as store

EXIT_FAILED = 1
EXIT_INVALID = 2
_STORE_SOURCE = Path(store.__file__).read_text()
_BOOT = ("import sys,zlib,base64;g={'__name__':'pdkit_stage_node'};"
         "exec(zlib.decompress(base64.b64decode(sys.argv[1])),g);sys.exit(g['main'](sys.argv[2:]))")
SEND_CHUNK = 1 << 20


def node_command(action: str, target: str, *args: str, sudo: bool = False) -> str:
    """The shell command that runs store.py's ACTION on the node with its own python3."""
    payload = base64.b64encode(zlib.compress(_STORE_SOURCE.encode(), 9)).decode()
    words = ["python3", "-c", _BOOT, payload, action, target, *args]
    return ("sudo -n " if sudo else "") + " ".join(shlex.quote(w) for w in words)


# ---------------------------------------------------------------- progress


def human_bytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def eta_words(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass
class ShardProgress:
    """One file's transfer, printed at most every INTERVAL seconds: bytes, rate, ETA (stderr)."""

    host: str
    name: str
    size: int
    start_at: int
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    interval: float = 1.0
    clock: Any = time.monotonic

    def __post_init__(self) -> None:
        self.done = self.start_at
        self.t0 = self.clock()
        self.last = self.t0

    def line(self, now: float) -> str:
        sent = self.done - self.start_at
        rate = sent / max(now - self.t0, 1e-9)
        left = (self.size - self.done) / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.size if self.size else 100.0
        eta = eta_words(left) if left != float("inf") else "?"
        return (f"pdkit stage: {self.host}: {self.name} {human_bytes(self.done)} / {human_bytes(self.size)} "
                f"({pct:.0f}%) {rate / 1e6:,.1f} MB/s ETA {eta}")

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            print(self.line(now), file=self.stream, flush=True)

    def finished(self) -> float:
        took = self.clock() - self.t0
        sent = self.done - self.start_at
        resumed = f", resumed at {human_bytes(self.start_at)}" if self.start_at else ""
        print(f"pdkit stage: {self.host}: {self.name} {human_bytes(sent)} sent in {took:.1f} s "
              f"({sent / max(took, 1e-9) / 1e6:,.1f} MB/s{resumed})", file=self.stream, flush=True)
        return took


# ---------------------------------------------------------------- sources


NODE_PREFIX = "node:"
VIAS = ("pull", "control")
SOURCE_FORMS = "a directory on this machine, an http(s):// mirror URL, node:HOST or node:HOST:/path/to/model"


@dataclass
class Source:
    """Where the weights come from: a directory on this machine, an HTTP(S) mirror the nodes read, or another
    node (NODE, its model path NODE_PATH when given; PEER once connected)."""

    location: str
    node: str | None = None
    node_path: str | None = None
    peer: PeerSource | None = None

    @property
    def is_http(self) -> bool:
        return self.node is None and self.location.startswith(("http://", "https://"))

    def check(self, manifest: dict[str, dict]) -> list[str]:
        """Files of the manifest this machine's directory lacks or has at another size (a mirror: not checked
        here; a node: by its own `offer`)."""
        if self.is_http or self.node is not None:
            return []
        problems = []
        for name, want in sorted(manifest.items()):
            p = os.path.join(self.location, name)
            if not os.path.isfile(p):
                problems.append(f"{p}: missing")
            elif os.path.getsize(p) != want["size"]:
                problems.append(f"{p}: {os.path.getsize(p)} bytes, the manifest says {want['size']}")
        return problems


def parse_source(text: str) -> Source:
    """--source's value: `node:HOST[:/path]`, an http(s):// URL, or a directory on this machine."""
    if text.startswith(NODE_PREFIX):
        host, sep, path = text[len(NODE_PREFIX):].partition(":")
        if not host:
            raise store.StageError(f"--source {text}: no host name after 'node:'; valid: node:HOST or "
                                   "node:HOST:/path/to/model, HOST as the inventory names it")
        if sep and not path.startswith("/"):
            raise store.StageError(f"--source {text}: the model path after the host must be absolute "
                                   f"(node:{host}:/srv/models/NAME), got {path!r}")
        return Source(text, node=host, node_path=path.rstrip("/") or ("/" if path else None))
    if not text:
        raise store.StageError(f"--source is empty; valid: {SOURCE_FORMS}")
    if text.startswith(("http://", "https://")):
        return Source(text)
    return Source(text.rstrip("/") or "/")


def source_flag_problem(source: Source, manifest: str | None, via: str | None) -> str | None:
    """A flag that does not go with SOURCE, saying what would be valid; None when they agree."""
    if source.node is not None and manifest:
        return (f"--manifest {manifest}: with --source {source.location} the source node's own manifest (the one "
                f"its weights were verified with) is the truth; leave --manifest out")
    if source.node is None and via is not None:
        return f"--via {via} is for --source node:HOST (how the bytes go from node to node); leave it out"
    if via is not None and via not in VIAS:
        return f"--via {via}: valid: {' or '.join(VIAS)}"
    return None


def plan_node_source(source: Source, serving: dict[str, str], hosts: list[str], limit: list[str],
                     model: str) -> tuple[str, dict[str, str]]:
    """(the source node's model path, the targets: host -> model path) for `--source node:HOST[:/path]`.

    SERVING: every host whose engines serve MODEL -> its model path; HOSTS: every host of the inventory.
    The source is never a target (it has the weights): left out of the default targets, refused in --limit.
    """
    host = source.node
    assert host is not None
    if host not in hosts:
        raise store.StageError(f"--source {source.location}: no host {host} in the inventory; valid: node:HOST with "
                               f"HOST one of {', '.join(sorted(hosts))}")
    path = source.node_path or serving.get(host)
    if path is None:
        raise store.StageError(f"--source {source.location}: no engine on {host} serves {model}, so where its weights "
                               f"are is not known; give the path: --source node:{host}:/path/to/model")
    if not path.startswith("/"):
        raise store.StageError(f"--source {source.location}: {host}'s model path {path} is a hub id, not a directory; "
                               f"give the path: --source node:{host}:/path/to/model")
    others = ", ".join(sorted(h for h in serving if h != host)) or "none (no other host serves it)"
    if host in limit:
        raise store.StageError(f"--limit {host}: {host} is the source (--source {source.location}), a node is not "
                               f"staged from itself; valid --limit: {others}")
    targets = {h: t for h, t in serving.items() if h != host and (not limit or h in limit)}
    if not targets:
        raise store.StageError(f"--source {source.location}: {host} is the only host whose engines serve {model}; "
                               "nothing to stage from it (the targets are the other hosts that serve it)")
    return path, targets


def url_host(address: str) -> str:
    """ADDRESS as a URL's host (an IPv6 address in brackets)."""
    return f"[{address}]" if ":" in address else address


def load_manifest(source: Source, manifest_path: str | None, log) -> dict[str, dict]:
    """The manifest to stage: the user's file (SGLang's format), or generated from the source directory."""
    if manifest_path:
        try:
            text = Path(manifest_path).read_bytes()
        except OSError as exc:
            raise store.StageError(f"--manifest {manifest_path}: {exc.strerror or exc}") from exc
        return store.parse_manifest(text, f"--manifest {manifest_path}")
    if source.is_http:
        raise store.StageError(f"--source {source.location} is an HTTP mirror: give its manifest with --manifest FILE "
                               "(SGLang's format: `python -m sglang.srt.utils.model_file_verifier generate`)")
    if not os.path.isdir(source.location):
        raise store.StageError(f"--source {source.location} is not a directory on this machine (valid: the model's "
                               "directory, or an http(s):// mirror URL with --manifest)")
    names = store.discover(source.location)
    total = sum(os.path.getsize(os.path.join(source.location, n)) for n in names)
    log(f"no --manifest: hashing {len(names)} file(s), {human_bytes(total)}, in {source.location}")
    t0 = time.monotonic()
    manifest = store.generate(source.location)
    log(f"manifest written from {source.location} in {time.monotonic() - t0:.1f} s "
        f"(weights {store.weights_id(manifest)[:store.ID_CHARS]})")
    return manifest


# ---------------------------------------------------------------- one node over SSH


class NodeError(RuntimeError):
    pass


class Node:
    """store.py's actions on one connected pyinfra host, through its paramiko client."""

    def __init__(self, name: str, host: Any, sudo: bool, log) -> None:
        self.name, self.host, self.sudo, self.log = name, host, sudo, log
        client = getattr(host.connector, "client", None)
        if client is None or not hasattr(client, "get_transport"):
            raise NodeError(f"{name}: not reached over SSH (pdkit stage sends the weights through the SSH connection)")
        self.client = client

    def call(self, action: str, target: str, *args: str, stdin: bytes | None = None, feed=None,
             on_stderr=None, timeout: float | None = None) -> dict:
        """Run ACTION; feed(channel) writes its stdin. The node's one JSON line, or NodeError."""
        chan = self.client.get_transport().open_session()
        if timeout:
            chan.settimeout(timeout)
        chan.exec_command(node_command(action, target, *args, sudo=self.sudo))
        err = b""
        try:
            if stdin is not None:
                chan.sendall(stdin)
            if feed is not None:
                feed(chan)
            chan.shutdown_write()
        except (OSError, EOFError):
            pass  # the node ended the command early: its answer below says why
        out = b""
        while True:
            if chan.recv_stderr_ready():
                data = chan.recv_stderr(65536)
                err += data
                if on_stderr:
                    on_stderr(data)
            elif chan.recv_ready():
                out += chan.recv(65536)
            elif chan.exit_status_ready():
                break
            else:
                time.sleep(0.05)
        while data := chan.recv(65536):
            out += data
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        rc = chan.recv_exit_status()
        chan.close()
        text = out.decode(errors="replace").strip().splitlines()
        try:
            answer = json.loads(text[-1]) if text else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise NodeError(f"{self.name}: {action} on {target} gave no answer (exit {rc}): "
                            f"{(err or out).decode(errors='replace').strip()[-500:]}")
        if rc != 0 or "error" in answer:
            raise NodeError(f"{self.name}: {answer.get('error') or f'{action} failed (exit {rc})'}")
        return answer


@dataclass
class StageResult:
    host: str
    target: str
    weights: str
    sent_bytes: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    resumed: dict[str, int] = field(default_factory=dict)
    version: str = ""
    activated: str = "no"  # no | first | switched | already | new release <id>


def _send(node: Node, target: str, wid: str, name: str, offset: int, source: Source, bar: ShardProgress,
          size: int) -> None:
    """One file from OFFSET: streamed from this machine's directory, or fetched by the node from the mirror."""
    if source.is_http:
        def seen(data: bytes) -> None:
            for line in data.decode(errors="replace").splitlines():
                if line.startswith("PROGRESS "):
                    bar.advance(int(line.split()[1]) - bar.done)
        node.call("fetch", target, wid, name, str(offset), source.location, on_stderr=seen)
        bar.done = size
        return

    def feed(chan) -> None:
        with open(os.path.join(source.location, name), "rb") as fh:
            fh.seek(offset)
            while chunk := fh.read(SEND_CHUNK):
                chan.sendall(chunk)
                bar.advance(len(chunk))
    node.call("receive", target, wid, name, str(offset), feed=feed)


class SourceError(NodeError):
    """The source node cannot serve this target (unreachable, refused): no other file would get through."""


@dataclass
class PeerSource:
    """The source node once connected: its Node, the model path and version it serves, the address the other
    nodes reach it at, and how the bytes go (VIAS)."""

    node: Node
    path: str
    version: str
    address: str
    via: str = "pull"


class PeerServer:
    """store.py `serve` on the source for one target: open while its SSH channel is; the token goes over the
    channel's stdin (never argv, never a log) and lives as long as the server."""

    def __init__(self, peer: PeerSource, allow: str, timeout: float = 60) -> None:
        self.peer, self.token = peer, secrets.token_urlsafe(32)
        self.chan = peer.node.client.get_transport().open_session()
        self.chan.settimeout(timeout)
        self.chan.exec_command(node_command("serve", peer.path, sudo=peer.node.sudo))
        self.chan.sendall(json.dumps({"token": self.token, "allow": [allow], "bind": peer.address}).encode() + b"\n")
        line = b""
        while not line.endswith(b"\n"):
            data = self.chan.recv(4096)
            if not data:
                break
            line += data
        try:
            answer = json.loads(line)
        except ValueError:
            answer = {}
        if "port" not in answer:
            err = self.chan.recv_stderr(65536) if self.chan.recv_stderr_ready() else b""
            self.chan.close()
            raise SourceError(f"{peer.node.name} (the source): cannot serve its weights: "
                              f"{answer.get('error') or (err or line).decode(errors='replace').strip()[-500:]}")
        self.url = f"http://{url_host(peer.address)}:{answer['port']}"

    def close(self) -> dict:
        """End the server (EOF on its stdin); its counts {served, bytes, refused}."""
        self.chan.shutdown_write()
        out = b""
        try:
            while data := self.chan.recv(65536):
                out += data
        except OSError:
            pass
        self.chan.close()
        try:
            return json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {}


class Sender:
    """The bytes of one target's files from SOURCE: this machine's directory, a mirror, or a source node (a
    server started on the first file that needs it, ended by close())."""

    def __init__(self, node: Node, target: str, wid: str, source: Source) -> None:
        self.node, self.target, self.wid, self.source = node, target, wid, source
        self.server: PeerServer | None = None

    def send(self, name: str, offset: int, bar: ShardProgress, size: int) -> None:
        peer = self.source.peer
        if peer is None:
            return _send(self.node, self.target, self.wid, name, offset, self.source, bar, size)
        try:
            if peer.via == "control":
                self._relay(peer, name, offset, bar)
            else:
                self._pull(peer, name, offset, bar, size)
        except SourceError:
            raise
        except NodeError as exc:
            if "does not match the manifest" not in str(exc):
                raise
            theirs = peer.node.call("hash", peer.version, name)
            if not theirs["matches"]:  # the source's disk, not the way: say whose copy is bad
                raise NodeError(f"{self.node.name}: {name}: {peer.node.name}'s own copy does not match its manifest "
                                f"(sha256 {theirs['sha256'][:16]}..., {theirs['size']} bytes): the source's weights "
                                f"changed after they were verified; stage {peer.node.name} again from the original "
                                f"source (--source DIR|URL --limit {peer.node.name}), then from it; the file was "
                                f"discarded on {self.node.name}, nothing was replaced") from exc
            raise

    def _pull(self, peer: PeerSource, name: str, offset: int, bar: ShardProgress, size: int) -> None:
        if self.server is None:
            me = self.node.call("route", self.target, peer.address)["address"]
            self.server = PeerServer(peer, me)
            self.node.log(f"{self.node.name}: pulls from {peer.node.name} at {self.server.url} (read-only, "
                          f"for {me} alone, until this transfer ends)")

        def seen(data: bytes) -> None:
            for line in data.decode(errors="replace").splitlines():
                if line.startswith("PROGRESS "):
                    bar.advance(int(line.split()[1]) - bar.done)
        try:
            self.node.call("fetch", self.target, self.wid, name, str(offset), self.server.url,
                           stdin=json.dumps({"token": self.server.token}).encode(), on_stderr=seen)
        except NodeError as exc:
            if "cannot fetch" not in str(exc):
                raise
            # the server or the way to it: every other file would fail the same way (each after a timeout)
            raise SourceError(f"{self.node.name}: cannot reach {peer.node.name}'s weights at "
                              f"{self.server.url}: {str(exc).split(': ', 2)[-1]}; the nodes' network must let "
                              f"{self.node.name} connect to {peer.node.name} ({peer.address}) on a port of its "
                              "choosing, or re-run with --via control (the bytes through this machine)") from exc
        bar.done = size

    def _relay(self, peer: PeerSource, name: str, offset: int, bar: ShardProgress) -> None:
        problems: list[str] = []

        def feed(chan) -> None:
            src = peer.node.client.get_transport().open_session()
            src.exec_command(node_command("send", peer.version, name, str(offset), sudo=peer.node.sudo))
            while data := src.recv(SEND_CHUNK):
                chan.sendall(data)
                bar.advance(len(data))
            rc = src.recv_exit_status()
            err = b""
            while src.recv_stderr_ready():
                err += src.recv_stderr(65536)
            src.close()
            if rc != 0:
                problems.append(err.decode(errors="replace").strip()[-500:] or f"send exited {rc}")
        try:
            self.node.call("receive", self.target, self.wid, name, str(offset), feed=feed)
        except NodeError as exc:
            if problems:  # the target saw the stream end early: the source said why
                raise NodeError(f"{self.node.name}: {peer.node.name} (the source): {problems[0]}") from exc
            raise

    def close(self) -> None:
        if self.server is not None:
            counts = self.server.close()
            if counts.get("refused"):
                self.node.log(f"{self.peer_name()}: its server refused {counts['refused']} request(s) "
                              "(another address, no token, or a file not in the manifest)")
            self.server = None

    def peer_name(self) -> str:
        return self.source.peer.node.name if self.source.peer else "?"


def stage_node(node: Node, target: str, manifest: dict[str, dict], source: Source, group: str,
               activate: bool, switch=None, progress_stream: IO[str] = sys.stderr) -> StageResult:
    """Stage MANIFEST at TARGET on NODE (the four steps of the module's docstring)."""
    wid = store.weights_id(manifest)
    result = StageResult(node.name, target, wid)
    t0 = time.monotonic()
    have = node.call("prepare", target, stdin=store.manifest_bytes(manifest))
    if have["ready"]:
        node.log(f"{node.name}: weights {wid[:store.ID_CHARS]} already staged and verified at "
                 f"{store.version_dir(target, wid)}")
    failures: list[str] = []
    sender = Sender(node, target, wid, source)
    try:
        _transfer(node, manifest, have, sender, result, failures, progress_stream)
    finally:
        sender.close()
    if failures:
        raise NodeError(f"{node.name}: {len(failures)} file(s) failed ({'; '.join(failures)})")
    committed = node.call("commit", target, wid, group)
    result.version = committed["version"]
    if not committed.get("already"):
        node.log(f"{node.name}: {committed['verified']} file(s) verified against the manifest, now "
                 f"{store.version_dir(target, wid)} (root:{committed['group']}, files {committed['mode']})")
    current = have["active"]
    if current.get("id") == wid:
        result.activated = "already"
    elif current["kind"] == "missing":
        node.call("activate", target, wid)
        result.activated = "first"
    elif not activate:
        result.activated = "no"
    elif switch is not None:  # a deployed node: a new release, the engines restarted onto it and gated
        result.activated = f"new release {switch(target, result.version)}"
    else:
        node.call("activate", target, wid)
        result.activated = "switched"
    result.seconds = time.monotonic() - t0
    return result


def _transfer(node: Node, manifest: dict[str, dict], have: dict, sender: Sender, result: StageResult,
              failures: list[str], progress_stream: IO[str]) -> None:
    """Every file the node lacks, from its offset; a file that fails is noted and the next one goes on."""
    if have["ready"]:
        return
    for name in sorted(manifest):
        state = have["files"][name]
        if state.get("restarted"):
            node.log(f"{node.name}: {name}: the staged copy had {state['restarted']}: sent again")
        if state["done"]:
            result.skipped.append(name)
            node.log(f"{node.name}: {name}: present with the manifest's size and sha256: skipped")
            continue
        offset = state["have"]
        if offset:
            result.resumed[name] = offset
        bar = ShardProgress(node.name, name, manifest[name]["size"], offset, stream=progress_stream)
        try:
            sender.send(name, offset, bar, manifest[name]["size"])
        except SourceError:
            raise
        except NodeError as exc:  # one bad file stops neither the others nor the next run's resume
            failures.append(str(exc).removeprefix(f"{node.name}: "))
            node.log(f"{node.name}: {failures[-1]}")
            continue
        bar.finished()
        result.sent_bytes += bar.done - offset


def _release_switch(host: Any, releases_cmd: str, target: str, version: str) -> str:
    """On a deployed node: a new release with the new weights, the engines restarted onto them and gated
    (pdkit/agent/releases.py `weights`); the node's previous release back on failure."""
    # lazy: pyinfra's API loads gevent and paramiko; only a stage that switches weights needs it
    from pdkit.roll.pyinfra_api import run_remote

    ok, stdout, stderr = run_remote(host, f"{releases_cmd} weights --link {shlex.quote(target)} "
                                          f"--version {shlex.quote(version)}", timeout=7200)
    if not ok:
        raise NodeError(stderr.strip()[-800:] or stdout.strip()[-800:])
    return json.loads(stdout.strip().splitlines()[-1])["id"]


# ---------------------------------------------------------------- the command


def targets_by_host(spec: Any, model: str | None) -> dict[str, str]:
    """Host -> the model path to stage there: every host with an engine serving MODEL (default the cluster's)."""
    want = model or spec.cluster.model.path
    out: dict[str, str] = {}
    for host in spec.hosts:
        for placement in spec.placements(host):
            m = placement.engine.model or spec.cluster.model
            if m.path.rstrip("/") == want.rstrip("/"):
                out[host.name] = m.path.rstrip("/")
    return out


def _offer(spec: Any, source: Source, path: str, connected: dict[str, Any], unreachable: dict[str, str],
           via: str, log) -> dict[str, dict]:
    """The source node's own manifest (store.py `offer`: its active version, verified, its files of the
    manifest's sizes); SOURCE.peer set for the transfers. NodeError/StageError naming the host otherwise."""
    name = source.node
    assert name is not None
    if name not in connected:
        raise NodeError(f"{name} (the source, --source {source.location}): cannot reach it over SSH "
                        f"({unreachable.get(name, 'no SSH connection')})")
    host = connected[name]
    node = Node(name, host, (host.data.get("ssh_user") or "root") != "root", log)
    try:
        offered = node.call("offer", path)
    except NodeError as exc:
        raise NodeError(f"--source {source.location}: {exc}") from exc
    manifest = store.parse_manifest(offered["manifest"], f"{name}:{offered['version']}/{store.MANIFEST_NAME}")
    spec_host = next(h for h in spec.hosts if h.name == name)
    # the address the other nodes reach it at: its engines' (pdkit_node.address), else ssh_hostname
    address = spec.engine_address(spec_host) if spec_host.node is not None else spec_host.address
    source.peer = PeerSource(node, path, offered["version"], address, via)
    log(f"source {name}:{path} -> {offered['version']} ({offered['files']} files, "
        f"{human_bytes(offered['bytes'])}, its own manifest); "
        + (f"the targets pull from {address}" if via == "pull" else "streamed through this machine"))
    return manifest


def cmd_stage(args: argparse.Namespace) -> int:
    # lazy: pyinfra's API (gevent, paramiko) loads only for the command that connects, after patch_gevent
    from pdkit.roll.pyinfra_api import Pyinfra, patch_gevent, run_remote

    patch_gevent()
    # lazy: the loader imports pyinfra's CLI loader, after the gevent patch
    from pdkit.agent.releases import CURRENT, release_json_path, releases_dir
    from pdkit.inventory.loader import load_or_report
    from pdkit.render.paths import releases_command

    def log(message: str) -> None:
        print(f"pdkit stage: {message}", file=sys.stderr, flush=True)

    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    model = args.model or spec.cluster.model.path
    targets = targets_by_host(spec, args.model)
    try:
        source = parse_source(args.source)
        why = source_flag_problem(source, args.manifest, args.via)
        if why:
            raise store.StageError(why)
    except store.StageError as exc:
        print(f"pdkit stage: {exc}; nothing was contacted", file=sys.stderr)
        return EXIT_INVALID
    if args.limit:
        unknown = [h for h in args.limit if h not in targets]
        if unknown:
            print(f"pdkit stage: {', '.join(unknown)}: no engine there serves {model} "
                  f"(hosts that do: {', '.join(sorted(targets)) or 'none'})", file=sys.stderr)
            return EXIT_INVALID
    if source.node is not None:
        try:
            source_path, planned = plan_node_source(source, targets, [h.name for h in spec.hosts], args.limit, model)
        except store.StageError as exc:
            print(f"pdkit stage: {exc}; nothing was contacted", file=sys.stderr)
            return EXIT_INVALID
        if source.node in targets:
            log(f"{source.node} is the source: not a target")
        targets = planned
    elif args.limit:
        targets = {h: t for h, t in targets.items() if h in args.limit}
    bad = [t for t in set(targets.values()) if not t.startswith("/")]
    if not targets or bad:
        why = (f"model {bad[0]} is a hub id, not a directory on the nodes" if bad
               else f"no engine serves {model}")
        print(f"pdkit stage: {why}; valid: an absolute model path of an engine in the inventory", file=sys.stderr)
        return EXIT_INVALID
    connected: dict[str, Any] = {}
    unreachable: dict[str, str] = {}
    if source.node is None:
        try:
            manifest = load_manifest(source, args.manifest, log)
            mismatched = source.check(manifest)
            if mismatched:
                raise store.StageError(f"the source does not match the manifest: {'; '.join(mismatched)}")
        except store.StageError as exc:
            print(f"pdkit stage: {exc}; nothing was contacted", file=sys.stderr)
            return EXIT_INVALID
    else:
        _, connected, unreachable = Pyinfra(args.inventory).connect(sorted({*targets, source.node}))
        try:
            manifest = _offer(spec, source, source_path, connected, unreachable, args.via or "pull", log)
        except (NodeError, store.StageError) as exc:
            print(f"pdkit stage: {exc}; nothing was staged", file=sys.stderr)
            return EXIT_INVALID
    if args.write_manifest:
        fd = os.open(args.write_manifest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(store.manifest_bytes(manifest))
        log(f"manifest kept in {args.write_manifest} (SGLang's format: `--model-checksum` reads it)")
    wid = store.weights_id(manifest)
    total = sum(f["size"] for f in manifest.values())
    log(f"weights {wid[:store.ID_CHARS]} ({len(manifest)} files, {human_bytes(total)}) to "
        f"{', '.join(f'{h}:{t}' for h, t in sorted(targets.items()))}")
    if source.node is None:
        _, connected, unreachable = Pyinfra(args.inventory).connect(sorted(targets))
    failed = {h: f"cannot reach it over SSH ({why})" for h, why in unreachable.items() if h in targets}
    results = []
    for name in sorted(h for h in connected if h in targets):
        host = connected[name]
        sudo = (host.data.get("ssh_user") or "root") != "root"
        try:
            node = Node(name, host, sudo, log)
            switch = None
            # the engines of a deployed node read this path: the switch is a release (restarted and gated);
            # on a node never deployed, or one whose engines read another path, it is the link alone
            current = f"{releases_dir(spec.cluster.install_dir)}/{CURRENT}"
            read = (f"test -f {shlex.quote(current)} && grep -qF {shlex.quote(json.dumps(targets[name]))} "
                    f"{shlex.quote(release_json_path(spec.cluster.config_dir))}")
            if args.activate and run_remote(host, read, timeout=60)[0]:
                def switch(target: str, version: str, host=host) -> str:
                    return _release_switch(host, releases_command(spec), target, version)
            results.append(stage_node(node, targets[name], manifest, source, spec.cluster.service_user,
                                      args.activate, switch))
        except (NodeError, store.StageError, OSError) as exc:
            failed[name] = str(exc).removeprefix(f"{name}: ")
    for r in results:
        how = {"no": f"NOT active: {r.target} still serves other weights (re-run with --activate to switch)",
               "first": f"active: {r.target} -> {r.version}", "already": f"already active at {r.target}",
               "switched": f"active: {r.target} -> {r.version} (switched)"}.get(r.activated,
                                                                             f"active: {r.activated}")
        rate = r.sent_bytes / r.seconds / 1e6 if r.seconds else 0.0
        print(f"{r.host}: weights {r.weights[:store.ID_CHARS]} verified, {human_bytes(r.sent_bytes)} sent in "
              f"{r.seconds:.1f} s ({rate:,.1f} MB/s), {len(r.skipped)} file(s) skipped, "
              f"{len(r.resumed)} resumed; {how}")
    for name, why in sorted(failed.items()):
        print(f"{name}: FAILED: {why}; the weights it serves were not replaced (re-run to resume)", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("stage", help="stage model weights onto the nodes: verified against a SHA-256 "
                                            "manifest (SGLang's format), resumable, switched atomically")
    p.add_argument("inventory")
    p.add_argument("--source", required=True, metavar="DIR|URL|node:HOST[:PATH]",
                   help="the model directory on this machine, an http(s):// mirror the nodes can read, or another "
                        "node's staged and verified weights (node:HOST: its model path from the inventory; "
                        "node:HOST:/path: that path)")
    p.add_argument("--manifest", metavar="FILE", help="SGLang's checksum manifest of the weights (default: "
                                                      "pdkit writes one from --source DIR; a node: its own)")
    p.add_argument("--via", choices=VIAS, default=None,
                   help="with --source node:HOST: pull (default: each target fetches from a one-transfer read-only "
                        "server on the source) or control (streamed through this machine's SSH connections)")
    p.add_argument("--write-manifest", metavar="FILE", help="keep the manifest used (SGLang's format)")
    p.add_argument("--model", metavar="PATH", help="the model path to stage (default pdkit_cluster.model.path)")
    p.add_argument("--limit", action="append", default=[], metavar="HOST", help="only these hosts (repeat)")
    p.add_argument("--activate", action="store_true",
                   help="switch a model path that serves other weights (on a deployed node: a new release, its "
                        "engines restarted and gated, put back on failure)")
    p.set_defaults(func=cmd_stage)
