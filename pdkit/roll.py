"""`pdkit roll | releases | rollback`: ordered, drained, gated rolling changes with per-node releases.

    pdkit roll INVENTORY [--limit HOST ...] [--canary HOST] [--batch N] [--dry]
    pdkit releases INVENTORY HOST
    pdkit rollback INVENTORY HOST [--to RELEASE]

pyinfra has no gate between hosts and does not keep host order under --serial (pyinfra
3.10.0: State.active_hosts is a set, pyinfra/api/state.py), so the rollout is driven here through pyinfra's API: gevent patched first,
one State per batch (connect, load deploy/pd.py, run_ops). Per batch: connect, drain its
engines out of the router, apply, check readiness, add them back, smoke requests through the
router with the engines' KV failure counters unchanged. A failed gate puts the batch back on
the release it ran before (pdkit/releases.py), and the roll stops with a non-zero exit that
names the node and the gate. docs/rolling.md has the whole story.

The top half is pure planning (order, batches, version pairing, the dry-plan diff), unit
tested without hosts; the bottom half talks to hosts.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# DRAIN_GAUGES: engine gauges that must all read 0 before an engine may restart (running requests, PD queues)
from pdkit.metricnames import DRAIN_GAUGES, FAILURE_COUNTERS, ROUTER
from pdkit.paths import router_metrics_url, router_url
from pdkit.releases import releases_dir
from pdkit.router_api import Key, worker_type

if TYPE_CHECKING:
    from pdkit.plan import HostPlan
    from pdkit.spec import ClusterSpec

REPO = Path(__file__).resolve().parent.parent
DEPLOY_FILE = "deploy/pd.py"
EXIT_FAILED = 1
CONNECT_ATTEMPTS = 3
EXIT_INVALID = 2
# a smoke completion's length: 2 tokens take the whole PD path (prefill, KV transfer, one decode step)
SMOKE_MAX_TOKENS = 2
# How long a router keeps a worker `draining` after the roll removes it. 0: the roll drains by
# the engine's own gauges above, so the router's settle (smg: 5 s by default) would only keep the
# node out of the router longer, and a re-add is refused (409) until it has passed.
ROUTER_DRAIN_SETTLE_S = 0
# How long a downtime roll keeps a router's last regular worker listed `draining` (smg answers
# 404 once none is listed, 503 + Retry-After while one drains): the slowest measured
# restart-to-ready x HOLD_FACTOR + HOLD_MARGIN_S (drain, apply, re-add), at most HOLD_MAX_S;
# HOLD_UNMEASURED_S when the node's engines never logged a restart
HOLD_FACTOR, HOLD_MARGIN_S, HOLD_MAX_S, HOLD_UNMEASURED_S = 1.5, 10, 600, 60
# Decodes leave the router first and come back last: with no decode both routers answer new
# requests 503 at once while the prefills' requests in flight finish, and serving resumes only
# once a prefill is there to pair with (tests/sim/test_router_no_workers.py)
REMOVAL_ORDER = {"decode": 0, "regular": 1, "prefill": 2}
# What a step's Alertmanager silence must outlast (silence_window_s): a new engine environment
# installed inside the apply (real SGLang 0.5.23 installs took 227-236 s: docs/benchmarks.md),
# and a restore's command on the node (run_remote's timeout)
APPLY_INSTALL_S, RESTORE_S = 900, 900


class RollError(RuntimeError):
    """A gate failed: names the node and the gate."""

    def __init__(self, host: str, gate: str, message: str) -> None:
        super().__init__(f"{host}: gate '{gate}' failed: {message}")
        self.host, self.gate, self.message = host, gate, message
        # set by roll_batch: whether the batch was put back on its previous release (an apply was
        # attempted), so the final line never claims a restore when nothing was changed
        self.restored: bool | None = None
        # set by roll_batch: whether the batch's engines are back in the router (None: none was
        # taken out), so the final line never claims they are when the re-add failed
        self.readded: bool | None = None


def router_state_words(readded: bool | None) -> str:
    """Pure: where the batch's engines stand with the router after a failed gate, for the last line."""
    if readded is None:
        return "nothing was taken out of the router"
    if readded:
        return "its engines are back in the router"
    return "its engines are NOT back in the router (the re-add failed: see 'could not add' above)"


def stop_summary(exc: RollError, untouched: list[str]) -> str:
    """Pure: the roll's last line after a failed gate: what state the failed node is in."""
    rest = f"not touched: {', '.join(untouched) or 'none'}"
    if exc.restored:
        return f"pdkit roll: {exc.host} is back on its previous release where one was recorded; {router_state_words(exc.readded)}; {rest}"
    if exc.gate == "connect":
        return f"pdkit roll: {exc.host} could not be reached: nothing was changed on it; {rest}"
    return f"pdkit roll: {exc.host}: nothing was applied (gate '{exc.gate}' failed before the deploy); {router_state_words(exc.readded)}; {rest}"


# ================================================================ pure planning


def rollout_order(spec: ClusterSpec, *, limit: Iterable[str] | None = None, canary: str | None = None) -> list[str]:
    """The order hosts are rolled in: canary, other GPU nodes, router hosts, then hosts without engines.

    The default canary is the first GPU node that runs no router (a broken canary then never
    takes the router down with it). Router hosts go after the other GPU nodes so that a
    router restart, if any, comes once every engine runs the new configuration.
    """
    spec.check_limit(limit or ())
    names = [h.name for h in spec.hosts]
    wanted = list(names) if not limit else [n for n in names if n in set(limit)]
    if canary is not None and canary not in wanted:
        raise ValueError(f"--canary {canary} is not among the hosts being rolled ({', '.join(wanted)})")

    def rank(name: str) -> int:
        host = spec.host(name)
        if host.node is not None and spec.placements(host) and host.router is None:
            return 0
        if host.router is not None:
            return 1
        return 2

    ordered = sorted(wanted, key=lambda n: (rank(n), names.index(n)))
    if canary is None:
        canary = next((n for n in ordered if rank(n) == 0), ordered[0] if ordered else None)
    return [canary, *(n for n in ordered if n != canary)] if canary else []


def version_changes(spec: ClusterSpec, current: dict[str, dict[str, str]]) -> set[tuple[str, str]]:
    """(host, engine) whose planned SGLang version differs from the one its node runs now.

    current: host -> engine -> version, from the nodes' release.json; an engine a node does not
    run yet is no version change (it starts fresh).
    """
    out = set()
    for host, engine in spec.engines():
        running = current.get(host.name, {}).get(engine.name)
        if running is not None and running != spec.engine_version(engine):
            out.add((host.name, engine.name))
    return out


def pairing_units(spec: ClusterSpec, changed: set[tuple[str, str]]) -> tuple[list[set[str]], list[str]]:
    """Hosts that must roll together so that no prefill and decode serve together on different versions.

    A PD group with a version change rolls as one unit (all its hosts in one batch). A router in
    PD mode pairs ANY prefill with ANY decode it fronts, whatever their group, so when it fronts
    several groups and any of them changes version, all of its workers' hosts become one unit.
    Returns (units of 2+ hosts, one explanation line per unit).
    """
    parent: dict[str, str] = {h.name: h.name for h in spec.hosts}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    reasons: dict[frozenset[str], str] = {}
    groups: dict[str, list[tuple[str, str]]] = {}
    for host, engine in spec.engines():
        if engine.role != "unified":
            groups.setdefault(engine.pd_group, []).append((host.name, engine.name))
    changed_groups = {g for g, members in groups.items() if any(m in changed for m in members)}
    for g in sorted(changed_groups):
        hosts = sorted({h for h, _ in groups[g]})
        for h in hosts[1:]:
            union(hosts[0], h)
        if len(hosts) > 1:
            reasons[frozenset(hosts)] = f"PD group {g!r} changes SGLang version: its hosts {', '.join(hosts)} roll together as one batch"
    for router in spec.router_hosts:
        fronted = spec.router_workers(router)
        fronted_groups = {e.pd_group for _, e in fronted if e.role != "unified"}
        if len(fronted_groups) > 1 and fronted_groups & changed_groups:
            hosts = sorted({h.name for h, e in fronted if e.role != "unified"})
            for h in hosts[1:]:
                union(hosts[0], h)
            reasons[frozenset(hosts)] = (
                f"the router on {router.name} pairs any prefill with any decode of groups {', '.join(sorted(fronted_groups))} and a version changes: "
                f"hosts {', '.join(hosts)} roll together as one batch (they leave and rejoin the router together, which drains all of its workers at once)"
            )
    units: dict[str, set[str]] = {}
    for name in parent:
        units.setdefault(find(name), set()).add(name)
    multi = [u for u in units.values() if len(u) > 1]
    explanations = [reasons.get(frozenset(u)) or f"hosts {', '.join(sorted(u))} roll together (shared PD groups change SGLang version)" for u in multi]
    # a unit joined from overlapping reasons gets every reason that touched it
    for u, line in zip(multi, list(explanations)):
        extra = [r for k, r in reasons.items() if k <= u and r != line]
        if extra:
            explanations[explanations.index(line)] = "; ".join([line, *extra])
    return multi, explanations


def spanning_units(spec: ClusterSpec) -> tuple[list[set[str]], list[str]]:
    """Every engine spanning nodes is one unit of rollout: its hosts go in one batch, so rank 0
    is drained from the router once, every rank restarts together (one deploy over the batch),
    the gates wait on rank 0's readiness and a real request, and a failure rolls every rank back.
    Returns (units, one explanation line per engine)."""
    units, lines = [], []
    for host, engine in spec.engines():
        if engine.spans_nodes:
            hosts = [h.name for h in spec.engine_hosts(host, engine)]
            units.append(set(hosts))
            lines.append(f"engine {host.name}/{engine.name} spans {', '.join(hosts)}: one step (rank 0 on {host.name} drained from "
                         f"the router, every rank restarted together, gated on rank 0 and a real request, every rank rolled back on failure)")
    return units, lines


def merge_units(*results: tuple[list[set[str]], list[str]]) -> tuple[list[set[str]], list[str]]:
    """Units from several rules (pairing_units, spanning_units): overlapping ones become one."""
    merged: list[set[str]] = []
    for units, _ in results:
        for unit in units:
            touching = [m for m in merged if m & unit]
            for m in touching:
                merged.remove(m)
                unit = unit | m
            merged.append(set(unit))
    return merged, [line for _, lines in results for line in lines]


@dataclass(frozen=True)
class Outage:
    """A router left without any worker of some kinds while a batch is out of it: clients of
    that router get errors until the batch is back (a one-node cluster has one on every roll)."""

    router: str  # the router's host
    url: str  # the router's base URL, as clients reach it
    kinds: tuple[str, ...]  # the router's worker types (prefill, decode, regular) it loses every worker of

    def lost(self) -> str:
        """What clients of the router lose, in the words of every message about it."""
        return f"the router on {self.router} ({self.url}) has no {' or '.join(self.kinds)} worker"


def batch_outages(spec: ClusterSpec, batch: Iterable[str]) -> list[Outage]:
    """Pure: per router, the worker types whose every planned worker runs on BATCH's hosts."""

    leaving = set(batch)
    out = []
    for router_host in spec.router_hosts:
        hosts_of: dict[str, set[str]] = {}
        for h, e in spec.router_workers(router_host):
            hosts_of.setdefault(worker_type(e.role), set()).add(h.name)
        lost = tuple(sorted(kind for kind, hosts in hosts_of.items() if hosts <= leaving))
        if lost:
            out.append(Outage(router_host.name, router_url(router_host), lost))
    return out


def expected_outage(restart_s: dict[str, float | None], batch: list[str], ready_timeout_s: float) -> tuple[float, str]:
    """Pure: (seconds, where the figure comes from) a batch's engines are expected to be out: the
    longest restart-to-ready last measured on its nodes, else the spec's ready timeout."""
    measured = {h: restart_s[h] for h in batch if restart_s.get(h)}
    if measured:
        host = max(measured, key=lambda h: measured[h] or 0.0)
        return float(measured[host] or 0.0), f"the engines' restart-to-ready as last measured on {host}"
    return float(ready_timeout_s), "the spec's ready_timeout_s: no engine restart measured on the node yet"


def outage_lines(batches: list[list[str]], outages: dict[int, list[Outage]], restart_s: dict[str, float | None], ready_timeout_s: float) -> list[str]:
    """Pure: one line per batch that takes a router's last workers of a kind out, saying what it costs."""
    lines = []
    for i, found in sorted(outages.items()):
        label = "canary" if i == 0 else f"batch {i}"
        seconds, source = expected_outage(restart_s, batches[i], ready_timeout_s)
        lost = "; ".join(o.lost() for o in found)
        lines.append(f"{label} {', '.join(batches[i])}: {lost} while it is out: expected outage ~{seconds:.0f} s "
                     f"({source}), plus draining the requests in flight and the router's re-add")
    return lines


def refusal_text(command: str, rerun: str, lines: list[str]) -> str:
    """Pure: why a roll (or rollback) without --allow-downtime stops before any change, and what to run."""
    return "\n".join([
        f"pdkit {command}: refused, nothing was changed: this takes the last workers of a kind out of a router, "
        "and its clients get an error until they are back:",
        *(f"  {line}" for line in lines),
        "To accept the outage (the requests in flight drain first; new ones get the router's error status at once), run:",
        f"  {rerun}",
        "(docs/rolling.md, 'Downtime mode')",
    ])


def rerun_with_downtime(args: argparse.Namespace) -> str:
    """Pure: the command line that was given, with --allow-downtime added."""
    parts = ["pdkit", args.command, args.inventory]
    if args.command == "rollback":
        parts += [args.host] + (["--to", args.to] if args.to else [])
    else:
        for host in args.limit or []:
            parts += ["--limit", host]
        parts += ["--canary", args.canary] if args.canary else []
        parts += ["--batch", str(args.batch)] if args.batch != 1 else []
    return shlex.join([*parts, "--allow-downtime"])


def make_batches(order: list[str], batch_size: int, units: list[set[str]] | None = None) -> list[list[str]]:
    """Batches in ORDER: the canary (with its pairing unit) alone first, then up to BATCH_SIZE hosts.

    A pairing unit is never split; a batch that would split one grows to hold it whole.
    """
    if batch_size < 1:
        raise ValueError("--batch must be at least 1")
    unit_of: dict[str, set[str]] = {}
    for unit in units or []:
        for h in unit:
            unit_of[h] = unit
    placed: set[str] = set()
    batches: list[list[str]] = []
    for i, host in enumerate(order):
        if host in placed:
            continue
        size = 1 if i == 0 else batch_size  # the canary goes alone
        batch: list[str] = []
        for candidate in order[i:]:
            if candidate in placed or candidate in batch:
                continue
            members = [m for m in order if m in unit_of.get(candidate, {candidate})]
            if batch and len(batch) + len(members) > size:
                break
            batch += [m for m in members if m not in batch]
            if len(batch) >= size:
                break
        placed.update(batch)
        batches.append(batch)
    return batches


@dataclass(frozen=True)
class HostDiff:
    """What applying the plan would change on one host."""

    host: str
    files: tuple[str, ...]  # paths whose bytes, mode or owner differ (or that are missing)
    restarts: tuple[str, ...]  # units that would (re)start
    new_venv: bool = False
    removes: tuple[str, ...] = ()  # files the node's release has and the plan no longer does


def host_diff(plan: HostPlan, state: dict, *, new_venvs: Iterable[str] = ()) -> HostDiff:
    """Pure: the files that differ from the plan (or that it no longer has) and the services that
    would (re)start, by the deploy's own rule (pdkit/changes.py). NEW_VENVS: the venv links the
    deploy would point at a new venv (pdkit.hoststate.changed_venv_links: the node venv restarts
    pdkit-exporter, the engine environment the engines, the router venv the router)."""
    from pdkit import changes
    from pdkit.plan import services_meta

    paths = state.get("paths", {})
    files = tuple(f.path for f in plan.files if paths.get(f.path) != ["file", f.mode, f.owner, f.group, f.sha256])
    recorded = state.get("release", {}) or {}
    present = [p for p, st in paths.items() if st and st[0] == "file"]
    removed = tuple(changes.removals(recorded.get("files", []), [f.path for f in plan.files], present))
    venvs = set(new_venvs)
    running = {}
    for service in plan.services:
        unit_state = state.get("units", {}).get(service.unit) or []
        running[service.unit] = len(unit_state) > 2 and unit_state[1] in ("active", "activating", "reloading") and unit_state[2] == "enabled"
    decision = changes.decide(services_meta(plan.services), {*files, *removed}, venvs, running, recorded.get("services"))
    restarts = tuple(s.unit for s in plan.services if s.unit in {*decision.start, *decision.restart})
    return HostDiff(plan.host, files, restarts, bool(venvs), removed)


def open_breakers(states: dict[str, float], urls: Iterable[str]) -> list[str]:
    """Pure: the URLs among URLS whose breaker the router reports open (smg_worker_cb_state 1)."""
    return sorted(u.rstrip("/") for u in urls if states.get(u.rstrip("/")) == 1)


def unchanged_hosts(diffs: dict[str, HostDiff]) -> set[str]:
    """Hosts already as planned (no file, no restart, no new venv): the roll leaves them serving."""
    return {h for h, d in diffs.items() if not (d.files or d.restarts or d.new_venv or d.removes)}


def format_dry_plan(batches: list[list[str]], diffs: dict[str, HostDiff], explanations: list[str], secret_paths: set[str]) -> str:
    lines = ["pdkit roll --dry: nothing will be changed", ""]
    for line in explanations:
        lines.append(f"{'spans nodes' if line.startswith('engine ') else 'version pairing'}: {line}")
    if explanations:
        lines.append("")
    step = 0
    for b, batch in enumerate(batches):
        label = "canary" if b == 0 else f"batch {b}"
        lines.append(f"{label}: {', '.join(batch)}")
        for host in batch:
            step += 1
            d = diffs.get(host)
            if d is None:
                lines.append(f"  {step}. {host}: state not read")
                continue
            if not d.files and not d.restarts and not d.removes:
                lines.append(f"  {step}. {host}: no change")
                continue
            lines.append(f"  {step}. {host}: {len(d.files)} file(s) differ from the plan, {len(d.restarts)} service(s) would restart" + (" (new venv)" if d.new_venv else ""))
            for path in d.files:
                lines.append(f"       file     {path}" + ("  (secret: content not shown)" if path in secret_paths else ""))
            for path in d.removes:
                lines.append(f"       remove   {path}  (no longer planned)")
            for unit in d.restarts:
                lines.append(f"       restart  {unit}")
    return "\n".join(lines)


def covered_seconds(intervals: Iterable[tuple[int, int]]) -> float:
    """Seconds covered by the union of [start, end] intervals given in microseconds."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total / 1e6


# a start this soon after the unit went inactive belongs to the same restart (µs)
RESTART_GAP_US = 5_000_000


def restart_to_ready(units: dict[str, list]) -> float | None:
    """Pure: from _TIMING_PROBE's [left active, ready, went inactive, started] per unit (µs), the
    longest time a running engine took from its last stop to its readiness line: the stop itself
    (left active -> inactive) when it belongs to this start, plus start -> ready. None: no ready line."""
    took = []
    for values in units.values():
        exit_us, ready_us, inactive_us, started_us = (list(values) + [0, 0, 0, 0])[:4]
        if not ready_us or not started_us or ready_us <= started_us:
            continue
        # the stop is this restart's when the start followed it at once (systemctl restart), not
        # when the unit sat stopped for a while before it was started again
        stopping = inactive_us - exit_us if 0 < exit_us <= inactive_us <= started_us <= inactive_us + RESTART_GAP_US else 0
        took.append((stopping + ready_us - started_us) / 1e6)
    return max(took) if took else None


def metric_sums(text: str, names: Iterable[str]) -> dict[str, float]:
    """Sum of every sample of each named metric in a Prometheus text page (absent: 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    sums = {n: 0.0 for n in wanted}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                sums[sample.name] += sample.value
    return sums


# The key the running router was started with: systemd's copy of its credential
# (LoadCredential=, /run/credentials/<unit>/), which stays what the router read at its start
# while a deploy rewrites the key file. First line: "key" (the key follows), "none" (running
# without one) or "inactive". Read by root over SSH; never printed.
RUNNING_KEY_PROBE = (
    "u=pdkit-router.service; c=/run/credentials/$u/router-api-key; "
    "if [ \"$(systemctl is-active $u)\" != active ]; then echo inactive; "
    "elif [ -r \"$c\" ]; then echo key; cat \"$c\"; else echo none; fi"
)


def parse_running_key(stdout: str) -> Key | None:
    """Pure: RUNNING_KEY_PROBE's answer as a Key (value None: the router runs without one); None
    when the router is not running (or the answer is unreadable).

    >>> parse_running_key("none\n").value is None, parse_running_key("inactive") is None
    (True, True)
    """
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    if lines[0] == "none":
        return Key(None, "the running router (started without a key)")
    if lines[0] == "key" and len(lines) > 1 and lines[1].strip():
        return Key(lines[1].strip(), "the key the running router was started with")
    return None


def router_keys(spec: ClusterSpec, running: Key | None) -> list[Key]:
    """Pure: the keys a roll's client tries on a router, in order: the one its router runs with
    now (until it restarts on the inventory's), the inventory's, none. Across a key change the
    router accepts the first until its host's batch restarts it, then the second."""
    from pdkit.router_api import key_order

    configured = spec.cluster.secrets.router_api_key
    planned = Key(configured.get_secret_value() if configured else None, "pdkit_cluster.secrets.router_api_key")
    return key_order(*([running] if running else []), planned, Key(None, "no key"))


def key_fix(inventory: str, router_host: str) -> str:
    """Pure: what to run when a router refuses every key the roll has."""
    return (f"Set pdkit_cluster.secrets.router_api_key in {inventory} to the key the router on {router_host} runs with, "
            f"or restart it on the inventory's key: pyinfra {inventory} deploy/pd.py --limit {router_host} "
            f"(its clients get errors while it restarts)")


def silence_window_s(drain_timeout_s: float, gate_s: float, router_timeout_s: float, held_s: float = 0) -> float:
    """Pure: the upper bound of one roll (or rollback) step by the roll's own timeouts, failure
    path included: the endsAt of its silence, so a pdkit that dies mid-step leaves no silence
    behind for longer than the step could have taken. The silence is expired as soon as the
    step ends; this bound only matters when pdkit cannot expire it. GATE_S: the slowest gate of
    the batch's services (their ready_timeout_s)."""
    drain = 2 * drain_timeout_s  # the other workers usable, then the engines idle
    apply = APPLY_INSTALL_S + gate_s  # the deploy: installs, restarts, its own gates
    ready = gate_s + 60  # Roller.run_gates: the gates' timeout + 60
    router = 3 * router_timeout_s + held_s + gate_s + 60  # add, healthy, breakers closed, the router's gate
    smoke = router_timeout_s
    recover = RESTORE_S + 3 * router_timeout_s + held_s  # a failed gate: restore, re-add
    return drain + apply + ready + router + smoke + recover


# ================================================================ talking to hosts


class Progress:
    """One line per node and step, with the time since the roll started and the step's own time."""

    def __init__(self, stream=None) -> None:
        self.start = time.monotonic()
        self.stream = stream or sys.stdout

    def __call__(self, host: str, step: str, message: str, took: float | None = None) -> None:
        took_s = f" ({took:.1f} s)" if took is not None else ""
        print(f"[{time.monotonic() - self.start:7.1f}s] {host:<12} {step:<8} {message}{took_s}", file=self.stream, flush=True)


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
    # the deploy's own time: "prepare" (facts, deploy code; it runs beside the drain) and each
    # operation that ran on the node (inside `apply`)
    apply_detail: dict[str, float] = field(default_factory=dict)
    # time spent waiting for requests rather than doing the kit's work: the drain's own wait for
    # the engines' requests to finish, and the smoke requests' answers through the routers (a slow
    # or unreachable node elsewhere makes those slow, not the kit)
    waited: dict[str, float] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.total_s - self.engines_restart_to_ready_s - sum(self.waited.values()))

    def summary(self) -> str:
        """The `done` line: where the node's time went."""
        waits = ", ".join(f"{k} {v:.1f} s" for k, v in self.waited.items())
        outage = f", service outage {self.outage_s:.1f} s" if self.outage_s is not None else ""
        return (f"total {self.total_s:.1f} s, engines restart-to-ready {self.engines_restart_to_ready_s:.1f} s, "
                f"waited on requests {sum(self.waited.values()):.1f} s ({waits or 'none'}), kit overhead {self.overhead_s:.1f} s{outage}")


class _LogCollector:
    """pyinfra logs an operation's failure (stderr of the gate) through `logging`; keep those lines."""

    def __init__(self) -> None:
        import logging

        self.lines: list[str] = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = lambda record: self.lines.append(_strip_ansi(record.getMessage()))  # type: ignore[method-assign]
        self.logger = logging.getLogger("pyinfra")
        # paramiko prints a traceback for a dropped banner exchange; the roll reports it in one line
        self.paramiko = logging.getLogger("paramiko")

    def __enter__(self) -> _LogCollector:
        import logging

        self.logger.addHandler(self.handler)
        self.logger.propagate = False
        self.paramiko_level = self.paramiko.level
        self.paramiko.setLevel(logging.CRITICAL)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = True
        self.paramiko.setLevel(self.paramiko_level)


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _op_timer():
    """A pyinfra callback handler that times each operation on each host: (host, op name) -> seconds."""
    from pyinfra.api.state import BaseStateCallback

    class OpTimer(BaseStateCallback):
        def __init__(self) -> None:
            self.started: dict[tuple[str, str], float] = {}
            self.took: dict[tuple[str, str], float] = {}

        def operation_host_start(self, state, host, op_hash) -> None:
            self.started[(host.name, op_hash)] = time.monotonic()

        def _end(self, state, host, op_hash) -> None:
            start = self.started.pop((host.name, op_hash), None)
            if start is not None:
                # the operation's own name without its deploy's, and without the list after a colon
                name = sorted(state.get_op_meta(op_hash).names)[0].rsplit(" | ", 1)[-1].split(":", 1)[0]
                self.took[(host.name, name)] = time.monotonic() - start

        def operation_host_success(self, state, host, op_hash, retry_count=0) -> None:
            self._end(state, host, op_hash)

        def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0) -> None:
            self._end(state, host, op_hash)

    return OpTimer()


class Pyinfra:
    """pyinfra's API for one inventory: one State per batch (gevent patched first, as pyinfra_cli/__init__.py does)."""

    def __init__(self, inventory: str) -> None:
        self.inventory = inventory
        # seconds of the last batch's deploy phases: prepare (facts, deploy code), execute (operations)
        self.phases: dict[str, float] = {}
        # seconds of each operation of the last execute, per host: host -> op name -> seconds
        self.operations: dict[str, dict[str, float]] = {}

    def _state(self, hosts: list[str]):
        from pyinfra.api import Config, State
        from pyinfra.api.connect import connect_all
        from pyinfra.api.exceptions import PyinfraError
        from pyinfra.context import ctx_config, ctx_inventory, ctx_state

        state = State(check_for_changes=False)
        state.cwd = str(REPO)
        config = Config()
        config.FAIL_PERCENT = None  # decide per host here, not by pyinfra's abort
        ctx_config.set(config)
        ctx_state.set(state)
        inventory = roll_inventory(self.inventory)
        ctx_inventory.set(inventory)
        state.inventory_filename = self.inventory
        state.init(inventory, config, initial_limit=[inventory.get_host(h) for h in hosts])
        # CONNECT_ATTEMPTS tries per host in all: pyinfra's connect_all is the first; each later one
        # is a single host.connect() of the hosts still missing (connect_all again would be two more
        # tries per round: the roll once made 5 tries where docs/rolling.md says 3)
        try:
            connect_all(state)
        except PyinfraError:
            pass  # "No hosts remaining!": every host failed to connect; the caller names them
        for _ in range(CONNECT_ATTEMPTS - 1):
            missing = [h for h in hosts if inventory.get_host(h) not in state.activated_hosts]
            if not missing:
                break
            # a busy sshd sometimes drops the banner exchange: try the missing hosts again
            time.sleep(1)
            for name in missing:
                host = inventory.get_host(name)
                host.connect()
                if host.connected:
                    state.activate_host(host)
                    state.failed_hosts.discard(host)
        from pdkit.deploy import tune_connection

        for host in state.activated_hosts:
            tune_connection(host)
        return state, inventory

    def connect(self, hosts: list[str]) -> tuple[Any, dict[str, Any], dict[str, str]]:
        """(state, name -> connected Host, name -> why it could not connect)."""
        with _LogCollector() as log:
            state, inventory = self._state(hosts)
        connected = {h.name: h for h in state.activated_hosts if h.name in hosts}
        failed = {h: _why(log.lines, h) or "no SSH connection" for h in hosts if h not in connected}
        return state, connected, failed

    def prepare(self, hosts: list[str], state: Any) -> dict[str, str]:
        """Load deploy/pd.py into STATE (the batch's, from `connect`): read the facts, decide the
        operations; nothing on the nodes changes. Name -> error for every host that failed."""
        from pyinfra.api.state import StateStage
        from pyinfra_cli.util import load_deploy_file

        def work() -> None:
            state.set_stage(StateStage.Prepare)
            load_deploy_file(state, str(REPO / DEPLOY_FILE))

        self.phases = {}
        return self._phase("prepare", hosts, state, work, "the deploy failed while reading the node")

    def execute(self, hosts: list[str], state: Any) -> dict[str, str]:
        """Run the operations `prepare` decided; name -> error for every host that failed."""
        from pyinfra.api.operations import run_ops
        from pyinfra.api.state import StateStage

        timer = _op_timer()

        def work() -> None:
            state.set_stage(StateStage.Execute)
            state.add_callback_handler(timer)
            run_ops(state)

        errors = self._phase("execute", hosts, state, work, "the deploy failed")
        self.operations = {}
        for (host_name, op), took in timer.took.items():
            self.operations.setdefault(host_name, {})[op] = took
        return errors

    def _phase(self, name: str, hosts: list[str], state: Any, work: Callable[[], None], failed_note: str) -> dict[str, str]:
        """Run one phase of pyinfra's, timed into self.phases; name -> error for every host that failed."""
        with _LogCollector() as log:
            try:
                t = time.monotonic()
                work()
                self.phases[name] = time.monotonic() - t
            except SystemExit as exc:
                return {h: f"the deploy stopped: {exc}" for h in hosts}
            except Exception as exc:  # noqa: BLE001 - pyinfra raises its own errors for a failed host
                failed = {h.name for h in state.failed_hosts} or set(hosts)
                # pyinfra's own "No hosts remaining!" says nothing a user can act on: the gate's line does
                return {h: _why(log.lines, h) or f"{type(exc).__name__}: {exc}" for h in failed}
        connected = {h.name for h in state.activated_hosts}
        failed = {h.name for h in state.failed_hosts} | (set(hosts) - connected)
        return {h: _why(log.lines, h) or failed_note for h in failed}


def roll_inventory(path: str) -> Any:
    """The pyinfra inventory a roll's batch runs with: the user's, plus node_drained=True.

    The deploy runs on a batch only after its drain gate passed, so the node roles may then
    reboot a node that asks for it (pdkit_node.reboot: when-drained, roles/nvidia_driver.py);
    a plain `pyinfra ... deploy/pd.py` never sets it and never reboots.
    """
    from pyinfra_cli.inventory import make_inventory

    return make_inventory(path, override_data={"node_drained": True}, cwd=str(REPO))


def _why(lines: list[str], host: str) -> str:
    """Why HOST failed, from pyinfra's log lines: a health gate's own FAILED line (it carries the
    engine's journal error) when there is one, else the host's last lines."""
    mine = [ln.strip() for ln in lines if host in ln or not ln.lstrip().startswith("[")]
    gates = [ln.split("FAILED", 1)[1].strip() for ln in mine if "FAILED " in ln]
    if gates:
        return " | ".join(dict.fromkeys(gates))[-1500:]
    return " | ".join(mine[-6:])[-1500:]


def run_remote(host: Any, command: str, timeout: int = 900) -> tuple[bool, str, str]:
    """Run COMMAND on a connected pyinfra host: (ok, stdout, stderr)."""
    from pyinfra.api import StringCommand

    ok, output = host.run_shell_command(StringCommand(command), _timeout=timeout)
    stdout = "\n".join(line.line for line in output if line.buffer_name == "stdout")
    stderr = "\n".join(line.line for line in output if line.buffer_name == "stderr")
    return ok, stdout, stderr


_TIMING_PROBE = r"""
import json, subprocess, sys
units, since = json.loads(sys.argv[1]), float(sys.argv[2])
out = {}
for u in units:
    show = dict(l.split("=", 1) for l in subprocess.run(["systemctl", "show", "-p", "ActiveExitTimestampMonotonic,InactiveEnterTimestampMonotonic,InactiveExitTimestampMonotonic,InvocationID", u], capture_output=True, text=True).stdout.splitlines() if "=" in l)
    log = subprocess.run(["journalctl", "--no-pager", "-o", "json", "_SYSTEMD_INVOCATION_ID=" + show.get("InvocationID", ""), "--grep", "fired up and ready to roll"], capture_output=True, text=True).stdout.splitlines()
    ready = json.loads(log[0])["__MONOTONIC_TIMESTAMP"] if log else None
    # [left active, ready line of this invocation, went inactive, started this invocation] (µs, node clock)
    out[u] = [int(show.get("ActiveExitTimestampMonotonic") or 0), int(ready) if ready else None,
              int(show.get("InactiveEnterTimestampMonotonic") or 0), int(show.get("InactiveExitTimestampMonotonic") or 0)]
print(json.dumps(out))
"""


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
    # the settle time the last drain held a regular worker draining for (hold_settle_s), or 0
    held_s: int = 0
    # router host -> the API key its running router was started with (read_router_keys); a host
    # missing here was not read: its client tries the inventory's key, then none
    running_keys: dict[str, Key] = field(default_factory=dict)
    # the worker URLs the last drain took out of a router: none after a failed drain means there is nothing to put back
    removed: list[str] = field(default_factory=list)
    # name -> connected pyinfra Host of the current batch (its gates run over these)
    connected: dict[str, Any] = field(default_factory=dict)
    # the command this Roller runs for (roll, rollback, tune): its silences' comments name it
    command: str = "roll"

    def __post_init__(self) -> None:
        from pdkit.plan import plan_cluster
        from pdkit.silences import Silencer

        self.plans = plan_cluster(self.spec)
        self.pyinfra = Pyinfra(self.inventory)
        self.silencer = Silencer.for_spec(self.spec, f"pdkit {self.command}", lambda who, text: self.progress(who, "silence", text))

    def silenced(self, hosts: list[str], what: str, done: str, failed: str):
        """A context: HOSTS' alerts silenced in Alertmanager (pdkit/silences.py) from here until it
        ends, however it ends; the bound is silence_window_s of this Roller's timeouts."""
        from pdkit.silences import host_matchers

        gate_s = max((s.ready_timeout_s for h in hosts for s in self.plans[h].services), default=self.spec.cluster.ready_timeout_s)
        held = self.hold_settle_s(hosts) if self.held_kinds(batch_outages(self.spec, hosts)) else 0
        window = silence_window_s(self.drain_timeout_s, gate_s, self.router_timeout_s, held)
        return self.silencer.silenced(",".join(hosts), hosts, host_matchers(self.spec, hosts), window,
                                      f"{what} on {', '.join(hosts)}", done=done, failed=failed)

    # ---- routers and engines
    def routers(self):
        """(router host, client) per router; the same client objects on every call."""
        from pdkit.router_api import RouterClient
        from pdkit.versions import ROUTER_RELEASES

        if not hasattr(self, "_routers"):
            self._routers = [
                (h, RouterClient(
                    router_url(h), keys=router_keys(self.spec, self.running_keys.get(h.name)),
                    key_fix=key_fix(self.inventory, h.name),
                    drain_settle_s=ROUTER_DRAIN_SETTLE_S if ROUTER_RELEASES[self.spec.router_release(h)].per_worker_drain_settle else None,
                ))
                for h in self.spec.router_hosts
            ]
        return self._routers

    def read_router_keys(self) -> list[str]:
        """Read, on each router host, the key its running router was started with (its systemd
        credential: the exact key, whatever the key file says now) into running_keys; one line
        per host that could not be read (its client then tries the inventory's key, then none)."""
        notes = []
        names = [h.name for h in self.spec.router_hosts]
        if not names:
            return notes
        _, connected, unreachable = self.pyinfra.connect(names)
        for name, why in unreachable.items():
            notes.append(f"{name}: cannot read the key its router runs with ({why}); trying the inventory's key, then none")
        for name, host in connected.items():
            ok, stdout, _ = run_remote(host, RUNNING_KEY_PROBE, timeout=60)
            key = parse_running_key(stdout) if ok else None
            if not ok:
                notes.append(f"{name}: cannot read the key its router runs with (the probe failed); trying the inventory's key, then none")
            elif key is None:
                notes.append(f"{name}: its router is not running; trying the inventory's key, then none")
            else:
                self.running_keys[name] = key
        return notes

    def workers_of(self, hosts: list[str]) -> list[tuple[Any, Any, str]]:
        """(router client, engine, url) for every engine of HOSTS that a router fronts."""
        from pdkit import flags

        out = []
        for router_host, client in self.routers():
            for h, e in self.spec.router_workers(router_host):
                if h.name in hosts:
                    out.append((client, e, flags.engine_url(self.spec, h, e)))
        return out

    def engine_urls(self, hosts: list[str]) -> dict[str, str]:
        from pdkit import flags

        return {f"{h.name}/{e.name}": flags.engine_url(self.spec, h, e) for h, e in self.spec.engines() if h.name in hosts}

    def scrape(self, urls: dict[str, str], names: Iterable[str]) -> dict[str, dict[str, float]]:
        from pdkit.health import http_request

        out = {}
        for label, url in urls.items():
            status, body = http_request(f"{url}/metrics", timeout=10)
            if status != 200:
                raise RuntimeError(f"{label}: {url}/metrics answered {status or 'nothing'}: {body.strip()[:160]}")
            out[label] = metric_sums(body, names)
        return out

    def circuit_states(self, router_host: Any) -> dict[str, float]:
        """worker URL -> smg_worker_cb_state (0 closed, 1 open, 2 half-open) from the router's metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        from pdkit.health import http_request

        status, body = http_request(router_metrics_url(router_host), timeout=10)
        if status != 200:
            return {}  # sglang-router 0.3.2 has no breaker gauge: judge by /workers alone
        out = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == ROUTER["worker_cb_state"] and "worker" in sample.labels:
                    out[sample.labels["worker"].rstrip("/")] = sample.value
        return out

    def others_can_serve(self, hosts: list[str], accepted: frozenset[tuple[str, str]] = frozenset()) -> str | None:
        """None when, for every worker type the batch takes out of a router, another worker of that
        type stays registered, ready, healthy and with a closed (or half-open) circuit; else why not.
        ACCEPTED: (router host, worker type) outages the roll was told to accept (--allow-downtime)."""
        leaving = self.workers_of(hosts)
        for router_host, client in self.routers():
            mine = {url for c, _, url in leaving if c is client}
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
                    state = ", ".join(f"{w.url} ({'circuit open' if breakers.get(w.url) == 1 else w.status or 'unhealthy'})" for w in others) or "none"
                    return f"taking {', '.join(hosts)} out of {client.base_url} would leave no usable {kind} worker (others: {state})"
        return None

    # ---- steps
    def hold_settle_s(self, hosts: list[str]) -> int:
        """Seconds to keep a router's last regular worker listed `draining` through a downtime."""
        known = [s for h in hosts if (s := self.restart_s.get(h))]
        return min(HOLD_MAX_S, math.ceil(HOLD_FACTOR * max(known) + HOLD_MARGIN_S)) if known else HOLD_UNMEASURED_S

    def held_kinds(self, outages: list[Outage]) -> set[tuple[str, str]]:
        """(router host, kind) of the outages whose router answers 404 with no regular worker listed."""
        from pdkit.router_api import REGULAR
        from pdkit.versions import ROUTER_RELEASES

        return {(o.router, REGULAR) for o in outages if REGULAR in o.kinds
                and ROUTER_RELEASES[self.spec.router_release(self.spec.host(o.router))].empty_regular_is_404}

    def drain(self, hosts: list[str]) -> str:
        outages = batch_outages(self.spec, hosts)
        if outages and not self.allow_downtime:
            lost = "; ".join(f"{o.url} would have no {' or '.join(o.kinds)} worker" for o in outages)
            raise RuntimeError(f"{lost}; nothing was removed (--allow-downtime accepts the outage)")
        accepted = frozenset((o.router, kind) for o in outages for kind in o.kinds)
        # never take out the last usable worker of a kind (unless that outage is accepted): wait
        # (bounded) for the others to be usable
        deadline = time.monotonic() + self.drain_timeout_s
        while (why := self.others_can_serve(hosts, accepted)) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{why}; nothing was removed")
            time.sleep(1)
        workers = sorted(self.workers_of(hosts), key=lambda w: REMOVAL_ORDER[worker_type(w[1].role)])
        router_of = {id(client): h.name for h, client in self.routers()}
        self.removed = []
        held = self.held_kinds(outages)
        self.held_s = self.hold_settle_s(hosts) if held else 0
        if outages:
            self.outage_since = time.monotonic()
        for client, engine, url in workers:
            client.remove(url, settle_s=self.held_s if (router_of[id(client)], worker_type(engine.role)) in held else None)
            self.removed.append(url)
        urls = self.engine_urls(hosts)
        deadline = time.monotonic() + self.drain_timeout_s
        while True:
            busy = {k: {n: v for n, v in m.items() if v} for k, m in self.scrape(urls, DRAIN_GAUGES).items()}
            busy = {k: v for k, v in busy.items() if v}
            if not busy:
                return f"{len(workers)} worker(s) out of the router, {len(urls)} engine(s) idle"
            if time.monotonic() > deadline:
                raise TimeoutError(f"engines still busy after {self.drain_timeout_s:.0f} s: {busy}")
            time.sleep(0.25)

    def readd(self, hosts: list[str]) -> str:
        workers = sorted(self.workers_of(hosts), key=lambda w: -REMOVAL_ORDER[worker_type(w[1].role)])
        for client, engine, url in workers:
            # a held worker leaves the router's list when its settle time is up: wait that out too
            client.add(url, worker_type(engine.role), engine.effective_bootstrap_port if engine.role == "prefill" else None,
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
                    raise RuntimeError(f"circuit breaker still open on {', '.join(still)} at {client.base_url} {self.router_timeout_s:.0f} s after the re-add")
                time.sleep(0.25)
        self.held_s = 0
        served = f"{len(workers)} worker(s) back in the router, healthy, circuit breakers closed"
        # a router on the batch's hosts: its own gate from the table (every planned worker listed
        # healthy and one completion), now that the batch's workers are back in it
        routers, _ = self.run_gates(hosts, 1)
        if routers:
            served += f"; {routers} router gate(s) passed"
        if self.outage_since is not None:
            self.last_outage_s = time.monotonic() - self.outage_since
            self.outage_since = None
            served += f"; the router served again after a {self.last_outage_s:.1f} s outage"
        return served

    def gates_of(self, host: str, phase: int) -> list:
        """The gates (pdkit/gates.py, the deploy's own) of HOST's planned services that run there:
        phase 0 the engines and daemons, phase 1 its router."""
        from pdkit import gates
        from pdkit.plan import services_not_started

        services = list(self.plans[host].services)
        held = services_not_started(self.spec, self.spec.host(host), services)
        return gates.phases(gates.gate_for(s) for s in services if s.unit not in held)[phase]

    def run_gates(self, hosts: list[str], phase: int) -> tuple[int, list[str]]:
        """Run the gate table's gates of PHASE for HOSTS on each host, as the deploy runs them:
        (gates passed, hosts that have none). A failed gate raises with its own line."""
        from pdkit import flags, gates

        python = f"{flags.venv_dir(self.spec)}/bin/python"
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
                lines = [ln.removeprefix("FAILED").strip() for ln in (stderr or stdout).strip().splitlines() if ln.strip()]
                raise RuntimeError(f"{h}: " + (" | ".join(ln for ln in lines if not ln.startswith("ok ")) or "its gates failed"))
        return sum(len(g) for g in wanted.values()), [h for h in hosts if h not in wanted]

    def ready(self, hosts: list[str]) -> str:
        """The batch's engines and daemons by the deploy's own gates (pdkit/gates.py: an engine's
        current invocation logged its readiness line and /health answers 200; a daemon's URL 200),
        run on each host; a router is gated by the router step, once its workers are back."""
        passed, _ = self.run_gates(hosts, 0)
        return f"{passed} engine and daemon gate(s) passed (pdkit/gates.py, run on the node)"

    def smoke(self, hosts: list[str]) -> str:
        urls = self.engine_urls(hosts)
        if not urls or not self.spec.router_hosts:
            return "no engines behind a router here"
        before = self.scrape(urls, FAILURE_COUNTERS)
        model = self.spec.cluster.model.name
        jobs = [(client, i) for _, client in self.routers() for i in range(self.smoke_requests)]
        # concurrently (greenlets under pyinfra's gevent): a few requests cost one request's time
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            answers = list(pool.map(lambda job: job[0].completion(model, f"pdkit roll smoke {hosts[0]} {job[1]}", max_tokens=SMOKE_MAX_TOKENS), jobs))
        for (client, i), (status, body) in zip(jobs, answers):
            if status != 200:
                raise RuntimeError(f"smoke request {i + 1} through {client.base_url} answered {status or 'nothing'}: {body.strip()[:200]}")
        sent = len(jobs)
        after = self.scrape(urls, FAILURE_COUNTERS)
        moved = {k: {n: after[k][n] - before[k][n] for n in FAILURE_COUNTERS if after[k][n] != before[k][n]} for k in urls}
        moved = {k: v for k, v in moved.items() if v}
        if moved:
            raise RuntimeError(f"KV transfer / bootstrap failure counters moved during the smoke requests: {moved}")
        return f"{sent} request(s) through the router succeeded; transfer and bootstrap failure counters unchanged"

    def current_releases(self, state: Any, hosts: dict[str, Any]) -> tuple[dict[str, str | None], dict[str, int | None]]:
        """(the release each node runs now, the node's monotonic clock in µs), one round trip per node."""
        current = shlex.quote(f"{releases_dir(self.spec.cluster.install_dir)}/CURRENT")
        releases: dict[str, str | None] = {}
        clocks: dict[str, int | None] = {}
        for name, host in hosts.items():
            ok, stdout, _ = run_remote(host, f"cut -d' ' -f1 /proc/uptime; cat {current} 2>/dev/null || true", timeout=60)
            lines = stdout.split()
            clocks[name] = int(float(lines[0]) * 1e6) if ok and lines else None
            releases[name] = lines[1] if ok and len(lines) > 1 else None
        return releases, clocks

    def _releases_cmd(self, host: str, action: str, *extra: str) -> str:
        from pdkit import flags

        q = shlex.quote
        python = f"{flags.venv_dir(self.spec)}/bin/python"
        release_json = f"{self.spec.cluster.config_dir}/release.json"
        head = f"{q(python)} -m pdkit.releases --releases-dir {q(releases_dir(self.spec.cluster.install_dir))} --release-json {q(release_json)}"
        return f"{head} {action} " + " ".join(q(x) for x in extra)

    def restore(self, host_name: str, host: Any, to: str | None) -> str:
        ok, stdout, stderr = run_remote(host, self._releases_cmd(host_name, "restore", *(["--to", to] if to else [])))
        if not ok:
            raise RuntimeError((stderr.strip().splitlines() or ["restore failed"])[-1])
        result = json.loads(stdout.strip().splitlines()[-1])
        return f"back on release {result['id']} ({len(result['written'])} file(s) rewritten, restarted {', '.join(result['restarted']) or 'nothing'})"

    def engines_restart_to_ready(self, host: Any, host_name: str, since_monotonic_us: int | None) -> float:
        """Wall time during which at least one of the node's engines restarted in this step was
        between its restart and its readiness line (node clock): engines that restart together
        count once, so overlapping restarts never hide the kit's own time."""
        units = [s.unit for s in self.plans[host_name].services if s.kind == "engine"]
        if not units:
            return 0.0
        ok, stdout, _ = run_remote(host, f"python3 -c {shlex.quote(_TIMING_PROBE)} {shlex.quote(json.dumps(units))} 0", timeout=60)
        if not ok:
            return 0.0
        intervals = [
            (exit_us, ready_us) for exit_us, ready_us, *_ in json.loads(stdout).values()
            if ready_us and exit_us and (since_monotonic_us is None or exit_us >= since_monotonic_us) and ready_us > exit_us
        ]
        return covered_seconds(intervals)

    def last_restart_to_ready(self, host: Any, host_name: str) -> float | None:
        """Seconds the node's running engines took from their last stop (or their start, after a
        boot) to SGLang's readiness line, the slowest of them; None when no engine logged one."""
        units = [s.unit for s in self.plans[host_name].services if s.kind == "engine"]
        if not units:
            return None
        ok, stdout, _ = run_remote(host, f"python3 -c {shlex.quote(_TIMING_PROBE)} {shlex.quote(json.dumps(units))} 0", timeout=60)
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
            # the plan read before the roll found nothing to change: leave it serving, in the router
            for h in batch:
                p(h, "done", "no change: files and services already as planned; left in the router")
            return
        timings = {h: NodeTiming(h, engines=sum(s.kind == "engine" for s in self.plans[h].services)) for h in batch}
        done_drain = False
        self.last_outage_s = None
        outages = batch_outages(self.spec, batch)
        if self.held_kinds(outages):
            for h in batch:
                if h not in self.restart_s:
                    self.restart_s[h] = self.last_restart_to_ready(hosts[h], h)
        for outage in outages:
            p(",".join(batch), "downtime", f"accepted: {outage.lost()} from the drain until the re-add; new requests get its error status meanwhile")

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
                           failed="the roll stopped on it: expired after the restore, so whatever is still wrong pages"):
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
                            f"(prepared while draining: {phases.get('prepare', 0):.1f} s; execute {phases.get('execute', 0):.1f} s)")

                gate("apply", apply)
                gate("ready", self.ready)
                gate("router", self.readd)
                gate("smoke", self.smoke)
            except RollError as exc:
                p(exc.host, "FAILED", f"gate '{exc.gate}': {exc.message}")
                exc.restored = done_drain
                if done_drain:
                    exc.readded = self._recover(batch, hosts, before)
                elif not self.removed:
                    # the drain failed before it took anything out (a router that refuses the key): nothing to put back
                    exc.readded = None
                else:
                    # nothing was applied: only put back whatever the drain took out of the router
                    try:
                        p(",".join(batch), "router", self.readd(batch))
                        exc.readded = True
                    except Exception as readd_exc:  # noqa: BLE001
                        p(",".join(batch), "router", f"could not add the engines back: {readd_exc}")
                        exc.readded = False
                raise
        for h in batch:
            timings[h].total_s = time.monotonic() - t0
            timings[h].apply_detail = {"prepare": self.pyinfra.phases.get("prepare", 0.0), **self.pyinfra.operations.get(h, {})}
            timings[h].engines_restart_to_ready_s = self.engines_restart_to_ready(hosts[h], h, clocks[h])
            timings[h].outage_s = self.last_outage_s
            timings[h].waited = {"drain": drain_own[0] if drain_own else 0.0, "smoke": timings[h].steps.get("smoke", 0.0)}
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

    def _recover(self, batch: list[str], hosts: dict[str, Any], before: dict[str, str | None]) -> bool:
        """Put every node of the batch back on the release it ran before, then back in the router;
        whether the re-add succeeded."""
        p = self.progress

        def one(h: str) -> None:
            start = time.monotonic()
            if before.get(h) is None:
                p(h, "restore", "no earlier release recorded on this node: left as it is (roll it with a fixed inventory)")
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
        try:
            p(",".join(batch), "router", self.readd(batch))
            return True
        except Exception as exc:  # noqa: BLE001
            p(",".join(batch), "router", f"could not add the restored engines back: {exc}")
            return False


# ================================================================ commands


def _load(inventory: str):
    from pdkit.loader import load_with_problems

    spec, problems = load_with_problems(inventory)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        print(f"{inventory}: {len(errors)} error(s); nothing was contacted.", file=sys.stderr)
        for p in errors:
            print(f"  error   {p}", file=sys.stderr)
        return None
    return spec


def patch_gevent() -> None:
    # pyinfra's API needs gevent, patched before anything opens a socket (pyinfra 3.10.0's pyinfra_cli/__init__.py does the same)
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # deploy/pd.py imports roles/


# the old name (tests/sim/test_tune_runner.py patches gevent with it)
_patch_gevent = patch_gevent


def read_node_state(roller: Roller, hosts: list[str]) -> tuple[dict[str, HostDiff], dict[str, dict[str, str]], dict[str, str]]:
    """(diff per host, engine versions each node runs now, unreachable hosts), read over SSH; nothing changes."""
    # lazy: pyinfra (and pdkit.hoststate, which imports it) load only after patch_gevent
    from pyinfra.context import ctx_host

    from pdkit import hoststate

    state, connected, unreachable = roller.pyinfra.connect(hosts)
    diffs: dict[str, HostDiff] = {}
    versions: dict[str, dict[str, str]] = {}
    release_json = f"{roller.spec.cluster.config_dir}/release.json"
    for name, host in connected.items():
        with ctx_host.use(host):
            facts = hoststate.host_state()
            try:
                new_venvs = hoststate.changed_venv_links()
            except (Exception, SystemExit):  # noqa: BLE001 - no wheelhouse for this python here: say so in the plan
                new_venvs = set()
        diffs[name] = host_diff(roller.plans[name], facts, new_venvs=new_venvs)
        ok, stdout, _ = run_remote(host, f"cat {shlex.quote(release_json)} 2>/dev/null || true", timeout=60)
        try:
            engines = json.loads(stdout).get("engines", {}) if stdout.strip() else {}
        except ValueError:
            engines = {}
        versions[name] = {e: v.get("sglang_version") for e, v in engines.items()}
    return diffs, versions, unreachable


def cmd_roll(args: argparse.Namespace) -> int:
    patch_gevent()
    spec = _load(args.inventory)
    if spec is None:
        return EXIT_INVALID
    try:
        order = rollout_order(spec, limit=args.limit or None, canary=args.canary)
    except ValueError as exc:
        print(f"pdkit roll: {exc}", file=sys.stderr)
        return EXIT_INVALID
    roller = Roller(args.inventory, spec, Progress(), drain_timeout_s=args.drain_timeout, smoke_requests=args.smoke_requests)
    progress = roller.progress
    progress("-", "plan", f"reading {len(order)} host(s) to plan the roll")
    diffs, versions, unreachable = read_node_state(roller, order)
    if unreachable and args.dry:
        for h, why in unreachable.items():
            print(f"pdkit roll --dry: {h}: cannot reach it over SSH ({why})", file=sys.stderr)
    units, explanations = merge_units(pairing_units(spec, version_changes(spec, versions)), spanning_units(spec))
    roller.unchanged = unchanged_hosts(diffs)
    try:
        batches = make_batches(order, args.batch, units)
    except ValueError as exc:
        print(f"pdkit roll: {exc}", file=sys.stderr)
        return EXIT_INVALID
    secret = {f.path for plan in roller.plans.values() for f in plan.files if f.secret}
    outages = {i: found for i, b in enumerate(batches) if not all(h in roller.unchanged for h in b) and (found := batch_outages(spec, b))}
    roller.restart_s = measure_restarts(roller, sorted({h for i in outages for h in batches[i]}))
    downtime = outage_lines(batches, outages, roller.restart_s, spec.cluster.ready_timeout_s)
    if args.dry:
        print(format_dry_plan(batches, diffs, explanations, secret))
        if downtime:
            accepted = "accepted by --allow-downtime" if args.allow_downtime else "the roll refuses it without --allow-downtime"
            print("", f"downtime ({accepted}):", *(f"  {line}" for line in downtime), sep="\n")
        return EXIT_FAILED if unreachable else 0

    def write_report(result: str, **extra: Any) -> None:
        # on every exit once the roll is planned: a failed roll is when the report is wanted most
        if args.report:
            Path(args.report).write_text(json.dumps({"result": result, **report(roller.timings), "downtime": downtime,
                                                     "silences": roller.silencer.records, **extra}, indent=2) + "\n")

    if downtime and not args.allow_downtime:
        print(refusal_text("roll", rerun_with_downtime(args), downtime), file=sys.stderr)
        write_report("refused", reason="downtime not accepted (--allow-downtime)")
        return EXIT_INVALID
    roller.allow_downtime = args.allow_downtime
    try:
        for note in roller.read_router_keys():
            progress("-", "key", note)
    except BaseException as exc:
        write_report("error", error=f"{type(exc).__name__}: {exc}")
        raise
    for line in downtime:
        progress("-", "downtime", line)
    for line in explanations:
        progress("-", "pairing", line)
    progress("-", "plan", "order: " + " | ".join(", ".join(b) for b in batches))
    for i, batch in enumerate(batches):
        try:
            roller.roll_batch(batch)
            if i == 0 and args.bake > 0 and len(batches) > 1:
                roller.bake(batch, args.bake)
        except RollError as exc:
            untouched = [h for b in batches[batches.index(batch) + 1:] for h in b]
            print(f"pdkit roll: stopped: {exc}", file=sys.stderr)
            print(stop_summary(exc, untouched), file=sys.stderr)
            write_report("stopped", failed={"host": exc.host, "gate": exc.gate, "message": exc.message, "restored": exc.restored,
                                            "outage_s": None if roller.last_outage_s is None else round(roller.last_outage_s, 2)},
                         untouched=untouched)
            return EXIT_FAILED
        except BaseException as exc:
            write_report("error", error=f"{type(exc).__name__}: {exc}")
            raise
    write_report("ok")
    if roller.timings:
        worst = max(roller.timings, key=lambda t: t.overhead_s)
        progress("-", "done", f"{len(order)} host(s) rolled; largest kit overhead {worst.overhead_s:.1f} s on {worst.host}")
    return 0


def measure_restarts(roller: Roller, hosts: list[str]) -> dict[str, float | None]:
    """Each host's last engine restart-to-ready (Roller.last_restart_to_ready), read over SSH; an
    unreachable host has none (the connect gate will name it)."""
    if not hosts:
        return {}
    _, connected, _ = roller.pyinfra.connect(hosts)
    return {name: roller.last_restart_to_ready(host, name) for name, host in connected.items()}


def report(timings: list[NodeTiming]) -> dict:
    """Per node: total, engines' restart-to-ready, the kit's own overhead, each step (seconds)."""
    return {
        "nodes": [
            {"host": t.host, "total_s": round(t.total_s, 2), "engines": t.engines, "engines_restart_to_ready_s": round(t.engines_restart_to_ready_s, 2),
             "overhead_s": round(t.overhead_s, 2), "waited_s": {k: round(v, 2) for k, v in t.waited.items()},
             "outage_s": None if t.outage_s is None else round(t.outage_s, 2),
             "steps": {k: round(v, 2) for k, v in t.steps.items()},
             "apply_detail": {k: round(v, 2) for k, v in t.apply_detail.items()}}
            for t in timings
        ]
    }


def cmd_releases(args: argparse.Namespace) -> int:
    patch_gevent()
    spec = _load(args.inventory)
    if spec is None:
        return EXIT_INVALID
    if args.host not in {h.name for h in spec.hosts}:
        print(f"pdkit releases: {args.host} is not in {args.inventory}", file=sys.stderr)
        return EXIT_INVALID
    roller = Roller(args.inventory, spec, Progress(sys.stderr))
    _, hosts, unreachable = roller.pyinfra.connect([args.host])
    if unreachable:
        print(f"pdkit releases: {args.host}: cannot reach it over SSH ({unreachable[args.host]})", file=sys.stderr)
        return EXIT_FAILED
    ok, stdout, stderr = run_remote(hosts[args.host], roller._releases_cmd(args.host, "list"), timeout=60)
    if not ok:
        print(f"pdkit releases: {args.host}: {stderr.strip()[-500:]}", file=sys.stderr)
        return EXIT_FAILED
    data = json.loads(stdout)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(format_releases(args.host, data, roller.plans[args.host].release_hash))
    return 0


def format_releases(host: str, data: dict, planned_hash: str) -> str:
    lines = [f"{host}: {len(data['releases'])} release(s) kept, newest last ('*' = running now, 'plan' = what the inventory says)"]
    for r in data["releases"]:
        marks = ("*" if r["id"] == data.get("current") else " ") + (" plan" if r["hash"] == planned_hash else "     ")
        lines.append(f"{marks} {r['id']}  {r['time']}  {r['files']} files  {r['command']}")
    if not data["releases"]:
        lines.append("  (none: the node has not been deployed with release recording yet)")
    return "\n".join(lines)


def cmd_rollback(args: argparse.Namespace) -> int:
    patch_gevent()
    spec = _load(args.inventory)
    if spec is None:
        return EXIT_INVALID
    if args.host not in {h.name for h in spec.hosts}:
        print(f"pdkit rollback: {args.host} is not in {args.inventory}", file=sys.stderr)
        return EXIT_INVALID
    roller = Roller(args.inventory, spec, Progress(), drain_timeout_s=args.drain_timeout, allow_downtime=args.allow_downtime, command="rollback")
    p = roller.progress
    batch = [args.host]
    for note in roller.read_router_keys():
        p("-", "key", note)
    _, hosts, unreachable = roller.pyinfra.connect(batch)
    if unreachable:
        print(f"pdkit rollback: {args.host}: cannot reach it over SSH ({unreachable[args.host]})", file=sys.stderr)
        return EXIT_FAILED
    roller.connected = dict(hosts)
    outages = batch_outages(spec, batch)
    if outages:
        roller.restart_s[args.host] = roller.last_restart_to_ready(hosts[args.host], args.host)
        downtime = outage_lines([batch], {0: outages}, roller.restart_s, spec.cluster.ready_timeout_s)
        if not args.allow_downtime:
            print(refusal_text("rollback", rerun_with_downtime(args), downtime), file=sys.stderr)
            return EXIT_INVALID
        for line in downtime:
            p("-", "downtime", line)
    name = "drain"
    # the node's alerts do not page from the drain to the smoke; a failed step expires the silence
    # once the engines are put back in the router, so a node left broken pages
    with roller.silenced(batch, "drain, restore, gates, re-add, smoke", done="back on the release, ready and in the router",
                         failed="the rollback stopped on it: expired, so whatever is still wrong pages") as step:
        try:
            for name, fn in (("drain", roller.drain), ("restore", lambda b: roller.restore(args.host, hosts[args.host], args.to)),
                             ("ready", roller.ready), ("router", roller.readd), ("smoke", roller.smoke)):
                start = time.monotonic()
                p(args.host, name, fn(batch), time.monotonic() - start)
        except Exception as exc:  # noqa: BLE001
            print(f"pdkit rollback: {args.host}: gate '{name}' failed: {exc}", file=sys.stderr)
            if name == "restore":
                try:
                    roller.readd(batch)
                except Exception:  # noqa: BLE001
                    pass
            step.failed = True
    return EXIT_FAILED if step.failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("roll", help="apply the inventory node by node: drain, apply, gate, re-add, smoke; roll back a failed node")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append", default=[], metavar="HOST", help="only these hosts (repeat)")
    p.add_argument("--canary", metavar="HOST", help="roll this host first, alone (default: the first GPU node without a router)")
    p.add_argument("--batch", type=int, default=1, metavar="N", help="hosts per batch after the canary (default 1)")
    p.add_argument("--dry", action="store_true", help="print the order and what would change on each node; change nothing")
    p.add_argument("--bake", type=float, default=0.0, metavar="S", help="after the canary, let it serve S seconds and check it again before going on")
    p.add_argument("--drain-timeout", type=float, default=300.0, metavar="S", help="longest wait for an engine's running requests and PD queues to empty")
    p.add_argument("--smoke-requests", type=int, default=4, metavar="N", help="completions sent through each router after a node rejoins")
    p.add_argument("--report", metavar="FILE", help="write per-node timings (total, engines' restart-to-ready, kit overhead, outage, steps) and the Alertmanager silences made (ids, matchers, window) as JSON")
    p.add_argument("--allow-downtime", action="store_true",
                   help="accept an outage where a batch holds a router's last workers of a kind (a one-node cluster); refused without it")
    p.set_defaults(func=cmd_roll)

    p = subparsers.add_parser("releases", help="list the releases kept on a node")
    p.add_argument("inventory")
    p.add_argument("host")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_releases)

    p = subparsers.add_parser("rollback", help="put a node back on a kept release (default: the previous one), drained and gated")
    p.add_argument("inventory")
    p.add_argument("host")
    p.add_argument("--to", metavar="RELEASE", help="release id or unique prefix (see `pdkit releases`)")
    p.add_argument("--drain-timeout", type=float, default=300.0, metavar="S")
    p.add_argument("--allow-downtime", action="store_true", help="accept an outage where the node holds a router's last workers of a kind")
    p.set_defaults(func=cmd_rollback)
