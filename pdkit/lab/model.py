"""Lab data: where the lab lives, what its hosts are called and where they are.

Everything here works without root and without a running lab: an inventory can be
validated against :func:`planned_hosts` on any machine.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_LAB_DIR = "/var/lib/pdkit-lab"
DEFAULT_SUBNET = "10.213.0.0/24"
DEFAULT_GPU_HOSTS = 3
MAX_GPU_HOSTS = 40  # .11 .. .50 in the /24

SUITE = "bookworm"
SSH_USER = "root"
SSH_PORT = 22
APT_CACHE_PORT = 3142

MONITORING_NAME = "lab-mon"
MONITORING_OCTET = 10  # lab-mon is .10, lab-gpuN is .10+N, the bridge is .1

LAB_JSON = "lab.json"  # public description of a running lab (LabInfo)
RUNTIME_JSON = "runtime.json"  # private bookkeeping for `lab down` (pids, cgroups, names)
SSH_KEY_NAME = "id_ed25519"
KNOWN_HOSTS_NAME = "known_hosts"

Role = Literal["gpu", "monitoring"]


class LabError(RuntimeError):
    """A lab operation failed; the message is meant for the user, one line."""

    exit_code = 1


def lab_dir() -> Path:
    """The lab state directory: ``$PDKIT_LAB_DIR`` or ``/var/lib/pdkit-lab``."""
    return Path(os.environ.get("PDKIT_LAB_DIR") or DEFAULT_LAB_DIR).absolute()


def cache_dir() -> Path:
    """Where the rootfs tarball and the apt cache live: ``${PDKIT_CACHE:-~/.cache/pdkit}/lab``."""
    base = os.environ.get("PDKIT_CACHE") or str(Path.home() / ".cache" / "pdkit")
    return Path(base).absolute() / "lab"


def lab_subnet() -> ipaddress.IPv4Network:
    """The lab's /24: ``$PDKIT_LAB_SUBNET`` or 10.213.0.0/24."""
    raw = os.environ.get("PDKIT_LAB_SUBNET") or DEFAULT_SUBNET
    try:
        net = ipaddress.IPv4Network(raw)
    except ValueError as exc:
        raise LabError(f"PDKIT_LAB_SUBNET={raw!r} is not an IPv4 network: {exc}") from None
    if net.prefixlen != 24:
        raise LabError(f"PDKIT_LAB_SUBNET={raw!r}: the lab needs a /24")
    if not net.is_private:
        raise LabError(f"PDKIT_LAB_SUBNET={raw!r}: use a private network")
    return net


class LabHost(BaseModel):
    """One lab host as an inventory sees it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    address: str
    role: Role
    ssh_user: str = SSH_USER
    ssh_port: int = SSH_PORT


class LabInfo(BaseModel):
    """A lab: its hosts and how to reach them (the content of ``<lab_dir>/lab.json``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: int = 1
    state_dir: Path
    subnet: str
    bridge: str
    bridge_address: str
    apt_cache_url: str
    ssh_key: Path
    known_hosts: Path
    hosts: list[LabHost]
    created_at: str | None = None
    running: bool = Field(default=False, description="True when read from a running lab")

    @property
    def gpu_hosts(self) -> list[LabHost]:
        return [h for h in self.hosts if h.role == "gpu"]

    @property
    def monitoring_host(self) -> LabHost:
        return next(h for h in self.hosts if h.role == "monitoring")

    def host(self, name: str) -> LabHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def pyinfra_data(self, host: LabHost) -> dict[str, object]:
        """pyinfra 3.10 SSH connector data for ``host`` (strict host-key checking)."""
        return pyinfra_host_data(host, self.ssh_key, self.known_hosts)

    def pyinfra_hosts(self) -> list[tuple[str, dict[str, object]]]:
        """``[(name, data), ...]`` ready for a pyinfra inventory group."""
        return [(h.name, self.pyinfra_data(h)) for h in self.hosts]


def pyinfra_host_data(host: LabHost, ssh_key: Path | str, known_hosts: Path | str) -> dict[str, object]:
    """The data keys pyinfra 3.10.0's ``@ssh`` connector needs to reach a lab host.

    Checked against the real lab: with exactly these keys ``pyinfra INV exec -- ...``
    connects to every host with strict host-key checking. (With ``ssh_key`` set, pyinfra
    already turns paramiko's agent and ~/.ssh key lookup off.)
    """
    return {
        "ssh_hostname": host.address,
        "ssh_port": host.ssh_port,
        "ssh_user": host.ssh_user,
        "ssh_key": str(ssh_key),
        "ssh_known_hosts_file": str(known_hosts),
        "ssh_strict_host_key_checking": "yes",
    }


@dataclass(frozen=True)
class LabConfig:
    """Names and paths of one lab, derived from its state dir and subnet."""

    state_dir: Path
    cache_dir: Path
    subnet: ipaddress.IPv4Network

    @classmethod
    def from_env(cls) -> LabConfig:
        return cls(state_dir=lab_dir(), cache_dir=cache_dir(), subnet=lab_subnet())

    # --- network names (Linux interface names are at most 15 characters) ---
    @property
    def tag(self) -> str:
        """Short prefix carried by every kernel object of this lab: ``pdk213-0`` for 10.213.0.0/24."""
        octets = str(self.subnet.network_address).split(".")
        return f"pdk{octets[1]}-{octets[2]}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}-br"

    def veth(self, host_name: str) -> str:
        """Host-side end of a host's veth pair (the guest side is ``host0``)."""
        short = "mon" if host_name == MONITORING_NAME else "g" + host_name.removeprefix("lab-gpu")
        return f"{self.tag}-{short}"

    def netns(self, host_name: str) -> str:
        return f"{self.tag}-{host_name}"

    @property
    def bridge_address(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def apt_cache_url(self) -> str:
        return f"http://{self.bridge_address}:{APT_CACHE_PORT}"

    @property
    def cgroup_name(self) -> str:
        return f"pdkit-lab-{self.tag}"

    # --- paths ---
    @property
    def machines_dir(self) -> Path:
        return self.state_dir / "machines"

    def machine_root(self, host_name: str) -> Path:
        """The host's root as the container sees it (an overlay mount)."""
        return self.machines_dir / host_name / "root"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def ssh_key(self) -> Path:
        return self.state_dir / SSH_KEY_NAME

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / KNOWN_HOSTS_NAME

    @property
    def lab_json(self) -> Path:
        return self.state_dir / LAB_JSON

    @property
    def runtime_json(self) -> Path:
        return self.run_dir / RUNTIME_JSON

    @property
    def lock_file(self) -> Path:
        return self.state_dir / ".lock"

    def hosts(self, n_gpu: int) -> list[LabHost]:
        if not 1 <= n_gpu <= MAX_GPU_HOSTS:
            raise LabError(f"--hosts must be between 1 and {MAX_GPU_HOSTS} (got {n_gpu})")
        base = self.subnet.network_address
        hosts = [
            LabHost(name=f"lab-gpu{i}", address=str(base + MONITORING_OCTET + i), role="gpu")
            for i in range(1, n_gpu + 1)
        ]
        hosts.append(LabHost(name=MONITORING_NAME, address=str(base + MONITORING_OCTET), role="monitoring"))
        return hosts

    def info(self, hosts: list[LabHost], *, created_at: str | None = None, running: bool = False) -> LabInfo:
        return LabInfo(
            state_dir=self.state_dir,
            subnet=str(self.subnet),
            bridge=self.bridge,
            bridge_address=self.bridge_address,
            apt_cache_url=self.apt_cache_url,
            ssh_key=self.ssh_key,
            known_hosts=self.known_hosts,
            hosts=hosts,
            created_at=created_at,
            running=running,
        )


def planned_hosts(n_gpu: int = DEFAULT_GPU_HOSTS) -> list[LabHost]:
    """The hosts ``pdkit lab up --hosts n_gpu`` creates: deterministic names and addresses.

    ``lab-gpu1..N`` at ``.11..`` and ``lab-mon`` at ``.10`` of ``$PDKIT_LAB_SUBNET``
    (default 10.213.0.0/24). Needs no root and no running lab.
    """
    return LabConfig.from_env().hosts(n_gpu)


def planned_lab(n_gpu: int = DEFAULT_GPU_HOSTS) -> LabInfo:
    """A :class:`LabInfo` for the lab that ``lab up`` would create (``running=False``)."""
    cfg = LabConfig.from_env()
    return cfg.info(cfg.hosts(n_gpu))


def load_lab(state_dir: Path | str | None = None) -> LabInfo | None:
    """The running lab described by ``<lab_dir>/lab.json``, or None when the lab is down.

    ``lab.json`` is written only once every host has booted and answered SSH, and is
    removed first thing by ``lab down``.
    """
    path = Path(state_dir or lab_dir()) / LAB_JSON
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise LabError(f"cannot read {path}: {exc}") from None
    raw["running"] = True
    return LabInfo.model_validate(raw)
