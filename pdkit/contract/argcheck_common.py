"""What both checker scripts share (stdlib only: they run in the parser venvs, without pdkit).

The scripts are run as `python <script>`, so this file's directory is first on sys.path.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from typing import TextIO

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Records(logging.Handler):
    """Collects the warnings a parser logs (deprecations), colour codes stripped."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        try:
            self.messages.append(ANSI.sub("", record.getMessage()))
        except Exception:  # noqa: BLE001
            pass


def jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def describe(parser: argparse.ArgumentParser) -> list[dict]:
    """Every option of a parser with its choices and defaults (the checkers' describe mode)."""
    out = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        out.append(
            {
                "flags": list(action.option_strings),
                "dest": action.dest,
                "action": type(action).__name__,
                "nargs": jsonable(action.nargs),
                "type": getattr(action.type, "__name__", None) if action.type else None,
                "choices": [jsonable(c) for c in action.choices] if action.choices is not None else None,
                "default": jsonable(action.default),
                "help": action.help if isinstance(action.help, str) else None,
                # SGLang's deprecated aliases name their replacement
                "new_flag": getattr(action, "new_flag", None),
            }
        )
    return out


def request_argvs(request: dict) -> list[list[str]]:
    """The request's argvs, refused unless they are a list of lists of strings."""
    argvs = request.get("argvs", [])
    if not isinstance(argvs, list) or not all(
        isinstance(a, list) and all(isinstance(s, str) for s in a) for a in argvs
    ):
        raise SystemExit("argvs must be a list of lists of strings")
    return argvs


def reply_stream() -> TextIO:
    """The real stdout, kept for the JSON reply alone: whatever the checked package or its dependencies print
    from now on (while importing, C level included) goes to stderr."""
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return real_stdout


def send_reply(out: TextIO, reply: dict) -> None:
    out.write(json.dumps(reply) + "\n")
    out.flush()


@contextlib.contextmanager
def one_check() -> Iterator[tuple[dict, io.StringIO]]:
    """One argv's result ({"ok": False, "error": None, "warnings": []}) and the buffer that stdout and stderr
    go to inside; on the way out, the warnings logged meanwhile become the result's."""
    records = Records()
    root = logging.getLogger()
    root.addHandler(records)
    buf = io.StringIO()
    result: dict = {"ok": False, "error": None, "warnings": []}
    try:
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
            yield result, buf
    finally:
        root.removeHandler(records)
        result["warnings"] = records.messages
