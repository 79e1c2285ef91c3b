"""`pdkit roll | releases | rollback`: ordered, drained, gated rolling changes with per-node releases.

    pdkit roll INVENTORY [--limit HOST ...] [--canary HOST] [--batch N] [--dry]
    pdkit releases INVENTORY HOST
    pdkit rollback INVENTORY HOST [--to RELEASE]

pyinfra has no gate between hosts and does not keep host order under --serial (pyinfra
3.10.0: State.active_hosts is a set, pyinfra/api/state.py), so the rollout is driven here through
pyinfra's API: gevent patched first, one State per batch (connect, load deploy/pd.py, run_ops). Per
batch: connect, drain its engines out of the router, apply, check readiness, add them back, smoke
requests through the router with the engines' KV failure counters unchanged. A failed gate puts the
batch back on the release it ran before (pdkit/releases.py), and the roll stops with a non-zero exit
that names the node and the gate. docs/rolling.md has the whole story.

- planning.py: what to roll in which order, outages and hold times, the dry-plan diff (pure;
  unit tested without hosts);
- pyinfra_api.py: pyinfra's API and SSH (gevent, one State per batch, commands on a node);
  pyinfra is imported only inside its functions, so importing pdkit.roll stays cheap;
- roller.py: the Roller, batch by batch: drain, apply, gates, re-add, smoke, restore on failure;
- commands.py: the commands, their parsers, what they print and the --report JSON.

Every name below stays importable from pdkit.roll. A test that patches one must patch the module
that looks it up (pdkit.roll.roller.run_remote, not pdkit.roll.run_remote).
"""

from pdkit.roll.commands import (
    EXIT_FAILED,
    EXIT_INVALID,
    add_parser,
    cmd_releases,
    cmd_roll,
    cmd_rollback,
    format_releases,
    measure_restarts,
    read_node_state,
    report,
)
from pdkit.roll.planning import (
    APPLY_INSTALL_S,
    HOLD_FACTOR,
    HOLD_MARGIN_S,
    HOLD_MAX_S,
    HOLD_UNMEASURED_S,
    RESTART_GAP_US,
    RESTORE_S,
    RUNNING_KEY_PROBE,
    HostDiff,
    Outage,
    RollError,
    batch_outages,
    covered_seconds,
    downtime_hold_s,
    expected_outage,
    format_dry_plan,
    host_diff,
    key_fix,
    make_batches,
    merge_units,
    metric_sums,
    open_breakers,
    outage_lines,
    pairing_units,
    parse_running_key,
    put_back_summary,
    refusal_text,
    rerun_with_downtime,
    restart_to_ready,
    rollout_order,
    router_keys,
    router_state_words,
    silence_window_s,
    sort_by_health,
    spanning_units,
    stop_summary,
    unchanged_hosts,
    version_changes,
)
from pdkit.roll.pyinfra_api import (
    CONNECT_ATTEMPTS,
    DEPLOY_FILE,
    REPO,
    Pyinfra,
    patch_gevent,
    roll_inventory,
    run_remote,
)
from pdkit.roll.roller import (
    REMOVAL_ORDER,
    ROUTER_DRAIN_SETTLE_S,
    SMOKE_MAX_TOKENS,
    NodeTiming,
    Progress,
    Recovery,
    Roller,
)

# the old name (tests/sim/test_tune_runner.py patches gevent with it)
_patch_gevent = patch_gevent

__all__ = [
    "APPLY_INSTALL_S", "CONNECT_ATTEMPTS", "DEPLOY_FILE", "EXIT_FAILED", "EXIT_INVALID", "HOLD_FACTOR",
    "HOLD_MARGIN_S", "HOLD_MAX_S", "HOLD_UNMEASURED_S", "REMOVAL_ORDER", "REPO", "RESTART_GAP_US", "RESTORE_S",
    "ROUTER_DRAIN_SETTLE_S", "RUNNING_KEY_PROBE", "SMOKE_MAX_TOKENS", "HostDiff", "NodeTiming", "Outage",
    "Progress", "Pyinfra", "Recovery", "RollError", "Roller", "add_parser", "batch_outages", "cmd_releases", "cmd_roll",
    "cmd_rollback", "covered_seconds", "downtime_hold_s", "expected_outage", "format_dry_plan", "format_releases",
    "host_diff", "key_fix", "make_batches", "measure_restarts", "merge_units", "metric_sums", "open_breakers",
    "outage_lines", "pairing_units", "parse_running_key", "patch_gevent", "put_back_summary", "read_node_state",
    "refusal_text",
    "report", "rerun_with_downtime", "restart_to_ready", "roll_inventory", "rollout_order", "router_keys",
    "router_state_words", "run_remote", "silence_window_s", "sort_by_health", "spanning_units", "stop_summary",
    "unchanged_hosts",
    "version_changes",
]
