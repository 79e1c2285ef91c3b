"""The parser table's generator: writes pdkit/upstream/parser_table.json from the pinned parsers.

Run on the control machine by pdkit's Python, with the contract virtualenvs built
(`bash .ci/contract-env.sh`): each release's own argparse parser is described by the checker
scripts next to this file (pdkit.contract's describe mode), and this module keeps what
`pdkit validate` needs of it. The kit reads the table through pdkit.upstream.parsertable:

    python -m pdkit.contract.parsertable_gen --write   # regenerate pdkit/upstream/parser_table.json
    python -m pdkit.contract.parsertable_gen --check   # exit 1 when the committed table is stale

tests/test_parser_table.py regenerates it in CI and fails on any difference.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from pdkit import contract
from pdkit.upstream.parsertable import TABLE_PATH
from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES

# the committed table's first line: the command that writes it
GENERATED_BY = "python -m pdkit.contract.parsertable_gen --write (from the contract virtualenvs)"

# SGLang environment variables whose defaults the table keeps (sglang/srt/environ.py): the PD
# waits and heartbeats pdkit.spec.faultbudget renders, and the sim reads by the same names
ENVIRONMENT_PREFIXES = ("SGLANG_DISAGGREGATION_",)

# Options whose value is a credential: they would show in `ps`, the unit file and the journal.
# Decided here, on the dest, so every release's table marks the same kind of option.
_SECRET_DEST = re.compile(r"(^|_)(api_keys?|password|secret|token)$")
# SGLang's help text asks for the same setting on both PD roles (0.5.23:
# sglang/srt/arg_groups/fields/disagg.py, e.g. "Set the same policy on both roles").
_BOTH_ROLES_HELP = re.compile(r"on both (roles|prefill and decode)|both prefill and decode (servers|engines)", re.I)


def _takes(option: dict) -> int | str:
    """argparse's nargs as the table keeps it; describe reports 0 for store_true/const-like actions."""
    nargs = option["nargs"]
    if nargs is None:
        return 1
    if isinstance(nargs, int) or nargs in ("?", "*", "+"):
        return nargs
    return "*"  # argparse.REMAINDER and the like: everything that follows


def table_entry(options: list[dict], with_defaults: bool = False) -> list[dict]:
    """The table's record of each option from a checker's describe reply (help text dropped;
    WITH_DEFAULTS: the parser's default kept, for the routers, whose defaults pdkit reasons about)."""
    out = []
    for o in options:
        if o["action"] == "_HelpAction":
            continue
        extra = {"default": o["default"]} if with_defaults else {}
        out.append({
            **extra,
            "flags": o["flags"],
            "dest": o["dest"],
            "takes": _takes(o),
            # sorted: some choices are sets in SGLang (their order changes from run to run)
            "choices": sorted(str(c) for c in o["choices"]) if o["choices"] is not None else None,
            "secret": bool(_SECRET_DEST.search(o["dest"])),
            "both_roles": bool(o["help"] and _BOTH_ROLES_HELP.search(o["help"])),
            # a deprecated spelling names its replacement ("--cuda-graph-backend-prefill=disabled")
            "replaced_by": o["new_flag"].split("=", 1)[0] if o.get("new_flag") else None,
        })
    return sorted(out, key=lambda o: o["flags"][0])


def generate() -> dict:
    """The table, read from the pinned parsers in the contract virtualenvs (minutes: imports sglang)."""
    out: dict = {"generated_by": GENERATED_BY, "sglang": {}, "router": {}}
    for version in sorted(SGLANG_RELEASES):
        reply = contract.run_sglang_check(version, [], describe=True, environment_prefixes=ENVIRONMENT_PREFIXES)
        out["sglang"][version] = {
            "source": f"sglang=={version}: sglang/srt/server_args.py ServerArgs.add_cli_args, "
                      "sglang/srt/speculative/spec_info.py SpeculativeAlgorithm, sglang/srt/environ.py Envs",
            "speculative_algorithms": reply["speculative_algorithms"],
            "environment": reply["environment"],
            "options": table_entry(reply["options"]),
        }
    for package, version in sorted(ROUTER_RELEASES):
        reply = contract.run_router_check(package, version, [], describe=True)
        source = ("smg/launch_router.py parse_router_args (smg launch)" if package == "smg"
                  else "sglang_router/launch_router.py")
        out["router"][f"{package} {version}"] = {"source": f"{package}=={version}: {source}",
                                                 "options": table_entry(reply["options"], with_defaults=True)}
    return out


def dumps(data: dict) -> str:
    # one option per line: a release bump reads as a small diff
    lines = ["{", f'  "generated_by": {json.dumps(data["generated_by"])},']
    for kind in ("sglang", "router"):
        lines.append(f'  "{kind}": {{')
        releases = list(data[kind].items())
        for r, (key, release) in enumerate(releases):
            lines.append(f"    {json.dumps(key)}: {{")
            for field in ("source", "speculative_algorithms", "environment"):
                if field in release:
                    lines.append(f"      {json.dumps(field)}: {json.dumps(release[field], sort_keys=True)},")
            lines.append('      "options": [')
            opts = release["options"]
            lines += [f"        {json.dumps(o, sort_keys=True)}{',' if j < len(opts) - 1 else ''}"
                      for j, o in enumerate(opts)]
            lines.append("      ]")
            lines.append("    }" + ("," if r < len(releases) - 1 else ""))
        lines.append("  }" + ("," if kind == "sglang" else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdkit.contract.parsertable_gen",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {TABLE_PATH.name}")
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed table differs")
    args = parser.parse_args(argv)
    text = dumps(generate())
    if args.write:
        TABLE_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {TABLE_PATH}")
        return 0
    if args.check:
        if TABLE_PATH.read_text(encoding="utf-8") != text:
            print(f"{TABLE_PATH} is stale: run `python -m pdkit.contract.parsertable_gen --write`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
