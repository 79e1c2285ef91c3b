"""Issue 47 item 6: each release records the weights its engines ran on (the SHA-256 of the staged version's
manifest); `pdkit releases` shows it; a restore switches the model path back, and refuses before any change
when those weights are gone from the node (a temp root, as tests/test_releases.py)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from pdkit.agent import releases
from pdkit.agent import weightstore as store
from pdkit.roll.commands import format_releases, rollback_weights_refusal
from tests.test_releases import RELEASE_JSON, RELEASES, SERVICES, Systemd, _config, _t, _venv

MODEL = "/srv/models/m"


def _engines_json(root, model: str = MODEL) -> None:
    p = root / RELEASE_JSON.lstrip("/")
    data = json.loads(p.read_text())
    data["engines"] = {"decode": {"role": "decode", "argv": ["--model-path", model, "--port", "30001"]},
                       "prefill": {"role": "prefill", "argv": [f"--model-path={model}"]}}
    p.write_text(json.dumps(data))


def _weights(root, seed: str) -> tuple[str, str]:
    """A staged version of MODEL (store.py's layout) holding a manifest; (version name, manifest sha256)."""
    files = {"model.safetensors": {"sha256": hashlib.sha256(seed.encode()).hexdigest(), "size": len(seed)}}
    wid = store.weights_id(files)
    version = store.version_name(MODEL, wid)
    d = root / "srv/models" / version
    d.mkdir(parents=True, exist_ok=True)
    (d / store.MANIFEST_NAME).write_bytes(store.manifest_bytes(files))
    (d / "model.safetensors").write_text(seed)
    return version, wid


def _point(root, version: str) -> None:
    link = root / MODEL.lstrip("/")
    if link.is_symlink():
        link.unlink()
    link.symlink_to(version)


def _record(root, second: int):
    return releases.record(root=root, releases_dir=RELEASES, release_json=RELEASE_JSON, command=f"test {second}",
                           services=SERVICES, venv_links=["/opt/pdkit/venv"], now=_t(second))


def _node(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    _engines_json(tmp_path)
    _venv(tmp_path, "node-1")


def test_the_layout_is_spelt_the_same_by_the_store_and_the_releases():
    assert (releases.WEIGHTS_MARK, releases.WEIGHTS_MANIFEST) == (store.VERSION_MARK, store.MANIFEST_NAME)
    name = store.version_name(MODEL, "ab" * 32)
    assert releases.is_weights_version(MODEL, name) and store.is_version_of(MODEL, name)
    assert not releases.is_weights_version(MODEL, name + store.PARTIAL_SUFFIX)


def test_a_release_records_the_weights_manifest_hash_and_a_new_version_is_a_new_release(tmp_path):
    _node(tmp_path)
    v1, w1 = _weights(tmp_path, "one")
    _point(tmp_path, v1)
    first = _record(tmp_path, 1)
    assert first["weights"] == {MODEL: {"version": v1, "sha256": w1}}
    assert w1 == store.weights_id({"model.safetensors": {"sha256": hashlib.sha256(b"one").hexdigest(), "size": 3}})
    assert _record(tmp_path, 2)["id"] == first["id"]  # nothing changed: no new release
    v2, w2 = _weights(tmp_path, "two")
    _point(tmp_path, v2)
    second = _record(tmp_path, 3)
    assert second["id"] != first["id"] and second["weights"][MODEL]["sha256"] == w2
    listed = releases.list_releases(root=tmp_path, releases_dir=RELEASES)
    assert [r["weights"][MODEL]["sha256"] for r in listed["releases"]] == [w1, w2]
    text = format_releases("gpu1", listed, planned_hash="")
    assert f"weights {w1[:16]}" in text and f"weights {w2[:16]}" in text


def test_a_model_that_is_no_staged_version_records_no_weights(tmp_path):
    _node(tmp_path)
    (tmp_path / "srv/models/m").mkdir(parents=True)  # copied by hand: pdkit cannot say which weights
    assert _record(tmp_path, 1)["weights"] == {}


def test_a_rollback_switches_the_weights_back_and_restarts_the_engines(tmp_path):
    _node(tmp_path)
    v1, _ = _weights(tmp_path, "one")
    _point(tmp_path, v1)
    _record(tmp_path, 1)
    v2, _ = _weights(tmp_path, "two")
    _point(tmp_path, v2)
    _record(tmp_path, 2)
    systemd = Systemd()
    out = releases.restore(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON,
                           systemctl=systemd.systemctl, unit_active=lambda u: True, wait=systemd.wait)
    assert out["weights"] == {MODEL: v1} and os.readlink(tmp_path / "srv/models/m") == v1
    assert "pdkit-engine-decode.service" in systemd.restarted()  # the engines read the model at start
    assert "pdkit-exporter.service" not in systemd.restarted()


def test_a_rollback_refuses_before_any_change_when_its_weights_are_gone(tmp_path):
    _node(tmp_path)
    v1, w1 = _weights(tmp_path, "one")
    _point(tmp_path, v1)
    first = _record(tmp_path, 1)
    v2, _ = _weights(tmp_path, "two")
    _point(tmp_path, v2)
    _config(tmp_path, "A=2\n", "{}\n")
    _engines_json(tmp_path)
    _record(tmp_path, 2)
    import shutil

    shutil.rmtree(tmp_path / "srv/models" / v1)
    listed = releases.list_releases(root=tmp_path, releases_dir=RELEASES)
    gone = listed["releases"][0]["weights_missing"]
    assert gone == [f"/srv/models/{v1} (weights {w1[:16]} of {MODEL})"]
    assert "GONE" in format_releases("gpu1", listed, planned_hash="")
    refusal = rollback_weights_refusal("gpu1", listed, None)
    assert refusal and "gpu1" in refusal and first["id"] in refusal and f"/srv/models/{v1}" in refusal
    assert rollback_weights_refusal("gpu1", listed, listed["releases"][1]["id"]) is None
    systemd = Systemd()
    with pytest.raises(releases.ReleaseError, match=f"release {first['id']} ran on weights that are gone"):
        releases.restore(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON,
                         systemctl=systemd.systemctl, unit_active=lambda u: True, wait=systemd.wait)
    assert systemd.calls == [] and os.readlink(tmp_path / "srv/models/m") == v2
    assert (tmp_path / "etc/pdkit/engines/decode.env").read_text() == "A=2\n"


def test_switching_weights_is_a_release_and_the_old_weights_go_only_once_it_ran(tmp_path):
    _node(tmp_path)
    v1, _ = _weights(tmp_path, "one")
    _point(tmp_path, v1)
    first = _record(tmp_path, 1)
    v2, w2 = _weights(tmp_path, "two")
    systemd = Systemd()
    out = releases.switch_weights(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, link=MODEL,
                                  version=v2, command="pdkit stage --activate", now=_t(5),
                                  systemctl=systemd.systemctl, unit_active=lambda u: True, wait=systemd.wait)
    assert os.readlink(tmp_path / "srv/models/m") == v2 and "pdkit-engine-decode.service" in systemd.restarted()
    listed = releases.list_releases(root=tmp_path, releases_dir=RELEASES)
    assert listed["current"] == out["id"] != first["id"]
    assert listed["releases"][-1]["weights"][MODEL]["sha256"] == w2
    # v1 is kept: the release before still names it (a rollback goes back to it)
    assert (tmp_path / "srv/models" / v1).is_dir() and out["pruned_weights"] == []
    # an unreferenced version (a release pruned, a stage never activated) goes at the next record
    v3, _ = _weights(tmp_path, "three")
    releases.prune_weights(tmp_path, tmp_path / RELEASES.lstrip("/"), [MODEL])
    assert not (tmp_path / "srv/models" / v3).exists() and (tmp_path / "srv/models" / v1).is_dir()


def test_a_failed_gate_after_a_weights_switch_puts_the_node_back_on_its_weights(tmp_path):
    _node(tmp_path)
    v1, _ = _weights(tmp_path, "one")
    _point(tmp_path, v1)
    first = _record(tmp_path, 1)
    v2, _ = _weights(tmp_path, "two")
    systemd = Systemd()
    fails = {"left": 1}

    def wait(unit, svc):
        if unit == "pdkit-engine-decode.service" and fails["left"]:
            fails["left"] -= 1
            return False, "decode did not become ready"
        return True, "ready"

    with pytest.raises(releases.ReleaseError, match=f"back on release {first['id']}"):
        releases.switch_weights(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, link=MODEL,
                                version=v2, command="t", now=_t(5), systemctl=systemd.systemctl,
                                unit_active=lambda u: True, wait=wait)
    assert os.readlink(tmp_path / "srv/models/m") == v1
    assert releases.read_current(tmp_path / RELEASES.lstrip("/")) == first["id"]
    assert (tmp_path / "srv/models" / v2).is_dir()  # staged and verified: kept for another try


def test_switching_to_a_directory_that_is_no_staged_version_is_refused(tmp_path):
    _node(tmp_path)
    v1, _ = _weights(tmp_path, "one")
    _point(tmp_path, v1)
    _record(tmp_path, 1)
    (tmp_path / "srv/models/.m.pdkit-w-0123456789abcdef").mkdir()
    with pytest.raises(releases.ReleaseError, match="not a staged, verified version"):
        releases.switch_weights(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, link=MODEL,
                                version=".m.pdkit-w-0123456789abcdef", command="t")
    with pytest.raises(releases.ReleaseError, match="model path of no engine"):
        releases.switch_weights(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, link="/srv/other",
                                version=v1, command="t")
