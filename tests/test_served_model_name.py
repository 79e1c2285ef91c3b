"""Requests name the model as the engines serve it (issue 48 item 5: the served name was decided twice)."""

from __future__ import annotations

import copy

import pytest

from pdkit.bench.record import served_model
from pdkit.inventory.loader import load
from pdkit.render.flags import sglang_args
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory


@pytest.mark.parametrize("inventory", ["inventories/cluster.py", "inventories/lab.py"])
def test_bench_requests_carry_the_name_the_engines_serve(inventory):
    spec = load(inventory)
    host, engine = next(iter(spec.engines()))
    argv = sglang_args(spec, host, engine)
    served = argv[argv.index("--served-model-name") + 1]
    assert served_model(spec) == served == spec.cluster.model.name


def test_a_model_path_without_a_served_name_is_served_by_its_last_part(tmp_path):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["model"] = {k: v for k, v in cluster["model"].items() if k != "served_name"}
    spec = load(str(write_inventory(tmp_path, hosts, cluster)))
    assert served_model(spec) == spec.cluster.model.path.rstrip("/").rsplit("/", 1)[-1] != spec.cluster.model.path
