"""The whole stack: `pyinfra inventories/cluster.py deploy/pd.py`.

Validates the inventory first (nothing runs if it is invalid), then on each host: the service
user and directories, Debian packages (node_exporter, Prometheus), the venvs from the wheelhouse, the engines and the router with their
health gates. With `--serial` (config.py sets FAIL_PERCENT = 0) this is a node-by-node
rollout that stops at the first host whose gate fails.
"""

from pdkit.hosts.deploy import current_spec, tune_connection
from roles import base, node, packages, preflight, services

current_spec()  # an invalid inventory stops here, before any operation
tune_connection()  # TCP_NODELAY on this host's SSH socket: ~50 ms less per command (pdkit/hosts/deploy.py)
preflight.read_facts_and_host_state()  # what the preflight and the roles decide on: one SSH round trip per host
preflight.preflight()  # one report per GPU node; a mismatch stops that node before any change
node.node()  # gpu: nvidia hosts only: NVIDIA repo, driver R580, CUDA 13.0, NCCL (docs/tuning.md)
base.service_user_and_dirs()
packages.packages()
base.venvs()
services.services()
from roles.releases import record_release  # noqa: E402

record_release()  # keep what was applied as a release on the node (docs/rolling.md)
