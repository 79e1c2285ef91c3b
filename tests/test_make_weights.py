"""gpu/make_weights.py: random Llama weights as safetensors, read back by safetensors and by
transformers' own LlamaForCausalLM loader (in the SGLang 0.5.17 contract virtualenv, which holds
both), so a wrong name, shape or byte offset fails here and not on the lent GPU."""

from __future__ import annotations

import hashlib
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from pdkit.upstream.venvs import sglang_python
from tests.conftest import load_script, require

REPO = Path(__file__).resolve().parents[1]


mw = load_script("gpu/make_weights.py", "pdkit_make_weights")

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}


def _model(tmp_path: Path, name: str = "m", **config) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TINY, **config}))
    return d


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.glob("*.safetensors")):
        h.update(p.read_bytes())
    return h.hexdigest()


def test_shards_hold_every_parameter_once_with_contiguous_offsets(tmp_path):
    d = _model(tmp_path)
    # ~0.1 MiB shards: the 64 KiB embedding and lm_head force several
    paths = mw.write_weights(d, shard_gib=0.1 / 1024, say=lambda _: None)
    assert len(paths) > 2
    index = json.loads((d / "model.safetensors.index.json").read_text())
    expected = dict(mw.llama_parameters(TINY))
    assert set(index["weight_map"]) == set(expected)
    seen = {}
    for p in paths:
        header = mw.read_header(p)
        header.pop("__metadata__")
        end = 0
        for name, meta in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            assert meta["dtype"] == "BF16"
            assert tuple(meta["shape"]) == expected[name]
            assert meta["data_offsets"][0] == end, f"{p.name}: {name} does not start where the previous ended"
            end = meta["data_offsets"][1]
            seen[name] = p.name
        head_len = int.from_bytes(p.read_bytes()[:8], "little")
        assert p.stat().st_size == 8 + head_len + end
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == sum(mw.nbytes(s) for s in expected.values())


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a, b, c = (_model(tmp_path, n) for n in "abc")
    for d, seed in ((a, 7), (b, 7), (c, 8)):
        mw.write_weights(d, seed=seed, say=lambda _: None)
    assert _digest(a) == _digest(b) != _digest(c)


def test_tied_embeddings_have_no_lm_head_and_other_architectures_are_refused(tmp_path):
    names = [n for n, _ in mw.llama_parameters({**TINY, "tie_word_embeddings": True})]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    with pytest.raises(SystemExit, match="only LlamaForCausalLM"):
        mw.write_weights(_model(tmp_path, architectures=["Qwen2ForCausalLM"]), say=lambda _: None)


def test_the_gpu_tier_model_is_about_1_8_gb(tmp_path):
    make_model = load_script("gpu/make_model.py", "pdkit_make_model")
    total = sum(mw.nbytes(s) for _, s in mw.llama_parameters(make_model.CONFIG))
    assert 1.6e9 < total < 2.0e9  # gpu/make_model.py's docstring: ~0.9B parameters, 1.8 GB in bf16


def test_transformers_and_safetensors_read_what_was_written(tmp_path):
    python = sglang_python("0.5.17")
    require(python is not None, "no SGLang 0.5.17 contract venv (transformers + torch + safetensors): "
                                "run `bash .ci/contract-env.sh`")
    d = _model(tmp_path)
    mw.write_weights(d, shard_gib=0.1 / 1024, say=lambda _: None)
    script = textwrap.dedent("""
        import importlib.util, json, sys
        import torch
        from safetensors.torch import load_file
        spec = importlib.util.spec_from_file_location("mw", sys.argv[1])
        mw = importlib.util.module_from_spec(spec); spec.loader.exec_module(mw)
        d = sys.argv[2]
        mw.check_transformers(__import__("pathlib").Path(d))
        index = json.load(open(d + "/model.safetensors.index.json"))
        t = {}
        for shard in sorted(set(index["weight_map"].values())):
            t.update(load_file(d + "/" + shard))
        w = t["model.layers.0.mlp.up_proj.weight"].float()
        print(json.dumps({"dtype": str(t["model.norm.weight"].dtype),
                          "norm_ones": bool((t["model.norm.weight"] == 1).all()),
                          "std": float(w.std()), "mean": float(w.mean())}))
    """)
    done = subprocess.run([str(python), "-c", script, str(REPO / "gpu" / "make_weights.py"), str(d)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no missing, unexpected or mismatched key" in done.stdout
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["dtype"] == "torch.bfloat16" and got["norm_ones"]
    assert 0.017 < got["std"] < 0.023 and abs(got["mean"]) < 0.003


def test_a_missing_tensor_fails_the_transformers_check(tmp_path):
    """The check can fail: drop one tensor from a shard and transformers reports it missing."""
    python = sglang_python("0.5.17")
    require(python is not None, "no SGLang 0.5.17 contract venv: run `bash .ci/contract-env.sh`")
    d = _model(tmp_path)
    real = mw.llama_parameters
    mw_copy = load_script("gpu/make_weights.py", "pdkit_make_weights_missing_one")
    mw_copy.llama_parameters = lambda c: [p for p in real(c) if p[0] != "model.layers.1.mlp.down_proj.weight"]
    mw_copy.write_weights(d, say=lambda _: None)
    script = ("import importlib.util, sys, pathlib\n"
              "spec = importlib.util.spec_from_file_location('mw', sys.argv[1])\n"
              "mw = importlib.util.module_from_spec(spec); spec.loader.exec_module(mw)\n"
              "mw.check_transformers(pathlib.Path(sys.argv[2]))\n")
    done = subprocess.run([str(python), "-c", script, str(REPO / "gpu" / "make_weights.py"), str(d)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "model.layers.1.mlp.down_proj.weight" in done.stderr + done.stdout
