"""pdkit lab: local test hosts with real systemd, reached by real SSH (no GPUs).

``pdkit lab up [--hosts N]`` starts N "GPU node" hosts (``lab-gpu1..N``, default 3) and one
monitoring host (``lab-mon``): systemd-nspawn containers of Debian bookworm with systemd as
PID 1, each in its own network namespace on a bridge of the control machine, with an
apt cache (apt-cacher-ng) on the bridge address as their only package source. See
docs/lab.md. Bringing the lab up or down needs root; reading its description does not.

Python API, by module. ``pdkit.lab`` itself exports what other packages use: load_lab and
planned_lab (inventories/lab.py, benchmarks/), ssh_run and status (benchmarks/); tests and the
siblings here import the rest from its module.

pdkit.lab.model (the plan and the state; no root)::

    lab_dir() -> Path
        The state directory: $PDKIT_LAB_DIR, default /var/lib/pdkit-lab. It holds the
        control machine's SSH key (id_ed25519), known_hosts, lab.json, logs/, machines/.

    load_lab(state_dir=None) -> LabInfo | None
        The running lab (lab.json), or None when it is down. lab.json is written only
        when every host has booted and answered SSH, and is removed first by `lab down`.

    planned_hosts(n_gpu: int = 3) -> list[LabHost]
        The hosts `lab up --hosts n_gpu` creates: deterministic names and addresses, usable
        with the lab down (validate an inventory anywhere, no root needed).
        lab-gpu{i} = <subnet>.{10+i} (role "gpu"), lab-mon = <subnet>.10 (role
        "monitoring"); subnet $PDKIT_LAB_SUBNET, default 10.213.0.0/24; bridge at .1.

    planned_lab(n_gpu: int = 3) -> LabInfo
        Same, as a LabInfo (running=False) with the paths the key and known_hosts will have.

    LabHost(name, address, role: "gpu" | "monitoring", ssh_user="root", ssh_port=22)
    LabInfo
        .hosts: list[LabHost]         .gpu_hosts / .monitoring_host / .host(name)
        .ssh_key: Path                private key of the control machine
        .known_hosts: Path            the guests' host keys, read from their rootfs
        .subnet, .bridge, .bridge_address, .apt_cache_url, .state_dir, .running
        .pyinfra_data(host) -> dict   pyinfra SSH connector data for one host
        .pyinfra_hosts() -> [(name, data)]

    pyinfra_host_data(host, ssh_key, known_hosts) -> dict
        The pyinfra 3.10 data keys that connect with strict host-key checking:
        ssh_hostname, ssh_port, ssh_user, ssh_key, ssh_known_hosts_file,
        ssh_strict_host_key_checking="yes".

pdkit.lab.lifecycle (up, down, status, SSH)::

    up(n_gpu=3, *, rebuild_rootfs=False, progress=None) -> LabInfo      (root)
    down(state_dir=None, *, progress=None) -> list[str]   leftovers, [] when clean (root)
    status(state_dir=None, *, probe_ssh=True) -> LabStatus               (root)
    leftovers(cfg=None) -> list[str]   namespaces, links, mounts, cgroups, processes left
    ssh_argv(host, ssh_key, known_hosts, command=None) -> list[str]   OpenSSH argv (strict)
    ssh_run(info, host, command, *, timeout=60) -> CompletedProcess

    LabError (pdkit.lab.model, exit_code 1), NotRoot and MissingTool (pdkit.lab.system, exit_code 2):
    one-line messages.

Environment: PDKIT_LAB_DIR (state), PDKIT_LAB_SUBNET (a private /24),
PDKIT_CACHE (rootfs tarball and apt cache under $PDKIT_CACHE/lab, default
~/.cache/pdkit), PDKIT_LAB_KEEP_FAILED=1 (leave a failed `lab up` as it is).
"""

from __future__ import annotations

from pdkit.lab.lifecycle import ssh_run, status
from pdkit.lab.model import load_lab, planned_lab

__all__ = ["load_lab", "planned_lab", "ssh_run", "status"]
