"""A restarted engine must be the engine it was (issue 42 item 5): its shape, recorded and compared.

Stdlib only: it runs ON the node, in the node venv, from the engine gate (pdkit/agent/health.py
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
each of its unit's files (unit file, environment files: pdkit.render.plan.Service.files, which a
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

The weights themselves (issue 44 item 2): beside the shape, the record holds the engine's weight
checksums as its `/weights_checker` reported them at the same first healthy start, and every later
start compares them: a rank whose checksum changed fails the gate, naming the rank (tp/pp/dp) and
both checksums' first SHORT hex digits (`compare_weights`). Read in the pinned wheels (0.5.17 and
0.5.23 alike unless said):

- the route: `@app.api_route("/weights_checker", methods=["GET", "POST"])`, auth level
  ADMIN_OPTIONAL (0.5.17 sglang/srt/entrypoints/http_server.py:1486, 0.5.23 :1599): open without
  keys; with only --api-key it wants `Authorization: Bearer <api key>`; with --admin-api-key it
  wants that key (srt/utils/auth.py decide_request_auth). pdkit renders neither key for an engine
  (the gate reads /server_info without a header too), so it sends none; a 401/403 is "unavailable".
- the body: CheckWeightsReqInput (srt/managers/io_struct.py), `action` "checksum" by default
  (0.5.23 adds skip_tensor_list and selector "all"); the gate POSTs {"action": "checksum"}.
- the answer: `{"success", "message", "ranks", "per_engine_checksum"}`, 200 on success, else 400
  with success false (the checker's exception as message). `per_engine_checksum` is the sha256 of
  the ranks' `per_gpu_checksum`s in answer order (srt/managers/tokenizer_control_mixin.py
  check_weights); each rank is a ChecksumInfo (srt/utils/weight_checker.py): `checksums`
  {tensor name: 16 hex}, `per_gpu_checksum` (sha256 over the sorted names and their hex), and
  `parallelism_info`: one {tp_rank, tp_size, dp_rank, dp_size, pp_rank, pp_size, rank, size}
  object in 0.5.17, a LIST of them in 0.5.23, one per runner, each with a `role` ("target", or a
  draft role; scheduler_components/weight_updater.py _merge_checksum_payloads). Only pp rank 0's
  schedulers answer the tokenizer (scheduler.py init_ipc_channels), each with its TP group's ranks.
- its cost: every rank hashes every tensor on its GPU (a Triton kernel per tensor, 0.5.23
  dequantizing quantized ones first), serially in the scheduler between batches; nothing in
  SGLang bounds the call. WEIGHTS_TIMEOUT_S bounds it here.

An engine that does not answer it (a release without the route: 404; a key it wants; 400; no answer
within the bound) is recorded "unavailable" and never blocks: the verdict says so. A record without
answered weights (unavailable then, or written before this check) takes the first start that answers.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# a restarted engine must keep at least 90% of each figure its configuration's first healthy start reported
MIN_FRACTION = 0.9
# apart from the node layer's /var/lib/pdkit-node (driver state, the reboot marker), which a node deploy
# creates and whose absence its lab test checks: these records are the engine gate's own
SHAPES_DIR = "/var/lib/pdkit-engines/shapes"
LAST = "last.json"
# records kept per unit (a release keeps 10, pdkit/agent/releases.py KEEP): a rollback finds its release's
KEEP = 20

# /weights_checker, beside /health: the engine's weight checksums (module docstring)
WEIGHTS_PATH = "/weights_checker"
# How long the gate waits for them. SGLang bounds nothing (the HTTP handler awaits the scheduler): each
# rank hashes its tensors on its GPU, memory-bound (85 GB of an H100 read in well under a second), with
# one host sync per tensor (a few thousand: about a second) and, on an engine's first call, the Triton
# JIT of the hash (0.5.23: and dequant) kernels: seconds, not minutes. 60 s leaves an order of magnitude
# over that while bounding what one engine adds to a gate; an engine slower than that is "unavailable",
# which never blocks.
WEIGHTS_TIMEOUT_S = 60.0
# hex digits of a checksum a message shows
SHORT = 12

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


def _graph_sizes(info: dict[str, Any], states: list[dict[str, Any]]) -> list[int] | None:
    captured = states[0].get("decode_cuda_graph_bs") if states else None
    if isinstance(captured, list) and captured:
        return captured
    config = info.get("cuda_graph_config")
    if isinstance(config, dict) and isinstance(config.get("decode"), dict):
        decode = config["decode"]
        if decode.get("backend") == "disabled":
            return None
        if isinstance(decode.get("bs"), list) and decode["bs"]:
            sizes: list[int] = decode["bs"]
            return sizes
    for key in ("cuda_graph_bs_decode", "cuda_graph_bs"):
        if isinstance(info.get(key), list) and info[key]:
            listed: list[int] = info[key]
            return listed
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


def describe(shape: Mapping[str, int | None]) -> str:
    """Pure: one line of a shape's figures, e.g. `KV pool 531636 tokens, max running requests 256, ...`."""
    parts = [f"{label} {shape[k]}{unit}" for k, (label, unit) in FIGURES.items() if shape.get(k) is not None]
    return ", ".join(parts) or "no figure reported"


def compare(recorded: Mapping[str, int | None], now: Mapping[str, int | None], min_fraction: float = MIN_FRACTION,
            ) -> list[str]:
    """Pure: one message per figure that fell below MIN_FRACTION of its recorded value, naming both
    numbers. A figure either side does not report (an older release) is not compared."""
    problems = []
    for key, (label, unit) in FIGURES.items():
        was, got = _int(recorded.get(key)), _int(now.get(key))
        if was is None or got is None or was <= 0:
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


def _write(path: Path, data: dict[str, Any]) -> None:
    """Atomically, mode 0644 (root's when the gate runs as root: the engine user cannot write it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def weights_checker_url(health_url: str) -> str:
    """The engine's /weights_checker beside its /health URL."""
    return health_url.rstrip("/").removesuffix("/health") + WEIGHTS_PATH


def _parallelism(info: Any) -> dict[str, Any]:
    """A rank's placement: 0.5.17's one object, else the "target" runner's of 0.5.23's list (all share the GPU)."""
    if isinstance(info, list):
        dicts = [d for d in info if isinstance(d, dict)]
        return next((d for d in dicts if d.get("role") == "target"), dicts[0] if dicts else {})
    return info if isinstance(info, dict) else {}


def rank_label(placement: dict[str, Any]) -> str:
    """Pure: how a message names a rank, e.g. `tp_rank 1/pp_rank 0/dp_rank 0`."""
    return "/".join(f"{k} {placement.get(k, '?')}" for k in ("tp_rank", "pp_rank", "dp_rank"))


def weights_from_answer(status: int, body: str) -> dict[str, Any]:
    """Pure: what the record keeps of one /weights_checker answer (STATUS 0: nothing answered, BODY why):
    {"status": "answered", "per_engine_checksum", "ranks": [{"rank": label, "tp_rank", "pp_rank",
    "dp_rank", "per_gpu_checksum"}]} or {"status": "unavailable", "reason"}."""
    def unavailable(reason: str) -> dict[str, Any]:
        return {"status": "unavailable", "reason": reason}

    try:
        data = json.loads(body) if status else None
    except ValueError:
        data = None
    message = str(data.get("message"))[:200] if isinstance(data, dict) and "message" in data else body.strip()[:200]
    if status == 0:
        return unavailable(f"no answer within {WEIGHTS_TIMEOUT_S:.0f} s ({body.strip()[:200]})")
    if status in (404, 405):
        return unavailable(f"HTTP {status}: not served (a release without {WEIGHTS_PATH})")
    if status in (401, 403):
        return unavailable(f"HTTP {status}: the engine wants a key for it (--api-key/--admin-api-key)")
    if status != 200 or not isinstance(data, dict) or data.get("success") is not True:
        return unavailable(f"HTTP {status}: the engine did not checksum its weights ({message!r})")
    ranks = []
    for item in data.get("ranks") or []:
        if not isinstance(item, dict) or not isinstance(item.get("per_gpu_checksum"), str):
            continue
        where = _parallelism(item.get("parallelism_info"))
        placement = {k: _int(where.get(k)) for k in ("tp_rank", "pp_rank", "dp_rank")}
        ranks.append({"rank": rank_label(placement), **placement, "per_gpu_checksum": item["per_gpu_checksum"]})
    engine = data.get("per_engine_checksum")
    if not isinstance(engine, str) or not engine:
        return unavailable(f"HTTP 200 without a per_engine_checksum ({message!r})")
    return {"status": "answered", "per_engine_checksum": engine, "ranks": ranks}


def _short(checksum: Any) -> str:
    return str(checksum)[:SHORT] if checksum else "none"


def describe_weights(weights: dict[str, Any]) -> str:
    """Pure: one line of a weights record, e.g. `per-engine checksum 3f2a9c1b0d4e over 2 ranks`."""
    if weights.get("status") != "answered":
        return f"{WEIGHTS_PATH} unavailable ({weights.get('reason', 'no reason given')})"
    count = len(weights.get("ranks") or [])
    return f"per-engine checksum {_short(weights.get('per_engine_checksum'))} over {count} rank{'s' * (count != 1)}"


def _by_rank(weights: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rank in weights.get("ranks") or []:
        if isinstance(rank, dict) and isinstance(rank.get("per_gpu_checksum"), str):
            out.setdefault(str(rank.get("rank")), []).append(rank["per_gpu_checksum"])
    return {label: sorted(sums) for label, sums in out.items()}


def compare_weights(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Pure: one message per rank whose per_gpu_checksum is not the recorded one, naming the rank and both
    checksums (SHORT hex digits), matched by tp/pp/dp rank (a DP rank's answers arrive in any order, so
    the per-engine checksum alone could differ with the same weights). Nothing when either side is not
    an answer (unavailable never blocks); the per-engine checksums when neither side lists ranks."""
    if recorded.get("status") != "answered" or now.get("status") != "answered":
        return []
    was, got = _by_rank(recorded), _by_rank(now)
    problems = []
    for label in sorted(set(was) | set(got)):
        before, after = was.get(label, []), got.get(label, [])
        if before == after:
            continue
        shown_before = ",".join(map(_short, before)) or "none"
        shown_after = ",".join(map(_short, after)) or "none"
        if not after:
            problems.append(f"rank {label}: per_gpu_checksum {shown_before} recorded, the rank is not reported now")
        elif not before:
            problems.append(f"rank {label}: per_gpu_checksum {shown_after} now, no such rank recorded")
        else:
            problems.append(f"rank {label}: per_gpu_checksum {shown_after} now, {shown_before} recorded")
    if problems or (not was and not got and recorded.get("per_engine_checksum") != now.get("per_engine_checksum")):
        problems.append(f"per-engine checksum {_short(now.get('per_engine_checksum'))} now, "
                        f"{_short(recorded.get('per_engine_checksum'))} recorded")
    return problems


def weights_verdict(last: dict[str, Any] | None) -> dict[str, str] | None:
    """Pure: the gate's last weights verdict from its last.json, as strings (status recorded | match |
    mismatch | unavailable, recorded and now: per-engine checksums' SHORT digits, problem: the first
    or the reason); None when the gate did not check weights."""
    weights = (last or {}).get("weights")
    if not isinstance(weights, dict) or weights.get("status") not in ("recorded", "match", "mismatch", "unavailable"):
        return None
    problems = weights.get("problems") or []
    problem = "; ".join(str(p) for p in problems) if problems else str(weights.get("reason") or "")
    return {"status": weights["status"],
            "recorded": str(weights.get("recorded") or "")[:SHORT], "now": str(weights.get("now") or "")[:SHORT],
            "problem": problem[:300]}


def _weights_step(record: dict[str, Any], weights: dict[str, Any], later: bool) -> tuple[dict[str, Any], str, bool]:
    """(the last.json weights verdict, its line, whether the record takes these weights now). LATER: the
    record was written at an earlier start (its shape), so answered weights it lacks are taken now."""
    kept = record.get("weights")
    recorded: dict[str, Any] = kept if isinstance(kept, dict) else {}
    engine_now = weights.get("per_engine_checksum")
    verdict: dict[str, Any]
    if weights.get("status") != "answered":
        verdict = {"status": "unavailable", "recorded": recorded.get("per_engine_checksum"), "now": None,
                   "reason": weights.get("reason"), "problems": []}
        return verdict, f"weights not compared: {describe_weights(weights)}; this never blocks", False
    if recorded.get("status") != "answered":
        verdict = {"status": "recorded", "recorded": engine_now, "now": engine_now, "problems": []}
        first = (f" at this start, the first of this configuration that answered {WEIGHTS_PATH}" if later
                 else "")
        return verdict, f"weights recorded{first} ({describe_weights(weights)})", True
    problems = compare_weights(recorded, weights)
    verdict = {"status": "mismatch" if problems else "match", "recorded": recorded.get("per_engine_checksum"),
               "now": engine_now, "recorded_at": recorded.get("recorded_at"), "problems": problems}
    if problems:
        return verdict, "; ".join(problems), False
    return verdict, f"weights as recorded at {recorded.get('recorded_at')} ({describe_weights(weights)})", False


def check(unit: str, inputs: list[str] | tuple[str, ...], info: dict[str, Any], shapes_dir: str = SHAPES_DIR,
          min_fraction: float = MIN_FRACTION, root: Path = Path("/"), weights: dict[str, Any] | None = None,
          ) -> tuple[bool, str]:
    """Record UNIT's shape (from its /server_info INFO) at its configuration's first healthy start,
    or compare it with that record: (ok, one line naming the figures and, on failure, both numbers).
    With WEIGHTS (weights_from_answer of its /weights_checker), the same for its weight checksums: a
    changed rank fails, naming it and both checksums; an unavailable answer never fails."""
    shape = shape_from_server_info(info)
    digests = input_digests(inputs, root)
    key = inputs_key(digests)
    unit_dir = Path(shapes_dir) / unit
    path = unit_dir / f"{key}.json"
    record = read_json(path)
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    if record is None or not isinstance(record.get("shape"), dict):
        record = {"unit": unit, "key": key, "inputs": digests, "shape": shape, "recorded_at": now,
                  "version": info.get("version")}
        last: dict[str, Any] = {"key": key, "recorded": shape, "recorded_at": now, "now": shape, "at": now,
                                "problems": []}
        line = f"shape recorded ({describe(shape)}) at this configuration's first healthy start ({key})"
        if weights is not None:
            last["weights"], weights_line, _ = _weights_step({}, weights, later=False)
            record["weights"] = {**weights, "recorded_at": now}
            line += f"; {weights_line}"
        _write(path, record)
        _write(unit_dir / LAST, last)
        _prune(unit_dir)
        return True, line
    problems = compare(record["shape"], shape, min_fraction)
    last = {"key": key, "recorded": record["shape"], "recorded_at": record.get("recorded_at"), "now": shape,
            "at": now, "problems": problems}
    weights_line, weights_failed = "", False
    if weights is not None:
        last["weights"], weights_line, take = _weights_step(record, weights, later=True)
        weights_failed = last["weights"]["status"] == "mismatch"
        if take:
            _write(path, {**record, "weights": {**weights, "recorded_at": now}})
    _write(unit_dir / LAST, last)
    failures = []
    if problems:
        failures.append(f"{unit} came back smaller than its configuration's first healthy start "
                        f"({record.get('recorded_at')}, {path}): " + "; ".join(problems))
    if weights_failed:
        failures.append(f"{unit} came back with other weights than its configuration's first healthy start "
                        f"({last['weights'].get('recorded_at')}, {path}): {weights_line}")
    if failures:
        return False, "; ".join(failures)
    line = f"shape as recorded at {record.get('recorded_at')} ({describe(shape)})"
    return True, f"{line}; {weights_line}" if weights_line else line


def _prune(unit_dir: Path) -> None:
    records = sorted((p for p in unit_dir.glob("*.json") if p.name != LAST), key=lambda p: p.stat().st_mtime)
    for old in records[:-KEEP]:
        old.unlink(missing_ok=True)
