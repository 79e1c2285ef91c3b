"""The pinned SGLang and router command lines as their own parsers define them, as data.

`pdkit/parser_table.json` lists, for every pinned SGLang release and router package, each
option of its argparse parser (option strings, dest, how many values it takes, its
choices) and the speculative algorithm names SGLang's `SpeculativeAlgorithm.from_string`
accepts. It is generated from the real wheels in the contract virtualenvs
(`bash .ci/contract-env.sh`), so `pdkit validate` checks choices, aliases and prefixes
exactly as SGLang and the router will, without importing either:

    python -m pdkit.parsertable --write   # regenerate pdkit/parser_table.json
    python -m pdkit.parsertable --check   # exit 1 when the committed table is stale

tests/test_parser_table.py regenerates it in CI and fails on any difference.

The argv reading below follows CPython 3.11's argparse (`_parse_optional`,
`_get_option_tuples`, `_match_argument`): exact option strings first, then `--flag=value`,
then unambiguous prefixes of long options (SGLang's parser keeps `allow_abbrev`).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from pdkit import contract
from pdkit.versions import ROUTER_RELEASES, SGLANG_RELEASES

TABLE_PATH = Path(__file__).with_name("parser_table.json")
# SGLang environment variables whose defaults the table keeps (sglang/srt/environ.py): the PD
# waits and heartbeats pdkit.faultbudget renders, and the sim reads by the same names
ENVIRONMENT_PREFIXES = ("SGLANG_DISAGGREGATION_",)

# Options whose value is a credential: they would show in `ps`, the unit file and the journal.
# Decided here, on the dest, so every release's table marks the same kind of option.
_SECRET_DEST = re.compile(r"(^|_)(api_keys?|password|secret|token)$")
# SGLang's help text asks for the same setting on both PD roles (0.5.23:
# sglang/srt/arg_groups/fields/disagg.py, e.g. "Set the same policy on both roles").
_BOTH_ROLES_HELP = re.compile(r"on both (roles|prefill and decode)|both prefill and decode (servers|engines)", re.I)
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Option:
    """One argparse option of a pinned parser."""

    flags: tuple[str, ...]
    dest: str
    # how many values follow the flag: 0, 1, "?", "*" or "+" (argparse nargs)
    takes: int | str
    choices: tuple[str, ...] | None
    # its value is a credential (see _SECRET_DEST)
    secret: bool
    # SGLang's help says to set it the same on prefill and decode
    both_roles: bool
    # a deprecated spelling: the flag that replaces it
    replaced_by: str | None = None

    @property
    def name(self) -> str:
        """The long spelling argparse prints first."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


@dataclass(frozen=True)
class Parsed:
    """One flag of an argv and the values argparse would give it."""

    index: int
    written: str
    option: Option
    values: tuple[str, ...]


@dataclass(frozen=True)
class ArgvProblem:
    index: int
    message: str


class Parser:
    """The option table of one release's parser, with argparse's lookup rules."""

    def __init__(self, label: str, options: list[dict]):
        self.label = label
        self.options = tuple(
            Option(tuple(o["flags"]), o["dest"], o["takes"], tuple(o["choices"]) if o["choices"] is not None else None,
                   o["secret"], o["both_roles"], o["replaced_by"])
            for o in options
        )
        self.by_flag = {flag: opt for opt in self.options for flag in opt.flags}
        self._long = sorted(f for f in self.by_flag if f.startswith("--"))
        self.both_roles = tuple(o for o in self.options if o.both_roles)

    def option(self, flag: str) -> Option:
        """The option an exact option string names (for flags pdkit itself generates)."""
        return self.by_flag[flag]

    def choices(self, flag: str) -> tuple[str, ...] | None:
        return self.by_flag[flag].choices

    def resolve(self, name: str) -> tuple[Option | None, str | None]:
        """(option, None) as argparse resolves `name`, else (None, why not)."""
        if name in self.by_flag:
            return self.by_flag[name], None
        if name.startswith("--"):
            # argparse 3.11 counts option strings, not actions: two spellings of one flag that
            # share the prefix are "ambiguous" too (the contract envs run Python 3.11)
            hits = [f for f in self._long if f.startswith(name)]
            if len(hits) == 1:
                return self.by_flag[hits[0]], None
            if hits:
                shown = ", ".join(hits[:6]) + (f" and {len(hits) - 6} more" if len(hits) > 6 else "")
                return None, f"{name} is ambiguous in {self.label}: it abbreviates {shown}; write the full flag"
        close = difflib.get_close_matches(name, self._long, n=3, cutoff=0.75)
        hint = f"; did you mean {' or '.join(close)}?" if close else f"; see `{self.label} --help` for its flags"
        return None, f"{name} is not a flag of {self.label}{hint}"

    def parse(self, argv: list[str] | tuple[str, ...]) -> tuple[list[Parsed], list[ArgvProblem]]:
        """Read an argv the way argparse would: each flag with its values, and what it rejects."""
        parsed: list[Parsed] = []
        problems: list[ArgvProblem] = []
        i = 0
        while i < len(argv):
            token = argv[i]
            if not _looks_like_flag(token):
                if re.search(r"\s", token) and shlex_split(token) and _looks_like_flag(shlex_split(token)[0]):
                    problems.append(ArgvProblem(i, _one_string_message(token)))
                else:
                    problems.append(ArgvProblem(i, f"{token!r} is a value without a flag before it that takes one (argparse: unrecognized arguments)"))
                i += 1
                continue
            name, explicit = token.split("=", 1) if "=" in token else (token, None)
            if re.search(r"\s", name):
                problems.append(ArgvProblem(i, _one_string_message(token)))
                i += 1
                continue
            option, why = self.resolve(name)
            if option is None:
                problems.append(ArgvProblem(i, why or f"{name} is not a flag of {self.label}"))
                i += 1
                while i < len(argv) and not _looks_like_flag(argv[i]):
                    i += 1  # its values: one problem for the flag, not one per value
                continue
            start = i
            i += 1
            if explicit is not None:
                if option.takes == 0:
                    problems.append(ArgvProblem(start, f"{option.name} takes no value (got {token!r}); write {option.name} alone"))
                    continue
                values = [explicit]
            else:
                values = []
                limit = option.takes if isinstance(option.takes, int) else 1 if option.takes == "?" else len(argv)
                while i < len(argv) and len(values) < limit and not _looks_like_flag(argv[i]):
                    values.append(argv[i])
                    i += 1
                wanted = option.takes if isinstance(option.takes, int) else 1 if option.takes == "+" else 0
                if len(values) < wanted:
                    problems.append(ArgvProblem(start, f"{option.name} expects {wanted} value(s) after it, got {len(values)}"))
                    continue
            if option.choices is not None:
                bad = [v for v in values if v not in option.choices]
                if bad:
                    problems.append(ArgvProblem(start, f"{bad[0]!r} is not a valid {option.name} in {self.label}; valid: {', '.join(option.choices)}"))
                    continue
            parsed.append(Parsed(start, token, option, tuple(values)))
        return parsed, problems


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)


def shlex_split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _one_string_message(token: str) -> str:
    return (f"{token!r} is one argv entry holding several words; argparse sees it as a single unknown argument: "
            f"give one entry per word, e.g. {shlex_split(token)!r}")


@functools.cache
def table() -> dict:
    with TABLE_PATH.open(encoding="utf-8") as fh:
        return json.load(fh)


@functools.cache
def sglang_parser(version: str) -> Parser:
    return Parser(f"SGLang {version}", table()["sglang"][version]["options"])


@functools.cache
def router_parser(package: str, version: str) -> Parser:
    return Parser(f"{package} {version}", table()["router"][f"{package} {version}"]["options"])


def sglang_environment(version: str) -> dict[str, dict]:
    """{variable: {"type": "EnvInt", "default": 300}} of SGLang VERSION (ENVIRONMENT_PREFIXES only)."""
    return table()["sglang"][version]["environment"]


def router_default(package: str, version: str, flag: str):
    """The router parser's default for FLAG (e.g. '--request-timeout-secs')."""
    release = table()["router"][f"{package} {version}"]
    for option in release["options"]:
        if flag in option["flags"]:
            return option["default"]
    raise KeyError(f"{package} {version} has no option {flag}")


def router_has_flag(package: str, version: str, flag: str) -> bool:
    return any(flag in option["flags"] for option in table()["router"][f"{package} {version}"]["options"])


def speculative_algorithms(version: str) -> tuple[str, ...]:
    return tuple(table()["sglang"][version]["speculative_algorithms"])


def all_speculative_algorithms() -> tuple[str, ...]:
    """Every name any pinned release accepts, in first-seen order."""
    seen: dict[str, None] = {}
    for release in table()["sglang"].values():
        seen.update(dict.fromkeys(release["speculative_algorithms"]))
    return tuple(seen)


# ------------------------------------------------------------------------------ generation


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
    out: dict = {"generated_by": "python -m pdkit.parsertable --write (from the contract virtualenvs)", "sglang": {}, "router": {}}
    for version in sorted(SGLANG_RELEASES):
        reply = contract.run_sglang_check(version, [], describe=True, environment_prefixes=ENVIRONMENT_PREFIXES)
        out["sglang"][version] = {
            "source": f"sglang=={version}: sglang/srt/server_args.py ServerArgs.add_cli_args, sglang/srt/speculative/spec_info.py SpeculativeAlgorithm, sglang/srt/environ.py Envs",
            "speculative_algorithms": reply["speculative_algorithms"],
            "environment": reply["environment"],
            "options": table_entry(reply["options"]),
        }
    for package, version in sorted(ROUTER_RELEASES):
        reply = contract.run_router_check(package, version, [], describe=True)
        source = "smg/launch_router.py parse_router_args (smg launch)" if package == "smg" else "sglang_router/launch_router.py"
        out["router"][f"{package} {version}"] = {"source": f"{package}=={version}: {source}", "options": table_entry(reply["options"], with_defaults=True)}
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
            lines += [f"        {json.dumps(o, sort_keys=True)}{',' if j < len(opts) - 1 else ''}" for j, o in enumerate(opts)]
            lines.append("      ]")
            lines.append("    }" + ("," if r < len(releases) - 1 else ""))
        lines.append("  }" + ("," if kind == "sglang" else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdkit.parsertable", description=__doc__.split("\n\n")[0])
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
            print(f"{TABLE_PATH} is stale: run `python -m pdkit.parsertable --write`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
