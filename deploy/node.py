"""Only the node layer: `pyinfra INVENTORY deploy/node.py` (preflight, then on `gpu: nvidia` hosts the
NVIDIA repository, driver R580, CUDA 13.0 and NCCL). deploy/pd.py runs the same two steps first.

First provisioning of a node: run this, drain nothing (nothing serves yet), reboot (the report and
pdkit_node_reboot_required say so), run the preflight again, then deploy/pd.py.
"""

from pdkit.hosts.deploy import current_spec, tune_connection
from roles import node, preflight

current_spec()  # an invalid inventory stops here, before any fact is read
tune_connection()  # TCP_NODELAY on this host's SSH socket: ~50 ms less per command (pdkit/hosts/deploy.py)
preflight.preflight()
node.node()
