"""Where a no-op re-run's CPU goes on the running lab (issue 20 item 6), per process group.

    sudo .venv/bin/python benchmarks/noop_profile.py [--runs 3] [--inventory inventories/lab.py]
        [--deploy deploy/pd.py] [--tree DIR] [--out FILE.json] [-- EXTRA PYINFRA ARGS]

Each run: an idle window first (nothing deployed; 15 s, one scrape interval of the lab, or as long as the last run took), then
`pyinfra -y INVENTORY DEPLOY`. Around both windows it reads `cpu.stat` (usage_usec) of every
cgroup of the lab in the cgroup v2 hierarchy: each guest's systemd puts every unit in its own
cgroup there (ssh.service, systemd-logind.service, user.slice with the SSH sessions, the engines,
...), and a cgroup's usage includes processes that have already exited, so the short-lived
ones a no-op runs (sshd's per-connection children, shells, the host-state probe, systemctl)
are counted, which sampling tools miss. The control process's CPU is its rusage (wait4, its
children included); the machine's busy CPU comes from /proc/stat.

--freeze HOST:UNIT (repeatable) freezes UNIT on lab host HOST (the cgroup v2 freezer, from this
machine: the unit stays active, so the deploy still sees it running) for the idle and deploy windows
of every run, thawed after each: e.g. `--freeze lab-mon:prometheus.service` stops every scrape, and
with it the load the scrapes cause on every guest (node_exporter, pdkit-exporter, the engines'
/metrics), to tell that load apart from the deploy's own. Only for a no-op: a deploy that gates on a
frozen service would wait for it.

--tree DIR runs the deploy of another checkout (e.g. `git worktree add DIR REV`: a before/after on
one running lab): pyinfra starts in DIR, with DIR first on PYTHONPATH.

Prints, per group summed over the guests of a role (GPU hosts, the monitoring host), the CPU of
the deploy window minus that of the idle window (the lab's own background: engines, exporters,
Prometheus' scrapes), in ms per host and in all, beside the wall time and the control process.
Medians over the runs. Groups: the unit's cgroup name under the guest's payload
(session-N.scope folded into user.slice), `nspawn` for the guest's cgroup outside its payload.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UNIFIED_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))  # hybrid layout, then pure v2


def read_usage_usec(cgroup: Path) -> int | None:
    """usage_usec of a v2 cgroup's cpu.stat, None when it is gone or has none."""
    try:
        text = (cgroup / "cpu.stat").read_text()
    except OSError:
        return None
    m = re.search(r"^usage_usec (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def group_of(relative: str) -> str | None:
    """The profile group of a cgroup path below a guest's cgroup (`payload/system.slice/ssh.service`
    -> `ssh.service`), None for a cgroup whose usage its parent's group already counts."""
    parts = relative.split("/") if relative else []
    if not parts:
        return None  # the guest itself: the total, not a group
    if parts[0] != "payload":
        return None
    rest = parts[1:]
    if len(rest) == 1:
        return rest[0] if rest[0] in ("init.scope", "user.slice") or not rest[0].endswith(".slice") else None
    if len(rest) == 2 and rest[0] == "system.slice":
        return rest[1]
    return None


@dataclass
class Snapshot:
    """usage_usec per guest (total) and per (guest, group)."""

    guests: dict[str, int] = field(default_factory=dict)
    groups: dict[tuple[str, str], int] = field(default_factory=dict)
    busy_ticks: int = 0

    @staticmethod
    def take(lab_root: Path) -> Snapshot:
        snap = Snapshot(busy_ticks=_busy_ticks())
        for guest_dir in sorted(p for p in lab_root.iterdir() if p.is_dir()):
            total = read_usage_usec(guest_dir)
            if total is None:
                continue
            snap.guests[guest_dir.name] = total
            payload = guest_dir / "payload"
            inside = 0
            if payload.is_dir():
                for cg in [payload, *payload.iterdir(), *(payload / "system.slice").glob("*")]:
                    if not cg.is_dir():
                        continue
                    name = group_of(str(cg.relative_to(guest_dir)))
                    usage = read_usage_usec(cg) if name else None
                    if name and usage is not None:
                        snap.groups[(guest_dir.name, name)] = usage
                inside = read_usage_usec(payload) or 0
            snap.groups[(guest_dir.name, "nspawn")] = total - inside
        return snap


def _busy_ticks() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle


def delta(before: Snapshot, after: Snapshot) -> dict[tuple[str, str], int]:
    """usec per (guest, group) between two snapshots; a group absent from either counts 0 there
    (a cgroup created in the window: its whole usage)."""
    out: dict[tuple[str, str], int] = {}
    for key in set(before.groups) | set(after.groups):
        out[key] = after.groups.get(key, before.groups.get(key, 0)) - before.groups.get(key, 0)
    for guest in set(before.guests) | set(after.guests):
        out[(guest, "*total")] = after.guests.get(guest, 0) - before.guests.get(guest, 0)
    return out


def role_of(guest: str, roles: dict[str, str]) -> str:
    return roles.get(guest, "gpu" if "gpu" in guest else "other")


def idle_cores(idle: dict[tuple[str, str], int], window_s: float, roles: dict[str, str]) -> dict[str, dict[str, float]]:
    """{role: {group: cores the idle window used, over all guests of the role}}: the lab's own background."""
    out: dict[str, dict[str, float]] = {}
    for (guest, group), usec in idle.items():
        role = role_of(guest, roles)
        out.setdefault(role, {}).setdefault(group, 0.0)
        out[role][group] += usec / 1e6 / window_s
    return out


def parse_freeze(value: str) -> tuple[str, str]:
    """`HOST:UNIT` -> (HOST, UNIT)."""
    host, sep, unit = value.partition(":")
    if not (sep and host and unit):
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:UNIT, e.g. lab-mon:prometheus.service")
    return host, unit


def freeze(lab_root: Path, units: list[tuple[str, str]], frozen: bool, timeout_s: float = 10.0) -> None:
    """Freeze (or thaw) each (HOST, UNIT) through its cgroup's cgroup.freeze, from this machine: the
    guest's systemd cannot freeze a unit itself ("does not support freezing" in a systemd-nspawn
    guest), and does not notice this: the unit stays active. Waits until the kernel says it is."""
    for host, unit in units:
        cg = lab_root / host / "payload" / "system.slice" / unit
        if not (cg / "cgroup.freeze").exists():
            sys.exit(f"noop_profile: {host} has no cgroup for {unit} ({cg}): is it running there?")
        (cg / "cgroup.freeze").write_text("1" if frozen else "0")
        deadline = time.monotonic() + timeout_s
        while f"frozen {int(frozen)}" not in (cg / "cgroup.events").read_text().split("\n"):
            if time.monotonic() > deadline:
                sys.exit(f"noop_profile: {unit} on {host} did not {'freeze' if frozen else 'thaw'} in {timeout_s:.0f} s")
            time.sleep(0.05)


def summarize(deploy: dict[tuple[str, str], int], idle: dict[tuple[str, str], int],
              roles: dict[str, str]) -> dict[str, dict[str, float]]:
    """{role: {group: ms over all guests of the role, deploy minus idle}} plus `hosts` per role."""
    out: dict[str, dict[str, float]] = {}
    for (guest, group), usec in deploy.items():
        role = role_of(guest, roles)
        out.setdefault(role, {}).setdefault(group, 0.0)
        out[role][group] += (usec - idle.get((guest, group), 0)) / 1000
    guests = {g for g, _ in deploy}
    for role in out:
        out[role]["hosts"] = float(sum(1 for g in guests if role_of(g, roles) == role))
    return out


def lab_cgroup_root() -> tuple[Path, dict[str, str]]:
    """The lab's cgroup in the v2 hierarchy and each guest's role, from the running lab."""
    sys.path.insert(0, str(REPO))
    from pdkit.lab import load_lab

    lab = load_lab()
    if lab is None:
        sys.exit("noop_profile: the lab is down: `pdkit lab up --hosts N` first, then converge it once")
    roles = {h.name: ("monitoring" if h.name == lab.monitoring_host.name else "gpu") for h in lab.hosts}
    for root in UNIFIED_ROOTS:
        for cand in root.glob("**/pdkit-lab-*"):
            if cand.is_dir() and any((cand / name).is_dir() for name in roles):
                return cand, roles
    sys.exit("noop_profile: no cgroup v2 directory of the lab under /sys/fs/cgroup (unified): cannot attribute CPU")


def run_pyinfra(argv: list[str], tree: Path = REPO) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, stdout)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=env)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"noop_profile: {' '.join(argv)} failed:\n{out[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--inventory", default="inventories/lab.py")
    ap.add_argument("--deploy", default="deploy/pd.py")
    ap.add_argument("--tree", type=Path, default=REPO, help="the checkout whose deploy runs (default: this one)")
    ap.add_argument("--out", type=Path, help="write every run's figures as JSON here")
    ap.add_argument("--freeze", type=parse_freeze, action="append", default=[], metavar="HOST:UNIT",
                    help="freeze UNIT on lab host HOST during each run's windows (e.g. lab-mon:prometheus.service)")
    ap.add_argument("extra", nargs="*", help="more pyinfra arguments (after --)")
    args = ap.parse_args()

    root, roles = lab_cgroup_root()
    pyinfra = str(Path(sys.executable).parent / "pyinfra")
    argv = [pyinfra, "-y", args.inventory, args.deploy, *args.extra]
    hz = os.sysconf("SC_CLK_TCK")
    runs = []
    window = 15.0
    for i in range(args.runs):
        freeze(root, args.freeze, True)
        try:
            time.sleep(1.0 if args.freeze else 0.0)  # a scrape in flight when frozen is held, not finished
            idle0 = Snapshot.take(root)
            time.sleep(window)
            idle1 = Snapshot.take(root)
            dep0 = Snapshot.take(root)
            wall, control_cpu, _ = run_pyinfra(argv, args.tree.resolve())
            dep1 = Snapshot.take(root)
        finally:
            freeze(root, args.freeze, False)
        idle_delta = delta(idle0, idle1)
        scale = wall / window  # the idle window's usage, stretched to the deploy's length
        idle = {k: int(v * scale) for k, v in idle_delta.items()}
        summary = summarize(delta(dep0, dep1), idle, roles)
        busy = (dep1.busy_ticks - dep0.busy_ticks) / hz
        idle_busy = (idle1.busy_ticks - idle0.busy_ticks) / hz / window
        runs.append({"wall_s": wall, "control_cpu_s": control_cpu, "machine_busy_cpu_s": busy,
                     "idle_window_s": window, "idle_machine_cores": idle_busy, "groups_ms": summary,
                     "idle_cores": idle_cores(idle_delta, window, roles)})
        print(f"run {i + 1}: wall {wall:.2f} s, control process {control_cpu:.2f} s CPU, machine busy "
              f"{busy:.2f} s CPU ({busy / wall:.2f} of {os.cpu_count()} cores)", flush=True)
        window = max(15.0, wall)  # at least one Prometheus scrape interval of the lab (15 s)

    def med(get) -> float:
        return statistics.median(get(r) for r in runs)

    print(f"\nmedian of {len(runs)} runs: wall {med(lambda r: r['wall_s']):.2f} s, control process "
          f"{med(lambda r: r['control_cpu_s']):.2f} s CPU, machine busy {med(lambda r: r['machine_busy_cpu_s']):.2f} s CPU")
    print(f"idle window: machine busy {med(lambda r: r['idle_machine_cores']):.2f} cores" + (f" (frozen: {', '.join(h + ':' + u for h, u in args.freeze)})" if args.freeze else ""))
    for role in sorted(runs[0]["idle_cores"]):
        busiest = sorted(((g, med(lambda r: r["idle_cores"][role].get(g, 0.0))) for g in runs[0]["idle_cores"][role] if g != "*total"), key=lambda x: -x[1])
        print(f"  {role}: {med(lambda r: r['idle_cores'][role].get('*total', 0.0)):.3f} cores; " + ", ".join(f"{g} {c:.3f}" for g, c in busiest[:6]))
    for role in sorted(runs[0]["groups_ms"]):
        hosts = int(runs[0]["groups_ms"][role]["hosts"])
        groups = sorted((g for g in runs[0]["groups_ms"][role] if g != "hosts"),
                        key=lambda g: -med(lambda r: r["groups_ms"][role].get(g, 0.0)))
        print(f"\n{role} ({hosts} host{'s' if hosts != 1 else ''}): CPU of the no-op minus idle, ms")
        print(f"  {'group':40s} {'all':>9s} {'per host':>9s}")
        for g in groups:
            total = med(lambda r: r["groups_ms"][role].get(g, 0.0))
            if abs(total) < 0.5 * hosts and g != "*total":
                continue
            print(f"  {g:40s} {total:9.1f} {total / hosts:9.1f}")
    if args.out:
        args.out.write_text(json.dumps({"argv": argv[1:], "tree": str(args.tree), "frozen": [f"{h}:{u}" for h, u in args.freeze], "runs": runs}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
