"""Build what a GPU host with systemd on the lent machine needs, here (root, Debian, network).

The lent GPU machine (Ubuntu 24.04, a VM whose PID 1 is not systemd, no sshd, no
systemd-nspawn, nothing reachable) gets a Debian trixie container booted by systemd-nspawn with
systemd as PID 1 and sshd, so that pdkit's real deploy (`pyinfra ... deploy/pd.py` over SSH)
runs there unchanged. Everything is built here and carried; gpu/nspawn/host.py does the rest on
the device. Output, git-ignored, one carry per directory:

    gpu-payload-nspawn/rootfs/rootfs-trixie.tar.xz  Debian 13 (glibc 2.41 >= the image's 2.39):
        systemd, sshd, python3 (3.13), systemd-container (its systemd-nspawn is what boots the
        container on the device: run through the rootfs' own ld.so), gcc + libc6-dev (Triton
        compiles its CUDA launchers with the C compiler at run time), prometheus-node-exporter
        (the deploy would apt-install it; the container has no route out). Trimmed: docs, man
        pages, translations, apt lists, caches, LTO, sanitizer runtimes, static libraries.
        No keys: host.py makes the host key and the client key on the device at each unpack.
    gpu-payload-nspawn/monitoring/rootfs-trixie-monitoring.tar.xz, gpu-payload-nspawn/cxx/rootfs-trixie-cxx.tar.xz
        layers (LAYERS): only what installing Prometheus, resp. g++ (SGLang's JIT kernels: nvcc
        needs a host C++ compiler), adds to the base tree; host.py unpacks them over it.
    gpu-payload-nspawn/wheels/wheels.tar.xz
        control/   wheels + hashed requirements for the device's own venv (CPython 3.12,
                   manylinux_2_39): pdkit's dependencies at the exact versions installed in this
                   machine's pdkit venv (pyinfra 3.10.0, ...), pip, setuptools and wheel (pdkit
                   itself is the carried repository, installed editable there, and setuptools
                   lets pdkit rebuild its own wheel offline if that tree differs from this one);
        cache/     ${PDKIT_CACHE}/wheelhouse as pdkit/wheels/wheelhouse.py lays it out, for the
                   container's platform (debian13: CPython 3.13, glibc 2.41): the node pins
                   (pdkit/wheels/locks/node.txt: the pdkit-only node venv), the router pins of
                   sglang-router 0.3.2 (SGLang 0.5.17's pairing) and pdkit's wheel. With
                   PDKIT_OFFLINE=1 the deploy uses only this cache.
        Binary wheels are stored uncompressed inside (same files, same RECORD; only the zip
        compression differs) so that xz can compress them: the router's 31 MB wheel packs
        to about half.
    gpu-payload-nspawn/manifest.json  sizes, sha256, package versions, pdkit's source digest.

    sudo PYTHONPATH=. .venv/bin/python gpu/nspawn/build.py            # ~12 min (3 debootstraps, xz -9e), debs cached
    sudo PYTHONPATH=. .venv/bin/python gpu/nspawn/build.py --only wheels

docs/gpu.md ("A systemd host on the lent machine") has the device call sequence.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "gpu-payload-nspawn"
WORK = Path(os.environ.get("PDKIT_NSPAWN_WORK", "/var/tmp/pdkit-nspawn"))
SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
CARRY_AIM = 56 * 2**20  # per artefact: the 64 MiB carry holds it beside the ~7.5 MB repo

# The lab's list (pdkit/lab/rootfs.py) minus what an offline host has no use for (curl,
# ca-certificates, gnupg, rsync, ping, less), plus what the device needs and cannot fetch.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",  # brings openssh-client: host.py's readiness check runs its ssh
    "python3",
    "python3-venv",
    "sudo",
    "adduser",
    "netbase",
    "iproute2",
    "procps",
    "numactl",
    # the systemd-nspawn that boots this very tree on the device (which has none)
    "systemd-container",
    # Triton (SGLang's triton attention backend) builds each kernel's launcher with the C
    # compiler at run time; the image's Python headers are bound in by host.py
    "gcc",
    "libc6-dev",
    # what roles/packages.py would apt-install on every host (plan.host_packages): already
    # installed, so the deploy finds nothing missing and never needs a package source
    "prometheus-node-exporter",
)
# Layers: each a tarball of only what installing its packages adds to the base tree (unpacked
# over it by host.py), so that no carry exceeds the limit. monitoring: what the deploy would
# apt-install on the monitoring host (Prometheus, 85 MB, and Alertmanager). cxx: SGLang's JIT kernels (tvm_ffi ->
# nvcc from the image's CUDA toolkit, bound in) need a host C++ compiler.
LAYERS = {"monitoring": ("prometheus", "prometheus-alertmanager"), "cxx": ("g++",)}

# Removed after debootstrap: nothing on a serving host reads them, and the carry is 64 MiB.
TRIM = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bash-completion",
    "usr/share/gdb",
    "usr/share/gcc",
    # link-time optimisation (gcc -flto) and its dump tool: Triton never asks for either
    "usr/libexec/gcc/x86_64-linux-gnu/14/lto1",
    "usr/bin/x86_64-linux-gnu-lto-dump-14",
    "usr/bin/lto-dump-14",
    # binutils' profiler
    "usr/lib/x86_64-linux-gnu/gprofng",
    "etc/gprofng.rc",
    # promtool: prometheus' package depends on it, nothing pdkit runs calls it (86 MB)
    "usr/bin/promtool",
    # the time-zone database of Prometheus' web UI's JavaScript (the API does not use it)
    "usr/share/javascript/moment-timezone/data",
)
# sanitizer runtimes (gcc -fsanitize=...) and gprofng's libraries
TRIM_GLOBS = (
    "usr/lib/x86_64-linux-gnu/libasan.so*",
    "usr/lib/x86_64-linux-gnu/libtsan.so*",
    "usr/lib/x86_64-linux-gnu/liblsan.so*",
    "usr/lib/x86_64-linux-gnu/libubsan.so*",
    "usr/lib/x86_64-linux-gnu/libhwasan.so*",
    "usr/lib/x86_64-linux-gnu/libgprofng.so*",
    # static glibc (gcc -static): Triton links shared objects (libc_nonshared.a stays)
    "usr/lib/x86_64-linux-gnu/libc.a",
    "usr/lib/x86_64-linux-gnu/libm-2.*.a",
    "usr/lib/x86_64-linux-gnu/libmvec.a",
    "usr/lib/x86_64-linux-gnu/libcrypt.a",
    "usr/lib/x86_64-linux-gnu/libresolv.a",
    "usr/lib/gcc/x86_64-linux-gnu/14/lib*san*",
    # static C++ runtimes (g++ -static-libstdc++): JIT kernels link the shared one
    "usr/lib/gcc/x86_64-linux-gnu/14/libstdc++*.a",
    "usr/lib/gcc/x86_64-linux-gnu/14/libsupc++.a",
    "usr/bin/gp-*",
    "usr/bin/gprofng*",
    "usr/bin/x86_64-linux-gnu-gp-*",
    "usr/bin/x86_64-linux-gnu-gprofng*",
)

# what host.py runs from the rootfs on the device, through the rootfs' own ld.so
HOST_SIDE_BINARIES = ("usr/bin/systemd-nspawn", "usr/bin/ssh", "usr/bin/ssh-keygen", "usr/sbin/ip")
LIBRARY_PATH = ("usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/systemd", "lib/x86_64-linux-gnu")

# pip runs from its own wheel on the device (no ensurepip needed there) and stays in the venv;
# setuptools + wheel let pdkit rebuild its own wheel offline when the device's tree differs
# (PIP_NO_BUILD_ISOLATION=0; pyproject.toml asks for setuptools>=68)
CONTROL_TOOLS = {"pip": "25.1.1", "setuptools": "80.9.0", "wheel": "0.45.1"}

RECIPE_VERSION = 1  # bump when the customisation below changes


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------------- rootfs


def customise(root: Path) -> None:
    """The lab image's customisation (its sshd, journald, resolv.conf and masked units), for trixie."""
    from pdkit.lab.rootfs import JOURNALD_CONF, SSHD_CONFIG, clear_identity, mask_units, remove_tree, write_file

    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    write_file(root / "etc/ssh/sshd_config.d/pdkit-lab.conf", SSHD_CONFIG)
    write_file(root / "etc/systemd/journald.conf.d/pdkit-lab.conf", JOURNALD_CONF)
    (root / "var/log/journal").mkdir(parents=True, exist_ok=True)
    mask_units(root)
    # nothing to fetch from on the device: no sources at all, so apt says so at once
    write_file(root / "etc/apt/sources.list", "# pdkit nspawn host: no package source (the device reaches nothing)\n")
    for extra in (root / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()
    clear_identity(root)
    for rel in TRIM:
        p = root / rel
        if p.is_dir() and not p.is_symlink():
            remove_tree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    for pattern in TRIM_GLOBS:
        for p in root.glob(pattern):
            p.unlink()
    for cache in root.glob("usr/lib/python3*/**/__pycache__"):
        remove_tree(cache)
    for d in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
        for p in (root / d).rglob("*"):
            if p.is_file() or p.is_symlink():
                p.unlink()
    for p in [*(root / "var/cache/debconf").glob("*-old"), *(root / "var/lib/dpkg").glob("*-old")]:
        p.unlink()
    for d in ("dev", "proc", "sys", "run", "tmp"):
        for p in (root / d).glob("*"):
            remove_tree(p)


def check_host_side(root: Path) -> dict[str, str]:
    """Every binary host.py runs from the rootfs resolves all of its libraries inside the rootfs."""
    ld = root / "lib64/ld-linux-x86-64.so.2"
    libpath = ":".join(str(root / d) for d in LIBRARY_PATH)
    versions = {}
    for rel in HOST_SIDE_BINARIES:
        out = run([str(ld), "--library-path", libpath, "--list", str(root / rel)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if "=>" not in line:
                continue
            target = line.split("=>", 1)[1].split("(")[0].strip()
            if "not found" in line or not target.startswith(str(root) + "/"):
                raise SystemExit(f"{rel}: {line.strip()}: a library resolves outside the rootfs")
    nspawn = run([str(ld), "--library-path", libpath, str(root / "usr/bin/systemd-nspawn"), "--version"],
                 capture_output=True, text=True).stdout.splitlines()[0]
    versions["systemd-nspawn"] = nspawn
    return versions


def package_versions(root: Path, packages: tuple[str, ...]) -> dict[str, str]:
    out = run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package} ${Version}\n"],
              capture_output=True, text=True).stdout
    have = dict(line.split(" ", 1) for line in out.splitlines() if line)
    versions = {p: have.get(p, "MISSING") for p in packages}
    missing = [p for p, v in versions.items() if v == "MISSING"]
    if missing:
        raise SystemExit(f"not installed: {missing}")
    return versions


def debootstrap(root: Path, packages: tuple[str, ...], args: argparse.Namespace) -> None:
    from pdkit.lab.rootfs import remove_tree

    remove_tree(root)
    root.mkdir(parents=True)
    debs = WORK / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    log_path = root.with_suffix(".debootstrap.log")
    log(f"rootfs: debootstrap {SUITE} minbase + {len(packages)} packages into {root} (debs cached in {debs}; log {log_path})")
    t = time.monotonic()
    with open(log_path, "w") as fh:
        proc = subprocess.run(
            ["nice", "-n", "19", "debootstrap", "--variant=minbase", "--merged-usr", "--components=main",
             f"--cache-dir={debs}", "--include=" + ",".join(packages), SUITE, str(root), args.mirror],
            stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"debootstrap failed ({proc.returncode}): see {log_path}")
    log(f"rootfs: debootstrap done in {time.monotonic() - t:.0f}s")


def pack(root: Path, dest: Path, args: argparse.Namespace, names: Path | None = None) -> None:
    """tar | xz with the x86 branch filter (executables compress ~7% better); NAMES: a file list instead of the tree."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    what = ["--no-recursion", "-T", str(names)] if names else ["."]
    t = time.monotonic()
    run(["tar", "--numeric-owner", "--sort=name", "--mtime=@0", "-C", str(root), "-cf", str(tmp),
         "-I", f"nice -n 19 xz --x86 --lzma2=preset=9e -T{args.threads}", *what])
    os.replace(tmp, dest)
    log(f"{dest.relative_to(REPO)} {mib(dest.stat().st_size)} (packed in {time.monotonic() - t:.0f}s)")


def _signature(path: Path) -> tuple:
    st = path.lstat()
    if path.is_symlink():
        return ("l", os.readlink(path), st.st_uid, st.st_gid)
    if path.is_dir():
        return ("d", st.st_mode, st.st_uid, st.st_gid)
    return ("f", st.st_mode, st.st_uid, st.st_gid, st.st_size, sha256(path) if st.st_size < 2**26 else st.st_mtime_ns)


def added_paths(base: Path, full: Path) -> list[str]:
    """Paths of FULL that BASE lacks or holds differently (the monitoring packages' files, the
    users they added, dpkg's status), parents first: what unpacking over BASE must write."""
    out = []
    for dirpath, dirnames, filenames in os.walk(full):
        dirnames.sort()
        for name in [*sorted(dirnames), *sorted(filenames)]:
            p = Path(dirpath) / name
            rel = p.relative_to(full)
            twin = base / rel
            if not (twin.exists() or twin.is_symlink()) or _signature(twin) != _signature(p):
                out.append(f"./{rel}")
    return out


def build_rootfs(args: argparse.Namespace) -> dict:
    from pdkit.lab.rootfs import remove_tree

    build = WORK / "build"
    base = build / "rootfs"
    debootstrap(base, PACKAGES, args)
    versions = package_versions(base, PACKAGES)
    customise(base)
    host_side = check_host_side(base)
    log(f"rootfs: {host_side['systemd-nspawn']}; systemd-nspawn, ssh, ssh-keygen and ip resolve every library inside the rootfs")
    unpacked = int(run(["du", "-sb", str(base)], capture_output=True, text=True).stdout.split()[0])
    log(f"rootfs: {mib(unpacked)} after trimming")
    dest = OUT / "rootfs" / f"rootfs-{SUITE}.tar.xz"
    pack(base, dest, args)
    entry = {"file": str(dest.relative_to(REPO)), "bytes": dest.stat().st_size, "sha256": sha256(dest),
             "unpacked_bytes": unpacked, "suite": SUITE, "packages": versions, **host_side, "recipe": RECIPE_VERSION}
    entry["layers"] = {}
    for name, packages in LAYERS.items():
        if name in args.skip_layer:
            continue
        full = build / f"rootfs-{name}"
        debootstrap(full, PACKAGES + packages, args)
        layer_versions = package_versions(full, packages)
        customise(full)
        names = build / f"{name}.list"
        paths = added_paths(base, full)
        names.write_text("\n".join(paths) + "\n")
        dest = OUT / name / f"rootfs-{SUITE}-{name}.tar.xz"
        log(f"rootfs: layer {name}: {len(paths)} paths that installing {', '.join(packages)} adds or changes")
        pack(full, dest, args, names)
        entry["layers"][name] = {"file": str(dest.relative_to(REPO)), "bytes": dest.stat().st_size, "sha256": sha256(dest),
                                 "paths": len(paths), "packages": layer_versions,
                                 "changed_base_files": [p for p in paths if (base / p).exists() and not (base / p).is_dir()]}
        if not args.keep:
            remove_tree(full)
    if not args.keep:
        remove_tree(build)
    return entry


# ------------------------------------------------------------------------------------- wheels


def control_pins() -> dict[str, str]:
    """pdkit's runtime closure at the versions installed here (the set the tests ran with), for CPython 3.12 on Linux."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "implementation_name": "cpython", "platform_system": "Linux", "sys_platform": "linux",
           "platform_machine": "x86_64", "extra": ""}
    pins: dict[str, str] = {}
    todo = [Requirement(r) for r in importlib.metadata.requires("pdkit") or []]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in pins:
            continue
        dist = importlib.metadata.distribution(req.name)
        if not req.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{req}: this venv has {dist.version}")
        pins[name] = dist.version
        todo += [Requirement(r) for r in dist.requires or []]
    pins.pop("pdkit", None)
    pins.update(CONTROL_TOOLS)
    return pins


def store_uncompressed(wheel: Path, dest: Path) -> None:
    """The same wheel with ZIP_STORED members: same names, order and bytes inside (RECORD holds)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            data = src.read(info)
            new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            new.external_attr, new.create_system, new.compress_type = info.external_attr, info.create_system, zipfile.ZIP_STORED
            out.writestr(new, data)
    with zipfile.ZipFile(dest) as check:
        assert check.testzip() is None, dest


def build_wheels(args: argparse.Namespace) -> dict:
    os.environ["PDKIT_CACHE"] = str(WORK / "cache")  # our own pools, not the lead's ~/.cache
    from pdkit.upstream.versions import SGLANG_RELEASES
    from pdkit.wheels import wheelhouse
    from pdkit.wheels.platforms import KNOWN_PLATFORMS

    control_platform = KNOWN_PLATFORMS["ubuntu2404"]  # the device image: CPython 3.12, glibc 2.39
    node_platform = KNOWN_PLATFORMS["debian13"]  # the container: CPython 3.13, glibc 2.41
    router = SGLANG_RELEASES["0.5.17"].default_router
    own = wheelhouse.pdkit_wheel()
    pins = control_pins()
    log(f"wheels: control venv: pdkit + {len(pins)} packages for CPython {control_platform.python}, glibc {control_platform.glibc_text}")
    control = wheelhouse.download("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())), pins, control_platform,
                                  label="control venv", hashed=False)
    log(f"wheels: container ({node_platform.name}): node bundle (the pdkit-only node venv) and {router[0]} {router[1]}")
    node = wheelhouse.node_bundle(node_platform)
    router_bundle = wheelhouse.router_bundle(node_platform, *router)
    stage = WORK / "wheels-stage"
    from pdkit.lab.rootfs import remove_tree

    remove_tree(stage)
    cache = wheelhouse.cache_root()
    entries: dict[str, Path] = {}
    # pdkit itself is not among them: the device installs its carried repository editable
    for wheel in control.values():
        entries[f"control/{wheel.name}"] = wheel
    for wheel in sorted({*node.wheels, *router_bundle.wheels}):
        entries[f"cache/wheelhouse/{wheel.relative_to(cache)}"] = wheel
    requirements = []
    first: dict[str, Path] = {}  # a wheel in both sets (pure Python, pdkit's own) is packed once: a hard link
    for rel, src in sorted(entries.items()):
        dest = stage / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.name in first:
            os.link(first[src.name], dest)
        elif src.name.endswith("-any.whl") or src.stat().st_size < 200_000:
            shutil.copy2(src, dest)
        else:
            store_uncompressed(src, dest)
        first.setdefault(src.name, dest)
        if rel.startswith("control/"):
            from packaging.utils import parse_wheel_filename

            name, version, _, _ = parse_wheel_filename(dest.name)
            requirements.append(f"{name}=={version} --hash=sha256:{sha256(dest)}\n")
    (stage / "control/requirements.txt").write_text("".join(sorted(requirements)))
    dest = OUT / "wheels" / "wheels.tar.xz"
    pack(stage, dest, args)
    remove_tree(stage)
    log(f"wheels: {dest.relative_to(REPO)} {mib(dest.stat().st_size)} ({len(entries)} wheels)")
    return {"file": str(dest.relative_to(REPO)), "bytes": dest.stat().st_size, "sha256": sha256(dest),
            "pdkit_wheel": own.name, "pdkit_source_digest": wheelhouse.source_digest(),
            "control": {"platform": control_platform.name, "pins": pins},
            "node_bundle": {"platform": node_platform.name, "wheels": [w.name for w in node.wheels], "digest": node.digest},
            "router_bundle": {"package": list(router), "wheels": [w.name for w in router_bundle.wheels], "digest": router_bundle.digest}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["rootfs", "wheels"], help="build one artefact (the manifest keeps the other's entry)")
    ap.add_argument("--mirror", default=MIRROR)
    ap.add_argument("--threads", type=int, default=1, help="xz threads (1: the best ratio)")
    ap.add_argument("--skip-layer", action="append", default=[], choices=sorted(LAYERS), help="do not build this layer")
    ap.add_argument("--keep", action="store_true", help=f"keep the trees under {WORK}/build")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root (debootstrap)")
    manifest_path = OUT / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if args.only in (None, "rootfs"):
        manifest["rootfs"] = build_rootfs(args)
    if args.only in (None, "wheels"):
        manifest["wheels"] = build_wheels(args)
    manifest["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    entries = [manifest.get("rootfs"), *((manifest.get("rootfs") or {}).get("layers") or {}).values(), manifest.get("wheels")]
    for entry in filter(None, entries):
        flag = "" if entry["bytes"] <= CARRY_AIM else f"  OVER the {mib(CARRY_AIM)} aim"
        print(f"{entry['file']}: {mib(entry['bytes'])}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
