"""The wheelhouse: every Python package a node installs, built on the control machine.

Nodes never reach a package index (air-gapped GPU clusters need exactly this): the control
machine downloads exact pins for the nodes' Python and architecture, builds pdkit's own
wheel, and packs each venv's set into one deterministic tarball. A node gets one file per
venv; the deploy unpacks and installs it only when its content hash changed.

    python -m pdkit.wheelhouse --python 3.11 [--engine sglang --sglang-version 0.5.23]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pdkit.versions import NIXL_PACKAGE

REPO = Path(__file__).resolve().parent.parent
LOCKS = Path(__file__).resolve().parent / "locks"
# manylinux tags a Debian 12 / Ubuntu 24.04 x86_64 node accepts (glibc 2.36 / 2.39)
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def cache_root() -> Path:
    return Path(os.environ.get("PDKIT_CACHE", Path.home() / ".cache" / "pdkit")) / "wheelhouse"


@dataclass(frozen=True)
class Bundle:
    """One venv's packages as a single tarball, and the pins pip installs from it."""

    name: str  # "node" | "router"
    tarball: Path
    requirements: tuple[str, ...]  # exact pins, installed with --no-index
    digest: str  # sha256 of the tarball: the install marker

    @property
    def remote_name(self) -> str:
        return f"{self.name}-wheels.tar"


def lock_pins(lock: str) -> list[str]:
    lines = (LOCKS / lock).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def source_digest() -> str:
    """Hash of everything that goes into pdkit's own wheel, so it is rebuilt only when that changes."""
    digest = hashlib.sha256()
    files = [REPO / "pyproject.toml", *sorted((REPO / "pdkit").rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


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
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps", "-w", str(Path(tmp) / "out"), str(src)],
            env=env, timeout=600, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"wheelhouse: building pdkit's wheel failed:\n{proc.stderr.strip()[-2000:]}")
        out.mkdir(parents=True, exist_ok=True)
        wheel = next((Path(tmp) / "out").glob("pdkit-*.whl"))
        shutil.copy2(wheel, out / wheel.name)
    return out / wheel.name


def download(pins: list[str], python: str, *, resolve_deps: bool = False) -> list[Path]:
    """Binary wheels for exact pins, for the nodes' Python and platform (cached across runs)."""
    key = hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()[:16]
    # exact, complete pin sets share one pool; a resolved set gets a directory of its own, so
    # that what it lists is exactly what pip chose for it
    pool = cache_root() / "pool" / f"cp{python.replace('.', '')}" / (f"resolved-{key}" if resolve_deps else "")
    pool.mkdir(parents=True, exist_ok=True)
    marker = pool / f".done-{key}"
    listing = pool / (marker.name + ".files")
    if marker.exists():
        return [pool / name for name in listing.read_text().split()]
    _log(f"downloading {len(pins)} pinned packages for Python {python}")
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp", "-d", str(pool),
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if not resolve_deps:
        cmd.append("--no-deps")
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write("\n".join(pins) + "\n")
        req.flush()
        proc = subprocess.run([*cmd, "-r", req.name], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"wheelhouse: pip download failed for Python {python}:\n{proc.stderr.strip()[-2000:]}")
    files = sorted(pool.glob("*.whl")) if resolve_deps else _files_for(pins, pool)
    listing.write_text("\n".join(sorted(p.name for p in files)) + "\n")
    marker.touch()
    return files


def _canonical(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _files_for(pins: list[str], pool: Path) -> list[Path]:
    wanted = {(_canonical(p.split("==")[0]), p.split("==")[1]) for p in pins}
    found = []
    for wheel in pool.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        if (_canonical(name), version) in wanted:
            found.append(wheel)
    missing = wanted - {(_canonical(w.name.split("-")[0]), w.name.split("-")[1]) for w in found}
    if missing:
        raise RuntimeError(f"no wheel downloaded for {sorted(missing)}")
    return sorted(found)


def pack(name: str, wheels: list[Path], requirements: list[str]) -> Bundle:
    """A tarball whose bytes depend only on the wheels' names and contents (stable mtimes, owners, order).

    Packing reads every wheel (~0.25 s for the router's), and every deploy asks for the bundles
    to compare their digest with the node's: the digest is kept beside the tarball under a key
    made of the inputs' names, sizes and mtimes, so an unchanged set is not read again.
    """
    entries = sorted({w.name: w for w in wheels}.items())
    stats = [(n, st.st_size, st.st_mtime_ns) for n, st in ((n, p.stat()) for n, p in entries)]
    key = hashlib.sha256(json.dumps([name, list(requirements), stats]).encode()).hexdigest()[:32]
    index = cache_root() / "bundles" / f"{name}-inputs-{key}.json"
    try:
        known = json.loads(index.read_text())
        tarball = Path(known["tarball"])
        if tarball.is_file():
            return Bundle(name=name, tarball=tarball, requirements=tuple(requirements), digest=known["digest"])
    except (OSError, ValueError, KeyError):
        pass
    bundle = _pack(name, entries, requirements)
    index.write_text(json.dumps({"digest": bundle.digest, "tarball": str(bundle.tarball)}))
    return bundle


def _pack(name: str, entries: list[tuple[str, Path]], requirements: list[str]) -> Bundle:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        req_text = ("\n".join(requirements) + "\n").encode()
        for arcname, data in [("requirements.txt", req_text)] + [(n, p.read_bytes()) for n, p in entries]:
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    out = cache_root() / "bundles" / f"{name}-{digest[:16]}.tar"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(out)
    return Bundle(name=name, tarball=out, requirements=tuple(requirements), digest=digest)


_BUILT: dict[tuple, Bundle] = {}


def node_bundle(python: str, engine: str = "sim", sglang_version: str | None = None) -> Bundle:
    """pdkit (sim engine, health gate, exporter) plus, for engine sglang, sglang and nixl."""
    key = ("node", python, engine, sglang_version)
    if key not in _BUILT:
        pins = lock_pins("node.txt")
        wheels = download(pins, python)
        requirements = list(pins)
        if engine == "sglang":
            # plan-tested on the lab; the GPU tier carries its own trimmed payload
            extra = [f"sglang=={sglang_version}", f"{NIXL_PACKAGE[0]}=={NIXL_PACKAGE[1]}"]
            wheels += download(extra, python, resolve_deps=True)
            requirements += extra
        own = pdkit_wheel()
        # pdkit itself is installed from its wheel with --force-reinstall (its version does not
        # change with every commit); requirements.txt holds the exact pins of everything else
        _BUILT[key] = pack("node", [*wheels, own], requirements)
    return _BUILT[key]


def router_bundle(python: str, package: str, version: str) -> Bundle:
    key = ("router", python, package, version)
    if key not in _BUILT:
        pins = lock_pins(f"router-{package}-{version}.txt")
        _BUILT[key] = pack("router", download(pins, python), pins)
    return _BUILT[key]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the wheelhouse bundles for nodes.")
    parser.add_argument("--python", default="3.11", help="the nodes' Python, e.g. 3.11 (Debian 12) or 3.12 (Ubuntu 24.04)")
    parser.add_argument("--engine", choices=["sim", "sglang"], default="sim")
    parser.add_argument("--sglang-version", default=None)
    parser.add_argument("--router", default="smg==1.13.0")
    args = parser.parse_args(argv)
    node = node_bundle(args.python, args.engine, args.sglang_version)
    package, version = args.router.split("==")
    router = router_bundle(args.python, package, version)
    for bundle in (node, router):
        print(f"{bundle.name}: {bundle.tarball} ({bundle.tarball.stat().st_size / 1e6:.1f} MB, sha256 {bundle.digest[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
