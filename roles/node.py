"""The node layer on `gpu: nvidia` hosts: NVIDIA repository, driver R580, CUDA 13.0, NCCL.

Lab hosts (`gpu: none`), nodes whose machine brings the stack (`nvidia_stack: provided`) and hosts
without pdkit_node get none of it; they run only the preflight.
"""

from __future__ import annotations

from pyinfra.api import deploy

from pdkit.hosts.deploy import current_host
from roles.cuda import cuda
from roles.nccl import nccl
from roles.nvidia_driver import nvidia_driver


def installs_nvidia_stack(node) -> bool:
    """Whether the node layer installs NVIDIA's repository, driver, CUDA and NCCL on this node."""
    return node is not None and node.gpu == "nvidia" and node.nvidia_stack == "install"


@deploy("pdkit node layer")
def node() -> None:
    this = current_host()
    if not installs_nvidia_stack(this.node):
        return
    nvidia_driver()
    cuda()
    nccl()
