"""`pdkit roll | releases | rollback`: ordered, drained, gated rolling changes with per-node releases.

    pdkit roll INVENTORY [--limit HOST ...] [--canary HOST] [--batch N] [--dry]
    pdkit releases INVENTORY HOST
    pdkit rollback INVENTORY HOST [--to RELEASE]

pyinfra has no gate between hosts and does not keep host order under --serial (pyinfra
3.10.0: State.active_hosts is a set, pyinfra/api/state.py), so the rollout is driven here through
pyinfra's API: gevent patched first, one State per batch (connect, load deploy/pd.py, run_ops). Per
batch: connect, drain its engines out of the router, apply, check readiness, add them back, smoke
requests through the router with the engines' KV failure counters unchanged. A failed gate puts the
batch back on the release it ran before (pdkit/agent/releases.py), and the roll stops with a non-zero exit
that names the node and the gate. docs/rolling.md has the whole story.

- planning.py: what to roll in which order, outages and hold times, the dry-plan diff (pure;
  unit tested without hosts);
- pyinfra_api.py: pyinfra's API and SSH (gevent, one State per batch, commands on a node);
  pyinfra is imported only inside its functions, so importing pdkit.roll stays cheap;
- roller.py: the Roller, batch by batch: drain, apply, gates, re-add, smoke, restore on failure;
- commands.py: the commands, their parsers, what they print and the --report JSON.

The names below are what other packages use (pdkit/cli.py's add_parser, pdkit.tune); everything else,
tests and the siblings here included, is imported from its submodule, and a test patches a name where it
is looked up (pdkit.roll.roller.run_remote). The names are looked up in their submodule on first use
(PEP 562), so a command that needs planning.py does not load the roller and what it imports.
"""

from __future__ import annotations

from typing import Any

from pdkit import lazy_attr

# What other packages use, by the submodule that holds it
_PUBLIC = {
    "commands": ("add_parser", "read_node_state"),
    "planning": ("RollError", "make_batches", "metric_sums", "pairing_units", "rollout_order",
                 "router_state_words", "unchanged_hosts", "version_changes"),
    "pyinfra_api": ("patch_gevent",),
    "roller": ("Progress", "Roller"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """A name of the surface, from its submodule; kept here, so the next lookup is a plain attribute."""
    return lazy_attr(globals(), _HOME, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
