"""The opt-in model verification at start (pdkit_cluster.model.verify_checksum -> SGLang's --model-checksum;
issue 47 item 8's flag): off by default, rendered per release into every engine's argv, refused by validate
where pdkit knows no manifest for the model, and by the preflight where the node lacks the manifest; and what
SGLang's own verifier does with the staged layout (contract virtualenvs)."""

from __future__ import annotations

import copy
import io
import os
import subprocess

import pytest

from pdkit.agent import weightstore as store
from pdkit.hosts.preflight import (
    CHECKSUM_MANIFEST,
    check_host,
    model_dir_problems,
    model_dirs_fact_args,
    model_dirs_wanted,
)
from pdkit.inventory.loader import load_with_problems
from pdkit.render import flags
from pdkit.upstream import parsertable, startchecks, venvs
from pdkit.upstream.versions import SGLANG_RELEASES
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, require, write_inventory
from tests.node.test_preflight_checks import errors, rtx_facts, spec_host
from tests.node.test_preflight_model_dirs import FINE

STAGED = "/models/m/.pdkit-manifest.json"


def spec_with(tmp_path, version="0.5.23", **model):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    cluster["sglang_version"] = version
    cluster["model"].update(model)
    return load_with_problems(write_inventory(tmp_path, hosts, cluster))


def argvs(spec) -> dict[str, list[str]]:
    return {f"{h.name}/{e.name}": flags.sglang_args(spec, h, e) for h in spec.gpu_hosts for e in h.node.engines}


def checksum_values(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--model-checksum"]


# ------------------------------------------------------------------------------------------- rendering


def test_off_by_default_no_engine_gets_the_flag(tmp_path):
    spec, problems = spec_with(tmp_path)
    assert spec is not None, problems
    assert spec.cluster.model.verify_checksum is False and spec.cluster.model.checksum_source is None
    assert all(checksum_values(a) == [] for a in argvs(spec).values())


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_opt_in_gives_every_engine_the_staged_manifest(tmp_path, version):
    spec, problems = spec_with(tmp_path, version, verify_checksum=True)
    assert spec is not None, problems
    rendered = argvs(spec)
    assert {e.split("/")[1] for e in rendered} == {"prefill", "decode"}
    assert {name: checksum_values(a) for name, a in rendered.items()} == {name: [STAGED] for name in rendered}
    # the manifest is always named: a bare --model-checksum would make SGLang ask the hub for the model path's hashes
    assert all(a[a.index("--model-checksum") + 1].startswith("/") for a in rendered.values())


def test_a_declared_manifest_is_given_as_it_is(tmp_path):
    spec, problems = spec_with(tmp_path, verify_checksum=True, checksum_manifest="/srv/manifests/m.json")
    assert spec is not None, problems
    assert {tuple(checksum_values(a)) for a in argvs(spec).values()} == {("/srv/manifests/m.json",)}


def test_the_spelling_is_each_releases_own(monkeypatch):
    for version in SGLANG_RELEASES:
        option = next(o for o in parsertable.table()["sglang"][version]["options"] if o["dest"] == "model_checksum")
        assert option["takes"] == "?"  # SGLang's nargs="?", const="": a path, or nothing for the hub
        assert flags.model_checksum_args(version, "/m/x.json") == [option["flags"][0], "/m/x.json"]
    assert flags.model_checksum_args("0.5.23", None) == []
    # a release that spells it otherwise gets its own spelling; one without it is refused, naming the field
    table = copy.deepcopy(parsertable.table())
    for o in table["sglang"]["0.5.17"]["options"]:
        if o["dest"] == "model_checksum":
            o["flags"] = ["--model-file-checksum"]
    table["sglang"]["0.5.23"]["options"] = [o for o in table["sglang"]["0.5.23"]["options"]
                                            if o["dest"] != "model_checksum"]
    monkeypatch.setattr(parsertable, "table", lambda: table)
    assert flags.model_checksum_args("0.5.17", "/m/x.json") == ["--model-file-checksum", "/m/x.json"]
    with pytest.raises(ValueError, match="SGLang 0.5.23 has no --model-checksum: remove verify_checksum"):
        flags.model_checksum_args("0.5.23", "/m/x.json")


# ------------------------------------------------------------------------------------------- validate's refusals


@pytest.mark.parametrize("model, field, says", [
    ({"path": "org/model", "verify_checksum": True}, "pdkit_cluster.model",
     "path 'org/model' is a hub id, and pdkit knows no manifest for it (`pdkit stage` stages directories)"),
    ({"verify_checksum": True, "load_format": "dummy"}, "pdkit_cluster.model",
     "dummy weights are random and read no file"),
    ({"checksum_manifest": "/srv/manifests/m.json"}, "pdkit_cluster.model",
     "checksum_manifest is read only with verify_checksum: true"),
    ({"verify_checksum": True, "checksum_manifest": "manifests/m.json"}, "pdkit_cluster.model.checksum_manifest",
     "is not a plain absolute file path"),
    ({"verify_checksum": True, "checksum_manifest": "/home/u/m.json"}, "pdkit_cluster.model.checksum_manifest",
     "is under /home, which the engine units cannot see"),
])
def test_validate_refuses_a_model_without_a_manifest_pdkit_knows(tmp_path, model, field, says):
    spec, problems = spec_with(tmp_path, **model)
    assert spec is None
    found = [p for p in problems if p.severity == "error" and p.field == field]
    assert found and says in found[0].message, problems
    assert found[0].host != "<inventory>"


def test_a_hub_id_with_a_declared_manifest_is_accepted(tmp_path):
    spec, problems = spec_with(tmp_path, path="org/model", verify_checksum=True,
                               checksum_manifest="/srv/manifests/model.json")
    assert spec is not None, problems
    assert {tuple(checksum_values(a)) for a in argvs(spec).values()} == {("/srv/manifests/model.json",)}


# ------------------------------------------------------------------------------------------- the preflight


def _verifying(tmp_path, **model):
    spec, host = spec_host(tmp_path)
    update = {"verify_checksum": True, **model}
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(
        update={"model": spec.cluster.model.model_copy(update=update)})})
    return spec, host


def test_the_preflight_probes_the_manifest_and_refuses_a_node_without_it(tmp_path):
    spec, host = _verifying(tmp_path)
    assert model_dirs_fact_args(spec, host) == ("pdkit", ("/models/m", STAGED))
    wanted, _ = model_dirs_wanted(spec, host)
    assert {(d.engine, d.what, d.field) for d in wanted if d.path == STAGED} == {
        ("prefill", CHECKSUM_MANIFEST, "pdkit_cluster.model.verify_checksum"),
        ("decode", CHECKSUM_MANIFEST, "pdkit_cluster.model.verify_checksum")}
    paths = {"/models/m": FINE, STAGED: {"exists": False, "existing_parent": "/models/m"}}
    facts = {**rtx_facts(), "model_dirs": {"user": "pdkit", "user_exists": True, "how": "runuser", "paths": paths}}
    found = [e for e in errors(check_host(spec, host, facts)) if "checksum manifest" in e]
    assert len(found) == 2
    assert found[0].startswith(f"model: gpu01: engine 'prefill' checksum manifest {STAGED} "
                               "(pdkit_cluster.model.verify_checksum): does not exist on gpu01, so pdkit knows no "
                               "manifest for this model: stage the model with `pdkit stage INVENTORY --source DIR`")
    assert "or set verify_checksum: false" in found[0]
    paths[STAGED] = {"exists": True, "is_dir": False}
    assert [e for e in errors(check_host(spec, host, facts)) if "checksum manifest" in e] == []


def test_a_declared_manifest_missing_on_the_node_names_its_field(tmp_path):
    spec, host = _verifying(tmp_path, checksum_manifest="/srv/m.json")
    wanted = next(d for d in model_dirs_wanted(spec, host)[0] if d.what == CHECKSUM_MANIFEST)
    [why] = model_dir_problems("gpu01", "pdkit", wanted, {"exists": False, "existing_parent": "/srv"})
    assert "/srv/m.json (pdkit_cluster.model.checksum_manifest): does not exist on gpu01" in why
    assert "copy the manifest there, or correct checksum_manifest" in why
    [why] = model_dir_problems("gpu01", "pdkit", wanted, {"exists": True, "is_dir": True})
    assert "is a directory; valid: the manifest file" in why


# ------------------------------------------------------------------------------------------- SGLang's verifier


def _staged(tmp_path) -> tuple[str, str]:
    """A model staged the way `pdkit stage` leaves it: the link, and the file it points at."""
    src = tmp_path / "src"
    src.mkdir()
    for i in (1, 2):
        (src / f"model-0000{i}-of-00002.safetensors").write_bytes(os.urandom(50_000 + i))
    (src / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    manifest = store.generate(str(src))
    wid = store.weights_id(manifest)
    (tmp_path / "models").mkdir()
    target = str(tmp_path / "models" / "m")
    for name, state in store.prepare(target, manifest)["files"].items():
        store.receive(target, wid, name, state["have"], io.BytesIO((src / name).read_bytes()[state["have"]:]))
    store.commit(target, wid, None)
    store.activate(target, wid)
    return target, store.version_dir(target, wid)


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_sglangs_verifier_reads_the_staged_manifest_through_the_link_and_fails_as_documented(tmp_path, version):
    """What the engine runs at start with pdkit's argv: verify(model_path, <model path>/.pdkit-manifest.json)."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    python, script = venvs.env_python(f"sglang-{version}"), root / "srt" / "utils" / "model_file_verifier.py"
    target, version_dir = _staged(tmp_path)
    source = flags.model_checksum_args(version, f"{target}/{store.MANIFEST_NAME}")[1]

    def verify(model_path: str, manifest: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), str(script), "verify", "--model-path", model_path, "--model-checksum",
                               manifest], capture_output=True, text=True, timeout=120)

    run = verify(target, source)
    assert run.returncode == 0 and "All 3 files verified successfully" in run.stdout, run.stderr[-2000:]
    shard = os.path.join(version_dir, "model-00002-of-00002.safetensors")
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 1]))
    run = verify(target, source)
    assert run.returncode != 0 and "Integrity check failed: model-00002-of-00002.safetensors: mismatch" in run.stderr
    # a manifest path that is no file is taken for a hub repo id: SGLang goes to the hub, not "file not found"
    run = verify(target, f"{tmp_path}/no-such-manifest.json")
    assert "verified successfully" not in run.stdout and "_load_file_infos_from_hf" in run.stderr
