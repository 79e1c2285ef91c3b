"""Each engine's start history on the node (pdkit/agent/enginestarts.py, issue 45 item 1): what the engine
gate records per start (restart-to-ready, warm or cold, configuration class), and the probe the roll
reads it with."""

from __future__ import annotations

import json
import subprocess

import pytest

from pdkit.agent import enginestarts

UNIT = "pdkit-engine-decode.service"
S = 1_000_000


def _node(tmp_path, port: int = 30001, graphs: str = "64"):
    """A node under TMP_PATH: the engine's unit file, its environment file, the engine-venv link."""
    (tmp_path / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
    (tmp_path / "etc/pdkit").mkdir(parents=True, exist_ok=True)
    (tmp_path / "etc/systemd/system" / UNIT).write_text(
        "[Service]\nEnvironmentFile=/etc/pdkit/decode.env\n"
        "ExecStart=/opt/pdkit/engine-venv/bin/python -m sglang.launch_server \\\n"
        f"    --host 10.0.0.1 \\\n    --port {port} \\\n    --cuda-graph-max-bs {graphs}\n")
    (tmp_path / "etc/pdkit/decode.env").write_text("# env\nSGLANG_HOST_IP=10.0.0.1\nTRITON_CACHE_DIR=/var/cache/t\n"
                                                   "HF_TOKEN=secret\n")
    return tmp_path


def _venv(root, name: str) -> None:
    (root / "opt/pdkit/venvs" / name).mkdir(parents=True, exist_ok=True)
    link = root / "opt/pdkit/engine-venv"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f"venvs/{name}")


def _start(root, marks, invocation, *, exit_s, inactive_s, started_s, ready_s, running=None):
    """The gate sees INVOCATION ready at READY_S (its mark), systemd's timestamps as given."""
    marks.mkdir(exist_ok=True)
    (marks / f"{UNIT}.json").write_text(json.dumps({"invocation": invocation, "ready_monotonic_us": ready_s * S,
                                                    "phases": {"load_weight": 1.5}}))
    props = {"InvocationID": running or invocation, "ActiveExitTimestampMonotonic": str(exit_s * S),
             "InactiveEnterTimestampMonotonic": str(inactive_s * S),
             "InactiveExitTimestampMonotonic": str(started_s * S), "FragmentPath": f"/etc/systemd/system/{UNIT}"}
    return enginestarts.record_start(UNIT, invocation, str(marks), root=root, show=lambda unit: props)


def test_each_start_is_recorded_once_with_its_time_warmth_and_class(tmp_path):
    root, marks = _node(tmp_path / "root"), tmp_path / "ready"
    _venv(root, "engine-aa")
    # the first start after the install (no stop before it): cold
    first = _start(root, marks, "inv1", exit_s=0, inactive_s=0, started_s=5, ready_s=210)
    assert first["restart_to_ready_s"] == 205.0 and first["warm"] is False
    assert first["engine_env"].endswith("/opt/pdkit/venvs/engine-aa") and first["phases"] == {"load_weight": 1.5}
    # a restart on the same environment: warm; the stop (2 s) counts, as in the roll's probe
    second = _start(root, marks, "inv2", exit_s=300, inactive_s=302, started_s=302, ready_s=371)
    assert second["restart_to_ready_s"] == 71.0 and second["warm"] is True
    assert second["config_class"] == first["config_class"]
    # the same start seen by a second gate, or a mark of a start no longer running: nothing more
    assert _start(root, marks, "inv2", exit_s=300, inactive_s=302, started_s=302, ready_s=380) is None
    assert _start(root, marks, "inv3", exit_s=400, inactive_s=401, started_s=401, ready_s=450, running="inv4") is None
    # a start-cost change: another class; a port change: the same one
    _node(root, graphs="96")
    third = _start(root, marks, "inv5", exit_s=500, inactive_s=501, started_s=501, ready_s=585)
    assert third["warm"] is True and third["config_class"] != first["config_class"]
    _node(root, port=31999)
    assert _start(root, marks, "inv6", exit_s=600, inactive_s=601, started_s=601, ready_s=672)["config_class"] == \
        first["config_class"]
    # a new engine environment (another lock): its first start is cold again
    _venv(root, "engine-bb")
    fourth = _start(root, marks, "inv7", exit_s=700, inactive_s=701, started_s=701, ready_s=900)
    assert fourth["warm"] is False and fourth["engine_env"].endswith("engine-bb")
    history = enginestarts.read_history(str(marks), UNIT)
    assert [e["invocation"] for e in history] == ["inv1", "inv2", "inv5", "inv6", "inv7"]
    assert oct((marks / f"{UNIT}{enginestarts.SUFFIX}").stat().st_mode & 0o777) == "0o644"


def test_the_history_keeps_the_newest_starts_and_a_broken_node_never_fails_the_gate(tmp_path, monkeypatch):
    root, marks = _node(tmp_path / "root"), tmp_path / "ready"
    _venv(root, "engine-aa")
    monkeypatch.setattr(enginestarts, "KEEP_STARTS", 2)
    for i in range(4):
        _start(root, marks, f"inv{i}", exit_s=100 * i + 1, inactive_s=100 * i + 2, started_s=100 * i + 2,
               ready_s=100 * i + 50)
    assert [e["invocation"] for e in enginestarts.read_history(str(marks), UNIT)] == ["inv2", "inv3"]

    def broken(unit):
        raise OSError("no systemctl")

    assert enginestarts.record_start(UNIT, "x", str(marks), root=root, show=broken) is None


def test_the_class_leaves_out_addresses_logs_and_credentials_only():
    argv = ["/opt/pdkit/engine-venv/bin/python", "-m", "sglang.launch_server", "--host", "10.0.0.1", "--port", "30001",
            "--tp-size", "4", "--log-level=info", "--enable-metrics"]
    env = {"TRITON_CACHE_DIR": "/var/cache/t", "SGLANG_HOST_IP": "10.0.0.1", "HF_TOKEN": "x"}
    base = enginestarts.config_class(argv, env)
    assert enginestarts.config_class([*argv[:3], "--host", "10.0.0.2", "--port", "1", *argv[7:]],
                                     {**env, "SGLANG_HOST_IP": "10.0.0.2", "HF_TOKEN": "y"}) == base
    assert enginestarts.config_class(argv[:-1], env) != base  # a flag without a value
    assert enginestarts.config_class(argv, {**env, "TRITON_CACHE_DIR": "/elsewhere"}) != base
    assert enginestarts.config_class([*argv[:7], "--tp-size", "8", *argv[9:]], env) != base


def test_the_gate_records_a_start_it_watched_and_not_one_already_up(monkeypatch, tmp_path):
    """A start the gate did not see coming up (already ready at its first look) has no start time
    of its own: its restart-to-ready would be the time since whenever it started."""
    from pdkit.agent import health

    seen = []
    monkeypatch.setattr(health.enginestarts, "record_start", lambda unit, inv, marks: seen.append(inv))
    monkeypatch.setattr(health, "_unit_snapshot", lambda unit: {"ActiveState": "active", "SubState": "running",
                                                                "InvocationID": "inv1", "NRestarts": "0"})
    monkeypatch.setattr(health, "unit_log", lambda *a, **k: "")
    monkeypatch.setattr(health, "startup_phases", lambda url: {})
    monkeypatch.setattr(health, "read_server_info", lambda url, timeout=5.0: ({"version": "x"}, ""))
    answers = iter([(503, "starting")])
    monkeypatch.setattr(health, "http_request", lambda url, *a, **k: next(answers, (200, "")))
    shapes = str(tmp_path / "shapes")
    assert health.wait_engine(UNIT, "http://127.0.0.1:9/health", timeout=5, poll=0.01, shapes_dir=shapes)[0]
    assert seen == ["inv1"]
    assert health.wait_engine(UNIT, "http://127.0.0.1:9/health", timeout=5, poll=0.01, shapes_dir=shapes)[0]
    assert seen == ["inv1"]


def test_the_rolls_probe_reads_every_engines_history(tmp_path):
    marks = tmp_path / "ready"
    marks.mkdir()
    (marks / f"{UNIT}{enginestarts.SUFFIX}").write_text(json.dumps([{"invocation": "a", "restart_to_ready_s": 71.0}]))
    command = enginestarts.history_probe_command([UNIT, "pdkit-engine-prefill.service"], str(marks))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {UNIT: [{"invocation": "a", "restart_to_ready_s": 71.0}],
                                       "pdkit-engine-prefill.service": []}


@pytest.mark.parametrize(("values", "want"), [
    ((10 * S, 50 * S, 12 * S, 12 * S), 40.0),  # a restart: the stop (2 s) and start -> ready (38 s)
    ((0, 25 * S, 0, 5 * S), 20.0),  # a first start
    ((10 * S, 80 * S, 12 * S, 60 * S), 20.0),  # stopped a while before this start: the stop is not this start's
    ((10 * S, None, 12 * S, 12 * S), None),
])
def test_restart_seconds(values, want):
    assert enginestarts.restart_seconds(*values) == want
