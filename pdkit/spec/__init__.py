"""The cluster spec: pydantic models for what the user writes, and the cross-host rules.

A pyinfra inventory describes the cluster; each host's resolved data holds pdkit's
sections (all keys start with ``pdkit_``):

- ``pdkit_cluster``   cluster-wide: model, engine kind, SGLang version, tuning defaults.
                      May be set on any group or host; every host that resolves it must
                      see the same value.
- ``pdkit_node``      a GPU node: its GPUs, NUMA layout, NCCL profile and engines.
- ``pdkit_router``    this host runs the router.
- ``pdkit_monitoring`` this host runs Prometheus and Grafana.

`pdkit.inventory.loader.load()` turns an inventory into a frozen `ClusterSpec` or a list of
`Problem`s; this package holds the models and `cross_checks()`, the rules that need
more than one section to decide. Declarations and rules live apart, as SGLang keeps its
server arguments apart from its `*_hook.py` checks:

- fields       field types, bounds and value rules the models share (Frozen, Port, at_most, paths)
- tuning       the tuning layers and speculative decoding (Tuning, RoleTuning, TUNING_DEFAULTS)
- alerting     Alertmanager receivers, routes and the alerting section (RECEIVER_KINDS)
- models       the sections: Cluster, Model, Secrets, Node, GpuLayout, Engine, Router, Monitoring;
               HOST_SECTIONS (host data key -> section model: the loader and the README table)
- cluster      ClusterSpec and HostSpec with their lookups; Problem and SpecError
- facts        what flags, plan, doctor and validation derive alike (decode graphs, shared GPUs, ...)
- spanning     engines spanning nodes and their parallel layout (parallel_problems)
- addresses    ports and addresses (host_ports, CROSS_HOST_SERVICES, check_addresses)
- pcie         a node's declared PCIe layout judged by pdkit.agent.topology's placement rules (declared_pcie_problems)
- ignored      settings a mode or role ignores (IGNORED_BY_MODE, ignored_settings)
- credentials  secrets and alert receivers against what reads them
- startup      what SGLang refuses at start (startup_check_problems)
- checks       cross_checks(), which runs all of the rules

Every public name is importable from `pdkit.spec` itself, as it was when this was one module.
"""

from __future__ import annotations

# the public names of every module, as before the split (pdkit.spec.X)
from pdkit.spec.addresses import *  # noqa: F401,F403
from pdkit.spec.alerting import *  # noqa: F401,F403
from pdkit.spec.checks import *  # noqa: F401,F403
from pdkit.spec.cluster import *  # noqa: F401,F403
from pdkit.spec.credentials import *  # noqa: F401,F403
from pdkit.spec.facts import *  # noqa: F401,F403

# fieldtable documents the fault budget as a spec section (pdkit_cluster.fault_budget)
from pdkit.spec.faultbudget import FaultBudget as FaultBudget  # noqa: F401 (the `as` form: an explicit re-export)
from pdkit.spec.fields import *  # noqa: F401,F403
from pdkit.spec.ignored import *  # noqa: F401,F403
from pdkit.spec.models import *  # noqa: F401,F403
from pdkit.spec.pcie import *  # noqa: F401,F403
from pdkit.spec.spanning import *  # noqa: F401,F403
from pdkit.spec.startup import *  # noqa: F401,F403
from pdkit.spec.tuning import *  # noqa: F401,F403
