"""Bundles: hashed requirements, deterministic bytes, the right wheel per platform, clear errors, and
real pip installing one from pdkit's HTTP bundle server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import requests
from packaging.utils import parse_wheel_filename

from pdkit.wheels import bundleserver, wheelhouse
from pdkit.wheels.platforms import KNOWN_PLATFORMS
from pdkit.wheels.wheelhouse import WheelhouseError

DEBIAN12 = KNOWN_PLATFORMS["debian12"]


def make_wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any", body: str = "VALUE = 1\n") -> Path:
    """A minimal valid wheel that pip installs (one module, METADATA, WHEEL, RECORD)."""
    path = directory / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}.py", body)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: pdkit-test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        zf.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "cache_root", lambda: tmp_path / "cache")
    return tmp_path / "cache"


def bundle_of(directory: Path, *wheels: Path) -> wheelhouse.Bundle:
    pins = {p.name.split("-")[0]: p.name.split("-")[1] for p in wheels}
    req = "".join(wheelhouse.hashed_requirement(n, v, w) + "\n" for (n, v), w in zip(pins.items(), wheels))
    return wheelhouse.make_bundle("router", list(wheels), req)


def test_digest_follows_names_contents_and_requirements_not_mtimes(tmp_path, cache):
    a, b = make_wheel(tmp_path, "alpha", "1.0"), make_wheel(tmp_path, "beta", "2.0")
    first = bundle_of(tmp_path, a, b)
    assert "alpha==1.0 --hash=sha256:" in first.requirements
    assert bundle_of(tmp_path, a, b).digest == first.digest
    os.utime(a, ns=(1, 1))
    assert bundle_of(tmp_path, a, b).digest == first.digest
    make_wheel(tmp_path, "alpha", "1.0", body="VALUE = 2\n")
    assert bundle_of(tmp_path, a, b).digest != first.digest


def test_the_sftp_tarball_is_deterministic_and_holds_requirements_and_wheels(tmp_path, cache):
    a, b = make_wheel(tmp_path, "alpha", "1.0"), make_wheel(tmp_path, "beta", "2.0")
    bundle = bundle_of(tmp_path, a, b)
    first = bundle.tarball().read_bytes()
    bundle.tarball().unlink()
    assert bundle.tarball().read_bytes() == first
    with tarfile.open(bundle.tarball()) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["requirements.txt", a.name, b.name]
        assert {(m.mtime, m.uid, m.gid, m.mode) for m in members} == {(0, 0, 0, 0o644)}
        assert tar.extractfile("requirements.txt").read().decode() == bundle.requirements


def test_wheels_for_picks_the_most_specific_wheel_the_node_accepts(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    generic = make_wheel(pool, "fast", "1.0", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
    specific = make_wheel(pool, "fast", "1.0", "cp311-cp311-manylinux_2_31_x86_64")
    make_wheel(pool, "fast", "1.0", "cp311-cp311-manylinux_2_39_x86_64")  # too new for glibc 2.36
    make_wheel(pool, "fast", "1.0", "cp312-cp312-manylinux_2_17_x86_64")  # another Python
    make_wheel(pool, "fast", "0.9", "py3-none-any")  # another version
    found, missing = wheelhouse.wheels_for({"fast": "1.0", "absent": "3.0"}, pool, DEBIAN12)
    assert found == {"fast": specific} and generic.exists()
    assert missing == ["absent==3.0"]


def test_offline_with_an_incomplete_cache_names_every_missing_package_and_the_fix(cache, monkeypatch):
    monkeypatch.setenv("PDKIT_OFFLINE", "1")
    with pytest.raises(WheelhouseError) as err:
        wheelhouse.download("torch==2.14.1\nsglang==0.5.23\n", {"torch": "2.14.1", "sglang": "0.5.23"}, DEBIAN12, label="engine lock x", hashed=False)
    message = str(err.value)
    assert "offline" in message and "sglang==0.5.23" in message and "torch==2.14.1" in message
    assert "python -m pdkit.wheels.wheelhouse" in message and "PDKIT_CACHE" in message


def test_a_package_the_index_lacks_is_named_in_one_line_not_a_pip_traceback(cache, tmp_path, monkeypatch):
    empty = tmp_path / "index"
    empty.mkdir()
    # a real pip against an empty local index: no network, the same failure a missing wheel gives
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", empty.as_uri())
    with pytest.raises(WheelhouseError) as err:
        wheelhouse.download("llguidance==1.9.1\n", {"llguidance": "1.9.1"}, DEBIAN12, label="engine lock y", hashed=False)
    message = str(err.value)
    assert "llguidance==1.9.1" in message and "Python 3.11, glibc 2.36" in message
    assert "Traceback" not in message and "\n" not in message


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("ERROR: Could not find a version that satisfies the requirement llguidance==1.9.1 (from versions: none)\nERROR: No matching distribution found for llguidance==1.9.1", "no wheel of llguidance==1.9.1"),
        ("WARNING: Retrying ... Failed to establish a new connection: [Errno 111]\nERROR: Could not install", "could not be reached"),
        ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.\n    torch==2.14.1 from https://x/torch.whl:\n        Expected sha256 aa", "torch==2.14.1"),
    ],
)
def test_pip_failures_become_one_line(stderr, expected):
    assert expected in wheelhouse._pip_failure(stderr)


def test_real_pip_installs_a_bundle_from_the_bundle_server_and_checks_every_hash(tmp_path, cache):
    a, b = make_wheel(tmp_path, "alpha", "1.0"), make_wheel(tmp_path, "beta", "2.0")
    bundle = bundle_of(tmp_path, a, b)
    url = bundleserver.serve(bundle, "127.0.0.1")
    try:
        target = tmp_path / "site"
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--no-deps", "--require-hashes", "--target", str(target)]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        proc = subprocess.run([*pip, "--find-links", url, "-r", url + "requirements.txt"], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert (target / "alpha.py").is_file() and (target / "beta.py").is_file()

        # only this process's token and the registered bundles answer
        assert requests.get(url.replace(bundleserver._TOKEN, "wrong-token"), timeout=5).status_code == 404
        assert requests.get(url + "../../", timeout=5).status_code == 404

        # a file changed after the bundle was made is refused by pip's hash check
        make_wheel(tmp_path, "beta", "2.0", body="VALUE = 'tampered'\n")
        again = subprocess.run([*pip, "--target", str(tmp_path / "site2"), "--find-links", url, "-r", url + "requirements.txt"], capture_output=True, text=True, env=env, timeout=120)
        assert again.returncode != 0 and "HASHES" in again.stderr
    finally:
        bundleserver.stop_all()


# ------------------------------------------------------- issue 30 item 3: the engine environment


def _tree_copy(tmp_path: Path) -> Path:
    """A copy of the source pdkit's wheels are built from (pyproject and pdkit/), to edit."""
    import shutil

    root = tmp_path / "src"
    shutil.copytree(wheelhouse.REPO / "pdkit", root / "pdkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(wheelhouse.REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_sim_engine_wheel_changes_with_the_sims_sources_only(tmp_path, cache):
    """The sim engine's environment is identified by what the sim runs: an edit to pdkit/bench/record.py
    (a module no engine runs) builds the same wheel byte for byte, so the engine bundle and the
    engines stay; an edit to pdkit/sim/, or to a module the sim imports, builds a new one."""
    root = _tree_copy(tmp_path)
    sources = wheelhouse.sim_sources(root)
    assert "pdkit/sim/engine.py" in sources and "pdkit/upstream/catalogue.py" in sources and "pdkit/upstream/data/metric_catalogue.json" in sources
    assert not {"pdkit/bench/record.py", "pdkit/agent/exporter/__init__.py", "pdkit/agent/health.py", "pdkit/spec/__init__.py"} & set(sources)
    first = wheelhouse.sim_wheel(root)
    digest = wheelhouse.file_sha256(first)

    (root / "pdkit" / "bench" / "record.py").write_text((root / "pdkit" / "bench" / "record.py").read_text() + "\n# a pdkit-only change\n")
    assert wheelhouse.sim_wheel(root) == first
    # built afresh (another control machine, an empty cache): the same bytes
    first.unlink()
    assert wheelhouse.file_sha256(wheelhouse.sim_wheel(root)) == digest

    for edited in ("pdkit/sim/engine.py", "pdkit/upstream/catalogue.py"):
        path = root / edited
        before = path.read_text()
        path.write_text(before + "\n# a change the sim runs\n")
        assert wheelhouse.sim_wheel(root) != first, edited
        path.write_text(before)
    assert wheelhouse.sim_wheel(root) == first


def test_the_sim_runs_from_its_wheel_alone(tmp_path, cache):
    """The closure is complete: pip installs the sim's wheel (hash-checked, as a node does) and
    `python -m pdkit.sim` serves /health and its /metrics from it, with none of pdkit's other
    modules there (the site-packages beside it give only aiohttp and prometheus_client, the node pins)."""
    wheel = wheelhouse.sim_wheel()
    name, version, _, _ = parse_wheel_filename(wheel.name)
    req = tmp_path / "requirements.txt"
    req.write_text(wheelhouse.hashed_requirement(str(name), str(version), wheel) + "\n")
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--no-deps", "--require-hashes",
           "--target", str(target), "--find-links", str(wheel.parent), "-r", str(req)]
    proc = subprocess.run(pip, capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import aiohttp

    # -S: no .pth files, so the test venv's editable pdkit cannot lend its modules; its
    # site-packages (after the target) give the third-party pins only. cwd away from the
    # repository: `python -m` puts the current directory first on sys.path
    env = {**os.environ, "PYTHONPATH": f"{target}:{Path(aiohttp.__file__).parent.parent}"}
    python = [sys.executable, "-S"]
    alone = subprocess.run([*python, "-c", "import pdkit, importlib.util as u; print(pdkit.__file__); print(u.find_spec('pdkit.bench'))"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert alone.stdout.split() == [str(target / "pdkit" / "__init__.py"), "None"], alone.stdout + alone.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen([*python, "-m", "pdkit.sim", "--model-path", "m", "--port", str(port), "--enable-metrics"],
                           env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert sim.poll() is None, sim.stderr.read()[-3000:]
            time.sleep(0.1)
        else:
            pytest.fail("the sim from its wheel never became healthy")
        assert "sglang:num_running_reqs" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        sim.terminate()
        sim.wait(timeout=30)
