"""The engine gate against a real sim engine (issue 42 items 1 and 5): ready from what the engine
answers (no readiness line in the journal needed), its shape recorded at the first healthy start of
its configuration, and a restart with a shrunken KV pool (PDKIT_SIM_KV_POOL_FRACTION) failing it
with both numbers."""

from __future__ import annotations

import re

import pytest

from pdkit.agent import health
from pdkit.sim.localstack import sim_command

from .support import Processes, free_ports, gated_unit, get, status_of, wait_until

UNIT = "pdkit-engine-decode.service"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The unit is active (one invocation) and its journal holds NOTHING: rotated away, as on a busy box."""
    with gated_unit(tmp_path, monkeypatch, UNIT, "python -m pdkit.sim --disaggregation-mode decode") as (group, unit_file):
        yield group, unit_file, [str(unit_file)], str(tmp_path / "shapes")


def _decode(group: Processes, name: str, env: dict[str, str] | None = None) -> tuple[str, object]:
    port, = free_ports(1)
    proc = group.start(name, sim_command("decode", port), env)
    return f"http://127.0.0.1:{port}", proc


def test_the_gate_passes_a_healthy_engine_whose_readiness_line_is_gone(node):
    """The old gate waited for the readiness line until its timeout (issue 42: 420 s, a rollback that never finished)."""
    group, _, _, _ = node
    url, _ = _decode(group, "decode")
    ok, message = health.wait_engine(UNIT, f"{url}/health", timeout=20, interval=0.05)
    assert ok, message
    assert f"{UNIT} ready: {url}/health answered 200 and /server_info was read" in message
    assert "its readiness line is not in the journal (rotated or not logged: not needed)" in message


def test_the_sim_answers_503_until_ready_and_reports_its_shape_where_sglang_does(node):
    group, _, _, _ = node
    url, proc = _decode(group, "decode", {"PDKIT_SIM_STARTUP_DELAY_S": "3"})
    first = wait_until(lambda: status_of(f"{url}/health"), 10, "the HTTP port to answer", context=group.logs)
    assert first == 503  # SGLang: 503 while ServerStatus.Starting (http_server.py health_generate)
    wait_until(lambda: status_of(f"{url}/health") == 200, 15, "readiness", context=group.logs)
    info = get(f"{url}/server_info").json()
    assert info["max_total_num_tokens"] == 262144 and info["max_req_input_len"] == info["context_length"] - 1
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == info["max_running_requests"]
    assert state["memory_usage"]["token_capacity"] == 262144
    assert state["decode_cuda_graph_bs"][:5] == [1, 2, 4, 8, 12] and state["decode_cuda_graph_bs"][-1] == 256


def test_a_restart_with_a_shrunken_kv_pool_fails_the_gate_naming_both_numbers(node, capsys):
    group, unit_file, inputs, shapes = node
    url, _ = _decode(group, "first")
    ok, message = health.wait_engine(UNIT, f"{url}/health", timeout=20, interval=0.05, shape_inputs=inputs,
                                     shapes_dir=shapes)
    assert ok and "shape recorded (KV pool 262144 tokens" in message, message
    group.stop_all()

    # the same configuration restarted short of memory: the gate (its CLI, as the deploy and the roll run it) fails
    url, proc = _decode(group, "shrunk", {"PDKIT_SIM_KV_POOL_FRACTION": "0.05"})
    code = health.main(["gates", "--engine", UNIT, f"{url}/health", "20", "--shape", UNIT, ",".join(inputs),
                        "--shapes-dir", shapes])
    err = capsys.readouterr().err
    assert code == 1
    assert (f"FAILED {UNIT} came back smaller than its configuration's first healthy start" in err
            and "KV pool 13107 tokens, 5.0% of the 262144 recorded at this release's first healthy start; "
                "below the 90% floor" in err), err
    # the sim's other reports of its pool agree: the gauge and its log line
    assert re.search(r"^sglang:max_total_num_tokens\{[^}]*\} 13107(\.0)?$", get(f"{url}/metrics").text, re.M)
    assert "KV Cache is allocated. #tokens: 13107" in proc.log_text()

    # a new configuration (its unit file changed): a legitimate change records its own shape
    unit_file.write_text("[Service]\nExecStart=python -m pdkit.sim --disaggregation-mode decode --mem-fraction 0.1\n")
    ok, message = health.wait_engine(UNIT, f"{url}/health", timeout=20, interval=0.05, shape_inputs=inputs,
                                     shapes_dir=shapes)
    assert ok and "shape recorded (KV pool 13107 tokens" in message, message
