"""The journal that keeps the kit's evidence (issue 42 item 2): its size, its drop-in, the router's log level."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pdkit.agent import journald
from pdkit.inventory.loader import load
from pdkit.render import flags
from pdkit.render.plan import plan_cluster
from roles.services import journald_changed
from tests.conftest import write_inventory

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = ("cluster", "a6000", "multinode", "provided-env")
# what the lab's and the GPU rig's rootfs write (pdkit/lab/rootfs.py JOURNALD_CONF, gpu/nspawn/build.py)
LAB_DROPIN = "pdkit-lab.conf"


def test_size_is_a_day_of_engine_lines_at_the_target_rate():
    size = journald.journal_size(64, decode_engines=1)
    assert size.requests_per_s == 32.0  # 64 in flight, 2 s each
    # 2 access lines of 80 B and 258/886 prefill-batch lines of 300 B, each with 265 B of journal overhead
    assert size.bytes_per_request == pytest.approx(2 * 345 + 258 / 886 * 565)
    assert size.engine_step_bytes_per_s == pytest.approx(2.5 * 515)
    assert size.bytes_per_day == pytest.approx((32 * size.bytes_per_request + 2.5 * 515) * 86_400)
    assert size.max_use_mb == 2560  # 2,359 MiB rounded up to 256 MiB
    assert size.max_use_mb * 2**20 >= size.bytes_per_day


def test_size_grows_with_concurrency_and_has_a_floor():
    assert journald.journal_size(1).max_use_mb == journald.FLOOR_MB
    assert journald.journal_size(None) == journald.journal_size(journald.DEFAULT_CONCURRENCY)
    big = journald.journal_size(1024, decode_engines=4)
    assert big.max_use_mb * 2**20 >= big.bytes_per_day > journald.journal_size(64).bytes_per_day


def test_rate_limit_is_journalds_default_unless_a_unit_would_come_near_it():
    assert journald.journal_size(64).rate_burst == 10_000
    # 4,096 in flight: 2,048 requests/s, 2 access lines each, 122,880 lines a unit in 30 s
    assert journald.journal_size(4096).rate_burst == 246_000


def test_dropin_text_is_persistent_and_sized():
    text = journald.journald_conf(journald.journal_size(64))
    assert "[Journal]\nStorage=persistent\nSystemMaxUse=2560M\nRateLimitIntervalSec=30s\nRateLimitBurst=10000\n" in text


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_host_gets_the_dropin_root_owned_0644(name, monkeypatch):
    monkeypatch.chdir(REPO)
    plans = plan_cluster(load(f"inventories/{name}.py"))
    for plan in plans.values():
        f = plan.file(journald.JOURNALD_DROPIN_PATH)
        assert (f.mode, f.owner, f.group) == ("0644", "root", "root")
        assert ("/etc/systemd/journald.conf.d", "0755", "root", "root") in plan.directories


def test_dropin_sorts_after_the_labs():
    # journald reads drop-ins in file-name order and the last setting wins
    name = journald.JOURNALD_DROPIN_PATH.rsplit("/", 1)[1]
    assert sorted([name, LAB_DROPIN, "00-distribution.conf", "50-local.conf"])[-1] == name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_reads_the_dropin_last(tmp_path, monkeypatch):
    """`systemd-analyze cat-config` (systemd's own drop-in order) over a root with the lab's file and ours."""
    monkeypatch.chdir(REPO)
    plan = plan_cluster(load("inventories/cluster.py"))["gpu01"]
    conf = tmp_path / "etc/systemd/journald.conf.d"
    conf.mkdir(parents=True)
    (conf / LAB_DROPIN).write_text("[Journal]\nStorage=persistent\nSystemMaxUse=32M\n")
    (tmp_path / journald.JOURNALD_DROPIN_PATH.lstrip("/")).write_text(plan.file(journald.JOURNALD_DROPIN_PATH).content)
    out = subprocess.run(["systemd-analyze", f"--root={tmp_path}", "cat-config", "systemd/journald.conf"],
                         capture_output=True, text=True, check=True).stdout
    values = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("SystemMaxUse=")]
    assert values == ["32M", "2560M"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_router_runs_at_warn(name, monkeypatch):
    monkeypatch.chdir(REPO)
    spec = load(f"inventories/{name}.py")
    for host in spec.router_hosts:
        argv = flags.router_args(spec, host)
        assert argv[argv.index("--log-level") + 1] == "warn"


def test_journald_restarts_only_when_its_dropin_changed():
    assert journald_changed({journald.JOURNALD_DROPIN_PATH, "/etc/pdkit/release.json"})
    assert not journald_changed({"/etc/pdkit/release.json", "/etc/systemd/system/pdkit-router.service"})


def test_the_router_log_level_is_a_spec_field_and_the_journal_is_sized_for_it(tmp_path, base):
    """Issue 42: pdkit_router.log_level (default warn, both pinned routers' choices); at info the
    router's request lines are sized into its host's journal, at warn they are not."""
    from pdkit.upstream.parsertable import table

    for release in table()["router"].values():
        option = next(o for o in release["options"] if "--log-level" in (o.get("flags") or []))
        assert set(option["choices"]) == set(journald.ROUTER_LOG_LEVELS)
    warn = journald.journal_size(64, 1, "warn")
    info = journald.journal_size(64, 1, "info")
    assert warn == journald.journal_size(64, 1, None)
    assert info.bytes_per_request == pytest.approx(warn.bytes_per_request + 886 + 2 * journald.ENTRY_OVERHEAD_B)
    assert info.max_use_mb > warn.max_use_mb
    cluster, hosts = base
    router_host = next(name for name, data in hosts.items() if "pdkit_router" in data)
    hosts[router_host]["pdkit_router"]["log_level"] = "info"
    spec = load(str(write_inventory(tmp_path, hosts, cluster)))
    host = spec.host(router_host)
    argv = flags.router_args(spec, host)
    assert argv[argv.index("--log-level") + 1] == "info"
    level = host.router.log_level
    decodes = sum(1 for p in spec.placements(host) if p.engine.role == "decode" and p.rank == 0) if host.node else 0
    want = journald.journal_size(spec.cluster.target_concurrency, decodes, level)
    dropin = plan_cluster(spec)[router_host].file(journald.JOURNALD_DROPIN_PATH).content
    assert f"SystemMaxUse={want.max_use_mb}M" in dropin and want.bytes_per_request > journald.journal_size(
        spec.cluster.target_concurrency, decodes, "warn").bytes_per_request
