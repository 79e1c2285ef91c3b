"""The host-state probe (roles/facts.py) run for real: the command the fact sends, through sh, on
this machine, with stand-ins for systemctl and dpkg-query; and the fact that reads it together
with another fact in one round trip."""

from __future__ import annotations

import grp
import hashlib
import io
import json
import os
import pwd
import shlex
import stat
import subprocess
import sys

import pytest
from pyinfra.api import FactBase

from roles import node_facts
from roles.facts import PdkitHostState, WithHostState
from roles.node_facts import PROBE_TEXTS, NodeFacts, facts_from_texts, output_lines, probe_texts

SYSTEMCTL = """#!/bin/sh
# systemctl show -p LoadState,ActiveState,UnitFileState UNIT...: one block per unit
shift 3
first=1
for u in "$@"; do
  [ $first = 1 ] || echo
  first=0
  case "$u" in
    up.service) printf 'LoadState=loaded\\nActiveState=active\\nUnitFileState=enabled\\n' ;;
    *) printf 'LoadState=not-found\\nActiveState=inactive\\n' ;;
  esac
done
echo "systemctl: noise on stderr" >&2
"""

DPKG_QUERY = """#!/bin/sh
# dpkg-query -W -f FORMAT PKG...
shift 3
for p in "$@"; do
  case "$p" in
    here) echo "here install ok installed" ;;
    half) echo "half deinstall ok config-files" ;;
    *) echo "dpkg-query: no packages found matching $p" >&2 ;;
  esac
done
exit 1
"""


@pytest.fixture()
def node(tmp_path):
    """A directory tree standing for a node, and a PATH whose python3 is this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for name, text in (("systemctl", SYSTEMCTL), ("dpkg-query", DPKG_QUERY)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/a.conf").write_text("a\n")
    (root / "etc/a.conf").chmod(0o640)
    (root / "etc/secret").write_bytes(b"\x00\xffbinary")
    (root / "etc/secret").chmod(0o600)
    (root / "dir").mkdir()
    (root / "dir").chmod(0o2750)
    venv = root / "venv"
    venv.mkdir()
    (venv / ".pdkit-bundle-bbbb").touch()
    (venv / ".pdkit-bundle-aaaa").touch()
    (venv / "bin").mkdir()
    releases = root / "releases"
    (releases / "r2").mkdir(parents=True)
    (releases / "CURRENT").write_text("r2\n")
    meta = {"hash": "h2", "venvs": {"node": "x"}, "files": {str(root / "old.conf"): "s", str(root / "etc/a.conf"): "t"}, "services": {"gone.service": {}}}
    (releases / "r2/meta.json").write_text(json.dumps(meta))
    return {"root": root, "env": {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C"}}


def _run(command: str, env: dict) -> list[str]:
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    # pyinfra hands a fact its stdout as lines, newlines stripped
    return done.stdout.splitlines()


def _probe(root, releases: str = "", user=None) -> dict:
    return {
        "paths": (str(root / "etc/a.conf"), str(root / "etc/secret"), str(root / "dir"), str(root / "missing")),
        "units": ("up.service", "down.service"),
        "user": user or ["root", "nosuchuser-pdkit"],
        "venvs": (str(root / "venv"), str(root / "novenv")),
        "packages": ("here", "half", "gone"),
        "releases": releases,
    }


def _pyinfra_lines(stdout: str) -> list[str]:
    """STDOUT as pyinfra hands it to a fact (its own reader, pyinfra.connectors.util.read_buffer)."""
    from queue import Queue

    from pyinfra.connectors.util import read_buffer

    queue: Queue = Queue()
    read_buffer("stdout", io.StringIO(stdout), queue)
    return [queue.get().line for _ in range(queue.qsize())]


def _stat(path, kind):
    st = os.stat(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if kind == "file" else None
    return [kind, f"{stat.S_IMODE(st.st_mode):04o}", pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name, digest]


def test_the_probe_reads_paths_units_users_venvs_packages_and_the_current_release(node):
    root = node["root"]
    kwargs = _probe(root, releases=str(root / "releases"))
    state = PdkitHostState().process(_run(PdkitHostState().command(**kwargs), node["env"]))
    assert state["release"] == {"id": "r2", "hash": "h2", "venvs": {"node": "x"}, "files": sorted([str(root / "old.conf"), str(root / "etc/a.conf")]),
                                "services": {"gone.service": {}}}
    assert state["paths"] == {
        str(root / "etc/a.conf"): _stat(root / "etc/a.conf", "file"),
        str(root / "etc/secret"): _stat(root / "etc/secret", "file"),
        str(root / "dir"): _stat(root / "dir", "dir"),
        str(root / "missing"): None,
        # a file of the current release the plan no longer has is read too (the deploy removes it)
        str(root / "old.conf"): None,
    }
    assert state["paths"][str(root / "dir")][1] == "2750"
    # the current release's units come after the planned ones
    assert state["units"] == {"up.service": ["loaded", "active", "enabled"], "down.service": ["not-found", "inactive"], "gone.service": ["not-found", "inactive"]}
    assert (state["user"], state["users"]) == (False, {"root": True, "nosuchuser-pdkit": False})
    assert state["venvs"] == {str(root / "venv"): [".pdkit-bundle-aaaa", ".pdkit-bundle-bbbb"], str(root / "novenv"): []}
    assert state["packages"] == ["here"]
    assert state["python"] == "%d.%d" % sys.version_info[:2]
    assert state["glibc"] == os.confstr("CS_GNU_LIBC_VERSION")
    assert state["arch"] == os.uname().machine


def test_no_release_no_units_no_packages(node):
    root = node["root"]
    kwargs = {**_probe(root, user="root"), "units": (), "packages": ()}
    state = PdkitHostState().process(_run(PdkitHostState().command(**kwargs), node["env"]))
    assert (state["release"], state["units"], state["packages"], state["user"], state["users"]) == ({}, {}, [], True, {"root": True})
    assert sorted(state["paths"]) == sorted(kwargs["paths"])


def test_the_probe_ignores_the_nodes_python_environment(node, tmp_path):
    # a PYTHONPATH on the node (or a stray module in the working directory) cannot change what the probe reads
    (tmp_path / "json.py").write_text("raise SystemExit('a stray json.py was imported')\n")
    env = {**node["env"], "PYTHONPATH": str(tmp_path)}
    state = PdkitHostState().process(_run(f"cd {tmp_path} && " + PdkitHostState().command(**_probe(node["root"])), env))
    assert state["users"]["root"] is True


class Echo(FactBase):
    """Prints TEXT as it is."""

    def command(self, text: str) -> str:
        return f"printf %s {shlex.quote(text)}"

    def process(self, output):
        return output


class Fails(FactBase):
    def command(self) -> str:
        return "echo partial; exit 3"


def test_another_fact_and_the_host_state_in_one_command(node):
    kwargs = _probe(node["root"])
    alone = PdkitHostState().process(_run(PdkitHostState().command(**kwargs), node["env"]))
    fact = WithHostState()

    def both(text):
        return fact.process(_run(fact.command(Echo, {"text": text}, kwargs), node["env"]))

    # each part exactly as read alone: an empty line kept, nothing added
    assert both("a\n\nb\n") == (["a", "", "b"], alone)
    # output without a final newline keeps its last line
    assert both("a\nb")[0] == ["a", "b"]
    # no output: no lines (read_with_host_state gives the fact's default then, as pyinfra does)
    assert both("") == ([], alone)


def test_a_part_that_fails_is_none_and_the_other_is_kept(node):
    kwargs = _probe(node["root"])
    fact = WithHostState()
    value, state = fact.process(_run(fact.command(Fails, {}, kwargs), node["env"]))
    assert value is None and state["users"]["root"] is True
    # no python3 on the node: the probe fails, the other fact is kept
    value, state = fact.process(_run(fact.command(Echo, {"text": "x\n"}, kwargs), {**node["env"], "PATH": "/nonexistent"}))
    assert (value, state) == (["x"], None)
    # output cut short (no part's end seen): neither part is kept
    assert fact.process(["x"]) == (None, None)


# the probe's JSON and SHA-256 (its prelude, up to where it reads its arguments), in this process
_PRELUDE = __import__("roles.facts", fromlist=["_PROBE"])._PROBE.split("paths, units, user, venvs, packages, releases, texts =")[0]
_VALUES = [
    {"release": {"id": "r2", "hash": "h", "files": ["/etc/é", "/x \"y\" \\z", "/tab\there", "/nl\nx", "/emoji-\U0001f600"]},
     "n": [0, -1, 2**70, 1.5, -0.0, 1e300], "flags": [True, False, None], "empty": [{}, [], ""]},
    "\x00\x1f\x7f\u2028", [], {},
]


def _codec(block: tuple[str, ...] = ()):
    saved = {name: sys.modules.get(name) for name in block}
    try:
        for name in block:
            sys.modules[name] = None  # an import of it fails, as on a Python without it
        namespace: dict = {}
        exec(_PRELUDE, namespace)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return namespace


@pytest.mark.parametrize("block", [(), ("_json", "_sha2", "_sha256")], ids=["c-modules", "fallback"])
def test_the_probes_json_and_sha256_are_json_and_hashlibs(block):
    ns = _codec(block)
    if block:
        assert ns["sha256"] is hashlib.sha256 and ns["loads"] is json.loads  # the fallback did run
    else:
        assert ns["sha256"] is not hashlib.sha256 and ns["loads"] is not json.loads  # json and hashlib not imported
    for value in _VALUES:
        text = ns["dumps"](value)
        assert text == json.dumps(value)
        assert ns["loads"](text) == json.loads(text)
    assert ns["dumps"]([float("nan"), float("inf"), float("-inf")]) == json.dumps([float("nan"), float("inf"), float("-inf")])
    assert ns["loads"]('  {"a": [1, 2.5, "\\u00e9", null, true]}\n') == {"a": [1, 2.5, "é", None, True]}
    for bad in ("", "{", '{"a": 1} x', "[1,]"):
        with pytest.raises(ValueError):
            ns["loads"](bad)
    with pytest.raises(TypeError):
        ns["dumps"]({"a": object()})
    data = os.urandom(4096)
    assert ns["sha256"](data).hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("marker", [None, "NVIDIA driver packages changed by pdkit\n  second line\n", "no final newline"], ids=["no-marker", "marker", "marker-no-newline"])
def test_the_probes_texts_give_the_facts_their_commands_give(node, tmp_path, monkeypatch, marker):
    # a `gpu: none` host's preflight facts read by the probe (roles/preflight.py) equal NodeFacts'
    # own shell commands run on the same machine (this one's os-release and uname, a marker file)
    path = tmp_path / "reboot-required"
    if marker is not None:
        path.write_text(marker)
    monkeypatch.setattr(node_facts, "REBOOT_MARKER_PATH", str(path))
    names = tuple(PROBE_TEXTS)
    texts = tuple((n, k, str(path) if n == "reboot_required" else a) for n, k, a in probe_texts(names))
    state = PdkitHostState().process(_run(PdkitHostState().command(**_probe(node["root"]), texts=texts), node["env"]))
    shell = subprocess.run(["/bin/sh", "-c", NodeFacts().command(names)], capture_output=True, text=True, env=node["env"], timeout=60)
    assert shell.returncode == 0, shell.stderr
    expected = NodeFacts().process(_pyinfra_lines(shell.stdout))
    assert facts_from_texts(names, state["texts"]) == expected
    assert expected["arch"] == os.uname().machine and expected["os"]["id"]  # the comparison saw real values
    assert expected["reboot_required"] == (None if marker is None else " ".join(x.strip() for x in marker.splitlines() if x.strip()))


def test_an_unreadable_os_release_is_left_to_its_own_command(node, tmp_path):
    # `cat /etc/os-release` would fail the fact: no value from the texts, NodeFacts is read alone
    texts = (("os", "file", str(tmp_path / "absent")), ("arch", "uname", "machine"), ("reboot_required", "file", str(tmp_path / "absent")))
    state = PdkitHostState().process(_run(PdkitHostState().command(**_probe(node["root"]), texts=texts), node["env"]))
    assert state["texts"] == {"os": None, "arch": os.uname().machine + "\n", "reboot_required": None}
    assert facts_from_texts(("os", "arch", "reboot_required"), state["texts"]) is None
    # an absent marker is no marker, as `cat MARKER 2>/dev/null || true` says
    assert facts_from_texts(("arch", "reboot_required"), state["texts"]) == {"arch": os.uname().machine, "reboot_required": None}


@pytest.mark.parametrize("text", ["", "a", "a\n", "a\n\nb\n", "\n", "a\r\nb"])
def test_output_lines_split_as_pyinfra_splits(text):
    assert output_lines(text) == _pyinfra_lines(text)
