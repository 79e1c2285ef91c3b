"""Where gpu/nspawn/host.py keeps a container host's state: the one rule it and the inventories share.

    $PDKIT_NSPAWN_DIR (default /var/lib/pdkit-nspawn)    the state directory (the base)
        id_ed25519, id_ed25519.pub                        the control side's SSH key: one for every machine
        ucx_tls.json                                      host.py xfer-probe's choice (between machines)
        <machine>/                                        one machine's own state:
            host.json                                     how to reach it (what the inventories read)
            known_hosts                                   its host key, written before it boots
            runtime.json, timings.json, console.log, probe.json, libraries.json

host.py (`--machine NAME`, default pdkit-h200) writes there; inventories/h200-nspawn.py (one
host) and inventories/h200-nspawn-pair.py (two) read there, through these functions, so the
two sides cannot disagree on a path again. On 2026-12-02 they did: host.py had moved to
`<base>/<machine>/` and the one-host inventory still read `<base>/host.json`, so the first
deploy from a fresh clone failed with "No host key for [127.0.0.1]:2222 found in known_hosts";
and with PDKIT_NSPAWN_DIR pointed at the machine's own directory to work around it, host.py
looked for the running machine under `<machine>/<machine>/`, did not find it, and `unpack`
replaced the running machine's tree. `machine_dir` now refuses a base that is itself a
machine's state directory.

Stdlib only: host.py runs on the lent machine's own Python, the inventories in pdkit's venv.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ENV = "PDKIT_NSPAWN_DIR"
DEFAULT_DIR = "/var/lib/pdkit-nspawn"
# the files only a machine's own directory holds: a base that has them is a machine's directory
MACHINE_FILES = ("host.json", "runtime.json")
# what systemd-nspawn accepts as a machine name, and a directory name with no surprises
MACHINE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$")


class StateDirError(ValueError):
    """The state directory or a machine name that would put a machine's state somewhere else."""


def base_dir(base: str | os.PathLike | None = None) -> Path:
    """The state directory: BASE, else $PDKIT_NSPAWN_DIR, else /var/lib/pdkit-nspawn."""
    return Path(base if base is not None else (os.environ.get(ENV) or DEFAULT_DIR))


def machine_dir(machine: str, base: str | os.PathLike | None = None) -> Path:
    """One machine's own state directory: <base>/<machine>."""
    if not MACHINE_NAME.match(machine or ""):
        raise StateDirError(f"{machine!r} is not a machine name (letters, digits, '_', '.', '-')")
    root = base_dir(base)
    own = [f for f in MACHINE_FILES if (root / f).is_file()]
    if own:
        raise StateDirError(
            f"{ENV}={root} is a machine's own state directory (it holds {', '.join(own)}): set {ENV} to the directory "
            f"above it ({root.parent}); each machine's state is <{ENV}>/<machine>/ (gpu/nspawn/machine_state.py)")
    return root / machine


def host_json(machine: str, base: str | os.PathLike | None = None) -> Path:
    return machine_dir(machine, base) / "host.json"


def known_hosts(machine: str, base: str | os.PathLike | None = None) -> Path:
    return machine_dir(machine, base) / "known_hosts"


def client_key(base: str | os.PathLike | None = None) -> Path:
    """The control side's key: one for every machine the launcher boots."""
    return base_dir(base) / "id_ed25519"


def ucx_tls_file(base: str | os.PathLike | None = None) -> Path:
    return base_dir(base) / "ucx_tls.json"


def read_host(machine: str, base: str | os.PathLike | None = None) -> dict:
    """What `host.py up` wrote for MACHINE ({} before it ran)."""
    try:
        return json.loads(host_json(machine, base).read_text())
    except (OSError, ValueError):
        return {}


def ssh_settings(machine: str, address: str, port: int, base: str | os.PathLike | None = None) -> dict:
    """How an inventory reaches MACHINE: host.json's address, port, key and known_hosts once `up`
    ran, else the launcher's fixed ADDRESS and PORT with the paths `up` will write (so the
    inventory validates before any machine exists)."""
    up = read_host(machine, base)
    return {
        "ssh_hostname": up.get("ssh_hostname", address),
        "ssh_port": int(up.get("ssh_port", port)),
        "ssh_key": str(up.get("ssh_key", client_key(base))),
        "ssh_known_hosts_file": str(up.get("ssh_known_hosts_file", known_hosts(machine, base))),
    }
