"""A node's own engine environment (pdkit_node.engine_venv, issue 22 item 1): the preflight's probe
(roles.node_facts.EngineEnv, one command in the NodeFacts round trip) and its pure decision
(pdkit.hosts.preflight.engine_env_problems), each class of problem, then the probe run for real here
against small fake environments."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.hosts.preflight import (
    check_host,
    engine_env_problems,
    engine_env_wants,
    format_report,
    has_errors,
    same_release,
)
from pdkit.inventory.loader import load
from pdkit.upstream.versions import NIXL_IMPORT
from roles.node_facts import NODE_FACTS, NODE_FACTS_MARK, EngineEnv, NodeFacts
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory

VENV = "/opt/sglang-env"
PY = f"{VENV}/bin/python"
GOOD = {"path": PY, "exists": True, "executable": True, "python": "3.12.3", "sglang": "0.5.23", "sglang_dist": "0.5.23", "nixl": True}


def problems(probe, versions=("0.5.23",), nixl=True):
    return engine_env_problems("gpu01", VENV, probe, list(versions), nixl)


def one(probe, **kwargs) -> str:
    found = problems(probe, **kwargs)
    assert len(found) == 1, found
    # every problem names the host, the field, the path and what would be valid
    assert found[0].startswith(f"gpu01: pdkit_node.engine_venv {VENV}: "), found[0]
    assert "valid: a Python environment whose bin/python imports sglang 0.5.23" in found[0], found[0]
    return found[0]


# (case, probe, a phrase the one problem must carry)
CLASSES = [
    ("path missing", {"path": PY, "exists": False, "venv_exists": True}, f"{PY} does not exist"),
    ("the directory missing too", {"path": PY, "exists": False, "venv_exists": False}, f"{PY} does not exist (nor does {VENV})"),
    ("a dangling link", {"path": PY, "exists": False, "link": "/usr/bin/python3.11"}, f"{PY} is a link to /usr/bin/python3.11, which does not exist"),
    ("not executable", {"path": PY, "exists": True, "executable": False, "mode": "0644"}, f"{PY} is not executable (mode 0644)"),
    ("python does not run", {**{k: GOOD[k] for k in ("path", "exists", "executable")}, "error": "exit 127: error while loading shared libraries: libpython3.12.so.1.0"},
     f"{PY} did not run: exit 127: error while loading shared libraries"),
    ("sglang missing", {**GOOD, "sglang": None, "sglang_dist": None, "sglang_error": "ModuleNotFoundError: No module named 'sglang'"},
     "`import sglang` failed: ModuleNotFoundError: No module named 'sglang'"),
    ("sglang installed but broken", {**GOOD, "sglang": None, "sglang_error": "ModuleNotFoundError: No module named 'triton'"},
     "`import sglang` failed: ModuleNotFoundError: No module named 'triton' (the sglang 0.5.23 distribution is installed but does not import)"),
    ("wrong version", {**GOOD, "sglang": "0.5.17", "sglang_dist": "0.5.17"}, "sglang 0.5.17, the spec wants 0.5.23"),
    ("another release, not a build label", {**GOOD, "sglang": "0.5.23.post1"}, "sglang 0.5.23.post1, the spec wants 0.5.23"),
    ("no version at all", {**GOOD, "sglang": None, "sglang_dist": None}, "sglang imports but reports no version"),
    ("nixl missing", {**GOOD, "nixl": False, "nixl_error": "ModuleNotFoundError: No module named 'nixl'"},
     f"`{NIXL_IMPORT}` failed: ModuleNotFoundError: No module named 'nixl' (its prefill/decode engines transfer KV over NIXL"),
    ("the probe never ran", None, f"{PY} did not run: the probe did not run"),
]


@pytest.mark.parametrize(("case", "probe", "phrase"), CLASSES, ids=[c[0] for c in CLASSES])
def test_each_class_of_problem_is_one_line_naming_host_field_path_found_and_valid(case, probe, phrase):
    assert phrase in one(probe), case


def test_all_good():
    assert problems(GOOD) == []
    # a local build label is the same release rebuilt (e.g. a vendor's CUDA variant)
    assert problems({**GOOD, "sglang": "0.5.23+cu130"}) == []
    # no __version__ but distribution metadata: that version counts
    assert problems({**GOOD, "sglang": None, "sglang_dist": "0.5.23"}) == []
    assert same_release("0.5.23", "0.5.23") and same_release("0.5.23+nv25.10", "0.5.23")
    assert not same_release("0.5.23rc0", "0.5.23") and not same_release("0.5.2", "0.5.23")


def test_nixl_is_only_needed_by_pd_engines_over_nixl():
    missing = {**GOOD, "nixl": False, "nixl_error": "ModuleNotFoundError: No module named 'nixl'"}
    assert problems(missing, nixl=False) == []
    assert "and NIXL as SGLang imports it" in one(missing)
    assert "NIXL" not in one({**GOOD, "sglang": "0.5.17"}, nixl=False)


def test_a_wrong_version_and_no_nixl_are_both_reported():
    found = problems({**GOOD, "sglang": "0.5.17", "nixl": False, "nixl_error": "ImportError: x"})
    assert len(found) == 2 and "sglang 0.5.17" in found[0] and NIXL_IMPORT in found[1]


def _spec(tmp_path, engine_venv=VENV, gpu="none", **engine_update):
    hosts = copy.deepcopy(BASE_HOSTS)
    node = hosts["gpu01"]["pdkit_node"]
    node.update(gpu=gpu, engine_venv=engine_venv)
    for engine in node["engines"]:
        engine.update(engine_update)
    spec = load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER)))
    return spec, spec.host("gpu01")


def test_what_the_environment_must_provide_follows_the_engines(tmp_path):
    spec, host = _spec(tmp_path)
    assert engine_env_wants(spec, host) == (["0.5.23"], True)
    cluster = {**BASE_CLUSTER, "transfer_backend": "mooncake"}
    hosts = copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_node"]["engine_venv"] = VENV
    spec = load(str(write_inventory(tmp_path, hosts, cluster)))
    assert engine_env_wants(spec, spec.host("gpu01")) == (["0.5.23"], False)
    # a PD group's engines may move to another release together: the environment must have that one
    hosts["gpu01"]["pdkit_node"]["engines"] = [{**e, "sglang_version": "0.5.17"} for e in hosts["gpu01"]["pdkit_node"]["engines"]]
    spec = load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER)))
    assert engine_env_wants(spec, spec.host("gpu01")) == (["0.5.17"], True)
    assert "the spec wants 0.5.17" in problems(GOOD, versions=["0.5.17"])[0]


@pytest.mark.parametrize("gpu", ["none", "nvidia"])
def test_the_preflight_stops_the_host_on_a_bad_environment_and_reports_it(tmp_path, gpu):
    spec, host = _spec(tmp_path, gpu=gpu)
    facts = {"os": {"id": "debian", "version_id": "12", "pretty_name": "Debian GNU/Linux 12 (bookworm)"}, "arch": "x86_64", "kernel": "6.1.0-28-amd64",
             "engine_env": {**GOOD, "sglang": "0.5.17"}}
    findings = check_host(spec, host, facts)
    assert has_errors(findings)
    env = [f for f in findings if f.check == "engine-env"]
    assert len(env) == 1 and env[0].severity == "error" and findings[0] == env[0]  # errors first
    report = format_report("gpu01", findings, facts)
    assert report.splitlines()[0].startswith("pdkit preflight gpu01: FAILED")
    assert f"  fact     engine env {PY}: python 3.12.3, sglang 0.5.17, nixl yes" in report
    assert f"error    engine-env: gpu01: pdkit_node.engine_venv {VENV}: sglang 0.5.17, the spec wants 0.5.23" in report


def test_a_good_environment_passes_on_a_lab_host(tmp_path):
    spec, host = _spec(tmp_path)
    facts = {"os": {"id": "debian", "version_id": "12"}, "engine_env": GOOD}
    findings = check_host(spec, host, facts)
    assert not has_errors(findings)
    assert f"engine env {PY}: python 3.12.3, sglang 0.5.23, nixl yes" in format_report("gpu01", findings, facts)
    # a node without engine_venv is never probed nor judged on it
    spec, host = _spec(tmp_path, engine_venv=None)
    assert not [f for f in check_host(spec, host, {"os": {}}) if f.check == "engine-env"]


# --------------------------------------------------------------------------- the probe, run for real


def _fake_env(root: Path, *, sglang: str | None = None, sglang_raises: str | None = None, dist: str | None = None, nixl: bool = False) -> str:
    """A directory with bin/python: this machine's Python with a fake sglang (and nixl) first on sys.path."""
    site = root / "site"
    site.mkdir(parents=True)
    if sglang is not None or sglang_raises is not None:
        (site / "sglang").mkdir()
        body = f"raise ImportError({sglang_raises!r})\n" if sglang_raises else f"__version__ = {sglang!r}\n"
        (site / "sglang" / "__init__.py").write_text(body)
    if dist:
        info = site / f"sglang-{dist}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {dist}\n")
    if nixl:
        (site / "nixl").mkdir()
        (site / "nixl" / "__init__.py").write_text("")
        (site / "nixl" / "_api.py").write_text("nixl_agent = object\n")
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(root)


def _probe(venv: str) -> dict:
    proc = subprocess.run(["sh", "-c", EngineEnv().command(venv)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return EngineEnv().process(proc.stdout.splitlines())


def test_the_probe_reads_each_class_from_real_environments(tmp_path):
    good = _fake_env(tmp_path / "good", sglang="0.5.23", nixl=True)
    assert engine_env_problems("gpu01", good, _probe(good), ["0.5.23"], True) == []
    probe = _probe(good)
    assert probe["sglang"] == "0.5.23" and probe["nixl"] is True and probe["python"] == "%d.%d.%d" % sys.version_info[:3]

    old = _fake_env(tmp_path / "old", sglang="0.5.17")
    [version, nixl] = engine_env_problems("gpu01", old, _probe(old), ["0.5.23"], True)
    assert "sglang 0.5.17, the spec wants 0.5.23" in version and "No module named 'nixl'" in nixl

    broken = _fake_env(tmp_path / "broken", sglang_raises="No module named 'triton'", dist="0.5.23", nixl=True)
    [problem] = engine_env_problems("gpu01", broken, _probe(broken), ["0.5.23"], True)
    assert "`import sglang` failed: ImportError: No module named 'triton' (the sglang 0.5.23 distribution is installed" in problem

    bare = _fake_env(tmp_path / "bare")
    assert "No module named 'sglang'" in engine_env_problems("gpu01", bare, _probe(bare), ["0.5.23"], False)[0]

    assert f"{tmp_path}/none/bin/python does not exist (nor does {tmp_path}/none)" in engine_env_problems("gpu01", f"{tmp_path}/none", _probe(f"{tmp_path}/none"), ["0.5.23"], False)[0]

    noexec = _fake_env(tmp_path / "noexec", sglang="0.5.23")
    Path(noexec, "bin", "python").chmod(0o644)
    assert "is not executable (mode 0644)" in engine_env_problems("gpu01", noexec, _probe(noexec), ["0.5.23"], False)[0]

    link = tmp_path / "link"
    (link / "bin").mkdir(parents=True)
    (link / "bin" / "python").symlink_to("/nonexistent/python3.99")
    assert "is a link to /nonexistent/python3.99, which does not exist" in engine_env_problems("gpu01", str(link), _probe(str(link)), ["0.5.23"], False)[0]

    crash = tmp_path / "crash"
    (crash / "bin").mkdir(parents=True)
    (crash / "bin" / "python").write_text("#!/bin/sh\necho 'libpython3.12.so.1.0: cannot open shared object file' >&2\nexit 127\n")
    (crash / "bin" / "python").chmod(0o755)
    assert "did not run: exit 127: libpython3.12.so.1.0: cannot open shared object file" in engine_env_problems("gpu01", str(crash), _probe(str(crash)), ["0.5.23"], False)[0]


def test_the_probe_writes_nothing_into_the_environment(tmp_path):
    good = _fake_env(tmp_path / "good", sglang="0.5.23", nixl=True)
    before = sorted(str(p) for p in Path(good).rglob("*"))
    _probe(good)
    assert sorted(str(p) for p in Path(good).rglob("*")) == before  # python -B: no __pycache__


def test_the_probe_rides_in_the_node_facts_round_trip(tmp_path):
    """NodeFacts with engine_venv: one command, the host-only facts as before plus "engine_env";
    without it the command is exactly the one it always was."""
    good = _fake_env(tmp_path / "good", sglang="0.5.23", nixl=True)
    bundle = NodeFacts()
    names = ("os", "arch", "kernel", "reboot_required")
    plain = bundle.command(names)
    assert bundle.command(names, engine_venv=None) == plain
    with_env = bundle.command(names, engine_venv=good)
    assert with_env.startswith(plain + " && ") and EngineEnv().command(good) in with_env
    proc = subprocess.run(["sh", "-c", with_env], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    values = bundle.process(proc.stdout.splitlines())
    assert set(values) == {*names, "engine_env"}
    assert values["engine_env"] == _probe(good)
    assert values["arch"] == NODE_FACTS["arch"]().process(subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.splitlines())
    # a node without python3 (or a probe that printed nothing) is a finding, not a crash
    assert bundle.process([NODE_FACTS_MARK + "engine_env"])["engine_env"] == EngineEnv.default()
    assert "did not run" in engine_env_problems("gpu01", VENV, EngineEnv.default(), ["0.5.23"], False)[0]


def test_each_host_gets_pdkit_alone_in_its_node_venv_and_an_engine_environment_only_where_engines_run_from_one_of_pdkits(tmp_path, monkeypatch):
    """roles.base: the node venv is the pdkit-only bundle on every host (health gates,
    pdkit-exporter; issue 30 item 3: no engine runs from it); the locked engine closure goes to
    <install_dir>/engine-venv on a host whose engines run from the kit's environment, nowhere on
    a node that provides its own (gpu01) or a host with no engine (mon01)."""
    import roles.base as base
    from pdkit.wheels import wheelhouse

    hosts = copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_node"]["engine_venv"] = VENV
    spec = load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER)))
    asked = []
    monkeypatch.setattr(base, "current_spec", lambda: spec)
    monkeypatch.setattr(base, "node_platform", lambda: wheelhouse.DEFAULT_PLATFORM)
    monkeypatch.setattr(wheelhouse, "node_bundle", lambda platform: "node bundle")
    monkeypatch.setattr(wheelhouse, "engine_bundle", lambda platform, engine, version: asked.append((engine, version)) or "engine bundle")
    got = {}
    for name in ("gpu01", "gpu02", "mon01"):
        monkeypatch.setattr(base, "current_host", lambda name=name: spec.host(name))
        assert base._node_bundle() == ("node bundle", "/opt/pdkit/venv")
        got[name] = base._engine_bundle()
    assert got == {"gpu01": None, "gpu02": ("engine bundle", "/opt/pdkit/engine-venv"), "mon01": None}
    assert asked == [("sglang", "0.5.23")]
    sim = json.dumps(wheelhouse.lock_pins("node.txt"))
    assert "sglang" not in sim and "torch" not in sim  # the pdkit-only bundle's pins
