"""`pyinfra --limit`: say which hosts outside the limit this run left stale, and the command that converges them.

A limited run never touches the excluded hosts, so each keeps the files it had:

- a router there keeps its unit (argv): pdkit registers the (re)started engines through that
  router's worker API (pdkit/hosts/routersync.py), but the unit still lists the old workers, and its
  next restart goes back to them (issue #18 item 5);
- the monitoring host's Prometheus keeps its scrape configuration: an engine (or exporter) whose
  address this run moved is scraped at the old one, and PdkitEngineDown fires a few minutes
  later (issue 30 item 6). Only an address change stales it (a restart on the same port does
  not); the old addresses come from the node's recorded release, which the deploy reads anyway.

Nothing here is fixed from the limited run: writing a host the user left out is what --limit
asks pdkit not to do. The run ends with one warning per stale host and, when there are
several, one command for all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from pdkit.agent.changes import keyed_changes


def _address(url: str) -> str:
    """host:port of a service URL (what Prometheus scrapes, what a router routes to)."""
    parts = urlsplit(url)
    return parts.netloc or url


def retargeted(recorded: Mapping[str, Mapping], planned: Mapping[str, str]) -> list[str]:
    """Pure: the scrape targets a host's deploy moves, as `unit: old -> new` (or `unit: gone`,
    `unit: new at ADDR`). RECORDED: the services of the node's current release (unit -> {kind,
    health_url}); PLANNED: unit -> health URL of the plan's engines and HTTP services (a router's
    scrape port is not its health URL: its own host's deploy restarts it)."""
    old = {u: _address(m["health_url"]) for u, m in recorded.items() if m.get("kind") in ("engine", "http")
           and m.get("health_url")}
    new = {u: _address(url) for u, url in planned.items()}
    said = {"removed": lambda u: f"{u}: gone (was {old[u]})", "added": lambda u: f"{u}: new at {new[u]}",
            "changed": lambda u: f"{u}: {old[u]} -> {new[u]}"}
    return [said[change](unit) for unit, change in keyed_changes(old, new)]


def limit_warnings(
    routers: Mapping[str, Iterable[tuple[str, str]]], moved: Mapping[str, Iterable[str]], excluded: Iterable[str],
    inventory: str,
    scrapers: Mapping[str, Iterable[str]] | None = None, changed: Mapping[str, Iterable[str]] | None = None,
) -> list[str]:
    """Pure. ROUTERS: router host -> its planned (worker host, worker URL); MOVED: host -> worker
    URLs of engines this run started or restarted; EXCLUDED: hosts outside --limit/--exclude;
    SCRAPERS: monitoring host -> the hosts its Prometheus scrapes; CHANGED: host -> the scrape
    targets this run moved there (`retargeted`)."""
    out = []
    stale: list[str] = []
    left_out = set(excluded)
    moved_urls = {h: set(urls) for h, urls in moved.items()}
    for router in sorted(routers):
        if router not in left_out:
            continue
        hit = sorted(url for h, url in routers[router] if url in moved_urls.get(h, set()))
        if hit:
            stale.append(router)
            out.append(
                f"pdkit: --limit left out router host {router}, which fronts workers this run (re)started or changed: "
                f"{', '.join(hit)}. "
                "They were registered through its worker API, but its unit still lists its old workers (a restart goes "
                f"back to them). Run: pyinfra {inventory} deploy/pd.py --limit {router}   (or the whole inventory)"
            )
    changed = {h: list(c) for h, c in (changed or {}).items() if c}
    scraped = scrapers or {}
    for mon in sorted(scraped):
        if mon not in left_out:
            continue
        hit = [f"{h}: {c}" for h in sorted(set(scraped[mon]) & set(changed)) for c in changed[h]]
        if hit:
            stale.append(mon)
            out.append(
                f"pdkit: --limit left out monitoring host {mon}, whose Prometheus scrapes targets this run moved: "
                f"{'; '.join(hit)}. "
                "It keeps scraping the old addresses (PdkitEngineDown fires for them) until its scrape configuration "
                f"is rewritten. Run: pyinfra {inventory} deploy/pd.py --limit {mon}   (or the whole inventory)"
            )
    if len(stale) > 1:
        limits = " ".join(f"--limit {h}" for h in sorted(set(stale)))
        out.append(f"pdkit: to bring every host left stale in line at once: pyinfra {inventory} deploy/pd.py {limits}")
    return out
