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
from pathlib import Path
from typing import Any

# sglang/srt/utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS (the same in 0.5.17 and 0.5.23), in order
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
# the sub-configs SGLang takes as the text config of a multimodal checkpoint (get_hf_text_config)
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")
# what the node's probe keeps of config.json (and of each text sub-config): enough for the rules here
CONFIG_KEYS = ("architectures", "rope_scaling", "rope_parameters", *CONTEXT_LENGTH_KEYS)


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
