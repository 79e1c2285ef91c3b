"""Only the preflight: `pyinfra INVENTORY deploy/preflight.py` prints one report per GPU node.

Reads facts (OS, kernel, GPUs, driver, open module, NUMA, NICs, `nvidia-smi topo -m`) and checks
them against the inventory; changes nothing. A host with an error fails its only operation.
"""

from pdkit.hosts.deploy import current_spec, tune_connection
from roles.preflight import preflight

current_spec()  # an invalid inventory stops here, before any fact is read
tune_connection()  # TCP_NODELAY on this host's SSH socket: ~50 ms less per command (pdkit/hosts/deploy.py)
preflight()
