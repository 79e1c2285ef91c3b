"""Inventory -> ClusterSpec, through pyinfra's own inventory loader, without touching a host.

Using pyinfra's loader means group_data precedence is exactly what `pyinfra INVENTORY
deploy/pd.py` will see. Every problem is collected before anything is raised, so the user
fixes an inventory in one pass.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
import os
import sys
import traceback
import typing
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from pdkit.inventory.fieldtable import SECTIONS as FIELD_SECTIONS
from pdkit.render import argvcheck
from pdkit.spec import (
    HOST_SECTIONS,
    Cluster,
    ClusterSpec,
    HostSpec,
    Problem,
    SpecError,
    address_problem,
    cross_checks,
)

SECTIONS = HOST_SECTIONS


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
        return None, [Problem("<inventory>", str(inventory),
                              "no such inventory file; give a pyinfra inventory .py file, e.g. inventories/cluster.py")]
    try:
        hosts, dropped = read_inventory_and_drops(str(path), cwd or os.getcwd())
    except InventoryLoadError as exc:
        return None, [Problem("<inventory>", exc.where, exc.message)]
    spec, problems = spec_from_host_data(hosts, inventory=str(inventory))
    if dropped:
        return None, dropped + problems
    return spec, problems


class InventoryLoadError(Exception):
    """The inventory (or a group_data file) could not be executed: where, and why, in one line."""

    def __init__(self, where: str, message: str):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


def read_inventory(path: str, cwd: str) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """(host name, groups, resolved data) for every host, via pyinfra's CLI loader."""
    return read_inventory_and_drops(path, cwd)[0]


def read_inventory_and_drops(path: str, cwd: str) -> tuple[list[tuple[str, tuple[str, ...], dict[str, Any]]],
                                                           list[Problem]]:
    """(host name, groups, resolved data) for every host, via pyinfra's CLI loader, and the
    hosts or sections pyinfra's loader would drop without a word.

    Raises InventoryLoadError, never the user's own exception (pyinfra wraps it in a
    click exception whose formatting itself fails outside pyinfra's CLI)."""

    # importing pyinfra_cli gevent-patches the process; when requests/urllib3 were imported first
    # gevent warns about ssl, which is harmless for inventory loading (no connection is made)
    warnings.filterwarnings("ignore", message="Monkey-patching ssl after ssl has already been imported")
    # lazy: pyinfra_cli gevent-patches the whole process and takes ~480 ms; only reading an inventory needs it
    import pyinfra_cli.inventory as cli_inventory
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    # pyinfra's loader executes the inventory with a State in context, as its CLI does
    state = State(check_for_changes=False)
    state.cwd = cwd
    module_attrs: dict[str, Any] = {}
    original = cli_inventory._get_groups_from_filename

    def groups_keeping_attrs(filename: str):
        # the same as pyinfra's, keeping the module's variables to see what it leaves out
        attrs = cli_inventory.exec_file(filename, return_locals=True)
        module_attrs.update(attrs)
        return {key: value for key, value in attrs.items() if cli_inventory._is_inventory_group(key, value)}

    cli_inventory._get_groups_from_filename = groups_keeping_attrs
    try:
        with _quiet_pyinfra(), ctx_state.use(state):
            inventory = cli_inventory.make_inventory(path, cwd=cwd)
    except SystemExit as exc:
        raise InventoryLoadError(_user_frame(path, exc.__traceback__),
                                 f"the inventory calls sys.exit({exc.code!r}); an inventory must define its groups, "
                                 "not exit") from None
    except SyntaxError as exc:
        raise InventoryLoadError(f"{exc.filename or path}:{exc.lineno}",
                                 f"SyntaxError: {exc.msg} (the file must run as plain Python: try `python3 "
                                 f"{exc.filename or path}`)") from None
    except Exception as exc:  # the user's Python file: one line, never a traceback
        raise InventoryLoadError(*_describe_load_error(path, exc)) from None
    finally:
        cli_inventory._get_groups_from_filename = original
    return inventory_host_data(inventory), dropped_by_pyinfra(module_attrs)


def _describe_load_error(path: str, exc: BaseException) -> tuple[str, str]:
    """(file:line, "ExcType: message") for an exception raised while pyinfra ran the inventory."""
    inner = getattr(exc, "exception", None)  # pyinfra_cli's UnexpectedExternalError(e, filename)
    if isinstance(inner, BaseException):
        filename = getattr(exc, "filename", path)
        tb = getattr(inner, "_traceback", None) or inner.__traceback__
        return _user_frame(filename, tb), (f"{type(inner).__name__}: {inner} (the file must run as plain Python: "
                                           f"try `python3 {filename}`)")
    text = str(getattr(exc, "message", "") or exc) or type(exc).__name__
    return _user_frame(path, exc.__traceback__), f"pyinfra could not load it: {type(exc).__name__}: {text}"


def _user_frame(filename: str, tb) -> str:
    """"file:line" of the innermost traceback frame inside `filename` (else the file alone)."""

    wanted = os.path.abspath(filename)
    line = None
    for frame in traceback.extract_tb(tb) if tb is not None else ():
        if os.path.abspath(frame.filename) == wanted:
            line = frame.lineno
    return f"{filename}:{line}" if line is not None else filename


def dropped_by_pyinfra(attrs: dict[str, Any]) -> list[Problem]:
    """Hosts and pdkit sections that pyinfra's loader leaves out silently.

    pyinfra builds the inventory from the `all` group when the file defines one (a host only
    in another group is gone), skips variables whose name starts with '_' or whose items are
    not all host names / (name, data) tuples, and merges a host's data from several groups key
    by key, so a section given twice keeps only the last one (pyinfra_cli/inventory.py,
    pyinfra/api/inventory.py make_hosts_and_groups, pyinfra 3.10)."""
    problems: list[Problem] = []
    groups: dict[str, list] = {}
    ignored: dict[str, list] = {}
    for key, value in attrs.items():
        if not isinstance(key, str) or key.startswith("__") or not isinstance(value, (list, tuple)):
            continue
        members = value[0] if isinstance(value, tuple) and value and isinstance(value[0], (list, tuple)) else value
        if not isinstance(members, (list, tuple)):
            continue
        valid = not key.startswith("_") and all(isinstance(m, (str, tuple)) for m in members)
        (groups if valid else ignored)[key] = list(members)

    def entries(members):
        for m in members:
            if isinstance(m, str):
                yield m, {}
            elif isinstance(m, tuple) and len(m) == 2 and isinstance(m[0], str) and isinstance(m[1], dict):
                yield m
            elif isinstance(m, tuple) and m and isinstance(m[0], str):
                yield m[0], {}

    listed = {name for members in groups.values() for name, _ in entries(members)}
    if "all" in groups:
        in_all = {name for name, _ in entries(groups["all"])}
        for group, members in groups.items():
            for name, data in entries(members):
                if name not in in_all:
                    problems.append(Problem(name, group,
                                            f"host is in group {group!r} but not in the `all` group, so pyinfra leaves "
                                            f"it (and its pdkit sections) out: add {name!r} to all"))
                    in_all.add(name)  # once per host
    for group, members in ignored.items():
        why = ("its name starts with '_'" if group.startswith("_")
               else "pyinfra groups hold only host names and (name, data) tuples")
        for member in members:
            if (isinstance(member, tuple) and len(member) == 2 and isinstance(member[0], str)
                and isinstance(member[1], dict)):
                name, data = member
                if name not in listed and any(str(k).startswith("pdkit") for k in data):
                    problems.append(Problem(name, group,
                                            f"pyinfra ignores the variable {group!r} ({why}), so this host and its "
                                            "pdkit sections are dropped: put it in a group without a leading '_'"))
    seen: dict[tuple[str, str], tuple[str, Any]] = {}
    for group, members in groups.items():
        for name, data in entries(members):
            for key, value in data.items():
                if not str(key).startswith("pdkit_"):
                    continue
                earlier = seen.get((name, key))
                if earlier is not None and earlier[1] != value:
                    problems.append(Problem(name, key,
                                            f"given in group {earlier[0]!r} and again in group {group!r}: pyinfra "
                                            f"keeps only the {group!r} one (host data merges key by key, not field by "
                                            f"field); give {key} once"))
                seen[(name, key)] = (group, value)
    return problems


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
        problems.extend(unknown_host_keys(name, data))
        raw_cluster = data.get("pdkit_cluster")
        if raw_cluster is not None:
            if cluster_raw is None:
                cluster_raw, cluster_from = raw_cluster, name
            elif raw_cluster != cluster_raw:
                problems.append(Problem(name, "pdkit_cluster",
                                        f"differs from the pdkit_cluster that {cluster_from} sees; cluster-wide "
                                        "settings must resolve to the same value on every host"))
        entry: dict[str, Any] = {
            "name": name,
            "groups": groups,
            "address": str(data.get("ssh_hostname") or name),
        }
        ssh_port = data.get("ssh_port")
        if ssh_port is not None:
            if isinstance(ssh_port, int) and not isinstance(ssh_port, bool) and 1 <= ssh_port <= 65535:
                entry["ssh_port"] = ssh_port
            else:
                problems.append(Problem(name, "ssh_port",
                                        f"{ssh_port!r} is not a port: give an integer from 1 to 65535"))
        if not entry["address"].startswith("@") and (why := address_problem(entry["address"])):
            problems.append(Problem(name, "ssh_hostname" if data.get("ssh_hostname") else "<host name>",
                                    f"{why} (pyinfra connects to the host name when ssh_hostname is unset)"))
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
        problems.append(Problem("<inventory>", "pdkit_cluster",
                                "no host resolves pdkit_cluster: set it (model, engine, sglang_version, ...) on a "
                                "group every host belongs to"))
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

    problems.extend(argvcheck.problems(spec))
    problems.extend(_route_problems(spec))
    problems.extend(_model_config_problems(spec))
    if any(p.severity == "error" for p in problems):
        return None, problems
    return spec, problems


def pyinfra_host_keys() -> frozenset[str]:
    """Host data keys pyinfra itself reads: every connector's data keys and the global arguments."""
    global _PYINFRA_KEYS
    if _PYINFRA_KEYS is None:
        # lazy: pyinfra's API loads gevent and paramiko (~250 ms); only a loaded inventory needs it
        from pyinfra.api.arguments import all_global_arguments
        from pyinfra.api.connectors import get_all_connectors

        keys = {name for name, _ in all_global_arguments()}
        for connector in get_all_connectors().values():
            keys.update(getattr(connector, "data_meta", None) or {})
        _PYINFRA_KEYS = frozenset(keys)
    return _PYINFRA_KEYS


_PYINFRA_KEYS: frozenset[str] | None = None


def unknown_host_keys(host: str, data: dict[str, Any]) -> list[Problem]:
    """Host-level keys that are neither a pdkit section nor pyinfra's: an error when it looks
    meant for pdkit (a misspelt section, a field outside its section), else a warning."""


    problems = []
    known = pyinfra_host_keys()
    for key in data:
        if not isinstance(key, str) or key in SECTIONS or key in known or key.startswith("_"):
            continue
        normalised = key.lower().replace("-", "_").strip()
        close = difflib.get_close_matches(normalised, list(SECTIONS), n=1, cutoff=0.75)
        if normalised in SECTIONS or close or normalised.startswith("pdkit"):
            hint = f"did you mean {(close or [normalised])[0]}? " if (close or normalised in SECTIONS) else ""
            problems.append(Problem(host, key, f"unknown pdkit section; {hint}valid: {', '.join(SECTIONS)}"))
            continue
        owners = [heading for heading, model in FIELD_SECTIONS if key in model.model_fields]
        if owners:
            problems.append(Problem(host, key, f"{key!r} is a field of {owners[0]}, not a host-level key: pdkit never "
                                    "reads it here; move it inside that section"))
        else:
            problems.append(Problem(host, key, f"not a pdkit section ({', '.join(SECTIONS)}) nor a pyinfra connector "
                                    "setting or global argument: pdkit ignores it", "warning"))
    return problems


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
        elif (part in ("function-after", "function-before")
              or str(part).startswith(("function-", "literal[", "tagged-union"))):
            continue
        else:
            path += f".{part}"
    return path


def _message(model: type[BaseModel], err: ErrorDetails) -> str:
    kind = err["type"]
    msg = err["msg"]
    if kind == "extra_forbidden":
        owner = _model_at(model, err["loc"][:-1])
        valid = ", ".join(owner.model_fields) if owner is not None else ""
        return f"unknown field {err['loc'][-1]!r}; valid fields: {valid}"
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        return (f"{err.get('input')!r} is not valid: "
                f"{_PATTERN_HINTS.get(err['ctx']['pattern'], 'must match ' + err['ctx']['pattern'])}")
    if msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    if "input" in err and kind not in ("model_type", "dict_type"):
        return f"{msg} (got {err['input']!r})"
    return msg


_PATTERN_HINTS = {
    r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$": "use lowercase letters, digits and '-', at most 40 characters, not "
    "starting or ending with '-' (it becomes a systemd unit name and a metric label)",
    r"^[a-z_][a-z0-9_-]{0,30}$": "a Unix user name: lowercase letters, digits, '_' and '-'",
    r"^/[A-Za-z0-9_./-]+$": "an absolute path of letters, digits, '_', '.', '/' and '-'",
    r"^\d+\.\d+$": "a compute capability like '12.0' or '9.0'",
}


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model a validation error location points into (for listing valid fields)."""

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


def invalid_report(inventory: str | os.PathLike[str], errors: Sequence[Problem], warnings: Sequence[Problem] = (),
                   nothing: str = "nothing was contacted") -> str:
    """What every command prints (to stderr) when the inventory is invalid: one header, then each error and warning,
    the way `pdkit validate` lists them. NOTHING says what was not done (a deploy: no host was changed)."""
    lines = [f"{inventory}: {len(errors)} error(s); {nothing}."]
    lines += [f"  error   {p}" for p in errors] + [f"  warning {p}" for p in warnings]
    return "\n".join(lines)


def load_or_report(inventory: str | os.PathLike[str]) -> ClusterSpec | None:
    """For commands that act on a cluster: the spec, or None after printing every error to stderr.

    Nothing is contacted before this returns a spec. (pyinfra's CLI, imported here, gevent-patches
    the process: commands load the inventory before they import any HTTP client.)
    """
    spec, problems = load_with_problems(inventory)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        print(invalid_report(inventory, errors, nothing=f"nothing was contacted (`pdkit validate {inventory}` "
                             "lists warnings too)"), file=sys.stderr)
        return None
    return spec


def _route_problems(spec: ClusterSpec) -> list[Problem]:
    """An alert route that matches an alert name no rule has, or a severity no rule sets, never fires:
    a warning naming the route (issue 46; a typo'd PdkitEngineWedgde pages no one)."""
    routes = [(h, i, r) for h in spec.hosts if h.monitoring is not None
              for i, r in enumerate(h.monitoring.alerting.routes)]
    if not routes:
        return []
    from pdkit.monitoring.rules import ALERT_NAMES, alerts  # lazy: the rules load only for an inventory with routes

    severities = sorted({a.severity for a in alerts(spec)})

    out: list[Problem] = []
    for host, i, route in routes:
        name, severity = route.match.get("alertname"), route.match.get("severity")
        field = f"pdkit_monitoring.alerting.routes[{i}].match"
        if name is not None and name not in ALERT_NAMES:
            close = difflib.get_close_matches(name, ALERT_NAMES, n=1)
            out.append(Problem(host.name, field, f"alertname {name!r} is no alert pdkit renders, so this route never "
                               "matches" + (f": did you mean {close[0]!r}?" if close else "")
                               + " (the alerts: docs/monitoring.md)", "warning"))
        if severity is not None and severity not in severities:
            out.append(Problem(host.name, field, f"severity {severity!r} is set by no alert pdkit renders, so this "
                               f"route never matches: valid: {', '.join(severities)}", "warning"))
    return out


def _severity(value: str, source: str) -> Literal["error", "warning"]:
    """A finding's severity as Problem takes it; another word from SOURCE is a bug there (such a problem
    would be neither counted as an error nor listed as a warning)."""
    if value == "error":
        return "error"
    if value == "warning":
        return "warning"
    raise ValueError(f"{source} gave severity {value!r}; valid: error, warning")


def _model_config_problems(spec: ClusterSpec) -> list[Problem]:
    """The model's own config.json against the engines' settings, where the model directory is on this
    machine (issue 46 item 4; the preflight reads the same keys on the node: pdkit/spec/modelconfig.py)."""
    from pdkit.spec import modelconfig  # lazy: read only when a model path is a directory here
    from pdkit.spec.startup import tuning_origin  # lazy: with it

    out: list[Problem] = []
    configs: dict[str, dict | None] = {}
    for host, engine in spec.engines():
        path = spec.engine_model(engine).path
        if not path.startswith("/"):
            continue
        if path not in configs:
            configs[path] = modelconfig.read_local(path)
        config = configs[path]
        if config is None:
            continue
        tuning = spec.engine_tuning(engine)
        why = modelconfig.context_problem(tuning.context_length, bool(tuning.value("allow_longer_context")), config,
                                          f"{path.rstrip('/')}/config.json, read by validate on this machine")
        found = [("error", "context_length", why)] if why else []
        # what the architecture forces or refuses (pdkit.spec.modelconfig.architecture_problems; the preflight runs
        # the same function on the node's copy)
        found += modelconfig.architecture_problems(modelconfig.engine_facts(spec, host, engine), config,
                                                   f"{path.rstrip('/')}/config.json, read by validate on this machine")
        for severity, name, message in found:
            # extra_args is the engine's own field; the others are tuning fields, named in the layer that sets them
            field = name if name == "extra_args" else tuning_origin(spec, engine, "", name)
            assert host.node is not None  # spec.engines() pairs each engine with the GPU host declaring it
            at = field if field.startswith("pdkit_cluster") else \
                f"pdkit_node.engines[{host.node.engines.index(engine)}].{field}"
            if not any(p.host == host.name and p.field == at and p.message == message for p in out):
                # the cluster layer: once per host
                out.append(Problem(host.name, at, message, _severity(severity, "pdkit.spec.modelconfig")))
    return out
