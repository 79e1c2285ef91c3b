"""The NVIDIA stack of a GPU node as data: apt repository, pins, package lists, files.

Pure functions from what the preflight facts say about a host (OS id and version, machine,
running kernel) and the node's spec to the exact text and package lists the node roles lay
down. Nothing here talks to a host; roles/nvidia_repo.py, nvidia_driver.py, cuda.py and
nccl.py only apply what these return. Reasons for each value: docs/tuning.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdkit.upstream.versions import (
    CUDA_KEYRING_VERSION,
    CUDA_TOOLKIT_PACKAGE,
    NCCL_APT_VERSION,
    NVIDIA_DRIVER_BRANCH,
)

REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"
# (os-release ID, VERSION_ID) -> NVIDIA's repository directory. Debian 13's apt (sqv) rejects the
# older SHA1-bound key of the debian12 repository, so a Debian 13 host only ever gets debian13.
REPO_DISTROS: dict[tuple[str, str], str] = {
    ("ubuntu", "24.04"): "ubuntu2404",
    ("debian", "12"): "debian12",
    ("debian", "13"): "debian13",
}
# `uname -m` -> NVIDIA's architecture directory
REPO_ARCHES: dict[str, str] = {"x86_64": "x86_64", "aarch64": "sbsa"}

# what the cuda-keyring package installs: the key our deb822 source trusts, and the one-line
# .list source it ships, which pdkit removes so that apt sees the repository once
KEYRING_PATH = "/usr/share/keyrings/cuda-archive-keyring.gpg"
SOURCES_PATH = "/etc/apt/sources.list.d/pdkit-nvidia-cuda.sources"
# root's own directories: /var/lib/<service user> and /var/cache/<service user> belong to the
# service user (the units' StateDirectory=/CacheDirectory=), which must not be able to touch these
NODE_STATE_DIR = "/var/lib/pdkit-node"
NODE_CACHE_DIR = "/var/cache/pdkit-node"
KEYRING_DEB_PATH = f"{NODE_CACHE_DIR}/cuda-keyring.deb"
NCCL_PIN_PATH = "/etc/apt/preferences.d/pdkit-nccl"
UNATTENDED_PATH = "/etc/apt/apt.conf.d/51pdkit-nvidia-no-unattended-upgrades"
# written when the driver packages changed in a run; read by the preflight and pdkit-exporter
REBOOT_MARKER_PATH = f"{NODE_STATE_DIR}/reboot-required"
PERSISTENCED_UNIT = "nvidia-persistenced.service"


class UnsupportedNode(ValueError):
    """The host's OS or architecture has no NVIDIA repository pdkit supports."""


def repo_distro(os_id: str, version_id: str) -> str:
    """NVIDIA's repository name for an os-release ID/VERSION_ID, e.g. ('debian', '12') -> 'debian12'."""
    try:
        return REPO_DISTROS[(os_id, version_id)]
    except KeyError:
        valid = ", ".join(f"{i} {v}" for i, v in REPO_DISTROS)
        raise UnsupportedNode(f"{os_id} {version_id} has no supported NVIDIA repository; valid: {valid}") from None


def repo_arch(machine: str) -> str:
    """NVIDIA's architecture directory for `uname -m`."""
    try:
        return REPO_ARCHES[machine]
    except KeyError:
        raise UnsupportedNode(f"architecture {machine!r} is not supported; valid: {', '.join(REPO_ARCHES)}") from None


def repo_url(distro: str, arch: str) -> str:
    return f"{REPO_BASE}/{distro}/{arch}/"


def keyring_deb_url(distro: str, arch: str) -> str:
    """The cuda-keyring package, from the repository it is the key of (NVIDIA's documented route)."""
    return f"{repo_url(distro, arch)}cuda-keyring_{CUDA_KEYRING_VERSION}_all.deb"


def keyring_list_path(distro: str, arch: str) -> str:
    """The .list source cuda-keyring ships; pdkit's deb822 source replaces it."""
    return f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.list"


def sources_text(distro: str, arch: str) -> str:
    """deb822 source for NVIDIA's flat repository, trusted only through the cuda-keyring key."""
    return (
        "# NVIDIA CUDA repository (pdkit: pdkit/node.py, docs/tuning.md)\n"
        "Types: deb\n"
        f"URIs: {repo_url(distro, arch)}\n"
        "Suites: /\n"
        f"Signed-By: {KEYRING_PATH}\n"
    )


def pinning_package() -> str:
    """NVIDIA's branch lock for apt (an apt preferences file in a package), installed before the driver."""
    return f"nvidia-driver-pinning-{NVIDIA_DRIVER_BRANCH}"


def kernel_flavour(kernel: str) -> str:
    """Ubuntu's kernel flavour from `uname -r`: '6.8.0-51-generic' -> 'generic', '6.8.0-1021-aws' -> 'aws'."""
    parts = kernel.split("-")
    if len(parts) < 3 or not parts[-1].isalpha():
        raise UnsupportedNode(f"kernel {kernel!r} is not an Ubuntu archive kernel (no flavour suffix): use "
                              "driver_modules nvidia-dkms")
    return parts[-1]


def driver_packages(distro: str, kernel: str, modules: str) -> list[str]:
    """Driver packages in install order: the branch pin first, then modules and user space."""
    if modules == "ubuntu-prebuilt":
        if not distro.startswith("ubuntu"):
            raise UnsupportedNode(f"driver_modules ubuntu-prebuilt needs Ubuntu; this host is {distro}: use "
                                  "nvidia-dkms")
        branch = NVIDIA_DRIVER_BRANCH
        # Canonical's signed prebuilt open modules for the running flavour (they follow kernel
        # updates), with the matching user space that does not pull DKMS in
        return [
            pinning_package(),
            f"linux-modules-nvidia-{branch}-open-{kernel_flavour(kernel)}",
            f"nvidia-headless-no-dkms-{branch}-open",
            f"nvidia-utils-{branch}",
        ]
    if modules != "nvidia-dkms":
        raise ValueError(f"unknown driver_modules {modules!r}")
    # DKMS builds the open modules against the running kernel's headers
    return [pinning_package(), f"linux-headers-{kernel}", "nvidia-open"]


def cuda_packages() -> list[str]:
    return [CUDA_TOOLKIT_PACKAGE]


def nccl_packages() -> list[str]:
    """libnccl2/libnccl-dev at the one pinned version (pdkit.upstream.versions.NCCL_APT_VERSION)."""
    return [f"libnccl2={NCCL_APT_VERSION}", f"libnccl-dev={NCCL_APT_VERSION}"]


def nccl_pin_text() -> str:
    """apt preferences holding NCCL at the pinned version (an `apt upgrade` must not move it)."""
    return (
        "# pdkit: NCCL stays at the version pdkit pins (pdkit/versions.py NCCL_APT_VERSION)\n"
        "Package: libnccl2 libnccl-dev\n"
        f"Pin: version {NCCL_APT_VERSION}\n"
        "Pin-Priority: 1001\n"
    )


# unattended-upgrades matches these as regular expressions from the start of a package name
UNATTENDED_BLACKLIST: tuple[str, ...] = ("nvidia-", "libnvidia-", "linux-modules-nvidia-", "cuda-", "libcuda",
                                         "libnccl")


def unattended_text() -> str:
    """Keep the driver, CUDA and NCCL out of unattended upgrades: a driver upgrade needs a drained reboot."""
    entries = "".join(f'    "{p}";\n' for p in UNATTENDED_BLACKLIST)
    return (
        "// pdkit: the NVIDIA stack changes only through pdkit (docs/tuning.md)\n"
        f"Unattended-Upgrade::Package-Blacklist {{\n{entries}}};\n"
    )


def reboot_marker_text(reason: str) -> str:
    return f"{reason}\n"


@dataclass(frozen=True)
class NodeStack:
    """Everything the node roles lay down on one host."""

    distro: str
    arch: str
    repo_url: str
    keyring_deb_url: str
    keyring_list_path: str
    sources_text: str
    driver_packages: tuple[str, ...]
    cuda_packages: tuple[str, ...]
    nccl_packages: tuple[str, ...]
    nccl_pin_text: str
    unattended_text: str


def node_stack(*, os_id: str, version_id: str, machine: str, kernel: str, modules: str) -> NodeStack:
    """The NVIDIA stack for a host, from its facts and the node's driver_modules choice."""
    distro, arch = repo_distro(os_id, version_id), repo_arch(machine)
    return NodeStack(
        distro=distro,
        arch=arch,
        repo_url=repo_url(distro, arch),
        keyring_deb_url=keyring_deb_url(distro, arch),
        keyring_list_path=keyring_list_path(distro, arch),
        sources_text=sources_text(distro, arch),
        driver_packages=tuple(driver_packages(distro, kernel, modules)),
        cuda_packages=tuple(cuda_packages()),
        nccl_packages=tuple(nccl_packages()),
        nccl_pin_text=nccl_pin_text(),
        unattended_text=unattended_text(),
    )
