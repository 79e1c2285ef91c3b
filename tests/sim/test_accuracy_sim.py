"""The answer gate's accuracy part (d) end to end: the real sgl-eval (pinned, pdkit's `eval` extra) run
by pdkit.clients.evalrun against sim engines behind the real smg router, its metrics.json read into the record.

The sim is no model: its answers hold no \\boxed{} answer, so it scores 0 (the mechanics are tested
first). With PDKIT_SIM_ANSWER_BOXED it states an answer derived from its own tokens (docs/sim.md,
"Accuracy rehearsal"): a dataset recorded from the baseline's own answers scores 1 on the baseline and
on an engine that answers alike, and an engine that diverges (PDKIT_SIM_DIVERGE_*) fails the verdict.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from pdkit.bench.measure import Measured
from pdkit.clients import answers
from pdkit.clients.answers import Accuracy
from tests.conftest import require

from .conftest import start_pd_stack
from .support import MODEL, Processes, free_ports, start_sim

PROBLEMS = [("What is 2 + 3?", "5"), ("What is 7 times 6?", "42"), ("What is 100 - 1?", "99")]


def dataset(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": p, "expected_answer": a}) + "\n"
                            for i, (p, a) in enumerate(PROBLEMS)))
    return path


def test_sgl_eval_scores_a_pd_stack_through_the_real_router_and_the_record_has_the_figures(procs: Processes,
                                                                                          tmp_path):
    require(importlib.util.find_spec("sgl_eval") is not None, "sgl-eval is not installed (pip install -e '.[eval]')")
    stack = start_pd_stack(procs)
    # the router fronts exactly the target's engines: the eval goes through it, as the users' requests do
    measured = Measured(("box",), stack.router_url, {}, (), ("box/decode", "box/prefill"))
    acc = Accuracy(enabled=True, bench="aime25", dataset=str(dataset(tmp_path / "mini.jsonl")), max_tokens=16,
                   num_threads=2, timeout_s=240)
    result = answers.eval_accuracy(measured, acc, MODEL, tmp_path / "eval")
    assert result["problems"] == [], result.get("output_tail")
    assert result["exit_code"] == 0 and result["via"] == "the router (box/decode, box/prefill)"
    assert result["endpoint"] == f"{stack.router_url}/v1"
    assert (result["num_examples"], result["n_repeats"], result["partial"]) == (3, 1, False)
    assert result["score"] == 0.0 and result["ci95"] == [0.0, 0.0] and result["error_rate"] == 0.0
    assert result["truncated_rate"] == 1.0  # 16 tokens of the sim's words, each answer cut at max_tokens
    assert result["model"] == MODEL and result["sgl_eval_version"] == answers.SGL_EVAL_VERSION
    assert result["seconds"] > 0 and result["key"] == acc.key()
    run = Path(result["run_dir"])
    assert (run / "metrics.json").exists() and run.parent.parent == tmp_path / "eval"
    # the baseline and a check on the same engines: the same score, the verdict passes and says so
    ok, why = answers.accuracy_check(result, result, acc)
    assert ok and why.startswith("accuracy: score 0.000 (95% CI 0.000-0.000) vs the baseline's 0.000")


def test_an_engine_that_does_not_answer_is_a_failed_run_not_a_score(procs: Processes, tmp_path):
    require(importlib.util.find_spec("sgl_eval") is not None, "sgl-eval is not installed (pip install -e '.[eval]')")
    (port,) = free_ports(1)
    acc = Accuracy(enabled=True, dataset=str(dataset(tmp_path / "mini.jsonl")), max_tokens=8, timeout_s=120)
    # nothing listens: sgl-eval cannot even list the model, and exits non-zero
    result = answers.run_accuracy(acc, f"http://127.0.0.1:{port}/v1", None, {}, tmp_path / "eval")
    assert result["exit_code"] not in (0, None) and result["problems"][0].startswith("sgl-eval exited with status")
    assert "output_tail" in result


BOXED = {"PDKIT_SIM_ANSWER_BOXED": "1"}
# every position of the engine's own output diverges (its argv always has --enable-metrics)
DIVERGING = {**BOXED, "PDKIT_SIM_DRIFT_WHEN": "--enable-metrics", "PDKIT_SIM_DIVERGE_FROM_POSITION": "1"}


def test_a_diverging_engine_states_other_answers_and_fails_the_verdict(procs: Processes, tmp_path):
    require(importlib.util.find_spec("sgl_eval") is not None, "sgl-eval is not installed (pip install -e '.[eval]')")
    stack = start_pd_stack(procs, prefill_env=BOXED, decode_env=BOXED)
    same_port, diverging_port = free_ports(2)
    start_sim(procs, "same", "null", same_port, env=BOXED)
    start_sim(procs, "diverging", "null", diverging_port, env=DIVERGING)
    router = Measured(("box",), stack.router_url, {}, (), ("box/decode", "box/prefill"))
    problems = [(f"Problem {i}: how many {w} are there?", "0") for i, w in enumerate(
        ["apples", "rivers", "stars", "coins", "lamps", "roads"])]
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps({"id": f"q{i}", "problem": p, "expected_answer": a}) + "\n"
                             for i, (p, a) in enumerate(problems)))
    acc = Accuracy(enabled=True, dataset=str(first), max_tokens=12, num_threads=3, timeout_s=240)
    said = answers.eval_accuracy(router, acc, MODEL, tmp_path / "eval")
    assert said["problems"] == [], said.get("output_tail")
    # the dataset recorded from the baseline's own answers (sgl-eval's predictions: output-rs0.jsonl)
    rows = [json.loads(line) for line in (Path(said["run_dir"]) / "output-rs0.jsonl").read_text().splitlines()]
    stated = {r["id"]: r["predicted_answer"] for r in rows}
    assert len(stated) == len(problems) and all(a is not None and a.isdigit() for a in stated.values()), rows
    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text("".join(json.dumps({"id": f"q{i}", "problem": p, "expected_answer": stated[f"q{i}"]}) + "\n"
                                for i, (p, _) in enumerate(problems)))
    acc = Accuracy(enabled=True, dataset=str(recorded), max_tokens=12, num_threads=3, timeout_s=240)
    base = answers.eval_accuracy(router, acc, MODEL, tmp_path / "eval")
    assert base["problems"] == [] and base["score"] == 1.0, base
    # a unified engine that answers alike (the sim's text does not depend on PD): the same score
    same = answers.run_accuracy(acc, f"http://127.0.0.1:{same_port}/v1", MODEL, {}, tmp_path / "eval")
    assert answers.accuracy_check(base, same, acc) == (True, "accuracy: score 1.000 (95% CI 1.000-1.000) vs the "
                                                             "baseline's 1.000 (95% CI 1.000-1.000): drop +0.000 "
                                                             "(max_drop 0.05, combined 95% half-width 0.000)")
    diverged = answers.run_accuracy(acc, f"http://127.0.0.1:{diverging_port}/v1", MODEL, {}, tmp_path / "eval")
    assert diverged["problems"] == [] and diverged["score"] < 0.5, diverged
    ok, why = answers.accuracy_check(base, diverged, acc)
    assert not ok and why.endswith("beyond both") and "vs the baseline's 1.000" in why
