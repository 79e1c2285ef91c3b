"""The lab itself: hosts with systemd as PID 1, strict SSH, networking, apt cache, clean down.

The first group needs neither root nor a lab (API and CLI behaviour); the `lab` marked
tests use the session lab from conftest.py, except the last one, which brings up its own
one-host lab (own state dir and subnet) to prove that `down` leaves nothing behind.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdkit.lab import lifecycle, model, system
from pdkit.lab.model import APT_CACHE_PORT, MAX_GPU_HOSTS, LabConfig

from .conftest import lab_skip_reason

REPO = Path(__file__).resolve().parents[2]


def _ssh(info: model.LabInfo, host: model.LabHost, command: str, **kw) -> subprocess.CompletedProcess[str]:
    return lifecycle.ssh_run(info, host, command, **kw)


# ----------------------------------------------------------------- no root, no lab


def test_planned_hosts_are_deterministic(monkeypatch):
    monkeypatch.delenv("PDKIT_LAB_SUBNET", raising=False)
    hosts = model.planned_hosts()
    assert [(h.name, h.address, h.role) for h in hosts] == [
        ("lab-gpu1", "10.213.0.11", "gpu"),
        ("lab-gpu2", "10.213.0.12", "gpu"),
        ("lab-gpu3", "10.213.0.13", "gpu"),
        ("lab-mon", "10.213.0.10", "monitoring"),
    ]
    assert all(h.ssh_user == "root" and h.ssh_port == 22 for h in hosts)
    assert [h.name for h in model.planned_hosts(1)] == ["lab-gpu1", "lab-mon"]
    monkeypatch.setenv("PDKIT_LAB_SUBNET", "10.213.9.0/24")
    assert model.planned_hosts(2)[1].address == "10.213.9.12"
    with pytest.raises(model.LabError):
        model.planned_hosts(0)


def test_planned_lab_gives_pyinfra_data(monkeypatch, tmp_path):
    monkeypatch.setenv("PDKIT_LAB_DIR", str(tmp_path))
    monkeypatch.delenv("PDKIT_LAB_SUBNET", raising=False)
    info = model.planned_lab(2)
    assert not info.running
    name, data = info.pyinfra_hosts()[0]
    assert name == "lab-gpu1"
    assert data == {
        "ssh_hostname": "10.213.0.11",
        "ssh_port": 22,
        "ssh_user": "root",
        "ssh_key": str(tmp_path / "id_ed25519"),
        "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
        "ssh_strict_host_key_checking": "yes",
    }
    assert model.load_lab() is None  # nothing running in an empty state dir


def test_interface_names_fit_the_kernel_limit():
    cfg = LabConfig(Path("/x"), Path("/y"), ipaddress.IPv4Network("10.255.255.0/24"))
    names = [cfg.bridge] + [cfg.veth(h.name) for h in cfg.hosts(MAX_GPU_HOSTS)]
    assert all(len(n) <= 15 for n in names), names
    assert len(set(names)) == len(names)


def test_not_root_is_one_line_and_exit_2(monkeypatch, capsys):
    from pdkit.cli import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for sub in ("up", "down", "status"):
        assert main(["lab", sub]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs root" in err[0], err


def test_missing_tool_names_the_package(monkeypatch):
    real = system.which
    monkeypatch.setattr(system, "which", lambda t: None if t == "debootstrap" else real(t))
    with pytest.raises(system.MissingTool) as exc:
        system.require_tools()
    msg = str(exc.value)
    assert "debootstrap" in msg and "apt-get install debootstrap" in msg and ".ci/lab-prereqs.sh" in msg
    assert "\n" not in msg


# ----------------------------------------------------------------- the session lab


@pytest.mark.lab
def test_lab_json_describes_the_running_lab(lab):
    info = model.load_lab()
    assert info is not None and info.running
    assert info.hosts == lab.hosts
    assert [h.name for h in info.gpu_hosts] == [f"lab-gpu{i}" for i in range(1, len(info.gpu_hosts) + 1)]
    assert info.monitoring_host.name == "lab-mon"
    assert info.hosts == model.planned_hosts(len(info.gpu_hosts))  # plan == reality
    raw = json.loads((model.lab_dir() / "lab.json").read_text())
    for key in ("ssh_key", "known_hosts", "hosts", "subnet", "apt_cache_url"):
        assert key in raw
    assert set(raw["hosts"][0]) >= {"name", "address", "role", "ssh_user", "ssh_port"}
    assert info.ssh_key.stat().st_mode & 0o077 == 0, "private key must be 0600"
    kh = info.known_hosts.read_text().splitlines()
    assert len(kh) == len(info.hosts)
    for h, line in zip(info.hosts, kh):
        assert line.startswith(f"{h.name},{h.address} ssh-ed25519 ")


@pytest.mark.lab
def test_every_host_boots_systemd_as_pid1_and_answers_ssh(lab):
    for host in lab.hosts:
        proc = _ssh(lab, host, "cat /proc/1/comm; systemctl is-system-running; hostname; id -u", timeout=30)
        assert proc.returncode == 0, f"{host.name}: {proc.stderr}"
        comm, state, hostname, uid = proc.stdout.split()
        assert (comm, state, hostname, uid) == ("systemd", "running", host.name, "0"), host.name
    # and from the control machine: PID 1 of each container's PID namespace is systemd
    rt = json.loads((model.lab_dir() / "run" / "runtime.json").read_text())
    for host in lab.hosts:
        leader = rt["hosts"][host.name]["leader"]
        assert Path(f"/proc/{leader}/comm").read_text().strip() == "systemd"


@pytest.mark.lab
def test_roots_user_manager_outlives_an_ssh_session(lab):
    """Root lingers in the lab image: without it each guest started a systemd --user at pyinfra's
    first login and stopped it 10 s after the last, on the control machine's cores, in every
    no-op run (docs/benchmarks.md)."""
    host = lab.hosts[0]
    first = _ssh(lab, host, "systemctl show -p ActiveEnterTimestampMonotonic --value user@0.service; ls /var/lib/systemd/linger", timeout=30)
    assert first.returncode == 0 and first.stdout.split()[1:] == ["root"], first.stdout + first.stderr
    time.sleep(11)  # logind's UserStopDelaySec (10 s) after the last session ended
    again = _ssh(lab, host, "systemctl is-active user@0.service; systemctl show -p ActiveEnterTimestampMonotonic --value user@0.service", timeout=30)
    assert again.stdout.split() == ["active", first.stdout.split()[0]], (first.stdout, again.stdout)


@pytest.mark.lab
def test_ssh_is_strict_about_host_keys(lab, tmp_path):
    a, b = lab.hosts[0], lab.hosts[1]
    lines = lab.known_hosts.read_text().splitlines()
    key_of = {line.split()[0].split(",")[0]: " ".join(line.split()[1:]) for line in lines}

    # a's entry carries b's key: SSH must refuse (man-in-the-middle case)
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{a.name},{a.address} {key_of[b.name]}\n")
    proc = _ssh(lab, a, "true", known_hosts=wrong, timeout=30)
    assert proc.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in proc.stderr or "verification failed" in proc.stderr

    # no entry at all: no trust on first use either
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    proc = _ssh(lab, a, "true", known_hosts=empty, timeout=30)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr
    assert empty.read_text() == ""

    # root by key only: password authentication is not offered
    argv = lifecycle.ssh_argv(a, lab.ssh_key, lab.known_hosts, "true")
    argv[argv.index("IdentitiesOnly=yes")] = "PreferredAuthentications=password,keyboard-interactive"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Permission denied" in proc.stderr


@pytest.mark.lab
def test_pyinfra_connects_with_the_documented_data(lab, tmp_path):
    """pyinfra 3.10 with exactly the keys of pyinfra_host_data(), strict host keys."""
    inv = tmp_path / "lab_inventory.py"
    inv.write_text(
        textwrap.dedent(
            """
            from pdkit.lab.model import load_lab
            lab_hosts = load_lab().pyinfra_hosts()
            """
        )
    )
    pyinfra = Path(sys.executable).with_name("pyinfra")
    proc = subprocess.run(
        [str(pyinfra), str(inv), "exec", "--", "systemctl", "is-system-running"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for host in lab.hosts:
        assert f"[{host.name}]" in out and "running" in out

    bad = tmp_path / "bad_inventory.py"
    wrong = tmp_path / "wrong_known_hosts"
    first, second = lab.known_hosts.read_text().splitlines()[:2]
    wrong.write_text(first.split()[0] + " " + " ".join(second.split()[1:]) + "\n")
    bad.write_text(
        textwrap.dedent(
            f"""
            from pdkit.lab.model import load_lab
            _lab = load_lab()
            _h = _lab.hosts[0]
            _data = _lab.pyinfra_data(_h)
            _data["ssh_known_hosts_file"] = {str(wrong)!r}
            lab_hosts = [(_h.name, _data)]
            """
        )
    )
    proc = subprocess.run(
        [str(pyinfra), str(bad), "exec", "--", "true"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode != 0
    assert "host key" in (proc.stdout + proc.stderr).lower()


@pytest.mark.lab
def test_hosts_reach_each_other_and_the_apt_cache_but_not_the_world(lab):
    names = " ".join(h.name for h in lab.hosts)
    for host in lab.hosts:
        proc = _ssh(
            lab,
            host,
            f"for n in {names}; do ping -c1 -W2 $n >/dev/null || echo UNREACHABLE $n; done;"
            f" curl -fsS -o /dev/null -m 10 {lab.apt_cache_url}/acng-report.html || echo NO-APT-CACHE;"
            " ip route show default | grep -q . && echo HAS-DEFAULT-ROUTE; true",
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "", f"{host.name}: {proc.stdout}"
    # apt works through the cache (and only through it)
    host = lab.gpu_hosts[0]
    t = time.monotonic()
    proc = _ssh(lab, host, "apt-get update -q 2>&1 && apt-cache policy openssh-server | head -3", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert f"{lab.apt_cache_url}/debian" in proc.stdout
    assert "Err:" not in proc.stdout
    print(f"apt-get update through the cache: {time.monotonic() - t:.1f}s")


@pytest.mark.lab
def test_up_again_is_idempotent_and_status_is_green(lab):
    rt_before = json.loads((model.lab_dir() / "run" / "runtime.json").read_text())
    t = time.monotonic()
    again = lifecycle.up(len(lab.gpu_hosts))
    assert time.monotonic() - t < 10
    assert again.hosts == lab.hosts
    rt_after = json.loads((model.lab_dir() / "run" / "runtime.json").read_text())
    assert {n: r["pid"] for n, r in rt_after["hosts"].items()} == {n: r["pid"] for n, r in rt_before["hosts"].items()}

    st = lifecycle.status()
    assert st.state == "up" and st.apt_cache_alive
    assert all(h.healthy for h in st.hosts), lifecycle.format_status(st)
    proc = subprocess.run(
        [sys.executable, "-m", "pdkit.cli", "lab", "status"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in lab.hosts:
        line = next(line for line in proc.stdout.splitlines() if line.startswith(host.name + " "))
        assert host.address in line and "running" in line and " ok " in line


# ----------------------------------------------------------------- down, on a lab of its own


def _independent_leftovers(cfg: LabConfig) -> list[str]:
    """Look for remains without the lab's own bookkeeping: ip, mountinfo, cgroupfs, /proc."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if cfg.tag in line]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=20).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if cfg.tag in line]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4]
        if mp.startswith(str(cfg.state_dir)) or cfg.tag in mp:
            found.append(f"mount {mp}")
    for hier in Path("/sys/fs/cgroup").iterdir():
        for dirpath, dirnames, _ in os.walk(hier):
            if Path(dirpath).relative_to(hier).parts.__len__() >= 3:
                dirnames[:] = []
            for d in dirnames:
                if cfg.tag in d:
                    found.append(f"cgroup {dirpath}/{d}")
    for pid in system.all_pids():
        if pid == os.getpid():
            continue
        cmd = " ".join(system.proc_cmdline(pid))
        try:
            root = os.readlink(f"/proc/{pid}/root")
        except OSError:
            root = "/"
        if str(cfg.state_dir) in cmd or root.startswith(str(cfg.state_dir)):
            found.append(f"process {pid} {cmd[:100]}")
    if system.tcp_listening(cfg.bridge_address, APT_CACHE_PORT):
        found.append("apt cache still listening")
    return found


@pytest.mark.lab
def test_down_leaves_nothing_behind(tmp_path):
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ)
    env["PDKIT_LAB_DIR"] = str(tmp_path / "lab")
    env["PDKIT_LAB_SUBNET"] = "10.213.77.0/24"  # beside the session lab, not in its way
    cfg = LabConfig(Path(env["PDKIT_LAB_DIR"]), model.cache_dir(), ipaddress.IPv4Network(env["PDKIT_LAB_SUBNET"]))

    def cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pdkit.cli", "lab", *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    try:
        up = cli("up", "--hosts", "1")
        assert up.returncode == 0, up.stderr
        info = model.load_lab(cfg.state_dir)
        assert info is not None and [h.address for h in info.hosts] == ["10.213.77.11", "10.213.77.10"]
        # leave something running in the guests: a service, an SSH session's user manager
        for host in info.hosts:
            busy = "systemd-run --unit=busy sleep 600 && systemctl is-active busy"
            proc = lifecycle.ssh_run(info, host, busy, timeout=30)
            assert proc.stdout.strip() == "active", proc.stderr
        assert _independent_leftovers(cfg), "the check must see a running lab"
    finally:
        t = time.monotonic()
        down = cli("down", timeout=300)
        took = time.monotonic() - t
    assert down.returncode == 0, down.stderr
    assert lifecycle.leftovers(cfg) == []
    assert _independent_leftovers(cfg) == []
    assert not (cfg.state_dir / "machines").exists()
    assert model.load_lab(cfg.state_dir) is None
    assert cli("status").returncode == 3
    print(f"lab down took {took:.1f}s")


def test_inotify_limits_grow_with_the_lab_and_are_never_lowered(tmp_path):
    """A 32-host lab exhausted the default 128 inotify instances: guests' units failed and sshd never started."""
    from pdkit.lab.lifecycle import inotify_limits_needed, raise_inotify_limits

    assert inotify_limits_needed(4, {"max_user_instances": 128, "max_user_watches": 192536}) == {"max_user_instances": 192}
    assert inotify_limits_needed(32, {"max_user_instances": 128, "max_user_watches": 192536}) == {
        "max_user_instances": 640, "max_user_watches": 327680}
    assert inotify_limits_needed(32, {"max_user_instances": 10_000, "max_user_watches": 10**7}) == {}
    (tmp_path / "max_user_instances").write_text("128\n")
    (tmp_path / "max_user_watches").write_text("8192\n")
    lines = raise_inotify_limits(32, tmp_path)
    assert (tmp_path / "max_user_instances").read_text() == "640\n" and "128 -> 640" in lines[0], lines
    assert raise_inotify_limits(32, tmp_path) == []
