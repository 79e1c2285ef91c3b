"""What runs on a node imports only what the node venv installs (pdkit/wheels/locks/node.txt).

The node venv has no pydantic, pyinfra or jinja2: a module of the sim engine, the health gates or
pdkit-exporter that reaches one of them fails at the engine's first start on every node (it did:
the sim importing pdkit.spec.faultbudget, which needs pydantic). Each entry point is imported in a child
Python whose import system refuses every top-level module that is neither the standard library,
pdkit, nor a package of the node lock.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.wheels.wheelhouse import node_sources, node_wheel
from tests.conftest import REPO

# import names of the node lock's distributions (pdkit/wheels/locks/node.txt), where they differ
IMPORT_NAMES = {"attrs": ["attr", "attrs"], "charset-normalizer": ["charset_normalizer"], "typing_extensions": ["typing_extensions"]}
def node_modules() -> list[str]:
    """Every module of the node wheel (pdkit.wheels.wheelhouse.node_sources), each importable on a node: the units'
    ExecStart / ExecStartPre modules and everything they import (a `__main__` would run, not import)."""
    return [rel[:-3].replace("/", ".").removesuffix(".__init__") for rel in node_sources()
            if rel.endswith(".py") and not rel.endswith("__main__.py")]


def node_lock_imports() -> set[str]:
    names: set[str] = set()
    for line in (REPO / "pdkit" / "wheels" / "locks" / "node.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==", line)
        if m:
            dist = m.group(1)
            names.update(IMPORT_NAMES.get(dist, [dist.lower().replace("-", "_")]))
    return names


CHILD = r"""
import sys
sys.path[:0] = [sys.argv[2], sys.argv[3]]
import importlib
importlib.import_module(sys.argv[1])
"""


@pytest.fixture(scope="module")
def node_site(tmp_path_factory):
    """A site directory holding only the node lock's packages (links into this venv's site-packages)."""
    import site as site_mod

    site_dir = tmp_path_factory.mktemp("node-site")
    sources = [Path(p) for p in site_mod.getsitepackages()]
    for name in node_lock_imports():
        for src in sources:
            found = [src / name] + list(src.glob(f"{name}.py")) + list(src.glob(f"{name}.*.so"))
            found = [f for f in found if f.exists()]
            if found:
                for f in found:
                    (site_dir / f.name).symlink_to(f)
                break
    return site_dir


@pytest.fixture(scope="module")
def node_pdkit(tmp_path_factory):
    """pdkit as the node venv has it: the node wheel (built into a scratch cache), unpacked."""
    import os
    import zipfile

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("PDKIT_CACHE")
    os.environ["PDKIT_CACHE"] = str(cache)
    try:
        wheel = node_wheel()
    finally:
        if old is None:
            del os.environ["PDKIT_CACHE"]
        else:
            os.environ["PDKIT_CACHE"] = old
    tree = tmp_path_factory.mktemp("node-pdkit")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    return tree


def _import(module: str, site_dir: Path, pdkit_root: Path) -> subprocess.CompletedProcess:
    # -I -S: no user site, no PYTHONPATH, no site-packages: the standard library, the node lock, pdkit
    return subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, module, str(site_dir), str(pdkit_root)],
                          cwd=site_dir, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module", node_modules())
def test_node_side_module_imports_from_the_node_wheel_with_only_the_node_lock(module, node_site, node_pdkit):
    proc = _import(module, node_site, node_pdkit)
    assert proc.returncode == 0, (f"{module} needs a package the node venv lacks, or a pdkit file the node wheel "
                                  f"(pdkit.wheels.wheelhouse.NODE_SOURCES) leaves out:\n{proc.stderr[-2000:]}")


def test_the_guard_can_fail(node_site):
    proc = _import("pdkit.spec.faultbudget", node_site, REPO)
    assert proc.returncode != 0 and "pydantic" in proc.stderr


def test_a_control_side_module_is_not_in_the_node_wheel(node_site, node_pdkit):
    """A control-side edit cannot change the node wheel (issue 48 item 2): its files are not in it."""
    proc = _import("pdkit.bench.record", node_site, node_pdkit)
    assert proc.returncode != 0 and "No module named 'pdkit.bench'" in proc.stderr, proc.stderr[-1000:]
    assert not (node_pdkit / "pdkit" / "cli.py").exists()
