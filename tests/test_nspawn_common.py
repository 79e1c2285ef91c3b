"""pdkit/hosts/nspawn_common.py: what the lab and gpu/nspawn/host.py share, and that both still build the
same commands through it (no root, no container: arguments, files, processes of this test)."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.hosts import nspawn_common as common
from pdkit.lab.lifecycle import ssh_argv
from pdkit.lab.model import LabHost
from tests.conftest import load_script

# what both launchers passed ssh before the helpers were shared, option for option
SSH_OPTIONS = ["-F", "/dev/null", "-i", "/k/id_ed25519", "-p", "2222", "-o", "IdentitiesOnly=yes",
               "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/s/known_hosts",
               "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no", "-o", "ConnectTimeout=7",
               "-o", "LogLevel=ERROR"]


@pytest.fixture(scope="module")
def host():
    return load_script("gpu/nspawn/host.py", "pdkit_nspawn_host")


def test_ssh_options_are_strict_and_take_no_config():
    assert common.ssh_options("/k/id_ed25519", Path("/s/known_hosts"), 2222, 7) == SSH_OPTIONS


def test_the_lab_reaches_a_host_with_the_shared_options():
    h = LabHost(name="lab-gpu1", address="10.213.0.11", role="gpu", ssh_port=2222)
    argv = ssh_argv(h, "/k/id_ed25519", "/s/known_hosts", "true", connect_timeout=7)
    assert argv == ["ssh", *SSH_OPTIONS, "root@10.213.0.11", "--", "true"]
    assert ssh_argv(h, "/k/id_ed25519", "/s/known_hosts", ["a", "b"], connect_timeout=7)[-3:] == ["--", "a", "b"]


def test_host_py_reaches_its_container_with_the_shared_options(host, tmp_path, monkeypatch):
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path))
    rt = {"machine": "pdkit-a", "ssh_port": 2222, "ssh_address": "10.214.0.2"}
    argv = host.Host(Path("/m/pdkit-a"), rt).argv("true", timeout=7)
    ssh = argv.index("/m/pdkit-a/usr/bin/ssh")
    assert argv[:ssh] == host.rootfs_cmd(Path("/m/pdkit-a"), "usr/bin/ssh")[:-1]
    options = [str(tmp_path / "id_ed25519") if a == "/k/id_ed25519" else a for a in SSH_OPTIONS]
    known_hosts = f"UserKnownHostsFile={tmp_path / 'pdkit-a' / 'known_hosts'}"
    options = [known_hosts if a.startswith("UserKnownHostsFile=") else a for a in options]
    assert argv[ssh + 1:] == [*options, "root@10.214.0.2", "--", "true"]


def test_keygen_makes_an_ed25519_key_without_a_passphrase():
    assert common.keygen_args(Path("/r/etc/ssh/ssh_host_ed25519_key"), "root@pdkit-a") == [
        "-q", "-t", "ed25519", "-N", "", "-C", "root@pdkit-a", "-f", "/r/etc/ssh/ssh_host_ed25519_key"]


def test_nspawn_boots_systemd_without_registering_and_with_the_engines_capabilities():
    args = common.nspawn_boot_args(Path("/m/h1"), "pdkit-lab-h1", "h1")
    assert args[:5] == ["--quiet", "--boot", "--directory=/m/h1", "--machine=pdkit-lab-h1", "--hostname=h1"]
    assert {"--register=no", "--keep-unit", "--resolv-conf=off", "--timezone=off", "--link-journal=no",
            "--console=read-only", "--rlimit=RLIMIT_MEMLOCK=infinity"} <= set(args)
    assert "--capability=CAP_SYS_RESOURCE,CAP_IPC_LOCK,CAP_NET_ADMIN" in args


def test_the_systemd_wait_is_bounded_in_whole_seconds():
    assert common.systemd_wait_command(42.9) == "timeout 42 systemctl is-system-running --wait"


def test_the_cgroup_shell_moves_itself_in_then_becomes_the_command(tmp_path):
    groups = [tmp_path / "a", tmp_path / "b c"]  # a space: the paths are quoted
    for g in groups:
        g.mkdir()
        (g / "cgroup.procs").write_text("")
    argv = common.in_cgroups(groups, [sys.executable, "-c", "import os; print(os.getpid())"])
    assert argv[0] == "sh" and argv[3] == "sh"
    pid = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    assert [(g / "cgroup.procs").read_text().strip() for g in groups] == [pid, pid]  # exec: the same process


def test_write_file_sets_the_mode_and_replaces_a_link_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("the machine's own file\n")
    path = tmp_path / "tree/etc/hostname"
    path.parent.mkdir(parents=True)
    path.symlink_to(outside)
    common.write_file(path, "h1\n", 0o444)
    assert not path.is_symlink() and path.read_text() == "h1\n" and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert outside.read_text() == "the machine's own file\n"
    common.write_file(tmp_path / "new/dir/f", "x")
    assert stat.S_IMODE((tmp_path / "new/dir/f").stat().st_mode) == 0o644


def test_replace_link_takes_the_place_of_a_file_or_a_link(tmp_path):
    unit = tmp_path / "etc/systemd/system/apt-daily.timer"
    common.replace_link(unit, "/dev/null")  # nothing there, parents missing
    unit.unlink()
    unit.write_text("[Timer]\n")
    common.replace_link(unit, "/dev/null")
    assert str(unit.readlink()) == "/dev/null"
    common.replace_link(unit, "/lib/systemd/system/other.timer")
    assert str(unit.readlink()) == "/lib/systemd/system/other.timer"


def test_kill_pids_signals_each_and_skips_the_gone():
    child = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    common.kill_pids([gone.pid, child.pid])
    assert child.wait(timeout=10) == -9


def test_write_json_replaces_the_file_whole_with_the_callers_format(tmp_path):
    path = tmp_path / "state/runtime.json"
    common.write_json(path, {"b": 1, "a": Path("/x")}, indent=1, sort_keys=True, default=str)
    assert path.read_text() == '{\n "a": "/x",\n "b": 1\n}\n'
    assert not path.with_suffix(".tmp").exists()


def test_authorize_key_gives_root_one_key_with_the_modes_sshd_wants(tmp_path):
    common.authorize_key(tmp_path, "ssh-ed25519 AAAA control\n\n")
    ssh_dir = tmp_path / "root/.ssh"
    assert (ssh_dir / "authorized_keys").read_text() == "ssh-ed25519 AAAA control\n"
    assert stat.S_IMODE(ssh_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((ssh_dir / "authorized_keys").stat().st_mode) == 0o600


def test_run_names_what_failed(tmp_path):
    assert common.run(["sh", "-c", "echo out"]).stdout == "out\n"
    with pytest.raises(common.CommandError, match=r"^exit 3: sh -c echo no >&2; exit 3: no$") as failed:
        common.run(["sh", "-c", "echo no >&2; exit 3"])
    assert (failed.value.returncode, failed.value.output) == (3, "no")
    assert common.run(["sh", "-c", "exit 3"], check=False).returncode == 3
    with pytest.raises(common.CommandError, match="command not found: /nonexistent/tool"):
        common.run(["/nonexistent/tool"])
    with pytest.raises(common.CommandError, match="timed out after 0s: sleep 5"):
        common.run(["sleep", "5"], timeout=0.2)


def test_the_lab_and_host_py_raise_their_own_errors(host):
    from pdkit.lab.model import LabError  # lazy: the lab's error, for this test alone
    from pdkit.lab.system import run

    with pytest.raises(LabError, match="exit 3: sh -c exit 3"):
        run(["sh", "-c", "exit 3"])
    with pytest.raises(SystemExit, match=r"host.py: error: sh -c echo why >&2; exit 3...: why"):
        host.run_checked(["sh", "-c", "echo why >&2; exit 3"])


def test_remove_tree_removes_a_tree_a_file_and_a_link(tmp_path):
    (tmp_path / "t/a/b").mkdir(parents=True)
    (tmp_path / "t/a/b/f").write_text("x")
    common.remove_tree(tmp_path / "t")
    assert not (tmp_path / "t").exists()
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    common.remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "target").is_dir()
    common.remove_tree(tmp_path / "missing")  # nothing there: nothing to do


def test_a_process_is_known_by_its_pid_and_start_time():
    me = os.getpid()
    start = common.proc_start_time(me)
    assert start is not None and common.proc_alive(me, start) and common.proc_alive(me)
    assert not common.proc_alive(me, start + 1)  # the pid, reused by another process
    assert not common.proc_alive(None) and common.proc_start_time(2**22 + 1) is None


def test_a_cgroup_trees_processes_and_its_removal_deepest_first(tmp_path):
    top = tmp_path / "pdkit-nspawn-a"
    (top / "payload/inner").mkdir(parents=True)
    (top / "cgroup.procs").write_text("5\n")
    (top / "payload/cgroup.procs").write_text("7\n5\n")
    (top / "payload/inner/cgroup.procs").write_text("6\n")
    assert common.cgroup_pids(top) == [5, 6, 7]
    assert common.cgroup_pids(tmp_path / "missing") == []
    for f in top.rglob("cgroup.procs"):  # a real cgroup's files go with its directory
        f.unlink()
    assert common.remove_cgroup_tree(top) == [] and not top.exists()


def test_mounts_under_finds_the_mounts_of_this_machine():
    assert "/proc" in common.mounts_under(Path("/proc")) or "/proc" in common.mounts_under(Path("/"))


def test_host_py_unpack_still_refuses_without_an_artefact(host, tmp_path, monkeypatch):
    """host.py's first step runs through the shared helpers' import on its own python."""
    monkeypatch.setenv("PDKIT_NSPAWN_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(host, "MACHINES", tmp_path / "machines")
    monkeypatch.setattr(host, "nspawn_pids", lambda root: [])
    with pytest.raises(SystemExit, match="no rootfs-trixie.tar.xz in"):
        host.cmd_unpack(argparse.Namespace(machine="pdkit-a", artefacts=[str(tmp_path)]))


def test_host_py_imports_nothing_but_the_stdlib_on_a_bare_python(tmp_path):
    """As on the lent machine: a python3 with no site-packages, started from the repository root."""
    from tests.conftest import REPO  # lazy: only this test starts host.py itself

    code = ("import runpy, sys; sys.argv = ['host.py', '--help']\n"
            "try:\n    runpy.run_path('gpu/nspawn/host.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "import pdkit.hosts.nspawn_common\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
            "and m.split('.')[0] not in ('pdkit', 'pdkit_nspawn_machine_state', '__main__'))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
