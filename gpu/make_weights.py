"""Write random weights for a Llama-architecture model directory as safetensors shards.

The GPU tier's model (gpu/make_model.py) has a config and a tokenizer only; with
`--load-format dummy` SGLang invents the weights in GPU memory and never reads a file, so no
GPU figure measured how the engine loads weights. This writes real-format weights instead:
every parameter SGLang's LlamaForCausalLM loader reads (the Hugging Face names), bf16, seeded
(the same bytes on every run), split into shards of at most --shard-gib with a
model.safetensors.index.json, exactly as a downloaded checkpoint lays them out. The engines then
load them through SGLang's normal loader (`PDKIT_GPU_WEIGHTS=safetensors`, inventories/h200.py).

The safetensors layout (an 8-byte little-endian header length, a JSON header of dtype, shape and
byte offsets, then the raw tensors) is written directly: numpy has no bfloat16, so each float32
draw keeps its upper 16 bits (bf16 by truncation). Values are N(0, 0.02) like a fresh Hugging
Face init, norms are ones. `--check-transformers` loads the directory with transformers'
LlamaForCausalLM (on the device's python3) and fails on any missing or unexpected key.

    python3 gpu/make_weights.py MODEL_DIR [--shard-gib 2] [--seed 0] [--check-transformers]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np

INIT_STD = 0.02  # transformers' LlamaConfig.initializer_range default
SHARD_GIB = 2.0  # about what published checkpoints use (4-5 GB shards are also common)


def llama_parameters(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every weight of a LlamaForCausalLM with CONFIG, in checkpoint order."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise SystemExit("make_weights: attention_bias / mlp_bias configs are not supported (gpu/make_model.py has neither)")
    params = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        params += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
            (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
            (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    params.append(("model.norm.weight", (hidden,)))
    if not config.get("tie_word_embeddings", False):
        params.append(("lm_head.weight", (vocab, hidden)))
    return params


def nbytes(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) * 2  # bf16


def shard_plan(params: list[tuple[str, tuple[int, ...]]], shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Consecutive parameters packed into shards of at most SHARD_BYTES (a bigger tensor gets its own)."""
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in params:
        if shards[-1] and size + nbytes(shape) > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes(shape)
    return shards


def bf16(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> bytes:
    """The tensor's bytes: ones for a norm, else N(0, INIT_STD), as bf16 (float32's upper half)."""
    if name.endswith("norm.weight"):
        values = np.ones(shape, dtype=np.float32)
    else:
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= INIT_STD
    return (values.view(np.uint32) >> 16).astype("<u2").tobytes()


def write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator) -> int:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes(shape)]}
        offset += nbytes(shape)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format's recommended alignment of the data section
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for name, shape in tensors:
            f.write(bf16(rng, name, shape))
    tmp.replace(path)
    return offset


def write_weights(model_dir: Path, shard_gib: float = SHARD_GIB, seed: int = 0, say=print) -> list[Path]:
    """Write MODEL_DIR's safetensors shards and index from its config.json; the shard paths."""
    config = json.loads((model_dir / "config.json").read_text())
    arch = config.get("architectures") or []
    if arch != ["LlamaForCausalLM"]:
        raise SystemExit(f"make_weights: {model_dir}/config.json architectures {arch}: only LlamaForCausalLM is written")
    for old in list(model_dir.glob("*.safetensors")) + list(model_dir.glob("model.safetensors.index.json")):
        old.unlink()
    params = llama_parameters(config)
    shards = shard_plan(params, int(shard_gib * 2**30))
    total = sum(nbytes(s) for _, s in params)
    rng = np.random.Generator(np.random.PCG64(seed))
    weight_map, paths, start = {}, [], time.monotonic()
    for i, tensors in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        written = write_shard(model_dir / name, tensors, rng)
        weight_map.update({t: name for t, _ in tensors})
        paths.append(model_dir / name)
        say(f"make_weights: {name} {written / 2**30:.2f} GiB ({len(tensors)} tensors), "
            f"{time.monotonic() - start:.1f} s so far")
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    say(f"make_weights: {len(params)} tensors, {total / 2**30:.2f} GiB bf16 in {len(shards)} shard(s), "
        f"seed {seed}, {time.monotonic() - start:.1f} s")
    return paths


def read_header(path: Path) -> dict:
    """A safetensors file's JSON header (for checks)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def check_transformers(model_dir: Path) -> None:
    """Load MODEL_DIR with transformers' LlamaForCausalLM; fail on a missing or unexpected key."""
    # a Llama needs no torchvision, and one not built for the installed torch breaks transformers'
    # import (the SGLang 0.5.17 contract venv pairs torch 2.13 with torchvision 0.28)
    sys.modules.setdefault("torchvision", None)
    from transformers import LlamaForCausalLM  # lazy: only the device's python3 has transformers and torch

    start = time.monotonic()
    _, info = LlamaForCausalLM.from_pretrained(str(model_dir), output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit(f"make_weights: transformers' LlamaForCausalLM does not read {model_dir} as written: {bad}")
    print(f"make_weights: transformers' LlamaForCausalLM loaded {model_dir}: no missing, unexpected or mismatched "
          f"key ({time.monotonic() - start:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--shard-gib", type=float, default=SHARD_GIB)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-transformers", action="store_true")
    args = ap.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        raise SystemExit(f"make_weights: {args.model_dir}/config.json not found (gpu/make_model.py writes it)")
    write_weights(args.model_dir, args.shard_gib, args.seed)
    if args.check_transformers:
        check_transformers(args.model_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
