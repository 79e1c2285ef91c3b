"""`pdkit lab up [--hosts N] | status | down` (hooked into pdkit.cli by add_parser)."""

from __future__ import annotations

import argparse
import signal
import sys

from pdkit.lab import lifecycle
from pdkit.lab.model import DEFAULT_GPU_HOSTS, LabError
from pdkit.lab.system import require_root

EXIT_DOWN = 3  # `lab status` when no lab is up (like `systemctl status` of an inactive unit)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    lab = subparsers.add_parser(
        "lab",
        help="local systemd-nspawn test hosts (root)",
        description=(
            "Local test hosts: N 'GPU node' hosts (no GPUs) and one monitoring host, each a "
            "systemd-nspawn Debian bookworm container with systemd as PID 1, reached over SSH "
            "with strict host-key checking. State: $PDKIT_LAB_DIR (default /var/lib/pdkit-lab)."
        ),
    )
    sub = lab.add_subparsers(dest="lab_command", required=True)

    p_up = sub.add_parser("up", help="bring the lab up (reports the running lab if it is up)")
    p_up.add_argument("--hosts", type=int, default=DEFAULT_GPU_HOSTS, metavar="N", help="GPU hosts (default 3)")
    p_up.add_argument("--rebuild-rootfs", action="store_true", help="debootstrap the cached rootfs again")
    p_up.set_defaults(func=cmd_up)

    p_status = sub.add_parser("status", help="each host, its address, systemd state, SSH")
    p_status.set_defaults(func=cmd_status)

    p_down = sub.add_parser("down", help="stop and remove everything the lab created")
    p_down.set_defaults(func=cmd_down)
    return lab


def _fail(exc: LabError) -> int:
    print(f"pdkit lab: {exc}", file=sys.stderr)
    return getattr(exc, "exit_code", 1)


class _Terminated(BaseException):
    pass


def _on_sigterm(signum, frame):  # a killed `lab up` cleans up like a failed one
    raise _Terminated()


def cmd_up(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        lifecycle.up(args.hosts, rebuild_rootfs=args.rebuild_rootfs)
        print(lifecycle.format_status(lifecycle.status()))
    except LabError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        print("pdkit lab: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("pdkit lab: terminated", file=sys.stderr)
        return 143
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        require_root()
        st = lifecycle.status()
    except LabError as exc:
        return _fail(exc)
    print(lifecycle.format_status(st))
    return {"up": 0, "degraded": 1, "down": EXIT_DOWN}[st.state]


def cmd_down(args: argparse.Namespace) -> int:
    try:
        left = lifecycle.down()
    except LabError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        print("pdkit lab: interrupted", file=sys.stderr)
        return 130
    return 1 if left else 0
