"""pyinfra configuration for every pdkit deploy (pyinfra 3 runs config.py from the working directory).

pyinfra 3 only executes this file: settings must be assigned on its `config` object.
"""

from pyinfra import config

# Stop at the first failed host: with --serial this makes `pyinfra INV deploy/pd.py --serial`
# a node-by-node rollout that halts at the first unhealthy node (the health gate fails the host).
config.FAIL_PERCENT = 0
