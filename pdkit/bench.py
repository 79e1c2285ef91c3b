"""`pdkit bench` and `pdkit compare`: measure the cluster through its router, keep every run.

`pdkit bench INVENTORY --concurrency 1,16,64 --input-len N --output-len N --requests N` sends
streaming requests through the cluster's router (the first router host of the spec) with a
fixed input and output length, after a warm-up, and reports per concurrency level: output
tok/s, requests/s, TTFT, TPOT, ITL (mean, p50, p99) and errors. The maths is in
pdkit.benchstats.

Requests go to SGLang's native `/generate` with `input_ids` (exactly N input tokens; the
router refuses token ids on /v1/completions) and `sampling_params` `max_new_tokens` = output
length with `ignore_eos: true` (SGLang keeps generating past EOS; the sim always produces
exactly max_new_tokens). Every streamed chunk carries `meta_info.completion_tokens`, so output
tokens are counted by the server, not guessed from text. A request that ends with another
number of output tokens than asked for counts as an error.

`--limit HOST` (repeatable) benches only those hosts' own engines: each request goes to one of
their PD pairs directly, in the form the router gives it (pdkit.tune.measure), the pairs in turn.
Through the router, smg's load-aware decode policy (power_of_two) moves load off a slow engine, so
a change on one node of several barely moves the cluster's figure; a limited bench measures that
node's pairs alone. Its record says so (env.measured.via "engines") and `pdkit doctor` never takes
it as the cluster's baseline.

`--engine-bench sglang` runs SGLang's own `python -m sglang.benchmark.serving` (random dataset,
`--random-range-ratio 1` for fixed lengths, one run per concurrency) against the router and
reads its `--output-file` JSONL into the same record.

Each run is one JSON line appended to OUT/runs.jsonl (default docs/bench/), plus
OUT/<id>.md (markdown table) and OUT/<id>.png (throughput and TPOT against concurrency).

Record schema (version 1):
    schema        1
    id            "<UTC time %Y%m%dT%H%M%SZ>-<label or 'run'>", unique per run
    label         free text from --label ("" if none)
    time          ISO-8601 UTC start time
    tool          "pdkit" | "sglang.benchmark.serving"
    inventory     the inventory path given
    cluster       cluster name; model: served model name; router_url
    input_len, output_len, requests (per level), warmup (requests before the first level)
    levels[]      one per concurrency, in the order run:
        concurrency, requests, completed, errors, error_samples (up to 3 messages),
        failures {kind: n} (pdkit.benchstats.failure_kind: "status 503", "hang", "aborted",
        "empty (stop)", "short (length)", ...), failed_finish_reasons {finish reason the failed
        streams named, "error 500" for an error event: n}, failed_workers {the router's
        x-smg-routed-worker-id, "unknown" where it sends none: n}. Records written before these
        three keys have none of them: readers treat them as unknown, not as zero
        duration_s (wall time of the level), input_tokens, output_tokens,
        output_tok_s, requests_s,
        ttft_ms, tpot_ms, itl_ms, e2e_ms: {"mean", "p50", "p99"} in ms (null when no data)
        kv              (PD clusters) the level's KV hand-offs, from every measured prefill's
                        /metrics read just before and just after the level: pdkit.kvcost.KvFigures
                        .as_record() (transfers, mb_per_request (MiB), latency_mean_ms,
                        latency_p99_ms + latency_p99_above_buckets (past SGLang's 5,000 ms top
                        bucket: a floor, shown ">5000"), effective_gb_s (ratio of sums),
                        sglang_speed_mean_gb_s, ttft_share (KV latency mean / the level's TTFT
                        mean)) plus "prefills" (those read both times) and "unread" {prefill: why}
                        when some /metrics could not be read (none read: no figure keys).
                        --engine-bench sglang adds "warmup_included": its run's warm-up requests
                        fall inside the window. Absent on unified engines and older records
        goodput         only when SLOs were given (`pdkit tune`'s goodput objective):
                        {"requests_s", "good", "attainment", "slo_ms"} (pdkit.benchstats.goodput)
    kv_prefills   the prefills whose /metrics give the levels' kv ([]: unified engines, no PD
                  hand-off); absent from records written before the KV figures
    env           environment fingerprint:
        spec_hash       sha256 over every host's planned release hash (pdkit.plan)
        engine          "sim" | "sglang" (cluster.engine)
        sglang_versions planned SGLang version(s), sorted
        router          "<package> <version>" of the first router host
        gpus[]          {"host", "gpu" (nvidia|none), "model", "count", "driver"}; driver from one
                        SSH `nvidia-smi` per GPU node (strict host keys), "n/a" on `gpu: none`
                        hosts, "unknown: <why>" when it could not be read, "not probed" with --no-ssh
        engine_flags    {"<host>/<engine>": the sglang argv pdkit plans (pdkit.flags.sglang_args)}
        measured        what the requests went to: {"via": "router", "router_url", "engines": the
                        router's workers} for `pdkit bench`; `pdkit bench --limit` and `pdkit tune`
                        on part of the cluster bench those hosts' own engines: {"via": "engines", "hosts", "engines",
                        "routes": ["<prefill>+<decode>" PD pairs or unified engines]} (docs/tune.md)

Public helpers (used by `pdkit doctor`): load_runs(path), run_bench(spec, ...), fingerprint(spec).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the client sits in pdkit.benchclient (pdkit.tune.measure sends with it too); its names stay importable from here
from pdkit.benchclient import router_target, stream_one
from pdkit.benchstats import RequestResult, ratio, summarize_level
from pdkit.tune.measure import measured_for

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

SCHEMA_VERSION = 1
DEFAULT_OUT = "docs/bench"
RUNS_FILE = "runs.jsonl"
EXIT_INVALID = 2
# Prompt token ids are drawn from this range: inside every real vocabulary (and the sim's 32000),
# clear of the low special-token ids.
PROMPT_TOKEN_RANGE = (1000, 30000)
SSH_TIMEOUT_S = 20
NVIDIA_SMI_DRIVER = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"


# ---- the environment fingerprint -------------------------------------------------------------

def spec_hash(spec: ClusterSpec) -> str:
    """sha256 over every host's planned release hash: equal hashes mean the same rendered cluster."""
    from pdkit.plan import plan_cluster

    digest = hashlib.sha256()
    for host, plan in sorted(plan_cluster(spec).items()):
        digest.update(f"{host}\0{plan.release_hash}\n".encode())
    return digest.hexdigest()


def engine_flags(spec: ClusterSpec) -> dict[str, list[str]]:
    """The planned sglang argv of every engine, keyed host/engine."""
    from pdkit.flags import sglang_args

    return {f"{h.name}/{e.name}": sglang_args(spec, h, e) for h, e in spec.engines()}


def ssh_command(host_data: dict[str, Any], remote: str) -> list[str]:
    """OpenSSH argv for one command on a host from its pyinfra SSH data; host keys always checked."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={SSH_TIMEOUT_S}"]
    if host_data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={host_data['ssh_known_hosts_file']}"]
    if host_data.get("ssh_key"):
        argv += ["-i", str(host_data["ssh_key"]), "-o", "IdentitiesOnly=yes"]
    if host_data.get("ssh_port"):
        argv += ["-p", str(host_data["ssh_port"])]
    target = str(host_data.get("ssh_hostname") or host_data["name"])
    if host_data.get("ssh_user"):
        target = f"{host_data['ssh_user']}@{target}"
    return argv + ["--", target, remote]


def parse_driver_versions(text: str) -> str:
    """nvidia-smi's one-version-per-GPU output -> the version ("a, b" if GPUs disagree)."""
    versions = sorted({line.strip() for line in text.splitlines() if line.strip()})
    return ", ".join(versions) if versions else "unknown: nvidia-smi printed nothing"


def probe_driver(host_data: dict[str, Any], run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """The NVIDIA driver version of one host over SSH, or "unknown: <why>"."""
    try:
        done = run(ssh_command(host_data, NVIDIA_SMI_DRIVER), capture_output=True, text=True,
                   timeout=SSH_TIMEOUT_S + 10)
    except FileNotFoundError:
        # seen on the lent GPU machine, whose image has no OpenSSH client (pyinfra uses paramiko)
        return "unknown: no `ssh` client on this machine (install openssh-client, or pass --no-ssh)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown: {type(exc).__name__}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"unknown: {why[:120]}"
    return parse_driver_versions(done.stdout)


def _inventory_ssh_data(inventory: str) -> dict[str, dict[str, Any]]:
    from pdkit.loader import read_inventory

    return {name: {**data, "name": name} for name, _groups, data in read_inventory(inventory, os.getcwd())}


def fingerprint(spec: ClusterSpec, probe_drivers: bool = True) -> dict[str, Any]:
    """What the numbers depend on: plans, versions, GPUs and driver, engine flags."""
    router_hosts = spec.router_hosts
    router = " ".join(spec.router_release(router_hosts[0])) if router_hosts else "none"
    nvidia_hosts = [h for h in spec.gpu_hosts if h.node is not None and h.node.gpu == "nvidia"]
    ssh_data = _inventory_ssh_data(spec.inventory) if (probe_drivers and nvidia_hosts and spec.inventory) else {}
    gpus = []
    for host in spec.gpu_hosts:
        node = host.node
        assert node is not None
        if node.gpu == "none":
            driver = "n/a"
        elif not probe_drivers:
            driver = "not probed"
        elif host.name in ssh_data:
            driver = probe_driver(ssh_data[host.name])
        else:
            driver = "unknown: no SSH data for this host"
        gpus.append({"host": host.name, "gpu": node.gpu, "model": node.gpus.model, "count": node.gpus.count,
                     "driver": driver})
    return {
        "spec_hash": spec_hash(spec),
        "engine": spec.cluster.engine,
        "sglang_versions": sorted({spec.engine_version(e) for _, e in spec.engines()}),
        "router": router,
        "gpus": gpus,
        "engine_flags": engine_flags(spec),
    }


# ---- the client ------------------------------------------------------------------------------

def served_model(spec: ClusterSpec) -> str:
    model = spec.cluster.model
    return model.served_name or model.path


def prompt_ids(seed: int, input_len: int) -> list[int]:
    """A deterministic prompt of exactly input_len token ids (distinct per seed: no prefix-cache hits)."""
    rng = random.Random(seed)
    return [rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(input_len)]


def generate_body(seed: int, input_len: int, output_len: int) -> dict[str, Any]:
    """A native /generate request with fixed input and output lengths."""
    return {
        "input_ids": prompt_ids(seed, input_len),
        "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }


class Progress:
    """A one-line progress bar on stderr (a line per quarter when stderr is not a terminal)."""

    def __init__(self, title: str, total: int, enabled: bool = True, stream=None) -> None:
        self.title, self.total, self.enabled = title, total, enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.errors = 0
        self._last_draw = 0.0
        self._last_quarter = 0

    def step(self, ok: bool) -> None:
        self.done += 1
        self.errors += 0 if ok else 1
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw > 0.1 or self.done == self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
        else:
            quarter = self.done * 4 // max(self.total, 1)
            if quarter > self._last_quarter:
                self._last_quarter = quarter
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def line(self) -> str:
        width = 30
        filled = width * self.done // max(self.total, 1)
        return (f"{self.title} [{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total}"
                f"  errors {self.errors}")

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


# Sends one request of a level: (aiohttp session, request index, body, output_len, timeout_s) -> result.
# The default streams it to the router's /generate; `pdkit tune` gives one that sends it to chosen
# engines (pdkit.tune.measure: the target's own PD pairs).
Sender = Callable[[Any, int, dict[str, Any], int, float], Awaitable[RequestResult]]


def router_sender(url: str, headers: dict[str, str]) -> Sender:
    """The Sender that streams every request to URL (the router's /generate)."""
    async def send(session, _index: int, body: dict[str, Any], output_len: int, timeout_s: float) -> RequestResult:
        return await stream_one(session, url, headers, body, output_len, timeout_s)

    return send


def router_measured(spec: ClusterSpec, router_url: str) -> dict[str, Any]:
    """What a bench through the router measures: the engines it fronts (env.measured of a record)."""
    router = spec.router_hosts[0]
    return {"via": "router", "router_url": router_url,
            "engines": sorted(f"{h.name}/{e.name}" for h, e in spec.router_workers(router))}


# ---- the KV hand-off of each level (PD clusters) -------------------------------------------

KV_SCRAPE_TIMEOUT_S = 5.0
NO_PD_HANDOFF = "no PD hand-off: the measured engines are unified (no prefill hands KV to a decode)"


def kv_prefills(spec: ClusterSpec, measured: dict[str, Any]) -> dict[str, str | None]:
    """The prefills whose KV hand-offs a bench's requests cause: {host/engine: engine URL}, in the
    measured engines' order. Through the router: every prefill it fronts; to the engines directly:
    the prefill of each PD route. None for a label the spec does not name (its /metrics cannot be
    found); {} when nothing measured is a PD pair (unified engines: no hand-off)."""
    from pdkit.flags import engine_url

    urls = {f"{h.name}/{e.name}": engine_url(spec, h, e) for h, e in spec.engines() if e.role == "prefill"}
    if measured.get("via", "router") == "router":
        labels = [e for e in measured.get("engines") or [] if e in urls]
    else:
        labels = [route.split("+", 1)[0] for route in measured.get("routes") or [] if "+" in route]
    return {label: urls.get(label) for label in dict.fromkeys(labels)}


# One sample of every prefill: (histograms by prefill, why by prefill whose /metrics could not be read)
KvSample = tuple[dict[str, Any], dict[str, str]]


def scrape_kv(prefills: dict[str, str | None], timeout_s: float = KV_SCRAPE_TIMEOUT_S) -> KvSample:
    """GET every prefill's /metrics at once and read its KV histograms (pdkit.kvcost). Engines
    take no API key in pdkit (only the router has one), so no header is sent."""
    from concurrent.futures import ThreadPoolExecutor

    from pdkit.health import http_request
    from pdkit.kvcost import kv_histograms

    def one(item: tuple[str, str | None]) -> tuple[str, Any, str | None]:
        label, url = item
        if url is None:
            return label, None, "not an engine of the inventory: its /metrics address is unknown"
        status, body = http_request(f"{url}/metrics", timeout=timeout_s)
        if status != 200:
            why = f"HTTP {status}: {body.strip()[:120]}" if status else (body.strip()[:160] or "no answer")
            return label, None, f"{url}/metrics: {why}"
        try:
            return label, kv_histograms(body), None
        except ValueError as exc:
            return label, None, f"{url}/metrics: unreadable: {str(exc)[:120]}"

    pages: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if not prefills:
        return pages, errors
    with ThreadPoolExecutor(max_workers=min(16, len(prefills))) as pool:
        for label, page, why in pool.map(one, prefills.items()):
            if why is None:
                pages[label] = page
            else:
                errors[label] = why
    return pages, errors


def level_kv(before: KvSample, after: KvSample, ttft_mean_ms: float | None) -> dict[str, Any]:
    """Pure: a level's `kv` block from the prefills' samples before and after it.

    Each prefill's window is its own difference (a restarted one counts from zero), the prefills'
    windows are combined, and pdkit.kvcost.kv_figures gives the figures, with the level's
    client-side TTFT mean for the KV share. `prefills`: those read both times; `unread`: why the
    others gave nothing (the figures then cover the read ones only; none read: no figures)."""
    from pdkit.kvcost import combine, kv_figures

    unread = {**after[1], **before[1]}
    read = [label for label in after[0] if label in before[0] and label not in unread]
    out: dict[str, Any] = {"prefills": read}
    if read:
        windows = [{key: h.minus(before[0][label].get(key)) for key, h in after[0][label].items()} for label in read]
        out.update(kv_figures({}, combine(windows), ttft_mean_ms).as_record())
    if unread:
        out["unread"] = dict(sorted(unread.items()))
    return out


def say_kv_unread(concurrency: int, kv: dict[str, Any]) -> None:
    """One stderr line when a level's prefills could not all be read (the record keeps why)."""
    if kv.get("unread"):
        which = "; ".join(f"{label}: {why}" for label, why in kv["unread"].items())
        scope = "no KV figures" if not kv.get("prefills") else f"KV figures from {', '.join(kv['prefills'])} only"
        print(f"bench: C={concurrency}: {scope}: /metrics not read on {which}", file=sys.stderr)


async def run_level(url: str, headers: dict[str, str], concurrency: int, requests: int, input_len: int,
                    output_len: int, timeout_s: float, seed: int, progress: Progress | None = None,
                    send: Sender | None = None) -> tuple[list[RequestResult], float]:
    """`requests` requests, `concurrency` in flight at any time; returns the results and the wall time.
    SEND: how each request goes out (default: streamed to URL)."""
    import asyncio

    import aiohttp

    send = send or router_sender(url, headers)

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[RequestResult] = []

    async def worker(session) -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result = await send(session, i, generate_body(seed + i, input_len, output_len), output_len, timeout_s)
            results.append(result)
            if progress is not None:
                progress.step(result.ok)

    # two connections per request: a sender that talks to a PD pair itself holds a prefill's and a
    # decode's at once (with one per request, C decodes could wait for prefills that never get one)
    connector = aiohttp.TCPConnector(limit=2 * concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(min(concurrency, requests))))
        duration = time.perf_counter() - start
    return results, duration


def run_id(started: datetime, label: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:40] or "run"
    return f"{started:%Y%m%dT%H%M%SZ}-{slug}"


def _record_head(spec: ClusterSpec, tool: str, label: str, input_len: int, output_len: int, requests: int,
                 warmup: int, probe_drivers: bool, router_url: str, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    started = datetime.now(UTC)
    env = fingerprint(spec, probe_drivers=probe_drivers)
    env["measured"] = measured or router_measured(spec, router_url)
    return {
        "schema": SCHEMA_VERSION,
        "id": run_id(started, label),
        "label": label,
        "time": started.isoformat(timespec="seconds"),
        "tool": tool,
        "inventory": spec.inventory,
        "cluster": spec.cluster.name,
        "model": served_model(spec),
        "router_url": router_url,
        "input_len": input_len,
        "output_len": output_len,
        "requests": requests,
        "warmup": warmup,
        "levels": [],
        "env": env,
    }


def run_bench(spec: ClusterSpec, concurrency: Sequence[int] = (16,), input_len: int = 512, output_len: int = 128,
              requests: int = 64, warmup: int = 4, label: str = "", timeout_s: float = 300.0,
              probe_drivers: bool = True, progress: bool = True, seed: int = 0,
              send: Sender | None = None, measured: dict[str, Any] | None = None,
              prefills: dict[str, str | None] | None = None,
              goodput_slo: dict[str, float] | None = None) -> dict[str, Any]:
    """Run the pdkit client through the spec's router at each concurrency; return the record.

    SEND and MEASURED (together) bench chosen engines instead: SEND sends each request, MEASURED
    says what it measures (env.measured; default: the router and the engines it fronts).
    PREFILLS: {label: engine URL} whose /metrics give each level's KV figures (default: the
    measured PD pairs' prefills, kv_prefills). GOODPUT_SLO: {"ttft_ms", "tpot_ms"}: each level
    also records its goodput (pdkit.benchstats.goodput)."""
    import asyncio

    if (send is None) != (measured is None):
        raise ValueError("run_bench: give send and measured together (what is sent, and what that measures)")
    check_workload(spec, input_len, output_len, requests, warmup)
    router_url, headers = router_target(spec)
    record = _record_head(spec, "pdkit", label, input_len, output_len, requests, warmup, probe_drivers, router_url, measured)
    if prefills is None:
        prefills = kv_prefills(spec, record["env"]["measured"])
    record["kv_prefills"] = list(prefills)
    url = f"{router_url}/generate"
    if warmup:
        bar = Progress("warm-up", warmup, progress)
        results, _ = asyncio.run(run_level(url, headers, max(concurrency), warmup, input_len, output_len,
                                           timeout_s, seed + 1_000_000, bar, send))
        bar.close()
        failed = [r for r in results if not r.ok]
        if len(failed) == len(results):
            where = router_url if measured is None else ", ".join(measured.get("routes") or measured.get("engines") or [])
            raise RuntimeError(f"every warm-up request through {where} failed: {failed[0].error}")
    for level_index, c in enumerate(concurrency):
        bar = Progress(f"C={c:<4}", requests, progress)
        before = scrape_kv(prefills)
        results, duration = asyncio.run(run_level(url, headers, c, requests, input_len, output_len, timeout_s,
                                                  seed + level_index * requests, bar, send))
        after = scrape_kv(prefills)
        bar.close()
        level = summarize_level(results, duration, c, goodput_slo)
        if prefills:
            level["kv"] = level_kv(before, after, level["ttft_ms"]["mean"])
            say_kv_unread(c, level["kv"])
        record["levels"].append(level)
    return record


def check_workload(spec: ClusterSpec, input_len: int, output_len: int, requests: int, warmup: int) -> None:
    """Refuse a workload that cannot run, before any request is sent."""
    if input_len < 1 or output_len < 1:
        raise ValueError("--input-len and --output-len must be at least 1")
    if requests < 1 or warmup < 0:
        raise ValueError(f"--requests must be at least 1 (got {requests}) and --warmup at least 0 (got {warmup})")
    limits = [t.context_length for t in (spec.engine_tuning(e) for _, e in spec.engines()) if t.context_length]
    if limits and input_len + output_len > min(limits):
        raise ValueError(f"--input-len + --output-len = {input_len + output_len} exceeds the planned "
                         f"context length {min(limits)} (cluster tuning context_length)")


# ---- SGLang's own benchmark ------------------------------------------------------------------

SGLANG_BENCH_MODULE = "sglang.benchmark.serving"


def _ms(result: dict[str, Any], metric: str) -> dict[str, float | None]:
    return {"mean": result.get(f"mean_{metric}_ms"), "p50": result.get(f"median_{metric}_ms"),
            "p99": result.get(f"p99_{metric}_ms")}


def level_from_sglang_result(result: dict[str, Any], requests: int | None = None) -> dict[str, Any]:
    """One line of sglang.benchmark.serving's --output-file (0.5.23 keys) -> a levels[] entry.

    The result line has no prompt count: `requests` is the --num-prompts we passed; without it,
    the `errors` list that --output-details adds, else completed (errors unknown -> 0).
    """
    completed = int(result["completed"])
    error_list = [e for e in (result.get("errors") or []) if e]
    if requests is None:
        requests = len(result["errors"]) if isinstance(result.get("errors"), list) else completed
    return {
        "concurrency": result.get("max_concurrency"),
        "requests": requests,
        "completed": completed,
        "errors": requests - completed,
        "error_samples": list(dict.fromkeys(str(e)[:200] for e in error_list))[:3],
        "duration_s": result["duration"],
        "input_tokens": result.get("total_input_tokens"),
        "output_tokens": result.get("total_output_tokens"),
        "output_tok_s": result["output_throughput"],
        "requests_s": result["request_throughput"],
        "ttft_ms": _ms(result, "ttft"),
        "tpot_ms": _ms(result, "tpot"),
        "itl_ms": _ms(result, "itl"),
        "e2e_ms": _ms(result, "e2e_latency"),
    }


def read_sglang_results(path: str | Path, requests: int | None = None) -> list[dict[str, Any]]:
    """Every result line of an sglang.benchmark.serving --output-file, as levels[] entries."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    return [level_from_sglang_result(json.loads(line), requests) for line in lines]


def sglang_bench_available(python: str) -> bool:
    """True when `python` can import sglang.benchmark.serving (without running it)."""
    # find_spec of a submodule imports its parent package, and raises when that is missing
    probe = ("import importlib.util, sys\n"
             f"try:\n    found = importlib.util.find_spec({SGLANG_BENCH_MODULE!r}) is not None\n"
             "except ImportError:\n    found = False\n"
             "sys.exit(0 if found else 1)\n")
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def sglang_bench_command(python: str, router_url: str, model: str, tokenizer: str | None, concurrency: int,
                         requests: int, input_len: int, output_len: int, warmup: int, output_file: str) -> list[str]:
    """argv of one `python -m sglang.benchmark.serving` run at one concurrency (fixed lengths)."""
    argv = [python, "-m", SGLANG_BENCH_MODULE, "--backend", "sglang", "--base-url", router_url,
            # random-ids: token ids drawn locally. `random` samples ShareGPT text it downloads from the
            # hub first, which fails on an offline GPU node (seen on the lent H200)
            "--model", model, "--dataset-name", "random-ids",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "1", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--warmup-requests", str(warmup), "--output-file", output_file,
            # the ids go out as they are (no detokenize/retokenize round trip): exact input lengths
            "--tokenize-prompt"]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv


def run_sglang_bench(spec: ClusterSpec, concurrency: Sequence[int] = (16,), input_len: int = 512,
                     output_len: int = 128, requests: int = 64, warmup: int = 4, label: str = "",
                     python: str = sys.executable, tokenizer: str | None = None, probe_drivers: bool = True,
                     timeout_s: float = 3600.0) -> dict[str, Any]:
    """SGLang's own serving benchmark through the router, read into a pdkit record."""
    check_workload(spec, input_len, output_len, requests, warmup)
    if not sglang_bench_available(python):
        raise RuntimeError(f"{python} cannot import {SGLANG_BENCH_MODULE}: install sglang there, or give "
                           "--sglang-python of a virtualenv that has it, or use --engine-bench pdkit")
    router_url, headers = router_target(spec)
    record = _record_head(spec, SGLANG_BENCH_MODULE, label, input_len, output_len, requests, warmup,
                          probe_drivers, router_url)
    prefills = kv_prefills(spec, record["env"]["measured"])
    record["kv_prefills"] = list(prefills)
    env = dict(os.environ)
    if "Authorization" in headers:
        # serving.py's get_auth_headers() reads OPENAI_API_KEY: the key stays out of argv
        env["OPENAI_API_KEY"] = headers["Authorization"].removeprefix("Bearer ")
    with tempfile.TemporaryDirectory(prefix="pdkit-bench-") as tmp:
        for c in concurrency:
            out_file = str(Path(tmp) / f"c{c}.jsonl")
            argv = sglang_bench_command(python, router_url, served_model(spec), tokenizer, c, requests,
                                        input_len, output_len, warmup, out_file)
            print(f"C={c}: {shlex.join(argv)}", file=sys.stderr)
            before = scrape_kv(prefills)
            done = subprocess.run(argv, env=env, timeout=timeout_s)
            after = scrape_kv(prefills)
            if done.returncode != 0 or not Path(out_file).is_file():
                raise RuntimeError(f"{SGLANG_BENCH_MODULE} failed at concurrency {c} (exit {done.returncode})")
            levels = read_sglang_results(out_file, requests)
            if prefills and len(levels) == 1:
                # the window holds the run's own --warmup-requests too (serving.py sends them first)
                levels[0]["kv"] = {**level_kv(before, after, levels[0]["ttft_ms"]["mean"]), "warmup_included": warmup}
                say_kv_unread(c, levels[0]["kv"])
            record["levels"].extend(levels)
    return record


# ---- runs on disk, tables, plots -------------------------------------------------------------

def load_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a runs.jsonl (oldest first); [] when the file does not exist."""
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def append_run(path: str | Path, record: dict[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


def fmt_cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


# the per-level figures, as the run table and `pdkit compare` show them
METRICS = (
    ("output tok/s", lambda lv: lv["output_tok_s"]),
    ("req/s", lambda lv: lv["requests_s"]),
    ("TTFT p50 ms", lambda lv: lv["ttft_ms"]["p50"]),
    ("TTFT p99 ms", lambda lv: lv["ttft_ms"]["p99"]),
    ("TPOT p50 ms", lambda lv: lv["tpot_ms"]["p50"]),
    ("TPOT p99 ms", lambda lv: lv["tpot_ms"]["p99"]),
    ("ITL p50 ms", lambda lv: lv["itl_ms"]["p50"]),
    ("ITL p99 ms", lambda lv: lv["itl_ms"]["p99"]),
)
ERRORS = ("errors", lambda lv: lv["errors"])
LEVEL_COLUMNS = (
    ("C", lambda lv: lv["concurrency"]),
    ("requests", lambda lv: lv["requests"]),
    ERRORS,
    *METRICS,
)


# The KV hand-off figures of a level (its `kv` block: pdkit.kvcost.KvFigures), as the run table and
# `pdkit compare` show them: (column, key in the block)
KV_COLUMNS = (
    ("KV transfers", "transfers"),
    ("KV MB/request", "mb_per_request"),
    ("KV latency mean ms", "latency_mean_ms"),
    ("KV latency p99 ms", "latency_p99_ms"),
    ("KV effective GB/s", "effective_gb_s"),
    ("SGLang speed mean GB/s", "sglang_speed_mean_gb_s"),
    ("KV share of TTFT", "ttft_share"),
)


def kv_text(kv: dict[str, Any], key: str) -> str:
    """One KV figure as shown: p99 past SGLang's top bucket as ">5000" (a floor), the share in %."""
    value = kv.get(key)
    if key == "latency_p99_ms" and value is not None and kv.get("latency_p99_above_buckets"):
        return f">{value:g}"
    if key == "ttft_share" and value is not None:
        return f"{value:.0%}"
    return fmt_cell(value, 2 if key.endswith("gb_s") else 1)


def kv_has_figures(level: dict[str, Any]) -> bool:
    return "transfers" in (level.get("kv") or {})


def render_kv(record: dict[str, Any]) -> list[str]:
    """The run's KV hand-off section: a table per level from the prefills' histograms; "no PD
    hand-off" for unified engines; nothing for a record from before KV figures."""
    if "kv_prefills" not in record:
        return []
    if not record["kv_prefills"]:
        return ["", f"KV hand-off: none to measure ({NO_PD_HANDOFF})."]
    lines = ["", f"KV hand-off per level, from the prefills' own histograms ({', '.join(record['kv_prefills'])}): "
                 "effective GB/s = MiB moved / 1024 / seconds spent moving them (a ratio of sums, queueing "
                 "included); SGLang's speed mean is its histogram's mean of per-request ratios; MB is MiB; "
                 "share of TTFT = KV latency mean / the level's client-side TTFT mean.", "",
             "| C | " + " | ".join(name for name, _ in KV_COLUMNS) + " |",
             "|---:|" + "|".join("---:" for _ in KV_COLUMNS) + "|"]
    notes = []
    for level in record["levels"]:
        kv = level.get("kv") or {}
        if kv_has_figures(level):
            cells = [kv_text(kv, key) for _, key in KV_COLUMNS]
        else:
            cells = ["not read"] + ["–"] * (len(KV_COLUMNS) - 1)
        lines.append(f"| {level['concurrency']} | " + " | ".join(cells) + " |")
        if kv.get("unread"):
            scope = f"figures from {', '.join(kv['prefills'])} only" if kv.get("prefills") else "no figures"
            notes.append(f"- C={level['concurrency']}: /metrics not read ({scope}): "
                         + "; ".join(f"{label}: {why}" for label, why in kv["unread"].items()))
        if kv.get("warmup_included"):
            notes.append(f"- C={level['concurrency']}: the window includes the run's {kv['warmup_included']} warm-up request(s)")
    return lines + ([""] + notes if notes else [])


def render_goodput(record: dict[str, Any]) -> list[str]:
    """One line per level that recorded goodput (pdkit.benchstats.goodput)."""
    lines = []
    for level in record["levels"]:
        g = level.get("goodput")
        if g:
            slo = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in g["slo_ms"].items())
            lines.append(f"- C={level['concurrency']} goodput: {fmt_cell(g['requests_s'], 2)} req/s met {slo} "
                         f"({g['good']} of {level['requests']} requests)")
    return [""] + lines if lines else []


def describe_env(record: dict[str, Any]) -> list[str]:
    env = record["env"]
    gpus = "; ".join(f"{g['host']}: {g['count']}x {g['model']} (gpu: {g['gpu']}, driver {g['driver']})"
                     for g in env["gpus"]) or "none"
    return [
        f"- engine: {env['engine']}, sglang {', '.join(env['sglang_versions']) or 'n/a'}, router {env['router']}",
        f"- GPUs: {gpus}",
        f"- spec hash: `{env['spec_hash'][:16]}`",
    ] + ([f"- measured: {describe_measured(env['measured'])}"] if env.get("measured") else [])


def describe_measured(measured: dict[str, Any]) -> str:
    """env.measured in words: the router and its engines, or the engines sent to directly."""
    if measured.get("via") == "router":
        return f"through the router {measured.get('router_url', '')} over {', '.join(measured.get('engines') or [])}"
    return f"the engines directly, PD pairs {', '.join(measured.get('routes') or [])}"


def sent_to(router_url: str, measured: dict[str, Any] | None) -> str:
    """Where a bench's requests went, for its first line: through the router, or to the pairs directly."""
    measured = measured or {}
    if measured.get("via", "router") == "router":
        return f"through {router_url}"
    return f"to {', '.join(measured.get('routes') or measured.get('engines') or [])} directly (not through the router)"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "–"


def render_markdown(record: dict[str, Any]) -> str:
    """A bench record as a markdown section: what was run, then one table row per concurrency."""
    label = f" — {record['label']}" if record.get("label") else ""
    lines = [
        f"## {record['id']}{label}",
        "",
        f"{record['time']}, `{record['tool']}` {sent_to(record['router_url'], (record.get('env') or {}).get('measured'))}, cluster `{record['cluster']}`, "
        f"model `{record['model']}`: input {record['input_len']} tokens, output {record['output_len']} tokens, "
        f"{record['requests']} requests per level after {record['warmup']} warm-up requests.",
        "",
        *describe_env(record),
        "",
        "| " + " | ".join(name for name, _ in LEVEL_COLUMNS) + " |",
        "|" + "|".join("---:" for _ in LEVEL_COLUMNS) + "|",
    ]
    for level in record["levels"]:
        lines.append("| " + " | ".join(fmt_cell(get(level)) for _, get in LEVEL_COLUMNS) + " |")
    lines += render_goodput(record)
    lines += render_kv(record)
    samples = [s for lv in record["levels"] for s in lv.get("error_samples", [])]
    if samples:
        lines += ["", "Errors (samples): " + "; ".join(dict.fromkeys(samples))]
    for level in record["levels"]:
        if level.get("errors") and level.get("failures"):  # absent from records before the counts
            lines.append(f"- C={level['concurrency']} failures by kind {_counts(level['failures'])}; by finish reason "
                         f"{_counts(level.get('failed_finish_reasons') or {})}; by worker {_counts(level.get('failed_workers') or {})}")
    return "\n".join(lines) + "\n"


def render_plot(records: Sequence[dict[str, Any]], path: str | Path) -> None:
    """PNG: output tok/s and TPOT (p50, p99) against concurrency, one line per record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tput, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
    for record in records:
        levels = sorted(record["levels"], key=lambda lv: lv["concurrency"])
        xs = [lv["concurrency"] for lv in levels]
        name = record.get("label") or record["id"]
        (line,) = ax_tput.plot(xs, [lv["output_tok_s"] for lv in levels], marker="o", label=name)
        color = line.get_color()  # one colour per run on both charts
        ax_tpot.plot(xs, [lv["tpot_ms"]["p50"] for lv in levels], marker="o", color=color, label=f"{name} p50")
        ax_tpot.plot(xs, [lv["tpot_ms"]["p99"] for lv in levels], marker="x", linestyle="--", color=color,
                     label=f"{name} p99")
    ticks = sorted({lv["concurrency"] for record in records for lv in record["levels"]})
    for ax, title, unit in ((ax_tput, "Output throughput", "output tok/s"), (ax_tpot, "TPOT", "ms per token")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    first = records[0]
    fig.suptitle(f"{first['cluster']} ({first['env']['engine']}): in {first['input_len']} / "
                 f"out {first['output_len']} tokens", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(record: dict[str, Any], out_dir: str | Path, plot: bool = True) -> list[Path]:
    """Append the record to OUT/runs.jsonl and write OUT/<id>.md (and OUT/<id>.png)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    append_run(out / RUNS_FILE, record)
    written = [out / RUNS_FILE, out / f"{record['id']}.md"]
    written[1].write_text(render_markdown(record))
    if plot:
        written.append(out / f"{record['id']}.png")
        render_plot([record], written[-1])
    return written


# ---- compare ---------------------------------------------------------------------------------

def find_run(ref: str, runs_path: str | Path) -> dict[str, Any]:
    """A record by file (.json: the record; .jsonl: its last line), else by id, else the latest with that label."""
    p = Path(ref)
    if p.is_file():
        if p.suffix == ".jsonl":
            runs = load_runs(p)
            if not runs:
                raise LookupError(f"{ref}: no runs in this file")
            return runs[-1]
        return json.loads(p.read_text())
    runs = load_runs(runs_path)
    for record in runs:
        if record["id"] == ref:
            return record
    labelled = [r for r in runs if r.get("label") == ref]
    if labelled:
        return labelled[-1]
    known = ", ".join(r["id"] for r in runs[-5:]) or "none"
    raise LookupError(f"{ref!r} is neither a file nor a run id or label in {runs_path} (latest ids: {known})")


COMPARED_METRICS = (*METRICS, ERRORS)


def compare_levels(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per concurrency present in both runs and per metric: A, B and B/A."""
    b_levels = {lv["concurrency"]: lv for lv in b["levels"]}
    rows = []
    for level_a in sorted(a["levels"], key=lambda lv: lv["concurrency"]):
        level_b = b_levels.get(level_a["concurrency"])
        if level_b is None:
            continue
        for name, get in COMPARED_METRICS:
            va, vb = get(level_a), get(level_b)
            rows.append({"concurrency": level_a["concurrency"], "metric": name, "a": va, "b": vb,
                         "ratio": ratio(vb, va)})
        if kv_has_figures(level_a) or kv_has_figures(level_b):
            kv_a, kv_b = level_a.get("kv") or {}, level_b.get("kv") or {}
            for name, key in KV_COLUMNS:
                va, vb = kv_a.get(key), kv_b.get(key)
                # a p99 past the top bucket is a floor: no ratio of floors
                floor = key == "latency_p99_ms" and (kv_a.get("latency_p99_above_buckets") or kv_b.get("latency_p99_above_buckets"))
                rows.append({"concurrency": level_a["concurrency"], "metric": name, "a": va, "b": vb,
                             "ratio": None if floor else ratio(vb, va),
                             "a_text": kv_text(kv_a, key) if kv_has_figures(level_a) else _kv_missing(a, level_a),
                             "b_text": kv_text(kv_b, key) if kv_has_figures(level_b) else _kv_missing(b, level_b)})
    return rows


def _kv_missing(record: dict[str, Any], level: dict[str, Any]) -> str:
    """Why a level has no KV figures, in a compare cell."""
    if "kv_prefills" not in record:
        return "not recorded"
    if not record["kv_prefills"]:
        return "no PD hand-off"
    return "not read"


def argv_options(argv: Sequence[str]) -> dict[str, str]:
    """An argv as {"--flag": "its values"} (a flag takes the tokens up to the next --flag)."""
    options: dict[str, list[str]] = {}
    current = ""
    for token in argv:
        if token.startswith("--"):
            current = token
            options.setdefault(current, [])
        else:
            options.setdefault(current, []).append(token)
    return {flag: " ".join(values) for flag, values in options.items()}


def _option_text(flag: str, value: str) -> str:
    return f"`{flag} {value}`" if value else f"`{flag}`"


def flag_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Engines whose planned argv differs between the runs: options removed, added and changed."""
    flags_a, flags_b = a["env"]["engine_flags"], b["env"]["engine_flags"]
    out = []
    for engine in sorted(set(flags_a) | set(flags_b)):
        before, after = flags_a.get(engine), flags_b.get(engine)
        if before == after:
            continue
        if before is None or after is None:
            out.append(f"{engine}: engine {'added' if before is None else 'removed'}")
            continue
        opts_a, opts_b = argv_options(before), argv_options(after)
        parts = []
        for flag in sorted(set(opts_a) | set(opts_b)):
            shown_a, shown_b = _option_text(flag, opts_a.get(flag, "")), _option_text(flag, opts_b.get(flag, ""))
            if flag not in opts_b:
                parts.append(f"removed {shown_a}")
            elif flag not in opts_a:
                parts.append(f"added {shown_b}")
            elif opts_a[flag] != opts_b[flag]:
                parts.append(f"{shown_a} -> {shown_b}")
        out.append(f"{engine}: " + ("; ".join(parts) or "same options, another order"))
    return out


def render_compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Markdown: the two runs, what differs in their environment, then A, B and B/A per level and metric."""
    def name(r: dict[str, Any]) -> str:
        return f"`{r['id']}`" + (f" ({r['label']})" if r.get("label") else "")

    lines = [f"# pdkit compare: A = {name(a)}, B = {name(b)}", ""]
    for key, label in (("spec_hash", "spec hash"), ("engine", "engine"), ("sglang_versions", "sglang"),
                       ("router", "router"), ("gpus", "GPUs"), ("measured", "measured engines")):
        va, vb = a["env"].get(key), b["env"].get(key)
        if key == "measured" and (va is None or vb is None):
            continue  # a record from before env.measured: unknown, not different
        if va != vb:
            if key == "spec_hash":
                va, vb = va[:16], vb[:16]
            lines.append(f"- {label} differs: A {json.dumps(va)} / B {json.dumps(vb)}")
    changes = flag_changes(a, b)
    lines += [f"- flags {c}" for c in changes]
    for key in ("input_len", "output_len", "requests", "tool"):
        if a.get(key) != b.get(key):
            lines.append(f"- {key} differs: A {a.get(key)} / B {b.get(key)} (not like for like)")
    if len(lines) == 2:
        lines.append("- same spec hash, flags and workload")
    rows = compare_levels(a, b)
    lines += ["", "| C | metric | A | B | B/A |", "|---:|---|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['concurrency']} | {row['metric']} | {row.get('a_text') or fmt_cell(row['a'])} | "
                     f"{row.get('b_text') or fmt_cell(row['b'])} | {fmt_cell(row['ratio'], 2)} |")
    if not rows:
        lines.append("| – | no concurrency level in common | | | |")
    return "\n".join(lines) + "\n"


# ---- CLI -------------------------------------------------------------------------------------

def parse_concurrency(text: str) -> list[int]:
    """'1,16,64' -> [1, 16, 64]; each level a positive integer."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency takes comma-separated positive integers, e.g. 1,16,64; got {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"--concurrency takes comma-separated positive integers, e.g. 1,16,64; got {text!r}")
    return levels


def limited_measure(spec: ClusterSpec, hosts: Sequence[str], engine_bench: str = "pdkit"):
    """What `--limit HOST` benches: those hosts' own PD pairs / unified engines, sent to directly
    (pdkit.tune.measure), or the router when they hold every engine it fronts. Refuses a name the
    inventory lacks or a host without engines, before any request."""
    spec.check_limit(hosts)
    engine_hosts = [h.name for h, _ in spec.engines()]
    idle = [h for h in hosts if h not in engine_hosts]
    if idle:
        raise ValueError(f"--limit: host(s) {idle} run no engine; hosts with engines: {sorted(set(engine_hosts))}")
    if engine_bench != "pdkit":
        raise ValueError("--limit needs pdkit's client (--engine-bench pdkit): SGLang's bench sends to one URL, "
                         "and a PD pair needs each request sent to its prefill and decode at once")
    return measured_for(spec, list(dict.fromkeys(hosts)))


def cmd_bench(args: argparse.Namespace) -> int:
    from pdkit.loader import load_or_report

    spec = load_or_report(args.inventory)
    if spec is None:
        return EXIT_INVALID
    common = dict(concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
                  requests=args.requests, warmup=args.warmup, label=args.label, probe_drivers=not args.no_ssh)
    try:
        measured = limited_measure(spec, args.limit, args.engine_bench) if args.limit else None
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        router_url, _ = router_target(spec)
        print(f"bench {sent_to(router_url, measured.describe() if measured else None)} (model {served_model(spec)}, engine {spec.cluster.engine}): "
              f"C={','.join(map(str, args.concurrency))}, in {args.input_len} / out {args.output_len} tokens, "
              f"{args.requests} requests per level", file=sys.stderr)
        if args.engine_bench == "sglang":
            record = run_sglang_bench(spec, python=args.sglang_python, tokenizer=args.tokenizer, **common)
        elif measured is not None:
            record = run_bench(spec, timeout_s=args.timeout, progress=not args.quiet, send=measured.stream,
                               measured=measured.describe(), **common)
        else:
            record = run_bench(spec, timeout_s=args.timeout, progress=not args.quiet, **common)
    except (ValueError, RuntimeError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    written = write_outputs(record, args.out, plot=not args.no_plot)
    print(render_markdown(record))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 1 if any(lv["errors"] for lv in record["levels"]) else 0


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        a, b = find_run(args.a, args.runs), find_run(args.b, args.runs)
    except (LookupError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return EXIT_INVALID
    text = render_compare(a, b)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        render_plot([a, b], args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    print(text, end="")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench` and `compare`."""
    p = subparsers.add_parser("bench", help="measure the cluster through its router (tok/s, TTFT, TPOT, ITL per concurrency)",
                              description="Streaming requests with fixed input/output lengths through the router, "
                                          "after a warm-up; one JSON line per run in OUT/runs.jsonl, plus OUT/<id>.md and .png.")
    p.add_argument("inventory")
    p.add_argument("--concurrency", type=parse_concurrency, default=[1, 16, 64], metavar="C1,C2,...",
                   help="concurrency levels, run in this order (default 1,16,64)")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens per request (default 512)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens per request, EOS ignored (default 128)")
    p.add_argument("--requests", type=int, default=64, help="requests per concurrency level (default 64)")
    p.add_argument("--warmup", type=int, default=4, help="warm-up requests before the first level, not counted (default 4)")
    p.add_argument("--label", default="", help="free text kept with the run, e.g. 'before cuda-graph change'")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for runs.jsonl, <id>.md and <id>.png (default {DEFAULT_OUT})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    p.add_argument("--engine-bench", choices=("pdkit", "sglang"), default="pdkit",
                   help=f"pdkit's client (default) or SGLang's own `python -m {SGLANG_BENCH_MODULE}`")
    p.add_argument("--sglang-python", default=sys.executable,
                   help="python that has sglang installed, for --engine-bench sglang (default: this one)")
    p.add_argument("--tokenizer", default=None, help="tokenizer path for --engine-bench sglang (default: the model name)")
    p.add_argument("--limit", action="append", default=[], metavar="HOST",
                   help="bench only these hosts' own engines (repeat): each request goes to one of their PD pairs "
                        "directly, in the router's PD form, in turn, so each pair serves an equal share. Through the "
                        "router a load-aware policy moves load off a slow engine, and one changed node of several "
                        "barely shows; the record says what it measured (env.measured)")
    p.add_argument("--no-ssh", action="store_true", help="do not SSH to GPU nodes for the driver version")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)

    p = subparsers.add_parser("compare", help="two bench runs side by side with ratios (B/A)",
                              description="A and B: a run id or label from RUNS, or a .json record / .jsonl file (its last run).")
    p.add_argument("a", metavar="A", help="the run before (id, label or file)")
    p.add_argument("b", metavar="B", help="the run after (id, label or file)")
    p.add_argument("--runs", default=f"{DEFAULT_OUT}/{RUNS_FILE}", help=f"runs file to look ids and labels up in (default {DEFAULT_OUT}/{RUNS_FILE})")
    p.add_argument("--out", default=None, help="also write the markdown to this file")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw both runs on one throughput/TPOT chart")
    p.set_defaults(func=cmd_compare)
