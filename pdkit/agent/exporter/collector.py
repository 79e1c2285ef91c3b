"""The prometheus-client custom collector: one scrape of pdkit-exporter = one look at every engine
of the node.

Per scrape, concurrently on a small thread pool: GET /metrics of each engine (one attempt, a
hard total deadline, no retries; a request still running from an earlier scrape is not started
again), GET /server_info where it is due (its resolved args and version are fixed for the life of
an engine process: it is read again when the unit's main process changed, after /metrics failed
or its counters went back, and at least every server_info_max_age_s), one `journalctl` read for
all engine units, and the check of each unit's main process (/proc/PID/environ and cmdline,
cached per process). Scrapes are serialised with a lock, so two Prometheus servers scraping at
once cannot double the load on the engines.

Decisions live in pure functions (pdkit.agent.exporter.metrics / logs / drift / system); this module
only fetches, keeps the little state between scrapes (journal cursor, last batch lines, cached
processes and /server_info, flag findings) and lays out the metric families.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import requests
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from requests.adapters import HTTPAdapter

from pdkit.agent import engineshape, jitcache, residency
from pdkit.agent.exporter.config import EngineConfig, ExporterConfig
from pdkit.agent.exporter.drift import (
    FlagCheck,
    argv_options,
    cmdline_drift,
    compare_server_info,
    describe,
    engine_args,
    flag_key,
)
from pdkit.agent.exporter.gpuhealth import GpuProbe, judge
from pdkit.agent.exporter.logs import parse_batch_line
from pdkit.agent.exporter.metrics import decode_cuda_graph_ratio, parse_metrics
from pdkit.agent.exporter.system import (
    REBOOT_MARKER_PATH,
    JournalEntry,
    JournalError,
    JournalReader,
    ProcessCheck,
    ProcessInspector,
    ProcessView,
    env_problems,
    reboot_required,
)
from pdkit.upstream.metricnames import EXPORTER_FAMILIES

log = logging.getLogger("pdkit.exporter")

# The figures of the last `Decode batch` / `Prefill batch` log line pdkit-exporter publishes, in the order it writes
# them: (the figure's key in pdkit.agent.exporter.logs.parse_batch_line's answer, "timestamp" for the line's journal
# time; its family in EXPORTER_FAMILIES after `<phase>_batch_`; what the help calls it; the help's note; the phases
# whose lines carry it)
BATCH_FIGURES = (
    ("gen_throughput", "gen_throughput_tokens_per_second", "gen throughput (token/s)", "", ("decode",)),
    ("input_throughput", "input_throughput_tokens_per_second", "input throughput (token/s)", "", ("prefill",)),
    ("running_requests", "running_requests", "#running-req", "", ("decode", "prefill")),
    ("queued_requests", "queued_requests", "#queue-req", "", ("decode", "prefill")),
    ("cuda_graph", "cuda_graph", "`cuda graph:`", " (1 True, 0 False)", ("decode", "prefill")),
    ("token_usage", "token_usage_ratio", "token usage", "", ("decode",)),
    ("timestamp", "timestamp_seconds", "Journal time", " (unix seconds)", ("decode", "prefill")),
)

ENDPOINTS = ("metrics", "server_info")
MAX_BODY_BYTES = 16 * 1024 * 1024
LABELS = ("node", "engine", "role")

# pdkit-exporter's families of one engine each, in the order a scrape exposes them: (the family's key in
# EXPORTER_FAMILIES, its type, its labels after LABELS, its help). An info family's key names its series, as the
# rules read it; prometheus_client appends "_info" to the name it is given.
ENGINE_FAMILIES: tuple[tuple[str, Literal["gauge", "counter", "info"], tuple[str, ...], str], ...] = (
    ("engine_up", "gauge", (),
     "1 when the engine answered /metrics in this scrape and /server_info for its current process (read once per "
     "process, see server_info_max_age_s)."),
    ("engine_rank_up", "gauge", ("rank", "nnodes", "head"),
     "An engine spanning nodes: 1 when the unit of the rank this node runs has a running process. Rank 0 also serves "
     "HTTP (pdkit_engine_up); a rank above 0 serves none."),
    ("engine_scrape_error", "gauge", ("endpoint",),
     "1 when this scrape of the endpoint failed (refused, timeout, HTTP error, unreadable)."),
    ("engine_info", "info", (),
     "What the engine runs: release (config hash), SGLang version (running, from /server_info; last known while "
     "down) and the planned one."),
    ("engine_flags_drift", "gauge", (),
     "1 when the running flags (/server_info, process argv) differ from the planned argv; absent when neither could "
     "be read."),
    ("engine_flag_drift_info", "info", (),
     "One series per planned flag that the running engine contradicts."),
    ("engine_flags_unverified", "gauge", (),
     "Planned flags that /server_info does not report (so could only be checked in argv)."),
    ("engine_env_present", "gauge", (),
     "1 when every planned NCCL/UCX/SGLANG variable is in /proc/<MainPID>/environ with its planned value, 0 when "
     "not; absent when unreadable."),
    ("engine_env_check_error", "gauge", (),
     "1 when the engine process's environment could not be read (unit not running, no permission, systemctl failed)."),
    ("engine_env_mismatch_info", "info", (),
     "One series per planned variable missing from or different in the engine process."),
    ("engine_running_requests", "gauge", (),
     "Requests in the running batch (sglang:num_running_reqs)."),
    ("engine_queued_requests", "gauge", (),
     "Requests waiting to be scheduled (sglang:num_queue_reqs)."),
    ("engine_token_usage_ratio", "gauge", (),
     "KV cache token usage, 0..1 (sglang:token_usage)."),
    ("engine_gen_throughput_tokens_per_second", "gauge", (),
     "The engine's own generation throughput, refreshed at its log interval (sglang:gen_throughput)."),
    ("engine_pd_queue_requests", "gauge", ("queue",),
     "PD queue depth: bootstrap and inflight (prefill), prealloc and transfer (decode)."),
    ("engine_prompt_tokens", "counter", (),
     "Prompt tokens processed (sglang:prompt_tokens_total); rate() it for tokens per second."),
    ("engine_generation_tokens", "counter", (),
     "Tokens generated (sglang:generation_tokens_total); rate() it for tokens per second."),
    ("engine_kv_transfer_failures", "counter", ("stage",),
     "Requests whose PD KV hand-off failed, by stage (sglang:num_bootstrap_failed_reqs_total, "
     "num_transfer_failed_reqs_total)."),
    ("engine_forward_passes", "counter", ("phase", "cuda_graph"),
     "Forward passes by phase and whether they ran as a CUDA graph (sglang:cuda_graph_passes_total, one TP rank)."),
    ("decode_cuda_graph_ratio", "gauge", (),
     "Share of decode forward passes run as a CUDA graph since the engine started; absent before the first decode "
     "pass."),
    ("engine_shape_recorded", "gauge", ("figure",),
     "The engine's shape the gate recorded at the first healthy start of its running configuration "
     "(pdkit/agent/engineshape.py): KV pool tokens, max running requests, context length, CUDA-graph batch sizes."),
    ("engine_weights_info", "gauge", ("status", "recorded", "now", "problem"),
     "The engine gate's last verdict on the engine's weight checksums (/weights_checker against the first healthy "
     "start's, pdkit/agent/engineshape.py): status recorded, match, mismatch or unavailable; per-engine checksums "
     "recorded and now."),
    ("engine_weights_page_cache_ratio", "gauge", ("model_dir",),
     "Share of the engine's weight files in the node's page cache (mincore, at most once a minute): below 1 a "
     "restart reads the rest from disk."),
    ("engine_weights_bytes", "gauge", ("model_dir",),
     "Bytes of the engine's weight files."),
    ("engine_jit_caches_warm", "gauge", ("dir", "why"),
     "1 when the engine's JIT caches are warm for its next start (a start passed the engine gate with them on the "
     "current engine environment, pdkit/agent/jitcache.py), 0 when that start compiles them."),
    ("engine_jit_cold_start_extra_seconds", "gauge", ("dir", "source"),
     "What a cold start of the engine cost on this node beyond a warm one, by SGLang's start-up phases (its first "
     "and last gated start on one environment)."),
)


def _family(key: str, kind: str, labels: tuple[str, ...],
            doc: str) -> GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily:
    """One row of ENGINE_FAMILIES, declared (no samples yet)."""
    name, names = EXPORTER_FAMILIES[key], [*LABELS, *labels]
    if kind == "info":
        return InfoMetricFamily(name.removesuffix("_info"), doc, labels=names)
    return (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=names)


@dataclass
class Fetch:
    """One HTTP GET: the parsed body, or why there is none."""

    value: Any = None
    error: str | None = None
    status: int | None = None


def _short(exc: BaseException) -> str:
    text = str(exc)
    # urllib3 wraps the useful part ("Connection refused", "timed out") deep inside its message
    for marker in ("Connection refused", "timed out", "Name or service not known", "No route to host",
                   "Connection reset", "Remote end closed connection"):
        if marker in text:
            return f"{type(exc).__name__}: {marker}"
    return f"{type(exc).__name__}: {text[:160]}"


# what a rank above 0 answers instead of an HTTP fetch: it runs no HTTP server
NO_HTTP = Fetch(error="a rank above 0 of an engine spanning nodes serves no HTTP (rank 0 does)")


def http_get(session: requests.Session, url: str | requests.PreparedRequest, timeout_s: float,
             max_bytes: int = MAX_BODY_BYTES) -> Fetch:
    """GET once, within `timeout_s` in total (connect, headers and a body that trickles in).

    `url` may be a request prepared once (prepare_get): sending it skips requests' per-call
    preparation, a third of its cost per scrape.
    """
    deadline = time.monotonic() + timeout_s
    prepared = url if isinstance(url, requests.PreparedRequest) else prepare_get(url)
    try:
        with session.send(prepared, timeout=(timeout_s, timeout_s), stream=True, allow_redirects=False) as resp:
            if resp.status_code != 200:
                return Fetch(error=f"HTTP {resp.status_code}", status=resp.status_code)
            chunks, size = [], 0
            for chunk in resp.iter_content(65536):
                size += len(chunk)
                if size > max_bytes:
                    return Fetch(error=f"body over {max_bytes} bytes", status=200)
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    return Fetch(error=f"body not complete after {timeout_s:g} s", status=200)
            return Fetch(value=b"".join(chunks), status=200)
    except requests.RequestException as exc:
        return Fetch(error=_short(exc))


def prepare_get(url: str) -> requests.PreparedRequest:
    # identity: SGLang's /metrics app gzips when asked, which only costs CPU on the node's own network
    return requests.Request("GET", url, headers={"Accept-Encoding": "identity",
                                                 "User-Agent": "pdkit-exporter"}).prepare()


def new_session() -> requests.Session:
    session = requests.Session()
    # one attempt per scrape: no urllib3 retries, one kept-alive connection per engine endpoint
    adapter = HTTPAdapter(max_retries=0, pool_connections=1, pool_maxsize=1)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.trust_env = False  # engines are on the node's own addresses: never via an HTTP proxy
    return session


@dataclass
class EngineState:
    sessions: dict[str, requests.Session] = field(default_factory=dict)
    prepared: dict[str, requests.PreparedRequest] = field(default_factory=dict)
    inflight: dict[str, cf.Future[Fetch]] = field(default_factory=dict)
    sglang_version: str = ""
    model: str = ""
    # /server_info of the engine's current process (resolved args do not change while it lives)
    info: dict[str, Any] | None = None
    info_key: tuple[int, int] | None = None  # (pid, start time) it was read from, when known
    info_at: float = 0.0
    info_stale: bool = False  # /metrics failed or its counters went back: the process may be new
    last_totals: float | None = None
    flag_cache: tuple[Any, Any, Any] | None = None  # (server_info, process view, flag_findings result)
    # kind (decode | prefill) -> (figures, unix time of the line)
    last_batch: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    # topic -> last message logged, so a lasting problem is logged once, not every scrape
    noted: dict[str, str | None] = field(default_factory=dict)


@dataclass
class EngineSnapshot:
    """What one scrape saw of one engine (input of the metric layout)."""

    engine: EngineConfig
    metrics: Fetch
    server_info: Fetch
    process: ProcessCheck | None


def server_info_due(have: bool, have_key: tuple[int, int] | None, key: tuple[int, int] | None, age_s: float,
                    max_age_s: float, stale: bool) -> bool:
    """Whether this scrape must GET /server_info again.

    Its content (resolved args, version) is fixed for the life of an engine process, so it is
    read once per process: again when the unit's main process changed (pid + start time), when
    /metrics failed or its counters went back since (the engine may have restarted), and at the
    latest every max_age_s.
    """
    if not have or stale or age_s >= max_age_s:
        return True
    return key is not None and key != have_key


def cumulative_total(figures: dict[str, Any]) -> float:
    """Sum of an engine's cumulative counters: it only goes back when the process restarted."""
    total: float = (figures.get("prompt_tokens", 0.0) + figures.get("generation_tokens", 0.0)
                    + sum(figures["cuda_graph_passes"].values()))
    return total


# the stages of pdkit_engine_kv_transfer_failures_total (pdkit.agent.exporter.metrics' kv_transfer_failures keys)
KV_FAILURE_STAGES = ("bootstrap", "transfer")
# the weights' page-cache residency is measured at most this often per model directory
RESIDENCY_EVERY_S = 60.0


class PdkitCollector(Collector):
    # the node's reboot-required marker (tests point it elsewhere)
    reboot_marker_path: str = REBOOT_MARKER_PATH

    def __init__(
        self,
        config: ExporterConfig,
        inspector: ProcessInspector | None = None,
        journal: JournalReader | None = None,
        session_factory: Callable[[], requests.Session] = new_session,
        clock: Callable[[], float] = time.time,
        shapes_dir: str = engineshape.SHAPES_DIR,
        gpu_probe: GpuProbe | None = None,
    ) -> None:
        self.config = config
        # the GPU health probe (config.gpu_health: NVIDIA GPUs and a real engine), started now so that the
        # first scrape finds an answer; tests give their own
        if gpu_probe is None and config.gpu_health:
            gpu_probe = GpuProbe()
        self.gpu_probe = gpu_probe if config.gpu_health else None
        if self.gpu_probe is not None:
            self.gpu_probe.poll()
        self.shapes_dir = shapes_dir
        self.inspector = inspector if inspector is not None else ProcessInspector()
        units = [e.unit for e in config.engines if e.unit]
        if journal is None and config.journal.enabled and units:
            journal = JournalReader(units, max_entries=config.journal.max_entries, timeout=config.journal.timeout_s)
        self.journal = journal
        self.clock = clock
        self.state = {e.name: EngineState(sessions={ep: session_factory() for ep in ENDPOINTS},
                                          prepared={ep: prepare_get(f"{e.url}/{ep}") for ep in ENDPOINTS})
                      for e in config.engines}
        self.pool = cf.ThreadPoolExecutor(max_workers=2 * len(config.engines) + 2,
                                          thread_name_prefix="pdkit-exporter")
        self._lock = threading.Lock()
        self._release_cache: tuple[tuple[int, int], str] | None = None
        self._journal_future: cf.Future[list[JournalEntry]] | None = None
        self._journal_taken = True
        self._node_noted: dict[str, str | None] = {}
        # model directory -> (monotonic time, its last residency or None): pdkit.agent.residency, throttled
        self._residency_cache: dict[str, tuple[float, dict[str, Any] | None]] = {}

    def describe(self) -> list[Metric]:
        return []  # registering must not scrape the engines

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.gpu_probe is not None:
            self.gpu_probe.close()
        for state in self.state.values():
            for session in state.sessions.values():
                session.close()

    # ---------------------------------------------------------------------------- fetching

    def _fetch(self, engine: EngineConfig, endpoint: str) -> Fetch:
        state = self.state[engine.name]
        result = http_get(state.sessions[endpoint], state.prepared[endpoint], self.config.timeout_s)
        if result.error is not None:
            return result
        try:
            if endpoint == "metrics":
                result.value = parse_metrics(result.value.decode("utf-8", "replace"))
            else:
                info = json.loads(result.value)
                if not isinstance(info, dict):
                    raise ValueError("not a JSON object")
                result.value = info
        except ValueError as exc:
            return Fetch(error=f"unreadable {endpoint}: {str(exc)[:160]}", status=result.status)
        return result

    def _release(self) -> str:
        if self.config.release:
            return self.config.release
        path = self.config.release_file
        if not path:
            return ""
        try:
            st = os.stat(path)
            key = (st.st_mtime_ns, st.st_size)
            if self._release_cache is None or self._release_cache[0] != key:
                with open(path, "rb") as f:
                    self._release_cache = (key, hashlib.sha256(f.read()).hexdigest())
            self._note_node("release", None)
            return self._release_cache[1]
        except OSError as exc:
            self._note_node("release", f"cannot read release file {path}: {exc.strerror or exc}")
            return ""

    def _note(self, noted: dict[str, str | None], prefix: str, topic: str, message: str | None) -> None:
        if noted.get(topic) == message:
            return
        if message is not None:
            log.warning("%s%s", prefix, message)
        elif noted.get(topic) is not None:
            log.info("%s%s: ok again", prefix, topic)
        noted[topic] = message

    def _note_engine(self, engine: EngineConfig, topic: str, message: str | None) -> None:
        self._note(self.state[engine.name].noted, f"engine {engine.name}: ", topic, message)

    def _note_node(self, topic: str, message: str | None) -> None:
        self._note(self._node_noted, "", topic, message)

    def _submit(self, engine: EngineConfig, endpoint: str) -> cf.Future[Fetch] | Fetch:
        """Start a GET, unless the previous one to the same endpoint has not come back (no pile-up)."""
        state = self.state[engine.name]
        previous = state.inflight.get(endpoint)
        if previous is not None and not previous.done():
            return Fetch(error="previous request still running")
        future = self.pool.submit(self._fetch, engine, endpoint)
        state.inflight[endpoint] = future
        return future

    def scrape(self) -> tuple[list[EngineSnapshot], str | None]:
        """Look at every engine once (concurrently). Returns the snapshots and the journal error."""
        started = time.monotonic()
        # each request and journalctl enforce their own deadline; this only bounds the wait for
        # stragglers, which the in-flight guards then keep from piling up
        budget = max(self.config.timeout_s, self.config.journal.timeout_s) + 0.25
        engines = self.config.engines
        # a rank above 0 of an engine spanning nodes serves no HTTP: only its process is checked
        metrics_jobs = {e.name: self._submit(e, "metrics") if e.rank == 0 else NO_HTTP for e in engines}
        journal_future: cf.Future[list[JournalEntry]] | None = None
        journal_busy = False
        if self.journal is not None:
            previous = self._journal_future
            if previous is not None and not previous.done():
                journal_busy = True  # never two reads on one cursor
            else:
                if previous is not None and not self._journal_taken:
                    self._take_journal_future(previous)  # a read that finished after its scrape gave up
                journal_future = self._journal_future = self.pool.submit(self.journal.read)
                self._journal_taken = False

        # the process check is cheap while the processes stay the same (cached); it decides
        # whether /server_info must be read again
        units = [e.unit for e in engines]
        checks: list[ProcessCheck | None] = [None] * len(engines)
        if any(units):
            try:
                checks = list(self.inspector.check(units))
            except Exception as exc:  # noqa: BLE001 - a broken check must not cost the scrape
                checks = [ProcessCheck(error="pid_lookup", detail=repr(exc)) for _ in engines]
        now = time.monotonic()
        info_jobs: dict[str, cf.Future[Fetch] | Fetch] = {}
        for engine, check in zip(engines, checks):
            state = self.state[engine.name]
            key = (check.view.pid, check.view.start_time) if check is not None and check.view is not None else None
            if engine.rank == 0 and server_info_due(state.info is not None, state.info_key, key, now - state.info_at,
                               self.config.server_info_max_age_s, state.info_stale):
                info_jobs[engine.name] = self._submit(engine, "server_info")

        # only waited on (their results are read below): futures of two result types
        waits: list[cf.Future[Any]] = [j for j in (*metrics_jobs.values(), *info_jobs.values())
                                       if isinstance(j, cf.Future)]
        if journal_future is not None:
            waits.append(journal_future)
        cf.wait(waits, timeout=max(0.0, budget - (time.monotonic() - started)))

        def result(job: cf.Future[Fetch] | Fetch) -> Fetch:
            if isinstance(job, Fetch):
                return job
            return job.result() if job.done() else Fetch(error="no answer within the scrape budget")

        snapshots = []
        for engine, check in zip(engines, checks):
            state = self.state[engine.name]
            metrics = result(metrics_jobs[engine.name])
            if engine.name in info_jobs:
                info = result(info_jobs[engine.name])
                if info.error is None:
                    state.info, state.info_at, state.info_stale = info.value, now, False
                    state.info_key = (check.view.pid, check.view.start_time) \
                        if check is not None and check.view is not None else None
                else:
                    state.info = None
            elif engine.rank > 0:
                info = NO_HTTP
            else:
                info = Fetch(value=state.info)
            if engine.rank > 0:
                pass
            elif metrics.error is not None:
                state.info_stale = True
            else:
                totals = cumulative_total(metrics.value)
                if state.last_totals is not None and totals < state.last_totals:
                    state.info_stale = True  # counters reset: a new process
                state.last_totals = totals
            snapshots.append(EngineSnapshot(engine, metrics, info, check))

        journal_error = "previous journal read still running" if journal_busy else None
        if journal_future is not None:
            if not journal_future.done():
                journal_error = "journalctl did not finish within the scrape budget"
            else:
                journal_error = self._take_journal_future(journal_future)
        self._note_node("journal", journal_error)
        return snapshots, journal_error

    def _take_journal_future(self, future: cf.Future[list[JournalEntry]]) -> str | None:
        """Apply a finished journal read (once); its error, if it failed."""
        self._journal_taken = True
        exc = future.exception()
        if exc is not None:
            return str(exc) if isinstance(exc, JournalError) else repr(exc)
        self._take_journal(future.result())
        return None

    def _take_journal(self, entries: list[JournalEntry]) -> None:
        assert self.journal is not None
        by_unit = {e.unit: e for e in self.config.engines if e.unit}
        now = self.clock()
        for entry in entries:
            unit = self.journal.attribute(entry)
            engine = by_unit.get(unit) if unit else None
            if engine is None:
                continue
            figures = parse_batch_line(entry.message)
            if figures is not None:
                kind = figures.pop("kind")
                self.state[engine.name].last_batch[kind] = (figures, entry.realtime_s or now)

    # ---------------------------------------------------------------------------- exposing

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.perf_counter()
            snapshots, journal_error = self.scrape()
            families = self._families(snapshots, journal_error)
            if self.gpu_probe is not None:
                families += self._gpu_health(snapshots)
            duration = GaugeMetricFamily(EXPORTER_FAMILIES["exporter_collect_duration_seconds"],
                                         "Time this scrape of the node's engines took.", labels=["node"])
            duration.add_metric([self.config.node], time.perf_counter() - started)
            reboot = GaugeMetricFamily(EXPORTER_FAMILIES["node_reboot_required"],
                                       "1 when the NVIDIA driver changed and the node "
                                       "waits for a drained reboot (pdkit's marker file), else 0.", labels=["node"])
            reboot.add_metric([self.config.node], reboot_required(self.reboot_marker_path))
        yield from families
        yield duration
        yield reboot

    def _families(self, snapshots: list[EngineSnapshot], journal_error: str | None) -> list[Metric]:
        node = self.config.node
        release = self._release()

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])

        made = [(key, _family(key, kind, labels, doc)) for key, kind, labels, doc in ENGINE_FAMILIES]
        gauges = {key: f for key, f in made if isinstance(f, GaugeMetricFamily)}
        counters = {key: f for key, f in made if isinstance(f, CounterMetricFamily)}
        infos = {key: f for key, f in made if isinstance(f, InfoMetricFamily)}
        batch = {phase: {key: gauge(EXPORTER_FAMILIES[f"{phase}_batch_{family}"],
                                    f"{what} of the last `{phase.capitalize()} batch` log line{note}.")
                         for key, family, what, note, phases in BATCH_FIGURES if phase in phases}
                 for phase in ("decode", "prefill")}

        for snap in snapshots:
            e = snap.engine
            state = self.state[e.name]
            labels = [node, e.name, e.role]
            m, si = snap.metrics, snap.server_info
            if e.nnodes > 1:
                alive = snap.process is not None and snap.process.view is not None
                gauges["engine_rank_up"].add_metric([*labels, str(e.rank), str(e.nnodes), e.head or ""],
                                                    1.0 if alive else 0.0)
            if e.rank > 0:
                # no HTTP on this rank: its flags (argv) and environment (NCCL included) only
                self._process(snap, labels, gauges, infos)
                continue
            gauges["engine_up"].add_metric(labels, 1.0 if m.error is None and si.error is None else 0.0)
            for endpoint, result in (("metrics", m), ("server_info", si)):
                gauges["engine_scrape_error"].add_metric([*labels, endpoint], 0.0 if result.error is None else 1.0)
                self._note_engine(e, f"fetch {endpoint}", None if result.error is None
                                  else f"GET {e.url}/{endpoint} failed: {result.error}")

            if si.error is None:
                version = si.value.get("version")
                state.sglang_version = str(version) if version is not None else ""
                model = si.value.get("served_model_name")
                state.model = str(model) if model is not None else ""
            infos["engine_info"].add_metric(labels, {
                "cluster": self.config.cluster,
                "release": release,
                "sglang_version": state.sglang_version,
                "planned_sglang_version": e.sglang_version,
                "unit": e.unit or "",
                "model": state.model,
            })

            self._process(snap, labels, gauges, infos)
            for figure, value in recorded_shape(self.shapes_dir, e.unit).items():
                gauges["engine_shape_recorded"].add_metric([*labels, figure], float(value))
            last = engineshape.read_json(Path(self.shapes_dir) / e.unit / engineshape.LAST) if e.unit else None
            if (verdict := engineshape.weights_verdict(last)) is not None:
                gauges["engine_weights_info"].add_metric(
                    [*labels, *(verdict[k] for k in ("status", "recorded", "now", "problem"))], 1.0)
            if (jit_dir := jitcache.engine_dir_of(e.env_dict)) is not None:
                judged = jitcache.judge(jit_dir)
                gauges["engine_jit_caches_warm"].add_metric([*labels, jit_dir, judged["why"]],
                                                            1.0 if judged["state"] == "warm" else 0.0)
                if judged["extra_s"] is not None:
                    gauges["engine_jit_cold_start_extra_seconds"].add_metric(
                        [*labels, jit_dir, judged["extra_from"]], float(judged["extra_s"]))
            if (model_dir := residency.model_dir_of(e.argv)) is not None:
                got = self._residency(e, model_dir)
                if got is not None and got["files"]:
                    gauges["engine_weights_page_cache_ratio"].add_metric([*labels, model_dir], got["ratio"])
                    gauges["engine_weights_bytes"].add_metric([*labels, model_dir], float(got["bytes"]))

            if m.error is None:
                figures = m.value
                for family, key in (("engine_running_requests", "running_requests"),
                                    ("engine_queued_requests", "queued_requests"),
                                    ("engine_token_usage_ratio", "token_usage"),
                                    ("engine_gen_throughput_tokens_per_second", "gen_throughput"),
                                    ("engine_prompt_tokens", "prompt_tokens"),
                                    ("engine_generation_tokens", "generation_tokens")):
                    if key in figures:
                        (gauges[family] if family in gauges else counters[family]).add_metric(labels, figures[key])
                for queue, value in sorted(figures["pd_queues"].items()):
                    gauges["engine_pd_queue_requests"].add_metric([*labels, queue], value)
                # SGLang creates both failure counters on their first increment (metric catalogue: lazy), so an
                # engine page without them means "none failed yet": 0, which lets increase() see the first one
                failures = figures["kv_transfer_failures"]
                for stage in KV_FAILURE_STAGES:
                    counters["engine_kv_transfer_failures"].add_metric([*labels, stage], failures.get(stage, 0.0))
                for mode, value in sorted(figures["cuda_graph_passes"].items()):
                    phase, _, kind = mode.partition("_")
                    counters["engine_forward_passes"].add_metric(
                        [*labels, phase, "true" if kind == "cuda_graph" else "false"], value)
                r = decode_cuda_graph_ratio(figures["cuda_graph_passes"])
                if r is not None:
                    gauges["decode_cuda_graph_ratio"].add_metric(labels, r)

            for kind, fams in batch.items():
                last_line = state.last_batch.get(kind)
                if last_line is None:
                    continue
                line_figures, stamp = last_line
                for key, fam in fams.items():
                    if key == "timestamp":
                        fam.add_metric(labels, stamp)
                    elif key in line_figures:
                        fam.add_metric(labels, float(line_figures[key]))

        out: list[Metric] = [f for _, f in made]
        for fams in batch.values():
            out.extend(fams.values())
        if self.journal is not None:
            jerr = gauge_node(EXPORTER_FAMILIES["exporter_journal_error"],
                              "1 when this scrape could not read the engines' "
                              "journal (the exporter's user needs group systemd-journal).")
            jerr.add_metric([node], 0.0 if journal_error is None else 1.0)
            out.append(jerr)
        return out

    def _gpu_health(self, snapshots: list[EngineSnapshot]) -> list[Metric]:
        """The last GPU health probe's answer per engine GPU, and whether it could tell (the probe runs in
        the background, pdkit.agent.exporter.gpuhealth.GpuProbe: a scrape never waits for nvidia-smi)."""
        assert self.gpu_probe is not None
        node = self.config.node
        last, stale = self.gpu_probe.poll()
        # the node's engines run: a busy GPU with no process listed is theirs (another PID namespace)
        serving = any(s.process is not None and s.process.view is not None for s in snapshots)
        wedged = GaugeMetricFamily(EXPORTER_FAMILIES["engine_gpu_wedged"],
                                   "1 when a GPU the engine uses needs a reset before an engine "
                                   "may use it (the preflight's GPU health probe, at most once a minute: a reset-class "
                                   "Xid, pending page retirement or row remap, GPU Recovery Action), 0 when healthy; "
                                   "`seen` says what was seen.", labels=[*LABELS, "gpu", "bdf", "seen"])
        error = GaugeMetricFamily(EXPORTER_FAMILIES["exporter_gpu_probe_error"],
                                  "1 when the node's GPU health probe could not tell (it "
                                  "hung, failed, or read no nvidia-smi -q; `why`), else 0.", labels=["node", "why"])
        if last is None and stale is None:
            return []  # the first probe is still running: nothing to say yet
        why = stale
        if last is not None:
            for e in self.config.engines:
                states, cannot_tell = judge(last, e.gpus, engines_serving=serving)
                why = why or cannot_tell
                for g in states:
                    wedged.add_metric([node, e.name, e.role, str(g.gpu), g.bdf, g.seen], 1.0 if g.wedged else 0.0)
            if not self.config.engines:
                why = why or judge(last, (), engines_serving=serving)[1]
        self._note_node("gpu health", why)
        error.add_metric([node, why or ""], 1.0 if why else 0.0)
        return [wedged, error]

    def _residency(self, engine: EngineConfig, model_dir: str) -> dict[str, Any] | None:
        """pdkit.agent.residency over MODEL_DIR's weight files, measured at most every RESIDENCY_EVERY_S (a big
        model's mincore vector is MBs), the last result in between; None when it cannot be read."""
        now = time.monotonic()
        last = self._residency_cache.get(model_dir)
        if last is not None and now - last[0] < RESIDENCY_EVERY_S:
            return last[1]
        try:
            got: dict[str, Any] | None = residency.residency(residency.weight_files(model_dir))
            self._note_engine(engine, "weights residency", None)
        except OSError as exc:
            got = None
            self._note_engine(engine, "weights residency", f"cannot measure {model_dir}: {exc}")
        self._residency_cache[model_dir] = (now, got)
        return got

    def _process(self, snap: EngineSnapshot, labels: list[str], gauges: dict[str, GaugeMetricFamily],
                 infos: dict[str, InfoMetricFamily]) -> None:
        """What every rank's process is checked for, whether it serves HTTP or not: its flags and its environment."""
        self._flags(snap, labels, gauges["engine_flags_drift"], infos["engine_flag_drift_info"],
                    gauges["engine_flags_unverified"])
        self._env(snap, labels, gauges["engine_env_present"], gauges["engine_env_check_error"],
                  infos["engine_env_mismatch_info"])

    def _flags(self, snap: EngineSnapshot, labels: list[str], drift: GaugeMetricFamily,
               drift_info: InfoMetricFamily, unverified: GaugeMetricFamily) -> None:
        e = snap.engine
        state = self.state[e.name]
        info = snap.server_info.value if snap.server_info.error is None else None
        view = snap.process.view if snap.process is not None else None
        # both inputs are fixed for the life of the engine process: compare once per process
        cached = state.flag_cache
        if cached is not None and cached[0] is info and cached[1] is view:
            result = cached[2]
        else:
            result = flag_findings(e, info, view)
            state.flag_cache = (info, view, result)
        checked, unverified_count, drifted = result
        if unverified_count is not None:
            unverified.add_metric(labels, float(unverified_count))
        if checked:
            drift.add_metric(labels, 1.0 if drifted else 0.0)
            for flag in sorted(drifted):
                drift_info.add_metric(labels, {"flag": flag})
        self._note_engine(e, "drift", "flags differ from the plan: " + "; ".join(drifted[f] for f in sorted(drifted))
                          if drifted else None)

    def _env(self, snap: EngineSnapshot, labels: list[str], present: GaugeMetricFamily,
             error: GaugeMetricFamily, mismatch: InfoMetricFamily) -> None:
        e = snap.engine
        check = snap.process
        if check is None or check.error is not None or check.view is None or check.view.environ is None:
            error.add_metric(labels, 1.0)
            detail = (check.detail or check.error) if check is not None else "no process check"
            self._note_engine(e, "env", f"environment not checked: {detail}")
            return
        error.add_metric(labels, 0.0)
        problems = env_problems(e.env_dict, check.view.environ)
        present.add_metric(labels, 0.0 if problems else 1.0)
        for var, problem in sorted(problems.items()):
            mismatch.add_metric(labels, {"var": var, "problem": problem})
        self._note_engine(e, "env", None if not problems else f"PID {check.view.pid} lacks the planned environment: "
                          + ", ".join(f"{v} {p}" for v, p in sorted(problems.items())))


def flag_findings(e: EngineConfig, info: dict[str, Any] | None,
                  view: ProcessView | None) -> tuple[bool, int | None, dict[str, str]]:
    """(whether anything could be checked, planned flags /server_info does not report,
    {drifted flag: what differs}) from /server_info and the process argv."""
    drifted: dict[str, str] = {}
    checked = False
    unverified_count = None
    if info is not None:
        checked = True
        result: FlagCheck = compare_server_info(e.argv, info, e.drift_ignore)
        unverified_count = len(result.unverified)
        for flag in result.drifted:
            drifted[flag] = "server_info " + describe(flag, e.argv, info.get(flag_key(flag)))
    if view is not None and view.cmdline:
        checked = True
        running_args = engine_args(view.cmdline)
        running_opts = argv_options(running_args)
        for flag in cmdline_drift(e.argv, running_args, e.drift_ignore):
            opt = running_opts.get(flag_key(flag))
            shown = "(absent)" if opt is None else " ".join(opt.values) or "(set)"
            drifted.setdefault(flag, f"argv of PID {view.pid} " + describe(flag, e.argv, shown))
    return checked, unverified_count, drifted


def recorded_shape(shapes_dir: str, unit: str | None) -> dict[str, int]:
    """The figures the engine gate last compared UNIT with (its configuration's record: last.json, 0644,
    written by the gate as root), those it reports; {} when nothing is recorded or no unit is known."""
    if not unit:
        return {}
    last = engineshape.read_json(Path(shapes_dir) / unit / engineshape.LAST) or {}
    recorded = last.get("recorded")
    if not isinstance(recorded, dict):
        return {}
    return {k: v for k, v in recorded.items() if k in engineshape.FIGURES and isinstance(v, int)
            and not isinstance(v, bool)}


def gauge_node(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["node"])


__all__ = ["EngineSnapshot", "Fetch", "PdkitCollector", "cumulative_total", "http_get", "new_session",
           "prepare_get", "server_info_due"]
