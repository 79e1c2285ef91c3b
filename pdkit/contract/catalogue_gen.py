"""The metric catalogue's generator: writes pdkit/upstream/data/metric_catalogue.json from the pinned releases.

Run on the control machine by pdkit's Python, with the contract virtualenvs built
(`bash .ci/contract-env.sh`); the kit reads the result through pdkit.upstream.catalogue:

    python -m pdkit.contract.catalogue_gen           # rewrite pdkit/upstream/data/metric_catalogue.json
    python -m pdkit.contract.catalogue_gen --check   # exit 1 when the committed catalogue differs

CI reruns it and fails on any difference (tests/test_catalogue.py).

- SGLang: `pdkit/contract/sglang_metrics.py`, run in each release's contract virtualenv
  (.ci/contract-env.sh), constructs the release's own SchedulerMetricsCollector and
  TokenizerMetricsCollector (sglang/srt/observability/metrics_collector.py) with the labels
  SGLang builds for them and reads prometheus_client's registry: per family its type, label
  names, buckets, and whether its child exists once the engine has logged its stats
  (`eager`) or only after the first event that touches it (`lazy`: failure counters,
  cuda_graph_passes_total per mode, the request counters and histograms).
- Routers: the real binary of smg 1.13.0 (its contract virtualenv) started on loopback in PD mode
  in front of two sim engines; its /metrics is read once its workers are registered (before any
  request) and again after requests went through it. A family seen before is `eager`, one that
  appears only after is `lazy`. Then a fault phase (smg only, FAULT_FAMILIES) registers a prefill
  whose bootstrap port refuses, and reads the PD fault family that creates (lazy); the module's
  FAULT_FAMILIES comment says which of smg's other fault families cannot be made to appear here,
  and why. Rust's metrics crate creates a series on its first record, so this is the only
  source for a router's families: its definitions are spread over the binary. sglang-router
  0.3.2 from the real pages recorded from its binary (RECORDED_ROUTER_PAGES).

Kept apart from the reader (pdkit.upstream.catalogue, which the sim imports and so keeps to the node's
rules): this module starts routers and sims (pdkit.sim.localstack) and reads their pages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from pdkit.sim.localstack import (
    LocalProcess,
    free_ports,
    router_serves,
    router_workers_ready,
    sim_command,
    wait_for,
)
from pdkit.upstream.catalogue import CATALOGUE_PATH, ROUTERS, SGLANG_VERSIONS
from pdkit.upstream.venvs import env_python

# the committed catalogue's first line: the command that writes it
GENERATED_BY = "python -m pdkit.contract.catalogue_gen"

# prometheus_client's multiprocess collector (SGLang runs with PROMETHEUS_MULTIPROC_DIR) keeps a
# `pid` label on gauges whose multiprocess_mode keeps one series per process
PID_GAUGE_MODES = ("all", "liveall")


def _sglang(version: str) -> dict:
    py = env_python(f"sglang-{version}")
    script = Path(__file__).parent / "sglang_metrics.py"
    out = subprocess.run([str(py), str(script)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"sglang_metrics.py in sglang-{version} failed:\n{out.stderr[-3000:]}")
    reply = json.loads(out.stdout)
    if reply["version"] != version:
        raise RuntimeError(f"the sglang-{version} env holds sglang {reply['version']}")
    families = {}
    for name, f in reply["families"].items():
        labels = list(f["labels"])
        if f["type"] == "gauge" and f.get("multiprocess_mode") in PID_GAUGE_MODES:
            labels = sorted(labels + ["pid"])
        families[name] = {"type": f["type"], "labels": labels, "eager": f["eager"],
                          "collector": f["collector"], **({"buckets": f["buckets"]} if "buckets" in f else {}),
                          **({"eager_children": f["eager_children"]} if f.get("eager_children") else {})}
    return {"source": "sglang/srt/observability/metrics_collector.py (SchedulerMetricsCollector, "
                      "TokenizerMetricsCollector) of the sglang wheel, constructed in its contract env",
            "scheduler_labels": reply["scheduler_labels"], "tokenizer_labels": reply["tokenizer_labels"],
            "families": families, "log_formats": reply["log_formats"]}


def _page_families(text: str) -> dict[str, dict]:
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le", "quantile"}
        if fam.samples:
            out[name] = {"type": fam.type, "labels": sorted(labels)}
    return out


def _router_command(package: str, version: str, ports: dict[str, int]) -> list[str]:
    py = env_python(f"{package}-{version}")
    head = [str(py.parent / "smg"), "launch"] if package == "smg" else [str(py), "-m", "sglang_router.launch_router"]
    return head + [
        "--pd-disaggregation",
        "--prefill", f"http://127.0.0.1:{ports['prefill']}", str(ports["bootstrap"]),
        "--decode", f"http://127.0.0.1:{ports['decode']}",
        "--host", "127.0.0.1", "--port", str(ports["router"]),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ports["metrics"]),
        "--worker-startup-check-interval", "1", "--health-check-interval-secs", "1",
        "--log-level", "warn",
    ]


def _router(package: str, version: str) -> dict:
    names = ("prefill", "bootstrap", "decode", "router", "metrics")
    ports = dict(zip(names, free_ports(len(names))))
    procs: list[LocalProcess] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for role in ("prefill", "decode"):
                argv = sim_command(role, ports[role], ports["bootstrap"] if role == "prefill" else None)
                procs.append(LocalProcess(role, argv, Path(tmp) / f"{role}.log").start())
            for role in ("prefill", "decode"):
                wait_for(lambda p=ports[role]: requests.get(f"http://127.0.0.1:{p}/health", timeout=2).ok,
                         60, f"sim {role}", procs)
            procs.append(LocalProcess("router", _router_command(package, version, ports),
                                      Path(tmp) / "router.log").start())
            url = f"http://127.0.0.1:{ports['router']}"
            metrics = f"http://127.0.0.1:{ports['metrics']}/metrics"
            wait_for(lambda: router_workers_ready(url), 180, f"{package} {version} workers", procs, interval=0.5)
            time.sleep(2)  # a few health-check rounds
            before = _page_families(requests.get(metrics, timeout=5).text)
            for _ in range(3):
                if not router_serves(url):
                    raise RuntimeError(f"{package} {version}: a request through the router failed")
            after = _page_families(requests.get(metrics, timeout=5).text)
            faults = _fault_phase(package, version, url, metrics, ports, procs)
        finally:
            for p in reversed(procs):
                p.stop()
    families = {name: {**f, "eager": name in before} for name, f in after.items()}
    for name, f in faults.items():
        if name in families:
            raise RuntimeError(f"{package} {version}: {name} was on the page before the fault phase made it")
        families[name] = {**f, "eager": False}
    for name, f in ON_RUNTIME_EVENTS.get((package, version), {}).items():
        seen = families.get(name)
        if seen is not None and (seen["type"], seen["labels"]) != (f["type"], f["labels"]):
            raise RuntimeError(f"{package} {version}: {name} is a {seen['type']} {seen['labels']} on its page, "
                               f"ON_RUNTIME_EVENTS says {f['type']} {f['labels']}")
        if name.encode() not in _router_library(package, version).read_bytes():
            raise RuntimeError(f"{package} {version}: its library defines no {name} (ON_RUNTIME_EVENTS is stale)")
        families[name] = {**f, "eager": False}
    return {"source": f"live /metrics of the {package} {version} binary (contract env) in PD mode before and "
                      "after requests", "families": dict(sorted(families.items()))}


# The fault phase (smg only): families a router creates only on its first PD fault, made to appear on
# purpose after the requests, and only those named here are taken from the page (other families the
# fault brings, e.g. a third worker's series, are not this phase's business). Each is a live fact of
# the 1.13.0 binary, checked by running it; what increments them is from the binary's own help text
# (its HELP lines and log lines), since smg's public repository (github.com/lightseekorg/smg, v1.9.0
# at the newest) has none of these families.
#
# - smg_pd_rendezvous_failures_total{leg, phase}: smg probes a prefill's bootstrap port when it
#   registers the worker; a port that refuses counts {leg="prefill", phase="probe"} (log: "Bootstrap
#   port did not accept a connection at registration: the leg is registered, but its disaggregated
#   partners cannot rendezvous there"). The phase registers the running sim prefill a second time
#   (POST /workers, as http://localhost:PORT: the router keys workers by URL) with a bootstrap port
#   nothing listens on: the counter appears within a second, every run. Its other phases (bootstrap,
#   transfer) are the gRPC path's, which pdkit does not deploy.
#
# Not here, and why (each tried against the 1.13.0 binary in front of the sims, 2026-12-03):
# - smg_worker_stalled, smg_worker_stall_transitions_total (the liveness veto, --worker-stall-secs /
#   --worker-wedge-secs): none of these set the veto: a stalled sim decode (PDKIT_SIM_STALL_FILE, /health
#   kept cheap) with 6 or 10 streamed requests in flight for 12 s; 6 long streams decoding (the load
#   feed reporting 6 running) then the decode stalled, no token for 60 s and a new request routed to it;
#   a SIGSTOPped decode (10 s); a killed decode answered with transport errors (health-failure
#   threshold raised so that it stayed routable). smg_worker_liveness_fallback_total stayed 0 as well.
#   What sets it in PD mode over HTTP is not in any public source; not reproducible here, no alert.
# - smg_workers_overloaded: set from the engines' reported waiting queue / KV usage; a stalled sim
#   does not update its gauges and a PD sim decode reports its queue in the PD queues, so its
#   waiting count stays 0 (measured): not deterministic here. PdkitRouterWorkersOverloaded reads the
#   eager smg_worker_overload_{shed,fallback}_total instead.
# - smg_pd_bootstrap_failures_total: counted when the router cannot add bootstrap fields to a
#   request that is not a JSON object (smg's pd_router.rs, inject_bootstrap_into_value, in every
#   public release): a typed HTTP request always is one, so no client can cause it.
# - smg_admission_queue_rejected_total, smg_pd_prefill_admission_rejections_total: need an admission
#   limit (--max-concurrent-requests with --queue-size, --prefill-max-inflight-requests-per-worker)
#   that pdkit does not set and that would change what this router's other families look like;
#   PdkitRouterAdmissionRejected reads smg_http_rate_limit_total{result="rejected"}.
FAULT_FAMILIES = {
    ("smg", "1.13.0"): ("smg_pd_rendezvous_failures_total",),
}
# how long the fault phase waits for its families (they appear within a second on a 2-core machine)
FAULT_WAIT_S = 30.0


def _fault_phase(package: str, version: str, url: str, metrics: str, ports: dict[str, int],
                 procs: list) -> dict[str, dict]:
    """Make the router count a PD rendezvous failure and read the families FAULT_FAMILIES names."""
    wanted = FAULT_FAMILIES.get((package, version), ())
    if not wanted:
        return {}
    # a bootstrap port nothing listens on: the registration probe is refused
    (closed,) = free_ports(1)
    resp = requests.post(f"{url}/workers", timeout=10, json={
        "url": f"http://localhost:{ports['prefill']}", "worker_type": "prefill", "bootstrap_port": closed})
    if resp.status_code >= 300:
        raise RuntimeError(f"{package} {version}: POST /workers for the fault phase: {resp.status_code} {resp.text}")
    seen: dict[str, dict] = {}

    def all_seen() -> bool:
        seen.clear()
        seen.update(_page_families(requests.get(metrics, timeout=5).text))
        return all(name in seen for name in wanted)

    wait_for(all_seen, FAULT_WAIT_S, f"{package} {version}: {', '.join(wanted)} after a refused bootstrap probe",
             procs, interval=0.5)
    return {name: seen[name] for name in wanted}


# Families a router creates on a runtime event no request can force: smg's tokio runtime monitor
# counts event-loop stalls, and the counter's first stall creates it, so a run on a loaded
# machine sees it and one on an idle machine does not. Listed so the catalogue does not depend
# on the machine's load: always lazy; when a run sees it, its type and labels must be these, and
# the name must be in the router's own library (smg/smg_rs.abi3.so).
ON_RUNTIME_EVENTS = {
    ("smg", "1.13.0"): {"smg_tokio_event_loop_stalls_total": {"type": "counter", "labels": []}},
}


def _router_library(package: str, version: str) -> Path:
    site = env_python(f"{package}-{version}").parent.parent / "lib"
    found = sorted(site.glob("python3*/site-packages/smg/smg_rs*.so"))
    if not found:
        raise RuntimeError(f"{package} {version}: no smg_rs library under {site}")
    return found[0]


# sglang-router 0.3.2 serves no /workers list before its workers are up and did not come up in front
# of the sim on loopback; its families are read from the real pages recorded from the kit's
# sglang-router 0.3.2 unit on an H200 (tests/fixtures/sglang-0.5.17-h200-pd-one-gpu, before and after
# load), the same binary's own /metrics.
RECORDED_ROUTER_PAGES = {
    ("sglang-router", "0.3.2"): Path(__file__).resolve().parents[2] / "tests" / "fixtures"
    / "sglang-0.5.17-h200-pd-one-gpu",
}


def _router_recorded(package: str, version: str) -> dict:
    d = RECORDED_ROUTER_PAGES[(package, version)]
    before: dict[str, dict] = {}
    after: dict[str, dict] = {}
    for phase in ("base", "nograph"):
        before.update(_page_families((d / f"metrics-{phase}-before-router.txt").read_text()))
        after.update(_page_families((d / f"metrics-{phase}-after-router.txt").read_text()))
    first = _page_families((d / "metrics-base-before-router.txt").read_text())
    merged = {**before, **after}
    families = {name: {**f, "eager": name in first} for name, f in sorted(merged.items())}
    return {"source": f"recorded /metrics of the {package} {version} binary (the kit's router unit on an H200, "
                      "tests/fixtures/sglang-0.5.17-h200-pd-one-gpu)", "families": families}


def generate() -> dict:
    routers = {}
    for p, v in ROUTERS:
        routers[f"{p}-{v}"] = _router_recorded(p, v) if (p, v) in RECORDED_ROUTER_PAGES else _router(p, v)
    return {
        "generated_by": GENERATED_BY,
        "sglang": {v: _sglang(v) for v in SGLANG_VERSIONS},
        "routers": routers,
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render(generate())
    if args and args[0] == "--check":
        if CATALOGUE_PATH.read_text() != text:
            print(f"{CATALOGUE_PATH} differs from the generator's output: run python -m pdkit.contract.catalogue_gen")
            return 1
        return 0
    CATALOGUE_PATH.parent.mkdir(parents=True, exist_ok=True)
    CATALOGUE_PATH.write_text(text)
    print(f"wrote {CATALOGUE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
