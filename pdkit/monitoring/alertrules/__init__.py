"""Every alert, one record each, grouped by concern (as the kubernetes-mixin keeps its alerts):

| module | alerts on |
|---|---|
| `engines` | the engines: down, a rank down, queues, decode CUDA graphs (the decode-graph rule), wedged, TTFT |
| `router` | the routers and their word on their workers |
| `node` | the hosts and what pdkit-exporter reads on them |
| `kv` | the KV cache's way from prefill to decode |
| `base` | the record (`AlertRecord`), its `Scope` and `Runbook`, and the promtool case helpers |

A record holds the alert whole: name, severity, `for`, scope, runbook, and `build`, which renders the rest for a
spec (expression, value, threshold(s), annotations, promtool cases, the doc table's line). Everything else is
generated from these records: the rules file and the promtool tests (pdkit.monitoring.rules; each description's
"What to do" is its runbook's steps, base.what_to_do), the runbooks and
docs/monitoring.md's alert table (pdkit.contract.alerttable), Alertmanager's inhibitions
(pdkit.monitoring.alertmanager). A new alert is a record in its concern's module and a line in ALERTS and
SCOPE_ORDER (a router worker alert: in router.WORKER_ALERTS, the group both take).

Named `alertrules`, not `alerts`: `pdkit.monitoring.alerts` is the function that renders them (the package's
re-export), and a submodule of that name would replace it as the package's attribute.
"""

from __future__ import annotations

from pdkit.monitoring.alertrules import engines, kv, node, router
from pdkit.monitoring.alertrules.base import ENGINE, HOST, NODE, ROUTER_WORKERS, SCOPES, SEVERITIES, AlertRecord

# the rules file's order
ALERTS: tuple[AlertRecord, ...] = (
    engines.ENGINE_DOWN,
    engines.ENGINE_RANK_DOWN,
    router.ROUTER_DOWN,
    node.NODE_DOWN,
    node.GPU_WEDGED,
    node.SCRAPE_TARGET_DOWN,
    *router.WORKER_ALERTS,
    engines.QUEUE_GROWING,
    kv.KV_TRANSFER_FAILURES,
    kv.BOOTSTRAP_FAILURES,
    kv.KV_HANDOFF_SLOW,
    engines.DECODE_GRAPH_RATIO_LOW,
    engines.ENGINE_WEDGED,
    engines.TTFT_P99_OVER_SLO,
    node.CONFIG_DRIFT,
    node.NCCL_ENV_MISSING,
)

# The order alertmanager.yml names them in (each inhibition's target regex takes its scopes' alerts in this
# order): the order the scope tuples had before the records, kept so that the rendered file stays byte-identical
# (issue 48 item 7). Alertmanager reads any order the same.
SCOPE_ORDER: tuple[AlertRecord, ...] = (
    engines.ENGINE_DOWN,
    engines.ENGINE_RANK_DOWN,
    engines.ENGINE_WEDGED,
    engines.QUEUE_GROWING,
    kv.KV_TRANSFER_FAILURES,
    kv.BOOTSTRAP_FAILURES,
    engines.TTFT_P99_OVER_SLO,
    engines.DECODE_GRAPH_RATIO_LOW,
    kv.KV_HANDOFF_SLOW,
    node.CONFIG_DRIFT,
    node.NCCL_ENV_MISSING,
    node.GPU_WEDGED,
    node.SCRAPE_TARGET_DOWN,
    router.ROUTER_DOWN,
    *router.WORKER_ALERTS,
    node.NODE_DOWN,
)


def check_records(records: tuple[AlertRecord, ...], scope_order: tuple[AlertRecord, ...]) -> None:
    """Refuse a record set the generators cannot render whole: a name twice, a severity or scope that is not one
    of SEVERITIES / SCOPES, a runbook without what it means, its causes or something to run, or a scope order
    that is not the same records."""
    names = [r.name for r in records]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"alert records: {twice} declared more than once; each alert is one record")
    for r in records:
        if r.severity not in SEVERITIES:
            raise ValueError(f"alert record {r.name}: severity {r.severity!r} is not one of {list(SEVERITIES)}")
        if r.scope not in SCOPES:
            raise ValueError(f"alert record {r.name}: scope {r.scope!r} is not one of {[s.name for s in SCOPES]}")
        rb = r.runbook
        if rb is None or not (rb.means and rb.causes and rb.run):
            raise ValueError(f"alert record {r.name}: its runbook needs `means`, `causes` and `run` "
                             "(docs/monitoring.md's entry is generated from them)")
    order = [r.name for r in scope_order]
    if sorted(order) != sorted(names):
        raise ValueError(f"alertrules.SCOPE_ORDER must list every record once: missing "
                         f"{sorted(set(names) - set(order))}, not a record or twice "
                         f"{sorted(n for n in set(order) if n not in names or order.count(n) > 1)}")


check_records(ALERTS, SCOPE_ORDER)

ALERT_NAMES = tuple(r.name for r in ALERTS)


def scoped(*scopes) -> tuple[str, ...]:
    """The names of the alerts of SCOPES, in SCOPE_ORDER (what an inhibition's target regex lists)."""
    return tuple(r.name for r in SCOPE_ORDER if r.scope in scopes)


__all__ = ["ALERTS", "ALERT_NAMES", "ENGINE", "HOST", "NODE", "ROUTER_WORKERS", "SCOPE_ORDER", "AlertRecord",
           "check_records", "engines", "kv", "node", "router", "scoped"]
