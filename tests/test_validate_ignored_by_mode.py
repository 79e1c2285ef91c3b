"""Issue 32, second pass, class 4: a field the chosen mode ignores warns (an error under
--strict), from one table (pdkit.spec.IGNORED_BY_MODE)."""

from __future__ import annotations

import glob

import pytest
from pydantic import BaseModel

from pdkit.cli import main
from pdkit.inventory.loader import load_with_problems
from pdkit.spec.ignored import IGNORED_BY_MODE
from pdkit.spec.models import Cluster, Node
from tests.conftest import write_inventory


def _provided(**fields):
    def mutate(c, h):
        h["gpu01"]["pdkit_node"].update(nvidia_stack="provided", **fields)
    return mutate


def _lab(**fields):
    def mutate(c, h):
        h["gpu02"]["pdkit_node"].update(gpu="none", **fields)
    return mutate


def _unified(c, h):
    for name in ("gpu01", "gpu02"):
        h[name]["pdkit_node"]["engines"] = [{"name": "u", "role": "unified", "gpus": [0, 1], "port": 30000}]
    h["gpu01"]["pdkit_router"] = {"workers": ["gpu01/u", "gpu02/u"]}


IGNORED_CASES = [
    # nvidia_stack: provided
    ("provided-stack-with-driver-modules", _provided(driver_modules="ubuntu-prebuilt"), "gpu01", "pdkit_node.driver_modules", "the machine brings the NVIDIA stack"),
    ("provided-stack-with-reboot", _provided(reboot="when-drained"), "gpu01", "pdkit_node.reboot", "remove reboot"),
    ("provided-stack-with-default-modules-given", _provided(driver_modules="nvidia-dkms"), "gpu01", "pdkit_node.driver_modules", "ignored (nvidia_stack: provided)"),
    # gpu: none
    ("lab-host-with-nvidia-stack", _lab(nvidia_stack="provided"), "gpu02", "pdkit_node.nvidia_stack", "ignored (gpu: none)"),
    ("lab-host-with-driver-modules", _lab(driver_modules="ubuntu-prebuilt"), "gpu02", "pdkit_node.driver_modules", "no driver checks"),
    ("lab-host-with-reboot", _lab(reboot="when-drained"), "gpu02", "pdkit_node.reboot", "remove reboot"),
    # sim engine
    ("sim-with-nccl-p2p-level", lambda c, h: c.update(engine="sim") or h["gpu01"]["pdkit_node"].update(nccl_profile="pcie", nccl_p2p_level="SYS"), "gpu01", "pdkit_node.nccl_p2p_level", "the sim runs no NCCL"),
    ("sim-with-trust-remote-code", lambda c, h: c.update(engine="sim") or c["model"].update(trust_remote_code=True), "<inventory>", "pdkit_cluster.model.trust_remote_code", "ignored (pdkit_cluster.engine: sim)"),
    # unified vs PD
    ("unified-node-with-ucx-devices", lambda c, h: _unified(c, h) or h["gpu02"]["pdkit_node"].update(ucx_net_devices="mlx5_0:1"), "gpu02", "pdkit_node.ucx_net_devices", "only for NIXL KV transfer"),
    ("mooncake-with-ucx-devices", lambda c, h: c.update(transfer_backend="mooncake") or h["gpu01"]["pdkit_node"].update(ucx_net_devices="mlx5_0:1"), "gpu01", "pdkit_node.ucx_net_devices", "remove ucx_net_devices"),
    ("unified-cluster-with-transfer-backend", lambda c, h: _unified(c, h) or c.update(transfer_backend="mooncake"), "<inventory>", "pdkit_cluster.transfer_backend", "only to prefill and decode engines"),
]


def _run(mutate, base, tmp_path, capsys, *extra):
    cluster, hosts = base
    mutate(cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)
    rc = main(["validate", *extra, str(inv)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out + out.err


@pytest.mark.parametrize("case", IGNORED_CASES, ids=[c[0] for c in IGNORED_CASES])
def test_a_field_the_mode_ignores_warns(case, base, tmp_path, capsys):
    _, mutate, host, field, phrase = case
    rc, out = _run(mutate, base, tmp_path, capsys)
    assert rc == 0, out
    lines = [line for line in out.splitlines() if line.strip().startswith("warning") and f"{host}: {field}:" in line]
    assert lines and any(phrase in line for line in lines), f"no warning {host}: {field} with {phrase!r}:\n{out}"


@pytest.mark.parametrize("case", IGNORED_CASES[::3], ids=[c[0] for c in IGNORED_CASES[::3]])
def test_strict_makes_it_an_error(case, base, tmp_path, capsys):
    _, mutate, host, field, phrase = case
    rc, out = _run(mutate, base, tmp_path, capsys, "--strict")
    assert rc == 2, out
    assert any(line.strip().startswith("error") and f"{host}: {field}:" in line and phrase in line for line in out.splitlines()), out


def test_the_same_fields_where_the_mode_uses_them_do_not_warn(base, tmp_path):
    """driver_modules and reboot on an installing node; ucx_net_devices on a PD node with nixl."""
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"].update(driver_modules="ubuntu-prebuilt", reboot="when-drained", ucx_net_devices="mlx5_0:1")
    spec, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    assert spec is not None
    assert not [str(p) for p in problems if p.message.startswith("ignored (")]


def _model_has(path: str) -> bool:
    section, *names = path.split(".")
    model: type[BaseModel] | None = {"pdkit_cluster": Cluster, "pdkit_node": Node}.get(section)
    for name in names:
        if model is None or name not in model.model_fields:
            return False
        annotation = model.model_fields[name].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return True


def test_every_field_in_the_table_exists_in_the_models():
    paths = [path for row in IGNORED_BY_MODE for path in row.fields]
    assert paths
    assert [p for p in paths if not _model_has(p)] == []
    assert all(row.why and row.mode for row in IGNORED_BY_MODE)


def test_the_table_covers_every_mode_the_issue_names():
    modes = " | ".join(row.mode for row in IGNORED_BY_MODE)
    for mode in ("nvidia_stack: provided", "gpu: none", "engine: sim", "unified"):
        assert mode in modes


@pytest.mark.parametrize("inventory", sorted(glob.glob("inventories/*.py")))
def test_the_example_inventories_set_no_ignored_field(inventory):
    spec, problems = load_with_problems(inventory)
    assert [str(p) for p in problems if p.message.startswith("ignored (")] == []
