"""What the graded answer gate (pdkit/clients/answers.py, docs/correctness.md) costs a `pdkit tune` candidate
on the lab, against the candidate's bench time. Target (issue 44 item 7): the default gate at most
20% of a candidate's bench time.

    .venv/bin/pdkit lab up --hosts 1
    .venv/bin/python benchmarks/answer_gate_cost.py [--candidates 3]

Needs a running lab of one host or more. Converges it on inventories/lab-one-node.py (not measured),
then runs the shipped campaign docs/tune/lab-one-node.yaml as it is (workload, bench, gate
defaults: lengths 1024/8192/32768 capped at the lab's 8192, load 8) with its first N candidates,
its records in a temporary folder, the baseline kept. Prints per candidate the gate's seconds
(correctness: short answers, forced scores, loaded scores), the bench's seconds and their ratio,
then the ratio's mean and spread over the candidates. The sim's figures are rehearsal figures
(docs/sim.md): the ratio, not the seconds, is the claim, and only for the lab.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PDKIT = str(Path(sys.executable).parent / "pdkit")
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
ONE = "inventories/lab-one-node.py"
CAMPAIGN = REPO / "docs" / "tune" / "lab-one-node.yaml"
TARGET_RATIO = 0.20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=3, help="the shipped campaign's first N candidates")
    args = parser.parse_args()
    converge = subprocess.run([PYINFRA, ONE, "deploy/pd.py", "-y"], cwd=REPO, capture_output=True, text=True)
    if converge.returncode:
        print(converge.stderr[-3000:], file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        campaign = yaml.safe_load(CAMPAIGN.read_text())
        campaign.update(out_dir=f"{tmp}/out", state_dir=f"{tmp}/state", keep="baseline",
                        candidates=campaign["candidates"][:args.candidates])
        path = Path(tmp) / "campaign.yaml"
        path.write_text(yaml.safe_dump(campaign, sort_keys=False))
        print(f"pdkit tune {ONE} (docs/tune/lab-one-node.yaml, first {args.candidates} candidate(s)) ...", flush=True)
        run = subprocess.run([PDKIT, "tune", ONE, str(path)], cwd=REPO, capture_output=True, text=True)
        if run.returncode:
            print(run.stdout[-4000:] + run.stderr[-2000:], file=sys.stderr)
            return 1
        records = [json.loads(line) for line in (Path(tmp) / "out" / f"{campaign['name']}.jsonl").read_text().splitlines()
                   if line.strip()]
    ratios = []
    print(f"\n{'run':<16} {'short+forced+loaded s':>22} {'forced s':>9} {'loaded s':>9} {'bench s':>8} {'ratio':>7}")
    for r in records:
        if r.get("kind") not in ("baseline", "candidate") or r.get("verdict") != "pass":
            continue
        t = r["timings"]
        gate, bench = t.get("correctness_s", 0.0), t.get("bench_s", 0.0)
        ratio = gate / bench if bench else float("nan")
        if r["kind"] == "candidate":
            ratios.append(ratio)
        extra = f"  (+ {t['forced_record_s']:.1f} s recording the baseline's continuations, once)" \
            if "forced_record_s" in t else ""
        print(f"{r['candidate']:<16} {gate:>22.2f} {t.get('forced_s', 0):>9.2f} {t.get('loaded_s', 0):>9.2f} "
              f"{bench:>8.2f} {ratio:>7.1%}{extra}")
    if not ratios:
        print("no candidate passed: nothing to compare", file=sys.stderr)
        return 1
    spread = (max(ratios) - min(ratios)) if len(ratios) > 1 else 0.0
    print(f"\ngate / bench over {len(ratios)} candidate(s): mean {statistics.mean(ratios):.1%}, "
          f"min {min(ratios):.1%}, max {max(ratios):.1%} (spread {spread:.1%}); target <= {TARGET_RATIO:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
