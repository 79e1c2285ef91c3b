"""pyinfra's own flags with pdkit (issue #18 items 2-5): --serial's router order, --dry's per-host list,
--diff, --limit's warning. Pure parts here; the lab runs them for real (tests/lab/test_deploy_flags_lab.py)."""

from __future__ import annotations

import copy

import pytest

from pdkit.agent.health import router_verdict
from pdkit.clients.router_api import Worker
from pdkit.hosts.limitwarn import limit_warnings
from pdkit.hosts.routersync import PlannedWorker, routers_for_host, sync_actions
from pdkit.inventory.loader import load
from pdkit.render.plan import PlannedFile, plan_cluster
from roles.install_files import change_summary, diff_lines, install_commands
from roles.services import router_gate_command
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory

P1, D1, P2, D2 = "http://h1:30000", "http://h1:30001", "http://h2:30000", "http://h2:30001"

VERDICTS = [
    # (what, listed url->healthy, remote workers answering their /health) -> verdict, pending
    ("all healthy", {P1: True, D1: True, P2: True, D2: True}, {P2, D2}, "ready", []),
    ("a local worker unhealthy: wait", {P1: True, D1: False, P2: True, D2: True}, {P2, D2}, "waiting", []),
    ("a remote host not deployed yet (--serial reached the router first): pending, not a failure",
     {P1: True, D1: True, P2: False}, set(), "pending", [P2, D2]),
    ("a remote worker that answers must be healthy in the router", {P1: True, D1: True, P2: True, D2: False}, {P2, D2}, "waiting", []),
    ("a remote worker up but not listed: wait for it", {P1: True, D1: True, P2: True}, {P2, D2}, "waiting", []),
    ("a local worker missing is never pending", {D1: True}, {P2, D2}, "waiting", []),
]


@pytest.mark.parametrize(("what", "listed", "answering", "verdict", "pending"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_router_gate_verdict(what, listed, answering, verdict, pending):
    got, _, _, got_pending = router_verdict({P1, D1, P2, D2}, {P2, D2}, listed, answering)
    assert (got, got_pending) == (verdict, pending), what


def _worker(url, kind="decode", healthy=True):
    return Worker(id=url, url=url, worker_type=kind, bootstrap_port=None, healthy=healthy, status="ready")


def test_sync_registers_missing_workers_and_takes_out_this_hosts_stale_ones():
    listed = [_worker(P1, "prefill"), _worker(D1), _worker(P2, "prefill"), _worker("http://h2:30009", healthy=False)]
    planned = [PlannedWorker(P2, "prefill", 8998), PlannedWorker("http://h2:30011", "decode")]
    add, remove = sync_actions(listed, planned, "h2", planned_elsewhere=[P1, D1])
    assert [w.url for w in add] == ["http://h2:30011"]
    assert remove == ["http://h2:30009"]  # a port the plan moved away from; h1's workers are never touched
    # converged: nothing to do
    assert sync_actions([*listed[:3], _worker("http://h2:30011")], planned, "h2", [P1, D1]) == ([], [])


def test_the_router_gate_lets_only_other_hosts_workers_be_pending(tmp_path):
    hosts = copy.deepcopy(BASE_HOSTS)
    # one router over both nodes' pairs (pd_group per node), as in the lab
    hosts["gpu01"] = {**hosts["gpu01"], "pdkit_router": {"workers": ["gpu01/prefill", "gpu01/decode", "gpu02/prefill", "gpu02/decode"]}}
    hosts["gpu02"]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    hosts["gpu01"]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    spec = load(str(write_inventory(tmp_path, hosts, BASE_CLUSTER)))
    router = next(s for s in plan_cluster(spec)["gpu01"].services if s.kind == "router")
    command = router_gate_command("/opt/pdkit/venv/bin/python", router)
    assert "--worker http://10.9.0.1:30000" in command and "--remote-worker http://10.9.0.2:30000" in command
    assert "--worker http://10.9.0.2" not in command
    # gpu02's deploy syncs the router on gpu01; gpu01's own engines are checked by its router gate
    (router_host, mine, others), = routers_for_host(spec, "gpu02")
    assert router_host.name == "gpu01" and {w.url for w in mine} == {"http://10.9.0.2:30000", "http://10.9.0.2:30001"}
    assert {w.worker_type for w in mine} == {"prefill", "decode"} and set(others) == {"http://10.9.0.1:30000", "http://10.9.0.1:30001"}
    assert routers_for_host(spec, "gpu01") == []


def test_limit_warns_about_a_left_out_router_that_fronts_restarted_workers():
    routers = {"gpu01": [("gpu01", P1), ("gpu02", P2), ("gpu02", D2)]}
    lines = limit_warnings(routers, {"gpu02": [D2]}, excluded=["gpu01", "mon01"], inventory="inventories/lab.py")
    assert len(lines) == 1
    assert "router host gpu01" in lines[0] and D2 in lines[0] and P2 not in lines[0]
    assert "pyinfra inventories/lab.py deploy/pd.py --limit gpu01" in lines[0]
    # the router host inside the limit, or nothing it fronts restarted: no warning
    assert limit_warnings(routers, {"gpu02": [D2]}, excluded=["mon01"], inventory="i.py") == []
    assert limit_warnings(routers, {"gpu03": ["http://h3:1"]}, excluded=["gpu01"], inventory="i.py") == []


def test_limit_names_the_monitoring_host_whose_scrape_targets_it_moved_and_one_command_for_all():
    """Issue 30 item 6: Prometheus kept scraping a moved engine's old port; the warning named only the router."""
    from pdkit.hosts.limitwarn import retargeted

    recorded = {"pdkit-engine-decode.service": {"kind": "engine", "health_url": "http://h2:30001/health"},
                "pdkit-engine-prefill.service": {"kind": "engine", "health_url": "http://h2:30000/health"},
                "pdkit-exporter.service": {"kind": "http", "health_url": "http://h2:9400/metrics"},
                "pdkit-router.service": {"kind": "router", "health_url": "http://h2:8000/health"}}
    planned = {"pdkit-engine-decode.service": "http://h2:30011/health", "pdkit-engine-prefill.service": "http://h2:30000/health",
               "pdkit-exporter.service": "http://h2:9400/metrics"}
    moved = retargeted(recorded, planned)
    assert moved == ["pdkit-engine-decode.service: h2:30001 -> h2:30011"]
    # a restart on the same addresses moves nothing: Prometheus is not stale
    assert retargeted(recorded, {**planned, "pdkit-engine-decode.service": "http://h2:30001/health"}) == []
    assert retargeted({}, {"pdkit-exporter.service": "http://h2:9400/metrics"}) == ["pdkit-exporter.service: new at h2:9400"]
    routers = {"gpu01": [("gpu01", P1), ("gpu02", P2), ("gpu02", "http://h2:30011")]}
    lines = limit_warnings(routers, {"gpu02": ["http://h2:30011"]}, excluded=["gpu01", "mon01"], inventory="inventories/lab.py",
                           scrapers={"mon01": ["gpu01", "gpu02", "mon01"]}, changed={"gpu02": moved})
    assert len(lines) == 3, lines
    assert "router host gpu01" in lines[0]
    assert "monitoring host mon01" in lines[1] and "gpu02: pdkit-engine-decode.service: h2:30001 -> h2:30011" in lines[1]
    assert "pyinfra inventories/lab.py deploy/pd.py --limit mon01" in lines[1]
    assert lines[2] == "pdkit: to bring every host left stale in line at once: pyinfra inventories/lab.py deploy/pd.py --limit gpu01 --limit mon01"
    # the monitoring host inside the limit, or no address moved: no warning about it
    assert not any("monitoring" in ln for ln in limit_warnings(routers, {}, ["gpu01"], "i.py", {"mon01": ["gpu02"]}, {"gpu02": moved}))
    assert limit_warnings({}, {"gpu02": [D2]}, ["mon01"], "i.py", {"mon01": ["gpu02"]}, {"gpu02": []}) == []


def test_each_host_names_its_own_files_and_secrets_are_only_named():
    a = [PlannedFile("/etc/pdkit/engines/decode.env", "X=1\n"), PlannedFile("/etc/pdkit/secrets.env", "HF_TOKEN=hf_s3cret\n", "0600", secret=True)]
    assert change_summary(a) == "2 file(s) to write: /etc/pdkit/engines/decode.env, /etc/pdkit/secrets.env (secret)"
    assert change_summary([], ["/etc/pdkit/router-api-key"]) == "1 no longer planned, to remove: /etc/pdkit/router-api-key"
    assert change_summary([]) == "no file to change"


def test_diff_is_unified_for_text_and_never_shows_a_secret():
    unit = PlannedFile("/etc/systemd/system/pdkit-engine-decode.service", "a\n--port 30002\nc\n")
    lines = diff_lines(unit, "a\n--port 30001\nc\n")
    assert lines[0] == "Will modify /etc/systemd/system/pdkit-engine-decode.service"
    assert "---" in lines[1] and "-" + "--port 30001" in lines and "+--port 30002" in lines
    assert diff_lines(unit, None)[0].startswith("Will create")
    secret = PlannedFile("/etc/pdkit/secrets.env", "HF_TOKEN=hf_new\n", "0600", secret=True)
    shown = diff_lines(secret, "HF_TOKEN=hf_old\n")
    assert shown == ["Will modify /etc/pdkit/secrets.env (secret: content not shown)"]
    assert "hf_" not in " ".join(shown)


def test_install_commands_remove_dropped_files_before_the_reload():
    f = PlannedFile("/etc/pdkit/nccl.env", "A=1\n")
    steps = install_commands([f], "/etc/pdkit/.staging", daemon_reload=True, remove=["/etc/systemd/system/pdkit-engine-old.service", "/etc/pdkit/secrets.env"])
    shell = steps[-1]
    assert "rm -f /etc/systemd/system/pdkit-engine-old.service /etc/pdkit/secrets.env" in shell
    assert shell.index("rm -f") < shell.index("systemctl daemon-reload")


NOTES = [
    ("every remote worker healthy", {P2: True, D2: True}, "all 2 worker(s) on other hosts registered and healthy", []),
    ("one host not deployed yet", {P2: False}, "pending", [P2, D2]),
    ("listed but unhealthy is pending too", {P2: True, D2: False}, "pending", [D2]),
]


@pytest.mark.parametrize(("what", "listed", "says", "pending"), NOTES, ids=[n[0] for n in NOTES])
def test_router_host_says_which_remote_workers_are_pending(what, listed, says, pending):
    from pdkit.hosts.routersync import remote_worker_note

    note = remote_worker_note("pdkit-router.service", [D2 + "/", P2], listed)
    assert note.startswith("pdkit-router.service: ") and says in note, note
    for url in (P2, D2):
        assert (url in note) == (url in pending), (what, note)
