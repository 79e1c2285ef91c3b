"""Issue 32: what the pinned SGLang releases check on their server arguments at start.

pdkit/upstream/data/startup_checks.json is generated from the wheels' sources in the contract
virtualenvs (python -m pdkit.upstream.startchecks --write); the first test regenerates it and fails on
any difference. Every row must be covered in pdkit/upstream/data/startup_check_coverage.json, by a
validate rule (with a test named here or in tests/test_validate.py) or by a reason it cannot be
checked before start; the cases below are the rules' tests (host, field path, what is valid).
"""

from __future__ import annotations

import copy
import re

import pytest

from pdkit.cli import main
from pdkit.upstream import startchecks
from pdkit.upstream.versions import SGLANG_RELEASES
from tests.conftest import REPO, require, write_inventory
from tests.test_validate import _span, assert_validate_refuses

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


def _blackwell(hosts, host):
    """HOST's GPUs as B200s (compute capability 10.0)."""
    node = hosts[host]["pdkit_node"]
    node["gpus"] = {**node["gpus"], "model": "NVIDIA B200", "memory_gib": 180, "compute_capability": "10.0"}


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
    # found by test_the_never_renders_claims_... review: rows once covered by "fires only with a flag pdkit never renders"
    ("flashinfer-a2a-0523-attn-dp-below-tp", lambda c, h: _engine(h, "gpu02", 1).update(tuning={"moe_a2a_backend": "flashinfer"}),
     "gpu02", "pdkit_node.engines[1].attn_dp", "valid: attn_dp 2"),
    ("deepep-v2-across-nodes", lambda c, h: _span(h, tuning={"moe_a2a_backend": "deepep_v2", "moe_runner_backend": "deep_gemm"}),
     "gpu01", "pdkit_node.engines[1].tuning.moe_a2a_backend", "add ['--deepep-v2-mode', 'hybrid'] to extra_args"),
    ("nvfp4-kv-with-fa3-on-blackwell", lambda c, h: _blackwell(h, "gpu01") or _engine(h, "gpu01", 0).update(tuning={"kv_cache_dtype": "nvfp4", "attention_backend": "fa3"}),
     "gpu01", "pdkit_node.engines[0].tuning.attention_backend", "valid: flashinfer or trtllm_mha"),
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

# the prefix-cache levers against the transfer backend, speculative decoding and the KV dtype
# (handle_pd_disaggregation, handle_speculative_decoding, handle_cache_compatibility, handle_kv4_compatibility)
CACHE_LEVER_CASES = [
    ("hicache-with-radix-cache-off", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"hicache": True, "radix_cache": False}),
     "gpu01", "pdkit_node.engines[0].tuning.hicache", "set one of the two"),
    ("decode-radix-with-fake-backend", lambda c, h: c.update(transfer_backend="fake") or c["tuning"].update(decode={"decode_radix_cache": True}),
     "gpu02", "pdkit_cluster.tuning.decode.decode_radix_cache", "valid: transfer_backend nixl or mooncake"),
    ("decode-radix-with-ngram-on-0523", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"decode_radix_cache": True, "speculative": {"algorithm": "NGRAM"}}),
     "gpu01", "pdkit_node.engines[1].tuning.decode_radix_cache", "valid: speculative algorithm DSPARK, EAGLE, EAGLE3, NEXTN"),
    ("decode-radix-with-nextn-on-0517", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu02", 1).update(tuning={"decode_radix_cache": True, **NEXTN}),
     "gpu02", "pdkit_node.engines[1].tuning.decode_radix_cache", "valid: no tuning.speculative on this decode"),
    ("hicache-with-nvfp4-kv-on-blackwell", lambda c, h: _blackwell(h, "gpu01") or _engine(h, "gpu01", 0).update(tuning={"hicache": True, "kv_cache_dtype": "nvfp4", "attention_backend": "trtllm_mha"}),
     "gpu01", "pdkit_node.engines[0].tuning.hicache", "valid: kv_cache_dtype fp8_e4m3, bf16 or auto with hicache"),
]

STARTUP_CASES = GPU_GENERATION_CASES + SPECULATIVE_PARALLEL_CASES + TRANSFER_BACKEND_CASES + MOE_CASES + A2A_QUANT_CASES + SPECULATIVE_LAYOUT_CASES + CACHE_LEVER_CASES


@pytest.mark.parametrize("case", STARTUP_CASES, ids=[c[0] for c in STARTUP_CASES])
def test_a_combination_sglang_refuses_at_start_fails_validate(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


@pytest.mark.parametrize("cases", [SPECULATIVE_PARALLEL_CASES, TRANSFER_BACKEND_CASES, MOE_CASES, A2A_QUANT_CASES, SPECULATIVE_LAYOUT_CASES, GPU_GENERATION_CASES, CACHE_LEVER_CASES],
                         ids=["speculative-parallel", "transfer-backend", "moe", "a2a-quantization", "speculative-layout", "gpu-generation", "cache-levers"])
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


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
@pytest.mark.parametrize("layer", ["engine", "role", "default"])
def test_pp_with_the_overlap_schedule_left_on_is_valid(version, layer, base, tmp_path, capsys):
    """Issue 46's regression: pp 2 with the overlap schedule on (SGLang's default, or set on the role
    layer or the engine) validates: both pinned releases turn it off themselves for pp > 1 before
    their assert runs (arg_groups/overrides.py _pipeline_parallel_overlap_disable; checked against
    the wheels' source in test_sglang_turns_the_overlap_schedule_off_for_pp_itself)."""
    cluster, hosts = base
    cluster["sglang_version"] = version
    if layer == "role":
        cluster["tuning"].update(prefill={"overlap_schedule": True})
    _pp(hosts, "gpu01", 0, **({"tuning": {"overlap_schedule": True}} if layer == "engine" else {}))
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_sglang_turns_the_overlap_schedule_off_for_pp_itself(version):
    """The derivation the rule above relies on, read from the pinned wheel (its import needs triton,
    which the CPU contract venv lacks): a post-process that sets disable_overlap_schedule under
    pp_size > 1, run by the release's resolution before its checks."""
    import ast

    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    tree = ast.parse((srt / "arg_groups" / "overrides.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_pipeline_parallel_overlap_disable")
    text = ast.unparse(fn)
    assert "view.pp_size > 1" in text and "'disable_overlap_schedule': True" in text, text
    caller = srt / ("server_args.py" if version == "0.5.17" else "arg_groups/pipeline.py")
    assert "run_post_process_pass(self, _pipeline_parallel_overlap_disable)" in caller.read_text() or \
        "run_post_process_pass(server_args, _pipeline_parallel_overlap_disable)" in caller.read_text(), caller


# ------------------------------------------------------------------------------ the table


@pytest.mark.contract
def test_the_committed_startup_check_table_is_what_the_pinned_wheels_check():
    missing = [f"sglang-{v}" for v in SGLANG_RELEASES if startchecks.sglang_root(v) is None]
    require(not missing, f"contract virtualenvs missing ({', '.join(missing)}): run `bash .ci/contract-env.sh`")
    fresh = startchecks.generate()
    committed = startchecks.TABLE_PATH.read_text(encoding="utf-8")
    assert startchecks.dumps(fresh) == committed, "pdkit/upstream/data/startup_checks.json is stale: run `python -m pdkit.upstream.startchecks --write`"
    # checked on the fresh table too: a release bump that adds a check fails here, naming it
    gaps = startchecks.uncovered(fresh)
    assert not gaps, "checks the pinned releases run at start that pdkit/upstream/data/startup_check_coverage.json does not cover " \
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


def _names_a_spec_object(rule: str) -> bool:
    """RULE's owner is `pdkit.spec.<module>.<name>[.<attribute>]`: a function, or a validator or field of a model,
    that a module of pdkit/spec/ defines."""
    import importlib

    parts = rule.split(".")
    for cut in range(len(parts) - 1, 2, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            owner, found = found, getattr(found, name, None)
            if found is None and name in (getattr(owner, "model_fields", None) or {}):
                return parts[:2] == ["pdkit", "spec"]
        return parts[:2] == ["pdkit", "spec"] and callable(found)
    return False


def test_each_rule_names_a_rule_and_a_test_that_exist():
    cases = _validate_case_ids()
    for rid, entry in startchecks.coverage().items():
        assert ("rule" in entry) != ("why" in entry), f"{rid}: give either rule (+ test) or why: {entry}"
        if "why" in entry:
            assert len(entry["why"]) > 20, f"{rid}: say why it cannot be checked before start"
            continue
        assert entry.get("test") in cases, f"{rid}: rule {entry['rule']!r} names test {entry.get('test')!r}, which is not a case of tests/test_validate.py or tests/test_startchecks.py"
        owner = entry["rule"].split(" ", 1)[0]
        assert _names_a_spec_object(owner), entry["rule"]


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


# ------------------------------------------------------------------------------ the "why" claims
# A `why` that says pdkit never renders a flag is a claim about pdkit/render/flags.py: checked here
# against every flag pdkit CAN put on an engine's command line, not only the flags the example
# inventories happen to render.

# a value for every Tuning field that makes pdkit render what the field maps to (a new field
# fails test_every_tuning_field_has_a_probe until it gets one here)
TUNING_PROBES: dict[str, list] = {
    "cuda_graph": [False, True], "prefill_cuda_graph": [False], "cuda_graph_max_bs": [8], "cuda_graph_bs": [[1, 2, 4, 8]],
    "num_continuous_decode_steps": [2], "context_length": [4096], "allow_longer_context": [True], "mem_fraction_static": [0.5],
    "max_running_requests": [8], "max_queued_requests": [8], "chunked_prefill_size": [512], "page_size": [16],
    "overlap_schedule": [False], "torch_compile": [True], "attention_backend": ["fa3"], "sampling_backend": ["pytorch"],
    "moe_runner_backend": ["triton"], "quantization": ["fp8"], "kv_cache_dtype": ["fp8_e4m3"],
    "speculative": [{"algorithm": "EAGLE", "draft_model_path": "/models/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}],
    "custom_all_reduce": ["off"], "pcie_ipc_allreduce": [True], "watchdog_timeout": [60], "enable_metrics": [False, True],
    "decode_log_interval": [10], "log_level": ["info"], "moe_a2a_backend": ["deepep"], "enable_eplb": [True],
    "ep_num_redundant_experts": [4], "radix_cache": [False], "radix_eviction_policy": ["lfu"],
    "decode_radix_cache": [True], "hicache": [True], "hicache_ratio": [2.0], "hicache_size_gb": [8],
}
# Tuning fields that reach the engine's environment, not its argv (pdkit.render.flags.engine_env)
ENV_ONLY_TUNING = {"allow_longer_context", "pcie_ipc_allreduce"}
# engine and model fields, each with a value that makes pdkit render its flag
ENGINE_PROBES: list[dict] = [
    {"dp": 2, "tp": 1}, {"pp": 2, "tp": 1}, {"ep": 2}, {"attn_dp": 2}, {"bootstrap_port": 9000}, {"role": "unified"},
    {"model": {"path": "/models/o", "served_name": "o", "tokenizer_path": "/models/t", "trust_remote_code": True, "load_format": "dummy"}},
]
# fields SGLang resolves from flags pdkit renders: a check on them is reachable from pdkit's argv
# even though pdkit never writes their own flag (0.5.17 server_args.py / 0.5.23 cuda_graph_hook.py
# parse_cuda_graph_config builds cuda_graph_config from --cuda-graph-backend-decode/-prefill,
# --cuda-graph-bs-decode, --cuda-graph-max-bs-decode; 0.5.23 server_args.py derives
# enable_dp_attention from --attn-dp-size)
DERIVED_FROM_RENDERED = {"cuda_graph_config", "enable_dp_attention", "dp_size"}


def _engine_flag_literals() -> set[str]:
    """Every '--flag' string constant in the pdkit/render/flags.py code that builds an engine's argv."""
    import ast

    from pdkit.render import flags

    tree = ast.parse(open(flags.__file__, encoding="utf-8").read())
    engine_code = {"sglang_args", "parallel_args", "expert_args", "_cuda_graph_args", "_VALUE_FLAGS"}
    out: set[str] = set()
    for node in tree.body:
        name = getattr(node, "name", None) or next((t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)), None)
        if name in engine_code:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("--"):
                    out.add(sub.value)
                assert not (isinstance(sub, ast.JoinedStr) and ast.unparse(sub).startswith(("f'--", 'f"--'))), f"{name} builds a flag name at run time: list it here"
    assert len(engine_code) == len({n for n in engine_code if any(getattr(x, "name", None) == n or n in ast.unparse(x)[:40] for x in tree.body)})
    return out


def _argv_flags(spec) -> set[str]:
    from pdkit.render import flags

    out: set[str] = set()
    for host in spec.gpu_hosts:
        for p in spec.placements(host):
            argv = flags.engine_command(spec, p.head, p.engine, p.rank, node=host)
            out |= {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return out


def _base_spec(tmp_path, version):
    from pdkit.inventory.loader import load
    from tests.conftest import BASE_CLUSTER, BASE_HOSTS

    return load(write_inventory(tmp_path, copy.deepcopy(BASE_HOSTS), {**copy.deepcopy(BASE_CLUSTER), "sglang_version": version, "tuning": {}}))


def _probe_specs(tmp_path):
    """(label, tuning field or None, spec): the base inventory with each tuning, engine and model
    probe, per release. Built with model_copy (each field validated by its model, the whole not
    by validate): what pdkit renders for a setting, whatever else validate would say of it."""
    from pdkit.spec.models import Engine
    from pdkit.spec.tuning import RoleTuning, Tuning

    for version in sorted(SGLANG_RELEASES):
        base = _base_spec(tmp_path, version)
        for name, values in TUNING_PROBES.items():
            for value in values:
                tuning = RoleTuning(all=Tuning(**{name: value}))
                yield f"{version} tuning.{name}={value!r}", name, base.model_copy(update={"cluster": base.cluster.model_copy(update={"tuning": tuning})})
        for probe in ENGINE_PROBES:
            hosts = []
            for host in base.hosts:
                if host.node is not None:
                    engines = tuple(Engine(**{**e.model_dump(exclude_unset=True), **probe}) for e in host.node.engines)
                    host = host.model_copy(update={"node": host.node.model_copy(update={"engines": engines})})
                hosts.append(host)
            yield f"{version} engine {probe}", None, base.model_copy(update={"hosts": tuple(hosts)})


def _example_specs():
    from pdkit.inventory.loader import load_with_problems

    for path in sorted((REPO / "inventories").glob("*.py")):
        spec, problems = load_with_problems(path, cwd=str(REPO))
        assert spec is not None, f"{path.name}: {[str(p) for p in problems if p.severity == 'error']}"
        yield path.name, spec


@pytest.fixture(scope="module")
def renderable(tmp_path_factory):
    """(flags, dests): every flag pdkit can render on an engine's argv (the example inventories
    at every pinned release, every flag literal of pdkit/render/flags.py's engine code, and the base
    inventory with each probe) and the server-argument fields they and DERIVED_FROM_RENDERED set."""
    from pdkit.upstream.parsertable import sglang_parser

    tmp = tmp_path_factory.mktemp("probes")
    found = set(_engine_flag_literals())
    for _, spec in _example_specs():
        for version in SGLANG_RELEASES:
            found |= _argv_flags(spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"sglang_version": version})}))
    for _, _, spec in _probe_specs(tmp):
        found |= _argv_flags(spec)
    dests = set(DERIVED_FROM_RENDERED)
    for version in SGLANG_RELEASES:
        parser = sglang_parser(version)
        dests |= {parser.by_flag[f].dest for f in found if f in parser.by_flag}
    return frozenset(found), frozenset(dests)


def test_every_tuning_field_has_a_probe_that_renders_it(tmp_path):
    """A tuning field added without a probe, or one whose probe changes nothing, fails here: the
    claims test must see every flag a tuning field can render."""
    from pdkit.spec import Tuning

    assert set(TUNING_PROBES) == set(Tuning.model_fields), "give every Tuning field a probe in TUNING_PROBES"
    from pdkit.render import flags

    def argvs(spec):
        return [flags.sglang_args(spec, h, e) for h, e in spec.engines()]

    baseline = {v: argvs(_base_spec(tmp_path, v)) for v in SGLANG_RELEASES}
    changed: dict[str, bool] = {}
    for label, name, spec in _probe_specs(tmp_path):
        if name is not None:
            changed[name] = changed.get(name, False) or argvs(spec) != baseline[label.split(" ", 1)[0]]
    silent = sorted(n for n, c in changed.items() if not c and n not in ENV_ONLY_TUNING)
    assert not silent, f"these tuning probes render no flag: give them a value that does, or list them in ENV_ONLY_TUNING: {silent}"


# "--flag" or a "--prefix-*" glob named in a why
_FLAG_IN_WHY = re.compile(r"--[a-z0-9][a-z0-9*-]*")


def never_rendered_claims(why: str) -> list[str]:
    """The flags a `why` says pdkit never renders ([] when it claims no such thing)."""
    if not re.search(r"pdkit (?:never renders|renders neither)", why):
        return []
    fires = re.match(r"fires only with (.*?) away from SGLang's default", why)
    claimed = fires.group(1) if fires else why.split("pdkit never renders")[0].split("pdkit renders neither")[0]
    return sorted(set(_FLAG_IN_WHY.findall(claimed)))


def _rendered(flag: str, flags_: frozenset[str], dests: frozenset[str]) -> list[str]:
    """What of pdkit's renderable set FLAG (a name or a --prefix-* glob) matches."""
    import fnmatch

    from pdkit.upstream.parsertable import sglang_parser

    hits = [f for f in flags_ if fnmatch.fnmatchcase(f, flag)]
    for version in SGLANG_RELEASES:
        parser = sglang_parser(version)
        for name, option in parser.by_flag.items():
            if fnmatch.fnmatchcase(name, flag) and option.dest in dests:
                hits.append(f"{name} (sets {option.dest}, which pdkit's argv sets, SGLang {version})")
        if "*" not in flag and flag not in parser.by_flag and flag[2:].replace("-", "_") in dests:
            hits.append(f"{flag} (field {flag[2:].replace('-', '_')})")
    return sorted(set(hits))


def test_the_never_renders_claims_name_flags_pdkit_cannot_render(renderable):
    flags_, dests = renderable
    rows = {r["id"]: r for r in startchecks.table()["checks"]}
    wrong, checked = [], 0
    for rid, entry in startchecks.coverage().items():
        claims = never_rendered_claims(entry.get("why", ""))
        checked += bool(claims)
        for flag in claims:
            hits = _rendered(flag, flags_, dests)
            if hits:
                wrong.append(f"{rid} ({rows[rid]['function']}): says pdkit never renders {flag}, but it renders {', '.join(hits)}")
        fires = re.match(r"fires only with (.*?) away from SGLang's default", entry.get("why", ""))
        if fires:
            # the drafted family names the row's own fields: a why that drifted from its row fails
            own = {"--" + f.replace("_", "-") for f in rows[rid]["fields"]}
            stray = sorted(set(_FLAG_IN_WHY.findall(fires.group(1))) - own)
            assert not stray, f"{rid}: the why names {stray}, which the row's check does not read ({rows[rid]['fields']})"
    assert checked > 400, checked  # the claims are read: the regexes still match the text
    assert not wrong, "coverage whys that claim pdkit never renders a flag it can render (write a validate rule, or correct the why):\n" + "\n".join(wrong)


@pytest.mark.parametrize("why,flag", [
    ("fires only with --page-size away from SGLang's default: pdkit never renders it, and extra_args ...", "--page-size"),
    ("runs only with --enable-dp-attention, which pdkit never renders", "--enable-dp-attention"),
    ("fires only with --cuda-graph-config away from SGLang's default: pdkit never renders it", "--cuda-graph-config"),
    ("validates --enable-eplb / --mooncake-ib-device lists; pdkit renders neither flag", "--enable-eplb"),
])
def test_the_claims_check_can_fail(why, flag, renderable):
    """A why pointed at a flag pdkit does render (a tuning lever, one only 0.5.17's attention-DP
    spelling renders, a field SGLang builds from pdkit's per-phase graph flags) is caught."""
    assert flag in never_rendered_claims(why)
    assert _rendered(flag, *renderable)


def test_the_claims_check_passes_a_flag_pdkit_never_renders(renderable):
    assert never_rendered_claims("runs only with --enable-lora / --lora-paths, which pdkit never renders") == ["--enable-lora", "--lora-paths"]
    assert not _rendered("--enable-lora", *renderable) and not _rendered("--mamba-*", *renderable)


# ------------------------------------------------------------------------------ extra_args a start check reads
# (case id, mutate, host, field path, phrase): an engine's extra_args setting a field that a start
# check reads and no validate rule covers warns (an error under --strict), quoting SGLang's message
EXTRA_ARGS_START_CHECK_CASES = [
    ("two-batch-overlap-in-extra-args", lambda c, h: _engine(h, "gpu01", 1).update(extra_args=["--enable-two-batch-overlap"]),
     "gpu01", "pdkit_node.engines[1].extra_args", "--enable-two-batch-overlap is read by a check SGLang 0.5.23 runs at start ("),
    ("attn-cp-size-in-extra-args", lambda c, h: _engine(h, "gpu02", 0).update(extra_args=["--attn-cp-size", "2"]),
     "gpu02", "pdkit_node.engines[0].extra_args", "--attn-cp-size is read by a check SGLang 0.5.23 runs at start ("),
    ("enable-lora-in-extra-args-on-0517", lambda c, h: c.update(sglang_version="0.5.17") or _engine(h, "gpu02", 1).update(extra_args=["--enable-lora"]),
     "gpu02", "pdkit_node.engines[1].extra_args", "--enable-lora is read by a check SGLang 0.5.17 runs at start ("),
]


@pytest.mark.parametrize("case", EXTRA_ARGS_START_CHECK_CASES, ids=[c[0] for c in EXTRA_ARGS_START_CHECK_CASES])
def test_extra_args_a_start_check_reads_warn(case, base, tmp_path, capsys):
    from tests.test_validate import test_ignored_setting_warns_and_fails_under_strict

    test_ignored_setting_warns_and_fails_under_strict(case, base, tmp_path, capsys)
    # the message quotes one of SGLang's own for that field, from the table and coverage files
    _, _, _, _, phrase = case
    flag = phrase.split(" ", 1)[0]
    version = phrase.split("SGLang ", 1)[1].split(" ", 1)[0]
    from pdkit.upstream.parsertable import sglang_parser

    dest = sglang_parser(version).by_flag[flag].dest
    rows = [r for r in startchecks.table()["checks"] if version in r["releases"] and dest in r["fields"] and "why" in startchecks.coverage()[r["id"]]]
    assert rows and startchecks.unchecked_fields(version)[dest] in {r["message"] for r in rows}


def test_extra_args_no_start_check_reads_do_not_warn(base, tmp_path, capsys):
    """A flag no start check reads (--enable-dp-lm-head with DSPARK is a rule's, --uno-lora-path none) passes quietly."""
    cluster, hosts = base
    _engine(hosts, "gpu01", 1).update(extra_args=["--skip-server-warmup"])
    inv = write_inventory(tmp_path, hosts, cluster)
    assert "skip_server_warmup" not in startchecks.unchecked_fields("0.5.23")
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err


def test_flags_validates_hints_ask_for_do_not_warn():
    """validate tells users to add some flags to extra_args; the extra_args warning must not then
    warn about them: the exempt set is exactly the flags the hints in pdkit/spec/ name."""
    import re
    from pathlib import Path

    from pdkit.upstream.parsertable import sglang_parser

    source = "".join(p.read_text(encoding="utf-8") for p in sorted(Path(startchecks.__file__).parents[1].joinpath("spec").glob("*.py")))
    hinted = set(re.findall(r"add \[?'(--[a-z0-9-]+)'[^\n]*?to extra_args", source))
    assert {"--enable-dp-lm-head", "--uno-lora-path"} <= hinted
    parser = sglang_parser("0.5.23")
    assert {parser.by_flag[f].dest for f in hinted} == startchecks.RECOMMENDED_BY_VALIDATE
    for version in ("0.5.17", "0.5.23"):
        assert not startchecks.RECOMMENDED_BY_VALIDATE & set(startchecks.unchecked_fields(version))


# ------------------------------------------------------------------------------ SGLang's order (issue 46 item 2)
# what the derivations SGLang runs before a check change (tests/test_startcheck_order.py lists them
# per rule and release, read from the wheels)

EAGLE_TREE = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 4, **DRAFT}

# now refused: the check sees a derived value the flags alone do not show
DERIVED_REFUSED_CASES = [
    # _mla_backend_page_constraints snaps flashmla's page to 64 before _handle_eagle_family checks the tree
    ("eagle-tree-on-a-snapped-page", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"attention_backend": "flashmla", "speculative": EAGLE_TREE}),
     "gpu01", "pdkit_node.engines[1].tuning.speculative.eagle_topk", "as SGLang snaps it for this backend"),
    # _handle_ngram sets eagle_topk to --speculative-ngram-max-bfs-breadth (10) before its tree check
    ("ngram-tree-from-bfs-breadth", lambda c, h: c["tuning"].update(all={"page_size": 16}) or _engine(h, "gpu01", 1).update(tuning={"attention_backend": "fa3", "speculative": {"algorithm": "NGRAM"}}),
     "gpu01", "pdkit_node.engines[1].tuning.speculative", "--speculative-ngram-max-bfs-breadth"),
    # handle_data_parallelism divides chunked_prefill_size by the attention-DP size before check_server_args
    ("chunked-prefill-per-attention-dp-rank", lambda c, h: c["tuning"].update(all={"page_size": 64}, prefill={"chunked_prefill_size": 192}) or _engine(h, "gpu01", 0).update(attn_dp=2),
     "gpu01", "pdkit_node.engines[0].tuning.chunked_prefill_size", "192 / attn_dp 2 = 96"),
    # handle_pd_disaggregation turns the radix cache off on a decode engine before handle_cache_compatibility
    ("hicache-on-a-decode-without-decode-radix", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"hicache": True}),
     "gpu01", "pdkit_node.engines[1].tuning.hicache", "valid: decode_radix_cache: true on this decode"),
    # _attention_backend_fa3_fp8_fallback swaps fa3 for triton with an fp8_e5m2 KV cache before _handle_uno
    ("uno-on-fa3-with-fp8-e5m2-kv", lambda c, h: c["tuning"].update(all={"kv_cache_dtype": "fp8_e5m2"}) or _engine(h, "gpu01", 1).update(gpus=[2], tp=1, extra_args=["--uno-lora-path", "/models/lora"], tuning={"attention_backend": "fa3", "speculative": {"algorithm": "UNO"}}),
     "gpu01", "pdkit_cluster.tuning.all.kv_cache_dtype", "swaps fa3 for triton"),
]


@pytest.mark.parametrize("case", DERIVED_REFUSED_CASES, ids=[c[0] for c in DERIVED_REFUSED_CASES])
def test_a_value_sglang_derives_before_its_check_is_refused(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


# now valid: SGLang's own derivation makes them pass its check
DERIVED_VALID_CASES = [
    # _a2a_ep_size (handle_a2a_moe) sets ep_size = tp_size for deepep before the EPLB assert
    ("eplb-with-deepep-and-no-ep", lambda c, h: _engine(h, "gpu01", 0).update(tuning={"moe_a2a_backend": "deepep", "enable_eplb": True})),
    # DFLASH sets num_steps and topk to 1 itself; its draft tokens are the block size
    ("dflash-draft-tokens-without-steps", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "DFLASH", "num_draft_tokens": 16, **DRAFT}})),
    ("dflash-block-size-16-with-one-step", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "DFLASH", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 16, **DRAFT}})),
    # NGRAM derives num_steps from its draft tokens
    ("ngram-draft-tokens-without-steps", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "NGRAM", "num_draft_tokens": 8}})),
    # check_server_args skips the page multiple on decode engines
    ("chunked-prefill-on-a-decode", lambda c, h: c["tuning"].update(all={"page_size": 64}, decode={"chunked_prefill_size": 100})),
    # 129 / attn_dp 2 = 64 per rank, a multiple of page 64
    ("chunked-prefill-a-page-per-rank", lambda c, h: c["tuning"].update(all={"page_size": 64}) or _engine(h, "gpu01", 0).update(attn_dp=2, tuning={"chunked_prefill_size": 129})),
]


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
@pytest.mark.parametrize("case", DERIVED_VALID_CASES, ids=[c[0] for c in DERIVED_VALID_CASES])
def test_what_sglangs_derivation_makes_valid_passes(case, version, base, tmp_path, capsys):
    cluster, hosts = base
    cluster["sglang_version"] = version
    case[1](cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)
    rc = main(["validate", str(inv)])
    err = capsys.readouterr().err
    assert rc == 0, err


def test_the_megamoe_runner_alias_is_no_flashinfer_a2a_on_0523(base, tmp_path, capsys):
    """0.5.23's handle_moe_runner_backend_alias turns runner megamoe into a2a megamoe (runner auto)
    before handle_a2a_moe: the flashinfer all-to-all's runner and attention-DP rules do not apply."""
    cluster, hosts = base
    _engine(hosts, "gpu01", 1).update(tuning={"moe_runner_backend": "megamoe", "moe_a2a_backend": "flashinfer"})
    inv = write_inventory(tmp_path, hosts, cluster)
    main(["validate", str(inv)])
    err = capsys.readouterr().err
    assert "with moe_a2a_backend flashinfer" not in err and "needs attention DP over every TP rank" not in err, err


# ------------------------------------------------------------------------------ issue 46: the audit's leftovers
from pdkit.spec import pagesize as _pagesize  # noqa: E402
from pdkit.spec.tuning import Tuning as _Tuning  # noqa: E402


def _derived(version="0.5.23", role="prefill", extra=(), env=None, sm=10, mem=80.0, page=1, attn_dp=1, ep=None, **tuning):
    return [(sev, field) for sev, field, _ in startchecks.derivation_problems(
        version, role, _Tuning(**tuning), tuple(extra), env or {}, sm, mem, page, attn_dp, ep)]


def test_tokenspeed_mla_is_judged_as_cutedsl_mla_on_0523():
    # 0.5.23 serving_hook.handle_deprecated_args renames it; cutedsl_mla needs SM100 and snaps the page to 64
    assert _pagesize.effective_page_size("0.5.23", {"attention_backend": ("tokenspeed_mla",)})[0] == 64
    assert _derived(attention_backend="tokenspeed_mla", sm=10) == [("warning", "attention_backend")]
    assert ("error", "attention_backend") in _derived(attention_backend="tokenspeed_mla", sm=12)
    assert ("warning", "kv_cache_dtype") in _derived(attention_backend="tokenspeed_mla", kv_cache_dtype="bf16")
    # 0.5.17 still has tokenspeed_mla as itself (SM100/SM12x): no alias warning there
    assert _derived("0.5.17", attention_backend="tokenspeed_mla", sm=12) == []


def test_flashinfer_a2a_with_the_runner_left_on_auto():
    # both releases refuse a resolved 'auto'; nvfp4_online resolves it to flashinfer_trtllm, which 0.5.17 refuses
    assert _derived("0.5.17", moe_a2a_backend="flashinfer") == [("warning", "moe_runner_backend")]
    assert _derived("0.5.17", moe_a2a_backend="flashinfer", quantization="nvfp4_online") == \
        [("error", "moe_runner_backend")]
    assert _derived("0.5.23", moe_a2a_backend="flashinfer", quantization="nvfp4_online") == []
    assert _derived("0.5.17", moe_a2a_backend="flashinfer", moe_runner_backend="flashinfer_cutlass") == []
    assert _derived("0.5.23", moe_a2a_backend="flashinfer", quantization="modelopt_fp4", sm=12) == []


def test_eagle_topk_1_draft_tokens_are_adjusted_not_refused():
    # speculative_hook._handle_eagle_family (0.5.17 and 0.5.23) sets num_draft_tokens = num_steps + 1 with a warning
    from pdkit.spec.tuning import Speculative
    spec = Speculative.model_construct(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=8,
                                       draft_model_path=None)
    for version in ("0.5.17", "0.5.23"):
        tuning = _Tuning.model_construct(speculative=spec)
        found = startchecks.derivation_problems(version, "decode", tuning, (), {}, 9, 80.0, 1, 1, None)
        assert [(s, f) for s, f, _ in found] == [("warning", "speculative.num_draft_tokens")]
        assert "num_steps + 1 = 4" in found[0][2]
    ok = Speculative.model_construct(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4,
                                     draft_model_path=None)
    assert startchecks.derivation_problems("0.5.23", "decode", _Tuning.model_construct(speculative=ok), (), {}, 9,
                                           80.0, 1, 1, None) == []


def test_an_unset_chunk_is_judged_against_sglang_s_default():
    # handle_gpu_memory_settings: 0.5.17 picks 2048 below 35 GiB, 0.5.23 4096 from 20 GiB; 80 GiB -> 8192
    assert startchecks.default_chunk("0.5.17", 24) == 2048 and startchecks.default_chunk("0.5.23", 24) == 4096
    assert startchecks.default_chunk("0.5.23", 80) == 8192 and startchecks.default_chunk("0.5.23", 192) == 16384
    assert startchecks.default_chunk("0.5.23", None) is None
    assert _derived(page=64, attn_dp=1) == []  # 8192 % 64
    assert _derived(page=64, attn_dp=8, mem=80.0) == []  # 1024 per rank
    assert _derived(page=64, attn_dp=3, mem=80.0) == [("error", "chunked_prefill_size")]  # 2730 per rank
    assert _derived(page=64, attn_dp=3, role="decode") == []  # decode engines skip the check
    assert _derived(page=64, attn_dp=3, mem=None) == []  # memory unknown: no guess
    assert _derived(page=64, attn_dp=3, chunked_prefill_size=-1) == []


def test_sglang_cutlass_moe_in_an_engine_env():
    env = {"SGLANG_CUTLASS_MOE": "1"}
    assert _derived("0.5.17", env=env, quantization="fp8") == []
    assert _derived("0.5.17", env=env, quantization="awq") == [("error", "env.SGLANG_CUTLASS_MOE")]
    assert _derived("0.5.17", env=env) == [("warning", "env.SGLANG_CUTLASS_MOE")]  # the checkpoint's quantization
    assert _derived("0.5.17", env=env, quantization="fp8", ep=2) == [("error", "env.SGLANG_CUTLASS_MOE")]
    assert _derived("0.5.23", env=env, quantization="fp8") == [("warning", "env.SGLANG_CUTLASS_MOE")]
    assert _derived("0.5.17", env={"SGLANG_CUTLASS_MOE": "0"}, quantization="awq") == []


def test_prefill_and_decode_backends_given_in_extra_args():
    same = ("--prefill-attention-backend", "flashinfer", "--decode-attention-backend=flashinfer")
    assert _derived(extra=same, attention_backend="fa3") == [("warning", "attention_backend")]
    assert _derived(extra=same, attention_backend="flashinfer") == []
    assert _derived(extra=same) == []
    # an MLA backend on a GPU that cannot run it, given through extra_args rather than the field
    assert _derived(extra=("--decode-attention-backend", "trtllm_mla"), sm=9) == [("error", "extra_args")]
    assert _derived(extra=("--decode-attention-backend", "trtllm_mla"), sm=12) == []
    for version in ("0.5.17", "0.5.23"):
        assert _derived(version, extra=("--prefill-attention-backend", "cutedsl_mla")) == [("error", "extra_args")]
