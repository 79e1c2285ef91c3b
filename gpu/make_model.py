"""Write the GPU tier's small Llama-architecture model directory (config + locally trained tokenizer).

No weights: the engines run with `--load-format dummy` (inventories/h200.py), which initialises
random weights from config.json alone, with the same seed in every process. The shape (16 layers,
hidden 2048, intermediate 5632, 16 heads / 8 KV heads, vocab 32000: ~0.9B parameters, 1.8 GB in
bf16) is large enough that GPU time, not Python, dominates a decode step on an H200.

The tokenizer is a byte-level BPE trained here with the `tokenizers` library on a synthetic,
seeded corpus, so the directory is byte-for-byte deterministic (checked by `--check`) and needs
no download. It needs `tokenizers` importable (run_gpu_tier.py puts the pinned 0.22.2 wheel on
sys.path).

    python gpu/make_model.py OUT_DIR [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 32000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 (config's bos/eos below)

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}

# A plain role-tagged template: /v1/chat/completions needs one, and transformers 5 has no default.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<unk>",
    "add_bos_token": True,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 4096,
    "chat_template": CHAT_TEMPLATE,
}

SPECIAL_TOKENS_MAP = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}


def parameter_count(cfg: dict = CONFIG) -> int:
    h, i, n, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h  # q,o + k,v + gate/up/down + 2 norms
    return n * per_layer + 2 * v * h + h  # embeddings + lm_head + final norm


def corpus(seed: int = 20261129, words: int = 120_000) -> list[str]:
    """Deterministic pseudo-text: Zipf-ish words over syllables, enough merges for a 32k vocab."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
              "st", "tr", "pl", "gr", "ch", "sh", "th", "br", "kr", "fl", "sp"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"]
    codas = ["", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng", "x"]
    lexicon = []
    for _ in range(40_000):
        word = "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 4)))
        lexicon.append(word)
    weights = [1.0 / (r + 1) ** 0.8 for r in range(len(lexicon))]
    punct = [".", ",", "!", "?", ";", ":"]
    lines = []
    chosen = rng.choices(lexicon, weights=weights, k=words)
    digits = "0123456789"
    for start in range(0, words, 12):
        sentence = chosen[start:start + 12]
        text = " ".join(sentence).capitalize() + rng.choice(punct)
        if rng.random() < 0.2:
            text += " " + "".join(rng.choice(digits) for _ in range(rng.randint(1, 6)))
        lines.append(text)
    return lines


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def write_model(out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"tokenizer vocab is {tok.get_vocab_size()}, config says {VOCAB_SIZE}: enlarge the corpus")
    files = {
        "config.json": json.dumps(CONFIG, indent=2, sort_keys=True) + "\n",
        "generation_config.json": json.dumps(GENERATION_CONFIG, indent=2, sort_keys=True) + "\n",
        "tokenizer_config.json": json.dumps(TOKENIZER_CONFIG, indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps(SPECIAL_TOKENS_MAP, indent=2, sort_keys=True) + "\n",
        "tokenizer.json": tok.to_str(pretty=False) + "\n",
    }
    digests = {}
    for name, text in files.items():
        (out / name).write_text(text)
        digests[name] = hashlib.sha256(text.encode()).hexdigest()
    return digests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--check", action="store_true", help="build twice and fail unless both are byte-identical")
    args = ap.parse_args(argv)
    digests = write_model(args.out)
    if args.check:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            again = write_model(Path(tmp))
        if again != digests:
            print("NOT deterministic:", {k for k in digests if digests[k] != again.get(k)}, file=sys.stderr)
            return 1
    print(f"{args.out}: Llama {CONFIG['num_hidden_layers']}x{CONFIG['hidden_size']}, "
          f"{parameter_count() / 1e9:.2f}B parameters, vocab {VOCAB_SIZE}")
    for name, digest in sorted(digests.items()):
        print(f"  {digest[:16]}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
