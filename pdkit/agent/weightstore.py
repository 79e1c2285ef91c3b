"""The node's side of weight staging (issue 47 item 5): the manifest, the staging directory, verify, commit, activate.

Self-contained and standard library only: `pdkit stage` sends this file's source to the node and runs it
with the node's own `python3` (`python3 -c <bootstrap> ACTION ...`), so it works on a node that has
never been deployed (no node venv yet). The control side (pdkit/weights/stage.py) imports the same
file for the manifest and the layout, so both sides spell them once.

The manifest is SGLang's own (sglang/srt/utils/model_file_verifier.py, identical in 0.5.17 and 0.5.23):

    {"files": {"<file name>": {"sha256": "<hex>", "size": <bytes>}, ...}}

written by `python -m sglang.srt.utils.model_file_verifier generate` as `json.dumps(m, indent=2,
sort_keys=True)` (no trailing newline) and read by its `verify` and the engine's `--model-checksum`.
Only the directory's top-level files are listed (names not starting with '.', and not matching
SGLang's ignore list: README, LICENSE, NOTICE, *.lock, .gitattributes, .DS_Store). pdkit writes the
same bytes (`manifest_bytes`), so a manifest's SHA-256 (the weights id) is the same whichever of the
two wrote it.

On the node, beside the model path TARGET (`/srv/models/m`):

    /srv/models/m                      -> .m.pdkit-w-<id16>   (a relative symlink, switched atomically)
    /srv/models/.m.pdkit-w-<id16>/     a verified version: the files, and .pdkit-manifest.json
    /srv/models/.m.pdkit-w-<id16>.partial/   a transfer in progress (root only, 0700): resumed, never read

A version directory exists only once every file matched the manifest (size and SHA-256, read back from
disk); it is the rename of the .partial directory. Versions are owned by root, group the engines'
service group, files 0640 and directories 0750: the engines read them and nothing else does. An
interrupted or corrupted transfer leaves only a .partial directory: TARGET is never touched by it.

A node that has a verified version can be the source of another (`--source node:HOST`): `offer` (its
version and own manifest, or why not), `serve` (a one-transfer read-only HTTP server the target's
`fetch` pulls from), `send` (the bytes to stdout, for the relay through the control machine), `hash`
(whose copy is bad after a mismatch), and `route` on the target (the address the server lets in).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fnmatch
import grp
import hashlib
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO

MANIFEST_NAME = ".pdkit-manifest.json"
VERSION_MARK = ".pdkit-w-"
PARTIAL_SUFFIX = ".partial"
# the header a source node's server wants its one-transfer token in (a header: never in a URL or argv)
TOKEN_HEADER = "X-Pdkit-Token"
ID_CHARS = 16
CHUNK = 1 << 20
# SGLang's IGNORE_PATTERNS (sglang/srt/utils/model_file_verifier.py, 0.5.17 and 0.5.23): files its
# `generate` leaves out of a manifest; pdkit leaves out the same ones so the two manifests agree
IGNORED = (".DS_Store", "*.lock", ".gitattributes", "LICENSE", "LICENSE.*", "README.md", "README.*", "NOTICE")
FILE_MODE, DIR_MODE = 0o640, 0o750
# without the service group (a node never deployed): world-readable, still read-only
OPEN_FILE_MODE, OPEN_DIR_MODE = 0o644, 0o755


class StageError(RuntimeError):
    """Staging cannot go on; the message names the path and what was found."""


# ---------------------------------------------------------------- the manifest (SGLang's format)


def manifest_bytes(files: dict[str, dict[str, Any]]) -> bytes:
    """The manifest of FILES ({name: {sha256, size}}) byte for byte as SGLang's `generate` writes it."""
    body = {"files": {name: {"sha256": info["sha256"], "size": int(info["size"])} for name, info in files.items()}}
    return json.dumps(body, indent=2, sort_keys=True).encode()


def weights_id(files: dict[str, dict[str, Any]]) -> str:
    """The SHA-256 of the manifest's bytes: what a release records as its weights."""
    return hashlib.sha256(manifest_bytes(files)).hexdigest()


def parse_manifest(text: str | bytes, where: str = "the manifest") -> dict[str, dict[str, Any]]:
    """{name: {sha256, size}} from a manifest's text; StageError naming WHERE when it is not one pdkit can stage."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StageError(f"{where} is not JSON: {exc}") from exc
    if isinstance(data, dict) and "checksums" in data and "files" not in data:
        raise StageError(f"{where} is SGLang's old 'checksums' format (no sizes): regenerate it with `python -m "
                         "sglang.srt.utils.model_file_verifier generate` or let `pdkit stage` write one")
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        raise StageError(f"{where} has no 'files' table; valid: "
                         '{"files": {NAME: {"sha256": HEX, "size": N}}}')
    out: dict[str, dict[str, Any]] = {}
    for name, info in files.items():
        if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or name.startswith("."):
            raise StageError(f"{where}: file name {name!r} is not a plain top-level file name of the model directory")
        if not isinstance(info, dict) or not re.fullmatch(r"[0-9a-f]{64}", str(info.get("sha256", ""))):
            raise StageError(f"{where}: {name}: sha256 must be 64 lowercase hex digits, got {info!r}")
        size = info.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise StageError(f"{where}: {name}: size must be a byte count (an integer >= 0), got {size!r}")
        out[name] = {"sha256": info["sha256"], "size": size}
    return out


def discover(directory: str) -> list[str]:
    """The files SGLang's `generate` would list in DIRECTORY: top-level regular files (symlinks followed)."""
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise StageError(f"cannot list {directory}: {exc.strerror or exc}") from exc
    return sorted(n for n in names if os.path.isfile(os.path.join(directory, n)) and not n.startswith(".")
                  and not any(fnmatch.fnmatch(n, p) for p in IGNORED))


def file_sha256(path: str, limit: int | None = None, progress: Callable[[int], object] | None = None) -> str:
    """SHA-256 of PATH's bytes (its first LIMIT bytes when given)."""
    digest = hashlib.sha256()
    left = limit
    with open(path, "rb") as fh:
        while left is None or left > 0:
            chunk = fh.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            if left is not None:
                left -= len(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


def generate(directory: str, progress: Callable[[int], object] | None = None) -> dict[str, dict[str, Any]]:
    """The manifest of DIRECTORY ({name: {sha256, size}}), as SGLang's `generate` computes it."""
    names = discover(directory)
    if not names:
        raise StageError(f"no model files in {directory} (SGLang's manifest lists its top-level files)")
    return {n: {"sha256": file_sha256(os.path.join(directory, n), progress=progress),
                "size": os.path.getsize(os.path.join(directory, n))} for n in names}


def compare(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any] | None]) -> list[str]:
    """Every file of EXPECTED that ACTUAL ({name: {sha256, size} or None}) lacks or has with other bytes."""
    problems = []
    for name, want in sorted(expected.items()):
        have = actual.get(name)
        if have is None:
            problems.append(f"{name}: missing (expected {want['size']} bytes)")
        elif have["size"] != want["size"]:
            problems.append(f"{name}: {have['size']} bytes, expected {want['size']}")
        elif have["sha256"] != want["sha256"]:
            problems.append(f"{name}: sha256 {have['sha256'][:16]}..., expected {want['sha256'][:16]}...")
    return problems


# ---------------------------------------------------------------- the layout beside TARGET


def version_name(target: str, wid: str) -> str:
    """The version directory's name (no path) for weights WID of TARGET."""
    return f".{os.path.basename(target.rstrip('/'))}{VERSION_MARK}{wid[:ID_CHARS]}"


def version_dir(target: str, wid: str) -> str:
    return os.path.join(os.path.dirname(target.rstrip("/")), version_name(target, wid))


def partial_dir(target: str, wid: str) -> str:
    return version_dir(target, wid) + PARTIAL_SUFFIX


def is_version_of(target: str, name: str) -> bool:
    """Whether NAME (beside TARGET) is one of TARGET's version directories (not a transfer in progress)."""
    head = f".{os.path.basename(target.rstrip('/'))}{VERSION_MARK}"
    return name.startswith(head) and re.fullmatch(r"[0-9a-f]{%d}" % ID_CHARS, name[len(head):]) is not None


def active(target: str) -> dict[str, Any]:
    """What TARGET is now: {kind: missing|link|dir|other, version (a version name) or None, id or None}."""
    if os.path.islink(target):
        dest = os.readlink(target)
        name = os.path.basename(dest.rstrip("/"))
        beside = os.path.dirname(dest.rstrip("/")) in ("", os.path.dirname(target.rstrip("/")))
        if beside and is_version_of(target, name):
            wid = manifest_id(os.path.join(os.path.dirname(target.rstrip("/")), name))
            return {"kind": "link", "version": name, "id": wid, "dest": dest}
        return {"kind": "link", "version": None, "id": None, "dest": dest}
    if os.path.isdir(target):
        return {"kind": "dir", "version": None, "id": None}
    if os.path.lexists(target):
        return {"kind": "other", "version": None, "id": None}
    return {"kind": "missing", "version": None, "id": None}


def manifest_id(version: str) -> str | None:
    """The weights id (SHA-256 of the manifest's bytes) of a version directory, or None."""
    try:
        with open(os.path.join(version, MANIFEST_NAME), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


# ---------------------------------------------------------------- node actions


def _groups(group: str | None) -> tuple[int, int, int]:
    """(gid, file mode, dir mode): the service group's read access, or world-readable without it."""
    if group:
        try:
            return grp.getgrnam(group).gr_gid, FILE_MODE, DIR_MODE
        except KeyError:
            pass
    return 0, OPEN_FILE_MODE, OPEN_DIR_MODE


def _stat_files(
    directory: str, manifest: dict[str, dict[str, Any]], hash_them: bool
) -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {}
    for name, want in manifest.items():
        path = os.path.join(directory, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            out[name] = None
            continue
        sha = file_sha256(path) if hash_them and size == want["size"] else None
        out[name] = {"size": size, "sha256": sha}
    return out


def prepare(target: str, manifest: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Open (or resume) the staging of MANIFEST for TARGET; per file, what the node already has.

    {id, active, ready (the version exists already), files: {name: {have (bytes kept), done (bool)}}}.
    A file whose size and SHA-256 match is done; a shorter one is resumed from its end; a longer one,
    or one of the full size with other bytes, starts again.
    """
    wid = weights_id(manifest)
    parent = os.path.dirname(target.rstrip("/"))
    if not os.path.isdir(parent):
        raise StageError(f"the directory {parent} (above {target}) does not exist: create it, or set the model path "
                         "to where the weights go")
    files: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {"id": wid, "active": active(target), "ready": False, "files": files}
    if os.path.isdir(version_dir(target, wid)) and manifest_id(version_dir(target, wid)) == wid:
        result["ready"] = True
        return result
    staging = partial_dir(target, wid)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    os.chmod(staging, 0o700)
    _write(os.path.join(staging, MANIFEST_NAME), manifest_bytes(manifest), 0o600)
    for name, info in _stat_files(staging, manifest, hash_them=True).items():
        want = manifest[name]
        if info is None:
            files[name] = {"have": 0, "done": False}
        elif info["size"] == want["size"] and info["sha256"] == want["sha256"]:
            files[name] = {"have": info["size"], "done": True}
        elif info["size"] < want["size"]:
            files[name] = {"have": info["size"], "done": False}
        else:  # too long, or the full size with other bytes: nothing of it can be trusted
            os.unlink(os.path.join(staging, name))
            files[name] = {"have": 0, "done": False, "restarted": f"{info['size']} bytes that did not match"}
    return result


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def receive(
    target: str, wid: str, name: str, offset: int, stream: BinaryIO | None,
    fetch: Callable[[int], BinaryIO] | None = None, report: Callable[[int], object] | None = None,
) -> dict[str, Any]:
    """Append a file's bytes from OFFSET (read from STREAM, or from FETCH(offset) -> stream) to the staging
    directory, then check its size and SHA-256 against the manifest there. A mismatch deletes it and
    raises; an early end of the stream keeps what arrived (the next run resumes) and raises."""
    staging = partial_dir(target, wid)
    try:
        with open(os.path.join(staging, MANIFEST_NAME), "rb") as fh:
            manifest = parse_manifest(fh.read(), f"{staging}/{MANIFEST_NAME}")
    except OSError as exc:
        raise StageError(f"no staging directory {staging} for weights {wid[:ID_CHARS]}: run prepare first") from exc
    if name not in manifest:
        raise StageError(f"{name} is not in the manifest of weights {wid[:ID_CHARS]}")
    want = manifest[name]
    path = os.path.join(staging, name)
    have = os.path.getsize(path) if os.path.exists(path) else 0
    if offset > have:
        raise StageError(f"{path}: asked to resume at byte {offset} but the node has {have}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+b") as out:
        out.truncate(offset)
        digest = _hash_prefix(path, offset)
        out.seek(offset)
        got = offset
        source = stream if fetch is None else fetch(offset)
        assert source is not None, "receive reads STREAM, or FETCH(offset) when given"
        while got < want["size"]:
            chunk = source.read(min(CHUNK, want["size"] - got))
            if not chunk:
                break
            out.write(chunk)
            digest.update(chunk)
            got += len(chunk)
            if report:
                report(got)
        extra = source.read(1) if got == want["size"] else b""
        out.flush()
        os.fsync(out.fileno())
    if got < want["size"]:
        raise StageError(f"{name}: the transfer ended at byte {got} of {want['size']}; kept for the next run to resume")
    if extra:
        os.unlink(path)
        raise StageError(f"{name}: the source sent more than the manifest's {want['size']} bytes: the source and the "
                         "manifest disagree; the file was discarded")
    sha = digest.hexdigest()
    if sha != want["sha256"]:
        os.unlink(path)
        raise StageError(f"{name}: sha256 {sha[:16]}... does not match the manifest's {want['sha256'][:16]}... "
                         "(a corrupted source or transfer); the file was discarded, nothing was replaced")
    return {"file": name, "size": got, "sha256": sha, "resumed_at": offset}


def _hash_prefix(path: str, offset: int) -> hashlib._Hash:
    digest = hashlib.sha256()
    left = offset
    with open(path, "rb") as fh:
        while left > 0:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                raise StageError(f"{path} is shorter than {offset} bytes")
            digest.update(chunk)
            left -= len(chunk)
    return digest


def commit(target: str, wid: str, group: str | None) -> dict[str, Any]:
    """Verify every file of the staging directory against its manifest (read back from disk), give it the
    version's owner and modes, and rename it into the version directory (atomic). Nothing on TARGET changes."""
    staging, version = partial_dir(target, wid), version_dir(target, wid)
    if os.path.isdir(version) and manifest_id(version) == wid:
        # staged before the service group existed (a node never deployed): the engines' group now
        with open(os.path.join(version, MANIFEST_NAME), "rb") as fh:
            names = list(parse_manifest(fh.read(), f"{version}/{MANIFEST_NAME}"))
        gid, fmode, dmode = _groups(group)
        if os.stat(version).st_gid != gid or stat.S_IMODE(os.stat(version).st_mode) != dmode:
            _own(version, names, gid, fmode, dmode)
        return {"version": os.path.basename(version), "verified": 0, "already": True,
                "mode": "%04o" % fmode, "group": grp.getgrgid(gid).gr_name}
    with open(os.path.join(staging, MANIFEST_NAME), "rb") as fh:
        raw = fh.read()
    manifest = parse_manifest(raw, f"{staging}/{MANIFEST_NAME}")
    if hashlib.sha256(raw).hexdigest() != wid:
        raise StageError(f"{staging}/{MANIFEST_NAME} is not the manifest of weights {wid[:ID_CHARS]}")
    extra = sorted(set(os.listdir(staging)) - set(manifest) - {MANIFEST_NAME})
    for name in extra:  # leftovers (a .tmp), never part of a version
        os.unlink(os.path.join(staging, name))
    problems = compare(manifest, _stat_files(staging, manifest, hash_them=True))
    if problems:
        raise StageError(f"{staging} does not match its manifest, nothing was replaced: " + "; ".join(problems))
    gid, fmode, dmode = _groups(group)
    _own(staging, list(manifest), gid, fmode, dmode)
    _fsync_dir(staging)
    os.rename(staging, version)
    _fsync_dir(os.path.dirname(version))
    return {"version": os.path.basename(version), "verified": len(manifest), "already": False,
            "mode": "%04o" % fmode, "group": grp.getgrgid(gid).gr_name}


def _own(directory: str, names: list[str], gid: int, fmode: int, dmode: int) -> None:
    """Root owns DIRECTORY and its files; group GID reads them (FMODE, DMODE); nobody else writes."""
    for name in [*names, MANIFEST_NAME]:
        p = os.path.join(directory, name)
        os.chown(p, 0, gid)
        os.chmod(p, fmode)
    os.chown(directory, 0, gid)
    os.chmod(directory, dmode)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> None:
    """renameat2(RENAME_EXCHANGE): swap two paths atomically (a symlink with a directory included)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.renameat2(_AT_FDCWD, a.encode(), _AT_FDCWD, b.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise StageError(f"cannot swap {a} and {b} atomically: {os.strerror(err)}")


def activate(target: str, wid: str) -> dict[str, Any]:
    """Point TARGET at version WID in one rename. A directory TARGET (weights copied by hand) is swapped
    out atomically and kept beside it as `.NAME.pdkit-unmanaged-<time>`, never deleted."""
    version = version_dir(target, wid)
    if manifest_id(version) != wid:
        raise StageError(f"{version} is not a verified version of weights {wid[:ID_CHARS]}; stage it first")
    target = target.rstrip("/")
    before = active(target)
    link_tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.pdkit-link")
    if os.path.lexists(link_tmp):
        os.unlink(link_tmp)
    os.symlink(os.path.basename(version), link_tmp)
    kept = None
    if before["kind"] == "dir":
        _exchange(link_tmp, target)
        kept = os.path.join(os.path.dirname(target),
                            f".{os.path.basename(target)}.pdkit-unmanaged-{time.strftime('%Y%m%dT%H%M%S')}")
        os.rename(link_tmp, kept)
    elif before["kind"] == "other":
        os.unlink(link_tmp)
        raise StageError(f"{target} is neither a directory nor a symlink; move it away first")
    else:
        os.replace(link_tmp, target)
    _fsync_dir(os.path.dirname(target))
    return {"target": target, "version": os.path.basename(version), "before": before, "kept": kept}


def status(target: str) -> dict[str, Any]:
    """TARGET's active version and every version and transfer in progress beside it."""
    parent = os.path.dirname(target.rstrip("/"))
    head = f".{os.path.basename(target.rstrip('/'))}{VERSION_MARK}"
    names = sorted(os.listdir(parent)) if os.path.isdir(parent) else []
    return {"active": active(target), "versions": [n for n in names if is_version_of(target, n)],
            "partial": [n for n in names if n.startswith(head) and n.endswith(PARTIAL_SUFFIX)]}


def _fetch_http(
    url: str, name: str, timeout: float = 60, token: str | None = None
) -> Callable[[int], BinaryIO]:
    """A function offset -> a stream of FILE's bytes from the mirror URL (a Range request to resume).
    TOKEN: the source node's server's one-transfer token (TOKEN_HEADER), never in the URL."""
    import http.client  # lazy: only an HTTP mirror source needs them (urllib.request imports it anyway)
    import urllib.parse
    import urllib.request

    def opener(offset: int) -> BinaryIO:
        req = urllib.request.Request(url.rstrip("/") + "/" + urllib.parse.quote(name))
        if token:
            req.add_header(TOKEN_HEADER, token)
        if offset:
            req.add_header("Range", f"bytes={offset}-")
        try:
            resp: http.client.HTTPResponse = urllib.request.urlopen(  # noqa: S310 - the user's own mirror
                req, timeout=timeout)
        except OSError as exc:
            raise StageError(f"cannot fetch {req.full_url}: {exc}") from exc
        if offset and resp.status != 206:
            raise StageError(f"{req.full_url} ignored the Range request (HTTP {resp.status}): "
                             f"cannot resume at {offset}")
        return resp

    return opener


# ---------------------------------------------------------------- a node as the source (`--source node:HOST`)
#
# The source node's active version is the truth: its own .pdkit-manifest.json, written when that version
# was verified (commit). `offer` refuses a path that is no verified version, or whose files are missing
# or of another size than that manifest says; a byte changed since is caught by the target, which hashes
# every byte it writes against the same manifest (and `hash` then tells whose copy is bad).

def source_version(path: str) -> str:
    """The verified version directory PATH serves: PATH's link target, or PATH itself when it is a version
    directory. StageError saying what PATH is and what to do otherwise."""
    path = path.rstrip("/")
    redo = ("stage this node from the original source first (`pdkit stage INVENTORY --source DIR|URL --limit "
            "HOST`, which verifies the files and records their manifest), then stage the others from it")
    now = active(path)
    if now["kind"] == "link" and now["version"]:
        version = os.path.join(os.path.dirname(path), now["version"])
    elif now["kind"] == "dir" and VERSION_MARK in os.path.basename(path) and not path.endswith(PARTIAL_SUFFIX) \
            and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        version = path
    elif now["kind"] == "missing":
        raise StageError(f"{path} does not exist on this node: it has no weights to copy; {redo}")
    elif now["kind"] == "dir":
        raise StageError(f"{path} is a plain directory without a verified manifest (weights copied by hand): "
                         f"pdkit cannot tell which weights they are; {redo}")
    elif now["kind"] == "link":
        raise StageError(f"{path} links to {now['dest']}, not a version pdkit staged and verified; {redo}")
    else:
        raise StageError(f"{path} is neither a directory nor a link; {redo}")
    wid = manifest_id(version)
    if wid is None:
        raise StageError(f"{version} has no {MANIFEST_NAME}: not a verified version; {redo}")
    if not os.path.basename(version).endswith(wid[:ID_CHARS]):
        raise StageError(f"{version}/{MANIFEST_NAME} is not the manifest that version was verified with "
                         f"(its id is {wid[:ID_CHARS]}): it was changed by hand; {redo}")
    return version


def _version_manifest(version: str) -> tuple[bytes, dict[str, dict[str, Any]]]:
    with open(os.path.join(version, MANIFEST_NAME), "rb") as fh:
        raw = fh.read()
    return raw, parse_manifest(raw, f"{version}/{MANIFEST_NAME}")


def offer(path: str) -> dict[str, Any]:
    """What this node can give as a source: {version, id, manifest (its text), files, bytes}; StageError
    when PATH is no verified version or a file is missing or of another size than its manifest says."""
    version = source_version(path)
    raw, manifest = _version_manifest(version)
    problems = []
    for name, want in sorted(manifest.items()):
        p = os.path.join(version, name)
        if not os.path.isfile(p) or os.path.islink(p):
            problems.append(f"{name}: missing")
        elif os.path.getsize(p) != want["size"]:
            problems.append(f"{name}: {os.path.getsize(p)} bytes, its manifest says {want['size']}")
    if problems:
        raise StageError(f"{version} does not match its own manifest ({'; '.join(problems)}): its weights were "
                         "changed after they were verified; stage this node again from the original source "
                         "(`--source DIR|URL --limit HOST`), then stage the others from it")
    return {"version": version, "id": hashlib.sha256(raw).hexdigest(), "manifest": raw.decode(),
            "files": len(manifest), "bytes": sum(f["size"] for f in manifest.values())}


def _open_served(version: str, name: str) -> int:
    """A read-only descriptor of NAME in VERSION, NAME one of its manifest's files (no path from a request
    is ever joined to a directory: only the manifest's names), never through a symlink."""
    _, manifest = _version_manifest(version)
    if name not in manifest:
        raise StageError(f"{name} is not in the manifest of {version}")
    return os.open(os.path.join(version, name), os.O_RDONLY | os.O_NOFOLLOW)


def hash_file(version: str, name: str) -> dict[str, Any]:
    """NAME's size and SHA-256 in VERSION as this node's disk has it, and whether they match its manifest."""
    _, manifest = _version_manifest(version)
    fd = _open_served(version, name)
    os.close(fd)
    path = os.path.join(version, name)
    sha = file_sha256(path)
    return {"file": name, "size": os.path.getsize(path), "sha256": sha,
            "matches": sha == manifest[name]["sha256"] and os.path.getsize(path) == manifest[name]["size"]}


def send(version: str, name: str, offset: int, out: BinaryIO) -> int:
    """NAME's bytes from OFFSET to OUT (the relay through the control machine: the SSH channel's stdout)."""
    fd = _open_served(version, name)
    try:
        while chunk := os.pread(fd, CHUNK, offset):
            out.write(chunk)
            offset += len(chunk)
        out.flush()
    finally:
        os.close(fd)
    return 0


def route(address: str) -> str:
    """The local address this node's kernel would send from to reach ADDRESS (no packet is sent): what a
    source node's server lets in."""
    import socket  # lazy: only a node source needs it

    family, _, _, _, sockaddr = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        local: str = s.getsockname()[0]
        return local


def _drop_privileges() -> None:
    """After the served files are open: the server runs as nobody, so it cannot open anything else."""
    if os.geteuid() != 0:
        return
    import pwd  # lazy: only the server drops privileges

    try:
        uid, gid = pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid
    except KeyError:
        uid = gid = 65534
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def parse_range(header: str | None, size: int) -> int | None:
    """The start of `Range: bytes=N-` (the only form a resuming fetch sends), 0 without one, None when the
    range is not one this server answers."""
    if not header:
        return 0
    m = re.fullmatch(r"bytes=(\d+)-", header.strip())
    if not m or int(m.group(1)) > size:
        return None
    return int(m.group(1))


def serve(path: str, token: str, allow: list[str], bind: str, control: BinaryIO, out: TextIO) -> dict[str, int]:
    """A read-only HTTP server of PATH's verified version for one transfer: on BIND (this node's address on
    the nodes' network), an ephemeral port, answering only ALLOW's addresses that send TOKEN (TOKEN_HEADER),
    only the manifest's files, GET with an optional `Range: bytes=N-`. Its first line on OUT is {port}; it
    ends when CONTROL (the SSH channel's stdin) reaches EOF, i.e. when the control machine closes the
    channel or loses the connection. The files are opened first, then the process becomes nobody."""
    import hmac  # lazy: only the server needs these
    import socket
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    version = source_version(path)
    _, manifest = _version_manifest(version)
    fds = {name: _open_served(version, name) for name in manifest}
    counts = {"served": 0, "bytes": 0, "refused": 0}
    allowed = set(allow)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # no request log: nothing of a request reaches a log
            pass

        def _refuse(self, code: int) -> None:
            counts["refused"] += 1
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.client_address[0] not in allowed or not hmac.compare_digest(
                    self.headers.get(TOKEN_HEADER, "").encode(), token.encode()):
                return self._refuse(403)
            name = urllib.parse.unquote(self.path.lstrip("/"))
            if name not in fds:
                return self._refuse(404)
            size = manifest[name]["size"]
            start = parse_range(self.headers.get("Range"), size)
            if start is None:
                return self._refuse(416)
            self.send_response(206 if self.headers.get("Range") else 200)
            self.send_header("Content-Length", str(size - start))
            if self.headers.get("Range"):
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            offset = start
            while offset < size and (chunk := os.pread(fds[name], min(CHUNK, size - offset), offset)):
                self.wfile.write(chunk)
                offset += len(chunk)
            counts["served"] += 1
            counts["bytes"] += offset - start

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        daemon_threads = True

    try:
        server = Server((bind, 0), Handler)
    except OSError as exc:
        raise StageError(f"cannot listen on {bind}: {exc.strerror or exc} (the address the other nodes reach "
                         "this one at: pdkit_node.address, else ssh_hostname)") from exc
    _drop_privileges()
    print(json.dumps({"port": server.server_address[1]}), file=out, flush=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    while control.read(65536):  # until the control machine closes the channel
        pass
    server.shutdown()
    server.server_close()
    for fd in fds.values():
        os.close(fd)
    return counts


def _progress_lines(interval: float = 1.0) -> Callable[[int], None]:
    """report(bytes so far) -> a `PROGRESS <bytes>` line on stderr at most every INTERVAL seconds (read by
    the control side for a mirror the node fetches itself)."""
    last = [time.monotonic()]

    def report(got: int) -> None:
        now = time.monotonic()
        if now - last[0] >= interval:
            last[0] = now
            print(f"PROGRESS {got}", file=sys.stderr, flush=True)

    return report


def main(argv: list[str]) -> int:
    """ACTION TARGET [...]: prepare (manifest on stdin) | receive WID NAME OFFSET (bytes on stdin) |
    fetch WID NAME OFFSET URL | commit WID [GROUP] | activate WID | status, and on a source node:
    offer | hash NAME | send NAME OFFSET (the bytes on stdout) | serve (below); route ADDRESS.
    One JSON line on stdout (send: the file's bytes, errors on stderr)."""
    action, target, *rest = argv
    if action == "send":  # stdout carries the file's bytes: an error goes to stderr alone
        try:
            return send(target, rest[0], int(rest[1]), sys.stdout.buffer)
        except (StageError, OSError) as exc:
            print(f"cannot send {rest[0]} from {target}: {exc}", file=sys.stderr)
            return 1
    try:
        if action == "prepare":
            out = prepare(target, parse_manifest(sys.stdin.buffer.read(), "the manifest sent"))
        elif action == "receive":
            out = receive(target, rest[0], rest[1], int(rest[2]), sys.stdin.buffer)
        elif action == "fetch":  # stdin: nothing (a mirror) or {"token": ...} (a source node's server)
            sent = sys.stdin.buffer.read().strip()
            token = json.loads(sent)["token"] if sent else None
            out = receive(target, rest[0], rest[1], int(rest[2]), None,
                          fetch=_fetch_http(rest[3], rest[1], token=token), report=_progress_lines())
        elif action == "offer":
            out = offer(target)
        elif action == "hash":
            out = hash_file(target, rest[0])
        elif action == "route":
            out = {"address": route(rest[0])}
        elif action == "serve":  # stdin: one JSON line {token, allow, bind}, then open until EOF
            config = json.loads(sys.stdin.buffer.readline())
            out = serve(target, config["token"], config["allow"], config["bind"], sys.stdin.buffer, sys.stdout)
        elif action == "commit":
            out = commit(target, rest[0], rest[1] if len(rest) > 1 else None)
        elif action == "activate":
            out = activate(target, rest[0])
        elif action == "status":
            out = status(target)
        else:
            raise StageError(f"unknown action {action!r}")
    except (StageError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
