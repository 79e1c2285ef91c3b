"""The checks the pinned SGLang releases run on their server arguments at start, as data.

SGLang refuses some combinations of its own flags only when the engine starts
(`ServerArgs.__post_init__` in 0.5.17; `ServerArgs.resolve_once` and the hooks of
`sglang/srt/arg_groups/pipeline.py` in 0.5.23): a `raise` or a failed `assert` there costs a
failed engine start after the deploy. `pdkit/upstream/data/startup_checks.json` lists every one of
them, read from the wheels' sources in the contract virtualenvs with `ast` (nothing is
imported): for each, the release(s), the function, the conditions guarding it (the enclosing
`if` tests, negated on `else` branches, and the negated assert test), SGLang's message (the
message expression's source, f-strings kept) and the server-argument fields it reads.

    python -m pdkit.upstream.startchecks --write   # regenerate pdkit/upstream/data/startup_checks.json
    python -m pdkit.upstream.startchecks --check   # exit 1 when the committed table is stale

`pdkit/upstream/data/startup_check_coverage.json` says, for each row id, either which `pdkit validate`
rule catches it before the deploy ({"rule": ..., "test": ...}) or why it cannot or need not
be checked before start ({"why": ...}). tests/test_startchecks.py regenerates the table in CI
and fails on a row the coverage file does not cover, so a pin bump that brings a new check
cannot pass unnoticed.

The walk: from the entry points, every function or method it calls (`self.m(...)`, a
module-level function, a name imported from another `sglang.srt` module, also when passed as
an argument, as `run_hook(handle_x, server_args)` does), transitively, within
FOLLOWED_MODULES. A row's id hashes the function name, conditions and message but not the
release or line, so an unchanged check keeps its id across releases.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pdkit.upstream import parsertable, venvs
from pdkit.upstream.tables import read_table
from pdkit.upstream.versions import SGLANG_RELEASES

if TYPE_CHECKING:  # the type only: upstream/ imports nothing of spec/ (tests/test_layering.py)
    from pdkit.spec.tuning import Tuning

# a derivation finding's severity as pdkit.spec.Problem takes it (another word would be neither an error nor a warning)
Severity = Literal["error", "warning"]

DATA_DIR = Path(__file__).with_name("data")
TABLE_PATH = DATA_DIR / "startup_checks.json"
COVERAGE_PATH = DATA_DIR / "startup_check_coverage.json"

# Where a release starts checking its arguments (class ServerArgs in sglang/srt/server_args.py).
# (check_server_args: engine.py calls it right after, before any model loads.)
ENTRY_METHODS = ("__post_init__", "resolve_once", "check_server_args")
# Modules whose functions the walk follows (the server-argument code). Others (model config
# loading, platform probes) are runtime, not argument checks: calls into them are not followed.
FOLLOWED_MODULES = ("sglang.srt.server_args", "sglang.srt.arg_groups", "sglang.srt.speculative.spec_info")
# Names of the ServerArgs record in the followed code (self in 0.5.17; the hooks take
# server_args and read it through cfg = resolving_view(server_args) in 0.5.23).
_RECORD_NAMES = {"self", "server_args", "cfg", "args", "sa", "view", "raw"}


def sglang_root(version: str) -> Path | None:
    """The installed `sglang` package of the version's contract virtualenv, or None."""

    python = venvs.sglang_python(version)
    if python is None:
        return None
    venv = python.parent.parent
    for candidate in sorted(venv.glob("lib/python*/site-packages/sglang")):
        if (candidate / "srt" / "server_args.py").is_file():
            return candidate
    return None


@dataclass
class _Function:
    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None = None


@dataclass
class _Module:
    name: str
    path: Path
    tree: ast.Module
    # top-level functions and classes
    functions: dict[str, ast.AST] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    # name -> (module, name) for `from sglang.srt.x import y` at module level
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)


def _imports_in(body: Iterable[ast.stmt], package_of: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            module = node.module
            if node.level:
                base = package_of.split(".")
                module = ".".join(base[: len(base) - node.level + 1] + [module])
            for alias in node.names:
                out[alias.asname or alias.name] = (module, alias.name)
    return out


class _Walker:
    def __init__(self, root: Path):
        self.root = root  # .../site-packages/sglang
        self.modules: dict[str, _Module | None] = {}

    def module(self, name: str) -> _Module | None:
        if name in self.modules:
            return self.modules[name]
        parts = name.split(".")
        mod = None
        if parts[0] == "sglang":
            base = self.root.joinpath(*parts[1:])
            for path in (base.with_suffix(".py"), base / "__init__.py"):
                if path.is_file():
                    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
                    mod = _Module(name, path, tree)
                    for node in tree.body:  # the last definition wins
                        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            mod.functions[node.name] = node
                        elif isinstance(node, ast.ClassDef):
                            mod.classes[node.name] = node
                    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
                    mod.imports = _imports_in(tree.body, package)
                    break
        self.modules[name] = mod
        return mod

    @staticmethod
    def followed(module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in FOLLOWED_MODULES)

    def resolve(self, module: str, name: str, local_imports: dict[str, tuple[str, str]],
                depth: int = 0) -> _Function | None:
        """The function NAME means in MODULE (a def there, or an import of a followed module)."""
        if depth > 5:
            return None
        target = local_imports.get(name)
        mod = self.module(module)
        if target is None and mod is not None:
            if name in mod.functions:
                return _Function(module, name, mod.functions[name])  # type: ignore[arg-type]
            target = mod.imports.get(name)
        if target is None or not self.followed(target[0]):
            return None
        other = self.module(target[0])
        if other is None:
            return None
        if target[1] in other.functions:
            return _Function(target[0], target[1], other.functions[target[1]])  # type: ignore[arg-type]
        return self.resolve(target[0], target[1], {}, depth + 1)  # re-exported

    def method(self, module: str, cls: str, name: str) -> _Function | None:
        mod = self.module(module)
        if mod is None or cls not in mod.classes:
            return None
        found = None
        for node in mod.classes[cls].body:  # the last definition wins, as in Python
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = _Function(module, f"{cls}.{name}", node, cls)
        return found


def _negate(test: ast.expr) -> str:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.unparse(test.operand)
    return f"not ({ast.unparse(test)})"


def _fields_in(nodes: list[ast.AST], known: set[str]) -> list[str]:
    found: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in _RECORD_NAMES
                and sub.attr in known):
                found.add(sub.attr)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Call) and sub.attr in known:
                found.add(sub.attr)  # resolved_view(server_args).x, self._resolved().x
            elif (isinstance(sub, ast.Call) and any(isinstance(a, ast.Constant) and a.value in known
                                                    for a in sub.args[1:])):
                # getattr(cfg, "x"), resolution_result(server_args, "x")
                found.update(a.value for a in sub.args[1:]
                             if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value in known)
    return sorted(found)


def _local_fields(fn: _Function, known: set[str]) -> dict[str, set[str]]:
    """Local names of FN assigned from server-argument fields (`transport = cfg.mm_feature_transport`),
    to a fixed point, so a condition on the local counts the field."""
    assigns: list[tuple[list[str], ast.AST]] = []
    for node in ast.walk(fn.node):
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if targets:
                assigns.append((targets, node.value))
        elif (isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name)
              and node.value is not None):
            assigns.append(([node.target.id], node.value))
    local: dict[str, set[str]] = {}
    for _ in range(4):
        changed = False
        for targets, value in assigns:
            found = set(_fields_in([value], known))
            for sub in ast.walk(value):
                if isinstance(sub, ast.Name) and sub.id in local:
                    found |= local[sub.id]
            for t in targets:
                if not found <= local.get(t, set()):
                    local[t] = local.get(t, set()) | found
                    changed = True
        if not changed:
            break
    return local


def _checks_in(fn: _Function, known: set[str]) -> list[dict[str, Any]]:
    """Every raise and assert in FN's body with the conditions that lead to it."""
    out: list[dict[str, Any]] = []
    local = _local_fields(fn, known)

    def _row(fn: _Function, stmt: ast.stmt, kind: str, exception: str, conditions: list[str], message: str,
             nodes: list[ast.AST], known: set[str]) -> dict[str, Any]:
        row = _make_row(fn, stmt, kind, exception, conditions, message, nodes, known)
        extra = {f for node in nodes for sub in ast.walk(node) if isinstance(sub, ast.Name) and sub.id in local
                 for f in local[sub.id]}
        row["fields"] = sorted(set(row["fields"]) | extra)
        return row

    # a guard: its text and the node whose fields it reads (an `except` handler: the whole handler)
    def visit(stmts: list[ast.stmt], guards: list[tuple[str, ast.AST]]) -> None:
        guards = list(guards)
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                visit(stmt.body, guards + [(ast.unparse(stmt.test), stmt.test)])
                if stmt.orelse:
                    visit(stmt.orelse, guards + [(_negate(stmt.test), stmt.test)])
                elif stmt.body and isinstance(stmt.body[-1], ast.Return):
                    # `if not cfg.enable_x: return` guards everything after it
                    guards.append((_negate(stmt.test), stmt.test))
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                loop = (f"for {ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}", stmt.iter)
                visit(stmt.body, guards + [loop])
                visit(stmt.orelse, guards)
            elif isinstance(stmt, ast.While):
                visit(stmt.body, guards + [(f"while {ast.unparse(stmt.test)}", stmt.test)])
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                visit(stmt.body, guards)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body, guards)
                for handler in stmt.handlers:
                    visit(handler.body,
                          guards + [(f"except {ast.unparse(handler.type) if handler.type else ''}".strip(), handler)])
                visit(stmt.orelse, guards)
                visit(stmt.finalbody, guards)
            elif isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    visit(case.body, guards + [(f"match {ast.unparse(stmt.subject)}: case {ast.unparse(case.pattern)}",
                                                stmt.subject)])
            elif isinstance(stmt, ast.Raise) and stmt.exc is not None:
                exc = stmt.exc
                if isinstance(exc, ast.Call):
                    kind = ast.unparse(exc.func)
                    message = ast.unparse(exc.args[0]) if exc.args else ""
                else:
                    kind, message = ast.unparse(exc), ""
                out.append(_row(fn, stmt, "raise", kind, [g for g, _ in guards], message,
                                [n for _, n in guards] + [exc], known))
            elif isinstance(stmt, ast.Assert):
                conditions = [g for g, _ in guards] + [_negate(stmt.test)]
                message = ast.unparse(stmt.msg) if stmt.msg is not None else ""
                out.append(_row(fn, stmt, "assert", "AssertionError", conditions, message,
                                [n for _, n in guards] + [stmt.test, stmt.msg or stmt.test], known))

    visit(fn.node.body, [])
    return out


def _make_row(fn: _Function, stmt: ast.stmt, kind: str, exception: str, conditions: list[str], message: str,
              nodes: list[ast.AST], known: set[str]) -> dict[str, Any]:
    return {
        "function": fn.qualname,
        "module": fn.module,
        "line": stmt.lineno,
        "kind": kind,
        "exception": exception,
        "conditions": conditions,
        "message": message,
        "fields": _fields_in(nodes, known),
    }


def _call_guards(fn: _Function, node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
    """The `if` tests (negated on the else branch) around NODE inside FN, outermost first."""
    guards: list[str] = []
    child, parent = node, parents.get(node)
    while parent is not None and parent is not fn.node:
        if isinstance(parent, ast.If) and child is not parent.test:
            guards.append(ast.unparse(parent.test) if child in parent.body else _negate(parent.test))
        child, parent = parent, parents.get(parent)
    return guards[::-1]


def _calls_in(walker: _Walker, fn: _Function) -> list[tuple[_Function, list[str]]]:
    """The functions FN calls (or hands to run_hook and the like) that the walk follows, each
    with the `if` tests around the call (check_server_args: `if cfg.pp_size > 1:`)."""
    parents = {child: parent for parent in ast.walk(fn.node) for child in ast.iter_child_nodes(parent)}
    found = _callees(walker, fn)
    return [(target, _call_guards(fn, node, parents)) for node, target in found]


def _callees(walker: _Walker, fn: _Function) -> list[tuple[ast.AST, _Function]]:
    local_imports = _imports_in([n for n in ast.walk(fn.node) if isinstance(n, ast.ImportFrom)],
                                fn.module.rsplit(".", 1)[0])
    out: list[tuple[ast.AST, _Function]] = []
    # classes of followed modules this function imports (SpeculativeAlgorithm): `algo.m(...)` on
    # one of their objects is followed to the class's method m (handle_server_args)
    classes: list[tuple[str, str]] = []
    for name, (module, real) in local_imports.items():
        mod = walker.module(module) if walker.followed(module) else None
        if mod is not None and real in mod.classes:
            classes.append((module, real))
    for node in ast.walk(fn.node):
        target = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" and fn.cls:
            target = walker.method(fn.module, fn.cls, node.attr)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and classes:
            for module, cls in classes:
                target = walker.method(module, cls, node.attr)
                if target is not None:
                    out.append((node, target))
            target = None
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            target = walker.resolve(fn.module, node.id, local_imports)
        if target is not None:
            out.append((node, target))
    return out


def extract(root: Path, version: str, known_fields: set[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """(functions walked, check rows) of the sglang package at ROOT."""
    walker = _Walker(root)
    queue = [f for f in (walker.method("sglang.srt.server_args", "ServerArgs", m) for m in ENTRY_METHODS)
             if f is not None]
    if not queue:
        raise RuntimeError(f"{root}/srt/server_args.py has no ServerArgs.{' or '.join(ENTRY_METHODS)}")
    seen: dict[tuple[str, str], _Function] = {}
    via: dict[tuple[str, str], tuple[str, list[str]]] = {}
    pending: list[tuple[_Function, str, list[str]]] = [(f, "", []) for f in queue]
    while pending:
        fn, caller, guards = pending.pop(0)
        key = (fn.module, fn.qualname)
        if key in seen:
            continue
        seen[key], via[key] = fn, (caller, guards)
        pending.extend((callee, fn.qualname, call_guards) for callee, call_guards in _calls_in(walker, fn))
    rows: list[dict[str, Any]] = []
    for key, fn in seen.items():
        for row in _checks_in(fn, known_fields):
            # the caller that first reached it (breadth first) and the `if` tests around that call
            row["via"], row["via_conditions"] = via[key]
            rows.append(row)
    walked = sorted(f"{m}:{q}" for m, q in seen)
    return walked, rows


_RECORD_PREFIX = re.compile(r"\b(?:%s)\." % "|".join(sorted(_RECORD_NAMES)))


def row_id(row: dict[str, Any]) -> str:
    """Release-independent: 0.5.17's `ServerArgs._handle_x` reading `self.f` and 0.5.23's hook
    `handle_x` reading `server_args.f` / `cfg.f` hash alike when the check is the same."""
    function = row["function"].split(".")[-1].lstrip("_")
    norm = [_RECORD_PREFIX.sub("args.", c) for c in row["conditions"]]
    text = json.dumps([function, row["kind"], norm, _RECORD_PREFIX.sub("args.", row["message"])])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def generate(roots: dict[str, Path] | None = None) -> dict[str, Any]:
    """The table, read from the pinned wheels' sources (the contract virtualenvs; no import)."""

    releases: dict[str, dict[str, Any]] = {}
    merged: dict[str, dict[str, Any]] = {}
    for version in sorted(SGLANG_RELEASES):
        root = (roots or {}).get(version) or sglang_root(version)
        if root is None:
            raise RuntimeError(f"no contract virtualenv for sglang {version}: run `bash .ci/contract-env.sh`")
        known = {o["dest"] for o in parsertable.table()["sglang"][version]["options"]}
        walked, rows = extract(root, version, known)
        releases[version] = {
            "source": f"sglang=={version}: sglang/srt/server_args.py ServerArgs.{' / '.join(ENTRY_METHODS)} and what "
            f"they call in {', '.join(FOLLOWED_MODULES)}",
            "functions_walked": len(walked),
            "checks": len(rows),
        }
        counts: dict[str, int] = {}
        for row in rows:
            base = row_id(row)
            counts[base] = counts.get(base, 0) + 1
            rid = base if counts[base] == 1 else f"{base}-{counts[base]}"
            entry = merged.setdefault(rid, {"id": rid,
                                            **{k: row[k] for k in ("function", "kind", "exception", "conditions",
                                                                   "message", "fields")},
                                            "releases": [], "where": {}, "via": {}, "via_conditions": {}})
            entry["releases"].append(version)
            entry["where"][version] = f"{row['module'].replace('.', '/')}.py:{row['line']}"
            entry["via"][version] = row["via"]
            entry["via_conditions"][version] = row["via_conditions"]
    checks = sorted(merged.values(), key=lambda r: (r["function"], r["id"]))
    return {
        "generated_by": "python -m pdkit.upstream.startchecks --write (from the contract virtualenvs' sources)",
        "releases": releases,
        "checks": checks,
    }


def dumps(data: dict[str, Any]) -> str:
    lines = ["{", f'  "generated_by": {json.dumps(data["generated_by"])},',
             f'  "releases": {json.dumps(data["releases"], sort_keys=True)},', '  "checks": [']
    checks = data["checks"]
    lines += [f"    {json.dumps(c, sort_keys=True)}{',' if i < len(checks) - 1 else ''}" for i, c in enumerate(checks)]
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def table() -> dict[str, Any]:
    return read_table(TABLE_PATH)


def coverage() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = read_table(COVERAGE_PATH)["coverage"]
    return entries


def uncovered(data: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The table's rows the coverage file says nothing about."""
    cov = coverage()
    return [row for row in (data or table())["checks"] if row["id"] not in cov]


# Fields whose flags validate's own hints tell a user to add to extra_args (pdkit/spec/: "add
# '--enable-dp-lm-head' to extra_args"): warning about them would contradict the hint that asked
# for them (tests/test_startchecks.py holds this set to the hints)
RECOMMENDED_BY_VALIDATE = frozenset({"enable_dp_lm_head", "uno_lora_path", "deepep_v2_mode"})


@functools.cache
def unchecked_fields(version: str) -> dict[str, str]:
    """Server-argument field -> one message of a check SGLang VERSION runs at start on it that no
    validate rule covers (its coverage entry is a `why`): an engine's extra_args that set such a
    field get a warning (pdkit.render.argvcheck), since validate holds extra_args to the parser only."""
    cov = coverage()
    out: dict[str, str] = {}
    for row in sorted(table()["checks"], key=lambda r: r["id"]):
        if version in row["releases"] and "why" in cov.get(row["id"], {}) and row["message"]:
            for name in row["fields"]:
                if name not in RECOMMENDED_BY_VALIDATE:
                    out.setdefault(name, row["message"])
    return out


# ------------------------------------------------------------------------------ coverage drafts
# `--draft-coverage` proposes a reason for each uncovered row by family, for a maintainer to read
# and commit into startup_check_coverage.json (or to replace by a rule): nothing is covered until
# it is written there.

_HARDWARE = re.compile(
    r"\b(is_cuda|is_hip|is_npu|is_xpu|is_mps|is_cpu|is_musa|is_sm\d+\w*|is_blackwell\w*|is_hopper\w*|get_platform|current_platform|"
    r"get_device\w*|torch\.cuda|get_bool_env_var\(.SGLANG_USE_AITER|use_mlx|is_flashinfer_available|is_fa3_default_architecture|"
    r"get_device_capability|device\b|_is_\w+|cuda_version|importlib|find_spec|is_\w*_available|platform)\b")
_MODEL = re.compile(
    r"\b(model_config\w*|hf_config|hf_text_config|model_arch|architectures|get_model_config|model_type|is_deepseek\w*|mambaish\w*|"
    r"quant_config|text_config|num_nextn_predict_layers|is_hybrid\w*|hf_\w+|_mc\b|checkpoint|model_label|config\.json|nvfp4_moe_meta|"
    r"is_gemma4_draft|parse_connector_type|is_runai_obj_uri)")
_ENV = re.compile(r"envs\.(\w+)|[\"'](SGLANG_\w+)[\"']")


PLATFORM_FIELDS = {"device"}


def rendered_dests(version: str) -> set[str]:
    """The server-argument fields pdkit's command line sets (the flags written in pdkit/render/flags.py,
    resolved by the release's parser table)."""

    source = Path(__file__).parents[1].joinpath("render", "flags.py").read_text(encoding="utf-8")
    parser = parsertable.sglang_parser(version)
    out = {parser.by_flag[f].dest for f in re.findall(r"[\"'](--[a-z0-9-]+)", source) if f in parser.by_flag}
    if "--attn-dp-size" in source:
        out.add("attn_dp_size")
    return out


# Functions SGLang runs only for a feature pdkit never turns on (the caller's gate is in its
# source, `via`), for a model family, for a platform, or on its own bookkeeping.
FUNCTION_FAMILIES: tuple[tuple[str, str], ...] = (
    (r"layernorm_sp|muse", "runs only with --enable-layernorm-sp / Muse Spark MegaMoE (handle_layernorm_sp returns "
     "early without them), which pdkit never renders"),
    (r"buckets_rule", "validates the --*-buckets rule flags (metrics histogram buckets), which pdkit never renders"),
    (r"ib_devices", "validates --elastic-ep-devices / --mooncake-ib-device style InfiniBand device lists against the "
     "node's sysfs; pdkit renders neither flag and the sysfs is the node's"),
    (r"mamba", "runs only for SSM/mamba hybrid checkpoints (decided from the model's config.json at start) with their "
     "--mamba-* cache strategy flags, which pdkit never renders"),
    (r"mps", "runs only on Apple MPS (--device mps / macOS), never on pdkit's NVIDIA nodes"),
    (r"hisparse", "runs only with --enable-hisparse, which pdkit never renders"),
    (r"kv_shard|kv_cache_sharding", "runs only with --enable-kv-cache-sharding, which pdkit never renders"),
    (r"unified_memory|spec_verify_backends", "runs only with --enable-unified-memory, which pdkit never renders"),
    (r"fallbacks_of|declare_resolution|validate_declarations|run_post_process_pass|resolve_once|_invoke_provider|with_fallback",
     "an invariant of SGLang's own resolution code (its records, declarations and passes), not a property of the "
     "arguments: no command line reaches it"),
    (r"deepseek_v4", "runs only for DeepSeek V4 / V4.1 checkpoints (apply_deepseek_v4_defaults and its validators, "
     "decided from config.json at start)"),
    (r"dsa", "runs only for DSA (DeepSeek sparse attention) checkpoints, decided from config.json at start, with their "
     "--dsa-* backends and the GPU's SM generation"),
    (r"xpu", "runs only on Intel XPU (decode context parallelism there), never on pdkit's NVIDIA nodes"),
    (r"lora", "runs only with LoRA serving (--enable-lora / --lora-paths; check_lora_server_args returns early without "
     "them), which pdkit never renders"),
    (r"load_publish", "runs only with --load-publish-endpoint / --kv-events-config, which pdkit never renders"),
    (r"max_context_size|prefill_max_context", "needs --cuda-graph-prefill-max-context, which pdkit never renders, "
     "against the checkpoint's context length"),
    (r"prefill_complete", "needs --disaggregation-decode-allocation-policy prefill_complete, which pdkit never "
     "renders"),
    (r"dispatch_type", "needs --flashinfer-a2a-dispatch-type (with SGLANG_MOE_NVFP4_DISPATCH), which pdkit never "
     "renders"),
    (r"swa|prefix_tails", "needs --swa-full-tokens-ratio / --swa-prefix-tails (sliding-window models), which pdkit "
     "never renders"),
    (r"deepep_v2|flashinfer_a2a_token_budget|mega_moe|megamoe|flydsl|pplx|mori",
     "a token budget or runner pairing of an expert-parallel all-to-all backend, sized from SGLANG_* dispatch-capacity "
     "variables and the checkpoint's MoE shape at start"),
)


def draft_reason(row: dict[str, Any], rendered: set[str]) -> str:
    """A proposed `why` for ROW by family, or "" when none fits and a person must decide: a
    feature pdkit never turns on (FUNCTION_FAMILIES, by the function and its caller), flags pdkit
    never renders, the checkpoint, the platform, SGLang environment variables. A rendered setting
    that needs a never-rendered flag away from its default (DFLASH/DSPARK with attention DP need
    --enable-dp-lm-head) is a rule, not this: read each drafted row before committing it."""
    text = " ".join(row["conditions"] + [row["message"]])
    where = " ".join([row["function"], *row["via"].values()])
    for pattern, why in FUNCTION_FAMILIES:
        if re.search(pattern, where, re.I):
            return why
    # a check on the checkpoint's kind (its guards read config.json) is the checkpoint's first
    if _MODEL.search(" ".join(row["conditions"])):
        return ("depends on the checkpoint (its config.json: architecture, quantization, layers), which SGLang reads "
                "at start and pdkit never opens")
    # --device is left unset by pdkit and resolves to the node's platform: a hardware condition
    never = sorted(set(row["fields"]) - rendered - PLATFORM_FIELDS)
    if never:
        shown = ", ".join("--" + f.replace("_", "-") for f in never)
        return (f"fires only with {shown} away from SGLang's default: pdkit never renders "
                f"{'it' if len(never) == 1 else 'them'}, "
                "and extra_args that set them are checked against the release's parser only "
                "(tests/test_contract_parsers.py), not its start checks")
    if _MODEL.search(text):
        return ("depends on the checkpoint (its config.json: architecture, quantization, layers), which SGLang reads "
                "at start and pdkit never opens")
    if _HARDWARE.search(text):
        return ("depends on the platform the engine starts on (CUDA/ROCm/NPU/XPU/MPS, the GPU's SM generation, "
                "installed kernels), known only on the node")
    env = sorted({a or b for a, b in _ENV.findall(text)})
    if env:
        return (f"depends on SGLang environment variable(s) {', '.join(env)}, which pdkit does not set "
                "(an engine's env passes them through unchecked)")
    return ""


def draft_coverage(data: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    data = data or table()
    cov = coverage() if COVERAGE_PATH.exists() else {}
    rendered: set[str] = set()
    for version in data["releases"]:
        rendered |= rendered_dests(version)
    return {row["id"]: {"why": draft_reason(row, rendered)} for row in data["checks"] if row["id"] not in cov}


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m pdkit.upstream.startchecks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {TABLE_PATH.name}")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the committed table differs or a row is uncovered")
    parser.add_argument("--draft-coverage", action="store_true",
                        help="print proposed reasons for the rows the coverage file lacks (review before committing "
                        "them)")
    args = parser.parse_args(argv)
    if args.draft_coverage:
        print(json.dumps(draft_coverage(generate()), indent=1, sort_keys=True))
        return 0
    data = generate()
    text = dumps(data)
    if args.write:
        TABLE_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {TABLE_PATH}")
        return 0
    if args.check:
        rc = 0
        if not TABLE_PATH.exists() or TABLE_PATH.read_text(encoding="utf-8") != text:
            print(f"{TABLE_PATH} is stale: run `python -m pdkit.upstream.startchecks --write`", file=sys.stderr)
            rc = 1
        for row in uncovered(data):
            print(f"{row['id']} ({', '.join(row['releases'])} {row['function']}): {row['message']} — not in "
                  f"{COVERAGE_PATH.name}", file=sys.stderr)
            rc = 1
        return rc
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------ derivations before the checks
# Issue 46 item 2, the audit's leftovers: what SGLang derives itself before its start checks, for settings that
# reach the engine by another road than the fields startup_check_problems reads (an alias, an env variable,
# extra_args, a default SGLang picks). Pure; each message cites the file and release it follows.

# 0.5.23 arg_groups/serving_hook.py handle_deprecated_args: deprecated attention-backend names
BACKEND_ALIASES = {"0.5.23": {"tokenspeed_mla": "cutedsl_mla", "compressed": "dsv4"}}
# the moe runners flashinfer all-to-all takes (0.5.17 server_args.py _handle_a2a_moe, 0.5.23 arg_groups/moe_hook.py
# handle_a2a_moe): 'auto' is not one of them
FLASHINFER_A2A_RUNNERS = {
    "0.5.17": ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm_routed"),
    "0.5.23": ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_trtllm_routed",
               "deep_gemm"),
}
# what _moe_runner_backend_quant_constraints resolves 'auto' to before that check (overrides.py, both releases)
AUTO_RUNNER_BY_QUANTIZATION = {"nvfp4_online": "flashinfer_trtllm", "mxfp8": "flashinfer_trtllm"}
# --chunked-prefill-size SGLang picks when it is unset, by GPU memory (GiB upper bound, chunk); 0.5.17
# server_args.py _handle_gpu_memory_settings, 0.5.23 arg_groups/memory_hook.py handle_gpu_memory_settings
DEFAULT_CHUNK = {
    "0.5.17": ((20, 2048), (35, 2048), (60, 4096), (90, 8192), (160, 8192), (None, 16384)),
    "0.5.23": ((20, 2048), (35, 4096), (60, 4096), (90, 8192), (160, 8192), (None, 16384)),
}
_TRUE = ("true", "1", "yes", "y")


def default_chunk(version: str, memory_gib: float | None) -> int | None:
    """The chunked-prefill size SGLang VERSION picks for a GPU of MEMORY_GIB when none is given (None: unknown)."""
    if memory_gib is None or version not in DEFAULT_CHUNK:
        return None
    for bound, chunk in DEFAULT_CHUNK[version]:
        if bound is None or memory_gib < bound:
            return chunk
    return None


def derivation_problems(version: str, role: str, tuning: Tuning, extra_args: tuple[str, ...], env: dict[str, str],
                        sm_major: int | None, memory_gib: float | None, page: int, attn_dp: int,
                        ep: int | None) -> list[tuple[Severity, str, str]]:
    """(severity, field, message) for what SGLang VERSION derives before its start checks from an engine's TUNING
    (a pdkit.spec.tuning.Tuning), extra_args, env and node (SM major, GPU memory), given the PAGE it runs with
    (pdkit.spec.startup.effective_page). Field: a tuning field name, 'extra_args' or 'env.NAME'."""
    out: list[tuple[Severity, str, str]] = []

    prefill = parsertable.extra_arg(extra_args, "--prefill-attention-backend")
    decode = parsertable.extra_arg(extra_args, "--decode-attention-backend")
    backend = tuning.attention_backend
    # equal prefill and decode backends replace attention_backend (overrides.py _attention_backend_default, both)
    if prefill is not None and prefill == decode and backend is not None and backend != prefill:
        out.append(("warning", "attention_backend",
                    f"attention_backend {backend} is replaced by {prefill}: extra_args give the same prefill and "
                    f"decode backend, and SGLang {version} then sets attention_backend to it (arg_groups/overrides.py "
                    "_attention_backend_default); every backend rule judges it: remove one of them"))
    aliases = BACKEND_ALIASES.get(version, {})
    for name, value in (("attention_backend", backend), ("extra_args", prefill), ("extra_args", decode)):
        if value in aliases:
            out.append(("warning", name,
                        f"{value} is a deprecated name in SGLang {version}: it runs as {aliases[value]} "
                        "(arg_groups/serving_hook.py handle_deprecated_args); write that instead"))
    if "tokenspeed_mla" in (backend, decode) and version == "0.5.23":
        if sm_major is not None and sm_major != 10:
            out.append(("error", "attention_backend",
                        f"tokenspeed_mla runs as cutedsl_mla in SGLang 0.5.23, which refuses compute capability "
                        f"{sm_major}.x at start ('CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)', "
                        "arg_groups/overrides.py _cutedsl_prefill_backend_fill); valid: trtllm_mla on SM12x, or an "
                        "SM100 node"))
        if tuning.kv_cache_dtype not in (None, "fp8_e4m3"):
            out.append(("warning", "kv_cache_dtype",
                        f"kv_cache_dtype {tuning.kv_cache_dtype} is replaced by fp8_e4m3: SGLang 0.5.23 keeps what "
                        "tokenspeed_mla implied (serving_hook.py handle_deprecated_args)"))
    for name, value in (("extra_args", decode), ("extra_args", prefill)):
        if value in ("trtllm_mla", "cutedsl_mla") and sm_major is not None:
            majors = (10, 12) if value == "trtllm_mla" else (10,)
            if sm_major not in majors:
                out.append(("error", name, f"{value} given in extra_args on compute capability {sm_major}.x: SGLang "
                            f"{version} refuses it at start (arg_groups/overrides.py _mla_kv_cache_dtype_checks / "
                            f"_cutedsl_prefill_backend_fill); valid on this GPU: another backend"))
    if prefill == "cutedsl_mla":  # both releases' _cutedsl_prefill_backend_fill
        out.append(("error", "extra_args", f"--prefill-attention-backend cutedsl_mla: SGLang {version} refuses it at "
                    "start ('CuteDSL MLA only supports decoding for now'); valid: trtllm_mla or fa3 for prefill"))
    runner = tuning.moe_runner_backend
    if tuning.moe_a2a_backend == "flashinfer" and runner in (None, "auto"):
        resolved = AUTO_RUNNER_BY_QUANTIZATION.get(tuning.quantization or "")
        if tuning.quantization == "modelopt_fp4" and sm_major == 12:
            resolved = "flashinfer_cutlass"
        allowed = FLASHINFER_A2A_RUNNERS.get(version, ())
        where = "server_args.py _handle_a2a_moe" if version == "0.5.17" else "arg_groups/moe_hook.py handle_a2a_moe"
        if resolved is not None and resolved not in allowed:
            out.append(("error", "moe_runner_backend",
                        f"moe_runner_backend left on auto with moe_a2a_backend flashinfer and quantization "
                        f"{tuning.quantization}: SGLang {version} resolves it to {resolved}, then refuses it at start "
                        f"({where}); valid: moe_runner_backend {' / '.join(allowed)}"))
        elif resolved is None:
            out.append(("warning", "moe_runner_backend",
                        f"moe_runner_backend left on auto with moe_a2a_backend flashinfer: SGLang {version} refuses "
                        f"'auto' at start ({where}) unless the checkpoint's own override picks a runner; set "
                        f"moe_runner_backend: one of {', '.join(allowed)}"))
    spec = tuning.speculative
    if (spec is not None and spec.algorithm in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE") and spec.eagle_topk == 1
            and spec.num_steps is not None and spec.num_draft_tokens is not None
            and spec.num_draft_tokens != spec.num_steps + 1):
        out.append(("warning", "speculative.num_draft_tokens",
                    f"num_draft_tokens {spec.num_draft_tokens} with eagle_topk 1 is replaced by num_steps + 1 = "
                    f"{spec.num_steps + 1}: SGLang {version} adjusts it ('speculative_num_draft_tokens is adjusted to "
                    "speculative_num_steps + 1 when speculative_eagle_topk == 1', arg_groups/speculative_hook.py "
                    f"_handle_eagle_family); set {spec.num_steps + 1} or leave it unset"))
    if str(env.get("SGLANG_CUTLASS_MOE", "")).lower() in _TRUE:
        if version != "0.5.17":
            out.append(("warning", "env.SGLANG_CUTLASS_MOE",
                        f"SGLang {version} has no SGLANG_CUTLASS_MOE (0.5.17's deprecated switch): it is ignored; "
                        "set moe_runner_backend: cutlass instead"))
        else:
            if tuning.quantization not in ("fp8", "mxfp8"):
                out.append(("error" if tuning.quantization is not None else "warning", "env.SGLANG_CUTLASS_MOE",
                            f"SGLANG_CUTLASS_MOE with quantization {tuning.quantization}: SGLang 0.5.17 refuses it "
                            "at start ('cutlass MoE is only supported with fp8/mxfp8 quantization', "
                            "arg_groups/overrides.py _cutlass_moe_env_override); valid: quantization fp8 or mxfp8, "
                            "or remove it"))
            elif (ep or 1) > 1:
                out.append(("error", "env.SGLANG_CUTLASS_MOE",
                            f"SGLANG_CUTLASS_MOE makes the MoE runner cutlass, and with quantization "
                            f"{tuning.quantization} and ep {ep} SGLang 0.5.17 refuses it at start ('FP8/MXFP8 Cutlass "
                            "MoE is only supported with ep_size == 1'); valid: ep 1, or remove it"))
            if runner not in (None, "auto", "cutlass"):
                out.append(("warning", "env.SGLANG_CUTLASS_MOE",
                            f"SGLANG_CUTLASS_MOE replaces moe_runner_backend {runner} by cutlass (SGLang 0.5.17 "
                            "_cutlass_moe_env_override); remove one of them"))
    if tuning.chunked_prefill_size is None and role != "decode":
        chunk = default_chunk(version, memory_gib)
        per_rank = chunk // attn_dp if chunk else None
        share = f", {per_rank} per attention-DP rank" if attn_dp > 1 else ""
        if per_rank and page > 1 and per_rank % page:
            out.append(("error", "chunked_prefill_size",
                        f"chunked_prefill_size is unset, so SGLang {version} picks {chunk} for a {memory_gib:g} GiB "
                        f"GPU (handle_gpu_memory_settings){share}, "
                        f"not a multiple of page_size {page}: it refuses that at start; valid: a chunked_prefill_size "
                        f"whose share per rank is a multiple of {page}"))
    return out
