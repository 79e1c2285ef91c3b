"""Keep what was just applied as a release on the node (pdkit/agent/releases.py), after the services role.

Decided at prepare time from the host-state fact's `release` (the node's CURRENT release): a release is
recorded when the plan's release hash differs from the node's current one, or a new node
venv is being installed, or the node has no release yet. A re-run that changes nothing
records nothing, so a second deploy still reports no change.
"""

from __future__ import annotations

import getpass
import json
import shlex
import socket
import sys

from pyinfra.api import deploy
from pyinfra.operations import server

from pdkit.hosts.deploy import current_plan, current_spec
from pdkit.hosts.hoststate import host_state
from pdkit.render import flags
from pdkit.render.paths import releases_command
from pdkit.render.plan import services_meta as meta
from roles import base

# pyinfra options whose value may be a secret: never kept in a release
_SECRET_OPTIONS = ("--password", "--ssh-password", "--sudo-password", "--key-password", "--ssh-key-password", "--data")


def redacted(argv: list[str]) -> list[str]:
    """ARGV with the values of secret-bearing options replaced by '***'."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg in _SECRET_OPTIONS:
            out.append(arg)
            hide_next = True
        elif arg.startswith(tuple(f"{o}=" for o in _SECRET_OPTIONS)):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(arg)
    return out


def applied_by() -> str:
    """Who applied this, with what: e.g. `root@ctl: pdkit roll inventories/lab.py --canary lab-gpu2`."""
    argv = [sys.argv[0].rsplit("/", 1)[-1], *sys.argv[1:]]
    return f"{getpass.getuser()}@{socket.gethostname()}: {shlex.join(redacted(argv))}"


def services_meta() -> dict[str, dict]:
    """What a restore needs to know about each planned service (no secrets: units, files, URLs, venv)."""

    return meta(current_plan().services)


@deploy("pdkit releases: keep the applied configuration as a release")
def record_release() -> None:
    spec = current_spec()
    plan = current_plan()
    current = host_state()["release"]
    # a new venv of any kind (node, engine, router) is a new release too: a rollback must switch that link back
    needed = current.get("hash") != plan.release_hash or bool(base.changed_venv_links())
    if not needed:
        # nothing to keep: a no-op declares no operation on this host at all, where a gated one
        # cost every host an operation's bookkeeping (~16 ms of the deploying machine's CPU per
        # host on the lab; docs/benchmarks.md "No-op re-run on the lab: a CPU profile")
        return
    q = shlex.quote
    venvs = " ".join(f"--venv {q(v)}" for v in flags.venv_links(spec))
    command = (
        f"{releases_command(spec)} "
        f"record --command {q(applied_by())} --services-json {q(json.dumps(services_meta(), sort_keys=True))} {venvs} "
        f"--expect-hash {q(plan.release_hash)}"
    )
    server.shell(name="Record the applied configuration as a release", commands=[command])
