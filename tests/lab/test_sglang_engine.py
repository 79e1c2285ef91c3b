"""The real engine install on a lab host: `engine: sglang` from the locked wheelhouse, offline.

`pyinfra <inventory> deploy/pd.py` with `engine: sglang` on a `gpu: none` lab host (lab-mon:
no other test runs engines there, and this cluster lives in its own install and config
directories, so the shared lab's cluster is not touched). The host has no package index: the
node fetches the ~4 GB of locked wheels over HTTP from this machine (pip --no-index
--require-hashes), or gets them over SFTP. Then, inside that exact venv on the host:
`python -m sglang.launch_server --help` exits 0, and the argv pdkit rendered for each engine
(release.json on the host) passes SGLang's own parser (pdkit.contract.sglang_argcheck, the
node-side half of the contract test). The engines and the router are laid down but not
started (no GPU), and the deploy output says why. A second run changes nothing (0.5.23's). pip compiled the
site's bytecode (the engine user cannot write it).

One release per test, 0.5.17 and then 0.5.23 (both locks resolve); each cleans up after itself,
except that 0.5.23's venv, once every check of it passed, is handed over to
tests/lab/test_sglang_provided_env_lab.py when that module runs later in the session
(tests/lab/engine_handover.py): one real install instead of two.
"""

from __future__ import annotations

import json
import os
import pprint
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.lab.lifecycle import ssh_run
from pdkit.wheels import wheelhouse
from pdkit.wheels.platforms import KNOWN_PLATFORMS
from tests.conftest import REPO
from tests.lab import engine_handover as handover

pytestmark = pytest.mark.lab

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
INSTALL_DIR = "/opt/pdkit-engine"
CONFIG_DIR = "/etc/pdkit-engine"
UNITS = ("pdkit-engine-prefill.service", "pdkit-engine-decode.service", "pdkit-router.service", "pdkit-exporter.service")
NOT_STARTED = "engine sglang on a gpu: none host (preflight: no GPU)"


def write_inventory(directory: Path, lab, version: str) -> Path:
    host = lab.monitoring_host
    data = {
        **lab.pyinfra_data(host),
        "ssh_strict_host_key_checking": "yes",
        "pdkit_node": {
            "gpu": "none",
            "gpus": {"model": "NVIDIA H200 (lab)", "count": 2, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0]},
            "nccl_profile": "nvlink",
            "engines": [
                {"name": "prefill", "role": "prefill", "gpus": [0], "port": 31000, "bootstrap_port": 8999, "pd_group": "pair"},
                {"name": "decode", "role": "decode", "gpus": [1], "port": 31001, "pd_group": "pair"},
            ],
        },
        "pdkit_router": {"port": 8100, "prometheus_port": 29100},
    }
    cluster = {
        "name": "labengine", "engine": "sglang", "sglang_version": version,
        "model": {"path": "/models/Qwen3-8B", "served_name": "qwen3-8b"},
        "install_dir": INSTALL_DIR, "config_dir": CONFIG_DIR,
        "tuning": {"all": {"context_length": 8192}, "decode": {"cuda_graph": True, "cuda_graph_max_bs": 64}},
    }
    path = directory / f"engine_{version.replace('.', '_')}.py"
    path.write_text(f"nodes = {pprint.pformat([(host.name, data)])}\nall = ({[host.name]!r}, {pprint.pformat({'pdkit_cluster': cluster})})\n")
    return path


def deploy(inventory: Path, timeout: int = 3000) -> tuple[int, dict, str]:
    proc = subprocess.run([PYINFRA, str(inventory), "deploy/pd.py", "-y", "--json"], cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        out = {}
    return proc.returncode, out, proc.stderr


def changed(results: dict) -> list[str]:
    return [op["name"] for op in results.get("results", {}).get("operations", []) if op.get("success")]


def on_host(lab, command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return ssh_run(lab, lab.monitoring_host, command, timeout=timeout)


def discard_command(*paths: str) -> str:
    """Shell that makes PATHS absent at once and frees their space in the background.

    An engine venv is ~9 GB in ~50k files, and the lab's disk is mounted with online discard:
    `rm -rf` of one took 22-38 s of the lab tests' wall time, three times a session. Renamed beside
    itself (one directory, so always a rename, never a copy), a path is gone for every later check;
    the host's systemd removes the renamed trees while the next test runs. A path that cannot be
    renamed is removed in place, as before.
    """
    moves = "; ".join(f"if [ -e {p} ]; then mv -T {p} {p}.discard-$s 2>/dev/null && set -- \"$@\" {p}.discard-$s || rm -rf {p}; fi"
                      for p in paths)
    return (f"set --; s=$(date +%s%N); {moves}; "
            "if [ $# -gt 0 ]; then systemd-run --quiet --no-block --collect rm -rf \"$@\" || rm -rf \"$@\"; fi")


def remove_engine_cluster(lab) -> None:
    units = " ".join(UNITS)
    paths = " ".join(f"/etc/systemd/system/{u}" for u in UNITS)
    on_host(lab, f"systemctl disable --now {units} 2>/dev/null; rm -f {paths}; {discard_command(INSTALL_DIR, CONFIG_DIR)}; systemctl daemon-reload",
            timeout=300)


@pytest.fixture
def clean_engine_host(lab):
    remove_engine_cluster(lab)
    yield
    remove_engine_cluster(lab)


def test_a_wheel_missing_from_the_cache_offline_fails_before_any_host_changes(lab, tmp_path, clean_engine_host):
    inventory = write_inventory(tmp_path, lab, "0.5.23")
    env = {**os.environ, "PDKIT_OFFLINE": "1", "PDKIT_CACHE": str(tmp_path / "empty-cache")}
    proc = subprocess.run([PYINFRA, str(inventory), "deploy/pd.py", "-y"], cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # the node, the package, the cause and the fix, in one message; no traceback
    assert "lab-mon" in out and "offline (PDKIT_OFFLINE)" in out and "sglang==0.5.23" in out and "python -m pdkit.wheels.wheelhouse" in out, out[-3000:]
    assert "No host was changed" in out and "Traceback" not in out, out[-3000:]
    assert on_host(lab, f"test -e {INSTALL_DIR} || test -e {CONFIG_DIR}").returncode != 0, "the host was changed"


@pytest.fixture
def engine_host(lab, version):
    """A clean host before; after, clean again, unless the test handed its venv over (engine_handover)."""
    remove_engine_cluster(lab)
    yield
    if not (version == handover.VERSION and handover.kept(version)):
        remove_engine_cluster(lab)


# 0.5.23 last: its venv is handed over to test_sglang_provided_env_lab.py (tests/lab/engine_handover.py)
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_sglang_installs_offline_from_the_lock_and_its_parser_accepts_the_rendered_argv(lab, tmp_path, engine_host, version, request):
    inventory = write_inventory(tmp_path, lab, version)
    # the host cannot reach a package index: whatever it installs came from this machine
    assert on_host(lab, "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/', timeout=5)\"", timeout=60).returncode != 0

    rc, results, err = deploy(inventory)
    assert rc == 0, f"deploy failed (rc {rc}):\n{err[-5000:]}"
    install_ops = [name for name in changed(results) if "| Install engine venv" in name]
    assert install_ops and "hash-checked" in install_ops[0], changed(results)
    assert "fetched over HTTP from this machine" in install_ops[0], f"expected the HTTP path on the lab: {install_ops}\n{err[-2000:]}"
    for unit in ("pdkit-engine-prefill.service", "pdkit-engine-decode.service"):
        assert f"not starting {unit}: {NOT_STARTED}" in err, err[-3000:]
    assert "not starting pdkit-router.service" in err

    # pip compiled the site as it installed it (issue 45 item 6): the engine user cannot write the
    # venv, so a site without bytecode would compile every module at every engine start. Checked
    # before anything here imports sglang (an import as root would write the .pyc itself)
    # the venv's real lib/ (engine-venv is a link, and a venv's lib64 links to lib: no path counted twice)
    site = f"$(readlink -f {INSTALL_DIR}/engine-venv)/lib"
    pyc = on_host(lab, f"find {site} -path '*/site-packages/sglang/srt/__pycache__/server_args.cpython-*.pyc' | wc -l; "
                       f"find {site} -path '*/site-packages/sglang/*' -name '*.py' | wc -l; "
                       f"find {site} -path '*/site-packages/sglang/*' -name '*.pyc' | wc -l")
    has_server_args, py_files, pyc_files = (int(n) for n in pyc.stdout.split())
    assert has_server_args == 1 and py_files > 1000 and pyc_files >= 0.9 * py_files, pyc.stdout + pyc.stderr

    # the engines run from the engine environment (issue 30 item 3), identified by the lock alone: its
    # bundle marker is the lock's bundle digest; pdkit's node venv holds pdkit and no SGLang, and the
    # engine environment no pdkit
    venv = f"{INSTALL_DIR}/engine-venv"
    platform = KNOWN_PLATFORMS["debian12"]
    digest = wheelhouse.engine_bundle(platform, "sglang", version).digest
    assert on_host(lab, f"ls -A {venv}/").stdout.split().count(f".pdkit-bundle-{digest[:16]}") == 1
    unit = on_host(lab, "cat /etc/systemd/system/pdkit-engine-decode.service").stdout
    assert f"ExecStart={venv}/bin/python -m sglang.launch_server \\" in unit, unit
    split = on_host(lab, f"{INSTALL_DIR}/venv/bin/python -c 'import importlib.util as u; print(u.find_spec(\"sglang\") is None)';"
                         f" {venv}/bin/python -c 'import importlib.util as u; print(u.find_spec(\"pdkit\") is None)'")
    assert split.stdout.split() == ["True", "True"], split.stdout + split.stderr
    pins = on_host(lab, f"{venv}/bin/python -c 'import importlib.metadata as m; print(m.version(\"sglang\"), m.version(\"nixl-cu13\"), m.version(\"torch\"))'")
    assert pins.returncode == 0 and pins.stdout.split()[:2] == [version, "1.5.1"], pins.stdout + pins.stderr

    helped = on_host(lab, f"HF_HUB_OFFLINE=1 {venv}/bin/python -m sglang.launch_server --help")
    assert helped.returncode == 0, f"launch_server --help failed in the host's venv:\n{helped.stderr[-3000:]}"
    assert "--model-path" in helped.stdout

    release = json.loads(on_host(lab, f"cat {CONFIG_DIR}/release.json").stdout)
    argvs = {name: e["argv"] for name, e in release["engines"].items()}
    assert set(argvs) == {"prefill", "decode"}
    argcheck_request = json.dumps({"argvs": [argvs["prefill"], argvs["decode"], [*argvs["decode"], "--cuda-graph-max-bs-decod", "x"]]})
    # the checker (stdlib only, with its sibling argcheck_common.py) copied from this checkout, run by the engine
    # venv's Python: a control-side contract script, so not in the node wheel (pdkit.wheels.wheelhouse.NODE_SOURCES)
    checker_dir = "/tmp/pdkit-argcheck"
    for name in ("sglang_argcheck.py", "argcheck_common.py"):
        text = (REPO / "pdkit" / "contract" / name).read_text()
        wrote = on_host(lab, f"mkdir -p {checker_dir} && cat > {checker_dir}/{name} <<'PDKIT_EOF'\n{text}\nPDKIT_EOF")
        assert wrote.returncode == 0, wrote.stderr[-2000:]
    checker = f"{checker_dir}/sglang_argcheck.py"
    checked = on_host(lab, f"echo {shlex.quote(argcheck_request)} | HF_HUB_OFFLINE=1 {venv}/bin/python {checker}")
    assert checked.returncode == 0, checked.stderr[-3000:]
    reply = json.loads(checked.stdout)
    assert reply["version"] == version
    prefill, decode, broken = reply["results"]
    assert prefill["ok"] and decode["ok"], reply["results"]
    assert not broken["ok"]  # the same parser on the host does refuse a bad flag

    states = on_host(lab, "systemctl is-active pdkit-engine-prefill pdkit-engine-decode pdkit-router; systemctl is-enabled pdkit-engine-prefill pdkit-engine-decode pdkit-router")
    assert re.findall(r"^(inactive|disabled)$", states.stdout, flags=re.M) == ["inactive"] * 3 + ["disabled"] * 3, states.stdout

    # a second run changes nothing (once: both releases take the same install path; CI's budget)
    if version == "0.5.23":
        rc, again, err = deploy(inventory, timeout=600)
        assert rc == 0 and not changed(again), f"a second run changed {changed(again)}:\n{err[-2000:]}"

    # every check passed: the provided-environment tests later in this session use this venv
    if version == handover.VERSION and handover.wanted(request.session):
        real = on_host(lab, f"readlink -f {venv}").stdout.strip()
        assert real.startswith(f"{INSTALL_DIR}/venvs/engine-"), real
        handover.keep(version, real)
