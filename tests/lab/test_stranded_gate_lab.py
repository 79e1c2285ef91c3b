"""A gate started on a lab host over real SSH ends when its control side dies (issue 42 item 4).

The control side is killed with SIGKILL mid-gate, as a killed `pdkit roll` is: (a) pdkit's own
path, pyinfra's API over paramiko (pdkit/roll/pyinfra_api.py run_remote: `sh -c '...'`, stdin
closed at once), and (b) OpenSSH's client running it the way pyinfra runs a command with sudo
(`sudo -H -n sh -c '...'`). The gate waits on a unit that does not exist and a URL that never
answers, with a 600 s timeout. Before pdkit/agent/lifeline.py it went on polling on the host for those
600 s; now nothing of it may be left running within LEFT_WITHIN_S, and the host's journal says why.

The gate runs from this checkout's pdkit (its three modules copied to /tmp on the host) with the
host's python3: a node venv, where one is deployed, holds whatever pdkit deployed it.
"""

from __future__ import annotations

import ast
import io
import signal
import subprocess
import sys
import tarfile
import time
import uuid

import pytest

from pdkit.lab.lifecycle import ssh_argv
from tests.conftest import REPO
from tests.lab.test_roll import ssh

pytestmark = pytest.mark.lab

LEFT_WITHIN_S = 5


def _closure(module: str) -> list[str]:
    """MODULE's file and every pdkit module it imports, transitively (what the gate needs on a host
    without the node venv): read from the sources, so a new import of the gate travels too."""
    found: list[str] = ["pdkit/__init__.py"]
    todo = [module]
    while todo:
        rel = todo.pop()
        if rel in found:
            continue
        found.append(rel)
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{a.name}" for a in node.names] + [node.module]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                path = name.replace(".", "/") + ".py"
                if name.startswith("pdkit.") and (REPO / path).is_file():
                    todo.append(path)
    return found


# `python3 -m pdkit.health` runs the entry path, which runs pdkit/agent/health.py (issue 48)
MODULES = ["pdkit/health.py", *_closure("pdkit/agent/health.py")]

CONTROL = """
import sys
from pdkit.roll.pyinfra_api import patch_gevent
patch_gevent()
from pdkit.roll.pyinfra_api import Pyinfra, run_remote
inventory, name, command = sys.argv[1:4]
state, connected, failed = Pyinfra(inventory).connect([name])
if name not in connected:
    print("FAILED", failed, flush=True)
    sys.exit(2)
print("connected", flush=True)
print(run_remote(connected[name], command, timeout=900), flush=True)
"""


def _upload(lab, host, where: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in MODULES:
            tar.add(REPO / rel, arcname=rel)
    argv = ssh_argv(lab.host(host), lab.ssh_key, lab.known_hosts, f"mkdir -p {where} && tar -x -C {where}")
    done = subprocess.run(argv, input=buf.getvalue(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _left(lab, host: str, token: str) -> list[str]:
    """What of the gate runs on HOST: every live process whose command line holds TOKEN."""
    pattern = f"[{token[0]}]{token[1:]}"  # does not match this ps's own shell
    out = ssh(lab, host, f"ps -eo pid=,stat=,args= | grep -e '{pattern}' | grep -v ' Z' || true").stdout
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def _wait_for(cond, timeout: float, step: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(step)
    return cond()


@pytest.mark.parametrize("control", ["pyinfra", "ssh-sudo"])
def test_a_gate_ends_on_the_host_when_its_control_side_is_killed(lab, tmp_path, control):
    host = next(h.name for h in lab.hosts if h.role == "gpu")
    token = f"stranded-{uuid.uuid4().hex[:12]}"
    where = f"/tmp/pdkit-{token}"
    _upload(lab, host, where)
    gate = (f"cd {where} && python3 -m pdkit.health gates --engine pdkit-{token}.service "
            f"http://127.0.0.1:9/health 600 --http http://127.0.0.1:9/{token} 600")
    if control == "pyinfra":
        inventory = tmp_path / "inventory.py"
        inventory.write_text(f"gpu = [({host!r}, {lab.pyinfra_data(lab.host(host))!r})]\n")
        script = tmp_path / "control.py"
        script.write_text(CONTROL)
        argv = [sys.executable, str(script), str(inventory), host, gate]
    else:
        argv = ssh_argv(lab.host(host), lab.ssh_key, lab.known_hosts, f"sudo -H -n sh -c '{gate}'")
    since = ssh(lab, host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    control_side = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
    try:
        running = _wait_for(lambda: [ln for ln in _left(lab, host, token)
                                     if ln.split(None, 2)[2].startswith("python3 -m pdkit.health")], 60)
        assert running, f"the gate never started on {host}"
        gate_pid = running[0].split()[0]
        time.sleep(1)  # mid-gate: it has polled for a while
        control_side.send_signal(signal.SIGKILL)
        control_side.wait(timeout=10)
        killed = time.monotonic()
        left = _wait_for(lambda: not _left(lab, host, token), LEFT_WITHIN_S)
        assert left, f"{host}: still running {LEFT_WITHIN_S} s after the control side died: {_left(lab, host, token)}"
        took = time.monotonic() - killed
        said = _wait_for(lambda: ssh(lab, host, f"journalctl -q -o cat -t pdkit-lifeline --since '{since}' "
                                                f"| grep 'pid {gate_pid})' || true").stdout.strip(), 10)
        # pyinfra's way (the kit's): the gate itself saw its session go, and says so. Under sudo the
        # command may run on sudo's own pty (Debian's `Defaults use_pty`): sudo then hangs it up
        # when the session goes, which can end it before the watcher's next look; gone is what counts
        if control == "pyinfra":
            assert "the control side went away" in said, f"{host}'s journal says nothing of it"
        print(f"{control}: gone {took:.1f} s after the kill; journal: {said}")
    finally:
        if control_side.poll() is None:
            control_side.kill()
            control_side.wait(timeout=10)
        pids = " ".join(ln.split()[0] for ln in _left(lab, host, token))
        ssh(lab, host, f"{'kill -9 ' + pids + '; ' if pids else ''}rm -rf {where}")
