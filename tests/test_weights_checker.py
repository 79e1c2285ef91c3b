"""The weights themselves (issue 44 item 2): pdkit/agent/engineshape.py reads SGLang's /weights_checker answer,
records each engine's per-engine and per-rank checksums beside its shape at the first healthy start, and
fails a later start whose weights differ, naming the rank and both checksums; an engine that does not
answer is "unavailable" and never blocks. Then the exporter's series of the verdict and doctor's row."""

from __future__ import annotations

import hashlib
import json

import pytest

from pdkit.agent import engineshape
from pdkit.agent.engineshape import SHORT, compare_weights, weights_from_answer, weights_verdict
from tests.test_engineshape import INFO_0517, _inputs

UNIT = "pdkit-engine-decode.service"


def _rank(checksum: str, tp: int, version: str = "0.5.17", dp: int = 0) -> dict:
    """One ChecksumInfo as SGLang serialises it (srt/utils/weight_checker.py; io_struct.py wire Struct)."""
    placement = {"tp_rank": tp, "tp_size": 2, "dp_rank": dp, "dp_size": 1, "pp_rank": 0, "pp_size": 1,
                 "rank": tp, "size": 2}
    parallelism = placement if version == "0.5.17" else [{"role": "target", **placement}]
    return {"checksums": {"model.embed_tokens.weight": "00ff00ff00ff00ff"}, "per_gpu_checksum": checksum,
            "parallelism_info": parallelism}


def _answer(*checksums: str, version: str = "0.5.17") -> str:
    """http_server.py check_weights' body: success, message, ranks, per_engine_checksum (the sha256 of the
    ranks' per_gpu_checksum in order: tokenizer_control_mixin.py check_weights)."""
    engine = hashlib.sha256("".join(checksums).encode()).hexdigest()
    return json.dumps({"success": True, "message": "Success.", "per_engine_checksum": engine,
                       "ranks": [_rank(c, tp, version) for tp, c in enumerate(checksums)]})


A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_an_answer_is_read_in_both_releases_shapes(version):
    got = weights_from_answer(200, _answer(A, B, version=version))
    assert got["status"] == "answered"
    assert got["per_engine_checksum"] == hashlib.sha256((A + B).encode()).hexdigest()
    assert got["ranks"] == [
        {"rank": "tp_rank 0/pp_rank 0/dp_rank 0", "tp_rank": 0, "pp_rank": 0, "dp_rank": 0, "per_gpu_checksum": A},
        {"rank": "tp_rank 1/pp_rank 0/dp_rank 0", "tp_rank": 1, "pp_rank": 0, "dp_rank": 0, "per_gpu_checksum": B},
    ]


@pytest.mark.parametrize(("status", "body", "reason"), [
    (0, "timed out", "no answer within 60 s (timed out)"),
    (404, '{"detail":"Not Found"}', "HTTP 404: not served (a release without /weights_checker)"),
    (401, '{"error":"Unauthorized"}', "HTTP 401: the engine wants a key for it (--api-key/--admin-api-key)"),
    # SGLang answers 400 with success false when the checker raised (weight_updater.py check_weights)
    (400, '{"success":false,"message":"Unsupported action=\'x\'"}',
     "HTTP 400: the engine did not checksum its weights (\"Unsupported action='x'\")"),
    (200, '{"success":true,"message":"Success."}', "HTTP 200 without a per_engine_checksum ('Success.')"),
    (500, "Internal Server Error", "HTTP 500: the engine did not checksum its weights ('Internal Server Error')"),
])
def test_an_engine_that_does_not_answer_is_unavailable_with_the_reason(status, body, reason):
    assert weights_from_answer(status, body) == {"status": "unavailable", "reason": reason}


def test_compare_names_the_rank_and_both_checksums():
    recorded = weights_from_answer(200, _answer(A, B))
    assert compare_weights(recorded, weights_from_answer(200, _answer(A, B))) == []
    changed = weights_from_answer(200, _answer(A, C))
    problems = compare_weights(recorded, changed)
    assert problems == [
        f"rank tp_rank 1/pp_rank 0/dp_rank 0: per_gpu_checksum {C[:SHORT]} now, {B[:SHORT]} recorded",
        f"per-engine checksum {changed['per_engine_checksum'][:SHORT]} now, "
        f"{recorded['per_engine_checksum'][:SHORT]} recorded",
    ]
    # a rank gone, or a new one, is named too
    assert compare_weights(recorded, weights_from_answer(200, _answer(A)))[0] == (
        f"rank tp_rank 1/pp_rank 0/dp_rank 0: per_gpu_checksum {B[:SHORT]} recorded, the rank is not reported now")


def test_compare_matches_ranks_not_the_answer_order_and_never_blocks_on_unavailable():
    recorded = weights_from_answer(200, _answer(A, B))
    # DP replies arrive in any order: the per-engine checksum differs, no rank's weights do
    shuffled = json.loads(_answer(A, B))
    shuffled["ranks"].reverse()
    shuffled["per_engine_checksum"] = hashlib.sha256((B + A).encode()).hexdigest()
    assert compare_weights(recorded, weights_from_answer(200, json.dumps(shuffled))) == []
    gone = weights_from_answer(404, "")
    assert compare_weights(recorded, gone) == [] and compare_weights(gone, recorded) == []
    # without ranks (nothing to match), the per-engine checksums decide
    bare = {"status": "answered", "per_engine_checksum": A, "ranks": []}
    assert compare_weights(bare, {**bare, "per_engine_checksum": B}) == [
        f"per-engine checksum {B[:SHORT]} now, {A[:SHORT]} recorded"]


def test_the_record_holds_the_weights_beside_the_shape_and_a_changed_rank_fails(tmp_path):
    _, inputs = _inputs(tmp_path)
    shapes = tmp_path / "shapes"
    first = weights_from_answer(200, _answer(A, B))
    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=first)
    assert ok and message.startswith("shape recorded (KV pool 531636 tokens")
    assert f"; weights recorded (per-engine checksum {first['per_engine_checksum'][:SHORT]} over 2 ranks)" in message
    record, = (p for p in (shapes / UNIT).glob("*.json") if p.name != "last.json")
    kept = json.loads(record.read_text())
    assert kept["shape"]["kv_pool_tokens"] == 531636
    assert kept["weights"]["status"] == "answered" and kept["weights"]["recorded_at"] == kept["recorded_at"]
    assert kept["weights"]["per_engine_checksum"] == first["per_engine_checksum"]
    assert [r["per_gpu_checksum"] for r in kept["weights"]["ranks"]] == [A, B]
    assert json.loads((shapes / UNIT / "last.json").read_text())["weights"]["status"] == "recorded"

    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(200, _answer(A, B)))
    assert ok and f"weights as recorded at {kept['recorded_at']} (per-engine checksum" in message

    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(200, _answer(A, C)))
    assert not ok
    assert message.startswith(f"{UNIT} came back with other weights than its configuration's first healthy start")
    assert f"rank tp_rank 1/pp_rank 0/dp_rank 0: per_gpu_checksum {C[:SHORT]} now, {B[:SHORT]} recorded" in message
    last = json.loads((shapes / UNIT / "last.json").read_text())
    assert last["weights"]["status"] == "mismatch" and last["problems"] == []
    # the record stays the first start's: the same weights pass again
    assert engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=first)[0]

    # an engine that does not answer now never blocks, and says so
    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(404, ""))
    assert ok and message.endswith("weights not compared: /weights_checker unavailable (HTTP 404: not served "
                                   "(a release without /weights_checker)); this never blocks")


def test_a_smaller_engine_with_other_weights_names_both_failures(tmp_path):
    _, inputs = _inputs(tmp_path)
    shapes = str(tmp_path / "shapes")
    assert engineshape.check(UNIT, inputs, INFO_0517, shapes, weights=weights_from_answer(200, _answer(A, B)))[0]
    shrunk = {**INFO_0517, "max_total_num_tokens": 7452}
    ok, message = engineshape.check(UNIT, inputs, shrunk, shapes, weights=weights_from_answer(200, _answer(C, B)))
    assert not ok and "KV pool 7452 tokens, 1.4% of the 531636 recorded" in message
    assert f"rank tp_rank 0/pp_rank 0/dp_rank 0: per_gpu_checksum {C[:SHORT]} now, {A[:SHORT]} recorded" in message


def test_unavailable_at_the_first_start_is_recorded_and_the_first_answer_taken_later(tmp_path):
    _, inputs = _inputs(tmp_path)
    shapes = tmp_path / "shapes"
    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(0, "timed out"))
    assert ok and "weights not compared: /weights_checker unavailable (no answer within 60 s" in message
    record, = (p for p in (shapes / UNIT).glob("*.json") if p.name != "last.json")
    assert json.loads(record.read_text())["weights"]["status"] == "unavailable"
    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(200, _answer(A)))
    assert ok and "weights recorded at this start, the first of this configuration that answered /weights_checker" in message
    assert json.loads(record.read_text())["weights"]["status"] == "answered"
    assert not engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(200, _answer(B)))[0]


def test_without_weights_the_shape_gate_is_as_it_was(tmp_path):
    """A caller that passes no weights (an older node kit's gate) records and compares the shape alone."""
    _, inputs = _inputs(tmp_path)
    shapes = tmp_path / "shapes"
    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes))
    assert ok and "weights" not in message
    record, = (p for p in (shapes / UNIT).glob("*.json") if p.name != "last.json")
    assert "weights" not in json.loads(record.read_text())
    assert weights_verdict(json.loads((shapes / UNIT / "last.json").read_text())) is None
    ok, message = engineshape.check(UNIT, inputs, INFO_0517, str(shapes))
    assert ok and message == f"shape as recorded at {json.loads(record.read_text())['recorded_at']} " \
                              f"({engineshape.describe(engineshape.shape_from_server_info(INFO_0517))})"


def test_the_verdict_the_exporter_publishes():
    assert weights_verdict(None) is None and weights_verdict({"weights": {"status": "answered"}}) is None
    assert weights_verdict({"weights": {"status": "mismatch", "recorded": A, "now": C, "problems": ["x", "y"]}}) == {
        "status": "mismatch", "recorded": A[:SHORT], "now": C[:SHORT], "problem": "x; y"}
    assert weights_verdict({"weights": {"status": "unavailable", "recorded": None, "now": None,
                                        "reason": "HTTP 404"}}) == {
        "status": "unavailable", "recorded": "", "now": "", "problem": "HTTP 404"}


def test_the_url_sits_beside_health():
    assert engineshape.weights_checker_url("http://h:30001/health") == "http://h:30001/weights_checker"
    assert engineshape.weights_checker_url("http://h:30001/health/") == "http://h:30001/weights_checker"
    assert 10 <= engineshape.WEIGHTS_TIMEOUT_S <= 120


def test_the_nodes_exporter_publishes_the_gates_weights_verdict(tmp_path):
    """pdkit-exporter reads the gate's last.json and exports pdkit_engine_weights_info for doctor."""
    # here: the exporter and its test helpers import prometheus_client and requests, which only this test needs
    from pdkit.agent.exporter.collector import PdkitCollector
    from pdkit.agent.exporter.config import parse_config
    from pdkit.agent.exporter.system import ProcessInspector, SystemdPids
    from pdkit.upstream.metricnames import EXPORTER_WEIGHTS_INFO
    from tests.exporter.support import FakeSystemctl, exposition, label_sets, samples

    _, inputs = _inputs(tmp_path)
    shapes = tmp_path / "shapes"
    cfg = parse_config({"node": "gpu01", "cluster": "lab", "engines": [
        {"name": "decode", "role": "decode", "url": "http://127.0.0.1:9", "unit": UNIT, "sglang_version": "sim",
         "argv": [], "env": {}}], "timeout_s": 0.5, "journal": {"enabled": False}})

    def series() -> list[dict[str, str]]:
        collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl({}))),
                                   shapes_dir=str(shapes))
        try:
            return label_sets(samples(exposition(collector)), EXPORTER_WEIGHTS_INFO, engine="decode")
        finally:
            collector.close()

    assert series() == []
    first = weights_from_answer(200, _answer(A, B))
    assert engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=first)[0]
    found, = series()
    assert (found["status"], found["recorded"], found["now"]) == (
        "recorded", first["per_engine_checksum"][:SHORT], first["per_engine_checksum"][:SHORT])
    assert not engineshape.check(UNIT, inputs, INFO_0517, str(shapes), weights=weights_from_answer(200, _answer(A, C)))[0]
    found, = series()
    assert found["status"] == "mismatch" and f"rank tp_rank 1/pp_rank 0/dp_rank 0: per_gpu_checksum {C[:SHORT]}" \
                                             in found["problem"]


def _with_weights(**labels: str):
    """The lab capture's decode observation, its exporter page carrying the gate's weights verdict."""
    from pdkit.doctor.observe import exporter_views
    from tests.test_doctor import DATA, observe

    page = (DATA / "lab_base" / "exporter.txt").read_text() + "# TYPE pdkit_engine_weights_info gauge\n" + (
        "pdkit_engine_weights_info{" + ",".join(f'{k}="{v}"' for k, v in
                                               {"engine": "decode", "node": "lab-gpu1", "role": "decode",
                                                **labels}.items()) + "} 1.0\n")
    obs = observe("lab_base", "decode")
    obs.exporter = exporter_views(page)["decode"]
    return obs


def test_doctors_weights_row_on_recorded_pages():
    from pdkit.doctor.checks_engine import check_weights
    from pdkit.doctor.model import FAIL, INFO, PASS, WARN
    from tests.test_doctor import assert_verdict, observe

    # nothing checked yet (a node deployed before the gate checked weights): a WARN saying so, never a PASS
    assert_verdict(check_weights(observe("lab_base", "decode")), WARN, "nothing recorded yet", "pdkit roll")
    assert_verdict(check_weights(_with_weights(status="match", recorded="3f2a9c1b0d4e", now="3f2a9c1b0d4e",
                                               problem="")), PASS, "per-engine checksum 3f2a9c1b0d4e",
                   "as recorded at its configuration's first healthy start")
    problem = "rank tp_rank 1/pp_rank 0/dp_rank 0: per_gpu_checksum cccccccccccc now, bbbbbbbbbbbb recorded"
    assert_verdict(check_weights(_with_weights(status="mismatch", recorded="3f2a9c1b0d4e", now="77aa", problem=problem)),
                   FAIL, problem, "check the model files on lab-gpu1")
    assert_verdict(check_weights(_with_weights(status="unavailable", recorded="", now="",
                                               problem="HTTP 404: not served (a release without /weights_checker)")),
                   INFO, "not compared", "HTTP 404", "never blocks")
    unread = observe("lab_base", "decode")
    unread.exporter, unread.exporter_error = None, "Connection refused"
    assert_verdict(check_weights(unread), WARN, "not measurable", "Connection refused")
