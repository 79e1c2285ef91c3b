"""NCCL (libnccl2, libnccl-dev) for CUDA 13 at the version pinned in pdkit/upstream/versions.py, held there by apt preferences."""

from __future__ import annotations

import io

from pyinfra.api import deploy
from pyinfra.operations import apt, files

from pdkit.render.node import NCCL_PIN_PATH, nccl_pin_text
from roles.nvidia_repo import nvidia_repo
from roles.preflight import current_stack


def nccl_files() -> None:
    """What needs no NVIDIA repository: the apt preferences that hold NCCL at its pin."""
    files.put(name=f"Hold NCCL at its pinned version ({NCCL_PIN_PATH})", src=io.StringIO(nccl_pin_text()), dest=NCCL_PIN_PATH, mode="0644", user="root", group="root")


@deploy("pdkit NCCL")
def nccl() -> None:
    nvidia_repo()
    nccl_files()
    packages = list(current_stack().nccl_packages)
    apt.packages(name=f"NCCL: {', '.join(packages)}", packages=packages, no_recommends=True, _timeout=900)
