"""Engine locks: the exact, hashed closure of an engine venv, one file per (engine, Python, platform).

An SGLang venv is ~200 packages (torch and its CUDA wheels, flashinfer, nixl, ...). Resolved
afresh at every build, two builds a week apart install different versions on one cluster; so
the closure is resolved once by a real resolver (uv, pinned in the test extras), committed under
`pdkit/wheels/locks/engine/`, and the wheelhouse only ever downloads and installs what a lock names,
with pip's `--require-hashes`.

Regenerate (needs PyPI; writes pdkit/wheels/locks/engine/*.txt):

    python -m pdkit.wheels.enginelock                                   # every pinned release x platform
    python -m pdkit.wheels.enginelock --sglang-version 0.5.23 --platform debian12

A lock's platform is the oldest glibc it was resolved for (`manylinux_2_36_x86_64`): a node
uses the lock of its Python whose glibc is the highest at or below its own.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pdkit.upstream.versions import NIXL_EXCLUDED, NIXL_META_PACKAGE, NIXL_PACKAGE, SGLANG_RELEASES
from pdkit.wheels.platforms import KNOWN_PLATFORMS, NodePlatform, parse_glibc, platform_for

LOCKS = Path(__file__).resolve().parent / "locks"
ENGINE_LOCKS = LOCKS / "engine"
# the resolver, pinned (pyproject's test extras): its version is written into every lock
UV_VERSION = "0.13.9"
# uv's newest manylinux target; a node with a newer glibc installs wheels of this policy too
UV_MAX_GLIBC = (2, 40)
PYPI = "https://pypi.org/simple"
_HEADER = re.compile(r"^# (engine|python|platform|resolver|inputs): (.+)$")


class LockError(Exception):
    """No lock fits, or a lock file is malformed: the message says what exists and how to fix it."""


@dataclass(frozen=True)
class EngineLock:
    package: str  # "sglang"
    version: str
    python: str  # "3.11"
    platform_tag: str  # "manylinux_2_36_x86_64"
    path: Path
    resolver: str
    pins: dict[str, str]  # canonical name -> version, every package of the closure

    @property
    def glibc(self) -> tuple[int, int]:
        m = re.match(r"manylinux_(\d+)_(\d+)_", self.platform_tag)
        assert m, self.platform_tag
        return int(m.group(1)), int(m.group(2))

    @property
    def arch(self) -> str:
        return self.platform_tag.split("_", 3)[3]

    @property
    def text(self) -> str:
        return self.path.read_text()


def canonical(name: str) -> str:
    """PEP 503 name: the key pins are compared by."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_filename(package: str, version: str, python: str, platform_tag: str) -> str:
    return f"{package}-{version}-cp{python.replace('.', '')}-{platform_tag}.txt"


def lock_platform_tag(platform: NodePlatform) -> str:
    glibc = min(platform.glibc, UV_MAX_GLIBC)
    return f"manylinux_{glibc[0]}_{glibc[1]}_{platform.arch}"


def _uv_target(platform: NodePlatform) -> str:
    glibc = min(platform.glibc, UV_MAX_GLIBC)
    return f"{platform.arch}-manylinux_{glibc[0]}_{glibc[1]}"


def parse_lock(path: Path) -> EngineLock:
    text = path.read_text()
    header: dict[str, str] = {}
    pins: dict[str, str] = {}
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            header[m.group(1)] = m.group(2).strip()
            continue
        pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", line)
        if pin:
            pins[canonical(pin.group(1))] = pin.group(2)
    missing = [k for k in ("engine", "python", "platform", "resolver") if k not in header]
    if missing:
        raise LockError(f"{path.name}: header lacks {', '.join(missing)} (regenerate it: python -m "
                        f"pdkit.wheels.enginelock)")
    package, _, version = header["engine"].partition("==")
    return EngineLock(package, version, header["python"], header["platform"], path, header["resolver"], pins)


def all_locks(directory: Path = ENGINE_LOCKS) -> list[EngineLock]:
    return [parse_lock(p) for p in sorted(directory.glob("*.txt"))]


def select_lock(package: str, version: str, python: str, glibc: tuple[int, int], arch: str = "x86_64", *,
                directory: Path = ENGINE_LOCKS) -> EngineLock:
    """The lock a node of PYTHON / GLIBC installs PACKAGE==VERSION from, or LockError saying why none fits."""
    same_release = [lk for lk in all_locks(directory) if (lk.package, lk.version) == (package, version)]
    if not same_release:
        raise LockError(
            f"no lock for {package}=={version} (pdkit/wheels/locks/engine/ has none); generate it with "
            f"`python -m pdkit.wheels.enginelock --sglang-version {version}`, or use a release pdkit pins: "
            f"{', '.join(SGLANG_RELEASES)}"
        )
    for_python = [lk for lk in same_release if lk.python == python and lk.arch == arch]
    if not for_python:
        have = ", ".join(f"Python {lk.python} ({lk.platform_tag})" for lk in same_release)
        raise LockError(
            f"{package}=={version} has no lock for Python {python} on {arch} (locks exist for {have}): "
            f"give the node a Python the locks cover, or generate one with "
            f"`python -m pdkit.wheels.enginelock --sglang-version {version} --python {python} --glibc <the node's "
            f"glibc>`"
        )
    fitting = [lk for lk in for_python if lk.glibc <= glibc]
    if not fitting:
        have = ", ".join(lk.platform_tag for lk in for_python)
        raise LockError(
            f"{package}=={version} for Python {python}: every lock needs a newer glibc than the node's "
            f"{glibc[0]}.{glibc[1]} ({have}); {package}'s wheels may not exist for it: try "
            f"`python -m pdkit.wheels.enginelock --sglang-version {version} --python {python} --glibc "
            f"{glibc[0]}.{glibc[1]}`"
        )
    return max(fitting, key=lambda lk: lk.glibc)


def lock_pins(lock: str) -> list[str]:
    """The pins of pdkit/wheels/locks/LOCK (comments and blank lines left out)."""
    lines = (LOCKS / lock).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def lock_inputs(package: str, version: str) -> list[str]:
    """What a lock is resolved from: the engine, nixl for PD's KV transfer, and pdkit's own node pins."""
    if package != "sglang":
        raise LockError(f"unknown engine package {package!r}: only sglang is locked")
    return [f"sglang=={version}", f"{NIXL_PACKAGE[0]}=={NIXL_PACKAGE[1]}",
            f"{NIXL_META_PACKAGE[0]}=={NIXL_META_PACKAGE[1]}", *lock_pins("node.txt")]


def lock_overrides() -> list[str]:
    """uv overrides: packages a dependency asks for that an engine venv must not get (a marker
    that is never true removes a requirement: nixl's meta package asks for nixl-cu12 too)."""
    return [f"{name} ; sys_platform == 'never'" for name in NIXL_EXCLUDED]


def _uv() -> str:
    candidates = [Path(sys.executable).parent / "uv", shutil.which("uv")]
    for c in candidates:
        if c and Path(c).is_file():
            out = subprocess.run([str(c), "--version"], capture_output=True, text=True).stdout
            if UV_VERSION in out:
                return str(c)
    raise LockError(f"uv {UV_VERSION} not found (pip install uv=={UV_VERSION}, or the project's test extras)")


def generate(package: str, version: str, platform: NodePlatform, *, directory: Path = ENGINE_LOCKS) -> Path:
    """Resolve PACKAGE==VERSION's closure for PLATFORM with uv and write its lock."""
    tag = lock_platform_tag(platform)
    inputs = lock_inputs(package, version)
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / lock_filename(package, version, platform.python, tag)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "inputs.in"
        req.write_text("\n".join(inputs) + "\n")
        overrides = Path(tmp) / "overrides.txt"
        overrides.write_text("\n".join(lock_overrides()) + "\n")
        resolved = Path(tmp) / "lock.txt"
        cmd = [
            _uv(), "pip", "compile", str(req), "--quiet", "--no-header", "--no-annotate", "--generate-hashes",
            "--python-version", platform.python, "--python-platform", _uv_target(platform),
            "--override", str(overrides), "--index-url", PYPI, "--no-config", "-o", str(resolved),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise LockError(f"uv could not resolve {package}=={version} for Python {platform.python} / "
                            f"{tag}:\n{proc.stderr.strip()[-3000:]}")
        body = resolved.read_text()
    header = "\n".join([
        "# pdkit engine lock: every package of the engine venv, exact, with hashes. Do not edit:",
        f"#   python -m pdkit.wheels.enginelock --sglang-version {version} --python {platform.python} --glibc "
        f"{platform.glibc_text}",
        f"# engine: {package}=={version}",
        f"# python: {platform.python}",
        f"# platform: {tag}",
        f"# resolver: uv {UV_VERSION}",
        f"# inputs: {' '.join(inputs[:3])} + pdkit/wheels/locks/node.txt; without: {' '.join(NIXL_EXCLUDED)}",
    ])
    out.write_text(header + "\n" + body)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the engine locks (pdkit/wheels/locks/engine/) with uv.")
    parser.add_argument("--sglang-version", action="append",
                        help=f"default: every pinned release ({', '.join(SGLANG_RELEASES)})")
    parser.add_argument("--platform", action="append", choices=sorted(KNOWN_PLATFORMS),
                        help="default: every known node OS")
    parser.add_argument("--python", help="a Python not in the platform table (with --glibc)")
    parser.add_argument("--glibc", help="the node's glibc, e.g. 2.36 (with --python)")
    args = parser.parse_args(argv)
    if bool(args.python) != bool(args.glibc):
        parser.error("--python and --glibc go together")
    if args.python:
        platforms = [platform_for(args.python, parse_glibc(args.glibc))]
    else:
        platforms = [KNOWN_PLATFORMS[p] for p in (args.platform or sorted(KNOWN_PLATFORMS))]
    failed = 0
    for version in args.sglang_version or list(SGLANG_RELEASES):
        for platform in platforms:
            try:
                path = generate("sglang", version, platform)
            except LockError as exc:
                failed += 1
                print(f"enginelock: FAILED sglang=={version} {platform.name}: {exc}", file=sys.stderr)
                continue
            lock = parse_lock(path)
            print(f"enginelock: {path.relative_to(LOCKS.parents[2])}: {len(lock.pins)} packages")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
