"""Time the main job on the lab: first converge on fresh hosts (wheelhouse warm) and the no-op re-run.

    sudo .venv/bin/python benchmarks/deploy.py [--hosts 3] [--reruns 3] [--keep]
    sudo .venv/bin/python benchmarks/deploy.py --keep --engine-venv [--sglang-version 0.5.23] [--sftp]

With --engine-venv it times the real engine venv (sglang from its lock, ~4.4 GB of wheels)
instead: the raw transfer of the bundle to one lab host over SFTP (paramiko, what pyinfra's
files.put uses) and over HTTP (pdkit's bundle server), then a first converge of an
`engine: sglang` cluster on one lab host and on every lab host, each with the aggregate MB/s.
That cluster lives in its own install/config directories and is removed afterwards.

Target: the no-op re-run takes <= 5 s for 3 GPU hosts + the monitoring host. It recreates the
lab (so the first converge really starts from bare hosts), builds the wheelhouse first (so the
figure is the deploy, not PyPI), and prints every figure for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TARGET_NOOP_S = 5.0


def timed(cmd: list[str], timeout: int = 1200) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - start, proc


def deploy() -> tuple[float, dict]:
    seconds, proc = timed([str(BIN / "pyinfra"), "inventories/lab.py", "deploy/pd.py", "-y", "--json"])
    if proc.returncode != 0:
        sys.exit(f"deploy failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout)


def changed_ops(results: dict) -> int:
    return sum(1 for op in results["results"]["operations"] if op.get("success"))


ENGINE_INSTALL_DIR = "/opt/pdkit-bench-engine"
ENGINE_CONFIG_DIR = "/etc/pdkit-bench-engine"
ENGINE_UNITS = ("pdkit-engine-bprefill.service", "pdkit-engine-bdecode.service", "pdkit-router.service", "pdkit-exporter.service")


def engine_inventory(lab, hosts, version: str, transfer: str) -> Path:
    """An `engine: sglang` cluster on HOSTS (gpu: none: laid down, not started), its own dirs."""
    import pprint
    import tempfile

    nodes = []
    for i, host in enumerate(hosts):
        data = {
            **lab.pyinfra_data(host),
            "pdkit_node": {
                "gpu": "none", "nccl_profile": "nvlink",
                "gpus": {"model": "NVIDIA H200 (lab)", "count": 2, "memory_gib": 141, "compute_capability": "9.0", "numa": [0, 0]},
                "engines": [
                    {"name": "bprefill", "role": "prefill", "gpus": [0], "port": 32000, "bootstrap_port": 8997, "pd_group": host.name},
                    {"name": "bdecode", "role": "decode", "gpus": [1], "port": 32001, "pd_group": host.name},
                ],
            },
        }
        if i == 0:
            data["pdkit_router"] = {"port": 8200, "prometheus_port": 29200}
        nodes.append((host.name, data))
    cluster = {
        "name": "benchengine", "engine": "sglang", "sglang_version": version, "wheelhouse_transfer": transfer,
        "model": {"path": "/models/Qwen3-8B", "served_name": "qwen3-8b"},
        "install_dir": ENGINE_INSTALL_DIR, "config_dir": ENGINE_CONFIG_DIR,
    }
    path = Path(tempfile.mkdtemp(prefix="pdkit-bench-")) / "engine.py"
    path.write_text(f"nodes = {pprint.pformat(nodes)}\nall = ({[h.name for h in hosts]!r}, {pprint.pformat({'pdkit_cluster': cluster})})\n")
    return path


def remove_engine_cluster(lab, hosts) -> None:
    from pdkit import lab as pdlab

    units = " ".join(ENGINE_UNITS)
    paths = " ".join(f"/etc/systemd/system/{u}" for u in ENGINE_UNITS)
    for host in hosts:
        pdlab.ssh_run(lab, host, f"systemctl disable --now {units} 2>/dev/null; rm -f {paths}; rm -rf {ENGINE_INSTALL_DIR} {ENGINE_CONFIG_DIR} /opt/pdkit-bench.tar; systemctl daemon-reload", timeout=300)


def raw_transfers(lab, host, bundle) -> None:
    """The bundle to one host: SFTP (paramiko, as pyinfra's files.put) vs a node fetching over HTTP."""
    import paramiko

    from pdkit import lab as pdlab
    from pdkit.wheels import bundleserver

    tarball = bundle.tarball()
    size_mb = tarball.stat().st_size / 1e6
    client = paramiko.SSHClient()
    client.load_host_keys(str(lab.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(host.address, port=host.ssh_port, username=host.ssh_user, key_filename=str(lab.ssh_key), allow_agent=False, look_for_keys=False)
    try:
        start = time.perf_counter()
        client.open_sftp().put(str(tarball), "/opt/pdkit-bench.tar")  # on disk: /tmp is a small tmpfs
        sftp_s = time.perf_counter() - start
    finally:
        client.close()
        pdlab.ssh_run(lab, host, "rm -f /opt/pdkit-bench.tar")
    print(f"raw SFTP upload to {host.name} (paramiko): {size_mb:.0f} MB in {sftp_s:.1f} s = {size_mb / sftp_s:.0f} MB/s")

    url = bundleserver.serve(bundle, lab.bridge_address)
    fetch = (
        "import sys, time, urllib.request\n"
        "base = sys.argv[1]; names = sys.argv[2:]; t = time.time(); n = 0\n"
        "for name in names:\n"
        "    with urllib.request.urlopen(base + name) as r:\n"
        "        while True:\n"
        "            b = r.read(1 << 20)\n"
        "            if not b: break\n"
        "            n += len(b)\n"
        "print(n, time.time() - t)\n"
    )
    import shlex

    names = " ".join(shlex.quote(w.name) for w in bundle.wheels)
    proc = pdlab.ssh_run(lab, host, f"python3 -c {shlex.quote(fetch)} {shlex.quote(url)} {names}", timeout=1800)
    got, seconds = proc.stdout.split()
    print(f"raw HTTP fetch by {host.name} from the bundle server: {int(got) / 1e6:.0f} MB in {float(seconds):.1f} s = {int(got) / 1e6 / float(seconds):.0f} MB/s")
    bundleserver.stop_all()


def engine_venv_phase(args) -> None:
    from pdkit import lab as pdlab
    from pdkit.wheels import wheelhouse
    from pdkit.wheels.platforms import KNOWN_PLATFORMS

    lab = pdlab.load_lab()
    if lab is None:
        sys.exit("the lab is not up: `pdkit lab up` (or run without --keep)")
    start = time.perf_counter()
    bundle = wheelhouse.engine_bundle(KNOWN_PLATFORMS["debian12"], "sglang", args.sglang_version)
    print(f"engine bundle sglang {args.sglang_version} for debian12: {len(bundle.wheels)} wheels, {bundle.size / 1e6:.0f} MB ({time.perf_counter() - start:.1f} s, cache warm or not)")
    hosts = lab.gpu_hosts
    remove_engine_cluster(lab, hosts)
    raw_transfers(lab, hosts[0], bundle)
    runs = [("http", hosts[:1]), ("http", hosts)]
    if args.sftp:
        # one host only: SFTP unpacks a 4.4 GB tarball beside the 11 GB venv on each host
        runs += [("sftp", hosts[:1])]
    for transfer, subset in runs:
        inventory = engine_inventory(lab, subset, args.sglang_version, transfer)
        seconds, proc = timed([str(BIN / "pyinfra"), str(inventory), "deploy/pd.py", "-y"], timeout=7200)
        remove_engine_cluster(lab, subset)
        if proc.returncode != 0:
            sys.exit(f"engine-venv deploy ({transfer}, {len(subset)} hosts) failed:\n{proc.stderr[-3000:]}{proc.stdout[-3000:]}")
        total_mb = bundle.size / 1e6 * len(subset)
        print(f"engine-venv first converge, {transfer}, {len(subset)} host(s): {seconds:.1f} s ({total_mb:.0f} MB moved, {total_mb / seconds:.0f} MB/s aggregate incl. pip install)")
    if args.keep:
        # the engine cluster reused the lab's router/exporter unit names on lab-gpu1..N: put the lab back
        seconds, proc = timed([str(BIN / "pyinfra"), "inventories/lab.py", "deploy/pd.py", "-y"], timeout=1800)
        print(f"lab cluster re-converged after the engine runs: {seconds:.1f} s (rc {proc.returncode})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, help="GPU hosts (plus the monitoring host)")
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="reuse the running lab instead of recreating it")
    parser.add_argument("--engine-venv", action="store_true", help="time the real engine venv install instead (see above)")
    parser.add_argument("--sglang-version", default="0.5.23")
    parser.add_argument("--sftp", action="store_true", help="with --engine-venv: also converge over SFTP (slow)")
    args = parser.parse_args()
    pdkit = str(BIN / "pdkit")
    if args.engine_venv:
        if not args.keep:
            subprocess.run([pdkit, "lab", "down"], cwd=REPO, capture_output=True, timeout=300)
            proc = subprocess.run([pdkit, "lab", "up", "--hosts", str(args.hosts)], cwd=REPO, capture_output=True, text=True, timeout=1200)
            if proc.returncode != 0:
                sys.exit(f"lab up failed:\n{proc.stderr[-2000:]}")
        sys.path.insert(0, str(REPO))
        engine_venv_phase(args)
        return 0

    if not args.keep:
        subprocess.run([pdkit, "lab", "down"], cwd=REPO, capture_output=True, timeout=300)
        up_s, proc = timed([pdkit, "lab", "up", "--hosts", str(args.hosts)])
        if proc.returncode != 0:
            sys.exit(f"lab up failed:\n{proc.stderr[-2000:]}")
        print(f"lab up (rootfs cached): {up_s:.1f} s")
    wh_s, proc = timed([str(BIN / "python"), "-m", "pdkit.wheels.wheelhouse", "--python", "3.11"])
    if proc.returncode != 0:
        sys.exit(f"wheelhouse build failed:\n{proc.stderr[-2000:]}")
    print(f"wheelhouse (warm cache check): {wh_s:.1f} s")

    first_s, results = deploy()
    label = "first converge on fresh hosts" if not args.keep else "converge on the running lab"
    print(f"{label}: {first_s:.1f} s ({changed_ops(results)} operations changed something)")

    noop = []
    for _ in range(args.reruns):
        seconds, results = deploy()
        if changed_ops(results):
            sys.exit(f"a re-run changed {changed_ops(results)} operations: not a no-op")
        noop.append(seconds)
    med = statistics.median(noop)
    print(f"no-op re-run: median {med:.2f} s (runs: {', '.join(f'{s:.2f}' for s in noop)}), 0 operations changed")
    print(f"target no-op <= {TARGET_NOOP_S:.0f} s for {args.hosts} GPU hosts + monitoring: {'MET' if med <= TARGET_NOOP_S else 'MISSED'}")
    return 0 if med <= TARGET_NOOP_S else 1


if __name__ == "__main__":
    sys.exit(main())
