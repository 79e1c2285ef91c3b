"""The part of the node roles that a lab host can really apply (no NVIDIA repository reachable):
the deb822 source, unattended-upgrades' blacklist, the NCCL apt preferences. Used by
tests/lab/test_node_roles.py to prove that a second run changes nothing."""

from pdkit.hosts.deploy import current_spec
from roles import nccl, nvidia_driver, nvidia_repo

current_spec()
nvidia_repo.source_files()
nvidia_driver.driver_files()
nccl.nccl_files()
