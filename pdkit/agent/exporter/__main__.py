"""`python -m pdkit.exporter --config /etc/pdkit/exporter.json` (see pdkit.agent.exporter)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, start_http_server

from pdkit.agent.exporter.collector import PdkitCollector
from pdkit.agent.exporter.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdkit.exporter",
                                     description="Per-node Prometheus exporter for pdkit's SGLang engines.")
    parser.add_argument("--config", required=True, help="exporter.json rendered by the plan")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="validate the config and exit")
    mode.add_argument("--once", action="store_true", help="scrape once, print the exposition, exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("pdkit.exporter")

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"pdkit-exporter: invalid config: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok ({len(config.engines)} engines on {config.node})")
        return 0

    collector = PdkitCollector(config)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if args.once:
        if collector.gpu_probe is not None:
            collector.gpu_probe.wait()  # one look: with the GPU health probe's answer, however long it takes
        sys.stdout.write(generate_latest(registry).decode())
        collector.close()
        return 0
    # the exporter's own CPU and memory, as process_* series
    ProcessCollector(registry=registry)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server, _thread = start_http_server(config.listen_port, addr=config.listen_address, registry=registry)
    except OSError as exc:
        print(f"pdkit-exporter: cannot listen on {config.listen_address}:{config.listen_port}: {exc}", file=sys.stderr)
        return 1
    log.info("pdkit-exporter for node %s: %d engine(s), listening on %s:%d", config.node, len(config.engines),
             config.listen_address, config.listen_port)
    stop.wait()
    server.shutdown()
    collector.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
