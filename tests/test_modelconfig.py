"""Issue 46 item 4: the model's own config.json, read by validate where the model directory is on the
deploying machine (the preflight's half is in tests/node/test_preflight_model_dirs.py)."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from pdkit import modelconfig
from pdkit.cli import main
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
