"""The one rule for what a change on a node means: which files go, which units stop, start or restart.

Deploy (roles/services.py), `pdkit roll --dry` (pdkit/roll/planning.py host_diff) and rollback
(pdkit/agent/releases.py plan_restore) all call these functions, so the three cannot disagree
(issue #18 item 8). Stdlib only: releases.py runs it ON the node from the node venv.

A service is described as releases keep it (meta.json "services"):

    {unit: {"kind": "engine"|"router"|"http", "files": [paths], "venv": "/opt/pdkit/venv" | None}}

`venv` is the venv link the unit's ExecStart runs from: pdkit-exporter from the node venv
(pdkit's own wheel: a pdkit upgrade restarts it and nothing else), engines from the engine
environment (`<install_dir>/engine-venv`: SGLang's lock, or the sim's own sources; issue 30
item 3), the router from the router venv, packaged daemons (Prometheus, Grafana, DCGM) from
none, and so do engines on a node that provides its own engine environment
(`pdkit_node.engine_venv`: pdkit never changes it; a changed engine_venv path changes the
unit file, which restarts them). A release recorded before `venv` was kept has no such key: such a service
restarts on any venv change (the cautious reading of what it ran from).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# the key absent: "unknown venv" (legacy release), distinct from None ("runs from no venv of pdkit's")
_UNKNOWN = object()


@dataclass(frozen=True)
class Decision:
    """Units to start (not running or not enabled) and to restart (running, something they use changed), in order."""

    start: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)
    # unit -> why it restarts (a file, a venv), for the deploy's operation names and the dry plan
    why: dict[str, str] = field(default_factory=dict)


def _order(units: Iterable[str], services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    # engines and daemons first, routers last: a router's gate needs its workers up
    return sorted(units, key=lambda u: (services[u].get("kind") == "router", services[u].get("kind") != "engine", u))


def decide(
    services: Mapping[str, Mapping[str, Any]],
    changed_files: Iterable[str],
    changed_venvs: Iterable[str],
    running: Mapping[str, bool],
    previous: Mapping[str, Mapping[str, Any]] | None = None,
) -> Decision:
    """Pure: which of SERVICES start and which restart.

    changed_files: paths written or removed by this change; changed_venvs: venv links that
    now point at a new venv; running: unit -> active and enabled now; previous: the services of
    the release the node runs now (a file a unit USED to read, e.g. a secrets file the new plan
    drops, counts as that unit's file too).
    """
    changed = set(changed_files)
    venvs = set(changed_venvs)
    previous = previous or {}
    start, restart, why = [], [], {}
    for unit, svc in services.items():
        if not running.get(unit, False):
            start.append(unit)
            why[unit] = "not running"
            continue
        files = set(svc.get("files", ())) | set(previous.get(unit, {}).get("files", ()))
        hit = sorted(changed & files)
        venv = svc.get("venv", _UNKNOWN)
        if hit:
            restart.append(unit)
            why[unit] = "changed: " + ", ".join(hit)
        elif venvs and (venv in venvs or venv is _UNKNOWN):
            restart.append(unit)
            why[unit] = "new venv: " + (", ".join(sorted(venvs)) if venv is _UNKNOWN else str(venv))
    # engines sharing GPUs restart as a group, in order: each sizes its pool against the memory the
    # earlier ones leave free, which grows with their traffic; restarted alone a later engine finds
    # less than at the first start (on the lent H200 the decode's wait for it failed, docs/gpu.md)
    for unit in list(restart) + list(start):
        for mate in services[unit].get("share_group", ()):
            if mate != unit and mate in services and mate not in restart and mate not in start:
                restart.append(mate)
                why[mate] = f"shares its GPUs with {unit}: the group restarts together, in order"
    return Decision(_order(start, services), _order(restart, services), why)


def removals(recorded: Iterable[str], planned: Iterable[str], present: Iterable[str]) -> list[str]:
    """Pure: files the node's current release laid down that the new plan no longer has and that
    are still on the node (so a second run removes nothing and reports no change)."""
    keep = set(planned)
    there = set(present)
    return sorted(p for p in set(recorded) if p not in keep and p in there)


def units_to_stop(recorded: Iterable[str], planned: Iterable[str], active_or_enabled: Mapping[str, bool]) -> list[str]:
    """Pure: units the current release ran that the new plan does not, still running or enabled."""
    keep = set(planned)
    return sorted(u for u in set(recorded) if u not in keep and active_or_enabled.get(u, False))


Change = Literal["removed", "added", "changed"]


def keyed_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Change]]:
    """Pure: the keys whose entries differ between two keyed maps, sorted, each with what happened to it:
    "removed" (in OLD only), "added" (in NEW only) or "changed" (in both, unequal). The one reading of "what
    changed" for the deploy's moved scrape targets (pdkit/hosts/limitwarn.py) and bench's flag changes between
    two runs (pdkit/bench/report.py); each says it in its own words."""
    out: list[tuple[str, Change]] = []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            out.append((key, "removed"))
        elif key not in old:
            out.append((key, "added"))
        elif old[key] != new[key]:
            out.append((key, "changed"))
    return out
