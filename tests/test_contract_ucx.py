"""The UCX variables pdkit renders, against the UCX that the pinned nixl-cu13 wheel bundles.

pdkit/data/ucx_config.json is what that UCX itself prints as its settings and defaults
(pdkit/contract/ucx_config.py, from the wheel .ci/contract-env.sh downloads). UCX only warns about
a variable it does not know, so a renamed or misspelt one would change nothing on a node: every
UCX_* the kit can render must be in the table, and the table must be what the wheel says.
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

import pytest

from pdkit import flags, kvcost
from pdkit.contract import contract_home
from pdkit.contract.ucx_config import ucx_settings
from pdkit.loader import load
from pdkit.versions import NIXL_PACKAGE
from tests.conftest import REPO, require

pytestmark = pytest.mark.contract

TABLE = REPO / "pdkit" / "data" / "ucx_config.json"


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
    assert fresh == _table(), "regenerate: python -m pdkit.contract.ucx_config WHEEL > pdkit/data/ucx_config.json"


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
    m = re.fullmatch(r"(\d+)([kKmMgG]?)[bB]?", size)
    assert m, size
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]


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
