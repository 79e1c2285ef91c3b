"""Cost against cluster size (issue 20): validate + render up to 512 nodes; the lab from 1 to 32 hosts.

    python benchmarks/scale.py --render-only [--sizes 1,4,16,32,128,512] [--repeat 3] [--profile 512]
    sudo python benchmarks/scale.py --lab [--hosts 1,4,16,32] [--batch 4] [--out docs/bench/scale]

--render-only (no host is contacted, no root): for each N a synthetic inventory of N GPU nodes
(8 GPUs each, a TP4 prefill and a TP4 decode as on inventories/cluster.py, a PD group per node
as on inventories/lab.py), one router host fronting every engine and a monitoring host with
Grafana. The inventory is generated text, written to a temporary file because `pdkit validate`
and `pdkit render` read a pyinfra inventory file; each is timed through pdkit's own command line
entry point (`pdkit.cli.main`, in this process, imports already done), render writing every
host's files into a temporary directory. Prints a table; the target is validate + render of 512
nodes under 2 s. --profile N prints cProfile's top functions of one validate + render at N.

--lab (root; the lab of docs/lab.md, so `pdkit lab down` first if one runs): for each N,
`pdkit lab up --hosts N` (a lab of another size is taken down first), the first converge
(`pyinfra -y INV deploy/pd.py`), the no-op re-run, a one-field change rolled with
`pdkit roll --batch K` (decode cuda_graph_max_bs 64 -> 96: the decode units, exporter.json and
release.json change), and Prometheus' own `scrape_duration_seconds` of every target, read from
the monitoring host. INV is inventories/lab.py run against the lab of N hosts (see
`lab_inventory_text`). A step that fails at some N is recorded with its error and the next N
runs. Writes the table (markdown), the raw rows (JSON) and a PNG of time against N into --out.
The lab stays up at the last size (--down-after takes it down).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.roll import lab_copy_lines  # noqa: E402 - after the repository root is on sys.path

RENDER_SIZES = (1, 4, 16, 32, 128, 512)
LAB_SIZES = (1, 4, 16, 32)
TARGET_S = 2.0  # validate + render at 512 nodes (issue 20)
TARGET_NODES = 512
LAB_BASE = "inventories/lab.py"
ROLL_FIELD = "pdkit_cluster.tuning.decode.cuda_graph_max_bs"
ROLL_FROM, ROLL_TO = 64, 96


# ---------------------------------------------------------------------------
# --render-only


def synthetic_inventory_text(nodes: int) -> str:
    """N GPU nodes (TP4 prefill + TP4 decode, a PD group per node), one router host, monitoring with Grafana."""
    lines = [
        f'"""Synthetic: {nodes} GPU node(s) x 8 GPUs, one router, monitoring (benchmarks/scale.py)."""',
        "_GPUS = {'model': 'NVIDIA RTX PRO 6000 Blackwell Server Edition', 'count': 8, 'memory_gib': 96,",
        "         'compute_capability': '12.0', 'numa': [0, 0, 0, 0, 1, 1, 1, 1]}",
        "def _node(i):",
        "    return {'ssh_hostname': f'10.1.{i // 250}.{i % 250 + 1}', 'ssh_user': 'ubuntu', '_sudo': True, 'pdkit_node': {",
        "        'gpus': _GPUS, 'nccl_profile': 'pcie', 'ucx_net_devices': 'mlx5_0:1', 'engines': [",
        "        {'name': 'prefill', 'role': 'prefill', 'gpus': [0, 1, 2, 3], 'port': 30000, 'bootstrap_port': 8998, 'pd_group': f'n{i}'},",
        "        {'name': 'decode', 'role': 'decode', 'gpus': [4, 5, 6, 7], 'port': 30001, 'pd_group': f'n{i}'}]}}",
        f"gpu_nodes = [(f'gpu{{i:03d}}', _node(i)) for i in range({nodes})]",
        "routers = [('router01', {'ssh_hostname': '10.2.0.1', 'ssh_user': 'ubuntu', '_sudo': True, 'pdkit_router': {'port': 8000}})]",
        "monitoring = [('mon01', {'ssh_hostname': '10.2.0.2', 'ssh_user': 'ubuntu', '_sudo': True, 'pdkit_monitoring': {}})]",
        "all = ([h for h, _ in gpu_nodes] + ['router01', 'mon01'], {'pdkit_cluster': {",  # noqa: A001 - pyinfra's group name
        "    'name': 'scale', 'engine': 'sglang', 'sglang_version': '0.5.23',",
        "    'model': {'path': '/models/DeepSeek-V4-Flash', 'served_name': 'deepseek-v4-flash', 'trust_remote_code': True},",
        "    'transfer_backend': 'nixl', 'target_concurrency': 64,",
        "    'tuning': {'all': {'context_length': 8192, 'mem_fraction_static': 0.88},",
        "               'decode': {'cuda_graph': True, 'cuda_graph_max_bs': 64, 'num_continuous_decode_steps': 4}}}})",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class RenderRow:
    nodes: int
    hosts: int = 0
    engines: int = 0
    files: int = 0
    validate_s: list[float] = field(default_factory=list)
    render_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def validate(self) -> float:
        return statistics.median(self.validate_s) if self.validate_s else float("nan")

    @property
    def render(self) -> float:
        return statistics.median(self.render_s) if self.render_s else float("nan")

    @property
    def total(self) -> float:
        return self.validate + self.render


def _quiet(fn: Callable[[], int]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = fn()
    return rc, out.getvalue() + err.getvalue()


def time_validate_render(inventory: Path, out_dir: Path) -> tuple[float, float, str]:
    """`pdkit validate INV` and `pdkit render INV --out DIR`, each through pdkit's CLI entry point."""
    from pdkit.cli import main as pdkit_main

    t0 = time.perf_counter()
    rc, text = _quiet(lambda: pdkit_main(["validate", str(inventory)]))
    t1 = time.perf_counter()
    if rc != 0:
        return t1 - t0, float("nan"), f"pdkit validate exited {rc}: {text.strip()[-500:]}"
    rc, text = _quiet(lambda: pdkit_main(["render", str(inventory), "--out", str(out_dir)]))
    t2 = time.perf_counter()
    if rc != 0:
        return t1 - t0, t2 - t1, f"pdkit render exited {rc}: {text.strip()[-500:]}"
    return t1 - t0, t2 - t1, ""


def render_bench(sizes: Sequence[int], repeat: int, tmp: Path) -> list[RenderRow]:
    rows = []
    for n in sizes:
        row = RenderRow(n)
        outs: list[Path] = []
        for i in range(repeat):
            # a new file name each round: pyinfra caches compiled inventory files by path
            inv = tmp / f"scale{n}_{i}.py"
            inv.write_text(synthetic_inventory_text(n))
            out = tmp / f"out{n}_{i}"
            v, r, err = time_validate_render(inv, out)
            row.validate_s.append(v)
            if err:
                row.error = err
                break
            row.render_s.append(r)
            if i == 0:
                row.files = sum(1 for p in out.rglob("*") if p.is_file())
                row.hosts = sum(1 for p in out.iterdir() if p.is_dir())
                row.engines = 2 * n
            outs.append(out)
        # removed after the size's rounds, not between them: a removal's journal work would land in the next round
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
        rows.append(row)
    return rows


def render_table(rows: Sequence[RenderRow]) -> str:
    head = ("| GPU nodes | hosts | engines | files | `pdkit validate` | `pdkit render` | validate + render |\n"
            "|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        if r.error:
            body += f"| {r.nodes} | {r.hosts} | {r.engines} | {r.files} | failed: {r.error} | | |\n"
            continue
        body += (f"| {r.nodes} | {r.hosts} | {r.engines} | {r.files} | {r.validate * 1000:.0f} ms | "
                 f"{r.render * 1000:.0f} ms | **{r.total * 1000:.0f} ms** |\n")
    return head + body


def profile_once(n: int, tmp: Path, top: int = 25) -> str:
    inv = tmp / f"profile{n}.py"
    inv.write_text(synthetic_inventory_text(n))
    prof = cProfile.Profile()
    prof.enable()
    time_validate_render(inv, tmp / f"profile-out{n}")
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def filesystem_of(path: Path) -> str:
    """The filesystem type PATH lives on (/proc/mounts' longest matching mount point)."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) >= len(best):
            best, kind = parts[1], f"{parts[2]} on {parts[1]}"
    return kind


def main_render(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="pdkit-scale-", dir=args.out_dir) as tmp_name:
        tmp = Path(tmp_name)
        # imports (pyinfra's CLI pulls in gevent, pydantic, jinja2) once, outside the figures
        time_validate_render(_write(tmp / "warm.py", synthetic_inventory_text(1)), tmp / "warm-out")
        rows = render_bench(sizes, args.repeat, tmp)
        if args.profile:
            print(profile_once(args.profile, tmp))
        where = filesystem_of(tmp)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(f"validate + render against cluster size: median of {args.repeat} run(s), in-process "
          f"(`pdkit.cli.main`), {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"rendered into {where}, load average {load}")
    print(render_table(rows))
    verdict = target_verdict(rows)
    print(verdict)
    return 0 if verdict.endswith("met") else 1


def target_verdict(rows: Sequence[RenderRow]) -> str:
    at = [r for r in rows if r.nodes == TARGET_NODES and not r.error]
    if not at:
        return f"target (validate + render of {TARGET_NODES} nodes < {TARGET_S:.0f} s): not measured"
    total = at[0].total
    return (f"target (validate + render of {TARGET_NODES} nodes < {TARGET_S:.0f} s): "
            f"{total:.2f} s, {'met' if total < TARGET_S else 'NOT met'}")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------
# --lab: the steps at each size, behind an interface (`LabSteps`) the tests replace with fakes


def lab_inventory_text(n: int, *, max_bs: int | None = None, repo: Path = REPO) -> str:
    """inventories/lab.py run against the lab of N GPU hosts: the running lab when it has N GPU
    hosts (lab.py reads lab.json), the hosts `pdkit lab up --hosts N` creates when the lab is
    down (lab.py falls back to the planned lab, of N hosts here), an error naming the fix when
    a lab of another size runs. MAX_BS: the decode cuda_graph_max_bs of the rolled change."""
    lines = [
        f'"""inventories/lab.py on a lab of {n} GPU host(s) (benchmarks/scale.py --lab)."""',
        "import copy, runpy",
        "import pdkit.lab as _pdlab",
        f"_N = {n}",
        "_running = _pdlab.load_lab()",
        "if _running is not None and len(_running.gpu_hosts) != _N:",
        "    raise RuntimeError(f'the running lab has {len(_running.gpu_hosts)} GPU hosts, this inventory is for {_N}: "
        "pdkit lab down && pdkit lab up --hosts {_N}')",
        "# lab.py takes the running lab, else the planned one: the planned lab of N hosts",
        "_planned = _pdlab.planned_lab",
        "_pdlab.planned_lab = lambda n_gpu=_N: _planned(n_gpu)",
        "try:",
        f"    _base = runpy.run_path({str(repo / LAB_BASE)!r})",
        "finally:",
        "    _pdlab.planned_lab = _planned",
        *lab_copy_lines(max_bs),
    ]
    return "\n".join(lines) + "\n"


@dataclass
class LabRow:
    """One lab size: each step's wall time (None: not reached), and the first failure."""

    gpu_hosts: int
    batch: int
    lab_up_s: float | None = None
    converge_s: float | None = None
    noop_s: float | None = None
    noop_changed: int | None = None  # operations the no-op re-run changed (0 expected)
    roll_s: float | None = None
    scrape_median_s: float | None = None
    scrape_max_s: float | None = None
    scrape_targets: int | None = None
    targets_up: int | None = None
    targets_down: list[str] = field(default_factory=list)  # "job instance" of each target not up at the end
    scrape_by_job: dict[str, float] = field(default_factory=dict)  # job -> max scrape_duration_seconds
    memory_mib: float | None = None  # PSS of every lab container after the converge
    failed: str = ""  # "step: what went wrong"; the steps after it were not run


class StepFailed(Exception):
    """A step of one lab size failed; the message is what the table shows."""


class LabSteps:
    """The steps of one size, run for real (root, docs/lab.md)."""

    def __init__(self, repo: Path = REPO, python: str = sys.executable):
        self.repo = repo
        self.bin = Path(python).parent

    def _run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(argv, cwd=self.repo, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise StepFailed(f"{' '.join(argv[:3])} ... did not finish in {timeout:.0f} s") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise StepFailed(f"{Path(argv[0]).name} {' '.join(argv[1:3])} exited {proc.returncode}: {' / '.join(tail)}")
        return proc

    def lab_up(self, n: int) -> float:
        from pdkit.lab import load_lab

        if load_lab() is not None:
            self._run([str(self.bin / "pdkit"), "lab", "down"], 600)
        t0 = time.monotonic()
        self._run([str(self.bin / "pdkit"), "lab", "up", "--hosts", str(n)], 1200)
        return time.monotonic() - t0

    def deploy(self, inventory: Path) -> tuple[float, int]:
        """`pyinfra -y INV deploy/pd.py`: (seconds, operations that changed something)."""
        t0 = time.monotonic()
        proc = self._run([str(self.bin / "pyinfra"), "-y", str(inventory), "deploy/pd.py", "--json"], 3600)
        return time.monotonic() - t0, changed_operations(proc.stdout)

    def roll(self, inventory: Path, batch: int) -> float:
        t0 = time.monotonic()
        self._run([str(self.bin / "pdkit"), "roll", str(inventory), "--batch", str(batch)], 3600)
        return time.monotonic() - t0

    def memory_mib(self) -> float | None:
        from pdkit.lab import status

        pss = [h.memory_pss for h in status(probe_ssh=False).hosts]
        return sum(pss) / 2**20 if pss and all(p is not None for p in pss) else None  # type: ignore[misc]

    def scrape(self, timeout: float = 180) -> list[tuple[str, str, float, bool]]:
        """(job, instance, scrape_duration_seconds, up) of every target of the lab's Prometheus, once
        every target is up after the roll (or the timeout) and one more scrape interval went by."""
        import requests

        from pdkit.lab import load_lab

        lab = load_lab()
        if lab is None:
            raise StepFailed("the lab is down")
        url = f"http://{lab.monitoring_host.address}:9090/api/v1/query"

        def query(q: str) -> dict[tuple[str, str], float]:
            body = requests.get(url, params={"query": q}, timeout=10).json()
            return {(r["metric"].get("job", ""), r["metric"].get("instance", "")): float(r["value"][1]) for r in body["data"]["result"]}

        deadline = time.monotonic() + timeout
        while True:
            up = query("up")
            if up and all(v == 1 for v in up.values()) or time.monotonic() > deadline:
                break
            time.sleep(5)
        time.sleep(16)  # a full 15 s interval: every target scraped since the roll settled
        up, durations = query("up"), query("scrape_duration_seconds")
        if not durations:
            raise StepFailed("Prometheus has no scrape_duration_seconds")
        return [(job, inst, d, up.get((job, inst)) == 1) for (job, inst), d in sorted(durations.items())]


def changed_operations(pyinfra_json: str) -> int:
    """Operations that changed something on some host, from `pyinfra --json` output."""
    try:
        results = json.loads(pyinfra_json) if pyinfra_json.strip() else {}
    except json.JSONDecodeError:
        return -1
    return sum(1 for op in results.get("results", {}).get("operations", []) if op.get("success"))


def run_lab(sizes: Sequence[int], batch: int, steps, workdir: Path, on_row: Callable[[list[LabRow]], None] | None = None) -> list[LabRow]:
    """Every size in turn; a failed step is recorded on its row and the next size runs."""
    rows: list[LabRow] = []
    for n in sizes:
        row = LabRow(n, batch=max(1, min(batch, n - 1)))
        rows.append(row)
        base = _write(workdir / f"lab{n}.py", lab_inventory_text(n))
        changed = _write(workdir / f"lab{n}_rolled.py", lab_inventory_text(n, max_bs=ROLL_TO))
        step = "lab up"
        try:
            row.lab_up_s = steps.lab_up(n)
            step = "first converge"
            row.converge_s, _ = steps.deploy(base)
            step = "memory"
            row.memory_mib = steps.memory_mib()
            step = "no-op re-run"
            row.noop_s, row.noop_changed = steps.deploy(base)
            step = f"roll --batch {row.batch}"
            row.roll_s = steps.roll(changed, row.batch)
            step = "scrape durations"
            scraped = steps.scrape()
            durations = [d for _, _, d, _ in scraped]
            row.scrape_targets = len(scraped)
            row.targets_up = sum(1 for *_, ok in scraped if ok)
            row.targets_down = [f"{job} {inst}" for job, inst, _, ok in scraped if not ok]
            row.scrape_median_s = statistics.median(durations)
            row.scrape_max_s = max(durations)
            for job, _, d, _ in scraped:
                row.scrape_by_job[job] = max(row.scrape_by_job.get(job, 0.0), d)
        except Exception as exc:  # noqa: BLE001 - one size's failure is a result, not the end of the run
            row.failed = f"{step}: {exc}"
        if on_row is not None:
            on_row(rows)
    return rows


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def lab_table(rows: Sequence[LabRow]) -> str:
    head = ("| GPU hosts | `lab up` | first converge | no-op re-run (ops changed) | one-field roll | "
            "scrape duration median / max (targets up) | lab memory (PSS) | result |\n"
            "|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        noop = "-" if r.noop_s is None else f"{r.noop_s:.1f} s ({r.noop_changed})"
        roll = "-" if r.roll_s is None else f"{r.roll_s:.1f} s (`--batch {r.batch}`)"
        down = f"; down: {', '.join(r.targets_down)}" if r.targets_down else ""
        scrape = "-" if r.scrape_median_s is None else f"{_ms(r.scrape_median_s)} / {_ms(r.scrape_max_s)} ({r.targets_up}/{r.scrape_targets}{down})"
        mem = "-" if r.memory_mib is None else f"{r.memory_mib / 1024:.1f} GiB"
        result = f"FAILED at {r.failed}".replace("|", "/") if r.failed else "ok"
        body += f"| {r.gpu_hosts} | {_s(r.lab_up_s)} | {_s(r.converge_s)} | {noop} | {roll} | {scrape} | {mem} | {result} |\n"
    return head + body


def write_plot(rows: Sequence[LabRow], path: Path) -> Path:
    """Time of each step against the number of GPU hosts; scrape durations on their own axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def plot(ax, lines: tuple[tuple[str, str], ...], scale: float, ylabel: str, title: str) -> None:
        """One line per (LabRow field, label), its values times SCALE, against the number of GPU hosts."""
        for attr, label in lines:
            pts = [(r.gpu_hosts, getattr(r, attr) * scale) for r in rows if getattr(r, attr) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.set_xlabel("GPU hosts (lab)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)

    fig, (steps_ax, scrape_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    plot(steps_ax, (("lab_up_s", "pdkit lab up"), ("converge_s", "first converge"), ("noop_s", "no-op re-run"),
                    ("roll_s", "one-field pdkit roll")), 1, "seconds", "lab steps against cluster size")
    failed = [r for r in rows if r.failed]
    for r in failed:
        steps_ax.axvline(r.gpu_hosts, color="red", alpha=0.3, linestyle=":")
        steps_ax.annotate(f"failed: {r.failed.split(':')[0]}", (r.gpu_hosts, 0), rotation=90, fontsize=7, color="red",
                          xytext=(3, 5), textcoords="offset points")
    plot(scrape_ax, (("scrape_median_s", "median"), ("scrape_max_s", "max")), 1000, "ms",
         "Prometheus scrape_duration_seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_lab_results(rows: Sequence[LabRow], out: Path, when: str | None = None) -> dict[str, Path]:
    """scale-lab.md (table), scale-lab.json (rows), scale-lab.png (plot) under OUT."""
    out.mkdir(parents=True, exist_ok=True)
    when = when or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    md = out / "scale-lab.md"
    md.write_text(
        f"# The lab against cluster size ({when})\n\n"
        f"`benchmarks/scale.py --lab`: per size, `pdkit lab up --hosts N`, the first converge, the no-op re-run, "
        f"{ROLL_FIELD} {ROLL_FROM} -> {ROLL_TO} rolled with `pdkit roll --batch K`, and Prometheus' own "
        f"scrape_duration_seconds over every target. Control machine: {os.cpu_count()} CPUs.\n\n"
        + lab_table(rows) + "\n![time against N](scale-lab.png)\n"
    )
    js = out / "scale-lab.json"
    js.write_text(json.dumps({"when": when, "cpus": os.cpu_count(), "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    png = write_plot(rows, out / "scale-lab.png")
    return {"md": md, "json": js, "png": png}


def main_lab(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("--lab needs root (the lab is systemd-nspawn containers): sudo .venv/bin/python benchmarks/scale.py --lab", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.hosts.split(",")]
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="pdkit-scale-lab-") as tmp:
        def progress(rows: list[LabRow]) -> None:
            r = rows[-1]
            print(f"{r.gpu_hosts} GPU host(s): {'FAILED at ' + r.failed if r.failed else 'ok'}", flush=True)
            write_lab_results(rows, out)

        rows = run_lab(sizes, args.batch, LabSteps(), Path(tmp), on_row=progress)
    print(lab_table(rows))
    print(f"written: {out}/scale-lab.md, scale-lab.json, scale-lab.png")
    if args.down_after:
        subprocess.run([str(Path(sys.executable).parent / "pdkit"), "lab", "down"], cwd=REPO, check=False)
    else:
        print(f"the lab is left up with {sizes[-1]} GPU host(s) on the rolled change; `pdkit lab down` removes it")
    return 1 if any(r.failed for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--render-only", action="store_true", help="validate + render of synthetic inventories, no host contacted")
    mode.add_argument("--lab", action="store_true", help="the lab at each size (root)")
    parser.add_argument("--sizes", default=",".join(map(str, RENDER_SIZES)), help="--render-only: GPU node counts")
    parser.add_argument("--repeat", type=int, default=3, help="--render-only: runs per size (the median is shown)")
    parser.add_argument("--profile", type=int, metavar="N", help="--render-only: cProfile one validate + render at N nodes")
    parser.add_argument("--out-dir", help="--render-only: render under this directory (default $TMPDIR; e.g. /dev/shm to leave the disk out)")
    parser.add_argument("--hosts", default=",".join(map(str, LAB_SIZES)), help="--lab: GPU host counts (the lab allows 1-40)")
    parser.add_argument("--batch", type=int, default=4, metavar="K", help="--lab: pdkit roll --batch K (at most N - 1)")
    parser.add_argument("--out", default=str(REPO / "docs" / "bench" / "scale"), help="--lab: where the table, JSON and PNG go")
    parser.add_argument("--down-after", action="store_true", help="--lab: take the lab down at the end")
    args = parser.parse_args(argv)
    if args.render_only:
        return main_render(args)
    return main_lab(args)


if __name__ == "__main__":
    sys.exit(main())
