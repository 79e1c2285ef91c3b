"""How a big wheel bundle is split between pip processes that install it at once.

pip installs one wheel after another, on one core: the ~210 wheels of an engine bundle (~4 GB,
~9 GB installed) took it 200 s of user and 57 s of system CPU time on the 2-core lab machine, and
about as long in wall time on a node with 64 idle cores (docs/benchmarks.md, "The real engine
venv"). So a bundle of at least `SHARD_MIN_BYTES` goes to `INSTALL_SHARDS` pip processes at once
(`--no-deps`, each its own requirements file, all into the same new venv), and the small node,
sim and router bundles keep one pip.

Two processes may write into one venv only if no file is written by both: wheels that would put
a file at the same place (torch-c-dlpack-ext and flashinfer-python both ship a top-level
`build_backend.py`; two packages may install the same console script) go to the same process.
The shares are balanced by wheel size, the largest group first into the lightest share.

    shards = requirement_shards(bundle.requirements, bundle.wheels)   # () for one pip
"""

from __future__ import annotations

import configparser
import re
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

# a bundle at least this big installs through several pip processes (an engine bundle is ~4 GB;
# the node bundle ~13 MB, the router's ~110 MB, the sim's less)
SHARD_MIN_BYTES = 1_000_000_000
# how many pip processes install a big bundle at once: a node with fewer cores time-shares them,
# and each holds only its own share of the wheels in memory
INSTALL_SHARDS = 4


class ShardError(Exception):
    """The bundle's requirements and its wheels do not name the same packages."""


def requirement_entries(requirements: str) -> tuple[str, dict[str, str]]:
    """REQUIREMENTS as its leading comment block and one entry per package (its `name==version \\`
    line with the `--hash` lines under it), keyed by the package's canonical name."""
    head: list[str] = []
    entries: dict[str, str] = {}
    current: str | None = None
    for line in requirements.splitlines(keepends=True):
        if current is not None and line[:1] in (" ", "\t") and line.strip():
            entries[current] += line
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            current = None
            if not entries:
                head.append(line)
            continue
        current = canonicalize_name(re.split(r"[=<>!~;\s\[@]", stripped, maxsplit=1)[0])
        entries[current] = line
    return "".join(head), entries


def installed_paths(wheel: Path) -> set[str]:
    """Where WHEEL's files land, relative to the venv's site-packages (`../bin/NAME` for scripts,
    `../include/...`, `../data/...` for the other .data kinds): what two wheels must not share."""
    paths: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith("/"):
                continue
            top, _, rest = name.partition("/")
            if top.endswith(".dist-info"):
                if rest == "entry_points.txt":
                    paths |= {f"../bin/{script}" for script in _scripts(archive.read(name).decode("utf-8", "replace"))}
                continue
            if top.endswith(".data"):
                kind, _, sub = rest.partition("/")
                if kind in ("purelib", "platlib"):
                    paths.add(sub)
                elif kind == "scripts":
                    paths.add(f"../bin/{sub.rsplit('/', 1)[-1]}")
                else:
                    paths.add(f"../{kind}/{sub}")
                continue
            paths.add(name)
    return paths


class _CaseKeptParser(configparser.ConfigParser):
    """ConfigParser that keeps option names as written: script names keep their case."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def _scripts(entry_points: str) -> set[str]:
    parser = _CaseKeptParser(interpolation=None, delimiters=("=",))
    try:
        parser.read_string(entry_points)
    except configparser.Error:
        return set()
    return {name for section in ("console_scripts", "gui_scripts") if parser.has_section(section)
            for name in parser.options(section)}


def groups_sharing_files(paths_by_package: dict[str, set[str]]) -> list[set[str]]:
    """The packages as groups: two packages whose wheels write a file at the same place are in one."""
    parent = {name: name for name in paths_by_package}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    owner: dict[str, str] = {}
    for name in sorted(paths_by_package):
        for path in paths_by_package[name]:
            if path in owner:
                parent[root(name)] = root(owner[path])
            else:
                owner[path] = name
    groups: dict[str, set[str]] = {}
    for name in paths_by_package:
        groups.setdefault(root(name), set()).add(name)
    return list(groups.values())


def balance(groups: list[set[str]], size: dict[str, int], shards: int) -> list[list[str]]:
    """GROUPS spread over at most SHARDS shares of about equal size (largest group first into the
    lightest share); each share's package names sorted, empty shares dropped."""
    loads = [0] * shards
    members: list[list[str]] = [[] for _ in range(shards)]
    for group in sorted(groups, key=lambda g: (-sum(size[p] for p in g), sorted(g))):
        lightest = loads.index(min(loads))
        loads[lightest] += sum(size[p] for p in group)
        members[lightest].extend(group)
    return [sorted(m) for m in members if m]


def requirement_shards(requirements: str, wheels: tuple[Path, ...], shards: int | None = None,
                       min_bytes: int | None = None) -> tuple[str, ...]:
    """The requirements files of the pip processes that install this bundle at once, each with the
    bundle's comment block first: () when one pip installs it (a small bundle, or SHARDS 1).
    SHARDS and MIN_BYTES default to INSTALL_SHARDS and SHARD_MIN_BYTES."""
    shards = INSTALL_SHARDS if shards is None else shards
    min_bytes = SHARD_MIN_BYTES if min_bytes is None else min_bytes
    size: dict[str, int] = {canonicalize_name(parse_wheel_filename(w.name)[0]): w.stat().st_size for w in wheels}
    if shards < 2 or sum(size.values()) < min_bytes:
        return ()
    head, entries = requirement_entries(requirements)
    if set(entries) != set(size):
        raise ShardError(f"requirements without a wheel: {sorted(set(entries) - set(size))}; "
                         f"wheels without a requirement: {sorted(set(size) - set(entries))}")
    paths: dict[str, set[str]] = {canonicalize_name(parse_wheel_filename(w.name)[0]): installed_paths(w)
                                  for w in wheels}
    shares = balance(groups_sharing_files(paths), size, shards)
    return tuple(head + "".join(entries[name] for name in share) for share in shares)


def shard_file_names(count: int) -> list[str]:
    """The names the shares' requirements files have beside the bundle's requirements.txt."""
    return [f"requirements-{k}-of-{count}.txt" for k in range(1, count + 1)]


def all_at_once(commands: list[str]) -> str:
    """One POSIX shell command that starts COMMANDS together, waits for every one, and fails if any failed."""
    starts = " ".join(f"( {c} ) & pids=\"$pids $!\";" for c in commands)
    return f"pids=''; {starts} rc=0; for p in $pids; do wait $p || rc=1; done; [ $rc = 0 ]"
