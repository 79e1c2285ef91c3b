"""The one-screen summary `pdkit validate` prints for a valid inventory."""

from __future__ import annotations

from pdkit.render import flags
from pdkit.render.outages import batch_outages
from pdkit.spec import ClusterSpec, effective_decode_graph_max_bs, engine_numa_node, faultbudget


def summary(spec: ClusterSpec) -> str:
    c = spec.cluster
    lines = [
        f"cluster {c.name}: engine {c.engine}, sglang {c.sglang_version}, model {c.model.path} (served as "
        f"{c.model.name})",
        f"  {'PD over ' + c.transfer_backend if spec.is_pd() else 'no PD'}; target concurrency "
        f"{c.target_concurrency or 'unset'}; service user {c.service_user}",
        "",
        "nodes:",
    ]
    for host in spec.gpu_hosts:
        node = host.node
        assert node is not None
        g = node.gpus
        gpu_kind = "virtual " if node.gpu == "none" else ""
        lines.append(f"  {host.name} ({host.address}): {g.count}x {gpu_kind}{g.model} {g.memory_gib} GiB "
                     f"sm_{g.compute_capability.replace('.', '')}, NCCL profile {node.nccl_profile}")
        if node.engine_venv:
            lines.append(f"    engines run from the node's own environment {flags.engine_python(spec, host)} (pdkit "
                         "installs no engine here)")
        for e in node.engines:
            numa = engine_numa_node(host, e)
            graphs = effective_decode_graph_max_bs(spec, host, e)
            tuning = spec.engine_tuning(e)
            bits = [
                f"GPUs {','.join(map(str, e.gpus))}",
                f"TP{e.tp_size}" + (f" DP{e.dp}" if e.dp > 1 else "") + (f" PP{e.pp}" if e.pp > 1 else "")
                + (f" EP{e.ep}" if e.ep else "") + (f" attn-DP{e.attn_dp}" if (e.attn_dp or 1) > 1 else ""),
                f"NUMA {numa if numa is not None else '-'}",
                f"port {e.port}",
            ]
            if e.effective_bootstrap_port is not None:
                bits.append(f"bootstrap {e.effective_bootstrap_port}")
            if e.role != "prefill":
                bits.append("decode graphs " + (f"<= bs {graphs}" if graphs else
                                                "off" if not tuning.value("cuda_graph") else "on (SGLang default)"))
            if tuning.context_length:
                bits.append(f"ctx {tuning.context_length}")
            if e.spans_nodes:
                bits.append(f"rank 0 of {e.nnodes} nodes ({', '.join(e.nodes or ())}), dist-init :{e.dist_init_port}")
            lines.append(f"    {e.name:<10} {e.role:<8} " + ", ".join(bits))
        for p in spec.placements(host):
            if p.rank > 0:
                lines.append(f"    {p.engine.name:<10} {p.engine.role:<8} rank {p.rank} of "
                             f"{p.head.name}/{p.engine.name}, GPUs {','.join(map(str, p.engine.gpus))}")
    lines += ["", "router:"]
    for host in spec.router_hosts:
        package, version = spec.router_release(host)
        assert host.router is not None
        workers = spec.router_workers(host)
        lines.append(f"  {host.name}: {package} {version} on {flags.router_address(host)}:{host.router.port} (metrics "
                     f":{host.router.prometheus_port}), {len(workers)} workers: "
                     + ", ".join(f"{h.name}/{e.name}" for h, e in workers))
        for node_name in sorted({h.name for h, _ in workers}):
            for outage in batch_outages(spec, [node_name]):
                if outage.router == host.name:
                    lines.append(f"    every {' and '.join(outage.kinds)} worker is on {node_name}: a change there is "
                                 "an outage (pdkit roll --allow-downtime, docs/rolling.md 'Downtime mode')")
        lines += ["    " + line for line in faultbudget.summary_lines(
                c.fault_budget, host.router.health_check_interval_secs, host.router.health_failure_threshold,
                pd=spec.is_pd())]
    lines += ["", "monitoring:"]
    if not spec.monitoring_hosts:
        lines.append("  none declared")
    for host in spec.monitoring_hosts:
        m = host.monitoring
        assert m is not None
        grafana = f"Grafana :{m.grafana_port}" if m.grafana else "no Grafana (pdkit_monitoring.grafana: false)"
        lines.append(f"  {host.name}: Prometheus :{m.prometheus_port} every {m.scrape_interval_s}s, {grafana}")
        receivers = ", ".join(f"{r.name} ({r.kind})" for r in m.alerting.receivers) or "none: alerts reach no one"
        lines.append(f"    Alertmanager :{m.alertmanager_port}, receivers: {receivers}")
    lines += ["", f"OK: {len(spec.hosts)} hosts, {len(spec.engines())} engines; no host was contacted."]
    return "\n".join(lines)
