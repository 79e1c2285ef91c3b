"""The local lab as the users' own shape: ONE box with a TP4 prefill on GPUs 0-3, a TP4 decode on
GPUs 4-7 and the router beside them, plus the monitoring host (inventories/cluster.py's layout).

    pdkit lab up --hosts 1 && pyinfra inventories/lab-one-node.py deploy/pd.py -y

On a lab of more GPU hosts it takes the first one and the monitoring host, and leaves the others
alone. Every engine and the router restart together on a change, so `pdkit roll` and `pdkit tune`
on it need `--allow-downtime` / `downtime: true` (docs/rolling.md, 'Downtime mode';
docs/tune/lab-one-node.yaml).
"""

import runpy
from pathlib import Path

# the lab's own hosts, engines and settings (inventories/lab.py): one place decides them
_LAB = runpy.run_path(str(Path(__file__).with_name("lab.py")))

gpu_nodes = _LAB["gpu_nodes"][:1]
monitoring = _LAB["monitoring"]
all = ([gpu_nodes[0][0], monitoring[0][0]], _LAB["all"][1])  # noqa: A001 - pyinfra's group name
