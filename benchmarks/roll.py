"""The kit's own overhead per node in `pdkit roll`: the node's total time minus its engines' restart-to-ready.

    sudo PDKIT_LAB_DIR=... PDKIT_LAB_SUBNET=... .venv/bin/python benchmarks/roll.py [--rounds 2]

Needs a running lab converged on inventories/lab.py (`pdkit lab up && pyinfra inventories/lab.py
deploy/pd.py -y`). Each round rolls a config change across every lab host (decode
cuda_graph_max_bs 64 -> 96: the decode unit, exporter.json and release.json change, the decode
engine and the exporter restart) and then rolls inventories/lab.py back, each with
`pdkit roll --report`. Prints, per node and roll: total, engines' restart-to-ready (from the
node's own clock: the unit leaving `active` to the readiness log line), the kit's overhead and
each step's time. Target: overhead <= 2 s per node. The lab ends on inventories/lab.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PDKIT = str(Path(sys.executable).parent / "pdkit")
TARGET_OVERHEAD_S = 2.0
BASE = "inventories/lab.py"


def changed_inventory(directory: Path) -> Path:
    path = directory / "lab_roll_bench.py"
    path.write_text(
        "import copy, runpy\n"
        f"_base = runpy.run_path({str(REPO / BASE)!r})\n"
        "gpu_nodes = _base['gpu_nodes']\n"
        "monitoring = _base['monitoring']\n"
        "_hosts, _data = _base['all']\n"
        "_cluster = copy.deepcopy(_data['pdkit_cluster'])\n"
        "_cluster['tuning']['decode']['cuda_graph_max_bs'] = 96\n"
        "all = (_hosts, {'pdkit_cluster': _cluster})\n"
    )
    return path


def roll(inventory: str, report: Path) -> list[dict]:
    proc = subprocess.run([PDKIT, "roll", inventory, "--report", str(report)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"pdkit roll {inventory} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return json.loads(report.read_text())["nodes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="change + roll back pairs")
    args = parser.parse_args()
    rows: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        changed = str(changed_inventory(Path(tmp)))
        for i in range(args.rounds):
            for label, inventory in (("change", changed), ("back", BASE)):
                for node in roll(inventory, Path(tmp) / f"report-{i}-{label}.json"):
                    rows.append((f"{label} {i + 1}", node))
    print(f"{'roll':<9} {'node':<10} {'total':>7} {'engines':>8} {'overhead':>9}  steps (s)")
    for label, n in rows:
        steps = " ".join(f"{k} {v:.1f}" for k, v in n["steps"].items())
        print(f"{label:<9} {n['host']:<10} {n['total_s']:7.1f} {n['engines_restart_to_ready_s']:8.1f} {n['overhead_s']:9.1f}  {steps}")
    gpu = [n for _, n in rows if n["engines_restart_to_ready_s"] > 0]
    if not gpu:
        print("no engine restarted: nothing to measure")
        return 1
    overheads = [n["overhead_s"] for n in gpu]
    print(f"\nkit overhead per GPU node: median {statistics.median(overheads):.1f} s, max {max(overheads):.1f} s over {len(gpu)} node rolls "
          f"(engines' restart-to-ready median {statistics.median(n['engines_restart_to_ready_s'] for n in gpu):.1f} s)")
    steps = sorted({k for n in gpu for k in n["steps"]})
    print("median per step: " + ", ".join(f"{k} {statistics.median(n['steps'].get(k, 0) for n in gpu):.1f} s" for k in steps))
    met = max(overheads) <= TARGET_OVERHEAD_S
    print(f"target <= {TARGET_OVERHEAD_S:.0f} s per node: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
