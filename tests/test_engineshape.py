"""A restarted engine must be the engine it was (issue 42 item 5): pdkit/agent/engineshape.py's pure parts,
its record-then-compare on disk, and the gate table's shape inputs."""

from __future__ import annotations

import json
import stat

import pytest

from pdkit.agent import engineshape, gates
from pdkit.agent.engineshape import MIN_FRACTION, compare, inputs_key, shape_from_server_info
from pdkit.inventory.loader import load
from pdkit.render.plan import plan_cluster, services_meta
from tests.conftest import REPO

# /server_info of SGLang 0.5.17 as its http_server.py server_info() builds it: the server arguments
# (cuda_graph_config resolved by server_args.py, PhaseConfig), the scheduler's init info at the top
# level, one internal state per DP rank (managers/scheduler.py get_internal_state)
INFO_0517 = {
    "context_length": 32768, "max_running_requests": None, "version": "0.5.17",
    "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 256, "bs": [1, 2, 4, 8, 12, 16, 24, 32, 256]},
                          "prefill": {"backend": "breakable", "max_bs": 8192, "bs": None}},
    "max_total_num_tokens": 531636, "max_req_input_len": 32761,
    "internal_states": [{"effective_max_running_requests_per_dp": 2048,
                         "memory_usage": {"token_capacity": 531636}, "last_gen_throughput": 0.0}],
}
# 0.5.23: the same, plus the decode CUDA-graph sizes the worker really captured
# (managers/scheduler_components/internal_state.py _add_disaggregation)
INFO_0523 = {**INFO_0517, "version": "0.5.23",
             "internal_states": [{**INFO_0517["internal_states"][0], "decode_cuda_graph_bs": [1, 2, 4, 8, 16, 32]},
                                 {**INFO_0517["internal_states"][0], "effective_max_running_requests_per_dp": 1024,
                                  "decode_cuda_graph_bs": [1, 2, 4, 8, 16, 32]}]}


def test_the_shape_is_read_where_each_release_reports_it():
    assert shape_from_server_info(INFO_0517) == {"kv_pool_tokens": 531636, "max_running_requests": 2048,
                                                 "context_length": 32761, "cuda_graph_max_bs": 256,
                                                 "cuda_graph_bs_count": 9}
    # the captured sizes win over the configured ones; the smallest DP rank's limit counts
    assert shape_from_server_info(INFO_0523) == {"kv_pool_tokens": 531636, "max_running_requests": 1024,
                                                 "context_length": 32761, "cuda_graph_max_bs": 32,
                                                 "cuda_graph_bs_count": 6}


def test_a_release_that_reports_less_gives_none_not_a_guess():
    older = {"context_length": 8192, "cuda_graph_bs": [1, 2, 4], "internal_states": [{"last_gen_throughput": 0.0}]}
    assert shape_from_server_info(older) == {"kv_pool_tokens": None, "max_running_requests": None,
                                             "context_length": 8192, "cuda_graph_max_bs": 4, "cuda_graph_bs_count": 3}
    assert shape_from_server_info({}) == dict.fromkeys(engineshape.FIGURES)
    off = {**INFO_0517, "cuda_graph_config": {"decode": {"backend": "disabled", "bs": [1, 2]}}}
    assert shape_from_server_info(off)["cuda_graph_max_bs"] is None
    # a PD prefill captures no decode graph (0.5.23: []): the configured sizes are what it reports
    prefill = {**INFO_0523, "internal_states": [{"decode_cuda_graph_bs": []}]}
    assert shape_from_server_info(prefill)["cuda_graph_bs_count"] == 9


def test_compare_names_the_figure_and_both_numbers():
    recorded = shape_from_server_info(INFO_0517)
    shrunk = {**recorded, "kv_pool_tokens": 7452, "max_running_requests": 1844}
    assert compare(recorded, shrunk) == [
        "KV pool 7452 tokens, 1.4% of the 531636 recorded at this release's first healthy start; below the 90% floor",
    ]
    fewer = {**recorded, "cuda_graph_max_bs": 32, "cuda_graph_bs_count": 6, "max_running_requests": 1000}
    assert compare(recorded, fewer) == [
        "max running requests 1000, 48.8% of the 2048 recorded at this release's first healthy start; "
        "below the 90% floor",
        "largest CUDA-graph batch size 32, 12.5% of the 256 recorded at this release's first healthy start; "
        "below the 90% floor",
        "CUDA-graph batch sizes 6 captured, 66.7% of the 9 recorded at this release's first healthy start; "
        "below the 90% floor",
    ]


def test_compare_holds_at_the_floor_and_skips_what_either_side_does_not_report():
    assert MIN_FRACTION == 0.9
    recorded = {"kv_pool_tokens": 1000, "context_length": None, "max_running_requests": 10}
    assert compare(recorded, {"kv_pool_tokens": 900, "context_length": 5, "max_running_requests": None}) == []
    assert compare(recorded, {"kv_pool_tokens": 899})[0].startswith("KV pool 899 tokens, 89.9% of the 1000")
    assert compare(recorded, {"kv_pool_tokens": 2000}) == []  # larger is never a failure
    assert compare({}, shape_from_server_info(INFO_0517)) == []


def test_the_record_key_follows_the_engines_files_and_venv():
    base = {"/etc/systemd/system/pdkit-engine-decode.service": "sha256:aa", "/opt/pdkit/engine-venv": "dir:/v/1"}
    assert inputs_key(base) == inputs_key(dict(reversed(base.items())))
    assert inputs_key(base) != inputs_key({**base, "/opt/pdkit/engine-venv": "dir:/v/2"})
    assert inputs_key(base) != inputs_key({**base, "/etc/systemd/system/pdkit-engine-decode.service": "sha256:ab"})


def _inputs(tmp_path):
    unit = tmp_path / "pdkit-engine-decode.service"
    unit.write_text("[Service]\nExecStart=sglang --mem-fraction-static 0.88\n")
    venv = tmp_path / "venvs" / "a"
    venv.mkdir(parents=True)
    (tmp_path / "engine-venv").symlink_to(venv)
    return unit, [str(unit), str(tmp_path / "engine-venv")]


def test_first_healthy_start_records_later_starts_compare_a_new_configuration_records_anew(tmp_path):
    unit, inputs = _inputs(tmp_path)
    shapes = tmp_path / "shapes"
    ok, message = engineshape.check("pdkit-engine-decode.service", inputs, INFO_0517, str(shapes))
    assert ok and message.startswith("shape recorded (KV pool 531636 tokens, max running requests 2048")
    records = [p for p in (shapes / "pdkit-engine-decode.service").glob("*.json") if p.name != "last.json"]
    assert len(records) == 1 and stat.S_IMODE(records[0].stat().st_mode) == 0o644
    assert stat.S_IMODE(records[0].parent.stat().st_mode) == 0o755

    assert engineshape.check("pdkit-engine-decode.service", inputs, INFO_0517, str(shapes))[0]
    shrunk = {**INFO_0517, "max_total_num_tokens": 7452}
    ok, message = engineshape.check("pdkit-engine-decode.service", inputs, shrunk, str(shapes))
    assert not ok
    assert "pdkit-engine-decode.service came back smaller than its configuration's first healthy start" in message
    assert "KV pool 7452 tokens, 1.4% of the 531636 recorded" in message
    last = json.loads((shapes / "pdkit-engine-decode.service" / "last.json").read_text())
    assert last["recorded"]["kv_pool_tokens"] == 531636 and last["now"]["kv_pool_tokens"] == 7452

    # a new configuration (the unit's flags changed): its own record, the smaller pool is its baseline
    unit.write_text("[Service]\nExecStart=sglang --mem-fraction-static 0.5\n")
    ok, message = engineshape.check("pdkit-engine-decode.service", inputs, shrunk, str(shapes))
    assert ok and message.startswith("shape recorded (KV pool 7452 tokens")
    # a rollback to the first configuration compares with ITS record again
    unit.write_text("[Service]\nExecStart=sglang --mem-fraction-static 0.88\n")
    assert not engineshape.check("pdkit-engine-decode.service", inputs, shrunk, str(shapes))[0]


def test_an_engines_gate_carries_its_files_and_venv_from_a_plan_or_a_release_record():
    spec = load(str(REPO / "inventories" / "lab.py"))
    host = next(h for h in plan_cluster(spec).values() if any(s.kind == "engine" for s in h.services))
    service = next(s for s in host.services if s.kind == "engine")
    gate = gates.gate_for(service)
    assert gate.shape_inputs == tuple(sorted(service.files)) + ((service.venv,) if service.venv else ())
    # a release keeps the service as services_meta writes it: its gate is the deploy's, shape inputs included
    record = services_meta([service])[service.unit]
    assert gates.gate_for(record, service.unit) == gate
    command = gates.command("/opt/pdkit/venv/bin/python", [gate])
    assert f"--shape {service.unit} {','.join(gate.shape_inputs)}" in command


@pytest.mark.parametrize(("raw", "fraction"), [("0.05", 0.05), ("1", 1.0), ("0", None), ("1.5", None), ("-1", None)])
def test_the_sims_kv_pool_fraction_knob_is_within_zero_and_one(raw, fraction):
    # here: the sim's modules import aiohttp, which only the sim tests need
    from pdkit.sim.knobs import KnobError, load_knobs
    from pdkit.sim.main import kv_pool_tokens

    assert load_knobs({}).kv_pool_fraction == 1.0
    if fraction is None:
        with pytest.raises(KnobError, match=r"PDKIT_SIM_KV_POOL_FRACTION must be within \(0, 1\]"):
            load_knobs({"PDKIT_SIM_KV_POOL_FRACTION": raw})
        return
    assert load_knobs({"PDKIT_SIM_KV_POOL_FRACTION": raw}).kv_pool_fraction == fraction
    assert kv_pool_tokens(262144, fraction) == int(262144 * fraction) and kv_pool_tokens(10, 0.01) == 1


def test_the_nodes_exporter_publishes_the_recorded_shape_for_doctor(tmp_path):
    """pdkit-exporter reads the gate's last.json (0644, root's) and exports pdkit_engine_shape_recorded per figure."""
    # here: the exporter and its test helpers import prometheus_client and requests, which only this test needs
    from pdkit.agent.exporter.collector import PdkitCollector
    from pdkit.agent.exporter.config import parse_config
    from pdkit.agent.exporter.system import ProcessInspector, SystemdPids
    from pdkit.upstream.metricnames import EXPORTER_SHAPE_RECORDED
    from tests.exporter.support import FakeSystemctl, exposition, samples, value

    unit = "pdkit-engine-decode.service"
    _, inputs = _inputs(tmp_path)
    shapes = tmp_path / "shapes"
    cfg = parse_config({"node": "gpu01", "cluster": "lab", "engines": [
        {"name": "decode", "role": "decode", "url": "http://127.0.0.1:9", "unit": unit, "sglang_version": "sim",
         "argv": [], "env": {}}], "timeout_s": 0.5, "journal": {"enabled": False}})

    def scrape() -> dict:
        collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl({}))),
                                   shapes_dir=str(shapes))
        try:
            return samples(exposition(collector))
        finally:
            collector.close()

    assert value(scrape(), EXPORTER_SHAPE_RECORDED, engine="decode", figure="kv_pool_tokens") is None
    assert engineshape.check(unit, inputs, INFO_0517, str(shapes))[0]
    found = scrape()
    assert value(found, EXPORTER_SHAPE_RECORDED, engine="decode", figure="kv_pool_tokens") == 531636
    assert value(found, EXPORTER_SHAPE_RECORDED, engine="decode", figure="cuda_graph_bs_count") == 9
