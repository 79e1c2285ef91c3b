"""pyinfra configuration for every pdkit deploy (pyinfra reads config.py from the working directory)."""

# Stop at the first failed host: with --serial this makes `pyinfra INV deploy/pd.py --serial`
# a node-by-node rollout that halts at the first unhealthy node (the health gate fails the host).
FAIL_PERCENT = 0
