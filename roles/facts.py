"""The host-state fact the roles read: it lives in pdkit/hosts/hoststate.py (pdkit roll reads hosts with it
too, and pdkit imports nothing from roles/); its names stay importable from here."""

from __future__ import annotations

from pdkit.hosts.hoststate import (  # noqa: F401 - re-exported
    PROBE,
    PdkitHostState,
    WithHostState,
    host_state,
    path_matches,
    read_texts_with_host_state,
    read_with_host_state,
    unit_active_enabled,
)

# the probe's source under its old name (tests/test_host_state_probe.py reads its prelude)
_PROBE = PROBE
