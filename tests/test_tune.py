"""pdkit tune without a cluster: campaign parsing, sweeps, derived specs and their validation,
the derived inventory, flag diffs, ranking, records, resume, the estimate, the report and plot,
the correctness comparison and the wedge watch. The CLI runs in a child process (pdkit tune
gevent-patches the process it runs in)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.tune import gates
from pdkit.tune.campaign import (
    CampaignError,
    Candidate,
    apply_overlay,
    campaign_problems,
    derive,
    expand,
    flag_diff,
    keep_lines,
    key_problem,
    parse_campaign,
    render_inventory,
    spec_diff,
)
from pdkit.tune.results import (
    ResumeError,
    choose_kept,
    estimate,
    rank,
    render_markdown,
    resume_plan,
    write_report,
)
from tests.conftest import REPO

LAB = str(REPO / "inventories" / "lab.py")


@pytest.fixture(scope="module")
def lab_hosts():
    from pdkit.loader import load, read_inventory

    return read_inventory(LAB, str(REPO)), load(LAB)


def campaign(**over):
    raw = {"name": "t", "workload": {"concurrency": [4, 16, 64]}, "candidates": [{"name": "a", "set": {"decode.cuda_graph": False}}]}
    raw.update(over)
    return parse_campaign(raw)


# ---------------------------------------------------------------- campaign and sweeps


@pytest.mark.parametrize("entries, expected", [
    ([{"name": "off", "set": {"decode.cuda_graph": False}}], [("off", {"decode.cuda_graph": False})]),
    ([{"name": "mbs", "set": {"decode.cuda_graph_max_bs": [64, 96, 128]}}],
     [("mbs-64", {"decode.cuda_graph_max_bs": 64}), ("mbs-96", {"decode.cuda_graph_max_bs": 96}), ("mbs-128", {"decode.cuda_graph_max_bs": 128})]),
    # a list-valued field: a flat list is one value, a list of lists sweeps
    ([{"name": "bs", "set": {"decode.cuda_graph_bs": [1, 2, 4]}}], [("bs", {"decode.cuda_graph_bs": [1, 2, 4]})]),
    ([{"name": "bs", "set": {"decode.cuda_graph_bs": [[1, 2], [1, 2, 4]]}}],
     [("bs-1-2", {"decode.cuda_graph_bs": [1, 2]}), ("bs-1-2-4", {"decode.cuda_graph_bs": [1, 2, 4]})]),
    # two swept keys: their product, in listed order; an unswept key rides along
    ([{"name": "x", "set": {"decode.num_continuous_decode_steps": [1, 4], "all.page_size": [16, 64], "decode.cuda_graph": True}}],
     [("x-num_continuous_decode_steps1-page_size16", {"decode.num_continuous_decode_steps": 1, "all.page_size": 16, "decode.cuda_graph": True}),
      ("x-num_continuous_decode_steps1-page_size64", {"decode.num_continuous_decode_steps": 1, "all.page_size": 64, "decode.cuda_graph": True}),
      ("x-num_continuous_decode_steps4-page_size16", {"decode.num_continuous_decode_steps": 4, "all.page_size": 16, "decode.cuda_graph": True}),
      ("x-num_continuous_decode_steps4-page_size64", {"decode.num_continuous_decode_steps": 4, "all.page_size": 64, "decode.cuda_graph": True})]),
])
def test_expand(entries, expected):
    got = expand(campaign(candidates=entries))
    assert [(c.name, c.overlay) for c in got] == expected
    assert {c.origin for c in got} == {e["name"] for e in entries}


def test_candidate_gate_settings_default_to_the_campaigns():
    c = campaign(correctness={"min_match_rate": 0.8}, candidates=[
        {"name": "a", "set": {"decode.cuda_graph": False}},
        {"name": "b", "set": {"decode.cuda_graph": False}, "exact": True, "min_match_rate": 0.5}])
    a, b = expand(c)
    assert (a.exact, a.min_match_rate) == (False, 0.8)
    assert (b.exact, b.min_match_rate) == (True, 0.5)


@pytest.mark.parametrize("key, fragment", [
    ("decode.cuda_graph_max_bs", None),
    ("all.speculative.num_steps", None),
    ("node.nccl_profile", None),
    ("decode.cuda_graph_maxbs", "'cuda_graph_maxbs' is not a tuning field"),
    ("router.policy", "unknown scope 'router'"),
    ("node.gpus", "node levers are"),
    ("cuda_graph", "an overlay key is SCOPE.FIELD"),
])
def test_key_problem(key, fragment):
    why = key_problem(key)
    assert (why is None) if fragment is None else (fragment in why), why


@pytest.mark.parametrize("over, fragment", [
    ({"keep": "nope"}, "campaign.keep: 'nope' is not 'best', 'baseline' or a candidate name"),
    ({"target_concurrency": 32}, "campaign.target_concurrency: 32 is not one of campaign.workload.concurrency"),
    ({"candidates": [{"name": "a", "set": {"decode.x": 1}}]}, "campaign.candidates[a].set.decode.x"),
    ({"candidates": [{"name": "a", "set": {"decode.cuda_graph": False}}, {"name": "a", "set": {"decode.cuda_graph": True}}]}, "two candidates are named 'a'"),
    ({"candidates": [{"name": "baseline", "set": {"decode.cuda_graph": False}}]}, "the campaign's reference"),
])
def test_campaign_problems_name_the_campaign_field(over, fragment):
    c = campaign(**over)
    problems = campaign_problems(c, expand(c))
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize("raw, fragment", [
    ({"name": "t", "candidates": [{"name": "a", "set": {"decode.cuda_graph": False}}], "sok": {}}, "campaign.sok: unknown field"),
    ({"name": "t", "candidates": []}, "campaign.candidates"),
    ({"name": "Bad Name", "candidates": [{"name": "a", "set": {"x.y": 1}}]}, "campaign.name"),
    ({"name": "t", "target": "half", "candidates": [{"name": "a", "set": {"x.y": 1}}]}, "campaign.target"),
    ({"name": "t", "correctness": {"min_match_rate": 1.5}, "candidates": [{"name": "a", "set": {"x.y": 1}}]}, "campaign.correctness.min_match_rate"),
])
def test_parse_errors_name_the_campaign_field(raw, fragment):
    with pytest.raises(CampaignError) as info:
        parse_campaign(raw)
    assert any(p.startswith(fragment) for p in info.value.problems), info.value.problems


# ---------------------------------------------------------------- derived specs


def _cand(overlay, name="c"):
    return Candidate(name=name, overlay=overlay, exact=False, min_match_rate=0.9, origin=name)


def test_overlay_lands_on_the_target_engines_only(lab_hosts):
    hosts, base = lab_hosts
    snapshot = copy.deepcopy(hosts)
    spec, problems, applied = derive(hosts, _cand({"decode.cuda_graph_max_bs": 96, "node.nccl_profile": "pcie-p2p-off"}), ["lab-gpu2"], "x.py")
    assert spec is not None, problems
    assert applied.landed["decode.cuda_graph_max_bs"] == [("lab-gpu2", "pdkit_node.engines[decode].tuning.cuda_graph_max_bs")]
    assert spec_diff(base, spec) == {
        "lab-gpu2/decode": {"cuda_graph_max_bs": [64, 96]},
        "lab-gpu2/node": {"nccl_profile": ["pcie", "pcie-p2p-off"]},
    }
    assert hosts == snapshot, "the inventory's own data is never changed"
    assert apply_overlay(hosts, {}, ["lab-gpu2"]).hosts == snapshot


@pytest.mark.parametrize("overlay, fragments", [
    # the validator's own rules, with host and field
    ({"decode.cuda_graph_max_bs": 16}, ["lab-gpu2", "pdkit_node.engines[1].tuning.cuda_graph_max_bs", "target_concurrency is 64"]),
    ({"all.mem_fraction_static": 1.5}, ["lab-gpu2", "tuning.mem_fraction_static"]),
    ({"node.nccl_profile": "infiniband"}, ["lab-gpu2", "pdkit_node.nccl_profile"]),
    ({"unified.page_size": 64}, ["candidates[c].set.unified.page_size", "matches no engine"]),
])
def test_invalid_candidate_names_host_and_field(lab_hosts, overlay, fragments):
    hosts, _ = lab_hosts
    spec, problems, _ = derive(hosts, _cand(overlay), ["lab-gpu2"], "x.py")
    assert spec is None
    text = "\n".join(str(p) for p in problems if p.severity == "error")
    for f in fragments:
        assert f in text, text


def test_derived_inventory_loads_to_the_same_plan(lab_hosts, tmp_path):
    from pdkit.loader import load
    from pdkit.plan import plan_cluster

    hosts, base = lab_hosts
    spec, _, applied = derive(hosts, _cand({"decode.cuda_graph": False}), ["lab-gpu2"], "x.py")
    path = tmp_path / "c.py"
    path.write_text(render_inventory(applied.hosts, LAB, "c"))
    loaded = load(path)
    assert {h: p.release_hash for h, p in plan_cluster(loaded).items()} == {h: p.release_hash for h, p in plan_cluster(spec).items()}
    before, after = plan_cluster(base), plan_cluster(loaded)
    assert before["lab-gpu1"].release_hash == after["lab-gpu1"].release_hash
    assert before["lab-gpu2"].release_hash != after["lab-gpu2"].release_hash


def test_flag_diff_uses_pdkit_compares_words(lab_hosts):
    hosts, base = lab_hosts
    spec, _, _ = derive(hosts, _cand({"decode.cuda_graph": False}), ["lab-gpu2"], "x.py")
    assert flag_diff(base, spec) == ["lab-gpu2/decode: added `--cuda-graph-backend-decode disabled`; removed `--cuda-graph-max-bs-decode 64`"]


def test_keep_lines_per_engine_or_cluster_wide(lab_hosts):
    hosts, _ = lab_hosts
    cand = _cand({"decode.num_continuous_decode_steps": 1})
    _, _, one = derive(hosts, cand, ["lab-gpu2"], "x.py")
    assert keep_lines(cand, one, ["lab-gpu1", "lab-gpu2"]) == ["lab-gpu2: pdkit_node.engines[decode].tuning.num_continuous_decode_steps: 1"]
    _, _, both = derive(hosts, cand, ["lab-gpu1", "lab-gpu2"], "x.py")
    assert keep_lines(cand, both, ["lab-gpu1", "lab-gpu2"]) == ["pdkit_cluster.tuning.decode.num_continuous_decode_steps: 1"]


# ---------------------------------------------------------------- records, ranking, resume


def rec(name, verdict="pass", tok=None, p99=10.0, kind=None, overlay=None, **extra):
    levels = [] if tok is None else [{"concurrency": 64, "output_tok_s": tok, "requests_s": tok / 10, "tpot_ms": {"p50": p99 / 2, "p99": p99},
                                      "errors": 0, "error_samples": []}]
    c = _cand(overlay or {"decode.cuda_graph": name}, name) if name != "baseline" else None
    return {"campaign": "t", "candidate": name, "kind": kind or ("baseline" if name == "baseline" else "candidate"),
            "verdict": verdict, "overlay": c.overlay if c else {}, "overlay_hash": c.overlay_hash if c else None,
            "bench": {"levels": levels, "env": {"engine": "sim"}, "id": name, "cluster": "lab", "input_len": 1, "output_len": 1} if levels else None,
            "failed_gate": None if verdict == "pass" else "soak", "reason": "" if verdict == "pass" else "wedged: lab-gpu2/decode", **extra}


@pytest.mark.parametrize("records, slo, order", [
    ([rec("baseline", tok=100), rec("a", tok=150), rec("b", tok=50), rec("c", "fail")], None, ["a", "baseline", "b"]),
    # over the SLO ranks after every candidate within it, whatever its throughput
    ([rec("baseline", tok=100, p99=20), rec("a", tok=150, p99=40), rec("b", tok=120, p99=25)], 30, ["b", "baseline", "a"]),
])
def test_rank(records, slo, order):
    rows = rank(records, 64, "output_tok_s", slo)
    assert [r["candidate"] for r in rows] == order
    by = {r["candidate"]: r for r in rows}
    assert by["baseline"]["ratio"] == pytest.approx(1.0)
    assert by[order[0]]["ratio"] == pytest.approx(by[order[0]]["value"] / by["baseline"]["value"])


@pytest.mark.parametrize("keep, records, expected", [
    ("best", [rec("baseline", tok=100), rec("a", tok=150)], "a"),
    ("best", [rec("baseline", tok=100), rec("a", tok=50)], "baseline"),
    ("baseline", [rec("baseline", tok=100), rec("a", tok=150)], "baseline"),
    ("a", [rec("baseline", tok=100), rec("a", tok=50), rec("b", tok=150)], "a"),
    ("a", [rec("baseline", tok=100), rec("a", "fail"), rec("b", tok=150)], "baseline"),
])
def test_choose_kept(keep, records, expected):
    kept, why = choose_kept(keep, rank(records, 64, "output_tok_s"), records)
    assert kept == expected, why


def test_resume_plan_skips_recorded_candidates_and_refuses_changes():
    cands = [_cand({"decode.cuda_graph": "a"}, "a"), _cand({"decode.cuda_graph": "b"}, "b")]
    records = [rec("baseline", tok=1), rec("a", tok=2)]
    done, todo = resume_plan(cands, records, True, "t")
    assert set(done) == {"baseline", "a"} and [c.name for c in todo] == ["b"]
    with pytest.raises(ResumeError, match="pass --resume"):
        resume_plan(cands, records, False, "t")
    changed = [_cand({"decode.cuda_graph": "other"}, "a"), cands[1]]
    with pytest.raises(ResumeError, match="changed since it was recorded"):
        resume_plan(changed, records, True, "t")
    with pytest.raises(ResumeError, match="no longer defines"):
        resume_plan(cands[1:], records, True, "t")
    assert resume_plan(cands, [], False, "t") == ({}, cands)
    # an end record (what was left applied) is not a candidate result
    done, todo = resume_plan(cands, [*records, rec("b", tok=3), {"campaign": "t", "kind": "end", "candidate": "b"}], True, "t")
    assert todo == [] and done["b"]["kind"] == "candidate"


def test_estimate_uses_measured_times_when_recorded():
    c = campaign(workload={"concurrency": [4, 16], "requests": 10, "warmup": 2}, soak={"seconds": 5})
    assumed = estimate(3, 1, c)
    assert assumed["measured"] == {"roll": False, "bench": False}
    assert assumed["per_candidate"]["roll_s"] == 60.0 and assumed["per_candidate"]["bench_s"] == pytest.approx(0.5 * 22)
    measured = estimate(3, 2, c, [{"timings": {"roll_s": 30, "restarts": 1, "bench_s": 12}}, {"timings": {"roll_s": 50, "restarts": 1, "bench_s": 8}}])
    assert measured["measured"] == {"roll": True, "bench": True}
    assert measured["per_candidate"]["roll_s"] == 80.0 and measured["per_candidate"]["bench_s"] == 10.0
    assert measured["total_s"] == pytest.approx(3 * sum(measured["per_candidate"].values()), abs=0.5)


def test_report_ranks_lists_failures_and_draws_the_plot(tmp_path):
    c = campaign(out_dir=str(tmp_path))
    records = [rec("baseline", tok=100), rec("a", tok=150, flag_diff=["lab-gpu2/decode: added `--x`"]), rec("b", "fail"),
               {"campaign": "t", "kind": "end", "candidate": "a", "reason": "best", "keep_fields": ["lab-gpu2: pdkit_node.engines[decode].tuning.x: 1"]}]
    text = render_markdown(c, records, 64, "t.png", pending=["z"])
    table = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert table[0].startswith("| 1 | a |") and "1.500" in table[0] and table[1].startswith("| 2 | baseline |")
    assert "| b |" in text and "wedged: lab-gpu2/decode" in text and "| soak |" in text
    assert "never SGLang" in text and "Not run yet: z" in text and "![" in text
    assert "Left applied: a" in text and "lab-gpu2: pdkit_node.engines[decode].tuning.x: 1" in text
    written = write_report(c, records, 64)
    assert [p.name for p in written] == ["t.md", "t.png"]
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- gates (pure parts)


@pytest.mark.parametrize("base, got, div", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2, 3], [1, 2], 2), ([1, 2], [1, 2, 3], 2), ([1], [2], 0),
])
def test_first_divergence(base, got, div):
    assert gates.first_divergence(base, got) == div


def test_compare_and_verdicts():
    base = [{"tokens": [1, 2, 3, 4]}, {"tokens": [5, 6, 7, 8]}]
    same = gates.compare(base, [{"tokens": [1, 2, 3, 4]}, {"tokens": [5, 6, 7, 8]}])
    assert same["match_rate"] == 1.0 and gates.correctness_verdict(same, 1.0, True)[0]
    late = gates.compare(base, [{"tokens": [1, 2, 3, 9]}, {"tokens": [5, 6, 7, 8]}])
    assert late["match_rate"] == pytest.approx(7 / 8)
    assert gates.correctness_verdict(late, 0.8, False)[0]
    ok, why = gates.correctness_verdict(late, 0.8, True)
    assert not ok and "exactness required" in why and "#0 at token 3" in why
    ok, why = gates.correctness_verdict(late, 0.9, False)
    assert not ok and "below the threshold 0.9" in why
    broken = gates.compare(base, [{"error": "HTTP 502"}, {"tokens": [5, 6, 7, 8]}])
    ok, why = gates.correctness_verdict(broken, 0.0, False)
    assert not ok and "1 of 2 prompts failed" in why and "HTTP 502" in why


def test_prompts_are_fixed_and_distinct():
    assert gates.prompts(16) == gates.prompts(16) and len(set(gates.prompts(16))) == 16


def test_wedge_watch_needs_running_requests_and_no_progress_for_the_window():
    w = gates.WedgeWatch(window_s=2)
    run = "sglang:num_running_reqs"
    tok = "sglang:realtime_tokens_total"
    assert w.observe(0, {"d": {run: 4, tok: 10}}) == []
    assert w.observe(1, {"d": {run: 4, tok: 10}}) == []  # stuck for 0 s (first stuck sample)
    assert w.observe(2.5, {"d": {run: 4, tok: 10}}) == []  # 1.5 s
    assert w.observe(3.1, {"d": {run: 4, tok: 10}}) == ["d"]  # 2.1 s
    assert w.observe(4, {"d": {run: 4, tok: 11}}) == []  # a token moved
    idle = gates.WedgeWatch(window_s=0.1)
    assert idle.observe(0, {"d": {run: 0, tok: 1}}) == [] and idle.observe(5, {"d": {run: 0, tok: 1}}) == []


def test_counter_moves():
    name = "sglang:num_transfer_failed_reqs_total"
    assert gates.counter_moves({"a": {name: 1}, "b": None}, {"a": {name: 3}, "b": {name: 9}}) == {"a": {name: 2}}
    assert gates.counter_moves({"a": {name: 1}}, {"a": {name: 1}}) == {}


# ---------------------------------------------------------------- the command (child process)


def _tune(*args, cwd=REPO):
    return subprocess.run([str(Path(sys.executable).parent / "pdkit"), "tune", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_invalid_candidate_fails_up_front_naming_host_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "t", "out_dir": str(tmp_path / "out"), "candidates": [
        {"name": "ok", "set": {"decode.cuda_graph": False}},
        {"name": "small", "set": {"decode.cuda_graph_max_bs": [16, 64]}}]}))
    done = _tune(LAB, str(path))
    assert done.returncode == 2, done.stderr
    assert "no host was contacted" in done.stderr
    assert "candidate small-16: lab-gpu2: pdkit_node.engines[1].tuning.cuda_graph_max_bs" in done.stderr
    assert "small-64" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_cli_dry_prints_candidates_flag_diffs_and_estimate(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("CAMPAIGN = {'name': 't', 'out_dir': %r, 'workload': {'concurrency': [4, 64]}, 'candidates': [\n"
                    "  {'name': 'off', 'set': {'decode.cuda_graph': False}},\n"
                    "  {'name': 'steps', 'set': {'decode.num_continuous_decode_steps': [1, 8]}}]}\n" % str(tmp_path / "out"))
    done = _tune(LAB, str(path), "--dry")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "target: lab-gpu2; objective output_tok_s at C=64" in out
    assert "lab-gpu2/decode: added `--cuda-graph-backend-decode disabled`" in out
    assert "steps-1:" in out and "`--num-continuous-decode-steps 4` -> `--num-continuous-decode-steps 1`" in out
    assert "steps-8:" in out and "estimate:" in out and "assumed, not yet measured" in out
    assert not (tmp_path / "out").exists(), "--dry writes nothing"


def test_the_docs_example_and_the_gpu_campaign_validate(tmp_path):
    import re

    block = re.search(r"```yaml\n(.*?)```", (REPO / "docs" / "tune.md").read_text(), re.S).group(1)
    path = tmp_path / "docs.yaml"
    path.write_text(block + f"out_dir: {tmp_path / 'out'}\n")
    done = _tune(str(REPO / "inventories" / "cluster.py"), str(path), "--dry")
    assert done.returncode == 0, done.stderr
    assert "mtp-3:" in done.stdout and "graph-max-bs-128:" in done.stdout
    gpu = _tune("inventories/h200.py", "gpu/tune_h200.yaml", "--dry")
    assert gpu.returncode == 0, gpu.stderr
    assert "h200/decode: added `--cuda-graph-backend-decode disabled`" in gpu.stdout
