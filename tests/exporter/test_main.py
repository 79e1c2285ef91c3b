"""`python -m pdkit.exporter` as a process: --check, --once, and serving /metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import requests

from pdkit.sim.localstack import free_ports

from .support import samples, value


def write_config(tmp_path, **extra) -> str:
    dead, listen = free_ports(2)
    config = {"node": "gpu09", "listen_address": "127.0.0.1", "listen_port": listen, "journal": {"enabled": False},
              "engines": [{"name": "decode", "role": "decode", "url": f"http://127.0.0.1:{dead}",
                           "argv": ["--port", str(dead)]}], **extra}
    path = tmp_path / "exporter.json"
    path.write_text(json.dumps(config))
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdkit.exporter", *args], capture_output=True, text=True, timeout=30)


def test_check_and_bad_config(tmp_path):
    path = write_config(tmp_path)
    done = run("--config", path, "--check")
    assert done.returncode == 0 and "1 engines on gpu09" in done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"node": "x", "engines": [], "port": 1}))
    done = run("--config", str(bad), "--check")
    assert done.returncode == 2 and "unknown key(s) port" in done.stderr


def test_once_prints_the_exposition(tmp_path):
    done = run("--config", write_config(tmp_path), "--once")
    assert done.returncode == 0, done.stderr
    found = samples(done.stdout)
    assert value(found, "pdkit_engine_up", node="gpu09", engine="decode", role="decode") == 0
    assert value(found, "pdkit_engine_scrape_error", endpoint="metrics") == 1
    assert "GET http://127.0.0.1:" in done.stderr and "Connection refused" in done.stderr


def test_once_waits_for_the_gpu_health_probe_and_prints_its_answer(tmp_path):
    # the real probe on an empty fake root: no GPU and no nvidia-smi, so it cannot tell
    root = tmp_path / "root"
    root.mkdir()
    done = subprocess.run([sys.executable, "-m", "pdkit.exporter", "--config", write_config(tmp_path, gpu_health=True),
                           "--once"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PDKIT_TOPOLOGY_ROOT": str(root)})
    assert done.returncode == 0, done.stderr
    found = samples(done.stdout)
    assert value(found, "pdkit_exporter_gpu_probe_error", node="gpu09") == 1
    assert 'why="nvidia-smi -q not read' in done.stdout


def test_serves_metrics_until_sigterm(tmp_path):
    path = write_config(tmp_path)
    port = json.loads(open(path).read())["listen_port"]
    proc = subprocess.Popen([sys.executable, "-m", "pdkit.exporter", "--config", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                resp = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                break
            except requests.ConnectionError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "the exporter did not start listening"
                time.sleep(0.05)
        found = samples(resp.text)
        assert value(found, "pdkit_engine_up", engine="decode") == 0
        assert value(found, "process_resident_memory_bytes") > 0
        assert value(found, "pdkit_exporter_collect_duration_seconds", node="gpu09") < 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
