"""The environment fingerprint of a bench record (its `env`): what the numbers depend on, i.e. the
planned release hashes, SGLang and router versions, engine flags, GPUs and their driver (one SSH
`nvidia-smi` per GPU node, host keys always checked)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pdkit.inventory.loader import read_inventory
from pdkit.render.flags import sglang_args
from pdkit.render.plan import plan_cluster

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

SSH_TIMEOUT_S = 20
NVIDIA_SMI_DRIVER = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"


def spec_hash(spec: ClusterSpec) -> str:
    """sha256 over every host's planned release hash: equal hashes mean the same rendered cluster."""
    digest = hashlib.sha256()
    for host, plan in sorted(plan_cluster(spec).items()):
        digest.update(f"{host}\0{plan.release_hash}\n".encode())
    return digest.hexdigest()


def engine_flags(spec: ClusterSpec) -> dict[str, list[str]]:
    """The planned sglang argv of every engine, keyed host/engine."""
    return {f"{h.name}/{e.name}": sglang_args(spec, h, e) for h, e in spec.engines()}


def ssh_command(host_data: dict[str, Any], remote: str) -> list[str]:
    """OpenSSH argv for one command on a host from its pyinfra SSH data; host keys always checked."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={SSH_TIMEOUT_S}"]
    if host_data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={host_data['ssh_known_hosts_file']}"]
    if host_data.get("ssh_key"):
        argv += ["-i", str(host_data["ssh_key"]), "-o", "IdentitiesOnly=yes"]
    if host_data.get("ssh_port"):
        argv += ["-p", str(host_data["ssh_port"])]
    target = str(host_data.get("ssh_hostname") or host_data["name"])
    if host_data.get("ssh_user"):
        target = f"{host_data['ssh_user']}@{target}"
    return argv + ["--", target, remote]


def parse_driver_versions(text: str) -> str:
    """nvidia-smi's one-version-per-GPU output -> the version ("a, b" if GPUs disagree)."""
    versions = sorted({line.strip() for line in text.splitlines() if line.strip()})
    return ", ".join(versions) if versions else "unknown: nvidia-smi printed nothing"


def probe_driver(host_data: dict[str, Any], run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """The NVIDIA driver version of one host over SSH, or "unknown: <why>"."""
    try:
        done = run(ssh_command(host_data, NVIDIA_SMI_DRIVER), capture_output=True, text=True,
                   timeout=SSH_TIMEOUT_S + 10)
    except FileNotFoundError:
        # seen on the lent GPU machine, whose image has no OpenSSH client (pyinfra uses paramiko)
        return "unknown: no `ssh` client on this machine (install openssh-client, or pass --no-ssh)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown: {type(exc).__name__}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"unknown: {why[:120]}"
    return parse_driver_versions(done.stdout)


def _inventory_ssh_data(inventory: str) -> dict[str, dict[str, Any]]:
    return {name: {**data, "name": name} for name, _groups, data in read_inventory(inventory, os.getcwd())}


def fingerprint(spec: ClusterSpec, probe_drivers: bool = True) -> dict[str, Any]:
    """What the numbers depend on: plans, versions, GPUs and driver, engine flags."""
    router_hosts = spec.router_hosts
    router = " ".join(spec.router_release(router_hosts[0])) if router_hosts else "none"
    nvidia_hosts = [h for h in spec.gpu_hosts if h.node is not None and h.node.gpu == "nvidia"]
    ssh_data = _inventory_ssh_data(spec.inventory) if (probe_drivers and nvidia_hosts and spec.inventory) else {}
    gpus = []
    for host in spec.gpu_hosts:
        node = host.node
        assert node is not None
        if node.gpu == "none":
            driver = "n/a"
        elif not probe_drivers:
            driver = "not probed"
        elif host.name in ssh_data:
            driver = probe_driver(ssh_data[host.name])
        else:
            driver = "unknown: no SSH data for this host"
        gpus.append({"host": host.name, "gpu": node.gpu, "model": node.gpus.model, "count": node.gpus.count,
                     "driver": driver})
    return {
        "spec_hash": spec_hash(spec),
        "engine": spec.cluster.engine,
        "sglang_versions": sorted({spec.engine_version(e) for _, e in spec.engines()}),
        "router": router,
        "gpus": gpus,
        "engine_flags": engine_flags(spec),
    }
