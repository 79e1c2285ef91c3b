"""Issue 42 item 3: every failure after a drain puts the box back in service. For roll, rollback and
tune's put-back, a failure injected at each step (drain, apply or restore, ready, router, smoke)
leaves the router listing the node's healthy workers, and the last line says so; an engine that
stays unhealthy is left out and named. A fake router that lists what was added and removed, and
fake engines whose /health answers 200 unless they are marked down."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import types

import pytest

from pdkit.clients.router_api import RouterError, Worker, worker_type
from pdkit.inventory.loader import load
from pdkit.roll.planning import RollError, put_back_summary, sort_by_health, stop_summary
from pdkit.roll.roller import Progress, Roller
from tests.conftest import REPO
from tests.test_roll import _FakePyinfra


class _ListingRouter:
    """A router's worker API as the Roller sees it: a worker is listed once added, gone once removed,
    healthy while its engine is not in DOWN; FAIL_WAITS: the next wait_healthy calls that fail."""

    base_url = "http://fake-router:8000"

    def __init__(self, workers: dict[str, str], down: set[str]) -> None:
        self.kinds = dict(workers)  # url -> worker type
        self.listed = set(workers)
        self.down = down
        self.fail_waits = 0

    def workers(self):
        return [Worker(id=u, url=u, worker_type=self.kinds[u], bootstrap_port=None, healthy=u not in self.down,
                       status="ready") for u in sorted(self.listed)]

    def remove(self, url, settle_s=None):
        self.listed.discard(url)

    def add(self, url, kind, bootstrap_port=None, timeout=60):
        self.listed.add(url)
        self.kinds[url] = kind

    def wait_healthy(self, urls, timeout=60):
        if self.fail_waits:
            self.fail_waits -= 1
            raise RouterError(f"router {self.base_url}: after {timeout:.0f} s workers unhealthy {sorted(urls)}")
        bad = sorted(u for u in urls if u not in self.listed or u in self.down)
        if bad:
            raise RouterError(f"router {self.base_url}: after {timeout:.0f} s workers missing or unhealthy {bad}")

    def routable(self) -> set[str]:
        return {w.url for w in self.workers() if w.routable}


def _roller(monkeypatch, inventory: str, node: str, *, command: str = "roll", down: set[str] | None = None):
    """(roller, router, the node's worker URLs by role, progress stream): a Roller over INVENTORY
    whose router is a _ListingRouter listing every worker, its engines idle, healthy unless in DOWN,
    its SSH side a _FakePyinfra, its restore and gates recorded."""
    spec = load(str(REPO / "inventories" / inventory))
    out = io.StringIO()
    roller = Roller(f"inventories/{inventory}", spec, Progress(out), allow_downtime=True, command=command)
    roller.router_timeout_s = 2  # the put-back's wait for an unhealthy engine, kept short here
    router_host = spec.router_hosts[0]
    down = set() if down is None else down
    fake = _ListingRouter({flags_url: worker_type(e.role) for h, e in spec.router_workers(router_host)
                           for flags_url in [roller.engine_urls([h.name])[f"{h.name}/{e.name}"]]}, down)
    roller._routers = [(router_host, fake)]
    roller.pyinfra = _FakePyinfra()
    roller.restored = []
    monkeypatch.setattr(roller, "scrape", lambda urls, names, missing_ok=(): {k: {n: 0.0 for n in names} for k in urls})
    monkeypatch.setattr(roller, "circuit_states", lambda host: {})
    monkeypatch.setattr(roller, "run_gates", lambda hosts, phase: (0, []))
    monkeypatch.setattr(roller, "current_releases", lambda state, hosts: ({h: "rel-1" for h in hosts},
                                                                          {h: None for h in hosts}))
    monkeypatch.setattr(roller, "restore", lambda name, host, to: roller.restored.append((name, to)) or f"back on {to}")
    monkeypatch.setattr(roller, "engines_restart_to_ready", lambda host, name, since: 0.0)
    monkeypatch.setattr(roller, "last_restart_to_ready", lambda host, name: None)
    monkeypatch.setattr(roller, "silenced", lambda *a, **k: contextlib.nullcontext(types.SimpleNamespace(failed=False)))
    monkeypatch.setattr(roller, "read_router_keys", lambda: [])
    # each engine's own /health: 200 unless it is down
    monkeypatch.setattr("pdkit.roll.roller.http_request",
                        lambda url, *a, **k: (503, "not ready") if url.removesuffix("/health") in down else (200, ""))
    mine = {e.role: roller.engine_urls([node])[f"{node}/{e.name}"] for h, e in spec.engines() if h.name == node}
    return roller, fake, mine, out


def _fail(what: str):
    def fn(*_a, **_k):
        raise RuntimeError(f"injected: {what} failed")
    return fn


def _inject(monkeypatch, roller, fake, step: str) -> None:
    """Make STEP of a roll or rollback fail as it would on a node."""
    if step == "drain":
        # the engines never go idle: the drain fails after it took the workers out
        monkeypatch.setattr(roller, "scrape", _fail("the engines' /metrics"))
        roller.drain_timeout_s = 0
    elif step == "apply":
        roller.pyinfra.execute = lambda hosts, state: {hosts[0]: "injected: a deploy operation failed"}
    elif step == "restore":
        monkeypatch.setattr(roller, "restore", _fail("the restore"))
    elif step == "ready":
        monkeypatch.setattr(roller, "ready", _fail("the engine gate"))
    elif step == "router":
        fake.fail_waits = 1  # the router step's wait fails once; the put-back's re-add then works
    elif step == "smoke":
        monkeypatch.setattr(roller, "smoke", _fail("a smoke request"))


# ---------------------------------------------------------------- the pure parts


def test_engines_are_sorted_by_their_own_health_answer():
    healthy, left_out = sort_by_health({"http://a:1": (200, "ok"), "http://b:2": (503, "loading\n"),
                                        "http://c:3": (0, "Connection refused")})
    assert healthy == ["http://a:1"]
    assert left_out == {"http://b:2": "its /health answered 503: loading",
                        "http://c:3": "its /health did not answer (Connection refused)"}


def test_the_last_line_names_the_workers_left_out():
    failed = RollError("gpu01", "ready", "x")
    failed.restored, failed.readded, failed.left_out = True, True, {"http://gpu01:30000": "its /health answered 503: x"}
    line = stop_summary(failed, [])
    assert "its healthy engines are back in the router; left out: http://gpu01:30000 (its /health answered 503" in line
    assert "its engines are back in the router" not in line
    line = put_back_summary("rollback", "gpu01", True, True, {})
    assert line == ("pdkit rollback: gpu01: the restore completed: it runs the release it was rolled back to; "
                    "its engines are back in the router")
    line = put_back_summary("rollback", "gpu01", False, False, {"http://x:1": "its /health did not answer (refused)"})
    assert "the restore failed" in line and "its engines are NOT back in the router; left out: http://x:1" in line
    assert "the restore did not start: it runs the release it ran before" in put_back_summary("rollback", "h", None, None)
    assert put_back_summary("rollback", "h", None, None).endswith("nothing was taken out of the router")


# ---------------------------------------------------------------- roll (and tune's rolls: the same roll_batch)


@pytest.mark.parametrize("step", ["drain", "apply", "ready", "router", "smoke"])
def test_a_roll_failing_at_any_step_after_the_drain_leaves_the_workers_in_the_router(monkeypatch, step):
    roller, fake, mine, out = _roller(monkeypatch, "cluster.py", "gpu01")
    _inject(monkeypatch, roller, fake, step)
    with pytest.raises(RollError) as exc:
        roller.roll_batch(["gpu01"])
    assert exc.value.gate == step
    assert set(mine.values()) <= fake.routable(), (fake.routable(), out.getvalue())
    assert exc.value.readded is True and exc.value.left_out == {}
    assert "its engines are back in the router" in stop_summary(exc.value, [])
    # restored when something may have been applied; not after a failed drain
    assert roller.restored == ([] if step == "drain" else [("gpu01", "rel-1")])
    assert "put back in service: 2 worker(s) in the router" in out.getvalue()


def test_a_roll_whose_engine_stays_unhealthy_puts_back_the_other_and_names_it(monkeypatch):
    """The prefill never answers /health again: the router step fails, the restore does not help;
    the decode goes back in, the prefill is left out, named with its answer."""
    down: set[str] = set()
    roller, fake, mine, out = _roller(monkeypatch, "cluster.py", "gpu01", down=down)
    down.add(mine["prefill"])
    with pytest.raises(RollError) as exc:
        roller.roll_batch(["gpu01"])
    assert exc.value.gate == "router"
    assert fake.routable() == {mine["decode"]}
    assert exc.value.readded is True and list(exc.value.left_out) == [mine["prefill"]]
    line = stop_summary(exc.value, [])
    assert f"left out: {mine['prefill']} (its /health answered 503: not ready" in line, line
    assert f"left out of the router: {mine['prefill']}: its /health answered 503" in out.getvalue()
    # the failed router step had added it: the router still lists it, unhealthy, and the line says so
    assert mine["prefill"] in fake.listed and "the router still lists it, unhealthy" in line


def test_a_drain_refused_before_it_removed_anything_puts_nothing_back(monkeypatch):
    roller, fake, mine, out = _roller(monkeypatch, "cluster.py", "gpu01")
    roller.allow_downtime = False  # the drain refuses the outage before touching the router
    roller.removed = list(mine.values())  # a former batch's drain: not this one's
    with pytest.raises(RollError) as exc:
        roller.roll_batch(["gpu01"])
    assert exc.value.gate == "drain" and exc.value.readded is None
    assert "nothing was taken out of the router" in stop_summary(exc.value, [])


# ---------------------------------------------------------------- a layout change (pdkit tune's node.layout / node.engines)


def _layout_roller(monkeypatch, layout: dict):
    """A roller whose spec is lab-one-node.py changed by LAYOUT (a campaign overlay), while its
    router still lists the node's workers as they are now (PD: a prefill on :30000, a decode on :30001)."""
    from pdkit.inventory.loader import read_inventory, spec_from_host_data
    from pdkit.tune.campaign import apply_overlay

    roller, fake, mine, out = _roller(monkeypatch, "lab-one-node.py", "lab-gpu1")
    hosts = read_inventory(str(REPO / "inventories" / "lab-one-node.py"), str(REPO))
    spec, problems = spec_from_host_data(apply_overlay(hosts, layout, ["lab-gpu1"]).hosts, inventory="x.py")
    assert spec is not None, problems
    roller.spec = spec
    return roller, fake, mine, out


def test_pd_to_unified_takes_the_listed_pd_workers_out_and_adds_the_unified_one_as_regular(monkeypatch):
    roller, fake, mine, _ = _layout_roller(monkeypatch, {"node.layout": "unified"})
    assert {fake.kinds[u] for u in fake.listed} == {"prefill", "decode"}
    said = roller.drain(["lab-gpu1"])
    # both listed workers leave, though the unified engine reuses the prefill's URL
    assert fake.listed == set() and "2 worker(s) out of the router (a layout change: 2 of them" in said, said
    assert {u: fake.kinds[u] for u in roller.retired} == {mine["prefill"]: "prefill", mine["decode"]: "decode"}
    assert roller.outage_since is not None
    roller.readd(["lab-gpu1"])
    [unified] = [roller.engine_urls(["lab-gpu1"])["lab-gpu1/unified"]]
    assert fake.listed == {unified} and unified == mine["prefill"]


def test_a_layout_change_without_downtime_is_refused_before_anything_is_removed(monkeypatch):
    roller, fake, mine, _ = _layout_roller(monkeypatch, {"node.layout": "unified"})
    roller.allow_downtime = False
    with pytest.raises(RuntimeError, match="the layout change leaves lab-gpu1 no decode worker.*nothing was removed"):
        roller.drain(["lab-gpu1"])
    assert fake.listed == set(mine.values())


@pytest.mark.parametrize("step", ["apply", "ready", "router", "smoke"])
def test_a_failed_layout_change_puts_the_old_workers_back_as_they_were_listed(monkeypatch, step):
    roller, fake, mine, out = _layout_roller(monkeypatch, {"node.layout": "unified"})
    _inject(monkeypatch, roller, fake, step)
    with pytest.raises(RollError) as exc:
        roller.roll_batch(["lab-gpu1"])
    assert exc.value.gate == step and roller.restored == [("lab-gpu1", "rel-1")]
    # back as the node's restored release serves them: a prefill and a decode, not one regular worker
    assert fake.routable() == set(mine.values()), out.getvalue()
    assert [fake.kinds[u] for u in sorted(fake.listed)] == ["prefill", "decode"]
    assert "back in the router as listed before the layout change" in out.getvalue()


def test_unified_back_to_pd_scrapes_only_the_engines_that_run(monkeypatch):
    """The other way: the router lists one regular worker; the PD decode's port has no engine yet,
    so the drain's idle check must not wait on it."""
    roller, fake, mine, _ = _layout_roller(monkeypatch, {"node.layout": "unified"})
    roller.drain(["lab-gpu1"])
    roller.readd(["lab-gpu1"])
    unified_spec = roller.spec
    pd_roller, pd_fake, _, _ = _roller(monkeypatch, "lab-one-node.py", "lab-gpu1")
    pd_fake.listed, pd_fake.kinds = set(fake.listed), {u: "regular" for u in fake.listed}
    scraped = []
    monkeypatch.setattr(pd_roller, "scrape", lambda urls, names, missing_ok=(): scraped.append((dict(urls), set(missing_ok)))
                        or {k: {n: 0.0 for n in names} for k in urls if k not in missing_ok})
    said = pd_roller.drain(["lab-gpu1"])
    assert unified_spec is not pd_roller.spec and "1 worker(s) out of the router (a layout change" in said, said
    urls, missing_ok = scraped[0]
    assert missing_ok == {"lab-gpu1/decode"} and urls["lab-gpu1/decode"] == mine["decode"]
    pd_roller.readd(["lab-gpu1"])
    assert {u: pd_fake.kinds.get(u) for u in pd_fake.listed} == {mine["prefill"]: "prefill", mine["decode"]: "decode"}


def test_a_roll_onto_a_node_whose_engine_is_down_and_out_of_the_router_drains_the_rest(monkeypatch):
    """On the lent H200 a failed roll left the decode down and out of the router; the next roll
    (the fixed inventory) stopped at the drain because the decode's /metrics did not answer. An
    engine no router lists has nothing of the router's in flight: it is reported, not waited on."""
    roller, fake, mine, _ = _roller(monkeypatch, "lab-one-node.py", "lab-gpu1")
    fake.listed.discard(mine["decode"])

    def scrape(urls, names, missing_ok=()):
        out = {}
        for label, url in urls.items():
            if url == mine["decode"]:
                if label in missing_ok:
                    continue
                raise RuntimeError(f"{label}: {url}/metrics answered nothing")
            out[label] = {n: 0.0 for n in names}
        return out

    monkeypatch.setattr(roller, "scrape", scrape)
    said = roller.drain(["lab-gpu1"])
    assert said == ("1 worker(s) out of the router, 1 engine(s) idle, 1 not running and in no router "
                    "(lab-gpu1/decode): nothing to drain"), said
    # listed, it must answer: a serving engine that stops answering still fails the drain
    fake.listed.add(mine["decode"])
    roller.drain_timeout_s = 0
    with pytest.raises(RuntimeError, match="answered nothing"):
        roller.drain(["lab-gpu1"])


# ---------------------------------------------------------------- rollback


def _rollback(monkeypatch, roller, host: str) -> tuple[int, str]:
    from pdkit.roll import commands

    monkeypatch.setattr(commands, "patch_gevent", lambda: None)
    monkeypatch.setattr(commands, "Roller", lambda *a, **k: roller)
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    args = argparse.Namespace(inventory=roller.inventory, host=host, to=None, drain_timeout=300.0,
                              allow_downtime=True)
    return commands.cmd_rollback(args), err.getvalue()


@pytest.mark.parametrize("step", ["drain", "restore", "ready", "router", "smoke"])
def test_a_rollback_failing_at_any_step_after_the_drain_leaves_the_workers_in_the_router(monkeypatch, step):
    roller, fake, mine, out = _roller(monkeypatch, "cluster.py", "gpu01", command="rollback")
    monkeypatch.setattr(roller, "ready", lambda hosts: "ready")
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoked")
    _inject(monkeypatch, roller, fake, step)
    rc, err = _rollback(monkeypatch, roller, "gpu01")
    assert rc == 1
    assert f"pdkit rollback: gpu01: gate '{step}' failed: " in err
    assert set(mine.values()) <= fake.routable(), (err, out.getvalue())
    last = err.strip().splitlines()[-1]
    assert last.startswith("pdkit rollback: gpu01: ") and last.endswith("its engines are back in the router"), last
    said = {"drain": "did not start", "restore": "the restore failed"}.get(step, "the restore completed")
    assert said in last, last


def test_a_rollback_whose_engine_stays_unhealthy_puts_back_the_other_and_names_it(monkeypatch):
    down: set[str] = set()
    roller, fake, mine, out = _roller(monkeypatch, "cluster.py", "gpu01", command="rollback", down=down)
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoked")
    # the restore leaves the prefill unhealthy: the ready gate fails on it
    monkeypatch.setattr(roller, "restore", lambda name, host, to: down.add(mine["prefill"]) or "back on release rel-0")
    monkeypatch.setattr(roller, "ready", _fail("prefill not healthy"))
    rc, err = _rollback(monkeypatch, roller, "gpu01")
    assert rc == 1 and fake.routable() == {mine["decode"]}
    last = err.strip().splitlines()[-1]
    assert f"its healthy engines are back in the router; left out: {mine['prefill']} (its /health answered 503" in last


def test_a_rollback_that_succeeds_says_nothing_of_a_put_back(monkeypatch):
    roller, fake, mine, out = _roller(monkeypatch, "cluster.py", "gpu01", command="rollback")
    monkeypatch.setattr(roller, "ready", lambda hosts: "ready")
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoked")
    rc, err = _rollback(monkeypatch, roller, "gpu01")
    assert rc == 0 and err == "" and set(mine.values()) <= fake.routable()
    assert "put back in service" not in out.getvalue()


# ---------------------------------------------------------------- tune's put-back of a failed candidate


def _tune_session(tmp_path):
    from pdkit.tune import runner

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "t", "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"),
                                "workload": {"concurrency": [4]},
                                "candidates": [{"name": "off", "set": {"decode.cuda_graph": False}}]}))
    return runner.Session(runner.prepare(str(REPO / "inventories" / "lab.py"), str(path)), [])


@pytest.mark.parametrize("step", ["drain", "restore", "ready", "router", "smoke"])
def test_tunes_put_back_failing_at_any_step_leaves_the_workers_in_the_router(monkeypatch, tmp_path, step):
    session = _tune_session(tmp_path)
    roller, fake, mine, out = _roller(monkeypatch, "lab.py", "lab-gpu2", command="tune")
    session.progress = roller.progress
    session.roller = lambda name: roller  # the spec put back is the candidate's own here
    monkeypatch.setattr(roller, "ready", lambda hosts: "ready")
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoked")
    _inject(monkeypatch, roller, fake, step)
    [line] = session.put_back(roller, ["lab-gpu2"], {"lab-gpu2": "rel-0"})
    assert set(fake.kinds) == fake.routable(), (line, out.getvalue())  # every worker of the lab listed, healthy
    assert line.startswith("lab-gpu2: rollback FAILED after ") and line.endswith("its engines are back in the router")


def test_tunes_put_back_with_an_unhealthy_engine_names_it(monkeypatch, tmp_path):
    session = _tune_session(tmp_path)
    down: set[str] = set()
    roller, fake, mine, out = _roller(monkeypatch, "lab.py", "lab-gpu2", command="tune", down=down)
    session.progress = roller.progress
    session.roller = lambda name: roller
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoked")
    monkeypatch.setattr(roller, "restore", lambda name, host, to: down.add(mine["decode"]) or "back")
    monkeypatch.setattr(roller, "ready", _fail("decode not healthy"))
    [line] = session.put_back(roller, ["lab-gpu2"], {"lab-gpu2": "rel-0"})
    assert mine["prefill"] in fake.routable() and mine["decode"] not in fake.routable()
    assert f"left out: {mine['decode']} (its /health answered 503" in line, line


def test_tunes_put_back_gates_the_spec_it_restored_not_the_failed_candidates(monkeypatch, tmp_path):
    """On the lent H100 (2026-12-07) a unified-layout candidate failed and was restored onto the PD pair; the
    put-back's `ready` was the candidate's and watched the unified unit the restore had just stopped:
    "FAILED rollback: pdkit-engine-unified.service failed at its first start" on a box back and serving."""
    from pdkit.tune.runner import BASELINE

    session = _tune_session(tmp_path)
    candidate, fake, mine, out = _roller(monkeypatch, "lab.py", "lab-gpu2", command="tune")
    restored, _, _, _ = _roller(monkeypatch, "lab.py", "lab-gpu2", command="tune")
    session.progress = candidate.progress
    monkeypatch.setattr(candidate, "ready", _fail("pdkit-engine-unified.service failed at its first start"))
    monkeypatch.setattr(restored, "ready", lambda hosts: "the PD pair ready")
    monkeypatch.setattr(candidate, "smoke", _fail("the candidate's smoke"))
    monkeypatch.setattr(restored, "smoke", lambda hosts: "smoked through the PD pair")
    asked = []
    session.roller = lambda name: asked.append(name) or restored
    assert session.on_node == BASELINE
    [line] = session.put_back(candidate, ["lab-gpu2"], {"lab-gpu2": "rel-0"})
    assert line == "lab-gpu2: back on release rel-0", (line, out.getvalue())
    assert asked == [BASELINE] and candidate.restored == [("lab-gpu2", "rel-0")]
    assert "the PD pair ready" in out.getvalue() and "smoked through the PD pair" in out.getvalue()


def test_a_resumed_tune_puts_back_onto_the_last_candidate_that_passed(tmp_path):
    from pdkit.tune import runner

    records = [{"kind": "baseline", "candidate": runner.BASELINE, "verdict": "pass"},
               {"kind": "candidate", "candidate": "off", "verdict": "pass"},
               {"kind": "candidate", "candidate": "other", "verdict": "fail"}]
    prep = _tune_session(tmp_path).prep
    assert runner.Session(prep, records).on_node == "off"
    assert runner.Session(prep, records[:1]).on_node == runner.BASELINE


def test_the_drain_does_not_wait_on_an_engine_no_router_lists_whose_gauges_say_busy(monkeypatch):
    """Issue 45 item 4: an engine the router already had no worker of (left out by an earlier step,
    wedged) reports running requests that are none of the router's: the drain reports it and goes
    on; the same gauges on a listed engine are waited on until the drain's timeout."""
    roller, fake, mine, _ = _roller(monkeypatch, "lab-one-node.py", "lab-gpu1")
    fake.listed.discard(mine["decode"])

    def scrape(urls, names, missing_ok=()):
        return {label: {n: (3.0 if url == mine["decode"] else 0.0) for n in names} for label, url in urls.items()}

    monkeypatch.setattr(roller, "scrape", scrape)
    roller.drain_timeout_s = 0
    said = roller.drain(["lab-gpu1"])
    assert said == ("1 worker(s) out of the router, 1 engine(s) idle, 1 in no router still report requests "
                    "(lab-gpu1/decode): none of the router's, not waited on"), said
    fake.listed.add(mine["decode"])
    with pytest.raises(TimeoutError, match="lab-gpu1/decode"):
        roller.drain(["lab-gpu1"])


def test_a_downtime_roll_records_the_outage_it_announced_beside_the_one_measured(monkeypatch):
    """Issue 45 item 1: the record shows announced vs measured (the node's `done` line and --report)."""
    from pdkit.roll.commands import report

    roller, fake, mine, out = _roller(monkeypatch, "lab-one-node.py", "lab-gpu1")
    roller.restart_s = {"lab-gpu1": 42.0}
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoke requests answered")  # the stand-in router serves none
    roller.roll_batch(["lab-gpu1"])
    timing = roller.timings[-1]
    assert timing.outage_s is not None and timing.announced_outage_s == 42.0
    assert "(announced ~42 s)" in out.getvalue(), out.getvalue()
    node = report(roller.timings)["nodes"][0]
    assert node["announced_outage_s"] == 42.0 and node["outage_s"] == round(timing.outage_s, 2)


def test_a_downtime_roll_announces_from_the_engines_warm_restart_and_records_which(monkeypatch):
    """Issue 45 item 1: with the node's start history read (Roller.estimates), the announced figure is
    the engine's last warm restart of its class, not the node's last start (a cold 205 s); the
    report names the source beside the measured outage."""
    from pdkit.roll.commands import report

    roller, fake, mine, out = _roller(monkeypatch, "lab-one-node.py", "lab-gpu1")
    roller.restart_s = {"lab-gpu1": 205.0}
    roller.estimates = {"lab-gpu1": {"pdkit-engine-decode.service": (71.0, "its last warm restart with the same "
                                                                           "configuration class, t2")}}
    monkeypatch.setattr(roller, "smoke", lambda hosts: "smoke requests answered")
    roller.roll_batch(["lab-gpu1"])
    assert "(announced ~71 s)" in out.getvalue(), out.getvalue()
    node = report(roller.timings)["nodes"][0]
    assert node["announced_outage_s"] == 71.0 and node["outage_s"] is not None
    assert node["announced_outage_source"].startswith("decode on lab-gpu1: its last warm restart"), node
