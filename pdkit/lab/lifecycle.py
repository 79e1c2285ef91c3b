"""`lab up`, `lab status`, `lab down`: the orchestration."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pdkit.hosts.nspawn_common import (
    cgroup_hierarchies,
    cgroup_pids,
    keygen_args,
    kill_pids,
    make_cgroup_dirs,
    mounts_under,
    nspawn_boot_args,
    proc_alive,
    proc_start_time,
    remove_cgroup_tree,
    ssh_options,
    start_in_cgroups,
    systemd_wait_command,
    write_json,
)
from pdkit.lab import aptcache, net, rootfs
from pdkit.lab.model import (
    APT_CACHE_PORT,
    DEFAULT_GPU_HOSTS,
    LabConfig,
    LabError,
    LabHost,
    LabInfo,
    load_lab,
)
from pdkit.lab.system import (
    Progress,
    has_capability,
    memory_usage,
    pids_rooted_under,
    pids_with_arg_under,
    proc_cmdline,
    pss_bytes,
    require_root,
    require_tools,
    run,
    tcp_listening,
    wait_gone,
    which,
)

BOOT_TIMEOUT = 120  # from nspawn start to `systemctl is-system-running --wait`, for a few hosts
# more per host: every host boots at once on the control machine's few cores (32 hosts on 2
# cores missed the flat 120 s: benchmarks/scale.py --lab, docs/benchmarks.md)
BOOT_TIMEOUT_PER_HOST = 6
STOP_TIMEOUT = 20  # orderly poweroff before SIGKILL


# ---------------------------------------------------------------- ssh


def ssh_argv(
    host: LabHost,
    ssh_key: Path | str,
    known_hosts: Path | str,
    command: str | list[str] | None = None,
    *,
    connect_timeout: int = 5,
) -> list[str]:
    """OpenSSH argv to reach a lab host with strict host-key checking and no other config."""
    argv = ["ssh", *ssh_options(ssh_key, known_hosts, host.ssh_port, connect_timeout),
            f"{host.ssh_user}@{host.address}"]
    if command is not None:
        argv += ["--", command] if isinstance(command, str) else ["--", *command]
    return argv


def ssh_run(
    info: LabInfo, host: LabHost | str, command: str, *, timeout: float = 60, known_hosts: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a shell command on a lab host over SSH (strict host keys); never raises on exit codes."""
    h = info.host(host) if isinstance(host, str) else host
    argv = ssh_argv(h, info.ssh_key, known_hosts or info.known_hosts, command)
    try:
        return subprocess.run(argv, text=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f}s")


# ---------------------------------------------------------------- runtime bookkeeping


def _read_runtime(cfg: LabConfig) -> dict | None:
    try:
        return json.loads(cfg.runtime_json.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    """The lab's state files (lab.json, runtime.json): indented, anything else as its string."""
    write_json(path, data, indent=2, default=str)


def config_for_existing(state_dir: Path | None = None) -> LabConfig:
    """The config of the lab in ``state_dir`` as recorded when it came up (env otherwise)."""
    cfg = LabConfig.from_env()
    if state_dir is not None:
        cfg = LabConfig(state_dir=Path(state_dir), cache_dir=cfg.cache_dir, subnet=cfg.subnet)
    rt = _read_runtime(cfg)
    if rt and rt.get("subnet"):
        cfg = LabConfig(state_dir=cfg.state_dir, cache_dir=cfg.cache_dir, subnet=ipaddress.IPv4Network(rt["subnet"]))
    return cfg


@contextlib.contextmanager
def file_lock(path: Path, progress: Progress, what: str, timeout: float = 900) -> Iterator[None]:
    """Exclusive flock on ``path``; says so when it has to wait for another pdkit process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(f"{what}: another pdkit process holds {path} (waited {timeout:.0f} s)") from None
                if not told:
                    progress(f"waiting for another pdkit process ({what}, {path})")
                    told = True
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _locked(cfg: LabConfig, progress: Progress) -> contextlib.AbstractContextManager[None]:
    return file_lock(cfg.lock_file, progress, "lab state")


# ---------------------------------------------------------------- status


@dataclass
class HostStatus:
    host: LabHost
    pid: int | None
    nspawn_alive: bool
    systemd: str  # running / degraded / starting / ... / "-" when unreachable
    ssh_ok: bool
    memory_rss: int | None  # anonymous memory of the container's cgroup
    memory_pss: int | None  # PSS summed over the container's processes (nspawn included)

    @property
    def healthy(self) -> bool:
        return self.nspawn_alive and self.ssh_ok and self.systemd == "running"


@dataclass
class LabStatus:
    state: str  # "up", "degraded", "down"
    config: LabConfig
    info: LabInfo | None
    hosts: list[HostStatus]
    apt_cache_alive: bool


def _host_status(info: LabInfo, host: LabHost, rec: dict, *, probe_ssh: bool = True) -> HostStatus:
    alive = proc_alive(rec.get("pid"), rec.get("start"))
    systemd, ssh_ok = "-", False
    if alive and probe_ssh:
        proc = ssh_run(info, host, "systemctl is-system-running", timeout=20)
        ssh_ok = proc.returncode != 255 and proc.returncode != 124
        systemd = (proc.stdout.strip() or "-") if ssh_ok else "-"
    mem = memory_usage(rec.get("cgroups", [])) or {}
    pids: set[int] = set()
    for cg in rec.get("cgroups", [])[:1]:
        pids |= set(cgroup_pids(Path(cg)))
    return HostStatus(host, rec.get("pid"), alive, systemd, ssh_ok, mem.get("rss"), pss_bytes(sorted(pids)))


def status(state_dir: Path | None = None, *, probe_ssh: bool = True) -> LabStatus:
    cfg = config_for_existing(state_dir)
    info = load_lab(cfg.state_dir)
    rt = _read_runtime(cfg)
    if info is None or not rt:
        return LabStatus("down" if not rt else "degraded", cfg, info, [], False)
    acng = rt.get("apt_cache", {})
    acng_alive = proc_alive(acng.get("pid"), acng.get("start"))
    recs = rt.get("hosts", {})
    with ThreadPoolExecutor(max_workers=8) as pool:
        hosts = list(pool.map(lambda h: _host_status(info, h, recs.get(h.name, {}), probe_ssh=probe_ssh), info.hosts))
    ok = acng_alive and all(h.healthy if probe_ssh else h.nspawn_alive for h in hosts)
    return LabStatus("up" if ok else "degraded", cfg, info, hosts, acng_alive)


def format_status(st: LabStatus) -> str:
    cfg = st.config
    if st.state == "down":
        return f"lab: down (state dir {cfg.state_dir})"
    lines = [
        f"lab: {st.state}  state dir {cfg.state_dir}  subnet {cfg.subnet}  bridge {cfg.bridge} "
        f"({cfg.bridge_address})",
        f"apt cache: {cfg.apt_cache_url} ({'running' if st.apt_cache_alive else 'NOT running'})",
    ]
    if st.info is None:
        lines.append("no lab.json: the lab did not finish coming up; run `pdkit lab down`")
        return "\n".join(lines)
    lines.append(f"ssh: key {st.info.ssh_key}  known_hosts {st.info.known_hosts}  (strict host-key checking)")
    lines.append(
        f"{'HOST':<10} {'ADDRESS':<15} {'ROLE':<11} {'PID':>8}  {'SYSTEMD':<12} {'SSH':<4} {'PSS':>8} {'ANON':>8}"
    )

    def mib(v: int | None) -> str:
        return f"{v / 2**20:.0f} MiB" if v is not None else "-"

    for h in st.hosts:
        pid = str(h.pid) if h.nspawn_alive else "dead"
        lines.append(
            f"{h.host.name:<10} {h.host.address:<15} {h.host.role:<11} {pid:>8}  {h.systemd:<12} "
            f"{'ok' if h.ssh_ok else 'FAIL':<4} {mib(h.memory_pss):>8} {mib(h.memory_rss):>8}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- up


def _ensure_client_key(cfg: LabConfig) -> str:
    key = cfg.ssh_key
    if not key.exists():
        run(["ssh-keygen", *keygen_args(key, "pdkit-lab-control")], timeout=30)
    key.chmod(0o600)
    return key.with_name(key.name + ".pub").read_text()


def _start_machine(cfg: LabConfig, host: LabHost) -> dict:
    root = cfg.machine_root(host.name)
    ns = cfg.netns(host.name)
    cgroups = make_cgroup_dirs(f"{cfg.cgroup_name}/{host.name}")
    nspawn = which("systemd-nspawn") or "systemd-nspawn"
    argv = [
        nspawn,
        # --machine unique across labs: nspawn keys /run/systemd/nspawn/propagate/<machine> on it
        *nspawn_boot_args(root, cfg.netns(host.name), host.name),
        f"--network-namespace-path=/run/netns/{ns}",
    ]
    log_path = cfg.log_dir / f"{host.name}.console.log"
    # The wrapper shell moves itself into the container's own cgroups, then becomes nspawn.
    proc = start_in_cgroups(cgroups, argv, log_path)
    return {
        "pid": proc.pid,
        "start": proc_start_time(proc.pid),
        "netns": ns,
        "veth": cfg.veth(host.name),
        "root": str(root),
        "cgroups": [str(c) for c in cgroups],
        "console_log": str(log_path),
    }


def _wait_ready(info: LabInfo, host: LabHost, rec: dict, deadline: float) -> str:
    """Wait until SSH answers and systemd finished booting; return its state."""
    while True:
        if not proc_alive(rec["pid"], rec["start"]):
            tail = Path(rec["console_log"]).read_text(errors="replace").strip().splitlines()[-3:]
            raise LabError(f"{host.name}: systemd-nspawn exited during boot: {' | '.join(tail)} ({rec['console_log']})")
        if aptcache.port_open(host.address, host.ssh_port, 0.5):
            break
        if time.monotonic() > deadline:
            raise LabError(f"{host.name}: SSH on {host.address}:{host.ssh_port} did not open ({rec['console_log']})")
        time.sleep(0.2)
    left = max(5.0, deadline - time.monotonic())
    proc = ssh_run(info, host, systemd_wait_command(left), timeout=left + 10)
    state = proc.stdout.strip()
    if proc.returncode == 255:
        raise LabError(f"{host.name}: ssh failed: {proc.stderr.strip()}")
    if not state:
        raise LabError(f"{host.name}: systemd did not report a state: {proc.stderr.strip()}")
    return state


def up(
    n_gpu: int = DEFAULT_GPU_HOSTS,
    *,
    rebuild_rootfs: bool = False,
    progress: Progress | None = None,
    keep_failed: bool = False,
) -> LabInfo:
    """Bring the lab up (or report the running one); return its :class:`LabInfo`."""
    progress = progress or Progress()
    require_root()
    require_tools()
    cfg = config_for_existing()
    with _locked(cfg, progress):
        rt = _read_runtime(cfg)
        if rt is not None:
            st = status(cfg.state_dir, probe_ssh=False)
            if st.state == "up" and st.info is not None:
                have = len(st.info.gpu_hosts)
                if have != n_gpu:
                    raise LabError(
                        f"the lab is already up with {have} GPU hosts (asked for {n_gpu}): `pdkit lab down` first"
                    )
                progress("lab is already up")
                return st.info
            progress("found a half-up lab: taking it down first")
            _down_locked(cfg, progress)
        env_cfg = LabConfig.from_env()
        if env_cfg != cfg:
            cfg = env_cfg
        try:
            return _up_locked(cfg, n_gpu, progress, rebuild_rootfs)
        except BaseException as exc:
            why = str(exc) or type(exc).__name__
            if keep_failed or os.environ.get("PDKIT_LAB_KEEP_FAILED") == "1":
                progress(f"lab up failed ({why}); leaving it as it is for debugging (PDKIT_LAB_KEEP_FAILED)")
            else:
                progress(f"lab up failed: {why}; cleaning up (PDKIT_LAB_KEEP_FAILED=1 keeps it)")
                with contextlib.suppress(Exception):
                    _down_locked(cfg, progress)
            raise


# What one booted host's systemd and services take of the kernel's per-user inotify limits (the
# guests' root is this machine's root): systemd, journald, logind, udev-less units' path watches.
# A 32-host lab hit the default 128 instances: "Failed to create inotify object: Too many open
# files" in the guests' consoles, and sshd never started (benchmarks/scale.py --lab).
INOTIFY_INSTANCES_PER_HOST = 16
INOTIFY_WATCHES_PER_HOST = 8192
INOTIFY_SYSCTL = Path("/proc/sys/fs/inotify")


def inotify_limits_needed(n_hosts: int, current: dict[str, int]) -> dict[str, int]:
    """Pure: the sysctls to raise (name -> value) for N_HOSTS booted hosts, given the CURRENT ones;
    never lowers one. 128 instances are left for this machine's own processes."""
    want = {"max_user_instances": 128 + INOTIFY_INSTANCES_PER_HOST * n_hosts,
            "max_user_watches": 65536 + INOTIFY_WATCHES_PER_HOST * n_hosts}
    return {k: v for k, v in want.items() if current.get(k, 0) < v}


def raise_inotify_limits(n_hosts: int, root: Path = INOTIFY_SYSCTL) -> list[str]:
    """Raise fs.inotify limits the hosts would exhaust; the lines say what changed (or why not)."""
    current = {}
    for name in ("max_user_instances", "max_user_watches"):
        try:
            current[name] = int((root / name).read_text())
        except (OSError, ValueError):
            return [f"note: could not read fs.inotify.{name}; {n_hosts} hosts may exhaust it "
                    "(guests then fail to start units)"]
    out = []
    for name, value in inotify_limits_needed(n_hosts, current).items():
        try:
            (root / name).write_text(f"{value}\n")
            out.append(f"fs.inotify.{name}: {current[name]} -> {value} "
                       f"({n_hosts} hosts; each host's systemd needs its own)")
        except OSError as exc:
            out.append(f"WARNING fs.inotify.{name} is {current[name]}, {n_hosts} hosts need {value} "
                       f"and it could not be raised ({exc}): sysctl -w fs.inotify.{name}={value}")
    return out


def _up_locked(cfg: LabConfig, n_gpu: int, progress: Progress, rebuild_rootfs: bool) -> LabInfo:
    t0 = time.monotonic()
    hosts = cfg.hosts(n_gpu)
    for d in (cfg.state_dir, cfg.machines_dir, cfg.run_dir, cfg.log_dir):
        d.mkdir(parents=True, exist_ok=True)
    rt: dict = {
        "subnet": str(cfg.subnet),
        "state_dir": str(cfg.state_dir),
        "tag": cfg.tag,
        "hosts": {},
        "cgroup_roots": [],
    }
    _write_json(cfg.runtime_json, rt)  # from here on `lab down` knows what to clean

    client_pub = _ensure_client_key(cfg)
    if not has_capability(24):  # CAP_SYS_RESOURCE
        progress(
            "note: root here has no CAP_SYS_RESOURCE, so the hosts keep this machine's RLIMIT_MEMLOCK"
            " (LimitMEMLOCK=infinity in a unit will not take effect)"
        )
    for line in raise_inotify_limits(len(hosts)):
        progress(line)
    progress(f"network: bridge {cfg.bridge} {cfg.bridge_address}/24")
    net.ensure_bridge(cfg)
    rt["cgroup_roots"] = [str(m / ours.lstrip("/") / cfg.cgroup_name) for m, ours in cgroup_hierarchies()]
    aptcache.forget_suite_indexes(cfg)
    rt["apt_cache"] = aptcache.start(cfg)
    _write_json(cfg.runtime_json, rt)
    progress(f"apt cache: apt-cacher-ng on {cfg.apt_cache_url} (pid {rt['apt_cache']['pid']})")

    t = time.monotonic()
    for problem in aptcache.warm(cfg):
        progress(f"apt cache: could not warm {problem}")
    progress(f"apt cache: suite indexes warm ({time.monotonic() - t:.1f}s)")

    with file_lock(cfg.cache_dir / ".lock", progress, "rootfs cache"):
        tarball = rootfs.ensure_tarball(cfg, progress, rebuild=rebuild_rootfs)
        base_root = rootfs.ensure_base(tarball, progress)
    host_keys: dict[str, str] = {}
    t = time.monotonic()
    for host in hosts:
        root = rootfs.mount_host_root(base_root, cfg.machines_dir / host.name)
        host_keys[host.name] = rootfs.personalise(root, host, hosts, cfg, client_pub)
    progress(f"hosts: {len(hosts)} root filesystems (overlay on the base) in {time.monotonic() - t:.1f}s")

    # known_hosts straight from the guests' rootfs: no trust on first use
    kh = [f"{h.name},{h.address} {' '.join(host_keys[h.name].split()[:2])}" for h in hosts]
    cfg.known_hosts.write_text("\n".join(kh) + "\n")
    cfg.known_hosts.chmod(0o644)

    info = cfg.info(hosts, created_at=datetime.now(UTC).isoformat(timespec="seconds"))
    progress("hosts: booting (systemd-nspawn, systemd as PID 1)")
    for host in hosts:
        net.add_host(cfg, host)
        rt["hosts"][host.name] = _start_machine(cfg, host)
        _write_json(cfg.runtime_json, rt)

    deadline = time.monotonic() + BOOT_TIMEOUT + BOOT_TIMEOUT_PER_HOST * len(hosts)
    degraded = []
    for host in hosts:
        state = _wait_ready(info, host, rt["hosts"][host.name], deadline)
        rt["hosts"][host.name]["leader"] = net.leader_pid(cfg.netns(host.name))
        if state != "running":
            failed = ssh_run(info, host, "systemctl --failed --no-legend --plain", timeout=20).stdout.strip()
            degraded.append(f"{host.name}: {state} ({failed or 'no failed units'})")
        progress(f"  {host.name} {host.address}: systemd {state}, ssh ok")
    _write_json(cfg.runtime_json, rt)
    _write_json(cfg.lab_json, json.loads(info.model_dump_json(exclude={"running"})))
    for line in degraded:
        progress(f"WARNING {line}")
    progress(f"lab up: {len(hosts)} hosts in {time.monotonic() - t0:.1f}s")
    return load_lab(cfg.state_dir) or info


# ---------------------------------------------------------------- down


def down(state_dir: Path | None = None, *, progress: Progress | None = None) -> list[str]:
    """Take the lab down; return what could not be removed (empty when clean)."""
    progress = progress or Progress()
    require_root()
    cfg = config_for_existing(state_dir)
    with _locked(cfg, progress):
        return _down_locked(cfg, progress)


def _stop_machines(cfg: LabConfig, rt: dict, progress: Progress) -> None:
    recs = rt.get("hosts", {})
    alive = {n: r for n, r in recs.items() if proc_alive(r.get("pid"), r.get("start"))}
    # orderly: SIGTERM to nspawn makes it send SIGRTMIN+3 (poweroff) to the guest's systemd.
    # A guest still early in its boot has no handler for it yet and drops it: repeat.
    if alive:
        progress(f"stopping {len(alive)} hosts ({', '.join(alive)})")
    pids = [r["pid"] for r in alive.values()]
    deadline = time.monotonic() + STOP_TIMEOUT
    left = pids
    while left and time.monotonic() < deadline:
        kill_pids(left, signal.SIGTERM)
        left = wait_gone(left, min(2.0, max(0.1, deadline - time.monotonic())))
    if alive:
        progress(f"hosts powered off ({len(alive) - len(left)}/{len(alive)})")
    if left:
        progress(f"hosts did not power off in {STOP_TIMEOUT}s: killing {left}")
        kill_pids(left)
        wait_gone(left, 10)
    # anything still running from a machine root, in a lab cgroup or netns
    stray = set(pids_rooted_under(cfg.machines_dir)) | set(pids_with_arg_under(cfg.machines_dir))
    for rec in recs.values():
        for cg in rec.get("cgroups", []):
            stray |= set(cgroup_pids(Path(cg)))
    for ns in net.netns_names():
        if ns.startswith(cfg.tag + "-"):
            stray |= set(net.pids_in_netns(ns))
    stray.discard(os.getpid())
    if stray:
        progress(f"killing {len(stray)} leftover processes")
        kill_pids(sorted(stray))
        wait_gone(sorted(stray), 10)


def _find_cgroup_dirs(cfg: LabConfig, rt: dict) -> list[Path]:
    found = {Path(p) for p in rt.get("cgroup_roots", [])}
    for mount, ours in cgroup_hierarchies():
        found.add(mount / ours.lstrip("/") / cfg.cgroup_name)
        found.add(mount / cfg.cgroup_name)
    return sorted(p for p in found if p.is_dir())


def _down_locked(cfg: LabConfig, progress: Progress) -> list[str]:
    t0 = time.monotonic()
    rt = _read_runtime(cfg) or {}
    with contextlib.suppress(FileNotFoundError):
        cfg.lab_json.unlink()
    _stop_machines(cfg, rt, progress)
    net.remove_all(cfg)
    acng = rt.get("apt_cache", {})
    aptcache.stop(acng.get("pid"), acng.get("start"))
    for pid in pids_with_arg_under(aptcache.conf_dir(cfg)):
        kill_pids([pid])
    problems: list[str] = []
    for d in _find_cgroup_dirs(cfg, rt):
        problems += remove_cgroup_tree(d)
    if cfg.machines_dir.exists():
        rootfs.remove_tree(cfg.machines_dir)
    for p in (cfg.known_hosts, cfg.runtime_json):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    if aptcache.conf_dir(cfg).exists():
        rootfs.remove_tree(aptcache.conf_dir(cfg))
    left = leftovers(cfg) + problems
    if left:
        progress("lab down: left behind: " + "; ".join(left))
    else:
        progress(f"lab down: clean in {time.monotonic() - t0:.1f}s")
    return left


def leftovers(cfg: LabConfig | None = None) -> list[str]:
    """Everything of the lab that still exists on the control machine (empty after a clean down)."""
    cfg = cfg or config_for_existing()
    found = net.leftovers(cfg)
    found += [f"mount {m}" for m in mounts_under(cfg.state_dir)]
    found += [f"mount {m}" for m in mounts_under(net.NETNS_DIR) if Path(m).name.startswith(cfg.tag + "-")]
    for mount, ours in cgroup_hierarchies():
        for base in {mount / ours.lstrip("/"), mount}:
            d = base / cfg.cgroup_name
            if d.exists():
                found.append(f"cgroup {d}")
    pids = (
        set(pids_rooted_under(cfg.machines_dir))
        | set(pids_with_arg_under(cfg.machines_dir))
        | set(pids_with_arg_under(aptcache.conf_dir(cfg)))
    )
    pids.discard(os.getpid())
    for pid in sorted(pids):
        found.append(f"process {pid} {' '.join(proc_cmdline(pid))[:120]}")
    if tcp_listening(cfg.bridge_address, APT_CACHE_PORT):
        found.append(f"listener {cfg.bridge_address}:{APT_CACHE_PORT}")
    return found
