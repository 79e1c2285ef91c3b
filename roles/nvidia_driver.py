"""The NVIDIA driver: branch locked to R580, open kernel modules, persistenced, no unattended upgrades.

A driver install or change writes the reboot-required marker (pdkit.render.node.REBOOT_MARKER_PATH),
which the preflight report and pdkit-exporter (pdkit_node_reboot_required) show. The kit never
reboots a serving node by itself: only with pdkit_node.reboot: when-drained AND pyinfra data
node_drained=True, which `pdkit roll` sets for the node it has just drained.
"""

from __future__ import annotations

import io
import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from pdkit.hosts.deploy import current_host
from pdkit.render.node import (
    NODE_STATE_DIR,
    PERSISTENCED_UNIT,
    REBOOT_MARKER_PATH,
    UNATTENDED_PATH,
    pinning_package,
    reboot_marker_text,
    unattended_text,
)
from pdkit.upstream.versions import NVIDIA_DRIVER_BRANCH
from roles.nvidia_repo import nvidia_repo
from roles.preflight import current_stack, node_facts

APT_TIMEOUT_S = 1800  # DKMS builds the modules inside the install


def driver_files() -> None:
    """What needs no NVIDIA repository: unattended-upgrades kept off the NVIDIA stack."""
    files.put(
        name=f"Keep the NVIDIA stack out of unattended upgrades ({UNATTENDED_PATH})",
        src=io.StringIO(unattended_text()), dest=UNATTENDED_PATH, mode="0644", user="root", group="root",
    )


@deploy("pdkit NVIDIA driver")
def nvidia_driver() -> None:
    node = current_host().node
    assert node is not None
    nvidia_repo()
    stack = current_stack()
    driver_files()
    pin_package, *driver = stack.driver_packages
    assert pin_package == pinning_package()
    # the branch lock goes in before the driver, so apt never resolves nvidia-open past R580
    pin = apt.packages(name=f"Lock the driver to branch {NVIDIA_DRIVER_BRANCH} ({pin_package})", packages=[pin_package], no_recommends=True, _timeout=APT_TIMEOUT_S)
    installed = apt.packages(name=f"NVIDIA driver R{NVIDIA_DRIVER_BRANCH} ({node.driver_modules}): {', '.join(driver)}", packages=driver, no_recommends=True, _timeout=APT_TIMEOUT_S)
    changed = any_changed(pin, installed)
    files.directory(name=f"Directory {NODE_STATE_DIR}", path=NODE_STATE_DIR, mode="0755", user="root", group="root")
    files.put(
        name=f"Mark reboot required ({REBOOT_MARKER_PATH}) when the driver changed",
        src=io.StringIO(reboot_marker_text(f"NVIDIA driver packages changed by pdkit (branch {NVIDIA_DRIVER_BRANCH}, {node.driver_modules})")),
        dest=REBOOT_MARKER_PATH, mode="0644", user="root", group="root", _if=changed,
    )
    systemd.service(name=f"Enable {PERSISTENCED_UNIT}", service=PERSISTENCED_UNIT, running=None, enabled=True)
    pending = bool(node_facts().get("reboot_required"))
    # start it only on a driver that is loaded as installed (after a change, the reboot starts it)
    systemd.service(name=f"Start {PERSISTENCED_UNIT}", service=PERSISTENCED_UNIT, running=True, _if=lambda: not pending and not changed())
    if node.reboot == "when-drained" and host.data.get("node_drained") is True:
        needed = lambda: pending or changed()  # noqa: E731
        server.reboot(name="Reboot the drained node (the driver changed)", reboot_timeout=1800, _if=needed)
        server.shell(name=f"Clear {REBOOT_MARKER_PATH} after the reboot", commands=[f"rm -f {shlex.quote(REBOOT_MARKER_PATH)}"], _if=needed)
