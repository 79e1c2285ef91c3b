"""How much of a model's weight files the node's page cache holds, and reading the rest in.

A restart reads every weight file again: from the page cache that is a copy at memory speed,
from disk it is the outage's biggest part (a 122B FP8 model: 531 s cold from disk, 31 s with its
weights cached; docs/rolling.md "Weights from memory"). So before a planned restart the roll
measures the weights' residency (mincore(2) over a read-only mapping of each file) and, when
part of them is not cached, reads them in before the drain, while the node still serves.

On-node, standard library only (ctypes for mmap/mincore/munmap, as glibc exports them):

    python3 -m pdkit.residency /models/llama [--warm] [--evict]    # one JSON line
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import sys
import time
from pathlib import Path
from typing import Any

# the files SGLang's loaders read as weights (safetensors, PyTorch .bin/.pt, GGUF), not the tokenizer
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
PAGE = mmap.PAGESIZE
READ_CHUNK = 16 << 20  # bytes per read() when warming: large enough for readahead to stream

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc = libc
    return _libc


def model_dir_of(argv: tuple[str, ...] | list[str]) -> str | None:
    """The local model directory an engine with these SGLang flags reads its weights from: the value
    of --model-path (or its alias --model), when it is an absolute path and --load-format is not `dummy`."""
    # lazy: only the exporter, doctor and the roll ask; the residency CLI on a node never does
    from pdkit.agent.exporter.drift import argv_options

    opts = argv_options(argv)
    path = opts["model_path"].values[0] if "model_path" in opts and opts["model_path"].values else None
    if "load_format" in opts and opts["load_format"].values[:1] == ("dummy",):
        return None
    return path if path and path.startswith("/") else None


def weight_files(model_dir: str | Path) -> list[Path]:
    """The weight files under MODEL_DIR (recursively, as sharded checkpoints keep them), sorted."""
    root = Path(model_dir)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def resident_bytes(path: Path) -> tuple[int, int]:
    """(bytes of PATH in the page cache, its size), page-granular."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    libc = _c()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}: {os.strerror(ctypes.get_errno())}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}: {os.strerror(ctypes.get_errno())}")
            resident = sum(b & 1 for b in bytes(vec))
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    return min(resident * PAGE, size), size


def residency(files: list[Path]) -> dict[str, Any]:
    """{"files", "bytes", "resident_bytes", "ratio"} over FILES."""
    total = resident = 0
    for f in files:
        r, s = resident_bytes(f)
        resident += r
        total += s
    return {"files": len(files), "bytes": total, "resident_bytes": resident,
            "ratio": round(resident / total, 4) if total else 1.0}


def warm(files: list[Path]) -> float:
    """Read FILES through the page cache (sequentially, so readahead streams); seconds taken."""
    start = time.monotonic()
    buf = bytearray(READ_CHUNK)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while fh.readinto(buf):
                pass
    return time.monotonic() - start


def evict(files: list[Path]) -> None:
    """Drop FILES' clean pages from the page cache (POSIX_FADV_DONTNEED): a cold start, for tests
    and measurements; no privilege needed."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pdkit.residency", description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--warm", action="store_true", help="read the weight files in when not all are cached")
    ap.add_argument("--evict", action="store_true", help="drop them from the page cache first")
    args = ap.parse_args(argv)
    if not Path(args.model_dir).is_dir():
        print(json.dumps({"error": f"{args.model_dir}: not a directory"}))
        return 2
    files = weight_files(args.model_dir)
    if args.evict:
        evict(files)
    out = {"model_dir": args.model_dir, "before": residency(files)}
    if args.warm and out["before"]["ratio"] < 1.0:
        out["warm_s"] = round(warm(files), 2)
        out["after"] = residency(files)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
