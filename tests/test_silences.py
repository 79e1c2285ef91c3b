"""Planned changes don't page (issue 31 item 3): pdkit/hosts/silences.py against a real Alertmanager
(Debian's prometheus-alertmanager 0.25, started here on 127.0.0.1), and the roll's, rollback's
and deploy's use of it with their host steps stood in for."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

from pdkit.hosts.silences import (
    Alertmanager,
    Matcher,
    Silencer,
    deploy_end,
    deploy_silence,
    deploy_start,
    host_matchers,
    wait_state,
)
from pdkit.inventory.loader import load
from tests.conftest import require, write_inventory

ALERTMANAGER = shutil.which("prometheus-alertmanager")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    """A real Alertmanager on 127.0.0.1 with one receiver that sends nowhere: its URL."""
    require(ALERTMANAGER is not None, "prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager)")
    d = tmp_path_factory.mktemp("alertmanager")
    (d / "am.yml").write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    port = _free_port()
    log = open(d / "am.log", "w")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={d / 'am.yml'}", f"--storage.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    from pdkit.agent.health import http_request

    deadline = time.monotonic() + 30
    while http_request(f"{url}/-/ready", timeout=1)[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"Alertmanager did not start: {(d / 'am.log').read_text()[-2000:]}")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


@pytest.fixture
def spec(tmp_path, base):
    """gpu01 (a router over every engine), gpu02, mon01: the shape of the lab."""
    cluster, hosts = base
    del hosts["gpu01"]["pdkit_router"]["workers"]
    for h in ("gpu01", "gpu02"):
        hosts[h]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    return load(write_inventory(tmp_path, hosts, cluster))


class Lines:
    """Collects a Silencer's lines (who, text)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, who: str, text: str) -> None:
        self.lines.append((who, text))

    def text(self) -> str:
        return "\n".join(f"{w}: {t}" for w, t in self.lines)


def _post_alert(url: str, labels: dict[str, str]) -> None:
    from pdkit.agent.health import http_request

    now = datetime.now(UTC)
    status, body = http_request(f"{url}/api/v2/alerts", [{"labels": {"alertname": "PdkitTest", **labels},
                                                          "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}])
    assert status == 200, body


def _alert_state(url: str, labels: dict[str, str]) -> tuple[str, list[str]]:
    """(state, silencedBy) of the one alert with exactly these labels (besides alertname)."""
    from pdkit.agent.health import http_request

    status, body = http_request(f"{url}/api/v2/alerts?active=true&silenced=true&inhibited=true")
    assert status == 200, body
    found = [a for a in json.loads(body) if a["labels"] == {"alertname": "PdkitTest", **labels}]
    assert len(found) == 1, found
    return found[0]["status"]["state"], found[0]["status"]["silencedBy"]


def _wait_alert(url: str, labels: dict[str, str], state: str) -> list[str]:
    deadline = time.monotonic() + 10
    while (got := _alert_state(url, labels))[0] != state:
        assert time.monotonic() < deadline, f"alert {labels} is {got}, not {state}"
        time.sleep(0.1)
    return got[1]


# ---------------------------------------------------------------- which alerts are a host's


def test_a_hosts_silences_cover_its_targets_and_the_routers_view_of_its_engines(spec):
    assert host_matchers(spec, ["gpu02"]) == [
        (Matcher("cluster", "test"), Matcher("node", "gpu02")),
        (Matcher("cluster", "test"), Matcher("worker_instance", "gpu02/prefill|gpu02/decode", is_regex=True)),
    ]
    # a batch of two: one regex, each name matched literally (a '.' in a name matches only a '.')
    two = host_matchers(spec, ["gpu01", "gpu02"])
    assert two[0][1] == Matcher("node", "gpu01|gpu02", is_regex=True)
    # a host no router fronts (the monitoring host): its own targets only
    assert host_matchers(spec, ["mon01"]) == [(Matcher("cluster", "test"), Matcher("node", "mon01"))]


# ---------------------------------------------------------------- the client, against Alertmanager 0.25


def test_a_silence_is_active_with_its_matchers_and_names_the_command_and_user_then_expires(alertmanager, spec):
    lines = Lines()
    silencer = Silencer([alertmanager], "pdkit roll", lines, user="alice@ctl")
    gpu02 = {"cluster": "test", "node": "gpu02", "instance": "gpu02/decode"}
    seen_by_router = {"cluster": "test", "node": "gpu01", "instance": "gpu01/router", "worker_instance": "gpu02/decode"}
    other = {"cluster": "test", "node": "gpu01", "instance": "gpu01/decode"}
    other_cluster = {"cluster": "prod", "node": "gpu02", "instance": "gpu02/decode"}
    for labels in (gpu02, seen_by_router, other, other_cluster):
        _post_alert(alertmanager, labels)

    silence = silencer.start("gpu02", ["gpu02"], host_matchers(spec, ["gpu02"]), 600, "drain, apply, gates on gpu02")
    assert silence is not None and len(silence.ids) == 2
    am = Alertmanager(alertmanager)
    for (url, sid), matchers in zip(silence.ids, host_matchers(spec, ["gpu02"])):
        got = wait_state(am, sid, "active")
        assert url == alertmanager
        assert sorted(got["matchers"], key=lambda m: m["name"]) == sorted((m.api() for m in matchers), key=lambda m: m["name"])
        assert got["createdBy"] == "pdkit"
        assert got["comment"] == "pdkit roll by alice@ctl: drain, apply, gates on gpu02"
        # the window: at most the bound asked for; started by Alertmanager's clock, not in the past
        ends = datetime.fromisoformat(got["endsAt"].replace("Z", "+00:00"))
        starts = datetime.fromisoformat(got["startsAt"].replace("Z", "+00:00"))
        assert timedelta(seconds=590) < ends - starts <= timedelta(seconds=601)
        assert abs((starts - datetime.now(UTC)).total_seconds()) < 60
    # exactly the host's alerts are silenced: its own and the router's about its engines
    assert set(_wait_alert(alertmanager, gpu02, "suppressed")) == {silence.ids[0][1]}
    assert set(_wait_alert(alertmanager, seen_by_router, "suppressed")) == {silence.ids[1][1]}
    assert _alert_state(alertmanager, other)[0] == "active"
    assert _alert_state(alertmanager, other_cluster)[0] == "active"
    [(who, line)] = lines.lines
    assert who == "gpu02" and 'node="gpu02"' in line and 'worker_instance=~"gpu02/prefill|gpu02/decode"' in line
    assert "pdkit roll by alice@ctl" in line and silence.ids[0][1] in line

    silencer.end(silence, "rolled")
    for _, sid in silence.ids:
        wait_state(am, sid, "expired")
    _wait_alert(alertmanager, gpu02, "active")
    _wait_alert(alertmanager, seen_by_router, "active")
    assert "silence expired" in lines.lines[-1][1] and "rolled" in lines.lines[-1][1]
    record = silencer.records[0]
    assert [s["id"] for s in record["silences"]] == [sid for _, sid in silence.ids]
    assert record["matchers"][0] == [m.api() for m in host_matchers(spec, ["gpu02"])[0]]
    assert record["expired_at"] and record["ends_at"] > record["starts_at"] and record["outcome"] == "rolled"


def test_an_unreachable_alertmanager_is_one_warning_and_no_exception_and_no_credentials():
    lines = Lines()
    port = _free_port()  # nothing listens there
    silencer = Silencer([f"http://pdkit:hunter2@127.0.0.1:{port}"], "pdkit roll", lines, user="alice@ctl", timeout=2)
    matchers = [(Matcher("cluster", "test"), Matcher("node", "gpu02"))]
    assert silencer.start("gpu02", ["gpu02"], matchers, 60, "roll") is None
    with silencer.silenced("gpu03", ["gpu03"], matchers, 60, "roll") as step:
        assert step.silence is None
    silencer.end(None, "nothing to end")
    [(who, warning)] = lines.lines  # once, whatever the number of steps
    assert warning.startswith("warning: ") and f"127.0.0.1:{port}" in warning and "courtesy, not a gate" in warning
    assert "hunter2" not in lines.text() and "pdkit:" not in warning
    assert silencer.records == []


def test_no_monitoring_host_no_silence_and_no_line(tmp_path, base):
    cluster, hosts = base
    del hosts["mon01"]
    lines = Lines()
    silencer = Silencer.for_spec(load(write_inventory(tmp_path, hosts, cluster)), "pdkit roll", lines)
    assert silencer.start("gpu02", ["gpu02"], [(Matcher("node", "gpu02"),)], 60, "roll") is None
    assert lines.lines == []


def test_a_failing_step_still_expires_its_silence_and_says_so(alertmanager):
    lines = Lines()
    silencer = Silencer([alertmanager], "pdkit rollback", lines, user="alice@ctl")
    with pytest.raises(RuntimeError, match="gate failed"):
        with silencer.silenced("gpu02", ["gpu02"], [(Matcher("cluster", "test"), Matcher("node", "gpu02"))], 60, "rollback",
                               done="DONE", failed="the step failed") as step:
            wait_state(Alertmanager(alertmanager), step.silence.ids[0][1], "active")
            raise RuntimeError("gate failed")
    wait_state(Alertmanager(alertmanager), step.silence.ids[0][1], "expired")
    assert "the step failed" in lines.lines[-1][1] and "DONE" not in lines.text()


# ---------------------------------------------------------------- the roll, rollback and deploy


def _roller(spec, alertmanager, lines_out):
    from pdkit.roll.roller import Progress, Roller
    from tests.test_roll import _FakePyinfra

    roller = Roller("inv.py", spec, Progress(lines_out))
    roller.pyinfra = _FakePyinfra()
    # the spec's Alertmanager is the monitoring host's; the test's runs on 127.0.0.1
    roller.silencer = Silencer([alertmanager], "pdkit roll", lambda who, text: roller.progress(who, "silence", text), user="alice@ctl")
    roller.current_releases = lambda state, hosts: ({h: f"rel-{h}" for h in hosts}, {h: None for h in hosts})
    roller.drain = lambda hosts: "drained"
    roller.readd = lambda hosts: "back"
    roller.smoke = lambda hosts: "smoked"
    roller.engines_restart_to_ready = lambda host, name, since: 0.0
    return roller


def test_a_rolled_node_is_silenced_from_drain_to_smoke_and_expired_after(alertmanager, spec):
    out = io.StringIO()
    roller = _roller(spec, alertmanager, out)
    am = Alertmanager(alertmanager)
    during = []

    def ready(hosts):
        during.append([am.get(sid)["status"]["state"] for _, sid in roller.silencer.made[0].ids])
        return "ready"

    roller.ready = ready
    roller.roll_batch(["gpu02"])
    assert during == [["active", "active"]]
    [silence] = roller.silencer.made
    for _, sid in silence.ids:
        wait_state(am, sid, "expired")
    text = out.getvalue()
    assert text.index("silenced {") < text.index("drained") < text.index("smoked") < text.index("silence expired")
    assert "rolled, ready and back in the router" in text


def test_a_node_the_roll_left_broken_is_not_silenced(alertmanager, spec):
    """A gate fails after the apply: the node is restored, and its silence expired after the
    restore, when the roll stops on it (whatever is still wrong pages)."""
    from pdkit.roll.planning import RollError

    out = io.StringIO()
    roller = _roller(spec, alertmanager, out)
    roller.ready = lambda hosts: (_ for _ in ()).throw(TimeoutError("decode not healthy"))
    am = Alertmanager(alertmanager)
    restored = []

    def restore(host_name, host, to):
        restored.append([am.get(sid)["status"]["state"] for _, sid in roller.silencer.made[0].ids])
        return f"back on {to}"

    roller.restore = restore
    with pytest.raises(RollError):
        roller.roll_batch(["gpu02"])
    assert restored == [["active", "active"]]  # still silenced while it is put back
    for _, sid in roller.silencer.made[0].ids:
        wait_state(am, sid, "expired")
    text = out.getvalue()
    assert text.index("back on rel-gpu02") < text.index("silence expired") and "the roll stopped on it" in text
    assert roller.silencer.records[0]["outcome"].startswith("the roll stopped on it")


def test_an_unchanged_batch_is_not_silenced(alertmanager, spec):
    roller = _roller(spec, alertmanager, io.StringIO())
    roller.unchanged = {"gpu02"}
    roller.not_serving = lambda hosts: []
    roller.roll_batch(["gpu02"])
    assert roller.silencer.made == []


def test_an_unchanged_batch_not_serving_is_rolled_and_silenced(alertmanager, spec):
    out = io.StringIO()
    roller = _roller(spec, alertmanager, out)
    roller.unchanged = {"gpu02"}
    roller.not_serving = lambda hosts: ["http://10.0.0.2:30000 is not in its router"]
    roller.ready = lambda hosts: "ready"
    roller.roll_batch(["gpu02"])
    assert len(roller.silencer.made) == 1
    text = out.getvalue()
    assert "no file or service to change, but http://10.0.0.2:30000 is not in its router" in text
    assert text.index("heal") < text.index("drained") < text.index("smoked")


def test_the_silences_bound_is_the_steps_own_timeouts(spec):
    from pdkit.roll.planning import APPLY_INSTALL_S, RESTORE_S, silence_window_s

    # drain 2x300, apply 900+600, ready 660, router 3x120+600+60, smoke 120, restore 900 + 3x120
    assert silence_window_s(300, 600, 120) == 600 + APPLY_INSTALL_S + 600 + 660 + 360 + 660 + 120 + RESTORE_S + 360
    # a held downtime worker lengthens the router steps (the add and the failure path's re-add)
    assert silence_window_s(300, 600, 120, held_s=60) == silence_window_s(300, 600, 120) + 120


def test_a_deploy_silences_a_host_whose_engines_restart_and_expires_after_its_gates(alertmanager, spec, monkeypatch):
    from pdkit.hosts.silences import deploy_end_all, deploy_window_s
    from pdkit.render.plan import plan_cluster

    services = plan_cluster(spec)["gpu02"].services
    engines = [s for s in services if s.kind == "engine"]
    daemons = [s for s in services if s.kind == "http"]
    window, units = deploy_silence(spec, "gpu02", [*engines, *daemons], node_drained=False)
    assert units == [s.unit for s in engines]
    # gpu02's engines are gpu01's router's workers: one sync with that router
    assert window == deploy_window_s([s.ready_timeout_s for s in (*engines, *daemons)], [], 1)
    # a daemon alone, a roll's deploy (it silences its batch itself): no silence
    assert deploy_silence(spec, "gpu02", daemons, node_drained=False) is None
    assert deploy_silence(spec, "gpu02", engines, node_drained=True) is None

    # the python.call functions, with the spec's Alertmanager moved to the test's
    monkeypatch.setattr("pdkit.monitoring.common.alertmanager_urls", lambda spec: [alertmanager])
    printed = io.StringIO()
    monkeypatch.setattr("sys.stderr", printed)

    class State:
        def __init__(self):
            self.handlers = []

        def add_callback_handler(self, handler):
            self.handlers.append(handler)

    class Host:
        name = "gpu02"

    state = State()
    am = Alertmanager(alertmanager)

    def active() -> list[dict]:
        return [s for s in am.silences() if s["status"]["state"] == "active" and "pyinfra deploy" in s["comment"]]

    deploy_start(state, Host(), spec, window, units)
    made = active()
    assert sorted(m["name"] for s in made for m in s["matchers"]) == ["cluster", "cluster", "node", "worker_instance"]
    assert all(s["comment"].endswith(f"restarting {', '.join(units)} on gpu02") for s in made)
    deploy_end(state, Host())
    for s in made:
        wait_state(am, s["id"], "expired")
    assert "pdkit: gpu02: silenced {" in printed.getvalue() and "its restarts passed their gates" in printed.getvalue()

    # a failed operation on the host expires its silence at once (pyinfra runs none of its later ones)
    deploy_start(state, Host(), spec, window, units)
    [watch] = state.handlers
    made = active()
    assert len(made) == 2
    watch.operation_host_error(state, Host(), "op")
    for s in made:
        wait_state(am, s["id"], "expired")
    assert "the deploy failed on it" in printed.getvalue()
    deploy_end_all("nothing left")  # the exit handler: nothing open any more

    # an Alertmanager that does not answer: one warning for the whole deploy, not one per host
    monkeypatch.setattr("pdkit.monitoring.common.alertmanager_urls", lambda spec: [DOWN])
    for name in ("gpu01", "gpu02"):
        Host.name = name
        deploy_start(state, Host(), spec, window, units)
    assert printed.getvalue().count("warning: ") == 1


DOWN = f"http://127.0.0.1:{_free_port()}"


# The commands themselves, in a child process (pyinfra's API gevent-patches the process), with the
# SSH side and the node steps stood in for and the spec's Alertmanager moved to the test's.
_COMMAND = """
import json, sys
import pdkit.monitoring.common as common
common.alertmanager_urls = lambda spec: [{am!r}]
from pdkit.roll import commands as roll_commands, roller as roll_roller
from pdkit.roll.planning import HostDiff
from pdkit.roll.roller import Roller
from tests.test_roll import _FakePyinfra
roll_roller.Pyinfra = lambda inventory: _FakePyinfra()
Roller.read_router_keys = lambda self: []
roll_commands.read_node_state = lambda roller, hosts: ({{h: HostDiff(h, ("/etc/pdkit/x",), ("pdkit-engine-decode.service",)) for h in hosts}}, {{}}, {{}})
roll_commands.measure_restarts = lambda roller, hosts: {{}}
Roller.current_releases = lambda self, state, hosts: ({{h: "rel-" + h for h in hosts}}, {{h: None for h in hosts}})
Roller.last_restart_to_ready = lambda self, host, name: None
Roller.engines_restart_to_ready = lambda self, host, name, since: 0.0
Roller.drain = lambda self, hosts: "drained"
Roller.restore = lambda self, name, host, to: "back on " + str(to)
Roller.readd = lambda self, hosts: "back"
Roller.smoke = lambda self, hosts: "smoked"
def ready(self, hosts):
    if {broken!r} in hosts:
        raise TimeoutError("decode not healthy")
    return "ready"
Roller.ready = ready
from pdkit.cli import main
sys.exit(main({argv!r}))
"""


def _command(alertmanager: str, argv: list[str], broken: str | None = None) -> subprocess.CompletedProcess:
    import sys

    from tests.conftest import REPO

    code = _COMMAND.format(am=alertmanager, argv=argv, broken=broken)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_roll_report_records_each_silence_and_a_stopped_roll_leaves_none_active(alertmanager, spec, tmp_path):
    report = tmp_path / "roll.json"
    proc = _command(alertmanager, ["roll", spec.inventory, "--report", str(report)], broken="gpu01")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["result"] == "stopped" and data["failed"]["host"] == "gpu01"
    # the canary gpu02 rolled under its silence; gpu01 stopped the roll: expired after its restore; mon01 untouched
    assert [s["hosts"] for s in data["silences"]] == [["gpu02"], ["gpu01"]]
    rolled, stopped = data["silences"]
    assert rolled["outcome"] == "rolled, ready and back in the router" and stopped["outcome"].startswith("the roll stopped on it")
    am = Alertmanager(alertmanager)
    for record in data["silences"]:
        assert record["comment"].startswith("pdkit roll by ") and record["starts_at"] < record["expired_at"] < record["ends_at"]
        for s, matchers in zip(record["silences"], record["matchers"]):
            got = am.get(s["id"])
            assert got["status"]["state"] == "expired"
            assert sorted(got["matchers"], key=lambda m: m["name"]) == sorted(matchers, key=lambda m: m["name"])
    assert [m["value"] for m in stopped["matchers"][0]] == ["test", "gpu01"]
    out = proc.stdout
    assert out.index("back on rel-gpu01") < out.rindex("silence expired")


def test_a_rollback_is_silenced_and_expired(alertmanager, spec):
    before = {s["id"] for s in Alertmanager(alertmanager).silences()}
    proc = _command(alertmanager, ["rollback", spec.inventory, "gpu02"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    made = [s for s in Alertmanager(alertmanager).silences() if s["id"] not in before]
    assert len(made) == 2 and all(s["comment"].startswith("pdkit rollback by ") for s in made)
    assert all(s["status"]["state"] == "expired" for s in made)
    assert "silence expired" in proc.stdout and "back on the release, ready and in the router" in proc.stdout
    # a failed rollback: expired too, and said so
    before |= {s["id"] for s in made}
    proc = _command(alertmanager, ["rollback", spec.inventory, "gpu02"], broken="gpu02")
    assert proc.returncode == 1
    made = [s for s in Alertmanager(alertmanager).silences() if s["id"] not in before]
    assert len(made) == 2 and all(s["status"]["state"] == "expired" for s in made)
    assert "the rollback stopped on it" in proc.stdout


def test_tunes_rolls_and_put_backs_are_silenced_as_pdkit_tune(alertmanager, tmp_path):
    """pdkit tune rolls through the Roller (the roll's silences, named `pdkit tune`) and puts a
    failed candidate's hosts back with rollback's steps: silenced, then expired either way."""
    from pdkit.tune import runner
    from tests.conftest import REPO
    from tests.test_roll import _FakePyinfra

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "t", "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"),
                                "workload": {"concurrency": [4]}, "candidates": [{"name": "off", "set": {"decode.cuda_graph": False}}]}))
    prep = runner.prepare(str(REPO / "inventories" / "lab.py"), str(path))
    out = io.StringIO()
    session = runner.Session(prep, [])
    session.progress.stream = out
    roller = session.roller(runner.BASELINE)
    assert roller.silencer.command == "pdkit tune"
    roller.silencer = Silencer([alertmanager], roller.silencer.command, roller.silencer.say, user="alice@ctl")
    roller.pyinfra = _FakePyinfra()
    roller.drain = lambda hosts: "drained"
    roller.restore = lambda name, host, to: f"back on {to}"
    roller.readd = lambda hosts: "back"
    roller.smoke = lambda hosts: "smoked"
    roller.ready = lambda hosts: "ready"
    assert session.put_back(roller, ["lab-gpu2"], {"lab-gpu2": "rel-1"}) == ["lab-gpu2: back on release rel-1"]
    roller.ready = lambda hosts: (_ for _ in ()).throw(TimeoutError("decode not healthy"))
    assert "rollback FAILED" in session.put_back(roller, ["lab-gpu3"], {"lab-gpu3": "rel-1"})[0]
    am = Alertmanager(alertmanager)
    put_back, failed = roller.silencer.made
    assert put_back.hosts == ("lab-gpu2",) and failed.hosts == ("lab-gpu3",)
    assert put_back.comment.startswith("pdkit tune by alice@ctl: put back on its release")
    assert put_back.outcome == "back on its release, ready and in the router" and failed.outcome.startswith("its put-back failed")
    for silence in (put_back, failed):
        for _, sid in silence.ids:
            assert am.get(sid)["status"]["state"] == "expired"
