"""What a roll will do, decided without a host: the order, batches and version pairing, the outages
a batch causes and how long a downtime holds, the dry-plan diff, the silence window, the router keys
to try, how a stopped roll is worded. Pure: no I/O, unit tested without hosts.
"""

from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from pdkit.agent import changes
from pdkit.agent.enginestarts import RESTART_GAP_US as RESTART_GAP_US  # re-exported: pdkit.roll names it
from pdkit.agent.enginestarts import config_class, restart_seconds, unit_argv_env
from pdkit.agent.health import worker_key
from pdkit.clients.router_api import Key, key_order
from pdkit.render.outages import Outage

if TYPE_CHECKING:
    from pdkit.render.plan import HostPlan
    from pdkit.spec import ClusterSpec

# How long a downtime roll keeps a router's last regular worker listed `draining` (smg answers
# 404 once none is listed, 503 + Retry-After while one drains): the slowest measured
# restart-to-ready x HOLD_FACTOR + HOLD_MARGIN_S (drain, apply, re-add), at most HOLD_MAX_S;
# HOLD_UNMEASURED_S when the node's engines never logged a restart
HOLD_FACTOR, HOLD_MARGIN_S, HOLD_MAX_S, HOLD_UNMEASURED_S = 1.5, 10, 600, 60
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
        # set by roll_batch: the workers the put-back left out of the router, and why (Recovery.left_out)
        self.left_out: dict[str, str] = {}


def sort_by_health(answers: dict[str, tuple[int, str]]) -> tuple[list[str], dict[str, str]]:
    """Pure: (URLs whose own /health answered 200, {URL: why not} for the others) from each engine's
    last /health answer (status, body; status 0 when nothing answered)."""
    healthy = [u for u, (status, _) in answers.items() if status == 200]
    left_out = {u: (f"its /health answered {status}: {body.strip()[:120]}" if status
                    else f"its /health did not answer ({body.strip()[:120]})")
                for u, (status, body) in answers.items() if status != 200}
    return healthy, left_out


def router_state_words(readded: bool | None, left_out: dict[str, str] | None = None) -> str:
    """Pure: where the batch's engines stand with the router after a failed step, for the last line.
    LEFT_OUT: the workers the put-back did not add back (URL -> why); named, so a partial re-add is
    never reported as all or nothing."""
    if readded is None:
        return "nothing was taken out of the router"
    if left_out:
        named = "; ".join(f"{u} ({why})" for u, why in sorted(left_out.items()))
        if readded:
            return f"its healthy engines are back in the router; left out: {named}"
        return f"its engines are NOT back in the router; left out: {named}"
    if readded:
        return "its engines are back in the router"
    return "its engines are NOT back in the router (the re-add failed: see 'could not add' above)"


def stop_summary(exc: RollError, untouched: list[str]) -> str:
    """Pure: the roll's last line after a failed gate: what state the failed node is in."""
    rest = f"not touched: {', '.join(untouched) or 'none'}"
    if exc.restored:
        return (f"pdkit roll: {exc.host} is back on its previous release where one was recorded; "
                f"{router_state_words(exc.readded, exc.left_out)}; {rest}")
    if exc.gate == "connect":
        return f"pdkit roll: {exc.host} could not be reached: nothing was changed on it; {rest}"
    return (f"pdkit roll: {exc.host}: nothing was applied (gate '{exc.gate}' failed before the deploy); "
            f"{router_state_words(exc.readded, exc.left_out)}; {rest}")



def put_back_summary(command: str, host: str, restored: bool | None, readded: bool | None,
                     left_out: dict[str, str] | None = None) -> str:
    """Pure: the last line of `pdkit rollback` (COMMAND) after a failed step: which release the node
    is left on (RESTORED: the restore step completed; False: it failed; None: it never started)
    and where its engines stand with the router."""
    release = {True: "the restore completed: it runs the release it was rolled back to",
               False: "the restore failed: it runs whatever the failed restore left in place",
               None: "the restore did not start: it runs the release it ran before"}[restored]
    return f"pdkit {command}: {host}: {release}; {router_state_words(readded, left_out)}"


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
            reasons[frozenset(hosts)] = (f"PD group {g!r} changes SGLang version: its hosts {', '.join(hosts)} "
                                         "roll together as one batch")
    for router in spec.router_hosts:
        fronted = spec.router_workers(router)
        fronted_groups = {e.pd_group for _, e in fronted if e.role != "unified"}
        if len(fronted_groups) > 1 and fronted_groups & changed_groups:
            hosts = sorted({h.name for h, e in fronted if e.role != "unified"})
            for h in hosts[1:]:
                union(hosts[0], h)
            reasons[frozenset(hosts)] = (
                f"the router on {router.name} pairs any prefill with any decode of groups "
                f"{', '.join(sorted(fronted_groups))} and a version changes: "
                f"hosts {', '.join(hosts)} roll together as one batch (they leave and rejoin the router together, "
                "which drains all of its workers at once)"
            )
    units: dict[str, set[str]] = {}
    for name in parent:
        units.setdefault(find(name), set()).add(name)
    multi = [u for u in units.values() if len(u) > 1]
    explanations = [reasons.get(frozenset(u))
                    or f"hosts {', '.join(sorted(u))} roll together (shared PD groups change SGLang version)"
                    for u in multi]
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
            lines.append(f"engine {host.name}/{engine.name} spans {', '.join(hosts)}: "
                         f"one step (rank 0 on {host.name} drained from "
                         "the router, every rank restarted together, gated on rank "
                         "0 and a real request, every rank rolled back on failure)")
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


# an engine's expected restart-to-ready for an announcement (engine_estimate): (seconds, where it comes from)
Estimate = tuple[float, str]


def engine_estimate(history: list[dict], planned_class: str | None, new_env: bool = False) -> Estimate | None:
    """Pure: what an engine's restart will take, from its start history on the node (oldest first,
    pdkit/agent/enginestarts.py) and the configuration class it will have after the change
    (PLANNED_CLASS): its last warm restart of that class; else its last warm restart of any class,
    labelled so; None when it has no warm restart (the caller falls back). NEW_ENV: the change
    installs a new engine environment, so the restart is a first, cold one (empty JIT caches): its
    last cold start then, else None."""
    timed = [s for s in history if isinstance(s.get("restart_to_ready_s"), (int, float))]
    if new_env:
        cold = [s for s in timed if not s.get("warm")]
        return ((float(cold[-1]["restart_to_ready_s"]), "the first start on a new engine environment (JIT caches "
                 f"cold): its last such start, {cold[-1].get('time', '?')}") if cold else None)
    warm = [s for s in timed if s.get("warm")]
    same = [s for s in warm if planned_class is not None and s.get("config_class") == planned_class]
    if same:
        return (float(same[-1]["restart_to_ready_s"]),
                f"its last warm restart with the same configuration class, {same[-1].get('time', '?')}")
    if warm:
        return (float(warm[-1]["restart_to_ready_s"]),
                f"its last warm restart, of ANOTHER configuration class (none of this one recorded), "
                f"{warm[-1].get('time', '?')}")
    return None


def planned_classes(plan: HostPlan) -> dict[str, str]:
    """Pure: each engine unit's configuration class as PLAN renders it (pdkit.agent.enginestarts.config_class
    of its unit file and environment files: the bytes the node will hold after the change)."""
    contents = {f.path: f.content for f in plan.files}
    out = {}
    for s in plan.services:
        unit_file = next((p for p in s.files if p.rsplit("/", 1)[-1] == s.unit), None)
        if s.kind == "engine" and unit_file in contents:
            argv, env = unit_argv_env(contents[unit_file], contents.get)
            out[s.unit] = config_class(argv, env)
    return out


def host_estimates(plan: HostPlan, diff: HostDiff | None, history: dict[str, list[dict]]) -> dict[str, Estimate | None]:
    """Pure: engine unit -> engine_estimate for each engine of PLAN the change restarts (DIFF's
    restarts; every engine when the diff is unknown), from the node's start HISTORY (unit -> starts)."""
    classes = planned_classes(plan)
    return {s.unit: engine_estimate(history.get(s.unit, []), classes.get(s.unit),
                                    new_env=bool(diff is not None and s.venv and s.venv in diff.venvs))
            for s in plan.services if s.kind == "engine" and (diff is None or s.unit in diff.restarts)}


def expected_outage(restart_s: dict[str, float | None], batch: list[str], ready_timeout_s: float,
                    estimates: dict[str, dict[str, Estimate | None]] | None = None) -> tuple[float, str]:
    """Pure: (seconds, where the figure comes from) a batch's engines are expected to be out: the
    slowest engine's ESTIMATES (host -> engine unit -> engine_estimate, for the engines the change
    restarts); for a host with an engine without one (or no estimates), the longest
    restart-to-ready last measured on it (RESTART_S), whatever that start was; else the spec's
    ready timeout."""
    figures: list[Estimate] = []
    for h in batch:
        per = (estimates or {}).get(h) or {}
        for unit, found in sorted(per.items()):
            if found:
                name = unit.removeprefix("pdkit-engine-").removesuffix(".service")
                figures.append((found[0], f"{name} on {h}: {found[1]}"))
        if (not per or not all(per.values())) and restart_s.get(h):
            figures.append((float(restart_s[h] or 0.0), f"the engines' restart-to-ready as last measured on {h}"))
    if figures:
        return max(figures, key=lambda f: f[0])
    return float(ready_timeout_s), "the spec's ready_timeout_s: no engine restart measured on the node yet"


def downtime_hold_s(restart_s: dict[str, float | None], hosts: list[str]) -> int:
    """Pure: seconds to keep a router's last regular worker listed `draining` through a downtime
    of HOSTS, from their engines' last measured restart-to-ready (RESTART_S)."""
    known = [s for h in hosts if (s := restart_s.get(h))]
    return min(HOLD_MAX_S, math.ceil(HOLD_FACTOR * max(known) + HOLD_MARGIN_S)) if known else HOLD_UNMEASURED_S


def outage_lines(batches: list[list[str]], outages: dict[int, list[Outage]], restart_s: dict[str, float | None],
                 ready_timeout_s: float, estimates: dict[str, dict[str, Estimate | None]] | None = None) -> list[str]:
    """Pure: one line per batch that takes a router's last workers of a kind out, saying what it costs."""
    lines = []
    for i, found in sorted(outages.items()):
        label = "canary" if i == 0 else f"batch {i}"
        seconds, source = expected_outage(restart_s, batches[i], ready_timeout_s, estimates)
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
        "To accept the outage (the requests in flight drain first; new ones get the router's error status "
        "at once), run:",
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
    venvs: tuple[str, ...] = ()  # the venv links the deploy points at a new venv (an engine's: its restart is cold)


def host_diff(plan: HostPlan, state: dict, *, new_venvs: Iterable[str] = ()) -> HostDiff:
    """Pure: the files that differ from the plan (or that it no longer has) and the services that
    would (re)start, by the deploy's own rule (pdkit/agent/changes.py). NEW_VENVS: the venv links the
    deploy would point at a new venv (pdkit.hosts.hoststate.changed_venv_links: the node venv restarts
    pdkit-exporter, the engine environment the engines, the router venv the router)."""
    # lazy: pdkit.render.plan loads jinja2 (~40 ms); the CLI imports pdkit.roll for every command
    from pdkit.render.plan import services_meta

    paths = state.get("paths", {})
    files = tuple(f.path for f in plan.files if paths.get(f.path) != ["file", f.mode, f.owner, f.group, f.sha256])
    recorded = state.get("release", {}) or {}
    present = [p for p, st in paths.items() if st and st[0] == "file"]
    removed = tuple(changes.removals(recorded.get("files", []), [f.path for f in plan.files], present))
    venvs = set(new_venvs)
    running = {}
    for service in plan.services:
        unit_state = state.get("units", {}).get(service.unit) or []
        running[service.unit] = (len(unit_state) > 2 and unit_state[1] in ("active", "activating", "reloading")
                                 and unit_state[2] == "enabled")
    decision = changes.decide(services_meta(plan.services), {*files, *removed}, venvs, running,
                              recorded.get("services"))
    restarts = tuple(s.unit for s in plan.services if s.unit in {*decision.start, *decision.restart})
    return HostDiff(plan.host, files, restarts, bool(venvs), removed, tuple(sorted(venvs)))


def open_breakers(states: dict[str, float], urls: Iterable[str]) -> list[str]:
    """Pure: the URLs among URLS whose breaker the router reports open (smg_worker_cb_state 1)."""
    return sorted(worker_key(u) for u in urls if states.get(worker_key(u)) == 1)


def unchanged_hosts(diffs: dict[str, HostDiff]) -> set[str]:
    """Hosts already as planned (no file, no restart, no new venv): the roll leaves them serving."""
    return {h for h, d in diffs.items() if not (d.files or d.restarts or d.new_venv or d.removes)}


def format_dry_plan(batches: list[list[str]], diffs: dict[str, HostDiff], explanations: list[str],
                    secret_paths: set[str]) -> str:
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
            lines.append(f"  {step}. {host}: {len(d.files)} file(s) differ from the plan, "
                         f"{len(d.restarts)} service(s) would restart" + (" (new venv)" if d.new_venv else ""))
            for path in d.files:
                lines.append(f"       file     {path}"
                             + ("  (secret: content not shown)" if path in secret_paths else ""))
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


def restart_to_ready(units: dict[str, list]) -> float | None:
    """Pure: from the roller's _TIMING_PROBE (pdkit/roll/roller.py): [left active, ready, went
    inactive, started] per unit (µs), the longest time a running engine took from its last stop to
    its readiness line (pdkit.agent.enginestarts.restart_seconds: the stop counts when it belongs to this
    start). None: no ready line."""
    took = [t for values in units.values()
            if (t := restart_seconds(*(list(values) + [0, 0, 0, 0])[:4])) is not None]
    return max(took) if took else None


def metric_sums(text: str, names: Iterable[str]) -> dict[str, float]:
    """Sum of every sample of each named metric in a Prometheus text page (absent: 0)."""
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
    configured = spec.cluster.secrets.router_api_key
    planned = Key(configured.get_secret_value() if configured else None, "pdkit_cluster.secrets.router_api_key")
    return key_order(*([running] if running else []), planned, Key(None, "no key"))


def key_fix(inventory: str, router_host: str) -> str:
    """Pure: what to run when a router refuses every key the roll has."""
    return (f"Set pdkit_cluster.secrets.router_api_key in {inventory} "
            f"to the key the router on {router_host} runs with, "
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
