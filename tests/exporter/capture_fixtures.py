"""Regenerate the captured fixtures in tests/exporter/data/ from a real sim PD stack.

    .venv/bin/python tests/exporter/capture_fixtures.py

Starts a sim prefill + sim decode + smg on loopback (pdkit.sim.localstack) with SGLang flags of
the kind pdkit renders, sends a few requests through the router, and writes each engine's
/metrics text, /server_info JSON, its planned argv (the flags after `-m pdkit.sim`) and the
per-batch lines of its log. Not a test: the tests read what it wrote.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import sys
import tempfile
from pathlib import Path

import requests

from pdkit.sim.localstack import MODEL, LocalPDStack

DATA = Path(__file__).resolve().parent / "data"
EXTRA = ["--tp-size", "2", "--base-gpu-id", "0", "--gpu-id-step", "1", "--cuda-graph-max-bs-decode", "4",
         "--mem-fraction-static", "0.85", "--page-size", "16", "--decode-log-interval", "5",
         "--numa-node", "0", "0", "1", "1", "--disable-custom-all-reduce", "--log-level", "info"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, \
            LocalPDStack(Path(tmp), sim_env={"PDKIT_SIM_STARTUP_DELAY_S": "0.2"}, sim_extra=EXTRA) as stack:
        def one(i: int) -> int:
            body = {"model": MODEL, "prompt": "hello world " * (10 + i), "max_tokens": 40}
            return requests.post(f"{stack.router_url}/v1/completions", json=body, timeout=30).status_code

        with cf.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(one, range(16)))
        if set(statuses) != {200}:
            print(f"requests failed: {statuses}", file=sys.stderr)
            return 1
        for proc, port in ((stack.prefill, stack.prefill_port), (stack.decode, stack.decode_port)):
            name = proc.name
            (DATA / f"sim_{name}_metrics.txt").write_text(requests.get(f"http://127.0.0.1:{port}/metrics").text)
            info = requests.get(f"http://127.0.0.1:{port}/server_info").json()
            (DATA / f"sim_{name}_server_info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
            argv = proc.argv[proc.argv.index("-m") + 2:]
            (DATA / f"sim_{name}_argv.json").write_text(json.dumps(argv, indent=1) + "\n")
            lines = [ln for ln in proc.log_path.read_text().splitlines() if " batch" in ln]
            (DATA / f"sim_{name}_batch.log").write_text("\n".join(lines[-12:]) + "\n")
    print(f"wrote fixtures to {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
