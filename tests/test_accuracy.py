"""The answer gate's accuracy part (d) (pdkit/clients/answers.py, docs/correctness.md), its pure parts: sgl-eval's
arguments, its metrics.json read into a score and a 95% interval, the verdict, the endpoint rule, the
configuration and the --dry lines; and the runner's handling of the API key (never argv). The real
sgl-eval runs against sim engines behind the real router in tests/sim/test_accuracy_sim.py.

metrics.json shapes: sgl-eval 0.1.3 sgl_eval/metrics.py dump_run and pipeline/report.py render
(name, num_examples, n_repeats, latency_seconds, aggregate, partial, sgl_eval_version, ...);
aggregate from runner/__init__.py (_default_aggregate: score; _finish_reason_rates: stop_rate,
truncated_rate, error_rate) and evals/_math.py _flatten_math_metrics (pass@1, pass@1_std, pass@1_sem,
pass@k, majority@k, no_answer, score) with repeats.
"""

from __future__ import annotations

import json
import math
import stat

import pytest
from pydantic import ValidationError

from pdkit.bench.measure import Measured
from pdkit.bench.routes import EngineRef, Route
from pdkit.clients import answers
from pdkit.clients.answers import Accuracy, GateConfig
from pdkit.spec.models import AnswerAccuracy, AnswerGate
from pdkit.tune.campaign import Correctness


def metrics_single(score: float, n: int = 30, error_rate: float = 0.0, **extra) -> dict:
    return {"name": "aime25", "num_examples": n, "n_repeats": 1, "latency_seconds": 12.5,
            "output_throughput_tps": 100.0, "total_completion_tokens": 1000, "total_prompt_tokens": 3000,
            "aggregate": {"score": score, "stop_rate": 1.0 - error_rate, "truncated_rate": 0.0,
                          "error_rate": error_rate},
            "timestamp": "20260101-000000", "model": "m", "base_url": "http://r/v1", "num_threads": 16,
            "gen": {"temperature": 0.0}, "sgl_eval_version": "0.1.3", "ns_commit_sha": "x", **extra}


def metrics_repeats(pass1: float, sem: float, n: int = 30, k: int = 4) -> dict:
    m = metrics_single(pass1, n)
    m["n_repeats"] = k
    m["aggregate"] = {"pass@1": pass1, "pass@1_std": sem * math.sqrt(k), "pass@1_sem": sem, f"pass@{k}": 0.9,
                      f"majority@{k}": 0.8, "no_answer": 0.0, "score": pass1, "stop_rate": 1.0,
                      "truncated_rate": 0.0, "error_rate": 0.0}
    return m


# ---- arguments


def test_argv_names_the_bench_endpoint_and_limits_and_never_a_key(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"problem": "1+1?", "expected_answer": "2"}\n')
    acc = Accuracy(enabled=True, bench="aime24", dataset=str(data), num_examples=5, max_tokens=64, thinking=False)
    argv = answers.accuracy_argv(acc, "http://r:8000/v1", "m", tmp_path / "out")
    assert argv[:3] == ["aime24", "--base-url", "http://r:8000/v1"]
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--model"] == "m" and pairs["--num-examples"] == "5" and pairs["--max-tokens"] == "64"
    assert pairs["--n-repeats"] == "1" and pairs["--temperature"] == "0" and pairs["--num-threads"] == "16"
    assert argv[argv.index("--from-dataset") + 1] == str(data.resolve())
    assert "--no-thinking" in argv and not any("api-key" in a for a in argv)
    # every problem by default, the bench's own thinking default, the bundled set
    argv = answers.accuracy_argv(Accuracy(), "http://r/v1", None, "/o")
    assert "--num-examples" not in argv and "--thinking" not in argv and "--from-dataset" not in argv
    assert "--model" not in argv


def test_the_key_reaches_the_eval_through_its_environment_not_its_command_line(tmp_path):
    """run_accuracy with a stand-in interpreter that records what it was given: the key is in the
    environment (pdkit.clients.evalrun reads it there), never in argv; no metrics: a problem, said."""
    seen = tmp_path / "seen.json"
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv, 'key': os.environ.get({answers.EVAL_KEY_ENV!r}),"
                    " 'hf': os.environ.get('HF_DATASETS_OFFLINE')}, "
                    f"open({str(seen)!r}, 'w'))\nsys.exit(2)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = answers.run_accuracy(Accuracy(enabled=True), "http://r/v1", "m",
                                  {"Authorization": "Bearer s3cret-key"}, tmp_path / "eval", python=str(fake))
    got = json.loads(seen.read_text())
    assert got["key"] == "s3cret-key" and got["hf"] == "1"
    assert got["argv"][1:3] == ["-m", "pdkit.clients.evalrun"] and not any("s3cret" in a for a in got["argv"])
    assert result["problems"] == ["sgl-eval exited with status 2", "no metrics.json written"]
    assert result["exit_code"] == 2 and result["seconds"] >= 0 and "s3cret" not in json.dumps(result)


def test_the_runner_refuses_a_missing_or_other_sgl_eval(monkeypatch, capsys):
    from importlib import metadata

    from pdkit.clients import evalrun

    monkeypatch.setattr(metadata, "version", lambda name: "0.2.0")
    assert evalrun.main(["aime25"]) == 3
    assert "pinned to 0.1.3" in capsys.readouterr().err

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert evalrun.main(["aime25"]) == 3
    assert "pip install 'pdkit[eval]'" in capsys.readouterr().err


# ---- reading a run


def test_a_single_run_has_the_binomial_interval():
    r = answers.accuracy_result(metrics_single(0.5, n=30))
    se = math.sqrt(0.25 / 30)
    assert r["score"] == 0.5 and r["stderr"] == pytest.approx(se, abs=1e-6)
    assert r["ci95"] == [pytest.approx(0.5 - 1.96 * se, abs=1e-3), pytest.approx(0.5 + 1.96 * se, abs=1e-3)]
    assert r["stderr_from"] == "binomial over 30 problem(s)" and r["num_examples"] == 30
    assert r["error_rate"] == 0.0 and not r["partial"] and r["sgl_eval_version"] == "0.1.3"
    # the sim scores 0: an interval of no width, clipped at 0
    assert answers.accuracy_result(metrics_single(0.0))["ci95"] == [0.0, 0.0]


def test_repeats_use_sgl_evals_own_standard_error_of_pass_at_1():
    r = answers.accuracy_result(metrics_repeats(0.4, sem=0.02, k=4))
    assert r["score"] == 0.4 and r["stderr"] == 0.02 and r["stderr_from"] == "pass@1_sem over 4 repeats"
    assert r["ci95"] == [pytest.approx(0.4 - 1.96 * 0.02, abs=1e-3), pytest.approx(0.4 + 1.96 * 0.02, abs=1e-3)]


def test_a_run_that_cannot_be_judged_says_why():
    whole = answers.accuracy_result(metrics_single(0.5))
    assert answers.accuracy_problems(whole, 0, True) == []
    assert answers.accuracy_problems(whole, 130, True) == ["sgl-eval exited with status 130 (aborted)"]
    assert answers.accuracy_problems({}, None, False) == ["sgl-eval did not finish in time", "no metrics.json written"]
    errors = answers.accuracy_result(metrics_single(0.5, error_rate=0.1))
    assert answers.accuracy_problems(errors, 0, True) == ["10.0% of the requests failed"]
    partial = answers.accuracy_result(metrics_single(0.5, partial=True, planned_examples=30, completed_samples=12))
    assert answers.accuracy_problems(partial, 0, True) == ["partial run: 12 of 30 x 1 samples"]
    other = answers.accuracy_result(metrics_single(0.5, sgl_eval_version="0.2.0"))
    assert answers.accuracy_problems(other, 0, True) == ["sgl-eval 0.2.0 ran, not the pinned 0.1.3"]


# ---- the verdict


def _r(metrics: dict) -> dict:
    r = answers.accuracy_result(metrics)
    return {**r, "problems": answers.accuracy_problems(r, 0, True)}


def test_a_drop_beyond_max_drop_and_the_combined_interval_fails_naming_both():
    base, cand = _r(metrics_repeats(0.60, sem=0.01, n=300, k=4)), _r(metrics_repeats(0.50, sem=0.01, n=300, k=4))
    ok, why = answers.accuracy_verdict(base, cand, max_drop=0.05)
    half = 1.96 * math.hypot(0.01, 0.01)
    assert not ok and "drop +0.100" in why and "max_drop 0.05" in why and f"half-width {half:.3f}" in why
    assert "score 0.500 (95% CI 0.480-0.520) vs the baseline's 0.600 (95% CI 0.580-0.620)" in why
    assert why.endswith("beyond both")


def test_a_drop_inside_the_interval_passes_however_large_and_a_small_one_passes_however_sure():
    # 30 problems, one run each: 0.5 -> 0.4 is inside the combined interval (~0.25)
    ok, why = answers.accuracy_verdict(_r(metrics_single(0.5)), _r(metrics_single(0.4)), max_drop=0.05)
    assert ok and "drop +0.100" in why
    # a tight interval, but the drop is within max_drop
    assert answers.accuracy_verdict(_r(metrics_repeats(0.60, 0.001, k=8)), _r(metrics_repeats(0.57, 0.001, k=8)),
                                    max_drop=0.05)[0]
    # a gain never fails
    assert answers.accuracy_verdict(_r(metrics_single(0.2)), _r(metrics_single(0.9)), max_drop=0.0)[0]


def test_a_candidate_with_request_errors_fails_whatever_its_score():
    ok, why = answers.accuracy_verdict(_r(metrics_single(0.5)), _r(metrics_single(0.9, error_rate=0.05)), 0.05)
    assert not ok and why == "accuracy: 5.0% of the requests failed"


def test_a_skipped_eval_passes_and_says_why():
    skipped = {"skipped": "skipped: no single URL", "problems": []}
    assert answers.accuracy_check(skipped, skipped, Accuracy()) == (True, "accuracy: skipped: no single URL")


# ---- where it sends


def _ref(label: str, bootstrap: bool = False) -> EngineRef:
    return EngineRef(label, f"http://{label.replace('/', '-')}:30000", ("h", 8998) if bootstrap else None)


PD = Route(_ref("a/decode"), _ref("a/prefill", True))


def test_the_router_when_it_fronts_exactly_the_target():
    via_router = Measured(("a",), "http://r:8000", {"Authorization": "Bearer k"}, (), ("a/decode", "a/prefill"))
    assert answers.accuracy_endpoint(via_router) == ("http://r:8000/v1", {"Authorization": "Bearer k"},
                                                     "the router (a/decode, a/prefill)")
    # the target's own routes (the answer gate's engines_for), and the router fronts exactly them
    own = Measured(("a",), "http://r:8000", {}, (PD,), ("a/prefill", "a/decode"))
    assert answers.accuracy_endpoint(own)[0] == "http://r:8000/v1"


def test_a_unified_target_is_asked_on_its_engine_and_a_pd_canary_of_a_larger_cluster_is_skipped():
    uni = Measured(("a",), "http://r:8000", {"Authorization": "Bearer k"}, (Route(_ref("a/u0")), Route(_ref("a/u1"))),
                   ("a/u0", "a/u1", "b/u0"))
    assert answers.accuracy_endpoint(uni) == ("http://a-u0:30000/v1", {}, "the target's engine a/u0 (the first of 2)")
    canary = Measured(("a",), "http://r:8000", {}, (PD,), ("a/prefill", "a/decode", "b/prefill", "b/decode"))
    url, headers, why = answers.accuracy_endpoint(canary)
    assert url is None and "the router also fronts b/decode, b/prefill (an eval through it would mix them)" in why


# ---- configuration and --dry


def test_off_by_default_everywhere_and_one_model_for_inventory_and_campaign(tmp_path):
    assert GateConfig().accuracy == Accuracy() and not Accuracy().enabled
    assert AnswerGate().gate_config().accuracy == Accuracy() == Correctness().gate_config().accuracy
    assert not any(line.startswith("(d)") for line in answers.describe(GateConfig(), 32768, None))
    on = AnswerGate(accuracy={"enabled": True, "bench": "aime26", "max_drop": 0.1}).gate_config().accuracy
    assert (on.enabled, on.bench, on.max_drop) == (True, "aime26", 0.1)
    assert Correctness(accuracy={"enabled": True}).gate_config().accuracy.enabled


def test_sets_that_download_and_identical_repeats_are_refused():
    with pytest.raises(ValidationError, match="aime24"):
        AnswerAccuracy(bench="gsm8k")
    with pytest.raises(ValidationError, match="identical greedy answers"):
        AnswerAccuracy(n_repeats=4)
    assert AnswerAccuracy(n_repeats=4, temperature=0.6).accuracy().n_repeats == 4


def test_dry_lines_say_what_runs_what_fails_it_and_where(tmp_path):
    lines = answers.describe(GateConfig(accuracy=Accuracy(enabled=True, num_examples=10)), 32768, True)
    text = "\n".join(lines)
    assert "(d) accuracy: sgl-eval 0.1.3 on aime25 (bundled: offline), the first 10 problem(s) x 1" in text
    assert "more than 0.05 below the baseline's and outside the combined 95% interval" in text
    assert "PD engines checked on their own skip it" in text and "(d) cost:" in text


def test_a_recorded_score_is_not_reused_with_other_settings_or_another_dataset(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "p", "expected_answer": "1"}\n')
    first = Accuracy(dataset=str(data)).key()
    assert Accuracy(dataset=str(data), max_tokens=10).key() != first
    data.write_text('{"problem": "p", "expected_answer": "2"}\n')
    assert Accuracy(dataset=str(data)).key() != first
    # part (d) off leaves the forced record's key as it was
    assert GateConfig(accuracy=Accuracy(enabled=True)).key() == GateConfig().key()


# ---- the campaign's wiring (no cluster)


def test_a_campaign_records_the_baselines_score_once_and_fails_a_candidate_that_drops(tmp_path, monkeypatch):
    """pdkit tune with correctness.accuracy on: the baseline's eval is kept in the campaign's state and
    its seconds in timings.accuracy_s; a candidate whose score drops beyond max_drop and the interval
    fails the correctness gate with both figures; --dry says where the eval goes on this target."""
    import pdkit.bench
    import pdkit.doctor
    from pdkit.tune import gates, runner
    from tests.conftest import REPO

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "t", "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"),
                                "workload": {"concurrency": [4]},
                                "correctness": {"prompts": 2, "lengths": [], "accuracy": {"enabled": True}},
                                "candidates": [{"name": "off", "set": {"decode.cuda_graph": False}}]}))
    prep = runner.prepare(str(REPO / "inventories" / "lab.py"), str(path))
    scores = iter([metrics_repeats(0.60, sem=0.01, n=300, k=4), metrics_repeats(0.40, sem=0.01, n=300, k=4)])
    seen = []

    def eval_accuracy(measured, acc, model, out_dir):
        seen.append((measured.describe(), model, out_dir))
        return {**_r(next(scores)), "seconds": 42.0, "via": "the router (...)"}

    monkeypatch.setattr(answers, "ask", lambda *a, **k: [{"tokens": [1, 2, 3]}] * 2)
    monkeypatch.setattr(answers, "eval_accuracy", eval_accuracy)
    monkeypatch.setattr(gates, "soak", lambda *a, **k: (True, "fine", {}))
    monkeypatch.setattr(pdkit.bench, "run_bench", lambda spec, **kw: {
        "levels": [{"concurrency": 4, "errors": 0, "output_tok_s": 100.0}], "env": {"measured": kw["measured"]}})
    monkeypatch.setattr(pdkit.doctor, "run_doctor", lambda spec, **kw: [])
    record = {"gates": {}, "timings": {}}
    runner.Session(prep, []).run_gates("baseline", prep.base_spec, record, None, None)
    assert record["timings"]["accuracy_s"] == 42.0 and record["accuracy"]["score"] == 0.6
    assert "accuracy: baseline 0.600 (95% CI 0.580-0.620)" in record["gates"]["correctness"]["detail"]
    stored = list((tmp_path / "state").rglob("accuracy-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["score"] == 0.6
    assert seen[0][0]["engines"] == ["lab-gpu2/prefill", "lab-gpu2/decode"] and seen[0][1] == prep.base_spec.cluster.model.name
    cand = {"gates": {}, "timings": {}}
    with pytest.raises(runner.GateFailed, match="beyond both") as failed:
        runner.Session(prep, []).run_gates("off", prep.specs["off"], cand, [{"tokens": [1, 2, 3]}] * 2,
                                           prep.candidates[0])
    assert failed.value.gate == "correctness" and "drop +0.200" in failed.value.why
    assert cand["accuracy"]["ok"] is False and cand["accuracy"]["baseline"]["score"] == 0.6
    assert cand["timings"]["accuracy_s"] == 42.0 and not cand["gates"]["correctness"]["ok"]
    # the lab's canary is a PD pair on its own engines and the router fronts two more nodes: skipped, said why
    dry = runner.dry_text(prep, [], prep.candidates)
    assert "(d) accuracy: sgl-eval 0.1.3 on aime25" in dry
    assert "(d) here: skipped: the target's PD pairs are measured on their own engines, and the router also " \
           "fronts lab-gpu1/decode" in dry


# ---- the roll's canary (no cluster)


def test_the_rolls_canary_keeps_the_baselines_score_per_release_and_stops_on_a_drop(tmp_path, monkeypatch):
    """Roller.record_answers runs the eval once per release (kept in answer_cache_dir with the other
    answers), Roller.check_answers runs it on the changed canary and raises on a drop beyond both
    figures; the roll's record has the part's figures, the baseline's and the seconds."""
    import io

    from pdkit.inventory.loader import load_with_problems
    from pdkit.roll.roller import Progress, Roller
    from tests.conftest import REPO

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = load_with_problems(str(REPO / "inventories" / "lab.py"))[0]
    roller = Roller("inventories/lab.py", spec, Progress(io.StringIO()))
    roller.answer_gate = GateConfig(short_prompts=0, lengths=(), accuracy=Accuracy(enabled=True))
    runs = []
    scores = iter([metrics_repeats(0.60, sem=0.01, n=300, k=4), metrics_repeats(0.30, sem=0.01, n=300, k=4)])

    def eval_accuracy(measured, acc, model, out_dir):
        runs.append(out_dir)
        return {**_r(next(scores)), "seconds": 7.0, "via": "the router (x)", "run_dir": str(out_dir / "r")}

    monkeypatch.setattr(answers, "eval_accuracy", eval_accuracy)
    said = roller.record_answers(["lab-gpu2"], {"lab-gpu2": "rel-1"})
    assert said.endswith("; accuracy 0.600 (95% CI 0.580-0.620) in 7 s via the router (x)")
    assert runs == [tmp_path / "cache" / "pdkit" / "answers" / "eval"]
    # a second roll from the same release reuses the recorded score
    assert "recorded earlier" in roller.record_answers(["lab-gpu2"], {"lab-gpu2": "rel-1"}) and len(runs) == 1
    with pytest.raises(RuntimeError, match="beyond both"):
        roller.check_answers(["lab-gpu2"])
    part = roller.answer_record["parts"]["accuracy"]
    assert not part["ok"] and part["score"] == 0.3 and part["baseline"]["score"] == 0.6 and part["seconds"] == 7.0


def test_a_baseline_eval_that_cannot_be_judged_stops_the_roll_before_the_drain(tmp_path, monkeypatch):
    import io

    from pdkit.inventory.loader import load_with_problems
    from pdkit.roll.roller import Progress, Roller
    from tests.conftest import REPO

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = load_with_problems(str(REPO / "inventories" / "lab.py"))[0]
    roller = Roller("inventories/lab.py", spec, Progress(io.StringIO()))
    roller.answer_gate = GateConfig(short_prompts=0, lengths=(), accuracy=Accuracy(enabled=True))
    monkeypatch.setattr(answers, "eval_accuracy", lambda *a: {
        **_r(metrics_single(0.5, error_rate=0.2)), "run_dir": "/x"})
    with pytest.raises(RuntimeError, match="the baseline's eval cannot be judged: 20.0% of the requests failed"):
        roller.record_answers(["lab-gpu2"], {"lab-gpu2": "rel-1"})


def test_the_sims_stated_answer_follows_its_own_tokens():
    """PDKIT_SIM_ANSWER_BOXED (docs/sim.md, "Accuracy rehearsal"): the same output states the same
    answer, another token anywhere almost surely another; the knob is off by default."""
    from pdkit.sim.knobs import load_knobs
    from pdkit.sim.textgen import boxed_answer

    assert boxed_answer([5, 6, 7]) == boxed_answer([5, 6, 7]) != boxed_answer([5, 6, 8])
    assert boxed_answer([5, 6, 7]).startswith(" \\boxed{") and boxed_answer([5, 6, 7]).endswith("}")
    assert load_knobs({"PDKIT_SIM_ANSWER_BOXED": "1"}).answer_boxed and not load_knobs({}).answer_boxed
