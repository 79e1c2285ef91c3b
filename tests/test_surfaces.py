"""Chosen package surfaces (issue 48 item 3), read with ast: nothing is imported but the packages.

Each package below exports from its __init__ (its `__all__`) exactly the names that code outside it
uses: pdkit's other modules, roles/, deploy/, benchmarks/, gpu/ and inventories/. Tests are not users:
they import the submodule that holds a name. A name no other package uses leaves the surface; a name
another package starts to use joins it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("bench", "roll", "doctor", "lab", "tune", "exporter", "contract")
USERS = ("pdkit", "roles", "deploy", "benchmarks", "gpu", "inventories")


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """The file's import, attribute and assignment nodes: all the reader below looks at (parsed once)."""
    kinds = (ast.Import, ast.ImportFrom, ast.Attribute, ast.Assign)
    return tuple(n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, kinds))


def used_names(root: Path, package: str, submodules: set[str]) -> dict[str, list[str]]:
    """name -> ["file:line", ...] for every name of pdkit.PACKAGE that code under USERS outside the package
    takes from the package itself: `from pdkit.P import name`, and `P.name` after `from pdkit import P` or
    `import pdkit.P [as P]`, and add_parser where COMMAND_MODULES (pdkit/cli.py) names the package. Submodules
    (`from pdkit.P import sub`) are not names of the surface."""
    found: dict[str, list[str]] = {}
    for top in USERS:
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else []:
            rel = path.relative_to(root).as_posix()
            if rel.startswith(f"pdkit/{package}/"):
                continue
            nodes = _nodes(path)
            aliases: set[str] = set()
            dotted = False  # `import pdkit.P`: uses read as pdkit.P.name
            for node in nodes:
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == f"pdkit.{package}":
                    for a in node.names:
                        if a.name not in submodules:
                            found.setdefault(a.name, []).append(f"{rel}:{node.lineno}")
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "pdkit":
                    aliases |= {a.asname or a.name for a in node.names if a.name == package}
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name == f"pdkit.{package}":
                            if a.asname:
                                aliases.add(a.asname)
                            else:
                                dotted = True
            for node in nodes:
                if not isinstance(node, ast.Attribute) or node.attr in submodules:
                    continue
                value = node.value
                direct = isinstance(value, ast.Name) and value.id in aliases
                via_pdkit = (dotted and isinstance(value, ast.Attribute) and value.attr == package
                             and isinstance(value.value, ast.Name) and value.value.id == "pdkit")
                if direct or via_pdkit:
                    found.setdefault(node.attr, []).append(f"{rel}:{node.lineno}")
            # pdkit/cli.py imports each module of COMMAND_MODULES by name and calls its add_parser
            for node in nodes:
                if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMMAND_MODULES"
                                                         for t in node.targets)):
                    if f"pdkit.{package}" in {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}:
                        found.setdefault("add_parser", []).append(f"{rel}:{node.lineno}")
    return found


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
    assert problems == [], "\n".join(problems)


def test_the_finder_sees_every_way_of_taking_a_name(tmp_path):
    """The reader above finds each form of use (so the surface test can fail), and skips submodules,
    the package's own files and tests."""
    files = {
        "pdkit/pkg/__init__.py": "",
        "pdkit/pkg/sub.py": "from pdkit.pkg import inner  # the package's own: not a user\n",
        "pdkit/a.py": "from pdkit.pkg import one, sub\n",
        "pdkit/b.py": "from pdkit import pkg\npkg.two()\npkg.sub.x()\n",
        "roles/c.py": "import pdkit.pkg as p\np.three\n",
        "gpu/d.py": "import pdkit.pkg\npdkit.pkg.four\n",
        "pdkit/cli.py": "COMMAND_MODULES = ('pdkit.other', 'pdkit.pkg')\n",
        "tests/test_e.py": "from pdkit.pkg import five\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = used_names(tmp_path, "pkg", {"sub"})
    assert got == {"one": ["pdkit/a.py:1"], "two": ["pdkit/b.py:2"], "three": ["roles/c.py:2"],
                   "four": ["gpu/d.py:2"], "add_parser": ["pdkit/cli.py:1"]}, got
