"""Releases: every configuration applied to a node, kept on the node for byte-exact rollbacks.

Stdlib only: this module also runs ON the node, from the node venv's python
(`/opt/pdkit/venv/bin/python -m pdkit.releases record|list|restore ...`).

On a node (root-only, mode 0700):

    <install_dir>/releases/
        CURRENT                      the id of the release the node runs now
        <id>/meta.json               id, hash, time, command, files (mode, owner, group, sha256),
                                     venv links, services (unit -> kind, files, health URL, timeout),
                                     weights (model path -> the staged version it pointed at and the
                                     SHA-256 of its manifest: pdkit/agent/weightstore.py, docs/weights.md)
        <id>/files/<absolute path>   the files, byte for byte

A release id is `<UTC time>-<first 12 hex of the hash>`, so ids sort by time. The hash is
the one `pdkit.render.plan.HostPlan.release_hash` computes from the plan, computed here from the
files on disk; recording checks that the two agree. The newest KEEP releases are kept.

Every host path goes through `root` (default "/"), so the logic is tested in a temp dir.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdkit.agent import changes, gates, journald
from pdkit.agent import weightstore as store

KEEP = 10
CURRENT = "CURRENT"
META = "meta.json"


class ReleaseError(RuntimeError):
    """A release cannot be recorded or restored; the message says why."""


# ---------------------------------------------------------------- pure helpers


def releases_dir(install_dir: str) -> str:
    """Where a node keeps its releases (the deploy records into it, `pdkit roll` restores from it)."""
    return f"{install_dir}/releases"


def release_json_path(config_dir: str) -> str:
    """The node's release.json (what it should be running: the deploy writes it, drift checks,
    rollbacks and `pdkit roll` read it); here, on-node, so this module's own default uses it too."""
    return f"{config_dir}/release.json"


def release_hash(entries: dict[str, dict[str, Any]]) -> str:
    """The release hash of {path: {mode, owner, group, sha256}} (same formula as HostPlan.release_hash)."""
    digest = hashlib.sha256()
    for path in sorted(entries):
        e = entries[path]
        digest.update(f"{path}\0{e['mode']}\0{e['owner']}\0{e['group']}\0{e['sha256']}\n".encode())
    return digest.hexdigest()


def release_id(when: _dt.datetime, hash_: str) -> str:
    return when.astimezone(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + hash_[:12]


def to_prune(ids: list[str], keep: int, protect: str | None) -> list[str]:
    """Ids to delete so that the newest KEEP stay (never the current one)."""
    ordered = sorted(ids)
    old = ordered[: max(0, len(ordered) - keep)]
    return [i for i in old if i != protect]


def previous_release(ids: list[str], current: str | None) -> str | None:
    """The release before CURRENT (the newest one when CURRENT is unknown or the oldest)."""
    ordered = sorted(ids)
    if current in ordered:
        i = ordered.index(current)
        return ordered[i - 1] if i > 0 else None
    return ordered[-1] if ordered else None


@dataclass
class RestorePlan:
    """What restoring a release changes on a node (decided from the release and the node's state)."""

    write: list[str] = field(default_factory=list)  # files whose bytes, mode or owner differ
    remove: list[str] = field(default_factory=list)  # files of the current config the release does not have
    venv_switch: dict[str, str] = field(default_factory=dict)  # link -> target
    restart: list[str] = field(default_factory=list)  # units to (re)start, engines first
    stop: list[str] = field(default_factory=list)  # units the release does not run
    journald: bool = False  # its drop-in changes: journald restarts before the services
    weights_switch: dict[str, str] = field(default_factory=dict)  # model path -> the version it points at again


def plan_restore(
    target: dict[str, Any], current_files: dict[str, dict[str, Any] | None], current_venvs: dict[str, str],
    unit_active: dict[str, bool], current_units: list[str],
    previous: dict[str, dict[str, Any]] | None = None,
    current_weights: dict[str, str | None] | None = None,
) -> RestorePlan:
    """Pure: the steps that put a node back on TARGET (a release's meta) from its current state.

    current_files: path -> {mode, owner, group, sha256} or None (missing), for every path the
    release has AND every path of the current configuration. previous: the services of the
    release the node runs now (a file a unit read there counts as its file). current_weights: model
    path -> the version directory its link points at now (None: not a staged version).
    """
    plan = RestorePlan()
    for path, want in sorted(target["files"].items()):
        have = current_files.get(path)
        if have is None or any(have.get(k) != want[k] for k in ("mode", "owner", "group", "sha256")):
            plan.write.append(path)
    # the one rule the deploy uses too (pdkit/agent/changes.py): files, units and venvs
    plan.remove = changes.removals([p for p, have in current_files.items() if have is not None], target["files"],
                                   [p for p, have in current_files.items() if have is not None])
    plan.venv_switch = {link: dest for link, dest in sorted(target.get("venvs", {}).items())
                        if current_venvs.get(link) != dest}
    plan.weights_switch = {link: w["version"] for link, w in sorted(target.get("weights", {}).items())
                           if (current_weights or {}).get(link) != w["version"]}
    services: dict[str, dict[str, Any]] = target.get("services", {})
    decision = changes.decide(services, set(plan.write) | set(plan.remove), set(plan.venv_switch), unit_active,
                              previous)
    plan.restart = [*decision.start, *decision.restart]
    if plan.weights_switch:
        # the engines read the model at their start: every engine of the node restarts onto the weights
        plan.restart += [u for u, svc in services.items() if svc.get("kind") == "engine" and u not in plan.restart]
    plan.restart = sorted(plan.restart, key=lambda u: (services[u].get("kind") == "router",
                                                       services[u].get("kind") != "engine", u))
    plan.stop = changes.units_to_stop(current_units, services, {u: True for u in current_units})
    plan.journald = journald.restart_needed(set(plan.write) | set(plan.remove))
    return plan


# ---------------------------------------------------------------- the node's file system


def host_path(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def stat_entry(p: Path) -> dict[str, Any] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    if not p.is_file():
        return None
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return {"mode": "%04o" % (st.st_mode & 0o7777), "owner": owner, "group": group,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}


def planned_paths(root: Path, release_json: str) -> list[str]:
    """Every file pdkit laid down, as listed by the node's release.json (plus release.json itself)."""
    p = host_path(root, release_json)
    try:
        manifest = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"cannot read {release_json}: {exc}") from exc
    return sorted({*manifest.get("files", {}), release_json})


def current_units(root: Path, release_json: str) -> list[str]:
    try:
        return list(json.loads(host_path(root, release_json).read_text()).get("services", []))
    except (OSError, ValueError):
        return []


# ---------------------------------------------------------------- the weights a release ran on (issue 47 item 6)

# the layout pdkit/agent/weightstore.py lays down (`pdkit stage`, docs/weights.md): a model path is a relative
# symlink to `.<name>.pdkit-w-<16 hex>` beside it, a verified version holding SGLang's manifest as
# `.pdkit-manifest.json`; spelled once there (stdlib only, on-node like this module)
WEIGHTS_MARK = store.VERSION_MARK
WEIGHTS_MANIFEST = store.MANIFEST_NAME


def model_paths(root: Path, release_json: str) -> list[str]:
    """The --model-path of every engine in the node's release.json (absolute paths only: a hub id is no directory)."""
    try:
        engines = json.loads(host_path(root, release_json).read_text()).get("engines", {})
    except (OSError, ValueError):
        return []
    out = set()
    for engine in engines.values():
        argv = list(engine.get("argv", []))
        for i, arg in enumerate(argv):
            value = argv[i + 1] if arg == "--model-path" and i + 1 < len(argv) else (
                arg.split("=", 1)[1] if arg.startswith("--model-path=") else None)
            if value and value.startswith("/"):
                out.add(value.rstrip("/"))
    return sorted(out)


def is_weights_version(link: str, name: str) -> bool:
    head = f".{os.path.basename(link.rstrip('/'))}{WEIGHTS_MARK}"
    rest = name[len(head):]
    return name.startswith(head) and len(rest) == 16 and all(c in "0123456789abcdef" for c in rest)


def link_version(root: Path, link: str) -> str | None:
    """The staged version directory (its name) the model path LINK points at now, or None."""
    p = host_path(root, link)
    if not p.is_symlink():
        return None
    dest = os.readlink(p).rstrip("/")
    name = os.path.basename(dest)
    if os.path.dirname(dest) not in ("", os.path.dirname(link.rstrip("/"))) or not is_weights_version(link, name):
        return None
    return name


def _manifest_sha(version_path: Path) -> str | None:
    try:
        return hashlib.sha256((version_path / WEIGHTS_MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def weights_of(root: Path, release_json: str) -> dict[str, dict[str, Any]]:
    """Model path -> {version, sha256 (of its manifest)} for each engine model that is a staged version."""
    out = {}
    for link in model_paths(root, release_json):
        name = link_version(root, link)
        sha = _manifest_sha(host_path(root, os.path.join(os.path.dirname(link), name))) if name else None
        if name and sha:
            out[link] = {"version": name, "sha256": sha}
    return out


def weights_missing(root: Path, meta: dict[str, Any]) -> list[str]:
    """The version directories META's weights name that are gone from the node (or hold other weights)."""
    missing = []
    for link, w in sorted(meta.get("weights", {}).items()):
        path = os.path.join(os.path.dirname(link), w["version"])
        if _manifest_sha(host_path(root, path)) != w["sha256"]:
            missing.append(f"{path} (weights {w['sha256'][:16]} of {link})")
    return missing


def _switch_weights(root: Path, link: str, version: str) -> None:
    """Point the model path LINK at VERSION (beside it) in one rename."""
    p = host_path(root, link)
    tmp = p.with_name(f".{p.name}.pdkit-link")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(version, tmp)
    os.replace(tmp, p)


def prune_weights(root: Path, releases: Path, links: list[str]) -> list[str]:
    """Remove the staged versions of LINKS that no kept release names and no link points at (the
    previous weights go once a newer release ran on new ones and the last release naming them is pruned)."""
    kept = set()
    for rid in _ids(releases):
        try:
            meta = json.loads((releases / rid / META).read_text())
        except (OSError, ValueError):
            return []  # an unreadable release: remove nothing rather than weights it may name
        kept |= {(link, w["version"]) for link, w in meta.get("weights", {}).items()}
    removed = []
    for link in links:
        parent = host_path(root, os.path.dirname(link))
        current = link_version(root, link)
        for entry in sorted(parent.iterdir()) if parent.is_dir() else []:
            if (is_weights_version(link, entry.name) and entry.name != current and (link, entry.name) not in kept
                    and entry.is_dir() and not entry.is_symlink()):
                shutil.rmtree(entry)
                removed.append(str(entry))
    return removed


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _ids(releases: Path) -> list[str]:
    if not releases.is_dir():
        return []
    return sorted(d.name for d in releases.iterdir() if (d / META).is_file())


def read_current(releases: Path) -> str | None:
    try:
        return (releases / CURRENT).read_text().strip() or None
    except OSError:
        return None


def record(
    *, root: Path, releases_dir: str, release_json: str, command: str, services: dict[str, dict[str, Any]],
    venv_links: list[str], expect_hash: str | None = None, keep: int = KEEP, now: _dt.datetime | None = None,
) -> dict[str, Any]:
    """Copy every planned file (bytes, mode, owner) into a new release and make it CURRENT."""
    releases = host_path(root, releases_dir)
    entries: dict[str, dict[str, Any]] = {}
    for path in planned_paths(root, release_json):
        entry = stat_entry(host_path(root, path))
        if entry is None:
            raise ReleaseError(f"{path} is listed in {release_json} but is missing on the node")
        entries[path] = entry
    hash_ = release_hash(entries)
    if expect_hash and hash_ != expect_hash:
        raise ReleaseError(f"the files on the node hash to {hash_[:12]} but the plan's release is {expect_hash[:12]}: "
                           "a file differs from the plan")
    venvs = {link: os.path.realpath(host_path(root, link)) for link in venv_links if host_path(root, link).exists()}
    if root != Path("/"):
        venvs = {link: "/" + os.path.relpath(dest, root) for link, dest in venvs.items()}
    weights = weights_of(root, release_json)
    current = read_current(releases)
    if current and (releases / current / META).is_file():
        meta: dict[str, Any] = json.loads((releases / current / META).read_text())
        if meta["hash"] == hash_ and meta.get("venvs") == venvs and meta.get("weights", {}) == weights:
            return meta  # the node already runs exactly this release
    when = now or _dt.datetime.now(_dt.UTC)
    rid = release_id(when, hash_)
    releases.mkdir(parents=True, exist_ok=True)
    os.chmod(releases, 0o700)  # secrets are kept here too
    tmp = releases / f".{rid}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "files").mkdir(parents=True)
    for path in entries:
        dest = host_path(tmp / "files", path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(host_path(root, path), dest)
        os.chmod(dest, 0o600)
    meta = {
        "id": rid, "hash": hash_, "time": when.astimezone(_dt.UTC).isoformat(timespec="seconds"), "command": command,
        "files": entries, "venvs": venvs, "services": services, "weights": weights,
    }
    _write_private(tmp / META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(releases / rid, ignore_errors=True)
    os.rename(tmp, releases / rid)
    _set_current(releases, rid)
    for old in to_prune(_ids(releases), keep, rid):
        shutil.rmtree(releases / old, ignore_errors=True)
    # recorded after the services' gates passed (roles/releases.py runs last): the engines run on these weights
    prune_weights(root, releases, list(weights))
    return meta


def _set_current(releases: Path, rid: str) -> None:
    tmp = releases / f".{CURRENT}.tmp"
    _write_private(tmp, rid + "\n")
    os.replace(tmp, releases / CURRENT)


def list_releases(*, root: Path, releases_dir: str) -> dict[str, Any]:
    releases = host_path(root, releases_dir)
    out = []
    for rid in _ids(releases):
        meta = json.loads((releases / rid / META).read_text())
        out.append({k: meta.get(k) for k in ("id", "hash", "time", "command", "venvs")}
                   | {"files": len(meta.get("files", {})), "weights": meta.get("weights", {}),
                      "weights_missing": weights_missing(root, meta)})
    return {"current": read_current(releases), "releases": out}


# how long a `systemctl restart|start` may block: systemd bounds the start job itself (TimeoutStartSec,
# which for an engine on shared GPUs adds its predecessor's ready_timeout_s and the GPU-memory wait:
# pdkit.render.plan.shared_gpu_start), so this only catches a hung systemctl. 120 s cut the restore of such a
# decode short on the lent H200 (docs/gpu.md) and left the box without it
START_JOB_BOUND_S = 3600
# any other systemctl verb (daemon-reload, enable, reset-failed, stop)
SYSTEMCTL_BOUND_S = 120


def _systemctl(args: list[str]) -> None:
    bound = START_JOB_BOUND_S if args and args[0] in ("restart", "start") else SYSTEMCTL_BOUND_S
    subprocess.run(["systemctl", *args], check=False, capture_output=True, timeout=bound)


def _unit_active(unit: str) -> bool:
    out = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, timeout=20).stdout.strip()
    return out in ("active", "activating", "reloading")


def _wait_service(unit: str, svc: dict[str, Any]) -> tuple[bool, str]:
    """UNIT's gate from the one gate table (pdkit/agent/gates.py), read from the release's record of it."""

    return gates.wait(gates.gate_for(svc, unit))


def _install_file(src: Path, dest: Path, entry: dict[str, Any]) -> None:
    """Write DEST atomically with the release's bytes, mode and owner (never a moment world-readable)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.pdkit-restore")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(src.read_bytes())
    try:
        uid, gid = pwd.getpwnam(entry["owner"]).pw_uid, grp.getgrnam(entry["group"]).gr_gid
    except KeyError as exc:
        raise ReleaseError(f"{dest}: owner {entry['owner']}:{entry['group']} no longer exists") from exc
    os.chown(tmp, uid, gid)
    os.chmod(tmp, int(entry["mode"], 8))
    os.replace(tmp, dest)


def _switch_link(link: Path, dest: str, root: Path) -> None:
    target = host_path(root, dest)
    if not target.is_dir():
        raise ReleaseError(f"the venv {dest} this release ran with is gone (only the 3 newest are kept); cannot "
                           f"restore {link}")
    tmp = link.with_name(link.name + ".pdkit-restore")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(str(target) if root != Path("/") else dest, tmp)
    os.replace(tmp, link)


def restore(
    *, root: Path, releases_dir: str, release_json: str, to: str | None = None,
    systemctl: Callable[[list[str]], None] = _systemctl, unit_active: Callable[[str], bool] = _unit_active,
    wait: Callable[[str, dict[str, Any]], tuple[bool, str]] = _wait_service,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Put the node back on release TO (default: the one before CURRENT), restart what changed, wait for health."""
    releases = host_path(root, releases_dir)
    ids = _ids(releases)
    current = read_current(releases)
    rid = to or previous_release(ids, current)
    if rid is None:
        raise ReleaseError(f"no release to go back to (kept: {', '.join(ids) or 'none'}; current: {current or 'none'})")
    matches = [i for i in ids if i == rid or i.startswith(rid)]
    if len(matches) != 1:
        raise ReleaseError(f"release {rid!r} {'is ambiguous' if matches else 'is not kept on this node'}; kept: "
                           f"{', '.join(ids) or 'none'}")
    rid = matches[0]
    target = json.loads((releases / rid / META).read_text())
    gone = weights_missing(root, target)
    if gone:
        raise ReleaseError(f"release {rid} ran on weights that are gone from this node: {', '.join(gone)}; nothing "
                           "was changed. Stage them again (`pdkit stage INVENTORY --source ... --manifest ...`) or "
                           "roll back to a release whose weights are kept (`pdkit releases`)")
    paths = set(target["files"])
    try:
        paths |= set(planned_paths(root, release_json))
    except ReleaseError:
        pass  # no readable release.json now: restore the release's files, remove nothing
    cur_files = {p: stat_entry(host_path(root, p)) for p in sorted(paths)}
    cur_venvs = {link: ("/" + os.path.relpath(os.path.realpath(host_path(root, link)), root) if root != Path("/")
                        else os.path.realpath(link)) for link in target.get("venvs", {})}
    units = current_units(root, release_json)
    active = {u: unit_active(u) for u in set(target.get("services", {})) | set(units)}
    previous = None
    if current and (releases / current / META).is_file():
        previous = json.loads((releases / current / META).read_text()).get("services")
    cur_weights = {link: link_version(root, link) for link in target.get("weights", {})}
    plan = plan_restore(target, cur_files, cur_venvs, active, units, previous, cur_weights)
    log(f"restoring {rid}: {len(plan.write)} file(s) to write, {len(plan.remove)} to remove, venv switch "
        f"{sorted(plan.venv_switch) or 'none'}, weights switch "
        f"{', '.join(f'{k} -> {v}' for k, v in plan.weights_switch.items()) or 'none'}, "
        f"restart {plan.restart or 'none'}")
    for unit in plan.stop:
        systemctl(["disable", "--now", unit])
    for path in plan.write:
        # verify the kept copy before it replaces anything
        src = host_path(releases / rid / "files", path)
        if hashlib.sha256(src.read_bytes()).hexdigest() != target["files"][path]["sha256"]:
            raise ReleaseError(f"the kept copy of {path} in release {rid} is damaged (hash differs); nothing further "
                               "restored")
        _install_file(src, host_path(root, path), target["files"][path])
    for path in plan.remove:
        host_path(root, path).unlink(missing_ok=True)
    for link, dest in plan.venv_switch.items():
        _switch_link(host_path(root, link), dest, root)
    for link, version in plan.weights_switch.items():
        _switch_weights(root, link, version)
    systemctl(["daemon-reload"])
    if plan.journald:
        # as the deploy does (roles/services.py): the restored drop-in is read only at journald's start,
        # and before the services restart, so their new streams land in the journal it configures
        systemctl(["restart", journald.JOURNALD_UNIT])
        log(f"restarted {journald.JOURNALD_UNIT} (its pdkit drop-in changed)")
    _set_current(releases, rid)
    # as the deploy does (roles/services.py, the phases of pdkit/agent/gates.py): the engines and daemons
    # restart together (one systemctl call: their start-ups overlap) and their gates wait together;
    # the routers after, once their workers passed theirs
    from concurrent.futures import ThreadPoolExecutor

    services = target["services"]
    first = [u for u in plan.restart if services[u].get("kind") != "router"]
    routers = [u for u in plan.restart if services[u].get("kind") == "router"]
    failures: list[str] = []
    for units in (first, routers):
        if not units or failures:
            continue
        systemctl(["reset-failed", *units])
        systemctl(["enable", *units])
        systemctl(["restart", *units])
        with ThreadPoolExecutor(max_workers=len(units)) as pool:
            results = list(pool.map(lambda u: wait(u, services[u]), units))
        for unit, (ok, message) in zip(units, results):
            log(message)
            if not ok:
                failures.append(f"{unit}: {message}")
    if failures:
        raise ReleaseError(f"restored the files of {rid} but not every service became ready: {'; '.join(failures)}")
    return {"id": rid, "written": plan.write, "removed": plan.remove, "venvs": plan.venv_switch,
            "weights": plan.weights_switch,
            "restarted": plan.restart + ([journald.JOURNALD_UNIT] if plan.journald else [])}


def switch_weights(
    *, root: Path, releases_dir: str, release_json: str, link: str, version: str, command: str,
    now: _dt.datetime | None = None, keep: int = KEEP, **restore_hooks: Callable[..., Any],
) -> dict[str, Any]:
    """New weights for a deployed node (`pdkit stage --activate`): a new release, the current one's files
    with the model path LINK on the staged VERSION, restored like any release (the link switched, the
    engines restarted, their gates waited for). A failed gate puts the node back on the release it ran,
    weights included; the previous weights are pruned only once the new release's engines are ready."""
    releases = host_path(root, releases_dir)
    current = read_current(releases)
    if not current or not (releases / current / META).is_file():
        raise ReleaseError("this node has no current release (never deployed): the link alone is switched there")
    if link not in model_paths(root, release_json):
        raise ReleaseError(f"{link} is the model path of no engine in {release_json}; engines read: "
                           f"{', '.join(model_paths(root, release_json)) or 'none'}")
    where = os.path.join(os.path.dirname(link), version)
    sha = _manifest_sha(host_path(root, where))
    if not is_weights_version(link, version) or sha is None:
        raise ReleaseError(f"{where} is not a staged, verified version of {link}")
    meta = json.loads((releases / current / META).read_text())
    when = now or _dt.datetime.now(_dt.UTC)
    rid = release_id(when, meta["hash"])
    if rid == current:
        raise ReleaseError(f"release {rid} exists already; try again in a second")
    new = {**meta, "id": rid, "time": when.astimezone(_dt.UTC).isoformat(timespec="seconds"), "command": command,
           "weights": {**meta.get("weights", {}), link: {"version": version, "sha256": sha}}}
    tmp = releases / f".{rid}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(releases / current / "files", tmp / "files")
    _write_private(tmp / META, json.dumps(new, indent=2, sort_keys=True) + "\n")
    os.rename(tmp, releases / rid)
    try:
        result = restore(root=root, releases_dir=releases_dir, release_json=release_json, to=rid, **restore_hooks)
    except ReleaseError as exc:
        try:
            restore(root=root, releases_dir=releases_dir, release_json=release_json, to=current, **restore_hooks)
        except ReleaseError as again:
            raise ReleaseError(f"{exc}; putting the node back on {current} failed too: {again}") from exc
        raise ReleaseError(f"{exc}; the node is back on release {current} and its weights") from exc
    for old in to_prune(_ids(releases), keep, rid):
        shutil.rmtree(releases / old, ignore_errors=True)
    result["pruned_weights"] = prune_weights(root, releases, list(new["weights"]))
    return result


# ---------------------------------------------------------------- on-host entry point


def main(argv: list[str] | None = None) -> int:
    from pdkit.agent import lifeline  # here, not at the top: the whole hook of issue 42 item 4 stays in main()
    lifeline.watch_command("pdkit.releases", argv, endable=lifeline.gate_waiting)  # never half-way: in a gate
    parser = argparse.ArgumentParser(prog="python -m pdkit.releases",
                                     description="Record, list and restore this node's releases.")
    parser.add_argument("--releases-dir", default=releases_dir("/opt/pdkit"))
    parser.add_argument("--release-json", default=release_json_path("/etc/pdkit"))
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="action", required=True)
    r = sub.add_parser("record", help="keep the files now on the node as a release and make it current")
    r.add_argument("--command", required=True, dest="applied_by", help="the command that applied this configuration")
    r.add_argument("--services-json", default="{}", help="unit -> {kind, files, health_url, ready_timeout_s}")
    r.add_argument("--venv", action="append", default=[], help="a venv link whose target the release keeps (repeat)")
    r.add_argument("--expect-hash", help="the plan's release hash; refuse when the files on disk differ")
    r.add_argument("--keep", type=int, default=KEEP)
    sub.add_parser("list", help="the kept releases as JSON")
    s = sub.add_parser("restore", help="put the node back on a kept release and restart what changed")
    s.add_argument("--to", help="release id (or a unique prefix); default: the one before the current")
    w = sub.add_parser("weights", help="a new release with a model path on a staged version of its weights, "
                                       "restored like any release (pdkit stage --activate)")
    w.add_argument("--link", required=True, help="the engines' model path (a symlink pdkit stage manages)")
    w.add_argument("--version", required=True, help="the staged version directory's name beside it")
    w.add_argument("--command", default="pdkit stage --activate", dest="applied_by")
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        if args.action == "record":
            meta = record(
                root=root, releases_dir=args.releases_dir, release_json=args.release_json, command=args.applied_by,
                services=json.loads(args.services_json), venv_links=args.venv, expect_hash=args.expect_hash,
                keep=args.keep,
            )
            print(json.dumps({"id": meta["id"], "hash": meta["hash"]}))
        elif args.action == "list":
            print(json.dumps(list_releases(root=root, releases_dir=args.releases_dir)))
        elif args.action == "weights":
            result = switch_weights(root=root, releases_dir=args.releases_dir, release_json=args.release_json,
                                    link=args.link.rstrip("/"), version=args.version, command=args.applied_by,
                                    log=lambda m: print(m, file=sys.stderr))
            print(json.dumps(result))
        else:
            result = restore(root=root, releases_dir=args.releases_dir, release_json=args.release_json, to=args.to,
                             log=lambda m: print(m, file=sys.stderr))
            print(json.dumps(result))
    except ReleaseError as exc:
        print(f"pdkit.releases: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
