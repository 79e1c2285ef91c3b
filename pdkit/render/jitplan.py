"""What the control side asks of the engines' JIT caches (issue 45 item 2; docs/rolling.md "JIT caches"):
which directory each engine of a node runs on, the deploy's restart command that starts engines on cold
caches one at a time, and the roll's warning before a node's restart. The node side: pdkit/agent/jitwarm.py,
the stamp and its verdict: pdkit/agent/jitcache.py.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pdkit.agent import jitcache
from pdkit.render import flags

if TYPE_CHECKING:
    from pdkit.render.plan import Service
    from pdkit.spec import ClusterSpec

# the first start of a node's engines on cold caches: prefills first (the decode's KV transfer waits for
# them anyway), then unified engines, then decodes (sgl-project/sglang#27604: two engines compiling at once)
START_ORDER = {"prefill": 0, "unified": 1, "decode": 2}


def engine_dirs(spec: ClusterSpec, host_name: str) -> dict[str, tuple[str, str]]:
    """engine name -> (its cache directory, its release) for the engines HOST_NAME declares and runs
    alone (rank 0 of its own); an engine whose own env moved SGLANG_CACHE_DIR elsewhere is not judged."""
    host = spec.host(host_name)
    out = {}
    for p in spec.placements(host):
        if p.rank == 0 and p.head.name == host.name and not p.engine.spans_nodes:
            found = jitcache.engine_dir_of(flags.engine_env(spec, host, p.engine))
            if found is not None:
                out[p.engine.name] = (found, spec.engine_version(p.engine))
    return out


def restart_command(spec: ClusterSpec, host_name: str, services: Sequence[Service]) -> str | None:
    """The command that restarts SERVICES (the node's engines and daemons, roles/services.py) through
    `python -m pdkit.jitwarm restart`, which starts the engines on cold caches one at a time; None where
    fewer than two engines could compile at once (engines sharing GPUs start one after another already,
    pdkit.render.plan.shared_gpu_start; a rank of an engine spanning nodes is left to its own start)."""
    dirs = engine_dirs(spec, host_name)
    engines = sorted((s for s in services if s.kind == "engine" and s.rank == 0 and not s.share_group
                      and not s.span and s.engine in dirs),
                     key=lambda s: (START_ORDER.get(s.role or "", 1), s.engine or ""))
    if len(engines) < 2:
        return None
    q = shlex.quote
    timeout = max(s.ready_timeout_s for s in engines)
    named = " ".join(f"--engine {q(s.unit)} {q(s.health_url)} {q(dirs[s.engine][0])}" for s in engines)  # type: ignore[index]
    return (f"{q(flags.node_python(spec))} -m pdkit.jitwarm restart --timeout {timeout} {named} "
            + " ".join(q(s.unit) for s in services))


def state_command(spec: ClusterSpec, dirs: Sequence[str]) -> str:
    return f"{shlex.quote(flags.node_python(spec))} -m pdkit.jitwarm state " + " ".join(shlex.quote(d) for d in dirs)


def warning_words(judged: Sequence[dict[str, Any]], engines: dict[str, tuple[str, str]]) -> str:
    """Pure: the roll's words for the cold ones of JUDGED (pdkit.agent.jitcache.judge per directory) of ENGINES
    (name -> (directory, release)), "" when every one is warm: what a restart will cost on top."""
    by_dir = {row.get("dir"): row for row in judged}
    words = []
    for name, (d, release) in sorted(engines.items()):
        row = by_dir.get(d)
        if row is None or row.get("state") != "cold":
            continue
        extra = row.get("extra_s")
        cost = (f"expect ~{extra:.0f} s more than a warm start (its last cold start on this node, "
                f"{row.get('extra_from')})" if isinstance(extra, (int, float))
                else "expect a longer start than a warm one (no cold start of it measured on this node yet)")
        words.append(f"{name} (SGLang {release}): JIT caches cold, {row.get('why')}; "
                     f"if it restarts it compiles: {cost}")
    return ("warning: " + "; ".join(words)) if words else ""


def pre_restart_warning(spec: ClusterSpec, host_name: str,
                        run: Callable[[str], tuple[bool, str, str]]) -> str:
    """Before a node's drain: its engines whose caches are cold for the release they will run, with what
    that costs (`warning_words`), read on the node through RUN(command) -> (ok, stdout, stderr); "" when
    all are warm or it has none. A warning only, never a refusal; a node that cannot tell says so.
    A lock change this very roll installs is seen by the deploy's restart (pdkit/agent/jitwarm.py), not here:
    the engine environment's link still points at the old one before the apply."""
    engines = engine_dirs(spec, host_name)
    if not engines:
        return ""
    try:
        ok, stdout, stderr = run(state_command(spec, [d for d, _ in engines.values()]))
    except Exception as exc:  # noqa: BLE001 - a warning only: never a reason to stop the roll
        ok, stdout, stderr = False, "", f"{type(exc).__name__}: {exc}"
    try:
        judged = json.loads(stdout.strip().splitlines()[-1]) if ok else None
    except (ValueError, IndexError):
        judged = None
    if not isinstance(judged, list):
        lines = (stderr or stdout).strip().splitlines() if not ok else ["an unreadable answer"]
        return (f"JIT caches not judged ({lines[-1][:200] if lines else 'no answer'}; a node venv older than "
                "pdkit.agent.jitwarm answers so)")
    return warning_words(judged, engines)
