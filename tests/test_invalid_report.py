"""Every command says "the inventory is invalid" the same way (issue 48 item 5: it was printed four ways):
pdkit.inventory.loader.invalid_report, one header and the errors as `pdkit validate` lists them, exit 2, nothing contacted."""

from __future__ import annotations

import copy

import pytest

from pdkit.cli import main
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory

COMMANDS = {
    "validate": [],
    "roll": ["--allow-downtime"],
    "doctor": [],
    "bench": [],
    "stage": ["--source", "/nonexistent-weights"],
}


@pytest.fixture
def bad_inventory(tmp_path):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_node"]["engines"][0]["gpus"] = [7]  # the node declares 4 GPUs
    return str(write_inventory(tmp_path, hosts, cluster))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_reports_an_invalid_inventory_alike(command, bad_inventory, capsys):
    rc = main([command, bad_inventory, *COMMANDS[command]])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2, err
    header = next(i for i, line in enumerate(err) if line.startswith(f"{bad_inventory}: "))
    assert err[header].startswith(f"{bad_inventory}: 1 error(s); nothing was contacted"), err
    assert err[header + 1].startswith("  error   gpu01: pdkit_node.engines[0].gpus: GPU 7 does not exist"), err
