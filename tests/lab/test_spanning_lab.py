"""Issue 20 item 5 on the shared lab: one decode engine spanning two lab hosts (TP8 as 2 x 4
virtual GPUs, `nodes` [lab-gpu1, lab-gpu2], rank 0 on lab-gpu1 the only HTTP server) behind the
router with the prefill (and a TP4 decode) of lab-gpu3.

- deployed, it serves: requests through the router succeed and the spanning decode generates;
  every rank runs its own argv (--node-rank) and the cross-node NCCL settings of its host;
  `pdkit doctor` checks rank 1 through lab-gpu2's exporter (process, argv, environment);
- a one-field change rolled with `pdkit roll` restarts every rank in one batch, gated on rank 0
  (one engine answers /health for the two hosts), with no failed request under a light load;
- rank 1 killed with SIGKILL (with lab-gpu3's decode out of the router, the spanning decode
  serves every request): rank 0 exits like an NCCL timeout, systemd restarts both, the ranks meet
  again. Zero lost data, as defined here: every request the router accepted was answered, either
  200 with every token asked for or an error status with an error message (none hung past its
  timeout, none came back truncated, the router never refused a connection), and once requests
  succeed again every request succeeds. The outage (kill -> first success after the last failed
  request) is measured and printed, and must stay under OUTAGE_BOUND_S.

The lab is put back on inventories/lab.py and re-converged at the end (other modules share it).
Cross-node NCCL settings, as validation demands for an engine spanning nodes: `nic` host0 (the
lab hosts' one interface: NCCL_SOCKET_IFNAME) and `nccl_net` socket (NCCL_IB_DISABLE=1) on every
node; `ucx_net_devices` host0 because the PD group spans hosts.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import requests

from tests.lab.test_deploy import (
    INVENTORY,
    changed_hosts,
    failed_hosts,
    json_from_child,
    lab_spec,
    run_pyinfra,
    ssh,
    wait_circuits_closed,
)
from tests.lab.test_roll import PDKIT, derived_inventory

pytestmark = pytest.mark.lab

SPAN = "decode-tp8"
SPAN_UNIT = f"pdkit-engine-{SPAN}.service"
SPAN_PORT = 30002
MAX_TOKENS = 8
OUTAGE_BOUND_S = 120.0  # sim: 5 s rank-loss timeout + RestartSec 5 + start-up + the router's health checks

SPANNING_BODY = f"""
_names = [n for n, _ in gpu_nodes]
_head, _rank1, _other = _names[0], _names[1], _names[2]
for _n, _d in gpu_nodes:
    # across nodes: NCCL bootstraps and runs over the lab's one interface (TCP sockets, no IB);
    # the PD group spans hosts, so UCX is given the interface too
    _d['pdkit_node'].update({{'nic': 'host0', 'nccl_net': 'socket', 'ucx_net_devices': 'host0'}})
_by = dict(gpu_nodes)
_by[_head]['pdkit_node']['engines'] = [{{'name': {SPAN!r}, 'role': 'decode', 'gpus': [4, 5, 6, 7], 'port': {SPAN_PORT},
    'pd_group': 'span', 'nodes': [_head, _rank1], 'dist_init_port': 25000, 'tp': 8}}]
_by[_rank1]['pdkit_node']['engines'] = []
for _e in _by[_other]['pdkit_node']['engines']:
    _e['pd_group'] = 'span'
"""
# the one field rolled: the spanning decode's own graph size (its argv changes on every rank)
ROLLED_BODY = SPANNING_BODY + "_by[_head]['pdkit_node']['engines'][0]['tuning'] = {'cuda_graph_max_bs': 96}\n"


def span_spec(inventory) -> dict:
    code = (
        "import json; from pdkit.inventory.loader import load; from pdkit.render.flags import router_address, sglang_args, nccl_env; "
        f"spec = load({str(inventory)!r}); "
        f"head = next(h for h, e in spec.engines() if e.name == {SPAN!r}); engine = head.node.engine({SPAN!r}); "
        "ranks = spec.engine_hosts(head, engine); "
        "print(json.dumps({'router': spec.router_hosts[0].name, 'gpu': [h.name for h in spec.gpu_hosts], "
        "'addr': {h.name: h.address for h in spec.hosts}, 'model': spec.cluster.model.name, "
        "'ranks': [h.name for h in ranks], 'argv': [sglang_args(spec, head, engine, r) for r in range(len(ranks))], "
        "'nccl': {h.name: nccl_env(spec, h) for h in ranks}, "
        "'other': [h.name for h in spec.gpu_hosts if h.name not in [r.name for r in ranks]][0], "
        "'router_metrics': [f'http://{router_address(h)}:{h.router.prometheus_port}/metrics' for h in spec.router_hosts]}))"
    )
    return json_from_child(code)


def unit_prop(lab, host: str, prop: str, unit: str = SPAN_UNIT) -> str:
    return ssh(lab, host, f"systemctl show -p {prop} --value {unit}").stdout.strip()


def process_of(lab, host: str, unit: str = SPAN_UNIT) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the unit's main process, read on its host."""
    pid = unit_prop(lab, host, "MainPID", unit)
    assert pid not in ("", "0"), f"{unit} on {host} has no main process"
    out = ssh(lab, host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline; echo ---; tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    cmdline, _, environ = out.partition("---\n")
    return cmdline.splitlines(), dict(line.split("=", 1) for line in environ.splitlines() if "=" in line)


def router_url(spec) -> str:
    return f"http://{spec['addr'][spec['router']]}:8000"


def engine_counter(spec, name: str) -> float:
    text = requests.get(f"http://{spec['addr'][spec['ranks'][0]]}:{SPAN_PORT}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@dataclass
class Outcome:
    started: float
    ended: float
    status: int | None  # None: no HTTP answer (timeout, connection refused or reset by the router)
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class Prober:
    """THREADS clients sending short completions through the router back to back until stopped."""

    url: str
    model: str
    threads: int = 4
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _one(self, i: int) -> Outcome:
        started = time.monotonic()
        try:
            r = requests.post(f"{self.url}/v1/completions", json={"model": self.model, "prompt": f"span probe {i}", "max_tokens": MAX_TOKENS}, timeout=60)
        except requests.RequestException as exc:
            return Outcome(started, time.monotonic(), None, f"{type(exc).__name__}: {exc}")
        ended = time.monotonic()
        if r.status_code == 200:
            try:
                body = r.json()
                tokens, text = body["usage"]["completion_tokens"], body["choices"][0]["text"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                return Outcome(started, ended, -1, f"200 with an unreadable body ({exc}): {r.text[:200]}")
            if tokens != MAX_TOKENS or not text.strip():
                return Outcome(started, ended, -1, f"200 but truncated: {tokens} of {MAX_TOKENS} tokens, text {text!r}")
            return Outcome(started, ended, 200, "")
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text.strip()
        return Outcome(started, ended, r.status_code, message[:300])

    def _loop(self, k: int) -> None:
        i = 0
        while not self.stop.is_set():
            self.outcomes.append(self._one(k * 1_000_000 + i))
            i += 1

    def __enter__(self) -> Prober:
        self._workers = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(self.threads)]
        for t in self._workers:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._workers:
            t.join(timeout=90)

    def lost(self) -> list[Outcome]:
        """Requests the router accepted that were neither served whole nor refused with a clear error."""
        return [o for o in self.outcomes if o.status is None or o.status == -1 or (o.status != 200 and not o.detail)]


@pytest.fixture(scope="module")
def spanning(lab, tmp_path_factory):
    base = lab_spec()
    assert len(base["gpu"]) >= 3, "this test needs a lab of 3 GPU hosts"
    tmp = tmp_path_factory.mktemp("spanning")
    inventory = derived_inventory(tmp, "lab_spanning", SPANNING_BODY)
    rolled = derived_inventory(tmp, "lab_spanning_rolled", ROLLED_BODY)
    spec = span_spec(inventory)
    try:
        rc, results, err = run_pyinfra(str(inventory))
        assert rc == 0 and not failed_hosts(results), f"deploying the spanning decode failed (rc {rc}):\n{err[-4000:]}"
        yield {"spec": spec, "inventory": inventory, "rolled": rolled, "tmp": tmp}
    finally:
        # back on inventories/lab.py, converged, breakers closed: the next module finds the lab as it expects
        rc, results, err = run_pyinfra()
        assert rc == 0 and not failed_hosts(results), f"putting the lab back on {INVENTORY} failed:\n{err[-4000:]}"
        rc, results, err = run_pyinfra()
        assert rc == 0 and changed_hosts(results) == {}, f"the lab is not converged after the test: {changed_hosts(results)}\n{err[-2000:]}"
        wait_circuits_closed(base)


def test_the_spanning_decode_serves_through_the_router_and_every_rank_runs_its_own_plan(lab, spanning):
    spec = spanning["spec"]
    head, rank1 = spec["ranks"]
    rc, results, err = run_pyinfra(str(spanning["inventory"]))
    assert rc == 0 and changed_hosts(results) == {}, f"the second run changed: {changed_hosts(results)}"
    for host in (head, rank1):
        assert unit_prop(lab, host, "ActiveState") == "active", f"{SPAN_UNIT} on {host}"
        argv, env = process_of(lab, host)
        rank = spec["ranks"].index(host)
        assert argv[argv.index("-m") + 2:] == spec["argv"][rank], f"{host}: the process runs another argv"
        assert argv[argv.index("--node-rank") + 1] == str(rank) and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == f"{spec['addr'][head]}:25000"
        for var in ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE"):
            assert env.get(var) == spec["nccl"][host][var], f"{host}: {var} is {env.get(var)!r} in the process"
    # only rank 0 serves HTTP
    assert requests.get(f"http://{spec['addr'][head]}:{SPAN_PORT}/health", timeout=10).status_code == 200
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{spec['addr'][rank1]}:{SPAN_PORT}/health", timeout=5)

    wait_circuits_closed(spec)
    generated = engine_counter(spec, "sglang:generation_tokens_total")
    url = router_url(spec)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: requests.post(f"{url}/v1/completions", json={"model": spec["model"], "prompt": f"span hello {i}",
                                                                                          "max_tokens": MAX_TOKENS}, timeout=60), range(16)))
    assert [a.status_code for a in answers] == [200] * 16, [a.text[:200] for a in answers if a.status_code != 200]
    assert engine_counter(spec, "sglang:generation_tokens_total") > generated, "the spanning decode generated nothing"

    # doctor reads rank 1 through lab-gpu2's exporter: its process, argv and NCCL environment
    proc = subprocess.run([PDKIT, "doctor", str(spanning["inventory"]), "--json"], capture_output=True, text=True, timeout=300)
    checks = {(c["host"], c["target"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    for check in ("rank_process", "flags", "process_env"):
        row = checks[(rank1, f"{SPAN} rank 1", check)]
        assert row["status"] == "PASS", row
    assert (rank1, f"{SPAN} rank 1", "reachable") not in checks
    assert checks[(head, SPAN, "reachable")]["status"] == "PASS"
    assert checks[(head, SPAN, "process_env")]["status"] == "PASS"


def test_a_rolled_change_restarts_every_rank_together_gated_on_rank_0(lab, spanning):
    spec = spanning["spec"]
    head, rank1, other = *spec["ranks"], spec["other"]
    before = {h: unit_prop(lab, h, "InvocationID") for h in (head, rank1)}
    other_before = unit_prop(lab, other, "InvocationID", "pdkit-engine-decode.service")
    report = spanning["tmp"] / "roll-report.json"
    started = time.time()
    with Prober(router_url(spec), spec["model"], threads=4) as load:
        proc = subprocess.run([PDKIT, "roll", str(spanning["rolled"]), "--report", str(report)], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # one batch over both ranks' hosts, gated by the deploy's own gate table (pdkit/agent/gates.py: rank 0's
    # /health, the other rank's unit staying up while rank 0 is ready)
    batch = next(m.group(1) for line in out.splitlines()
                 if (m := re.search(r"\]\s+(\S+)\s+ready\s+\d+ engine and daemon gate\(s\) passed", line)))
    assert set(batch.split(",")) == {head, rank1}, out[-3000:]
    nodes = {n["host"]: n for n in json.loads(report.read_text())["nodes"]}
    assert set(nodes) == {head, rank1}, f"expected only the spanning engine's hosts to roll: {sorted(nodes)}"
    assert nodes[head]["steps"] == nodes[rank1]["steps"], "the two ranks' hosts did not roll as one step"
    after = {h: unit_prop(lab, h, "InvocationID") for h in (head, rank1)}
    assert all(after[h] != before[h] for h in before), f"not every rank restarted: {before} -> {after}"
    for h in (head, rank1):
        argv, _ = process_of(lab, h)
        assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "96", f"{h} does not run the rolled argv"
        since = ssh(lab, h, f"date -d \"$(systemctl show -p ExecMainStartTimestamp --value {SPAN_UNIT})\" +%s").stdout.strip()
        assert int(since) >= int(started) - 1, f"{h}: {SPAN_UNIT} did not start during the roll"
    assert unit_prop(lab, other, "InvocationID", "pdkit-engine-decode.service") == other_before, "lab-gpu3's decode was restarted"
    failed = [o for o in load.outcomes if not o.ok]
    print(f"\nroll of {SPAN} over {batch}: {len(load.outcomes)} requests through the router during it, {len(failed)} failed")
    assert load.outcomes and not failed, [(o.status, o.detail) for o in failed[:5]]


def test_a_killed_rank_is_recovered_with_zero_lost_data_and_a_bounded_outage(lab, spanning):
    from pdkit.clients.router_api import RouterClient

    spec = spanning["spec"]
    head, rank1, other = *spec["ranks"], spec["other"]
    url = router_url(spec)
    client = RouterClient(url, drain_settle_s=0)
    other_decode = f"http://{spec['addr'][other]}:30001"
    restarts = {h: int(unit_prop(lab, h, "NRestarts")) for h in (head, rank1)}
    assert client.remove(other_decode) is not None, f"{other_decode} is not a router worker"
    try:
        deadline = time.monotonic() + 30
        while client.find(other_decode) is not None:  # gone (settle 0): the spanning decode serves alone
            assert time.monotonic() < deadline, f"{other_decode} still listed by the router"
            time.sleep(0.2)
        pid = unit_prop(lab, rank1, "MainPID")
        with Prober(url, spec["model"], threads=4) as probe:
            time.sleep(3)  # steady traffic before the kill
            assert probe.outcomes and all(o.ok for o in probe.outcomes), [(o.status, o.detail) for o in probe.outcomes if not o.ok][:3]
            kill_epoch = time.time()
            killed = time.monotonic()
            assert ssh(lab, rank1, f"kill -9 {pid}").returncode == 0
            deadline = killed + OUTAGE_BOUND_S + 60
            while True:
                after = [o for o in list(probe.outcomes) if o.started > killed]
                failures = [o for o in after if not o.ok]
                last_fail = max((o.ended for o in failures), default=None)
                recovered = [o for o in after if o.ok and last_fail is not None and o.started > last_fail]
                if len(recovered) >= 20:
                    break
                assert time.monotonic() < deadline, f"no recovery {OUTAGE_BOUND_S + 60:.0f} s after the kill: {len(failures)} failures, last {failures[-1:]}"
                time.sleep(0.5)
        outcomes = [o for o in probe.outcomes if o.started > killed]
        failures = [o for o in outcomes if not o.ok]
        last_fail = max(o.ended for o in failures)
        first_back = min((o for o in outcomes if o.ok and o.started > last_fail), key=lambda o: o.ended)
        outage_s = first_back.ended - killed
        first_fail = min(o.started for o in failures) - killed
        print(f"\nrank 1 of {SPAN} killed on {rank1}: first failed request {first_fail:.1f} s after the kill, "
              f"first success after the last failure {outage_s:.1f} s after it (the outage); "
              f"{len(outcomes)} requests after the kill, {len(failures)} failed with an error status, "
              f"statuses {sorted({o.status for o in failures})}")

        # zero lost data: every accepted request was served whole or refused with a clear error
        lost = probe.lost()
        assert not lost, [(o.status, o.detail) for o in lost[:5]]
        assert all(o.status >= 500 and o.detail for o in failures), [(o.status, o.detail) for o in failures[:5]]
        assert outage_s < OUTAGE_BOUND_S, f"outage {outage_s:.1f} s is above the bound {OUTAGE_BOUND_S:.0f} s"
        # the ranks met again: both restarted by systemd, rank 0 after an NCCL-style timeout, both up
        for h in (head, rank1):
            assert unit_prop(lab, h, "ActiveState") == "active"
            assert int(unit_prop(lab, h, "NRestarts")) > restarts[h], f"{SPAN_UNIT} on {h} was not restarted by systemd"
        log = ssh(lab, head, f"journalctl -u {SPAN_UNIT} -o cat --no-pager --since @{int(kill_epoch) - 1}").stdout
        assert "watchdog caught collective operation timeout" in log, log[-2000:]
        # after the recovery every request succeeds
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: requests.post(f"{url}/v1/completions", json={"model": spec["model"], "prompt": f"after {i}",
                                                                                              "max_tokens": MAX_TOKENS}, timeout=60).status_code, range(16)))
        assert answers == [200] * 16, answers
    finally:
        client.add(other_decode, "decode")
        client.wait_healthy([other_decode], timeout=120)
        wait_circuits_closed(spec)
