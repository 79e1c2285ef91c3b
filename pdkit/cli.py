"""The `pdkit` command line: validate | render | lab (more subcommands land with their issues)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    try:
        from pdkit.lab.cli import add_parser as add_lab_parser
    except ImportError:  # the lab lands with its own issue
        add_lab_parser = None
    if add_lab_parser is not None:
        add_lab_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
