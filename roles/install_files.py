"""One operation that lays down every planned file that differs (one upload each, one command)
and removes the files the plan no longer has.

`files.put` reads three facts per file (File, Directory, Sha1File) and then uploads, chmods
and chowns in separate round trips: ~0.3 s a file, and a roll's config change touches three
(the unit, exporter.json, release.json). The services role already knows which files differ
from its one host-state fact (roles/facts.py), so this operation only has to write them.
"""

from __future__ import annotations

import difflib
import io
import shlex
import sys
from collections.abc import Sequence
from weakref import WeakKeyDictionary

from pyinfra import host, state
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import FileContents

from pdkit.render.plan import PlannedFile
from roles.facts import host_state


def change_summary(files: Sequence[PlannedFile], remove: Sequence[str] = ()) -> str:
    """This host's own list (pyinfra shares one operation name across hosts, so the name stays
    generic and each host prints this under its own name)."""
    parts = []
    if files:
        parts.append(f"{len(files)} file(s) to write: " + ", ".join(f.path + (" (secret)" if f.secret else "") for f in files))
    if remove:
        parts.append(f"{len(remove)} no longer planned, to remove: " + ", ".join(remove))
    return "; ".join(parts) or "no file to change"


def diff_lines(planned: PlannedFile, current: str | None) -> list[str]:
    """`--diff`: a unified diff from the host's CURRENT text (None: missing) to PLANNED's, like
    pyinfra's files.put; a secret file only says that it changes, never a line of it."""
    verb = "create" if current is None else "modify"
    if planned.secret:
        return [f"Will {verb} {planned.path} (secret: content not shown)"]
    diff = difflib.unified_diff(
        (current or "").splitlines(keepends=True), planned.content.splitlines(keepends=True),
        fromfile=planned.path if current is not None else "/dev/null", tofile=planned.path, n=2,
    )
    return [f"Will {verb} {planned.path}", *(line.rstrip("\n") for line in diff)]


# (state -> host names) that already printed their list: pyinfra runs an operation's body at
# prepare time (to see whether it changes anything) and again at execute time
_LOGGED: WeakKeyDictionary = WeakKeyDictionary()


def install_commands(files: Sequence[PlannedFile], staging: str, *, daemon_reload: bool, remove: Sequence[str] = ()) -> list[str | tuple[PlannedFile, str]]:
    """The steps, in order: uploads ((file, staged path)), then one shell command.

    Uploads land in STAGING, a root-only (0700) directory the base role keeps (pdkit.render.plan
    .staging_dir), so no file is ever visible under its final path with the wrong mode or owner;
    each is then given its mode and owner and moved into place (`mkdir -p` creates a missing
    parent, as files.put does, and leaves an existing one's mode alone). A unit file among them
    is followed by one `systemctl daemon-reload`. REMOVE: paths deleted (files the node's
    current release laid down that the plan no longer has), before that reload.
    """
    q = shlex.quote
    staged = [(f, f"{staging}/{i}") for i, f in enumerate(files)]
    moves = [
        f"mkdir -p {q(f.path.rsplit('/', 1)[0])} && chown {q(f.owner)}:{q(f.group)} {q(s)} && chmod {q(f.mode)} {q(s)} && mv -f {q(s)} {q(f.path)}"
        for f, s in staged
    ]
    if remove:
        moves.append("rm -f " + " ".join(q(p) for p in remove))
    if daemon_reload:
        moves.append("systemctl daemon-reload")
    return [*staged, " && ".join(moves)]


def announce(files: Sequence[PlannedFile], remove: Sequence[str] = ()) -> None:
    """Print this host's own list of files to write and remove (and, with --diff, their diffs) at
    prepare time, so `--dry` shows it too: pyinfra runs an operation's body only when it executes."""

    logged = _LOGGED.setdefault(state, set())

    def say(line: str) -> None:
        # stderr, under the host's name as pyinfra prints it: host.log is not shown by default,
        # and --json keeps stdout for pyinfra's results
        print(f"    [{host.name}] {line}", file=sys.stderr, flush=True)

    if host.name not in logged:
        logged.add(host.name)
        say(change_summary(files, remove))
        if state.config.DIFF:
            for planned in files:
                current = None
                if not planned.secret:
                    lines = host.get_fact(FileContents, path=planned.path)
                    current = None if lines is None else "".join(line + "\n" for line in lines)
                elif host_has(planned.path):
                    current = ""
                for line in diff_lines(planned, current):
                    say("  " + line)
            for path in remove:
                say(f"  Will remove {path}")


@operation()
def install_files(files: Sequence[PlannedFile], staging: str, daemon_reload: bool = False, remove: Sequence[str] = ()):
    """
    Write FILES (content, mode, owner, group) through a root-only staging directory and delete REMOVE.

    + files: the planned files to write (all of them are written: pass only those that differ)
    + staging: a root-only (0700) directory that only this operation writes to
    + daemon_reload: run `systemctl daemon-reload` afterwards (a unit or drop-in is among FILES)
    + remove: paths to delete (files no longer planned)

    Call `announce` first (prepare time): each host prints its own list; with `--diff`
    (pyinfra's flag) a unified diff of each text file, secrets only named.

    **Example:**

    .. code:: python

        install_files(name="Install 2 changed file(s)", files=changed, staging="/etc/pdkit/.staging")
    """
    for step in install_commands(files, staging, daemon_reload=daemon_reload, remove=remove):
        if isinstance(step, str):
            yield StringCommand(step)
        else:
            planned, staged_path = step
            yield FileUploadCommand(io.BytesIO(planned.content.encode()), staged_path)


def host_has(path: str) -> bool:
    """Whether PATH exists on the current host (from the one host-state fact: no extra round trip)."""

    return bool(host_state()["paths"].get(path))
