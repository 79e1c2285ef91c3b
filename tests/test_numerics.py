"""Settings that change the answers by design (issue 44 item 3, pdkit/spec/numerics.py): named where
they are set, refused until acknowledged, each rule from the pinned releases' own code."""

from __future__ import annotations

import typing

import pytest

from pdkit.inventory.loader import load_with_problems
from pdkit.spec import numerics
from pdkit.spec.models import ByDesign
from tests.conftest import REPO, write_inventory


def load(tmp_path, cluster, hosts):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load_with_problems(str(write_inventory(tmp_path, hosts, cluster)), cwd=str(REPO))


def by_design(found, severity):
    return [p for p in found if "changes the answers by design" in p.message and p.severity == severity]


def test_the_acknowledgeable_ids_are_the_rules():
    assert set(typing.get_args(ByDesign)) == set(numerics.BY_DESIGN)


@pytest.mark.parametrize("setting,rule,field", [
    (lambda c, h: c["tuning"].setdefault("all", {}).update(kv_cache_dtype="fp8_e4m3"), "kv_cache_quantized",
     "pdkit_cluster.tuning.all.kv_cache_dtype"),
    (lambda c, h: h["gpu01"]["pdkit_node"]["engines"][1].update(
        extra_args=["--speculative-accept-threshold-single", "0.7"]), "speculative_accept_below_1", "extra_args"),
    (lambda c, h: h["gpu01"]["pdkit_node"]["engines"][1].update(
        extra_args=["--speculative-accept-threshold-acc=0.5"]), "speculative_accept_below_1", "extra_args"),
    (lambda c, h: (h["gpu01"]["pdkit_node"].update(nccl_profile="pcie"),
                   h["gpu01"]["pdkit_node"]["engines"][0].update(env={"NCCL_PROTO": "LL,LL128,Simple"})),
     "nccl_ll128_pcie", "env.NCCL_PROTO"),
])
def test_a_setting_that_changes_the_answers_is_refused_until_acknowledged(tmp_path, base, setting, rule, field):
    cluster, hosts = base
    setting(cluster, hosts)
    spec, found = load(tmp_path, cluster, hosts)
    errors = by_design(found, "error")
    assert spec is None and errors, found
    assert all(rule in p.message and p.field.endswith(field) for p in errors), errors
    assert f"pdkit_cluster.answers.acknowledge: [{rule}]" in errors[0].message
    assert {p.host for p in errors} <= {"gpu01", "gpu02"} and "gpu01" in {p.host for p in errors}
    cluster.setdefault("answers", {})["acknowledge"] = [rule]
    spec, found = load(tmp_path / "ack", cluster, hosts)
    assert spec is not None and not by_design(found, "error"), found
    assert by_design(found, "warning") and "acknowledged" in by_design(found, "warning")[0].message


@pytest.mark.parametrize("setting", [
    lambda c, h: c["tuning"].setdefault("all", {}).update(kv_cache_dtype="bf16"),
    lambda c, h: h["gpu01"]["pdkit_node"]["engines"][1].update(extra_args=["--speculative-accept-threshold-single", "1.0"]),
    # LL128 where the node is not on the PCIe profile: NVLink orders it
    lambda c, h: h["gpu01"]["pdkit_node"]["engines"][0].update(env={"NCCL_PROTO": "LL128"}),
])
def test_exact_settings_are_not_named(tmp_path, base, setting):
    cluster, hosts = base
    setting(cluster, hosts)
    spec, found = load(tmp_path, cluster, hosts)
    assert spec is not None and not by_design(found, "error") and not by_design(found, "warning"), found


def test_an_unknown_acknowledgement_is_refused_with_the_valid_ones(tmp_path, base):
    cluster, hosts = base
    cluster["answers"] = {"acknowledge": ["fp8"]}
    spec, found = load(tmp_path, cluster, hosts)
    assert spec is None and any("acknowledge" in p.field and "kv_cache_quantized" in p.message for p in found), found


def test_non_deterministic_kernels_are_named_in_reports_only(tmp_path, base):
    cluster, hosts = base
    spec, found = load(tmp_path, cluster, hosts)
    assert spec is not None
    lines = numerics.labels(spec)
    assert lines and all("--enable-deterministic-inference" in line for line in lines), lines
    hosts["gpu01"]["pdkit_node"]["engines"][0]["extra_args"] = ["--enable-deterministic-inference"]
    spec, _ = load(tmp_path / "det", cluster, hosts)
    assert not any(line.startswith("gpu01/prefill") for line in numerics.labels(spec))
