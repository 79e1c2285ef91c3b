"""CUDA 13.0 toolkit from NVIDIA's repository (/usr/local/cuda-13.0)."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt

from roles.nvidia_repo import nvidia_repo
from roles.preflight import current_stack


@deploy("pdkit CUDA toolkit")
def cuda() -> None:
    nvidia_repo()
    packages = list(current_stack().cuda_packages)
    apt.packages(name=f"CUDA toolkit: {', '.join(packages)}", packages=packages, no_recommends=True, _timeout=1800)
