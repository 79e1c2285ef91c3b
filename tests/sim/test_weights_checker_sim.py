"""The weights themselves (issue 44 item 2) against a real sim engine: its /weights_checker answers in
SGLang's shape for the release it imitates, and the engine gate records each rank's checksum at the
first healthy start, passes a restart with the same weights and fails one whose weights changed
(PDKIT_SIM_WEIGHTS_SALT), naming the rank and both checksums."""

from __future__ import annotations

import hashlib

import pytest
import requests

from pdkit.agent import engineshape, health
from pdkit.sim.localstack import sim_command

from .support import MODEL_PATH, Processes, free_ports, gated_unit, get, post, status_of, wait_until

UNIT = "pdkit-engine-decode.service"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The unit is active (one invocation) and its journal holds nothing (pdkit.agent.health's systemd reads faked)."""
    with gated_unit(tmp_path, monkeypatch, UNIT, "python -m pdkit.sim --disaggregation-mode decode --tp-size 2") as (group, unit_file):
        yield group, [str(unit_file)], str(tmp_path / "shapes")


def _decode(group: Processes, name: str, env: dict[str, str] | None = None, extra: tuple[str, ...] = ("--tp-size", "2"),
            ) -> str:
    port, = free_ports(1)
    group.start(name, sim_command("decode", port, extra=extra), env)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: status_of(f"{url}/health") == 200, 15, f"{name} ready", context=group.logs)
    return url


def _overall(checksums: dict[str, str]) -> str:
    # SGLang's per_gpu_checksum (srt/utils/weight_checker.py _compute_checksum, 0.5.23 overall_checksum)
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_sim_answers_in_sglangs_shape_for_the_release_it_imitates(node, version):
    group, _, _ = node
    url = _decode(group, f"decode-{version}", {"PDKIT_SIM_SGLANG_VERSION": version})
    answer = get(f"{url}/weights_checker")
    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == {"success", "message", "ranks", "per_engine_checksum"}
    assert body["success"] is True and body["message"] == "Success."
    assert len(body["ranks"]) == 2  # --tp-size 2: one ChecksumInfo per TP rank
    for tp, rank in enumerate(body["ranks"]):
        assert set(rank) == {"checksums", "per_gpu_checksum", "parallelism_info"}
        assert all(len(v) == 16 for v in rank["checksums"].values())  # f"{tensor_hash(t):016x}"
        assert rank["per_gpu_checksum"] == _overall(rank["checksums"])
        placement = {"tp_rank": tp, "tp_size": 2, "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": 1,
                     "rank": tp, "size": 2}
        # 0.5.17: one ParallelismInfo; 0.5.23: a list, one per runner, with its role
        assert rank["parallelism_info"] == (placement if version == "0.5.17" else [{"role": "target", **placement}])
    assert body["per_engine_checksum"] == hashlib.sha256(
        "".join(r["per_gpu_checksum"] for r in body["ranks"]).encode()).hexdigest()
    # POST with the default action, and the gate's own reading of it
    assert post(f"{url}/weights_checker", {"action": "checksum"}).json() == body
    read = engineshape.weights_from_answer(*health.http_request(engineshape.weights_checker_url(f"{url}/health"),
                                                                {"action": "checksum"}))
    assert read["status"] == "answered" and [r["rank"] for r in read["ranks"]] == [
        "tp_rank 0/pp_rank 0/dp_rank 0", "tp_rank 1/pp_rank 0/dp_rank 0"]


def test_the_checksums_follow_the_model_the_tp_shard_and_the_salt(node):
    group, _, _ = node
    same = [get(f"{_decode(group, f'a{i}', {'PDKIT_SIM_WEIGHTS_SALT': 's1'})}/weights_checker").json()
            for i in range(2)]
    assert same[0]["per_engine_checksum"] == same[1]["per_engine_checksum"]
    salted = get(f"{_decode(group, 'b', {'PDKIT_SIM_WEIGHTS_SALT': 's2'})}/weights_checker").json()
    assert all(a["per_gpu_checksum"] != b["per_gpu_checksum"] for a, b in zip(same[0]["ranks"], salted["ranks"]))
    tp1 = get(f"{_decode(group, 'c', {'PDKIT_SIM_WEIGHTS_SALT': 's1'}, extra=())}/weights_checker").json()
    assert len(tp1["ranks"]) == 1 and tp1["ranks"][0]["per_gpu_checksum"] != same[0]["ranks"][0]["per_gpu_checksum"]
    port, = free_ports(1)
    group.start("other-model", sim_command("decode", port, extra=("--tp-size", "2"), model_path=MODEL_PATH + "-b"),
                {"PDKIT_SIM_WEIGHTS_SALT": "s1"})
    wait_until(lambda: status_of(f"http://127.0.0.1:{port}/health") == 200, 15, "ready", context=group.logs)
    other = get(f"http://127.0.0.1:{port}/weights_checker").json()
    assert other["per_engine_checksum"] != same[0]["per_engine_checksum"]


def test_other_actions_answer_as_sglang_does_without_a_snapshot(node):
    group, _, _ = node
    url = _decode(group, "decode", {"PDKIT_SIM_SGLANG_VERSION": "0.5.23"})
    checker = f"{url}/weights_checker"
    before = post(checker, {}).json()["per_engine_checksum"]
    # compare without a snapshot: WeightChecker._compare's bare assert, an empty message, 400
    answer = post(checker, {"action": "compare"})
    assert answer.status_code == 400 and answer.json() == {"success": False, "message": ""}
    answer = post(checker, {"action": "nonsense"})
    assert answer.status_code == 400 and answer.json() == {"success": False, "message": "Unsupported action='nonsense'"}
    answer = post(checker, {"selector": "both"})
    assert answer.status_code == 400 and "invalid selector 'both'" in answer.json()["message"]
    assert post(checker, {"selector": "draft"}).json() == {"success": True, "message": "Success."}  # no draft model
    assert post(checker, {"action": "snapshot"}).json() == {"success": True, "message": "Success."}
    assert post(checker, {"action": "compare"}).status_code == 200
    # reset_tensors fills the weights with random values: the checksums change, compare fails
    assert post(checker, {"action": "reset_tensors"}).status_code == 200
    assert post(checker, {"action": "compare"}).status_code == 400
    assert post(checker, {}).json()["per_engine_checksum"] != before


def test_with_an_api_key_the_route_wants_it(node):
    """ADMIN_OPTIONAL with only --api-key: the api key (srt/utils/auth.py decide_request_auth)."""
    group, _, _ = node
    port, = free_ports(1)
    group.start("keyed", sim_command("decode", port, extra=("--api-key", "k1")))
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: status_of(f"{url}/health") == 200, 15, "ready", context=group.logs)
    assert requests.get(f"{url}/weights_checker", timeout=5).status_code == 401
    keyed = requests.get(f"{url}/weights_checker", headers=health.bearer_headers("k1"), timeout=5)
    assert keyed.status_code == 200 and keyed.json()["success"] is True


def test_a_restart_with_other_weights_fails_the_gate_naming_the_rank(node, capsys):
    group, inputs, shapes = node
    url = _decode(group, "first", {"PDKIT_SIM_WEIGHTS_SALT": "release-1"})
    ok, message = health.wait_engine(UNIT, f"{url}/health", timeout=20, interval=0.05, shape_inputs=inputs,
                                     shapes_dir=shapes)
    assert ok and "shape recorded (KV pool" in message and "weights recorded (per-engine checksum" in message, message
    recorded = get(f"{url}/weights_checker").json()
    group.stop_all()

    # the same weights after a restart: the gate passes
    url = _decode(group, "same", {"PDKIT_SIM_WEIGHTS_SALT": "release-1"})
    ok, message = health.wait_engine(UNIT, f"{url}/health", timeout=20, interval=0.05, shape_inputs=inputs,
                                     shapes_dir=shapes)
    assert ok and "weights as recorded at" in message, message
    group.stop_all()

    # other weights on the same configuration: the gate (its CLI, as the deploy and the roll run it) fails
    url = _decode(group, "other", {"PDKIT_SIM_WEIGHTS_SALT": "release-2"})
    now = get(f"{url}/weights_checker").json()
    code = health.main(["gates", "--engine", UNIT, f"{url}/health", "20", "--shape", UNIT, ",".join(inputs),
                        "--shapes-dir", shapes])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"FAILED {UNIT} came back with other weights than its configuration's first healthy start" in err, err
    for tp in (0, 1):
        was, got = recorded["ranks"][tp]["per_gpu_checksum"], now["ranks"][tp]["per_gpu_checksum"]
        assert (f"rank tp_rank {tp}/pp_rank 0/dp_rank 0: per_gpu_checksum {got[:12]} now, {was[:12]} recorded"
                in err), err
    assert (f"per-engine checksum {now['per_engine_checksum'][:12]} now, "
            f"{recorded['per_engine_checksum'][:12]} recorded") in err
    assert "came back smaller" not in err  # the shape is as recorded
