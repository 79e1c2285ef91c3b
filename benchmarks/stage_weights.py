"""Staging speed on the lab (issue 47 item 7): `pdkit stage` of a generated model to a lab host over real SSH.

    sudo python benchmarks/stage_weights.py [--host lab-gpu1] [--mb 512] [--shards 4] [--runs 3]

Needs a running lab (`pdkit lab up`; take /tmp/pdkit-lab.lock when others share the machine). Generates
a model of MB megabytes of random bytes (seed 47) in SHARDS safetensors-named shards plus config.json,
writes its manifest once (SGLang's format, timed apart: hashing on this machine), then RUNS times stages it
from scratch to a model path of its own on HOST (the version and any transfer in progress removed
between runs) and once more with everything present (the no-op: every shard hashed on the node and
skipped). Prints MB/s per run (sent bytes over the command's wall time: connect, transfer, the node's
hashing while it writes, the read-back verification, the rename) and the spread (min, median, max,
max/min - 1) over the runs. The lab guests run on this machine's CPU: SSH encryption on both ends and
SHA-256 on both share the same cores.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdkit import lab as pdlab  # noqa: E402 - the repository on the path first
from pdkit.agent import weightstore as store  # noqa: E402
from tests.lab.test_stage_lab import generated_model, inventory  # noqa: E402

PARENT, MODEL = "/srv/pdkit-stage-lab", "/srv/pdkit-stage-lab/m"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=None, help="lab host (default: the first GPU host)")
    parser.add_argument("--mb", type=int, default=512, help="model size in MB (default 512)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    info = pdlab.load_lab()
    if info is None:
        print("no lab is up: `sudo pdkit lab up` first", file=sys.stderr)
        return 2
    host = args.host or info.gpu_hosts[0].name
    pdkit = str(Path(sys.executable).parent / "pdkit")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        src = tmp_path / "model"
        generated_model(src, seed=47, shards=args.shards, shard_mb=args.mb // args.shards)
        total = sum(p.stat().st_size for p in src.iterdir())
        t0 = time.monotonic()
        manifest = store.generate(str(src))
        hash_s = time.monotonic() - t0
        (tmp_path / "m.json").write_bytes(store.manifest_bytes(manifest))
        inv = inventory(tmp_path, host)
        print(f"model: {total / 1e6:.0f} MB in {args.shards} shards; manifest (SHA-256 on this machine) "
              f"{hash_s:.1f} s ({total / hash_s / 1e6:.0f} MB/s)")
        rates = []
        for run in range(args.runs + 1):
            noop = run == args.runs
            if not noop:
                pdlab.ssh_run(info, host, f"rm -rf {PARENT} && mkdir -p {PARENT}", timeout=120)
            t0 = time.monotonic()
            done = subprocess.run([pdkit, "stage", inv, "--source", str(src), "--manifest", str(tmp_path / "m.json")],
                                  cwd=REPO, capture_output=True, text=True, timeout=1800)
            took = time.monotonic() - t0
            if done.returncode != 0:
                print(done.stdout + done.stderr, file=sys.stderr)
                return 1
            sent = float(re.search(r"verified, ([\d.,]+) MB sent", done.stdout).group(1).replace(",", "")) * 1e6
            if noop:
                print(f"no-op re-run (every shard present: hashed on the node and skipped): {took:.1f} s")
            else:
                rates.append(sent / took / 1e6)
                print(f"run {run + 1}: {sent / 1e6:.0f} MB in {took:.1f} s = {rates[-1]:.1f} MB/s")
        pdlab.ssh_run(info, host, f"rm -rf {PARENT}", timeout=120)
    lo, hi = min(rates), max(rates)
    print(f"staging speed over {len(rates)} runs: min {lo:.1f}, median {statistics.median(rates):.1f}, "
          f"max {hi:.1f} MB/s; spread (max/min - 1) {100 * (hi / lo - 1):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
