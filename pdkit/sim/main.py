"""Process entry: parse SGLang's argv, start the HTTP (and bootstrap) servers, become ready."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from pdkit.sim import rendezvous
from pdkit.sim.args import SimArgs, parse_args, release_problems
from pdkit.sim.bootstrap import build_bootstrap_app
from pdkit.sim.engine import Engine
from pdkit.sim.knobs import KnobError, Knobs, load_knobs
from pdkit.sim.logs import setup_logging
from pdkit.sim.metrics import DEFAULT_SGLANG_VERSION, SimMetrics
from pdkit.sim.server import SGLangAccessLogger, SimServer

# SGLang's readiness line, which the gate (pdkit.agent.health.READY_LOG_LINE) cites as evidence; its own copy on
# purpose:
# importing pdkit.agent.health would put it in the sim engine's wheel (wheelhouse.sim_sources), so a gate edit would
# restart sim engines
READY_LINE = "The server is fired up and ready to roll!"
# when this process started, as near as the sim can tell (SGLang's tokenizer_e2e counts from its launch)
PROCESS_STARTED = time.monotonic()
# SGLang's tokenizer_manager.sigterm_watchdog re-checks the requests still in flight every 5 s
DRAIN_TICK_S = 5.0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)  # exits 2 with argparse's usage message on a malformed flag value
    try:
        knobs = load_knobs()
    except KnobError as exc:
        print(f"pdkit.sim: error: {exc}", file=sys.stderr)
        return 2
    version = knobs.sglang_version or DEFAULT_SGLANG_VERSION
    problems = release_problems(args.argv, version)
    if problems:
        # as that release's argparse would: usage error, status 2
        print(f"python -m pdkit.sim: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.decode_radix_cache and args.server["disaggregation_transfer_backend"] == "fake":
        # SGLang's arg_groups/pd_disaggregation_hook.py (0.5.17 and 0.5.23) raises at start-up
        print("ValueError: --disaggregation-decode-enable-radix-cache is incompatible with "
              "--disaggregation-transfer-backend fake", file=sys.stderr)
        return 1
    try:
        return asyncio.run(serve(args, knobs))
    except KeyboardInterrupt:
        return 0


async def _start_site(app: web.Application, host: str, port: int, access_log,
                      exclude: tuple[str, ...]) -> web.AppRunner:
    access_class = type("AccessLogger", (SGLangAccessLogger,), {"exclude": exclude})
    runner = web.AppRunner(
        app,
        access_log=access_log,
        access_log_class=access_class,
        # A client that hangs up (the router cancelling the other PD leg) cancels its handler,
        # which aborts the request inside the engine.
        handler_cancellation=True,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner


def kv_pool_tokens(tokens: int, fraction: float) -> int:
    """The KV pool the sim allocates: PDKIT_SIM_KV_POOL_FRACTION of what the flags give, at least one token."""
    return max(1, int(tokens * fraction))


async def serve(args: SimArgs, knobs: Knobs) -> int:
    # a shrunken engine (PDKIT_SIM_KV_POOL_FRACTION): its scheduler, /server_info, gauge and log line all see the pool
    args = dataclasses.replace(args, max_total_tokens=kv_pool_tokens(args.max_total_tokens, knobs.kv_pool_fraction))
    log, sched_log, access = setup_logging(args.log_level, args.log_level_http)
    log.info(f"server_args=SimServerArgs({', '.join(f'{k}={v!r}' for k, v in args.server.items())})")
    if args.ignored:
        log.info(f"pdkit.sim does not model these SGLang arguments and ignores them: {' '.join(args.ignored)}")
    log.warning("pdkit.sim is a rehearsal engine: its timings and throughput are not performance measurements.")
    if args.mode == "decode":
        # SGLang's arg_groups/pd_disaggregation_hook.py, in the release's words
        if args.decode_radix_cache:
            log.warning("EXPERIMENTAL: Radix cache is enabled for decode server")
        elif (knobs.sglang_version or DEFAULT_SGLANG_VERSION) == "0.5.17":
            log.warning("KV cache is forced as chunk cache for decode server")
        else:
            log.warning("Radix cache is disabled for decode server")
    if args.nnodes > 1:
        try:
            dist = rendezvous.parse_addr(args.dist_init_addr or "")
            loss_s = rendezvous.loss_timeout_s()
        except ValueError as exc:
            log.error(f"{exc} (an engine spanning nodes needs --dist-init-addr HOST:PORT, rank 0's)")
            return 2
        if args.node_rank > 0:
            return await serve_follower(args, dist, loss_s, log)
    else:
        dist, loss_s = None, 0.0

    stop = asyncio.Event()
    exit_code = 0

    def fatal() -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()

    metrics = SimMetrics(args.served_model_name, args.engine_type, args.tp_size,
                         knobs.sglang_version or DEFAULT_SGLANG_VERSION)
    engine = Engine(args, knobs, metrics, sched_log)
    await engine.start(on_fatal=fatal)
    runners = []
    if args.mode == "prefill":
        route = {"prefill_attn_tp_size": args.tp_size, "prefill_dp_size": args.dp_size,
                 "prefill_pp_size": args.pp_size, "transfer_backend": args.server["disaggregation_transfer_backend"],
                 "engine": "pdkit.sim"}
        runners.append(await _start_site(build_bootstrap_app(engine.rooms, route), args.host,
                                          args.bootstrap_port, None, ()))
        sched_log.info(f"Bootstrap server started on {args.host}:{args.bootstrap_port}")
    runners.append(await _start_site(SimServer(args, knobs, engine).app(), args.host, args.port, access,
                                      args.access_log_exclude_prefixes))
    log.info(f"INFO:     Started server process [{os.getpid()}]")
    log.info(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")

    loop = asyncio.get_running_loop()
    drains: list[asyncio.Task] = []

    def sigterm() -> None:
        if not engine.draining:
            log.warning("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
            engine.draining = True
            drains.append(asyncio.create_task(drain(engine, log, stop)))

    loop.add_signal_handler(signal.SIGTERM, sigterm)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    async def ranks_lost(links) -> None:
        why = await rendezvous.watch_all(links)
        sched_log.error(rendezvous.nccl_timeout_line(0, why, loss_s))
        fatal()

    async def become_ready() -> None:
        sched_log.info("Load weight begin. (sim: no weights)")
        if dist is not None:
            # rank 0: ready only when every rank has joined at --dist-init-addr (torch's TCP store)
            links = await rendezvous.host_rendezvous(dist[0], dist[1], args.nnodes, sched_log, loss_s)
            sched_log.info(f"dist init: all {args.nnodes} ranks joined")
            tasks.append(asyncio.create_task(ranks_lost(links)))
        await asyncio.sleep(knobs.startup_delay_s)
        plan = args.cuda_graphs
        sched_log.info(f"KV Cache is allocated. #tokens: {args.max_total_tokens}")
        if plan.decode_enabled or plan.prefill_enabled:
            sched_log.info(f"Capture cuda graph end. decode: {plan.decode_enabled} (max bs {plan.decode_max_bs}), "
                           f"prefill: {plan.prefill_enabled} (max tokens {plan.prefill_max_tokens}). Time elapsed: "
                           "0.00 s.")
        # SGLang sets its start-up gauges once start-up completes, before the server answers /health
        # (TokenizerManager.set_startup_time): every phase, 0 for a CUDA-graph phase that did not run
        metrics.startup_time(time.monotonic() - PROCESS_STARTED, knobs.startup_delay_s, plan)
        engine.ready = True
        log.info(READY_LINE)

    async def watchdog() -> None:
        sched = engine.scheduler
        while True:
            await asyncio.sleep(1.0)
            busy = sched.waiting or sched.running
            if busy and time.monotonic() - sched.last_progress > args.watchdog_timeout:
                sched_log.error(f"Scheduler watchdog timeout (self.watchdog_timeout={args.watchdog_timeout}, "
                                "self.soft=False)")
                fatal()
                return

    tasks = [asyncio.create_task(become_ready()), asyncio.create_task(watchdog())]
    await stop.wait()
    for task in tasks + drains:
        task.cancel()
    for runner in reversed(runners):
        await runner.cleanup()
    await engine.stop()
    return exit_code


async def drain(engine: Engine, log, stop: asyncio.Event) -> None:
    """SGLang's SIGTERM (tokenizer_manager.SignalHandler and sigterm_watchdog, 0.5.17 and 0.5.23):
    /health answers 503 from now on, every request is still served, new ones too, and the process
    exits once none remains, re-checked every DRAIN_TICK_S; an engine a timed-out health probe
    marked UnHealthy exits at once. One difference: idle at SIGTERM, SGLang exits at its
    watchdog's next 5 s tick, the sim at once (docs/sim.md)."""
    while True:
        if engine.unhealthy:
            log.error("Signal SIGTERM received while health check failed. Force exiting.")
            break
        remain = engine.in_flight
        if remain == 0:
            break
        log.info(f"Gracefully exiting... Remaining number of requests {remain}.")
        await asyncio.sleep(DRAIN_TICK_S)
    stop.set()


async def serve_follower(args: SimArgs, dist: tuple[str, int], loss_s: float, log) -> int:
    """A rank above 0: no HTTP server (SGLang serves HTTP on rank 0 only); join rank 0, then
    live until a rank is lost (exit 1, as NCCL's watchdog ends the process) or SIGTERM (exit 0)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    timeout = float(args.dist_timeout) if args.dist_timeout else rendezvous.DEFAULT_DIST_TIMEOUT_S
    join = asyncio.create_task(rendezvous.join_rendezvous(dist[0], dist[1], args.node_rank, args.nnodes, log, loss_s,
                                                          timeout))
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({join, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stopper in done:
        join.cancel()
        return 0
    try:
        link = join.result()
    except TimeoutError as exc:
        log.error(f"dist init: {exc}")
        return 1
    log.info(f"dist init: all {args.nnodes} ranks joined; rank {args.node_rank} runs no HTTP server")
    started = time.monotonic()
    watch = asyncio.create_task(link.watch())
    done, _ = await asyncio.wait({watch, stopper}, return_when=asyncio.FIRST_COMPLETED)
    link.close()
    if stopper in done:
        watch.cancel()
        return 0
    log.error(rendezvous.nccl_timeout_line(args.node_rank, watch.result(), min(time.monotonic() - started, loss_s)))
    return 1
