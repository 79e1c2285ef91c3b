"""One fact that reads everything the deploy decides on, in a single round trip per host, and
what the deploy and `pdkit roll --dry` decide from it (the node's platform, the venv links a run
changes). The roles (roles/facts.py, roles/base.py) and pdkit.roll read hosts through this module.

pyinfra gathers facts one command at a time and does not cache them; a per-file `files.put`
costs two round trips per file. Reading every planned path's mode, owner and hash, the
units' states, the service user and the Python version at once keeps a no-op run fast; on a GPU
node the preflight's facts come in the same round trip (WithHostState). The values read cannot
change during the run except through pdkit's own operations, so deciding on them at prepare time
is sound (pyinfra 3.10.0 runs every deploy file to completion, collecting operations, before it
executes any: pyinfra_cli/main.py).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import FactBase

from pdkit.agent.releases import releases_dir
from pdkit.hosts.deploy import current_host, current_plan, current_spec
from pdkit.render import flags
from pdkit.spec import ClusterSpec, HostSpec
from pdkit.wheels import wheelhouse
from pdkit.wheels.platforms import NodePlatform, parse_glibc, platform_for
from pdkit.wheels.wheelhouse import WheelhouseError

# Run on every host of every deploy, so kept cheap on the node's CPU (on the lab, the deploying
# machine's): only the modules it needs, its two commands spawned directly, python3 -I -S (below).
# Importing subprocess, pathlib and platform was a quarter of its CPU: 35 ms per host, 25 ms now
# (Debian 12's python3; docs/benchmarks.md "No-op re-run: where the per-host time goes"). JSON
# and SHA-256 come from the C modules behind json and hashlib: `import json` pulls in re (15 ms
# of CPU on a lab guest), hashlib loads OpenSSL (6 ms), a quarter of the probe's own CPU; the
# plain modules stay the fallback (docs/benchmarks.md "No-op re-run on the lab: a CPU profile").
PROBE = (Path(__file__).with_name("hoststate_probe.py")).read_text()  # a program, kept as a file ruff and mypy read


class PdkitHostState(FactBase):
    """Python version, glibc and machine, every planned path (kind, mode, owner, group, sha256), unit states, service
    user, venvs' bundle markers, installed packages, the release the node runs (pdkit/agent/releases.py), and TEXTS:
    (name, "file", path) or (name, "uname", field) read as `cat` and `uname` would print them (None: unreadable)."""

    def command(self, paths: tuple[str, ...], units: tuple[str, ...], user: str | list[str], venvs: tuple[str, ...],
                packages: tuple[str, ...] = (), releases: str = "",
                texts: tuple[tuple[str, str, str], ...] = ()) -> str:
        # -I: no PYTHONPATH, user site or working directory on its path; -S: no site-packages
        args = [list(paths), list(units), user, list(venvs), list(packages), releases, [list(t) for t in texts]]
        return f"python3 -I -S -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(args))}"

    def process(self, output):
        return json.loads("\n".join(output))


# marks the end of one part of WithHostState's output: the part's exit status follows it
_PART_END = "--- pdkit part exit status: "


class WithHostState(FactBase):
    """Another fact (FACT, read with KWARGS) and PdkitHostState (read with STATE) in one command,
    one round trip instead of two: (FACT's value, the host state).

    Each part is run and parsed as when read alone (its `default()` when it printed nothing). A
    part whose command fails is None here, the other kept: the caller reads that part again
    alone, so that it fails exactly as it would have (pyinfra's error, the host marked failed).
    """

    def command(self, fact: type[FactBase], kwargs: dict, state: dict) -> str:
        parts = [fact().command(**kwargs), PdkitHostState().command(**state)]
        # each part in a subshell (an `exit` in it ends only that part), `;` after it: this command
        # succeeds, and each part's exit status is on the line after the part's output
        return " ; ".join(f"( {part} ) ; echo \"{_PART_END}$?\"" for part in parts)

    def process(self, output):
        # FACT's class is not in the output: the caller parses its part (read_with_host_state)
        parts: list[tuple[list[str], int]] = []
        lines: list[str] = []
        for line in output:
            head, mark, status = line.rpartition(_PART_END)
            if mark and status.isdigit():
                if head:
                    lines.append(head)  # the part's last line had no newline
                parts.append((lines, int(status)))
                lines = []
            else:
                lines.append(line)
        if len(parts) != 2:
            return None, None  # cut short: each part is read alone again
        (fact_lines, fact_status), (state_lines, state_status) = parts
        state = ((PdkitHostState().process(state_lines) if state_lines else PdkitHostState.default())
                 if state_status == 0 else None)
        return (fact_lines if fact_status == 0 else None), state


# per pyinfra State, then host name: `pdkit roll` runs one State per batch in one process, and a
# new State must read the hosts again (a State that is gone takes its entries with it)
_STATE: WeakKeyDictionary = WeakKeyDictionary()


def state_kwargs() -> dict:
    """What PdkitHostState reads on the current host: every path, unit, user, venv and package of its plan."""
    spec = current_spec()
    plan = current_plan()
    paths = tuple(sorted({f.path for f in plan.files} | {d[0] for d in plan.directories}
                         | {spec.cluster.install_dir, f"{spec.cluster.install_dir}/wheelhouse"}))
    return {
        "paths": paths, "units": tuple(s.unit for s in plan.services),
        "user": list(plan.users or (spec.cluster.service_user,)),
        "venvs": flags.venv_links(spec), "packages": tuple(plan.packages),
        "releases": releases_dir(spec.cluster.install_dir),
    }


def host_state(texts: tuple[tuple[str, str, str], ...] = ()) -> dict:
    """The current host's state for everything pdkit plans on it (one round trip, read once per run);
    TEXTS (PdkitHostState's) are read too when this is the first read."""
    read = _STATE.setdefault(host.state, {})
    if host.name not in read:
        read[host.name] = host.get_fact(PdkitHostState, **state_kwargs(), texts=texts)
    return read[host.name]


def read_with_host_state(fact: type[FactBase], kwargs: dict):
    """FACT's value (read with KWARGS) and, in the same round trip, the current host's state,
    kept for host_state(). None when FACT's command failed (read it alone then). The deploy reads
    the preflight's facts this way (roles/preflight.py): one round trip per host, not two."""
    read = _STATE.setdefault(host.state, {})
    if host.name in read:
        return host.get_fact(fact, **kwargs)
    # None: the command itself failed (pyinfra has said so): each part is read alone again
    lines, state = host.get_fact(WithHostState, fact=fact, kwargs=kwargs, state=state_kwargs()) or (None, None)
    if state is not None:
        read[host.name] = state
    if lines is None:
        return None
    return fact().process(lines) if lines else fact.default()


def read_texts_with_host_state(texts: tuple[tuple[str, str, str], ...]) -> dict[str, str | None] | None:
    """TEXTS (PdkitHostState's) read by the current host's host-state probe, in its own round trip,
    the host state kept for host_state(): name -> text (None: unreadable). None when the host state
    was already read (read them some other way then)."""
    if host.name in _STATE.setdefault(host.state, {}):
        return None
    return host_state(texts)["texts"]


def path_matches(state: dict, path: str, kind: str, mode: str, owner: str, group: str,
                 sha256: str | None = None) -> bool:
    return state["paths"].get(path) == [kind, mode, owner, group, sha256]


def unit_active_enabled(state: dict, unit: str) -> tuple[bool, bool, bool]:
    """(installed, active, enabled) from `systemctl show` LoadState/ActiveState/UnitFileState."""
    fields = state["units"].get(unit) or []
    loaded = bool(fields) and fields[0] == "loaded"
    active = len(fields) > 1 and fields[1] in ("active", "activating", "reloading")
    enabled = len(fields) > 2 and fields[2] == "enabled"
    return loaded, active, enabled


# ---- what the deploy decides from the host state: the node's platform and its venvs


def node_platform() -> NodePlatform:
    """The host's Python and glibc as the wheelhouse needs them (read in the one host-state fact)."""
    state = host_state()
    try:
        glibc = parse_glibc(state.get("glibc", ""))
    except ValueError:
        raise WheelhouseError(f"could not read the node's glibc version (got {state.get('glibc')!r}): pdkit needs a "
                              "glibc Linux node") from None
    return platform_for(state["python"], glibc, state.get("arch") or "x86_64")


def fail_prepare(exc: Exception) -> NoReturn:
    """Stop the whole run at prepare time: no host has been changed yet."""
    raise SystemExit(f"pdkit: {host.name}: {exc}. No host was changed.") from None


Bundled = tuple[wheelhouse.Bundle, str]
Platform = Callable[[], NodePlatform]


def node_venv_bundle(spec: ClusterSpec, platform: Platform) -> Bundled:
    # pdkit alone, on every host: no engine runs from it (flags.venv_dir)
    return wheelhouse.node_bundle(platform()), flags.venv_dir(spec)


def engine_venv_bundle(spec: ClusterSpec, host: HostSpec, platform: Platform) -> Bundled | None:
    """The kit-managed engine environment's bundle and link, or None (no engine process here, or
    the node provides its own engine environment): flags.managed_engine_env decides."""
    wanted = flags.managed_engine_env(spec, host)
    if wanted is None:
        return None
    return wheelhouse.engine_bundle(platform(), *wanted), flags.engine_venv_dir(spec)


def router_venv_bundle(spec: ClusterSpec, host: HostSpec, platform: Platform) -> Bundled | None:
    if host.router is None:
        return None
    package, version = spec.router_release(host)
    return wheelhouse.router_bundle(platform(), package, version), flags.router_venv_dir(spec)


def collect_bundles(makers: tuple[Callable[[], Bundled | None], ...]) -> list[Bundled]:
    """Every venv this host gets, as (bundle, link), from MAKERS (node, engine, router). Wheelhouse
    errors stop the whole run at prepare time, every bundle's at once (the fix for one should not
    hide the next)."""
    bundles, errors = [], []
    for make in makers:
        try:
            found = make()
        except WheelhouseError as exc:
            errors.append(str(exc))
            continue
        if found is not None:
            bundles.append(found)
    if errors:
        fail_prepare(WheelhouseError("; and ".join(errors)))
    return bundles


def venv_bundles() -> list[Bundled]:
    """Every venv the current host gets: node, engine, router (roles/base.py installs them)."""
    spec, host = current_spec(), current_host()
    return collect_bundles((
        lambda: node_venv_bundle(spec, node_platform),
        lambda: engine_venv_bundle(spec, host, node_platform),
        lambda: router_venv_bundle(spec, host, node_platform),
    ))


def installed(bundle: wheelhouse.Bundle, venv: str) -> bool:
    # the marker sits inside the real venv, seen through the VENV link: present only when the
    # link points at a complete venv of exactly this bundle (it is written last)
    return f".pdkit-bundle-{bundle.digest[:16]}" in host_state()["venvs"].get(venv, [])


def changed_venv_links(bundles: list[Bundled] | None = None) -> set[str]:
    """The venv links this run points at a new venv (of BUNDLES, default venv_bundles()). The one
    answer the deploy's restarts (roles/services.py), the release record (roles/releases.py) and
    `pdkit roll --dry` use: a service restarts when the link it runs from (pdkit/render/plan.py
    Service.venv) is among them, so a new pdkit wheel (node venv) restarts pdkit-exporter, a new
    engine environment the engines, a new router venv the router."""
    return {venv for bundle, venv in (venv_bundles() if bundles is None else bundles) if not installed(bundle, venv)}
