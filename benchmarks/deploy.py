"""Time the main job on the lab: first converge on fresh hosts (wheelhouse warm) and the no-op re-run.

    sudo .venv/bin/python benchmarks/deploy.py [--hosts 3] [--reruns 3] [--keep]

Target: the no-op re-run takes <= 5 s for 3 GPU hosts + the monitoring host. It recreates the
lab (so the first converge really starts from bare hosts), builds the wheelhouse first (so the
figure is the deploy, not PyPI), and prints every figure for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TARGET_NOOP_S = 5.0


def timed(cmd: list[str], timeout: int = 1200) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - start, proc


def deploy() -> tuple[float, dict]:
    seconds, proc = timed([str(BIN / "pyinfra"), "inventories/lab.py", "deploy/pd.py", "-y", "--json"])
    if proc.returncode != 0:
        sys.exit(f"deploy failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout)


def changed_ops(results: dict) -> int:
    return sum(1 for op in results["results"]["operations"] if op.get("success"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, help="GPU hosts (plus the monitoring host)")
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="reuse the running lab instead of recreating it")
    args = parser.parse_args()
    pdkit = str(BIN / "pdkit")

    if not args.keep:
        subprocess.run([pdkit, "lab", "down"], cwd=REPO, capture_output=True, timeout=300)
        up_s, proc = timed([pdkit, "lab", "up", "--hosts", str(args.hosts)])
        if proc.returncode != 0:
            sys.exit(f"lab up failed:\n{proc.stderr[-2000:]}")
        print(f"lab up (rootfs cached): {up_s:.1f} s")
    wh_s, proc = timed([str(BIN / "python"), "-m", "pdkit.wheelhouse", "--python", "3.11"])
    if proc.returncode != 0:
        sys.exit(f"wheelhouse build failed:\n{proc.stderr[-2000:]}")
    print(f"wheelhouse (warm cache check): {wh_s:.1f} s")

    first_s, results = deploy()
    label = "first converge on fresh hosts" if not args.keep else "converge on the running lab"
    print(f"{label}: {first_s:.1f} s ({changed_ops(results)} operations changed something)")

    noop = []
    for _ in range(args.reruns):
        seconds, results = deploy()
        if changed_ops(results):
            sys.exit(f"a re-run changed {changed_ops(results)} operations: not a no-op")
        noop.append(seconds)
    med = statistics.median(noop)
    print(f"no-op re-run: median {med:.2f} s (runs: {', '.join(f'{s:.2f}' for s in noop)}), 0 operations changed")
    print(f"target no-op <= {TARGET_NOOP_S:.0f} s for {args.hosts} GPU hosts + monitoring: {'MET' if med <= TARGET_NOOP_S else 'MISSED'}")
    return 0 if med <= TARGET_NOOP_S else 1


if __name__ == "__main__":
    sys.exit(main())
