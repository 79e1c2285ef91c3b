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
            shutil.rmtree(out)
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


def main_render(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="pdkit-scale-") as tmp_name:
        tmp = Path(tmp_name)
        # imports (pyinfra's CLI pulls in gevent, pydantic, jinja2) once, outside the figures
        time_validate_render(_write(tmp / "warm.py", synthetic_inventory_text(1)), tmp / "warm-out")
        rows = render_bench(sizes, args.repeat, tmp)
        if args.profile:
            print(profile_once(args.profile, tmp))
    print(f"validate + render against cluster size: median of {args.repeat} run(s), in-process "
          f"(`pdkit.cli.main`), {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--render-only", action="store_true", help="validate + render of synthetic inventories, no host contacted")
    mode.add_argument("--lab", action="store_true", help="the lab at each size (root)")
    parser.add_argument("--sizes", default=",".join(map(str, RENDER_SIZES)), help="--render-only: GPU node counts")
    parser.add_argument("--repeat", type=int, default=3, help="--render-only: runs per size (the median is shown)")
    parser.add_argument("--profile", type=int, metavar="N", help="--render-only: cProfile one validate + render at N nodes")
    args = parser.parse_args(argv)
    if args.render_only:
        return main_render(args)
    raise SystemExit("--lab: not written yet")


if __name__ == "__main__":
    sys.exit(main())
