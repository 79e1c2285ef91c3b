"""Engines sharing a GPU: an explicit, validated spec choice with a deterministic memory split.

SGLang sizes an engine's static pool against the memory free when it starts, so engines on one
GPU must start one after another, each with a fraction of the memory left by the engines
already holding theirs (pdkit.spec.shared_gpu_mem_fraction); the unit orders and gates that.
"""

from __future__ import annotations

import re

import pytest

from pdkit.inventory.loader import load_with_problems
from pdkit.render.plan import plan_host
from tests.conftest import REPO, write_inventory


def problems(tmp_path, cluster, hosts):
    spec, found = load_with_problems(str(write_inventory(tmp_path, hosts, cluster)), cwd=str(REPO))
    return [p for p in found if p.severity == "error"], spec


def one_gpu(base, prefill_share=0.4, decode_share=0.45):
    cluster, hosts = base
    engines = hosts["gpu01"]["pdkit_node"]["engines"]
    engines[0].update(gpus=[0], gpu_share=prefill_share)
    engines[1].update(gpus=[0], gpu_share=decode_share)
    return cluster, hosts


def test_the_one_gpu_tier_inventory_validates_with_cumulative_fractions(monkeypatch):
    monkeypatch.chdir(REPO)
    spec, found = load_with_problems("inventories/h200-1gpu.py", cwd=str(REPO))
    assert spec is not None and not [p for p in found if p.severity == "error"], found
    host = spec.gpu_hosts[0]
    units = {f.path.rsplit("/", 1)[-1]: f.content for f in plan_host(spec, host).files if f.path.endswith(".service")}
    prefill, decode = units["pdkit-engine-prefill.service"], units["pdkit-engine-decode.service"]
    assert "--mem-fraction-static 0.4 " in prefill.replace("\\\n    ", "") + " "
    assert re.search(r"--mem-fraction-static 0\.75\b", decode)
    # the decode starts after the prefill serves and restarts with it; the prefill waits for nobody
    assert "After=pdkit-engine-prefill.service" in decode and "PartOf=pdkit-engine-prefill.service" in decode
    assert re.search(r"ExecStartPre=.*pdkit\.health gates \\\n\s+--http http://127\.0\.0\.1:30000/health 420", decode)
    # the start's bound: the prefill's ready_timeout_s + the GPU-memory wait (pdkit.agent.gpumem) + 60
    assert "TimeoutStartSec=600" in decode
    # the prefill waits for nobody's /health (only for its GPU memory: tests/test_gpumem.py)
    assert "pdkit.agent.health" not in prefill and "PartOf" not in prefill
    # the prefill's crash restart stops this decode (PartOf=): SIGTERM to its server process only,
    # so that SGLang drains instead of losing its schedulers at once (what hung requests on the H200)
    for unit in (prefill, decode):
        assert re.search(r"^KillMode=mixed$", unit, re.M) and re.search(r"^TimeoutStopSec=60$", unit, re.M)


def test_shares_follow_declaration_order(tmp_path, base):
    errors, spec = problems(tmp_path, *one_gpu(base, 0.3, 0.5))
    assert not errors, errors
    from pdkit.spec import shared_gpu_mem_fraction

    host = spec.host("gpu01")
    assert [shared_gpu_mem_fraction(host, e) for e in host.node.engines] == [0.3, round(0.5 / 0.7, 4)]
    # engines alone on their GPUs keep the tuning's fraction (none here)
    other = spec.host("gpu02")
    assert [shared_gpu_mem_fraction(other, e) for e in other.node.engines] == [None, None]


def _assert_problem(errors, host, field, phrase):
    hits = [p for p in errors if p.host == host and p.field == field]
    assert hits, f"no error on {host} {field}: {errors}"
    assert phrase in hits[0].message, hits[0].message


@pytest.mark.parametrize(
    ("mutate", "field", "phrase"),
    [
        # a GPU shared without shares: the old rule, with the way to do it named
        (lambda e: (e[0].update(gpus=[0]), e[1].update(gpus=[0])), "pdkit_node.engines[1].gpus", "each sets gpu_share"),
        (lambda e: (e[0].update(gpus=[0], gpu_share=0.4), e[1].update(gpus=[0])), "pdkit_node.engines[1].gpus", "each sets gpu_share"),
        # sharing engines must list the same GPUs
        (lambda e: (e[0].update(gpus=[0, 1], gpu_share=0.4), e[1].update(gpus=[1, 2], gpu_share=0.4)), "pdkit_node.engines[1].gpus", "must list the same GPUs"),
        # together at most 0.9 of the memory
        (lambda e: (e[0].update(gpus=[0], gpu_share=0.5), e[1].update(gpus=[0], gpu_share=0.5)), "pdkit_node.engines[1].gpu_share", "at most 0.9"),
        # a share on an engine alone on its GPUs
        (lambda e: e[0].update(gpu_share=0.5), "pdkit_node.engines[0].gpu_share", "use tuning.mem_fraction_static"),
        # a share and an explicit fraction contradict each other
        (lambda e: (e[0].update(gpus=[0], gpu_share=0.4), e[1].update(gpus=[0], gpu_share=0.4, tuning={"mem_fraction_static": 0.8})), "pdkit_node.engines[1].tuning.mem_fraction_static", "remove mem_fraction_static"),
    ],
    ids=["no-shares", "one-share", "different-gpu-lists", "over-0.9", "share-without-sharing", "share-and-fraction"],
)
def test_bad_sharing_names_host_field_and_what_is_valid(tmp_path, base, mutate, field, phrase):
    cluster, hosts = base
    mutate(hosts["gpu01"]["pdkit_node"]["engines"])
    errors, _ = problems(tmp_path, cluster, hosts)
    _assert_problem(errors, "gpu01", field, phrase)


def test_an_engine_on_shared_gpus_restarts_only_with_its_whole_group_in_order(tmp_path, base):
    """Restarted alone, a later engine on a shared GPU finds less free memory than at its first start
    (the earlier one's working memory grew with traffic): on the lent H200 the decode's wait for the
    memory its fraction assumes failed and the restore could not bring it back (docs/gpu.md). Any
    change that restarts one engine of the group restarts all of it, so the starts repeat the first."""
    import copy

    from pdkit.agent import changes
    from pdkit.render.plan import services_meta

    pristine = copy.deepcopy(base)
    errors, spec = problems(tmp_path, *one_gpu(base))
    assert not errors, errors
    plan = plan_host(spec, spec.host("gpu01"))
    meta = services_meta(plan.services)
    group = ["pdkit-engine-prefill.service", "pdkit-engine-decode.service"]
    assert meta["pdkit-engine-decode.service"]["share_group"] == group
    running = {u: True for u in meta}
    decode_unit = next(f.path for f in plan.files if f.path.endswith("pdkit-engine-decode.service"))
    decision = changes.decide(meta, {decode_unit}, set(), running)
    assert set(decision.restart) >= set(group), decision
    assert "shares its GPUs with pdkit-engine-decode.service" in decision.why["pdkit-engine-prefill.service"]
    # a decode found down (crashed) starts, and the prefill restarts before it
    decision = changes.decide(meta, set(), set(), {**running, "pdkit-engine-decode.service": False})
    assert decision.start == ["pdkit-engine-decode.service"] and "pdkit-engine-prefill.service" in decision.restart
    # engines on their own GPUs keep the old rule: one changed engine restarts alone
    _, own = problems(tmp_path, *pristine)
    own_plan = plan_host(own, own.host("gpu01"))
    own_meta = services_meta(own_plan.services)
    assert "share_group" not in own_meta["pdkit-engine-decode.service"]
    own_decode = next(f.path for f in own_plan.files if f.path.endswith("pdkit-engine-decode.service"))
    assert changes.decide(own_meta, {own_decode}, set(), {u: True for u in own_meta}).restart == ["pdkit-engine-decode.service"]
