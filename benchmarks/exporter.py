"""Benchmark pdkit-exporter: one scrape of a node with 4 engines, and the exporter's memory.

    .venv/bin/python benchmarks/exporter.py            # 4 sim engines, 200 scrapes
    .venv/bin/python benchmarks/exporter.py --json

Starts 4 sim engines on loopback (2 PD pairs: prefill + decode, TP 2, --enable-metrics, the
SGLang flags pdkit renders), then `python -m pdkit.exporter --config ...` as its own process,
exactly as the unit runs it, and scrapes its /metrics back to back. Each scrape does the real
work: GET /metrics and /server_info of all 4 engines over HTTP, parse, drift check, the
/proc/PID/environ + cmdline check of the engines' real processes, and one journal read.

There is no systemd here, so `systemctl` and `journalctl` are two small shell scripts put first
on the exporter's PATH: systemctl answers MainPID with the sims' real PIDs (the exporter calls
it once and then caches per process), and journalctl prints the same JOURNAL_ENTRIES entries
in journalctl's JSON format on every call (built from the sims' own log lines, so the exporter
spawns a process and scans a busy journal's worth of lines each scrape).

Targets (issue 6): median scrape <= 25 ms, exporter resident memory <= 60 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdkit.sim.localstack import LocalProcess, free_ports, sim_command, wait_for  # noqa: E402

JOURNAL_ENTRIES = 500
ENV = {"NCCL_P2P_LEVEL": "PHB", "NCCL_PROTO": "LL,Simple", "UCX_TLS": "cuda_ipc,cuda_copy,sm,self,tcp",
       "SGLANG_DISAGGREGATION_NIXL_BACKEND": "UCX"}
EXTRA = ["--tp-size", "2", "--base-gpu-id", "0", "--gpu-id-step", "1", "--cuda-graph-max-bs-decode", "32",
         "--mem-fraction-static", "0.88", "--page-size", "16", "--decode-log-interval", "40"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def fake_tools(bin_dir: Path, units: dict[str, int], journal_file: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    blocks = "\n".join(f"MainPID={pid}\nId={unit}\n" for unit, pid in units.items())
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\ncat <<'EOF'\n{blocks}EOF\n")
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\nexec cat {journal_file}\n")
    for tool in ("systemctl", "journalctl"):
        os.chmod(bin_dir / tool, 0o755)


def journal_json(lines: list[tuple[str, str]], n: int) -> str:
    """n entries in journalctl's compact JSON (-o json --output-fields=MESSAGE,_SYSTEMD_UNIT,UNIT)."""
    out = []
    base = int(time.time() * 1e6)
    for i in range(n):
        unit, message = lines[i % len(lines)]
        out.append(json.dumps({
            "__CURSOR": f"s=0;i={i:x};b=0;m={i:x};t={base + i:x};x={i:x}", "__REALTIME_TIMESTAMP": str(base + i),
            "__MONOTONIC_TIMESTAMP": str(i), "_BOOT_ID": "0" * 32, "_SYSTEMD_UNIT": unit, "MESSAGE": message,
        }, separators=(",", ":")))
    return "\n".join(out) + "\n"


@dataclass
class Report:
    engines: int
    scrapes: int
    journal_entries_per_scrape: int
    scrape_median_ms: float
    scrape_p90_ms: float
    scrape_p99_ms: float
    scrape_max_ms: float
    collect_median_ms: float
    exporter_cpu_ms_per_scrape: float
    engine_metrics_get_median_ms: float
    exporter_rss_mb: float
    exporter_peak_rss_mb: float
    exposition_bytes: int
    engines_up: int
    target_met: bool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="pdkit-exporter-bench-") as tmp_s:
        tmp = Path(tmp_s)
        ports = free_ports(9)
        specs = [("prefill-a", "prefill", ports[0], ports[1]), ("decode-a", "decode", ports[2], None),
                 ("prefill-b", "prefill", ports[3], ports[4]), ("decode-b", "decode", ports[5], None)]
        procs: list[LocalProcess] = []
        try:
            for name, mode, port, bootstrap in specs:
                argv_ = sim_command(mode, port, bootstrap, EXTRA)
                procs.append(LocalProcess(name, argv_, tmp / f"{name}.log",
                                          {"PDKIT_SIM_STARTUP_DELAY_S": "0.2", **ENV}).start())
            for (name, _, port, _), proc in zip(specs, procs):
                wait_for(lambda p=port: requests.get(f"http://127.0.0.1:{p}/health", timeout=2).status_code == 200,
                         30, f"{name} to be ready", procs)

            units = {f"pdkit-engine-{name}.service": proc.pid for (name, *_), proc in zip(specs, procs)}
            lines = []
            for (name, *_), proc in zip(specs, procs):
                for line in proc.log_path.read_text().splitlines():
                    lines.append((f"pdkit-engine-{name}.service", line))
            # a busy journal: access lines and per-batch lines of all four engines
            decode_line = ("[2026-11-29 18:58:35 TP0] Decode batch, #running-req: 8, #token: 361, token usage: 0.00, "
                           "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, "
                           "cuda graph: True, gen throughput (token/s): 110.70, #queue-req: 0")
            lines += [("pdkit-engine-decode-a.service", decode_line), ("pdkit-engine-decode-b.service", decode_line)]
            lines += [(u, f'[2026-11-29 18:58:35] INFO:     127.0.0.1:5{i} - "GET /metrics HTTP/1.1" 200 OK')
                      for i, u in enumerate(units)]
            journal_file = tmp / "journal.json"
            journal_file.write_text(journal_json(lines, JOURNAL_ENTRIES))
            fake_tools(tmp / "bin", units, journal_file)
            release_file = tmp / "release.json"
            release_file.write_text(json.dumps({"engines": sorted(units)}, indent=2))

            listen = ports[6]
            config = {
                "node": "gpu01", "cluster": "bench", "listen_address": "127.0.0.1", "listen_port": listen,
                "release_file": str(release_file), "timeout_s": 2.0,
                "engines": [{"name": name, "role": mode, "url": f"http://127.0.0.1:{port}",
                             "unit": f"pdkit-engine-{name}.service", "sglang_version": "sim",
                             "argv": proc.argv[proc.argv.index("-m") + 2:], "env": ENV}
                            for (name, mode, port, _), proc in zip(specs, procs)],
            }
            config_path = tmp / "exporter.json"
            config_path.write_text(json.dumps(config))
            env = {"PATH": f"{tmp / 'bin'}:{os.environ.get('PATH', '')}"}
            exporter = LocalProcess("exporter", [sys.executable, "-m", "pdkit.exporter", "--config", str(config_path)],
                                    tmp / "exporter.log", env).start()
            procs.append(exporter)
            url = f"http://127.0.0.1:{listen}/metrics"
            wait_for(lambda: requests.get(url, timeout=5).status_code == 200, 30, "the exporter", procs)

            session = requests.Session()
            body = ""
            for _ in range(5):  # warm-up: first PID lookup, first journal read, connections
                body = session.get(url, timeout=10).text
            # for context: how long one engine takes to answer its own /metrics (sequential GETs)
            direct = []
            for _ in range(50):
                started = time.perf_counter()
                _ = session.get(f"http://127.0.0.1:{specs[1][2]}/metrics", timeout=10).content  # read the body: part of the time
                direct.append(time.perf_counter() - started)
            times, collects = [], []
            cpu_before = cpu_seconds(exporter.pid)
            for _ in range(args.scrapes):
                started = time.perf_counter()
                resp = session.get(url, timeout=10)
                times.append(time.perf_counter() - started)
                body = resp.text
                for line in body.splitlines():
                    if line.startswith("pdkit_exporter_collect_duration_seconds{"):
                        collects.append(float(line.rsplit(" ", 1)[1]))
            cpu_per_scrape = (cpu_seconds(exporter.pid) - cpu_before) / args.scrapes
            rss, hwm = rss_kib(exporter.pid)
            up = sum(1 for line in body.splitlines() if line.startswith("pdkit_engine_up{") and line.endswith(" 1.0"))
            env_ok = sum(1 for line in body.splitlines()
                         if line.startswith("pdkit_engine_env_present{") and line.endswith(" 1.0"))
            drift_ok = sum(1 for line in body.splitlines()
                           if line.startswith("pdkit_engine_flags_drift{") and line.endswith(" 0.0"))
            batch = sum(1 for line in body.splitlines() if line.startswith("pdkit_decode_batch_running_requests{"))
            if (up, env_ok, drift_ok, batch) != (4, 4, 4, 2):
                print(f"the exporter did not see the node as expected (up {up}, env {env_ok}, no drift {drift_ok}, "
                      f"decode batch lines {batch}):\n{exporter.log_tail()}", file=sys.stderr)
                return 1
        finally:
            for proc in reversed(procs):
                proc.stop()

    ms = 1000.0
    median = statistics.median(times) * ms
    report = Report(
        engines=4, scrapes=args.scrapes, journal_entries_per_scrape=JOURNAL_ENTRIES,
        scrape_median_ms=round(median, 2), scrape_p90_ms=round(percentile(times, 90) * ms, 2),
        scrape_p99_ms=round(percentile(times, 99) * ms, 2), scrape_max_ms=round(max(times) * ms, 2),
        collect_median_ms=round(statistics.median(collects) * ms, 2),
        exporter_cpu_ms_per_scrape=round(cpu_per_scrape * ms, 2),
        engine_metrics_get_median_ms=round(statistics.median(direct) * ms, 2),
        exporter_rss_mb=round(rss * 1024 / 1e6, 1), exporter_peak_rss_mb=round(hwm * 1024 / 1e6, 1),
        exposition_bytes=len(body.encode()), engines_up=up,
        target_met=median <= 25 and hwm * 1024 / 1e6 <= 60,
    )
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print(f"pdkit-exporter, {report.engines} sim engines (TP 2) on loopback, {report.scrapes} scrapes, "
              f"{report.journal_entries_per_scrape} journal entries per scrape")
        print(f"  scrape (GET /metrics)  median {report.scrape_median_ms} ms, p90 {report.scrape_p90_ms}, "
              f"p99 {report.scrape_p99_ms}, max {report.scrape_max_ms}")
        print(f"  collect (exporter's own timer) median {report.collect_median_ms} ms; exporter CPU "
              f"{report.exporter_cpu_ms_per_scrape} ms per scrape")
        print(f"  for context: one engine's own /metrics answers in {report.engine_metrics_get_median_ms} ms (median)")
        print(f"  exporter memory        RSS {report.exporter_rss_mb} MB, peak {report.exporter_peak_rss_mb} MB "
              "(VmRSS / VmHWM, 1 MB = 10^6 bytes)")
        print(f"  exposition             {report.exposition_bytes} bytes, engines up {report.engines_up}/4")
        print(f"  target (median <= 25 ms, RSS <= 60 MB): {'met' if report.target_met else 'NOT met'}")
    return 0 if report.target_met else 1


if __name__ == "__main__":
    sys.exit(main())
