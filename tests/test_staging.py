"""Issue 47 item 5: pdkit/agent/weightstore.py (the node's side of `pdkit stage`) on a temp directory, and
the manifest against SGLang's own verifier (the contract virtualenvs)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import stat
import subprocess

import pytest

from pdkit.agent import weightstore as store
from pdkit.upstream import startchecks, venvs
from pdkit.upstream.versions import SGLANG_RELEASES
from pdkit.weights import stage
from tests.conftest import require


def _model(directory, seed: int = 7, shards: int = 3, size: int = 300_000) -> dict[str, bytes]:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    files = {f"model-{i:05d}-of-{shards:05d}.safetensors": rng.randbytes(size + i) for i in range(1, shards + 1)}
    files["config.json"] = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "README.md").write_text("left out, as SGLang leaves it out\n")
    (directory / ".hidden").write_text("left out\n")
    return files


def _sent(target: str, manifest: dict, source, name: str, offset: int = 0, data: bytes | None = None) -> dict:
    wid = store.weights_id(manifest)
    body = (source / name).read_bytes()[offset:] if data is None else data
    return store.receive(target, wid, name, offset, io.BytesIO(body))


def _stage_all(target: str, manifest: dict, source) -> dict:
    have = store.prepare(target, manifest)
    for name, state in have["files"].items():
        if not state["done"]:
            _sent(target, manifest, source, name, state["have"])
    return have


# ---------------------------------------------------------------- the manifest


def test_the_manifest_is_sglangs_format_byte_for_byte(tmp_path):
    files = _model(tmp_path / "src")
    manifest = store.generate(str(tmp_path / "src"))
    assert sorted(manifest) == sorted(files)  # README.md and dot files left out, as SGLang's generate does
    text = store.manifest_bytes(manifest).decode()
    expected = {"files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()}}
    assert text == json.dumps(expected, indent=2, sort_keys=True)  # model_file_verifier.py generate_checksums
    assert store.parse_manifest(text) == manifest
    assert store.weights_id(manifest) == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("text, words", [
    ("not json", "is not JSON"),
    ('{"checksums": {"a": "00"}}', "old 'checksums' format"),
    ('{"files": {}}', "no 'files' table"),
    ('{"files": {"sub/a": {"sha256": "' + "0" * 64 + '", "size": 1}}}', "not a plain top-level file name"),
    ('{"files": {"a": {"sha256": "xyz", "size": 1}}}', "64 lowercase hex"),
    ('{"files": {"a": {"sha256": "' + "0" * 64 + '", "size": -1}}}', "size must be a byte count"),
])
def test_a_manifest_pdkit_cannot_stage_is_refused_saying_why(text, words):
    with pytest.raises(store.StageError, match=words):
        store.parse_manifest(text, "m.json")


# ---------------------------------------------------------------- staging, resume, verification


def test_staging_verifies_commits_and_activates_without_touching_the_target_before(tmp_path):
    src = tmp_path / "src"
    _model(src)
    manifest = store.generate(str(src))
    wid = store.weights_id(manifest)
    target = str(tmp_path / "models" / "m")
    (tmp_path / "models").mkdir()
    have = _stage_all(target, manifest, src)
    assert have["active"]["kind"] == "missing" and not os.path.lexists(target)
    assert stat.S_IMODE(os.stat(store.partial_dir(target, wid)).st_mode) == 0o700  # nobody reads a transfer
    done = store.commit(target, wid, None)
    version = store.version_dir(target, wid)
    assert done["verified"] == len(manifest) and os.path.isdir(version) and not os.path.exists(store.partial_dir(target, wid))
    assert not os.path.lexists(target)  # commit never touches the model path
    for name in manifest:
        st = os.stat(os.path.join(version, name))
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, store.OPEN_FILE_MODE)  # no service group here: o+r only
    assert (tmp_path / "models" / os.path.basename(version) / store.MANIFEST_NAME).read_bytes() == store.manifest_bytes(manifest)
    store.activate(target, wid)
    assert os.readlink(target) == os.path.basename(version)  # relative: valid inside a container's root too
    assert store.active(target)["id"] == wid
    assert store.prepare(target, manifest)["ready"] is True  # a second run sends nothing


def test_the_service_group_reads_and_nobody_else(tmp_path):
    src = tmp_path / "src"
    _model(src, shards=1)
    manifest = store.generate(str(src))
    target = str(tmp_path / "m")
    _stage_all(target, manifest, src)
    group = "nogroup" if _has_group("nogroup") else "daemon"
    store.commit(target, store.weights_id(manifest), group)
    version = store.version_dir(target, store.weights_id(manifest))
    for p in [version, *(os.path.join(version, n) for n in manifest)]:
        st = os.stat(p)
        mode = store.DIR_MODE if os.path.isdir(p) else store.FILE_MODE
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode) and st.st_gid != 0, p


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def test_an_interrupted_transfer_is_resumed_from_its_end_and_done_files_are_skipped(tmp_path):
    src = tmp_path / "src"
    files = _model(src)
    manifest = store.generate(str(src))
    target = str(tmp_path / "m")
    names = sorted(n for n in manifest if n.endswith(".safetensors"))
    store.prepare(target, manifest)
    _sent(target, manifest, src, names[0])
    with pytest.raises(store.StageError, match="ended at byte 1000 of"):  # the connection dropped mid-file
        _sent(target, manifest, src, names[1], 0, files[names[1]][:1000])
    have = store.prepare(target, manifest)
    assert have["files"][names[0]] == {"have": len(files[names[0]]), "done": True}
    assert have["files"][names[1]] == {"have": 1000, "done": False}
    out = _sent(target, manifest, src, names[1], 1000)
    assert out["resumed_at"] == 1000 and out["sha256"] == manifest[names[1]]["sha256"]


def test_a_corrupted_file_is_discarded_and_sent_again_and_nothing_is_replaced(tmp_path):
    src = tmp_path / "src"
    files = _model(src)
    old = tmp_path / "old"
    _model(old, seed=1)
    manifest = store.generate(str(src))
    wid = store.weights_id(manifest)
    target = str(tmp_path / "m")
    # the good weights the engines run now
    old_manifest = store.generate(str(old))
    _stage_all(target, old_manifest, old)
    store.commit(target, store.weights_id(old_manifest), None)
    store.activate(target, store.weights_id(old_manifest))
    name = sorted(n for n in manifest if n.endswith(".safetensors"))[0]
    store.prepare(target, manifest)
    bad = bytearray(files[name])
    bad[5] ^= 0xFF
    with pytest.raises(store.StageError, match="does not match the manifest"):  # a corrupted source
        _sent(target, manifest, src, name, 0, bytes(bad))
    assert not os.path.exists(os.path.join(store.partial_dir(target, wid), name))
    # a corrupted copy on the node's disk (full size, other bytes): prepare sends it again from byte 0
    _stage_all(target, manifest, src)
    p = os.path.join(store.partial_dir(target, wid), name)
    with open(p, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\0\0\0")
    with pytest.raises(store.StageError, match=f"{name}: sha256"):
        store.commit(target, wid, None)  # read back from disk before the rename
    assert store.active(target)["id"] == store.weights_id(old_manifest)  # the good weights still serve
    have = store.prepare(target, manifest)
    assert have["files"][name]["have"] == 0 and "did not match" in have["files"][name]["restarted"]
    _stage_all(target, manifest, src)
    store.commit(target, wid, None)
    store.activate(target, wid)
    assert store.active(target)["id"] == wid
    assert os.path.isdir(store.version_dir(target, store.weights_id(old_manifest)))  # kept: releases prune it


def test_a_hand_copied_directory_is_swapped_out_atomically_and_kept(tmp_path):
    src = tmp_path / "src"
    _model(src, shards=1)
    manifest = store.generate(str(src))
    target = tmp_path / "m"
    target.mkdir()
    (target / "weights.bin").write_text("by hand")
    _stage_all(str(target), manifest, src)
    store.commit(str(target), store.weights_id(manifest), None)
    out = store.activate(str(target), store.weights_id(manifest))
    assert target.is_symlink() and (tmp_path / os.path.basename(out["kept"]) / "weights.bin").read_text() == "by hand"


def test_more_bytes_than_the_manifest_says_are_refused(tmp_path):
    src = tmp_path / "src"
    files = _model(src, shards=1)
    manifest = store.generate(str(src))
    target = str(tmp_path / "m")
    store.prepare(target, manifest)
    name = "model-00001-of-00001.safetensors"
    with pytest.raises(store.StageError, match="more than the manifest"):
        _sent(target, manifest, src, name, 0, files[name] + b"x")


def test_the_node_command_runs_the_store_on_a_bare_python3(tmp_path):
    """What `pdkit stage` sends over SSH: store.py's source, run by python3 with no pdkit installed."""
    src = tmp_path / "src"
    _model(src, shards=1)
    manifest = store.generate(str(src))
    target = str(tmp_path / "m")
    run = subprocess.run(["bash", "-c", stage.node_command("prepare", target)], input=store.manifest_bytes(manifest),
                         capture_output=True, cwd="/", env={"PATH": os.environ["PATH"]})
    answer = json.loads(run.stdout)
    assert run.returncode == 0 and answer["id"] == store.weights_id(manifest) and not answer["ready"]
    assert "sudo -n python3" in stage.node_command("status", target, sudo=True)


def test_progress_names_bytes_rate_and_eta():
    clock = iter([0.0, 0.5, 1.2, 2.0, 2.0]).__next__
    out = io.StringIO()
    bar = stage.ShardProgress("gpu1", "model-1.safetensors", 400_000_000, 100_000_000, stream=out, clock=clock)
    bar.advance(50_000_000)  # 0.5 s: quieter than the interval
    bar.advance(50_000_000)  # 1.2 s
    assert out.getvalue().splitlines() == [
        "pdkit stage: gpu1: model-1.safetensors 200.0 MB / 400.0 MB (50%) 83.3 MB/s ETA 0:00:02"]
    bar.finished()
    assert "resumed at 100.0 MB" in out.getvalue()


# ---------------------------------------------------------------- SGLang's own verifier (contract)


def _verifier(version: str):
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    return venvs.env_python(f"sglang-{version}"), root / "srt" / "utils" / "model_file_verifier.py"


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_sglang_verifies_pdkits_manifest_and_pdkit_reads_sglangs(tmp_path, version):
    """Both ways: SGLang's `verify` (what --model-checksum runs) accepts pdkit's manifest, pdkit's parser
    reads SGLang's `generate` byte for byte, and SGLang refuses a directory pdkit's manifest says is wrong."""
    python, script = _verifier(version)
    src = tmp_path / "m"
    _model(src)
    ours = tmp_path / "pdkit.json"
    ours.write_bytes(store.manifest_bytes(store.generate(str(src))))
    # the file run as a script: `python -m sglang.srt.utils.model_file_verifier` imports sglang's package
    # (triton and torch, absent from the contract virtualenv); the functions are the same
    run = subprocess.run([str(python), str(script), "verify", "--model-path", str(src), "--model-checksum", str(ours)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "verified successfully" in run.stdout, run.stderr[-2000:]
    theirs = tmp_path / "sglang.json"
    run = subprocess.run([str(python), str(script), "generate", "--model-path", str(src), "--model-checksum",
                          str(theirs)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert theirs.read_bytes() == ours.read_bytes()
    assert store.parse_manifest(theirs.read_bytes()) == store.generate(str(src))
    victim = sorted(src.glob("*.safetensors"))[0]
    data = bytearray(victim.read_bytes())
    data[0] ^= 1
    victim.write_bytes(bytes(data))
    run = subprocess.run([str(python), str(script), "verify", "--model-path", str(src), "--model-checksum", str(ours)],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "Integrity check failed" in run.stderr


def test_a_version_staged_before_the_service_group_existed_gets_it_on_the_next_run(tmp_path):
    src = tmp_path / "src"
    _model(src, shards=1)
    manifest = store.generate(str(src))
    wid = store.weights_id(manifest)
    target = str(tmp_path / "m")
    _stage_all(target, manifest, src)
    store.commit(target, wid, "no-such-group-pdkit")  # a node never deployed: read-only for everyone
    version = store.version_dir(target, wid)
    assert stat.S_IMODE(os.stat(version).st_mode) == store.OPEN_DIR_MODE
    group = "nogroup" if _has_group("nogroup") else "daemon"
    out = store.commit(target, wid, group)  # the deploy made the group: the next stage hands it the weights
    assert out["already"] and out["group"] == group
    name = next(iter(manifest))
    st = os.stat(os.path.join(version, name))
    assert stat.S_IMODE(st.st_mode) == store.FILE_MODE and st.st_gid != 0


# ---------------------------------------------------------------- an HTTP mirror the node fetches from


class _Mirror:
    """An HTTP server over DIRECTORY honouring `Range: bytes=N-` (as nginx, S3 or `python -m RangeHTTPServer`
    do), which can cut a file short after CUT bytes once, or ignore Range (a server that cannot resume)."""

    def __init__(self, directory, ranges: bool = True):
        import http.server
        import threading

        mirror = self
        self.cut: dict[str, int] = {}
        self.ranges = ranges
        self.requests: list[tuple[str, str | None]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                rng = self.headers.get("Range")
                mirror.requests.append((name, rng))
                path = directory / name
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                start = int(rng.split("=")[1].rstrip("-")) if rng and mirror.ranges else 0
                body = data[start:]
                cut = mirror.cut.pop(name, None)
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body if cut is None else body[:cut])
                if cut is not None:
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_mirror_the_node_fetches_from_is_resumed_with_a_range_request_and_verified(tmp_path):
    """The node's side of `pdkit stage --source http://...` (store.py `fetch`): a transfer the mirror cut short
    keeps its bytes, the next fetch asks for the rest with `Range: bytes=N-`, and the file is verified and
    committed like a pushed one."""
    src = tmp_path / "src"
    files = _model(src)
    manifest = store.generate(str(src))
    wid = store.weights_id(manifest)
    target = str(tmp_path / "m")
    mirror = _Mirror(src)
    try:
        names = sorted(manifest)
        cut_name = next(n for n in names if n.endswith(".safetensors"))
        mirror.cut[cut_name] = 1000
        store.prepare(target, manifest)
        with pytest.raises(store.StageError):
            store.receive(target, wid, cut_name, 0, None, fetch=store._fetch_http(mirror.url, cut_name))
        have = store.prepare(target, manifest)
        assert have["files"][cut_name] == {"have": 1000, "done": False}
        out = store.receive(target, wid, cut_name, 1000, None, fetch=store._fetch_http(mirror.url, cut_name))
        assert out["resumed_at"] == 1000 and out["sha256"] == manifest[cut_name]["sha256"]
        assert mirror.requests[-1] == (cut_name, "bytes=1000-")
        for name, state in store.prepare(target, manifest)["files"].items():
            if not state["done"]:
                store.receive(target, wid, name, state["have"], None, fetch=store._fetch_http(mirror.url, name))
        store.commit(target, wid, None)
        version = tmp_path / os.path.basename(store.version_dir(target, wid))
        assert {p.name: p.read_bytes() for p in version.iterdir() if not p.name.startswith(".")} == files
    finally:
        mirror.close()


def test_a_mirror_that_ignores_range_cannot_resume_and_says_so(tmp_path):
    src = tmp_path / "src"
    _model(src)
    manifest = store.generate(str(src))
    wid = store.weights_id(manifest)
    target = str(tmp_path / "m")
    mirror = _Mirror(src, ranges=False)
    try:
        name = next(n for n in sorted(manifest) if n.endswith(".safetensors"))
        mirror.cut[name] = 1000
        store.prepare(target, manifest)
        with pytest.raises(store.StageError):
            store.receive(target, wid, name, 0, None, fetch=store._fetch_http(mirror.url, name))
        with pytest.raises(store.StageError, match="ignored the Range request"):
            store.receive(target, wid, name, 1000, None, fetch=store._fetch_http(mirror.url, name))
        # nothing was committed: the target was never touched
        assert not os.path.lexists(target)
    finally:
        mirror.close()


def test_a_missing_file_on_the_mirror_names_the_url(tmp_path):
    src = tmp_path / "src"
    _model(src)
    manifest = store.generate(str(src))
    target = str(tmp_path / "m")
    mirror = _Mirror(tmp_path / "empty")
    try:
        name = sorted(manifest)[0]
        store.prepare(target, manifest)
        with pytest.raises(store.StageError, match=f"cannot fetch {mirror.url}{name}"):
            store.receive(target, store.weights_id(manifest), name, 0, None, fetch=store._fetch_http(mirror.url, name))
    finally:
        mirror.close()
