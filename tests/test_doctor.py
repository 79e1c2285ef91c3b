"""`pdkit doctor`'s checks on pages captured from the lab (tests/doctor_data/, written by
tests/doctor_data/capture.py): every check's PASS, WARN and FAIL, each non-PASS with a fix hint.

Captures: lab_base (inventories/lab.py deployed), lab_graphs_off (the same with decode CUDA graphs
off on lab-gpu1/decode; lab_graphs_off_busy.exporter.txt after 64 more requests, once the
decode engine had written a `Decode batch` log line), lab_env_missing.exporter.txt (NCCL_PROTO removed by hand from the node's
nccl.env, decode restarted), lab_hand_edit.* (--context-length changed by hand in the decode unit).
Where a case has no capture (a version mix, a failed transfer, a growing queue) the captured
figures are changed in the one place the case needs, and the test says so.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pdkit.agent.exporter.metrics import parse_metrics
from pdkit.agent.health import router_worker_health
from pdkit.doctor.baseline import c16_throughput, last_recorded
from pdkit.doctor.checks import evaluate
from pdkit.doctor.checks_cache import check_prefix_cache
from pdkit.doctor.checks_cluster import check_router_workers, check_throughput
from pdkit.doctor.checks_engine import (
    check_context_length,
    check_env,
    check_flags,
    check_queues,
    check_reachable,
    check_versions,
)
from pdkit.doctor.checks_graphs import check_decode_cuda_graphs, check_graph_buckets
from pdkit.doctor.checks_kv import check_kv_path, check_kv_transfers
from pdkit.doctor.model import (
    FAIL,
    INFO,
    PASS,
    WARN,
    BenchPoint,
    EngineObservation,
    EnginePlan,
    KvBench,
    RouterObservation,
    Sample,
)
from pdkit.doctor.observe import exporter_views, page_sample
from pdkit.doctor.report import exit_code, render_table
from pdkit.spec.kvcost import KV_PATHS, KV_RATE_MIN_MB, kv_histograms
from pdkit.upstream.metricnames import SGLANG
from tests.test_kvcost import page

DATA = Path(__file__).resolve().parent / "doctor_data"
WINDOW_S = 3.0


def plans(scenario: str) -> dict[str, EnginePlan]:
    out = {}
    for p in json.loads((DATA / scenario / "plan.json").read_text()):
        p["argv"], p["env_names"] = tuple(p["argv"]), tuple(p["env_names"])
        out[p["engine"]] = EnginePlan(**p)
    return out


def figures(scenario: str, engine: str, n: int) -> dict:
    return parse_metrics((DATA / scenario / f"{engine}.metrics{n}.txt").read_text())


def sample(at: float, text: str) -> Sample:
    """A /metrics sample as `collect` takes it (observe.sample) from a page's text."""
    return page_sample(at, text)


def observe(scenario: str, engine: str, plan_scenario: str | None = None) -> EngineObservation:
    """An observation as `collect` builds it, from one capture (the plan may come from another)."""
    plan = plans(plan_scenario or scenario)[engine]
    views = exporter_views((DATA / scenario / "exporter.txt").read_text())
    return EngineObservation(
        plan=plan,
        server_info=json.loads((DATA / scenario / f"{engine}.server_info.json").read_text()),
        first=sample(0.0, (DATA / scenario / f"{engine}.metrics1.txt").read_text()),
        second=sample(WINDOW_S, (DATA / scenario / f"{engine}.metrics2.txt").read_text()),
        exporter=views[engine],
    )


def workers_seen(scenario: str = "lab_base") -> dict[str, bool]:
    return router_worker_health((DATA / scenario / "workers.json").read_text())


def assert_verdict(result, status: str, *words: str) -> None:
    assert result.status == status, result
    text = result.reason + " " + result.hint
    for word in words:
        assert word in text, f"{word!r} not in {result}"
    if status == PASS:
        assert result.hint == ""
    else:
        assert result.hint, f"a {status} without a fix hint: {result}"


# ---- reachable


def test_reachable_pass_fail_warn():
    assert_verdict(check_reachable(observe("lab_base", "decode")), PASS, "answered")
    down = EngineObservation(plan=plans("lab_base")["decode"], server_info_error="URLError: Connection refused",
                             first=Sample(0, None, "Connection refused"), second=Sample(3, None, "Connection refused"))
    assert_verdict(check_reachable(down), FAIL, "Connection refused", "systemctl status pdkit-engine-decode")
    partial = observe("lab_base", "decode")
    partial.second = Sample(3, None, "HTTP 404: Not Found")
    assert_verdict(check_reachable(partial), WARN, "HTTP 404", "enable_metrics")


# ---- flags


def test_flags_pass_on_the_deployed_plan():
    assert_verdict(check_flags(observe("lab_base", "decode")), PASS, "planned flags match")
    assert_verdict(check_flags(observe("lab_graphs_off", "decode")), PASS)


def test_flags_fail_when_the_engine_runs_another_plan():
    # the base plan (graphs on, max bs 64) against the engine deployed with graphs off
    result = check_flags(observe("lab_graphs_off", "decode", plan_scenario="lab_base"))
    assert_verdict(result, FAIL, "--cuda-graph-max-bs-decode", "re-apply the plan to lab-gpu1")


def test_flags_fail_on_a_hand_edit_seen_by_server_info_and_the_exporter():
    obs = observe("lab_graphs_off", "decode")
    obs.server_info = json.loads((DATA / "lab_hand_edit.decode.server_info.json").read_text())
    obs.exporter = exporter_views((DATA / "lab_hand_edit.exporter.txt").read_text())["decode"]
    assert obs.exporter.drift_flags == ("--context-length",)
    assert_verdict(check_flags(obs), FAIL, "1 planned flag(s)", "--context-length: planned '8192', running 4096")
    # the exporter's argv check alone is enough when /server_info is unreadable
    obs.server_info, obs.server_info_error = None, "timed out"
    assert_verdict(check_flags(obs), FAIL, "--context-length", "pdkit-exporter")


def test_flags_warn_when_nothing_can_be_read():
    obs = observe("lab_base", "decode")
    obs.server_info, obs.server_info_error, obs.exporter = None, "Connection refused", None
    assert_verdict(check_flags(obs), WARN, "not measured", "Connection refused")


# ---- decode CUDA graphs


def test_decode_graphs_pass_when_every_pass_in_the_window_ran_as_a_graph():
    result = check_decode_cuda_graphs(observe("lab_base", "decode"))
    assert_verdict(result, PASS, "16 of 16 decode passes ran as a CUDA graph in the last 3 s")


def test_decode_graphs_fail_with_the_spec_hint_when_the_spec_turns_them_off():
    result = check_decode_cuda_graphs(observe("lab_graphs_off", "decode"))
    assert_verdict(result, FAIL, "cuda_graph_backend_decode=disabled", "as the spec plans", "0 of 16",
                   "tuning.cuda_graph: true", "lab-gpu1/decode")


def test_decode_graphs_fail_with_the_redeploy_hint_when_the_plan_has_them_on():
    result = check_decode_cuda_graphs(observe("lab_graphs_off", "decode", plan_scenario="lab_base"))
    assert_verdict(result, FAIL, "although the plan has them on", "re-apply it to lab-gpu1")


def test_decode_graphs_fail_when_enabled_but_never_used():
    # graphs on in /server_info, but every decode pass ran without one (a failed capture)
    obs = observe("lab_graphs_off", "decode", plan_scenario="lab_base")
    obs.server_info = json.loads((DATA / "lab_base" / "decode.server_info.json").read_text())
    assert_verdict(check_decode_cuda_graphs(obs), FAIL, "enabled but unused", "0 of 16", "raise tuning.cuda_graph_max_bs")


def test_decode_graphs_warn_when_some_batches_ran_without_a_graph():
    obs = observe("lab_base", "decode")
    obs.second.figures["cuda_graph_passes"]["decode_none"] = 8.0  # 8 passes above the captured size
    assert_verdict(check_decode_cuda_graphs(obs), WARN, "only 16 of 24", "raise tuning.cuda_graph_max_bs")


def test_decode_graphs_warn_without_any_decode_pass():
    obs = observe("lab_base", "decode")
    for sample in (obs.first, obs.second):
        sample.figures["cuda_graph_passes"] = {k: 0.0 for k in sample.figures["cuda_graph_passes"]}
    assert_verdict(check_decode_cuda_graphs(obs), WARN, "no decode pass", "pdkit chat")


def test_decode_graphs_fall_back_to_the_exporter_on_versions_without_pass_counters():
    for scenario, status in (("lab_base", PASS), ("lab_graphs_off", FAIL)):
        obs = observe(scenario, "decode", plan_scenario="lab_base")
        obs.server_info.pop("cuda_graph_backend_decode")
        obs.server_info.pop("disable_cuda_graph")
        for sample in (obs.first, obs.second):
            sample.figures["cuda_graph_passes"] = {}
        result = check_decode_cuda_graphs(obs)
        assert_verdict(result, status, "pdkit-exporter's decode CUDA-graph ratio")
    # no ratio either: the last `Decode batch` log line (captured after enough load for one to be written)
    obs.exporter = exporter_views((DATA / "lab_graphs_off_busy.exporter.txt").read_text())["decode"]
    assert obs.exporter.decode_batch_cuda_graph == 0.0
    obs.exporter.decode_graph_ratio = None
    assert_verdict(check_decode_cuda_graphs(obs), FAIL, "Decode batch")
    obs.exporter = None
    assert_verdict(check_decode_cuda_graphs(obs), WARN, "not measurable", "systemd-journal")


# ---- capture buckets vs target concurrency


def test_graph_buckets_pass_fail_warn():
    obs = observe("lab_base", "decode")
    assert_verdict(check_graph_buckets(obs), PASS, "up to batch 64 >= 64")
    obs.plan = replace(obs.plan, required_bs=128)
    assert_verdict(check_graph_buckets(obs), FAIL, "up to batch 64, below the 128", "cuda_graph_max_bs >= 128")
    # planned high enough, running lower: the engine does not run the plan
    obs.plan = replace(obs.plan, required_bs=128, graph_max_bs=128)
    assert_verdict(check_graph_buckets(obs), FAIL, "up to batch 64", "the plan captures up to 128", "re-apply")
    obs.plan = replace(obs.plan, required_bs=None)
    assert_verdict(check_graph_buckets(obs), WARN, "target_concurrency")
    assert_verdict(check_graph_buckets(observe("lab_graphs_off", "decode")), WARN, "graphs are off")


def test_graph_buckets_read_an_explicit_bucket_list():
    obs = observe("lab_base", "decode")
    obs.server_info["cuda_graph_bs_decode"] = [1, 2, 4, 8, 16, 32]
    assert_verdict(check_graph_buckets(obs), FAIL, "up to batch 32")


# ---- context length


def test_context_length_pass_fail_warn():
    assert_verdict(check_context_length(observe("lab_base", "decode")), PASS, "capped at 8192")
    edited = observe("lab_graphs_off", "decode")
    edited.server_info = json.loads((DATA / "lab_hand_edit.decode.server_info.json").read_text())
    assert_verdict(check_context_length(edited), FAIL, "context length 4096, planned 8192", "re-apply", "allow_longer_context")
    uncapped = observe("lab_base", "decode")
    uncapped.plan = replace(uncapped.plan, context_length=None)
    assert_verdict(check_context_length(uncapped), PASS, "not capped by the spec")
    uncapped.server_info["context_length"] = 1048576  # what the seeds' DeepSeek ran with
    assert_verdict(check_context_length(uncapped), WARN, "1048576", "tuning.context_length")


# ---- process environment (the exporter's /proc/PID/environ check)


def test_env_pass_fail_warn():
    assert_verdict(check_env(observe("lab_base", "decode")), PASS, "NCCL_IB_DISABLE")
    missing = observe("lab_base", "decode")
    missing.exporter = exporter_views((DATA / "lab_env_missing.exporter.txt").read_text())["decode"]
    assert_verdict(check_env(missing), FAIL, "NCCL_PROTO missing", "restart the engine")
    unread = observe("lab_base", "decode")
    unread.exporter, unread.exporter_error = None, "http://10.223.0.11:9400/metrics: Connection refused"
    assert_verdict(check_env(unread), WARN, "not measurable", "systemctl status pdkit-exporter")


# ---- versions within a PD group


def test_versions_pass_fail_warn():
    group = [observe("lab_base", "prefill"), observe("lab_base", "decode")]
    for result in check_versions(group):
        assert_verdict(result, PASS, "runs sim like the rest of PD group 'lab-gpu1'")
    group[1].server_info["version"] = "0.5.17"  # a half-rolled upgrade
    for result in check_versions(group):
        assert_verdict(result, FAIL, "lab-gpu1/prefill sim", "lab-gpu1/decode 0.5.17", "NIXL handshake")
    real = [observe("lab_base", "prefill")]
    real[0].plan = replace(real[0].plan, engine_kind="sglang")
    assert_verdict(check_versions(real)[0], WARN, "runs SGLang sim, the spec plans 0.5.23")


# ---- KV transfers


def _without_failure_counters(text: str) -> str:
    # what SGLang 0.5.17 exports (docs/gpu.md): the same page without the two failure counters
    return "\n".join(line for line in text.splitlines()
                     if "num_bootstrap_failed_reqs" not in line and "num_transfer_failed_reqs" not in line) + "\n"


def test_kv_transfers_pass_on_the_lab():
    assert_verdict(check_kv_transfers(observe("lab_base", "decode")), PASS, "no failures", "129 generation tokens")


def test_kv_transfers_fail_on_failures_in_the_window_and_warn_on_old_ones():
    obs = observe("lab_base", "decode")
    obs.second.figures["kv_transfer_failures"]["transfer"] = 2.0
    assert_verdict(check_kv_transfers(obs), FAIL, "2 transfer", "ucx_net_devices")
    obs.first.figures["kv_transfer_failures"]["transfer"] = 2.0  # failed before the window, none since
    assert_verdict(check_kv_transfers(obs), WARN, "2 KV hand-off failure(s) since the engine started")


REAL = Path(__file__).parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"


def observe_real(before: str, after: str, engine: str = "decode") -> EngineObservation:
    """An observation from two pages of a real SGLang 0.5.17 engine (recorded on an H200)."""
    obs = observe("lab_base", engine)
    obs.server_info["version"] = "0.5.17"
    obs.first = Sample(0.0, parse_metrics(before))
    obs.second = Sample(WINDOW_S, parse_metrics(after))
    return obs


def test_kv_transfers_pass_on_a_healthy_real_engine_without_failure_counters():
    """Real 0.5.17 pages: the failure counters do not exist until the first failure; that is zero failures."""
    before = (REAL / "metrics-base-before-decode.txt").read_text()
    after = (REAL / "metrics-base-after-decode.txt").read_text()
    assert "num_transfer_failed_reqs_total" not in after
    assert_verdict(check_kv_transfers(observe_real(before, after)), PASS, "no failures")


def test_kv_transfers_fail_on_the_first_failure_of_a_real_engine():
    before = (REAL / "metrics-base-before-decode.txt").read_text()
    after = (REAL / "metrics-base-after-decode.txt").read_text() + (
        'sglang:num_transfer_failed_reqs_total{engine_type="decode",model_name="pdkit-llama-0.9b",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="0"} 1.0\n')
    assert_verdict(check_kv_transfers(observe_real(before, after)), FAIL, "1 transfer")


def _wedged(text: str) -> str:
    """A real page with requests held (the scheduler stopped stepping with 3 running, 2 queued)."""
    return re.sub(r"^(sglang:num_running_reqs\{[^}]*\}) .*$", r"\1 3.0",
                  re.sub(r"^(sglang:num_queue_reqs\{[^}]*\}) .*$", r"\1 2.0", text, flags=re.M), flags=re.M)


def test_queues_fail_a_wedged_real_engine():
    """The same real page twice (nothing moved) with requests held: wedged. Before/after load: PASS."""
    page = _wedged((REAL / "metrics-base-after-decode.txt").read_text())
    obs = observe_real(page, page)
    assert_verdict(check_queues(obs), FAIL, "wedged", "systemctl restart pdkit-engine-decode", "PdkitEngineWedged")
    healthy = observe_real((REAL / "metrics-base-before-decode.txt").read_text(),
                           (REAL / "metrics-base-after-decode.txt").read_text())
    assert check_queues(healthy).status == PASS
    moving = observe_real(page, _wedged((REAL / "metrics-base-after-decode.txt").read_text().replace(
        'mode="decode_cuda_graph",model_name="pdkit-llama-0.9b",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 7765.0',
        'mode="decode_cuda_graph",model_name="pdkit-llama-0.9b",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 7800.0')))
    assert check_queues(moving).status == PASS


def test_kv_transfers_warn_without_any_hand_off():
    # lab-gpu1's prefill got no request: the router sent every probe to lab-gpu2's prefill
    assert_verdict(check_kv_transfers(observe("lab_base", "prefill")), WARN, "no KV hand-off", "pdkit chat")


# ---- queues


def test_queues_pass_warn_fail():
    obs = observe("lab_base", "decode")
    assert_verdict(check_queues(obs), PASS, "0 -> 0 over 3 s")
    obs.second.figures["queued_requests"] = 12.0
    assert_verdict(check_queues(obs), WARN, "grew 0 -> 12", "add engines")
    obs.second.figures["pd_queues"]["transfer"] = 3.0
    stuck = copy.deepcopy(obs.second.figures)
    stuck["queued_requests"] = 0.0
    stuck["pd_queues"]["transfer"] = 0.0
    # nothing moved between the samples (same counters) while the queues grew: stuck
    obs.first = Sample(0.0, stuck)
    obs.first.figures.update({k: obs.second.figures[k] for k in ("prompt_tokens", "generation_tokens", "cuda_graph_passes")})
    assert_verdict(check_queues(obs), FAIL, "0 -> 15", "stuck", "restart the stuck engine")


# ---- router


def test_router_workers_pass_fail_warn():
    seen = workers_seen()
    planned = tuple(sorted(seen))
    assert len(planned) == 4 and all(seen.values())
    assert_verdict(check_router_workers(RouterObservation("lab-gpu1", "http://10.223.0.11:8000", planned, seen)), PASS,
                   "all 4 planned workers")
    more = planned + ("http://10.223.0.13:30001",)
    assert_verdict(check_router_workers(RouterObservation("lab-gpu1", "u", more, seen)), FAIL, "missing http://10.223.0.13:30001")
    sick = dict(seen, **{planned[0]: False})
    assert_verdict(check_router_workers(RouterObservation("lab-gpu1", "u", planned, sick)), FAIL, f"unhealthy {planned[0]}")
    assert_verdict(check_router_workers(RouterObservation("lab-gpu1", "u", planned, None, "Connection refused")), FAIL,
                   "Connection refused", "systemctl status pdkit-router")
    assert_verdict(check_router_workers(RouterObservation("lab-gpu1", "u", planned[:3], seen)), WARN, "unplanned")


# ---- C=16 throughput against the last recorded bench


def _record(cluster: str, engine: str, tok_s: float, run_id: str) -> dict:
    return {"id": run_id, "cluster": cluster, "input_len": 128, "output_len": 32, "requests": 48, "env": {"engine": engine},
            "levels": [{"concurrency": 1, "output_tok_s": 50.0, "completed": 48, "errors": 0},
                       {"concurrency": 16, "output_tok_s": tok_s, "completed": 48, "errors": 0}]}


def test_last_recorded_takes_the_newest_run_of_this_cluster_and_engine():
    runs = [_record("lab", "sim", 900.0, "a"), _record("lab", "sim", 1000.0, "b"), _record("lab", "sglang", 7000.0, "c"),
            _record("prod", "sim", 1.0, "d"), {**_record("lab", "sim", 5.0, "e"), "levels": [{"concurrency": 64, "output_tok_s": 5.0}]}]
    point = last_recorded(runs, "lab", "sim")
    assert point == BenchPoint(1000.0, "b", 128, 32, 48)
    assert last_recorded(runs, "other", "sim") is None
    # a bench of one host's own pairs (pdkit bench --limit) is not the cluster's figure; through the router it is
    limited = {**_record("lab", "sim", 200.0, "f"), "env": {"engine": "sim", "measured": {"via": "engines", "hosts": ["lab-gpu1"]}}}
    assert last_recorded([*runs, limited], "lab", "sim") == point
    routed = {**_record("lab", "sim", 950.0, "g"), "env": {"engine": "sim", "measured": {"via": "router"}}}
    assert last_recorded([*runs, limited, routed], "lab", "sim") == BenchPoint(950.0, "g", 128, 32, 48)
    assert c16_throughput({**_record("lab", "sim", 1.0, "x"), "levels": [{"concurrency": 16, "output_tok_s": 9.0, "errors": 3}]}) is None


def test_throughput_pass_fail_warn():
    recorded = BenchPoint(1000.0, "20261129T210000Z-graphs-on")
    assert_verdict(check_throughput("lab-gpu1", None, None), WARN, "no bench recorded", "pdkit bench")
    assert_verdict(check_throughput("lab-gpu1", recorded, None), WARN, "1000 tok/s", "graphs-on", "--bench")
    assert_verdict(check_throughput("lab-gpu1", recorded, BenchPoint(950.0, "now")), PASS, "-5%")
    assert_verdict(check_throughput("lab-gpu1", recorded, BenchPoint(600.0, "now")), FAIL, "-40%", "pdkit compare")
    assert_verdict(check_throughput("lab-gpu1", recorded, BenchPoint(850.0, "now"), tolerance=0.2), PASS)


# ---- the whole report


def _scenario(scenario: str, plan_scenario: str | None = None) -> tuple[list[EngineObservation], list[RouterObservation]]:
    engines = [observe(scenario, e, plan_scenario) for e in ("prefill", "decode")]
    routers = [RouterObservation("lab-gpu1", "http://10.223.0.11:8000", tuple(sorted(workers_seen(scenario))), workers_seen(scenario))]
    return engines, routers


def test_the_graphs_off_capture_fails_exactly_one_check_of_one_engine():
    base = evaluate(*_scenario("lab_base"), cluster_host="lab-gpu1")
    assert [r for r in base if r.status == FAIL] == [] and exit_code(base) == 0
    off = evaluate(*_scenario("lab_graphs_off"), cluster_host="lab-gpu1")
    assert [(r.host, r.target, r.check) for r in off if r.status == FAIL] == [("lab-gpu1", "decode", "decode_cuda_graph")]
    assert exit_code(off) == 1
    # the same pages judged against the base plan: the flags drifted too
    drifted = evaluate(*_scenario("lab_graphs_off", "lab_base"), cluster_host="lab-gpu1")
    assert {(r.target, r.check) for r in drifted if r.status == FAIL} == {("decode", "decode_cuda_graph"), ("decode", "flags")}


def test_every_engine_gets_its_role_s_checks_once():
    results = evaluate(*_scenario("lab_base"), cluster_host="lab-gpu1")
    checks = {}
    for r in results:
        checks.setdefault(r.target, []).append(r.check)
    # no weights_cached row: the sim reads no weight files
    assert checks["prefill"] == ["reachable", "flags", "context_length", "engine_shape", "weights", "jit_caches",
                                 "process_env", "kv_transfer", "kv_path", "prefix_cache", "queues", "version"]
    assert checks["decode"] == ["reachable", "flags", "decode_cuda_graph", "graph_buckets", "context_length",
                                "engine_shape", "weights", "jit_caches", "process_env", "kv_transfer", "queues",
                                "version"]
    assert checks["router"] == ["router_workers"] and checks["cluster"] == ["throughput_c16"]


def test_table_shows_a_block_per_engine_and_the_hint_under_a_fail():
    text = render_table(evaluate(*_scenario("lab_graphs_off"), cluster_host="lab-gpu1"))
    lines = text.splitlines()
    assert "lab-gpu1/prefill" in lines and "lab-gpu1/decode" in lines and "lab-gpu1/router" in lines
    fail = next(i for i, line in enumerate(lines) if " FAIL " in line)
    assert "decode_cuda_graph" in lines[fail] and lines[fail + 1].strip().startswith("fix: the spec turns them off")
    assert lines[-1].endswith("1 FAIL")


def test_the_cli_registers_doctor():
    from pdkit.cli import build_parser

    args = build_parser().parse_args(["doctor", "inventories/lab.py", "--json", "--bench", "--tolerance", "0.2"])
    assert args.json and args.bench and args.tolerance == 0.2 and args.func.__module__ == "pdkit.doctor"


@pytest.mark.parametrize("bad", ["does/not/exist.py"])
def test_the_cli_refuses_a_bad_inventory_before_contacting_anything(bad, capsys):
    from pdkit.cli import main

    assert main(["doctor", bad]) == 2
    assert "no such inventory file" in capsys.readouterr().err


def test_a_down_engine_fails_reachable_and_its_other_checks_only_follow_from_it():
    # the exporter still holds the engine's last ratio and version: they must not pass a dead engine
    down = EngineObservation(plan=plans("lab_base")["decode"], server_info_error="Connection refused",
                             first=Sample(0, None, "Connection refused"), second=Sample(3, None, "Connection refused"),
                             exporter=exporter_views((DATA / "lab_base" / "exporter.txt").read_text())["decode"])
    assert down.exporter.decode_graph_ratio == 1.0 and down.exporter.sglang_version == "sim"
    results = evaluate([down], [], cluster_host="lab-gpu1")
    by = {r.check: r for r in results if r.target == "decode"}
    assert by.pop("reachable").status == FAIL
    for check, result in by.items():
        assert_verdict(result, WARN, "follows from reachable")
    assert "last known sim" in by["version"].reason


# -- reboot_required (the driver role's marker, exported by pdkit-exporter as pdkit_node_reboot_required)


def _reboot_page(value: float) -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class One:  # the same family the exporter's collector yields (pdkit/agent/exporter/collector.py)
        def collect(self):
            g = GaugeMetricFamily("pdkit_node_reboot_required", "reboot pending", labels=["node"])
            g.add_metric(["lab-gpu1"], value)
            yield g

    registry = CollectorRegistry()
    registry.register(One())
    base = (DATA / "lab_base" / "exporter.txt").read_text()
    return base + generate_latest(registry).decode()


def test_reboot_required_read_from_the_exporter_page():
    from pdkit.doctor.checks_cluster import check_reboot
    from pdkit.doctor.observe import reboot_pending

    assert reboot_pending((DATA / "lab_base" / "exporter.txt").read_text()) is None
    assert reboot_pending(_reboot_page(0)) == 0
    assert reboot_pending(_reboot_page(1)) == 1
    assert check_reboot("lab-gpu1", 0).status == "PASS"
    pending = check_reboot("lab-gpu1", 1)
    assert pending.status == "WARN" and "when-drained" in pending.hint and "pdkit roll --limit lab-gpu1" in pending.hint
    unknown = check_reboot("lab-gpu1", None, "http://10.0.0.1:9400/metrics: connection refused")
    assert unknown.status == "WARN" and "connection refused" in unknown.reason


def test_evaluate_reports_the_reboot_per_node():
    results = evaluate([], [], cluster_host="lab-gpu1", reboots={"lab-gpu1": (1.0, None), "lab-gpu2": (0.0, None)})
    rows = {(r.host, r.check): r.status for r in results}
    assert rows[("lab-gpu1", "reboot_required")] == "WARN" and rows[("lab-gpu2", "reboot_required")] == "PASS"


# ---- issue #18 item 10: doctor's bench measures each decode engine, not only the cluster

ITL_PAGE = """# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_bucket{model_name="m",le="0.01"} 10.0
sglang:inter_token_latency_seconds_bucket{model_name="m",le="+Inf"} 40.0
sglang:inter_token_latency_seconds_sum{model_name="m"} 0.8
sglang:inter_token_latency_seconds_count{model_name="m"} 40.0
"""


def test_histogram_mean_reads_sum_and_count():
    from pdkit.doctor.observe import histogram_mean

    assert histogram_mean(ITL_PAGE, "sglang:inter_token_latency_seconds") == (0.8, 40.0)
    assert histogram_mean("# nothing\n", "sglang:inter_token_latency_seconds") is None


@pytest.mark.parametrize(("itl", "failed"), [
    # three decode engines at ~20 ms per token; one with graphs off at 3x (the sim's factor)
    ({("g1", "decode"): 0.060, ("g2", "decode"): 0.020, ("g3", "decode"): 0.021}, {("g1", "decode")}),
    # all alike (noise within tolerance): nothing fails, whatever the cluster figure does
    ({("g1", "decode"): 0.021, ("g2", "decode"): 0.020, ("g3", "decode"): 0.0205}, set()),
])
def test_decode_speed_names_the_slow_engine(itl, failed):
    from pdkit.doctor.checks_cluster import check_decode_speed

    results = check_decode_speed(itl, tolerance=0.10)
    assert {(r.host, r.target) for r in results if r.status == "FAIL"} == failed
    assert all(r.check == "decode_speed_c16" for r in results) and len(results) == 3


def test_decode_speed_without_tokens_or_peers():
    from pdkit.doctor.checks_cluster import check_decode_speed

    (idle,) = [r for r in check_decode_speed({("g1", "decode"): None, ("g2", "decode"): 0.02}) if r.host == "g1"]
    assert idle.status == "WARN" and "no decode token" in idle.reason
    (alone,) = check_decode_speed({("g1", "decode"): 0.02})
    assert alone.status == "PASS" and "no peer" in alone.reason


def test_per_engine_bench_gives_every_decode_engine_its_own_share(monkeypatch):
    """Issue #18 item 10: through the router one slow decode of three got no request in a lab run,
    so decode_speed_c16 had nothing to measure; doctor's speed bench asks each PD pair directly, in turn."""
    from pdkit import bench
    from pdkit.doctor.baseline import per_engine_bench
    from pdkit.inventory.loader import load

    spec = load(str(Path(__file__).resolve().parents[1] / "inventories" / "cluster.py"))
    seen = {}

    def fake_run_bench(spec_, **kw):
        seen.update(kw)
        return {"levels": []}

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)  # pdkit.doctor.baseline calls bench.run_bench
    per_engine_bench(spec, BenchPoint(1000.0, "r", 256, 64, 48), lambda _m: None, False)
    decodes = sorted(f"{h.name}/{e.name}" for h, e in spec.engines() if e.role in ("decode", "unified"))
    routed = [r.split("+")[-1] for r in seen["measured"]["routes"]]
    assert sorted(routed) == decodes, (routed, decodes)  # each decode once: round robin gives equal shares
    assert seen["measured"]["via"] == "engines" and callable(seen["send"])
    assert (seen["concurrency"], seen["requests"], seen["input_len"], seen["output_len"]) == ([16], 48, 256, 64)


# ---- engines spanning nodes (issue 20): only rank 0 serves HTTP; every rank's process is checked


def _rank_page(node: str, engine: str, *, rank: int = 1, nnodes: int = 2, head: str = "lab-gpu1", up: float = 1.0,
               drift: tuple[str, ...] = (), missing: tuple[str, ...] = (), env_error: float = 0.0) -> str:
    """What pdkit-exporter on a rank's host says about a rank above 0, in its own families (the
    rank > 0 branch of pdkit/agent/exporter/collector.py: rank_up, the argv and environment checks, no
    HTTP series). tests/exporter/test_collector.py reads the real exporter's page the same way."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

    labels = ["node", "engine", "role"]
    values = [node, engine, "decode"]

    class Page:
        def collect(self):
            fam = GaugeMetricFamily("pdkit_engine_rank_up", "rank up", labels=[*labels, "rank", "nnodes", "head"])
            fam.add_metric([*values, str(rank), str(nnodes), head], up)
            yield fam
            fam = GaugeMetricFamily("pdkit_engine_flags_drift", "drift", labels=labels)
            fam.add_metric(values, 1.0 if drift else 0.0)
            yield fam
            fam = InfoMetricFamily("pdkit_engine_flag_drift", "drifted flag", labels=[*labels, "flag"])
            for flag in drift:
                fam.add_metric([*values, flag], {})
            yield fam
            if up:
                fam = GaugeMetricFamily("pdkit_engine_env_present", "env", labels=labels)
                fam.add_metric(values, 0.0 if missing else 1.0)
                yield fam
            fam = GaugeMetricFamily("pdkit_engine_env_check_error", "env error", labels=labels)
            fam.add_metric(values, 0.0 if up else 1.0)
            yield fam
            fam = InfoMetricFamily("pdkit_engine_env_mismatch", "env mismatch", labels=[*labels, "var", "problem"])
            for var in missing:
                fam.add_metric([*values, var, "missing"], {})
            yield fam

    registry = CollectorRegistry()
    registry.register(Page())
    return generate_latest(registry).decode()


def _rank1(**page) -> EngineObservation:
    """Rank 1 of lab-gpu1/decode on lab-gpu2, as `collect` builds it: no HTTP, its host's exporter."""
    plan = replace(plans("lab_base")["decode"], host="lab-gpu2", rank=1, nnodes=2, head="lab-gpu1",
                   env_names=("NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "SGLANG_HOST_IP"))
    return EngineObservation(plan=plan, exporter=exporter_views(_rank_page("lab-gpu2", "decode", **page))["decode"])


def _rank0() -> EngineObservation:
    obs = observe("lab_base", "decode")
    obs.plan = replace(obs.plan, nnodes=2, head="lab-gpu1")
    return obs


def test_a_rank_above_0_is_not_down_for_lacking_http():
    results = evaluate([_rank0(), _rank1()], [], cluster_host="lab-gpu1")
    rank = [r for r in results if r.target == "decode rank 1"]
    assert [r.check for r in rank] == ["rank_process", "flags", "process_env"]
    assert all(r.host == "lab-gpu2" for r in rank)
    for r in rank:
        assert_verdict(r, PASS)
    assert "no HTTP on this rank" in rank[0].reason and "serves no /server_info" in rank[1].reason
    # rank 0 keeps every check of an engine, under the engine's own name
    head = {r.check: r for r in results if r.target == "decode"}
    assert {"reachable", "flags", "decode_cuda_graph", "process_env", "version"} <= set(head)
    assert head["reachable"].status == PASS and head["reachable"].host == "lab-gpu1"


def test_a_dead_rank_fails_rank_process_and_its_other_checks_follow_from_it():
    rank = {r.check: r for r in evaluate([_rank1(up=0.0)], []) if r.target == "decode rank 1"}
    assert_verdict(rank["rank_process"], FAIL, "rank 1 of lab-gpu1/decode (2 nodes) has no running process on lab-gpu2",
                   "journalctl -u pdkit-engine-decode", "the ranks meet again")
    for check in ("flags", "process_env"):
        assert_verdict(rank[check], WARN, "follows from rank_process")
    assert "reachable" not in rank


def test_the_nccl_environment_of_every_rank_is_checked():
    """Rank 0's environment can be right while rank 1's host lacks NCCL_SOCKET_IFNAME: the row names rank 1's host."""
    results = evaluate([_rank0(), _rank1(missing=("NCCL_SOCKET_IFNAME",))], [], cluster_host="lab-gpu1")
    env = {(r.host, r.target): r for r in results if r.check == "process_env"}
    assert env[("lab-gpu1", "decode")].status == PASS
    assert_verdict(env[("lab-gpu2", "decode rank 1")], FAIL, "NCCL_SOCKET_IFNAME missing", "re-apply the plan to lab-gpu2")


def test_a_rank_whose_argv_drifted_fails_flags():
    result = check_flags(_rank1(drift=("--tp-size",)))
    assert_verdict(result, FAIL, "rank 1", "--tp-size", "re-apply the plan to lab-gpu2")


def test_a_rank_without_an_exporter_or_with_the_wrong_rank():
    from pdkit.doctor.checks_engine import check_rank_process

    lost = _rank1()
    lost.exporter, lost.exporter_error = None, "http://10.223.0.12:9400/metrics: Connection refused"
    assert_verdict(check_rank_process(lost), WARN, "not measurable", "Connection refused", "systemctl status pdkit-exporter")
    assert_verdict(check_flags(lost), WARN, "not measurable", "rank 1 serves no /server_info")
    assert_verdict(check_env(lost), WARN, "not measurable")
    other = _rank1(rank=2, nnodes=3)
    assert_verdict(check_rank_process(other), FAIL, "watches rank 2", "re-apply the plan to lab-gpu2")
    silent = _rank1()
    silent.exporter = replace(silent.exporter, rank_up=None, rank=None)
    assert_verdict(check_rank_process(silent), WARN, "no pdkit_engine_rank_up", "exporter.json")


def test_every_rank_is_planned_with_its_own_host_argv_and_environment():
    from pdkit.doctor.collection import engine_plans
    from pdkit.inventory.loader import load
    from tests.conftest import REPO

    spec = load(REPO / "inventories" / "multinode.py")
    decode = [p for p in engine_plans(spec) if p.engine == "decode"]
    assert [(p.host, p.rank, p.nnodes, p.head, p.target) for p in decode] == [
        ("gpu-d0", 0, 2, "gpu-d0", "decode"), ("gpu-d1", 1, 2, "gpu-d0", "decode rank 1")]
    assert decode[0].url == decode[1].url == "http://10.0.1.20:30001"  # rank 0 serves HTTP for both
    differ = [i for i, (a, b) in enumerate(zip(decode[0].argv, decode[1].argv)) if a != b]
    assert [decode[0].argv[i - 1] for i in differ] == ["--node-rank"] and len(decode[0].argv) == len(decode[1].argv)
    for p in decode:
        assert {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "SGLANG_HOST_IP"} <= set(p.env_names), p.env_names
    (prefill,) = [p for p in engine_plans(spec) if p.engine == "prefill"]
    assert (prefill.rank, prefill.nnodes, prefill.head, prefill.target) == (0, 1, "", "prefill")


def test_collect_sends_no_http_to_a_rank_above_0_and_reads_its_hosts_exporter(monkeypatch):
    from pdkit.doctor import observe
    from pdkit.doctor.collection import collect
    from pdkit.inventory.loader import load
    from tests.conftest import REPO

    spec = load(REPO / "inventories" / "multinode.py")
    asked: list[str] = []

    def refused(url, timeout_s, headers=None):
        asked.append(url)
        return None, "Connection refused"

    monkeypatch.setattr(observe, "http_get", refused)  # every GET of collect goes through it
    collected = collect(spec, window_s=0, probe_requests=0, timeout_s=0.1)
    engine_gets = sorted(u for u in asked if u.endswith(("/server_info", "/metrics")) and ":300" in u)
    # two engines (prefill on gpu-p0, decode rank 0 on gpu-d0), each /server_info once and /metrics twice
    assert engine_gets == sorted(["http://10.0.1.10:30000/server_info", "http://10.0.1.10:30000/metrics", "http://10.0.1.10:30000/metrics",
                                  "http://10.0.1.20:30001/server_info", "http://10.0.1.20:30001/metrics", "http://10.0.1.20:30001/metrics"])
    assert "http://10.0.1.21:9400/metrics" in asked  # rank 1's host: its exporter
    (rank1,) = [o for o in collected.engines if o.plan.rank == 1]
    assert rank1.plan.host == "gpu-d1" and rank1.server_info_error is None and rank1.first.error is None
    assert "10.0.1.21:9400" in rank1.exporter_error
    results = evaluate(collected.engines, [])
    rank_rows = [r for r in results if r.target == "decode rank 1"]
    # the rank's node has NVIDIA GPUs: its GPU health is read from its exporter too (unreadable here)
    assert {r.check: r.status for r in rank_rows} == {"rank_process": WARN, "gpu_health": WARN, "flags": WARN,
                                                      "process_env": WARN}
    assert not any(r.check == "reachable" and r.target == "decode rank 1" for r in results)


# ---- kv_path: the KV hand-off's effective rate and share of TTFT, per prefill, against its path's floor

SAME_HOST, RDMA, TCP = (KV_PATHS[n].floor_gb_s for n in ("same-host", "cross-host-rdma", "cross-host-tcp"))


def kv_plan(paths: tuple[tuple[str, str], ...] = (("lab-gpu1", "same-host"),), devices: str | None = None,
            kind: str = "sglang") -> EnginePlan:
    decodes = tuple(f"{h}/decode" for h, _ in paths)
    return replace(plans("lab_base")["prefill"], kv_paths=paths, kv_decodes=decodes, ucx_net_devices=devices,
                   engine_kind=kind)


def kv_obs(plan: EnginePlan, before_ms: list[float], after_ms: list[float], mb: float,
           ttft_s: tuple[float, float] | None = None) -> tuple[EngineObservation, list[EngineObservation]]:
    """A prefill whose hand-offs took BEFORE_MS then BEFORE_MS + AFTER_MS (MB each), and its decode on
    plan.kv_decodes[0] whose TTFT histogram grew by TTFT_S (sum s, count) in the window."""
    first, second = page(before_ms, mb), page(before_ms + after_ms, mb)
    prefill = EngineObservation(plan=plan, first=sample(0.0, first), second=sample(WINDOW_S, second))
    host, engine = plan.kv_decodes[0].split("/")
    decode_plan = replace(plans("lab_base")["decode"], host=host)
    decode = EngineObservation(plan=decode_plan, first=Sample(0.0, {}, ttft=(0.0, 0.0)),
                               second=Sample(WINDOW_S, {}, ttft=ttft_s))
    return prefill, [decode]


def test_kv_path_passes_a_fast_same_host_pair_and_shows_its_figures():
    prefill, decodes = kv_obs(kv_plan(), [], [10.0] * 8, 192.0, ttft_s=(0.8, 8))  # 18.75 GB/s, 10% of 100 ms
    result = check_kv_path(prefill, decodes)
    assert_verdict(result, PASS, "8 hand-offs in the last 3 s", "192.0 MB/request", "latency mean 10 ms", "p99 ",
                   "effective 18.8 GB/s", "SGLang's speed mean 18.8 GB/s", "10% of TTFT (mean 100 ms",
                   f"same-host to lab-gpu1 (floor {SAME_HOST:g} GB/s)")


def test_kv_path_warns_a_same_host_pair_below_its_floor_that_is_a_small_part_of_ttft():
    prefill, decodes = kv_obs(kv_plan(), [], [400.0] * 8, 192.0, ttft_s=(8.0, 8))  # 0.47 GB/s, 40% of 1 s
    assert_verdict(check_kv_path(prefill, decodes), WARN, f"below the path's floor {SAME_HOST:g} GB/s", "cuda_ipc", "UCX_PROTO_INFO")


def test_kv_path_fails_the_h200_cross_host_tcp_pair():
    """The measured case (issue 33): 192 MB hand-offs taking 8-10 s across two hosts over TCP, TTFT 15 s at C=16,
    while SGLang's speed histogram (a mean of per-request ratios, here one fast hand-off among slow ones) looked
    healthy."""
    plan = kv_plan((("pdkit-a", "same-host"), ("pdkit-b", "cross-host-tcp")), devices="host0")
    prefill, decodes = kv_obs(plan, [], [9000.0] * 7 + [8000.0] * 8 + [3.0], 192.0, ttft_s=(15.0 * 16, 16))
    result = check_kv_path(prefill, decodes)
    assert_verdict(result, FAIL, "KV crosses hosts over TCP (ucx_net_devices 'host0' is not an RDMA device) to pdkit-b",
                   f"below the path's floor {TCP:g} GB/s", "of TTFT (above 50%)", "p99 >5000 ms", "effective 0.0236 GB/s",
                   "set pdkit_node.ucx_net_devices on lab-gpu1 to its RDMA NIC", "tuning.page_size",
                   "keep PD pairs on one host", f"floor {TCP:g} GB/s, the slowest path's")
    assert "SGLang's speed mean 3.93 GB/s" in result.reason  # the mean of ratios: over 100x the effective rate


def test_kv_path_names_a_tcp_pair_even_when_it_is_fast_enough():
    plan = kv_plan((("lab-gpu2", "cross-host-tcp"),))
    prefill, decodes = kv_obs(plan, [], [50.0] * 4, 192.0, ttft_s=(2.0, 4))  # 3.75 GB/s, 10% of 500 ms
    result = check_kv_path(prefill, decodes)
    assert_verdict(result, WARN, "KV crosses hosts over TCP (ucx_net_devices is unset)", "effective 3.75 GB/s",
                   "ucx_net_devices")
    assert "below" not in result.reason


@pytest.mark.parametrize(("latency_ms", "ttft_x", "status"), [(10.0, 5.0, PASS), (1000.0, 1.2, FAIL)])
def test_kv_path_over_rdma_is_judged_by_the_rdma_floor(latency_ms, ttft_x, status):
    # 18.75 GB/s at 20% of TTFT; 0.19 GB/s at 83% of TTFT
    plan = kv_plan((("gpu-d0", "cross-host-rdma"),), devices="mlx5_0:1")
    prefill, decodes = kv_obs(plan, [], [latency_ms] * 4, 192.0, ttft_s=(4 * ttft_x * latency_ms / 1000, 4))
    result = check_kv_path(prefill, decodes)
    assert_verdict(result, status, f"cross-host-rdma to gpu-d0 (floor {RDMA:g} GB/s)")
    assert "TCP" not in result.reason
    if status == FAIL:
        assert "ibstat" in result.hint and "mlx5_0:1" in result.hint


def test_kv_path_warns_when_the_hand_off_is_most_of_ttft():
    prefill, decodes = kv_obs(kv_plan(), [], [15.0] * 4, 192.0, ttft_s=(4 * 0.025, 4))  # 12.5 GB/s, 60% of 25 ms
    assert_verdict(check_kv_path(prefill, decodes), WARN, "the hand-off is 60% of TTFT (above 50%)", "inflight queue")


def test_kv_path_falls_back_to_the_totals_since_start_and_says_so():
    prefill, decodes = kv_obs(kv_plan(), [10.0] * 5, [], 192.0, ttft_s=None)
    result = check_kv_path(prefill, decodes)
    assert_verdict(result, PASS, "5 hand-offs since the engine started (none in the last 3 s)",
                   "share of TTFT unknown")


def test_kv_path_reads_ttft_from_the_prefill_when_its_decodes_have_none():
    plan = kv_plan()
    prefill, _ = kv_obs(plan, [], [10.0] * 4, 192.0)
    prefill.first.ttft, prefill.second.ttft = (0.0, 0.0), (0.4, 4)
    assert_verdict(check_kv_path(prefill, []), PASS, "10% of TTFT (mean 100 ms, its own TTFT histogram)")


def test_kv_path_judges_doctor_s_own_bench_when_it_ran_one():
    prefill, decodes = kv_obs(kv_plan(), [], [10.0] * 2, 192.0, ttft_s=(0.2, 2))
    # 16 more hand-offs of 400 ms each during the bench (0.47 GB/s), at 67% of the bench's TTFT
    bench = KvBench(prefill.second.kv, kv_histograms(page([10.0] * 2 + [400.0] * 16, 192.0)), ttft_mean_ms=600.0)
    assert_verdict(check_kv_path(prefill, decodes, bench), FAIL, "16 hand-offs during doctor's C=16 bench",
                   "67% of TTFT (mean 600 ms, the bench's mean)", f"below the path's floor {SAME_HOST:g} GB/s")
    # a bench that moved nothing through this prefill: the samples' window decides
    idle = KvBench(prefill.second.kv, prefill.second.kv, ttft_mean_ms=600.0)
    assert_verdict(check_kv_path(prefill, decodes, idle), PASS, "2 hand-offs in the last 3 s")


def test_kv_path_judges_the_sim_by_the_lowest_floor():
    """The sim moves KV at its kv_transfer_gb_s knob (1.2e9 B/s, 64 KiB per token: pdkit/sim/stepmodel.py), which
    is 1.12 GB/s in SGLang's unit (MiB / 1024 per s), below the same-host floor: a sim pair on the lab must not
    FAIL this row, so a sim is judged by the lowest floor, whatever its path; a sim slowed below it fails once
    its hand-offs are large enough for their rate to be judged (pdkit.spec.kvcost.KV_RATE_MIN_MB)."""
    from pdkit.sim.knobs import Knobs
    from pdkit.sim.stepmodel import kv_transfer_bytes, kv_transfer_seconds

    knobs = Knobs()
    mb, ms = kv_transfer_bytes(knobs, 1024) / 2**20, kv_transfer_seconds(knobs, 1024) * 1000
    assert mb >= KV_RATE_MIN_MB
    prefill, decodes = kv_obs(kv_plan(kind="sim"), [], [ms] * 8, mb, ttft_s=(8 * ms * 3 / 1000, 8))
    result = check_kv_path(prefill, decodes)
    assert_verdict(result, PASS, "effective 1.12 GB/s", "sim engine", f"judged by the lowest floor, {TCP:g} GB/s")
    lab = kv_plan((("lab-gpu1", "same-host"), ("lab-gpu2", "cross-host-tcp")), kind="sim")
    prefill, decodes = kv_obs(lab, [], [ms] * 8, mb, ttft_s=(8 * ms * 3 / 1000, 8))
    assert check_kv_path(prefill, decodes).status == WARN  # named: KV crosses hosts over TCP
    slowed = replace(knobs, kv_transfer_gb_s=TCP / 2)  # PDKIT_SIM_KV_TRANSFER_GB_S at half the lowest floor
    ms = kv_transfer_seconds(slowed, 1024) * 1000
    prefill, decodes = kv_obs(kv_plan(kind="sim"), [], [ms] * 8, mb, ttft_s=(8 * ms * 1.5 / 1000, 8))
    assert_verdict(check_kv_path(prefill, decodes), FAIL, f"below the path's floor {TCP:g} GB/s")


def test_kv_path_does_not_judge_the_rate_of_small_hand_offs():
    """8 MiB hand-offs at 0.2 GB/s are latency-bound: below every floor, yet not slow; their share of TTFT is judged."""
    prefill, decodes = kv_obs(kv_plan(), [], [40.0] * 8, 8.0, ttft_s=(8 * 0.2, 8))  # 0.2 GB/s, 20% of 200 ms
    assert_verdict(check_kv_path(prefill, decodes), PASS, f"rate not judged under {KV_RATE_MIN_MB:g} MiB")
    prefill, decodes = kv_obs(kv_plan(), [], [40.0] * 8, 8.0, ttft_s=(8 * 0.05, 8))  # 80% of 50 ms
    assert_verdict(check_kv_path(prefill, decodes), WARN, "of TTFT (above 50%)")


def test_kv_path_on_the_real_h200_one_host_pair():
    """Real SGLang 0.5.17 pages (one H200, prefill and decode on one host): 622 hand-offs of 8 MB in the window,
    0.23 GB/s effective while SGLang's speed mean says 0.47 GB/s; TTFT from the decode's histogram."""
    prefill = observe_real((REAL / "metrics-base-before-prefill.txt").read_text(),
                           (REAL / "metrics-base-after-prefill.txt").read_text(), engine="prefill")
    prefill.first = sample(0.0, (REAL / "metrics-base-before-prefill.txt").read_text())
    prefill.second = sample(WINDOW_S, (REAL / "metrics-base-after-prefill.txt").read_text())
    prefill.plan = kv_plan((("h200", "same-host"),))
    decode = observe_real((REAL / "metrics-base-before-decode.txt").read_text(),
                          (REAL / "metrics-base-after-decode.txt").read_text())
    decode.first = sample(0.0, (REAL / "metrics-base-before-decode.txt").read_text())
    decode.second = sample(WINDOW_S, (REAL / "metrics-base-after-decode.txt").read_text())
    decode.plan = replace(decode.plan, host="h200")
    result = check_kv_path(prefill, [decode])
    # 8 MiB hand-offs: latency-bound, their rate is not judged (0.229 GB/s is below every floor), 22% of TTFT
    assert result.status == PASS, result
    for words in ("622 hand-offs", f"rate not judged under {KV_RATE_MIN_MB:g} MiB", "8.0 MB/request", "effective 0.229 GB/s", "SGLang's speed mean 0.472 GB/s",
                  "22% of TTFT (mean 153 ms, its decodes' TTFT histograms over the same window)"):
        assert words in result.reason, (words, result.reason)


def test_kv_path_warns_without_any_hand_off():
    prefill, decodes = kv_obs(kv_plan(), [], [], 192.0)
    assert_verdict(check_kv_path(prefill, decodes), WARN, "no KV hand-off since the engine started", "pdkit chat")


def test_kv_path_plans_come_from_the_pairing_sets():
    from pdkit.doctor.collection import engine_plans
    from pdkit.inventory.loader import load

    by = {(p.host, p.engine): p for p in engine_plans(load("inventories/h200-nspawn-pair.py"))}
    a = by[("pdkit-a", "prefill")]
    assert a.kv_paths == (("pdkit-a", "same-host"), ("pdkit-b", "cross-host-tcp"))
    assert a.kv_decodes == ("pdkit-a/decode", "pdkit-b/decode")
    assert by[("pdkit-a", "decode")].kv_paths == ()
    rdma = {(p.host, p.engine): p for p in engine_plans(load("inventories/multinode.py"))}
    assert rdma[("gpu-p0", "prefill")].kv_paths == (("gpu-d0", "cross-host-rdma"),)


def test_the_doc_lists_every_kv_path_with_its_floor():
    from pdkit.spec.kvcost import KV_PATHS, KV_TTFT_SHARE_WARN

    doc = (Path(__file__).resolve().parents[1] / "docs" / "doctor.md").read_text()
    for path in KV_PATHS.values():
        assert re.search(rf"^\| `{path.name}` \|.*\| {path.floor_gb_s:g} \|$", doc, re.M), path
    assert f"({KV_TTFT_SHARE_WARN:.0%})" in doc


def _with_recorded_shape(scenario: str, engine: str, **figures: int) -> EngineObservation:
    """The capture's observation, its exporter page carrying the shape the gate recorded (pdkit_engine_shape_recorded)."""
    page = (DATA / scenario / "exporter.txt").read_text()
    page += "# TYPE pdkit_engine_shape_recorded gauge\n" + "".join(
        f'pdkit_engine_shape_recorded{{engine="{engine}",figure="{k}",node="lab-gpu1",role="{engine}"}} {v}.0\n'
        for k, v in figures.items())
    obs = observe(scenario, engine)
    obs.exporter = exporter_views(page)[engine]
    return obs


def test_engine_shape_against_the_recorded_one_on_recorded_pages():
    """Issue 42 item 5: the decode came back with 7,452 KV tokens instead of 531,636 and passed every check."""
    from pdkit.doctor.checks_engine import check_engine_shape

    # nothing recorded yet (a node deployed before the gate recorded shapes): a WARN saying so, never a PASS
    assert_verdict(check_engine_shape(observe("lab_base", "decode")), WARN, "nothing recorded yet", "KV pool 262144 tokens")
    same = _with_recorded_shape("lab_base", "decode", kv_pool_tokens=262144, context_length=8191)
    assert_verdict(check_engine_shape(same), PASS, "KV pool 262144 tokens", "at least 90% of the recorded")
    bigger = _with_recorded_shape("lab_base", "decode", kv_pool_tokens=531636, context_length=8191)
    assert_verdict(check_engine_shape(bigger), FAIL, "KV pool 262144 tokens, 49.3% of the 531636 recorded",
                   "below the 90% floor")
    unread = observe("lab_base", "decode")
    unread.exporter, unread.exporter_error = None, "Connection refused"
    assert_verdict(check_engine_shape(unread), WARN, "not measurable", "Connection refused")


# ---- prefix_cache (issue 43 item 5)

PREFIX = DATA / "sim_prefix_cache"  # tests/doctor_data/capture_prefix_cache.py: a sim PD pair, 8 sessions' 2nd turns


def cache_pair(case: str, decode_flag: bool = False) -> tuple[EngineObservation, list[EngineObservation]]:
    """The prefill and decode of a recorded sim pair (lab_base's plans, the decode's argv with or without the
    decode radix cache flag), each with its two pages."""
    base = plans("lab_base")
    prefill_plan = replace(base["prefill"], kv_paths=(("lab-gpu1", "same-host"),), kv_decodes=("lab-gpu1/decode",))
    argv = base["decode"].argv + (("--disaggregation-decode-enable-radix-cache",) if decode_flag else ())
    decode_plan = replace(base["decode"], argv=argv)
    out = []
    for plan in (prefill_plan, decode_plan):
        out.append(EngineObservation(plan=plan,
                                     first=sample(0.0, (PREFIX / case / f"{plan.engine}.metrics1.txt").read_text()),
                                     second=sample(WINDOW_S, (PREFIX / case / f"{plan.engine}.metrics2.txt").read_text())))
    return out[0], [out[1]]


def test_prefix_cache_warns_when_the_decode_re_receives_the_cached_prefix():
    """The sim pair without a decode radix cache (SGLang's default): each second turn is 2,500 tokens, 2,200 of them
    in the prefill's cache, and each hand-off still carries all 2,500 tokens' KV (64 KiB each)."""
    prefill, decodes = cache_pair("no_decode_cache")
    assert_verdict(check_prefix_cache(prefill, decodes), WARN,
                   "hit rate 88.0% in the last 3 s (17600 of 20000 prompt tokens from the cache)",
                   "8 hand-offs carried 156.2 MiB/request where the 300 uncached prompt tokens/request need 18.8 MiB "
                   "(64 KiB/token): 8.33x", "above 2x", "137.5 MiB/request of prefix the prefill had cached crosses again",
                   "lab-gpu1/decode has no radix cache",
                   "tuning.decode_radix_cache: true", "experimental", "pdkit tune", "The prefix-cache levers")


def test_prefix_cache_passes_with_the_decode_radix_cache():
    """The same sessions with --disaggregation-decode-enable-radix-cache on the decode: only the new tokens cross."""
    prefill, decodes = cache_pair("decode_radix_cache", decode_flag=True)
    assert_verdict(check_prefix_cache(prefill, decodes), PASS, "hit rate 88.0%",
                   "18.8 MiB/request where the 300 uncached prompt tokens/request need 18.8 MiB (64 KiB/token): 1.00x")


def test_prefix_cache_names_an_evicting_decode_cache_when_the_flag_is_on():
    """Cached prefixes crossing although the plan gives the decode its radix cache: not the flag's hint again."""
    prefill, decodes = cache_pair("no_decode_cache", decode_flag=True)
    result = check_prefix_cache(prefill, decodes)
    assert_verdict(result, WARN, "lab-gpu1/decode runs the decode radix cache", "yet cached prefixes still cross",
                   "evict", "session affinity")
    assert "tuning.decode_radix_cache" not in result.hint


def test_prefix_cache_on_the_real_h200_one_host_pair():
    """Real SGLang 0.5.17 pages (one H200, prefill and decode on one host, SGLang's bench of 128-token prompts):
    622 hand-offs of 8 MiB, the prefill's cache hit 48.7% of the prompts; the KV pool's 53.93 GiB over its
    883,515 tokens is 64 KiB a token: the decode gets every prompt token's KV, 1.95x the uncached part."""
    prefill = EngineObservation(plan=replace(plans("lab_base")["prefill"], kv_decodes=("h200/decode",)),
                                first=sample(0.0, (REAL / "metrics-base-before-prefill.txt").read_text()),
                                second=sample(WINDOW_S, (REAL / "metrics-base-after-prefill.txt").read_text()))
    assert_verdict(check_prefix_cache(prefill, []), PASS, "hit rate 48.7% in the last 3 s (38735 of 79616 prompt tokens",
                   "622 hand-offs carried 8.0 MiB/request where the 66 uncached prompt tokens/request need 4.1 MiB "
                   "(64 KiB/token): 1.95x")
    # three quarters cached: 4x the uncached part, but the 6 MiB sent again per request is latency-bound, not judged
    after = re.sub(r"^(sglang:cached_tokens_total\{[^}]*\}) .*$", r"\1 60000.0",
                   (REAL / "metrics-base-after-prefill.txt").read_text(), flags=re.M)
    prefill.second = sample(WINDOW_S, after)
    assert_verdict(check_prefix_cache(prefill, []), PASS, "4.06x", "6.0 MiB/request sent again is under 32 MiB",
                   "not judged")


def test_prefix_cache_says_no_traffic_in_the_window():
    """lab_base's lab-gpu1 prefill got no request (the router sent every probe to lab-gpu2's): no prompt, no rate."""
    result = check_prefix_cache(observe("lab_base", "prefill"))
    assert result.status == INFO, result
    assert "no traffic in the last 3 s" in result.reason and "no hit rate" in result.reason
    assert "--probe-requests" in result.hint and "Prefix cache hit rate" in result.hint


def test_prefix_cache_on_a_unified_engine_and_without_the_kv_pool_gauges():
    prefill, _ = cache_pair("no_decode_cache")
    unified = EngineObservation(plan=replace(prefill.plan, role="unified", pd_group=None, kv_paths=(), kv_decodes=()),
                                first=prefill.first, second=prefill.second)
    assert_verdict(check_prefix_cache(unified), PASS, "hit rate 88.0%", "no KV hand-off on a unified engine")
    # a page without the KV pool's size: the hand-off is shown, not compared, and the row says which gauge is missing
    page = "\n".join(line for line in (PREFIX / "no_decode_cache" / "prefill.metrics2.txt").read_text().splitlines()
                     if SGLANG["kv_cache_memory"] not in line) + "\n"
    prefill.second = sample(WINDOW_S, page)
    result = check_prefix_cache(prefill, [])
    assert result.status == INFO, result
    assert "8 hand-offs of 156.2 MiB/request" in result.reason and SGLANG["kv_cache_memory"] in result.reason


def test_evaluate_gives_the_prefix_cache_row_and_the_table_counts_info():
    results = evaluate(*_scenario("lab_base"), cluster_host="lab-gpu1")
    row = next(r for r in results if r.check == "prefix_cache")
    assert (row.target, row.status) == ("prefill", INFO)
    assert exit_code(results) == 0
    # prefix_cache, and jit_caches on both engines: the capture predates its exporter gauge
    assert ", 3 INFO, " in render_table(results).splitlines()[-1]


# ---- weights_cached (issue 45 item 3) ---------------------------------------------------------------

def test_weights_cached_passes_warm_weights_warns_cold_ones_with_the_gib_and_says_nothing_without_files():
    from pdkit.doctor.checks_engine import check_weights_cached
    from pdkit.doctor.model import ExporterView

    obs = _scenario("lab_base")[0][0]
    obs.exporter = ExporterView(weights_cached=("/models/llama", 0.999, 16 * 2**30))
    row = check_weights_cached(obs)
    assert row.status == "PASS" and "16.0 GiB" in row.reason and "/models/llama" in row.reason, row
    obs.exporter = ExporterView(weights_cached=("/models/llama", 0.25, 16 * 2**30))
    row = check_weights_cached(obs)
    assert row.status == "WARN" and "reads 12.0 GiB from disk" in row.reason, row
    assert "python3 -m pdkit.residency /models/llama --warm" in row.hint, row
    obs.exporter = ExporterView()
    assert check_weights_cached(obs).status == "INFO"


def test_the_weights_cached_row_is_there_for_engines_that_read_local_weight_files_only():
    from dataclasses import replace as dc_replace

    from pdkit.doctor.checks_engine import reads_weight_files

    plan = _scenario("lab_base")[0][0].plan
    assert not reads_weight_files(plan)  # the sim
    real = dc_replace(plan, engine_kind="sglang", argv=("--model-path", "/models/llama", "--tp-size", "1"))
    assert reads_weight_files(real)
    assert not reads_weight_files(dc_replace(real, argv=(*real.argv, "--load-format", "dummy")))
    assert not reads_weight_files(dc_replace(real, argv=("--model-path", "meta-llama/Llama-3.1-8B")))



# ---- jit_caches (issue 45 item 2) -------------------------------------------------------------------

def test_jit_caches_passes_warm_caches_warns_cold_ones_with_the_measured_cost():
    from pdkit.doctor.checks_engine import check_jit_caches
    from pdkit.upstream.metricnames import EXPORTER_JIT_COLD_EXTRA, EXPORTER_JIT_WARM

    where = "/var/cache/pdkit-engine/jit/0.5.23/decode"
    labels = 'node="lab-gpu1",engine="decode",role="decode"'
    page = (f'{EXPORTER_JIT_WARM}{{{labels},dir="{where}",why="2 gated start(s) with these caches"}} 1.0\n'
            f'{EXPORTER_JIT_COLD_EXTRA}{{{labels},dir="{where}",source="{where}"}} 181.0\n')
    obs = _scenario("lab_base")[0][1]
    obs.exporter = exporter_views(page)["decode"]
    row = check_jit_caches(obs)
    assert row.status == PASS and where in row.reason and "2 gated start(s)" in row.reason, row
    cold = page.replace("} 1.0\n", "} 0.0\n", 1).replace("2 gated start(s) with these caches", "no start passed")
    obs.exporter = exporter_views(cold)["decode"]
    row = check_jit_caches(obs)
    assert row.status == WARN and "its next restart compiles: ~181 s more than a warm start" in row.reason, row
    assert "one at a time" in row.hint
    obs.exporter = exporter_views(cold.splitlines()[0] + "\n")["decode"]
    assert "no cold start of it measured" in check_jit_caches(obs).reason
    obs.exporter, obs.exporter_error = None, "connection refused"
    assert check_jit_caches(obs).status == INFO
