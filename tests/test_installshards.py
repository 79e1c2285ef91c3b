"""A big wheel bundle installs through several pip processes at once (pdkit/wheels/installshards.py):
the shares cover every package once, wheels that write the same file share a process, the shares
are balanced by size, and the node's command fails if any pip failed. The last test installs a
sharded bundle with real pip processes from pdkit's bundle server into one venv."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from pdkit.wheels import bundleserver, installshards, wheelhouse
from pdkit.wheels.installshards import (
    ShardError,
    all_at_once,
    balance,
    groups_sharing_files,
    installed_paths,
    requirement_entries,
    requirement_shards,
    shard_file_names,
)
from tests.test_wheelhouse import make_wheel

REQUIREMENTS = """# pdkit engine lock: every package of the engine venv, exact, with hashes. Do not edit:
# engine: sglang==0.5.17
alpha==1.0 \\
    --hash=sha256:aa \\
    --hash=sha256:ab
Beta_Pkg==2.0 --hash=sha256:bb
gamma==3.0 \\
    --hash=sha256:cc
"""


def wheel_with(directory: Path, name: str, files: dict[str, str], entry_points: str | None = None,
               padding: int = 0) -> Path:
    """A wheel holding FILES (path -> text), optional entry points, and PADDING bytes of data."""
    path = directory / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for file, text in files.items():
            zf.writestr(file, text)
        if padding:
            zf.writestr(f"{name}/pad.bin", bytes(range(256)) * (padding // 256 + 1))
        if entry_points is not None:
            zf.writestr(f"{info}/entry_points.txt", entry_points)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    return path


def test_requirement_entries_keep_each_package_with_its_hash_lines_and_the_comment_block_apart():
    head, entries = requirement_entries(REQUIREMENTS)
    assert head.splitlines() == ["# pdkit engine lock: every package of the engine venv, exact, with hashes. Do not edit:",
                                 "# engine: sglang==0.5.17"]
    assert list(entries) == ["alpha", "beta-pkg", "gamma"]
    assert entries["alpha"] == "alpha==1.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:ab\n"
    assert entries["beta-pkg"] == "Beta_Pkg==2.0 --hash=sha256:bb\n"
    # nothing lost, nothing doubled
    assert head + "".join(entries.values()) == REQUIREMENTS


def test_installed_paths_map_data_dirs_and_scripts_where_pip_puts_them(tmp_path):
    wheel = wheel_with(tmp_path, "tool", {
        "tool/__init__.py": "", "build_backend.py": "",
        "tool-1.0.data/purelib/tool_extra.py": "", "tool-1.0.data/scripts/run-tool": "",
        "tool-1.0.data/headers/tool.h": "",
    }, entry_points="[console_scripts]\nToolCli = tool:main\n[other]\nx = y\n")
    assert installed_paths(wheel) == {"tool/__init__.py", "build_backend.py", "tool_extra.py", "../bin/run-tool",
                                      "../headers/tool.h", "../bin/ToolCli"}


def test_packages_writing_the_same_file_or_script_share_a_group():
    groups = groups_sharing_files({
        "torch-c-dlpack-ext": {"build_backend.py", "torch_c_dlpack_ext/__init__.py"},
        "flashinfer-python": {"build_backend.py", "flashinfer/__init__.py", "../bin/flashinfer"},
        "other": {"../bin/flashinfer"},
        "alone": {"alone/__init__.py"},
        # a namespace directory shared without a shared file is no conflict
        "nvidia-a": {"nvidia/a/lib.so"}, "nvidia-b": {"nvidia/b/lib.so"},
    })
    assert sorted(sorted(g) for g in groups) == [["alone"], ["flashinfer-python", "other", "torch-c-dlpack-ext"],
                                                 ["nvidia-a"], ["nvidia-b"]]


def test_balance_puts_the_largest_group_first_into_the_lightest_share_and_drops_empty_shares():
    size = {"torch": 500, "cublas": 400, "cudnn": 300, "a": 100, "b": 100, "c": 100}
    shares = balance([{"torch"}, {"cublas"}, {"cudnn"}, {"a"}, {"b"}, {"c"}], size, 3)
    assert shares == [["torch"], ["b", "cublas"], ["a", "c", "cudnn"]]
    assert balance([{"a"}, {"b"}], size, 4) == [["a"], ["b"]]
    # the same input gives the same shares (a bundle's files are served and packed from them)
    assert balance([{"c"}, {"b"}, {"a"}], size, 2) == balance([{"a"}, {"b"}, {"c"}], size, 2)


def test_a_small_bundle_keeps_one_pip_and_a_big_one_covers_every_package_once(tmp_path):
    wheels = (wheel_with(tmp_path, "alpha", {"alpha.py": ""}, padding=3000),
              wheel_with(tmp_path, "Beta_Pkg", {"beta_pkg.py": ""}, padding=2000),
              wheel_with(tmp_path, "gamma", {"gamma.py": ""}, padding=1000))
    assert requirement_shards(REQUIREMENTS, wheels, shards=4, min_bytes=10**9) == ()
    assert requirement_shards(REQUIREMENTS, wheels, shards=1, min_bytes=0) == ()
    shards = requirement_shards(REQUIREMENTS, wheels, shards=2, min_bytes=0)
    assert len(shards) == 2
    head, entries = requirement_entries(REQUIREMENTS)
    seen = []
    for text in shards:
        assert text.startswith(head)
        seen += list(requirement_entries(text)[1])
    assert sorted(seen) == sorted(entries)


def test_requirements_and_wheels_that_disagree_are_an_error_naming_the_packages(tmp_path):
    wheels = (wheel_with(tmp_path, "alpha", {"alpha.py": ""}), wheel_with(tmp_path, "delta", {"delta.py": ""}))
    with pytest.raises(ShardError, match=r"requirements without a wheel: \['beta-pkg', 'gamma'\]; "
                                         r"wheels without a requirement: \['delta'\]"):
        requirement_shards(REQUIREMENTS, wheels, shards=2, min_bytes=0)


def test_all_at_once_runs_every_command_and_fails_if_any_failed(tmp_path):
    def run(commands):
        return subprocess.run(["sh", "-c", all_at_once(commands)], capture_output=True, text=True, timeout=60).returncode

    ok = [f"sleep 0.2 && touch {tmp_path}/{n}" for n in ("a", "b", "c")]
    assert run(ok) == 0 and {p.name for p in tmp_path.iterdir()} == {"a", "b", "c"}
    # a failure in the first does not stop the others, and the whole fails once all ended
    assert run(["exit 3", f"sleep 0.3 && touch {tmp_path}/d"]) != 0 and (tmp_path / "d").exists()
    assert run([f"touch {tmp_path}/e", "false"]) != 0


def test_shard_file_names():
    assert shard_file_names(2) == ["requirements-1-of-2.txt", "requirements-2-of-2.txt"]


def test_real_pips_install_a_sharded_bundle_from_the_bundle_server_into_one_venv(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(installshards, "SHARD_MIN_BYTES", 0)
    monkeypatch.setattr(installshards, "INSTALL_SHARDS", 3)
    names = ["alpha", "beta", "gamma", "delta", "epsilon"]
    wheels = [make_wheel(tmp_path, n, "1.0", body=f"NAME = {n!r}\n") for n in names]
    req = "# a test bundle\n" + "".join(wheelhouse.hashed_requirement(n, "1.0", w) + "\n" for n, w in zip(names, wheels))
    bundle = wheelhouse.make_bundle("engine", wheels, req)
    files = bundle.shard_files()
    assert list(files) == shard_file_names(3)
    # the SFTP path's tar carries the same files
    with tarfile.open(bundle.tarball()) as tar:
        assert [m.name for m in tar.getmembers()][:4] == ["requirements.txt", *shard_file_names(3)]
        assert tar.extractfile("requirements-2-of-3.txt").read().decode() == files["requirements-2-of-3.txt"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    url = bundleserver.serve(bundle, "127.0.0.1")
    try:
        pip = (f"{sys.executable} -m pip --python {venv}/bin/python install --quiet --disable-pip-version-check "
               f"--no-index --no-deps --require-hashes --no-warn-conflicts --find-links {url}")
        command = all_at_once([f"{pip} -r {url}{name}" for name in files])
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        found = subprocess.run([f"{venv}/bin/python", "-c", f"import {', '.join(names)}; print({', '.join(n + '.NAME' for n in names)})"],
                               capture_output=True, text=True, timeout=60)
        assert found.stdout.split() == names, found.stderr
        # one share that cannot install (a hash no wheel has) fails the whole command (a fresh venv:
        # pip would find the packages of the first install already there)
        monkeypatch.setitem(wheelhouse._SHARDS, bundle.digest, {**files, "requirements-1-of-3.txt": files["requirements-1-of-3.txt"].replace("sha256:", "sha256:0", 1)})
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv2")], check=True, timeout=120)
        pip = pip.replace(f"{venv}/bin/python", f"{tmp_path}/venv2/bin/python")
        broken = subprocess.run(["sh", "-c", all_at_once([f"{pip} -r {url}{name}" for name in files])],
                                capture_output=True, text=True, timeout=300)
        assert broken.returncode != 0 and "hash" in broken.stderr.lower(), broken.stderr
    finally:
        bundleserver.stop_all()
