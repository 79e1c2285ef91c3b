"""Validate + render a generated 64-node / 512-GPU inventory; target <= 1 s on a 2-core machine.

    python benchmarks/render.py [--nodes 64] [--repeat 5]

Prints the median wall time of each phase and of the whole `pdkit render`, so the figure can
be copied into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdkit.cli import main as pdkit_main  # noqa: E402
from pdkit.inventory.loader import load  # noqa: E402
from pdkit.render.plan import plan_cluster  # noqa: E402

TARGET_S = 1.0


def inventory_text(nodes: int) -> str:
    """8 GPUs per node, two NUMA halves, a TP4 prefill and a TP4 decode on each: the seed layout x N."""
    lines = [
        "_GPUS = {'model': 'NVIDIA RTX PRO 6000 Blackwell Server Edition', 'count': 8, 'memory_gib': 96,",
        "         'compute_capability': '12.0', 'numa': [0, 0, 0, 0, 1, 1, 1, 1]}",
        "def _node(i):",
        "    return {'ssh_hostname': f'10.1.{i // 250}.{i % 250 + 1}', 'pdkit_node': {'gpus': _GPUS, 'nccl_profile': 'pcie', 'ucx_net_devices': 'mlx5_0:1', 'engines': [",
        "        {'name': 'prefill', 'role': 'prefill', 'gpus': [0, 1, 2, 3], 'port': 30000, 'pd_group': f'g{i}'},",
        "        {'name': 'decode', 'role': 'decode', 'gpus': [4, 5, 6, 7], 'port': 30001, 'pd_group': f'g{i}'}]}}",
        f"gpu_nodes = [(f'gpu{{i:03d}}', _node(i)) for i in range({nodes})]",
        "routers = [('router01', {'ssh_hostname': '10.2.0.1', 'pdkit_router': {}})]",
        "monitoring = [('mon01', {'ssh_hostname': '10.2.0.2', 'pdkit_monitoring': {}})]",
        "all = ([h for h, _ in gpu_nodes] + ['router01', 'mon01'], {'pdkit_cluster': {",
        "    'name': 'bench', 'model': {'path': '/models/DeepSeek-V4-Flash', 'trust_remote_code': True},",
        "    'target_concurrency': 64, 'tuning': {'all': {'context_length': 8192, 'mem_fraction_static': 0.88},",
        "    'decode': {'cuda_graph_max_bs': 64, 'num_continuous_decode_steps': 4}}}})",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    load_s, plan_s, total_s = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            # a new file name each round: pyinfra caches compiled inventory files by path
            inv = Path(tmp) / f"bench{i}.py"
            inv.write_text(inventory_text(args.nodes))
            t0 = time.perf_counter()
            spec = load(inv)
            t1 = time.perf_counter()
            plans = plan_cluster(spec)
            t2 = time.perf_counter()
            load_s.append(t1 - t0)
            plan_s.append(t2 - t1)

            inv2 = Path(tmp) / f"bench{i}_cli.py"
            inv2.write_text(inventory_text(args.nodes))
            out = Path(tmp) / f"out{i}"
            with open(os.devnull, "w") as devnull:
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    t3 = time.perf_counter()
                    rc = pdkit_main(["render", str(inv2), "--out", str(out)])
                    t4 = time.perf_counter()
                finally:
                    sys.stdout = stdout
            assert rc == 0
            total_s.append(t4 - t3)
        files = sum(len(p.files) for p in plans.values())
        # the same from a fresh process, as a user runs it (includes Python and pyinfra imports)
        inv3 = Path(tmp) / "cold.py"
        inv3.write_text(inventory_text(args.nodes))
        t5 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pdkit.cli", "render", str(inv3), "--out", str(Path(tmp) / "cold")], check=True, capture_output=True)
        cold_s = time.perf_counter() - t5
    gpus = sum(h.node.gpus.count for h in spec.gpu_hosts)
    med = statistics.median(total_s)
    print(f"inventory: {args.nodes} GPU nodes, {gpus} GPUs, {len(spec.engines())} engines, {len(spec.hosts)} hosts, {files} files")
    print(f"validate (load + checks): median {statistics.median(load_s) * 1000:.0f} ms")
    print(f"plan (argv, env, units):  median {statistics.median(plan_s) * 1000:.0f} ms")
    print(f"pdkit render end to end:  median {med * 1000:.0f} ms (min {min(total_s) * 1000:.0f}, max {max(total_s) * 1000:.0f}, {args.repeat} runs)")
    print(f"`pdkit render` as a new process (imports included): {cold_s * 1000:.0f} ms")
    print(f"target <= {TARGET_S:.1f} s: {'MET' if med <= TARGET_S else 'MISSED'}")
    return 0 if med <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
