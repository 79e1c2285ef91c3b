"""What both checker scripts share (stdlib only: they run in the parser venvs, without pdkit).

The scripts are run as `python <script>`, so this file's directory is first on sys.path.
"""

from __future__ import annotations

import argparse
import json
import logging
import re

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
