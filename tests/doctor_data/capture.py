"""Capture the pages `pdkit doctor` reads from a running lab, for tests/test_doctor.py.

    PDKIT_LAB_DIR=... PDKIT_LAB_SUBNET=... .venv/bin/python tests/doctor_data/capture.py SCENARIO [INVENTORY]

Writes tests/doctor_data/SCENARIO/: per engine of the first GPU host `<engine>.server_info.json`,
`<engine>.metrics1.txt` and `<engine>.metrics2.txt` (before and after a few probe requests through
the router, as doctor samples them), the host's `exporter.txt`, the router's `workers.json` and `router_metrics.txt`, and
`plan.json` (what the spec planned for those engines). Not a test: the tests read what it wrote.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from pdkit.inventory.loader import load  # before requests-using modules: pyinfra gevent-patches on import

# isort: split

from pdkit.agent.health import http_request
from pdkit.doctor.collection import engine_plans, router_urls
from pdkit.doctor.observe import probe

DATA = Path(__file__).resolve().parent


def get(url: str) -> str:
    status, body = http_request(url, timeout=10)
    if status != 200:
        raise SystemExit(f"{url}: {status} {body[:200]}")
    return body


def main(argv: list[str]) -> int:
    scenario = argv[0]
    spec = load(argv[1] if len(argv) > 1 else "inventories/lab.py")
    host = spec.gpu_hosts[0]
    plans = [p for p in engine_plans(spec) if p.host == host.name]
    out = DATA / scenario
    out.mkdir(parents=True, exist_ok=True)
    for p in plans:
        (out / f"{p.engine}.server_info.json").write_text(json.dumps(json.loads(get(f"{p.url}/server_info")), indent=1, sort_keys=True) + "\n")
        (out / f"{p.engine}.metrics1.txt").write_text(get(f"{p.url}/metrics"))
    router_host, router_url, _ = router_urls(spec)[0]
    statuses = probe(router_url, spec.cluster.model.name, 8, 30.0, {})
    time.sleep(3)
    for p in plans:
        (out / f"{p.engine}.metrics2.txt").write_text(get(f"{p.url}/metrics"))
    (out / "exporter.txt").write_text(get(f"http://{spec.engine_address(host)}:{host.node.exporter_port}/metrics"))
    (out / "workers.json").write_text(json.dumps(json.loads(get(f"{router_url}/workers")), indent=1, sort_keys=True) + "\n")
    router = spec.router_hosts[0]
    (out / "router_metrics.txt").write_text(get(f"http://{router.router.address or router.address}:{router.router.prometheus_port}/metrics"))
    (out / "plan.json").write_text(json.dumps([asdict(p) for p in plans], indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} (probe statuses {statuses})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
