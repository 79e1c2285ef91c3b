"""Preflight: read what a GPU node really is, check it against the spec, report every finding at once.

On a node that provides its own engine environment (pdkit_node.engine_venv) it also checks that
environment: its python runs, imports the spec's sglang release and, for PD engines over NIXL,
NIXL (roles/node_facts.py EngineEnv; pdkit.hosts.preflight.engine_env_problems decides). On a GPU node
whose engines read a model directory it checks each one: it exists, holds config.json and (unless
load_format dummy) weights, and the service user can read it (roles/node_facts.py ModelDirs;
pdkit.hosts.preflight.model_dir_problems decides). On a GPU node it reads each GPU's PCIe path, ACS, the
IOMMU, nvidia_uvm's HMM and GPU health (roles/node_facts.py PcieTopology; pdkit.agent.topology parses,
pdkit.hosts.preflight._check_pcie judges: issue 47).

Runs first in deploy/pd.py and alone in deploy/preflight.py. The facts are read at prepare time
(pdkit's own operations never change them during the run, except the driver, whose change marks
the node "reboot required" instead). The report goes to stderr as one block per host; a host with
an error gets a failing first operation, so a real apply stops there before anything on it
changes (and with FAIL_PERCENT = 0, before anything anywhere changes). A `--dry` plan still shows
every operation after it: the plan is honest about what would run once the node passes.
"""

from __future__ import annotations

import shlex
import sys
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from pdkit.hosts.deploy import current_host, current_spec
from pdkit.hosts.preflight import check_host, format_report, has_errors, model_dirs_fact_args
from pdkit.render.node import NodeStack, node_stack
from roles.facts import read_texts_with_host_state, read_with_host_state
from roles.node_facts import NODE_FACTS, PROBE_TEXTS, NodeFacts, facts_from_texts, probe_texts

# facts a `gpu: none` host still gets (OS for the report, the reboot marker)
_HOST_ONLY = ("os", "arch", "kernel", "reboot_required")
# per pyinfra State, then host: `pdkit roll` runs one State per batch in one process, and a
# State that is gone takes its entries with it
_FACTS: WeakKeyDictionary = WeakKeyDictionary()
REPORTS: WeakKeyDictionary = WeakKeyDictionary()


def _of(cache: WeakKeyDictionary) -> dict:
    """This State's part of a cache, by host name."""
    return cache.setdefault(host.state, {})


def _node_fact_kwargs() -> dict:
    this = current_host()
    gpu_node = this.node is not None and this.node.gpu != "none"
    names = tuple(NODE_FACTS) if gpu_node else _HOST_ONLY
    # a node's own engine environment (pdkit_node.engine_venv) is probed in the same round trip, gpu: none too
    kwargs = {"names": names, "engine_venv": this.node.engine_venv if this.node is not None else None}
    # the engines' model directories as the service user sees them (a GPU node's engines only:
    # elsewhere they are the sim's, or not started); only when there are some, so that the command
    # of a node without any stays the same
    model_dirs = model_dirs_fact_args(current_spec(), this) if gpu_node else None
    if model_dirs:
        kwargs["model_dirs"] = model_dirs
    if gpu_node:
        # PCIe paths, ACS, IOMMU, HMM and GPU health (pdkit/agent/topology_probe.py; issue 47)
        kwargs["pcie"] = True
    return kwargs


def node_facts() -> dict:
    """This host's preflight facts, read once per run."""
    facts = _of(_FACTS)
    if host.name not in facts:
        facts[host.name] = host.get_fact(NodeFacts, **_node_fact_kwargs())  # one round trip for all of them
    return facts[host.name]


def read_facts_and_host_state() -> None:
    """Read this node's preflight facts and its host state (roles/facts.py) in one round trip, not
    two: deploy/pd.py reads both on every GPU node (deploy/preflight.py only the first). A part
    that could not be read is read alone when asked for, and fails there as it would have."""
    if current_host().node is None or host.name in _of(_FACTS):
        return  # no preflight here: the host state is read alone, when the roles first ask
    kwargs = _node_fact_kwargs()
    if not kwargs["engine_venv"] and not kwargs.get("model_dirs") and all(name in PROBE_TEXTS for name in kwargs["names"]):
        # a `gpu: none` host: the probe reads its four facts itself, no shell command for them
        texts = read_texts_with_host_state(probe_texts(kwargs["names"]))
        value = facts_from_texts(kwargs["names"], texts) if texts is not None else None
    else:
        value = read_with_host_state(NodeFacts, kwargs)
    if value is not None:
        _of(_FACTS)[host.name] = value


def current_stack() -> NodeStack:
    """The NVIDIA stack this host gets (the preflight has already rejected an unsupported OS)."""
    facts = node_facts()
    node = current_host().node
    assert node is not None
    os_release = facts.get("os") or {}
    return node_stack(os_id=os_release.get("id", ""), version_id=os_release.get("version_id", ""), machine=facts.get("arch") or "", kernel=facts.get("kernel") or "", modules=node.driver_modules)


@deploy("pdkit preflight")
def preflight() -> None:
    this = current_host()
    if this.node is None:
        return
    if host.name in _of(REPORTS):
        return  # already checked in this run (deploy/pd.py and a role may both ask)
    facts = node_facts()
    findings = check_host(current_spec(), this, facts)
    report = format_report(host.name, findings, facts)
    _of(REPORTS)[host.name] = report
    # stderr: `--json` keeps stdout for pyinfra's results
    print(report, file=sys.stderr, flush=True)
    if has_errors(findings):
        errors = sum(f.severity == "error" for f in findings)
        # a failing command on the host itself: pyinfra marks the host failed and runs nothing after it
        server.shell(
            name=f"Preflight failed: {errors} error(s) (report above); stop before any change",
            commands=[f"echo {shlex.quote(report.splitlines()[0])} >&2; exit 1"],
        )
