"""The `pdkit` command line: validate | render | chat | lab | roll | releases | rollback | bench | compare | doctor."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from pdkit.inventory.loader import invalid_report, load_or_report, load_with_problems
from pdkit.inventory.summary import summary
from pdkit.render.plan import plan_cluster

EXIT_INVALID = 2


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0: valid (warnings printed); 2: invalid, every problem listed; anything else is a bug."""
    spec, problems = load_with_problems(args.inventory)
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity == "warning"]
    if args.strict:
        # --strict: a setting that would be ignored fails the check like any error
        errors, warnings = errors + warnings, []
    if errors or spec is None:
        print(invalid_report(args.inventory, errors, warnings), file=sys.stderr)
        return EXIT_INVALID
    print(summary(spec))
    for p in warnings:
        print(f"warning {p}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    out = Path(args.out)
    written = 0
    made: set[Path] = set()  # directories made (or found) already: one mkdir per directory, not per file
    for host, plan in plan_cluster(spec).items():
        for planned in plan.files:
            target = out / host / planned.path.lstrip("/")
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            # write-then-chmod would expose a secret for a moment: create with the final mode
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(planned.mode, 8))
            with os.fdopen(fd, "w") as fh:
                # the mode again past the umask (an existing file keeps its old mode on open)
                os.fchmod(fh.fileno(), int(planned.mode, 8))
                fh.write(planned.content)
            written += 1
    print(f"rendered {written} files for {len(spec.hosts)} hosts into {out}/<host>/")
    return 0


def sse_data(line: bytes) -> str | None:
    """The payload of one server-sent-events line read as bytes, or None for any other line. The format
    is UTF-8 by definition (WHATWG HTML, 9.2: a bad byte reads U+FFFD), whatever the Content-Type says:
    requests would decode SGLang's `text/event-stream` (no charset) as ISO-8859-1 and yield bytes where
    none is sent."""
    text = line.decode("utf-8", errors="replace")
    return text[len("data: "):] if text.startswith("data: ") else None


def cmd_chat(args: argparse.Namespace) -> int:
    """Send one streaming chat completion through the cluster's router and print it as it arrives."""
    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    # lazy: only after load_or_report: pyinfra's CLI, which it imports, gevent-patches ssl first
    import requests

    if not spec.router_hosts:
        print("the inventory declares no router", file=sys.stderr)
        return EXIT_INVALID
    # lazy: the CLI imports a command's modules only when it runs
    from pdkit.render.paths import router_auth_headers, router_url

    router = spec.router_hosts[0]
    url = router_url(router) + "/v1/chat/completions"
    headers = router_auth_headers(spec)
    body = {"model": spec.cluster.model.name, "messages": [{"role": "user", "content": args.prompt}],
            "max_tokens": args.max_tokens, "stream": True}
    print(f"POST {url} (model {spec.cluster.model.name}, streaming)", file=sys.stderr)
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        with requests.post(url, json=body, headers=headers, stream=True, timeout=args.timeout) as response:
            if response.status_code != 200:
                print(f"router answered {response.status_code}: {response.text.strip()[:500]}", file=sys.stderr)
                return 1
            for line in response.iter_lines():
                data = sse_data(line)
                if data is None or data == "[DONE]":
                    continue
                delta = json.loads(data)["choices"][0].get("delta", {}).get("content")
                if delta:
                    first = first or time.perf_counter()
                    tokens += 1
                    print(delta, end="", flush=True)
    except requests.RequestException as exc:
        print(f"\nno answer from the router at {url}: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    ttft = f"{(first - start) * 1000:.0f} ms" if first else "n/a"
    print(f"\n-- {tokens} chunks in {elapsed:.2f} s, first after {ttft} (through {router.name}'s router)",
          file=sys.stderr)
    return 0 if tokens else 1


# Subcommands that live in their own modules: each module has add_parser(subparsers).
COMMAND_MODULES = ("pdkit.lab.cli", "pdkit.roll", "pdkit.bench.cli", "pdkit.doctor", "pdkit.tune.runner",
                   "pdkit.weights.stage")


def _register(sub: argparse._SubParsersAction, module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # a command whose module has not landed yet is simply absent; any other import error is a bug
        if exc.name != module_name:
            raise
        return
    module.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdkit",
                                     description="SGLang PD serving from one validated spec, laid down by pyinfra.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check an inventory without contacting any host")
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventories/cluster.py")
    p.add_argument("--strict", action="store_true",
                   help="treat warnings (settings that would be ignored, unknown host keys) as errors")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="write every file pdkit would put on each host")
    p.add_argument("inventory")
    p.add_argument("--out", required=True, help="directory; files land in OUT/<host>/<absolute path>")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("chat", help="send one streaming chat completion through the router")
    p.add_argument("inventory")
    p.add_argument("--prompt", default="Say hello from the prefill/decode cluster.")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=120)
    p.set_defaults(func=cmd_chat)

    for module_name in COMMAND_MODULES:
        _register(sub, module_name)
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
