"""A provided engine environment on a lab host (issue 22 item 1): `pdkit_node.engine_venv`.

What it needs: the lab (root, `.ci/lab-prereqs.sh`) and what tests/lab/test_sglang_engine.py needs
for SGLang 0.5.23 (its lock's ~4.4 GB of wheels, cached in ${PDKIT_CACHE:-~/.cache/pdkit}/wheelhouse
or fetched once from PyPI on this machine). Cost: one real engine install on lab-mon shared by every
test here, then small deploys (the pdkit-only node venv, the router venv). That install is the one
test_sglang_engine.py's 0.5.23 test made and checked earlier in the session (this module sorts after
it; tests/lab/engine_handover.py), else this module's own (run alone: that module's deploy, ~4 GB
over HTTP from this machine).

1. The module fixture takes real SGLang 0.5.23 on lab-mon, installed with test_sglang_engine's
   inventory and deploy, then removes that cluster's units and config but keeps its venv: that
   venv is the "provided" environment (a vendor image's, as far as pdkit can tell).
2. A derived cluster in its own install and config directories points lab-mon's `engine_venv`
   at it (a unified engine: no KV transfer): the preflight passes and reports the environment,
   the engine unit's ExecStart runs `<that venv>/bin/python -m sglang.launch_server`, pdkit's
   own node venv holds pdkit and no SGLang, and a second run changes nothing.
3. The same environment behind a prefill/decode pair over NIXL: it imports
   `from nixl._api import nixl_agent` (SGLang's own import; pdkit's locks carry the `nixl` meta
   package for it) and the preflight passes.
4. `engine_venv` pointing at a plain `python3 -m venv` made on the host (no sglang): the deploy
   fails before any change, naming the host, the field, the path and the ImportError.

The shared lab cluster is not touched (other directories, lab-mon runs no engine of it).
"""

from __future__ import annotations

import pprint
import re
import shlex
from pathlib import Path

import pytest

from tests.lab import engine_handover as handover
from tests.lab.test_sglang_engine import (
    CONFIG_DIR as ENGINE_CONFIG_DIR,
)
from tests.lab.test_sglang_engine import (
    INSTALL_DIR as ENGINE_INSTALL_DIR,
)
from tests.lab.test_sglang_engine import (
    NOT_STARTED,
    UNITS,
    changed,
    deploy,
    discard_command,
    on_host,
    remove_engine_cluster,
)
from tests.lab.test_sglang_engine import write_inventory as engine_inventory

pytestmark = pytest.mark.lab

INSTALL_DIR = "/opt/pdkit-provided"
CONFIG_DIR = "/etc/pdkit-provided"
# a Python environment without sglang, made on the host by the test
BARE_VENV = "/opt/pdkit-bare-python"
PROVIDED_UNITS = (*UNITS, "pdkit-engine-main.service")
NIXL_IMPORT = "from nixl._api import nixl_agent"


def write_inventory(directory: Path, lab, engine_venv: str, *, pd: bool, name: str) -> Path:
    host = lab.monitoring_host
    if pd:
        engines = [
            {"name": "prefill", "role": "prefill", "gpus": [0], "port": 31000, "bootstrap_port": 8999, "pd_group": "pair"},
            {"name": "decode", "role": "decode", "gpus": [1], "port": 31001, "pd_group": "pair"},
        ]
    else:
        engines = [{"name": "main", "role": "unified", "gpus": [0, 1], "port": 31000}]
    data = {
        **lab.pyinfra_data(host),
        "ssh_strict_host_key_checking": "yes",
        "pdkit_node": {
            "gpu": "none",
            "gpus": {"model": "NVIDIA H200 (lab)", "count": 2, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0]},
            "nccl_profile": "nvlink",
            "engine_venv": engine_venv,
            "engines": engines,
        },
        "pdkit_router": {"port": 8100, "prometheus_port": 29100},
    }
    cluster = {
        "name": "labprovided", "engine": "sglang", "sglang_version": "0.5.23", "transfer_backend": "nixl",
        "model": {"path": "/models/Qwen3-8B", "served_name": "qwen3-8b"},
        "install_dir": INSTALL_DIR, "config_dir": CONFIG_DIR,
        "tuning": {"all": {"context_length": 8192}},
    }
    path = directory / f"{name}.py"
    path.write_text(f"nodes = {pprint.pformat([(host.name, data)])}\nall = ({[host.name]!r}, {pprint.pformat({'pdkit_cluster': cluster})})\n")
    return path


def remove_provided_cluster(lab) -> None:
    units = " ".join(PROVIDED_UNITS)
    paths = " ".join(f"/etc/systemd/system/{u}" for u in PROVIDED_UNITS)
    on_host(lab, f"systemctl disable --now {units} 2>/dev/null; rm -f {paths}; {discard_command(INSTALL_DIR, CONFIG_DIR)}; systemctl daemon-reload",
            timeout=300)


def nothing_changed(lab) -> bool:
    return on_host(lab, f"test -e {INSTALL_DIR} || test -e {CONFIG_DIR} || test -e /etc/systemd/system/pdkit-engine-main.service").returncode != 0


@pytest.fixture(scope="module")
def engine_venv(lab, tmp_path_factory):
    """The real SGLang 0.5.23 venv test_sglang_engine's deploy installs on lab-mon, with that
    cluster's units and config removed (their unit names are this module's too): the one that
    test handed over after its checks passed (tests/lab/engine_handover.py), else a fresh install
    with that test's inventory and deploy."""
    remove_provided_cluster(lab)
    handed = handover.take(handover.VERSION)
    real = on_host(lab, f"readlink -f {ENGINE_INSTALL_DIR}/engine-venv").stdout.strip() if handed else None
    if handed is None or real != handed:
        remove_engine_cluster(lab)
        rc, _, err = deploy(engine_inventory(tmp_path_factory.mktemp("engine"), lab, handover.VERSION))
        assert rc == 0, f"installing the engine venv failed (rc {rc}):\n{err[-5000:]}"
        real = on_host(lab, f"readlink -f {ENGINE_INSTALL_DIR}/engine-venv").stdout.strip()
    assert real.startswith(f"{ENGINE_INSTALL_DIR}/venvs/engine-"), real
    units = " ".join(UNITS)
    paths = " ".join(f"/etc/systemd/system/{u}" for u in UNITS)
    on_host(lab, f"systemctl disable --now {units} 2>/dev/null; rm -f {paths}; rm -rf {ENGINE_CONFIG_DIR}; systemctl daemon-reload", timeout=300)
    yield real
    remove_provided_cluster(lab)
    remove_engine_cluster(lab)
    on_host(lab, discard_command(BARE_VENV))


@pytest.fixture
def clean(lab, engine_venv):
    remove_provided_cluster(lab)
    yield
    remove_provided_cluster(lab)


def test_a_provided_environment_passes_preflight_and_runs_the_engine(lab, tmp_path, engine_venv, clean):
    inventory = write_inventory(tmp_path, lab, engine_venv, pd=False, name="provided_unified")
    rc, results, err = deploy(inventory, timeout=1200)
    assert rc == 0, f"deploy failed (rc {rc}):\n{err[-5000:]}"
    host = lab.monitoring_host.name
    assert f"pdkit preflight {host}: passed" in err, err[-3000:]
    assert f"engine env {engine_venv}/bin/python: python " in err and "sglang 0.5.23" in err, err[-3000:]
    assert f"not starting pdkit-engine-main.service: {NOT_STARTED}" in err, err[-3000:]

    # the engine runs from the provided environment, pdkit's own services from pdkit's node venv
    unit = on_host(lab, "cat /etc/systemd/system/pdkit-engine-main.service").stdout
    assert f"ExecStart={engine_venv}/bin/python -m sglang.launch_server \\" in unit, unit
    exporter = on_host(lab, "cat /etc/systemd/system/pdkit-exporter.service").stdout
    assert f"ExecStart={INSTALL_DIR}/venv/bin/python -m pdkit.exporter" in exporter, exporter

    # pdkit installed itself only: a small node venv, no SGLang in it
    install_ops = [n for n in changed(results) if "| Install node venv" in n]
    assert install_ops, changed(results)
    wheels = int(re.search(r"Install node venv \((\d+) wheels", install_ops[0]).group(1))
    assert wheels < 40, install_ops[0]
    # and no engine environment of its own: the node provides it
    assert not any("Install engine venv" in n for n in changed(results)), changed(results)
    assert on_host(lab, f"test -e {INSTALL_DIR}/engine-venv").returncode != 0
    check = "import importlib.util as u; print(u.find_spec('sglang') is None, u.find_spec('pdkit') is not None)"
    assert on_host(lab, f"{INSTALL_DIR}/venv/bin/python -c {shlex.quote(check)}").stdout.split() == ["True", "True"]

    # and the provided environment's own parser takes the argv the unit runs
    helped = on_host(lab, f"HF_HUB_OFFLINE=1 {engine_venv}/bin/python -m sglang.launch_server --help")
    assert helped.returncode == 0 and "--model-path" in helped.stdout, helped.stderr[-2000:]

    rc, again, err = deploy(inventory, timeout=600)
    assert rc == 0 and not changed(again), f"a second run changed {changed(again)}:\n{err[-2000:]}"


def test_a_pd_pair_on_the_provided_env_passes_the_nixl_check(lab, tmp_path, engine_venv, clean):
    # the environment came from pdkit's own lock, which carries the nixl meta package (SGLang's import)
    imported = on_host(lab, f"{engine_venv}/bin/python -B -c {shlex.quote(NIXL_IMPORT)}")
    assert imported.returncode == 0, f"`{NIXL_IMPORT}` fails in a venv from pdkit's lock: {imported.stderr[-1500:]}"
    inventory = write_inventory(tmp_path, lab, engine_venv, pd=True, name="provided_pd")
    rc, _, err = deploy(inventory, timeout=1200)
    host = lab.monitoring_host.name
    assert rc == 0, f"NIXL imports in {engine_venv} but the deploy failed (rc {rc}):\n{err[-5000:]}"
    assert f"pdkit preflight {host}: passed" in err
    # (an environment without nixl fails before any change: tests/node/test_engine_env.py)


def test_a_python_without_sglang_fails_before_any_change(lab, tmp_path, engine_venv, clean):
    on_host(lab, f"rm -rf {BARE_VENV} && python3 -m venv {BARE_VENV}")
    inventory = write_inventory(tmp_path, lab, BARE_VENV, pd=False, name="provided_bare")
    rc, _, err = deploy(inventory, timeout=600)
    host = lab.monitoring_host.name
    assert rc != 0
    assert f"pdkit preflight {host}: FAILED: 1 error(s)" in err, err[-3000:]
    assert (f"{host}: pdkit_node.engine_venv {BARE_VENV}: `import sglang` failed: ModuleNotFoundError: No module named 'sglang'; "
            "valid: a Python environment whose bin/python imports sglang 0.5.23") in err, err[-3000:]
    assert "Traceback" not in err
    assert nothing_changed(lab), "the host was changed"
