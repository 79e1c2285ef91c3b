"""What the lab and gpu/nspawn/host.py share: booting systemd-nspawn hosts, stdlib only.

Two launchers boot containers with systemd as PID 1 from a control machine whose own PID 1 is not
systemd: `pdkit lab` (pdkit/lab/) on the control machine, and gpu/nspawn/host.py on a lent GPU
machine (docs/gpu.md). host.py runs on that machine's bare python3 before any venv exists, with
only this repository on its path: so this module imports the standard library and nothing else
(tests/test_layering.py holds it to that), and pdkit/__init__.py, which it runs first, stays empty
of imports.

Here: commands with clear errors (`run`, CommandError), processes by pid and start time (and
killing them), cgroups (every hierarchy: v1, v2, hybrid), mounts, removing a tree without crossing
into a mount, files written with their modes, links replaced, the ssh and ssh-keygen arguments,
and the nspawn and readiness commands. Each side turns CommandError into its own error (LabError, host.py's Fail).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

# what engine units ask for: LimitMEMLOCK=infinity (UCX/NIXL pin memory) must take effect, and a
# host may shape its own network (tc netem for fault tests); nspawn's default set has none of these
NSPAWN_CAPABILITIES = "CAP_SYS_RESOURCE,CAP_IPC_LOCK,CAP_NET_ADMIN"


class CommandError(RuntimeError):
    """A command failed, timed out or was not found; the message names it, one line."""

    def __init__(self, message: str, cmd: Sequence[str], returncode: int | None = None, output: str = ""):
        super().__init__(message)
        self.cmd = list(cmd)
        self.returncode = returncode
        self.output = output  # the command's stderr (its stdout when stderr was empty)


# ---------------------------------------------------------------- commands


def run(
    cmd: Sequence[str],
    *,
    timeout: float | None = 60,
    check: bool = True,
    input: str | None = None,
    capture: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command with an outer timeout (None: none); CommandError with its stderr on failure."""
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.run(
            list(cmd),
            input=input,
            text=True,
            capture_output=capture,
            timeout=timeout,
            env=full_env,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise CommandError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}", cmd) from None
    except FileNotFoundError:
        raise CommandError(f"command not found: {cmd[0]}", cmd) from None
    if check and proc.returncode != 0:
        output = (proc.stderr or proc.stdout or "").strip()
        lines = output.splitlines()
        tail = lines[-1] if lines else ""
        raise CommandError(f"exit {proc.returncode}: {' '.join(cmd)}: {tail}", cmd, proc.returncode, output)
    return proc


# ---------------------------------------------------------------- processes


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (guards against pid reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def proc_alive(pid: int | None, start_time: int | None = None) -> bool:
    """PID runs (not a zombie) and, given START_TIME, is still the process that started then."""
    if not pid:
        return False
    st = proc_start_time(pid)
    if st is None:
        return False
    if start_time is not None and st != start_time:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    """SIG to each of PIDS; one that is gone already is no error."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- cgroups


def cgroup_hierarchies() -> list[tuple[Path, str]]:
    """``[(mount point, our path in it), ...]`` for every mounted cgroup hierarchy.

    Works for cgroup v1 (one mount per controller set, named hierarchies such as
    name=systemd), v2, and the hybrid layout (v1 controllers + v2 at .../unified).
    """
    ours: dict[str, str] = {}  # controller-set key -> path
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        ours["" if hid == "0" else controllers] = path

    result = []
    seen: set[str] = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        lf = left.split()
        fstype, _source, superopts = right.split()[:3]
        mount_root, mount_point = lf[3], lf[4].replace("\\040", " ")
        if mount_root != "/":
            continue
        key: str | None
        if fstype == "cgroup2":
            key = ""
        elif fstype == "cgroup":
            opts = set(superopts.split(","))
            key = next((k for k in ours if k and set(k.split(",")) <= opts), None)
        else:
            key = None
        if key is None:
            continue
        if key in seen or key not in ours:
            continue
        seen.add(key)
        result.append((Path(mount_point), ours[key]))
    return result


def _copy_cpuset(parent: Path, child: Path) -> None:
    """New cgroup v1 cpuset groups start with no CPUs/memory nodes: inherit the parent's."""
    for knob in ("cpuset.cpus", "cpuset.mems"):
        src, dst = parent / knob, child / knob
        if src.exists() and dst.exists() and not dst.read_text().strip():
            dst.write_text(src.read_text().strip() or "\n")


def make_cgroup_dirs(relative: str) -> list[Path]:
    """Create ``<our cgroup>/<relative>`` in every hierarchy; return the directories."""
    made = []
    for mount, ours in cgroup_hierarchies():
        base = mount / ours.lstrip("/")
        current = base
        for part in Path(relative).parts:
            child = current / part
            if not child.exists():
                child.mkdir()
            _copy_cpuset(current, child)
            current = child
        made.append(current)
    return made


def remove_cgroup_tree(path: Path) -> list[str]:
    """rmdir a cgroup directory and its children, deepest first. Returns what stayed."""
    if not path.is_dir():
        return []
    problems = []
    dirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, path]:
        for attempt in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:  # EBUSY while the last task is still exiting
                if attempt == 49:
                    problems.append(f"{d}: {exc.strerror}")
                time.sleep(0.1)
    return problems


def cgroup_pids(path: Path) -> list[int]:
    """Every process in the cgroup at PATH and its children, sorted."""
    pids: list[int] = []
    if not path.is_dir():
        return pids
    for procs in path.rglob("cgroup.procs"):
        try:
            pids += [int(x) for x in procs.read_text().split()]
        except OSError:
            pass
    try:
        pids += [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except OSError:
        pass
    return sorted(set(pids))


def in_cgroups(cgroups: Sequence[Path], argv: Sequence[str]) -> list[str]:
    """ARGV behind a shell that first moves itself into CGROUPS, then becomes the command: what
    nspawn (--keep-unit, no systemd to make a scope) and apt-cacher-ng are started through."""
    procs = " ".join(shlex.quote(str(Path(c) / "cgroup.procs")) for c in cgroups)
    return ["sh", "-c", f'for f in {procs}; do echo $$ > "$f"; done; exec "$@"', "sh", *argv]


def start_in_cgroups(cgroups: Sequence[Path], argv: Sequence[str], log_path: Path) -> subprocess.Popen:
    """ARGV started in CGROUPS (`in_cgroups`) in a session of its own, so that it outlives this process: stdin
    empty, stdout and stderr to LOG_PATH (written anew)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(in_cgroups(cgroups, argv), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


# ---------------------------------------------------------------- mounts and trees


def mounts_under(path: Path) -> list[str]:
    """Mount points at PATH or below it (this process's mount namespace)."""
    prefix = str(path).rstrip("/") + "/"
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp.startswith(prefix) or mp == prefix.rstrip("/"):
            out.append(mp)
    return out


def unmount_under(path: Path) -> None:
    """Lazily unmount everything at or below PATH, deepest first."""
    for mp in sorted(mounts_under(path), key=len, reverse=True):
        run(["umount", "-l", mp], timeout=30, check=False)


def remove_tree(path: Path, timeout: float | None = 300) -> None:
    """rm -rf that never crosses into a mount (an interrupted debootstrap or boot leaves some)."""
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_dir() and not path.is_symlink():
        unmount_under(path)
        run(["rm", "-rf", "--one-file-system", str(path)], timeout=timeout)
    else:
        path.unlink()


# ---------------------------------------------------------------- files


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """TEXT at PATH with MODE, parents made. A link there is replaced, not written through: in a
    container's tree an absolute link points at the control machine's own file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def replace_link(link: Path, target: str) -> None:
    """LINK -> TARGET, whatever file or link stood at LINK replaced; parents made."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def write_json(path: Path, data: dict, **dumps) -> None:
    """DATA as JSON at PATH, whole or not at all (a temporary file, then a rename): `down` and the
    inventories read these files while `up` rewrites them. DUMPS: json.dumps' options."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, **dumps) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- ssh


def keygen_args(key: Path, comment: str) -> list[str]:
    """ssh-keygen's arguments (after the binary) for a new ed25519 key at KEY with no passphrase."""
    return ["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)]


def authorize_key(root: Path, pubkey: str) -> None:
    """PUBKEY as root's only authorized key in the tree at ROOT (sshd wants .ssh 0700, the file 0600)."""
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    write_file(ssh_dir / "authorized_keys", pubkey.strip() + "\n", 0o600)


def ssh_options(key: Path | str, known_hosts: Path | str, port: int, connect_timeout: int = 5) -> list[str]:
    """ssh's options (after the binary, before user@host): this key only, strict host keys from
    KNOWN_HOSTS alone, no config file, no prompt, no host key learned on the way."""
    return [
        "-F", "/dev/null",
        "-i", str(key),
        "-p", str(port),
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "LogLevel=ERROR",
    ]


# ---------------------------------------------------------------- systemd-nspawn


def nspawn_boot_args(root: Path, machine: str, hostname: str) -> list[str]:
    """systemd-nspawn's options (after the binary) to boot the tree at ROOT with systemd as PID 1,
    from a machine whose own PID 1 is not systemd; each launcher adds its network and binds."""
    return [
        "--quiet",
        "--boot",
        f"--directory={root}",
        f"--machine={machine}",
        f"--hostname={hostname}",
        # no machined to register with, no unit to make: the caller's cgroups (in_cgroups) hold it
        "--register=no",
        "--keep-unit",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
        f"--capability={NSPAWN_CAPABILITIES}",
        "--rlimit=RLIMIT_MEMLOCK=infinity",
    ]


def systemd_wait_command(seconds: float) -> str:
    """The shell command, run in the container, that waits until its systemd has finished booting
    and prints its state (`running`, `degraded`, ...), giving up after SECONDS."""
    return f"timeout {int(seconds)} systemctl is-system-running --wait"
