"""The pinned SGLang and router command lines as their own parsers define them, as data.

`pdkit/upstream/parser_table.json` lists, for every pinned SGLang release and router package, each
option of its argparse parser (option strings, dest, how many values it takes, its
choices) and the speculative algorithm names SGLang's `SpeculativeAlgorithm.from_string`
accepts. It is generated from the real wheels in the contract virtualenvs
(`bash .ci/contract-env.sh`), so `pdkit validate` checks choices, aliases and prefixes
exactly as SGLang and the router will, without importing either. This module reads it (the
sim imports it, so it keeps to the node's rules); `python -m pdkit.contract.parsertable_gen`
writes it, and tests/test_parser_table.py regenerates it in CI and fails on any difference.

The argv reading below follows CPython 3.11's argparse (`_parse_optional`,
`_get_option_tuples`, `_match_argument`): exact option strings first, then `--flag=value`,
then unambiguous prefixes of long options (SGLang's parser keeps `allow_abbrev`).
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdkit.upstream.tables import read_table

TABLE_PATH = Path(__file__).with_name("parser_table.json")
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Option:
    """One argparse option of a pinned parser."""

    flags: tuple[str, ...]
    dest: str
    # how many values follow the flag: 0, 1, "?", "*" or "+" (argparse nargs)
    takes: int | str
    choices: tuple[str, ...] | None
    # its value is a credential (decided by the generator, pdkit.contract.parsertable_gen)
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

    def __init__(self, label: str, options: list[dict[str, Any]]):
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
                    problems.append(ArgvProblem(i, f"{token!r} is a value without a flag before it that takes one "
                                                   "(argparse: unrecognized arguments)"))
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
                    problems.append(ArgvProblem(start, f"{option.name} takes no value (got {token!r}); "
                                                       f"write {option.name} alone"))
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
                    problems.append(ArgvProblem(start, f"{option.name} expects {wanted} value(s) after it, "
                                                       f"got {len(values)}"))
                    continue
            if option.choices is not None:
                bad = [v for v in values if v not in option.choices]
                if bad:
                    problems.append(ArgvProblem(start, f"{bad[0]!r} is not a valid {option.name} in {self.label}; "
                                                       f"valid: {', '.join(option.choices)}"))
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


def extra_arg(extra_args: Sequence[str], flag: str) -> str | None:
    """The value EXTRA_ARGS give FLAG written whole ('--flag v' or '--flag=v'; the last wins, as in argparse),
    None when they give it none. An abbreviation of FLAG is not read here (Parser reads those)."""
    value = None
    for i, arg in enumerate(extra_args):
        if arg == flag and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _one_string_message(token: str) -> str:
    return (f"{token!r} is one argv entry holding several words; argparse sees it as a single unknown argument: "
            f"give one entry per word, e.g. {shlex_split(token)!r}")


def table() -> dict[str, Any]:
    return read_table(TABLE_PATH)


@functools.cache
def sglang_parser(version: str) -> Parser:
    return Parser(f"SGLang {version}", table()["sglang"][version]["options"])


@functools.cache
def router_parser(package: str, version: str) -> Parser:
    return Parser(f"{package} {version}", table()["router"][f"{package} {version}"]["options"])


def sglang_environment(version: str) -> dict[str, dict[str, Any]]:
    """{variable: {"type": "EnvInt", "default": 300}} of SGLang VERSION (the generator's ENVIRONMENT_PREFIXES only)."""
    environment: dict[str, dict[str, Any]] = table()["sglang"][version]["environment"]
    return environment


def router_default(package: str, version: str, flag: str) -> Any:
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
