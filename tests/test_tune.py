"""pdkit tune without a cluster: campaign parsing, sweeps, derived specs and their validation,
the derived inventory, flag diffs, ranking, records, resume, the estimate, the report and plot,
the correctness comparison and the wedge watch. The CLI runs in a child process (pdkit tune
gevent-patches the process it runs in).

What the gates and the bench measure (pdkit.bench.measure) is tested on the lab inventory (which
pairs, which form) and against two sim PD pairs behind the real smg router: the target's pair
alone gets the correctness prompts, the soak and the bench, so the corrupting and the wedging
lever strike on every run, and the bench record names the engines it measured."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.clients import answers
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
    REMEASURE,
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
    from pdkit.inventory.loader import load, read_inventory

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
    ("node.engines", None),
    ("node.layout", None),
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


@pytest.mark.parametrize("workload, problem", [
    ({"concurrency": [1, 64], "requests": 32}, "concurrency 64 can never be reached with requests 32"),
    ({"concurrency": [16, 16]}, "concurrency level(s) 16 given twice"),
    ({"concurrency": [32], "agentic": {"sessions": 16}}, "concurrency 32 can never be reached with agentic.sessions 16"),
])
def test_a_workload_level_that_cannot_be_reached_or_vanishes_is_refused(workload, problem):
    """Issue 46: a level above the request (or session) count measures a lower concurrency under its name; a
    repeated level would vanish silently."""
    with pytest.raises(CampaignError) as info:
        parse_campaign({"name": "t", "workload": workload, "candidates": [{"name": "a", "set": {"decode.cuda_graph": False}}]})
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_a_key_given_twice_in_a_yaml_campaign_is_refused_with_its_lines(tmp_path):
    """Issue 46: yaml.safe_load keeps the last of two equal keys silently (here the first candidates list
    would vanish); the campaign reader refuses it and says where both are."""
    from pdkit.tune.campaign import read_campaign_file

    path = tmp_path / "twice.yaml"
    path.write_text("name: t\ncandidates:\n  - {name: a, set: {decode.cuda_graph: false}}\n"
                    "workload: {requests: 8, concurrency: [1]}\ncandidates:\n  - {name: b, set: {all.page_size: 64}}\n")
    with pytest.raises(CampaignError) as info:
        read_campaign_file(path)
    text = " ".join(info.value.problems)
    assert "the key 'candidates' is given twice (first at line 2)" in text and "line 5" in text, text
    ok = tmp_path / "once.yaml"
    ok.write_text("name: t\ncandidates:\n  - {name: a, set: {decode.cuda_graph: false}}\n")
    assert read_campaign_file(ok)["candidates"][0]["name"] == "a"


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


@pytest.mark.parametrize("objective, problem", [
    ({"metric": "ttft_mean_ms"}, "campaign.objective.metric: Input should be 'output_tok_s', 'requests_s', 'goodput', 'ttft_p50_ms' or 'ttft_p99_ms'"),
    ({"metric": "goodput"}, "campaign.objective: metric goodput counts the requests within a TTFT and a TPOT SLO: set ttft_slo_ms and tpot_slo_ms"),
    ({"metric": "goodput", "ttft_slo_ms": 500}, "campaign.objective: metric goodput counts the requests within a TTFT and a TPOT SLO: set tpot_slo_ms ("),
    ({"metric": "ttft_p99_ms", "ttft_slo_ms": 500}, "campaign.objective: ttft_slo_ms are goodput's SLOs and metric 'ttft_p99_ms' would ignore them"),
    ({"metric": "goodput", "ttft_slo_ms": 0, "tpot_slo_ms": 50}, "campaign.objective.ttft_slo_ms: Input should be greater than 0"),
    ({"metrics": "goodput"}, "campaign.objective.metrics: unknown field"),
])
def test_a_bad_objective_names_the_field_and_the_valid_values(objective, problem):
    with pytest.raises(CampaignError) as info:
        campaign(objective=objective)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_the_objectives_say_what_they_count_and_which_way_is_better():
    assert campaign().objective.describe() == "(higher is better)"
    assert campaign(objective={"metric": "ttft_p99_ms", "tpot_p99_slo_ms": 80}).objective.describe() == "(lower is better), TPOT p99 <= 80 ms"
    goodput = campaign(objective={"metric": "goodput", "ttft_slo_ms": 2000, "tpot_slo_ms": 60}).objective
    assert goodput.describe() == "(requests/s whose TTFT <= 2000 ms and TPOT <= 60 ms, higher is better)"
    assert goodput.goodput_slo == {"ttft_ms": 2000, "tpot_ms": 60} and campaign().objective.goodput_slo is None


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
    assert_refused(lab_hosts[0], overlay, "lab-gpu2", fragments)


def assert_refused(hosts, overlay, target, fragments):
    """The candidate OVERLAY on TARGET derives no spec, and its errors say every one of FRAGMENTS."""
    spec, problems, _ = derive(hosts, _cand(overlay), [target], "x.py")
    assert spec is None
    text = "\n".join(str(p) for p in problems if p.severity == "error")
    for f in fragments:
        assert f in text, text


def test_derived_inventory_loads_to_the_same_plan(lab_hosts, tmp_path):
    from pdkit.inventory.loader import load
    from pdkit.render.plan import plan_cluster

    hosts, base = lab_hosts
    spec, _, applied = derive(hosts, _cand({"decode.cuda_graph": False}), ["lab-gpu2"], "x.py")
    path = tmp_path / "c.py"
    path.write_text(render_inventory(applied.hosts, LAB, "c"))
    loaded = load(path)
    assert {h: p.release_hash for h, p in plan_cluster(loaded).items()} == {h: p.release_hash for h, p in plan_cluster(spec).items()}
    before, after = plan_cluster(base), plan_cluster(loaded)
    assert before["lab-gpu1"].release_hash == after["lab-gpu1"].release_hash
    assert before["lab-gpu2"].release_hash != after["lab-gpu2"].release_hash


@pytest.mark.parametrize("overlay, diff", [
    ({"decode.decode_radix_cache": True}, ["lab-gpu2/decode: added `--disaggregation-decode-enable-radix-cache`"]),
    ({"prefill.hicache": True, "prefill.hicache_size_gb": 4},
     ["lab-gpu2/prefill: added `--enable-hierarchical-cache`; added `--hicache-size 4`"]),
    ({"prefill.radix_cache": False}, ["lab-gpu2/prefill: added `--disable-radix-cache`"]),
    # null unsets a lever: SGLang 0.5.23 then sizes mem_fraction_static per role itself
    ({"all.mem_fraction_static": None}, ["lab-gpu2/decode: removed `--mem-fraction-static 0.88`",
                                         "lab-gpu2/prefill: removed `--mem-fraction-static 0.88`"]),
])
def test_the_cache_levers_and_an_unset_lever_are_candidates(lab_hosts, overlay, diff):
    hosts, base = lab_hosts
    spec, problems, _ = derive(hosts, _cand(overlay), ["lab-gpu2"], "x.py")
    assert spec is not None, problems
    assert flag_diff(base, spec) == diff
    if "decode.decode_radix_cache" in overlay:  # offered, and labelled experimental wherever it shows
        assert any("experimental" in p.message for p in problems if p.severity == "warning"), problems


# ------------------------------------------------------------------ layout as a lever

ONE_NODE = str(REPO / "inventories" / "lab-one-node.py")
SPLIT_2_6 = [{"name": "prefill", "role": "prefill", "gpus": [0, 1], "port": 30000, "bootstrap_port": 8998, "pd_group": "lab-gpu1"},
             {"name": "decode", "role": "decode", "gpus": [2, 3, 4, 5, 6, 7], "tp": 2, "dp": 3, "port": 30001, "pd_group": "lab-gpu1"}]


@pytest.fixture(scope="module")
def one_node_hosts():
    from pdkit.inventory.loader import load, read_inventory

    return read_inventory(ONE_NODE, str(REPO)), load(ONE_NODE)


def test_pd_to_one_unified_engine_over_the_same_gpus(one_node_hosts):
    hosts, base = one_node_hosts
    spec, problems, applied = derive(hosts, _cand({"node.layout": "unified", "unified.page_size": 64}), ["lab-gpu1"], "x.py")
    assert spec is not None, problems
    node = next(h for h in spec.gpu_hosts if h.name == "lab-gpu1").node
    [engine] = node.engines
    assert (engine.role, engine.gpus, engine.tp_size, engine.port) == ("unified", tuple(range(8)), 8, 30000)
    # the layout applies first: the unified-scoped key lands on the new engine
    assert applied.landed["unified.page_size"] == [("lab-gpu1", "pdkit_node.engines[unified].tuning.page_size")]
    assert flag_diff(base, spec) == ["lab-gpu1/decode: engine removed", "lab-gpu1/prefill: engine removed", "lab-gpu1/unified: engine added"]
    # the derived inventory is a full inventory the loader reads back to the same plan
    from pdkit.render.plan import plan_cluster
    assert plan_cluster(spec)["lab-gpu1"].release_hash != plan_cluster(base)["lab-gpu1"].release_hash


def test_another_gpu_split_is_a_whole_engines_list(one_node_hosts, tmp_path):
    from pdkit.inventory.loader import load

    hosts, _ = one_node_hosts
    spec, problems, applied = derive(hosts, _cand({"node.engines": SPLIT_2_6}), ["lab-gpu1"], "x.py")
    assert spec is not None, problems
    engines = {e.name: e for e in next(h for h in spec.gpu_hosts if h.name == "lab-gpu1").node.engines}
    assert (engines["prefill"].gpus, engines["decode"].dp) == ((0, 1), 3)
    path = tmp_path / "split.py"
    path.write_text(render_inventory(applied.hosts, ONE_NODE, "split"))
    assert {e.name: e.gpus for e in next(h for h in load(path).gpu_hosts if h.name == "lab-gpu1").node.engines} == \
        {"prefill": (0, 1), "decode": (2, 3, 4, 5, 6, 7)}


@pytest.mark.parametrize("overlay, fragments", [
    # every layout is validated like any inventory: a GPU used twice, TP that does not divide, a port twice
    ({"node.engines": [{**SPLIT_2_6[0], "gpus": [0, 1, 2]}, SPLIT_2_6[1]]}, ["lab-gpu1", "pdkit_node.engines"]),
    ({"node.engines": [SPLIT_2_6[0], {**SPLIT_2_6[1], "tp": 4, "dp": 1}]}, ["lab-gpu1", "pdkit_node.engines[1]", "tp"]),
    ({"node.engines": [SPLIT_2_6[0], {**SPLIT_2_6[1], "port": 30000}]}, ["lab-gpu1", "port"]),
    # a role-scoped key that no engine of the new layout has changes nothing: refused
    ({"node.layout": "unified", "decode.page_size": 64}, ["candidates[c].set.decode.page_size", "matches no engine"]),
])
def test_a_bad_layout_is_refused_naming_host_and_field(one_node_hosts, overlay, fragments):
    assert_refused(one_node_hosts[0], overlay, "lab-gpu1", fragments)


@pytest.mark.parametrize("set_, fragment", [
    ({"node.layout": "tp8"}, "'tp8' is not a layout; valid: unified"),
    ({"node.engines": [1, 2]}, "a whole engines list"),
    ({"node.engines": []}, "a whole engines list"),
])
def test_layout_values_are_checked_up_front(set_, fragment):
    c = campaign(candidates=[{"name": "l", "set": set_}])
    problems = campaign_problems(c, expand(c))
    assert any(p.startswith(f"campaign.candidates[l].set.{next(iter(set_))}: ") and fragment in p for p in problems), problems


def test_a_layout_sweep_names_each_candidate_by_its_roles_and_gpus():
    unified = [{"name": "u", "role": "unified", "gpus": list(range(8)), "port": 30000}]
    parsed = campaign(candidates=[{"name": "shape", "set": {"node.engines": [SPLIT_2_6, unified]}}])
    assert [(c.name, len(c.overlay["node.engines"])) for c in expand(parsed)] == [("shape-p2-d6", 2), ("shape-u8", 1)]


# ------------------------------------------------------------------ the agentic workload in a campaign

AGENTIC = {"sessions": 4, "turns": 3, "system_tokens": 300, "turn_tokens": 100, "reply_tokens": 16, "think_s": 0.1}


def _agentic_campaign(tmp_path, agentic, candidates=None, **over):
    import yaml

    raw = {"name": "ag", "inventory": "inventories/lab-one-node.py", "target": "canary", "downtime": True,
           "workload": {"concurrency": [4], "warmup": 1, "agentic": agentic}, "target_concurrency": 4,
           "candidates": candidates or [{"name": "unified", "set": {"node.layout": "unified"}}], **over}
    path = tmp_path / "ag.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_an_agentic_campaign_dry_runs_with_its_sessions_and_largest_context(tmp_path):
    done = _tune("inventories/lab-one-node.py", str(_agentic_campaign(tmp_path, AGENTIC)), "--dry")
    assert done.returncode == 0, done.stderr
    assert ("bench: agentic workload: 4 fresh sessions x 3 turns per level (system 300 tokens shared, +100 per turn, "
            "replies 16 tokens, think 0.1 s), largest context 656 tokens") in done.stdout, done.stdout


def test_an_agentic_session_longer_than_a_candidates_cap_is_refused_up_front(tmp_path):
    cand = [{"name": "ctx", "set": {"all.context_length": 512}}]
    done = _tune("inventories/lab-one-node.py", str(_agentic_campaign(tmp_path, AGENTIC, cand)), "--dry")
    assert done.returncode == 2 and "no host was contacted" in done.stderr, done.stderr
    assert "candidate ctx: campaign.workload.agentic: the agentic workload's largest context" in done.stderr
    assert "656 exceeds the planned context length 512" in done.stderr and "candidate baseline" not in done.stderr


def test_an_agentic_trace_file_is_read_relative_to_the_campaign_and_a_missing_one_named(tmp_path):
    from pdkit.bench.agentic import AgenticParams, generate_trace, trace_bytes

    (tmp_path / "mine.json").write_bytes(trace_bytes(generate_trace(AgenticParams(sessions=2, turns=2), 2)))
    ok = _tune("inventories/lab-one-node.py", str(_agentic_campaign(tmp_path, {"trace": "mine.json", "reply_tokens": 8})), "--dry")
    assert ok.returncode == 0 and "sessions per level from the trace mine.json" in ok.stdout, ok.stdout + ok.stderr
    missing = _tune("inventories/lab-one-node.py", str(_agentic_campaign(tmp_path, {"trace": "nope.json"})), "--dry")
    assert missing.returncode == 2 and "campaign.workload.agentic:" in missing.stderr and "nope.json" in missing.stderr


def test_an_agentic_campaign_is_refused_when_the_target_is_not_what_the_router_fronts(tmp_path):
    import yaml

    raw = {"name": "ag", "inventory": "inventories/lab.py", "target": "canary",
           "workload": {"concurrency": [4], "agentic": AGENTIC}, "target_concurrency": 4,
           "candidates": [{"name": "steps", "set": {"decode.num_continuous_decode_steps": 1}}]}
    path = tmp_path / "ag.yaml"
    path.write_text(yaml.safe_dump(raw))
    done = _tune("inventories/lab.py", str(path), "--dry")
    assert done.returncode == 2 and "campaign.workload.agentic: the agentic workload replays sessions through the router" in done.stderr, done.stderr


def test_the_runner_benches_the_agentic_workload_with_the_same_sessions_for_every_candidate(monkeypatch, tmp_path):
    from pdkit.bench import agentic
    from pdkit.tune import runner

    prep = runner.prepare("inventories/lab-one-node.py", str(_agentic_campaign(tmp_path, AGENTIC)))
    seen = []
    monkeypatch.setattr(agentic, "run_agentic_bench", lambda spec, workload, **kw: seen.append((workload, kw)) or {"levels": []})
    monkeypatch.setattr("pdkit.bench.run_bench", lambda *a, **k: pytest.fail("the random-prompt bench ran"))
    run = runner.Session.__new__(runner.Session)
    run.prep = prep
    run.bench(prep.specs["baseline"], "baseline")
    run.bench(prep.specs["unified"], "unified")
    assert [w for w, _ in seen] == [prep.agentic, prep.agentic] and seen[0][1]["concurrency"] == [4]
    assert prep.agentic.describe()["params"]["system_tokens"] == 300


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


def _levels(tok, p99=10.0):
    return [{"concurrency": 64, "output_tok_s": tok, "requests_s": tok / 10, "tpot_ms": {"p50": p99 / 2, "p99": p99},
             "errors": 0, "error_samples": []}]


def rec(name, verdict="pass", tok=None, p99=10.0, kind=None, overlay=None, again=(99.0, 101.0), **extra):
    """A record; the baseline's AGAIN: its repeated benches' tok/s (the band: 2% by default, so a
    candidate needs more than 4% to be kept)."""
    levels = [] if tok is None else _levels(tok, p99)
    c = _cand(overlay or {"decode.cuda_graph": name}, name) if name != "baseline" else None
    if name == "baseline" and levels and again:
        extra.setdefault("bench_repeats", [_levels(t, p99) for t in again])
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


SLO = {"ttft_ms": 2000.0, "tpot_ms": 60.0}


def with_figures(record, ttft_p50=None, ttft_p99=None, goodput=None, slo=SLO):
    """REC's level with TTFT percentiles and goodput (as pdkit.bench.stats writes them)."""
    lv = record["bench"]["levels"][0]
    lv["ttft_ms"] = {"mean": ttft_p50, "p50": ttft_p50, "p99": ttft_p99}
    if goodput is not None:
        lv["goodput"] = {"requests_s": goodput, "good": 1, "attainment": 1.0, "slo_ms": dict(slo)}
    return record


@pytest.mark.parametrize("metric, goodput_slo, order, values", [
    # higher is better
    ("output_tok_s", None, ["b", "baseline", "a"], [300, 100, 50]),
    ("requests_s", None, ["b", "baseline", "a"], [30, 10, 5]),
    # the fastest first token first: a ranks first on p50, baseline on p99
    ("ttft_p50_ms", None, ["a", "b", "baseline"], [200, 400, 500]),
    ("ttft_p99_ms", None, ["baseline", "b", "a"], [900, 1000, 3000]),
    # goodput: requests/s within both SLOs, higher is better; a goodput judged by other SLOs is no figure
    ("goodput", SLO, ["b", "baseline", "a"], [4.0, 2.0, None]),
])
def test_rank_by_each_objective(metric, goodput_slo, order, values):
    records = [
        with_figures(rec("baseline", tok=100), ttft_p50=500, ttft_p99=900, goodput=2.0),
        with_figures(rec("a", tok=50), ttft_p50=200, ttft_p99=3000, goodput=9.0, slo={"ttft_ms": 5000, "tpot_ms": 60}),
        with_figures(rec("b", tok=300), ttft_p50=400, ttft_p99=1000, goodput=4.0),
        rec("c", "fail"),
    ]
    rows = rank(records, 64, metric, None, goodput_slo)
    assert [r["candidate"] for r in rows] == order
    assert [r["value"] for r in rows] == values
    by = {r["candidate"]: r for r in rows}
    assert by["baseline"]["ratio"] == pytest.approx(1.0)


def test_rank_by_ttft_keeps_the_tpot_slo_first_and_puts_no_figure_last():
    records = [with_figures(rec("baseline", tok=100, p99=20), ttft_p99=900), with_figures(rec("a", tok=100, p99=40), ttft_p99=100),
               rec("b", tok=100, p99=20)]  # b's level has no TTFT figure
    rows = rank(records, 64, "ttft_p99_ms", 30)
    assert [(r["candidate"], r["within_slo"]) for r in rows] == [("baseline", True), ("b", True), ("a", False)]
    rows = rank(records, 64, "ttft_p99_ms")
    assert [r["candidate"] for r in rows] == ["a", "baseline", "b"]


def test_the_report_ranks_by_the_campaigns_objective(tmp_path):
    c = campaign(workload={"concurrency": [64]}, objective={"metric": "ttft_p99_ms"})
    records = [with_figures(rec("baseline", tok=100), ttft_p99=900), with_figures(rec("a", tok=300), ttft_p99=1500)]
    text = render_markdown(c, records, 64, None)
    assert "objective `ttft_p99_ms` at C=64 (lower is better)." in text
    assert "| rank | candidate | overlay | ttft_p99_ms @C=64 |" in text
    assert text.index("| 1 | baseline |") < text.index("| 2 | a |")
    assert "| TPOT p99 ms | KV share of TTFT |" in text and "| 10.0 | – |" in text
    records[0]["bench"]["levels"][0]["kv"] = {"ttft_share": 0.4}
    assert "| 10.0 | 40% |" in render_markdown(c, records, 64, None)
    kept, _ = choose_kept("best", rank(records, 64, "ttft_p99_ms"), records)
    assert kept == "baseline"


def test_the_bench_gate_line_gives_ttft_goodput_and_the_kv_share():
    from pdkit.tune.runner import bench_figures

    lv = {"concurrency": 16, "output_tok_s": 640.4, "ttft_ms": {"p99": 812.2},
          "goodput": {"requests_s": 5.123}, "kv": {"ttft_share": 0.42}}
    assert bench_figures(lv) == "C=16 640 tok/s TTFT p99 812 ms goodput 5.12 req/s KV 42% of TTFT"
    assert bench_figures({"concurrency": 1, "output_tok_s": 10.0}) == "C=1 10 tok/s"


def test_the_long_prompt_campaign_is_3072_in_64_out_at_c1_and_c16():
    import yaml

    raw = yaml.safe_load((REPO / "docs" / "tune" / "lab-long-prompt.yaml").read_text())
    c = parse_campaign(raw)
    assert (c.workload.input_len, c.workload.output_len, c.workload.concurrency) == (3072, 64, (1, 16))
    assert c.objective.metric == "goodput" and c.target_concurrency == 16
    assert campaign_problems(c, expand(c)) == []


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


@pytest.mark.parametrize("again, cand_tok, margin, kept", [
    # baseline 100, 104, 98: median 100, spread 6%; a gain must clear 6% + the margin
    ((104.0, 98.0), 105.0, 0.02, "baseline"),   # +5%: inside the spread
    ((104.0, 98.0), 107.0, 0.02, "baseline"),   # +7%: beyond the spread, not beyond spread + margin
    ((104.0, 98.0), 109.0, 0.02, "a"),          # +9% > 8%
    ((104.0, 98.0), 107.0, 0.0, "a"),           # no margin: +7% > 6%
    ((100.5, 100.2), 101.1, 0.02, "baseline"),  # issue 43's lab run: ctx-4096 at 1.011x was kept; not any more
])
def test_best_is_kept_only_beyond_the_baselines_spread_plus_the_margin(again, cand_tok, margin, kept):
    records = [rec("baseline", tok=100.0, again=again), rec("a", tok=cand_tok)]
    ranked = rank(records, 64, "output_tok_s", margin=margin)
    assert ranked[0]["candidate"] == "a"  # the ranking is unchanged: the rule is in what is kept
    got, why = choose_kept("best", ranked, records)
    assert got == kept, why
    if kept == "baseline":
        assert why.startswith("no candidate beat the noise: the best, a, ") and "within the noise" in why
    else:
        assert "beyond the noise" in why


def test_a_baseline_measured_once_keeps_the_baseline_and_says_there_is_no_spread():
    records = [rec("baseline", tok=100.0, again=()), rec("a", tok=300.0)]
    kept, why = choose_kept("best", rank(records, 64, "output_tok_s"), records)
    assert kept == "baseline" and "measured 1 time(s): no spread to judge by" in why


def test_lower_is_better_objectives_judge_the_gain_downwards():
    records = [with_figures(rec("baseline", tok=100.0, again=()), ttft_p50=100.0),
               with_figures(rec("a", tok=100.0), ttft_p50=80.0), with_figures(rec("b", tok=100.0), ttft_p50=97.0)]
    records[0]["bench_repeats"] = [with_figures(rec("baseline", tok=100.0, again=()), ttft_p50=t)["bench"]["levels"]
                                   for t in (103.0, 99.0)]
    ranked = rank(records, 64, "ttft_p50_ms")
    assert [r["candidate"] for r in ranked] == ["a", "b", "baseline"]
    by = {r["candidate"]: r["noise"] for r in ranked}
    assert by["a"]["gain"] == pytest.approx(0.2) and by["a"]["beyond"] is True
    assert by["b"]["gain"] == pytest.approx(0.03) and by["b"]["beyond"] is False  # spread 4% + 2%
    assert choose_kept("best", ranked, records)[0] == "a"


def test_the_remeasure_at_the_end_widens_the_band():
    base = rec("baseline", tok=100.0, again=(101.0,))
    cand = rec("a", tok=106.0)
    assert choose_kept("best", rank([base, cand], 64, "output_tok_s"), [base, cand])[0] == "a"  # spread 1% + 2% < 6%
    # the baseline benched again at the end drifted to 95 tok/s: spread 6%, and +6% no longer clears it
    later = {"candidate": "baseline", "kind": REMEASURE, "verdict": "pass", "bench": {"levels": _levels(95.0)}}
    records = [base, cand, later]
    ranked = rank(records, 64, "output_tok_s")
    assert ranked[0]["candidate"] == "a" and ranked[0]["noise"]["spread"] == pytest.approx(0.06)
    kept, why = choose_kept("best", ranked, records)
    assert kept == "baseline" and "no candidate beat the noise" in why
    # the remeasure is not a candidate: it is neither ranked nor kept
    assert {r["candidate"] for r in ranked} == {"baseline", "a"}


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
    c = campaign(workload={"concurrency": [4, 16], "requests": 16, "warmup": 2}, soak={"seconds": 5})
    assumed = estimate(3, 1, c)
    assert assumed["measured"] == {"roll": False, "bench": False}
    assert assumed["per_candidate"]["roll_s"] == 60.0 and assumed["per_candidate"]["bench_s"] == pytest.approx(0.5 * (2 * 16 + 2))  # 0.5 s a request: 2 levels x 16, 2 warm-up
    measured = estimate(3, 2, c, [{"timings": {"roll_s": 30, "restarts": 1, "bench_s": 12}}, {"timings": {"roll_s": 50, "restarts": 1, "bench_s": 8}}])
    assert measured["measured"] == {"roll": True, "bench": True}
    assert measured["per_candidate"]["roll_s"] == 80.0 and measured["per_candidate"]["bench_s"] == 10.0
    # the baseline still to run: its two extra benches (baseline_repeats 3) are in the total
    assert measured["noise_s"] == 20.0
    assert measured["total_s"] == pytest.approx(3 * sum(measured["per_candidate"].values()) + 20.0, abs=0.5)
    done = [{"kind": "baseline", "timings": {"roll_s": 30, "restarts": 1, "bench_s": 10}}]
    assert estimate(2, 1, c, done)["noise_s"] == 0.0
    again = campaign(workload={"concurrency": [4, 16], "requests": 16, "warmup": 2}, noise={"remeasure_at_end": True})
    assert estimate(2, 1, again, done)["noise_s"] == 30.0 + 10.0  # one more roll of the targets and one bench


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


def test_report_without_matplotlib_writes_the_table_and_says_the_plot_is_missing(tmp_path, monkeypatch, capsys):
    """The GPU tier's control venv has no matplotlib: `pdkit tune` crashed there after its baseline."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    c = campaign(out_dir=str(tmp_path))
    written = write_report(c, [rec("baseline", tok=100), rec("a", tok=150)], 64)
    assert [p.name for p in written] == ["t.md"] and not (tmp_path / "t.png").exists()
    assert "| 1 | a |" in (tmp_path / "t.md").read_text() and "![" not in (tmp_path / "t.md").read_text()
    assert "no matplotlib here" in capsys.readouterr().err


# ---------------------------------------------------------------- gates (pure parts)


@pytest.mark.parametrize("base, got, div", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2, 3], [1, 2], 2), ([1, 2], [1, 2, 3], 2), ([1], [2], 0),
])
def test_first_divergence(base, got, div):
    assert answers.first_divergence(base, got) == div


def test_compare_and_verdicts():
    base = [{"tokens": [1, 2, 3, 4]}, {"tokens": [5, 6, 7, 8]}]
    same = answers.compare(base, [{"tokens": [1, 2, 3, 4]}, {"tokens": [5, 6, 7, 8]}])
    assert same["match_rate"] == 1.0 and answers.correctness_verdict(same, 1.0, True)[0]
    late = answers.compare(base, [{"tokens": [1, 2, 3, 9]}, {"tokens": [5, 6, 7, 8]}])
    assert late["match_rate"] == pytest.approx(7 / 8)
    assert answers.correctness_verdict(late, 0.8, False)[0]
    ok, why = answers.correctness_verdict(late, 0.8, True)
    assert not ok and "exactness required" in why and "#0 at token 3" in why
    ok, why = answers.correctness_verdict(late, 0.9, False)
    assert not ok and "below the threshold 0.9" in why
    broken = answers.compare(base, [{"error": "HTTP 502"}, {"tokens": [5, 6, 7, 8]}])
    ok, why = answers.correctness_verdict(broken, 0.0, False)
    assert not ok and "1 of 2 prompts failed" in why and "HTTP 502" in why


def test_prompts_are_fixed_and_distinct():
    assert answers.prompts(16) == answers.prompts(16) and len(set(answers.prompts(16))) == 16


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
    assert ("correctness, soak and bench: measured on the target's own engines, each request to one PD pair in turn, "
            "not through the router: lab-gpu2/prefill+lab-gpu2/decode") in out
    assert "lab-gpu2/decode: added `--cuda-graph-backend-decode disabled`" in out
    assert "steps-1:" in out and "`--num-continuous-decode-steps 4` -> `--num-continuous-decode-steps 1`" in out
    assert "steps-8:" in out and "estimate:" in out and "assumed, not yet measured" in out
    assert not (tmp_path / "out").exists(), "--dry writes nothing"


def docs_campaigns() -> list[tuple[str, str]]:
    """Every campaign in docs/: (where, its YAML text): the campaign files and the YAML blocks of the pages."""
    import re

    found = [(str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / "docs").rglob("*.yaml")) if "candidates:" in p.read_text()]
    for page in sorted((REPO / "docs").rglob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)):
            if "candidates:" in block:
                found.append((f"{page.relative_to(REPO)}#yaml{i + 1}", block))
    return found


def test_docs_hold_the_lab_the_one_node_and_the_gpu_campaigns():
    where = {w for w, _ in docs_campaigns()}
    assert {"docs/tune/lab.yaml", "docs/tune/lab-one-node.yaml", "docs/tune/h200.yaml", "docs/tune.md#yaml1"} <= where, where


@pytest.mark.parametrize("where,text", docs_campaigns(), ids=[w for w, _ in docs_campaigns()])
def test_every_campaign_in_the_docs_dry_runs_as_written_with_its_own_inventory(tmp_path, where, text):
    import yaml

    raw = yaml.safe_load(text)
    assert raw.get("inventory"), f"{where}: a campaign in the docs names the inventory it is for (campaign.inventory)"
    path = tmp_path / "campaign.yaml"
    # records (docs/tune/h200.jsonl) are read where the campaign keeps them; a page's example writes nowhere
    path.write_text(text if where.endswith(".yaml") else text + f"out_dir: {tmp_path / 'out'}\n")
    done = _tune(raw["inventory"], str(path), "--dry")
    assert done.returncode == 0, f"{where}: pdkit tune {raw['inventory']} --dry failed:\n{done.stderr}"
    assert done.stdout.startswith(f"pdkit tune --dry: campaign {raw['name']!r}"), done.stdout[:300]
    for cand in raw["candidates"]:
        assert f"  {cand['name']}" in done.stdout, (where, cand["name"])
    # a campaign that accepts downtime says what it costs; one that needs none mentions none
    assert ("downtime accepted (campaign.downtime)" in done.stdout) == bool(raw.get("downtime")), done.stdout


def test_the_docs_example_and_the_gpu_campaign_say_what_they_change():
    docs = next(text for where, text in docs_campaigns() if where == "docs/tune.md#yaml1")
    import yaml

    assert yaml.safe_load(docs)["downtime"] is True  # written for the users' one box
    gpu = _tune("inventories/h200-nspawn-pair.py", "docs/tune/h200.yaml", "--dry")
    assert gpu.returncode == 0, gpu.stderr
    assert "pdkit-b/decode: added `--cuda-graph-backend-decode disabled`" in gpu.stdout
    assert "baseline: the inventory as it is (recorded)" in gpu.stdout, gpu.stdout


def test_a_one_node_campaign_is_refused_without_downtime_and_dry_runs_with_it(tmp_path):
    text = (REPO / "docs" / "tune" / "lab-one-node.yaml").read_text()
    refused = tmp_path / "refused.yaml"
    refused.write_text(text.replace("downtime: true\n", ""))
    done = _tune("inventories/lab-one-node.py", str(refused), "--dry")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "campaign.downtime: rolling a candidate onto lab-gpu1, a service outage" in done.stderr, done.stderr
    assert "has no decode or prefill worker" in done.stderr and "set `downtime: true`" in done.stderr
    accepted = _tune("inventories/lab-one-node.py", "docs/tune/lab-one-node.yaml", "--dry")
    assert accepted.returncode == 0, accepted.stderr
    assert "downtime accepted (campaign.downtime): each roll onto lab-gpu1" in accepted.stdout
    # steps-1, steps-8, page-64, ctx-4096, unified, decode-radix: each restarts the box
    assert accepted.stdout.count("downtime: ~60 s with the cluster serving nothing (assumed") == 6, accepted.stdout
    # the layout candidate shows what it retires and adds; the experimental lever says so
    assert "lab-gpu1/unified: engine added" in accepted.stdout
    assert "warning: lab-gpu1: pdkit_node.engines[1].tuning.decode_radix_cache: experimental" in accepted.stdout
    # the three-node lab keeps serving while its canary rolls: no downtime, none to accept
    lab = _tune("inventories/lab.py", "docs/tune/lab.yaml", "--dry")
    assert lab.returncode == 0 and "downtime" not in lab.stdout, lab.stdout + lab.stderr


def test_expected_downtime_comes_from_the_records_once_there_are_some(lab_hosts):
    from types import SimpleNamespace

    from pdkit.tune.runner import expected_downtime

    prep = SimpleNamespace(outages={"lab-gpu1": ["..."]}, targets=["lab-gpu1"])
    assert expected_downtime(prep, [])[0] == 60.0
    records = [{"timings": {"outage_s": 20.0, "restarts": 1}}, {"timings": {"outage_s": 30.0, "restarts": 2}}, {"timings": {}}]
    seconds, source = expected_downtime(prep, records)
    assert seconds == pytest.approx(17.5) and "records (2)" in source
    assert expected_downtime(SimpleNamespace(outages={}, targets=["lab-gpu2"]), records) == (None, "")


# ---------------------------------------------------------------- what the gates and the bench measure


def test_a_canary_or_a_node_list_is_measured_on_its_own_pd_pairs_the_whole_cluster_through_the_router(lab_hosts):
    from pdkit.bench.measure import measured_for

    _, base = lab_hosts
    canary = measured_for(base, ["lab-gpu2"])
    assert canary.via == "engines"
    assert [r.label for r in canary.routes] == ["lab-gpu2/prefill+lab-gpu2/decode"]
    route = canary.routes[0]
    gpu2 = next(h for h in base.hosts if h.name == "lab-gpu2")
    assert route.prefill.bootstrap == (base.engine_address(gpu2), 8998)
    assert route.engine.url.endswith(":30001") and route.prefill.url.endswith(":30000")
    body = route.pd_body({"text": "x"})
    assert body["bootstrap_host"] == base.engine_address(gpu2) and body["bootstrap_port"] == 8998
    assert 0 <= body["bootstrap_room"] < 2**63 and body["bootstrap_room"] != route.pd_body({"text": "x"})["bootstrap_room"]
    assert canary.describe() == {"via": "engines", "hosts": ["lab-gpu2"], "engines": ["lab-gpu2/prefill", "lab-gpu2/decode"],
                                 "routes": ["lab-gpu2/prefill+lab-gpu2/decode"]}
    two = measured_for(base, ["lab-gpu1", "lab-gpu3"])
    assert [r.label for r in two.routes] == ["lab-gpu1/prefill+lab-gpu1/decode", "lab-gpu3/prefill+lab-gpu3/decode"]
    assert [two.route(i).label for i in range(4)] == [two.routes[0].label, two.routes[1].label] * 2  # in turn
    whole = measured_for(base, ["lab-gpu1", "lab-gpu2", "lab-gpu3"])
    assert whole.via == "router" and whole.routes == ()
    assert whole.describe()["engines"] == sorted(f"lab-gpu{i}/{e}" for i in (1, 2, 3) for e in ("prefill", "decode"))


def test_a_target_with_one_side_of_a_pd_group_is_paired_with_the_groups_other_engines(tmp_path):
    from pdkit.bench.measure import measured_for
    from pdkit.inventory.loader import load
    from tests.conftest import write_inventory

    gpus = {"model": "virtual", "count": 4, "memory_gib": 80, "compute_capability": "9.0"}
    def node(addr, engines):
        return {"ssh_hostname": addr, "pdkit_node": {"gpu": "none", "gpus": gpus, "ucx_net_devices": "mlx5_0:1", "engines": engines}}
    hosts = {
        # p1: two prefills; d1: one decode and a unified engine; all one PD group
        "p1": {**node("10.0.0.1", [{"name": "pa", "role": "prefill", "gpus": [0], "port": 30000, "bootstrap_port": 8998},
                                   {"name": "pb", "role": "prefill", "gpus": [1], "port": 30002, "bootstrap_port": 8999}]),
               "pdkit_router": {"port": 8000, "prometheus_port": 29000, "workers": ["p1/pa", "p1/pb", "d1/d"]}},
        "d1": node("10.0.0.2", [{"name": "d", "role": "decode", "gpus": [0], "port": 30001},
                                {"name": "u", "role": "unified", "gpus": [1], "port": 30003}]),
    }
    cluster = {"name": "t", "engine": "sim", "model": {"path": "/models/sim", "served_name": "sim"}}
    spec = load(write_inventory(tmp_path, hosts, cluster))
    decode_only = measured_for(spec, ["d1"])
    assert [r.label for r in decode_only.routes] == ["d1/u", "p1/pa+d1/d"]
    prefill_only = measured_for(spec, ["p1"])
    assert [r.label for r in prefill_only.routes] == ["p1/pa+d1/d", "p1/pb+d1/d"]
    assert prefill_only.routes[1].prefill.bootstrap == ("10.0.0.1", 8999)
    # the whole cluster, but the router does not front the unified engine: the engines are asked directly
    both = measured_for(spec, ["p1", "d1"])
    assert both.via == "engines" and [r.label for r in both.routes] == ["d1/u", "p1/pa+d1/d", "p1/pb+d1/d"]
    hosts["d1"]["pdkit_node"]["engines"].pop()
    assert measured_for(load(write_inventory(tmp_path, hosts, cluster)), ["p1", "d1"]).via == "router"


def _smg(procs, pairs, port, metrics_port):
    """smg in PD mode over several sim PD pairs (prefill port, bootstrap port, decode port)."""
    from pdkit.sim.localstack import smg_binary

    argv = [smg_binary(), "launch", "--pd-disaggregation"]
    for prefill, bootstrap, _ in pairs:
        argv += ["--prefill", f"http://127.0.0.1:{prefill}", str(bootstrap)]
    for _, _, decode in pairs:
        argv += ["--decode", f"http://127.0.0.1:{decode}"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
             "--worker-startup-check-interval", "1", "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
             "--health-success-threshold", "1", "--shutdown-grace-period-secs", "1", "--log-level", "warn"]
    return procs.start("router", argv)


@pytest.fixture(scope="module")
def two_pairs(tmp_path_factory):
    """Two sim PD pairs (a: as the baseline; b: a decode whose lever corrupts every token and wedges
    for 6 s once it holds 6 requests) and a unified sim, behind the real smg router (a and b).
    The hold is well above the soak's wedge window plus its sampling (a shared, loaded machine
    samples slowly): a wedge that lets go before the watch's window passes is not seen."""
    import requests

    from tests.sim.support import Processes, free_ports, launch_sim, wait_ready, wait_until

    procs = Processes(tmp_path_factory.mktemp("two_pairs"))
    lever = "--enable-torch-compile"
    b_env = {"PDKIT_SIM_CORRUPT_WHEN": lever, "PDKIT_SIM_WEDGE_WHEN": lever, "PDKIT_SIM_WEDGE_MIN_HELD": "6", "PDKIT_SIM_WEDGE_HOLD_S": "6"}
    ports = dict(zip(("ap", "ab", "ad", "bp", "bb", "bd", "u", "router", "metrics"), free_ports(9)))
    try:
        started = [
            (launch_sim(procs, "a-prefill", "prefill", ports["ap"], ports["ab"]), ports["ap"]),
            (launch_sim(procs, "a-decode", "decode", ports["ad"]), ports["ad"]),
            (launch_sim(procs, "b-prefill", "prefill", ports["bp"], ports["bb"]), ports["bp"]),
            (launch_sim(procs, "b-decode", "decode", ports["bd"], extra=[lever], env=b_env), ports["bd"]),
            (launch_sim(procs, "unified", "null", ports["u"]), ports["u"]),
        ]
        for proc, port in started:
            wait_ready(procs, proc, port, timeout=60)
        router = _smg(procs, [(ports["ap"], ports["ab"], ports["ad"]), (ports["bp"], ports["bb"], ports["bd"])],
                      ports["router"], ports["metrics"])
        url = f"http://127.0.0.1:{ports['router']}"

        def ready():
            assert router.alive(), router.log_tail()
            workers = requests.get(f"{url}/workers", timeout=2).json().get("workers", [])
            return sum(bool(w.get("is_healthy")) and w.get("status") == "ready" for w in workers) == 4
        wait_until(ready, 60, "smg to list four healthy workers", interval=0.2, context=procs.logs)
        yield ports, url
    finally:
        procs.stop_all()


def _pair(ports, side):
    from pdkit.bench.routes import EngineRef, Route

    return Route(EngineRef(f"{side}/decode", f"http://127.0.0.1:{ports[side + 'd']}"),
                 EngineRef(f"{side}/prefill", f"http://127.0.0.1:{ports[side + 'p']}", ("127.0.0.1", ports[side + "b"])))


def _requests_seen(ports):
    """Finished requests per engine (a prefill counts its half of a PD request too)."""
    import requests

    from pdkit.roll.planning import metric_sums
    from pdkit.upstream.metricnames import SGLANG

    out = {}
    for k in ("ap", "ad", "bp", "bd", "u"):
        page = requests.get(f"http://127.0.0.1:{ports[k]}/metrics", timeout=5).text
        out[k] = metric_sums(page, [SGLANG["requests"]])[SGLANG["requests"]]
    return out


def test_the_target_pair_alone_gets_the_gate_so_a_corrupting_lever_always_fails_it(two_pairs):
    from pdkit.bench.measure import Measured
    from pdkit.bench.routes import EngineRef, Route

    ports, router_url = two_pairs
    a = Measured(("a",), router_url, {}, (_pair(ports, "a"),))
    b = Measured(("b",), router_url, {}, (_pair(ports, "b"),))
    prompt_set = answers.prompts(8)
    baseline = answers.ask(a, {}, prompt_set, 16, 4)
    assert all(len(x.get("tokens", [])) == 16 for x in baseline), baseline
    before = _requests_seen(ports)
    candidate = answers.ask(b, {}, prompt_set, 16, 4)
    after = _requests_seen(ports)
    # every prompt went to b's pair and to nothing else
    assert {k: after[k] - before[k] for k in after} == {"ap": 0, "ad": 0, "bp": 8, "bd": 8, "u": 0}
    comparison = answers.compare(baseline, candidate)
    # every answer diverges right after the prefill's (right) first token: the same verdict every run
    assert {p["first_divergence"] for p in comparison["prompts"]} == {1}
    assert comparison["match_rate"] == pytest.approx(1 / 16)
    ok, why = answers.correctness_verdict(comparison, 0.9, exact=False)
    assert not ok and "below the threshold 0.9" in why, why
    # the same engines through the router: also served (the router path still works for everyone)
    assert all("tokens" in x for x in answers.ask(router_url, {}, prompt_set[:2], 4, 2))
    # a unified engine is asked as it is
    unified = Measured(("u",), router_url, {}, (Route(EngineRef("u/unified", f"http://127.0.0.1:{ports['u']}")),))
    assert answers.compare(baseline, answers.ask(unified, {}, prompt_set, 16, 4))["match_rate"] == 1.0


def test_a_dead_prefill_fails_the_request_at_once_and_hangs_up_on_the_decode(two_pairs):
    import time

    from pdkit.bench.measure import Measured
    from pdkit.bench.routes import EngineRef, Route
    from pdkit.sim.localstack import free_ports

    ports, router_url = two_pairs
    dead = free_ports(1)[0]
    route = Route(EngineRef("a/decode", f"http://127.0.0.1:{ports['ad']}"),
                  EngineRef("dead/prefill", f"http://127.0.0.1:{dead}", ("127.0.0.1", ports["ab"])))
    started = time.monotonic()
    out = answers.ask(Measured(("dead",), router_url, {}, (route,)), {}, answers.prompts(2), 8, 2)
    assert time.monotonic() - started < 5
    assert all(x.get("error", "").startswith("HTTP no answer: prefill dead/prefill") for x in out), out


def test_soak_and_bench_on_the_target_pair_wedge_deterministically_and_record_the_engines_measured(two_pairs, lab_hosts):
    import time

    from pdkit.bench.measure import Measured
    from pdkit.bench.record import run_bench

    ports, router_url = two_pairs
    a = Measured(("a",), router_url, {}, (_pair(ports, "a"),))
    b = Measured(("b",), router_url, {}, (_pair(ports, "b"),))
    watched = {"a/prefill": f"http://127.0.0.1:{ports['ap']}", "a/decode": f"http://127.0.0.1:{ports['ad']}",
               "b/prefill": f"http://127.0.0.1:{ports['bp']}", "b/decode": f"http://127.0.0.1:{ports['bd']}"}
    ok, why, figures = gates.soak(a, {}, watched, 2, 8, 16, 16, wedge_window_s=1.5)
    assert ok, (why, figures)
    assert figures["via"] == "engines" and "to a/prefill+a/decode" in why and figures["failed"] == 0
    # all of the soak's C=8 on b's pair: its decode holds 8 requests >= the lever's 6 (the correctness
    # gate's 4 never reach it), so it wedges every time, however the steps batch them
    started = time.monotonic()
    ok, why, figures = gates.soak(b, {}, watched, 20, 8, 16, 16, wedge_window_s=1.0)
    assert not ok and why.startswith("wedged: b/decode held running requests"), (why, figures)
    assert time.monotonic() - started < 12
    # the soak hung up on what the wedge held (a client of the engines, unlike smg, cancels): b empties
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and gates.engine_sample({"d": watched["b/decode"]})["d"]["sglang:num_running_reqs"]:
        time.sleep(0.2)
    assert gates.engine_sample({"d": watched["b/decode"]})["d"]["sglang:num_running_reqs"] == 0

    # the bench on a's pair only, saying so in its fingerprint (the spec only names the cluster here)
    _, spec = lab_hosts
    before = _requests_seen(ports)
    record = run_bench(spec, concurrency=[2, 4], input_len=8, output_len=4, requests=6, warmup=2, progress=False,
                       probe_drivers=False, send=a.stream, measured=a.describe(),
                       prefills={"a/prefill": f"http://127.0.0.1:{ports['ap']}"})
    after = _requests_seen(ports)
    assert [lv["errors"] for lv in record["levels"]] == [0, 0], record["levels"]
    # each level's KV hand-offs, read from a's prefill: one per request of the level
    assert [(lv["kv"]["prefills"], lv["kv"]["transfers"]) for lv in record["levels"]] == [(["a/prefill"], 6)] * 2
    assert record["levels"][0]["kv"]["mb_per_request"] == pytest.approx(8 * 65536 / 2**20)
    assert {k: after[k] - before[k] for k in after} == {"ap": 14, "ad": 14, "bp": 0, "bd": 0, "u": 0}
    assert record["env"]["measured"] == {"via": "engines", "hosts": ["a"], "engines": ["a/prefill", "a/decode"],
                                         "routes": ["a/prefill+a/decode"]}
    assert record["env"]["spec_hash"] and record["env"]["engine_flags"]
    with pytest.raises(ValueError, match="together"):
        run_bench(spec, send=a.stream, probe_drivers=False)


def test_the_runner_sends_gates_and_bench_to_what_prepare_chose_and_records_it(tmp_path, monkeypatch):
    """The wiring (no cluster): correctness, soak and bench all go to prep.measured (the canary's own
    pair on the lab inventory); resume refuses records measured on something else."""
    import pdkit.bench
    import pdkit.doctor
    from pdkit.tune import runner

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "t", "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"),
                                "workload": {"concurrency": [4, 64]}, "correctness": {"prompts": 2},
                                "candidates": [{"name": "off", "set": {"decode.cuda_graph": False}}]}))
    prep = runner.prepare(LAB, str(path))
    assert prep.measured.via == "engines" and [r.label for r in prep.measured.routes] == ["lab-gpu2/prefill+lab-gpu2/decode"]
    seen = {}

    def ask(target, headers, prompt_set, max_new_tokens, concurrency, timeout_s=120.0):
        seen.setdefault("ask", []).append(target)
        return [{"tokens": [1, 2, 3]} for _ in prompt_set]

    def soak(target, headers, engine_urls, *args, **kwargs):
        seen["soak"], seen["watched"] = target, sorted(engine_urls)
        return True, "fine", {"via": target.via}

    def bench(spec, **kwargs):
        seen["bench"] = kwargs
        seen["benches"] = seen.get("benches", 0) + 1
        tok = [100.0, 103.0, 98.0][seen["benches"] - 1]
        return {"levels": [{"concurrency": 64, "errors": 0, "output_tok_s": tok}], "env": {"measured": kwargs["measured"]}}

    def record_forced(measured, cfg, context_length, say):
        seen.setdefault("forced", []).append(measured)
        return {"items": [], "notes": [], "key": cfg.key()}

    def run_parts(measured, cfg, recorded, exact, say, load_factory):
        seen.setdefault("parts", []).append((measured, exact))
        return answers.Outcome(True, None, "forced: within tolerance", {"notes": [], "parts": {}})

    monkeypatch.setattr(answers, "ask", ask)
    monkeypatch.setattr(answers, "record_forced", record_forced)
    monkeypatch.setattr(answers, "run_parts", run_parts)
    monkeypatch.setattr(gates, "soak", soak)
    monkeypatch.setattr(pdkit.bench, "run_bench", bench)
    monkeypatch.setattr(pdkit.doctor, "run_doctor", lambda spec, **kw: [])
    record = {"gates": {}, "timings": {}}
    runner.Session(prep, []).run_gates("baseline", prep.base_spec, record, None, None)
    assert seen["ask"] == [prep.measured, prep.measured] and seen["soak"] is prep.measured
    # the graded gate's forced parts: recorded once by the baseline, then checked, on the same target
    # (on the target's own engines: smg drops a PD answer's input_top_logprobs)
    assert [m.describe() for m in seen["forced"]] == [prep.measured.describe()]
    assert [(m.via, e) for m, e in seen["parts"]] == [("engines", False)]
    # every engine is watched during the soak, not only the target's
    assert seen["watched"] == sorted(f"lab-gpu{i}/{e}" for i in (1, 2, 3) for e in ("prefill", "decode"))
    assert seen["bench"]["send"] == prep.measured.stream and seen["bench"]["measured"] == prep.measured.describe()
    assert seen["bench"]["goodput_slo"] is None  # judged only for a goodput objective
    assert all(g["ok"] for g in record["gates"].values()), record["gates"]
    # the baseline is benched baseline_repeats (3) times: the first is its bench, the others its repeats
    assert seen["benches"] == prep.campaign.noise.baseline_repeats == 3
    assert [lv[0]["output_tok_s"] for lv in record["bench_repeats"]] == [103.0, 98.0]
    assert "3 runs; output_tok_s at C=64: 100.0 (spread 5.0% of 3 runs)" in record["gates"]["bench"]["detail"]
    # a candidate is benched once
    seen["benches"] = 0
    cand_record = {"gates": {}, "timings": {}}
    runner.Session(prep, []).run_gates("off", prep.specs["off"], cand_record, [{"tokens": [1, 2, 3]}] * 2,
                                       prep.candidates[0])
    assert seen["benches"] == 1 and "bench_repeats" not in cand_record
    assert len(seen["forced"]) == 1 and seen["parts"][-1][1] == prep.candidates[0].exact

    # resume: a baseline measured on the same engines continues; one measured otherwise (or unrecorded) does not
    base = {"campaign": "t", "kind": "baseline", "candidate": "baseline", "measured": prep.measured.describe()}
    assert runner.measured_problem(prep.measured, [base]) is None
    assert runner.measured_problem(prep.measured, []) is None
    assert "start a new campaign" in runner.measured_problem(prep.measured, [{**base, "measured": {"via": "router"}}])
    assert "not recorded" in runner.measured_problem(prep.measured, [{k: v for k, v in base.items() if k != "measured"}])
    # the report says what was measured
    text = render_markdown(prep.campaign, [{**rec("baseline", tok=1), "measured": prep.measured.describe()}], 64, None)
    assert "Correctness, soak and bench measured the engines directly, PD pairs lab-gpu2/prefill+lab-gpu2/decode." in text


def test_the_sims_held_requests_wedge_knob_is_checked():
    from pdkit.sim.knobs import KnobError, load_knobs

    assert load_knobs({"PDKIT_SIM_WEDGE_MIN_HELD": "10"}).wedge_min_held == 10
    assert load_knobs({}).wedge_min_held == 0  # off: the decode batch decides (PDKIT_SIM_WEDGE_MIN_BATCH)
    with pytest.raises(KnobError, match="PDKIT_SIM_WEDGE_MIN_HELD must be >= 0"):
        load_knobs({"PDKIT_SIM_WEDGE_MIN_HELD": "-1"})


def test_bench_records_say_what_they_measured_and_compare_names_a_difference(lab_hosts):
    from pdkit.bench.measure import measured_for
    from pdkit.bench.report import describe_measured, render_compare
    from pdkit.bench.routes import router_measured

    _, spec = lab_hosts
    router = router_measured(spec, "http://r:8000")  # what a plain `pdkit bench` records
    assert router == {"via": "router", "router_url": "http://r:8000",
                      "engines": sorted(f"lab-gpu{i}/{e}" for i in (1, 2, 3) for e in ("prefill", "decode"))}
    assert describe_measured(router).startswith("through the router http://r:8000 over lab-gpu1/decode, ")
    canary = measured_for(spec, ["lab-gpu2"]).describe()
    assert describe_measured(canary) == "the engines directly, PD pairs lab-gpu2/prefill+lab-gpu2/decode"
    level = {"concurrency": 4, "output_tok_s": 1.0, "requests_s": 1.0, "errors": 0,
             **{k: {"p50": 1.0, "p99": 1.0} for k in ("ttft_ms", "tpot_ms", "itl_ms")}}
    env = {"spec_hash": "x" * 64, "engine": "sim", "sglang_versions": [], "router": "smg", "gpus": [], "engine_flags": {}}
    a = {"id": "a", "levels": [level], "env": {**env, "measured": router}}
    b = {"id": "b", "levels": [level], "env": {**env, "measured": canary}}
    assert "- measured engines differs" in render_compare(a, b)
    old = {"id": "old", "levels": [level], "env": env}  # a record from before env.measured: not a difference
    assert "measured engines" not in render_compare(old, b)


def test_a_router_fronting_only_its_own_node_makes_the_baseline_an_outage_even_for_another_target(tmp_path):
    """gpu01's router fronts gpu01's engines only: a campaign on gpu02 still rolls gpu01 at its
    baseline (every host goes onto the inventory), and says that is what needs `downtime: true`."""
    from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory

    hosts = copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_router"] = {"workers": ["gpu01/prefill", "gpu01/decode"]}
    inventory = write_inventory(tmp_path, hosts, copy.deepcopy(BASE_CLUSTER))
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "t", "target": ["gpu02"], "out_dir": str(tmp_path / "out"),
                                "candidates": [{"name": "a", "set": {"decode.cuda_graph": False}}]}))
    done = _tune(str(inventory), str(path), "--dry")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "campaign.downtime: the baseline's roll of every host reaches gpu01, a service outage" in done.stderr, done.stderr
    assert "onto gpu02" not in done.stderr


def test_the_report_shows_the_baselines_spread_and_judges_each_candidate_against_it(tmp_path):
    c = campaign(out_dir=str(tmp_path))
    records = [rec("baseline", tok=100.0, again=(104.0, 98.0)), rec("a", tok=105.0), rec("b", tok=120.0)]
    text = render_markdown(c, records, 64, None)
    assert "## The baseline's spread (3 runs)" in text
    assert "| 64 | output_tok_s | 100.0, 104.0, 98.0 | 100.0 | 6.0% |" in text
    assert "| b | `decode.cuda_graph: \"b\"` | 120.0 | 1.200 | +20.0% vs 6.0% + 2.0%: yes |" in text
    assert "+5.0% vs 6.0% + 2.0%: no" in text


def test_a_lever_that_changes_the_answers_by_design_needs_the_campaigns_acknowledgement(tmp_path):
    """Issue 44 item 3: an FP8 KV cache candidate is refused before any host is touched unless the
    campaign acknowledges it; acknowledged, --dry and the candidate's warnings name it."""
    from pdkit.tune import runner

    body = {"name": "t", "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"),
            "workload": {"concurrency": [4]}, "target": "all",
            "candidates": [{"name": "kv-fp8", "set": {"all.kv_cache_dtype": "fp8_e4m3"}}]}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(body))
    with pytest.raises(CampaignError) as refused:
        runner.prepare(LAB, str(path))
    text = "\n".join(refused.value.problems)
    assert "candidate kv-fp8" in text and "changes the answers by design" in text
    assert "acknowledge: [kv_cache_quantized]" in text, text
    path.write_text(json.dumps({**body, "acknowledge": ["kv_cache_quantized"]}))
    prep = runner.prepare(LAB, str(path))
    assert any("changes the answers by design" in w and "acknowledged" in w for w in prep.warnings["kv-fp8"]), prep.warnings
    dry = runner.dry_text(prep, [], prep.candidates)
    assert "--kv-cache-dtype fp8_e4m3 changes the answers by design" in dry, dry



def test_an_empty_sweep_is_refused_not_dropped():
    """Issue 46: `set: {all.page_size: []}` expanded to nothing and the candidate vanished silently."""
    c = parse_campaign({"name": "t", "candidates": [{"name": "pages", "set": {"all.page_size": []}},
                                                   {"name": "a", "set": {"decode.cuda_graph": False}}]})
    problems = campaign_problems(c, expand(c))
    assert any("campaign.candidates[pages].set.all.page_size: an empty sweep ([]) expands 'pages' to no candidate"
               in p for p in problems), problems
