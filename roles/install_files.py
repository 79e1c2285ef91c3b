"""One operation that lays down every planned file that differs: one upload each, one command.

`files.put` reads three facts per file (File, Directory, Sha1File) and then uploads, chmods
and chowns in separate round trips: ~0.3 s a file, and a roll's config change touches three
(the unit, exporter.json, release.json). The services role already knows which files differ
from its one host-state fact (roles/facts.py), so this operation only has to write them.
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Sequence

from pyinfra.api import FileUploadCommand, StringCommand, operation

from pdkit.plan import PlannedFile


def install_commands(files: Sequence[PlannedFile], staging: str, *, daemon_reload: bool) -> list[str | tuple[PlannedFile, str]]:
    """The steps, in order: uploads ((file, staged path)), then one shell command.

    Uploads land in STAGING, a root-only (0700) directory the base role keeps (pdkit.plan
    .staging_dir), so no file is ever visible under its final path with the wrong mode or owner;
    each is then given its mode and owner and moved into place (`mkdir -p` creates a missing
    parent, as files.put does, and leaves an existing one's mode alone). A unit file among them
    is followed by one `systemctl daemon-reload`.
    """
    q = shlex.quote
    staged = [(f, f"{staging}/{i}") for i, f in enumerate(files)]
    moves = [
        f"mkdir -p {q(f.path.rsplit('/', 1)[0])} && chown {q(f.owner)}:{q(f.group)} {q(s)} && chmod {q(f.mode)} {q(s)} && mv -f {q(s)} {q(f.path)}"
        for f, s in staged
    ]
    if daemon_reload:
        moves.append("systemctl daemon-reload")
    return [*staged, " && ".join(moves)]


@operation()
def install_files(files: Sequence[PlannedFile], staging: str, daemon_reload: bool = False):
    """
    Write FILES (content, mode, owner, group) through a root-only staging directory.

    + files: the planned files to write (all of them are written: pass only those that differ)
    + staging: a root-only (0700) directory that only this operation writes to
    + daemon_reload: run `systemctl daemon-reload` afterwards (a unit or drop-in is among FILES)

    **Example:**

    .. code:: python

        install_files(name="Install 2 changed file(s)", files=changed, staging="/etc/pdkit/.staging")
    """
    for step in install_commands(files, staging, daemon_reload=daemon_reload):
        if isinstance(step, str):
            yield StringCommand(step)
        else:
            planned, staged_path = step
            yield FileUploadCommand(io.BytesIO(planned.content.encode()), staged_path)
