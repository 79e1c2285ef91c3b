"""The kit's own overhead per node in `pdkit roll`: the node's total time minus its engines' restart-to-ready.

    sudo PDKIT_LAB_DIR=... PDKIT_LAB_SUBNET=... .venv/bin/python benchmarks/roll.py [--rounds 2]

Needs a running lab (`pdkit lab up`); it first converges it on inventories/lab.py with
`pyinfra inventories/lab.py deploy/pd.py -y` (not measured), so that a pdkit source change's
new node venv is not installed inside a measured roll. Each round rolls a config change across every lab host (decode
cuda_graph_max_bs 64 -> 96: the decode unit, exporter.json and release.json change, the decode
engine and the exporter restart) and then rolls inventories/lab.py back, each with
`pdkit roll --report`. Prints, per node and roll: total, engines' restart-to-ready (from the
node's own clock: the unit leaving `active` to the readiness log line), the kit's overhead and
each step's time, and the median time of each operation inside `apply`. Target: overhead <= 2 s
per node. The lab ends on inventories/lab.py.

--engine-start-s S gives every sim engine an S-second start (PDKIT_SIM_STARTUP_DELAY_S), nearer
a real engine's 56-106 s: the overhead must not grow with it (the kit's steps do not wait on
the engine beyond its readiness). It costs one unmeasured roll onto that setting first and one
back to inventories/lab.py at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PDKIT = str(Path(sys.executable).parent / "pdkit")
TARGET_OVERHEAD_S = 2.0
BASE = "inventories/lab.py"


def lab_copy_lines(max_bs: int | None, edits: Sequence[str] = ()) -> list[str]:
    """The lines of an inventory made from inventories/lab.py that follow its `_base = runpy.run_path(lab.py)`
    (with `import copy`): lab.py's hosts and cluster, copied, with decode cuda_graph_max_bs MAX_BS (None:
    lab.py's), then EDITS (which may change gpu_nodes and _cluster), then the `all` group.
    benchmarks/scale.py's lab inventories end the same way."""
    lines = [
        "gpu_nodes = copy.deepcopy(_base['gpu_nodes'])",
        "monitoring = _base['monitoring']",
        "_hosts, _data = _base['all']",
        "_cluster = copy.deepcopy(_data['pdkit_cluster'])",
    ]
    if max_bs is not None:
        lines.append(f"_cluster['tuning']['decode']['cuda_graph_max_bs'] = {max_bs}")
    return [*lines, *edits, "all = (_hosts, {'pdkit_cluster': _cluster})  # noqa: A001 - pyinfra's group name"]


def lab_inventory(directory: Path, name: str, *, max_bs: int | None, engine_start_s: float | None) -> Path:
    """inventories/lab.py, with decode cuda_graph_max_bs MAX_BS and every engine's start delay set."""
    path = directory / f"{name}.py"
    start_delay = [] if engine_start_s is None else [
        "for _name, _host in gpu_nodes:",
        "    for _engine in _host['pdkit_node']['engines']:",
        f"        _engine['env'] = {{**_engine.get('env', {{}}), 'PDKIT_SIM_STARTUP_DELAY_S': {str(engine_start_s)!r}}}",
    ]
    lines = ["import copy, runpy", f"_base = runpy.run_path({str(REPO / BASE)!r})", *lab_copy_lines(max_bs, start_delay)]
    path.write_text("\n".join(lines) + "\n")
    return path


def roll(inventory: str, report: Path) -> list[dict]:
    proc = subprocess.run([PDKIT, "roll", inventory, "--report", str(report)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"pdkit roll {inventory} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return json.loads(report.read_text())["nodes"]


def converge() -> None:
    pyinfra = str(Path(sys.executable).parent / "pyinfra")
    proc = subprocess.run([pyinfra, BASE, "deploy/pd.py", "-y"], cwd=REPO, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"pyinfra {BASE} deploy/pd.py failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")


def venv_installs(node: dict) -> list[str]:
    """Operations of a roll that installed a venv: such a roll measures more than a config change."""
    return [op for op in node.get("apply_detail", {}) if op.startswith("Install") and "venv" in op]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="change + roll back pairs")
    parser.add_argument("--engine-start-s", type=float, help="give every sim engine this start-up time (default: the sim's own ~1 s)")
    args = parser.parse_args()
    rows: list[tuple[str, dict]] = []
    print(f"converging the lab on {BASE} (not measured) ...", flush=True)
    converge()
    with tempfile.TemporaryDirectory() as tmp:
        changed = str(lab_inventory(Path(tmp), "lab_roll_changed", max_bs=96, engine_start_s=args.engine_start_s))
        base = BASE if args.engine_start_s is None else str(lab_inventory(Path(tmp), "lab_roll_base", max_bs=None, engine_start_s=args.engine_start_s))
        if base != BASE:
            print(f"setting every engine's start-up to {args.engine_start_s:g} s (not measured) ...", flush=True)
            roll(base, Path(tmp) / "report-setup.json")
        for i in range(args.rounds):
            for label, inventory in (("change", changed), ("back", base)):
                print(f"{label} {i + 1}: pdkit roll ...", flush=True)
                for node in roll(inventory, Path(tmp) / f"report-{i}-{label}.json"):
                    rows.append((f"{label} {i + 1}", node))
        if base != BASE:
            print("back to inventories/lab.py (not measured) ...", flush=True)
            roll(BASE, Path(tmp) / "report-teardown.json")
    print(f"{'roll':<9} {'node':<10} {'total':>7} {'engines':>8} {'overhead':>9}  steps (s)")
    for label, n in rows:
        steps = " ".join(f"{k} {v:.1f}" for k, v in n["steps"].items())
        print(f"{label:<9} {n['host']:<10} {n['total_s']:7.1f} {n['engines_restart_to_ready_s']:8.1f} {n['overhead_s']:9.1f}  {steps}")
    with_engines = [n for _, n in rows if n.get("engines", 0) > 0]
    gpu = [n for n in with_engines if n["engines_restart_to_ready_s"] > 0]
    unmeasured = [n["host"] for n in with_engines if n["engines_restart_to_ready_s"] <= 0]
    if unmeasured:
        # a GPU node whose engine restart was not found in its journal: reported, never dropped quietly
        print(f"\n{len(unmeasured)} GPU-node roll(s) without a measured engine restart (left out of the figures): {', '.join(unmeasured)}")
    with_venv = [n["host"] for n in gpu if venv_installs(n)]
    if with_venv:
        print(f"\n{len(with_venv)} roll(s) also installed a venv (the source changed during the run?): {', '.join(with_venv)}")
    if not gpu:
        print("no engine restarted: nothing to measure")
        return 1
    overheads = [n["overhead_s"] for n in gpu]
    print(f"\nkit overhead per GPU node: median {statistics.median(overheads):.1f} s, max {max(overheads):.1f} s over {len(gpu)} node rolls "
          f"(engines' restart-to-ready median {statistics.median(n['engines_restart_to_ready_s'] for n in gpu):.1f} s)")
    steps = sorted({k for n in gpu for k in n["steps"]})
    print("median per step: " + ", ".join(f"{k} {statistics.median(n['steps'].get(k, 0) for n in gpu):.1f} s" for k in steps))
    detail = list(dict.fromkeys(k for n in gpu for k in n.get("apply_detail", {})))
    print("deploy (prepare beside the drain, then each operation inside apply), median (s): " + ", ".join(f"{k} {statistics.median(n['apply_detail'].get(k, 0) for n in gpu):.2f}" for k in detail))
    met = max(overheads) <= TARGET_OVERHEAD_S and not unmeasured and not with_venv
    print(f"target <= {TARGET_OVERHEAD_S:.0f} s per node: {'met' if met else 'NOT met' if not (unmeasured or with_venv) else 'not shown (see the rolls named above)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
