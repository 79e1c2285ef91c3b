"""`pdkit roll` planning without hosts: order, batches, version pairing, the dry-plan diff, gauges."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys

import pytest

from pdkit.inventory.loader import load
from pdkit.render.outages import Outage, batch_outages
from pdkit.render.plan import plan_cluster
from pdkit.roll.commands import format_releases
from pdkit.roll.planning import (
    HostDiff,
    format_dry_plan,
    host_diff,
    make_batches,
    metric_sums,
    pairing_units,
    rollout_order,
    unchanged_hosts,
    version_changes,
)
from tests.conftest import REPO, write_inventory


def _spec(tmp_path, hosts, cluster):
    return load(write_inventory(tmp_path, hosts, cluster))


def _one_router_over_every_engine(tmp_path, three_nodes):
    """three_nodes with gpu01's router fronting every engine, as in the lab (the NICs named,
    as a router over several nodes' engines requires)."""
    cluster, hosts = three_nodes
    del hosts["gpu01"]["pdkit_router"]["workers"]
    for h in ("gpu01", "gpu02", "gpu03"):
        hosts[h]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    return _spec(tmp_path, hosts, cluster)


@pytest.fixture
def three_nodes(base):
    """gpu01 (router over every engine), gpu02, gpu03, mon01; each node its own PD group."""
    cluster, hosts = base
    hosts["gpu03"] = copy.deepcopy(hosts["gpu02"])
    hosts["gpu03"]["ssh_hostname"] = "10.9.0.4"
    hosts["gpu03"]["pdkit_node"]["engines"][0]["pd_group"] = "g3"
    hosts["gpu03"]["pdkit_node"]["engines"][1]["pd_group"] = "g3"
    hosts["gpu01"]["pdkit_router"] = {"workers": ["gpu01/prefill", "gpu01/decode"]}
    order = ["gpu01", "gpu02", "gpu03", "mon01"]
    return cluster, {h: hosts[h] for h in order}


def test_canary_first_then_gpu_nodes_then_router_host_then_hosts_without_engines(tmp_path, three_nodes):
    spec = _spec(tmp_path, three_nodes[1], three_nodes[0])
    # default canary: the first GPU node that runs no router
    assert rollout_order(spec) == ["gpu02", "gpu03", "gpu01", "mon01"]
    assert rollout_order(spec, canary="gpu03") == ["gpu03", "gpu02", "gpu01", "mon01"]
    assert rollout_order(spec, canary="gpu01") == ["gpu01", "gpu02", "gpu03", "mon01"]
    assert rollout_order(spec, limit=["gpu03", "gpu01"]) == ["gpu03", "gpu01"]


def test_bad_canary_or_limit_is_refused_with_the_valid_names(tmp_path, three_nodes):
    spec = _spec(tmp_path, three_nodes[1], three_nodes[0])
    with pytest.raises(ValueError, match="--canary gpu09 is not among the hosts being rolled"):
        rollout_order(spec, canary="gpu09")
    with pytest.raises(ValueError, match=r"--canary gpu02 .*gpu01, gpu03"):
        rollout_order(spec, limit=["gpu01", "gpu03"], canary="gpu02")
    with pytest.raises(ValueError, match=r"unknown host\(s\) \['nope'\]"):
        rollout_order(spec, limit=["nope"])


def test_batches_put_the_canary_alone_then_n_hosts():
    order = ["a", "b", "c", "d", "e"]
    assert make_batches(order, 1) == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert make_batches(order, 2) == [["a"], ["b", "c"], ["d", "e"]]
    assert make_batches(order, 10) == [["a"], ["b", "c", "d", "e"]]
    with pytest.raises(ValueError, match="at least 1"):
        make_batches(order, 0)


def test_a_pairing_unit_is_never_split_across_batches():
    order = ["a", "b", "c", "d", "e"]
    # b and e must go together: b's batch grows to hold e; c and d follow
    assert make_batches(order, 1, [{"b", "e"}]) == [["a"], ["b", "e"], ["c"], ["d"]]
    # the canary's unit goes with the canary
    assert make_batches(order, 1, [{"a", "d"}]) == [["a", "d"], ["b"], ["c"], ["e"]]
    # a unit that does not fit the rest of a batch starts the next one
    assert make_batches(order, 2, [{"c", "d"}]) == [["a"], ["b"], ["c", "d"], ["e"]]


def test_version_change_is_detected_per_engine(tmp_path, three_nodes):
    spec = _spec(tmp_path, three_nodes[1], three_nodes[0])
    running = {"gpu02": {"prefill": "0.5.17", "decode": "0.5.23"}, "gpu03": {"prefill": "0.5.23"}}
    assert version_changes(spec, running) == {("gpu02", "prefill")}
    # an engine the node does not run yet is no version change
    assert version_changes(spec, {}) == set()


def test_a_pd_group_across_hosts_that_changes_version_rolls_as_one_batch(tmp_path, three_nodes):
    cluster, hosts = three_nodes
    # gpu02's decode and gpu03's decode join gpu02's group g2 (and gpu03 keeps its own prefill in g3)
    hosts["gpu03"]["pdkit_node"]["engines"].append({"name": "decode2", "role": "decode", "gpus": [3], "port": 30002, "pd_group": "g2"})
    hosts["gpu03"]["pdkit_node"]["engines"][1]["gpus"] = [2]
    for h in ("gpu02", "gpu03"):
        hosts[h]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    spec = _spec(tmp_path, hosts, cluster)
    units, why = pairing_units(spec, {("gpu02", "decode")})
    assert units == [{"gpu02", "gpu03"}]
    assert "PD group 'g2' changes SGLang version" in why[0] and "gpu02, gpu03" in why[0]
    order = rollout_order(spec)
    assert make_batches(order, 1, units) == [["gpu02", "gpu03"], ["gpu01"], ["mon01"]]
    # without a version change nothing is paired: node by node
    assert pairing_units(spec, set()) == ([], [])


def test_a_router_over_several_groups_pairs_all_its_hosts_on_a_version_change(tmp_path, three_nodes):
    spec = _one_router_over_every_engine(tmp_path, three_nodes)
    units, why = pairing_units(spec, {("gpu03", "prefill")})
    assert units == [{"gpu01", "gpu02", "gpu03"}]
    assert "pairs any prefill with any decode" in why[0]
    # a config change without a version change keeps node by node
    assert pairing_units(spec, set()) == ([], [])


def test_dry_diff_lists_files_that_differ_and_services_that_restart(tmp_path, three_nodes):
    spec = _spec(tmp_path, three_nodes[1], three_nodes[0])
    plan = plan_cluster(spec)["gpu02"]
    on_node = {"paths": {f.path: ["file", f.mode, f.owner, f.group, f.sha256] for f in plan.files}, "units": {s.unit: ["loaded", "active", "enabled"] for s in plan.services}}
    assert host_diff(plan, on_node) == host_diff(plan, on_node)
    same = host_diff(plan, on_node)
    assert same.files == () and same.restarts == ()

    decode_unit = "/etc/systemd/system/pdkit-engine-decode.service"
    changed = copy.deepcopy(on_node)
    changed["paths"][decode_unit][4] = "0" * 64  # content differs
    changed["paths"]["/etc/pdkit/nccl.env"][1] = "0644"  # mode differs
    changed["units"]["pdkit-exporter.service"] = ["loaded", "failed", "enabled"]
    d = host_diff(plan, changed)
    assert set(d.files) == {decode_unit, "/etc/pdkit/nccl.env"}
    # nccl.env feeds both engines; the exporter is down
    assert set(d.restarts) == {"pdkit-engine-prefill.service", "pdkit-engine-decode.service", "pdkit-exporter.service"}
    # a new node venv (a pdkit upgrade) restarts pdkit-exporter alone, a new engine environment the
    # engines, even when no file changed
    assert set(host_diff(plan, on_node, new_venvs={"/opt/pdkit/venv"}).restarts) == {"pdkit-exporter.service"}
    assert set(host_diff(plan, on_node, new_venvs={"/opt/pdkit/engine-venv"}).restarts) == {"pdkit-engine-prefill.service", "pdkit-engine-decode.service"}

    # only a host with nothing to do is left alone by the roll (a new venv is something to do)
    assert unchanged_hosts({"a": same, "b": d, "c": host_diff(plan, on_node, new_venvs={"/opt/pdkit/venv"})}) == {"a"}

    text = format_dry_plan([["gpu02"], ["gpu01"]], {"gpu02": d}, ["why"], {"/etc/pdkit/secrets.env"})
    assert "canary: gpu02" in text and "batch 1: gpu01" in text and "version pairing: why" in text
    assert f"file     {decode_unit}" in text and "restart  pdkit-exporter.service" in text
    assert "gpu01: state not read" in text


def test_drain_gauges_and_failure_counters_are_summed_over_labels():
    page = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="0"} 2\n'
        'sglang:num_running_reqs{tp_rank="1"} 1\n'
        "# TYPE sglang:num_transfer_failed_reqs counter\n"
        "sglang:num_transfer_failed_reqs_total 3\n"
    )
    sums = metric_sums(page, ["sglang:num_running_reqs", "sglang:num_transfer_failed_reqs_total", "sglang:num_queue_reqs"])
    assert sums == {"sglang:num_running_reqs": 3.0, "sglang:num_transfer_failed_reqs_total": 3.0, "sglang:num_queue_reqs": 0.0}


def test_release_listing_marks_the_running_and_the_planned_release():
    data = {
        "current": "20260101T000001Z-bbbbbbbbbbbb",
        "releases": [
            {"id": "20260101T000000Z-aaaaaaaaaaaa", "hash": "a" * 64, "time": "2026-01-01T00:00:00+00:00", "command": "x: pyinfra", "files": 9},
            {"id": "20260101T000001Z-bbbbbbbbbbbb", "hash": "b" * 64, "time": "2026-01-01T00:00:01+00:00", "command": "x: pdkit roll", "files": 9},
        ],
    }
    lines = format_releases("gpu01", data, "a" * 64).splitlines()
    assert lines[1].startswith("  plan 20260101T000000Z-aaaaaaaaaaaa")
    assert lines[2].startswith("*      20260101T000001Z-bbbbbbbbbbbb")


def test_a_node_is_not_taken_out_when_no_other_worker_of_its_kind_could_serve(tmp_path, three_nodes):
    import io

    from pdkit.clients.router_api import Worker
    from pdkit.roll.roller import Progress, Roller

    spec = _one_router_over_every_engine(tmp_path, three_nodes)
    roller = Roller("inv.py", spec, Progress(io.StringIO()))

    class Router:
        base_url = "http://10.9.0.1:8000"

        def __init__(self, listed):
            self.listed = listed

        def workers(self):
            return self.listed

    def worker(ip, port, kind, healthy=True, status="ready"):
        return Worker(f"{ip}-{port}", f"http://{ip}:{port}", kind, None, healthy, status)

    everyone = [worker(f"10.9.0.{i}", p, k) for i in (1, 2, 4) for p, k in ((30000, "prefill"), (30001, "decode"))]
    router = Router(everyone)
    roller._routers = [(spec.host("gpu01"), router)]
    roller.circuit_states = lambda _host: {}
    assert roller.others_can_serve(["gpu02"]) is None
    # the other prefills: one unhealthy, one with its circuit open -> gpu02's prefill must stay
    router.listed = [w if w.url != "http://10.9.0.1:30000" else worker("10.9.0.1", 30000, "prefill", healthy=False) for w in everyone]
    roller.circuit_states = lambda _host: {"http://10.9.0.4:30000": 1.0}
    why = roller.others_can_serve(["gpu02"])
    assert why and "no usable prefill worker" in why and "http://10.9.0.4:30000 (circuit open)" in why
    # a half-open circuit may take a trial request: usable
    roller.circuit_states = lambda _host: {"http://10.9.0.4:30000": 2.0}
    assert roller.others_can_serve(["gpu02"]) is None
    # sglang-router 0.3.2 (SGLang 0.5.17's router) lists no status: its healthy workers serve
    roller.circuit_states = lambda _host: {}
    router.listed = [worker(f"10.9.0.{i}", p, k, status="") for i in (1, 2, 4) for p, k in ((30000, "prefill"), (30001, "decode"))]
    assert roller.others_can_serve(["gpu02"]) is None
    router.listed = [w if w.url != "http://10.9.0.1:30001" else worker("10.9.0.1", 30001, "decode", healthy=False, status="") for w in router.listed]
    router.listed = [w for w in router.listed if w.url != "http://10.9.0.4:30001"]
    why = roller.others_can_serve(["gpu02"])
    assert why and "no usable decode worker (others: http://10.9.0.1:30001 (unhealthy))" in why


def test_a_rolled_batch_runs_with_node_drained_and_a_plain_deploy_does_not(tmp_path, three_nodes):
    """roles/nvidia_driver.py reboots a `reboot: when-drained` node only when node_drained is set:
    the roll sets it (its deploy runs after the drain gate), pyinfra's own loader does not."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from pdkit.roll.pyinfra_api import roll_inventory

    cluster, hosts = three_nodes
    path = str(write_inventory(tmp_path, hosts, cluster))
    # pyinfra loads an inventory with a State in context, as the roll's _state does
    with ctx_state.use(State(check_for_changes=False)):
        rolled = roll_inventory(path)
        plain = make_inventory(path, cwd=str(REPO))
    for name in ("gpu01", "gpu02"):
        assert rolled.get_host(name).data.get("node_drained") is True
        assert plain.get_host(name).data.get("node_drained") is None


def test_engines_restarting_together_count_once():
    from pdkit.roll.planning import covered_seconds

    assert covered_seconds([]) == 0
    assert covered_seconds([(0, 1_000_000)]) == 1.0
    # prefill and decode restarted together: 0-1.5 s and 0.2-1.6 s -> 1.6 s, not 2.9 s
    assert covered_seconds([(200_000, 1_600_000), (0, 1_500_000)]) == 1.6
    # one after the other, with a gap: both counted, the gap not
    assert covered_seconds([(0, 1_000_000), (3_000_000, 4_500_000)]) == 2.5
    assert covered_seconds([(0, 5_000_000), (1_000_000, 2_000_000)]) == 5.0


def test_open_breakers_names_only_readded_workers_with_an_open_circuit():
    from pdkit.roll.planning import open_breakers

    states = {"http://a:1": 0.0, "http://b:1": 1.0, "http://c:1": 2.0, "http://d:1": 1.0}
    assert open_breakers(states, ["http://a:1/", "http://b:1", "http://c:1"]) == ["http://b:1"]
    assert open_breakers({}, ["http://a:1"]) == []  # no gauge (sglang-router 0.3.2): /workers decides


def test_the_last_line_never_claims_a_restore_when_nothing_was_changed():
    from pdkit.roll.planning import RollError, stop_summary

    cut = RollError("lab-gpu3", "connect", "cannot reach it over SSH (timed out); nothing was changed on it")
    cut.restored = False
    line = stop_summary(cut, ["lab-gpu1"])
    assert "back on its previous release" not in line
    assert line == "pdkit roll: lab-gpu3 could not be reached: nothing was changed on it; not touched: lab-gpu1"
    applied = RollError("lab-gpu2", "apply", "x")
    applied.restored = True
    assert "lab-gpu2 is back on its previous release" in stop_summary(applied, [])
    drained = RollError("lab-gpu2", "drain", "would leave no usable decode worker")
    drained.restored = False
    assert "nothing was applied" in stop_summary(drained, [])


def test_why_prefers_the_gates_own_line_over_pyinfras_noise():
    from pdkit.roll.pyinfra_api import _why

    lines = [
        "[lab-gpu2] Error: executed 1 commands",
        "[lab-gpu2] usage: launch_server.py [-h] --model-path MODEL_PATH",
        "[lab-gpu2] FAILED pdkit-engine-decode.service failed at its first start: launch_server.py: error: argument --port: invalid int value: 'x' (0.4 s)",
        "[lab-gpu2] ok     pdkit-engine-prefill.service ready",
        "No hosts remaining!",
    ]
    assert _why(lines, "lab-gpu2") == "pdkit-engine-decode.service failed at its first start: launch_server.py: error: argument --port: invalid int value: 'x' (0.4 s)"
    assert _why(["[lab-gpu1] something else"], "lab-gpu1") == "[lab-gpu1] something else"


# ---------------------------------------------------------------- issue 20: engines spanning nodes


def _spanning_decode(tmp_path, three_nodes):
    """gpu02's decode spans gpu02 and gpu03 (gpu03 runs rank 1 on its GPUs 2-3 and its own prefill)."""
    cluster, hosts = three_nodes
    hosts["gpu03"]["pdkit_node"]["engines"] = [hosts["gpu03"]["pdkit_node"]["engines"][0]]
    hosts["gpu03"]["pdkit_node"]["engines"][0]["pd_group"] = "g2"
    hosts["gpu02"]["pdkit_node"]["engines"][1].update(nodes=["gpu02", "gpu03"], dist_init_port=25000, tp=4)
    for h in ("gpu02", "gpu03"):
        hosts[h]["pdkit_node"].update(nic="eth0", nccl_net="socket", ucx_net_devices="eth0")
    return _spec(tmp_path, hosts, cluster)


def test_a_spanning_engine_is_one_unit_of_rollout(tmp_path, three_nodes):
    from pdkit.roll.planning import merge_units, spanning_units

    spec = _spanning_decode(tmp_path, three_nodes)
    units, lines = spanning_units(spec)
    assert units == [{"gpu02", "gpu03"}]
    assert lines == ["engine gpu02/decode spans gpu02, gpu03: one step (rank 0 on gpu02 drained from the router, every rank "
                     "restarted together, gated on rank 0 and a real request, every rank rolled back on failure)"]
    order = rollout_order(spec)
    assert order[0] == "gpu02"
    # --batch 1: the canary batch still holds every rank; gpu03 never rolls on its own
    batches = make_batches(order, 1, units)
    assert batches[0] == ["gpu02", "gpu03"] and all("gpu03" not in b for b in batches[1:])
    assert make_batches(rollout_order(spec, canary="gpu03"), 1, units)[0] == ["gpu03", "gpu02"]
    # overlapping units (a version pairing touching one rank's host) merge into one
    merged, _ = merge_units(([{"gpu03", "gpu01"}], ["x"]), (units, lines))
    assert merged == [{"gpu01", "gpu02", "gpu03"}]


def test_dry_plan_shows_a_spanning_engine_as_one_step_over_its_nodes(tmp_path, three_nodes):
    from pdkit.roll.planning import spanning_units

    spec = _spanning_decode(tmp_path, three_nodes)
    units, lines = spanning_units(spec)
    plans = plan_cluster(spec)
    diffs = {h: host_diff(p, {}) for h, p in plans.items()}
    text = format_dry_plan(make_batches(rollout_order(spec), 1, units), diffs, lines, set())
    assert "spans nodes: engine gpu02/decode spans gpu02, gpu03: one step" in text
    assert "canary: gpu02, gpu03" in text
    assert "restart  pdkit-engine-decode.service" in text.split("canary: gpu02, gpu03")[1].split("batch 1")[0]


class _FakePyinfra:
    """Stands in for the SSH side: records every call; CONNECT_FAILS hosts are unreachable."""

    def __init__(self, unreachable=()):
        self.unreachable = set(unreachable)
        self.calls = []
        self.phases, self.operations = {}, {}

    def connect(self, hosts):
        self.calls.append(("connect", tuple(hosts)))
        bad = {h: "timed out" for h in hosts if h in self.unreachable}
        return object(), {h: object() for h in hosts if h not in bad}, bad

    def prepare(self, hosts, state):
        self.calls.append(("prepare", tuple(hosts)))
        return {}

    def execute(self, hosts, state):
        self.calls.append(("execute", tuple(hosts)))
        return {}


def test_an_unreachable_rank_node_stops_the_roll_before_any_rank_changes(tmp_path, three_nodes):
    import io

    from pdkit.roll.planning import RollError, spanning_units
    from pdkit.roll.roller import Progress, Roller

    spec = _spanning_decode(tmp_path, three_nodes)
    out = io.StringIO()
    roller = Roller("inv.py", spec, Progress(out))
    roller.pyinfra = _FakePyinfra(unreachable={"gpu03"})
    drained = []
    roller.drain = lambda hosts: drained.append(hosts) or "drained"
    units, _ = spanning_units(spec)
    [batch, *_] = make_batches(rollout_order(spec), 1, units)
    with pytest.raises(RollError) as exc:
        roller.roll_batch(batch)
    assert exc.value.host == "gpu03" and exc.value.gate == "connect" and "nothing was changed" in exc.value.message
    # no rank was touched: not drained, nothing prepared or executed on gpu02 (rank 0) or gpu03
    assert roller.pyinfra.calls == [("connect", ("gpu02", "gpu03"))] and drained == []


def test_a_failed_spanning_batch_restores_every_rank_together(tmp_path, three_nodes):
    """A gate failing after the apply: every rank's node goes back byte for byte, at the same
    time (rank 0 is ready only when every rank joined, so one-by-one restores would wait on a
    rank still on the failed release)."""
    import io
    import threading

    from pdkit.roll.planning import RollError, spanning_units
    from pdkit.roll.roller import Progress, Roller

    spec = _spanning_decode(tmp_path, three_nodes)
    roller = Roller("inv.py", spec, Progress(io.StringIO()))
    roller.pyinfra = _FakePyinfra()
    roller.current_releases = lambda state, hosts: ({h: f"rel-{h}" for h in hosts}, {h: None for h in hosts})
    roller.drain = lambda hosts: "drained"
    roller.ready = lambda hosts: (_ for _ in ()).throw(TimeoutError("rank 0 not healthy"))
    roller.readd = lambda hosts: "back"
    both_in = threading.Barrier(2, timeout=5)
    restored = []

    def restore(host_name, host, to):
        both_in.wait()  # each restore waits for the other rank's: they must run together
        restored.append((host_name, to))
        return f"back on {to}"

    roller.restore = restore
    units, _ = spanning_units(spec)
    with pytest.raises(RollError) as exc:
        roller.roll_batch(["gpu02", "gpu03"])
    assert exc.value.gate == "ready"
    assert sorted(restored) == [("gpu02", "rel-gpu02"), ("gpu03", "rel-gpu03")]


# ---------------------------------------------------------------- downtime mode (--allow-downtime)

from pdkit.clients.router_api import worker_type  # noqa: E402
from pdkit.roll.planning import (  # noqa: E402 - grouped with the tests that use them
    expected_outage,
    outage_lines,
    refusal_text,
    rerun_with_downtime,
    restart_to_ready,
)
from pdkit.roll.roller import Progress, Roller  # noqa: E402


def test_the_users_one_box_loses_both_kinds_on_every_roll_and_the_monitoring_host_none():
    spec = load(str(REPO / "inventories" / "cluster.py"))
    [outage] = batch_outages(spec, ["gpu01"])
    assert outage.router == "gpu01" and outage.kinds == ("decode", "prefill")
    assert outage.url.startswith("http://") and outage.url.endswith(f":{spec.host('gpu01').router.port}")
    assert batch_outages(spec, [h.name for h in spec.hosts if h.name != "gpu01"]) == []


def test_a_unified_box_loses_its_regular_workers():
    spec = load(str(REPO / "inventories" / "a6000.py"))
    assert [o.kinds for o in batch_outages(spec, ["ct129"])] == [("regular",)]


def test_one_router_over_three_nodes_loses_nothing_per_node_and_everything_at_once(tmp_path, three_nodes):
    spec = _one_router_over_every_engine(tmp_path, three_nodes)
    for host in ("gpu01", "gpu02", "gpu03"):
        assert batch_outages(spec, [host]) == [], host
    [outage] = batch_outages(spec, ["gpu01", "gpu02", "gpu03"])
    assert outage.kinds == ("decode", "prefill")
    # two of three: the third node's workers still serve
    assert batch_outages(spec, ["gpu01", "gpu02"]) == []


def test_a_router_fronting_only_its_own_node_is_an_outage_for_that_node_only(tmp_path, three_nodes):
    spec = _spec(tmp_path, three_nodes[1], three_nodes[0])
    assert [(o.router, o.kinds) for o in batch_outages(spec, ["gpu01"])] == [("gpu01", ("decode", "prefill"))]
    assert batch_outages(spec, ["gpu02"]) == [] and batch_outages(spec, ["gpu03"]) == []


def test_expected_outage_is_the_slowest_measured_restart_else_the_ready_timeout():
    seconds, source = expected_outage({"a": 41.5, "b": 73.0, "c": None}, ["a", "b", "c"], 600)
    assert seconds == 73.0 and "last measured on b" in source
    seconds, source = expected_outage({"a": None}, ["a"], 600)
    assert seconds == 600 and "ready_timeout_s" in source
    assert expected_outage({}, ["z"], 120)[0] == 120


# a node's start history of one engine (pdkit/agent/enginestarts.py), oldest first: the first start on
# its engine environment (cold), a warm restart of class A, a warm restart of class B
_HISTORY = [
    {"invocation": "i1", "time": "t1", "restart_to_ready_s": 205.0, "engine_env": "/opt/pdkit/venvs/engine-aa",
     "config_class": "A", "warm": False},
    {"invocation": "i2", "time": "t2", "restart_to_ready_s": 71.0, "engine_env": "/opt/pdkit/venvs/engine-aa",
     "config_class": "A", "warm": True},
    {"invocation": "i3", "time": "t3", "restart_to_ready_s": 84.0, "engine_env": "/opt/pdkit/venvs/engine-aa",
     "config_class": "B", "warm": True},
]


def test_the_announcement_is_the_last_warm_restart_of_the_class_the_engine_will_have():
    """Issue 45 item 1: the cold first start (205 s) and another class's warm restart (84 s, the
    last start, which the node-level figure reads) are not what a warm restart of class A costs."""
    from pdkit.roll.planning import engine_estimate

    seconds, source = engine_estimate(_HISTORY, "A")
    assert seconds == 71.0 and "same configuration class" in source and "t2" in source
    # a class never run warm: the last warm restart of any class, labelled so
    seconds, source = engine_estimate(_HISTORY, "C")
    assert seconds == 84.0 and "ANOTHER configuration class" in source
    # nothing warm yet: none (the caller falls back to the node's last restart)
    assert engine_estimate(_HISTORY[:1], "A") is None and engine_estimate([], "A") is None
    # a new engine environment: the restart is a first, cold one
    seconds, source = engine_estimate(_HISTORY, "A", new_env=True)
    assert seconds == 205.0 and "new engine environment" in source
    assert engine_estimate(_HISTORY[1:], "A", new_env=True) is None


def test_expected_outage_takes_the_slowest_engine_estimate_and_falls_back_per_host():
    estimates = {"gpu01": {"pdkit-engine-decode.service": (71.0, "its last warm restart with the same class"),
                           "pdkit-engine-prefill.service": (40.0, "its last warm restart with the same class")}}
    # the node-level figure (the last start, whatever it was: 205 s cold) no longer decides
    seconds, source = expected_outage({"gpu01": 205.0}, ["gpu01"], 600, estimates)
    assert seconds == 71.0 and source.startswith("decode on gpu01: its last warm restart"), source
    # an engine without an estimate: its host's last measured restart counts as well
    estimates["gpu01"]["pdkit-engine-prefill.service"] = None
    seconds, source = expected_outage({"gpu01": 205.0}, ["gpu01"], 600, estimates)
    assert seconds == 205.0 and "last measured on gpu01" in source
    # no history and no measure: the ready timeout, as before
    assert expected_outage({}, ["gpu01"], 600, {"gpu01": {"pdkit-engine-decode.service": None}})[0] == 600
    [line] = outage_lines([["gpu01"]], {0: [Outage("gpu01", "http://10.0.0.1:8000", ("decode",))]}, {"gpu01": 205.0},
                          600, {"gpu01": {"pdkit-engine-decode.service": (71.0, "its last warm restart")}})
    assert "~71 s (decode on gpu01: its last warm restart)" in line, line


def test_the_planned_class_is_the_one_the_node_records_for_the_same_files(tmp_path):
    """The roll computes an engine's class after the change from the plan; the gate records it from
    the files on disk: the same bytes give the same class, and a start-cost change another one."""
    from pdkit.agent.enginestarts import config_class, unit_argv_env
    from pdkit.roll.planning import host_estimates, planned_classes

    spec = load(str(REPO / "inventories" / "lab-one-node.py"))
    plan = plan_cluster(spec)["lab-gpu1"]
    classes = planned_classes(plan)
    engines = [s for s in plan.services if s.kind == "engine"]
    assert set(classes) == {s.unit for s in engines} and len(set(classes.values())) == len(engines)
    for f in plan.files:  # the node's copy
        (tmp_path / f.path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f.path.lstrip("/")).write_text(f.content)
    unit = engines[0].unit
    on_disk = (tmp_path / f"etc/systemd/system/{unit}").read_text()
    argv, env = unit_argv_env(on_disk, lambda p: (tmp_path / p.lstrip("/")).read_text())
    assert argv[1:3] == ["-m", "pdkit.sim"] and env and config_class(argv, env) == classes[unit]
    # what does not change the start cost (the port) keeps the class; a start-cost flag does not
    moved = [a if a != argv[argv.index("--port") + 1] else "31999" for a in argv]
    assert config_class(moved, env) == classes[unit]
    assert config_class([*argv, "--cuda-graph-max-bs", "96"], env) != classes[unit]
    # the roll's estimates: the engines the change restarts, from the node's history of each
    history = {unit: [{**e, "config_class": classes[unit] if e["config_class"] == "A" else e["config_class"]}
                      for e in _HISTORY]}
    diff = HostDiff("lab-gpu1", ("/etc/x",), (unit,))
    assert host_estimates(plan, diff, history)[unit][0] == 71.0 and len(host_estimates(plan, diff, history)) == 1
    new_env = HostDiff("lab-gpu1", ("/etc/x",), (unit,), True, (), (engines[0].venv,))
    assert host_estimates(plan, new_env, history)[unit][0] == 205.0


def test_outage_lines_and_refusal_name_the_batch_router_kinds_figure_and_the_command(tmp_path):
    outages = {0: [Outage("gpu01", "http://10.0.0.1:8000", ("decode", "prefill"))]}
    [line] = outage_lines([["gpu01"], ["mon01"]], outages, {"gpu01": 74.4}, 600)
    for part in ("canary gpu01", "router on gpu01", "http://10.0.0.1:8000", "no decode or prefill worker", "~74 s", "last measured on gpu01"):
        assert part in line, (part, line)
    import argparse

    args = argparse.Namespace(command="roll", inventory="inventories/cluster.py", limit=["gpu01"], canary=None, batch=1)
    rerun = rerun_with_downtime(args)
    assert rerun == "pdkit roll inventories/cluster.py --limit gpu01 --allow-downtime"
    text = refusal_text("roll", rerun, [line])
    assert text.startswith("pdkit roll: refused, nothing was changed") and line in text and rerun in text
    back = argparse.Namespace(command="rollback", inventory="inv.py", host="gpu01", to="2026")
    assert rerun_with_downtime(back) == "pdkit rollback inv.py gpu01 --to 2026 --allow-downtime"


def test_restart_to_ready_counts_the_stop_of_this_restart_and_the_start_to_the_ready_line():
    s = 1_000_000
    # restarted: left active at 10 s, inactive at 12 s, started at 12 s, ready at 50 s -> 40 s
    # first start after boot: no stop, started at 5 s, ready at 25 s -> 20 s
    # a stop long before a later start is not part of this start: started 200 s, ready 230 s -> 30 s
    units = {"a": [10 * s, 50 * s, 12 * s, 12 * s], "b": [0, 25 * s, 0, 5 * s], "c": [10 * s, 230 * s, 11 * s, 200 * s], "d": [0, None, 0, 3 * s]}
    assert restart_to_ready(units) == 40.0
    assert restart_to_ready({"c": units["c"]}) == 30.0
    assert restart_to_ready({"d": units["d"]}) is None
    # the older probe's two-value rows are still read (no start known: skipped)
    assert restart_to_ready({"e": [1, 2]}) is None


def test_worker_type_is_the_routers_vocabulary():
    assert [worker_type(r) for r in ("prefill", "decode", "unified")] == ["prefill", "decode", "regular"]


def test_the_drain_refuses_an_outage_it_was_not_told_to_accept_before_touching_a_router():
    spec = load(str(REPO / "inventories" / "cluster.py"))
    roller = Roller("inventories/cluster.py", spec, Progress())
    roller._routers = []  # any router call would fail the test: none may be made
    with pytest.raises(RuntimeError, match=r"would have no decode or prefill worker; nothing was removed \(--allow-downtime"):
        roller.drain(["gpu01"])


class _FakeRouter:
    """Records the worker API calls a Roller makes; every worker healthy at once."""

    base_url = "http://fake:8000"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def workers(self):
        return []

    def remove(self, url, settle_s=None):
        self.calls.append(("remove", url, settle_s))

    def add(self, url, kind, bootstrap_port=None, timeout=60):
        self.calls.append(("add", url, kind, bootstrap_port, timeout))

    def wait_healthy(self, urls, timeout=60):
        self.calls.append(("wait_healthy", tuple(urls)))


def _downtime_roller(monkeypatch, inventory: str, router_host: str):
    """A Roller told to accept downtime, talking to a _FakeRouter; engines idle, breakers closed."""
    spec = load(str(REPO / "inventories" / inventory))
    roller = Roller(f"inventories/{inventory}", spec, Progress(), allow_downtime=True)
    fake = _FakeRouter()
    roller._routers = [(spec.host(router_host), fake)]
    monkeypatch.setattr(roller, "scrape", lambda urls, names, missing_ok=(): {k: {n: 0.0 for n in names} for k in urls})
    monkeypatch.setattr(roller, "circuit_states", lambda host: {})
    # the router step's own gate runs on the node (pdkit/agent/gates.py): recorded here
    monkeypatch.setattr(roller, "run_gates", lambda hosts, phase: (fake.calls.append(("gates", tuple(hosts), phase)), (0, []))[1])
    return spec, roller, fake


def test_an_accepted_outage_drains_readds_unified_engines_as_regular_and_times_the_outage(monkeypatch):
    spec, roller, fake = _downtime_roller(monkeypatch, "a6000.py", "ct129")
    roller.restart_s = {"ct129": 20.0}
    assert "1 worker(s) out of the router" in roller.drain(["ct129"])
    assert roller.outage_since is not None
    message = roller.readd(["ct129"])
    assert [c[0] for c in fake.calls] == ["remove", "add", "wait_healthy", "gates"] and fake.calls[-1] == ("gates", ("ct129",), 1)
    # smg answers 404 with no regular worker listed: the last one is held draining (503 +
    # Retry-After) for 1.5 x the measured 20 s restart + 10 s, and the re-add waits that out too
    assert fake.calls[0][2] == 40 and fake.calls[1][4] == roller.router_timeout_s + 40
    assert fake.calls[1][2] == "regular" and fake.calls[1][3] is None and roller.held_s == 0
    assert "outage" in message and roller.last_outage_s is not None and roller.outage_since is None


def test_decodes_leave_the_router_first_and_come_back_last(monkeypatch):
    spec, roller, fake = _downtime_roller(monkeypatch, "cluster.py", "gpu01")
    roller.drain(["gpu01"])
    roller.readd(["gpu01"])
    urls = {e.role: f":{e.port}" for _, e in spec.engines()}
    removed = [c[1] for c in fake.calls if c[0] == "remove"]
    assert [c[2] for c in fake.calls if c[0] == "remove"] == [None, None]  # PD: nothing held, smg's 503 needs none
    added = [(c[1], c[2]) for c in fake.calls if c[0] == "add"]
    assert [u.endswith(urls["decode"]) for u in removed] == [True, False], removed
    assert [kind for _, kind in added] == ["prefill", "decode"], added
    prefill = next(e for _, e in spec.engines() if e.role == "prefill")
    assert next(c[3] for c in fake.calls if c[0] == "add" and c[2] == "prefill") == prefill.effective_bootstrap_port


def test_validate_summary_says_which_node_is_an_outage_to_change():
    from pdkit.inventory.summary import summary

    one_box = summary(load(str(REPO / "inventories" / "cluster.py")))
    assert "    every decode and prefill worker is on gpu01: a change there is an outage (pdkit roll --allow-downtime" in one_box, one_box
    assert "every regular worker is on ct129" in summary(load(str(REPO / "inventories" / "a6000.py")))
    assert "a change there is an outage" not in summary(load(str(REPO / "inventories" / "lab.py")))


def test_the_hold_follows_the_measured_restart_and_has_bounds():
    spec = load(str(REPO / "inventories" / "a6000.py"))
    roller = Roller("inventories/a6000.py", spec, Progress())
    assert roller.hold_settle_s(["ct129"]) == 60  # nothing measured
    roller.restart_s = {"ct129": 3.2}
    assert roller.hold_settle_s(["ct129"]) == 15
    roller.restart_s = {"ct129": 900.0}
    assert roller.hold_settle_s(["ct129"]) == 600
    assert roller.held_kinds(batch_outages(spec, ["ct129"])) == {("ct129", "regular")}
    one_box = load(str(REPO / "inventories" / "cluster.py"))
    assert Roller("inventories/cluster.py", one_box, Progress()).held_kinds(batch_outages(one_box, ["gpu01"])) == set()


def test_the_last_line_says_whether_the_engines_are_back_in_the_router():
    """Issue 30 item 4: after 'could not add the engines back' the last line claimed they were back."""
    from pdkit.roll.planning import RollError, stop_summary

    failed = RollError("lab-gpu1", "drain", "router refuses every API key")
    failed.restored, failed.readded = False, None
    assert "nothing was taken out of the router" in stop_summary(failed, []) and "back in the router" not in stop_summary(failed, [])
    failed.readded = False
    assert "its engines are NOT back in the router" in stop_summary(failed, [])
    failed.readded = True
    assert "its engines are back in the router" in stop_summary(failed, [])
    applied = RollError("lab-gpu2", "apply", "x")
    applied.restored, applied.readded = True, False
    assert "back on its previous release" in stop_summary(applied, []) and "NOT back in the router" in stop_summary(applied, [])


def test_a_roll_tries_the_running_routers_key_then_the_inventorys_then_none(tmp_path):
    from pdkit.clients.router_api import Key
    from pdkit.roll.planning import key_fix, parse_running_key, router_keys

    def spec_with(key):
        # inventories/cluster.py runs without a key (auth: none): a keyed one drops that
        body = ("" if key is None else f"_cluster['secrets'] = {{'router_api_key': {key!r}}}\n"
                "gpu_nodes[0][1]['pdkit_router'].pop('auth')")
        path = tmp_path / f"inv_{key}.py"
        path.write_text(
            "import copy, runpy\n"
            f"_base = runpy.run_path({str(REPO / 'inventories' / 'cluster.py')!r})\n"
            "gpu_nodes = _base['gpu_nodes']\nmonitoring = _base.get('monitoring', [])\n"
            "_hosts, _data = _base['all']\n_cluster = copy.deepcopy(_data['pdkit_cluster'])\n"
            f"{body}\nall = (_hosts, {{'pdkit_cluster': _cluster}})\n"
        )
        return load(str(path))

    rotated = router_keys(spec_with("new-key"), parse_running_key("key\nold-key\n"))
    assert [(k.value, k.source) for k in rotated] == [
        ("old-key", "the key the running router was started with"), ("new-key", "pdkit_cluster.secrets.router_api_key"), (None, "no key")]
    added = router_keys(spec_with("new-key"), parse_running_key("none\n"))
    assert [k.value for k in added] == [None, "new-key"]
    removed = router_keys(spec_with(None), parse_running_key("key\nold-key"))
    assert [k.value for k in removed] == ["old-key", None]
    # not read (router down, host unreachable): the inventory's key, then none
    assert [k.value for k in router_keys(spec_with("new-key"), None)] == ["new-key", None]
    assert parse_running_key("inactive\n") is None and parse_running_key("") is None and parse_running_key("key\n") is None
    labels = " ".join(k.label for k in rotated)
    assert Key("s3cr3t", "x").label == "x" and "old-key" not in labels and "new-key" not in labels and labels.endswith("no key")
    fix = key_fix("inventories/lab.py", "lab-gpu1")
    assert "pyinfra inventories/lab.py deploy/pd.py --limit lab-gpu1" in fix and "pdkit_cluster.secrets.router_api_key" in fix


def test_the_connect_gate_tries_an_unreachable_host_three_times(tmp_path):
    """CONNECT_ATTEMPTS SSH connections to a host that refuses them, not more (the roll made 5:
    connect_all on every round plus a retry between). In a child: pyinfra's API gevent-patches."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused at once
    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = [('dead', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}})]\n")
    code = (
        "import json, sys\n"
        "from pyinfra.connectors.ssh import SSHConnector\n"
        "calls = []\n"
        "real = SSHConnector.connect\n"
        "def counting(self, *a, **k):\n"
        "    calls.append(1)\n"
        "    return real(self, *a, **k)\n"
        "SSHConnector.connect = counting\n"
        "from pdkit.roll.pyinfra_api import CONNECT_ATTEMPTS, Pyinfra\n"
        f"_, connected, failed = Pyinfra({str(inv)!r}).connect(['dead'])\n"
        "print(json.dumps({'calls': len(calls), 'attempts': CONNECT_ATTEMPTS, 'failed': sorted(failed)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failed"] == ["dead"]
    assert result["calls"] == result["attempts"] == 3, result


def test_waiting_on_requests_is_not_booked_as_kit_overhead():
    """Issue 30 item 2: a smoke step that waited 20 s on a node cut off elsewhere was reported as
    the kit's own overhead. The drain's wait for requests and the smoke answers are booked apart."""
    from pdkit.roll.commands import report
    from pdkit.roll.roller import NodeTiming

    t = NodeTiming("gpu01", total_s=60.0, engines=2, engines_restart_to_ready_s=30.0,
                   steps={"drain": 6.0, "smoke": 20.5}, waited={"drain": 5.0, "smoke": 20.5})
    assert t.overhead_s == pytest.approx(4.5)
    line = t.summary()
    assert "waited on requests 25.5 s (drain 5.0 s, smoke 20.5 s)" in line and line.endswith("kit overhead 4.5 s")
    node = report([t])["nodes"][0]
    assert node["overhead_s"] == 4.5 and node["waited_s"] == {"drain": 5.0, "smoke": 20.5}
    # a clock skew between the node's journal and the roll never yields a negative overhead
    assert NodeTiming("gpu01", total_s=10.0, engines_restart_to_ready_s=9.0, waited={"smoke": 3.0}).overhead_s == 0.0


def test_the_names_tests_patch_are_looked_up_where_they_patch_them():
    """tests/test_gates.py and tests/test_silences.py patch run_remote, Pyinfra, read_node_state and
    measure_restarts on the module of pdkit/roll/ whose code calls them: a patch on another module
    (pdkit.roll.pyinfra_api.run_remote) would not reach that code, and the test would silently stop testing."""
    import ast

    from pdkit.roll import commands, roller

    for module, names in ((roller, ("run_remote", "Pyinfra")), (commands, ("read_node_state", "measure_restarts"))):
        tree = ast.parse(open(module.__file__, encoding="utf-8").read())
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for name in names:
            assert name in vars(module) and name in called, (module.__name__, name)
