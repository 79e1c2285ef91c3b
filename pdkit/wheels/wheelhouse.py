"""The wheelhouse: every Python package a node installs, fetched on the control machine.

Nodes never reach a package index (air-gapped GPU clusters need exactly this): the control
machine downloads exact pins for the nodes' Python and platform, builds pdkit's own wheel, and
gives each venv's set to the node as one bundle, installed with `pip --no-index --no-deps
--require-hashes` from a requirements file that lists every package with its hash.

Three venvs, each identified only by what runs from it (issue 30 item 3): the node venv (pdkit:
health gates, pdkit-exporter, releases), the engine environment (`engine_bundle`: sglang, torch
and its CUDA wheels, nixl, ~4 GB, installed only from a committed lock, pdkit/wheels/enginelock.py,
never from a fresh resolution; or the sim's own sources) and the router venv.

    python -m pdkit.wheels.wheelhouse --platform debian12 [--engine sglang --sglang-version 0.5.23] [--offline]
    python -m pdkit.wheels.wheelhouse --python 3.12 --engine sglang --sglang-version 0.5.23   # ubuntu2404's glibc

Downloads are cached under ${PDKIT_CACHE:-~/.cache/pdkit}/wheelhouse (one pool per Python and
platform); `--offline` (or PDKIT_OFFLINE=1) never contacts an index and names what is missing.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from pdkit.upstream.versions import DEFAULT_SGLANG_VERSION
from pdkit.wheels import enginelock, installshards
from pdkit.wheels.enginelock import LockError, canonical, lock_pins
from pdkit.wheels.platforms import KNOWN_PLATFORMS, NodePlatform, parse_glibc, platform_for

REPO = Path(__file__).resolve().parents[2]
LOCKS = Path(__file__).resolve().parent / "locks"
# what a node with no stated platform is taken to be (the lab's hosts are Debian 12)
DEFAULT_PLATFORM = KNOWN_PLATFORMS["debian12"]


class WheelhouseError(Exception):
    """A bundle cannot be built: the message names the package and what would fix it."""


def cache_root() -> Path:
    return Path(os.environ.get("PDKIT_CACHE", Path.home() / ".cache" / "pdkit")) / "wheelhouse"


def offline() -> bool:
    return os.environ.get("PDKIT_OFFLINE", "") not in ("", "0")


# Bundle.shard_files by bundle digest: reading ~210 wheels' file lists takes about a second
_SHARDS: dict[str, dict[str, str]] = {}


@dataclass(frozen=True)
class Bundle:
    """One venv's packages: the wheel files and the requirements file pip installs them by."""

    name: str  # "node" | "engine" | "router"
    wheels: tuple[Path, ...]
    # requirements.txt: every package pinned with its sha256 (pip --require-hashes --no-deps)
    requirements: str
    digest: str  # over the requirements and every wheel's name and sha256: the install marker
    platform: NodePlatform = field(default=DEFAULT_PLATFORM, compare=False)

    @property
    def remote_name(self) -> str:
        return f"{self.name}-wheels.tar"

    @property
    def size(self) -> int:
        return sum(w.stat().st_size for w in self.wheels)

    def shard_files(self) -> dict[str, str]:
        """The requirements files of the pip processes that install this bundle at once, by file name
        (pdkit/wheels/installshards.py); empty when one pip installs it from requirements.txt."""
        if self.digest not in _SHARDS:
            texts = installshards.requirement_shards(self.requirements, self.wheels)
            _SHARDS[self.digest] = dict(zip(installshards.shard_file_names(len(texts)), texts))
        return _SHARDS[self.digest]

    def tarball(self) -> Path:
        """The bundle as one deterministic tar (for an upload over SFTP), packed on first use."""
        shards = self.shard_files()
        # a sharded bundle's tar also holds its shares' requirements files (a name of its own, so a
        # tar packed before the shares existed is never taken for one)
        suffix = f"-{len(shards)}shards" if shards else ""
        out = cache_root() / "bundles" / f"{self.name}-{self.digest[:16]}{suffix}.tar"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = _unique_tmp(out)
            _pack_tar(tmp, self.requirements, self.wheels, shards)
            tmp.replace(out)  # the same bytes from every writer: the last one's rename is as good
        return out


def _pack_tar(dest: Path, requirements: str, wheels: tuple[Path, ...], shards: dict[str, str] | None = None) -> None:
    """Stable bytes: fixed mtimes, owners and modes, sorted names; wheels streamed, not read whole."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "", ""
        return info

    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        req = requirements.encode()
        info = normalise(tarfile.TarInfo("requirements.txt"))
        info.size = len(req)
        tar.addfile(info, io.BytesIO(req))
        for name, text in (shards or {}).items():
            data = text.encode()
            info = normalise(tarfile.TarInfo(name))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for wheel in sorted(wheels, key=lambda p: p.name):
            tar.add(str(wheel), arcname=wheel.name, filter=normalise)


def _unique_tmp(path: Path) -> Path:
    """A temporary name beside PATH that no other process writes (several test workers, or two
    deploys on one control machine, fill the same cache at once)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def source_digest() -> str:
    """Hash of everything that goes into pdkit's own (control-side) wheel, so it is rebuilt only when that changes."""
    digest = hashlib.sha256()
    files = [REPO / "pyproject.toml", *sorted((REPO / "pdkit").rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# What runs from the node venv: the folders whose code runs on the nodes (tests/test_layering.py's RANKS) and
# the `python -m` paths units and node commands name. The node wheel is built from these files alone
# (`node_sources`), so an edit anywhere else (the CLI, doctor, bench, validate, render) gives the nodes the same
# wheel and restarts no node daemon (issue 48 item 2); tests/test_layering.py holds these files to the node
# venv's imports (the standard library, pdkit/wheels/locks/node.txt, each other).
NODE_SOURCES = (
    "pdkit/agent",  # gates, releases, the change rule, pdkit-exporter, ... (pdkit/agent/__init__.py)
    "pdkit/upstream",  # what the pinned releases are: the agent's and the sim's tables
    "pdkit/sim",  # the sim engine: a rehearsal node runs it from the node venv
    # `python -m pdkit.health` and the like: the paths units and node commands name, kept as programs that run
    # pdkit/agent/'s module (a node venv may predate the move, and a rendered unit is byte-identical since)
    "pdkit/health.py", "pdkit/gpumem.py", "pdkit/releases.py", "pdkit/jitwarm.py", "pdkit/residency.py",
    "pdkit/exporter",
)


def _spelled_data(root: Path, modules: set[Path]) -> set[Path]:
    """pdkit's data files (not modules) whose name one of MODULES spells out: they open them by name beside
    their own file (pdkit.upstream.catalogue's `metric_catalogue.json`, pdkit.upstream.parsertable's
    `parser_table.json`)."""
    texts = "\n".join(p.read_text() for p in modules)
    return {p for p in root.joinpath("pdkit").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
            and (f'"{p.name}"' in texts or f"'{p.name}'" in texts)}


def _with_packages(root: Path, modules: set[Path]) -> set[Path]:
    """MODULES and the __init__.py of every package above them (a module's packages run theirs first)."""
    out = set(modules)
    for path in modules:
        parent = path.parent
        while parent != root:
            out.add(parent / "__init__.py")
            parent = parent.parent
    return out


def node_sources(root: Path = REPO) -> list[str]:
    """The files of the node wheel (paths relative to ROOT, sorted): every module NODE_SOURCES names (a folder:
    its modules), the packages' __init__.py above them, pdkit/py.typed and the data files they open by name."""
    modules: set[Path] = set()
    for entry in NODE_SOURCES:
        path = root / entry
        if path.is_dir():
            modules |= {p for p in path.rglob("*.py") if "__pycache__" not in p.parts}
        elif path.is_file():
            modules.add(path)
        else:
            raise WheelhouseError(f"pdkit.wheels.wheelhouse.NODE_SOURCES names {entry}, which is not in {root}")
    modules = _with_packages(root, modules)
    marker = {root / "pdkit" / "py.typed"} if (root / "pdkit" / "py.typed").is_file() else set()
    return sorted(str(p.relative_to(root)) for p in modules | _spelled_data(root, modules) | marker)


def _read_sources(root: Path, sources: list[str]) -> tuple[dict[str, bytes], str]:
    """Each of SOURCES (paths relative to ROOT) read, and the sha256 (hex) of them all, names included."""
    digest = hashlib.sha256()
    contents = {}
    for rel in sources:
        contents[rel] = (root / rel).read_bytes()
        digest.update(rel.encode() + b"\0" + contents[rel] + b"\0")
    return contents, digest.hexdigest()


def _project_version(root: Path) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def _write_wheel(out: Path, dist: str, version: str, contents: dict[str, bytes], summary: str) -> Path:
    """A wheel at OUT from CONTENTS (path in the wheel -> bytes), byte for byte (no build backend: a setuptools
    upgrade on the control machine must not give the nodes a new environment). Stored entries, fixed times and
    modes, sorted names: the same files give the same sha256 on any control machine."""
    if out.exists():
        return out
    contents = dict(contents)
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    contents[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                                    f"Summary: {summary}\n").encode()
    contents[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: pdkit.wheels.wheelhouse\nRoot-Is-Purelib: true\n"
                                 b"Tag: py3-none-any\n")
    record = "".join(f"{rel},{_record_hash(data)},{len(data)}\n"
                     for rel, data in sorted(contents.items())) + f"{info}/RECORD,,\n"
    contents[f"{info}/RECORD"] = record.encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unique_tmp(out)
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        # RECORD last, as wheel tools write it
        for rel in [*sorted(r for r in contents if not r.endswith("/RECORD")), f"{info}/RECORD"]:
            entry = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            zf.writestr(entry, contents[rel])
    tmp.replace(out)
    return out


def node_wheel(root: Path = REPO) -> Path:
    """pdkit's wheel for the node venv, from `node_sources` alone: its digest (and so the node venv, and
    pdkit-exporter's restart) changes only when a file the node runs changes. Distribution `pdkit`, the
    project's version, as the full wheel (`pdkit_wheel`, the control machine's) has."""
    contents, digest = _read_sources(root, node_sources(root))
    version = _project_version(root)
    out = cache_root() / "node" / digest[:16] / f"pdkit-{version}-py3-none-any.whl"
    return _write_wheel(out, "pdkit", version, contents,
                        "pdkit's node-side modules: gates, pdkit-exporter, releases "
                        "(pdkit.wheels.wheelhouse.node_sources)")


def _log(message: str) -> None:
    # stderr: pyinfra's --json output owns stdout
    print(f"wheelhouse: {message}", file=sys.stderr, flush=True)


def pdkit_wheel() -> Path:
    out = cache_root() / "pdkit" / source_digest()
    wheels = list(out.glob("pdkit-*.whl"))
    if wheels:
        return wheels[0]
    _log(f"building pdkit's wheel ({out.name})")
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
    with tempfile.TemporaryDirectory() as tmp:
        # build from a snapshot: setuptools writes build/ and *.egg-info into the source tree
        src = Path(tmp) / "src"
        shutil.copytree(REPO / "pdkit", src / "pdkit", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps", "-w",
             str(Path(tmp) / "out"), str(src)],
            env=env, timeout=600, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise WheelhouseError(f"building pdkit's wheel failed:\n{proc.stderr.strip()[-2000:]}")
        out.mkdir(parents=True, exist_ok=True)
        wheel = next((Path(tmp) / "out").glob("pdkit-*.whl"))
        # copied under a name of its own, then linked in: a wheel in OUT is always whole, and one
        # that another process (a parallel test worker, a second deploy) put there first is kept
        # (the hashes already taken of it stay right)
        part = _unique_tmp(out / wheel.name)
        shutil.copy2(wheel, part)
        try:
            os.link(part, out / wheel.name)
        except FileExistsError:
            pass
        finally:
            part.unlink()
    return out / wheel.name


# ------------------------------------------------------------------------------ which files fit


def supported_tags(platform: NodePlatform) -> list[Tag]:
    """The wheel tags the node's pip accepts, best first (packaging.tags, as pip computes them)."""
    version = tuple(int(x) for x in platform.python.split("."))
    return [*cpython_tags(version, platforms=platform.tags), *compatible_tags(version, platforms=platform.tags)]


def _pool(platform: NodePlatform) -> Path:
    # per Python and newest tag: pip's pick for one platform may not install on an older glibc
    return cache_root() / "pool" / f"cp{platform.python.replace('.', '')}-{platform.tags[0]}"


def wheels_for(pins: dict[str, str], pool: Path, platform: NodePlatform) -> tuple[dict[str, Path], list[str]]:
    """({canonical name: the wheel pip would pick}, [pins with no fitting wheel in POOL])."""
    rank = {tag: i for i, tag in enumerate(supported_tags(platform))}
    best: dict[str, tuple[int, Path]] = {}
    for wheel in pool.glob("*.whl"):
        try:
            name, version, _, tags = parse_wheel_filename(wheel.name)
        except ValueError:
            continue
        key = canonical(str(name))
        if pins.get(key) != str(version):
            continue
        fit = min((rank[t] for t in tags if t in rank), default=None)
        if fit is not None and (key not in best or fit < best[key][0]):
            best[key] = (fit, wheel)
    missing = [f"{n}=={v}" for n, v in sorted(pins.items()) if n not in best]
    return {n: p for n, (_, p) in best.items()}, missing


def _pins_of(requirement_lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in requirement_lines:
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", line.strip())
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


# ------------------------------------------------------------------------------------- download


def _pip_failure(stderr: str) -> str:
    """pip's error in one line: the package it could not get, or why the index was out of reach."""
    lines = [ln for ln in stderr.splitlines()
             if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln]
    for pattern in (r"No matching distribution found for (\S+)", r"satisfies the requirement (\S+)"):
        for ln in lines:
            m = re.search(pattern, ln)
            if m:
                return f"no wheel of {m.group(1)} for this Python and platform on the index"
    text = "\n".join(lines)
    if "DO NOT MATCH THE HASHES" in text:
        bad = re.findall(r"^\s+(\S+==\S+) from ", text, flags=re.M)
        return f"downloaded file(s) do not match the lock's hashes: {', '.join(bad) or 'see pip output'}"
    if re.search(r"Failed to establish a new connection|Temporary failure in name resolution|Network is "
                 r"unreachable|ConnectTimeout|Max retries exceeded", text):
        return "the package index could not be reached"
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or ["pip failed without a message"])[-1].removeprefix("ERROR: ")


# named first when wheels are missing: the packages a reader recognises the lock by
_KEY_PACKAGES = ("sglang", "torch", "nixl-cu13", "smg", "sglang-router")


def _missing_text(missing: list[str], total: int) -> str:
    ordered = sorted(missing, key=lambda pin: (pin.split("==")[0] not in _KEY_PACKAGES,
                                               _KEY_PACKAGES.index(pin.split("==")[0])
                                               if pin.split("==")[0] in _KEY_PACKAGES else 0, pin))
    shown = ", ".join(ordered[:8]) + (f" and {len(ordered) - 8} more" if len(ordered) > 8 else "")
    return f"{'all' if len(missing) == total else len(missing)} of {total} wheels: {shown}"


def download(requirements: str, pins: dict[str, str], platform: NodePlatform, *, label: str,
             hashed: bool) -> dict[str, Path]:
    """Wheels for every pin (cached per Python and platform), or WheelhouseError naming what is missing."""
    pool = _pool(platform)
    pool.mkdir(parents=True, exist_ok=True)
    found, missing = wheels_for(pins, pool, platform)
    if not missing:
        return found
    where = f"Python {platform.python}, glibc {platform.glibc_text} ({platform.tags[0]})"
    if offline():
        raise WheelhouseError(
            f"{label}: offline (PDKIT_OFFLINE) and the cache {pool} lacks {_missing_text(missing, len(pins))}. Fix: "
            "run `python -m pdkit.wheels.wheelhouse` with the same "
            f"--platform/--engine on a machine that reaches the index and copy its {cache_root()} here (PDKIT_CACHE)"
        )
    _log(f"{label}: downloading {len(missing)} of {len(pins)} packages for {where} into {pool}")
    cmd = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
        "--no-deps", "--only-binary=:all:", "--python-version", platform.python, "--implementation", "cp", "-d",
        str(pool),
    ]
    for tag in platform.tags:
        cmd += ["--platform", tag]
    if hashed:
        cmd.append("--require-hashes")
    # a machine-wide pip constraint (PIP_CONSTRAINT, pip.conf) must not bend an exact, complete set
    env = {**os.environ, "PIP_CONSTRAINT": os.devnull}
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write(requirements)
        req.flush()
        proc = subprocess.run([*cmd, "-r", req.name], capture_output=True, text=True, timeout=3600, env=env)
    found, missing = wheels_for(pins, pool, platform)
    if proc.returncode != 0 or missing:
        reason = _pip_failure(proc.stderr) if proc.returncode != 0 else "pip finished but chose no fitting wheel"
        raise WheelhouseError(
            f"{label}: could not fetch {_missing_text(missing, len(pins))} for {where}: {reason}"
        )
    return found


# --------------------------------------------------------------------------------------- bundles


def _hashes_index() -> Path:
    return cache_root() / "sha256.json"


def file_sha256(path: Path, _memo: dict = {}) -> str:  # noqa: B006 - process-wide memo on purpose
    """sha256 of a wheel, kept by (path, size, mtime) so 4 GB of engine wheels are read once."""
    st = path.stat()
    key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    if not _memo:
        try:
            _memo.update(json.loads(_hashes_index().read_text()))
        except (OSError, ValueError):
            _memo["_"] = ""
    if key not in _memo:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        _memo[key] = digest.hexdigest()
        _hashes_index().parent.mkdir(parents=True, exist_ok=True)
        tmp = _unique_tmp(_hashes_index())
        tmp.write_text(json.dumps(_memo))
        tmp.replace(_hashes_index())
    return _memo[key]


def hashed_requirement(name: str, version: str, wheel: Path) -> str:
    return f"{name}=={version} --hash=sha256:{file_sha256(wheel)}"


def make_bundle(name: str, wheels: list[Path], requirements: str, platform: NodePlatform = DEFAULT_PLATFORM) -> Bundle:
    entries = sorted({w.name: w for w in wheels}.values(), key=lambda p: p.name)
    digest = hashlib.sha256(requirements.encode())
    for wheel in entries:
        digest.update(b"\0" + wheel.name.encode() + b"\0" + file_sha256(wheel).encode())
    return Bundle(name=name, wheels=tuple(entries), requirements=requirements, digest=digest.hexdigest(),
                  platform=platform)


def _own_requirement(own: Path) -> str:
    name, version, _, _ = parse_wheel_filename(own.name)
    return hashed_requirement(str(name), str(version), own)


_BUILT: dict[tuple, Bundle] = {}


def _node_pins(platform: NodePlatform) -> tuple[dict[str, Path], str]:
    """pdkit/wheels/locks/node.txt's wheels and their hashed requirement lines (pdkit's runtime pins)."""
    pins = lock_pins("node.txt")
    pinned = _pins_of(pins)
    wheels = download("\n".join(pins) + "\n", pinned, platform, label="node pins (pdkit/wheels/locks/node.txt)",
                      hashed=False)
    return wheels, "".join(hashed_requirement(n, v, wheels[n]) + "\n" for n, v in sorted(pinned.items()))


def node_bundle(platform: NodePlatform) -> Bundle:
    """pdkit's own node venv: pdkit (health gates, pdkit-exporter, releases) and its runtime pins.
    No engine runs from it (`engine_bundle`): a new pdkit wheel restarts pdkit's daemons only."""
    key = ("node", platform)
    if key not in _BUILT:
        own = node_wheel()
        wheels, requirements = _node_pins(platform)
        _BUILT[key] = make_bundle("node", [*wheels.values(), own], requirements + _own_requirement(own) + "\n",
                                  platform)
    return _BUILT[key]


def engine_bundle(platform: NodePlatform, engine: str, sglang_version: str | None = None) -> Bundle:
    """The kit-managed engine environment (flags.engine_venv_dir), identified only by what the
    engine runs, so that no other change to pdkit replaces it (and restarts the engines):

    - sglang: exactly the committed lock (pdkit/wheels/enginelock.py): sglang, torch, nixl, ... and no
      pdkit wheel (`python -m sglang.launch_server` imports none of pdkit).
    - sim: pdkit's runtime pins plus `sim_wheel()`, the sim's own sources and what they import.
    """
    key = ("engine", platform, engine, sglang_version)
    if key in _BUILT:
        return _BUILT[key]
    if engine == "sglang":
        if not sglang_version:
            raise WheelhouseError("engine sglang needs an SGLang version (pdkit_cluster.sglang_version)")
        try:
            lock = enginelock.select_lock("sglang", sglang_version, platform.python, platform.glibc, platform.arch)
        except LockError as exc:
            raise WheelhouseError(str(exc)) from None
        wheels = download(lock.text, lock.pins, platform, label=f"engine lock {lock.path.name}", hashed=True)
        bundle = make_bundle("engine", list(wheels.values()), lock.text, platform)
    elif engine == "sim":
        pins, requirements = _node_pins(platform)
        sim = sim_wheel()
        version = parse_wheel_filename(sim.name)[1]
        bundle = make_bundle("engine", [*pins.values(), sim],
                             requirements + hashed_requirement(SIM_DIST, str(version), sim) + "\n", platform)
    else:
        raise WheelhouseError(f"unknown engine {engine!r}: valid: sglang, sim")
    _BUILT[key] = bundle
    return bundle


# ------------------------------------------------------------------------- the sim engine's wheel

# the sim engine's environment holds this distribution: package `pdkit` with only the files the sim
# runs (sim_sources), so an edit to any other pdkit module builds the same wheel, byte for byte
SIM_DIST = "pdkit-sim"
SIM_PACKAGE = "pdkit.sim"


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None  # a name imported from a module (`from pdkit.sim.args import parse_args`), or not pdkit's


def _pdkit_imports(path: Path, root: Path) -> set[str]:
    """Every pdkit module PATH may import: module level and inside functions (a lazy import runs too)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = (".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])
                      if node.level else (node.module or ""))
            # `from pdkit import catalogue` imports the module pdkit.upstream.catalogue
            names |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
    return {n for n in names if n == "pdkit" or n.startswith("pdkit.")}


def sim_sources(root: Path = REPO) -> list[str]:
    """The files the sim engine runs (paths relative to ROOT, sorted): every module of pdkit/sim/,
    each pdkit module they import (followed to the end), the packages' __init__.py above them,
    and every data file of pdkit's (not a module) whose name one of those modules spells out
    (pdkit.upstream.catalogue's `metric_catalogue.json`, pdkit.upstream.parsertable's `parser_table.json`: they
    open them by name beside their own file). tests/test_wheelhouse.py runs the sim from
    exactly these files, so a file read some other way fails there."""
    sim_dir = root.joinpath(*SIM_PACKAGE.split("."))
    todo = [p for p in sorted(sim_dir.rglob("*.py")) if "__pycache__" not in p.parts]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(sorted(_with_packages(root, {path}) - {path}))
        for name in _pdkit_imports(path, root):
            found = _module_file(root, name)
            if found is not None:
                todo.append(found)
    return sorted(str(p.relative_to(root)) for p in seen | _spelled_data(root, seen))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def sim_wheel(root: Path = REPO) -> Path:
    """The sim engine's wheel, written here byte for byte from its sources (no build backend: a
    setuptools upgrade on the control machine must not give the engines a new environment).
    Stored entries, fixed times and modes, sorted names: the same sources give the same sha256
    on any control machine. Its version carries the sources' hash (`0.<hash as a number>`), so
    `importlib.metadata.version("pdkit-sim")` on a node says which sim it runs."""
    contents, digest = _read_sources(root, sim_sources(root))
    # a public version (no `+local`: pip asks for `%2B` in the URL, which the bundle server does
    # not decode): the sources' hash as a number
    version = f"0.{int(digest[:15], 16)}"
    out = cache_root() / "sim" / f"{SIM_DIST.replace('-', '_')}-{version}-py3-none-any.whl"
    return _write_wheel(out, SIM_DIST, version, contents,
                        "the pdkit sim engine's files (pdkit.wheels.wheelhouse.sim_sources)")


def router_bundle(platform: NodePlatform, package: str, version: str) -> Bundle:
    key = ("router", platform, package, version)
    if key not in _BUILT:
        lock = f"router-{package}-{version}.txt"
        pins = lock_pins(lock)
        pinned = _pins_of(pins)
        wheels = download("\n".join(pins) + "\n", pinned, platform, label=f"router pins (pdkit/wheels/locks/{lock})",
                          hashed=False)
        requirements = "".join(hashed_requirement(n, v, wheels[n]) + "\n" for n, v in sorted(pinned.items()))
        _BUILT[key] = make_bundle("router", list(wheels.values()), requirements, platform)
    return _BUILT[key]


def resolve_platform(name: str | None, python: str | None, glibc: str | None) -> NodePlatform:
    """--platform NAME, or --python [--glibc]: a Python alone means the known OS that ships it."""
    if name:
        return KNOWN_PLATFORMS[name]
    if python and glibc:
        return platform_for(python, parse_glibc(glibc))
    if python:
        for known in KNOWN_PLATFORMS.values():
            if known.python == python:
                return known
        raise WheelhouseError(f"no known node OS ships Python {python} "
                              f"({', '.join(f'{k}: {p.python}' for k, p in KNOWN_PLATFORMS.items())}): give --glibc "
                              "too")
    return DEFAULT_PLATFORM


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch and bundle the wheels a node installs (the deploy does this "
                                     "itself; this warms the cache).")
    parser.add_argument("--platform", choices=sorted(KNOWN_PLATFORMS),
                        help=f"the nodes' OS (default {DEFAULT_PLATFORM.name})")
    parser.add_argument("--python", help="the nodes' Python, e.g. 3.12; alone it picks the known OS that ships it")
    parser.add_argument("--glibc", help="the nodes' glibc, e.g. 2.39 (with --python, for an OS not in the table)")
    parser.add_argument("--engine", choices=["sim", "sglang"], default="sim")
    parser.add_argument("--sglang-version", default=None)
    parser.add_argument("--router", default="smg==1.13.0")
    parser.add_argument("--offline", action="store_true",
                        help="never contact an index: fail naming what the cache lacks")
    parser.add_argument("--tarball", action="store_true", help="also pack each bundle as the tar an SFTP upload sends")
    args = parser.parse_args(argv)
    if args.offline:
        os.environ["PDKIT_OFFLINE"] = "1"
    try:
        platform = resolve_platform(args.platform, args.python, args.glibc)
        if args.engine == "sglang" and not args.sglang_version:
            args.sglang_version = DEFAULT_SGLANG_VERSION
        node = node_bundle(platform)
        engine = engine_bundle(platform, args.engine, args.sglang_version if args.engine == "sglang" else None)
        package, version = args.router.split("==")
        router = router_bundle(platform, package, version)
        for bundle in (node, engine, router):
            extra = f", tar {bundle.tarball()}" if args.tarball else ""
            print(f"{bundle.name}: {len(bundle.wheels)} wheels, {bundle.size / 1e6:.1f} MB for {platform.name} "
                  f"(Python {platform.python}, glibc {platform.glibc_text}), digest {bundle.digest[:16]}{extra}")
    except WheelhouseError as exc:
        print(f"wheelhouse: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
