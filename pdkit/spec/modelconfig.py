"""What the model's own config.json decides before any engine starts (issue 46 item 4). Pure.

SGLang derives a model's context length from its config.json and refuses a longer `--context-length`
at start unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (0.5.17 and 0.5.23
`sglang/srt/configs/model_config.py` `_derive_context_length`, with `get_context_length` in
`sglang/srt/utils/hf_transformers/common.py`: the first of CONTEXT_LENGTH_KEYS in the text config,
times the rope-scaling factor unless the scaling names `original_max_position_embeddings` or is
`llama3`). `pdkit validate` reads config.json when the model directory is on the deploying machine;
the preflight reads the same keys on the node (roles/node_facts.py's model probe, CONFIG_KEYS); both
judge with `context_problem`, and each says which machine it read.

Where the rule cannot be sure it says nothing: no context key at all (SGLang then assumes 2,048,
but a config that names its length through a transformers attribute map would be misread here),
or a rope scaling whose factor SGLang might apply: the judgement uses the larger figure, so a rule
never refuses what SGLang accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdkit.upstream.parsertable import extra_arg

# sglang/srt/utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS (the same in 0.5.17 and 0.5.23), in order
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
# the sub-configs SGLang takes as the text config of a multimodal checkpoint (get_hf_text_config)
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")
# what the node's probe keeps of config.json (and of each text sub-config): enough for the rules here
# (architecture_problems reads model_type/architectures, DSA's index_topk / index_kpool, MLA's kv_lora_rank,
# Exaone4's sliding_window_pattern, the Gemma family's sliding_window and Granite's layer_types)
CONFIG_KEYS = ("architectures", "rope_scaling", "rope_parameters", *CONTEXT_LENGTH_KEYS, "model_type",
               "kv_lora_rank", "index_topk", "index_kpool", "sliding_window_pattern", "sliding_window", "layer_types")


def trimmed(config: dict[str, Any]) -> dict[str, Any]:
    """CONFIG reduced to CONFIG_KEYS (and its text sub-configs to theirs), as the node's probe sends it."""
    out = {k: config[k] for k in CONFIG_KEYS if k in config}
    for key in TEXT_CONFIG_KEYS:
        if isinstance(config.get(key), dict):
            out[key] = {k: config[key][k] for k in CONFIG_KEYS if k in config[key]}
    return out


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of CONFIG SGLang reads the context length from (get_hf_text_config)."""
    archs = config.get("architectures") or []
    if archs and str(archs[0]).startswith("Llava") and str(archs[0]).endswith("ForCausalLM"):
        return config
    for key in TEXT_CONFIG_KEYS:
        text = config.get(key)
        if isinstance(text, dict):
            return text
    return config


def derived_context_length(config: dict[str, Any]) -> tuple[int, str] | None:
    """(the longest context SGLang allows without the override, the key it came from), or None when
    the config names none of CONTEXT_LENGTH_KEYS. A rope scaling factor counts (the larger figure)."""
    text = text_config(config)
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key)
        if isinstance(value, int) and value > 0:
            factor = 1.0
            for scaling in (text.get("rope_scaling"), text.get("rope_parameters")):
                if isinstance(scaling, dict) and isinstance(scaling.get("factor"), (int, float)):
                    factor = max(factor, float(scaling["factor"]))
            return int(factor * value), key + (f" x rope factor {factor:g}" if factor != 1.0 else "")
    return None


def context_problem(context_length: int | None, allow_longer: bool, config: dict[str, Any], where: str) -> str | None:
    """Why CONTEXT_LENGTH fails the engine's start against CONFIG (read from WHERE), or None."""
    if context_length is None or allow_longer:
        return None
    derived = derived_context_length(config)
    if derived is None or context_length <= derived[0]:
        return None
    return (f"{context_length} is above the model's own context length {derived[0]} ({derived[1]} in {where}): SGLang "
            "refuses to start ('... is greater than the derived context_length', configs/model_config.py); valid: "
            f"at most {derived[0]}, or tuning.allow_longer_context: true (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN; "
            "SGLang warns it may give wrong outputs)")


def read_local(path: str) -> dict[str, Any] | None:
    """The model directory PATH's config.json on this machine, trimmed, or None when it is not here."""
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return trimmed(raw) if isinstance(raw, dict) else None


# ------------------------------------------------------------------------------ architecture-forced settings
# What SGLang decides from the checkpoint's architecture before its start checks, read from both pinned
# releases: 0.5.17 `sglang/srt/server_args.py` ServerArgs._handle_model_specific_adjustments with the
# per-architecture providers of `sglang/srt/arg_groups/overrides.py` (_deepseek_family_overrides,
# _mamba_radix_cache_resolution, ...); 0.5.23 `sglang/srt/arg_groups/model_hook.py`
# handle_model_specific_adjustments with `arg_groups/model_overrides/*.py` and `arg_groups/mamba_hook.py`.
# tests/test_modelconfig_contract.py finds each derivation below in each pinned wheel.


@dataclass(frozen=True)
class EngineFacts:
    """What architecture_problems needs of one engine: its release, role, the tuning it renders and the GPU
    generation its node declares (None: not declared / not an NVIDIA node)."""

    version: str
    role: str = "unified"
    page_size: int | None = None
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None  # from extra_args (pdkit renders no field for it)
    decode_attention_backend: str | None = None  # from extra_args
    radix_cache: bool | None = None
    decode_radix_cache: bool | None = None
    hicache: bool | None = None
    overlap_schedule: bool | None = None
    sm_major: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    kv_cache_dtype: str | None = None
    extra_args: tuple[str, ...] = ()


# The architectures whose checkpoints SGLang treats as DeepSeek Sparse Attention when config.json also names
# index_topk (configs/model_config.py is_deepseek_dsa, per release)
DSA_ARCHS = {
    "0.5.17": ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
               "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
               "GlmMoeDsaForCausalLMNextN", "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN"),
    "0.5.23": ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
               "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
               "GlmMoeDsaForCausalLMNextN", "Glm5NextForConditionalGenerationNextN", "Glm5NextForConditionalGeneration",
               "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM",
               "Dots3NoteForCausalLMNextN", "HYV4ForCausalLM", "HYV4ForCausalLMNextN"),
}
# The architectures _deepseek_family_overrides is registered for (0.5.17 overrides.py / 0.5.23
# model_overrides/deepseek_v2.py): its DSA arm forces the page, its MLA arm (no index_topk) gives trtllm_mla on
# SM100 when no attention backend is given
DEEPSEEK_FAMILY: dict[str, tuple[str, ...]] = {
    "0.5.17": ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
               "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
               "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN"),
}
DEEPSEEK_FAMILY["0.5.23"] = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
                              "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
                              "Glm5NextForConditionalGeneration", "HYV4ForCausalLM", "HYV4ForCausalLMNextN",
                              "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM")
# The attention backends an architecture's start asserts (0.5.17 server_args.py
# _handle_model_specific_adjustments, 0.5.23 arg_groups/model_hook.py handle_model_specific_adjustments):
# arch -> (which backends it reads: "both" = prefill and decode as attention_backends_of resolves them,
# "main" = attention_backend only; allowed (None: any but REFUSED); refused; SGLang's message)
_GPT_OSS = ("triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu", "aiter")
_LLAMA4 = ("fa3", "aiter", "triton", "ascend", "trtllm_mha", "intel_xpu")
BACKEND_ASSERTS: dict[str, dict[str, tuple[str, tuple[str, ...] | None, tuple[str, ...], str]]] = {
    "0.5.17": {
        "GptOssForCausalLM": ("both", _GPT_OSS, (), "GptOssForCausalLM requires one of {allowed} attention backend"),
        "Llama4ForConditionalGeneration": ("main", _LLAMA4, (), "{allowed} is required for Llama4 model"),
        "Llama4ForCausalLM": ("main", _LLAMA4, (), "{allowed} is required for Llama4 model"),
        "Gemma4ForConditionalGeneration": ("both", ("trtllm_mha", "triton", "ascend", "intel_xpu"), (),
                                           "Gemma4 only supports trtllm_mha, triton, or intel_xpu attention backend"),
        "Gemma4ForCausalLM": ("both", ("trtllm_mha", "triton", "ascend", "intel_xpu"), (),
                              "Gemma4 only supports trtllm_mha, triton, or intel_xpu attention backend"),
        "Gemma4UnifiedForConditionalGeneration": ("both", ("trtllm_mha", "triton", "ascend", "intel_xpu"), (),
                                                  "Gemma4 only supports trtllm_mha, triton, or intel_xpu attention "
                                                  "backend"),
        "Olmo2ForCausalLM": ("main", None, ("flashinfer",),
                             "FlashInfer backend can significantly degrade the performance of Olmo3 models."),
        "NemotronHForCausalLM": ("main", None, ("triton",), "NemotronHForCausalLM does not support triton attention "
                                 "backend"),
        "NemotronHPuzzleForCausalLM": ("main", None, ("triton",), "NemotronHForCausalLM does not support triton "
                                       "attention backend"),
        "Lfm2ForCausalLM": ("main", None, ("triton",), "{arch} does not support triton attention backend"),
        "Lfm2MoeForCausalLM": ("main", None, ("triton",), "{arch} does not support triton attention backend"),
    },
}
_GEMMA4_0523 = ("trtllm_mha", "triton", "fa4", "ascend", "intel_xpu", "intel_amx", "aiter")
BACKEND_ASSERTS["0.5.23"] = {
    **{k: v for k, v in BACKEND_ASSERTS["0.5.17"].items() if not k.startswith(("Gemma4", "NemotronH"))},
    **{k: ("both", _GEMMA4_0523, (), "Gemma4 only supports trtllm_mha, triton, fa4, ascend, intel_xpu, intel_amx, or "
           "aiter attention backend")
       for k in ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4UnifiedForConditionalGeneration")},
}
# Exaone4 with a sliding-window pattern in config.json: one of these (both releases)
EXAONE_ARCHS = ("Exaone4ForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM")
EXAONE_BACKENDS = ("fa3", "triton", "trtllm_mha")
# Hybrid linear-attention (mamba) checkpoints, per release (issue 46 item 3). SGLang picks the mamba radix cache's
# buffer strategy in _mamba_radix_cache_resolution (0.5.17 and 0.5.23 arg_groups/overrides.py): a checkpoint
# uses the mamba radix cache when its architecture is in _MAMBA_RADIX_CACHE_ARCHS (GraniteMoeHybrid only when a
# layer_types entry is "mamba") or its linear-attention registry spec (configs/linear_attn_model_registry.py,
# filled by register_linear_attn_model calls in configs/*.py) says uses_mamba_radix_cache; with the radix cache
# on and --mamba-radix-cache-strategy auto it takes extra_buffer when (the overlap schedule is on or page_size > 1)
# and supports_mamba_cache_extra_buffer (the architecture in _MAMBA_EXTRA_BUFFER_ARCHS, or in 0.5.23 a registry
# spec with support_mamba_cache_extra_buffer, and --linear-attn-backend triton), else no_buffer with the overlap
# schedule off. no_buffer then asserts page_size 1 and an attention backend other than trtllm_mha
# (0.5.17 ServerArgs._validate_mamba_no_buffer, 0.5.23 mamba_hook.validate_mamba_no_buffer).
# tests/test_modelconfig_contract.py reads both sets and the registry's specs from each wheel.
MAMBA_RADIX_ARCHS = {
    "0.5.17": frozenset({
        "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "BailingMoeV2_5ForCausalLM",
        "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration", "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM", "FalconH1ForCausalLM", "JetNemotronForCausalLM",
        "JetVLMForConditionalGeneration", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "ZayaForCausalLM"}),
    "0.5.23": frozenset({
        "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "BailingMoeV2_5ForCausalLM",
        "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration", "Qwen3NextForCausalLM",
        "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForCausalLM", "Qwen4ExpForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
        "MiniCPMV4_7ForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
        "NemotronH_Omni_Reasoning_V3", "FalconH1ForCausalLM", "JetNemotronForCausalLM",
        "JetVLMForConditionalGeneration", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "ZayaForCausalLM",
        "Glm5NextForConditionalGeneration"}),
}
MAMBA_EXTRA_BUFFER_ARCHS = {
    "0.5.17": frozenset({
        "KimiLinearForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
        "Qwen3NextForCausalLM", "InternS2PreviewForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
        "BailingMoeV2_5ForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM", "KimiK3ForConditionalGeneration"}),
    "0.5.23": frozenset({
        "KimiLinearForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM", "Qwen4ExpForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
        "MiniCPMV4_7ForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
        "BailingMoeV3VLForConditionalGeneration", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
        "Glm5NextForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
        "NemotronH_Omni_Reasoning_V3", "KimiK3ForConditionalGeneration", "InklingForConditionalGeneration",
        "InklingForConditionalGenerationMTP"}),
}
# The linear-attention registry's in-tree specs: release -> architecture -> (uses_mamba_radix_cache,
# support_mamba_cache_extra_buffer). 0.5.17 registers none in tree; 0.5.23 registers GigaChat 3.5
# (configs/gigachat35.py). 0.5.17's supports_mamba_cache_extra_buffer does not read the spec's opt-in.
LINEAR_ATTN_REGISTRY: dict[str, dict[str, tuple[bool, bool]]] = {
    "0.5.17": {},
    "0.5.23": {"GigaChat35ForCausalLM": (True, False), "GigaChat35ForCausalLMNextN": (True, False)},
}
_REGISTRY_OPT_IN = {"0.5.17": False, "0.5.23": True}  # does supports_mamba_cache_extra_buffer read the spec?
GRANITE_HYBRID = "GraniteMoeHybridForCausalLM"


def uses_mamba_radix_cache(version: str, config: dict[str, Any]) -> bool:
    """Whether SGLang VERSION runs CONFIG's checkpoint with the mamba radix cache (when the radix cache is on)."""
    arch = architecture(config)
    if arch is None:
        return False
    if arch == GRANITE_HYBRID:
        return "mamba" in (text_config(config).get("layer_types") or config.get("layer_types") or [])
    spec = LINEAR_ATTN_REGISTRY.get(version, {}).get(arch)
    return arch in MAMBA_RADIX_ARCHS.get(version, ()) or bool(spec and spec[0])


def extra_buffer_capable(version: str, arch: str) -> bool:
    """supports_mamba_cache_extra_buffer before its --linear-attn-backend triton condition."""
    spec = LINEAR_ATTN_REGISTRY.get(version, {}).get(arch)
    return arch in MAMBA_EXTRA_BUFFER_ARCHS.get(version, ()) or bool(_REGISTRY_OPT_IN[version] and spec and spec[1])


def no_buffer_archs(version: str) -> frozenset[str]:
    """The architectures of VERSION that land on no_buffer whatever the tuning once the radix cache is on: they use
    the mamba radix cache and cannot take extra_buffer (derived from the sets and the registry, never listed)."""
    registry = LINEAR_ATTN_REGISTRY.get(version, {})
    users = set(MAMBA_RADIX_ARCHS.get(version, ())) | {a for a, (uses, _) in registry.items() if uses}
    return frozenset(a for a in users if not extra_buffer_capable(version, a))


MAMBA_NO_BUFFER_ARCHS = {v: tuple(sorted(no_buffer_archs(v))) for v in MAMBA_RADIX_ARCHS}


def mamba_strategy(version: str, config: dict[str, Any], radix_on: bool, overlap_on: bool, page: int | None,
                   extra_args: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """(the mamba radix cache strategy SGLang VERSION runs CONFIG's checkpoint with, why), None when it uses none
    (not a mamba checkpoint, or the radix cache off): _mamba_radix_cache_resolution, both releases."""
    arch = architecture(config) or ""
    if not radix_on or not uses_mamba_radix_cache(version, config):
        return None, "no mamba radix cache"
    given = extra_arg(extra_args, "--mamba-radix-cache-strategy") or "auto"
    if given != "auto":
        return given, f"--mamba-radix-cache-strategy {given}"
    linear = extra_arg(extra_args, "--linear-attn-backend") or "triton"
    capable = extra_buffer_capable(version, arch)
    if (overlap_on or (page is not None and page > 1)) and capable and linear == "triton":
        return "extra_buffer", "auto"
    if not capable:
        return "no_buffer", f"auto: {arch} cannot take extra_buffer"
    if linear != "triton":
        return "no_buffer", f"auto: extra_buffer needs --linear-attn-backend triton, not {linear}"
    return "no_buffer", "auto: the overlap schedule is off and the page is 1"


# MiMoV2 HiCache needs SGLang's unified radix tree (0.5.17 _handle_model_specific_adjustments only)
MIMO_V2_ARCHS = ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM")
_ENV_TRUE = ("true", "1", "yes", "y")


def architecture(config: dict[str, Any]) -> str | None:
    """architectures[0] of config.json, as SGLang reads it (hf_config.architectures[0])."""
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else None


# DeepSeek-V4: SGLang sets attention_backend dsv4 and page_size 256 on CUDA whatever the inventory gives (0.5.17
# arg_groups/overrides.py _deepseek_v4_overrides; 0.5.23 arg_groups/model_overrides/deepseek_v4.py), and asserts
# its KV cache dtype ("auto" becomes fp8_e4m3: _deepseek_v4_kv_cache_dtype, both releases)
DSV4_ARCHS = ("DeepseekV4ForCausalLM",)
DSV4_PAGE = 256
DSV4_BACKEND = "dsv4"
DSV4_KV_DTYPES = ("fp8_e4m3", "bfloat16")


def _resolved_backends(facts: EngineFacts) -> tuple[str | None, str | None, str | None]:
    """(attention_backend, prefill, decode) as SGLang resolves them before the model checks: equal prefill and
    decode backends replace attention_backend (overrides.py _attention_backend_default, both releases), and
    prefill/decode fall back on attention_backend (attention_backends_of)."""
    main = facts.attention_backend
    if facts.prefill_attention_backend is not None and \
            facts.prefill_attention_backend == facts.decode_attention_backend:
        main = facts.prefill_attention_backend
    return main, facts.prefill_attention_backend or main, facts.decode_attention_backend or main


def _overrides_file(version: str, function: str, model: str) -> str:
    """Where SGLang VERSION overrides a model family's settings: 0.5.17's FUNCTION in arg_groups/overrides.py, later
    releases' arg_groups/model_overrides/MODEL.py."""
    return f"arg_groups/overrides.py {function}" if version == "0.5.17" else f"arg_groups/model_overrides/{model}.py"


def architecture_problems(facts: EngineFacts, config: dict[str, Any], source: str) -> list[tuple[str, str, str]]:
    """(severity, tuning field, message) for what SGLang FACTS.version forces or refuses for the checkpoint whose
    config.json is CONFIG (read from SOURCE). Error: SGLang refuses to start. Warning: a setting SGLang silently
    replaces. Pure; the caller names the host and the field's layer."""
    arch = architecture(config)
    if arch is None:
        return []
    version, out = facts.version, []
    _, prefill, decode = _resolved_backends(facts)
    where = "0.5.17 server_args.py _handle_model_specific_adjustments" if version == "0.5.17" else \
        "0.5.23 arg_groups/model_hook.py handle_model_specific_adjustments"
    rule = BACKEND_ASSERTS.get(version, {}).get(arch)
    if rule is not None:
        reads, allowed, refused, says = rule
        # only what the inventory names: an unset backend is SGLang's to fill for this model
        seen = [b for b in ((prefill, decode) if reads == "both" else (facts.attention_backend,)) if b is not None]
        bad = [b for b in seen if (allowed is not None and b not in allowed) or b in refused]
        if bad:
            valid = f"one of {', '.join(allowed)}" if allowed else f"any backend but {', '.join(refused)}"
            out.append(("error", "attention_backend",
                        f"attention backend {bad[0]} for {arch} ({source}): SGLang {version} refuses it at start "
                        f"('{says.format(allowed=list(allowed or ()), arch=arch)}', {where}); valid: {valid}, or "
                        "leave attention_backend unset (SGLang picks one for this model)"))
    given = facts.attention_backend
    if arch in EXAONE_ARCHS and config.get("sliding_window_pattern") is not None and given is not None \
            and given not in EXAONE_BACKENDS:
        out.append(("error", "attention_backend",
                    f"attention_backend {given} for {arch} with sliding_window_pattern ({source}): SGLang {version} "
                    f"refuses it at start ('One of the attention backends in {list(EXAONE_BACKENDS)} is required', "
                    f"{where}); valid: {', '.join(EXAONE_BACKENDS)}"))
    family = arch in DEEPSEEK_FAMILY.get(version, ())
    if family and arch in DSA_ARCHS.get(version, ()) and config.get("index_topk") is not None:
        kpool = config.get("index_kpool", 1) if version != "0.5.17" else 1
        forced = 64 * (kpool if isinstance(kpool, int) and kpool > 0 else 1)
        file = _overrides_file(version, "_deepseek_family_overrides", "deepseek_v2")
        if facts.page_size is not None and facts.page_size != forced:
            out.append(("warning", "page_size",
                        f"page_size {facts.page_size} is replaced: {arch} with index_topk ({source}) is a DeepSeek "
                        f"Sparse Attention checkpoint, and SGLang {version} sets its page size to {forced} on CUDA "
                        f"({file}); every rule and PD pair runs on page {forced}: set page_size {forced} or leave it "
                        "unset"))
    elif family and config.get("index_topk") is None and facts.sm_major == 10 and \
            (facts.attention_backend, facts.prefill_attention_backend, facts.decode_attention_backend) == \
            (None, None, None) and facts.page_size not in (32, 64):
        file = _overrides_file(version, "_deepseek_family_overrides", "deepseek_v2")
        out.append(("warning", "page_size",
                    f"page_size {facts.page_size if facts.page_size is not None else 'unset'} runs as 64: on SM100 "
                    f"SGLang {version} gives {arch} without an attention backend trtllm_mla ({file}), which snaps the "
                    "page to 64 (_mla_backend_page_constraints); a PD peer with another backend or page then no "
                    "longer matches: set page_size 64 (or 32), or the attention_backend on every engine of the pair"))
    if arch in DSV4_ARCHS:
        file = _overrides_file(version, "_deepseek_v4_overrides", "deepseek_v4")
        if facts.page_size is not None and facts.page_size != DSV4_PAGE:
            out.append(("warning", "page_size",
                        f"page_size {facts.page_size} is replaced: SGLang {version} runs {arch} ({source}) on the "
                        f"{DSV4_BACKEND} attention backend with page size {DSV4_PAGE} on CUDA ({file}); every rule "
                        f"and PD pair runs on page {DSV4_PAGE}: set page_size {DSV4_PAGE} or leave it unset"))
        if facts.attention_backend not in (None, DSV4_BACKEND):
            out.append(("warning", "attention_backend",
                        f"attention_backend {facts.attention_backend} is replaced: SGLang {version} runs {arch} "
                        f"({source}) on {DSV4_BACKEND} ({file}): leave attention_backend unset"))
        if facts.kv_cache_dtype not in (None, "auto", *DSV4_KV_DTYPES):
            out.append(("error", "kv_cache_dtype",
                        f"kv_cache_dtype {facts.kv_cache_dtype} for {arch} ({source}): SGLang {version} refuses it at "
                        f"start ('{facts.kv_cache_dtype} is not supported for {arch}', arg_groups/overrides.py "
                        f"_deepseek_v4_kv_cache_dtype); valid: {', '.join(DSV4_KV_DTYPES)}, or unset (fp8_e4m3)"))
    radix_on = facts.radix_cache is not False and (facts.role != "decode" or bool(facts.decode_radix_cache))
    out += _mamba_problems(facts, config, source, radix_on)
    out += _sliding_window_problems(facts, config, source, prefill, decode)
    if version == "0.5.17" and arch in MIMO_V2_ARCHS and facts.hicache and \
            str(facts.env.get("SGLANG_ENABLE_UNIFIED_RADIX_TREE", "")).lower() not in _ENV_TRUE:
        out.append(("error", "hicache",
                    f"hicache for {arch} ({source}): SGLang 0.5.17 refuses it at start without the unified radix tree "
                    f"('Hierarchical cache for MiMoV2 requires the unified radix tree', {where}); valid: "
                    "env SGLANG_ENABLE_UNIFIED_RADIX_TREE: '1' on the engine, hicache false, or sglang_version 0.5.23"))
    return out


def _mamba_problems(facts: EngineFacts, config: dict[str, Any], source: str,
                    radix_on: bool) -> list[tuple[str, str, str]]:
    """What the mamba radix cache strategy SGLang picks refuses or replaces (issue 46 item 3)."""
    version, arch, out = facts.version, architecture(config), []
    overlap_on = facts.overlap_schedule is not False
    strategy, why = mamba_strategy(version, config, radix_on, overlap_on, facts.page_size, facts.extra_args)
    hook = "0.5.17 server_args.py _validate_mamba_no_buffer" if version == "0.5.17" else \
        "0.5.23 arg_groups/mamba_hook.py validate_mamba_no_buffer"
    if strategy is None:
        given = extra_arg(facts.extra_args, "--mamba-radix-cache-strategy")
        if version == "0.5.23" and radix_on and given in ("extra_buffer", "extra_buffer_lazy") and arch is not None:
            out.append(("error", "extra_args",
                        f"--mamba-radix-cache-strategy {given} for {arch} ({source}): SGLang 0.5.23 refuses it at "
                        f"start ('--mamba-radix-cache-strategy {given} needs mamba state', arg_groups/model_hook.py "
                        "handle_mamba_radix_cache): this checkpoint has no mamba layers; valid: remove it"))
        return out
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        linear = extra_arg(facts.extra_args, "--linear-attn-backend") or "triton"
        if not (extra_buffer_capable(version, arch or "") and linear == "triton"):
            out.append(("error", "extra_args",
                        f"--mamba-radix-cache-strategy {strategy} for {arch} ({source}) with --linear-attn-backend "
                        f"{linear}: SGLang {version} refuses it at start ('extra_buffer is not supported for {arch}; "
                        "use no_buffer.', _validate_mamba_extra_buffer); valid: no_buffer (page_size 1), auto, or "
                        "radix_cache: false"))
        return out
    # no_buffer
    if facts.page_size is not None and facts.page_size > 1:
        out.append(("error", "page_size",
                    f"page_size {facts.page_size} for {arch} ({source}) with the radix cache on: SGLang {version} "
                    f"uses the no_buffer mamba cache for it ({why}) and refuses it at start ('no_buffer only supports "
                    f"page_size=1.', {hook}); valid: page_size 1, or radix_cache: false"))
    if facts.attention_backend == "trtllm_mha":
        out.append(("error", "attention_backend",
                    f"attention_backend trtllm_mha for {arch} ({source}) with the radix cache on: SGLang {version} "
                    f"uses the no_buffer mamba cache for it ({why}) and refuses it at start ('no_buffer do not "
                    f"support trtllm_mha attention backend.', {hook}); valid: another attention_backend, or "
                    "radix_cache: false"))
    if why.startswith("--mamba") and overlap_on:
        out.append(("error", "overlap_schedule",
                    f"--mamba-radix-cache-strategy no_buffer for {arch} ({source}) with the overlap schedule on: "
                    f"SGLang {version} refuses it at start ('no_buffer do not support overlap schedule', {hook}); "
                    "valid: overlap_schedule: false, or strategy auto"))
    elif facts.overlap_schedule is True:
        out.append(("warning", "overlap_schedule",
                    f"overlap_schedule true is replaced for {arch} ({source}): with the radix cache on, SGLang "
                    f"{version} picks the no_buffer mamba cache ({why}) and turns the overlap schedule off "
                    "(overrides.py _mamba_radix_cache_resolution); remove it, or radix_cache: false"))
    return out


# Item 1 (issue 46): hybrid sliding-window checkpoints SGLang runs WITHOUT its hybrid SWA memory pool: an override
# returns disable_hybrid_swa_memory True for them (0.5.17 arg_groups/overrides.py, 0.5.23
# arg_groups/model_overrides/gemma2_gemma3.py, exaone.py, olmo2.py; Step3p5/3p7 with HiCache in overrides.py
# _step3p_overrides), so ModelConfig.is_hybrid_swa is False: every layer keeps a full-length KV in one pool, a PD
# pair moves it as any dense model's, and no SWA-only rule (radix cache, disaggregation, page) applies.
# release -> architecture -> when ("always", "sliding_window_pattern": config.json names one, "hicache")
SWA_POOL_OFF: dict[str, dict[str, str]] = {
    "0.5.17": {
        **dict.fromkeys(("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
                         "Gemma3nForCausalLM", "Gemma3nForConditionalGeneration", "Olmo2ForCausalLM"), "always"),
        **dict.fromkeys(("Exaone4ForCausalLM", "ExaoneMoEForCausalLM"), "sliding_window_pattern"),
        **dict.fromkeys(("Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"), "hicache"),
    },
}
SWA_POOL_OFF["0.5.23"] = {**SWA_POOL_OFF["0.5.17"], "ExaoneMoeForCausalLM": "sliding_window_pattern"}
# the flags that size or switch the hybrid SWA pool: moot once SGLang turns the pool off
SWA_POOL_FLAGS = ("--swa-full-tokens-ratio", "--disable-hybrid-swa-memory")
# The Gemma family's model files give their local layers a sliding window (models/gemma2.py, gemma3_causal.py,
# gemma3n_causal.py: RadixAttention(sliding_window_size=...)), and the hpc_ops backend raises on any such layer at
# its first forward ('The hpc_ops attention backend does not support sliding window.', layers/attention/
# hpc_ops_backend.py, both releases)
GEMMA_SLIDING_ARCHS = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
                       "Gemma3nForCausalLM", "Gemma3nForConditionalGeneration")


def swa_pool_off(version: str, config: dict[str, Any], hicache: bool | None) -> bool:
    """Whether SGLang VERSION turns the hybrid SWA memory pool off for CONFIG's checkpoint."""
    when = SWA_POOL_OFF.get(version, {}).get(architecture(config) or "")
    return when == "always" or (when == "sliding_window_pattern" and config.get("sliding_window_pattern") is not None) \
        or (when == "hicache" and bool(hicache))


def _sliding_window_problems(facts: EngineFacts, config: dict[str, Any], source: str, prefill: str | None,
                             decode: str | None) -> list[tuple[str, str, str]]:
    """Item 1: SWA pool settings SGLang drops for these checkpoints, and hpc_ops on the Gemma family's windows."""
    version, arch, out = facts.version, architecture(config), []
    if swa_pool_off(version, config, facts.hicache):
        given = [f for f in SWA_POOL_FLAGS if any(a == f or a.startswith(f + "=") for a in facts.extra_args)]
        if given:
            out.append(("warning", "extra_args",
                        f"{given[0]} has no effect for {arch} ({source}): SGLang {version} turns the hybrid SWA memory "
                        "pool off for this architecture (disable_hybrid_swa_memory, its model override), so every "
                        "layer keeps a full-length KV cache and no SWA pool is sized: remove it"))
    if arch in GEMMA_SLIDING_ARCHS and "hpc_ops" in (prefill, decode):
        out.append(("error", "attention_backend",
                    f"attention backend hpc_ops for {arch} ({source}): its local layers have a sliding window, and "
                    f"SGLang {version}'s hpc_ops backend raises at the first forward ('The hpc_ops attention backend "
                    "does not support sliding window.', layers/attention/hpc_ops_backend.py); valid: another "
                    "attention_backend (fa3, flashinfer, triton), or leave it unset"))
    return out


# ------------------------------------------------------------------------------ the page a checkpoint forces
# (issue 46 item 4) read by pdkit/spec/pagesize.py before the backends' snaps, in SGLang's order: the model overrides
# (handle_model_specific_adjustments) run before _mla_backend_page_constraints and _fa4_page_constraint.
# release -> architecture -> the backend its override picks on SM100 when the inventory gives none, and which
# backend arguments must be unset ("all": attention, prefill and decode, is_attention_backend_not_set; "main":
# attention_backend only): 0.5.17 overrides.py _gpt_oss_overrides / _olmo2_overrides; 0.5.23
# model_overrides/gpt_oss.py, olmo2.py, exaone.py (with a sliding_window_pattern only)
SM100_DEFAULT_BACKEND: dict[str, dict[str, tuple[str, str]]] = {
    "0.5.17": {"GptOssForCausalLM": ("trtllm_mha", "all"), "Olmo2ForCausalLM": ("trtllm_mha", "main")},
    "0.5.23": {"GptOssForCausalLM": ("trtllm_mha", "all"), "Olmo2ForCausalLM": ("trtllm_mha", "main"),
               "Exaone4ForCausalLM": ("trtllm_mha", "main"), "ExaoneMoEForCausalLM": ("trtllm_mha", "main"),
               "ExaoneMoeForCausalLM": ("trtllm_mha", "main")},
}


@dataclass(frozen=True)
class ModelPage:
    """What a checkpoint decides of the page before the backends' snaps: the page it sets (None: none), the
    attention backend it sets (None: none), why, and whether that depends on a GPU generation pdkit was not told."""

    page: int | None = None
    backend: str | None = None
    why: str = ""
    sure: bool = True


def model_page(version: str, config: dict[str, Any], args: dict[str, tuple[str, ...]],
               sm_major: int | None) -> ModelPage:
    """What SGLang VERSION's model overrides set of the page / attention backend for CONFIG's checkpoint, given the
    engine's parsed argv ARGS (dest -> values) on a GPU of SM_MAJOR (None: unknown)."""
    arch = architecture(config)
    if arch is None:
        return ModelPage()
    given = {d: (args.get(d) or (None,))[0] for d in ("attention_backend", "prefill_attention_backend",
                                                     "decode_attention_backend")}
    if arch in DSV4_ARCHS:
        return ModelPage(DSV4_PAGE, DSV4_BACKEND, f"{arch} runs on {DSV4_BACKEND} with page {DSV4_PAGE}")
    family = arch in DEEPSEEK_FAMILY.get(version, ())
    if family and arch in DSA_ARCHS.get(version, ()) and config.get("index_topk") is not None:
        kpool = config.get("index_kpool", 1) if version != "0.5.17" else 1
        page = 64 * (kpool if isinstance(kpool, int) and kpool > 0 else 1)
        return ModelPage(page, None, f"{arch} with index_topk (DeepSeek Sparse Attention) runs page {page}")
    unset = all(v is None for v in given.values())
    if family and config.get("index_topk") is None and unset:
        if sm_major is None:
            return ModelPage(None, None, f"{arch} without an attention backend takes trtllm_mla on SM100 "
                             "(the node declares no compute_capability)", sure=False)
        if sm_major == 10:
            return ModelPage(None, "trtllm_mla", f"{arch} without an attention backend takes trtllm_mla on SM100")
    default = SM100_DEFAULT_BACKEND.get(version, {}).get(arch)
    if default is not None and (arch not in EXAONE_ARCHS or config.get("sliding_window_pattern") is not None):
        free = unset if default[1] == "all" else given["attention_backend"] is None
        if free and sm_major is None:
            return ModelPage(None, None, f"{arch} without an attention backend takes {default[0]} on SM100 (the "
                             "node declares no compute_capability)", sure=False)
        if free and sm_major == 10:
            return ModelPage(None, default[0], f"{arch} without an attention backend takes {default[0]} on SM100")
    return ModelPage()


def is_mla(config: dict[str, Any] | None) -> bool | None:
    """Whether CONFIG's checkpoint runs MLA attention (None: no config). Every MLA arm of ModelConfig reads a
    kv_lora_rank (configs/model_config.py, both releases), so a config without one is MHA."""
    if config is None or architecture(config) is None:
        return None
    return config.get("kv_lora_rank") is not None or text_config(config).get("kv_lora_rank") is not None


def engine_facts(spec: Any, host: Any, engine: Any) -> EngineFacts:
    """ENGINE's facts (HOST's, in the ClusterSpec SPEC) for architecture_problems: its release, role, rendered
    tuning, the attention backends its extra_args give, and the GPU generation its node declares."""
    tuning = spec.engine_tuning(engine)
    node = host.node
    return EngineFacts(
        version=spec.engine_version(engine), role=engine.role, page_size=tuning.page_size,
        attention_backend=tuning.attention_backend,
        prefill_attention_backend=extra_arg(engine.extra_args, "--prefill-attention-backend"),
        decode_attention_backend=extra_arg(engine.extra_args, "--decode-attention-backend"),
        radix_cache=tuning.radix_cache, decode_radix_cache=tuning.decode_radix_cache, hicache=tuning.hicache,
        overlap_schedule=tuning.overlap_schedule,
        sm_major=node.gpus.sm_major if node is not None and node.gpu == "nvidia" else None,
        env={str(k): str(v) for k, v in engine.env.items()}, kv_cache_dtype=tuning.kv_cache_dtype,
        extra_args=tuple(str(a) for a in engine.extra_args))
