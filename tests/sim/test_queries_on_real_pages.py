"""Every dashboard query and alert expression, evaluated by a real Prometheus (Debian's `prometheus`,
.ci/monitoring-prereqs.sh) scraping static servers of recorded /metrics pages: once the pages of real
SGLang 0.5.17 engines and their sglang-router 0.3.2 (tests/fixtures/sglang-0.5.17-h200-pd-one-gpu,
before and after load), once the pages of sim engines behind the real smg, recorded here the same way.
A query that answers on the sim's pages must answer on the real pages too, unless
tests/fixtures/sglang-0.5.17-h200-pd-one-gpu/query-exceptions.json says why it cannot.

The servers hand out each target's `before` page for the first scrapes and its `after` page from
then on, so rate()/increase() over the 4-scrape window see the load between the two."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

from pdkit.inventory.loader import load
from pdkit.monitoring.common import JOB_ENGINE, JOB_ROUTER, RULES_RELATIVE_PATH
from pdkit.monitoring.dashboards import all_promql
from pdkit.monitoring.rules import alert_conditions, alert_rules
from pdkit.monitoring.scrape import prometheus_config
from pdkit.render import flags
from tests.conftest import require, write_inventory

from .conftest import start_pd_stack
from .support import MODEL, free_ports, get, post

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"
EXCEPTIONS = REAL / "query-exceptions.json"
BEFORE_SCRAPES = 2  # each target's `before` page for its first scrapes, then `after`
AFTER_SCRAPES = 4  # scrapes (1 s apart, rules evaluated each second) of `after` before the queries


def one_pair_spec(tmp_path, base):
    cluster, hosts = base
    cluster["sglang_version"] = "0.5.17"
    hosts.pop("gpu02")
    return load(write_inventory(tmp_path, hosts, cluster))


class _Pages(BaseHTTPRequestHandler):
    pages: dict[str, str] = {}
    served: list[int] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.served[0] += 1
        body = self.pages["before" if self.served[0] <= BEFORE_SCRAPES else "after"].encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(pages: dict[str, str]) -> ThreadingHTTPServer:
    handler = type("Pages", (_Pages,), {"pages": pages, "served": [0]})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.served = handler.served  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def evaluate(spec, pages: dict[str, dict[str, str]], tmp: Path) -> dict[str, str]:
    """{where: "answers" | "nan" | "empty" | "error: ..."} for every panel query, alert value and alert condition,
    with the spec's scrape config (engine and router jobs, their labels and relabelling) pointed at
    servers of `pages` ({"prefill" | "decode" | "router": {"before", "after"}})."""
    require(shutil.which("prometheus") is not None, "no prometheus binary: run sudo bash .ci/monitoring-prereqs.sh")
    tmp.mkdir(parents=True, exist_ok=True)
    servers = {role: serve(p) for role, p in pages.items()}
    try:
        doc = yaml.safe_load(prometheus_config(spec))
        doc["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        jobs = []
        for job in doc["scrape_configs"]:
            if job["job_name"] not in (JOB_ENGINE, JOB_ROUTER):
                continue  # exporter, node, DCGM: no recorded pages of theirs
            for sc in job["static_configs"]:
                role = sc["labels"]["role"]
                sc["targets"] = [f"127.0.0.1:{servers[role].server_port}"]
            jobs.append(job)
        doc["scrape_configs"] = jobs
        (tmp / "rules").mkdir(exist_ok=True)
        (tmp / RULES_RELATIVE_PATH).write_text(alert_rules(spec))
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(doc))
        (port,) = free_ports(1)
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"))
        try:
            deadline = time.monotonic() + 60
            while min(sv.served[0] for sv in servers.values()) < BEFORE_SCRAPES + AFTER_SCRAPES:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
                time.sleep(0.2)
            out = {}
            for where, expr in all_promql(spec) + alert_conditions(spec):
                reply = requests.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}, timeout=10).json()
                if reply["status"] != "success":
                    out[where] = f"error: {reply.get('error')}"
                else:
                    values = [float(r["value"][1]) for r in reply["data"]["result"]]
                    # NaN (0/0: nothing moved in the window) is what Grafana shows as no value
                    out[where] = "answers" if any(v == v for v in values) else "nan" if values else "empty"
            return out
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        for s in servers.values():
            s.shutdown()


def real_pages(spec, phase_name: str = "base") -> dict[str, dict[str, str]]:
    """The recorded pages, the router's worker URLs rewritten to the spec's engine URLs (the recording's
    engines listened on 127.0.0.1:30000/30001, the spec's on the node's address, same ports)."""
    host = spec.host("gpu01")
    urls = {e.role: flags.engine_url(spec, host, e) for e in host.node.engines}
    out = {}
    for role in ("prefill", "decode", "router"):
        out[role] = {}
        for phase in ("before", "after"):
            text = (REAL / f"metrics-{phase_name}-{phase}-{role}.txt").read_text()
            if role == "router":
                for r, port in (("prefill", 30000), ("decode", 30001)):
                    text = text.replace(f'worker="http://127.0.0.1:{port}"', f'worker="{urls[r]}"')
            out[role][phase] = text
    return out


def sim_pages(spec, procs) -> dict[str, dict[str, str]]:
    """The same pages from sim engines (the spec's release) behind the real smg, before and after load."""
    env = {"PDKIT_SIM_SGLANG_VERSION": spec.cluster.sglang_version}
    stack = start_pd_stack(procs, prefill_env=env, decode_env=env)
    host = spec.host("gpu01")
    urls = {e.role: flags.engine_url(spec, host, e) for e in host.node.engines}
    local = {"prefill": stack.prefill_url, "decode": stack.decode_url}
    sources = {"prefill": f"{stack.prefill_url}/metrics", "decode": f"{stack.decode_url}/metrics",
               "router": f"{stack.router_metrics_url}/metrics"}

    def snapshot() -> dict[str, str]:
        out = {role: get(url).text for role, url in sources.items()}
        for role in ("prefill", "decode"):
            out["router"] = out["router"].replace(f'worker="{local[role]}"', f'worker="{urls[role]}"')
        return out

    before = snapshot()
    for i in range(6):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"load {i}"}], "max_tokens": 16,
                "stream": bool(i % 2)}
        assert post(f"{stack.router_url}/v1/chat/completions", body).status_code == 200
    after = snapshot()
    return {role: {"before": before[role], "after": after[role]} for role in sources}


def test_what_answers_on_the_sims_pages_answers_on_real_sglang_pages(procs, tmp_path, base):
    spec = one_pair_spec(tmp_path, base)
    real = evaluate(spec, real_pages(spec), tmp_path / "real")
    sim = evaluate(spec, sim_pages(spec, procs), tmp_path / "sim")
    exceptions = json.loads(EXCEPTIONS.read_text())
    assert set(real) == set(sim)
    errors = {w: r for w, r in {**real, **sim}.items() if r.startswith("error")}
    assert not errors, errors
    missing = sorted(w for w in sim if sim[w] == "answers" and real[w] != "answers" and w not in exceptions)
    assert not missing, "answer on the sim's pages, not on real SGLang 0.5.17's:\n" + "\n".join(missing)
    stale = sorted(w for w in exceptions if not (sim.get(w) == "answers" and real.get(w) != "answers"))
    assert not stale, f"query-exceptions.json lists queries that no longer need an exception: {stale}"
    # the bulk of the engine and router queries answers on the real pages (the check is not vacuous)
    assert sum(r == "answers" for r in real.values()) >= 20, real


def test_the_graph_ratio_alert_condition_holds_on_a_real_decode_without_graphs(tmp_path, base):
    """Real 0.5.17 pages, decode restarted with --cuda-graph-backend-decode disabled: only
    cuda_graph_passes_total{mode="decode_none"} exists. PdkitDecodeCudaGraphRatioLow's condition holds
    there (it fires after its `for`); on the graphs-on pages it does not."""
    spec = one_pair_spec(tmp_path, base)
    nograph = evaluate(spec, real_pages(spec, "nograph"), tmp_path / "nograph")
    assert nograph["alert PdkitDecodeCudaGraphRatioLow"] == "answers", nograph
    graphs = evaluate(spec, real_pages(spec, "base"), tmp_path / "base")
    assert graphs["alert PdkitDecodeCudaGraphRatioLow"] == "empty", graphs
