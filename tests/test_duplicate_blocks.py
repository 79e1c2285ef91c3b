"""benchmarks/duplicate_blocks.py (issue 48 item 5): the count CI's lint phase holds to `--max`, run on a tiny git
tree made here, so that the script can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "duplicate_blocks.py"

SHARED_7 = [f"total_{i} = compute({i}, scale={i * 3})" for i in range(7)]
SHARED_5 = [f"other_{i} = measure({i}, window={i + 10})" for i in range(5)]


def _file(name: str, body: list[str]) -> str:
    # each file's own lines around the shared ones, so that no run grows past them
    return "\n".join([f"# {name}", "import os", "", f"def {name}_head():", f"    return '{name}'", "",
                      *body, "", f"{name}_tail = os.sep + '{name}'", ""])


def _tree(tmp_path: Path) -> Path:
    files = {
        "a.py": _file("a", [*SHARED_7, "a_between = 1", *SHARED_5]),
        "b.py": _file("b", SHARED_7),  # 7 lines as a.py's: one pair
        "c.py": _file("c", SHARED_5),  # only 5 lines as a.py's: not a pair
        "tests/test_a.py": _file("t", SHARED_7),  # under tests/: not counted
        "untracked.py": _file("u", SHARED_7),  # git does not track it: not read
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "a.py", "b.py", "c.py", "tests/test_a.py"], cwd=tmp_path, check=True)
    return tmp_path


def _run(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--repo", str(tree), *args], capture_output=True, text=True,
                          timeout=60)


def test_two_files_sharing_seven_lines_are_one_pair_and_five_lines_are_none(tmp_path):
    proc = _run(_tree(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "duplicate blocks: 1 pairs (>= 6 identical lines, outside tests/)", proc.stdout
    assert len(lines) == 2 and "7 lines" in lines[0] and "a.py:" in lines[0] and "b.py:" in lines[0], proc.stdout


def test_max_fails_the_run_only_above_it(tmp_path):
    tree = _tree(tmp_path)
    assert _run(tree, "--max", "1").returncode == 0
    over = _run(tree, "--max", "0")
    assert over.returncode == 1 and "more than --max 0" in over.stderr, over.stdout + over.stderr
