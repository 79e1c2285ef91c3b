"""`pdkit doctor` and `pdkit bench` against the live GPU-tier stack, on the lent machine.

Run by gpu/device_driver.py inside a phase, while the rendered units serve. The machine has no
systemd and no SSH, so the spec comes as JSON (gpu/run_gpu_tier.py writes it from the inventory
with `model_dump_json(exclude_unset=True)`, which round-trips to the same plan) instead of
through pyinfra's inventory loader; everything else is pdkit's own code, unchanged:

    python gpu/pdkit_tools.py --spec gpu-payload/spec-base.json --out work/tools-base.json \
        --runs work/runs.jsonl --record --bench 1:16,16:128,64:256 --sglang-bench 16:128 --doctor --doctor-bench

--bench takes CONCURRENCY:REQUESTS pairs (C=1 needs fewer requests to take the same time).
Order: the benches (appended to --runs), then doctor, whose throughput check compares a fresh
C=16 run with the last one recorded in --runs for this cluster (--doctor-bench). Writes one JSON
object: {"bench": record, "sglang_bench": record, "doctor": [check, ...], "*_errors": [...]}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def local_driver() -> str:
    """The driver version as nvidia-smi reports it here (bench's SSH probe has no SSH to use)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown: {exc}"
    versions = sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})
    return ",".join(versions) if out.returncode == 0 and versions else f"unknown: nvidia-smi exit {out.returncode}"


def pairs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        c, n = item.split(":")
        out.append((int(c), int(n)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="ClusterSpec JSON")
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--doctor", action="store_true")
    ap.add_argument("--bench", type=pairs, default=[], help="CONCURRENCY:REQUESTS,...")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=32)
    ap.add_argument("--sglang-bench", type=pairs, default=[], help="CONCURRENCY:REQUESTS,... through sglang.benchmark.serving")
    ap.add_argument("--sglang-python", default=sys.executable)
    ap.add_argument("--tokenizer")
    ap.add_argument("--runs", required=True, help="runs.jsonl: the bench record is appended, doctor reads its C=16 reference")
    ap.add_argument("--record", action="store_true", help="append the pdkit bench record to --runs")
    ap.add_argument("--doctor-bench", action="store_true", help="doctor also runs a short C=16 bench against the reference")
    args = ap.parse_args(argv)

    from pdkit import bench, doctor
    from pdkit.spec import ClusterSpec

    spec = ClusterSpec.model_validate_json(Path(args.spec).read_text())
    driver = local_driver()
    result: dict = {"spec": args.spec, "label": args.label}

    def save() -> None:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))

    def stamp(record: dict) -> dict:
        for gpu in record["env"]["gpus"]:
            gpu["driver"] = driver
        return record

    def per_level(key: str, levels: list[tuple[int, int]], run_one) -> dict | None:
        """One record whose levels come from one run per (concurrency, requests); failures are listed."""
        record = None
        for i, (c, n) in enumerate(levels):
            try:
                one = run_one(i, c, n)
            except Exception as exc:  # noqa: BLE001 - the other levels still measure
                result.setdefault(f"{key}_errors", []).append(f"C={c}: {type(exc).__name__}: {exc}")
                continue
            if record is None:
                record = stamp(one)
            else:
                record["levels"].extend(one["levels"])
            print(f"{key} C={c}: {json.dumps(one['levels'][-1], default=str)[:400]}", flush=True)
        result[key] = record
        save()
        return record

    if args.bench:
        record = per_level("bench", args.bench, lambda i, c, n: bench.run_bench(
            spec, concurrency=[c], input_len=args.input_len, output_len=args.output_len, requests=n,
            warmup=args.warmup if i == 0 else 0, label=args.label, probe_drivers=False, progress=False))
        if record is not None and args.record:
            bench.append_run(args.runs, record)  # doctor's throughput reference

    if args.sglang_bench:
        per_level("sglang_bench", args.sglang_bench, lambda i, c, n: bench.run_sglang_bench(
            spec, concurrency=[c], input_len=args.input_len, output_len=args.output_len, requests=n, warmup=1,
            label=args.label, python=args.sglang_python, tokenizer=args.tokenizer, probe_drivers=False, timeout_s=300))

    if args.doctor:
        t = time.monotonic()
        try:
            checks = doctor.run_doctor(spec, bench=args.doctor_bench, runs_path=Path(args.runs), progress=lambda m: print(f"doctor: {m}", file=sys.stderr, flush=True))
            result["doctor"] = [asdict(c) for c in checks]
            print(doctor.render_table(checks), flush=True)
        except Exception as exc:  # noqa: BLE001 - keep going: the bench still measures
            result["doctor"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        result["doctor_s"] = round(time.monotonic() - t, 1)
        save()

    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
