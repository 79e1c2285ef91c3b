"""The roller: one roll (or rollback) of an inventory, batch by batch: drain out of the routers,
apply (deploy/pd.py through pdkit.roll.pyinfra_api), the nodes' own gates, re-add, smoke requests,
and the restore of the release a batch ran before when a gate fails; its progress lines and
per-node timings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from pdkit.agent import gates
from pdkit.agent.engineshape import SHAPES_DIR
from pdkit.agent.health import READY_LOG_LINE, http_request, ready_marks_dir, worker_key
from pdkit.agent.releases import releases_dir
from pdkit.clients import answers
from pdkit.clients.router_api import REGULAR, Key, RouterClient, worker_type
from pdkit.hosts import gpuhealth
from pdkit.render import flags, jitplan
from pdkit.render.outages import Outage, batch_outages
from pdkit.render.paths import releases_command, router_metrics_url, router_url
from pdkit.roll.planning import (
    RUNNING_KEY_PROBE,
    RollError,
    covered_seconds,
    downtime_hold_s,
    expected_outage,
    key_fix,
    metric_sums,
    open_breakers,
    parse_running_key,
    restart_to_ready,
    router_keys,
    router_state_words,
    silence_window_s,
    sort_by_health,
)
from pdkit.roll.pyinfra_api import Pyinfra, run_remote

# DRAIN_GAUGES: engine gauges that must all read 0 before an engine may restart (running requests, PD queues)
from pdkit.upstream.metricnames import DRAIN_GAUGES, FAILURE_COUNTERS, ROUTER
from pdkit.upstream.versions import ROUTER_RELEASES

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

# a smoke completion's length: 2 tokens take the whole PD path (prefill, KV transfer, one decode step)
SMOKE_MAX_TOKENS = 2
# How long a router keeps a worker `draining` after the roll removes it. 0: the roll drains by
# the engine's own gauges above, so the router's settle (smg: 5 s by default) would only keep the
# node out of the router longer, and a re-add is refused (409) until it has passed.
ROUTER_DRAIN_SETTLE_S = 0
def answer_cache_dir() -> Path:
    """Where `pdkit roll` keeps each release's recorded answers on the deploying machine."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdkit" / "answers"


# Decodes leave the router first and come back last: with no decode both routers answer new
# requests 503 at once while the prefills' requests in flight finish, and serving resumes only
# once a prefill is there to pair with (tests/sim/test_router_no_workers.py)
REMOVAL_ORDER = {"decode": 0, "regular": 1, "prefill": 2}


class Progress:
    """One line per node and step, with the time since the roll started and the step's own time."""

    def __init__(self, stream=None) -> None:
        self.start = time.monotonic()
        self.stream = stream or sys.stdout

    def __call__(self, host: str, step: str, message: str, took: float | None = None) -> None:
        took_s = f" ({took:.1f} s)" if took is not None else ""
        print(f"[{time.monotonic() - self.start:7.1f}s] {host:<12} {step:<8} {message}{took_s}", file=self.stream,
              flush=True)


@dataclass
class NodeTiming:
    host: str
    total_s: float = 0.0
    # engine units planned on the node, and the wall time during which they restarted
    engines: int = 0
    engines_restart_to_ready_s: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    # --allow-downtime: seconds a router had no worker of a kind, from the drain to the re-add
    outage_s: float | None = None
    # what the roll announced for that outage before it began (planning.expected_outage), beside the measured one
    announced_outage_s: float | None = None
    # where that figure came from (planning.expected_outage: a warm restart of the same class, ...)
    announced_source: str | None = None
    # the deploy's own time: "prepare" (facts, deploy code; it runs beside the drain) and each
    # operation that ran on the node (inside `apply`)
    apply_detail: dict[str, float] = field(default_factory=dict)
    # time spent waiting for requests rather than doing the kit's work: the drain's own wait for
    # the engines' requests to finish, and the smoke requests' answers through the routers (a slow
    # or unreachable node elsewhere makes those slow, not the kit)
    waited: dict[str, float] = field(default_factory=dict)
    # each engine restarted in this step: its restart-to-ready and SGLang's own start-up phases of
    # that start, as the engine gate read them when it first saw it ready (pdkit.agent.health.startup_phases)
    engine_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    # model path -> the weights' page-cache residency before the drain and what was read in (Roller.warm_weights)
    weights: dict[str, Any] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.total_s - self.engines_restart_to_ready_s - sum(self.waited.values()))

    def summary(self) -> str:
        """The `done` line: where the node's time went."""
        waits = ", ".join(f"{k} {v:.1f} s" for k, v in self.waited.items())
        outage = f", service outage {self.outage_s:.1f} s" if self.outage_s is not None else ""
        if outage and self.announced_outage_s is not None:
            outage += f" (announced ~{self.announced_outage_s:.0f} s)"
        return (f"total {self.total_s:.1f} s, engines restart-to-ready {self.engines_restart_to_ready_s:.1f} s, "
                f"waited on requests {sum(self.waited.values()):.1f} s "
                f"({waits or 'none'}), kit overhead {self.overhead_s:.1f} s{outage}{phases_words(self.engine_phases)}")


def phases_words(engine_phases: dict[str, dict[str, float]]) -> str:
    """'; decode ready 53.1 s (SGLang: load_weight 0.1 s, ...)' per engine restarted, for the done line."""
    parts = []
    for unit, phases in engine_phases.items():
        name = unit.removeprefix("pdkit-engine-").removesuffix(".service")
        ready = phases.get("restart_to_ready_s")
        own = ", ".join(f"{k} {v:.1f} s" for k, v in phases.items() if k != "restart_to_ready_s")
        parts.append(f"{name} ready {ready:.1f} s" if ready is not None else name)
        if own:
            parts[-1] += f" (SGLang: {own})"
    return "".join(f"; {p}" for p in parts)



_TIMING_PROBE = r"""
import json, re, subprocess, sys
units, since = json.loads(sys.argv[1]), float(sys.argv[2])
out = {}
for u in units:
    show = dict(l.split("=", 1) for l in subprocess.run(
        ["systemctl", "show", "-p", "ActiveExitTimestampMonotonic,InactiveEnterTimestampMonotonic,"
         "InactiveExitTimestampMonotonic,InvocationID", u],
        capture_output=True, text=True).stdout.splitlines() if "=" in l)
    log = subprocess.run(
        ["journalctl", "--no-pager", "-o", "json", "_SYSTEMD_INVOCATION_ID=" + show.get("InvocationID", ""),
         "--grep", re.escape(sys.argv[3])],
        capture_output=True, text=True).stdout.splitlines()
    ready = json.loads(log[0])["__MONOTONIC_TIMESTAMP"] if log else None
    phases = {}
    try:  # the engine gate's mark of this invocation: SGLang's phases, and when it saw it ready
        mark = json.load(open(sys.argv[4] + "/" + u + ".json"))
        if mark.get("invocation") == show.get("InvocationID"):
            phases = mark.get("phases") or {}
            if ready is None:  # the line rotated away: when the engine gate first saw this invocation ready
                ready = mark.get("ready_monotonic_us")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    # [left active, ready line of this invocation, went inactive, started this invocation] (µs, node
    # clock), then SGLang's start-up phases of this invocation (s)
    out[u] = [int(show.get("ActiveExitTimestampMonotonic") or 0), int(ready) if ready else None,
              int(show.get("InactiveEnterTimestampMonotonic") or 0),
              int(show.get("InactiveExitTimestampMonotonic") or 0), phases]
print(json.dumps(out))
"""


def timing_probe_command(units: list[str]) -> str:
    """The shell command reading UNITS' restart and readiness times on a node (_TIMING_PROBE, stdlib
    only). The readiness line is the engine gate's own (pdkit.agent.health.READY_LOG_LINE), passed in."""
    q = shlex.quote
    marks = ready_marks_dir(SHAPES_DIR)
    return f"python3 -c {q(_TIMING_PROBE)} {q(json.dumps(units))} 0 {q(READY_LOG_LINE)} {q(marks)}"


@dataclass
class Recovery:
    """What Roller.put_back_in_service did after a failed step: the worker URLs the routers list
    healthy again, and those left out (URL -> why)."""

    readded: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def back(self) -> bool:
        """Some worker is back in the router (all of them when nothing is left out)."""
        return bool(self.readded)

    def words(self) -> str:
        return router_state_words(self.back, self.left_out)


@dataclass
class Roller:
    """Drives one roll (or rollback) of an inventory."""

    inventory: str
    spec: ClusterSpec
    progress: Progress
    drain_timeout_s: float = 300.0
    smoke_requests: int = 4
    router_timeout_s: float = 120.0
    timings: list[NodeTiming] = field(default_factory=list)
    # hosts whose state, read before the roll, already matches the plan (no file, no restart)
    unchanged: set[str] = field(default_factory=set)
    # --allow-downtime: a batch may take a router's last workers of a kind out (batch_outages)
    allow_downtime: bool = False
    # when the last drain took a router's last workers of a kind out (monotonic), until the re-add
    outage_since: float | None = None
    # the last outage's length, drain to re-add (seconds), for the report
    last_outage_s: float | None = None
    # each host's engines' last restart-to-ready (last_restart_to_ready), read once per roll
    restart_s: dict[str, float | None] = field(default_factory=dict)
    # host -> engine unit -> its start history on the node, and what the announcement takes from it
    # (pdkit/agent/enginestarts.py, planning.host_estimates), read once per roll by `pdkit roll`
    start_history: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    estimates: dict[str, dict[str, tuple[float, str] | None]] = field(default_factory=dict)
    # host -> unit -> restart-to-ready and SGLang's start-up phases of the engines its last step restarted
    engine_phases: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # the settle time the last drain held a regular worker draining for (hold_settle_s), or 0
    held_s: int = 0
    # router host -> the API key its running router was started with (read_router_keys); a host
    # missing here was not read: its client tries the inventory's key, then none
    running_keys: dict[str, Key] = field(default_factory=dict)
    # the worker URLs the last drain took out of a router: none after a failed drain means there is nothing to put back
    removed: list[str] = field(default_factory=list)
    # workers the last drain took out that the plan no longer has as they were listed (a layout
    # change: PD <-> unified, another split): url -> (router client, the router's own listing), so a
    # failed change puts them back as they were, not as the plan would have them
    retired: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # name -> connected pyinfra Host of the current batch (its gates run over these)
    connected: dict[str, Any] = field(default_factory=dict)
    # the command this Roller runs for (roll, rollback, tune): its silences' comments name it
    command: str = "roll"
    # the graded answer gate of the first batch that changes (the canary; pdkit/clients/answers.py GateConfig),
    # set by `pdkit roll` from pdkit_cluster.answers; None: no answer gate (rollback, tune: its own gate)
    answer_gate: Any = None
    answer_exact: bool = False
    # what the canary answered before its drain, and the gate's record once it ran
    answer_baseline: dict[str, Any] | None = None
    answer_record: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # lazy: pdkit.render.plan loads jinja2 (~40 ms), pdkit.hosts.silences costs ~10 ms more;
        # the CLI imports pdkit.roll for every command, and only a Roller needs them
        from pdkit.hosts.silences import Silencer
        from pdkit.render.plan import plan_cluster

        self.plans = plan_cluster(self.spec)
        self.pyinfra = Pyinfra(self.inventory)
        self.silencer = Silencer.for_spec(self.spec, f"pdkit {self.command}",
                                          lambda who, text: self.progress(who, "silence", text))

    def silenced(self, hosts: list[str], what: str, done: str, failed: str):
        """A context: HOSTS' alerts silenced in Alertmanager (pdkit/hosts/silences.py) from here until it
        ends, however it ends; the bound is silence_window_s of this Roller's timeouts."""
        # lazy: pdkit.hosts.silences costs ~10 ms at import; the CLI imports pdkit.roll for every command
        from pdkit.hosts.silences import host_matchers

        gate_s = max((s.ready_timeout_s for h in hosts for s in self.plans[h].services),
                     default=self.spec.cluster.ready_timeout_s)
        held = self.hold_settle_s(hosts) if self.held_kinds(batch_outages(self.spec, hosts)) else 0
        window = silence_window_s(self.drain_timeout_s, gate_s, self.router_timeout_s, held)
        return self.silencer.silenced(",".join(hosts), hosts, host_matchers(self.spec, hosts), window,
                                      f"{what} on {', '.join(hosts)}", done=done, failed=failed)

    # ---- routers and engines
    def routers(self):
        """(router host, client) per router; the same client objects on every call."""
        if not hasattr(self, "_routers"):
            self._routers = [
                (h, RouterClient(
                    router_url(h), keys=router_keys(self.spec, self.running_keys.get(h.name)),
                    key_fix=key_fix(self.inventory, h.name),
                    drain_settle_s=(ROUTER_DRAIN_SETTLE_S
                                    if ROUTER_RELEASES[self.spec.router_release(h)].per_worker_drain_settle else None),
                ))
                for h in self.spec.router_hosts
            ]
        return self._routers

    def read_router_keys(self) -> list[str]:
        """Read, on each router host, the key its running router was started with (its systemd
        credential: the exact key, whatever the key file says now) into running_keys; one line
        per host that could not be read (its client then tries the inventory's key, then none)."""
        notes: list[str] = []
        names = [h.name for h in self.spec.router_hosts]
        if not names:
            return notes
        _, connected, unreachable = self.pyinfra.connect(names)
        for name, why in unreachable.items():
            notes.append(f"{name}: cannot read the key its router runs with "
                         f"({why}); trying the inventory's key, then none")
        for name, host in connected.items():
            ok, stdout, _ = run_remote(host, RUNNING_KEY_PROBE, timeout=60)
            key = parse_running_key(stdout) if ok else None
            if not ok:
                notes.append(f"{name}: cannot read the key its router runs with (the "
                             "probe failed); trying the inventory's key, then none")
            elif key is None:
                notes.append(f"{name}: its router is not running; trying the inventory's key, then none")
            else:
                self.running_keys[name] = key
        return notes

    def workers_of(self, hosts: list[str]) -> list[tuple[Any, Any, str]]:
        """(router client, engine, url) for every engine of HOSTS that a router fronts."""
        out = []
        for router_host, client in self.routers():
            for h, e in self.spec.router_workers(router_host):
                if h.name in hosts:
                    out.append((client, e, flags.engine_url(self.spec, h, e)))
        return out

    def engine_urls(self, hosts: list[str]) -> dict[str, str]:
        return {f"{h.name}/{e.name}": flags.engine_url(self.spec, h, e)
                for h, e in self.spec.engines() if h.name in hosts}

    def scrape(self, urls: dict[str, str], names: Iterable[str],
               missing_ok: Iterable[str] = ()) -> dict[str, dict[str, float]]:
        """Each engine's sums of NAMES; an engine labelled in MISSING_OK that does not answer is left out."""
        out = {}
        for label, url in urls.items():
            status, body = http_request(f"{url}/metrics", timeout=10)
            if status != 200 and label in missing_ok:
                continue
            if status != 200:
                raise RuntimeError(f"{label}: {url}/metrics answered {status or 'nothing'}: {body.strip()[:160]}")
            out[label] = metric_sums(body, names)
        return out

    def circuit_states(self, router_host: Any) -> dict[str, float]:
        """worker URL -> smg_worker_cb_state (0 closed, 1 open, 2 half-open) from the router's metrics."""
        status, body = http_request(router_metrics_url(router_host), timeout=10)
        if status != 200:
            return {}  # sglang-router 0.3.2 has no breaker gauge: judge by /workers alone
        out = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == ROUTER["worker_cb_state"] and "worker" in sample.labels:
                    out[worker_key(sample.labels["worker"])] = sample.value
        return out

    def others_can_serve(self, hosts: list[str], accepted: frozenset[tuple[str, str]] = frozenset(),
                         also: Iterable[str] = ()) -> str | None:
        """None when, for every worker type the batch takes out of a router, another worker of that
        type stays registered, ready, healthy and with a closed (or half-open) circuit; else why not.
        ACCEPTED: (router host, worker type) outages the roll was told to accept (--allow-downtime).
        ALSO: listed URLs a layout change takes out besides the planned workers (listed_changed)."""
        leaving = self.workers_of(hosts)
        also = set(also)
        for router_host, client in self.routers():
            mine = {url for c, _, url in leaving if c is client}
            mine |= {w.url for w in client.workers() if worker_key(w.url) in also}
            if not mine:
                continue
            listed = client.workers()
            breakers = self.circuit_states(router_host)
            for kind in sorted({w.worker_type for w in listed if w.url in mine}):
                if (router_host.name, kind) in accepted:
                    continue
                others = [w for w in listed if w.worker_type == kind and w.url not in mine]
                usable = [w for w in others if w.routable and breakers.get(w.url, 0) != 1]
                if not usable:
                    state = ", ".join(
                        f"{w.url} ({'circuit open' if breakers.get(w.url) == 1 else w.status or 'unhealthy'})"
                        for w in others) or "none"
                    return (f"taking {', '.join(hosts)} out of {client.base_url} would leave no usable {kind} worker "
                            f"(others: {state})")
        return None

    # ---- steps
    def hold_settle_s(self, hosts: list[str]) -> int:
        """Seconds to keep a router's last regular worker listed `draining` through a downtime."""
        return downtime_hold_s(self.restart_s, hosts)

    def held_kinds(self, outages: list[Outage]) -> set[tuple[str, str]]:
        """(router host, kind) of the outages whose router answers 404 with no regular worker listed."""
        return {(o.router, REGULAR) for o in outages if REGULAR in o.kinds
                and ROUTER_RELEASES[self.spec.router_release(self.spec.host(o.router))].empty_regular_is_404}

    def listed_changed(self, hosts: list[str], listings: dict[int, list]) -> list[tuple[Any, Any, Any]]:
        """(router host, client, listed worker) for each worker a router lists on HOSTS' engine
        addresses that the plan does not have as listed (its URL or its worker type differ): what a
        layout change (PD <-> unified, another GPU split) takes away. Empty on an ordinary roll.
        LISTINGS: id(client) -> its /workers as the caller read them."""
        addresses = {flags.engine_url(self.spec, host, e).rsplit(":", 1)[0]
                     for host in map(self.spec.host, hosts) if host.node is not None for e in host.node.engines}
        planned = {(worker_key(url), worker_type(e.role)) for _, e, url in self.workers_of(hosts)}
        out = []
        for router_host, client in self.routers():
            for w in listings[id(client)]:
                url = worker_key(w.url)
                if url.rsplit(":", 1)[0] in addresses and (url, w.worker_type) not in planned:
                    out.append((router_host, client, w))
        return out

    def drain(self, hosts: list[str]) -> str:
        # a drain that fails before its first removal took nothing out (not the last batch's workers)
        self.removed = []
        self.retired = {}
        outages = batch_outages(self.spec, hosts)
        # each router's list as the drain begins, read once: what the layout changes and what it loses
        listings = {id(client): client.workers() for _, client in self.routers()}
        changed = self.listed_changed(hosts, listings)
        # a layout change: the kinds it takes away that no other worker of the router serves are an
        # outage too, accepted only with --allow-downtime
        leaving = {worker_key(w.url) for _, _, w in changed} | {url for _, _, url in self.workers_of(hosts)}
        lost_kinds: set[tuple[str, str]] = set()
        for router_host, client, w in changed:
            others = [o for o in listings[id(client)]
                      if o.worker_type == w.worker_type and worker_key(o.url) not in leaving]
            if not others:
                lost_kinds.add((router_host.name, w.worker_type))
        if (outages or lost_kinds) and not self.allow_downtime:
            lost = "; ".join([f"{o.url} would have no {' or '.join(o.kinds)} worker" for o in outages]
                             + [f"the layout change leaves {router} no {kind} worker"
                                for router, kind in sorted(lost_kinds)])
            raise RuntimeError(f"{lost}; nothing was removed (--allow-downtime accepts the outage)")
        accepted = frozenset({(o.router, kind) for o in outages for kind in o.kinds} | lost_kinds)
        # never take out the last usable worker of a kind (unless that outage is accepted): wait
        # (bounded) for the others to be usable
        deadline = time.monotonic() + self.drain_timeout_s
        retiring = {worker_key(w.url) for _, _, w in changed}
        while (why := self.others_can_serve(hosts, accepted, also=retiring)) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{why}; nothing was removed")
            time.sleep(1)
        router_of = {id(client): h.name for h, client in self.routers()}
        removals = [(client, worker_type(engine.role), url) for client, engine, url in self.workers_of(hosts)]
        changed_urls = {(id(client), worker_key(w.url)) for _, client, w in changed}
        removals = [r for r in removals if (id(r[0]), r[2]) not in changed_urls]
        # only what a router lists goes out (and comes back on a failure): an engine a layout change
        # adds is not listed yet, one an earlier failed step left out is not listed any more
        # (a router that lists no worker at all keeps the old rule: every planned worker is removed)
        # read again once the wait is over (the lists may have moved meanwhile): the one read that decides
        # what goes out and which engines were listed when it did
        listed = {(id(client), worker_key(w.url)) for _, client in self.routers() for w in client.workers()}
        listing = {c for c, _ in listed}
        removals = [r for r in removals if id(r[0]) not in listing or (id(r[0]), r[2]) in listed]
        removals += [(client, w.worker_type, worker_key(w.url)) for _, client, w in changed]
        removals.sort(key=lambda r: REMOVAL_ORDER.get(r[1], 1))
        self.removed = []
        held = self.held_kinds(outages)
        self.held_s = self.hold_settle_s(hosts) if held else 0
        if outages or lost_kinds:
            self.outage_since = time.monotonic()
        listed_as = {(id(client), worker_key(w.url)): w for _, client, w in changed}
        for client, kind, url in removals:
            client.remove(url, settle_s=(self.held_s if (router_of[id(client)], kind) in held else None))
            self.removed.append(url)
            if (id(client), url) in listed_as:
                self.retired[url] = (client, listed_as[(id(client), url)])
        urls = self.engine_urls(hosts)
        # the engines the layout change retires finish their requests too. An engine no router listed
        # when the drain began (one a layout change adds, or one found down and left out by an
        # earlier failed step) has no request of the router's in flight: when it does not answer,
        # it is not running and there is nothing to drain (a roll that fixes it must not stop here)
        urls.update({f"retired {url}": url for url in self.retired})
        listed_before = {url for _, url in listed}
        unlisted = ({label for label, url in urls.items() if worker_key(url) not in listed_before}
                    if self.routers() else set())
        deadline = time.monotonic() + self.drain_timeout_s
        while True:
            pages = self.scrape(urls, DRAIN_GAUGES, missing_ok=unlisted)
            busy = {k: {n: v for n, v in m.items() if v} for k, m in pages.items()}
            busy = {k: v for k, v in busy.items() if v}
            # an engine no router listed has none of the router's requests in flight: gauges it still
            # reports (a wedged scheduler's, or requests sent to it directly) are not waited on (issue 45)
            stale = sorted(k for k in busy if k in unlisted)
            busy = {k: v for k, v in busy.items() if k not in unlisted}
            if not busy:
                idle = len({url for label, url in urls.items() if label in pages and label not in stale})
                down = sorted(label for label in urls if label not in pages and not label.startswith("retired "))
                layout = (f" (a layout change: {len(self.retired)} of them not in the plan as listed)"
                          if self.retired else "")
                gone = (f", {len(down)} not running and in no router ({', '.join(down)}): nothing to drain"
                        if down else "")
                still = (f", {len(stale)} in no router still report requests ({', '.join(stale)}): none of the "
                         "router's, not waited on" if stale else "")
                return f"{len(removals)} worker(s) out of the router{layout}, {idle} engine(s) idle{gone}{still}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"engines still busy after {self.drain_timeout_s:.0f} s: {busy}")
            time.sleep(0.25)

    def readd(self, hosts: list[str], only: Iterable[str] | None = None) -> str:
        """HOSTS' workers back in their routers, healthy, breakers closed, then the router gates of
        HOSTS. ONLY: just these worker URLs (the put-back after a failed step); the router gates, which
        want every planned worker listed, then run only when ONLY is all of them."""
        every = self.workers_of(hosts)
        complete = True
        if only is not None:
            wanted = set(only)
            complete = {url for _, _, url in every} <= wanted
            every = [w for w in every if w[2] in wanted]
        workers = sorted(every, key=lambda w: -REMOVAL_ORDER[worker_type(w[1].role)])
        for client, engine, url in workers:
            # a held worker leaves the router's list when its settle time is up: wait that out too
            client.add(url, worker_type(engine.role),
                       engine.effective_bootstrap_port if engine.role == "prefill" else None,
                       timeout=self.router_timeout_s + self.held_s)
        by_client: dict[int, tuple[Any, list[str]]] = {}
        for client, _, url in workers:
            by_client.setdefault(id(client), (client, []))[1].append(url)
        for client, urls in by_client.values():
            client.wait_healthy(urls, timeout=self.router_timeout_s)
        # a re-added worker must also be routable: no circuit breaker left open on it (smg's gauge;
        # sglang-router 0.3.2 has none, so /workers alone decides there)
        for router_host, client in self.routers():
            urls = by_client.get(id(client), (client, []))[1]
            if not urls:
                continue
            deadline = time.monotonic() + self.router_timeout_s
            while still := open_breakers(self.circuit_states(router_host), urls):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"circuit breaker still open on {', '.join(still)} at "
                                       f"{client.base_url} {self.router_timeout_s:.0f} s after the re-add")
                time.sleep(0.25)
        self.held_s = 0
        served = f"{len(workers)} worker(s) back in the router, healthy, circuit breakers closed"
        # a router on the batch's hosts: its own gate from the table (every planned worker listed
        # healthy and one completion), now that the batch's workers are back in it
        routers, _ = self.run_gates(hosts, 1) if complete else (0, [])
        if routers:
            served += f"; {routers} router gate(s) passed"
        if self.outage_since is not None and complete:
            self.last_outage_s = time.monotonic() - self.outage_since
            self.outage_since = None
            served += f"; the router served again after a {self.last_outage_s:.1f} s outage"
        return served

    def readd_as_listed(self, urls: list[str]) -> str:
        """Workers a layout change took out, back in their routers as they were listed (type,
        bootstrap port), prefill before decode, then healthy."""
        order = sorted(urls, key=lambda u: -REMOVAL_ORDER.get(self.retired[u][1].worker_type, 1))
        for url in order:
            client, listed = self.retired[url]
            client.add(url, listed.worker_type, listed.bootstrap_port, timeout=self.router_timeout_s + self.held_s)
        by_client: dict[int, tuple[Any, list[str]]] = {}
        for url in order:
            client = self.retired[url][0]
            by_client.setdefault(id(client), (client, []))[1].append(url)
        for client, mine in by_client.values():
            client.wait_healthy(mine, timeout=self.router_timeout_s)
        self.held_s = 0
        return f"{len(order)} worker(s) back in the router as listed before the layout change, healthy"

    def gates_of(self, host: str, phase: int) -> list:
        """The gates (pdkit/agent/gates.py, the deploy's own) of HOST's planned services that run there:
        phase 0 the engines and daemons, phase 1 its router."""
        # lazy: pdkit.render.plan loads jinja2 (~40 ms); the CLI imports pdkit.roll for every command
        from pdkit.render.plan import services_not_started

        services = list(self.plans[host].services)
        held = services_not_started(self.spec, self.spec.host(host), services)
        return gates.phases(gates.gate_for(s) for s in services if s.unit not in held)[phase]

    def check_gpu_health_before_drain(self, host_name: str, host: Any) -> str:
        """No change onto a wedged GPU (pdkit/hosts/gpuhealth.py): its engines would fail to start or hang, and a
        one-node box would be down until a reset. Raises RollError naming the GPU and what was seen (nothing
        changed yet); else what was read ("" where nothing is: the sim, no GPU)."""
        wedged, said = gpuhealth.restart_check(self.spec, host_name,
                                               lambda cmd: run_remote(host, cmd, timeout=120))
        if wedged:
            self.progress(host_name, "FAILED", f"gate 'gpu-health': {said}")
            raise RollError(host_name, "gpu-health", f"{said}; nothing was changed: {gpuhealth.RESET_HINT}")
        return said

    def warm_weights(self, host_name: str, host: Any) -> tuple[dict[str, Any], str]:
        """Before the drain, while the node serves: the page-cache residency of the weights its
        engines will read at their restart (pdkit.agent.residency, mincore), and the cold part read in, so
        the outage never includes a disk read: (record, progress words); nothing to
        read (dummy weights, a hub id): ({}, ""). Never fails the roll: a node that cannot tell says so."""
        node = self.spec.host(host_name).node
        if node is None:  # no GPU node: no engine, no weights
            return {}, ""
        paths = sorted({m.path for e in node.engines
                        if (m := self.spec.engine_model(e)).load_format != "dummy" and m.path.startswith("/")})
        if not paths or self.spec.cluster.engine == "sim":  # the sim reads no weight files
            return {}, ""
        python = flags.node_python(self.spec)
        record: dict[str, Any] = {}
        words = []
        for path in paths:
            try:
                ok, stdout, stderr = run_remote(host, f"{shlex.quote(python)} -m pdkit.residency {shlex.quote(path)} "
                                                      "--warm", timeout=1800)
            except Exception as exc:  # noqa: BLE001 - evidence and a head start only: never a reason to stop
                ok, stdout, stderr = False, "", str(exc)
            try:
                got = (json.loads(stdout.strip().splitlines()[-1]) if ok
                       else {"error": (stderr or stdout).strip()[-300:]})
            except (ValueError, IndexError):
                got = {"error": f"unreadable answer: {stdout.strip()[-300:]}"}
            record[path] = got
            if "error" in got:
                words.append(f"{path}: residency not measured ({got['error']})")
                continue
            before = got["before"]
            gib = before["bytes"] / 2**30
            if "warm_s" in got:
                words.append(f"{path}: {before['ratio']:.0%} of {gib:.1f} GiB was in the page cache; read in "
                             f"{got['warm_s']:.1f} s before the drain (now {got['after']['ratio']:.0%})")
            else:
                words.append(f"{path}: all {gib:.1f} GiB in the page cache")
        return record, "; ".join(words)

    def run_gates(self, hosts: list[str], phase: int) -> tuple[int, list[str]]:
        """Run the gate table's gates of PHASE for HOSTS on each host, as the deploy runs them:
        (gates passed, hosts that have none). A failed gate raises with its own line."""
        python = flags.node_python(self.spec)
        wanted = {h: g for h in hosts if (g := self.gates_of(h, phase))}
        missing = [h for h in wanted if h not in self.connected]
        if missing:
            _, fresh, unreachable = self.pyinfra.connect(missing)
            if unreachable:
                h, why = next(iter(unreachable.items()))
                raise RuntimeError(f"{h}: cannot reach it over SSH to run its gates ({why})")
            self.connected.update(fresh)
        for h, found in wanted.items():
            timeout = int(max(g.timeout for g in found)) + 60
            ok, stdout, stderr = run_remote(self.connected[h], gates.command(python, found), timeout=timeout)
            if not ok:
                lines = [ln.removeprefix("FAILED").strip() for ln in (stderr or stdout).strip().splitlines()
                         if ln.strip()]
                raise RuntimeError(f"{h}: " + (" | ".join(ln for ln in lines if not ln.startswith("ok "))
                                               or "its gates failed"))
        return sum(len(g) for g in wanted.values()), [h for h in hosts if h not in wanted]

    def ready(self, hosts: list[str]) -> str:
        """The batch's engines and daemons by the deploy's own gates (pdkit/agent/gates.py: an engine's
        current invocation answers /health 200 and /server_info with the shape its configuration
        recorded; a daemon's URL 200), run on each host; a router is gated by the router step, once
        its workers are back."""
        passed, _ = self.run_gates(hosts, 0)
        return f"{passed} engine and daemon gate(s) passed (pdkit/agent/gates.py, run on the node)"

    def smoke(self, hosts: list[str]) -> str:
        urls = self.engine_urls(hosts)
        if not urls or not self.spec.router_hosts:
            return "no engines behind a router here"
        before = self.scrape(urls, FAILURE_COUNTERS)
        model = self.spec.cluster.model.name
        jobs = [(client, i) for _, client in self.routers() for i in range(self.smoke_requests)]
        # concurrently (greenlets under pyinfra's gevent): a few requests cost one request's time
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            answers = list(pool.map(
                lambda job: job[0].completion(model, f"pdkit roll smoke {hosts[0]} {job[1]}",
                                              max_tokens=SMOKE_MAX_TOKENS),
                jobs))
        for (client, i), (status, body) in zip(jobs, answers):
            if status != 200:
                raise RuntimeError(f"smoke request {i + 1} through {client.base_url} "
                                   f"answered {status or 'nothing'}: {body.strip()[:200]}")
        sent = len(jobs)
        after = self.scrape(urls, FAILURE_COUNTERS)
        moved = {k: {n: after[k][n] - before[k][n] for n in FAILURE_COUNTERS if after[k][n] != before[k][n]}
                 for k in urls}
        moved = {k: v for k, v in moved.items() if v}
        if moved:
            raise RuntimeError(f"KV transfer / bootstrap failure counters moved during the smoke requests: {moved}")
        return f"{sent} request(s) through the router succeeded; transfer and bootstrap failure counters unchanged"

    # ---- the canary's answers (pdkit/clients/answers.py, docs/correctness.md)
    def answer_target(self, batch: list[str]):
        from pdkit.bench.measure import engines_for  # lazy: the bench client loads only for a gate that sends

        return engines_for(self.spec, batch)

    def not_serving(self, batch: list[str]) -> list[str]:
        """The batch's router-fronted engines that do not answer /health 200 now or that their router
        does not list, each with why; a router that does not answer names itself."""
        workers = self.workers_of(batch)
        if not workers:
            return []
        answered = self.engine_health(sorted({url for _, _, url in workers}), timeout_s=0)
        listed: dict[int, set[str] | str] = {}
        for client, _, _ in workers:
            if id(client) not in listed:
                try:
                    listed[id(client)] = {worker_key(w.url) for w in client.workers()}
                except Exception as exc:  # noqa: BLE001 - the router's own failure is the reason given
                    listed[id(client)] = f"its router {client.base_url} did not list its workers ({exc})"
        lapsed = []
        for client, _, url in workers:
            status = answered[url][0]
            in_router = listed[id(client)]
            if status != 200:
                lapsed.append(f"{url} answers /health {status or 'nothing'}")
            elif isinstance(in_router, str):
                lapsed.append(f"{url}: {in_router}")
            elif worker_key(url) not in in_router:
                lapsed.append(f"{url} is not in its router")
        return lapsed

    def engines_not_answering(self, batch: list[str]) -> list[str]:
        """The engines of the batch's routes (as planned) whose /health does not answer 200 now."""
        target = self.answer_target(batch)
        engines = {e.label: e.url for r in target.routes for e in (r.prefill, r.engine) if e is not None}
        answered = self.engine_health(list(engines.values()), timeout_s=0)  # one pass: nothing to wait for here
        return [label for label, url in engines.items() if answered[url][0] != 200]

    def record_answers(self, batch: list[str], before: dict[str, str | None]) -> str:
        """The canary's answers on the release it runs now (before its drain): short greedy answers and
        the forced continuations at the gate's lengths; kept per release on this machine
        (answer_cache_dir), so a second roll from the same release reuses them."""
        from pdkit.bench.record import context_cap  # lazy: the bench package loads only for a gate that sends

        cfg = self.answer_gate
        measured = self.answer_target(batch)
        # part (d) is in the key only when on: turning it on records a baseline with its score
        acc_key = cfg.accuracy.key() if cfg.accuracy.enabled else None
        key = hashlib.sha256(json.dumps([cfg.key(), sorted(before.items(), key=str), measured.describe()]
                                        + ([acc_key] if acc_key else []),
                                        sort_keys=True, default=str).encode()).hexdigest()[:20]
        path = answer_cache_dir() / f"{self.spec.cluster.name}-{key}.json"
        if all(before.values()) and path.exists():
            self.answer_baseline = json.loads(path.read_text())
            releases = ", ".join(sorted(set(map(str, before.values()))))
            return f"baseline of release(s) {releases} recorded earlier ({path})"
        short = answers.ask(measured, {}, answers.prompts(cfg.short_prompts), cfg.short_tokens,
                            cfg.short_concurrency) if cfg.short_prompts else []
        errors = [a["error"] for a in short if "error" in a]
        if errors:
            raise RuntimeError(f"{len(errors)} short prompt(s) failed: {errors[:2]}")
        forced = (answers.record_forced(measured, cfg, context_cap(self.spec) or 1 << 30) if cfg.lengths
                  else {"items": [], "notes": []})
        self.answer_baseline = {"short": short, "forced": forced}
        said = ""
        if cfg.accuracy.enabled:
            # (d): the baseline's score and interval, once per release (its runs' files beside the answers)
            acc = answers.eval_accuracy(measured, cfg.accuracy, self.spec.cluster.model.name,
                                        answer_cache_dir() / "eval")
            if acc["problems"]:
                raise RuntimeError(f"accuracy: the baseline's eval cannot be judged: {'; '.join(acc['problems'])} "
                                   f"({acc.get('run_dir')})")
            self.answer_baseline["accuracy"] = acc
            said = (f"; accuracy {acc['skipped']}" if acc.get("skipped") else
                    f"; accuracy {acc['score']:.3f} (95% CI {acc['ci95'][0]:.3f}-{acc['ci95'][1]:.3f}) in "
                    f"{acc['seconds']:.0f} s via {acc['via']}")
        if all(before.values()):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.write_text(json.dumps(self.answer_baseline))
            path.chmod(0o600)
        lengths = ", ".join(str(i["prompt_tokens"]) for i in forced["items"]) or "none"
        return (f"baseline recorded before the drain ({measured.via}): {len(short)} short answer(s), forced "
                f"continuations at {lengths} prompt tokens" + "".join(f"; {n}" for n in forced.get("notes", []))
                + said)

    def check_answers(self, batch: list[str]) -> str:
        """The canary's answers against its baseline: (a) short answers, (b) forced scores, (c) the same
        under load; exact or within the tolerance (pdkit_cluster.answers.exact). Raises at the first part
        that fails: the batch then goes back on its release."""
        cfg, base = self.answer_gate, self.answer_baseline or {}
        measured = self.answer_target(batch)
        start = time.monotonic()
        record: dict[str, Any] = {"exact": self.answer_exact, "tolerance": vars(cfg.tolerance), "parts": {}}
        self.answer_record = record
        done = []
        if base.get("short"):
            comparison = answers.compare(base["short"], answers.ask(measured, {}, answers.prompts(len(base["short"])),
                                                                     cfg.short_tokens, cfg.short_concurrency))
            ok, why = answers.correctness_verdict(comparison, cfg.min_match_rate, self.answer_exact)
            record["parts"]["short"] = {"ok": ok, "detail": why, "seconds": round(time.monotonic() - start, 2)}
            if not ok:
                raise RuntimeError(f"short: {why}")
            done.append(f"short: {why}")
        if base.get("forced", {}).get("items"):
            from pdkit.bench.load import LoadThread  # lazy: aiohttp loads only for a gate that sends

            outcome = answers.run_parts(measured, cfg, base["forced"], exact=self.answer_exact,
                                        load_factory=lambda c: LoadThread(measured, {}, c, cfg.load_input_len,
                                                                          answers.LOAD_OUTPUT_LEN,
                                                                          timeout_s=cfg.timeout_s))
            record["parts"].update(outcome.record["parts"])
            if not outcome.ok:
                raise RuntimeError(outcome.detail)
            done.append(outcome.detail)
        if base.get("accuracy"):
            # (d): the canary's eval against the baseline's score (the same endpoint rule, so the same skip)
            acc = answers.eval_accuracy(measured, cfg.accuracy, self.spec.cluster.model.name,
                                        answer_cache_dir() / "eval")
            ok, why = answers.accuracy_check(base["accuracy"], acc, cfg.accuracy)
            record["parts"]["accuracy"] = {**acc, "ok": ok, "detail": why, "baseline": {
                k: base["accuracy"].get(k) for k in ("score", "stderr", "ci95", "num_examples", "n_repeats", "run_dir",
                                                     "skipped")}}
            if not ok:
                raise RuntimeError(why)
            done.append(why)
        record["seconds"] = round(time.monotonic() - start, 2)
        return "; ".join(done) or "no part configured"

    def current_releases(
        self, state: Any, hosts: dict[str, Any],
    ) -> tuple[dict[str, str | None], dict[str, int | None]]:
        """(the release each node runs now, the node's monotonic clock in µs), one round trip per node."""
        current = shlex.quote(f"{releases_dir(self.spec.cluster.install_dir)}/CURRENT")
        releases: dict[str, str | None] = {}
        clocks: dict[str, int | None] = {}
        for name, host in hosts.items():
            ok, stdout, _ = run_remote(host, f"cut -d' ' -f1 /proc/uptime; cat {current} 2>/dev/null || true",
                                       timeout=60)
            lines = stdout.split()
            clocks[name] = int(float(lines[0]) * 1e6) if ok and lines else None
            releases[name] = lines[1] if ok and len(lines) > 1 else None
        return releases, clocks

    def releases_command(self, host: str, action: str, *extra: str) -> str:
        return f"{releases_command(self.spec)} {action} " + " ".join(shlex.quote(x) for x in extra)

    def restore(self, host_name: str, host: Any, to: str | None) -> str:
        ok, stdout, stderr = run_remote(host, self.releases_command(host_name, "restore",
                                                                    *(["--to", to] if to else [])))
        if not ok:
            raise RuntimeError((stderr.strip().splitlines() or ["restore failed"])[-1])
        result = json.loads(stdout.strip().splitlines()[-1])
        return (f"back on release {result['id']} ({len(result['written'])} file(s) rewritten, "
                f"restarted {', '.join(result['restarted']) or 'nothing'})")

    def engines_restart_to_ready(self, host: Any, host_name: str, since_monotonic_us: int | None) -> float:
        """Wall time during which at least one of the node's engines restarted in this step was
        between its restart and its readiness line (node clock): engines that restart together
        count once, so overlapping restarts never hide the kit's own time."""
        units = [s.unit for s in self.plans[host_name].services if s.kind == "engine"]
        if not units:
            return 0.0
        ok, stdout, _ = run_remote(host, timing_probe_command(units), timeout=60)
        if not ok:
            return 0.0
        probe = json.loads(stdout)
        # from the stop of a running engine, or from the start of one this step added (never active before)
        began = {unit: v[0] or v[3] for unit, v in probe.items()}
        restarted = {
            unit: values for unit, values in probe.items()
            if values[1] and began[unit] and (since_monotonic_us is None or began[unit] >= since_monotonic_us)
            and values[1] > began[unit]
        }
        self.engine_phases[host_name] = {
            unit: {"restart_to_ready_s": round((v[1] - began[unit]) / 1e6, 2), **(v[4] if len(v) > 4 else {})}
            for unit, v in restarted.items()
        }
        return covered_seconds([(began[unit], v[1]) for unit, v in restarted.items()])

    def last_restart_to_ready(self, host: Any, host_name: str) -> float | None:
        """Seconds the node's running engines took from their last stop (or their start, after a
        boot) to SGLang's readiness line, the slowest of them; None when no engine logged one."""
        units = [s.unit for s in self.plans[host_name].services if s.kind == "engine"]
        if not units:
            return None
        ok, stdout, _ = run_remote(host, timing_probe_command(units), timeout=60)
        return restart_to_ready(json.loads(stdout)) if ok else None

    # ---- one batch
    def roll_batch(self, batch: list[str]) -> None:
        p = self.progress
        t0 = time.monotonic()
        step = time.monotonic()
        state, hosts, unreachable = self.pyinfra.connect(batch)
        if unreachable:
            name, why = next(iter(unreachable.items()))
            p(name, "FAILED", f"gate 'connect': cannot reach it over SSH ({why})")
            raise RollError(name, "connect", f"cannot reach it over SSH ({why}); nothing was changed on it")
        self.connected = dict(hosts)
        before, clocks = self.current_releases(state, hosts)
        for h in batch:
            p(h, "connect", f"on release {before[h] or '(none recorded)'}", time.monotonic() - step)
        if all(h in self.unchanged for h in batch):
            # the plan read before the roll found nothing to change: leave it serving, in the router,
            # once it is seen to be so (a step cut short, e.g. a killed `pdkit tune`, leaves the files
            # as planned with the engines restarting and drained: the lent H100, 2026-12-07)
            step = time.monotonic()
            lapsed = self.not_serving(batch)
            if not lapsed:
                for h in batch:
                    p(h, "done", "no change: files and services already as planned; serving and in the router")
                return
            p(",".join(batch), "heal", f"no file or service to change, but {'; '.join(lapsed)}: rolled through "
                                       "drain, apply, gates and re-add to put it back", time.monotonic() - step)
        timings = {h: NodeTiming(h, engines=sum(s.kind == "engine" for s in self.plans[h].services)) for h in batch}
        check_answers = (self.answer_gate is not None and self.answer_record is None and bool(self.spec.router_hosts)
                         and any(t.engines for t in timings.values()))
        if check_answers:
            step = time.monotonic()
            missing = self.engines_not_answering(batch)
            if missing:
                # nothing to compare with: a layout change (engines the plan adds) or an engine already down
                check_answers = False
                p(",".join(batch), "answers", f"skipped: {', '.join(missing)} answer(s) no /health before the change "
                                              "(an engine this change adds, or one already down); pdkit tune compares "
                                              "layouts", time.monotonic() - step)
        if check_answers:
            try:
                message = self.record_answers(batch, before)
            except Exception as exc:  # noqa: BLE001 - nothing was changed yet: the roll stops before the drain
                p(",".join(batch), "FAILED", f"gate 'answers': the baseline could not be recorded: {exc}")
                raise RollError(",".join(batch), "answers", f"the baseline could not be recorded before the drain "
                                                            f"({exc}); nothing was changed") from exc
            p(",".join(batch), "answers", message, time.monotonic() - step)
        for h in batch:
            if timings[h].engines:
                step = time.monotonic()
                if said := self.check_gpu_health_before_drain(h, hosts[h]):
                    p(h, "gpu-health", said, time.monotonic() - step)
                step = time.monotonic()
                timings[h].weights, message = self.warm_weights(h, hosts[h])
                if message:
                    p(h, "weights", message, time.monotonic() - step)
                # JIT caches cold for the release its engines will run: a warning with the cost, never a refusal
                if message := jitplan.pre_restart_warning(
                        self.spec, h, partial(run_remote, hosts[h], timeout=60)):
                    p(h, "jit", message)
        done_drain = False
        self.last_outage_s = None
        outages = batch_outages(self.spec, batch)
        if self.held_kinds(outages):
            for h in batch:
                if h not in self.restart_s:
                    self.restart_s[h] = self.last_restart_to_ready(hosts[h], h)
        for outage in outages:
            p(",".join(batch), "downtime", f"accepted: {outage.lost()} from the drain until the "
                                           "re-add; new requests get its error status meanwhile")

        def gate(name: str, fn: Callable[[list[str]], str], started: float | None = None) -> None:
            start = time.monotonic() if started is None else started
            try:
                message = fn(batch)
            except RollError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure of a gate is reported the same way
                raise RollError(",".join(batch), name, str(exc)) from exc
            took = time.monotonic() - start
            for h in batch:
                timings[h].steps[name] = took
            p(",".join(batch), name, message, took)

        # the batch's alerts do not page while it is drained, restarted and gated; the silence ends
        # with the step: after the re-add and smoke, or after the restore when a gate failed (a node
        # left broken then pages)
        with self.silenced(batch, "drain, apply, gates, re-add, smoke", done="rolled, ready and back in the router",
                           failed="the roll stopped on it: expired after the "
                                  "restore, so whatever is still wrong pages"):
            try:
                # The deploy's prepare only reads the nodes (facts) and decides the operations, so it
                # runs while the drain (HTTP to routers and engines only) waits for the engines to go idle.
                drain_started = time.monotonic()
                drain_own: list[float] = []

                def timed_drain(b: list[str]) -> str:
                    try:
                        return self.drain(b)
                    finally:
                        drain_own.append(time.monotonic() - drain_started)

                with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdkit-roll-drain") as pool:
                    drained = pool.submit(timed_drain, batch)
                    prepare_errors = self.pyinfra.prepare(batch, state)
                gate("drain", lambda _: drained.result(), started=drain_started)
                done_drain = True

                def apply(b: list[str]) -> str:
                    errors = prepare_errors or self.pyinfra.execute(b, state)  # the batch's State: connected once
                    if errors:
                        h, why = next(iter(sorted(errors.items())))
                        raise RollError(h, "apply", why)
                    phases = self.pyinfra.phases
                    return (f"deploy/pd.py applied; changed services restarted and passed their health gates "
                            f"(prepared while draining: {phases.get('prepare', 0):.1f} "
                            f"s; execute {phases.get('execute', 0):.1f} s)")

                gate("apply", apply)
                gate("ready", self.ready)
                gate("router", self.readd)
                gate("smoke", self.smoke)
                if check_answers:
                    gate("answers", self.check_answers)
            except RollError as exc:
                p(exc.host, "FAILED", f"gate '{exc.gate}': {exc.message}")
                # after an apply was attempted the batch goes back on its release first; after a
                # failed drain nothing was applied: only what the drain took out goes back
                exc.restored = done_drain
                recovery = self.put_back_in_service(batch, restore_to=before if done_drain else None)
                exc.readded = None if recovery is None else recovery.back
                exc.left_out = {} if recovery is None else recovery.left_out
                raise
        for h in batch:
            timings[h].total_s = time.monotonic() - t0
            timings[h].apply_detail = {"prepare": self.pyinfra.phases.get("prepare", 0.0),
                                       **self.pyinfra.operations.get(h, {})}
            timings[h].engines_restart_to_ready_s = self.engines_restart_to_ready(hosts[h], h, clocks[h])
            timings[h].engine_phases = self.engine_phases.get(h, {})
            timings[h].outage_s = self.last_outage_s
            if outages and self.last_outage_s is not None:
                timings[h].announced_outage_s, timings[h].announced_source = expected_outage(
                    self.restart_s, batch, self.spec.cluster.ready_timeout_s, self.estimates)
            timings[h].waited = {"drain": drain_own[0] if drain_own else 0.0,
                                 "smoke": timings[h].steps.get("smoke", 0.0)}
            t = timings[h]
            p(h, "done", t.summary())
            self.timings.append(t)

    def bake(self, batch: list[str], seconds: float) -> None:
        """Let the canary serve for SECONDS, then check it again before any other node is touched."""
        p = self.progress
        p(",".join(batch), "bake", f"canary serves for {seconds:.0f} s before the next node")
        time.sleep(seconds)
        start = time.monotonic()
        try:
            message = self.ready(batch) + "; " + self.smoke(batch)
        except Exception as exc:  # noqa: BLE001
            raise RollError(",".join(batch), "bake", str(exc)) from exc
        p(",".join(batch), "bake", message, time.monotonic() - start)

    def restore_batch(self, batch: list[str], before: dict[str, str | None]) -> None:
        """Put every node of BATCH back on the release it ran before (BEFORE), together; one line
        per node, a failure reported and not raised (the put-back goes on to the router)."""
        p = self.progress

        def one(h: str) -> None:
            start = time.monotonic()
            if before.get(h) is None:
                p(h, "restore", "no earlier release recorded on this node: "
                                "left as it is (roll it with a fixed inventory)")
                return
            try:
                # a fresh connection: the failed deploy's State is done
                _, fresh, unreachable = self.pyinfra.connect([h])
                if unreachable:
                    raise RuntimeError(f"cannot reach it over SSH: {unreachable[h]}")
                self.connected[h] = fresh[h]
                p(h, "restore", self.restore(h, fresh[h], before[h]), time.monotonic() - start)
            except Exception as exc:  # noqa: BLE001 - report and go on to the router
                p(h, "restore", f"FAILED: {exc}")

        # the nodes of the batch restore together: the ranks of an engine spanning nodes must
        # restart together (rank 0 is ready only once every rank joined it), one after the
        # other each restore would wait on a rank still running the failed release
        with ThreadPoolExecutor(max_workers=max(1, len(batch)), thread_name_prefix="pdkit-roll-restore") as pool:
            list(pool.map(one, batch))

    def engine_health(self, urls: list[str], timeout_s: float) -> dict[str, tuple[int, str]]:
        """Each engine URL's own GET /health answer (status, body), polled until every one answers
        200 or TIMEOUT_S has passed: the last answer of each."""
        answers: dict[str, tuple[int, str]] = {}
        deadline = time.monotonic() + timeout_s
        while True:
            for url in urls:
                if answers.get(url, (0, ""))[0] != 200:
                    answers[url] = http_request(f"{url}/health", timeout=5)
            if all(status == 200 for status, _ in answers.values()) or time.monotonic() > deadline:
                return answers
            time.sleep(1)

    def put_back_in_service(self, hosts: list[str],
                            restore_to: dict[str, str | None] | None = None) -> Recovery | None:
        """After a failed step of a roll, rollback or tune: every path's one way back into service.
        RESTORE_TO (host -> release): first put each host back on that release (restore_batch).
        Then each worker the last drain took out goes back in its router if its engine's own
        /health answers 200 (waited for up to router_timeout_s); the others are left out, named,
        with their answer. What the routers list afterwards is what is reported (a re-add that
        fails half way still leaves the added workers in). None when the drain took nothing out."""
        p = self.progress
        if restore_to is not None:
            self.restore_batch(hosts, restore_to)
        workers = self.workers_of(hosts)
        taken = [url for _, _, url in workers if url in set(self.removed) and url not in self.retired]
        taken += [url for url in self.retired if url in set(self.removed)]
        who = ",".join(hosts)
        if not taken:
            if restore_to is None:
                p(who, "router", "nothing was taken out of the router: nothing to put back")
            return None
        healthy, left_out = sort_by_health(self.engine_health(sorted(set(taken)), self.router_timeout_s))
        error = ""
        # a layout change's workers go back as the router listed them before the change (the node
        # is back on that release), the others as planned
        back_as_listed = [url for url in healthy if url in self.retired]
        planned_back = [url for url in healthy if url not in self.retired]
        if back_as_listed:
            try:
                p(who, "router", self.readd_as_listed(back_as_listed))
            except Exception as exc:  # noqa: BLE001 - what the routers list below is what counts
                error = str(exc)
        if planned_back:
            try:
                p(who, "router", self.readd(hosts, only=planned_back))
            except Exception as exc:  # noqa: BLE001 - what the routers list below is what counts
                error = error or str(exc)
        listed: dict[str, bool] = {}
        for _, client in self.routers():
            try:
                for w in client.workers():
                    listed[w.url] = listed.get(w.url, False) or w.routable
            except Exception as exc:  # noqa: BLE001
                error = error or str(exc)
        for url in healthy:
            if not listed.get(url):
                left_out[url] = (f"healthy, but the re-add failed: {error}" if error
                                 else "healthy, but no router lists it healthy")
        for url in left_out:
            if url in listed and not listed[url]:
                # added by the failed re-add step: not taken out again (on the release it was put
                # back on, it serves once healthy), but said, so "left out" never hides it
                left_out[url] += "; the router still lists it, unhealthy: it gets requests once its health check passes"
        recovery = Recovery(readded=[u for u in taken if u in healthy and u not in left_out], left_out=left_out)
        for url, why in sorted(left_out.items()):
            p(who, "router", f"left out of the router: {url}: {why}")
        if not recovery.back:
            p(who, "router", f"could not add the engines back: {recovery.words()}")
        else:
            p(who, "router", f"put back in service: {len(recovery.readded)} worker(s) in the router; "
                             f"{recovery.words()}")
        return recovery
