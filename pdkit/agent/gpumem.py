"""Wait, before an engine on shared GPUs starts, until its GPUs have the free memory its fraction assumes.

Engines sharing a GPU (`pdkit_node.engines[].gpu_share`) start one after another, each with a
--mem-fraction-static of the memory it finds free (pdkit.spec.shared_gpu_mem_fraction): engine k
counts on about total x (1 - the earlier engines' shares). SGLang sizes its static pool against
what is free when it starts, so an engine started while memory is still held (the previous
process of the same unit not yet gone, whose CUDA memory can outlive its cgroup) serves with a
fraction of its pool: on the lent H200 a decode restarted alone found 2.87 GB and allocated
7,452 KV tokens instead of 531,636 (docs/gpu.md). The unit's ExecStartPre runs

    python -m pdkit.gpumem wait --gpus 0 --assumes 0.6 --margin-mib 4096 --timeout 120 --unit NAME

which polls `nvidia-smi` until every GPU has at least `total x base x assumes - margin` MiB free,
then exits 0; past the bound it exits 1 with the GPU, the free and the needed MiB in the journal,
so that the start fails and the gate reports it. `base` (1 unless the engine's environment sets
PDKIT_GPU_FREE_BASE) is the part of each GPU this host's engines count on: less than 1 where
engines of another host share the GPU (inventories/h200-nspawn-pair.py).

Standard library only: it runs from the node venv before the engine.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

# what the waiter asks nvidia-smi (memory in MiB, no units)
SMI_QUERY = ["--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"]
# the environment variable of an engine whose host shares its GPUs with another host's engines
BASE_ENV = "PDKIT_GPU_FREE_BASE"
# exit codes: 0 go; 1 the bound passed (the start fails); 2 a usage or environment problem
# a waiting line in the journal at first, then this often (free memory moves by a few MiB every poll)
LOG_EVERY_S = 10.0
EXIT_TIMEOUT, EXIT_ERROR = 1, 2


@dataclass(frozen=True)
class GpuMemory:
    index: int
    name: str
    total_mib: int
    free_mib: int


class GpuMemError(Exception):
    """nvidia-smi's output or the arguments cannot be used; the message says what and what is valid."""


def parse_smi(text: str) -> dict[int, GpuMemory]:
    """`nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader,nounits` by index."""
    gpus: dict[int, GpuMemory] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise GpuMemError(f"nvidia-smi printed {line.strip()!r}: expected 4 fields (index, name, memory.total MiB, "
                              "memory.free MiB)")
        index, name, total, free = fields
        try:
            gpus[int(index)] = GpuMemory(int(index), name, int(total), int(free))
        except ValueError:
            raise GpuMemError(f"nvidia-smi printed {line.strip()!r}: index, memory.total and memory.free must be "
                              "integers (MiB, --format=csv,noheader,nounits)") from None
    return gpus


def needed_mib(total_mib: int, assumes: float, base: float, margin_mib: int) -> int:
    """The free MiB an engine's fraction assumes on a GPU of TOTAL_MIB, less the margin, never below 0."""
    return max(0, math.floor(total_mib * base * assumes) - margin_mib)


def shortfalls(gpus: dict[int, GpuMemory], wanted: list[int], assumes: float, base: float,
               margin_mib: int) -> list[str]:
    """One line per wanted GPU without the free memory needed ([] = go); a GPU nvidia-smi lacks is an error."""
    missing = [i for i in wanted if i not in gpus]
    if missing:
        raise GpuMemError(f"nvidia-smi lists GPU(s) {sorted(gpus)}, not {missing}: the engine's GPUs "
                          "(pdkit_node.engines[].gpus) must be indices nvidia-smi shows")
    lines = []
    for i in wanted:
        g = gpus[i]
        need = needed_mib(g.total_mib, assumes, base, margin_mib)
        if g.free_mib < need:
            lines.append(f"GPU {i} ({g.name}): {g.free_mib} MiB free, {need} MiB needed "
                         f"({g.total_mib} MiB x {base:g} x {assumes:g} - {margin_mib} MiB margin)")
    return lines


def decide(short: list[str], waited_s: float, timeout_s: float) -> str:
    """go (enough memory), wait (not yet, time left) or fail (not by the bound)."""
    if not short:
        return "go"
    return "fail" if waited_s >= timeout_s else "wait"


def base_from_env(environ: dict[str, str]) -> float:
    """PDKIT_GPU_FREE_BASE: the part of each GPU this host's engines count on, (0, 1]; 1 when unset."""
    raw = environ.get(BASE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise GpuMemError(f"{BASE_ENV}={raw!r}: give the part of each GPU this host's engines count on, "
                          "a number in (0, 1] (e.g. 0.5 where another host's engines hold the other half)")
    return value


def read_smi(smi: str) -> str:
    proc = subprocess.run([smi, *SMI_QUERY], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise GpuMemError(f"{smi} {' '.join(SMI_QUERY)} failed (exit {proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()[:300]}")
    return proc.stdout


def wait(args: argparse.Namespace, read: Callable[[str], str] = read_smi, sleep: Callable[[float], object] = time.sleep,
         clock: Callable[[], float] = time.monotonic, log: Callable[[str], object] = print) -> int:
    """Poll until go or fail; the exit code (0 go, 1 the bound passed)."""
    wanted = [int(g) for g in args.gpus.split(",") if g.strip()]
    base = base_from_env(dict(os.environ)) if args.base is None else args.base
    smi = args.nvidia_smi or shutil.which("nvidia-smi")
    if not smi:
        raise GpuMemError("nvidia-smi is not on PATH: the wait for free GPU memory needs it (pdkit renders this "
                          "ExecStartPre only on gpu: nvidia nodes)")
    start = clock()
    said = None  # when the last waiting line was logged: once at first, then every LOG_EVERY_S
    while True:
        short = shortfalls(parse_smi(read(smi)), wanted, args.assumes, base, args.margin_mib)
        waited = clock() - start
        verdict = decide(short, waited, args.timeout)
        if verdict == "go":
            if said is not None:
                log(f"pdkit.gpumem: {args.unit}: GPU memory free after {waited:.1f} s, starting")
            return 0
        if verdict == "fail":
            log(f"pdkit.gpumem: {args.unit}: NOT STARTING after {waited:.0f} s: " + "; ".join(short)
                + ": the memory is still held (nvidia-smi --query-compute-apps=pid,used_memory names by whom); "
                "started now the engine would size its pool to what is left")
            return EXIT_TIMEOUT
        if said is None or waited - said >= LOG_EVERY_S:
            log(f"pdkit.gpumem: {args.unit}: waiting up to {args.timeout:.0f} s for GPU memory: " + "; ".join(short))
            said = waited
        sleep(args.interval)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdkit.gpumem", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wait", help="wait until the GPUs have the free memory the engine's fraction assumes")
    w.add_argument("--gpus", required=True, help="the engine's GPU indices, comma-separated (nvidia-smi's numbers)")
    w.add_argument("--assumes", type=float, required=True,
                   help="the part of the GPU the engine counts on finding free: 1 - the earlier engines' shares")
    w.add_argument("--margin-mib", type=int, default=0, help="what the earlier engines hold beyond their shares")
    w.add_argument("--timeout", type=float, required=True, help="seconds before the start fails")
    w.add_argument("--interval", type=float, default=1.0)
    w.add_argument("--unit", default="engine", help="the unit's name, for the journal")
    w.add_argument("--base", type=float, default=None, help=f"overrides {BASE_ENV}")
    w.add_argument("--nvidia-smi", default=None, help="the nvidia-smi to run (default: the one on PATH)")
    args = ap.parse_args(argv)
    if not 0 < args.assumes <= 1:
        print(f"pdkit.gpumem: --assumes {args.assumes}: give a number in (0, 1]", file=sys.stderr)
        return EXIT_ERROR
    try:
        return wait(args, log=lambda m: print(m, flush=True))
    except (GpuMemError, OSError, subprocess.SubprocessError) as exc:
        print(f"pdkit.gpumem: {args.unit}: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
