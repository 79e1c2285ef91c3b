"""pdkit.agent.releases on a node's file system (a temp root): record, list, prune, restore byte for byte."""

from __future__ import annotations

import datetime as dt
import grp
import hashlib
import json
import os
import pwd
import stat

import pytest

from pdkit.agent import releases
from pdkit.inventory.loader import load
from pdkit.render.plan import plan_cluster
from tests.conftest import write_inventory

RELEASES = "/opt/pdkit/releases"
RELEASE_JSON = "/etc/pdkit/release.json"
USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name
SERVICES = {
    "pdkit-engine-decode.service": {"kind": "engine", "files": ["/etc/pdkit/engines/decode.env", "/etc/systemd/system/pdkit-engine-decode.service"], "health_url": "http://h:30001/health", "ready_timeout_s": 5},
    "pdkit-exporter.service": {"kind": "http", "files": ["/etc/pdkit/exporter.json"], "health_url": "http://h:9400/metrics", "ready_timeout_s": 5},
}


def _t(second: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, 0, 0, second, tzinfo=dt.UTC)


def _write(root, path: str, text: str, mode: int = 0o640) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    os.chmod(p, mode)


def _config(root, decode_env: str, exporter: str, extra: dict[str, str] | None = None, services=None) -> None:
    files = {"/etc/pdkit/engines/decode.env": decode_env, "/etc/systemd/system/pdkit-engine-decode.service": "[Service]\nExecStart=/opt/pdkit/venv/bin/python -m pdkit.sim\n", "/etc/pdkit/exporter.json": exporter, **(extra or {})}
    for path, text in files.items():
        _write(root, path, text, 0o644 if path.endswith(".service") else 0o640)
    manifest = {"files": {p: {"sha256": hashlib.sha256(t.encode()).hexdigest()} for p, t in files.items()}, "services": services or sorted(SERVICES)}
    _write(root, RELEASE_JSON, json.dumps(manifest), 0o644)


def _venv(root, name: str) -> None:
    (root / "opt/pdkit/venvs" / name).mkdir(parents=True, exist_ok=True)
    link = root / "opt/pdkit/venv"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(root / "opt/pdkit/venvs" / name)


def _record(root, second: int, **kw):
    return releases.record(root=root, releases_dir=RELEASES, release_json=RELEASE_JSON, command=f"test {second}", services=SERVICES, venv_links=["/opt/pdkit/venv", "/opt/pdkit/router-venv"], now=_t(second), **kw)


def _snapshot(root) -> dict[str, tuple[bytes, int]]:
    out = {}
    for p in sorted((root / "etc").rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
    return out


class Systemd:
    """Records systemctl calls; every unit counts as active; every health wait succeeds."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.waited: list[str] = []

    def systemctl(self, args: list[str]) -> None:
        self.calls.append(args)

    def wait(self, unit: str, svc: dict) -> tuple[bool, str]:
        self.waited.append(unit)
        return True, f"{unit} ready"

    def restarted(self) -> list[str]:
        return [u for c in self.calls if c[0] == "restart" for u in c[1:]]


def _restore(root, systemd: Systemd, **kw):
    return releases.restore(root=root, releases_dir=RELEASES, release_json=RELEASE_JSON, systemctl=systemd.systemctl, unit_active=lambda u: True, wait=systemd.wait, **kw)


def test_release_hash_is_the_plans_release_hash(tmp_path, base):
    cluster, hosts = base
    plan = plan_cluster(load(write_inventory(tmp_path, hosts, cluster)))["gpu01"]
    entries = {f.path: {"mode": f.mode, "owner": f.owner, "group": f.group, "sha256": f.sha256} for f in plan.files}
    assert releases.release_hash(entries) == plan.release_hash


def test_record_keeps_every_file_with_its_mode_owner_and_hash(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    _venv(tmp_path, "node-1")
    meta = _record(tmp_path, 1)
    assert meta["id"] == "20260101T000001Z-" + meta["hash"][:12]
    kept = tmp_path / RELEASES.lstrip("/")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700  # secrets are kept there too
    assert (kept / "CURRENT").read_text().strip() == meta["id"]
    assert set(meta["files"]) == {RELEASE_JSON, "/etc/pdkit/engines/decode.env", "/etc/systemd/system/pdkit-engine-decode.service", "/etc/pdkit/exporter.json"}
    assert meta["files"]["/etc/pdkit/engines/decode.env"] == {"mode": "0640", "owner": USER, "group": GROUP, "sha256": hashlib.sha256(b"A=1\n").hexdigest()}
    assert (kept / meta["id"] / "files/etc/pdkit/engines/decode.env").read_text() == "A=1\n"
    assert meta["venvs"] == {"/opt/pdkit/venv": "/opt/pdkit/venvs/node-1"}  # the router venv does not exist here
    assert meta["command"] == "test 1" and meta["services"] == SERVICES
    # recording the same configuration again makes no new release
    assert _record(tmp_path, 2)["id"] == meta["id"]
    assert releases.list_releases(root=tmp_path, releases_dir=RELEASES)["releases"][0]["id"] == meta["id"]


def test_record_refuses_files_that_differ_from_the_plan(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    with pytest.raises(releases.ReleaseError, match="a file differs from the plan"):
        _record(tmp_path, 1, expect_hash="f" * 64)
    (tmp_path / "etc/pdkit/exporter.json").unlink()
    with pytest.raises(releases.ReleaseError, match="exporter.json is listed in /etc/pdkit/release.json but is missing"):
        _record(tmp_path, 1)


def test_only_the_newest_releases_are_kept(tmp_path):
    for i in range(5):
        _config(tmp_path, f"A={i}\n", "{}\n")
        _record(tmp_path, i, keep=3)
    listed = releases.list_releases(root=tmp_path, releases_dir=RELEASES)
    assert [r["id"][:16] for r in listed["releases"]] == ["20260101T000002Z"[:16], "20260101T000003Z"[:16], "20260101T000004Z"[:16]]
    assert listed["current"] == listed["releases"][-1]["id"]
    assert releases.to_prune(["a", "b", "c"], 1, protect="a") == ["b"]


def test_restore_puts_back_files_modes_and_the_venv_byte_for_byte_and_restarts_what_changed(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    _venv(tmp_path, "node-1")
    first = _record(tmp_path, 1)
    before = _snapshot(tmp_path)

    # the next configuration: decode env changed, exporter.json mode changed, a new file, a new venv
    _config(tmp_path, "A=2\n", "{}\n", extra={"/etc/pdkit/engines/extra.env": "X=1\n"})
    os.chmod(tmp_path / "etc/pdkit/exporter.json", 0o600)
    _venv(tmp_path, "node-2")
    second = _record(tmp_path, 2)
    assert second["id"] != first["id"]

    systemd = Systemd()
    result = _restore(tmp_path, systemd)  # default: the release before the current one
    assert result["id"] == first["id"]
    assert _snapshot(tmp_path) == before  # bytes and modes, extra.env gone
    assert os.path.realpath(tmp_path / "opt/pdkit/venv") == str(tmp_path / "opt/pdkit/venvs/node-1")
    # the engine restarts (its env and the venv changed), the exporter too (its file's mode changed and its venv)
    assert systemd.restarted() == ["pdkit-engine-decode.service", "pdkit-exporter.service"]
    assert ["daemon-reload"] in systemd.calls
    assert systemd.waited == ["pdkit-engine-decode.service", "pdkit-exporter.service"]
    listed = releases.list_releases(root=tmp_path, releases_dir=RELEASES)
    assert listed["current"] == first["id"] and len(listed["releases"]) == 2

    # and forward again by id prefix
    systemd = Systemd()
    assert _restore(tmp_path, systemd, to=second["id"][:20])["id"] == second["id"]
    assert (tmp_path / "etc/pdkit/engines/decode.env").read_text() == "A=2\n"
    assert (tmp_path / "etc/pdkit/engines/extra.env").read_text() == "X=1\n"


def test_restore_stops_units_the_release_does_not_run(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    first = _record(tmp_path, 1)
    _config(tmp_path, "A=1\n", "{}\n", services=[*sorted(SERVICES), "pdkit-engine-new.service"])
    systemd = Systemd()
    _restore(tmp_path, systemd, to=first["id"])
    assert ["disable", "--now", "pdkit-engine-new.service"] in systemd.calls


def test_restore_refuses_a_damaged_copy_before_writing_anything(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    first = _record(tmp_path, 1)
    _config(tmp_path, "A=2\n", "{}\n")
    _record(tmp_path, 2)
    (tmp_path / RELEASES.lstrip("/") / first["id"] / "files/etc/pdkit/engines/decode.env").write_text("tampered\n")
    with pytest.raises(releases.ReleaseError, match="damaged"):
        _restore(tmp_path, Systemd())
    assert (tmp_path / "etc/pdkit/engines/decode.env").read_text() == "A=2\n"


def test_restore_names_what_is_kept_when_the_release_is_unknown_or_missing(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    only = _record(tmp_path, 1)
    with pytest.raises(releases.ReleaseError, match="no release to go back to"):
        _restore(tmp_path, Systemd())
    with pytest.raises(releases.ReleaseError, match=f"is not kept on this node; kept: {only['id']}"):
        _restore(tmp_path, Systemd(), to="1999")


def test_a_service_that_does_not_come_back_fails_the_restore(tmp_path):
    _config(tmp_path, "A=1\n", "{}\n")
    _record(tmp_path, 1)
    _config(tmp_path, "A=2\n", "{}\n")
    _record(tmp_path, 2)
    with pytest.raises(releases.ReleaseError, match="not every service became ready: pdkit-engine-decode.service: never"):
        releases.restore(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, systemctl=lambda a: None, unit_active=lambda u: True,
                         wait=lambda u, s: (u != "pdkit-engine-decode.service", "never"))


def test_plan_restore_restarts_inactive_units_even_without_changes():
    target = {"files": {"/a": {"mode": "0644", "owner": "root", "group": "root", "sha256": "x"}}, "venvs": {}, "services": {"u.service": {"kind": "engine", "files": ["/a"]}}}
    same = {"/a": {"mode": "0644", "owner": "root", "group": "root", "sha256": "x"}}
    assert releases.plan_restore(target, same, {}, {"u.service": True}, ["u.service"]).restart == []
    assert releases.plan_restore(target, same, {}, {"u.service": False}, ["u.service"]).restart == ["u.service"]


def test_on_host_entry_point_lists_as_json(tmp_path, capsys):
    _config(tmp_path, "A=1\n", "{}\n")
    meta = _record(tmp_path, 1)
    assert releases.main(["--root", str(tmp_path), "list"]) == 0
    assert json.loads(capsys.readouterr().out)["current"] == meta["id"]
    assert releases.main(["--root", str(tmp_path), "restore"]) == 1
    assert "no release to go back to" in capsys.readouterr().err


def test_the_recorded_command_never_keeps_a_password():
    from roles.releases import redacted

    argv = ["pyinfra", "inv.py", "deploy/pd.py", "--ssh-password", "hunter2", "--sudo-password=s3cret", "--data", "x=1", "-y"]
    assert redacted(argv) == ["pyinfra", "inv.py", "deploy/pd.py", "--ssh-password", "***", "--sudo-password=***", "--data", "***", "-y"]


def test_a_restore_restarts_engines_and_daemons_together_and_the_router_after_their_gates(tmp_path):
    """As the deploy does (issue 30 item 7): not one unit after another, and the router once its workers are up."""
    router_unit = "/etc/systemd/system/pdkit-router.service"
    services = {**SERVICES, "pdkit-router.service": {"kind": "router", "files": [router_unit], "health_url": "http://h:8000/health", "ready_timeout_s": 5,
                                                      "expected_workers": ["http://h:30001"], "remote_workers": [], "model": "m", "api_key_file": None}}
    names = sorted(services)

    def config(n: int) -> None:
        _config(tmp_path, f"A={n}\n", f"{{\"n\": {n}}}\n", extra={router_unit: f"[Service]\nExecStart=/x {n}\n"}, services=names)

    def record(n: int):
        return releases.record(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, command=f"t {n}", services=services, venv_links=[], now=_t(n))

    config(1)
    first = record(1)
    config(2)
    record(2)
    events: list = []
    releases.restore(root=tmp_path, releases_dir=RELEASES, release_json=RELEASE_JSON, to=first["id"], systemctl=lambda a: events.append(tuple(a)),
                     unit_active=lambda u: True, wait=lambda u, s: events.append(("wait", u)) or (True, "ok"))
    restarts = [e for e in events if e[0] == "restart"]
    assert restarts == [("restart", "pdkit-engine-decode.service", "pdkit-exporter.service"), ("restart", "pdkit-router.service")]
    router_restart = events.index(("restart", "pdkit-router.service"))
    assert {e for e in events[:router_restart] if e[0] == "wait"} == {("wait", "pdkit-engine-decode.service"), ("wait", "pdkit-exporter.service")}
    assert events[-1] == ("wait", "pdkit-router.service")


def test_a_restore_waits_for_a_start_job_as_long_as_systemd_bounds_it(monkeypatch):
    """A shared-GPU engine's start job waits for its predecessor and the GPU memory before it runs
    (TimeoutStartSec = ready_timeout_s + 120 + 60): a 120 s bound on `systemctl restart` cut the
    restore short on the lent H200 and left the decode down (docs/gpu.md)."""
    seen = []
    monkeypatch.setattr(releases.subprocess, "run", lambda argv, **kw: seen.append((argv[1], kw["timeout"])))
    releases._systemctl(["restart", "pdkit-engine-decode.service"])
    releases._systemctl(["daemon-reload"])
    assert seen == [("restart", releases.START_JOB_BOUND_S), ("daemon-reload", releases.SYSTEMCTL_BOUND_S)]
    from pdkit.render.plan import GPU_FREE_WAIT_S
    assert releases.START_JOB_BOUND_S > 2 * 600 + GPU_FREE_WAIT_S + 60  # two ready_timeout_s of the largest default


def test_a_restore_restarts_journald_when_its_drop_in_changes_and_only_then(tmp_path):
    """Issue 42: the deploy restarts journald when its pdkit drop-in changed; a restore that puts
    another drop-in back must too (journald reads it only at its start), before the services."""
    from pdkit.agent.journald import JOURNALD_DROPIN_PATH, JOURNALD_UNIT

    _config(tmp_path, "A=1\n", "{}\n", extra={JOURNALD_DROPIN_PATH: "[Journal]\nSystemMaxUse=2G\n"})
    first = _record(tmp_path, 1)
    _config(tmp_path, "A=2\n", "{}\n", extra={JOURNALD_DROPIN_PATH: "[Journal]\nSystemMaxUse=4G\n"})
    second = _record(tmp_path, 2)
    systemd = Systemd()
    result = _restore(tmp_path, systemd, to=first["id"])
    assert (tmp_path / JOURNALD_DROPIN_PATH.lstrip("/")).read_text() == "[Journal]\nSystemMaxUse=2G\n"
    restarts = [c for c in systemd.calls if c[0] == "restart"]
    assert restarts[0] == ["restart", JOURNALD_UNIT] and JOURNALD_UNIT in result["restarted"]
    assert systemd.calls.index(["daemon-reload"]) < systemd.calls.index(["restart", JOURNALD_UNIT])
    # only the engine's env differs now: journald is left alone
    _config(tmp_path, "A=3\n", "{}\n", extra={JOURNALD_DROPIN_PATH: "[Journal]\nSystemMaxUse=2G\n"})
    _record(tmp_path, 3)
    systemd = Systemd()
    _restore(tmp_path, systemd, to=first["id"])
    assert JOURNALD_UNIT not in systemd.restarted() and "pdkit-engine-decode.service" in systemd.restarted()
    assert second["id"] != first["id"]
