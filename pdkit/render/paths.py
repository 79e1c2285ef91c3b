"""How the control machine reaches the cluster's services: one function per URL and header.

Example:

    url = router_url(host) + "/v1/chat/completions"
    requests.post(url, headers=router_auth_headers(spec), json=body)

Every router URL and the router's auth header are built here, so a change of scheme, address rule
or header is one edit (issue 34 item 2). On-node modules (pdkit.agent.health, the sim) keep to the
stdlib and share only `pdkit.agent.health.bearer_headers`.

The other "where" rules live with what owns them, each written once (tests/test_layering.py):
a venv's python and the node venv's in pdkit.render.flags (venv_python, node_python, beside the venv
directories), a node's release.json and releases directory in pdkit.agent.releases (release_json_path,
releases_dir: on-node, its own CLI defaults use them), the readiness line in pdkit.agent.health.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from pdkit.agent.health import bearer_headers
from pdkit.agent.releases import release_json_path, releases_dir
from pdkit.render.flags import node_python, router_address

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec, HostSpec


def router_url(host: HostSpec) -> str:
    """Base URL of the router on HOST (its API: /health, /workers, /v1/...)."""
    assert host.router is not None
    return f"http://{router_address(host)}:{host.router.port}"


def router_metrics_url(host: HostSpec) -> str:
    """The router's Prometheus page on HOST."""
    assert host.router is not None
    return f"http://{router_address(host)}:{host.router.prometheus_port}/metrics"


def router_api_key(spec: ClusterSpec) -> str | None:
    """The router's API key from the secrets table, or None when the cluster sets none."""
    key = spec.cluster.secrets.router_api_key
    return key.get_secret_value() if key is not None else None


def router_auth_headers(spec: ClusterSpec) -> dict[str, str]:
    """The header every request to the router carries (none without a key)."""
    return bearer_headers(router_api_key(spec))


def releases_command(spec: ClusterSpec) -> str:
    """The shell command of pdkit.agent.releases on a node, up to its action (record, list, restore): the
    deploy records with it, `pdkit roll` lists and restores with it."""
    q = shlex.quote
    return (f"{q(node_python(spec))} -m pdkit.releases --releases-dir {q(releases_dir(spec.cluster.install_dir))} "
            f"--release-json {q(release_json_path(spec.cluster.config_dir))}")
