"""The node side of warm JIT caches (issue 45 item 2; docs/rolling.md "JIT caches"). Stdlib only: it runs ON
the node, from the node venv, as root.

    python -m pdkit.jitwarm state ENGINE_DIR...
        each engine directory's caches, warm or cold (pdkit.agent.jitcache.judge), one JSON list: read by
        `pdkit roll` before a node's drain (pdkit/render/jitplan.py pre_restart_warning)
    python -m pdkit.jitwarm restart [--timeout S] [--engine UNIT HEALTH_URL ENGINE_DIR]... UNIT...
        the deploy's `systemctl restart UNIT...` of a node's engines and daemons (roles/services.py), but
        when two or more of the --engine units (in start order: prefills first) would start on cold
        caches, the later ones are stopped first, then each cold one started once the one before it
        serves: they never compile at once

A node's prefill and decode start together. Each has its own cache directories (pdkit/agent/jitcache.py), so
they no longer write one DeepGEMM cache at once (sgl-project/sglang#27604), but two first starts still
compile side by side on the node's cores (nvcc, Triton, Inductor, FlashInfer) and each is the slower for
it. Judged when the restart runs, after the deploy moved the engine environment's link: a lock change
makes the caches cold there as a new release does. A start that does not become ready in the timeout
never stops the others: the next one starts anyway, and the deploy's own gates decide.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

from pdkit.agent import health, jitcache


def serial_stages(engines: Sequence[tuple[str, bool]], others: Sequence[str]) -> list[list[str]]:
    """Pure: the units to restart together, stage by stage. ENGINES: (unit, cold) in start order; OTHERS:
    the rest of the units (daemons). With fewer than two cold engines one stage, as before; else the first
    cold engine with the warm ones and the daemons (none of them compiles), then each other cold engine
    alone, once the one before it serves."""
    cold = [u for u, c in engines if c]
    if len(cold) < 2:
        return [[*(u for u, _ in engines), *others]]
    return [[cold[0], *(u for u, c in engines if not c), *others], *([u] for u in cold[1:])]


def _systemctl(verb: str, units: Sequence[str]) -> int:
    return subprocess.run(["systemctl", verb, *units], check=False).returncode


def restart(units: Sequence[str], engines: Sequence[tuple[str, str, str]], timeout: float) -> int:
    """Restart UNITS, the cold ones of ENGINES ((unit, /health URL, engine dir), in start order) one at a
    time (serial_stages); systemctl's exit status."""
    cold = {u: jitcache.judge(d)["state"] == "cold" for u, _, d in engines}
    named = [u for u, _, _ in engines if u in units]
    stages = serial_stages([(u, cold[u]) for u in named], [u for u in units if u not in named])
    if len(stages) > 1:
        order = [s[0] for s in stages]
        print(f"pdkit.jitwarm: JIT caches cold for {', '.join(order)}: they start one after another, each once the "
              "one before it serves, so they never compile at once", flush=True)
    urls = {u: url for u, url, _ in engines}
    if len(stages) > 1:
        # the later ones stop now, as they would have with the rest: an old engine must not pair with a new
        # one through the router meanwhile (another release, another lock), nor hold its GPUs and cores
        rc = _systemctl("stop", [u for stage in stages[1:] for u in stage])
        if rc != 0:
            return rc
    for i, stage in enumerate(stages):
        rc = _systemctl("restart", stage)
        if rc != 0 or i == len(stages) - 1:
            return rc
        started = time.monotonic()
        ok, message = health.wait_engine(stage[0], urls[stage[0]], timeout)
        took = time.monotonic() - started
        print(f"pdkit.jitwarm: {stage[0]} {'serves' if ok else 'is not ready'} after {took:.0f} s"
              + ("" if ok else f" ({message}); the next starts anyway, its gate decides"), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdkit.jitwarm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("state", help="each engine directory's JIT caches: warm or cold (JSON)")
    s.add_argument("dirs", nargs="+", metavar="ENGINE_DIR")
    r = sub.add_parser("restart", help="systemctl restart UNIT..., engines on cold caches one at a time")
    r.add_argument("--engine", nargs=3, action="append", default=[], metavar=("UNIT", "HEALTH_URL", "ENGINE_DIR"),
                   help="an engine among the units, in start order (repeat)")
    r.add_argument("--timeout", type=float, default=600, help="the longest wait for one cold engine to serve")
    r.add_argument("units", nargs="+", metavar="UNIT")
    args = parser.parse_args(argv)
    if args.cmd == "state":
        print(json.dumps([jitcache.judge(d) for d in args.dirs]))
        return 0
    return restart(args.units, [tuple(e) for e in args.engine], args.timeout)


if __name__ == "__main__":
    sys.exit(main())
