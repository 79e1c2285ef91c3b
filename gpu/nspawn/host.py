"""A GPU host with systemd as PID 1 on the lent machine: unpack, boot, reach over SSH (stdlib only).

The lent machine has no systemd, no sshd, no systemd-nspawn and no network. gpu/nspawn/build.py
builds a Debian trixie tree that carries its own systemd-nspawn; this script boots it, so pdkit's
real deploy (`pyinfra inventories/h200-nspawn.py deploy/pd.py`, real SSH, strict host keys) runs
from the machine's shell against a real systemd host that sees the GPU:

    python3 gpu/nspawn/host.py unpack        # rootfs + its layers (monitoring, cxx)
                                             #   -> /var/lib/machines/pdkit-h200
    python3 gpu/nspawn/host.py control-venv  # wheels.tar.xz -> /root/pdkit-venv (pyinfra, pdkit)
                                             #   + the deploy's wheel cache
    python3 gpu/nspawn/host.py up --engine-payload gpu-payload     # keys, binds, boot, wait, checks
    python3 gpu/nspawn/host.py status | probe | down [--purge]

Several hosts on one machine (inventories/h200-nspawn-pair.py): `--machine NAME` (state in
STATE/NAME/) and `up --address 10.214.0.2/24`: nspawn's own veth on a bridge (routed through
the machine's namespace where the kernel has no bridges), the machine at the network's first
address, sshd on port 22 of the container's own; `xfer-probe --peer OTHER` moves GPU memory each
way with NIXL per UCX_TLS candidate; `exec -- CMD` runs a command in one over SSH.

`up`: a fresh ed25519 host key (in the tree) and client key (in the state dir), known_hosts
written from the tree before boot (no trust on first use); sshd on 127.0.0.1:2222 (the
container shares the machine's network: engines, router and monitoring all listen inside the
one host; --netns NAME puts it in a network namespace of its own instead, for a rehearsal);
binds: /dev/nvidia* and /dev/nvidia-caps, the driver's user-space libraries (libcuda*,
libnvidia-*, libcudadebugger*: found with the machine's `ldconfig -p`), nvidia-smi and the
CUDA toolkit (/usr/local/cuda: SGLang's JIT kernels run its nvcc), read-only at the same paths;
the image's Python (executable, standard library, site directories with torch, headers for
Triton's launcher builds) read-only at the same paths; the
SGLang payload (gpu-payload/site.tar.xz + nixl.tar.xz, as gpu/device_driver.py unpacks them)
unpacked into /opt/engine-venv/site inside the tree, and /opt/engine-venv/bin/python: the
image's python3 with that payload first on its path -- the provided engine environment; the
model directory at the path inventories/h200.py names. systemd-nspawn runs through the
tree's own ld.so (`<root>/lib64/ld-linux-x86-64.so.2 --library-path <root libs>`), with the
flags the lab uses on a host whose PID 1 is not systemd (--register=no --keep-unit, from a shell
that first moved itself into a cgroup of its own). Ready when `systemctl is-system-running
--wait` over SSH says so; then ldconfig inside, a check that every shared library of the engine
environment resolves inside the container (missing non-glibc libraries are copied from the
image into /opt/engine-venv/lib), and a probe (GPU, imports, a Triton kernel under the engine
units' device policy). Timings and the probe go to the state directory.

State: gpu/nspawn/machine_state.py is the one rule for where it lives, shared with the
inventories: $PDKIT_NSPAWN_DIR (default /var/lib/pdkit-nspawn) holds the control side's key
(id_ed25519) and xfer-probe's ucx_tls.json; <that>/<machine>/ holds one machine's known_hosts,
host.json (what inventories/h200-nspawn.py and h200-nspawn-pair.py read), runtime.json,
timings.json, console.log, probe.json. Point PDKIT_NSPAWN_DIR at the base, never at a machine's
own directory (refused). The tree: $PDKIT_NSPAWN_MACHINES/<machine> (default
/var/lib/machines/pdkit-h200); `unpack` and `up` refuse a tree a running systemd-nspawn boots,
whatever the state directory says.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import importlib.util
import ipaddress
import json
import lzma
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what it shares with pdkit's lab (pdkit/hosts/nspawn_common.py, stdlib only): run from the repository
# root on the machine's bare python3, where pdkit is not installed
sys.path.insert(0, str(REPO))
from pdkit.hosts import nspawn_common as shared  # noqa: E402
from pdkit.hosts.nspawn_common import CommandError, proc_alive, proc_start_time, write_file  # noqa: E402


def _load_machine_state():
    """gpu/nspawn/machine_state.py (beside this file): where a machine's state lives."""
    name = "pdkit_nspawn_machine_state"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name("machine_state.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


MS = _load_machine_state()
MACHINE = "pdkit-h200"
MACHINES = Path(os.environ.get("PDKIT_NSPAWN_MACHINES", "/var/lib/machines"))
ARTEFACT_DIRS = [REPO / "gpu-payload-nspawn" / d for d in ("rootfs", "monitoring", "cxx", "wheels")] + [
    Path("/root/stash")]
ROOTFS_NAME = "rootfs-trixie.tar.xz"
# layers unpacked over it (build.py LAYERS): Prometheus, the C++ compiler
LAYER_NAMES = {"monitoring": "rootfs-trixie-monitoring.tar.xz", "cxx": "rootfs-trixie-cxx.tar.xz"}
WHEELS_NAME = "wheels.tar.xz"
SSH_ADDRESS = "127.0.0.1"
SSH_PORT = 2222
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/systemd", "lib/x86_64-linux-gnu")
ENGINE_ENV = "/opt/engine-venv"  # the provided engine environment inside the container
IMAGE_RELOCATED = "/opt/pdkit-image"  # image paths the container itself uses are bound here instead
BOOT_TIMEOUT = 180
STOP_TIMEOUT = 25
# the driver's user-space, as the machine's linker cache names it
DRIVER_LIB = re.compile(r"^(libcuda\.so|libnvidia-[\w.-]+\.so|libcudadebugger\.so|libnvcuvid\.so)")
# glibc's own libraries are always the container's (2.41): never copied from the image
GLIBC = re.compile(r"^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libBrokenLocale"
                   r"|libc_malloc_debug|ld-linux[\w-]*|libnss_\w+|libthread_db|libmemusage|libpcprofile)\.so")
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class Fail(SystemExit):
    def __init__(self, msg: str):
        super().__init__(f"host.py: error: {msg}")


# ----------------------------------------------------------------------------- small helpers


def machine_root(machine: str) -> Path:
    return MACHINES / machine


# the machine this run works on (main() sets it from --machine): its own state directory
CURRENT = {"machine": MACHINE}


def state_base() -> Path:
    """$PDKIT_NSPAWN_DIR (read at each call: the tests set it)."""
    return MS.base_dir()


def machine_state(machine: str | None = None) -> Path:
    """STATE/<machine>: machine_state.py's rule, the one the inventories read through."""
    try:
        return MS.machine_dir(machine or CURRENT["machine"])
    except MS.StateDirError as exc:
        raise Fail(str(exc)) from None


def state_file(name: str) -> Path:
    """A file of this machine's state (STATE/<machine>/NAME)."""
    return machine_state() / name


def client_key() -> Path:
    """The control side's SSH key: one for every machine this launcher boots."""
    return MS.client_key()


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    """A state file (runtime.json, host.json, ...), whole or not at all, keys sorted."""
    shared.write_json(path, data, indent=1, sort_keys=True)


def file_digest(path: Path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}:{int(st.st_mtime)}"


def find_artefact(name: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        if (d / name).is_file():
            return d / name
    return None


def rootfs_cmd(root: Path, binary: str) -> list[str]:
    """Run a binary of the tree on the machine itself: the tree's ld.so, the tree's libraries."""
    libpath = ":".join(str(root / d) for d in LIB_DIRS)
    return [str(root / "lib64/ld-linux-x86-64.so.2"), "--library-path", libpath, str(root / binary.lstrip("/"))]


def setns_net(path: str):
    """preexec_fn: join the network namespace at PATH (Python 3.11 has no os.setns)."""
    def enter() -> None:
        fd = os.open(path, os.O_RDONLY)
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {path}")
        os.close(fd)
    return enter


def remove_tree(path: Path) -> None:
    """rm -rf that never crosses into a mount; as long as it takes (a tree with its engine payload)."""
    try:
        shared.remove_tree(path, timeout=None)
    except CommandError as exc:
        raise Fail(str(exc)) from None


def extract(tarball: Path, root: Path) -> None:
    """xz in Python (the image may lack xz), tar if the machine has one (fast, exact), else tarfile."""
    tar = shutil.which("tar")
    if tar:
        proc = subprocess.Popen([tar, "--numeric-owner", "-xpf", "-", "-C", str(root)], stdin=subprocess.PIPE)
        assert proc.stdin is not None
        with lzma.open(tarball) as src:
            shutil.copyfileobj(src, proc.stdin, 1 << 20)
        proc.stdin.close()
        if proc.wait() != 0:
            raise Fail(f"tar failed unpacking {tarball}")
        return
    with tarfile.open(tarball, "r:xz") as t:
        kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        t.extractall(root, numeric_owner=True, **kw)  # our own artefact: setuid bits, absolute links kept


# ----------------------------------------------------------------------------- unpack


def cmd_unpack(args: argparse.Namespace) -> int:
    root = machine_root(args.machine)
    if running(args.machine):
        refuse_if_booted(args.machine, "unpacking over its tree")
        raise Fail(f"{args.machine} is running: `host.py down` first")
    dirs = [Path(d) for d in args.artefacts] if args.artefacts else ARTEFACT_DIRS
    base = find_artefact(ROOTFS_NAME, dirs)
    if base is None:
        raise Fail(f"no {ROOTFS_NAME} in {', '.join(map(str, dirs))}")
    layers_found = {name: find_artefact(f, dirs) for name, f in LAYER_NAMES.items()}
    t = time.monotonic()
    remove_tree(root)
    root.mkdir(parents=True)
    root.chmod(0o755)
    extract(base, root)
    layers = [file_digest(base)]
    for name, tarball in layers_found.items():
        if tarball:
            # only what installing the layer's packages adds, over the base tree; each layer holds the
            # base's dpkg database plus its own packages: merge, so every layer's packages stay known
            before = {f: (root / f).read_text() for f in DPKG_DB if (root / f).exists()}
            extract(tarball, root)
            for f, text in before.items():
                write_file(root / f, merge_dpkg(text, (root / f).read_text()))
            layers.append(file_digest(tarball))
    write_file(root / ".pdkit-nspawn-layers", "\n".join(layers) + "\n")
    seconds = round(time.monotonic() - t, 1)
    timings = read_json(state_file("timings.json"))
    timings["unpack_s"] = seconds
    write_json(state_file("timings.json"), timings)
    missing = [f"{name} ({LAYER_NAMES[name]})" for name, t in layers_found.items() if t is None]
    log(f"unpacked {' + '.join(layers)} into {root} in {seconds}s"
        + (f"; WITHOUT the layers {', '.join(missing)}" if missing else ""))
    return 0


DPKG_DB = ("var/lib/dpkg/status", "var/lib/dpkg/available")


def merge_dpkg(old: str, new: str) -> str:
    """Union of two dpkg status files by package (NEW's stanza wins)."""
    def stanzas(text: str) -> dict[str, str]:
        out = {}
        for block in text.strip().split("\n\n"):
            m = re.search(r"^Package: (\S+)", block, re.M)
            if m:
                arch = re.search(r"^Architecture: (\S+)", block, re.M)
                out[(m.group(1), arch.group(1) if arch else "")] = block.strip()
        return out
    merged = {**stanzas(old), **stanzas(new)}
    return "\n\n".join(merged[k] for k in sorted(merged)) + "\n"


# ----------------------------------------------------------------------------- control venv


def cmd_control_venv(args: argparse.Namespace) -> int:
    """The machine's own venv for pyinfra + pdkit, from the wheelhouse; the deploy's wheel cache."""
    wheels = Path(args.wheels) if args.wheels else find_artefact(WHEELS_NAME, ARTEFACT_DIRS)
    if wheels is None or not wheels.is_file():
        raise Fail(f"no {WHEELS_NAME} (give --wheels)")
    t = time.monotonic()
    stage = state_base() / "wheels"
    remove_tree(stage)
    stage.mkdir(parents=True)
    extract(wheels, stage)
    venv = Path(args.venv)
    python = args.python or sys.executable
    pip_wheel = next((stage / "control").glob("pip-*.whl"))
    remove_tree(venv)
    # --without-pip: Ubuntu's python3 has no ensurepip unless python3-venv is installed; pip then
    # runs from its own wheel (a wheel is importable as a zip) and installs itself too
    made = subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    # --isolated: no pip.conf or PIP_* of this machine bends it; only these files, each hash-checked
    pip_args = ["--isolated", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--no-deps",
                "--require-hashes", "--no-cache-dir", "--find-links", str(stage / "control"),
                "-r", str(stage / "control/requirements.txt")]
    if made.returncode == 0:
        run_checked([str(venv / "bin/python"), f"{pip_wheel}/pip", *pip_args])
        # pdkit itself is this repository, installed editable (as on the machine that built the
        # wheels): the deploy's roles, its wheel digest and the CLI all read these very sources
        editable = subprocess.run([str(venv / "bin/python"), "-m", "pip", "--isolated", "install", "--quiet",
                                   "--no-index", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
                                   "-e", str(REPO)],
                                  capture_output=True, text=True)
        if editable.returncode != 0:
            raise Fail(f"pip install -e {REPO}: {editable.stderr.strip()[-800:]}")
        how = "venv, pdkit editable from this repository"
    else:
        # no venv module at all: a --target tree, with the two entry points as scripts
        log(f"`{python} -m venv` failed ({made.stderr.strip().splitlines()[-1:]}); falling back to pip --target")
        site = venv / "site"
        run_checked([python, f"{pip_wheel}/pip", *pip_args, "--target", str(site)])
        site = f"{site}:{REPO}"  # pdkit itself: this repository
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        for name, module in (("python", None), ("pyinfra", "pyinfra"), ("pdkit", "pdkit.cli")):
            run_line = f'exec "{python}" "$@"' if module is None else f'exec "{python}" -m {module} "$@"'
            write_file(venv / "bin" / name,
                       f'#!/bin/sh\nexport PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"\n{run_line}\n', 0o755)
        how = "pip --target"
    # the deploy's wheel cache (pdkit/wheels/wheelhouse.py's layout): merged into $PDKIT_CACHE/wheelhouse
    cache = Path(os.environ.get("PDKIT_CACHE", Path.home() / ".cache" / "pdkit")) / "wheelhouse"
    for src in (stage / "cache/wheelhouse").rglob("*.whl"):
        dest = cache / src.relative_to(stage / "cache/wheelhouse")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
    # pdkit's own wheel is keyed on this tree's sources: if they differ from the build's, pdkit
    # rebuilds it here, offline, with the venv's setuptools (no build isolation, no index)
    env = {**os.environ, "PDKIT_OFFLINE": "1", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}
    check = subprocess.run([str(venv / "bin/python"), "-m", "pdkit.wheels.wheelhouse", "--platform", "debian13",
                            "--engine", "sim", "--router", "sglang-router==0.3.2", "--offline"],
                           env=env, capture_output=True, text=True, cwd=REPO)
    remove_tree(stage)
    if check.returncode != 0:
        raise Fail(f"the wheel cache does not cover the deploy: {check.stderr.strip()[-800:]}")
    log(f"control venv {venv} ({how}, {python}) and wheel cache {cache} in {time.monotonic() - t:.1f}s")
    for line in check.stdout.splitlines():
        log(f"  {line}")
    log(f"deploy with: PDKIT_OFFLINE=1 PIP_NO_INDEX=1 PIP_NO_BUILD_ISOLATION=0 {venv}/bin/pyinfra -y "
        "inventories/h200-nspawn.py deploy/pd.py")
    return 0


def run_checked(cmd: list[str]) -> None:
    """CMD to its end (pip may take minutes), its output's tail in the error."""
    try:
        shared.run(cmd, timeout=None)
    except CommandError as exc:
        raise Fail(f"{' '.join(cmd[:4])}...: {(exc.output or str(exc))[-1500:]}") from None


# ----------------------------------------------------------------------------- personalise


def personalise(root: Path, machine: str, address: str, port: int) -> str:
    """Host key, client key, authorized_keys, sshd's listen address; returns the known_hosts line."""
    machine_state().mkdir(parents=True, exist_ok=True)
    client = client_key()
    if not client.exists():
        run_checked([*rootfs_cmd(root, "usr/bin/ssh-keygen"), *shared.keygen_args(client, "pdkit-nspawn-control")])
    client.chmod(0o600)
    host_key = root / "etc/ssh/ssh_host_ed25519_key"
    if not host_key.exists():  # a fresh tree has none: build.py bakes no key
        run_checked([*rootfs_cmd(root, "usr/bin/ssh-keygen"), *shared.keygen_args(host_key, f"root@{machine}")])
    shared.authorize_key(root, client.with_suffix(".pub").read_text())
    write_file(root / "etc/ssh/sshd_config.d/pdkit-nspawn-listen.conf",
               "# pdkit nspawn host (gpu/nspawn/host.py): sshd on the container's address only\n"
               f"Port {port}\nListenAddress {address}\n")
    write_file(root / "etc/hostname", machine + "\n")
    if not (root / "etc/machine-id").read_text().strip():
        write_file(root / "etc/machine-id", hashlib.sha256(os.urandom(32)).hexdigest()[:32] + "\n", 0o444)
    named = "" if address.startswith("127.") else f"{address}\t{machine}\n"
    write_file(root / "etc/hosts",
               f"127.0.0.1\tlocalhost{'' if named else ' ' + machine}\n"
               f"{named}::1\tlocalhost ip6-localhost ip6-loopback\n")
    write_file(root / "etc/default/locale", "LANG=C.UTF-8\n")  # pam_env reads it at every SSH login
    pub = " ".join((root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
    name = address if port == 22 else f"[{address}]:{port}"
    line = f"{name} {pub}\n"
    write_file(state_file("known_hosts"), line)
    return line


# ----------------------------------------------------------------------------- binds


def driver_binds(root: Path) -> tuple[list[str], list[str]]:
    """--bind flags for the NVIDIA device nodes and the driver's user space; notes for the log."""
    flags, notes = [], []
    nodes = sorted(p for p in glob.glob("/dev/nvidia*") if Path(p).exists())
    for node in nodes:
        flags.append(f"--bind={node}")
    notes.append(f"devices: {', '.join(nodes)}")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    libs: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and DRIVER_LIB.match(m.group(1)) and "x86-64" in m.group(2):
            libs[m.group(3)] = os.path.realpath(m.group(3))
    if not libs:
        raise Fail("`ldconfig -p` lists no libcuda/libnvidia-*: is the driver's user space installed?")
    extra_dirs = set()
    for real in sorted(set(libs.values())):
        flags.append(f"--bind-ro={real}")
        d = os.path.dirname(real).lstrip("/")
        if d not in LIB_DIRS and d != "lib64":
            extra_dirs.add("/" + d)
    # the names ldconfig knows them by (libcuda.so.1 -> libcuda.so.580...): links in the tree
    for path, real in libs.items():
        if path != real:
            # absolute: /lib is itself a link in the tree (merged /usr)
            shared.replace_link(root / path.lstrip("/"), real)
    if extra_dirs:
        write_file(root / "etc/ld.so.conf.d/pdkit-nvidia.conf", "\n".join(sorted(extra_dirs)) + "\n")
    # the image's CUDA toolkit: SGLang's JIT kernels (tvm_ffi) run its nvcc (CUDA_HOME or /usr/local/cuda)
    cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if os.path.isdir(cuda):
        real = os.path.realpath(cuda)
        for dest in dict.fromkeys([real, "/usr/local/cuda"]):
            flags.append(f"--bind-ro={real}:{dest}")
        notes.append(f"CUDA toolkit {real} at {', '.join(dict.fromkeys([real, '/usr/local/cuda']))}")
    else:
        notes.append(f"WARNING no CUDA toolkit at {cuda}: SGLang's JIT kernels will not build")
    smi = shutil.which("nvidia-smi")
    if smi:
        # at its own path and on the container's PATH (SGLang runs `nvidia-smi` by name)
        for dest in dict.fromkeys([smi, "/usr/bin/nvidia-smi"]):
            flags.append(f"--bind-ro={os.path.realpath(smi)}:{dest}")
    names = sorted({os.path.basename(r) for r in libs.values()})
    notes.append(f"driver libraries: {len(set(libs.values()))} files ({', '.join(names[:6])}...); "
                 f"nvidia-smi: {smi or 'not found'}")
    return flags, notes


IMAGE_QUERY = r"""
import importlib.util, json, os, sys, sysconfig
paths = sysconfig.get_paths()
multiarch = sysconfig.get_config_var("MULTIARCH") or ""
inc = [paths.get("include"), paths.get("platinclude")]
if multiarch:
    inc.append(os.path.join(sys.base_prefix, "include", multiarch, "python%d.%d" % sys.version_info[:2]))
torch = importlib.util.find_spec("torch")
print(json.dumps({
    "executable": sys.executable, "real_executable": os.path.realpath(sys.executable),
    "version": sys.version.split()[0],
    "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "stdlib": [paths["stdlib"], paths["platstdlib"]],
    "sys_path": [p for p in sys.path if p and os.path.isdir(p)], "include": [p for p in inc if p],
    "torch": os.path.dirname(torch.origin) if torch else None,
}))
"""


def image_python(python: str) -> dict:
    proc = subprocess.run([python, "-I", "-c", IMAGE_QUERY], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise Fail(f"{python}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def image_binds(root: Path, info: dict) -> tuple[list[str], list[str], list[str]]:
    """--bind-ro flags for the image's Python, the dirs to put on PYTHONPATH, notes."""
    flags, pythonpath, notes = [], [], []
    sources: list[str] = []
    system = info["base_prefix"] in ("/usr", "/usr/local")
    if not system:  # a self-contained install (python-build-standalone, conda, a custom prefix): the whole prefix
        sources.append(info["base_prefix"])
    if info["prefix"] != info["base_prefix"]:
        sources.append(info["prefix"])
    # a venv's python (the image's: /opt/torch/.venv/bin/python3) is a link to its base interpreter
    sources += [info["real_executable"], *info["stdlib"], *info["include"], *info["sys_path"]]
    done: list[str] = []
    for src in sources:
        if not os.path.exists(src) or any(src == d or src.startswith(d.rstrip("/") + "/") for d in done):
            continue
        done.append(src)
        twin = root / src.lstrip("/")
        # an empty file is the mount point nspawn left from an earlier boot (a real binary is not empty)
        in_use = (twin.is_file() and twin.stat().st_size > 0) or (twin.is_dir() and any(twin.iterdir()))
        if not in_use:
            flags.append(f"--bind-ro={src}")
            continue
        if src in info["sys_path"]:
            dest = IMAGE_RELOCATED + src
            flags.append(f"--bind-ro={src}:{dest}")
            pythonpath.append(dest)
            pth = sorted(os.path.basename(p) for p in glob.glob(os.path.join(src, "*.pth")))
            notes.append(f"{src} is the container's own too: bound at {dest}, on PYTHONPATH"
                         + (f" (its .pth files are not run: {', '.join(pth)})" if pth else ""))
        else:
            raise Fail(f"the image's {src} is also a path the container uses; cannot bind it there")
    for src in done:
        if src.startswith(("/root/", "/home/")):
            notes.append(f"WARNING {src} is under /root or /home: the engine units' ProtectHome=yes hides it")
    notes.append(f"image python {info['executable']} {info['version']}; torch at {info['torch'] or 'NOT FOUND'}; "
                 f"{len(done)} paths bound read-only")
    return flags, pythonpath, notes


def compile_site(site: Path, python: str) -> str:
    """Byte-compile the unpacked engine site with the engines' own interpreter, as pip does on a
    node the kit installs: the payload is carried without bytecode (gpu/run_gpu_tier.py installs it
    with --no-compile and strips __pycache__ to fit the carries), and the engine user cannot write
    into the site, so without this both engine processes compiled every module at every start."""
    t = time.monotonic()
    done = subprocess.run([python, "-m", "compileall", "-q", "-j", "0", "-d", f"{ENGINE_ENV}/site", str(site)],
                          capture_output=True, text=True)
    pyc = sum(1 for _ in site.rglob("*.pyc"))
    # compileall exits 1 when any file fails (vendored py2 snippets, templates): counted, not fatal
    failed = sum(1 for line in done.stdout.splitlines() if line.startswith("*** Error compiling"))
    return (f"bytecode: {pyc} .pyc written under {ENGINE_ENV}/site in {time.monotonic() - t:.1f}s"
            + (f" ({failed} file(s) did not compile, rc {done.returncode})" if done.returncode else ""))


def engine_env(root: Path, payload: Path | None, model_dir: str, info: dict | None, pythonpath: list[str]) -> list[str]:
    """/opt/engine-venv inside the tree: the SGLang payload and bin/python (the image's, payload first)."""
    notes = []
    env = root / ENGINE_ENV.lstrip("/")
    site = env / "site"
    if payload is not None:
        marker = env / ".payload"
        layers = [file_digest(payload / n) for n in ("site.tar.xz", "nixl.tar.xz") if (payload / n).exists()]
        if not layers:
            raise Fail(f"{payload}: no site.tar.xz / nixl.tar.xz (the GPU tier's payload: gpu/run_gpu_tier.py --dry)")
        if not marker.exists() or marker.read_text().split() != layers:
            t = time.monotonic()
            remove_tree(site)
            site.mkdir(parents=True)
            for name in ("site.tar.xz", "nixl.tar.xz"):
                if (payload / name).exists():
                    with tarfile.open(payload / name, "r:xz") as tar:  # as gpu/device_driver.py does
                        kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
                        tar.extractall(site, **kw)
            notes.append(f"engine payload {', '.join(layers)} -> {ENGINE_ENV}/site in {time.monotonic() - t:.1f}s")
            notes.append(compile_site(site, info["executable"] if info else sys.executable))
            write_file(marker, "\n".join(layers) + "\n")
        model_src = payload / "model"
        if model_src.is_dir():
            dest = root / model_dir.lstrip("/")
            remove_tree(dest)
            shutil.copytree(model_src, dest)
            notes.append(f"model {model_dir}")
    if info is not None:
        path = ":".join([f"{ENGINE_ENV}/site", *pythonpath])
        lib = env / "lib"
        ld = (f'export LD_LIBRARY_PATH="{ENGINE_ENV}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
              if lib.is_dir() and any(lib.iterdir()) else "")
        write_file(env / "bin/python",
              "#!/bin/sh\n"
              "# pdkit nspawn host (gpu/nspawn/host.py): the lent machine's own Python, bound read-only at its own\n"
              "# paths, with the carried SGLang payload first on its path: the provided engine environment\n"
              f'export PYTHONPATH="{path}${{PYTHONPATH:+:$PYTHONPATH}}"\n{ld}'
              "# the lent machine's rule: NVLink multicast off in NCCL, PyTorch and NVSHMEM, whatever the unit sets\n"
              "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1\n"
              "# the image's own tools last on PATH (ninja: SGLang's JIT kernels build with it)\n"
              f'export PATH="${{PATH:-/usr/bin:/bin}}:{os.path.dirname(info["executable"])}"\n'
              f'exec "{info["executable"]}" "$@"\n', 0o755)
        for alias in ("python3", f"python{'.'.join(info['version'].split('.')[:2])}"):
            shared.replace_link(env / "bin" / alias, "python")
        notes.append(f"{ENGINE_ENV}/bin/python -> {info['executable']} with {path} first")
    return notes



# ----------------------------------------------------------------------------- network


# the link the machines booted with --address share: a bridge in the lent machine's namespace
BRIDGE = "pdkn-br0"
GUEST_IFACE = "host0"  # the name nspawn's own --network-veth gives the container's end


def ip_cmd(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`ip` from the tree (the lent machine has no iproute2 of its own)."""
    r = subprocess.run([*rootfs_cmd(root, "usr/sbin/ip"), *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise Fail(f"ip {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r


def ensure_bridge(root: Path, gateway: ipaddress.IPv4Interface) -> bool:
    """The bridge with the network's first address; False where the kernel has no bridges."""
    if ip_cmd(root, "link", "show", "dev", BRIDGE, check=False).returncode == 0:
        return True
    if ip_cmd(root, "link", "add", BRIDGE, "type", "bridge", check=False).returncode != 0:
        return False
    ip_cmd(root, "addr", "add", str(gateway), "dev", BRIDGE)
    ip_cmd(root, "link", "set", "dev", BRIDGE, "up")
    return True


def gateway_of(iface: ipaddress.IPv4Interface) -> ipaddress.IPv4Interface:
    """The lent machine's own end of IFACE's network: its first address."""
    gateway = ipaddress.IPv4Interface(f"{next(iface.network.hosts())}/{iface.network.prefixlen}")
    if iface.ip == gateway.ip:
        raise Fail(f"--address {iface}: {gateway.ip} is the lent machine's own end of {iface.network}; "
                   "use another address")
    return gateway


def host_veth(machine: str, mode: str) -> str:
    """The lent machine's end of the veth nspawn makes (its own naming: vb-/ve- + the machine, 15 bytes)."""
    return (("vb-" if mode == "bridge" else "ve-") + machine)[:15]


def network_flags(root: Path, iface: ipaddress.IPv4Interface, mode: str) -> tuple[list[str], str]:
    """nspawn's own private network for a container on IFACE: a veth to the bridge or, where the
    kernel has no bridges, a veth routed through the machine's namespace. nspawn's own veth, not a
    named netns: only with a private network does nspawn mount the container's /sys from the
    container's namespace, and UCX finds its network devices there (/sys/class/net)."""
    machine_id = Path("/etc/machine-id")
    if not (machine_id.exists() and machine_id.read_text().strip()):
        # nspawn derives the veth's MAC addresses from the machine id; the lent machine has none
        # ("Failed to generate predictable MAC address for container side: No medium found")
        write_file(machine_id, hashlib.sha256(os.urandom(32)).hexdigest()[:32] + "\n", 0o444)
        log(f"{machine_id} was empty: wrote one (nspawn's veth MAC addresses derive from it)")
    if mode == "bridge" and not ensure_bridge(root, gateway_of(iface)):
        log("no bridge in this kernel: the containers' traffic is routed through the machine's namespace instead")
        mode = "routed"
    return ([f"--network-bridge={BRIDGE}"] if mode == "bridge" else ["--network-veth"]), mode


def guest_network(root: Path, iface: ipaddress.IPv4Interface, mode: str) -> None:
    """A unit in the tree that gives host0 its address before sshd starts (no networkd inside)."""
    gateway = gateway_of(iface)
    if mode == "bridge":
        steps = [f"addr replace {iface} dev {GUEST_IFACE}", f"link set dev {GUEST_IFACE} up"]
    else:
        steps = [f"addr replace {iface.ip}/32 dev {GUEST_IFACE}", f"link set dev {GUEST_IFACE} up",
                 f"route replace {gateway.ip}/32 dev {GUEST_IFACE}", f"route replace {iface.network} via {gateway.ip}"]
    # a default route, as on any host: code that asks the kernel for its outgoing address finds one
    steps.append(f"route replace default via {gateway.ip}")
    write_file(root / "etc/systemd/system/pdkit-nspawn-net.service",
          "# pdkit nspawn host (gpu/nspawn/host.py up --address): the container's own address\n"
          "[Unit]\nDescription=pdkit nspawn host address\nDefaultDependencies=no\n"
          "Before=network.target ssh.service sshd.service\n\n"
          "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/sbin/ip link set dev lo up\n"
          + "".join(f"ExecStart=/usr/sbin/ip {step}\n" for step in steps)
          + "\n[Install]\nWantedBy=multi-user.target\n")
    shared.replace_link(root / "etc/systemd/system/multi-user.target.wants/pdkit-nspawn-net.service",
                        "/etc/systemd/system/pdkit-nspawn-net.service")
    write_file(root / "etc/systemd/system/ssh.service.d/pdkit-nspawn-net.conf",
          "# sshd listens on the address pdkit-nspawn-net.service gives host0\n"
          "[Unit]\nWants=pdkit-nspawn-net.service\nAfter=pdkit-nspawn-net.service\n")


def host_side_routed(root: Path, machine: str, iface: ipaddress.IPv4Interface, proc: subprocess.Popen) -> None:
    """Routed mode: the machine's end of nspawn's veth holds the gateway's /32 and a route to the container."""
    veth = host_veth(machine, "routed")
    deadline = time.monotonic() + 30
    while ip_cmd(root, "link", "show", "dev", veth, check=False).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise Fail(f"nspawn made no {veth} (exited: {proc.poll()})")
        time.sleep(0.05)
    ip_cmd(root, "addr", "replace", f"{gateway_of(iface).ip}/32", "dev", veth)
    ip_cmd(root, "link", "set", "dev", veth, "up")
    ip_cmd(root, "route", "replace", f"{iface.ip}/32", "dev", veth)
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")


def unlink_netns(root: Path, rt: dict) -> None:
    """The netns (and with it the veth) when `up` made it; the bridge once no veth is on it."""
    netns = rt.get("netns")
    if netns and rt.get("netns_created") and Path(f"/run/netns/{netns}").exists():
        ip_cmd(root, "netns", "delete", netns, check=False)
    if rt.get("link") == "bridge":
        r = ip_cmd(root, "-j", "link", "show", "master", BRIDGE, check=False)
        if r.returncode == 0 and not json.loads(r.stdout or "[]"):
            ip_cmd(root, "link", "delete", "dev", BRIDGE, check=False)


# ----------------------------------------------------------------------------- ssh


class Host:
    def __init__(self, root: Path, rt: dict):
        self.root, self.rt = root, rt

    def argv(self, command: str, timeout: int = 5) -> list[str]:
        known_hosts = machine_state(self.rt["machine"]) / "known_hosts"
        return [*rootfs_cmd(self.root, "usr/bin/ssh"),
                *shared.ssh_options(client_key(), known_hosts, self.rt["ssh_port"], timeout),
                f"root@{self.rt['ssh_address']}", "--", command]

    def run(self, command: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        # a container on its own address is reached from here; one in a bare netns only from inside it
        netns = None if self.rt.get("address") else self.rt.get("netns")
        try:
            return subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout, input=input,
                                  stdin=None if input is not None else subprocess.DEVNULL,
                                  preexec_fn=setns_net(f"/run/netns/{netns}") if netns else None)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 124, "", f"timed out after {timeout:.0f}s")


# ----------------------------------------------------------------------------- up


def running(machine: str) -> bool:
    """MACHINE is up by its state (runtime.json), or a systemd-nspawn boots its tree anyway."""
    rt = read_json(machine_state(machine) / "runtime.json")
    by_state = rt.get("machine") == machine and proc_alive(rt.get("pid"), rt.get("start"))
    return by_state or bool(nspawn_pids(machine_root(machine)))


def nspawn_pids(root: Path, proc: Path = Path("/proc")) -> list[int]:
    """The systemd-nspawn processes booting ROOT, found by their argv (`--directory=ROOT`), not by
    any state directory: a state directory other than the one `up` wrote must not make a running
    machine look stopped (its tree would be unpacked over, as happened on 2026-12-02)."""
    want = f"--directory={root}"
    pids = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return pids
    for d in entries:
        if not d.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if want in args and any(a.endswith("/systemd-nspawn") or a == "systemd-nspawn" for a in args):
            pids.append(int(d.name))
    return sorted(pids)


def refuse_if_booted(machine: str, what: str) -> None:
    """Fail when a systemd-nspawn boots MACHINE's tree (whatever the state directory says)."""
    pids = nspawn_pids(machine_root(machine))
    if pids:
        rt = read_json(machine_state(machine) / "runtime.json")
        known = rt.get("pid") in pids
        raise Fail(f"{machine} is running (systemd-nspawn pid {', '.join(map(str, pids))} "
                   f"boots {machine_root(machine)}): "
                   f"`host.py --machine {machine} down` before {what}"
                   + ("" if known else f"; its state is not in {machine_state(machine)}: was it started with another "
                      f"{MS.ENV}? (now {state_base()})"))


def cmd_up(args: argparse.Namespace) -> int:
    root = machine_root(args.machine)
    rt_now = read_json(state_file("runtime.json"))
    if rt_now.get("machine") == args.machine and proc_alive(rt_now.get("pid"), rt_now.get("start")):
        log(f"{args.machine} is already up (host.py down first to restart it)")
        return 0
    refuse_if_booted(args.machine, "booting it again")
    if not (root / "usr/bin/systemd-nspawn").exists():
        cmd_unpack(args)
    timings = read_json(state_file("timings.json"))
    t_setup = time.monotonic()
    address = ipaddress.IPv4Interface(args.address) if args.address else None
    if address is not None and address.network.prefixlen == 32:
        raise Fail(f"--address {args.address}: give the network too, e.g. 10.214.0.2/24")
    ssh_address = str(address.ip) if address else SSH_ADDRESS
    ssh_port = args.ssh_port or (22 if address else SSH_PORT)
    personalise(root, args.machine, ssh_address, ssh_port)
    binds: list[str] = []
    notes: list[str] = []
    have_gpu = bool(glob.glob("/dev/nvidia[0-9]*"))
    if args.no_gpu or not have_gpu:
        notes.append("GPU binds skipped: " + ("--no-gpu" if args.no_gpu else "no /dev/nvidia[0-9]* on this machine")
                     + " (nothing NVIDIA is bound in)")
    else:
        flags, n = driver_binds(root)
        binds += flags
        notes += n
    info = None
    pythonpath: list[str] = []
    python = args.image_python or ("python3" if have_gpu and not args.no_gpu else None)
    if python:
        info = image_python(python)
        flags, pythonpath, n = image_binds(root, info)
        binds += flags
        notes += n
    else:
        notes.append("engine environment: no --image-python (and no GPU): /opt/engine-venv/bin/python not made")
    payload = Path(args.engine_payload) if args.engine_payload else None
    notes += engine_env(root, payload, args.model_dir or default_model_dir(), info, pythonpath)
    for n in notes:
        log(n)
    # the container's own network namespace, for a rehearsal beside other listeners
    if address and args.netns:
        raise Fail("--address gives the container a network of its own: leave out --netns")
    netns = args.netns
    made_netns = bool(netns) and not Path(f"/run/netns/{netns}").exists()
    if made_netns:
        ip_cmd(root, "netns", "add", netns)
        ip_cmd(root, "-n", netns, "link", "set", "lo", "up")
    net_flags: list[str] = []
    link = None
    if address:
        net_flags, link = network_flags(root, address, args.link)
        guest_network(root, address, link)
        log(f"network: {address} on {GUEST_IFACE} ({link}: {host_veth(args.machine, link)} on the machine, "
            f"at {gateway_of(address).ip})")
    else:
        for stale in ("etc/systemd/system/pdkit-nspawn-net.service",
                      "etc/systemd/system/multi-user.target.wants/pdkit-nspawn-net.service",
                      "etc/systemd/system/ssh.service.d/pdkit-nspawn-net.conf"):
            (root / stale).unlink(missing_ok=True)
    inotify_warning()
    cgroups = shared.make_cgroup_dirs(f"pdkit-nspawn-{args.machine}")
    argv = [
        *rootfs_cmd(root, "usr/bin/systemd-nspawn"),
        *shared.nspawn_boot_args(root, args.machine, args.machine),
        "--settings=no",
        *([f"--network-namespace-path=/run/netns/{netns}"] if netns else []), *net_flags,
        *binds,
    ]
    console = state_file("console.log")
    # systemd 257 in the container wants the unified hierarchy; on a cgroup-v2 machine it is what
    # nspawn picks anyway, on a hybrid one (this rehearsal machine) it makes nspawn mount cgroup2
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1", "LC_ALL": "C"}
    with open(console, "w") as out:
        proc = subprocess.Popen(shared.in_cgroups(cgroups, argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    if link == "routed":
        host_side_routed(root, args.machine, address, proc)
    timings["setup_s"] = round(time.monotonic() - t_setup, 1)
    t_boot = time.monotonic()
    rt = {"machine": args.machine, "pid": proc.pid, "start": proc_start_time(proc.pid), "root": str(root),
          "netns": netns, "netns_created": made_netns, "cgroups": [str(c) for c in cgroups],
          "ssh_address": ssh_address, "ssh_port": ssh_port, "link": link,
          "address": str(address.ip) if address else None, "argv": argv, "gpu": bool(binds and have_gpu)}
    write_json(state_file("runtime.json"), rt)
    host = Host(root, rt)
    state = wait_ready(host, proc, console, t_boot)
    timings["boot_to_ssh_s"] = round(rt.pop("_ssh_s"), 1)
    timings["boot_to_running_s"] = round(time.monotonic() - t_boot, 1)
    write_json(state_file("runtime.json"), rt)
    log(f"{args.machine}: ssh answered {timings['boot_to_ssh_s']}s after start, "
        f"systemd '{state}' at {timings['boot_to_running_s']}s")
    if state != "running":
        failed = host.run("systemctl --failed --no-legend --plain", timeout=20).stdout.strip()
        log(f"WARNING systemd is {state}: {failed or 'no failed units'}")
    host.run("ldconfig", timeout=60)
    if info is not None:
        fix_libraries(host, root, info)
    write_host_record(rt, ENGINE_ENV if info is not None else None)
    write_json(state_file("timings.json"), timings)
    if not args.no_probe:
        probe(host, rt, info is not None)
    log(f"up: {json.dumps(timings)}; ssh -i {client_key()} -o UserKnownHostsFile={state_file('known_hosts')} "
        f"-p {rt['ssh_port']} root@{rt['ssh_address']}")
    return 0


def write_host_record(rt: dict, engine_venv: str | None) -> Path:
    """STATE/<machine>/host.json: how the inventories reach the machine `up` booted (they read it
    through machine_state.ssh_settings, the same rule)."""
    path = machine_state(rt["machine"]) / "host.json"
    write_json(path, {
        "machine": rt["machine"], "ssh_hostname": rt["ssh_address"], "ssh_port": rt["ssh_port"], "ssh_user": "root",
        "address": rt.get("address"), "ssh_key": str(client_key()),
        "ssh_known_hosts_file": str(machine_state(rt["machine"]) / "known_hosts"),
        "engine_venv": engine_venv, "gpu": rt.get("gpu"), "netns": rt.get("netns")})
    return path


def inotify_warning() -> None:
    """systemd in the container needs inotify instances of the machine's shared per-user budget."""
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    except (OSError, ValueError):
        return
    used = sum(1 for fd in glob.glob("/proc/[0-9]*/fd/*") if _readlink(fd) == "anon_inode:inotify")
    if used > limit * 0.6:
        log(f"WARNING {used} inotify instances in use of fs.inotify.max_user_instances={limit}: systemd units in the "
            f"container may fail with 'Too many open files' (sysctl -w fs.inotify.max_user_instances=1024)")


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def default_model_dir() -> str:
    return runpy.run_path(str(REPO / "inventories" / "h200.py"))["MODEL_DIR"]


def wait_ready(host: Host, proc: subprocess.Popen, console: Path, t_boot: float) -> str:
    deadline = t_boot + BOOT_TIMEOUT
    while True:
        if proc.poll() is not None:
            tail = console.read_text(errors="replace").strip().splitlines()[-5:]
            raise Fail(f"systemd-nspawn exited ({proc.returncode}) during boot: {' | '.join(tail)} (see {console})")
        r = host.run("true", timeout=10)
        if r.returncode == 0:
            host.rt["_ssh_s"] = time.monotonic() - t_boot
            break
        if time.monotonic() > deadline:
            raise Fail(f"no SSH on {host.rt['ssh_address']}:{host.rt['ssh_port']} after {BOOT_TIMEOUT}s: "
                       f"{r.stderr.strip()} (see {console})")
        time.sleep(0.3)
    left = max(5, int(deadline - time.monotonic()))
    r = host.run(shared.systemd_wait_command(left), timeout=left + 10)
    return r.stdout.strip() or f"unknown ({r.stderr.strip()})"


# files whose shared-library dependencies must resolve inside the container: the image's Python
# and its extension modules, torch's libraries, every extension of the payload
LIB_CHECK = r"""
set -u
ld=/lib64/ld-linux-x86-64.so.2
[ -d /opt/engine-venv/lib ] && export LD_LIBRARY_PATH=/opt/engine-venv/lib
exe=$1; shift
for f in "$exe" $(find "$@" \( -name '*.so' -o -name '*.so.*' \) -type f 2>/dev/null); do
  "$ld" --verify "$f" >/dev/null 2>&1; case $? in 0|2) ;; *) continue;; esac
  # as ldd does it: every dependency listed, the missing ones as "=> not found"
  LD_TRACE_LOADED_OBJECTS=1 "$ld" "$f" 2>&1 | sed -n "s|^[[:space:]]*\([^ ]*\) => not found|MISSING \1 $f|p"
done
"""


def fix_libraries(host: Host, root: Path, info: dict) -> None:
    """Libraries the image's Python needs that trixie lacks: copied from the image to /opt/engine-venv/lib.

    Only the interpreter and the standard library's extension modules are fixed that way. torch,
    triton, NVIDIA's wheels and the payload are checked and reported only: their libraries find
    each other through RUNPATHs and through what torch has loaded already (a copy from the image's
    linker cache, e.g. a system CUDA runtime, would shadow the one torch was built with).
    """
    t = time.monotonic()
    dynload = sorted({os.path.join(d, "lib-dynload") for d in info["stdlib"]})
    beside = ([os.path.join(os.path.dirname(info["torch"]), n) for n in ("torch", "triton", "nvidia")]
              if info["torch"] else [])
    packages = [*beside, f"{ENGINE_ENV}/site"]
    known = image_libraries()
    copied, unresolved = [], set()
    lib = root / ENGINE_ENV.lstrip("/") / "lib"

    def scan(paths: list[str]) -> list[str]:
        r = host.run("sh -s -- " + " ".join(shlex.quote(d) for d in paths), timeout=900, input=LIB_CHECK)
        return [line for line in r.stdout.splitlines() if line.startswith("MISSING ")]

    for _round in range(4):
        lines = scan([info["executable"], *dynload])
        todo = sorted({line.split()[1] for line in lines} - unresolved - set(copied))
        for soname in todo:
            if GLIBC.match(soname) or soname not in known:
                unresolved.add(soname)
                continue
            lib.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(known[soname]), lib / soname)
            copied.append(soname)
        if copied and "LD_LIBRARY_PATH" not in (root / ENGINE_ENV.lstrip("/") / "bin/python").read_text():
            engine_env(root, None, "", info, read_pythonpath(root))
        if not set(todo) - unresolved:
            break
    # packages: a miss is fine when a library of that name ships in one of these trees (loaded
    # first, e.g. libtorch.so for sgl_kernel) or is the driver's (bound in on a GPU machine)
    lines = scan(["/dev/null", *packages])
    listing = host.run("find " + " ".join(shlex.quote(p) for p in packages)
                       + " -name '*.so*' -printf '%f\\n' 2>/dev/null", timeout=300)
    shipped = set(listing.stdout.split())
    later = sorted({line.split()[1] for line in lines} - shipped - set(copied))
    driver = [m for m in later if DRIVER_LIB.match(m)]
    packages_missing = sorted(set(later) - set(driver))
    result = {"copied_from_image": copied, "interpreter_unresolved": sorted(unresolved),
              "packages_unresolved": packages_missing, "driver_libraries_needed": driver,
              "seconds": round(time.monotonic() - t, 1),
              "examples": [line for line in lines if line.split()[1] in packages_missing][:20]}
    write_json(state_file("libraries.json"), result)
    log(f"libraries: {len(copied)} copied from the image into {ENGINE_ENV}/lib ({', '.join(copied) or 'none needed'}); "
        f"unresolved for the interpreter: {', '.join(sorted(unresolved)) or 'none'}; packages: "
        f"{', '.join(packages_missing) or 'all resolve'} (driver: {', '.join(driver) or 'none'}; {result['seconds']}s)")


def read_pythonpath(root: Path) -> list[str]:
    text = (root / ENGINE_ENV.lstrip("/") / "bin/python").read_text()
    m = re.search(r'export PYTHONPATH="([^"$]*)', text)
    return [p for p in (m.group(1).split(":") if m else []) if p != f"{ENGINE_ENV}/site"]


def image_libraries() -> dict[str, str]:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "x86-64" in m.group(2):
            libs.setdefault(m.group(1), m.group(3))
    return libs


# ----------------------------------------------------------------------------- probe


PROBE_GPU = r"""
import json, os, sys, time
out = {"python": sys.version.split()[0], "executable": sys.executable}
t = time.monotonic()
import torch
out["torch"] = torch.__version__
out["cuda_available"] = torch.cuda.is_available()
out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
out["cuda_sum_ok"] = float(x.sum().item()) == float((1 << 20) * ((1 << 20) - 1) / 2)
import triton, triton.language as tl
@triton.jit
def add(a, b, c, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(c + i, tl.load(a + i, mask=m) + tl.load(b + i, mask=m), mask=m)
y = torch.empty_like(x)
add[(triton.cdiv(x.numel(), 1024),)](x, x, y, x.numel(), BLOCK=1024)
torch.cuda.synchronize()
out["triton"] = triton.__version__
out["triton_kernel_ok"] = bool(torch.equal(y, x * 2))
out["seconds"] = round(time.monotonic() - t, 1)
print(json.dumps(out))
"""

PROBE_IMPORTS = r"""
import importlib, json, sys
out = {}
for m in sys.argv[1:]:
    try:
        mod = importlib.import_module(m)
        out[m] = getattr(mod, "__version__", "ok")
    except Exception as e:
        out[m] = "IMPORT FAILED: %s: %s" % (type(e).__name__, str(e)[:300])
print(json.dumps(out))
"""

# what gpu/device_driver.py imports to report versions (the router is pdkit's own venv here)
ENGINE_MODULES = ("torch", "triton", "sglang", "sgl_kernel", "flashinfer", "transformers", "tokenizers", "xgrammar",
                  "nixl_cu13")
STDLIB_MODULES = ("ssl", "ctypes", "sqlite3", "lzma", "bz2", "decimal", "zlib", "json", "uuid")

# A C extension built the way Triton builds its launchers (runtime/build.py: `gcc src -O3 -shared
# -fPIC -o X.so -I<python include>` + -lcuda when there is a driver), then imported
C_BUILD = r"""
set -e
d=$(mktemp -d)
cat > "$d/pdkit_probe.c" <<'EOF'
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef M[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "pdkit_probe", NULL, -1, M};
PyMODINIT_FUNC PyInit_pdkit_probe(void) { return PyModule_Create(&D); }
EOF
py=/opt/engine-venv/bin/python
inc=$($py -c 'import sysconfig
s = sysconfig.get_default_scheme(); s = "posix_prefix" if s == "posix_local" else s
print(sysconfig.get_paths(scheme=s)["include"])')
suffix=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
extra=""
if /sbin/ldconfig -p | grep -q 'libcuda.so '; then extra="-lcuda"; fi
gcc "$d/pdkit_probe.c" -O3 -shared -fPIC -o "$d/pdkit_probe$suffix" -I"$inc" $extra
cd "$d" && $py -c 'import pdkit_probe; assert pdkit_probe.answer() == 42; print("c-extension ok")'
rm -rf "$d"
"""


# what SGLang's JIT kernels do (tvm_ffi: the image's nvcc, the container's g++ as host compiler), in small
NVCC_BUILD = r"""
set -e
d=$(mktemp -d)
cat > "$d/k.cu" <<'CU'
#include <cstdio>
__global__ void k(int *x) { x[threadIdx.x] = threadIdx.x; }
int main() {
  int *x; cudaMalloc(&x, 32 * sizeof(int)); k<<<1, 32>>>(x);
  int h[32]; cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost);
  printf("nvcc ok: %d\n", h[31]); return h[31] != 31;
}
CU
/usr/local/cuda/bin/nvcc --version | tail -1
/usr/local/cuda/bin/nvcc -std=c++17 -arch=sm_90 -o "$d/k" "$d/k.cu"
"$d/k"
rm -rf "$d"
"""


def probe(host: Host, rt: dict, engine_env_made: bool) -> dict:
    t = time.monotonic()
    res: dict = {}
    r = host.run("python3 -c 'import sys; print(sys.version.split()[0])'", timeout=60)
    res["container_python3"] = {"rc": r.returncode, "version": r.stdout.strip(), "stderr": r.stderr.strip()[-300:]}
    r = host.run("systemd-nspawn --version | head -1; gcc --version | head -1; systemctl --version | head -1",
                 timeout=30)
    res["container_tools"] = r.stdout.strip().splitlines()
    if engine_env_made:
        py = f"{ENGINE_ENV}/bin/python"
        r = host.run(f"{py} - {' '.join(STDLIB_MODULES)}", input=PROBE_IMPORTS, timeout=120)
        res["image_stdlib"] = parse_json(r)
        r = host.run("sh -s", input=C_BUILD, timeout=120)
        res["c_extension"] = (r.stdout + r.stderr).strip()[-600:]
        if rt.get("gpu"):
            r = host.run("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader", timeout=60)
            res["nvidia_smi"] = (r.stdout + r.stderr).strip()
            r = host.run(f"{py} - {' '.join(ENGINE_MODULES)}", input=PROBE_IMPORTS, timeout=300)
            res["engine_imports"] = parse_json(r)
            # the engine units' own device policy and hardening (templates/systemd/engine.service.j2)
            props = ["DevicePolicy=closed", "DeviceAllow=char-nvidia* rw", "NoNewPrivileges=yes",
                     "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "User=nobody",
                     "Environment=HOME=/tmp", "LimitMEMLOCK=infinity"]
            # Triton reads a kernel's source file: the probe is a file, not stdin
            host.run("cat > /var/lib/pdkit-nspawn-probe.py && chmod 644 /var/lib/pdkit-nspawn-probe.py",
                     input=PROBE_GPU, timeout=30)
            cmd = ("systemd-run --quiet --wait --pipe --collect " + " ".join(f"-p {shlex.quote(p)}" for p in props)
                   + f" {py} /var/lib/pdkit-nspawn-probe.py")
            r = host.run(cmd, timeout=300)
            res["gpu_under_engine_policy"] = parse_json(r)
            r = host.run("sh -s", input=NVCC_BUILD, timeout=300)
            res["nvcc_host_cxx"] = (r.stdout + r.stderr).strip()[-600:]
    res["seconds"] = round(time.monotonic() - t, 1)
    write_json(state_file("probe.json"), res)
    for key, value in res.items():
        log(f"probe {key}: {json.dumps(value)[:400]}")
    return res


def parse_json(r: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"rc": r.returncode, "error": (r.stdout + r.stderr).strip()[-1500:]}


def cmd_probe(args: argparse.Namespace) -> int:
    rt = read_json(state_file("runtime.json"))
    if not proc_alive(rt.get("pid"), rt.get("start")):
        raise Fail("not running")
    probe(Host(Path(rt["root"]), rt), rt, (Path(rt["root"]) / ENGINE_ENV.lstrip("/") / "bin/python").exists())
    return 0



# ----------------------------------------------------------------------------- xfer-probe


XFER_PROBE = REPO / "gpu" / "nspawn" / "xfer_probe.py"
XFER_IN_TREE = "/var/lib/pdkit-nspawn-xfer_probe.py"
XFER_MARK = "PDKIT-XFER "
# what to try, in order: CUDA IPC between the containers (one GPU, but another PID and IPC
# namespace: unproven), then TCP with CUDA copies staged through host memory (slower, works wherever
# the containers reach each other)
XFER_TLS = ("cuda_ipc,cuda_copy,tcp,self", "tcp,cuda_copy,self")


def machine_host(machine: str) -> Host:
    rt = read_json(machine_state(machine) / "runtime.json")
    if not proc_alive(rt.get("pid"), rt.get("start")):
        raise Fail(f"{machine} is not running (host.py --machine {machine} up)")
    return Host(Path(rt["root"]), rt)


def one_xfer(src: Host, dst: Host, env: str, python: str, dram: bool) -> dict:
    """DST's target, then SRC's initiator WRITEs into it; both verdicts."""
    flag = " --dram" if dram else ""
    target = subprocess.Popen(dst.argv(f"{env} timeout 120 {python} {XFER_IN_TREE} target{flag}", timeout=10),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        offer = next((line for line in target.stdout if line.startswith(XFER_MARK)), None)  # type: ignore[union-attr]
        if offer is None:
            _, err = target.communicate(timeout=30)
            return {"ok": False, "why": f"target on {dst.rt['machine']} gave no descriptor: {err.strip()[-600:]}"}
        r = src.run(f"{env} timeout 90 {python} {XFER_IN_TREE} initiator{flag}", timeout=120, input=offer)
        verdict = next((json.loads(l[len(XFER_MARK):]) for l in r.stdout.splitlines() if l.startswith(XFER_MARK)), None)
        out, _ = target.communicate("done\n", timeout=60)
        landed = next((json.loads(l[len(XFER_MARK):]) for l in out.splitlines() if l.startswith(XFER_MARK)), {})
        ok = bool(verdict and verdict.get("state") == "DONE" and landed.get("target_ok"))
        res = {"ok": ok, "initiator": verdict, "target_ok": landed.get("target_ok")}
        if not ok:
            res["why"] = (r.stderr or r.stdout).strip()[-800:]
        return res
    finally:
        if target.poll() is None:
            target.kill()


def cmd_xfer_probe(args: argparse.Namespace) -> int:
    """A NIXL WRITE each way between this machine and --peer, per UCX_TLS candidate; the first that
    works both ways goes to STATE/ucx_tls.json (machine_state.ucx_tls_file) (inventories/h200-nspawn-pair.py
    reads it)."""
    hosts = [machine_host(args.machine), machine_host(args.peer)]
    for h in hosts:
        write_file(h.root / XFER_IN_TREE.lstrip("/"), XFER_PROBE.read_text(), 0o644)
    python = args.python or f"{ENGINE_ENV}/bin/python"
    results, chosen = [], None
    for tls in args.tls or XFER_TLS:
        env = f"UCX_TLS={shlex.quote(tls)} UCX_NET_DEVICES={GUEST_IFACE}"
        ok = True
        for src, dst in (hosts, hosts[::-1]):
            t = time.monotonic()
            res = one_xfer(src, dst, env, python, args.dram)
            res.update(tls=tls, src=src.rt["machine"], dst=dst.rt["machine"], seconds=round(time.monotonic() - t, 1))
            results.append(res)
            log(f"xfer {res['src']} -> {res['dst']} UCX_TLS={tls}: {'ok' if res['ok'] else 'FAILED'} "
                f"{json.dumps(res.get('initiator'))} {res.get('why', '')[-300:]}")
            if not res["ok"]:
                ok = False
                break
        if ok:
            chosen = tls
            break
    write_json(MS.ucx_tls_file(), {"chosen": chosen, "results": results, "machines": [h.rt["machine"] for h in hosts]})
    if chosen is None:
        log("xfer-probe: no UCX_TLS candidate moved memory between the two machines")
        return 1
    log(f"xfer-probe: UCX_TLS={chosen} (in {MS.ucx_tls_file()})")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """A shell command on the machine over its SSH (the lent machine has no ssh client of its own)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise Fail("exec: give a command, e.g. "
                   "host.py --machine pdkit-b exec -- sha256sum /etc/systemd/system/pdkit-*.service")
    r = machine_host(args.machine).run(" ".join(command), timeout=args.timeout)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    return r.returncode

# ----------------------------------------------------------------------------- status / down


def cmd_status(args: argparse.Namespace) -> int:
    rt = read_json(state_file("runtime.json"))
    if not rt:
        print(f"{args.machine}: down (no {state_file('runtime.json')})")
        return 3
    up = proc_alive(rt.get("pid"), rt.get("start"))
    line = (f"{rt['machine']}: nspawn pid {rt['pid']} {'alive' if up else 'DEAD'}; root {rt['root']}; "
            f"ssh {rt['ssh_address']}:{rt['ssh_port']}")
    if up:
        r = Host(Path(rt["root"]), rt).run("systemctl is-system-running", timeout=20)
        line += f"; systemd {r.stdout.strip() or r.stderr.strip()}"
    print(line)
    return 0 if up else 1


def cmd_down(args: argparse.Namespace) -> int:
    rt = read_json(state_file("runtime.json"))
    problems: list[str] = []
    pid, start = rt.get("pid"), rt.get("start")
    if proc_alive(pid, start):
        # SIGTERM: nspawn asks the guest's systemd to power off (a guest early in its boot drops it: repeat)
        deadline = time.monotonic() + STOP_TIMEOUT
        while proc_alive(pid, start) and time.monotonic() < deadline:
            os.kill(pid, signal.SIGTERM)
            for _ in range(20):
                if not proc_alive(pid, start):
                    break
                time.sleep(0.1)
        if proc_alive(pid, start):
            log(f"nspawn {pid} did not stop in {STOP_TIMEOUT}s: SIGKILL")
            os.kill(pid, signal.SIGKILL)
        log(f"{rt.get('machine')} powered off")
    for cg in rt.get("cgroups", []):
        left = set(shared.cgroup_pids(Path(cg))) - {os.getpid()}
        shared.kill_pids(sorted(left))
        time.sleep(0.5 if left else 0)
        problems += shared.remove_cgroup_tree(Path(cg))
    if rt.get("root"):
        unlink_netns(Path(rt["root"]), rt)
    for d in ("propagate", "unix-export"):  # nspawn leaves them where /run is not a tmpfs
        remove_tree(Path("/run/systemd/nspawn") / d / (rt.get("machine") or args.machine))
    for p in ("runtime.json", "host.json"):
        state_file(p).unlink(missing_ok=True)
    if args.purge:
        refuse_if_booted(args.machine, "purging its tree")
        remove_tree(machine_root(args.machine))
        remove_tree(machine_state())
    root = machine_root(args.machine)
    left = shared.mounts_under(root) if root.exists() else []
    problems += [f"mount {m}" for m in left]
    if problems:
        log("down: left behind: " + "; ".join(problems))
        return 1
    log("down: clean" + (" (tree and state removed)" if args.purge else ""))
    return 0


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machine", default=MACHINE)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("unpack", help="the rootfs (+ monitoring) tarballs into the machine's tree")
    p.add_argument("--artefacts", nargs="*", help=f"where to look (default: {', '.join(map(str, ARTEFACT_DIRS))})")
    p = sub.add_parser("control-venv", help="pyinfra + pdkit venv and the deploy's wheel cache, from wheels.tar.xz")
    p.add_argument("--wheels", help=f"default: {WHEELS_NAME} in {', '.join(map(str, ARTEFACT_DIRS))}")
    p.add_argument("--venv", default="/root/pdkit-venv")
    p.add_argument("--python", help="the Python 3.12 to make it with (default: this one)")
    p = sub.add_parser("up", help="personalise, bind, boot, wait, check")
    p.add_argument("--artefacts", nargs="*", help="for an unpack first, when the tree is missing")
    p.add_argument("--engine-payload", help="the GPU tier's payload dir (site.tar.xz, nixl.tar.xz, model/)")
    p.add_argument("--image-python", help="the Python the engines run on (default on a GPU machine: python3)")
    p.add_argument("--model-dir", help="where the model goes inside (default: inventories/h200.py's MODEL_DIR)")
    p.add_argument("--no-gpu", action="store_true", help="bind nothing NVIDIA (a rehearsal without a GPU)")
    p.add_argument("--ssh-port", type=int, help=f"sshd's port (default: 22 with --address, else {SSH_PORT})")
    p.add_argument("--netns", help="boot in this network namespace (made if missing) instead of the machine's")
    p.add_argument("--address", help="the container's own address and network, e.g. 10.214.0.2/24: a netns of its "
                   f"own (pdkn-MACHINE) with a veth on {BRIDGE}, which the machine holds the network's first "
                   "address of; "
                   "sshd and every service listen there (several container hosts on one machine)")
    p.add_argument("--link", choices=("bridge", "routed"), default="bridge",
                   help="how containers booted with --address reach each other: a bridge (default; routed where the "
                   "kernel has no bridges) or routed through the machine's namespace")
    p.add_argument("--no-probe", action="store_true")
    sub.add_parser("probe", help="the checks `up` ends with, again")
    p = sub.add_parser("xfer-probe",
                       help="a NIXL WRITE each way between this machine and --peer, per UCX_TLS candidate")
    p.add_argument("--peer", required=True, help="the other running machine")
    p.add_argument("--tls", action="append",
                   help=f"a UCX_TLS value to try (repeatable; default: {', '.join(XFER_TLS)})")
    p.add_argument("--python", help=f"the Python with nixl inside the machines (default: {ENGINE_ENV}/bin/python)")
    p.add_argument("--dram", action="store_true", help="host memory instead of the GPU's (a rehearsal without a GPU)")
    p = sub.add_parser("exec", help="run a shell command on the machine over SSH: exec -- CMD...")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("status")
    p = sub.add_parser("down")
    p.add_argument("--purge", action="store_true", help="also remove the tree and the state directory")
    args = ap.parse_args(argv)
    CURRENT["machine"] = args.machine
    if os.geteuid() != 0:
        raise Fail("needs root")
    return {"unpack": cmd_unpack, "control-venv": cmd_control_venv, "up": cmd_up, "probe": cmd_probe,
            "status": cmd_status, "down": cmd_down, "xfer-probe": cmd_xfer_probe,
            "exec": cmd_exec}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
