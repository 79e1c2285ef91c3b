"""Issue 32, second pass, class 2: every address another host connects to follows the README's
rule (no loopback, wildcard or @local there), from one table (pdkit.spec.CROSS_HOST_SERVICES)."""

from __future__ import annotations

import glob
from urllib.parse import urlsplit

import pytest

from pdkit.inventory.loader import load_with_problems
from pdkit.monitoring.common import alertmanager_urls, monitoring_host
from pdkit.monitoring.scrape import targets
from pdkit.render import flags
from pdkit.spec.addresses import cross_host_connections, local_only
from tests.conftest import write_inventory
from tests.test_validate import _span, assert_validate_refuses


def _router_host_on_ipv6_loopback(c, h):
    # rt01: a router host of its own in front of gpu01's engines, listening on ::1
    h["gpu01"].pop("pdkit_router")
    h["rt01"] = {"ssh_hostname": "10.9.0.5", "pdkit_router": {"workers": ["gpu01/prefill", "gpu01/decode"], "address": "::1"}}


ADDRESS_CASES = [
    # the issue: the router's own address on loopback, scraped by Prometheus on mon01
    ("router-metrics-on-loopback", lambda c, h: h["gpu01"]["pdkit_router"].update(address="127.0.0.1"),
     "gpu01", "pdkit_router.address", "Prometheus on mon01 scrapes it there"),
    ("router-metrics-on-the-wildcard", lambda c, h: h["gpu01"]["pdkit_router"].update(address="0.0.0.0"),
     "gpu01", "pdkit_router.address", "its LAN IP or DNS name"),
    # engines whose router is on their own host: still scraped (engine /metrics, pdkit-exporter)
    ("engine-metrics-on-loopback", lambda c, h: h["gpu01"]["pdkit_node"].update(address="127.0.0.1"),
     "gpu01", "pdkit_node.address", "Prometheus on mon01 scrapes it there"),
    ("engine-metrics-on-localhost", lambda c, h: h["gpu02"]["pdkit_node"].update(address="localhost"),
     "gpu02", "pdkit_node.address", "is loopback"),
    ("router-of-its-own-host-on-ipv6-loopback", _router_host_on_ipv6_loopback,
     "rt01", "pdkit_router.address", "::1 is loopback, but Prometheus on mon01 scrapes it there"),
]


@pytest.mark.parametrize("case", ADDRESS_CASES, ids=[c[0] for c in ADDRESS_CASES])
def test_an_address_another_host_connects_to_is_refused(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


def test_loopback_router_with_prometheus_beside_it_is_accepted(base, tmp_path):
    """The rule is for other hosts: Prometheus on the router's own host may reach it on loopback."""
    cluster, hosts = base
    hosts["gpu01"]["pdkit_router"]["address"] = "127.0.0.1"
    hosts["gpu01"]["pdkit_monitoring"] = hosts.pop("mon01")["pdkit_monitoring"]
    hosts["gpu01"]["pdkit_monitoring"]["scrape_hosts"] = ["gpu01"]
    spec, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    assert spec is not None, [str(p) for p in problems]
    assert not [p for p in problems if p.severity == "error"]


def _rendered_cross_host(spec):
    """(host, address) of each address one host's rendered files make another host connect to."""
    used = set()
    mon = monitoring_host(spec) if spec.monitoring_hosts else None
    if mon is not None:
        for t in targets(spec):
            if t.host != mon.name:
                used.add((t.host, t.address.rsplit(":", 1)[0].strip("[]"), f"prometheus.yml job {t.job}"))
        for am, url in zip(spec.monitoring_hosts, alertmanager_urls(spec)):
            if am.name != mon.name:
                used.add((am.name, urlsplit(url).hostname, "prometheus.yml alerting"))
    for router_host in spec.router_hosts:
        for host, engine in spec.router_workers(router_host):
            if host.name != router_host.name:
                used.add((host.name, urlsplit(flags.engine_url(spec, host, engine)).hostname, "router worker URL"))
    for host, engine in spec.engines():
        if engine.spans_nodes:
            used.add((host.name, flags.dist_init_addr(spec, host, engine).rsplit(":", 1)[0].strip("[]"), "--dist-init-addr"))
    return used


def _spec(inventory):
    spec, problems = load_with_problems(inventory)
    assert spec is not None, [str(p) for p in problems]
    return spec


INVENTORIES = sorted(glob.glob("inventories/*.py"))


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_every_rendered_cross_host_address_is_in_the_table(inventory):
    """A rendered file that makes one host connect to another uses an address that
    CROSS_HOST_SERVICES lists, so the rule checks it: a new service cannot be forgotten."""
    spec, problems = load_with_problems(inventory)
    if spec is None:
        pytest.skip(f"{inventory} does not load here: {problems[:1]}")
    checked = {(h.name, address) for h, address, _field, _client, _why in cross_host_connections(spec)}
    for host, address, what in _rendered_cross_host(spec):
        assert (host, address) in checked, f"{inventory}: {what} reaches {host} at {address}, which no CROSS_HOST_SERVICES entry checks"


def test_the_test_cluster_is_covered(base, tmp_path):
    """The coverage also holds for the test cluster with an engine spanning nodes and a router
    host of its own; and every address the table checks there passes the rule."""
    cluster, hosts = base
    _span(hosts)
    hosts["gpu01"].pop("pdkit_router")
    hosts["rt01"] = {"ssh_hostname": "10.9.0.5", "pdkit_router": {}}
    spec = _spec(write_inventory(tmp_path, hosts, cluster))
    checked = {(h.name, address) for h, address, _f, _c, _w in cross_host_connections(spec)}
    rendered = _rendered_cross_host(spec)
    assert {w for *_, w in rendered} >= {"prometheus.yml job router", "prometheus.yml job sglang", "router worker URL", "--dist-init-addr"}
    assert all((h, a) in checked for h, a, _ in rendered)
    # every address the table checks is refused on loopback: the rule walks every entry
    for h, address, field, client, why in cross_host_connections(spec):
        assert local_only(address) is None and field in ("ssh_hostname", "pdkit_node.address", "pdkit_router.address")


def test_the_issue_router_on_loopback_is_what_prometheus_yml_points_at(base, tmp_path):
    """The issue's case: before the table, pdkit_router.address 127.0.0.1 was accepted and
    prometheus.yml's router target (flags.router_address) pointed mon01 at itself. Now an error
    that names the field; test_the_test_cluster_is_covered checks the router job's address is
    one the table covers."""
    cluster, hosts = base
    hosts["gpu01"]["pdkit_router"]["address"] = "127.0.0.1"
    spec, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    assert any(p.host == "gpu01" and p.field == "pdkit_router.address" and p.severity == "error" for p in problems)
