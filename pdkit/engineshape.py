"""A restarted engine must be the engine it was (issue 42 item 5): its shape, recorded and compared.

Stdlib only: it runs ON the node, in the node venv, from the engine gate (pdkit/health.py
wait_engine), which runs as root.

An engine's *shape* is what it allocated at start-up, as it reports it on `/server_info`: its KV
pool (tokens), its effective max running requests, its context length and its CUDA-graph batch
sizes. A restart on a GPU whose memory is partly taken (a neighbour's leftovers, a shared GPU)
comes back smaller and still answers every health check: the issue's decode came back with a
7,452-token KV pool instead of 531,636 and passed every gate.

So at the first healthy start of an engine's configuration the gate records its shape, and after
every later start of the same configuration it compares: a figure below MIN_FRACTION of the
recorded one fails the gate, naming both numbers (`compare`).

The record is keyed by the engine's configuration as it is on disk (`inputs_key`): the sha256 of
each of its unit's files (unit file, environment files: pdkit.plan.Service.files, which a
release keeps too) and the real directory its venv link points at. A rollback to an older
release puts that release's files back, so it is compared with THAT release's record; a new
configuration (a legitimate change of the engine's files or venv) records its own; a release
that changes nothing of this engine (another engine's flags, the exporter) keeps comparing with
the same record. Computed from the files, not from CURRENT: the deploy gates before it records
its release, and a rollback's ready step runs with the inventory's plan, not the restored one.

On the node (root's own directory, 0755; records 0644, written atomically; the engine user cannot
write them):

    /var/lib/pdkit-engines/shapes/<unit>/<key>.json   {unit, key, inputs, shape, recorded_at, version}
    /var/lib/pdkit-engines/shapes/<unit>/last.json    the last gate's verdict: key, recorded, now, problems

Where SGLang reports each figure (read in the pinned wheels; names kept for both releases):

- KV pool: `max_total_num_tokens`, the scheduler's init info merged into /server_info's top level
  (0.5.17 sglang/srt/managers/scheduler.py get_init_info; entrypoints/http_server.py server_info:
  `**_global_state.scheduler_info`; 0.5.23 the same through sglang/srt/utils/common.py
  build_server_info `result.update(scheduler_info)`).
- max running requests: `internal_states[i].effective_max_running_requests_per_dp`, one dict per DP
  rank (0.5.17 managers/scheduler.py get_internal_state; 0.5.23
  managers/scheduler_components/internal_state.py _add_topology); the smallest rank counts.
- context length: `max_req_input_len` (the scheduler's resolved limit, same init info as the KV
  pool), else the `context_length` server argument.
- CUDA-graph batch sizes: `internal_states[0].decode_cuda_graph_bs`, the sizes captured (0.5.23
  internal_state.py _add_disaggregation, tp_worker.get_decode_cuda_graph_bs); else the resolved
  `cuda_graph_config.decode.bs` of the server arguments (0.5.17 server_args.py, PhaseConfig in
  model_executor/cuda_graph_config.py); else the old flat `cuda_graph_bs_decode` / `cuda_graph_bs`.
  Absent (None) on a release that reports none of them, or with decode graphs disabled.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

# a restarted engine must keep at least 90% of each figure its configuration's first healthy start reported
MIN_FRACTION = 0.9
# apart from the node layer's /var/lib/pdkit-node (driver state, the reboot marker), which a node deploy
# creates and whose absence its lab test checks: these records are the engine gate's own
SHAPES_DIR = "/var/lib/pdkit-engines/shapes"
LAST = "last.json"
# records kept per unit (a release keeps 10, pdkit/releases.py KEEP): a rollback finds its release's
KEEP = 20

# figure -> (what a message calls it, unit after the number)
FIGURES: dict[str, tuple[str, str]] = {
    "kv_pool_tokens": ("KV pool", " tokens"),
    "max_running_requests": ("max running requests", ""),
    "context_length": ("context length", " tokens"),
    "cuda_graph_max_bs": ("largest CUDA-graph batch size", ""),
    "cuda_graph_bs_count": ("CUDA-graph batch sizes", " captured"),
}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _graph_sizes(info: dict[str, Any], states: list[dict]) -> list[int] | None:
    captured = states[0].get("decode_cuda_graph_bs") if states else None
    if isinstance(captured, list) and captured:
        return captured
    config = info.get("cuda_graph_config")
    if isinstance(config, dict) and isinstance(config.get("decode"), dict):
        decode = config["decode"]
        if decode.get("backend") == "disabled":
            return None
        if isinstance(decode.get("bs"), list) and decode["bs"]:
            return decode["bs"]
    for key in ("cuda_graph_bs_decode", "cuda_graph_bs"):
        if isinstance(info.get(key), list) and info[key]:
            return info[key]
    return None


def shape_from_server_info(info: dict[str, Any]) -> dict[str, int | None]:
    """Pure: the engine's shape from its /server_info (where each figure comes from: module docstring);
    None for a figure the release does not report."""
    states = [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
    running = [v for s in states if (v := _int(s.get("effective_max_running_requests_per_dp"))) is not None]
    context = _int(info.get("max_req_input_len"))
    if context is None:
        context = _int(info.get("context_length"))
    sizes = [b for b in _graph_sizes(info, states) or [] if _int(b) is not None]
    return {
        "kv_pool_tokens": _int(info.get("max_total_num_tokens")),
        "max_running_requests": min(running) if running else None,
        "context_length": context,
        "cuda_graph_max_bs": max(sizes) if sizes else None,
        "cuda_graph_bs_count": len(sizes) if sizes else None,
    }


def describe(shape: dict[str, int | None]) -> str:
    """Pure: one line of a shape's figures, e.g. `KV pool 531636 tokens, max running requests 256, ...`."""
    parts = [f"{label} {shape[k]}{unit}" for k, (label, unit) in FIGURES.items() if shape.get(k) is not None]
    return ", ".join(parts) or "no figure reported"


def compare(recorded: dict[str, int | None], now: dict[str, int | None], min_fraction: float = MIN_FRACTION,
            ) -> list[str]:
    """Pure: one message per figure that fell below MIN_FRACTION of its recorded value, naming both
    numbers. A figure either side does not report (an older release) is not compared."""
    problems = []
    for key, (label, unit) in FIGURES.items():
        was, got = recorded.get(key), now.get(key)
        if _int(was) is None or _int(got) is None or was <= 0:
            continue
        if got < was * min_fraction:
            problems.append(f"{label} {got}{unit}, {100.0 * got / was:.1f}% of the {was} recorded at this "
                            f"release's first healthy start; below the {min_fraction:.0%} floor")
    return problems


def inputs_key(digests: dict[str, str]) -> str:
    """Pure: the record key of an engine configuration, from {path: digest} of its inputs (16 hex)."""
    digest = hashlib.sha256()
    for path in sorted(digests):
        digest.update(f"{path}\0{digests[path]}\n".encode())
    return digest.hexdigest()[:16]


def input_digests(paths: list[str] | tuple[str, ...], root: Path = Path("/")) -> dict[str, str]:
    """{path: digest} of an engine's inputs on disk: a file's sha256, a directory's (a venv link's)
    real path, `missing` for one that is not there."""
    out = {}
    for path in paths:
        p = root / path.lstrip("/")
        if p.is_dir():
            out[path] = "dir:" + os.path.realpath(p)
        elif p.is_file():
            out[path] = "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[path] = "missing"
    return out


def _write(path: Path, data: dict) -> None:
    """Atomically, mode 0644 (root's when the gate runs as root: the engine user cannot write it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check(unit: str, inputs: list[str] | tuple[str, ...], info: dict[str, Any], shapes_dir: str = SHAPES_DIR,
          min_fraction: float = MIN_FRACTION, root: Path = Path("/")) -> tuple[bool, str]:
    """Record UNIT's shape (from its /server_info INFO) at its configuration's first healthy start,
    or compare it with that record: (ok, one line naming the figures and, on failure, both numbers)."""
    shape = shape_from_server_info(info)
    digests = input_digests(inputs, root)
    key = inputs_key(digests)
    unit_dir = Path(shapes_dir) / unit
    path = unit_dir / f"{key}.json"
    record = read_json(path)
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    if record is None or not isinstance(record.get("shape"), dict):
        _write(path, {"unit": unit, "key": key, "inputs": digests, "shape": shape, "recorded_at": now,
                      "version": info.get("version")})
        _write(unit_dir / LAST, {"key": key, "recorded": shape, "recorded_at": now, "now": shape, "at": now,
                                 "problems": []})
        _prune(unit_dir)
        return True, f"shape recorded ({describe(shape)}) at this configuration's first healthy start ({key})"
    problems = compare(record["shape"], shape, min_fraction)
    _write(unit_dir / LAST, {"key": key, "recorded": record["shape"], "recorded_at": record.get("recorded_at"),
                             "now": shape, "at": now, "problems": problems})
    if problems:
        return False, (f"{unit} came back smaller than its configuration's first healthy start "
                       f"({record.get('recorded_at')}, {path}): " + "; ".join(problems))
    return True, f"shape as recorded at {record.get('recorded_at')} ({describe(shape)})"


def _prune(unit_dir: Path) -> None:
    records = sorted((p for p in unit_dir.glob("*.json") if p.name != LAST), key=lambda p: p.stat().st_mtime)
    for old in records[:-KEEP]:
        old.unlink(missing_ok=True)
