"""The bench record: one run's figures per concurrency level and its KV hand-off figures, made by
run_bench with pdkit's client (pdkit.bench.client), kept as JSON lines on disk and found again.

Each run is one JSON line appended to OUT/runs.jsonl (default docs/bench/), plus
OUT/<id>.md (markdown table) and OUT/<id>.png (throughput and TPOT against concurrency):
pdkit.bench.report.write_outputs.

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
        failures {kind: n} (pdkit.bench.stats.failure_kind: "status 503", "hang", "aborted",
        "empty (stop)", "short (length)", ...), failed_finish_reasons {finish reason the failed
        streams named, "error 500" for an error event: n}, failed_workers {the router's
        x-smg-routed-worker-id, "unknown" where it sends none: n}. Records written before these
        three keys have none of them: readers treat them as unknown, not as zero
        duration_s (wall time of the level), input_tokens, output_tokens,
        output_tok_s, requests_s,
        ttft_ms, tpot_ms, itl_ms, e2e_ms: {"mean", "p50", "p99"} in ms (null when no data)
        kv              (PD clusters) the level's KV hand-offs, from every measured prefill's
                        /metrics read just before and just after the level: pdkit.spec.kvcost.KvFigures
                        .as_record() (transfers, mb_per_request (MiB), latency_mean_ms,
                        latency_p99_ms + latency_p99_above_buckets (past SGLang's 5,000 ms top
                        bucket: a floor, shown ">5000"), effective_gb_s (ratio of sums),
                        sglang_speed_mean_gb_s, ttft_share (KV latency mean / the level's TTFT
                        mean)) plus "prefills" (those read both times) and "unread" {prefill: why}
                        when some /metrics could not be read (none read: no figure keys).
                        --engine-bench sglang adds "warmup_included": its run's warm-up requests
                        fall inside the window. Absent on unified engines and older records
        goodput         only when SLOs were given (`pdkit tune`'s goodput objective):
                        {"requests_s", "good", "attainment", "slo_ms"} (pdkit.bench.stats.goodput)
    repeats       `pdkit bench --repeats N` (N > 1) only: runs 2..N of the whole sweep, each a
                  `levels` list (`levels` above is run 1); pdkit.bench.noise.record_runs reads them
    kv_prefills   the prefills whose /metrics give the levels' kv ([]: unified engines, no PD
                  hand-off); absent from records written before the KV figures
    env           environment fingerprint:
        spec_hash       sha256 over every host's planned release hash (pdkit.render.plan)
        engine          "sim" | "sglang" (cluster.engine)
        sglang_versions planned SGLang version(s), sorted
        router          "<package> <version>" of the first router host
        gpus[]          {"host", "gpu" (nvidia|none), "model", "count", "driver"}; driver from one
                        SSH `nvidia-smi` per GPU node (strict host keys), "n/a" on `gpu: none`
                        hosts, "unknown: <why>" when it could not be read, "not probed" with --no-ssh
        engine_flags    {"<host>/<engine>": the sglang argv pdkit plans (pdkit.render.flags.sglang_args)}
        measured        what the requests went to: {"via": "router", "router_url", "engines": the
                        router's workers} for `pdkit bench`; `pdkit bench --limit` and `pdkit tune`
                        on part of the cluster bench those hosts' own engines: {"via": "engines", "hosts", "engines",
                        "routes": ["<prefill>+<decode>" PD pairs or unified engines]} (docs/tune.md)

"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdkit.agent import health
from pdkit.bench.client import Progress, Sender, router_target, run_level
from pdkit.bench.env import fingerprint
from pdkit.bench.routes import router_measured
from pdkit.bench.stats import summarize_level
from pdkit.render.flags import engine_url
from pdkit.spec.kvcost import CACHE_COUNTERS, cache_counts, cache_window, combine, hit_rate, kv_figures, kv_histograms

if TYPE_CHECKING:
    from pdkit.spec import ClusterSpec

SCHEMA_VERSION = 1
DEFAULT_OUT = "docs/bench"
RUNS_FILE = "runs.jsonl"


def served_model(spec: ClusterSpec) -> str:
    """The model name requests carry: the one the engines serve (`--served-model-name`, pdkit.spec.Model.name)."""
    return spec.cluster.model.name


# ---- the KV hand-off of each level (PD clusters) -------------------------------------------

KV_SCRAPE_TIMEOUT_S = 5.0
NO_PD_HANDOFF = "no PD hand-off: the measured engines are unified (no prefill hands KV to a decode)"


def kv_prefills(spec: ClusterSpec, measured: dict[str, Any]) -> dict[str, str | None]:
    """The prefills whose KV hand-offs a bench's requests cause: {host/engine: engine URL}, in the
    measured engines' order. Through the router: every prefill it fronts; to the engines directly:
    the prefill of each PD route. None for a label the spec does not name (its /metrics cannot be
    found); {} when nothing measured is a PD pair (unified engines: no hand-off)."""
    urls = {f"{h.name}/{e.name}": engine_url(spec, h, e) for h, e in spec.engines() if e.role == "prefill"}
    if measured.get("via", "router") == "router":
        labels = [e for e in measured.get("engines") or [] if e in urls]
    else:
        labels = [route.split("+", 1)[0] for route in measured.get("routes") or [] if "+" in route]
    return {label: urls.get(label) for label in dict.fromkeys(labels)}


# One sample of every prefill: (histograms by prefill, why by prefill whose /metrics could not be read)
KvSample = tuple[dict[str, Any], dict[str, str]]


def scrape_pages(engines: dict[str, str | None], parse: Callable[[str], Any],
                 timeout_s: float = KV_SCRAPE_TIMEOUT_S) -> KvSample:
    """GET every engine's /metrics at once and PARSE each page. Engines take no API key in pdkit
    (only the router has one), so no header is sent."""
    def one(item: tuple[str, str | None]) -> tuple[str, Any, str | None]:
        label, url = item
        if url is None:
            return label, None, "not an engine of the inventory: its /metrics address is unknown"
        status, body = health.http_request(f"{url}/metrics", timeout=timeout_s)
        if status != 200:
            why = f"HTTP {status}: {body.strip()[:120]}" if status else (body.strip()[:160] or "no answer")
            return label, None, f"{url}/metrics: {why}"
        try:
            return label, parse(body), None
        except ValueError as exc:
            return label, None, f"{url}/metrics: unreadable: {str(exc)[:120]}"

    pages: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if not engines:
        return pages, errors
    with ThreadPoolExecutor(max_workers=min(16, len(engines))) as pool:
        for label, page, why in pool.map(one, engines.items()):
            if why is None:
                pages[label] = page
            else:
                errors[label] = why
    return pages, errors


def scrape_kv(prefills: dict[str, str | None], timeout_s: float = KV_SCRAPE_TIMEOUT_S) -> KvSample:
    """Every prefill's KV histograms (pdkit.spec.kvcost), read at once."""
    return scrape_pages(prefills, kv_histograms, timeout_s)


def level_kv(before: KvSample, after: KvSample, ttft_mean_ms: float | None) -> dict[str, Any]:
    """Pure: a level's `kv` block from the prefills' samples before and after it.

    Each prefill's window is its own difference (a restarted one counts from zero), the prefills'
    windows are combined, and pdkit.spec.kvcost.kv_figures gives the figures, with the level's
    client-side TTFT mean for the KV share. `prefills`: those read both times; `unread`: why the
    others gave nothing (the figures then cover the read ones only; none read: no figures)."""
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


# ---- the prefix cache of each level -----------------------------------------------------------

# The engines' own counters and the hit-rate rule: pdkit.spec.kvcost (CACHE_COUNTERS, cache_counts, cache_window,
# hit_rate), shared with doctor's prefix_cache row


def cache_engines(spec: ClusterSpec, measured: dict[str, Any]) -> dict[str, str | None]:
    """The engines whose prefix cache a bench's prompts meet: {host/engine: engine URL}, the
    measured prefills and unified engines (a decode only receives the KV)."""
    roles = {f"{h.name}/{e.name}": e.role for h, e in spec.engines()}
    urls = {f"{h.name}/{e.name}": engine_url(spec, h, e) for h, e in spec.engines()}
    if measured.get("via", "router") == "router":
        labels = list(measured.get("engines") or [])
    else:
        labels = [route.split("+", 1)[0] for route in measured.get("routes") or []]
    return {label: urls.get(label) for label in dict.fromkeys(labels) if roles.get(label, "prefill") != "decode"}


def level_cache(before: KvSample, after: KvSample) -> dict[str, Any]:
    """Pure: a level's `prefix_cache` block: the engines' cached and prompt token counts over the
    level (each engine its own difference; a restarted one counts from zero), hit_rate = cached /
    prompt (None when no prompt token was counted), `engines` read both times, `unread` why not."""
    unread = {**after[1], **before[1]}
    read = [label for label in after[0] if label in before[0] and label not in unread]
    totals = dict.fromkeys(CACHE_COUNTERS, 0.0)
    for label in read:
        for key, n in cache_window(before[0][label], after[0][label]).items():
            totals[key] += n
    rate = hit_rate(totals)
    out: dict[str, Any] = {"engines": read, "cached_tokens": int(totals["cached"]),
                           "prompt_tokens": int(totals["prompt"]),
                           "hit_rate": round(rate, 4) if rate is not None else None}
    if unread:
        out["unread"] = dict(sorted(unread.items()))
    return out


@dataclass(frozen=True)
class LevelPages:
    """The engines whose own counters an agentic level reads just before and just after its requests: the
    prefills' KV histograms (kv_prefills: the level's `kv`) and the prefix-cache counters of the engines its
    prompts meet (cache_engines: its `prefix_cache`)."""

    prefills: dict[str, str | None]
    caches: dict[str, str | None]

    @classmethod
    def named_in(cls, spec: ClusterSpec, record: dict[str, Any]) -> LevelPages:
        """Those of RECORD's measured engines, named in it (`kv_prefills`, `cache_engines`)."""
        measured = record["env"]["measured"]
        pages = cls(kv_prefills(spec, measured), cache_engines(spec, measured))
        record["kv_prefills"], record["cache_engines"] = list(pages.prefills), list(pages.caches)
        return pages

    def sample(self) -> tuple[KvSample, KvSample]:
        """Every page read at once: (the prefills' KV histograms, the engines' prefix-cache counts)."""
        return scrape_kv(self.prefills), scrape_pages(self.caches, cache_counts)

    def figures(self, concurrency: int, before: tuple[KvSample, KvSample], after: tuple[KvSample, KvSample],
                ttft_mean_ms: float | None, **also: Any) -> dict[str, Any]:
        """A level's `prefix_cache` block and, where prefills are measured (PD), its `kv` block, from its
        samples BEFORE and AFTER, each with ALSO; a stderr line when a prefill could not be read."""
        out: dict[str, Any] = {"prefix_cache": {**level_cache(before[1], after[1]), **also}}
        if self.prefills:
            out["kv"] = {**level_kv(before[0], after[0], ttft_mean_ms), **also}
            say_kv_unread(concurrency, out["kv"])
        return out


# ---- a run: its head (id, workload, env), its levels ------------------------------------------

def run_id(started: datetime, label: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:40] or "run"
    return f"{started:%Y%m%dT%H%M%SZ}-{slug}"


def record_head(spec: ClusterSpec, tool: str, label: str, input_len: int, output_len: int, requests: int,
                warmup: int, probe_drivers: bool, router_url: str,
                measured: dict[str, Any] | None = None,
                workload: dict[str, Any] | None = None) -> dict[str, Any]:
    """A record without levels yet: what is run (`workload`: fixed lengths unless given), on what
    (env), where the requests go (env.measured)."""
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
        "workload": workload or {"kind": "fixed"},
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
    also records its goodput (pdkit.bench.stats.goodput)."""
    if (send is None) != (measured is None):
        raise ValueError("run_bench: give send and measured together (what is sent, and what that measures)")
    check_workload(spec, input_len, output_len, requests, warmup)
    router_url, headers = router_target(spec)
    record = record_head(spec, "pdkit", label, input_len, output_len, requests, warmup, probe_drivers, router_url,
                         measured)
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
            where = (router_url if measured is None
                     else ", ".join(measured.get("routes") or measured.get("engines") or []))
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


def context_cap(spec: ClusterSpec) -> int | None:
    """The smallest planned context length of the engines (cluster tuning context_length), or None."""
    limits = [t.context_length for t in (spec.engine_tuning(e) for _, e in spec.engines()) if t.context_length]
    return min(limits) if limits else None


def check_context(spec: ClusterSpec, tokens: int, what: str) -> None:
    """Refuse a workload whose largest request (prompt + output, TOKENS) exceeds the planned cap."""
    cap = context_cap(spec)
    if cap is not None and tokens > cap:
        raise ValueError(f"{what} = {tokens} exceeds the planned context length {cap} "
                         "(cluster tuning context_length)")


def check_workload(spec: ClusterSpec, input_len: int, output_len: int, requests: int, warmup: int) -> None:
    """Refuse a workload that cannot run, before any request is sent."""
    if input_len < 1 or output_len < 1:
        raise ValueError("--input-len and --output-len must be at least 1")
    if requests < 1 or warmup < 0:
        raise ValueError(f"--requests must be at least 1 (got {requests}) and --warmup at least 0 (got {warmup})")
    check_context(spec, input_len + output_len, "--input-len + --output-len")


# ---- runs on disk ---------------------------------------------------------------------------

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

