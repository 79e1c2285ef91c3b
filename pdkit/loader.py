"""Inventory -> ClusterSpec, through pyinfra's own inventory loader, without touching a host.

Using pyinfra's loader means group_data precedence is exactly what `pyinfra INVENTORY
deploy/pd.py` will see. Every problem is collected before anything is raised, so the user
fixes an inventory in one pass.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pdkit.spec import (
    Cluster,
    ClusterSpec,
    HostSpec,
    Monitoring,
    Node,
    Problem,
    Router,
    SpecError,
    cross_checks,
)

SECTIONS: dict[str, type[BaseModel]] = {
    "pdkit_cluster": Cluster,
    "pdkit_node": Node,
    "pdkit_router": Router,
    "pdkit_monitoring": Monitoring,
}


def load(inventory: str | os.PathLike[str], cwd: str | None = None) -> ClusterSpec:
    """Load and validate an inventory file. Raises SpecError listing every error."""
    spec, problems = load_with_problems(inventory, cwd)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        raise SpecError(problems)
    return spec


def load_with_problems(
    inventory: str | os.PathLike[str], cwd: str | None = None
) -> tuple[ClusterSpec | None, list[Problem]]:
    """Load an inventory; return the spec (None if any error) and every problem, warnings included."""
    path = Path(inventory)
    if not path.is_file():
        return None, [Problem("<inventory>", str(inventory), "no such inventory file; give a pyinfra inventory .py file, e.g. inventories/cluster.py")]
    try:
        hosts = read_inventory(str(path), cwd or os.getcwd())
    except Exception as exc:  # the user's Python file: report, never a traceback
        return None, [Problem("<inventory>", str(inventory), f"pyinfra could not load it: {type(exc).__name__}: {exc}")]
    return spec_from_host_data(hosts, inventory=str(inventory))


def read_inventory(path: str, cwd: str) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """(host name, groups, resolved data) for every host, via pyinfra's CLI loader."""
    import warnings

    # importing pyinfra_cli gevent-patches the process; when requests/urllib3 were imported first
    # gevent warns about ssl, which is harmless for inventory loading (no connection is made)
    warnings.filterwarnings("ignore", message="Monkey-patching ssl after ssl has already been imported")
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    # pyinfra's loader executes the inventory with a State in context, as its CLI does
    state = State(check_for_changes=False)
    state.cwd = cwd
    with _quiet_pyinfra(), ctx_state.use(state):
        inventory = make_inventory(path, cwd=cwd)
    return inventory_host_data(inventory)


def inventory_host_data(inventory) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """(host name, groups, resolved data) for each host of a pyinfra Inventory object."""
    out = []
    for host in inventory:
        groups = tuple(sorted(g.name if hasattr(g, "name") else str(g) for g in getattr(host, "groups", ())))
        out.append((host.name, groups, host.data.dict()))
    return out


@contextlib.contextmanager
def _quiet_pyinfra():
    logger = logging.getLogger("pyinfra")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def spec_from_host_data(
    hosts: list[tuple[str, tuple[str, ...], dict[str, Any]]], inventory: str = ""
) -> tuple[ClusterSpec | None, list[Problem]]:
    """Validate every host's pdkit sections, then the cross-host rules."""
    problems: list[Problem] = []
    cluster_raw: dict[str, Any] | None = None
    cluster_from = ""
    host_specs: list[dict[str, Any]] = []

    for name, groups, data in hosts:
        for key in sorted(k for k in data if k.startswith("pdkit_") and k not in SECTIONS):
            problems.append(Problem(name, key, f"unknown pdkit section; valid: {', '.join(SECTIONS)}"))
        raw_cluster = data.get("pdkit_cluster")
        if raw_cluster is not None:
            if cluster_raw is None:
                cluster_raw, cluster_from = raw_cluster, name
            elif raw_cluster != cluster_raw:
                problems.append(Problem(name, "pdkit_cluster", f"differs from the pdkit_cluster that {cluster_from} sees; cluster-wide settings must resolve to the same value on every host"))
        entry: dict[str, Any] = {
            "name": name,
            "groups": groups,
            "address": str(data.get("ssh_hostname") or name),
        }
        for key, model in SECTIONS.items():
            if key == "pdkit_cluster" or data.get(key) is None:
                continue
            value = _validated(model, data[key], name, key, problems)
            if value is not None:
                entry[key.removeprefix("pdkit_")] = value
            else:
                entry["invalid"] = True
        host_specs.append(entry)

    if cluster_raw is None:
        problems.append(Problem("<inventory>", "pdkit_cluster", "no host resolves pdkit_cluster: set it (model, engine, sglang_version, ...) on a group every host belongs to"))
        return None, problems
    cluster = _validated(Cluster, cluster_raw, cluster_from, "pdkit_cluster", problems)
    if cluster is None or any(h.get("invalid") for h in host_specs):
        return None, problems

    spec = ClusterSpec(
        cluster=cluster,
        hosts=tuple(HostSpec(**{k: v for k, v in h.items() if k != "invalid"}) for h in host_specs),
        inventory=inventory,
    )
    problems.extend(cross_checks(spec))
    from pdkit import argvcheck

    problems.extend(argvcheck.problems(spec))
    if any(p.severity == "error" for p in problems):
        return None, problems
    return spec, problems


def _validated(model: type[BaseModel], raw: Any, host: str, section: str, problems: list[Problem]):
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(Problem(host, _field_path(section, err["loc"]), _message(model, err)))
        return None


def _field_path(section: str, loc: tuple) -> str:
    path = section
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "literal[", "tagged-union")):
            continue
        else:
            path += f".{part}"
    return path


def _message(model: type[BaseModel], err: dict) -> str:
    kind = err["type"]
    msg = err["msg"]
    if kind == "extra_forbidden":
        owner = _model_at(model, err["loc"][:-1])
        valid = ", ".join(owner.model_fields) if owner is not None else ""
        return f"unknown field {err['loc'][-1]!r}; valid fields: {valid}"
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        return f"{err.get('input')!r} is not valid: {_PATTERN_HINTS.get(err['ctx']['pattern'], 'must match ' + err['ctx']['pattern'])}"
    if msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    if "input" in err and kind not in ("model_type", "dict_type"):
        return f"{msg} (got {err['input']!r})"
    return msg


_PATTERN_HINTS = {
    r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$": "use lowercase letters, digits and '-', at most 40 characters, not starting or ending with '-' (it becomes a systemd unit name and a metric label)",
    r"^[a-z_][a-z0-9_-]{0,30}$": "a Unix user name: lowercase letters, digits, '_' and '-'",
    r"^/[A-Za-z0-9_./-]+$": "an absolute path of letters, digits, '_', '.', '/' and '-'",
    r"^\d+\.\d+$": "a compute capability like '12.0' or '9.0'",
}


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model a validation error location points into (for listing valid fields)."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if field is None:
            return None
        current = _model_in(field.annotation, typing)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _model_in(annotation, typing) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg, typing)
        if found is not None:
            return found
    return None


def load_or_report(inventory: str | os.PathLike[str]) -> ClusterSpec | None:
    """For commands that act on a cluster: the spec, or None after printing every error to stderr.

    Nothing is contacted before this returns a spec. (pyinfra's CLI, imported here, gevent-patches
    the process: commands load the inventory before they import any HTTP client.)
    """
    spec, problems = load_with_problems(inventory)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        print(f"{inventory}: {len(errors)} error(s); nothing was contacted "
              f"(`pdkit validate {inventory}` lists warnings too).", file=sys.stderr)
        for p in errors:
            print(f"  error   {p}", file=sys.stderr)
        return None
    return spec
