"""Each engine's start history, kept on the node by the engine gate (issue 45 item 1).

Stdlib only: it runs ON the node, from the engine gate (pdkit/agent/health.py wait_engine, as root).

When the gate first sees a start of an engine ready, having watched it start (not a start that was
already up when the gate came), it appends one entry to the unit's history:

    /var/lib/pdkit-engines/ready/<unit>.starts.json   [{invocation, time, restart_to_ready_s,
                                                         engine_env, config_class, warm, phases}, ...]

oldest first, the newest KEEP_STARTS kept (root's, 0644, written atomically), beside the gate's
ready marks (pdkit.agent.health.mark_ready). `pdkit roll` reads it before a downtime roll
(history_probe_command) and announces the outage from the last WARM restart of the engine's
configuration class after the change (pdkit.roll.planning.engine_estimate):

- restart_to_ready_s: from the unit's last stop (when the start followed it at once) to the
  gate's first sighting of it ready, the same rule as the roll's probe (restart_seconds).
- engine_env: the real directory the engine's python runs from (argv[0]'s venv: the engine
  environment `venvs/engine-<lock hash>` behind `<install_dir>/engine-venv`).
- warm: an earlier start of this unit on the same engine environment completed (is in the
  history). The JIT caches are kept per engine and release (pdkit/agent/jitcache.py), so only the first
  start of an engine on a new environment compiles them from nothing; that is the cold one.
- config_class: config_class() of the unit's argv and environment (its unit file and
  EnvironmentFile= files, as on disk: the same bytes the plan renders, so `pdkit roll` computes
  the class an engine will have after a change from the plan alone).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEEP_STARTS = 30
SUFFIX = ".starts.json"
# a start this soon after the unit went inactive belongs to the same restart (µs)
RESTART_GAP_US = 5_000_000

# What a configuration class leaves out of an engine's argv and environment: what does not change
# what a start costs (weights read, JIT compiles, CUDA graphs captured, KV pool allocated). Where
# the engine listens and is reached (addresses, ports), how much it logs, credentials (never hashed
# in: they change nothing of the start), the served model's name and the PD fault budget's waits
# (read once it serves). Anything else, known or not, is part of the class: a setting missing here
# gives a new class, so the error is towards "no warm restart of this class yet" (the announce says
# which figure it fell back to), never towards another configuration's figure.
IGNORED_FLAGS = frozenset({
    "--host", "--port", "--dist-init-addr", "--disaggregation-bootstrap-port", "--api-key", "--admin-api-key",
    "--served-model-name", "--log-level", "--log-level-http", "--decode-log-interval",
})
IGNORED_ENV = frozenset({
    "SGLANG_HOST_IP", "PYTHONUNBUFFERED",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
})
_CREDENTIAL = re.compile(r"TOKEN|API_KEY|SECRET|PASSWORD", re.IGNORECASE)


def config_class(argv: list[str], env: dict[str, str]) -> str:
    """Pure: an engine's configuration class (12 hex): its argv and environment less what does not
    change its start-up cost (IGNORED_FLAGS with their values, IGNORED_ENV, credentials). Same
    argv and environment: same class."""
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            if not arg.startswith("--"):
                continue
        name = arg.split("=", 1)[0]
        if name in IGNORED_FLAGS:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    variables = sorted((k, v) for k, v in env.items() if k not in IGNORED_ENV and not _CREDENTIAL.search(k))
    digest = hashlib.sha256(json.dumps([kept, variables]).encode())
    return digest.hexdigest()[:12]


def env_file_values(text: str) -> dict[str, str]:
    """Pure: KEY=VALUE lines of a systemd EnvironmentFile (comments and blank lines skipped, one
    level of quotes taken off)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def unit_argv_env(unit_text: str, read: Callable[[str], str | None]) -> tuple[list[str], dict[str, str]]:
    """Pure but for READ (path -> text, None when absent): a systemd unit's ExecStart argv and the
    environment its Environment= and EnvironmentFile= lines give, in the order they appear."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in re.sub(r"\\\n", " ", unit_text).splitlines():
        key, _, value = line.strip().partition("=")
        if key == "ExecStart" and value.strip():
            argv = shlex.split(value.strip().lstrip("@-:+!"))
        elif key == "Environment":
            for item in shlex.split(value):
                name, eq, val = item.partition("=")
                if eq:
                    env[name] = val
        elif key == "EnvironmentFile":
            env.update(env_file_values(read(value.strip().lstrip("-")) or ""))
    return argv, env


def restart_seconds(exit_us: int, ready_us: int | None, inactive_us: int, started_us: int) -> float | None:
    """Pure: one start's restart-to-ready from systemd's monotonic timestamps (µs): [left active,
    ready, went inactive, started]: the stop itself (left active -> inactive) when the start followed
    it at once (a restart, not a unit that sat stopped for a while), plus start -> ready. None
    without a ready time after the start."""
    if not ready_us or not started_us or ready_us <= started_us:
        return None
    stopping = (inactive_us - exit_us
                if 0 < exit_us <= inactive_us <= started_us <= inactive_us + RESTART_GAP_US else 0)
    return (stopping + ready_us - started_us) / 1e6


def is_warm(history: list[dict[str, Any]], engine_env: str | None) -> bool:
    """Pure: a start is warm when an earlier start of the unit on the same engine environment
    completed (HISTORY holds completed starts only): its JIT caches were written then."""
    return engine_env is not None and any(e.get("engine_env") == engine_env for e in history)


def history_path(marks_dir: str, unit: str) -> Path:
    return Path(marks_dir) / f"{unit}{SUFFIX}"


def read_history(marks_dir: str, unit: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(history_path(marks_dir, unit).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def _show(unit: str) -> dict[str, str]:
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveExitTimestampMonotonic,InactiveEnterTimestampMonotonic,"
         "InactiveExitTimestampMonotonic,InvocationID,FragmentPath", unit],
        capture_output=True, text=True, timeout=10).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def record_start(unit: str, invocation: str, marks_dir: str, *, root: Path = Path("/"),
                 show: Callable[[str], dict[str, str]] = _show) -> dict[str, Any] | None:
    """Append INVOCATION's start of UNIT to its history (once), when the gate first saw it ready;
    the ready time is the gate's ready mark of that invocation (pdkit.agent.health.mark_ready), else now.
    The entry written, or None (another invocation runs now, already recorded, nothing readable).
    Evidence for an announcement only: never raises."""
    try:
        props = show(unit)
        if props.get("InvocationID") != invocation:
            return None
        history = read_history(marks_dir, unit)
        if any(e.get("invocation") == invocation for e in history):
            return None
        ready_us = time.monotonic_ns() // 1000
        phases: dict[str, Any] = {}
        try:
            mark = json.loads((Path(marks_dir) / f"{unit}.json").read_text())
            if mark.get("invocation") == invocation:
                ready_us, phases = int(mark["ready_monotonic_us"]), mark.get("phases") or {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        took = restart_seconds(int(props.get("ActiveExitTimestampMonotonic") or 0), ready_us,
                               int(props.get("InactiveEnterTimestampMonotonic") or 0),
                               int(props.get("InactiveExitTimestampMonotonic") or 0))
        if took is None:
            return None

        def read(path: str) -> str | None:
            try:
                return (root / path.lstrip("/")).read_text()
            except OSError:
                return None

        argv, env = unit_argv_env(read(props.get("FragmentPath") or "") or "", read)
        engine_env = (os.path.realpath(root / Path(argv[0].lstrip("/")).parent.parent)
                      if argv and argv[0].startswith("/") else None)
        entry = {"invocation": invocation, "time": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "restart_to_ready_s": round(took, 2), "engine_env": engine_env,
                 "config_class": config_class(argv, env) if argv else None,
                 "warm": is_warm(history, engine_env), "phases": phases}
        path = history_path(marks_dir, unit)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([*history, entry][-KEEP_STARTS:]))
        tmp.chmod(0o644)
        tmp.replace(path)
        return entry
    except Exception:  # noqa: BLE001 - evidence for an announcement only: never a reason to fail a gate
        return None


_HISTORY_PROBE = r"""
import json, sys
out = {}
for u in json.loads(sys.argv[2]):
    try:
        out[u] = json.load(open(sys.argv[1] + "/" + u + sys.argv[3]))
    except (OSError, ValueError):
        out[u] = []
print(json.dumps(out))
"""


def history_probe_command(units: list[str], marks_dir: str) -> str:
    """The shell command printing {unit: its start history} of UNITS on a node (stdlib python3)."""
    q = shlex.quote
    return f"python3 -c {q(_HISTORY_PROBE)} {q(marks_dir)} {q(json.dumps(units))} {q(SUFFIX)}"
