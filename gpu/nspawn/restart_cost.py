"""Where a warm restart of the one-node engines goes, measured on the lent machine (issue 45 item 6).

Run from the lent machine's shell after `device_one.sh up converge` (the control venv's python,
the inventory's engines up):

    /root/pdkit-venv/bin/python gpu/nspawn/restart_cost.py inventories/h200-nspawn.py --out $OUT/restart

1. Import time of SGLang's server entry point as the engine user, with the site's bytecode and
   without it (PYTHONPYCACHEPREFIX in a fresh empty directory: every module compiled, as every
   engine start did before gpu/nspawn/host.py compile_site), per top-level package (`-X importtime`).
2. Warm restarts of all the node's engines together (`systemctl restart`, as a shared-GPU roll
   restarts the group): per engine, seconds from the restart to each of SGLang's own log milestones
   (first line, server_args, torch distributed init, weights, KV pool, CUDA graphs, ready), to
   /health answering, and SGLang's start-up phase gauges (`sglang:startup_time_seconds{phase}`,
   `sglang:startup_cuda_graph_time_seconds`) read from /metrics. Once with bytecode, once without
   (the manager's environment, `systemctl set-environment PYTHONPYCACHEPREFIX=...` under the units'
   private /tmp, unset afterwards), then once more with it.

Writes OUT/restart-cost.json and prints a table. Performance figures from one run each: the
spread is the repeat of the bytecode restart (first and last).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pdkit.agent.health import startup_phases  # noqa: E402
from pdkit.inventory.loader import load  # noqa: E402
from pdkit.render import flags  # noqa: E402 - the repo on the path first

MACHINE = "pdkit-h200"
# SGLang 0.5.17's own log lines (sglang/srt/server_args.py, managers/scheduler.py,
# model_executor/model_runner.py, entrypoints/http_server.py), first occurrence after the restart
MILESTONES = [
    ("first_line", r"."),
    ("server_args", r"server_args="),
    ("torch_distributed", r"Init torch distributed begin"),
    ("weights_begin", r"Load weight begin"),
    ("weights_end", r"Load weight end"),
    ("kv_pool", r"KV Cache is allocated"),
    ("graphs_begin", r"Capture cuda graph begin"),
    ("graphs_end", r"Capture cuda graph end"),
    ("ready", r"The server is fired up and ready to roll"),
]
NO_BYTECODE_PREFIX = "/tmp/pdkit-no-bytecode"  # under each unit's PrivateTmp: empty at every start


def host_exec(command: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "gpu/nspawn/host.py"), "--machine", MACHINE, "exec",
                           "--timeout", str(timeout), "--", command], capture_output=True, text=True,
                          timeout=timeout + 30)


def importtime_by_package(stderr: str) -> tuple[float, list[tuple[str, float]]]:
    """Total seconds and the top-level packages by cumulative seconds, from `python -X importtime`."""
    per: dict[str, float] = {}
    total = 0.0
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        if not m or len(m.group(3)) > 1:  # level 0 only: its cumulative includes everything below
            continue
        seconds = int(m.group(2)) / 1e6
        total += seconds
        top = m.group(4).split(".")[0]
        per[top] = per.get(top, 0.0) + seconds
    return total, sorted(per.items(), key=lambda kv: -kv[1])[:12]


def importtime(user: str, python: str, bytecode: bool) -> dict:
    run = f"runuser -u {shlex.quote(user)} -- {shlex.quote(python)} -X importtime -c 'import sglang.launch_server'"
    if bytecode:
        cmd = f"cd / && {run} 2>&1 >/dev/null"
    else:  # a fresh prefix the engine user can write into: every module compiled once, as at each old start
        cmd = ("d=$(mktemp -d /var/tmp/pdkit-nopyc.XXXXXX) && chmod 777 $d && cd / && "
               f"runuser -u {shlex.quote(user)} -- env PYTHONPYCACHEPREFIX=$d {shlex.quote(python)} -X importtime "
               "-c 'import sglang.launch_server' 2>&1 >/dev/null; rm -rf $d")
    t = time.monotonic()
    r = host_exec(cmd, timeout=300)
    wall = time.monotonic() - t
    total, top = importtime_by_package(r.stdout + r.stderr)
    return {"bytecode": bytecode, "wall_s": round(wall, 2), "imports_s": round(total, 2),
            "top": [(p, round(s, 2)) for p, s in top], "rc": r.returncode}


def health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=3) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def startup_gauges(url: str) -> dict[str, float]:
    """SGLang's start-up phase gauges, read as the engine gate reads them (pdkit.agent.health.startup_phases)."""
    return startup_phases(url + "/health", timeout=10.0)


def milestones(unit: str, since: float, started: float) -> dict[str, float]:
    r = host_exec(f"journalctl -u {shlex.quote(unit)} --since @{since:.0f} -o short-unix --no-pager", timeout=60)
    found: dict[str, float] = {}
    for line in r.stdout.splitlines():
        ts, _, text = line.partition(" ")
        try:
            t = float(ts)
        except ValueError:
            continue
        if t < started or "systemd[" in text.split(":")[0]:
            continue
        for name, pattern in MILESTONES:
            if name not in found and re.search(pattern, text):
                found[name] = round(t - started, 1)
    return found


def restart(engines: list[tuple[str, str]], label: str, timeout: float = 420) -> dict:
    units = " ".join(shlex.quote(u) for u, _ in engines)
    clock = host_exec("date +%s.%N").stdout.strip()
    started = float(clock)
    t0 = time.monotonic()
    r = host_exec(f"systemctl restart {units}", timeout=400)
    ready: dict[str, float] = {}
    while len(ready) < len(engines) and time.monotonic() - t0 < timeout:
        for unit, url in engines:
            if unit not in ready and health(url):
                ready[unit] = round(time.monotonic() - t0, 1)
        time.sleep(0.5)
    out = {"label": label, "restart_rc": r.returncode, "ready_s": ready, "engines": {}}
    for unit, url in engines:
        out["engines"][unit] = {"health_s": ready.get(unit), "log": milestones(unit, started - 2, started),
                                "gauges": startup_gauges(url)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inventory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-importtime", action="store_true")
    ap.add_argument("--no-repeat", action="store_true", help="skip the second restart with bytecode (the spread)")
    args = ap.parse_args(argv)
    spec = load(args.inventory)
    host = spec.gpu_hosts[0]
    engines = [(e.unit_name, flags.engine_url(spec, host, e)) for e in host.node.engines]
    python = flags.engine_python(spec, host)
    user = spec.cluster.service_user
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"engines": engines, "imports": [], "restarts": []}

    def save() -> None:
        (args.out / "restart-cost.json").write_text(json.dumps(result, indent=1) + "\n")

    if not args.skip_importtime:
        for bytecode in (True, False):
            result["imports"].append(importtime(user, python, bytecode))
            i = result["imports"][-1]
            print(f"import sglang.launch_server as {user}, bytecode {'yes' if bytecode else 'no'}: "
                  f"{i['imports_s']} s of imports ({i['wall_s']} s wall); top: {i['top'][:6]}", flush=True)
            save()
    runs = [("bytecode", None), ("no-bytecode", NO_BYTECODE_PREFIX), ("bytecode-again", None)]
    for label, env in runs[:2] if args.no_repeat else runs:
        if env:
            host_exec(f"systemctl set-environment PYTHONPYCACHEPREFIX={env}")
        try:
            r = restart(engines, label)
        finally:
            if env:
                host_exec("systemctl unset-environment PYTHONPYCACHEPREFIX")
        result["restarts"].append(r)
        save()
        for unit, e in r["engines"].items():
            print(f"{label:15s} {unit}: health {e['health_s']} s; log {e['log']}; gauges {e['gauges']}", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
