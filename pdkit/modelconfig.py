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

# sglang/srt/utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS (the same in 0.5.17 and 0.5.23), in order
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
# the sub-configs SGLang takes as the text config of a multimodal checkpoint (get_hf_text_config)
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")
# what the node's probe keeps of config.json (and of each text sub-config): enough for the rules here
# (architecture_problems reads model_type/architectures, DSA's index_topk / index_kpool, MLA's kv_lora_rank
# and Exaone4's sliding_window_pattern)
CONFIG_KEYS = ("architectures", "rope_scaling", "rope_parameters", *CONTEXT_LENGTH_KEYS, "model_type",
               "kv_lora_rank", "index_topk", "index_kpool", "sliding_window_pattern")


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
        if isinstance(config.get(key), dict):
            return config[key]
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
DEEPSEEK_FAMILY = {
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
# Hybrid linear-attention checkpoints that keep a mamba radix cache but lack the extra_buffer strategy in both
# releases (in _MAMBA_RADIX_CACHE_ARCHS, not in _MAMBA_EXTRA_BUFFER_ARCHS of arg_groups/overrides.py): with the
# radix cache on, SGLang picks no_buffer, turns the overlap schedule off, and asserts page_size 1 and a backend
# other than trtllm_mha (0.5.17 ServerArgs._validate_mamba_no_buffer, 0.5.23 mamba_hook.validate_mamba_no_buffer)
_NO_BUFFER = ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration",
              "ZayaForCausalLM")
MAMBA_NO_BUFFER_ARCHS = {"0.5.17": _NO_BUFFER, "0.5.23": (*_NO_BUFFER, "InternS2MobiusForConditionalGeneration")}
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
        file = "arg_groups/overrides.py _deepseek_family_overrides" if version == "0.5.17" else \
            "arg_groups/model_overrides/deepseek_v2.py"
        if facts.page_size is not None and facts.page_size != forced:
            out.append(("warning", "page_size",
                        f"page_size {facts.page_size} is replaced: {arch} with index_topk ({source}) is a DeepSeek "
                        f"Sparse Attention checkpoint, and SGLang {version} sets its page size to {forced} on CUDA "
                        f"({file}); every rule and PD pair runs on page {forced}: set page_size {forced} or leave it "
                        "unset"))
    elif family and config.get("index_topk") is None and facts.sm_major == 10 and \
            (facts.attention_backend, facts.prefill_attention_backend, facts.decode_attention_backend) == \
            (None, None, None) and facts.page_size not in (32, 64):
        file = "arg_groups/overrides.py _deepseek_family_overrides" if version == "0.5.17" else \
            "arg_groups/model_overrides/deepseek_v2.py"
        out.append(("warning", "page_size",
                    f"page_size {facts.page_size if facts.page_size is not None else 'unset'} runs as 64: on SM100 "
                    f"SGLang {version} gives {arch} without an attention backend trtllm_mla ({file}), which snaps the "
                    "page to 64 (_mla_backend_page_constraints); a PD peer with another backend or page then no "
                    "longer matches: set page_size 64 (or 32), or the attention_backend on every engine of the pair"))
    if arch in DSV4_ARCHS:
        file = "arg_groups/overrides.py _deepseek_v4_overrides" if version == "0.5.17" else \
            "arg_groups/model_overrides/deepseek_v4.py"
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
    if arch in MAMBA_NO_BUFFER_ARCHS.get(version, ()) and radix_on:
        hook = "0.5.17 server_args.py _validate_mamba_no_buffer" if version == "0.5.17" else \
            "0.5.23 arg_groups/mamba_hook.py validate_mamba_no_buffer"
        if facts.page_size is not None and facts.page_size > 1:
            out.append(("error", "page_size",
                        f"page_size {facts.page_size} for {arch} ({source}) with the radix cache on: SGLang {version} "
                        f"uses the no_buffer mamba cache for it and refuses it at start ('no_buffer only supports "
                        f"page_size=1.', {hook}); valid: page_size 1, or radix_cache: false"))
        if given == "trtllm_mha":
            out.append(("error", "attention_backend",
                        f"attention_backend trtllm_mha for {arch} ({source}) with the radix cache on: SGLang {version} "
                        f"refuses it at start ('no_buffer do not support trtllm_mha attention backend.', {hook}); "
                        "valid: another attention_backend, or radix_cache: false"))
        if facts.overlap_schedule is True:
            out.append(("warning", "overlap_schedule",
                        f"overlap_schedule true is replaced for {arch} ({source}): with the radix cache on, SGLang "
                        f"{version} picks the no_buffer mamba cache and turns the overlap schedule off "
                        "(overrides.py _mamba_radix_cache_resolution); remove it, or radix_cache: false"))
    if version == "0.5.17" and arch in MIMO_V2_ARCHS and facts.hicache and \
            str(facts.env.get("SGLANG_ENABLE_UNIFIED_RADIX_TREE", "")).lower() not in _ENV_TRUE:
        out.append(("error", "hicache",
                    f"hicache for {arch} ({source}): SGLang 0.5.17 refuses it at start without the unified radix tree "
                    f"('Hierarchical cache for MiMoV2 requires the unified radix tree', {where}); valid: "
                    "env SGLANG_ENABLE_UNIFIED_RADIX_TREE: '1' on the engine, hicache false, or sglang_version 0.5.23"))
    return out


def extra_arg(extra_args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value EXTRA_ARGS give FLAG ('--flag v' or '--flag=v'; the last wins, as in argparse)."""
    value, args = None, list(extra_args)
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def engine_facts(spec, host, engine) -> EngineFacts:
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
        env={str(k): str(v) for k, v in engine.env.items()}, kv_cache_dtype=tuning.kv_cache_dtype)
