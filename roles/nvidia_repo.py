"""NVIDIA's CUDA apt repository: the cuda-keyring key and a deb822 source that trusts only it.

`nvidia_repo()` is shared: the driver, CUDA, NCCL and DCGM exporter roles all call it, and it
lays its operations down once per host per run (a second call is a no-op). Decisions (URLs,
source text, paths) are in pdkit/render/node.py.
"""

from __future__ import annotations

import io
import shlex
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, server

from pdkit.render.node import KEYRING_DEB_PATH, KEYRING_PATH, NODE_CACHE_DIR, SOURCES_PATH
from roles.preflight import current_stack

# hosts already laid down, per pyinfra State (`pdkit roll` runs one State per batch)
_LAID: WeakKeyDictionary = WeakKeyDictionary()


def source_files() -> object:
    """The deb822 source and the removal of cuda-keyring's own .list; returns the source operation."""
    stack = current_stack()
    files.file(name=f"No duplicate NVIDIA source {stack.keyring_list_path}", path=stack.keyring_list_path, present=False)
    return files.put(
        name=f"NVIDIA apt source {SOURCES_PATH} ({stack.repo_url}, Signed-By {KEYRING_PATH})",
        src=io.StringIO(stack.sources_text), dest=SOURCES_PATH, mode="0644", user="root", group="root",
    )


@deploy("pdkit NVIDIA apt repository")
def nvidia_repo() -> None:
    laid = _LAID.setdefault(host.state, set())
    if host.name in laid:
        return
    laid.add(host.name)
    stack = current_stack()
    q = shlex.quote
    if not host.get_fact(File, path=KEYRING_PATH):
        # NVIDIA's documented route to its key; the package also ships a .list source, removed
        # right away so that apt sees the repository once (through pdkit's deb822 source)
        files.directory(name=f"Directory {NODE_CACHE_DIR}", path=NODE_CACHE_DIR, mode="0755", user="root", group="root")
        files.download(name=f"cuda-keyring from {stack.keyring_deb_url}", src=stack.keyring_deb_url, dest=KEYRING_DEB_PATH, mode="0644", _timeout=300)
        server.shell(
            name=f"Install cuda-keyring ({KEYRING_PATH})",
            commands=[f"dpkg -i {q(KEYRING_DEB_PATH)} && rm -f {q(stack.keyring_list_path)}"],
        )
    source = source_files()
    apt.update(name="apt update (the NVIDIA source changed)", _if=source.did_change, _timeout=900)
