"""Issue 32: what the pinned SGLang releases check on their server arguments at start.

pdkit/data/startup_checks.json is generated from the wheels' sources in the contract
virtualenvs (python -m pdkit.startchecks --write); the first test regenerates it and fails on
any difference. Every row must be covered in pdkit/data/startup_check_coverage.json, by a
validate rule (with a test named here or in tests/test_validate.py) or by a reason it cannot be
checked before start; the cases below are the rules' tests (host, field path, what is valid).
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from pdkit import startchecks
from pdkit.cli import main
from pdkit.versions import SGLANG_RELEASES
from tests.conftest import REPO, require, write_inventory
from tests.test_validate import assert_validate_refuses

contract = pytest.importorskip("pdkit.contract")


def _engine(hosts, host, i):
    return hosts[host]["pdkit_node"]["engines"][i]


def _pp(hosts, host, i, **extra):
    """Engine I of HOST as one TP rank in 2 pipeline stages on its 2 GPUs."""
    _engine(hosts, host, i).update(pp=2, tp=1, **extra)


def _four_gpu_prefill(hosts, **extra):
    """gpu02's prefill on GPUs 0-3 (TP 4), its decode on 4-5 (the node gets 8 GPUs)."""
    node = hosts["gpu02"]["pdkit_node"]
    node["gpus"] = {**node["gpus"], "count": 8, "numa": [0] * 8}
    _engine(hosts, "gpu02", 0).update(gpus=[0, 1, 2, 3], **extra)
    _engine(hosts, "gpu02", 1).update(gpus=[4, 5])


NO_OVERLAP = {"overlap_schedule": False}
NEXTN = {"speculative": {"algorithm": "NEXTN"}}

# (case id, mutate(cluster, hosts), host, field path, phrase that says what is valid)
# speculative decoding x parallelism (0.5.23 validation_hook.check_pipeline_parallel_compat,
# 0.5.17 server_args.check_server_args, attention-backend compatibility)
SPECULATIVE_PARALLEL_CASES = [
    ("pp-speculative-on-decode", lambda c, h: _pp(h, "gpu01", 1, tuning={**NO_OVERLAP, **NEXTN}),
     "gpu01", "pdkit_node.engines[1].pp", "valid: pp 1 on this engine"),
    ("pp-speculative-on-0517", lambda c, h: c.update(sglang_version="0.5.17") or _pp(h, "gpu02", 0, tuning={**NO_OVERLAP, **NEXTN}),
     "gpu02", "pdkit_node.engines[0].pp", "sglang_version 0.5.23 on a prefill engine"),
    ("pp-speculative-eagle3", lambda c, h: _pp(h, "gpu01", 0, tuning={**NO_OVERLAP, "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/d"}}),
     "gpu01", "pdkit_node.engines[0].tuning.speculative.algorithm", "valid with pp > 1: EAGLE, NEXTN"),
    ("pp-dspark-on-decode", lambda c, h: _pp(h, "gpu02", 1, tuning={**NO_OVERLAP, "speculative": {"algorithm": "DSPARK", "draft_model_path": "/models/d"}}),
     "gpu02", "pdkit_node.engines[1].pp", "DSPARK with pp only on a prefill engine"),
    ("pp-speculative-env-on-pd", lambda c, h: _pp(h, "gpu01", 0, tuning={**NO_OVERLAP, **NEXTN}, env={"SGLANG_ENABLE_PP_SPEC": "1"}),
     "gpu01", "pdkit_node.engines[0].env.SGLANG_ENABLE_PP_SPEC", "valid: remove it"),
    ("pp-with-overlap-schedule", lambda c, h: _pp(h, "gpu01", 0),
     "gpu01", "pdkit_node.engines[0].tuning.overlap_schedule", "valid: overlap_schedule false"),
    ("pp-with-overlap-schedule-from-the-role-layer", lambda c, h: c["tuning"].update(prefill={"overlap_schedule": True}) or _pp(h, "gpu02", 0),
     "gpu02", "pdkit_cluster.tuning.prefill.overlap_schedule", "valid: overlap_schedule false"),
    ("flex-attention-with-speculative", lambda c, h: c["tuning"].update(all=NEXTN) or _engine(h, "gpu01", 1).update(tuning={"attention_backend": "flex_attention"}),
     "gpu01", "pdkit_node.engines[1].tuning.attention_backend", "valid: another attention_backend"),
]

# PD settings against the transfer backend (disaggregation hook: handle_pd_disaggregation)
TRANSFER_BACKEND_CASES = [
    ("fake-backend-with-a-prefill", lambda c, h: c.update(transfer_backend="fake"),
     "gpu01", "pdkit_cluster.transfer_backend", "valid: nixl or mooncake"),
    ("fake-backend-names-every-prefill-host", lambda c, h: c.update(transfer_backend="fake"),
     "gpu02", "pdkit_cluster.transfer_backend", "Prefill server does not support 'fake'"),
    ("fake-backend-on-0517", lambda c, h: c.update(transfer_backend="fake", sglang_version="0.5.17"),
     "gpu02", "pdkit_cluster.transfer_backend", "SGLang 0.5.17 refuses it"),
]

# MoE runner x expert parallelism (handle_moe_kernel_config)
MOE_CASES = [
    ("cutlass-runner-ep-neither-1-nor-tp", lambda c, h: _four_gpu_prefill(h, ep=2, tuning={"moe_runner_backend": "flashinfer_cutlass"}),
     "gpu02", "pdkit_node.engines[0].ep", "valid: ep 1 or ep 4"),
    ("cutedsl-runner-ep-neither-1-nor-tp", lambda c, h: _four_gpu_prefill(h, ep=2, tuning={"moe_runner_backend": "flashinfer_cutedsl"}),
     "gpu02", "pdkit_node.engines[0].ep", "valid: ep 1 or ep 4"),
    ("cutedsl-runner-with-mooncake-a2a", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"moe_runner_backend": "flashinfer_cutedsl", "moe_a2a_backend": "mooncake"}),
     "gpu01", "pdkit_node.engines[0].tuning.moe_a2a_backend", "valid: none, deepep, flashinfer"),
]

# MoE all-to-all backends and quantization against the runner and attention DP (handle_a2a_moe,
# handle_moe_kernel_config), and attention DP's own range (handle_data_parallelism)
A2A_QUANT_CASES = [
    ("pplx-without-attention-dp", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"moe_a2a_backend": "pplx"}),
     "gpu01", "pdkit_node.engines[0].attn_dp", "valid: attn_dp >= 2"),
    ("flashinfer-megamoe-attn-dp-below-tp", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"moe_a2a_backend": "flashinfer_megamoe"}),
     "gpu02", "pdkit_node.engines[1].attn_dp", "valid: attn_dp 2"),
    ("flashinfer-a2a-0517-needs-dp-attention", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu01", 1).update(tuning={"moe_a2a_backend": "flashinfer"}),
     "gpu01", "pdkit_node.engines[1].attn_dp", "valid: attn_dp 2"),
    ("flashinfer-a2a-0517-with-triton-runner", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu01", 1).update(attn_dp=2, tuning={"moe_a2a_backend": "flashinfer", "moe_runner_backend": "triton"}),
     "gpu01", "pdkit_node.engines[1].tuning.moe_runner_backend", "valid: flashinfer_cutlass, flashinfer_cutedsl, flashinfer_trtllm_routed or auto"),
    ("trtllm-routed-runner-with-awq", lambda c, h: c["tuning"].update(all={"moe_runner_backend": "flashinfer_trtllm_routed", "quantization": "awq"}),
     "gpu02", "pdkit_cluster.tuning.all.quantization", "valid: fp8, mxfp8"),
    ("nvfp4-online-with-triton-runner", lambda c, h: _engine(h, "gpu02", 0).update(tuning={"quantization": "nvfp4_online", "moe_runner_backend": "triton"}),
     "gpu02", "pdkit_node.engines[0].tuning.moe_runner_backend", "valid: flashinfer_trtllm"),
    ("cutlass-fp8-with-ep", lambda c, h: _engine(h, "gpu01", 0).update(ep=2, tuning={"quantization": "fp8", "moe_runner_backend": "cutlass"}),
     "gpu01", "pdkit_node.engines[0].ep", "valid: ep 1"),
    ("trtllm-mla-with-fp8-e5m2-kv", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"attention_backend": "trtllm_mla", "kv_cache_dtype": "fp8_e5m2"}),
     "gpu01", "pdkit_node.engines[1].tuning.kv_cache_dtype", "valid: fp8_e4m3, bf16, auto"),
    ("attn-dp-zero", lambda c, h: _engine(h, "gpu01", 1).update(attn_dp=0),
     "gpu01", "pdkit_node.engines[1].attn_dp", "greater than or equal to 1"),
]

DRAFT = {"draft_model_path": "/models/d"}

# each speculative algorithm's handler against attention DP, TP/PP and the attention backend
# (speculative_hook._handle_dflash / _dspark / _eagle_family / _ngram / _uno)
SPECULATIVE_LAYOUT_CASES = [
    ("ngram-with-attention-dp", lambda c, h: _engine(h, "gpu02", 1).update(attn_dp=2, tuning={"speculative": {"algorithm": "NGRAM"}}),
     "gpu02", "pdkit_node.engines[1].attn_dp", "valid: attn_dp 1 for this engine"),
    ("standalone-with-attention-dp", lambda c, h: _engine(h, "gpu01", 1).update(attn_dp=2, tuning={"speculative": {"algorithm": "STANDALONE", **DRAFT}}),
     "gpu01", "pdkit_node.engines[1].attn_dp", "an algorithm that runs with attention DP"),
    ("dflash-with-attention-dp-on-0517", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu01", 1).update(attn_dp=2, tuning={"speculative": {"algorithm": "DFLASH", **DRAFT}}),
     "gpu01", "pdkit_node.engines[1].attn_dp", "valid: attn_dp 1"),
    ("dspark-attention-dp-without-dp-lm-head", lambda c, h: _engine(h, "gpu02", 1).update(attn_dp=2, tuning={"speculative": {"algorithm": "DSPARK", **DRAFT}}),
     "gpu02", "pdkit_node.engines[1].extra_args", "valid: add '--enable-dp-lm-head' to extra_args"),
    ("dflash-with-pp", lambda c, h: _pp(h, "gpu01", 0, tuning={**NO_OVERLAP, "speculative": {"algorithm": "DFLASH", **DRAFT}}),
     "gpu01", "pdkit_node.engines[0].pp", "valid: pp 1"),
    ("uno-with-tp-2", lambda c, h: _engine(h, "gpu01", 1).update(extra_args=["--uno-lora-path", "/models/lora"], tuning={"speculative": {"algorithm": "UNO"}}),
     "gpu01", "pdkit_node.engines[1].tp", "valid: tp 1 and pp 1"),
    ("eagle-tree-on-trtllm-mha", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"attention_backend": "trtllm_mha", "speculative": {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8, **DRAFT}}),
     "gpu01", "pdkit_node.engines[1].tuning.speculative.eagle_topk", "valid: eagle_topk 1"),
    ("dflash-without-draft", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"speculative": {"algorithm": "DFLASH"}}),
     "gpu02", "pdkit_node.engines[1].tuning.speculative", "set draft_model_path"),
]

# settings SGLang takes only on some GPU generations, against the node's declared compute
# capability (the base nodes are H200s, 9.0), and SGLang variables against the transfer backend
GPU_GENERATION_CASES = [
    ("nvfp4-kv-cache-on-hopper", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"kv_cache_dtype": "nvfp4"}),
     "gpu01", "pdkit_node.engines[1].tuning.kv_cache_dtype", "compute capability 10.x / 12.x"),
    ("mxfp8-kv-cache-on-hopper", lambda c, h: c["tuning"].update(decode={"kv_cache_dtype": "mxfp8"}),
     "gpu02", "pdkit_cluster.tuning.decode.kv_cache_dtype", "valid on this GPU: another kv_cache_dtype"),
    ("nvfp4-online-quantization-on-hopper", lambda c, h: _engine(h, "gpu02", 0).update(tuning={"quantization": "nvfp4_online"}),
     "gpu02", "pdkit_node.engines[0].tuning.quantization", "compute capability 10.x"),
    ("trtllm-mla-on-hopper", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"attention_backend": "trtllm_mla"}),
     "gpu01", "pdkit_node.engines[0].tuning.attention_backend", "NVIDIA H200 (compute capability 9.0)"),
    ("flashinfer-megamoe-on-hopper", lambda c, h: _engine(h, "gpu01", 1).update(attn_dp=2, tuning={"moe_a2a_backend": "flashinfer_megamoe"}),
     "gpu01", "pdkit_node.engines[1].tuning.moe_a2a_backend", "FlashInfer MegaMOE currently requires an SM100-family CUDA device"),
    ("staging-buffer-with-fake-backend", lambda c, h: c.update(transfer_backend="fake") or _engine(h, "gpu01", 1).update(env={"SGLANG_DISAGG_STAGING_BUFFER": "1"}),
     "gpu01", "pdkit_node.engines[1].env.SGLANG_DISAGG_STAGING_BUFFER", "valid: remove it, or pdkit_cluster.transfer_backend nixl or mooncake"),
    ("pp-speculative-env-with-attention-dp", lambda c, h: _engine(h, "gpu02", 1).update(role="unified", pp=2, tp=1, attn_dp=2, env={"SGLANG_ENABLE_PP_SPEC": "true"}, tuning={**NO_OVERLAP, **NEXTN}),
     "gpu02", "pdkit_node.engines[1].attn_dp", "valid: attn_dp 1, or remove SGLANG_ENABLE_PP_SPEC"),
    ("pp-dspark-with-pp-spec-env", lambda c, h: _pp(h, "gpu01", 0, env={"SGLANG_ENABLE_PP_SPEC": "yes"}, tuning={**NO_OVERLAP, "speculative": {"algorithm": "DSPARK", **DRAFT}}),
     "gpu01", "pdkit_node.engines[0].env.SGLANG_ENABLE_PP_SPEC", "SGLANG_ENABLE_PP_SPEC does not support DSPARK PD prefill"),
]

STARTUP_CASES = GPU_GENERATION_CASES + SPECULATIVE_PARALLEL_CASES + TRANSFER_BACKEND_CASES + MOE_CASES + A2A_QUANT_CASES + SPECULATIVE_LAYOUT_CASES


@pytest.mark.parametrize("case", STARTUP_CASES, ids=[c[0] for c in STARTUP_CASES])
def test_a_combination_sglang_refuses_at_start_fails_validate(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


@pytest.mark.parametrize("cases", [SPECULATIVE_PARALLEL_CASES, TRANSFER_BACKEND_CASES, MOE_CASES, A2A_QUANT_CASES, SPECULATIVE_LAYOUT_CASES, GPU_GENERATION_CASES],
                         ids=["speculative-parallel", "transfer-backend", "moe", "a2a-quantization", "speculative-layout", "gpu-generation"])
def test_each_class_has_three_cases(cases):
    assert len({c[0] for c in cases}) >= 3 and all(c[4] for c in cases)


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_what_sglang_accepts_passes(version, base, tmp_path, capsys):
    """PP with NEXTN on a prefill engine (0.5.23), overlap schedule off; ep = tp with the cutlass runner."""
    cluster, hosts = base
    cluster["sglang_version"] = version
    _pp(hosts, "gpu01", 0, tuning={**NO_OVERLAP, **(NEXTN if version == "0.5.23" else {})})
    _four_gpu_prefill(hosts, ep=4, tuning={"moe_runner_backend": "flashinfer_cutlass"})
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------ the table


@pytest.mark.contract
def test_the_committed_startup_check_table_is_what_the_pinned_wheels_check():
    missing = [f"sglang-{v}" for v in SGLANG_RELEASES if startchecks.sglang_root(v) is None]
    require(not missing, f"contract virtualenvs missing ({', '.join(missing)}): run `bash .ci/contract-env.sh`")
    fresh = startchecks.generate()
    committed = startchecks.TABLE_PATH.read_text(encoding="utf-8")
    assert startchecks.dumps(fresh) == committed, "pdkit/data/startup_checks.json is stale: run `python -m pdkit.startchecks --write`"
    # checked on the fresh table too: a release bump that adds a check fails here, naming it
    gaps = startchecks.uncovered(fresh)
    assert not gaps, "checks the pinned releases run at start that pdkit/data/startup_check_coverage.json does not cover " \
                     "(add a validate rule and name it, or say why it cannot be checked before start):\n" + \
                     "\n".join(f"{r['id']} ({', '.join(r['releases'])} {r['function']}): {r['message']}" for r in gaps)


def test_the_table_covers_every_pinned_release():
    table = startchecks.table()
    assert sorted(table["releases"]) == sorted(SGLANG_RELEASES)
    for version in SGLANG_RELEASES:
        rows = [r for r in table["checks"] if version in r["releases"]]
        assert rows and len(rows) == table["releases"][version]["checks"], version


def test_every_check_is_covered_by_a_rule_or_a_reason():
    gaps = startchecks.uncovered()
    assert not gaps, "uncovered start checks:\n" + "\n".join(f"{r['id']} ({', '.join(r['releases'])} {r['function']}): {r['message']}" for r in gaps)
    ids = {r["id"] for r in startchecks.table()["checks"]}
    stale = sorted(set(startchecks.coverage()) - ids)
    assert not stale, f"coverage entries for checks no pinned release runs any more: {stale}"


def _validate_case_ids() -> set[str]:
    from tests import test_validate

    ids = {c[0] for c in STARTUP_CASES}
    for value in vars(test_validate).values():  # BAD_CASES, IGNORED_CASES, ...
        if isinstance(value, list) and value and all(isinstance(c, tuple) and c and isinstance(c[0], str) for c in value):
            ids |= {c[0] for c in value}
    return ids


def test_each_rule_names_a_rule_and_a_test_that_exist():
    from pdkit import spec

    cases = _validate_case_ids()
    for rid, entry in startchecks.coverage().items():
        assert ("rule" in entry) != ("why" in entry), f"{rid}: give either rule (+ test) or why: {entry}"
        if "why" in entry:
            assert len(entry["why"]) > 20, f"{rid}: say why it cannot be checked before start"
            continue
        assert entry.get("test") in cases, f"{rid}: rule {entry['rule']!r} names test {entry.get('test')!r}, which is not a case of tests/test_validate.py or tests/test_startchecks.py"
        owner = entry["rule"].split(" ", 1)[0]
        assert owner.startswith("pdkit.spec.") and hasattr(spec, owner.removeprefix("pdkit.spec.").split(".")[0]), entry["rule"]


def test_the_issues_two_examples_are_covered_by_rules():
    """Speculative decoding with pipeline parallelism on a decode engine, and a prefill with the
    'fake' transfer backend: both are rows of the table that a validate rule covers."""
    coverage = startchecks.coverage()
    by_message = {}
    for row in startchecks.table()["checks"]:
        by_message.setdefault(row["message"], []).append(row["id"])
    for message in ("'PP + speculative decoding (MTP) is only supported on prefill nodes (disaggregation-mode=prefill)'",
                    "\"Prefill server does not support 'fake' as the transfer backend\""):
        assert by_message.get(message), message
        assert all("rule" in coverage[rid] for rid in by_message[message]), message
