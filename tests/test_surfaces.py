"""Chosen package surfaces (issue 48 item 3), read with ast: nothing is imported but the packages.

Each package below exports from its __init__ (its `__all__`) exactly the names that code outside it
uses: pdkit's other modules, roles/, deploy/, benchmarks/, gpu/, inventories/ and config.py. Tests are not
users: they import the submodule that holds a name. A name no other package uses leaves the surface; a name
another package starts to use joins it. No __init__ star-imports a submodule; the package's own modules take
from it only submodules and what its __init__ defines itself, and tests (import, attribute or patch target)
only that and what its `__all__` lists.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("bench", "roll", "doctor", "lab", "tune", "exporter", "contract", "spec", "monitoring")
USERS = ("pdkit", "roles", "deploy", "benchmarks", "gpu", "inventories", "config.py")


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """The file's import, attribute, assignment and string nodes: all the reader below looks at (parsed once)."""
    kinds = (ast.Import, ast.ImportFrom, ast.Attribute, ast.Assign, ast.Constant)
    return tuple(n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, kinds))


def _files(root: Path, tops: tuple[str, ...]) -> list[Path]:
    """The .py files under each of TOPS (a folder or a file) that exist under ROOT."""
    out: list[Path] = []
    for top in tops:
        path = root / top
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
    return out


def names_taken(path: Path, rel: str, package: str, submodules: set[str]) -> list[tuple[str, str]]:
    """(name, "file:line") for every name of pdkit.PACKAGE the file takes from the package itself:
    `from pdkit.P import name`, and `P.name` after `from pdkit import P` or `import pdkit.P [as P]`, a string
    that is exactly "pdkit.P.name[...]" (a patch target), and add_parser where COMMAND_MODULES (pdkit/cli.py)
    names the package. Submodules (`from pdkit.P import sub`, `P.sub.x`) are not names of the surface."""
    found: list[tuple[str, str]] = []
    nodes = _nodes(path)
    aliases: set[str] = set()
    dotted = False  # `import pdkit.P`: uses read as pdkit.P.name
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == f"pdkit.{package}":
            found += [(a.name, f"{rel}:{node.lineno}") for a in node.names if a.name not in submodules]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "pdkit":
            aliases |= {a.asname or a.name for a in node.names if a.name == package}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == f"pdkit.{package}":
                    if a.asname:
                        aliases.add(a.asname)
                    else:
                        dotted = True
    patch_target = re.compile(rf"pdkit\.{package}\.(\w+)(\.\w+)*")
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = patch_target.fullmatch(node.value)
            if match and match[1] not in submodules:
                found.append((match[1], f"{rel}:{node.lineno}"))
            continue
        if not isinstance(node, ast.Attribute) or node.attr in submodules:
            continue
        value = node.value
        direct = isinstance(value, ast.Name) and value.id in aliases
        via_pdkit = (dotted and isinstance(value, ast.Attribute) and value.attr == package
                     and isinstance(value.value, ast.Name) and value.value.id == "pdkit")
        if direct or via_pdkit:
            found.append((node.attr, f"{rel}:{node.lineno}"))
    # pdkit/cli.py imports each module of COMMAND_MODULES by name and calls its add_parser
    for node in nodes:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMMAND_MODULES"
                                                 for t in node.targets)):
            if f"pdkit.{package}" in {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}:
                found.append(("add_parser", f"{rel}:{node.lineno}"))
    return found


def used_names(root: Path, package: str, submodules: set[str]) -> dict[str, list[str]]:
    """name -> ["file:line", ...] for every name of pdkit.PACKAGE that code under USERS outside the package
    takes from the package itself (names_taken)."""
    found: dict[str, list[str]] = {}
    for path in _files(root, USERS):
        rel = path.relative_to(root).as_posix()
        if not rel.startswith(f"pdkit/{package}/"):
            for name, where in names_taken(path, rel, package, submodules):
                found.setdefault(name, []).append(where)
    return found


def taken_inside(root: Path, package: str, submodules: set[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What the tests take from pdkit.PACKAGE itself, and what the package's own modules (its __init__ aside)
    take from it: (name, "file:line") each."""
    tests: list[tuple[str, str]] = []
    own: list[tuple[str, str]] = []
    for path in _files(root, ("tests", f"pdkit/{package}")):
        rel = path.relative_to(root).as_posix()
        if rel != f"pdkit/{package}/__init__.py":
            (tests if rel.startswith("tests/") else own).extend(names_taken(path, rel, package, submodules))
    return tests, own


def defined_in(init: Path) -> set[str]:
    """The names INIT defines itself (def, class, assignment), not those it imports: their home is the package."""
    tree = ast.parse(init.read_text(), str(init))
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def star_imports(init: Path) -> list[int]:
    """The lines of INIT that import a module's every name (`from x import *`)."""
    return [n.lineno for n in _nodes(init)
            if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]


def _submodules(package: str) -> set[str]:
    return {m.name for m in pkgutil.iter_modules([str(REPO / "pdkit" / package)])}


def test_each_package_exports_exactly_what_other_packages_use():
    problems = []
    for package in PACKAGES:
        module = importlib.import_module(f"pdkit.{package}")
        surface = set(getattr(module, "__all__", ()))
        used = used_names(REPO, package, _submodules(package))
        for name in sorted(set(used) - surface):
            problems.append(f"pdkit.{package}.{name} is used by {', '.join(used[name])} but not in its __all__")
        for name in sorted(surface - set(used)):
            problems.append(f"pdkit.{package}.__all__ has {name!r}, which no other package uses: tests import "
                            f"it from its submodule")
        for name in sorted(surface):
            if not hasattr(module, name):
                problems.append(f"pdkit.{package}.__all__ has {name!r}, which the package does not provide")
        for line in star_imports(REPO / "pdkit" / package / "__init__.py"):
            problems.append(f"pdkit/{package}/__init__.py:{line} imports every name of a module: import by name "
                            f"what other packages use")
    assert problems == [], "\n".join(problems)


def test_tests_and_the_packages_own_modules_take_submodules_from_it():
    """A test takes from the package only a name of its surface or one its __init__ defines, and the package's
    own modules only the latter: every other name comes from the submodule that holds it (no alias kept only
    for a test). Module attributes (`__path__`, ...) are no names of the surface."""
    problems = []
    for package in PACKAGES:
        surface = set(getattr(importlib.import_module(f"pdkit.{package}"), "__all__", ()))
        home = defined_in(REPO / "pdkit" / package / "__init__.py")
        tests, own = taken_inside(REPO, package, _submodules(package))
        problems += [f"{where} takes {name} from pdkit.{package}, whose __all__ does not list it: take it from "
                     f"its submodule" for name, where in tests
                     if name not in surface | home and not name.startswith("__")]
        problems += [f"{where} takes {name} from its own package pdkit.{package}: take it from its submodule"
                     for name, where in own if name not in home and not name.startswith("__")]
    assert problems == [], "\n".join(problems)


def test_the_finder_sees_every_way_of_taking_a_name(tmp_path):
    """The reader above finds each form of use (so the surface test can fail), and skips submodules,
    the package's own files and tests; the tests' and the package's own takings, its star imports and the
    names its __init__ defines are read apart."""
    files = {
        "pdkit/pkg/__init__.py": "from pdkit.pkg.sub import *\nfrom pdkit.pkg.sub import inner\n\n"
                                 "HERE = 1\n\n\ndef here():\n    pass\n",
        "pdkit/pkg/sub.py": "from pdkit.pkg import inner, here  # the package's own: not a user\n",
        "pdkit/a.py": "from pdkit.pkg import one, sub\n",
        "pdkit/b.py": "from pdkit import pkg\npkg.two()\npkg.sub.x()\n",
        "roles/c.py": "import pdkit.pkg as p\np.three\n",
        "gpu/d.py": "import pdkit.pkg\npdkit.pkg.four\n",
        "config.py": "from pdkit.pkg import seven\n",
        "pdkit/cli.py": "COMMAND_MODULES = ('pdkit.other', 'pdkit.pkg')\n",
        "tests/test_e.py": "from pdkit.pkg import five\n",
        "tests/test_f.py": "def test(monkeypatch):\n    monkeypatch.setattr('pdkit.pkg.six.x', 1)\n"
                           "    monkeypatch.setattr('pdkit.pkg.sub.x', 1)\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = used_names(tmp_path, "pkg", {"sub"})
    assert got == {"one": ["pdkit/a.py:1"], "two": ["pdkit/b.py:2"], "three": ["roles/c.py:2"],
                   "four": ["gpu/d.py:2"], "seven": ["config.py:1"], "add_parser": ["pdkit/cli.py:1"]}, got
    tests, own = taken_inside(tmp_path, "pkg", {"sub"})
    assert tests == [("five", "tests/test_e.py:1"), ("six", "tests/test_f.py:2")], tests
    assert own == [("inner", "pdkit/pkg/sub.py:1"), ("here", "pdkit/pkg/sub.py:1")], own
    assert star_imports(tmp_path / "pdkit/pkg/__init__.py") == [1]
    assert defined_in(tmp_path / "pdkit/pkg/__init__.py") == {"HERE", "here"}
