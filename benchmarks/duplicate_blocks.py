"""Count the duplicated blocks of the repository's code outside tests/ (issue 48 item 5).

    python benchmarks/duplicate_blocks.py [--max N] [--min-lines 6] [--repo DIR]

Standard library only (CI machines have no duplicate finder). For each .py and .sh file git tracks outside
tests/, it drops blank lines, comment-only lines and import lines and folds white space; a duplicated block is
a maximal run of MIN_LINES (6) or more such lines that stands, to the letter, in two places: two files, or two
places of one file that do not overlap. Runs of the same two files that overlap or touch (at most one other
line between them on each side) are one pair. It prints one line a pair, most lines first, then
`duplicate blocks: N pairs (>= 6 identical lines, outside tests/)`, and exits 0; with --max N it exits 1 where
there are more than N pairs (CI's lint phase, .ci/run).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".sh")
IMPORT = re.compile(r"(import|from)\s+[\w.]+(\s|$)")


def tracked_files(repo: Path) -> list[str]:
    """The .py and .sh files git tracks under REPO, outside tests/, that are there to read."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, check=True, capture_output=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    return sorted(n for n in names
                  if n.endswith(SUFFIXES) and not n.startswith("tests/") and (repo / n).is_file())


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, folded text) of each line that counts: not blank, not only a comment, not an import
    (a parenthesised import's continuation lines neither)."""
    kept: list[tuple[int, str]] = []
    in_import = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = " ".join(raw.split())
        if in_import:
            in_import = ")" not in line
            continue
        if not line or line.startswith("#"):
            continue
        if IMPORT.match(line) and (line.startswith("import ") or " import " in line):
            in_import = line.endswith("(")
            continue
        kept.append((number, line))
    return kept


def find_pairs(files: dict[str, list[tuple[int, str]]], min_lines: int) -> list[tuple[int, str, str]]:
    """(lines, place, place) per duplicated block, most lines first."""
    windows: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for name, lines in files.items():
        texts = [t for _, t in lines]
        for i in range(len(texts) - min_lines + 1):
            windows[tuple(texts[i:i + min_lines])].append((name, i))
    # every pair of places that share a window, by (file, file, offset): its windows' starts
    starts: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for places in windows.values():
        if len(places) < 2:
            continue
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (fa, ia), (fb, ib) = places[a], places[b]
                if fa == fb and ib - ia < min_lines:
                    continue  # one place of one file, or two that overlap
                starts[(fa, fb, ib - ia)].append(ia)
    # maximal runs: consecutive window starts at one offset; [start, end) in each file's kept lines
    runs: dict[tuple[str, str], list[tuple[int, int, int, int]]] = defaultdict(list)
    for (fa, fb, delta), found in starts.items():
        found.sort()
        first = 0
        for k in range(1, len(found) + 1):
            if k < len(found) and found[k] == found[k - 1] + 1:
                continue
            start = found[first]
            length = found[k - 1] - start + min_lines
            if fa == fb:
                length = min(length, delta)  # two places of one file must not overlap
            runs[(fa, fb)].append((start, start + length, start + delta, start + delta + length))
            first = k
    pairs: list[tuple[int, str, str]] = []
    for (fa, fb), found_runs in runs.items():
        for a0, a1, b0, b1 in merge_near(found_runs):
            if fa == fb:
                a1 = min(a1, b0)  # runs merged at several offsets of a repetitive stretch: the places must not overlap
            la, lb = files[fa], files[fb]
            pairs.append((min(a1 - a0, b1 - b0), f"{fa}:{la[a0][0]}-{la[a1 - 1][0]}",
                          f"{fb}:{lb[b0][0]}-{lb[b1 - 1][0]}"))
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    return pairs


def merge_near(runs: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Runs of one pair of files that overlap or touch on both sides (at most one line apart), as one."""
    merged = sorted(runs)
    while True:
        for x in range(len(merged)):
            for y in range(x + 1, len(merged)):
                m, n = merged[x], merged[y]
                if n[0] <= m[1] + 1 and m[0] <= n[1] + 1 and n[2] <= m[3] + 1 and m[2] <= n[3] + 1:
                    merged[x] = (min(m[0], n[0]), max(m[1], n[1]), min(m[2], n[2]), max(m[3], n[3]))
                    del merged[y]
                    break
            else:
                continue
            break
        else:
            return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=None, help="exit 1 where there are more pairs than this")
    ap.add_argument("--min-lines", type=int, default=6, help="how many identical lines make a block (6)")
    ap.add_argument("--repo", type=Path, default=REPO, help="the git checkout to read (this one)")
    args = ap.parse_args(argv)
    files = {}
    for name in tracked_files(args.repo):
        text = (args.repo / name).read_text(encoding="utf-8", errors="replace")
        files[name] = code_lines(text)
    pairs = find_pairs(files, args.min_lines)
    for lines, a, b in pairs:
        print(f"{lines:4d} lines  {a} ~ {b}")
    print(f"duplicate blocks: {len(pairs)} pairs (>= {args.min_lines} identical lines, outside tests/)")
    if args.max is not None and len(pairs) > args.max:
        print(f"duplicate blocks: {len(pairs)} is more than --max {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
