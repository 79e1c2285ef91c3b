"""No authentication must be an explicit choice (issue 46): pdkit_router.auth against the router's key.

An inventory that reads the key from the environment (os.environ.get("PDKIT_ROUTER_KEY")) gets None when
the variable is unset, and the router then serves anyone who reaches its port. So:

- key unset, auth unset: a warning naming the host, pdkit_router.auth and both valid choices (`pdkit
  validate --strict` makes it an error: the inventory may be right);
- auth "api_key" with no key: an error (the variable that should hold it is probably unset);
- auth "none" with a key: an error (the key reaches every router and pdkit client anyway);
- an empty key: an error (pdkit_cluster.secrets.router_api_key, tests/test_validate_issue32.py has its shapes);
- auth "api_key" with sglang-router 0.3.2: an error (it takes a key only on its command line);
- what stays valid: a key alone (auth unset means api_key), a key with auth "api_key", auth "none" without one.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

from pdkit.cli import main
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, REPO, write_inventory

KEY = "rk_0123456789abcdef"


def _inventory(tmp_path, auth=None, key=None, package=None):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    router = hosts["gpu01"]["pdkit_router"]
    router.pop("auth", None)
    if auth is not None:
        router["auth"] = auth
    if package is not None:
        router["package"] = package
    if key is not None:
        cluster["secrets"] = {"router_api_key": key}
    return write_inventory(tmp_path, hosts, cluster)


def _validate(path, capsys, *extra) -> tuple[int, list[tuple[str, str, str, str]]]:
    """Exit code and (severity, host, field, message) of each problem validate printed."""
    code = main(["validate", *extra, str(path)])
    captured = capsys.readouterr()
    found = []
    for line in (captured.out + captured.err).splitlines():
        match = re.match(r"^\s*(error|warning)\s+(\S+): (\S+): (.*)$", line)
        if match:
            found.append(match.groups())
    return code, found


def _about_auth(found):
    return [p for p in found if p[2] in ("pdkit_router.auth", "pdkit_cluster.secrets.router_api_key")]


def test_no_key_and_no_choice_warns_naming_host_field_and_both_choices(tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path), capsys)
    assert code == 0
    [(severity, host, field, message)] = _about_auth(found)
    assert (severity, host, field) == ("warning", "gpu01", "pdkit_router.auth")
    assert "pdkit_cluster.secrets.router_api_key is unset" in message and "environment variable" in message
    assert "auth: 'api_key'" in message and "auth: 'none'" in message


def test_strict_makes_the_missing_choice_an_error(tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path), capsys, "--strict")
    assert code == 2
    assert ("gpu01", "pdkit_router.auth") in [(h, f) for _, h, f, _ in found]


def test_api_key_without_a_key_is_an_error_naming_the_unset_variable(tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path, auth="api_key"), capsys)
    assert code == 2
    [(severity, host, field, message)] = _about_auth(found)
    assert (severity, host, field) == ("error", "gpu01", "pdkit_cluster.secrets.router_api_key")
    assert "probably unset" in message


def test_none_with_a_key_is_an_error(tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path, auth="none", key=KEY), capsys)
    assert code == 2
    [(severity, host, field, message)] = _about_auth(found)
    assert (severity, host, field) == ("error", "gpu01", "pdkit_router.auth")
    assert "'none' but pdkit_cluster.secrets.router_api_key is set" in message and KEY not in message


@pytest.mark.parametrize("auth", [None, "api_key"])
def test_an_empty_key_is_an_error(auth, tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path, auth=auth, key=""), capsys)
    assert code == 2
    assert [(s, h, f) for s, h, f, _ in _about_auth(found)] == [
        ("error", "gpu01", "pdkit_cluster.secrets.router_api_key")]


def test_api_key_with_sglang_router_is_an_error(tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path, auth="api_key", key=KEY, package="sglang-router"), capsys)
    assert code == 2
    assert ("error", "gpu01", "pdkit_router.auth") in [(s, h, f) for s, h, f, _ in found]


@pytest.mark.parametrize("auth,key", [(None, KEY), ("api_key", KEY), ("none", None)])
def test_what_stays_valid(auth, key, tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path, auth=auth, key=key), capsys)
    assert code == 0, found
    assert _about_auth(found) == []


def test_sglang_router_without_a_key_says_a_key_needs_smg(tmp_path, capsys):
    code, found = _validate(_inventory(tmp_path, package="sglang-router"), capsys)
    [(_, _, _, message)] = _about_auth(found)
    assert "needs package smg" in message and "auth: 'none'" in message


def test_a_key_read_from_an_unset_variable_is_caught(tmp_path):
    """The case the field exists for: the inventory reads the key with os.environ.get and the variable is
    unset where validate runs. Without auth: a warning; with auth 'api_key': an error."""
    for auth, expect in ((None, 0), ("api_key", 2)):
        path = _inventory(tmp_path, auth=auth)
        text = path.read_text().replace("'pdkit_cluster': {",
                                        "'pdkit_cluster': {'secrets': {'router_api_key': "
                                        "__import__('os').environ.get('PDKIT_TEST_UNSET_ROUTER_KEY')}, ", 1)
        path.write_text(text)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
        result = subprocess.run([sys.executable, "-m", "pdkit.cli", "validate", str(path)], capture_output=True,
                                text=True, env=env, cwd=REPO)
        output = result.stdout + result.stderr
        assert result.returncode == expect, output
        field = "pdkit_router.auth" if auth is None else "pdkit_cluster.secrets.router_api_key"
        assert f"gpu01: {field}: " in output, output


@pytest.mark.parametrize("inventory", sorted(p.name for p in (REPO / "inventories").glob("*.py")))
def test_every_shipped_inventory_says_its_choice(inventory, monkeypatch, capsys):
    """inventories/*.py (the good corpus: tests/test_good_corpus.py holds its exact warnings): none runs
    without a key silently."""
    monkeypatch.chdir(REPO)
    code, found = _validate(f"inventories/{inventory}", capsys)
    assert code == 0, found
    assert _about_auth(found) == []
