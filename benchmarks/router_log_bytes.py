"""What one request costs in router log bytes, per pinned router and log level (issue 42 item 2).

    /work/main/.venv/bin/python benchmarks/router_log_bytes.py [--requests 200]

Starts a sim prefill and a sim decode on loopback (pdkit.sim.localstack), then each pinned router
(smg 1.13.0, sglang-router 0.3.2, from the contract virtualenvs under ~/.cache/pdkit/contract) in
PD mode in front of them at each log level, idles it, sends REQUESTS completions, and prints the
bytes and lines its stdout+stderr gained per request beyond the idle rate. A second router of
each kind fronts a prefill and a decode that do not exist: every request there is a fast 503, as
during a downtime roll (issue 42: 2,394 and 5,296 of them). The figures are in docs/rolling.md,
"Evidence that survives"; pdkit/agent/journald.py sizes the journal from them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pdkit.sim.localstack import MODEL, LocalPDStack, LocalProcess, free_ports  # noqa: E402

CONTRACT = Path.home() / ".cache/pdkit/contract"
ROUTERS = {
    "smg 1.13.0": [str(CONTRACT / "smg-1.13.0/bin/smg"), "launch"],
    "sglang-router 0.3.2": [str(CONTRACT / "sglang-router-0.3.2/bin/python"), "-m", "sglang_router.launch_router"],
}
LEVELS = ("info", "warn")
IDLE_S = 6.0


def router_argv(launcher: list[str], prefill: int, bootstrap: int, decode: int, port: int, metrics: int,
                level: str) -> list[str]:
    # the kit's PD flags (pdkit.render.flags.router_args) with its check intervals, on loopback
    return [*launcher, "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{prefill}", str(bootstrap),
            "--decode", f"http://127.0.0.1:{decode}", "--prefill-policy", "cache_aware",
            "--decode-policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
            "--health-check-interval-secs", "5", "--health-failure-threshold", "2",
            "--health-success-threshold", "1", "--worker-startup-check-interval", "5",
            "--shutdown-grace-period-secs", "1", "--log-level", level]


def measure(name: str, argv: list[str], log: Path, url: str, n: int, want_ok: bool) -> dict:
    proc = LocalProcess(name, argv, log, {}).start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/health", timeout=1).status_code in (200, 503):
                    break
            except requests.RequestException:
                time.sleep(0.2)
        if want_ok:
            while time.monotonic() < deadline:
                try:
                    r = requests.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 8},
                                      timeout=10)
                    if r.status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.5)
        time.sleep(1.0)
        size0, lines0 = log.stat().st_size, log.read_bytes().count(b"\n")
        time.sleep(IDLE_S)
        size1, lines1 = log.stat().st_size, log.read_bytes().count(b"\n")
        idle_bps = (size1 - size0) / IDLE_S
        t0 = time.monotonic()
        codes: dict[int, int] = {}
        for i in range(n):
            body = {"model": MODEL, "prompt": f"request {i}", "max_tokens": 8, "stream": i % 2 == 1}
            r = requests.post(f"{url}/v1/completions", json=body, timeout=30)
            r.content  # noqa: B018 - read the whole (streamed) body
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
        took = time.monotonic() - t0
        time.sleep(0.5)
        size2, lines2 = log.stat().st_size, log.read_bytes().count(b"\n")
        idle = idle_bps * (took + 0.5)
        return {"codes": codes, "bytes_per_request": (size2 - size1 - idle) / n,
                "lines_per_request": (lines2 - lines1 - (lines1 - lines0) / IDLE_S * (took + 0.5)) / n,
                "idle_bytes_per_s": idle_bps}
    finally:
        proc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("/tmp/router-log-bytes"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with LocalPDStack(args.out / "stack") as stack:
        for router, launcher in ROUTERS.items():
            for level in LEVELS:
                for served in (True, False):
                    port, metrics, dead_p, dead_b, dead_d = free_ports(5)
                    if served:
                        ports = (stack.prefill_port, stack.bootstrap_port, stack.decode_port)
                    else:
                        ports = (dead_p, dead_b, dead_d)
                    tag = f"{router.replace(' ', '-')}-{level}-{'served' if served else '503'}"
                    result = measure(tag, router_argv(launcher, *ports, port, metrics, level), args.out / f"{tag}.log",
                                     f"http://127.0.0.1:{port}", args.requests, served)
                    print(f"{router:20} --log-level {level:5} {'served' if served else 'no workers':10} "
                          f"codes {result['codes']}: {result['bytes_per_request']:7.1f} B/request, "
                          f"{result['lines_per_request']:.2f} lines/request; idle {result['idle_bytes_per_s']:.1f} B/s",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
