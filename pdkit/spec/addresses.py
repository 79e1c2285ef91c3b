"""Addresses and ports: what each host listens on (host_ports), the services other hosts connect
to (CROSS_HOST_SERVICES), and the address rules (check_addresses)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from pdkit.spec.cluster import ClusterSpec, HostSpec, Problem
from pdkit.spec.facts import dcgm_enabled, pairing_sets
from pdkit.spec.spanning import dist_init_ports

__all__ = [
    "CROSS_HOST_SERVICES", "DCGM_EXPORTER_PORT", "NODE_EXPORTER_PORT", "SERVICE_ADDRESS", "address_problem",
    "check_addresses", "cross_host_connections", "CrossHostService", "host_ports", "local_only",
]

# Every host runs node_exporter on this port.
NODE_EXPORTER_PORT = 9100
# DCGM exporter's own default (9400) is pdkit-exporter's: DCGM moves one up.
DCGM_EXPORTER_PORT = 9401


def host_ports(spec: ClusterSpec, host: HostSpec) -> list[tuple[int, str]]:
    """Every port a host's services listen on, with the field that sets it."""
    ports: list[tuple[int, str]] = [(NODE_EXPORTER_PORT, "node_exporter (fixed)")]
    if host.node is not None:
        ports.append((host.node.exporter_port, "pdkit_node.exporter_port"))
        if dcgm_enabled(host):
            ports.append((DCGM_EXPORTER_PORT, "pdkit_node.dcgm_exporter (port 9401)"))
        for i, engine in enumerate(host.node.engines):
            ports.append((engine.port, f"pdkit_node.engines[{i}].port"))
            if engine.effective_bootstrap_port is not None:
                ports.append((engine.effective_bootstrap_port, f"pdkit_node.engines[{i}].bootstrap_port"))
            # dist_init_ports: the dist-init port, then the ones SGLang derives from it at +1, +2, ...
            for offset, port in enumerate(dist_init_ports(engine)):
                ports.append((port, f"pdkit_node.engines[{i}].dist_init_port"
                              + ("" if offset == 0 else f" (+{offset}: SGLang's attention-DP ports)")))
    if host.router is not None:
        ports.append((host.router.port, "pdkit_router.port"))
        ports.append((host.router.prometheus_port, "pdkit_router.prometheus_port"))
    if host.monitoring is not None:
        ports.append((host.monitoring.prometheus_port, "pdkit_monitoring.prometheus_port"))
        ports.append((host.monitoring.alertmanager_port, "pdkit_monitoring.alertmanager_port"))
        if host.monitoring.grafana:  # off: nothing listens there, so it cannot clash
            ports.append((host.monitoring.grafana_port, "pdkit_monitoring.grafana_port"))
    return ports


_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def address_problem(address: str) -> str | None:
    """Why `address` is neither an IP address nor a DNS host name (RFC 1123), or None."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    labels = address.rstrip(".").split(".")
    if len(address) <= 253 and all(_HOSTNAME_LABEL.match(label) for label in labels) and not labels[-1].isdigit():
        return None
    return f"{address!r} is neither an IP address nor a host name: give e.g. 10.0.0.12 or gpu01.example.net"


def ipv6_problem(address: str) -> str | None:
    """Why an IPv6 literal cannot be a service address here (else None): pdkit writes service addresses
    into URLs and host:port pairs unbracketed (router workers http://ADDR:PORT, Prometheus targets
    ADDR:PORT, SGLang's --dist-init-addr ADDR:PORT), forms the router and Prometheus refuse for
    fd00::1. A DNS name that resolves to it is left to the resolver."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.version != 6 or ip.is_unspecified or ip.is_loopback:
        return None  # the wildcard and loopback have their own, clearer error
    return (f"{address} is an IPv6 address, which pdkit does not render into the router's worker URLs, "
            f"Prometheus targets and SGLang's host:port flags (they would read http://{address}:30000 wrongly): "
            "give the host's IPv4 address or a DNS name")


def local_only(address: str) -> str | None:
    """What `address` is when no other host can reach a service on it (else None): the
    wildcard 0.0.0.0 / ::, loopback, or a pyinfra connector name such as @local."""
    if address.startswith("@"):
        return f"the pyinfra connector {address}"
    if address.lower() in ("localhost", "localhost.localdomain"):
        return "loopback"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_unspecified:
        return "the wildcard address"
    if ip.is_loopback:
        return "loopback"
    return None


def _address_field(host: HostSpec, kind: str) -> str:
    """The field that sets the address a service of `host` is reached on."""
    if kind == "engine" and host.node is not None and host.node.address is not None:
        return "pdkit_node.address"
    if kind == "router" and host.router is not None and host.router.address is not None:
        return "pdkit_router.address"
    return "ssh_hostname"


def _router_address(host: HostSpec) -> str:
    """pdkit.render.flags.router_address without importing flags (flags imports pdkit.spec)."""
    assert host.router is not None
    return host.router.address or host.address


# Which address a service listens on: an engine's (pdkit_node.address, else ssh_hostname), the
# router's (pdkit_router.address, else ssh_hostname) or the host's own (ssh_hostname).
SERVICE_ADDRESS: dict[str, Callable[[ClusterSpec, HostSpec], str]] = {
    "engine": lambda spec, host: spec.engine_address(host),
    "router": lambda spec, host: _router_address(host),
    "host": lambda spec, host: host.address,
}


# a service's clients: (the service's host, a client host's name, why) for each connection
Clients = Iterator[tuple[HostSpec, str, str]]


def _router_clients(spec: ClusterSpec) -> Clients:
    for router_host in spec.router_hosts:
        for h in {h.name: h for h, _ in spec.router_workers(router_host)}.values():
            yield h, router_host.name, f"the router on {router_host.name} connects to this node's engines"


def _pd_peer_clients(spec: ClusterSpec) -> Clients:
    for label, members in pairing_sets(spec):
        hosts = {h.name: h for h, e in members}
        if len(hosts) < 2:
            continue  # no other host reaches these engines
        # the first 3 other hosts by name, from one sort of the set (not one per host: 512 nodes)
        first = sorted(hosts)[:4]
        for h in hosts.values():
            others = [n for n in first if n != h.name][:3]
            yield h, others[0], (f"{label} pairs its PD engines with engines on {', '.join(others)}, which reach it "
                                 "for the KV transfer (bootstrap port, NIXL/Mooncake)")


def _dist_init_clients(spec: ClusterSpec) -> Clients:
    for host, engine in spec.engines():
        nodes = list(engine.nodes or ())
        if len(set(nodes)) >= 2 and nodes[0] == host.name:
            yield host, nodes[1], (f"the other ranks of {engine.name} ({', '.join(nodes[1:])}) connect to rank 0 "
                                   "there (--dist-init-addr)")


def _scrape_clients(has_service: Callable[[HostSpec], bool]) -> Callable[[ClusterSpec], Clients]:
    """Prometheus on each monitoring host scrapes the service on every scraped host that has it."""
    def clients(spec: ClusterSpec) -> Clients:
        by_name = {x.name: x for x in spec.hosts}
        for mon in spec.monitoring_hosts:
            assert mon.monitoring is not None
            for name in mon.monitoring.scrape_hosts or tuple(by_name):
                h = by_name.get(name)
                if h is not None and has_service(h):
                    yield h, mon.name, f"Prometheus on {mon.name} scrapes it there"
    return clients


def _alertmanager_clients(spec: ClusterSpec) -> Clients:
    for am in spec.monitoring_hosts:
        for mon in spec.monitoring_hosts:
            yield am, mon.name, f"Prometheus on {mon.name} sends its alerts to this host's Alertmanager"


@dataclass(frozen=True)
class CrossHostService:
    """One service of a host that another host connects to: the rule (README, "Errors") refuses
    loopback, the wildcard and pyinfra connectors (@local) as its address when a client is
    another host."""

    service: str
    # which address it listens on: a key of SERVICE_ADDRESS
    address: Literal["engine", "router", "host"]
    # who connects: (the service's host, a client host's name, why) for each connection
    clients: Callable[[ClusterSpec], Clients]


# Every address one host of the cluster uses to reach another. A new service another host
# connects to belongs here; tests/test_validate_addresses.py fails when a rendered cross-host
# target (prometheus.yml, the router's workers, --dist-init-addr, Alertmanager) is not covered.
# Not here: the router's HTTP port (clients are outside the cluster), Prometheus and Grafana
# (only the monitoring host itself reaches them).
CROSS_HOST_SERVICES: tuple[CrossHostService, ...] = (
    CrossHostService("engine HTTP (router worker)", "engine", _router_clients),
    CrossHostService("engine bootstrap port and KV transfer", "engine", _pd_peer_clients),
    CrossHostService("dist-init (rank 0 of an engine spanning nodes)", "engine", _dist_init_clients),
    CrossHostService("engine /metrics", "engine", _scrape_clients(lambda h: h.node is not None
                                                                  and bool(h.node.engines))),
    CrossHostService("pdkit-exporter", "engine", _scrape_clients(lambda h: h.node is not None)),
    CrossHostService("DCGM exporter", "engine", _scrape_clients(lambda h: dcgm_enabled(h))),
    CrossHostService("router metrics (prometheus_port)", "router", _scrape_clients(lambda h: h.router is not None)),
    CrossHostService("node_exporter", "host", _scrape_clients(lambda h: True)),
    # one monitoring host today (loader refuses a second), so no other host reaches it yet
    CrossHostService("Alertmanager", "host", _alertmanager_clients),
)


def cross_host_connections(spec: ClusterSpec) -> list[tuple[HostSpec, str, str, str, str]]:
    """(host, address, field, client, why) for each service of CROSS_HOST_SERVICES a host other
    than its own connects to."""
    out = []
    for service in CROSS_HOST_SERVICES:
        for host, client, why in service.clients(spec):
            if client != host.name:
                out.append((host, SERVICE_ADDRESS[service.address](spec, host), _address_field(host, service.address),
                            client, why))
    return out


def check_addresses(spec: ClusterSpec, add: Callable[[Problem], None]) -> None:
    """Valid addresses; no loopback or wildcard where another host must connect; one SSH
    target per host; ports unique per address (two hosts on one address are one machine)."""
    for host in spec.hosts:
        for field, value in (("pdkit_node.address", host.node.address if host.node else None),
                             ("pdkit_router.address", host.router.address if host.router else None)):
            if value is not None and (problem := address_problem(value)):
                add(Problem(host.name, field, problem))

    refused: set[tuple[str, str]] = set()
    for host, address, field, _client, why in cross_host_connections(spec):
        if (v6 := ipv6_problem(address)) and (host.name, field) not in refused:
            refused.add((host.name, field))
            add(Problem(host.name, field, v6))
            continue
        what = local_only(address)
        if what and (host.name, field) not in refused:
            refused.add((host.name, field))
            add(Problem(host.name, field, f"{address} is {what}, but {why}: give an address the other host can reach "
                        "(its LAN IP or DNS name)"))

    targets: dict[tuple[str, int], str] = {}
    for host in spec.hosts:
        if host.address.startswith("@"):
            continue
        target = (host.address, host.ssh_port or 22)
        if target in targets:
            add(Problem(host.name, "ssh_hostname",
                        f"{target[0]} port {target[1]} is already the SSH target of {targets[target]}: pyinfra would "
                        "deploy both hosts onto one machine; give each host its own ssh_hostname (or ssh_port)"))
        else:
            targets[target] = host.name

    on_address: dict[tuple[str, int], tuple[str, str]] = {}
    for host in spec.hosts:
        addresses = {host.address}
        if host.node is not None:
            addresses.add(spec.engine_address(host))
        for port, field in host_ports(spec, host):
            for address in sorted(addresses):
                if local_only(address):
                    continue  # loopback is per machine: the per-host check covers it
                owner = on_address.setdefault((address, port), (host.name, field))
                if owner[0] != host.name:
                    add(Problem(host.name, field, f"port {port} on {address} is already used by {owner[0]}'s "
                                f"{owner[1]} ({host.name} and {owner[0]} share the address {address}); ports must be "
                                "unique per address"))
