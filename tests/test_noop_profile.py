"""benchmarks/noop_profile.py without a lab: its cgroup grouping and arithmetic, on a cgroup tree
laid out in a temporary directory as a lab guest's systemd lays it out in the v2 hierarchy."""

from __future__ import annotations

from tests.conftest import load_script

prof = load_script("benchmarks/noop_profile.py", "pdkit_bench_noop_profile")


def _cg(root, rel, usec):
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec 0\nsystem_usec 0\n")


def _guest(root, name, *, total, payload, ssh, logind, user, init=0, engine=0):
    _cg(root, name, total)
    _cg(root, f"{name}/payload", payload)
    _cg(root, f"{name}/payload/init.scope", init)
    _cg(root, f"{name}/payload/user.slice", user)
    _cg(root, f"{name}/payload/user.slice/user-0.slice/session-7.scope", user)  # counted in user.slice only
    _cg(root, f"{name}/payload/system.slice", ssh + logind + engine)
    _cg(root, f"{name}/payload/system.slice/ssh.service", ssh)
    _cg(root, f"{name}/payload/system.slice/systemd-logind.service", logind)
    if engine:
        _cg(root, f"{name}/payload/system.slice/pdkit-engine@decode.service", engine)


def test_groups_are_the_units_of_a_guests_payload():
    assert prof.group_of("payload/system.slice/ssh.service") == "ssh.service"
    assert prof.group_of("payload/user.slice") == "user.slice"
    assert prof.group_of("payload/init.scope") == "init.scope"
    # counted by their parent's group, or the guest's total
    assert prof.group_of("payload/user.slice/user-0.slice/session-7.scope") is None
    assert prof.group_of("payload/system.slice") is None
    assert prof.group_of("") is None


def test_a_deploy_window_minus_the_idle_window_per_role(tmp_path):
    _guest(tmp_path, "lab-gpu1", total=1000, payload=900, ssh=100, logind=50, user=300, engine=400)
    _guest(tmp_path, "lab-mon", total=500, payload=450, ssh=10, logind=5, user=30)
    before = prof.Snapshot.take(tmp_path)
    assert before.groups[("lab-gpu1", "nspawn")] == 100  # the guest's cgroup outside its payload
    assert ("lab-gpu1", "system.slice") not in before.groups

    _guest(tmp_path, "lab-gpu1", total=9000, payload=8800, ssh=2100, logind=1050, user=5300, engine=400)
    _guest(tmp_path, "lab-mon", total=600, payload=540, ssh=20, logind=5, user=30)
    after = prof.Snapshot.take(tmp_path)
    deploy = prof.delta(before, after)
    assert deploy[("lab-gpu1", "ssh.service")] == 2000
    assert deploy[("lab-gpu1", "*total")] == 8000

    idle = {("lab-gpu1", "ssh.service"): 1000}
    roles = {"lab-gpu1": "gpu", "lab-mon": "monitoring"}
    summary = prof.summarize(deploy, idle, roles)
    assert summary["gpu"]["ssh.service"] == 1.0  # (2000 - 1000) usec
    assert summary["gpu"]["user.slice"] == 5.0
    assert summary["gpu"]["hosts"] == 1.0
    assert summary["monitoring"]["ssh.service"] == 0.01


def test_a_cgroup_created_inside_the_window_counts_its_whole_usage(tmp_path):
    _guest(tmp_path, "lab-gpu1", total=10, payload=10, ssh=1, logind=1, user=1)
    before = prof.Snapshot.take(tmp_path)
    _cg(tmp_path, "lab-gpu1/payload/system.slice/fresh.service", 700)
    after = prof.Snapshot.take(tmp_path)
    assert prof.delta(before, after)[("lab-gpu1", "fresh.service")] == 700


def test_the_idle_windows_load_in_cores_per_role_and_group():
    idle = {("lab-gpu1", "prometheus-node-exporter.service"): 300_000, ("lab-gpu2", "prometheus-node-exporter.service"): 100_000,
            ("lab-mon", "prometheus.service"): 150_000, ("lab-gpu1", "*total"): 500_000}
    cores = prof.idle_cores(idle, 10.0, {"lab-gpu1": "gpu", "lab-gpu2": "gpu", "lab-mon": "monitoring"})
    assert cores["gpu"]["prometheus-node-exporter.service"] == 0.04  # 0.4 s of CPU over 10 s
    assert cores["gpu"]["*total"] == 0.05
    assert cores["monitoring"] == {"prometheus.service": 0.015}


def test_freeze_takes_host_colon_unit_and_names_the_form_otherwise():
    import argparse

    import pytest

    assert prof.parse_freeze("lab-mon:prometheus.service") == ("lab-mon", "prometheus.service")
    for bad in ("prometheus.service", "lab-mon:", ":x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected HOST:UNIT"):
            prof.parse_freeze(bad)


def test_freeze_writes_the_units_cgroup_freeze_and_waits_for_the_kernel(tmp_path):
    import threading

    cg = tmp_path / "lab-mon/payload/system.slice/prometheus.service"
    cg.mkdir(parents=True)
    (cg / "cgroup.freeze").write_text("0\n")
    (cg / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    # the kernel reports the new state a little later
    threading.Timer(0.2, lambda: (cg / "cgroup.events").write_text("populated 1\nfrozen 1\n")).start()
    prof.freeze(tmp_path, [("lab-mon", "prometheus.service")], True)
    assert (cg / "cgroup.freeze").read_text() == "1"
    (cg / "cgroup.events").write_text("populated 1\nfrozen 1\n")  # never thaws
    import pytest

    with pytest.raises(SystemExit, match="did not thaw"):
        prof.freeze(tmp_path, [("lab-mon", "prometheus.service")], False, timeout_s=0.2)
    with pytest.raises(SystemExit, match="no cgroup for grafana-server.service"):
        prof.freeze(tmp_path, [("lab-mon", "grafana-server.service")], True)
