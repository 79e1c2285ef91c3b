"""`pdkit render`: golden files for the example inventories, determinism, modes, secrets."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pdkit.cli import main
from pdkit.inventory.loader import load
from pdkit.render.plan import plan_cluster
from tests.conftest import REPO, write_inventory

GOLDEN = REPO / "tests" / "golden"
# provided-env: a node whose own SGLang environment runs the engines (pdkit_node.engine_venv)
EXAMPLES = ["cluster", "a6000", "multinode", "provided-env"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", EXAMPLES)
def test_rendered_files_match_golden(name, tmp_path, monkeypatch):
    """Any change to a rendered unit or env file must show up here as a reviewed golden diff.

    Regenerate with: PDKIT_UPDATE_GOLDEN=1 pytest tests/test_render.py
    """
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    assert main(["render", f"inventories/{name}.py", "--out", str(out)]) == 0
    golden = GOLDEN / name
    if os.environ.get("PDKIT_UPDATE_GOLDEN"):
        import shutil

        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(out, golden)
    rendered, expected = _tree(out), _tree(golden)
    assert sorted(rendered) == sorted(expected)
    for path in expected:
        assert rendered[path] == expected[path], f"{path} differs from tests/golden/{name}/{path}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_render_is_deterministic(name, monkeypatch):
    monkeypatch.chdir(REPO)
    first = plan_cluster(load(f"inventories/{name}.py"))
    second = plan_cluster(load(f"inventories/{name}.py"))
    assert first == second
    assert {h: p.release_hash for h, p in first.items()} == {h: p.release_hash for h, p in second.items()}


def test_render_writes_files_with_planned_modes(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    assert main(["render", "inventories/cluster.py", "--out", str(out)]) == 0
    for host, plan in plan_cluster(load("inventories/cluster.py")).items():
        for f in plan.files:
            mode = stat.S_IMODE((out / host / f.path.lstrip("/")).stat().st_mode)
            assert mode == int(f.mode, 8), f.path


def test_secrets_only_reach_a_root_only_env_file(base, tmp_path):
    cluster, hosts = base
    cluster["secrets"] = {"hf_token": "hf_SeCrEt123", "router_api_key": "rk_SeCrEt456"}
    hosts["gpu01"]["pdkit_router"].pop("auth")  # the base runs without a key (auth: none); this one has one
    spec = load(write_inventory(tmp_path, hosts, cluster))
    plans = plan_cluster(spec)
    holders = []
    for host, plan in plans.items():
        for f in plan.files:
            if "hf_SeCrEt123" in f.content or "rk_SeCrEt456" in f.content:
                holders.append((host, f.path))
                assert f.mode == "0600" and f.owner == "root" and f.secret, f.path
                assert f.path.endswith(".env") or f.path == "/etc/pdkit/router-api-key"
            if f.path.endswith(".service"):
                assert "SeCrEt" not in f.content
    assert ("gpu01", "/etc/pdkit/secrets.env") in holders
    assert ("gpu01", "/etc/pdkit/router-api-key") in holders
    # the router loads its key as a systemd credential: never an environment variable (/proc/<pid>/environ)
    router_unit = plans["gpu01"].file("/etc/systemd/system/pdkit-router.service").content
    assert "LoadCredential=router-api-key:/etc/pdkit/router-api-key" in router_unit and "EnvironmentFile" not in router_unit
    assert "User=pdkit-router" in router_unit
    # the units point at the secret files rather than carrying the values
    unit = plans["gpu01"].file("/etc/systemd/system/pdkit-engine-prefill.service").content
    assert "EnvironmentFile=/etc/pdkit/secrets.env" in unit
    # and the spec never shows them in its repr (logs, tracebacks)
    assert "SeCrEt" not in repr(spec)


def test_render_refuses_an_invalid_inventory(base, tmp_path, capsys):
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"]["engines"][0]["gpus"] = [0, 9]
    out = tmp_path / "out"
    assert main(["render", str(write_inventory(tmp_path, hosts, cluster)), "--out", str(out)]) == 2
    assert "gpu01: pdkit_node.engines[0].gpus" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("name", EXAMPLES + ["lab"])
def test_every_rendered_exporter_config_is_accepted_by_the_exporter(name, monkeypatch):
    import json

    from pdkit.agent.exporter.config import parse_config

    monkeypatch.chdir(REPO)
    spec = load(f"inventories/{name}.py")
    seen = 0
    for host, plan in plan_cluster(spec).items():
        for f in plan.files:
            if f.path.endswith("/exporter.json"):
                config = parse_config(json.loads(f.content))
                assert config.node == host
                # every engine process of the host: its own engines and the ranks it runs of others'
                placements = spec.placements(spec.host(host))
                assert [(e.name, e.rank) for e in config.engines] == [(p.engine.name, p.rank) for p in placements]
                seen += 1
    assert seen == len([h for h in spec.gpu_hosts if spec.placements(h)])


def test_a_provided_engine_env_runs_only_the_engines_from_it(monkeypatch):
    """Issue 22 item 1: the engines' ExecStart starts with <engine_venv>/bin/python, every pdkit
    service (exporter, health gates) stays on the node venv, and the engines' flags are the ones
    pdkit renders anywhere (release.json, the exporter's drift check)."""
    import json
    import shlex

    from pdkit.render import flags

    monkeypatch.chdir(REPO)
    spec = load("inventories/provided-env.py")
    host = spec.host("gpu01")
    plan = plan_cluster(spec)["gpu01"]
    release = json.loads(plan.file("/etc/pdkit/release.json").content)
    exporter = json.loads(plan.file("/etc/pdkit/exporter.json").content)
    for engine in host.node.engines:
        unit = plan.file(f"/etc/systemd/system/{engine.unit_name}").content
        line = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
        argv = shlex.split(line.replace("\\\n", " "))
        assert argv == flags.engine_command(spec, host, engine)
        assert argv[:3] == ["/opt/vendor/sglang-env/bin/python", "-m", "sglang.launch_server"] == [flags.engine_python(spec, host), "-m", "sglang.launch_server"]
        assert argv[3:] == release["engines"][engine.name]["argv"] == next(e["argv"] for e in exporter["engines"] if e["name"] == engine.name)
    exporter_unit = plan.file("/etc/systemd/system/pdkit-exporter.service").content
    assert "ExecStart=/opt/pdkit/venv/bin/python -m pdkit.exporter" in exporter_unit
    venvs = {s.unit: s.venv for s in plan.services}
    assert venvs == {"pdkit-engine-prefill.service": None, "pdkit-engine-decode.service": None, "pdkit-exporter.service": "/opt/pdkit/venv",
                     "nvidia-dcgm-exporter.service": None, "pdkit-router.service": "/opt/pdkit/router-venv"}
    # the same layout without engine_venv differs in argv[0] and the unit's description only
    node = host.node.model_copy(update={"engine_venv": None})
    plain = spec.model_copy(update={"hosts": tuple(h.model_copy(update={"node": node}) if h.name == "gpu01" else h for h in spec.hosts)})
    plain_plan = plan_cluster(plain)["gpu01"]
    for engine in host.node.engines:
        a = plan.file(f"/etc/systemd/system/{engine.unit_name}").content.splitlines()
        b = plain_plan.file(f"/etc/systemd/system/{engine.unit_name}").content.splitlines()
        assert [(x, y) for x, y in zip(a, b) if x != y] == [
            (f"Description=pdkit SGLang (the node's own environment) {engine.role} engine {engine.name} (cluster provided)",
             f"Description=pdkit SGLang {engine.role} engine {engine.name} (cluster provided)"),
            ("ExecStart=/opt/vendor/sglang-env/bin/python -m sglang.launch_server \\", "ExecStart=/opt/pdkit/engine-venv/bin/python -m sglang.launch_server \\"),
        ]
