"""`pyinfra --limit`: say which routers outside the limit front engines this run (re)started.

A limited run never touches the excluded hosts, so a router there keeps the unit (argv) it
had: pdkit registers the (re)started engines through that router's worker API
(pdkit/routersync.py), but the router's unit still lists the old workers, and its next restart
goes back to them. The run ends with one warning per such router and the command that
converges it (issue #18 item 5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def limit_warnings(routers: Mapping[str, Iterable[tuple[str, str]]], moved: Mapping[str, Iterable[str]], excluded: Iterable[str], inventory: str) -> list[str]:
    """Pure. ROUTERS: router host -> its planned (worker host, worker URL); MOVED: host -> worker
    URLs of engines this run started or restarted; EXCLUDED: hosts outside --limit/--exclude."""
    out = []
    left_out = set(excluded)
    moved_urls = {h: set(urls) for h, urls in moved.items()}
    for router in sorted(routers):
        if router not in left_out:
            continue
        hit = sorted(url for h, url in routers[router] if url in moved_urls.get(h, set()))
        if hit:
            out.append(
                f"pdkit: --limit left out router host {router}, which fronts workers this run (re)started or changed: {', '.join(hit)}. "
                f"They were registered through its worker API, but its unit still lists its old workers (a restart goes back to them). "
                f"Run: pyinfra {inventory} deploy/pd.py --limit {router}   (or the whole inventory)"
            )
    return out
