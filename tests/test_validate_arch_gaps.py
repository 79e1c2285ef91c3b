"""Issue 46, the model's remaining gaps, through `pdkit validate` on a config.json validate reads on this machine:
Gemma2/3's sliding windows without SGLang's hybrid SWA pool (item 1), fa4's page 128 on SM100 (item 2), the mamba
buffer strategy derived from the linear-attention registry (item 3) and a PD pair judged on the pages SGLang really
runs (item 4). Each bad inventory is the shared base plus one mistake; each valid one must stay valid."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from pdkit.cli import main
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory

GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "sliding_window": 1024,
          "max_position_embeddings": 131072}
GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "sliding_window": 4096,
          "max_position_embeddings": 8192}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 40960}
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "max_position_embeddings": 262144}
GIGACHAT35 = {"architectures": ["GigaChat35ForCausalLM"], "model_type": "gigachat35", "max_position_embeddings": 131072}
DSA = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "kv_lora_rank": 512,
       "index_topk": 2048, "max_position_embeddings": 163840}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "kv_lora_rank": 512,
        "max_position_embeddings": 163840}
B200 = {"model": "NVIDIA B200", "count": 4, "memory_gib": 180, "compute_capability": "10.0", "numa": [0, 0, 1, 1]}


@pytest.fixture
def model_dir():
    """A model directory outside /tmp, /home and /root (validate refuses those: the engine units cannot see them)."""
    top = Path(tempfile.mkdtemp(prefix="pdkit-model-", dir="/var/lib"))
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _inventory(tmp_path, model_dir, config, tuning=None, version="0.5.23", gpus=None, engines=None):
    """The base inventory on CONFIG's checkpoint (None: a model directory validate cannot read), with cluster
    TUNING, release VERSION, gpu01's GPUS and per-engine updates ENGINES {index on gpu01: {...}}."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    path = "/models/not-on-this-machine"
    if config is not None:
        (model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": 32000}))
        path = str(model_dir)
    cluster.update(sglang_version=version, model={**cluster["model"], "path": path})
    cluster["tuning"] = {**cluster["tuning"], **(tuning or {})}
    if gpus is not None:
        hosts["gpu01"]["pdkit_node"]["gpus"] = gpus
    for index, update in (engines or {}).items():
        hosts["gpu01"]["pdkit_node"]["engines"][index].update(update)
    return write_inventory(tmp_path, hosts, cluster)


def _validate(inv, capsys):
    rc = main(["validate", str(inv)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.out + captured.err


def _lines(text, severity, needle):
    return [line for line in text.splitlines() if line.strip().startswith(severity) and needle in line]


# (id, config, tuning, version, gpus, engines, field the error names, a phrase)
BAD = [
    # item 1: hpc_ops raises on the Gemma family's sliding-window layers
    ("gemma3-hpc-ops", GEMMA3, {"all": {"attention_backend": "hpc_ops"}}, "0.5.23", None, None,
     "gpu01: pdkit_cluster.tuning.all.attention_backend", "does not support sliding window"),
    ("gemma2-hpc-ops-on-0517", GEMMA2, {"all": {"attention_backend": "hpc_ops"}}, "0.5.17", None, None,
     "gpu01: pdkit_cluster.tuning.all.attention_backend", "does not support sliding window"),
    # item 3: GigaChat 3.5 uses the mamba radix cache through 0.5.23's linear-attention registry and cannot take
    # extra_buffer: no_buffer refuses a page above 1 on the prefill (its radix cache is on)
    ("gigachat35-no-buffer-page", GIGACHAT35, {"all": {"page_size": 64}}, "0.5.23", None, None,
     "gpu01: pdkit_cluster.tuning.all.page_size", "no_buffer only supports page_size=1."),
    # item 3: Qwen3-Next takes extra_buffer only with the triton linear-attention backend: another lands on no_buffer
    ("qwen3-next-no-buffer-by-linear-backend", QWEN3_NEXT, {"all": {"page_size": 64}}, "0.5.23", None,
     {0: {"extra_args": ["--linear-attn-backend", "flashinfer"]}},
     "gpu01: pdkit_cluster.tuning.all.page_size", "extra_buffer needs --linear-attn-backend triton"),
    # item 3: an explicit no_buffer with the overlap schedule on
    ("explicit-no-buffer-with-overlap", QWEN3_NEXT, None, "0.5.17", None,
     {0: {"extra_args": ["--mamba-radix-cache-strategy", "no_buffer"]}},
     "gpu01: pdkit_node.engines[0].tuning.overlap_schedule", "no_buffer do not support overlap schedule"),
    # item 3: an explicit extra_buffer on a checkpoint without mamba state (0.5.23)
    ("extra-buffer-on-a-dense-model", QWEN3, None, "0.5.23", None,
     {0: {"extra_args": ["--mamba-radix-cache-strategy", "extra_buffer"]}},
     "gpu01: pdkit_node.engines[0].extra_args", "needs mamba state"),
    # items 2 and 4: equal pages on paper, fa4 on SM100 makes the prefill's 128: one pair error naming both engines
    ("fa4-pair-on-sm100", QWEN3, {"all": {"page_size": 64}}, "0.5.23", B200,
     {0: {"tuning": {"attention_backend": "fa4"}}, 1: {"tuning": {"attention_backend": "flashinfer"}}},
     "gpu01: pdkit_node.engines[1].tuning.page_size", "gpu01/decode runs KV page size 64"),
    # item 4: DeepSeek-V3 (MLA) without a backend on SM100 takes trtllm_mla (page 64); the prefill sets flashinfer
    ("dsv3-trtllm-mla-pair-on-sm100", DSV3, {"all": {"page_size": 1}}, "0.5.17", B200,
     {0: {"tuning": {"attention_backend": "flashinfer"}}},
     "gpu01: pdkit_node.engines[1].tuning.page_size", "takes trtllm_mla on SM100"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_inventory_is_refused_naming_host_and_field(case, tmp_path, model_dir, capsys):
    _, config, tuning, version, gpus, engines, field, phrase = case
    rc, text = _validate(_inventory(tmp_path, model_dir, config, tuning, version, gpus, engines), capsys)
    assert rc == 2, text
    matching = _lines(text, "error", field)
    assert matching and any(phrase in line for line in matching), text


def test_a_pair_error_names_both_engines_and_is_reported_once(tmp_path, model_dir, capsys):
    inv = _inventory(tmp_path, model_dir, QWEN3, {"all": {"page_size": 64}}, "0.5.23", B200,
                     {0: {"tuning": {"attention_backend": "fa4"}}, 1: {"tuning": {"attention_backend": "flashinfer"}}})
    rc, text = _validate(inv, capsys)
    pair = _lines(text, "error", "runs KV page size")
    assert rc == 2 and len(pair) == 1, text
    assert "gpu01/decode" in pair[0] and "gpu01/prefill 128" in pair[0] and "_fa4_page_constraint" in pair[0]
    assert "read by validate on this machine" in pair[0]
    # the prefill's own field is warned that fa4 replaces its page
    assert _lines(text, "warning", "gpu01: pdkit_cluster.tuning.all.page_size: page_size 64 is replaced"), text


# (id, config, tuning, version, gpus, engines, warnings that must be there (field needles))
VALID = [
    # item 1: Gemma2/3 take the usual backends; SGLang only turns their hybrid SWA pool off
    ("gemma3-fa3", GEMMA3, {"all": {"attention_backend": "fa3"}}, "0.5.23", None, None, []),
    ("gemma3-unset", GEMMA3, None, "0.5.17", None, None, []),
    ("gemma2-flashinfer-page-16-pair", GEMMA2, {"all": {"attention_backend": "flashinfer", "page_size": 16}},
     "0.5.23", None, None, []),
    # a hybrid SWA pool ratio for Gemma3 has no effect: a warning, not an error
    ("gemma3-swa-ratio", GEMMA3, None, "0.5.23", None, {0: {"extra_args": ["--swa-full-tokens-ratio", "0.5"]}},
     ["gpu01: pdkit_node.engines[0].extra_args"]),
    # item 2: fa4 on both engines of an SM100 pair runs 128 on both; fa4 on Hopper keeps the page given
    ("fa4-both-on-sm100", QWEN3, {"all": {"attention_backend": "fa4", "page_size": 128}}, "0.5.23", B200, None, []),
    ("fa4-prefill-on-hopper", QWEN3, {"all": {"page_size": 64}}, "0.5.23", None,
     {0: {"tuning": {"attention_backend": "fa4"}}, 1: {"tuning": {"attention_backend": "flashinfer"}}}, []),
    # item 3: Qwen3-Next with paging takes extra_buffer (triton linear attention): page 64 is valid
    ("qwen3-next-extra-buffer", QWEN3_NEXT, {"all": {"page_size": 64}}, "0.5.23", None, None, []),
    # item 3: GigaChat 3.5 with the radix cache off has no mamba radix cache; on 0.5.17 it is not registered
    # (a PD decode keeps no radix cache: page 64 is valid there in both releases)
    ("gigachat35-radix-off", GIGACHAT35, {"all": {"page_size": 64}, "prefill": {"radix_cache": False}}, "0.5.23",
     None, None, []),
    ("gigachat35-on-0517", GIGACHAT35, {"all": {"page_size": 64}}, "0.5.17", None, None, []),
    # item 4: pages that differ on paper but not in effect: DSA runs 64 on both (each engine's page warned)
    ("dsa-pair-differs-on-paper-only", DSA, {"prefill": {"page_size": 32}, "decode": {"page_size": 64}}, "0.5.23",
     None, None, ["pdkit_cluster.tuning.prefill.page_size: page_size 32 is replaced"]),
]


@pytest.mark.parametrize("case", VALID, ids=[c[0] for c in VALID])
def test_a_valid_inventory_stays_valid(case, tmp_path, model_dir, capsys):
    _, config, tuning, version, gpus, engines, warned = case
    rc, text = _validate(_inventory(tmp_path, model_dir, config, tuning, version, gpus, engines), capsys)
    assert rc == 0, text
    for needle in warned:
        assert _lines(text, "warning", needle), text
    # nothing else is warned of (a B200 node's NCCL profile advice is the base's own, not this rule's)
    others = [line for line in text.splitlines() if line.strip().startswith("warning") and "nccl_profile" not in line
              and not any(needle in line for needle in warned)]
    assert not others, text


def test_the_config_decides_a_pair_that_differs_on_paper(tmp_path, model_dir, capsys):
    """The same DSA pair with pages 32/64: valid when validate reads the checkpoint (SGLang runs 64 on both), a
    pair error when it cannot (the pages then differ as written)."""
    tuning = {"prefill": {"page_size": 32}, "decode": {"page_size": 64}}
    rc, text = _validate(_inventory(tmp_path, model_dir, DSA, tuning), capsys)
    assert rc == 0 and not _lines(text, "error", "runs KV page size"), text
    rc, text = _validate(_inventory(tmp_path, model_dir, None, tuning), capsys)
    assert rc == 2 and _lines(text, "error", "runs KV page size 64"), text


def test_an_undeclared_gpu_generation_makes_the_fa4_pair_a_warning(tmp_path, model_dir, capsys):
    gpus = {k: v for k, v in B200.items() if k != "compute_capability"}
    inv = _inventory(tmp_path, model_dir, QWEN3, {"all": {"page_size": 64}}, "0.5.23", gpus,
                     {0: {"tuning": {"attention_backend": "fa4"}}, 1: {"tuning": {"attention_backend": "flashinfer"}}})
    rc, text = _validate(inv, capsys)
    assert not _lines(text, "error", "runs KV page size"), text


def test_the_preflight_judges_the_pair_on_the_config_the_node_holds(tmp_path):
    """Item 4 on the node: validate could not read the model (a warning: fa4's page depends on the checkpoint), the
    preflight's model probe sends config.json's keys and the same pair rule makes it one error naming both engines;
    an MLA checkpoint (fa4 keeps its page) passes."""
    from pdkit.hosts.preflight import check_host
    from tests.node.runner import NODE
    from tests.node.test_preflight_checks import rtx_facts, spec_host
    from tests.node.test_preflight_model_dirs import FINE

    node = copy.deepcopy(NODE)
    node["gpus"] = {**node["gpus"], "model": "NVIDIA B200", "compute_capability": "10.0", "memory_gib": 180}
    node["engines"][0]["tuning"] = {"attention_backend": "fa4", "page_size": 64}
    node["engines"][1]["tuning"] = {"attention_backend": "flashinfer", "page_size": 64}
    spec, host = spec_host(tmp_path, node)

    def pair_findings(config):
        probe = {**FINE, "config_keys": config}
        facts = {**rtx_facts(), "model_dirs": {"user": "pdkit", "user_exists": True, "how": "runuser",
                                               "paths": {"/models/m": probe}}}
        return [f for f in check_host(spec, host, facts) if f.check == "model" and "runs KV page size" in f.message]

    found = pair_findings(QWEN3)
    assert [f.severity for f in found] == ["error"], found
    assert "gpu01/decode runs KV page size 64" in found[0].message and "gpu01/prefill 128" in found[0].message
    assert "read by the preflight on gpu01" in found[0].message
    assert pair_findings(DSV3) == []
