"""The lab's apt cache: an apt-cacher-ng of its own, listening on the bridge address only."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from pathlib import Path

from pdkit.hosts.nspawn_common import kill_pids, make_cgroup_dirs, proc_alive, proc_start_time, start_in_cgroups
from pdkit.lab.model import APT_CACHE_PORT, SUITE, LabConfig, LabError
from pdkit.lab.system import tcp_listening, wait_gone, which

DEBIAN_BACKEND = "http://deb.debian.org/debian/"


def conf_dir(cfg: LabConfig) -> Path:
    return cfg.run_dir / "apt-cacher-ng"


def store_dir(cfg: LabConfig) -> Path:
    """Downloaded packages: kept across `lab down` so the next builds and installs are warm."""
    return cfg.cache_dir / f"apt-cacher-ng-{cfg.tag}"  # one per lab: instances never share a store


def write_config(cfg: LabConfig) -> Path:
    d = conf_dir(cfg)
    d.mkdir(parents=True, exist_ok=True)
    logs = cfg.log_dir / "apt-cacher-ng"
    logs.mkdir(parents=True, exist_ok=True)
    store_dir(cfg).mkdir(parents=True, exist_ok=True)
    (d / "backends_debian").write_text(DEBIAN_BACKEND + "\n")
    (d / "acng.conf").write_text(
        "\n".join(
            [
                "# pdkit lab apt cache (written by `pdkit lab up`)",
                f"CacheDir: {store_dir(cfg)}",
                f"LogDir: {logs}",
                "SupportDir: /usr/lib/apt-cacher-ng",
                f"Port: {APT_CACHE_PORT}",
                f"BindAddress: {cfg.bridge_address}",
                f"SocketPath: {d / 'socket'}",
                f"PidFile: {d / 'pid'}",
                "Remap-debrep: file:deb_mirror*.gz /debian ; file:backends_debian",
                "Remap-secdeb: security.debian.org security.debian.org/debian-security"
                " deb.debian.org/debian-security /debian-security ; deb.debian.org/debian-security",
                "ReportPage: acng-report.html",
                "ExThreshold: 4",
                "NetworkTimeout: 30",
                # InRelease is fetched fresh once per `lab up` (warm()) and then served as
                # a static file: see warm() for the race this avoids.
                "SPfilePatternEx: .*/dists/[^/]+/InRelease$",
                "UnbufferLogs: 1",
                "",
            ]
        )
    )
    return d


def port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def start(cfg: LabConfig) -> dict:
    """Start apt-cacher-ng in its own cgroup; return ``{"pid", "start", "cgroups"}``."""
    exe = which("apt-cacher-ng")
    if exe is None:
        raise LabError("apt-cacher-ng is not installed: apt-get install apt-cacher-ng (or run .ci/lab-prereqs.sh)")
    if tcp_listening(cfg.bridge_address, APT_CACHE_PORT):
        raise LabError(
            f"{cfg.bridge_address}:{APT_CACHE_PORT} is already taken (a system-wide apt-cacher-ng?"
            " `systemctl disable --now apt-cacher-ng`)"
        )
    d = write_config(cfg)
    cgroups = make_cgroup_dirs(f"{cfg.cgroup_name}/apt-cacher-ng")
    proc = start_in_cgroups(cgroups, [exe, "-c", str(d), "ForeGround=1"], cfg.log_dir / "apt-cacher-ng.out")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (cfg.log_dir / "apt-cacher-ng.out").read_text(errors="replace").strip()[-300:]
            raise LabError(f"apt-cacher-ng exited with {proc.returncode}: {tail}")
        if tcp_listening(cfg.bridge_address, APT_CACHE_PORT):
            return {"pid": proc.pid, "start": proc_start_time(proc.pid), "cgroups": [str(c) for c in cgroups]}
        time.sleep(0.1)
    kill_pids([proc.pid])
    raise LabError(f"apt-cacher-ng did not listen on {cfg.bridge_address}:{APT_CACHE_PORT} within 20 s")


WARM_PATHS = (
    f"debian/dists/{SUITE}/InRelease",
    f"debian/dists/{SUITE}-updates/InRelease",
    f"debian-security/dists/{SUITE}-security/InRelease",
)


def forget_suite_indexes(cfg: LabConfig) -> None:
    """Drop the cached InRelease files so that this lab's warm() fetches current ones."""
    for p in store_dir(cfg).glob("*/dists/*/InRelease*"):
        if p.is_file():
            p.unlink()


def warm(cfg: LabConfig) -> list[str]:
    """Fetch the suites' InRelease files once, from the control machine, one at a time.

    apt asks for index files with "Cache-Control: max-age=0" and apt-cacher-ng 3.7.4 then
    re-fetches a volatile file for every client: it first renames the cached copy to
    `<name>.<unix seconds>`, so two hosts asking within the same second collide ("Failure
    to move file ... File exists", "Error creating file item") and one of them gets a 503
    or headers without a body. apt 2.6 then hangs in `apt-get update` (seen in 1 round
    of 4-5 with four hosts updating at once, which is what a pyinfra deploy does).
    Hence: InRelease is dropped at `lab up`, fetched here by one client, and served as a
    static file for the lab's lifetime (SPfilePatternEx); the Packages files it names
    are content-addressed (by-hash) and static anyway. A lab that lives longer than the
    7 days of bookworm-security's Valid-Until needs a `lab down`/`up`.

    Returns problems instead of raising; gives up after the first failure so that an
    offline machine does not wait three times.
    """
    proxyless = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for path in WARM_PATHS:
        url = f"{cfg.apt_cache_url}/{path}"
        try:
            with proxyless.open(url, timeout=40) as resp:
                body = resp.read()
                expected = resp.headers.get("Content-Length")
                if expected is not None and int(expected) != len(body):
                    return [f"{path}: short answer ({len(body)}/{expected} bytes)"]
        except (OSError, ValueError) as exc:
            return [f"{path}: {exc}"]
    return []


def stop(pid: int | None, start_time: int | None) -> None:
    if not proc_alive(pid, start_time):
        return
    assert pid is not None
    kill_pids([pid], signal.SIGTERM)
    if wait_gone([pid], 10):
        kill_pids([pid], signal.SIGKILL)
        wait_gone([pid], 5)
