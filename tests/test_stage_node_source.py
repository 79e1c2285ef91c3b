"""Issue 47 item 5, the third source: `pdkit stage --source node:HOST[:/path]`. The pure parts (the source's
parsing, the flags that go with it, the plan of source and targets) and the source node's side of store.py
(offer, serve, send, hash, route) on temp directories, the server and `send` run as the node runs them
(store.py's source through `python3 -c`)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from pdkit.agent import weightstore as store
from pdkit.weights import stage
from tests.conftest import REPO

# ---------------------------------------------------------------- parsing and planning


@pytest.mark.parametrize("text, node, path", [
    ("node:gpu1", "gpu1", None),
    ("node:gpu1:/srv/models/m", "gpu1", "/srv/models/m"),
    ("node:gpu1:/srv/models/m/", "gpu1", "/srv/models/m"),
])
def test_a_node_source_names_the_host_and_maybe_the_path(text, node, path):
    source = stage.parse_source(text)
    assert (source.node, source.node_path, source.is_http) == (node, path, False)
    assert source.check({"a": {"size": 1, "sha256": "0" * 64}}) == []  # the node checks itself (offer)


def test_directories_and_mirrors_are_still_what_they_were():
    assert stage.parse_source("/data/m/").location == "/data/m"
    assert stage.parse_source("/data/m/").node is None
    mirror = stage.parse_source("https://mirror.lan/m")
    assert mirror.is_http and mirror.node is None


@pytest.mark.parametrize("text, words", [
    ("node:", "no host name after 'node:'; valid: node:HOST or node:HOST:/path/to/model"),
    ("node::/srv/m", "no host name"),
    ("node:gpu1:srv/m", "must be absolute (node:gpu1:/srv/models/NAME), got 'srv/m'"),
    ("", "valid: a directory on this machine, an http(s):// mirror URL, node:HOST"),
])
def test_a_malformed_source_says_what_is_valid(text, words):
    with pytest.raises(store.StageError, match="--source") as err:
        stage.parse_source(text)
    assert words in str(err.value)


def test_flags_that_do_not_go_with_the_source_are_refused():
    node = stage.parse_source("node:gpu1")
    assert "the source node's own manifest" in stage.source_flag_problem(node, "m.json", None)
    assert "--via control is for --source node:HOST" in stage.source_flag_problem(
        stage.parse_source("/data/m"), None, "control")
    assert "valid: pull or control" in stage.source_flag_problem(node, None, "scp")
    assert stage.source_flag_problem(node, None, "control") is None
    assert stage.source_flag_problem(stage.parse_source("/data/m"), "m.json", None) is None


SERVING = {"gpu1": "/srv/models/m", "gpu2": "/srv/models/m", "gpu3": "/data/m"}
HOSTS = ["gpu1", "gpu2", "gpu3", "mon"]


def test_the_source_is_left_out_of_the_targets_and_its_path_is_its_engines():
    path, targets = stage.plan_node_source(stage.parse_source("node:gpu1"), SERVING, HOSTS, [], "/srv/models/m")
    assert path == "/srv/models/m" and targets == {"gpu2": "/srv/models/m", "gpu3": "/data/m"}
    path, targets = stage.plan_node_source(stage.parse_source("node:gpu3"), SERVING, HOSTS, ["gpu2"], "m")
    assert path == "/data/m" and targets == {"gpu2": "/srv/models/m"}


def test_a_host_without_the_model_needs_the_path():
    path, targets = stage.plan_node_source(stage.parse_source("node:mon:/backup/m"), SERVING, HOSTS, [], "m")
    assert path == "/backup/m" and sorted(targets) == ["gpu1", "gpu2", "gpu3"]
    with pytest.raises(store.StageError) as err:
        stage.plan_node_source(stage.parse_source("node:mon"), SERVING, HOSTS, [], "/srv/models/m")
    assert "no engine on mon serves /srv/models/m" in str(err.value)
    assert "--source node:mon:/path/to/model" in str(err.value)


@pytest.mark.parametrize("source, limit, serving, words", [
    ("node:gpu9", [], SERVING, "no host gpu9 in the inventory; valid: node:HOST with HOST one of gpu1, gpu2, gpu3, mon"),
    ("node:gpu1", ["gpu2", "gpu1"], SERVING,
     "--limit gpu1: gpu1 is the source (--source node:gpu1), a node is not staged from itself; valid --limit: gpu2, gpu3"),
    ("node:gpu1", [], {"gpu1": "/srv/models/m"}, "gpu1 is the only host whose engines serve /srv/models/m"),
    ("node:gpu1", [], {"gpu1": "Qwen/Qwen3-8B", "gpu2": "Qwen/Qwen3-8B"}, "a hub id, not a directory"),
])
def test_an_unknown_host_source_equal_target_and_no_target_are_refused(source, limit, serving, words):
    with pytest.raises(store.StageError) as err:
        stage.plan_node_source(stage.parse_source(source), serving, HOSTS, limit, "/srv/models/m")
    assert words in str(err.value)


def test_a_url_host_brackets_ipv6():
    assert stage.url_host("10.0.0.2") == "10.0.0.2" and stage.url_host("fd00::2") == "[fd00::2]"


@pytest.mark.parametrize("header, size, start", [
    (None, 10, 0), ("bytes=4-", 10, 4), ("bytes=10-", 10, 10), ("bytes=11-", 10, None), ("bytes=0-3", 10, None),
    ("items=1-", 10, None),
])
def test_the_server_answers_the_range_a_resuming_fetch_sends(header, size, start):
    assert store.parse_range(header, size) == start


# ---------------------------------------------------------------- the source node's side


def _files(seed: int = 3) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {f"model-{i:05d}-of-00002.safetensors": rng.randbytes(200_000 + i) for i in (1, 2)}
    files["config.json"] = b'{"architectures": ["LlamaForCausalLM"]}'
    return files


def _staged_source(tmp_path, seed: int = 3) -> tuple[str, dict[str, dict], dict[str, bytes]]:
    """A node's model path with a verified, active version (what `pdkit stage` leaves), like a source node."""
    src = tmp_path / "download"
    src.mkdir()
    files = _files(seed)
    for name, data in files.items():
        (src / name).write_bytes(data)
    manifest = store.generate(str(src))
    parent = tmp_path / "srcnode"
    parent.mkdir()
    target = str(parent / "m")
    wid = store.weights_id(manifest)
    store.prepare(target, manifest)
    for name in manifest:
        with open(src / name, "rb") as fh:
            store.receive(target, wid, name, 0, fh)
    store.commit(target, wid, None)
    store.activate(target, wid)
    return target, manifest, files


def test_a_verified_active_version_is_offered_with_its_own_manifest(tmp_path):
    target, manifest, _ = _staged_source(tmp_path)
    offered = store.offer(target)
    assert offered["version"] == store.version_dir(target, store.weights_id(manifest))
    assert store.parse_manifest(offered["manifest"]) == manifest
    assert offered["id"] == store.weights_id(manifest)
    assert offered["bytes"] == sum(f["size"] for f in manifest.values())
    assert store.offer(offered["version"])["id"] == offered["id"]  # node:HOST:/path of the version itself


def test_a_source_without_verified_weights_is_refused_saying_what_to_do(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    with pytest.raises(store.StageError, match="plain directory without a verified manifest") as err:
        store.offer(str(plain))
    assert "stage this node from the original source first" in str(err.value)
    with pytest.raises(store.StageError, match="does not exist on this node: it has no weights"):
        store.offer(str(tmp_path / "nothing"))
    os.symlink(str(plain), tmp_path / "elsewhere")
    with pytest.raises(store.StageError, match="not a version pdkit staged and verified"):
        store.offer(str(tmp_path / "elsewhere"))


def test_a_source_whose_files_do_not_match_its_manifest_is_refused(tmp_path):
    target, manifest, _ = _staged_source(tmp_path)
    version = store.version_dir(target, store.weights_id(manifest))
    shard = os.path.join(version, "model-00002-of-00002.safetensors")
    os.chmod(shard, 0o644)
    with open(shard, "ab") as fh:
        fh.write(b"x")
    with pytest.raises(store.StageError) as err:
        store.offer(target)
    assert f"{version} does not match its own manifest (model-00002-of-00002.safetensors: 200003 bytes, " \
           "its manifest says 200002)" in str(err.value)
    assert "stage this node again from the original source" in str(err.value)
    os.unlink(shard)
    with pytest.raises(store.StageError, match="model-00002-of-00002.safetensors: missing"):
        store.offer(target)


def test_a_manifest_edited_by_hand_is_not_the_versions(tmp_path):
    target, manifest, _ = _staged_source(tmp_path)
    version = store.version_dir(target, store.weights_id(manifest))
    path = os.path.join(version, store.MANIFEST_NAME)
    os.chmod(path, 0o644)
    edited = dict(manifest)
    edited.pop("config.json")
    with open(path, "wb") as fh:
        fh.write(store.manifest_bytes(edited))
    with pytest.raises(store.StageError, match="is not the manifest that version was verified with"):
        store.offer(target)


def test_hash_tells_whose_copy_is_bad(tmp_path):
    target, manifest, _ = _staged_source(tmp_path)
    version = store.version_dir(target, store.weights_id(manifest))
    name = "model-00001-of-00002.safetensors"
    assert store.hash_file(version, name)["matches"] is True
    shard = os.path.join(version, name)
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\0\0\0")
    assert store.hash_file(version, name)["matches"] is False
    with pytest.raises(store.StageError, match="is not in the manifest"):
        store.hash_file(version, "../../etc/passwd")


def _node(action: str, target: str, *args: str, **kw) -> subprocess.Popen:
    """store.py's ACTION run as on a node: its source through `python3 -c` (stage.node_command)."""
    return subprocess.Popen(stage.node_command(action, target, *args), shell=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_send_streams_a_file_from_its_offset_and_nothing_else(tmp_path):
    target, manifest, files = _staged_source(tmp_path)
    version = store.version_dir(target, store.weights_id(manifest))
    name = "model-00002-of-00002.safetensors"
    out, err = _node("send", version, name, "1000").communicate(timeout=60)
    assert out == files[name][1000:], err
    bad = _node("send", version, "../m", "0")
    out, err = bad.communicate(timeout=60)
    assert bad.returncode == 1 and out == b"" and b"is not in the manifest" in err  # no error bytes in the stream


def test_route_names_the_local_address_towards_a_peer():
    assert store.route("127.0.0.1") == "127.0.0.1"


class _Server:
    """store.py `serve` as the source node runs it: config on stdin, the port on its first line, open until EOF."""

    def __init__(self, target: str, token: str, allow: list[str]) -> None:
        self.proc = _node("serve", target)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"token": token, "allow": allow, "bind": "127.0.0.1"}).encode() + b"\n")
        self.proc.stdin.flush()
        first = json.loads(self.proc.stdout.readline())
        assert "port" in first, first
        self.url = f"http://127.0.0.1:{first['port']}"

    def close(self) -> dict:
        out, err = self.proc.communicate(timeout=30)  # EOF on stdin: the server ends
        assert self.proc.returncode == 0, err
        return json.loads(out.decode().strip().splitlines()[-1])


def test_a_target_pulls_from_the_source_server_resumes_and_verifies(tmp_path):
    target, manifest, files = _staged_source(tmp_path)
    wid = store.weights_id(manifest)
    token = "t0ken-" + "x" * 30
    server = _Server(target, token, ["127.0.0.1"])
    try:
        dest_parent = tmp_path / "dstnode"
        dest_parent.mkdir()
        dest = str(dest_parent / "m")
        store.prepare(dest, manifest)
        cut = "model-00001-of-00002.safetensors"
        with open(os.path.join(store.partial_dir(dest, wid), cut), "wb") as fh:  # an earlier run cut short
            fh.write(files[cut][:5000])
        have = store.prepare(dest, manifest)
        assert have["files"][cut] == {"have": 5000, "done": False}
        for name, state in have["files"].items():
            done = store.receive(dest, wid, name, state["have"], None,
                                 fetch=store._fetch_http(server.url, name, token=token))
            assert done["resumed_at"] == state["have"]
        store.commit(dest, wid, None)
        store.activate(dest, wid)
        for name, data in files.items():
            assert (dest_parent / "m" / name).read_bytes() == data
    finally:
        counts = server.close()
    assert counts["served"] == 3 and counts["bytes"] == sum(len(d) for d in files.values()) - 5000
    assert counts["refused"] == 0


@pytest.mark.parametrize("token, allow, name, code", [
    ("wrong", ["127.0.0.1"], "config.json", "HTTP Error 403"),
    (None, ["127.0.0.1"], "config.json", "HTTP Error 403"),
    ("right", ["10.9.9.9"], "config.json", "HTTP Error 403"),  # the target's address only
    ("right", ["127.0.0.1"], "../../../etc/passwd", "HTTP Error 404"),  # the manifest's files only
    ("right", ["127.0.0.1"], ".pdkit-manifest.json", "HTTP Error 404"),
])
def test_the_source_server_refuses_other_addresses_tokens_and_files(tmp_path, token, allow, name, code):
    target, _, _ = _staged_source(tmp_path)
    server = _Server(target, "right", allow)
    try:
        with pytest.raises(store.StageError, match=code) as err:
            store._fetch_http(server.url, name, token=token)(0)
        assert "right" not in str(err.value)  # the token is never in a URL or a message
    finally:
        counts = server.close()
    assert counts["refused"] == 1 and counts["served"] == 0


def test_the_server_cannot_start_on_an_address_that_is_not_the_nodes(tmp_path):
    target, _, _ = _staged_source(tmp_path)
    proc = _node("serve", target)
    out, _ = proc.communicate(json.dumps({"token": "t", "allow": [], "bind": "192.0.2.77"}).encode() + b"\n",
                              timeout=30)
    answer = json.loads(out)
    assert proc.returncode == 1 and "cannot listen on 192.0.2.77" in answer["error"]
    assert "pdkit_node.address, else ssh_hostname" in answer["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop happens only when the server starts as root")
def test_the_server_runs_as_nobody_once_its_files_are_open(tmp_path):
    target, _, _ = _staged_source(tmp_path)
    server = _Server(target, "t", ["127.0.0.1"])
    try:
        status = open(f"/proc/{_python_child(server.proc.pid)}/status").read()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        assert uid != "0"
    finally:
        server.close()


def _python_child(pid: int) -> int:
    """The python3 under the shell Popen started (shell=True: `sh -c` may exec it or fork it)."""
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    return int(children[0]) if children else pid



# ---------------------------------------------------------------- the control side, over faked nodes


class _FakeNode:
    """A Node whose store.py answers are given: ACTION -> a dict, or a function (args, stdin) -> dict."""

    def __init__(self, name: str, answers: dict) -> None:
        self.name, self.answers, self.sudo = name, answers, False
        self.calls: list[tuple] = []
        self.logs: list[str] = []

    def log(self, message: str) -> None:
        self.logs.append(message)

    def call(self, action, target, *args, stdin=None, feed=None, on_stderr=None, timeout=None):
        self.calls.append((action, target, *args, stdin))
        answer = self.answers[action]
        return answer(args, stdin) if callable(answer) else answer


class _FakeServer:
    made: list[_FakeServer] = []

    def __init__(self, peer, allow) -> None:
        self.allow, self.url, self.token, self.closed = allow, "http://10.0.0.1:40000", "s3cret-token", False
        _FakeServer.made.append(self)

    def close(self) -> dict:
        self.closed = True
        return {"served": 0, "refused": 0}


MANIFEST = {n: {"sha256": "a" * 64, "size": 10} for n in ("config.json", "model-1.safetensors", "model-2.safetensors")}


def _target(fetch) -> _FakeNode:
    return _FakeNode("gpu2", {
        "prepare": {"ready": False, "active": {"kind": "missing", "id": None},
                    "files": {n: {"have": 0, "done": False} for n in MANIFEST}},
        "route": {"address": "10.0.0.2"}, "fetch": fetch,
        "commit": {"version": ".m.pdkit-w-x", "already": False, "verified": 3, "group": "pdkit", "mode": "0640"},
        "activate": {}})


def _peer_source(source_node: _FakeNode, via: str = "pull") -> stage.Source:
    source = stage.parse_source("node:gpu1")
    source.peer = stage.PeerSource(source_node, "/srv/models/m", "/srv/models/.m.pdkit-w-x", "10.0.0.1", via)
    return source


def test_a_target_that_cannot_reach_the_source_stops_at_the_first_file_and_says_via_control(monkeypatch):
    monkeypatch.setattr(stage, "PeerServer", _FakeServer)

    def refused(args, stdin):
        raise stage.NodeError(f"gpu2: cannot fetch {args[3]}/{args[1]}: <urlopen error [Errno 111] Connection refused>")
    target = _target(refused)
    with pytest.raises(stage.SourceError) as err:
        stage.stage_node(target, "/srv/models/m", MANIFEST, _peer_source(_FakeNode("gpu1", {})), "pdkit", False,
                         progress_stream=open(os.devnull, "w"))
    assert "cannot reach gpu1's weights at http://10.0.0.1:40000: <urlopen error [Errno 111] Connection refused>" \
        in str(err.value) and "re-run with --via control" in str(err.value)
    fetches = [c for c in target.calls if c[0] == "fetch"]
    assert len(fetches) == 1 and not [c for c in target.calls if c[0] == "commit"]  # nothing else tried or committed
    server = _FakeServer.made[-1]
    assert server.closed and server.allow == "10.0.0.2"  # the server for the target's own address, ended
    assert "s3cret-token" not in " ".join(map(str, fetches[0][:-1])) and b"s3cret-token" in fetches[0][-1]


@pytest.mark.parametrize("source_matches, words", [
    (False, "model-2.safetensors: gpu1's own copy does not match its manifest (sha256 bbbbbbbbbbbbbbbb..., 10 bytes)"),
    (True, "model-2.safetensors: sha256 cccc... does not match the manifest's aaaa..."),  # corrupted on the way
])
def test_a_mismatch_from_a_node_source_says_whose_copy_is_bad_and_the_others_go_on(monkeypatch, source_matches,
                                                                                   words):
    monkeypatch.setattr(stage, "PeerServer", _FakeServer)

    def fetch(args, stdin):
        if args[1] == "model-2.safetensors":
            raise stage.NodeError(f"gpu2: {args[1]}: sha256 cccc... does not match the manifest's aaaa... "
                                  "(a corrupted source or transfer); the file was discarded, nothing was replaced")
        return {"file": args[1]}
    source_node = _FakeNode("gpu1", {"hash": {"matches": source_matches, "sha256": "b" * 64, "size": 10}})
    target = _target(fetch)
    with pytest.raises(stage.NodeError) as err:
        stage.stage_node(target, "/srv/models/m", MANIFEST, _peer_source(source_node), "pdkit", False,
                         progress_stream=open(os.devnull, "w"))
    assert words in str(err.value) and "1 file(s) failed" in str(err.value)
    assert [c[3] for c in target.calls if c[0] == "fetch"] == sorted(MANIFEST)  # the other files still went
    assert source_node.calls == [("hash", "/srv/models/.m.pdkit-w-x", "model-2.safetensors", None)]
    assert not [c for c in target.calls if c[0] in ("commit", "activate")]


def test_a_no_op_run_from_a_node_opens_no_server(monkeypatch):
    monkeypatch.setattr(stage, "PeerServer", _FakeServer)
    _FakeServer.made.clear()
    target = _target({})
    target.answers["prepare"] = {"ready": True, "active": {"kind": "link", "id": store.weights_id(MANIFEST)},
                                 "files": {}}
    target.answers["commit"] = {"version": ".m.pdkit-w-x", "already": True, "verified": 0, "group": "pdkit",
                                "mode": "0640"}
    result = stage.stage_node(target, "/srv/models/m", MANIFEST, _peer_source(_FakeNode("gpu1", {})), "pdkit", False)
    assert result.activated == "already" and _FakeServer.made == []


@pytest.mark.parametrize("args, words", [
    (["--source", "node:nope"], "--source node:nope: no host nope in the inventory; valid: node:HOST with HOST one of "
                                "lab-gpu1, lab-gpu2, lab-gpu3, lab-mon"),
    (["--source", "node:lab-gpu1", "--limit", "lab-gpu1"], "valid --limit: lab-gpu2, lab-gpu3"),
    (["--source", "node:lab-gpu1", "--manifest", "m.json"], "the source node's own manifest"),
    (["--source", "node:lab-mon"], "give the path: --source node:lab-mon:/path/to/model"),
])
def test_the_command_refuses_before_contacting_anything(tmp_path, args, words):
    """The CLI's wiring, on the lab's inventory with no lab up (its planned addresses): exit 2, nothing contacted."""
    pdkit = os.path.join(os.path.dirname(sys.executable), "pdkit")
    done = subprocess.run([pdkit, "stage", "inventories/lab.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PDKIT_LAB_DIR": str(tmp_path / "nolab")})
    assert done.returncode == 2 and words in done.stderr and "nothing was contacted" in done.stderr, done.stderr
