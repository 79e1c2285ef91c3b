"""Gathering doctor's observations: what each engine and router of the spec should be running
(`engine_plans`, `router_urls`), and `collect`, which reads all of them from the control machine, with
progress lines. Every read is a pdkit.doctor.observe function looked up on that module at call time, so
a test that replaces observe.http_get sees every GET."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pdkit.agent.exporter.config import reads_gpu_health
from pdkit.agent.health import router_worker_health
from pdkit.doctor import observe
from pdkit.doctor.model import EngineObservation, EnginePlan, ExporterView, RouterObservation
from pdkit.render import flags
from pdkit.render.paths import router_auth_headers, router_metrics_url, router_url
from pdkit.spec import (
    decode_graph_required_bs,
    decode_graphs_expected,
    effective_decode_graph_max_bs,
    pairing_sets,
    prefill_kv_paths,
)


def engine_plans(spec) -> list[EnginePlan]:
    """What each engine of the spec should be running."""
    target = spec.cluster.target_concurrency
    kv_paths = prefill_kv_paths(spec)
    kv_decodes: dict[tuple[str, str], set[str]] = {}
    for _label, members in pairing_sets(spec):
        decodes = {f"{h.name}/{e.name}" for h, e in members if e.role == "decode"}
        for h, e in members:
            if e.role == "prefill":
                kv_decodes.setdefault((h.name, e.name), set()).update(decodes)
    out = []
    for host, engine in spec.engines():
        tuning = spec.engine_tuning(engine)
        kv: dict[str, Any] = ({"kv_paths": tuple((d, p.name) for d, p in kv_paths.get((host.name, engine.name), ())),
               "kv_decodes": tuple(sorted(kv_decodes.get((host.name, engine.name), ()))),
               "ucx_net_devices": host.node.ucx_net_devices if host.node is not None else None}
              if engine.role == "prefill" else {})
        # every rank of an engine spanning nodes, rank 0 first: each on its own host, with that
        # host's NCCL/UCX environment and its own argv (--node-rank)
        for rank, node in enumerate(spec.engine_hosts(host, engine)):
            env = {**flags.nccl_env(spec, node), **flags.ucx_env(spec, node),
                   **flags.engine_env(spec, host, engine, node)}
            planned_env = sorted(k for k in env if k.startswith(("NCCL_", "UCX_", "SGLANG_")))
            out.append(EnginePlan(
                host=node.name,
                engine=engine.name,
                role=engine.role,
                url=flags.engine_url(spec, host, engine),
                pd_group=engine.pd_group if engine.role != "unified" else None,
                argv=tuple(flags.sglang_args(spec, host, engine, rank)),
                sglang_version=spec.engine_version(engine),
                engine_kind=spec.cluster.engine,
                context_length=tuning.context_length,
                cuda_graph=decode_graphs_expected(spec, engine),
                graph_max_bs=effective_decode_graph_max_bs(spec, host, engine),
                required_bs=decode_graph_required_bs(engine, target),
                env_names=tuple(planned_env),
                gpus=tuple(engine.gpus),
                # the node's exporter probes its GPUs' health: NVIDIA GPUs and a real engine (the exporter
                # config's gpu_health, pdkit/render/plan.py)
                gpu_health=node.node is not None and reads_gpu_health(node.node.gpu, spec.cluster.engine),
                **kv,
                **({"rank": rank, "nnodes": engine.nnodes, "head": host.name} if engine.spans_nodes else {}),
            ))
    return out


def router_urls(spec) -> list[tuple[str, str, tuple[str, ...]]]:
    """(host, router base URL, planned worker URLs) per router, from the plan's router service."""
    # lazy: pdkit.render.plan loads jinja2 and the unit templates' helpers (about 30 ms), and the CLI imports doctor
    # for every command; only this needs the plan
    from pdkit.render.plan import plan_host

    out = []
    for host in spec.router_hosts:
        service = next(s for s in plan_host(spec, host).services if s.kind == "router")
        out.append((host.name, router_url(host), service.expected_workers))
    return out


@dataclass
class Collected:
    """What `collect` read: every engine's and router's observations, the probes' HTTP statuses, each
    node's reboot flag."""

    engines: list[EngineObservation]
    routers: list[RouterObservation]
    probe_statuses: list[int] = field(default_factory=list)
    # GPU node -> (pdkit_node_reboot_required or None, why the exporter could not say)
    reboots: dict[str, tuple[float | None, str | None]] = field(default_factory=dict)


def collect(spec, *, window_s: float = 3.0, probe_requests: int = 8, timeout_s: float = 5.0,
            progress: Callable[[str], None] = lambda _m: None) -> Collected:
    """Read every engine, exporter and router of the spec (two /metrics samples `window_s` apart)."""
    plans = engine_plans(spec)
    obs = [EngineObservation(plan=p) for p in plans]
    # HTTP only to rank 0 of each engine: a rank above 0 serves none (its exporter says the rest)
    served = [o for o in obs if o.plan.rank == 0]
    headers = router_auth_headers(spec)
    routers = [RouterObservation(h, url, workers) for h, url, workers in router_urls(spec)]
    router_metrics = [router_metrics_url(h) for h in spec.router_hosts]
    exporters = {h.name: f"http://{spec.engine_address(h)}:{h.node.exporter_port}" for h in spec.gpu_hosts}

    with ThreadPoolExecutor(max(4, 2 * len(served) + len(routers) + len(exporters))) as pool:
        def read_engine(o: EngineObservation) -> None:
            o.server_info, o.server_info_error = observe.read_server_info(o.plan.url, timeout_s)
            o.first = observe.sample(o.plan.url, timeout_s)

        progress(f"reading {len(served)} engines")
        list(pool.map(read_engine, served))
        for r, outcomes in zip(routers, pool.map(lambda u: observe.read_router_outcomes(u, timeout_s), router_metrics)):
            r.outcomes_first = outcomes
        started = time.monotonic()
        statuses: list[int] = []
        for r in routers if probe_requests > 0 else []:
            progress(f"sending {probe_requests} probe requests through {r.url}")
            statuses += observe.probe(r.url, spec.cluster.model.name, probe_requests, max(timeout_s, 30.0), headers)
        time.sleep(max(0.0, window_s - (time.monotonic() - started)))
        progress(f"second look at the engines after {time.monotonic() - started:.1f} s; exporters and routers")
        seconds = pool.map(lambda o: observe.sample(o.plan.url, timeout_s), served)
        exporter_pages = dict(zip(exporters, pool.map(lambda u: observe.http_get(f"{u}/metrics", timeout_s),
                                                      exporters.values())))
        router_pages = list(pool.map(lambda r: observe.http_get(f"{r.url}/workers", timeout_s, headers), routers))
        for r, outcomes in zip(routers, pool.map(lambda u: observe.read_router_outcomes(u, timeout_s), router_metrics)):
            r.outcomes_second = outcomes
        for o, s in zip(served, seconds):
            o.second = s

    views: dict[str, dict[str, ExporterView]] = {}
    errors: dict[str, str] = {}
    for host, (body, error) in exporter_pages.items():
        if body is None:
            errors[host] = f"{exporters[host]}/metrics: {error}"
            continue
        try:
            views[host] = observe.exporter_views(body)
        except ValueError as exc:
            errors[host] = f"unreadable exporter page: {str(exc)[:120]}"
    for o in obs:
        view = views.get(o.plan.host, {}).get(o.plan.engine)
        o.exporter = view
        if view is None:
            o.exporter_error = errors.get(o.plan.host, f"no series for engine {o.plan.engine}")
    for r, (body, error) in zip(routers, router_pages):
        if body is None:
            r.error = error
            continue
        try:
            r.workers = router_worker_health(body)
        except (ValueError, AttributeError) as exc:
            r.error = f"unreadable /workers: {exc}"
    reboots: dict[str, tuple[float | None, str | None]] = {}
    for host, (body, _error) in exporter_pages.items():
        reboots[host] = (observe.reboot_pending(body), None) if body is not None else (None, errors.get(host))
    return Collected(obs, routers, statuses, reboots)

