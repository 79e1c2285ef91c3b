"""Issue 46: each architecture derivation pdkit.spec.modelconfig.architecture_problems relies on, found in each pinned
SGLang wheel's source (the contract virtualenvs; read, never imported), so a pin move re-checks it: a derivation
that moved or changed fails here, naming the file and the text that is gone."""

from __future__ import annotations

import ast

import pytest

from pdkit.spec import modelconfig
from pdkit.upstream import startchecks
from pdkit.upstream.versions import SGLANG_RELEASES
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
    # the two sets _mamba_radix_cache_resolution reads (the registry's specs: test_the_linear_attention_registry_...)
    assert modelconfig.MAMBA_RADIX_ARCHS[version] == _set_in(overrides, "_MAMBA_RADIX_CACHE_ARCHS")
    assert modelconfig.MAMBA_EXTRA_BUFFER_ARCHS[version] == _set_in(overrides, "_MAMBA_EXTRA_BUFFER_ARCHS")
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


def _registry_specs(srt) -> dict[str, tuple[bool, bool]]:
    """Every in-tree LinearAttnModelSpec(...) of the wheel (configs/*.py): architecture -> (uses_mamba_radix_cache,
    support_mamba_cache_extra_buffer), with the dataclass's defaults (True, False) where a call leaves them out."""
    defaults = {"uses_mamba_radix_cache": True, "support_mamba_cache_extra_buffer": False}
    found: dict[str, tuple[bool, bool]] = {}
    for path in sorted((srt / "configs").glob("*.py")):
        if path.name == "linear_attn_model_registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LinearAttnModelSpec":
                kw = {k.arg: k.value for k in node.keywords}
                flags = {name: (kw[name].value if name in kw else default) for name, default in defaults.items()}
                for arch in ast.literal_eval(kw["arch_names"]):
                    found[arch] = (flags["uses_mamba_radix_cache"], flags["support_mamba_cache_extra_buffer"])
    return found


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_linear_attention_registry_and_the_strategy_derivation_are_the_wheels(version):
    """Issue 46 item 3: which architectures land on no_buffer is derived from the wheel's two sets and its
    linear-attention registry (not a fixed list): the registry's in-tree specs, the registry's defaults, and the
    auto strategy's condition are read from each wheel."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    assert _registry_specs(srt) == modelconfig.LINEAR_ATTN_REGISTRY[version]
    registry = (srt / "configs/linear_attn_model_registry.py").read_text(encoding="utf-8")
    assert "uses_mamba_radix_cache: bool = True" in registry
    assert "support_mamba_cache_extra_buffer: bool = False" in registry
    overrides = (srt / "arg_groups/overrides.py").read_text(encoding="utf-8")
    resolution = ast.unparse(next(n for n in ast.parse(overrides).body if isinstance(n, ast.FunctionDef)
                                  and n.name == "_mamba_radix_cache_resolution"))
    for text in ("spec is not None and spec.uses_mamba_radix_cache or in_branch",
                 "if view.disable_radix_cache:", "wants_overlap = not view.disable_overlap_schedule",
                 "wants_paging = view.page_size is not None and view.page_size > 1",
                 "if (wants_overlap or wants_paging) and supports_mamba_cache_extra_buffer(",
                 "declared['mamba_radix_cache_strategy'] = 'no_buffer'",
                 "declared['disable_overlap_schedule'] = True",
                 "model_arch == 'GraniteMoeHybridForCausalLM'", "layer_type == 'mamba'"):
        assert text in resolution, f"SGLang {version} _mamba_radix_cache_resolution: {text!r} is gone"
    supports = ast.unparse(next(n for n in ast.parse(overrides).body if isinstance(n, ast.FunctionDef)
                                and n.name == "supports_mamba_cache_extra_buffer"))
    assert "return view.linear_attn_backend == 'triton'" in supports
    # 0.5.23 lets a registry spec opt in to extra_buffer; 0.5.17's check reads the two sets only
    assert ("spec.support_mamba_cache_extra_buffer" in supports) == modelconfig._REGISTRY_OPT_IN[version]
    # the derived no_buffer architectures: every radix-cache user that cannot take extra_buffer
    assert set(modelconfig.no_buffer_archs(version)) == (
        (_set_in(overrides, "_MAMBA_RADIX_CACHE_ARCHS") | {a for a, (u, _) in _registry_specs(srt).items() if u})
        - _set_in(overrides, "_MAMBA_EXTRA_BUFFER_ARCHS")
        - {a for a, (_, x) in _registry_specs(srt).items() if x and modelconfig._REGISTRY_OPT_IN[version]})


def _registered_for(source: str) -> dict[str, ast.FunctionDef]:
    """architecture -> the override function _register_for(...) or register_model_override_predicate(...)
    registers it for (string constants in the decorator, a predicate lambda's included)."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) in (
                        "_register_for", "register_model_override_predicate"):
                    for c in ast.walk(d):
                        if isinstance(c, ast.Constant) and isinstance(c.value, str):
                            out[c.value] = node
    return out


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_architectures_without_a_hybrid_swa_pool_are_the_wheels(version):
    """Issue 46 item 1: the architectures whose override returns disable_hybrid_swa_memory True, and when
    (always, with a sliding_window_pattern, with HiCache), read from each wheel's override registry; the Gemma2/3
    family is not in is_hybrid_swa_model's set either, so no SWA-only rule applies to it."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    files = [srt / "arg_groups/overrides.py", *sorted((srt / "arg_groups/model_overrides").glob("*.py"))]
    found = {}
    for path in files:
        if not path.exists():
            continue
        for arch, fn in _registered_for(path.read_text(encoding="utf-8")).items():
            text = ast.unparse(fn)
            if "disable_hybrid_swa_memory" not in text:
                continue
            found[arch] = ("sliding_window_pattern" if "sliding_window_pattern" in text
                           else "hicache" if "enable_hierarchical_cache" in text else "always")
    assert found == modelconfig.SWA_POOL_OFF[version]
    config = (srt / "configs/model_config.py").read_text(encoding="utf-8")
    hybrid = _function_strings(config, "is_hybrid_swa_model")
    assert not hybrid & set(modelconfig.GEMMA_SLIDING_ARCHS)
    assert "and not self.disable_hybrid_swa_memory" in config
    # hpc_ops refuses a sliding-window layer; the Gemma family's model files give their local layers one
    hpc = (srt / "layers/attention/hpc_ops_backend.py").read_text(encoding="utf-8")
    assert "The hpc_ops attention backend does not support sliding window." in hpc
    for model in ("gemma2.py", "gemma3_causal.py", "gemma3n_causal.py"):
        assert "sliding_window_size=" in (srt / "models" / model).read_text(encoding="utf-8"), model


# release -> (file, text) for the backend a checkpoint's override picks on SM100 (modelconfig.SM100_DEFAULT_BACKEND)
SM100_DEFAULTS = {
    "0.5.17": (("arg_groups/overrides.py", "_gpt_oss_overrides", "server_args.is_attention_backend_not_set()"),
               ("arg_groups/overrides.py", "_olmo2_overrides", "server_args.attention_backend is None")),
    "0.5.23": (("arg_groups/model_overrides/gpt_oss.py", "_gpt_oss_overrides", "is_attention_backend_not_set(cfg)"),
               ("arg_groups/model_overrides/olmo2.py", "_olmo2_overrides", "cfg.attention_backend is None"),
               ("arg_groups/model_overrides/exaone.py", "_exaone_overrides",
                "resolving_view(server_args).attention_backend is None")),
}


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_backend_a_checkpoint_takes_on_sm100_is_the_wheels(version):
    """Issue 46 item 4: GPT-OSS / Olmo2 (/ Exaone4 with a sliding-window pattern in 0.5.23) without an attention
    backend take trtllm_mha on SM100, whose snap then sets the page (pdkit.spec.modelconfig.model_page)."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    seen = set()
    for file, name, unset in SM100_DEFAULTS[version]:
        registered = _registered_for((srt / file).read_text(encoding="utf-8"))
        archs = {a for a, fn in registered.items() if fn.name == name}
        fn = ast.unparse(next(iter(registered[a] for a in archs)))
        assert unset in fn, f"{file} {name}: {unset!r} is gone"
        assert "['attention_backend'] = 'trtllm_mha'" in fn.split("elif")[0], f"{file} {name}: SM100's pick moved"
        for arch in archs:
            backend, reads = modelconfig.SM100_DEFAULT_BACKEND[version][arch]
            assert backend == "trtllm_mha" and reads == ("all" if "not_set" in unset else "main")
        seen |= archs
    assert seen == set(modelconfig.SM100_DEFAULT_BACKEND[version])
