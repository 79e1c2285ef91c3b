"""Contract checks: pdkit's generated command lines against the real parsers.

SGLang and the router change their flags between releases, and a wrong flag only shows
when a GPU node fails to start. These helpers hand argvs to the parsers of the pinned
releases themselves, each installed in its own virtualenv by `bash .ci/contract-env.sh`
(sglang's import needs torch and does not coexist with pdkit's dependencies; `smg` and
`sglang-router` both install an `smg` command). One subprocess per call: batch argvs.

    >>> check_sglang_argvs("0.5.23", [["--model-path", "/m", "--tp-size", "2"]])
    [None]

Standard library only; the checker scripts next to this file run under the contract
virtualenvs' Pythons and import nothing from pdkit. The generators of the tables the kit reads
live here too and run under pdkit's own Python on the control machine: `catalogue_gen`
(pdkit/upstream/data/metric_catalogue.json, read by pdkit.upstream.catalogue) and `parsertable_gen`
(pdkit/upstream/parser_table.json, read by pdkit.upstream.parsertable).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from pdkit.upstream.venvs import ROUTER_PACKAGES, env_python

_HERE = Path(__file__).resolve().parent
_SGLANG_CHECKER = _HERE / "sglang_argcheck.py"
_ROUTER_CHECKER = _HERE / "router_argcheck.py"


class ContractCheckError(RuntimeError):
    """The checker itself failed (import error, crash, garbled reply): not a verdict."""


def _run_checker(env_name: str, script: Path, request: dict, timeout: float) -> dict:
    python = env_python(env_name)
    env = dict(os.environ)
    # PYTHONDONTWRITEBYTECODE goes too: the envs are installed without .pyc files and
    # the first run writes them, which keeps later imports fast.
    for var in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"):
        env.pop(var, None)
    env.update(
        PYTHONNOUSERSITE="1",
        HF_HUB_OFFLINE="1",  # nothing here needs a hub; never reach for one
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    try:
        proc = subprocess.run(
            [str(python), str(script)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(_HERE),
        )
    except subprocess.TimeoutExpired as exc:
        raise ContractCheckError(f"{script.name} under {env_name} ran past {timeout:.0f} s") from exc

    stderr_tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
    try:
        reply = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ContractCheckError(
            f"{script.name} under {env_name} exited {proc.returncode} without a JSON reply; "
            f"stdout={proc.stdout[-500:]!r}; stderr tail:\n{stderr_tail}"
        ) from None
    if reply.get("fatal"):
        raise ContractCheckError(f"{script.name} under {env_name} could not start:\n{reply['fatal']}")
    if proc.returncode != 0:
        raise ContractCheckError(f"{script.name} under {env_name} exited {proc.returncode}; "
                                 f"stderr tail:\n{stderr_tail}")
    results = reply.get("results")
    if not isinstance(results, list) or len(results) != len(request["argvs"]):
        raise ContractCheckError(f"{script.name} under {env_name} answered {len(results or [])} results "
                                 f"for {len(request['argvs'])} argvs")
    return reply


def _normalise(argvs: list[list[str]]) -> list[list[str]]:
    out = []
    for argv in argvs:
        if isinstance(argv, (str, bytes)) or not all(isinstance(a, str) for a in argv):
            raise TypeError(f"each argv must be a list of str, got {argv!r}")
        out.append(list(argv))
    return out


def run_sglang_check(version: str, argvs: list[list[str]], *, describe: bool = False, timeout: float = 300,
                     environment_prefixes: tuple[str, ...] = ()) -> dict:
    """The full reply of sglang_argcheck.py under sglang `version`.

    reply["results"][i] = {"ok": bool, "error": str | None, "warnings": [str, ...]}
    (warnings: what SGLang logged while parsing, e.g. deprecated spellings);
    reply["options"] with describe=True: every option of the parser (flags, choices,
    default, nargs, help, the replacement a deprecated flag names), and reply["environment"]: the
    type and default of every `sglang.srt.environ.Envs` variable named with one of
    ENVIRONMENT_PREFIXES.
    """
    env_name = f"sglang-{version}"
    request = {"argvs": _normalise(argvs), "describe": describe, "environment_prefixes": list(environment_prefixes)}
    reply = _run_checker(env_name, _SGLANG_CHECKER, request, timeout)
    if reply.get("version") != version:
        raise ContractCheckError(f"{env_name} holds sglang {reply.get('version')!r}, not {version}")
    return reply


def check_sglang_argvs(version: str, argvs: list[list[str]]) -> list[str | None]:
    """For each argv (the flags after `python -m sglang.launch_server`): None when the
    parser of sglang `version` accepts it, else the error SGLang's argparse printed,
    e.g. "argument --disaggregation-transfer-backend: invalid choice: 'nixel' (...)".

    Parsing is SGLang's own: the parser `prepare_server_args` builds
    (`ServerArgs.add_cli_args` + `parse_args`), then `ServerArgs.from_cli_args` without
    the GPU/model resolution, then the `--speculative-algorithm` name through
    `SpeculativeAlgorithm.from_string`. Raises ContractEnvMissing when that version's
    virtualenv is not built, ContractCheckError when the checker itself fails.
    """
    reply = run_sglang_check(version, argvs)
    return [None if r["ok"] else (r["error"] or "rejected") for r in reply["results"]]


def run_router_check(
    package: str, version: str, argvs: list[list[str]], *, describe: bool = False, timeout: float = 120
) -> dict:
    """The full reply of router_argcheck.py for `package` ("smg" | "sglang-router") at `version`."""
    if package not in ROUTER_PACKAGES:
        raise ValueError(f"package must be one of {ROUTER_PACKAGES}, got {package!r}")
    env_name = f"{package}-{version}"
    reply = _run_checker(
        env_name, _ROUTER_CHECKER, {"package": package, "argvs": _normalise(argvs), "describe": describe}, timeout
    )
    if reply.get("version") != version:
        raise ContractCheckError(f"{env_name} holds {package} {reply.get('version')!r}, not {version}")
    return reply


def check_router_argvs(package: str, version: str, argvs: list[list[str]]) -> list[str | None]:
    """For each argv: None when the router's own command line accepts it, else the error.

    package "smg" (1.x): argv is what follows the `smg` executable, subcommand first:
        ["launch", "--pd-disaggregation", "--prefill", "http://P:30000", "8998",
         "--decode", "http://D:30001", ...]
      It runs through `smg.cli.main` (the `smg` console script) exactly as on a host;
      only `launch` is covered.
    package "sglang-router" (0.3.x): argv is what follows
      `python -m sglang_router.launch_router`.

    Past parsing, the pre-start part of launch_router runs too (RouterArgs conversion,
    `_validate_router_args()`, `Router.from_args`, which builds the Rust router without
    starting it), so a bad bootstrap port or selector fails here as well.
    """
    reply = run_router_check(package, version, argvs)
    return [None if r["ok"] else (r["error"] or "rejected") for r in reply["results"]]
