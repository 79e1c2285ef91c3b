"""Issue 46 item 4: the model's own config.json, read by validate where the model directory is on the
deploying machine (the preflight's half is in tests/node/test_preflight_model_dirs.py)."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from pdkit.cli import main
from pdkit.spec import modelconfig
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory


@pytest.mark.parametrize("config, derived", [
    ({"max_position_embeddings": 32768}, (32768, "max_position_embeddings")),
    # the first of SGLang's CONTEXT_LENGTH_KEYS wins
    ({"seq_length": 4096, "max_position_embeddings": 32768}, (4096, "seq_length")),
    # a multimodal checkpoint: the text sub-config
    ({"architectures": ["Qwen3VLForConditionalGeneration"], "text_config": {"max_position_embeddings": 262144}},
     (262144, "max_position_embeddings")),
    # rope scaling: the larger figure (SGLang applies the factor unless original_max_position_embeddings / llama3)
    ({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     (131072, "max_position_embeddings x rope factor 4")),
    ({"hidden_size": 4096}, None),  # no key: the rule stays silent rather than assume SGLang's 2,048
])
def test_the_derived_context_length_follows_sglang(config, derived):
    assert modelconfig.derived_context_length(config) == derived


def test_the_rule_refuses_only_above_the_derived_length_and_honours_the_override():
    config = {"max_position_embeddings": 8192}
    assert modelconfig.context_problem(8192, False, config, "x") is None
    assert modelconfig.context_problem(None, False, config, "x") is None
    assert modelconfig.context_problem(16384, True, config, "x") is None
    why = modelconfig.context_problem(16384, False, config, "/m/config.json")
    assert why and "above the model's own context length 8192" in why and "allow_longer_context: true" in why


@pytest.fixture
def model_dir():
    """A model directory outside /tmp, /home and /root (validate refuses those: the engine units cannot see them)."""
    top = Path(tempfile.mkdtemp(prefix="pdkit-model-", dir="/var/lib"))
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _model_dir(top, config):
    (top / "config.json").write_text(json.dumps({**config, "vocab_size": 32000}))
    return str(top)


@pytest.mark.parametrize("allow", [False, True])
def test_validate_reads_a_local_config_json_and_says_so(tmp_path, capsys, allow, model_dir):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["model"] = {**cluster["model"], "path": _model_dir(model_dir, {"max_position_embeddings": 8192})}
    cluster["tuning"] = {**cluster["tuning"], "all": {"context_length": 32768, **({"allow_longer_context": True} if allow else {})}}
    inv = write_inventory(tmp_path, hosts, cluster)
    rc = main(["validate", str(inv)])
    err = capsys.readouterr().err
    if allow:
        assert rc == 0, err
    else:
        assert rc == 2
        assert "pdkit_cluster.tuning.all.context_length: 32768 is above the model's own context length 8192" in err
        assert "config.json, read by validate on this machine" in err


def test_a_model_directory_not_on_this_machine_is_left_to_the_preflight(tmp_path, capsys):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["model"] = {**cluster["model"], "path": "/models/pdkit-test-absent-model"}
    cluster["tuning"] = {**cluster["tuning"], "all": {"context_length": 10_000_000}}
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------ architecture-forced settings
# config.json keys as the published checkpoints write them (trimmed to what the rules read)
DEEPSEEK_V32 = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "kv_lora_rank": 512,
                "index_topk": 2048, "max_position_embeddings": 163840}
# a DeepSeek-V4 checkpoint's config.json, as SGLang matches it (architectures[0])
DEEPSEEK_V4 = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "max_position_embeddings": 1048576}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "kv_lora_rank": 512,
               "max_position_embeddings": 163840}
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "max_position_embeddings": 131072}
LLAMA4 = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
          "text_config": {"max_position_embeddings": 10485760}}
GEMMA4 = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4"}
LFM2 = {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "max_position_embeddings": 128000}
EXAONE4 = {"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "sliding_window_pattern": "LLLG",
           "max_position_embeddings": 131072}
OLMO2 = {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "max_position_embeddings": 4096}
MIMO_V2 = {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash"}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 40960}

F = modelconfig.EngineFacts


def _found(facts, config):
    return [(sev, name) for sev, name, _ in modelconfig.architecture_problems(facts, config, "/m/config.json")]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("config, facts, expect", [
    # the per-architecture backend asserts: an explicit backend the model refuses
    (GPT_OSS, {"attention_backend": "flashinfer"}, [("error", "attention_backend")]),
    (GPT_OSS, {"attention_backend": "fa3"}, []),
    # GPT-OSS reads prefill and decode: a decode backend given in extra_args counts
    (GPT_OSS, {"attention_backend": "fa3", "decode_attention_backend": "flashinfer"}, [("error", "attention_backend")]),
    (LLAMA4, {"attention_backend": "flashinfer"}, [("error", "attention_backend")]),
    (LLAMA4, {"attention_backend": "fa3"}, []),
    (GEMMA4, {"attention_backend": "fa3"}, [("error", "attention_backend")]),
    (GEMMA4, {"attention_backend": "triton"}, []),
    (LFM2, {"attention_backend": "triton", "radix_cache": False}, [("error", "attention_backend")]),
    (OLMO2, {"attention_backend": "flashinfer"}, [("error", "attention_backend")]),
    (OLMO2, {"attention_backend": "fa3"}, []),
    (EXAONE4, {"attention_backend": "flashinfer"}, [("error", "attention_backend")]),
    (EXAONE4, {"attention_backend": "trtllm_mha"}, []),
    # without a sliding-window pattern Exaone4 takes any backend
    ({**EXAONE4, "sliding_window_pattern": None}, {"attention_backend": "flashinfer"}, []),
    # unset backends are SGLang's to pick for the model: never judged
    (GPT_OSS, {}, []), (LLAMA4, {}, []), (GEMMA4, {}, []),
    # DSA (index_topk): the page is forced to 64 on CUDA; another explicit page is silently replaced
    (DEEPSEEK_V32, {"page_size": 1}, [("warning", "page_size")]),
    (DEEPSEEK_V32, {"page_size": 64}, []),
    (DEEPSEEK_V32, {}, []),
    # an MTP draft architecture _deepseek_family_overrides is not registered for: no page is forced
    ({**DEEPSEEK_V32, "architectures": ["DeepseekV3ForCausalLMNextN"]}, {"page_size": 1}, []),
    # MLA DeepSeek-V3 without a backend on SM100: trtllm_mla snaps the page to 64
    (DEEPSEEK_V3, {"sm_major": 10}, [("warning", "page_size")]),
    (DEEPSEEK_V3, {"sm_major": 10, "page_size": 64}, []),
    (DEEPSEEK_V3, {"sm_major": 9}, []),
    (DEEPSEEK_V3, {"sm_major": 10, "attention_backend": "flashinfer"}, []),
    # DeepSeek-V4: dsv4 and page 256 whatever the inventory gives; its KV cache fp8_e4m3 or bfloat16 only
    (DEEPSEEK_V4, {"page_size": 64}, [("warning", "page_size")]),
    (DEEPSEEK_V4, {"attention_backend": "flashmla"}, [("warning", "attention_backend")]),
    (DEEPSEEK_V4, {"kv_cache_dtype": "fp8_e5m2"}, [("error", "kv_cache_dtype")]),
    (DEEPSEEK_V4, {"page_size": 256, "attention_backend": "dsv4", "kv_cache_dtype": "bfloat16"}, []),
    (DEEPSEEK_V4, {"kv_cache_dtype": "auto"}, []),
    (DEEPSEEK_V4, {}, []),
    # hybrid mamba without extra_buffer (LFM2): radix cache on -> no_buffer asserts page 1 and no trtllm_mha
    (LFM2, {"page_size": 64}, [("error", "page_size")]),
    (LFM2, {"attention_backend": "trtllm_mha"}, [("error", "attention_backend")]),
    (LFM2, {"overlap_schedule": True}, [("warning", "overlap_schedule")]),
    (LFM2, {"page_size": 64, "radix_cache": False}, []),
    # a PD decode has no radix cache unless decode_radix_cache: the mamba strategy is not chosen there
    (LFM2, {"page_size": 64, "role": "decode"}, []),
    (LFM2, {"page_size": 64, "role": "decode", "decode_radix_cache": True}, [("error", "page_size")]),
    # architectures with no forced setting stay valid whatever the tuning
    (QWEN3, {"attention_backend": "flashinfer", "page_size": 16, "sm_major": 10}, []),
    ({}, {"attention_backend": "flashinfer"}, []),
])
def test_architecture_rules_follow_what_sglang_forces(version, config, facts, expect):
    assert _found(F(version=version, **facts), config) == expect


def test_the_releases_differ_where_sglang_does():
    # Gemma4 takes fa4 from 0.5.23 on; NemotronH's triton assert is 0.5.17's only
    gemma = F(version="0.5.23", attention_backend="fa4")
    assert _found(gemma, GEMMA4) == []
    assert _found(F(version="0.5.17", attention_backend="fa4"), GEMMA4) == [("error", "attention_backend")]
    nemotron = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h"}
    assert _found(F(version="0.5.17", attention_backend="triton", radix_cache=False), nemotron) == \
        [("error", "attention_backend")]
    assert _found(F(version="0.5.23", attention_backend="triton", radix_cache=False), nemotron) == []
    # DSA's page is 64 x index_kpool in 0.5.23 (model_overrides/deepseek_v2.py), 64 in 0.5.17
    pooled = {**DEEPSEEK_V32, "index_kpool": 2}
    assert _found(F(version="0.5.23", page_size=128), pooled) == []
    assert _found(F(version="0.5.23", page_size=64), pooled) == [("warning", "page_size")]
    assert _found(F(version="0.5.17", page_size=64), pooled) == []
    # MiMoV2 HiCache needs the unified radix tree in 0.5.17 only
    assert _found(F(version="0.5.17", hicache=True), MIMO_V2) == [("error", "hicache")]
    assert _found(F(version="0.5.17", hicache=True, env={"SGLANG_ENABLE_UNIFIED_RADIX_TREE": "1"}), MIMO_V2) == []
    assert _found(F(version="0.5.23", hicache=True), MIMO_V2) == []


def test_equal_prefill_and_decode_backends_replace_attention_backend():
    # _attention_backend_default: equal prefill/decode backends become attention_backend (both releases)
    facts = F(version="0.5.23", attention_backend="fa3", prefill_attention_backend="flashinfer",
              decode_attention_backend="flashinfer")
    msgs = modelconfig.architecture_problems(facts, GPT_OSS, "/m/config.json")
    assert [m[:2] for m in msgs] == [("error", "attention_backend")] and "flashinfer" in msgs[0][2]


def test_a_message_names_what_sglang_forces_and_where():
    (sev, name, msg), = modelconfig.architecture_problems(F(version="0.5.23", page_size=1), DEEPSEEK_V32, "/m/c.json")
    assert "page size to 64" in msg and "model_overrides/deepseek_v2.py" in msg and "/m/c.json" in msg
    (sev, name, msg), = modelconfig.architecture_problems(F(version="0.5.17", attention_backend="flashinfer"),
                                                          GPT_OSS, "/m/c.json")
    assert "SGLang 0.5.17 refuses it at start" in msg and "server_args.py" in msg and "valid: one of triton" in msg


def test_the_node_probe_keeps_the_keys_the_architecture_rules_read():
    kept = modelconfig.trimmed({**DEEPSEEK_V32, "index_kpool": 2, "hidden_size": 7168, **EXAONE4})
    for key in ("architectures", "model_type", "kv_lora_rank", "index_topk", "index_kpool", "sliding_window_pattern"):
        assert key in kept
    assert "hidden_size" not in kept


def test_validate_warns_of_a_page_a_dsa_checkpoint_replaces(tmp_path, capsys, model_dir):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["model"] = {**cluster["model"], "path": _model_dir(model_dir, DEEPSEEK_V32)}
    cluster["tuning"] = {**cluster["tuning"], "all": {"page_size": 16}}
    inv = write_inventory(tmp_path, hosts, cluster)
    rc = main(["validate", str(inv)])
    out = capsys.readouterr().out  # a valid inventory's warnings follow the summary on stdout
    assert rc == 0, out
    assert "pdkit_cluster.tuning.all.page_size: page_size 16 is replaced" in out, out
    assert "read by validate on this machine" in out
    assert main(["validate", "--strict", str(inv)]) == 2


def test_validate_refuses_a_backend_the_local_model_refuses(tmp_path, capsys, model_dir):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["model"] = {**cluster["model"], "path": _model_dir(model_dir, GPT_OSS)}
    cluster["tuning"] = {**cluster["tuning"], "all": {"attention_backend": "flashinfer"}}
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "pdkit_cluster.tuning.all.attention_backend: attention backend flashinfer for GptOssForCausalLM" in err
