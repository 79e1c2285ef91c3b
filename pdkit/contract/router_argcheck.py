"""Check router command lines with the router package's own parser.

Run by the Python of a contract virtualenv (see .ci/contract-env.sh), never by pdkit's:
it imports only the standard library and the router package installed next to it.

    python router_argcheck.py < request.json

Request (stdin, JSON): {"package": "smg" | "sglang-router", "argvs": [[...], ...],
"describe": false}.

What an argv is:
  * smg (1.x): the arguments after the `smg` executable, starting with the subcommand:
    ["launch", "--pd-disaggregation", "--prefill", "http://P:30000", "8998", ...].
    They go through `smg.cli.main(argv)`, the function behind the `smg` console script,
    so the subcommand dispatch (`parse_known_args` on the top-level parser) and
    `smg.launch_router.parse_router_args(rest)` run exactly as on a host. Only `launch`
    is covered: `serve` would start inference workers.
  * sglang-router (0.3.x): the arguments after `python -m sglang_router.launch_router`,
    run through that module's main().

In both, launch_router() is replaced by a stand-in that does what the real one does up
to the point where it would serve: RouterArgs conversion, the discovery/IGW decision
(smg), `_validate_router_args()`, and `Router.from_args(args)`, which builds the Rust
router object from the arguments (no socket is opened, no thread started);
`Router.start()` is never called.

Reply (stdout, one JSON document):
    {"tool": "smg", "version": "1.13.0", "entry": "...",
     "results": [{"ok": true, "error": null, "warnings": [...]}, ...],
     "options": [...]}              # only with "describe": true
or {"fatal": "<traceback>"} with exit status 3 when the package cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from importlib.metadata import version as dist_version

# a sibling file: these scripts run outside pdkit
from argcheck_common import ANSI, describe, one_check, reply_stream, request_argvs, send_reply

_ARGPARSE_ERROR = re.compile(r"^\S+: error: (.*)$", re.MULTILINE)


class _Launched(Exception):
    """Raised by the stand-in launch_router once the arguments got that far."""


def _pre_start(router_args, RouterArgs, Router):
    """The real launch_router() up to Router.start()."""
    if not isinstance(router_args, RouterArgs):
        router_args = RouterArgs.from_cli_args(router_args)
    if getattr(router_args, "mini_lb", False):
        return router_args  # sglang-router's Python debug balancer: nothing more to build
    if Router is None:
        raise RuntimeError("Rust Router is not installed")
    if hasattr(router_args, "selected_discovery_provider"):
        if router_args.selected_discovery_provider() and not router_args.enable_igw:
            router_args.enable_igw = True
    router_args._validate_router_args()
    Router.from_args(router_args)  # builds the Rust-side router; start() is not called
    return router_args


def _run_one(invoke, argv: list[str]) -> dict:
    with one_check() as (result, buf):
        try:
            invoke(argv)
        except _Launched:
            result["ok"] = True
            return result
        except SystemExit as exc:
            text = ANSI.sub("", buf.getvalue())
            found = _ARGPARSE_ERROR.findall(text)
            if found:
                result["error"] = found[-1].strip()
            else:
                lines = [ln for ln in text.strip().splitlines() if ln.strip()]
                tail = f"; it printed: {lines[0].strip()}" if lines else ""
                if exc.code in (0, None):
                    result["error"] = f"exited with status 0 before launching (help or version?){tail}"
                else:
                    result["error"] = f"exited with status {exc.code} before launching{tail}"
            return result
        except Exception as exc:  # noqa: BLE001 - argument conversion or validation raised
            result["error"] = f"{type(exc).__name__}: {exc}"
            return result
        result["error"] = "returned without reaching launch_router()"
        return result


def _smg():
    # lazy: a contract venv holds smg or sglang-router, not both; the missing one becomes the fatal reply
    import smg.cli
    import smg.launch_router as lr
    from smg.router_args import RouterArgs

    def stand_in(args):
        _pre_start(args, RouterArgs, lr.Router)
        raise _Launched

    lr.launch_router = stand_in  # smg.cli.main imports it from the module at call time

    def invoke(argv):
        if argv and argv[0] == "serve":
            raise ValueError("only `smg launch` is checked here: `smg serve` starts inference workers")
        sys.argv = ["smg", *argv]  # the console script's argv[0]: names the prog in messages
        smg.cli.main(list(argv))

    def parser():
        p = argparse.ArgumentParser(prog="smg launch")
        RouterArgs.add_cli_args(p, use_router_prefix=False)
        return p

    return (invoke, parser, "smg",
            "smg.cli:main (console script `smg`), subcommand launch -> smg.launch_router.parse_router_args")


def _sglang_router():
    # lazy: a contract venv holds smg or sglang-router, not both; the missing one becomes the fatal reply
    import sglang_router.launch_router as lr
    from sglang_router.router_args import RouterArgs

    def stand_in(args):
        _pre_start(args, RouterArgs, lr.Router)
        raise _Launched

    lr.launch_router = stand_in  # main() looks the name up in its module

    def invoke(argv):
        sys.argv = [lr.__file__, *argv]  # as under `python -m sglang_router.launch_router`
        lr.main()

    def parser():
        p = argparse.ArgumentParser(prog="launch_router.py")
        RouterArgs.add_cli_args(p, use_router_prefix=False)
        return p

    return invoke, parser, "sglang-router", "python -m sglang_router.launch_router (main -> parse_router_args)"


def main() -> int:
    request = json.load(sys.stdin)
    package = request.get("package")
    argvs = request_argvs(request)
    real_stdout = reply_stream()

    reply: dict = {"tool": package}
    try:
        if package == "smg":
            invoke, make_parser, dist, entry = _smg()
        elif package == "sglang-router":
            invoke, make_parser, dist, entry = _sglang_router()
        else:
            raise ValueError(f"unknown router package {package!r}: expected 'smg' or 'sglang-router'")
        reply["version"] = dist_version(dist)
        reply["entry"] = entry
    except BaseException:  # noqa: BLE001
        reply["fatal"] = traceback.format_exc()
        send_reply(real_stdout, reply)
        return 3

    saved_argv = list(sys.argv)
    try:
        reply["results"] = [_run_one(invoke, list(argv)) for argv in argvs]
    finally:
        sys.argv = saved_argv
    if request.get("describe"):
        reply["options"] = describe(make_parser())
    send_reply(real_stdout, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
