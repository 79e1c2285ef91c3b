"""The `pdkit` command line: validate | render | lab (more subcommands land with their issues)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_INVALID = 2


def cmd_validate(args: argparse.Namespace) -> int:
    from pdkit.loader import load_with_problems
    from pdkit.summary import summary

    spec, problems = load_with_problems(args.inventory)
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity == "warning"]
    if errors or spec is None:
        print(f"{args.inventory}: {len(errors)} error(s); nothing was contacted.", file=sys.stderr)
        for p in errors:
            print(f"  error   {p}", file=sys.stderr)
        for p in warnings:
            print(f"  warning {p}", file=sys.stderr)
        return EXIT_INVALID
    print(summary(spec))
    for p in warnings:
        print(f"warning {p}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from pdkit.loader import load_with_problems
    from pdkit.plan import plan_cluster

    spec, problems = load_with_problems(args.inventory)
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        print(f"{args.inventory}: {len(errors)} error(s); run `pdkit validate {args.inventory}` for the list.", file=sys.stderr)
        for p in errors:
            print(f"  error   {p}", file=sys.stderr)
        return EXIT_INVALID
    out = Path(args.out)
    written = 0
    for host, plan in plan_cluster(spec).items():
        for planned in plan.files:
            target = out / host / planned.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            # write-then-chmod would expose a secret for a moment: create with the final mode
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(planned.mode, 8))
            with os.fdopen(fd, "w") as fh:
                fh.write(planned.content)
            os.chmod(target, int(planned.mode, 8))
            written += 1
    print(f"rendered {written} files for {len(spec.hosts)} hosts into {out}/<host>/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdkit", description="SGLang PD serving from one validated spec, laid down by pyinfra.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check an inventory without contacting any host")
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventories/cluster.py")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="write every file pdkit would put on each host")
    p.add_argument("inventory")
    p.add_argument("--out", required=True, help="directory; files land in OUT/<host>/<absolute path>")
    p.set_defaults(func=cmd_render)

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
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
