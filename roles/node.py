"""The node layer on `gpu: nvidia` hosts: NVIDIA repository, driver R580, CUDA 13.0, NCCL.

Lab hosts (`gpu: none`) and hosts without pdkit_node get none of it; they run only the preflight.
"""

from __future__ import annotations

from pyinfra.api import deploy

from pdkit.deploy import current_host
from roles.cuda import cuda
from roles.nccl import nccl
from roles.nvidia_driver import nvidia_driver


@deploy("pdkit node layer")
def node() -> None:
    this = current_host()
    if this.node is None or this.node.gpu != "nvidia":
        return
    nvidia_driver()
    cuda()
    nccl()
