"""Engine locks agree with pdkit/upstream/versions.py, cover every pinned release, and are chosen per node."""

from __future__ import annotations

import re
import shutil

import pytest

from pdkit.upstream.versions import NIXL_EXCLUDED, NIXL_META_PACKAGE, NIXL_PACKAGE, SGLANG_RELEASES
from pdkit.wheels import enginelock
from pdkit.wheels.enginelock import LockError, all_locks, canonical, select_lock
from pdkit.wheels.platforms import KNOWN_PLATFORMS
from pdkit.wheels.wheelhouse import lock_pins
from tests.conftest import require


def test_every_lock_header_agrees_with_its_body_and_versions_py():
    locks = all_locks()
    assert locks, "pdkit/wheels/locks/engine/ holds no lock"
    for lock in locks:
        assert lock.package == "sglang"
        assert lock.version in SGLANG_RELEASES, f"{lock.path.name}: sglang {lock.version} is not a release pdkit/upstream/versions.py pins"
        assert lock.pins.get("sglang") == lock.version, f"{lock.path.name}: header says {lock.version}, body pins {lock.pins.get('sglang')}"
        assert lock.pins.get(canonical(NIXL_PACKAGE[0])) == NIXL_PACKAGE[1], f"{lock.path.name}: nixl is not {NIXL_PACKAGE}"
        # SGLang imports the module `nixl`, which only the meta package has (issue 22: a pdkit venv
        # without it failed `from nixl._api import nixl_agent`); its cu12 half stays out
        assert lock.pins.get(canonical(NIXL_META_PACKAGE[0])) == NIXL_META_PACKAGE[1], f"{lock.path.name}: no {NIXL_META_PACKAGE}"
        assert not any(canonical(x) in lock.pins for x in NIXL_EXCLUDED), f"{lock.path.name}: holds {NIXL_EXCLUDED}"
        assert lock.resolver == f"uv {enginelock.UV_VERSION}"
        assert lock.path.name == enginelock.lock_filename(lock.package, lock.version, lock.python, lock.platform_tag)


def test_every_pinned_release_has_a_lock_for_every_known_node_os():
    have = {(lk.version, lk.python, lk.platform_tag) for lk in all_locks()}
    for version in SGLANG_RELEASES:
        for platform in KNOWN_PLATFORMS.values():
            want = (version, platform.python, enginelock.lock_platform_tag(platform))
            assert want in have, f"sglang {version} has no lock for {platform.name} {want}: python -m pdkit.wheels.enginelock --sglang-version {version} --platform {platform.name}"


def test_every_lock_pins_pdkits_own_node_packages_at_their_versions():
    node = {canonical(p.split("==")[0]): p.split("==")[1] for p in lock_pins("node.txt")}
    for lock in all_locks():
        differ = {n: (v, lock.pins.get(n)) for n, v in node.items() if lock.pins.get(n) != v}
        assert not differ, f"{lock.path.name} disagrees with pdkit/wheels/locks/node.txt: {differ}"


def test_every_pin_of_a_lock_carries_a_hash():
    for lock in all_locks():
        entries = re.split(r"\n(?=[A-Za-z0-9])", lock.text.split("\n", 7)[-1])
        for entry in entries:
            if "==" in entry.split("\n", 1)[0]:
                assert "--hash=sha256:" in entry, f"{lock.path.name}: {entry.splitlines()[0]} has no hash"


def test_the_highest_lock_at_or_below_the_nodes_glibc_is_chosen():
    lock = select_lock("sglang", "0.5.23", "3.11", (2, 36))
    assert lock.platform_tag == "manylinux_2_36_x86_64"
    # Debian 13's glibc 2.41 uses the newest policy uv can resolve for (2_40)
    assert select_lock("sglang", "0.5.23", "3.13", (2, 41)).platform_tag == "manylinux_2_40_x86_64"


def test_no_lock_for_a_nodes_python_names_the_python_and_what_exists():
    with pytest.raises(LockError) as err:
        select_lock("sglang", "0.5.23", "3.10", (2, 35))
    message = str(err.value)
    assert "Python 3.10" in message and "3.11" in message and "python -m pdkit.wheels.enginelock" in message


def test_a_node_glibc_older_than_every_lock_is_refused_with_the_fix():
    with pytest.raises(LockError) as err:
        select_lock("sglang", "0.5.23", "3.11", (2, 31))
    assert "2.31" in str(err.value) and "manylinux_2_36_x86_64" in str(err.value)


def test_an_unlocked_release_is_refused_with_the_command_that_locks_it():
    with pytest.raises(LockError) as err:
        select_lock("sglang", "0.5.99", "3.11", (2, 36))
    assert "0.5.99" in str(err.value) and "--sglang-version 0.5.99" in str(err.value)


def test_a_lock_without_its_header_is_refused(tmp_path):
    bad = tmp_path / "sglang-0.5.23-cp311-manylinux_2_36_x86_64.txt"
    bad.write_text("sglang==0.5.23 \\\n    --hash=sha256:00\n")
    with pytest.raises(LockError) as err:
        select_lock("sglang", "0.5.23", "3.11", (2, 36), directory=tmp_path)
    assert "header lacks" in str(err.value)


def test_the_generator_writes_a_parsable_lock_with_uv(tmp_path, monkeypatch):
    """The real resolver (needs PyPI), on a tiny closure: the engine's own reads ~200 packages' metadata."""
    require(shutil.which("uv") is not None or (enginelock.Path(enginelock.sys.executable).parent / "uv").exists(), "uv is not installed (the test extras pin it)")
    monkeypatch.setattr(enginelock, "lock_inputs", lambda package, version: ["idna==3.20"])
    path = enginelock.generate("sglang", "0.5.23", KNOWN_PLATFORMS["debian12"], directory=tmp_path)
    lock = enginelock.parse_lock(path)
    assert (lock.version, lock.python, lock.platform_tag) == ("0.5.23", "3.11", "manylinux_2_36_x86_64")
    assert lock.pins == {"idna": "3.20"} and "--hash=sha256:" in lock.text
