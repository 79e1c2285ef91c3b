"""How the kit's modules may import one another (issue 34), read with ast: nothing is imported.

(a) no import cycle among pdkit/ and roles/ modules, counting imports inside functions too (a
    function-level import hides a cycle, it does not break it; `if TYPE_CHECKING:` ones never run);
(b) pdkit/ (the library) imports nothing from roles/, deploy/, benchmarks/ or gpu/;
(c) what runs on a node (ON_NODE) imports only the standard library, the node lock's packages
    (pdkit/wheels/locks/node.txt, what the node venv holds) and other on-node modules;
(d) no `from x import _name` of another module's private name (tests excepted);
(e) every import inside a function says why on its line or the line above (a run of imports
    shares the comment above its first line): `# lazy: ...`, `# breaks the a <-> b cycle`, ...
(f) what gpu/nspawn/host.py imports from pdkit (STDLIB_ONLY) imports only the standard library and
    each other: host.py runs on a lent machine's bare python3, pdkit not installed (docs/gpu.md);
(g) pdkit's folders say where their code runs, in one import order (RANKS, issue 48 item 1): every
    module of pdkit/ is in one rank, and imports (at module level or in a function; `if TYPE_CHECKING:`
    ones never run) only its own rank and those below. Within a rank, (a) keeps imports acyclic.

tests/test_node_venv_imports.py imports the on-node entry points for real; (c) also covers what
they import lazily, on paths that test does not run.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from pdkit.wheels.wheelhouse import NODE_SOURCES
from tests.conftest import REPO

KIT = ("pdkit", "roles")
NOT_FROM_PDKIT = ("roles", "deploy", "benchmarks", "gpu")
PRIVATE_SCOPE = ("pdkit", "roles", "deploy", "benchmarks", "gpu")
# run from the node venv: the node wheel's files (pdkit.wheels.wheelhouse.NODE_SOURCES, where each is explained)
ON_NODE = NODE_SOURCES
# imported by gpu/nspawn/host.py on the lent machine's bare python3 (the package's __init__ runs first)
STDLIB_ONLY = ("pdkit/__init__.py", "pdkit/hosts/nspawn_common.py")
# Files left where a text pdkit renders or writes on a node cites them (byte-identical across issue 48's move): a
# docstring naming the new home, nothing else
POINTERS = ("pdkit/kvcost.py", "pdkit/journald.py", "pdkit/node.py", "pdkit/versions.py")
# Where pdkit's code runs, lowest first (issue 48 item 1; docs/architecture.md, "Folders"): a module imports only
# its own rank and the ranks above it in this list. A folder entry covers every module below it.
RANKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # what the pinned SGLang, router and UCX releases are, as data: anywhere, the nodes included
    ("upstream", ("pdkit/__init__.py", "pdkit/upstream")),
    # the node venv (pdkit.wheels.wheelhouse.NODE_SOURCES): gates, releases, pdkit-exporter, the sim engine, and
    # the `python -m pdkit.health`-style paths units and node commands name
    ("node", ("pdkit/agent", "pdkit/sim", "pdkit/health.py", "pdkit/gpumem.py", "pdkit/releases.py",
              "pdkit/jitwarm.py", "pdkit/residency.py", "pdkit/exporter", *POINTERS)),
    # the control machine's HTTP clients of the services: the router's API, the answer gate
    ("clients", ("pdkit/clients",)),
    # the validated model of a cluster, and the pure rules that read it
    ("spec", ("pdkit/spec",)),
    # spec -> text, pure: command lines, the per-host plan, rules, dashboards
    ("render", ("pdkit/render", "pdkit/monitoring")),
    # inventory file -> spec, without touching a host
    ("inventory", ("pdkit/inventory",)),
    # the packages a node installs, fetched and locked on the control machine
    ("wheels", ("pdkit/wheels",)),
    # inside a pyinfra run or over SSH: facts, probes, preflight, router sync, silences
    ("hosts", ("pdkit/hosts",)),
    # the commands, and the generators of committed tables and docs
    ("commands", ("pdkit/roll", "pdkit/doctor", "pdkit/bench", "pdkit/tune", "pdkit/lab", "pdkit/weights",
                  "pdkit/contract")),
    ("cli", ("pdkit/cli.py",)),
)
# import names of the node lock's distributions, where they differ from the distribution's name
IMPORT_NAMES = {"attrs": ["attr", "attrs"], "charset-normalizer": ["charset_normalizer"]}


@dataclass(frozen=True)
class Imp:
    module: str  # the importing module
    target: str  # the module imported (for `from m import n`: m.n when that is a module, else m)
    name: str | None  # the name taken by `from m import name`
    line: int
    in_function: bool
    type_checking: bool


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources(root: Path, tops: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for top in tops:
        if (root / top).is_dir():
            for path in sorted((root / top).rglob("*.py")):
                found[module_name(root, path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(root: Path, module: str, path: Path, known: set[str]) -> list[Imp]:
    tree = ast.parse(path.read_text(), str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: list[Imp] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend(Imp(module, a.name, None, child.lineno, in_function, type_checking) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[:len(package) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                for a in child.names:
                    full = f"{source}.{a.name}"
                    out.append(Imp(module, full if full in known else source, a.name, child.lineno, in_function,
                                   type_checking))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                  type_checking or (isinstance(child, ast.If) and _is_type_checking(child)))

    visit(tree, False, False)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10_000))
    try:
        for v in sorted(edges):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(old)
    return found


def node_lock_imports(root: Path) -> set[str]:
    names: set[str] = set()
    lock = root / "pdkit" / "wheels" / "locks" / "node.txt"
    for line in lock.read_text().splitlines() if lock.is_file() else []:
        m = re.match(r"^([A-Za-z0-9_.-]+)==", line)
        if m:
            dist = m.group(1)
            names.update(IMPORT_NAMES.get(dist, [dist.lower().replace("-", "_")]))
    return names


def rank_of(root: Path, path: Path) -> int | None:
    """The index in RANKS of the entry that holds PATH, or None."""
    rel = path.relative_to(root).as_posix()
    for n, (_, entries) in enumerate(RANKS):
        if any(rel == e or rel.startswith(e + "/") for e in entries):
            return n
    return None


def _on_node(root: Path, path: Path) -> bool:
    rel = path.relative_to(root).as_posix()
    return any(rel == entry or rel.startswith(entry + "/") for entry in ON_NODE)


def comment_lines(path: Path) -> set[int]:
    """The lines that hold a comment (tokenize: a '#' inside a string is no comment)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {tok.start[0] for tok in tokens if tok.type == tokenize.COMMENT}


def unexplained_function_imports(path: Path) -> list[int]:
    """Lines of function-level imports with no comment on their lines or the line above; an import
    right below an explained one (the same run) is explained by it."""
    tree = ast.parse(path.read_text(), str(path))
    comments = comment_lines(path)
    lines = path.read_text().splitlines()
    bad: list[int] = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for body in _bodies(func):
            explained = False
            previous_end = None
            for stmt in body:
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    explained, previous_end = False, None
                    continue
                own = any(n in comments for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
                above = stmt.lineno - 1 in comments and lines[stmt.lineno - 2].lstrip().startswith("#")
                same_run = explained and previous_end is not None and all(
                    not lines[n - 1].strip() or n in comments for n in range(previous_end + 1, stmt.lineno))
                explained = own or above or same_run
                previous_end = stmt.end_lineno or stmt.lineno
                if not explained:
                    bad.append(stmt.lineno)
    return bad


def _bodies(func: ast.AST):
    """Every statement list inside FUNC, not inside a nested function (walked on its own)."""
    todo = [func]
    while todo:
        node = todo.pop()
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts
                todo.extend(s for s in stmts if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)))
        todo.extend(getattr(node, "handlers", None) or [])
        todo.extend(getattr(node, "cases", None) or [])


@functools.cache
def check(root: Path) -> dict[str, list[str]]:
    """The layering problems of the tree at ROOT, by rule (a) .. (g)."""
    everything = sources(root, PRIVATE_SCOPE)
    known = set(everything)
    kit = {m: p for m, p in everything.items() if m.split(".")[0] in KIT}
    found: dict[str, list[str]] = {rule: [] for rule in "abcdefg"}
    rank = {m: rank_of(root, p) for m, p in kit.items() if m.split(".")[0] == "pdkit"}
    found["g"].extend(f"{p.relative_to(root).as_posix()}: in no rank of tests/test_layering.py's RANKS (put it in "
                      "the folder of where it runs)" for m, p in kit.items() if m in rank and rank[m] is None)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    node_packages = node_lock_imports(root)
    on_node = {m for m, p in kit.items() if _on_node(root, p)}
    stdlib_only = {m for m, p in kit.items() if p.relative_to(root).as_posix() in STDLIB_ONLY}
    edges: dict[str, set[str]] = {}
    for module, path in everything.items():
        rel = path.relative_to(root).as_posix()
        for imp in imports(root, module, path, known):
            top = imp.target.split(".")[0]
            if module in kit and imp.target in kit and imp.target != module and not imp.type_checking:
                edges.setdefault(module, set()).add(imp.target)
            if module.startswith("pdkit") and top in NOT_FROM_PDKIT:
                found["b"].append(f"{rel}:{imp.line}: pdkit imports {imp.target} (pdkit/ is the library: "
                                  f"{', '.join(NOT_FROM_PDKIT)} build on it, not it on them)")
            if module in on_node and not imp.type_checking:
                allowed = top in stdlib or top in node_packages or imp.target in on_node or imp.target == "pdkit"
                if not allowed:
                    found["c"].append(f"{rel}:{imp.line}: on-node module imports {imp.target} (the node venv has "
                                      "the standard library, pdkit/wheels/locks/node.txt and the other on-node modules)")
            low, high = rank.get(module), rank.get(imp.target)
            if low is not None and high is not None and high > low and not imp.type_checking:
                found["g"].append(f"{rel}:{imp.line}: {RANKS[low][0]} imports {imp.target} ({RANKS[high][0]}, a "
                                  "later rank: move the name it needs down, or the importer up)")
            if module in stdlib_only and not (top in stdlib or imp.target in stdlib_only):
                found["f"].append(f"{rel}:{imp.line}: imports {imp.target}, outside the standard library (gpu/nspawn/"
                                  "host.py imports this module on a lent machine's bare python3)")
            if (imp.name and imp.name.startswith("_") and not imp.name.startswith("__") and top in PRIVATE_SCOPE
                    and imp.target != module):
                found["d"].append(f"{rel}:{imp.line}: imports {imp.target}'s private name {imp.name} "
                                  "(make it public where it lives, or move it)")
        if module in kit:
            found["e"].extend(f"{rel}:{line}: function-level import without a one-line reason (# lazy: ..., "
                              "# breaks the a <-> b cycle, ...) on its line or the line above; or move it up"
                              for line in unexplained_function_imports(path))
    found = {rule: list(dict.fromkeys(problems)) for rule, problems in found.items()}
    found["a"] = [" <-> ".join(c) for c in cycles(edges)]
    return found


# ---------------------------------------------------------------- the tree


def test_no_import_cycle_among_pdkit_and_roles():
    assert check(REPO)["a"] == []


def test_pdkit_imports_nothing_from_roles_deploy_benchmarks_or_gpu():
    assert check(REPO)["b"] == []


def test_on_node_modules_import_only_the_stdlib_the_node_lock_and_each_other():
    assert check(REPO)["c"] == []


def test_no_module_imports_another_modules_private_name():
    assert check(REPO)["d"] == []


def test_what_the_nspawn_launcher_shares_with_the_lab_imports_only_the_stdlib():
    assert check(REPO)["f"] == []


def test_every_module_is_in_a_rank_and_imports_no_later_rank():
    assert check(REPO)["g"] == []


def test_the_node_wheel_is_the_node_rank_and_upstream():
    """Issue 48 item 2: the node wheel is built from the folders whose code runs there (RANKS' first two)."""
    ranked = {e for _, entries in RANKS[:2] for e in entries} - {"pdkit/__init__.py", *POINTERS}
    assert set(NODE_SOURCES) == ranked


# Function-level imports not yet given their reason when the rule came in (issue 34: 213 of them),
# per file; all have one now (or moved to module level), so none may come back without one. Kept as
# the place a file's legacy count would go, and it may only shrink: it is empty.
UNEXPLAINED_BEFORE_ISSUE_34: dict[str, int] = {}


def test_every_function_level_import_says_why():
    got: dict[str, list[str]] = {}
    for problem in check(REPO)["e"]:
        got.setdefault(problem.split(":")[0], []).append(problem)
    new = [p for f, ps in got.items() if len(ps) > UNEXPLAINED_BEFORE_ISSUE_34.get(f, 0) for p in ps]
    assert new == [], "a function-level import needs its one-line reason"
    shrunk = {f: len(got.get(f, [])) for f, n in UNEXPLAINED_BEFORE_ISSUE_34.items() if len(got.get(f, [])) < n}
    assert shrunk == {}, "fewer unexplained imports: lower UNEXPLAINED_BEFORE_ISSUE_34 to these counts"


# ---------------------------------------------------------------- each rule can fail


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for pkg in ("pdkit", "roles"):
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    (tmp_path / "pdkit" / "wheels" / "locks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "pdkit" / "wheels" / "locks" / "node.txt").write_text("requests==2.34.2\n")
    return tmp_path


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/a.py": "from pdkit import b\n",
        "pdkit/b.py": "def f():\n    from pdkit.a import x  # lazy: breaks nothing, hides the cycle\n",
        "roles/r.py": "from pdkit import a\n",
    })
    assert check(root)["a"] == ["pdkit.a <-> pdkit.b"]


def test_a_type_checking_import_makes_no_cycle(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/a.py": "from pdkit import b\n",
        "pdkit/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pdkit.a import x\n",
    })
    assert check(root)["a"] == []


def test_pdkit_importing_roles_deploy_benchmarks_or_gpu_is_found(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/a.py": "import roles.base\n",
        "pdkit/b.py": "def f():\n    from benchmarks import x  # lazy\n",
        "roles/base.py": "from pdkit import a\n",
    })
    got = check(root)["b"]
    assert len(got) == 2 and "pdkit/a.py:1" in got[0] and "pdkit/b.py:2" in got[1]


def test_an_on_node_module_importing_a_control_side_module_or_package_is_found(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/agent/health.py": "import json\nimport requests\nfrom pdkit import changes\n"
                           "def f():\n    import pydantic  # lazy\n    from pdkit import spec  # lazy\n",
        "pdkit/agent/changes.py": "import os\n",
        "pdkit/spec.py": "import pydantic\n",
    })
    got = check(root)["c"]
    assert len(got) == 2 and "pdkit/agent/health.py:5" in got[0] and "pdkit.spec" in got[1]


def test_a_stdlib_only_module_importing_anything_else_is_found(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/hosts/nspawn_common.py": "import json\nfrom pathlib import Path\nimport pydantic\n"
                                  "def f():\n    from pdkit.lab import model  # lazy\n",
        "pdkit/lab/model.py": "import pydantic\n",
    })
    got = check(root)["f"]
    assert len(got) == 2 and "pdkit/hosts/nspawn_common.py:3" in got[0] and "pdkit.lab.model" in got[1]


def test_a_module_outside_the_ranks_or_importing_a_later_rank_is_found(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/agent/a.py": "from pdkit.spec import models\nfrom typing import TYPE_CHECKING\n"
                            "if TYPE_CHECKING:\n    from pdkit.render import flags\n",
        "pdkit/spec/models.py": "def f():\n    from pdkit.roll import x  # lazy\n",
        "pdkit/render/flags.py": "from pdkit.agent import a\n",
        "pdkit/roll/x.py": "",
        "pdkit/loose.py": "",
    })
    got = check(root)["g"]
    assert len(got) == 3, got
    assert got[0].startswith("pdkit/loose.py: in no rank")
    assert "pdkit/agent/a.py:1: node imports pdkit.spec.models (spec" in got[1]
    assert "pdkit/spec/models.py:2: spec imports pdkit.roll.x (commands" in got[2]


def test_importing_another_modules_private_name_is_found(tmp_path):
    root = _tree(tmp_path, {
        "pdkit/a.py": "_hidden = 1\n",
        "pdkit/b.py": "from pdkit.a import _hidden\nfrom os import _exit\n",
        "deploy/pd.py": "from roles.base import _bundles\n",
    })
    got = check(root)["d"]
    assert len(got) == 2 and "_hidden" in got[0] and "_bundles" in got[1]


def test_a_function_level_import_without_a_reason_is_found(tmp_path):
    root = _tree(tmp_path, {"pdkit/a.py": (
        "def ok():\n"
        "    # lazy: heavy\n"
        "    import json\n"
        "    import os\n"
        "\n"
        "    from pdkit import b\n"
        "    return json, os, b\n"
        "def also_ok():\n"
        "    import json  # lazy: heavy\n"
        "def bad():\n"
        "    x = '# not a comment'\n"
        "    import json\n"
        "    if x:\n"
        "        import os\n"
        "    def inner():\n"
        "        import sys\n"
    ), "pdkit/b.py": ""})
    assert [p.split(":")[1] for p in check(root)["e"]] == ["12", "14", "16"]


def test_router_urls_and_the_auth_header_are_built_in_one_place():
    """Issue 34 item 2: `http://{router_address(...)}:{...port}` and `Bearer {...}` are built only in
    pdkit/render/paths.py and pdkit/agent/health.py (bearer_headers); elsewhere a rule written twice drifts."""
    import re

    router_url = re.compile(r"http://\{[^}]*router_address\(")
    bearer = re.compile(r"f\"Bearer \{")
    found = []
    for path in sorted((REPO / "pdkit").rglob("*.py")) + sorted((REPO / "gpu").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if router_url.search(line) and rel != "pdkit/render/paths.py":
                found.append(f"{rel}:{n}: a router URL: use pdkit.render.paths.router_url / router_metrics_url")
            # the sim checks the header SGLang's way, inside its own wheel (sim sources only: tests/test_wheelhouse.py)
            if bearer.search(line) and rel not in ("pdkit/agent/health.py", "pdkit/sim/server.py"):
                found.append(f"{rel}:{n}: a bearer header: use pdkit.agent.health.bearer_headers / "
                             "pdkit.render.paths.router_auth_headers")
    assert found == []


def _second_spellings(pattern: str, home: tuple[str, ...],
                      tops: tuple[str, ...] = ("pdkit", "roles", "deploy")) -> list[str]:
    """Lines of TOPS' .py files (gpu/: its top-level files) outside HOME that match PATTERN."""
    import re

    rule = re.compile(pattern)
    paths = [p for top in tops for p in sorted((REPO / top).rglob("*.py"))] + sorted((REPO / "gpu").glob("*.py"))
    found = []
    for path in paths:
        rel = path.relative_to(REPO).as_posix()
        if rel in home:
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                  if rule.search(line)]
    return found


def test_a_venvs_python_is_spelled_in_one_place():
    """Issue 34 item 2: `<venv>/bin/python` is built only by pdkit.render.flags.venv_python (node_python:
    the node venv's; engine_python: an engine's)."""
    assert _second_spellings(r"\}/bin/python", ("pdkit/render/flags.py",)) == []


def test_the_nodes_release_json_path_is_spelled_in_one_place():
    """Issue 34 item 2: a node's release.json path is built only by pdkit.agent.releases.release_json_path."""
    assert _second_spellings(r"\}/release\.json", ("pdkit/agent/releases.py",)) == []


def test_the_host_sections_models_are_listed_in_one_place():
    """Issue 34 item 2: section key -> model (`"pdkit_node": Node`) is written only in
    pdkit.spec.HOST_SECTIONS; the loader and the README's field table take it from there."""
    section_to_model = r"[\"']pdkit_(cluster|node|router|monitoring)[\"']\s*[:,]\s*(spec\.)?[A-Z]\w*\b"
    assert _second_spellings(section_to_model, ("pdkit/spec/models.py",)) == []


def test_sglangs_readiness_line_is_spelled_in_one_place():
    """Issue 34 item 2: the engine gate's readiness line is pdkit.agent.health.READY_LOG_LINE (the plan,
    the roll's timing probe and the GPU tier take it from there); the sim keeps its own copy
    (pdkit/sim/main.py says why)."""
    assert _second_spellings(r"ready to roll", ("pdkit/agent/health.py", "pdkit/sim/main.py")) == []


def _tuning_value_flags() -> list[tuple[str, str]]:
    """pdkit/render/flags.py's _VALUE_FLAGS (tuning field -> SGLang flag), read without importing it."""
    tree = ast.parse((REPO / "pdkit/render/flags.py").read_text(encoding="utf-8"))
    table = next(n for n in tree.body
                 if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "_VALUE_FLAGS")
    return list(ast.literal_eval(table.value))


def test_the_tuning_field_to_sglang_flag_table_is_written_once():
    """Issue 34 item 2: tuning field -> SGLang flag is pdkit.render.flags._VALUE_FLAGS; argvcheck and
    startchecks derive from it. No other module pairs one of its fields with its flag again."""
    pairs = [rf"[\"']{name}[\"']\s*[:,]\s*[\"']{re.escape(flag)}[\"']|"
             rf"[\"']{re.escape(flag)}[\"']\s*:\s*[\"']{name}[\"']"
             for name, flag in _tuning_value_flags()]
    assert _second_spellings("|".join(pairs), ("pdkit/render/flags.py",)) == []


def test_each_tuning_fields_comment_names_the_flag_pdkit_renders():
    """The README's field table (pdkit.inventory.fieldtable, from pdkit/spec/tuning.py's comments) names each
    value lever's flag: it must be the one pdkit.render.flags._VALUE_FLAGS renders."""
    source = (REPO / "pdkit/spec/tuning.py").read_text(encoding="utf-8").splitlines()
    wrong = []
    for name, flag in _tuning_value_flags():
        at = next(i for i, line in enumerate(source) if re.match(rf"\s+{name}:", line))
        if not re.match(rf"\s*# {re.escape(flag)}\b(?!-)", source[at - 1]):
            wrong.append(f"{name}: {source[at - 1].strip()!r} should name {flag}")
    assert wrong == []


def test_the_releases_command_is_built_in_one_place():
    """Issue 34 item 2: the node's `python -m pdkit.releases --releases-dir ... --release-json ...`
    is pdkit.render.paths.releases_command (the deploy records with it, the roll lists and restores)."""
    assert _second_spellings(r"-m pdkit\.releases --releases-dir", ("pdkit/render/paths.py",)) == []


# ---------------------------------------------------------------- the top of pdkit/ (issue 48 item 1)

# `python -m pdkit.X` paths that rendered units and node commands name: each runs pdkit/agent/X
ENTRY_SHIMS = ("health", "gpumem", "releases", "jitwarm", "residency")


def test_the_top_of_pdkit_holds_only_the_cli_the_entry_paths_and_pointers():
    top = {p.name for p in (REPO / "pdkit").glob("*.py")}
    assert top == {"__init__.py", "cli.py", *(f"{n}.py" for n in ENTRY_SHIMS), *(Path(p).name for p in POINTERS)}
    for pointer in POINTERS:
        tree = ast.parse((REPO / pointer).read_text())
        assert len(tree.body) == 1 and ast.get_docstring(tree), f"{pointer}: a docstring naming the new home, nothing else"


def test_each_entry_path_runs_its_agent_module():
    import subprocess

    for name in (*ENTRY_SHIMS, "exporter"):
        got = subprocess.run([sys.executable, "-m", f"pdkit.{name}", "--help"], capture_output=True, text=True,
                             timeout=60, cwd=REPO)
        assert got.returncode == 0 and "usage:" in got.stdout, (name, got.stdout[-400:], got.stderr[-400:])
