"""Issue 32 class 5: the preflight's model-directory check. ModelDirs' probe run for real on
directories made here (as root: through runuser, as the user `nobody`), and the verdicts
(pdkit.hosts.preflight.model_dir_problems, check_host) on probes of every kind."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from pdkit.hosts.preflight import ModelDir, check_host, model_dir_problems, model_dirs_fact_args, model_dirs_wanted
from roles.node_facts import MODEL_DIRS_MARK, ModelDirs, NodeFacts
from tests.node.runner import NODE
from tests.node.test_preflight_checks import errors, rtx_facts, spec_host


def _run(command: str) -> list[str]:
    proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.fixture
def models():
    """A world-traversable directory of model directories (pytest's tmp_path is root-only)."""
    top = tempfile.mkdtemp(prefix="pdkit-models-", dir="/var/tmp")
    os.chmod(top, 0o755)

    def make(name, files=(), mode=0o755, index=None):
        d = os.path.join(top, name)
        os.makedirs(d)
        for f in files:
            with open(os.path.join(d, f), "w") as fh:
                fh.write("{}")
            os.chmod(os.path.join(d, f), 0o644)
        if index is not None:
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
                json.dump({"weight_map": {f"w{i}": shard for i, shard in enumerate(index)}}, fh)
            os.chmod(os.path.join(d, "model.safetensors.index.json"), 0o644)
        os.chmod(d, mode)
        return d

    yield make, top
    shutil.rmtree(top)


def _probe(user, *paths):
    return ModelDirs().process(_run(ModelDirs().command(user, tuple(paths))))


def test_the_probe_reads_a_complete_checkpoint_and_what_is_missing(models):
    make, top = models
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    good = make("good", ["config.json", *shards], index=shards)
    partial = make("partial", ["config.json", shards[0]], index=shards)
    empty = make("empty")
    single = make("single", ["config.json", "model.safetensors"])
    out = _probe("nobody", good, partial, empty, single, f"{top}/absent/deeper")
    assert out["user"] == "nobody" and out["user_exists"] is True and out["how"] in ("runuser", "mode bits")
    p = out["paths"]
    assert p[good] == {"exists": True, "is_dir": True, "config": True, "indexes": ["model.safetensors.index.json"], "weights": [],
                       "safetensors": 2, "missing_shards": [], "missing_count": 0, "unreadable": []}
    assert p[partial]["missing_shards"] == [shards[1]] and p[partial]["missing_count"] == 1
    assert p[empty]["config"] is False and p[empty]["indexes"] == [] and p[empty]["safetensors"] == 0
    assert p[single]["weights"] == ["model.safetensors"] and p[single]["unreadable"] == []
    assert p[f"{top}/absent/deeper"] == {"exists": False, "existing_parent": top}


def test_the_probe_sees_what_the_service_user_cannot_read(models):
    make, _ = models
    private = make("private", ["config.json", "model.safetensors"], mode=0o700)
    hidden_config = make("hidden-config", ["config.json", "model.safetensors"])
    os.chmod(os.path.join(hidden_config, "config.json"), 0o600)
    out = _probe("nobody", private, hidden_config)
    assert out["paths"][private]["unreadable"] == [private]
    assert out["paths"][hidden_config]["unreadable"] == [os.path.join(hidden_config, "config.json")]
    # before the deploy creates the service user: the mode bits, as a user in no group of the files
    later = _probe("pdkit-no-such-user", private, hidden_config)
    assert later["user_exists"] is False and later["how"] == "mode bits"
    assert later["paths"][private]["unreadable"] == [private]
    assert later["paths"][hidden_config]["unreadable"] == [os.path.join(hidden_config, "config.json")]


def test_the_probe_rides_in_the_node_facts_round_trip(models):
    make, _ = models
    good = make("good", ["config.json", "model.safetensors"])
    command = NodeFacts().command(("arch",), model_dirs=("nobody", (good,)))
    values = NodeFacts().process(_run(command))
    assert values["arch"] and values["model_dirs"]["paths"][good]["config"] is True
    # without model directories the command is what it was before the check existed
    assert NodeFacts().command(("arch",)) == NodeFacts().command(("arch",), model_dirs=None)
    assert "model_dirs" not in NodeFacts().command(("arch",))
    assert ModelDirs().process(["garbage"]) == {"error": "the probe failed: garbage"}
    assert ModelDirs().process([MODEL_DIRS_MARK + '{"user": "u", "paths": {}}']) == {"user": "u", "paths": {}}


# ---- the verdicts

FINE = {"exists": True, "is_dir": True, "config": True, "indexes": ["model.safetensors.index.json"], "weights": [],
        "safetensors": 2, "missing_shards": [], "missing_count": 0, "unreadable": []}
MODEL = ModelDir("decode", "model", "pdkit_cluster.model.path", "/models/m", True, True)


@pytest.mark.parametrize("probe,wanted,phrase", [
    ({"exists": False, "existing_parent": "/models"}, MODEL, "does not exist on gpu01 (the nearest existing directory is /models)"),
    ({"exists": True, "is_dir": False}, MODEL, "is not a directory"),
    ({**FINE, "config": False}, MODEL, "has no config.json"),
    ({**FINE, "indexes": [], "safetensors": 0}, MODEL, "or set load_format: dummy"),
    ({**FINE, "missing_shards": ["a.safetensors"], "missing_count": 4}, MODEL, "names 4 weight file(s) the directory lacks (a.safetensors and 3 more)"),
    ({**FINE, "unreadable": ["/models/m"], "_how": "runuser", "_user_exists": True}, MODEL, "pdkit (checked with runuser) and cannot read /models/m"),
    ({**FINE, "unreadable": ["/models/m/config.json"], "_how": "mode bits", "_user_exists": False}, MODEL, "who does not exist yet"),
    ({"error": "PermissionError: x"}, MODEL, "could not be checked: PermissionError"),
    (None, MODEL, "not probed"),
], ids=["absent", "a-file", "no-config", "no-weights", "missing-shards", "unreadable", "unreadable-user-not-yet", "probe-error", "not-probed"])
def test_each_problem_names_host_engine_path_and_what_would_do(probe, wanted, phrase):
    (problem,) = model_dir_problems("gpu01", "pdkit", wanted, probe)
    assert problem.startswith("gpu01: engine 'decode' model /models/m (pdkit_cluster.model.path): ")
    assert phrase in problem


def test_dummy_weights_and_a_tokenizer_need_less():
    bare = {**FINE, "config": False, "indexes": [], "safetensors": 0}
    dummy = ModelDir("decode", "model", "pdkit_cluster.model.path", "/models/m", True, False)
    assert model_dir_problems("gpu01", "pdkit", dummy, {**bare, "config": True}) == []
    tokenizer = ModelDir("decode", "tokenizer", "pdkit_cluster.model.tokenizer_path", "/models/tok", False, False)
    assert model_dir_problems("gpu01", "pdkit", tokenizer, bare) == []
    assert model_dir_problems("gpu01", "pdkit", MODEL, FINE) == []


def _node_with(tmp_path, cluster_update=None, node=None):
    spec, host = spec_host(tmp_path, node)
    if cluster_update:
        spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update=cluster_update)})
    return spec, host


def test_check_host_fails_naming_host_engine_and_path(tmp_path):
    spec, host = _node_with(tmp_path)
    assert model_dirs_fact_args(spec, host) == ("pdkit", ("/models/m",))
    facts = {**rtx_facts(), "model_dirs": {"user": "pdkit", "user_exists": True, "how": "runuser", "paths": {"/models/m": {**FINE, "config": False}}}}
    found = errors(check_host(spec, host, facts))
    assert found == [
        "model: gpu01: engine 'prefill' model /models/m (pdkit_cluster.model.path): has no config.json (SGLang reads the architecture from it): give the directory of a Hugging Face checkpoint, the one that holds config.json",
        "model: gpu01: engine 'decode' model /models/m (pdkit_cluster.model.path): has no config.json (SGLang reads the architecture from it): give the directory of a Hugging Face checkpoint, the one that holds config.json",
    ]
    facts["model_dirs"]["paths"]["/models/m"] = FINE
    assert errors(check_host(spec, host, facts)) == []


def test_load_format_dummy_skips_the_weights(tmp_path):
    spec, host = _node_with(tmp_path)
    model = spec.cluster.model.model_copy(update={"load_format": "dummy"})
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"model": model})})
    wanted, _ = model_dirs_wanted(spec, host)
    assert {(d.engine, d.need_config, d.need_weights) for d in wanted} == {("prefill", True, False), ("decode", True, False)}
    facts = {**rtx_facts(), "model_dirs": {"user": "pdkit", "paths": {"/models/m": {**FINE, "indexes": [], "safetensors": 0}}}}
    assert errors(check_host(spec, host, facts)) == []


def test_a_hub_id_is_noted_not_checked(tmp_path):
    spec, host = _node_with(tmp_path)
    model = spec.cluster.model.model_copy(update={"path": "meta-llama/Llama-3.1-8B-Instruct"})
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"model": model})})
    assert model_dirs_fact_args(spec, host) is None
    notes = [f.message for f in check_host(spec, host, rtx_facts()) if f.check == "model"]
    assert notes == ["engine 'prefill' model meta-llama/Llama-3.1-8B-Instruct: a Hugging Face hub id, not a directory on the node: not checked "
                     "(the engine downloads it at start; a gated model needs pdkit_cluster.secrets.hf_token)",
                     "engine 'decode' model meta-llama/Llama-3.1-8B-Instruct: a Hugging Face hub id, not a directory on the node: not checked "
                     "(the engine downloads it at start; a gated model needs pdkit_cluster.secrets.hf_token)"]


def test_the_sim_and_engines_not_started_are_not_checked(tmp_path):
    spec, host = _node_with(tmp_path, {"engine": "sim"})
    assert model_dirs_wanted(spec, host) == ([], []) and model_dirs_fact_args(spec, host) is None
    spec, host = spec_host(tmp_path, {**copy.deepcopy(NODE), "gpu": "none"})
    assert model_dirs_wanted(spec, host) == ([], [])


def test_a_fact_that_was_not_read_is_a_warning_not_silence(tmp_path):
    spec, host = _node_with(tmp_path)
    found = [(f.severity, f.message) for f in check_host(spec, host, rtx_facts()) if f.check == "model"]
    assert found == [("warning", "the engines' model directories were not probed (/models/m)")]


def test_the_probe_sends_the_config_keys_the_rules_read(models):
    """Issue 46 item 4: the probe keeps pdkit.spec.modelconfig.CONFIG_KEYS of config.json (and of a text sub-config)."""
    make, _top = models
    d = make("ctx", ["model.safetensors"])
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 8192, "hidden_size": 4096,
                   "text_config": {"max_position_embeddings": 4096, "vocab_size": 1}}, fh)
    os.chmod(os.path.join(d, "config.json"), 0o644)
    got = _probe("nobody", d)["paths"][d]
    assert got["config"] and got["config_keys"] == {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 8192,
                                                    "text_config": {"max_position_embeddings": 4096}}, got


@pytest.mark.parametrize("context, allow, expect", [(32768, False, True), (8192, False, False), (32768, True, False)])
def test_check_host_refuses_a_context_longer_than_the_node_s_model(tmp_path, context, allow, expect):
    """The config.json the node holds against context_length: SGLang refuses a longer one at start unless
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (tuning.allow_longer_context)."""
    tuning = {"context_length": context, **({"allow_longer_context": True} if allow else {})}
    node = copy.deepcopy(NODE)
    for engine in node["engines"]:
        engine["tuning"] = {**engine.get("tuning", {}), **tuning}
    spec, host = _node_with(tmp_path, node=node)
    probe = {**FINE, "config_keys": {"max_position_embeddings": 8192}}
    facts = {**rtx_facts(), "model_dirs": {"user": "pdkit", "user_exists": True, "how": "runuser", "paths": {"/models/m": probe}}}
    found = [e for e in errors(check_host(spec, host, facts)) if "context_length" in e]
    if expect:
        assert len(found) == 2 and "above the model's own context length 8192 (max_position_embeddings in " \
            "/models/m/config.json, read by the preflight on gpu01)" in found[0], found
    else:
        assert found == []


@pytest.mark.parametrize("backend, expect", [("flashinfer", True), ("triton", False)])
def test_the_models_architecture_rules_run_on_the_config_the_node_holds(tmp_path, backend, expect):
    """pdkit.spec.modelconfig.architecture_problems on the node's config.json keys (issue 46 item 4): an Olmo2
    checkpoint makes SGLang refuse FlashInfer attention at start; triton passes."""
    node = copy.deepcopy(NODE)
    for engine in node["engines"]:
        engine["tuning"] = {**engine.get("tuning", {}), "attention_backend": backend}
    spec, host = _node_with(tmp_path, node=node)
    probe = {**FINE, "config_keys": {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
                                     "max_position_embeddings": 4096}}
    facts = {**rtx_facts(), "model_dirs": {"user": "pdkit", "user_exists": True, "how": "runuser", "paths": {"/models/m": probe}}}
    found = [e for e in errors(check_host(spec, host, facts)) if "Olmo2" in e or "FlashInfer" in e]
    if expect:
        assert found and all("read by the preflight on gpu01" in e for e in found), found
    else:
        assert found == []
