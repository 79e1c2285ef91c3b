"""Issue 46: each architecture derivation pdkit.modelconfig.architecture_problems relies on, found in each pinned
SGLang wheel's source (the contract virtualenvs; read, never imported), so a pin move re-checks it: a derivation
that moved or changed fails here, naming the file and the text that is gone."""

from __future__ import annotations

import ast

import pytest

from pdkit import modelconfig, startchecks
from pdkit.versions import SGLANG_RELEASES
from tests.conftest import require

# release -> ((file under sglang/srt, text that must be in it, what pdkit relies on), ...)
DERIVATIONS = {
    "0.5.17": (
        ("server_args.py", "f\"GptOssForCausalLM requires one of {supported_backends} attention backend",
         "GPT-OSS asserts its prefill/decode backends"),
        ("server_args.py", "is required for Llama4 model but got", "Llama4 asserts attention_backend"),
        ("server_args.py", "Gemma4 only supports trtllm_mha, triton, or intel_xpu attention backend", "Gemma4"),
        ("server_args.py", "FlashInfer backend can significantly degrade the performance of Olmo3", "Olmo2"),
        ("server_args.py", "NemotronHForCausalLM does not support triton attention backend", "NemotronH"),
        ("server_args.py", "does not support triton attention backend, \"\n                \"as the first layer", "Lfm2"),
        ("server_args.py", 'accepted_backends = ["fa3", "triton", "trtllm_mha"]', "Exaone4 with sliding windows"),
        ("server_args.py", "Hierarchical cache for MiMoV2 requires the unified", "MiMoV2 HiCache"),
        ("server_args.py", 'assert view.page_size in (1, None), "no_buffer only supports page_size=1."', "no_buffer"),
        ("server_args.py", 'view.attention_backend != "trtllm_mha"\n        ), "no_buffer do not support trtllm_mha',
         "no_buffer refuses trtllm_mha"),
        ("arg_groups/overrides.py", 'overrides["page_size"] = 64\n                logger.warning("Setting page size to 64 '
         'for DeepSeek DSA.")', "DSA forces page 64"),
        ("arg_groups/overrides.py", 'overrides["attention_backend"] = "trtllm_mla"', "DeepSeek-V3 on SM100"),
        ("arg_groups/overrides.py", 'declared["disable_overlap_schedule"] = True', "no_buffer turns overlap off"),
        ("arg_groups/overrides.py", "view.prefill_attention_backend == view.decode_attention_backend",
         "equal prefill/decode backends become attention_backend"),
        ("arg_groups/overrides.py", 'overrides: Dict[str, Any] = {"attention_backend": "dsv4"}\n\n    page_size = 256',
         "DeepSeek-V4 runs on dsv4 with page 256"),
        ("arg_groups/overrides.py", 'assert kv_cache_dtype in [\n        "fp8_e4m3",\n        "bfloat16",\n    ], '
         'f"{kv_cache_dtype} is not supported for {model_arch}"', "DeepSeek-V4's KV dtypes"),
    ),
    "0.5.23": (
        ("arg_groups/model_hook.py", "f\"GptOssForCausalLM requires one of {supported_backends} attention backend",
         "GPT-OSS"),
        ("arg_groups/model_hook.py", "is required for Llama4 model but got", "Llama4"),
        ("arg_groups/model_hook.py", '"Gemma4 only supports trtllm_mha, triton, fa4, ascend, intel_xpu, intel_amx, or "',
         "Gemma4"),
        ("arg_groups/model_hook.py", "FlashInfer backend can significantly degrade the performance of Olmo3", "Olmo2"),
        ("arg_groups/model_hook.py", 'accepted_backends = ["fa3", "triton", "trtllm_mha"]', "Exaone4"),
        ("arg_groups/model_hook.py", "does not support triton attention backend", "Lfm2"),
        ("arg_groups/mamba_hook.py", 'assert view.page_size in (1, None), "no_buffer only supports page_size=1."',
         "no_buffer"),
        ("arg_groups/mamba_hook.py", '"no_buffer do not support trtllm_mha attention backend."', "no_buffer"),
        ("arg_groups/model_overrides/deepseek_v2.py", "page_size = 64 * index_kpool", "DSA page 64 x index_kpool"),
        ("arg_groups/model_overrides/deepseek_v2.py", 'overrides["attention_backend"] = "trtllm_mla"',
         "DeepSeek-V3 on SM100"),
        ("configs/model_config.py", 'return getattr(config, "index_kpool", 1)', "index_kpool's default"),
        ("arg_groups/overrides.py", 'declared["disable_overlap_schedule"] = True', "no_buffer turns overlap off"),
        ("arg_groups/overrides.py", "view.prefill_attention_backend == view.decode_attention_backend",
         "equal prefill/decode backends"),
        ("arg_groups/model_overrides/deepseek_v4.py", 'overrides: Dict[str, Any] = {"attention_backend": "dsv4"}',
         "DeepSeek-V4 runs on dsv4"),
        ("arg_groups/model_overrides/deepseek_v4.py", "    page_size = 256\n", "DeepSeek-V4's page 256"),
        ("arg_groups/overrides.py", 'assert kv_cache_dtype in [\n        "fp8_e4m3",\n        "bfloat16",\n    ], '
         'f"{kv_cache_dtype} is not supported for {model_arch}"', "DeepSeek-V4's KV dtypes"),
    ),
}
# what must be ABSENT from a release (pdkit judges it only where it is)
ABSENT = {
    "0.5.23": (("arg_groups/model_hook.py", "NemotronHForCausalLM does not support triton"),
               ("arg_groups/model_hook.py", "Hierarchical cache for MiMoV2")),
}


def _set_in(source: str, name: str) -> set[str]:
    """The string members of the module-level NAME = frozenset({...}) / tuple in SOURCE."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    raise AssertionError(f"{name} not found")


def _function_strings(source: str, name: str) -> set[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    raise AssertionError(f"{name} not found")


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_each_architecture_derivation_is_in_the_pinned_wheel(version):
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    missing = [f"{f}: {why}: {text!r}" for f, text, why in DERIVATIONS[version]
               if text not in (srt / f).read_text(encoding="utf-8")]
    present = [f"{f}: {text!r}" for f, text in ABSENT.get(version, ()) if text in (srt / f).read_text(encoding="utf-8")]
    assert not missing and not present, f"SGLang {version}: read these again: {missing} {present}"


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_architecture_lists_match_the_pinned_wheel(version):
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    overrides = (srt / "arg_groups/overrides.py").read_text(encoding="utf-8")
    radix, extra = _set_in(overrides, "_MAMBA_RADIX_CACHE_ARCHS"), _set_in(overrides, "_MAMBA_EXTRA_BUFFER_ARCHS")
    # Granite is a mamba model only when its layer_types name one (_mamba_radix_cache_resolution): not judged
    assert set(modelconfig.MAMBA_NO_BUFFER_ARCHS[version]) == radix - extra - {"GraniteMoeHybridForCausalLM"}
    assert set(modelconfig.DSA_ARCHS[version]) == _function_strings(
        (srt / "configs/model_config.py").read_text(encoding="utf-8"), "is_deepseek_dsa") - {"index_topk"}
    family = overrides if version == "0.5.17" else \
        (srt / "arg_groups/model_overrides/deepseek_v2.py").read_text(encoding="utf-8")
    for node in ast.parse(family).body:
        if isinstance(node, ast.FunctionDef) and node.name == "_deepseek_family_overrides":
            listed = {a.value for d in node.decorator_list for a in d.args if isinstance(a, ast.Constant)}
            assert set(modelconfig.DEEPSEEK_FAMILY[version]) == listed
            break
    else:
        raise AssertionError("_deepseek_family_overrides not found")
