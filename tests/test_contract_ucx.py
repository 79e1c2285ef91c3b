"""The UCX variables pdkit renders, against the UCX that the pinned nixl-cu13 wheel bundles.

pdkit/upstream/data/ucx_config.json is what that UCX itself prints as its settings and defaults
(pdkit/contract/ucx_config.py, from the wheel .ci/contract-env.sh downloads). UCX only warns about
a variable it does not know, so a renamed or misspelt one would change nothing on a node: every
UCX_* the kit can render must be in the table, and the table must be what the wheel says.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from pdkit.contract.ucx_config import ucx_settings
from pdkit.inventory.loader import load
from pdkit.render import flags
from pdkit.spec import kvcost
from pdkit.upstream import ucxcheck
from pdkit.upstream.venvs import contract_home
from pdkit.upstream.versions import NIXL_PACKAGE
from tests.conftest import REPO, require

pytestmark = pytest.mark.contract

TABLE = REPO / "pdkit" / "upstream" / "data" / "ucx_config.json"


def _table() -> dict:
    return json.loads(TABLE.read_text())


def _wheel() -> Path | None:
    name, version = NIXL_PACKAGE
    found = sorted((contract_home() / f"{name}-{version}").glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def test_the_table_is_what_the_pinned_wheels_ucx_prints():
    wheel = _wheel()
    require(wheel is not None, f"no {NIXL_PACKAGE[0]} {NIXL_PACKAGE[1]} wheel under {contract_home()}: run bash .ci/contract-env.sh")
    fresh = ucx_settings(str(wheel))
    assert fresh == _table(), "regenerate: python -m pdkit.contract.ucx_config WHEEL > pdkit/upstream/data/ucx_config.json"


def test_the_table_is_of_the_pinned_nixl():
    name, version = NIXL_PACKAGE
    assert _table()["wheel"].startswith(f"{name.replace('-', '_')}-{version}-")


def _rendered_ucx_variables() -> dict[str, set[str]]:
    """UCX_* name -> where the kit renders it: every example inventory's ucx_env, every KV path profile."""
    found: dict[str, set[str]] = {}
    for inventory in sorted(glob.glob(str(REPO / "inventories" / "*.py"))):
        spec = load(inventory)
        for host in spec.gpu_hosts:
            for name in flags.ucx_env(spec, host):
                found.setdefault(name, set()).add(f"{Path(inventory).name} {host.name}")
    for path in kvcost.KV_PATHS.values():
        for name, _value in path.ucx_env:
            found.setdefault(name, set()).add(f"KV_PATHS[{path.name!r}]")
    return found


def test_every_ucx_variable_the_kit_renders_is_one_ucx_knows():
    rendered = _rendered_ucx_variables()
    # the example inventories exercise both branches of ucx_env and the TCP profile
    assert {"UCX_TLS", "UCX_NET_DEVICES", "UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"} <= set(rendered)
    unknown = {name: sorted(where) for name, where in rendered.items() if name not in _table()["settings"]}
    assert unknown == {}


def _bytes(size: str) -> int:
    parsed = ucxcheck.memunits(size)
    assert isinstance(parsed, int), size
    return parsed


def test_tcp_fragment_sizes_are_larger_than_ucxs_and_tx_fits_rx():
    """UCX refuses a TX segment larger than the RX one (tcp_iface.c); the profile only helps if it
    raises the defaults the table records (8K TX, 64K RX in UCX 1.23)."""
    defaults = _table()["settings"]
    for path in kvcost.KV_PATHS.values():
        env = dict(path.ucx_env)
        if "UCX_TCP_TX_SEG_SIZE" in env or "UCX_TCP_RX_SEG_SIZE" in env:
            tx, rx = _bytes(env["UCX_TCP_TX_SEG_SIZE"]), _bytes(env["UCX_TCP_RX_SEG_SIZE"])
            assert tx <= rx, path.name
            assert tx > _bytes(defaults["UCX_TCP_TX_SEG_SIZE"]), path.name


# the limits pdkit.upstream.ucxcheck.related_problems holds between UCX settings, each case opened by the pinned
# wheel's own UCX (a UCP worker, as NIXL makes one at an engine's start): pdkit must refuse exactly what
# UCX refuses, and pass what it opens (TLS as pdkit renders it for a same-node PD pair)
_TLS = "cuda_ipc,cuda_copy,sm,self,tcp"
UCX_LIMIT_CASES = {
    "defaults": {},
    "tx above rx": {"UCX_TCP_TX_SEG_SIZE": "128K", "UCX_TCP_RX_SEG_SIZE": "64K"},
    "tx equal rx": {"UCX_TCP_TX_SEG_SIZE": "256k", "UCX_TCP_RX_SEG_SIZE": "256kb"},
    "the TCP profile's sizes": {"UCX_TCP_TX_SEG_SIZE": "512K", "UCX_TCP_RX_SEG_SIZE": "1M"},
    "255 retries": {"UCX_TCP_MAX_CONN_RETRIES": "255"},
    "256 retries": {"UCX_TCP_MAX_CONN_RETRIES": "256"},
    "max iov beyond the tx segment": {"UCX_TCP_MAX_IOV": "1000"},
    "max iov inside a raised tx segment": {"UCX_TCP_MAX_IOV": "1000", "UCX_TCP_TX_SEG_SIZE": "16059",
                                           "UCX_TCP_RX_SEG_SIZE": "64K"},
    "max iov one byte short": {"UCX_TCP_MAX_IOV": "1000", "UCX_TCP_TX_SEG_SIZE": "16058"},
    "tiny tx segment": {"UCX_TCP_TX_SEG_SIZE": "16"},
    "rx pair over the chunk": {"UCX_TCP_RX_SEG_SIZE": "67108792"},
    "rx pair filling the chunk": {"UCX_TCP_RX_SEG_SIZE": "67108791"},
    "tx over a small chunk": {"UCX_TCP_TX_SEG_SIZE": "1048436", "UCX_TCP_RX_SEG_SIZE": "4M",
                              "UCX_TCP_TX_MAX_CHUNK_SIZE": "1M"},
    "tx filling a small chunk": {"UCX_TCP_TX_SEG_SIZE": "1048435", "UCX_TCP_RX_SEG_SIZE": "4M",
                                 "UCX_TCP_TX_MAX_CHUNK_SIZE": "1M"},
    "a fraction": {"UCX_TCP_TX_SEG_SIZE": "1.5K"},
    "a space inside": {"UCX_TCP_RX_SEG_SIZE": "64 K"},
    "kib": {"UCX_TCP_RX_SEG_SIZE": "64KiB"},
    "units in any case": {"UCX_TCP_TX_SEG_SIZE": "8Kb", "UCX_TCP_RX_SEG_SIZE": "65536b"},
    "auto tx segment": {"UCX_TCP_TX_SEG_SIZE": "auto"},
    "fifo 3": {"UCX_POSIX_FIFO_SIZE": "3"},
    "fifo 1": {"UCX_SYSV_FIFO_SIZE": "1"},
    "fifo 64": {"UCX_POSIX_FIFO_SIZE": "64", "UCX_SYSV_FIFO_SIZE": "1024"},
    "fifo 3 without sm": {"UCX_TLS": "cuda_ipc,cuda_copy,self,tcp", "UCX_POSIX_FIFO_SIZE": "3"},
    "tx above rx without tcp": {"UCX_TLS": "cuda_ipc,cuda_copy,sm,self", "UCX_TCP_TX_SEG_SIZE": "128K"},
}


def _has_tcp_device() -> bool:
    """UCX's TCP transport opens on an up, non-loopback interface (it skips lo by default)."""
    for dev in Path("/sys/class/net").iterdir():
        if dev.name != "lo" and (dev / "operstate").exists() and (dev / "operstate").read_text().strip() in ("up", "unknown"):
            return True
    return False


@pytest.mark.parametrize("case", sorted(UCX_LIMIT_CASES))
def test_ucx_limits_between_settings_are_the_pinned_ucxs(case, tmp_path_factory):
    import os
    import subprocess
    import sys

    from pdkit.upstream import ucxcheck

    wheel = _wheel()
    require(wheel is not None, f"no {NIXL_PACKAGE[0]} {NIXL_PACKAGE[1]} wheel under {contract_home()}: run bash .ci/contract-env.sh")
    env_case = {"UCX_TLS": _TLS, **UCX_LIMIT_CASES[case]}
    tcp_case = "tcp" in env_case["UCX_TLS"].split(",") and any(k.startswith("UCX_TCP_") for k in env_case)
    if tcp_case and not _has_tcp_device():
        pytest.skip("no up, non-loopback network interface here: UCX opens no TCP transport to judge")
    scratch = tmp_path_factory.getbasetemp() / "ucx-libs"
    scratch.mkdir(exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")} | env_case
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from pdkit.contract.ucx_config import worker_opens; "
         "ok, why = worker_opens(sys.argv[1], sys.argv[2]); print(why); sys.exit(0 if ok else 1)", str(wheel), str(scratch)],
        env=child_env, cwd=REPO, capture_output=True, text=True, timeout=120)
    opens = run.returncode == 0
    predicted = ucxcheck.related_problems(env_case)
    assert opens == (not predicted), (case, predicted, run.stdout[-1500:], run.stderr[-1500:])
