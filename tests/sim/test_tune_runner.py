"""pdkit tune's gate sequence (correctness, soak, doctor, bench) as the runner drives it, against
sim engines started with the argv pdkit renders for the spec, behind the real smg router.

The baseline passes every gate with the pdkit bench fingerprint recorded; a candidate whose lever
is not in effect (the engines still run the baseline's flags: no roll happened) passes
correctness and soak and is failed by doctor with doctor's reason. Runs in a child process, as
the CLI does (pdkit tune gevent-patches its process first).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from pdkit.sim.localstack import free_ports
from tests.conftest import REPO, write_inventory

from .support import MODEL

CHILD = textwrap.dedent('''
    import json, sys
    from pdkit.roll.pyinfra_api import patch_gevent
    patch_gevent()
    from pathlib import Path
    from pdkit.render import flags
    from pdkit.sim.localstack import LocalProcess, router_command, router_workers_ready, router_serves, wait_for
    from pdkit.tune.runner import GateFailed, Session, prepare

    inventory, campaign, logs, router_port, metrics_port = sys.argv[1:6]
    prep = prepare(inventory, campaign)
    spec = prep.specs["baseline"]
    host = spec.hosts[0]
    procs = []
    try:
        for _, engine in spec.engines():
            argv = [sys.executable, "-m", "pdkit.sim", *flags.sglang_args(spec, host, engine)]
            procs.append(LocalProcess(engine.name, argv, Path(logs) / f"{engine.name}.log",
                                      {"PDKIT_SIM_STARTUP_DELAY_S": "0.2"}).start())
        prefill, decode = (e for _, e in spec.engines())
        procs.append(LocalProcess("router", router_command(prefill.port, prefill.effective_bootstrap_port, decode.port,
                                                           int(router_port), int(metrics_port)), Path(logs) / "router.log").start())
        url = f"http://127.0.0.1:{router_port}"
        wait_for(lambda: router_workers_ready(url) and router_serves(url, model=spec.cluster.model.name), 60, "the router", procs)
        session = Session(prep, [])
        out = {}
        base = {"gates": {}, "timings": {}}
        session.run_gates("baseline", spec, base, None, None)
        out["baseline"] = {"gates": base["gates"], "env": base["bench"]["env"], "levels": [lv["concurrency"] for lv in base["bench"]["levels"]],
                           "answers": len(base["answers"]), "match_rate": base["correctness"]["match_rate"]}
        cand = prep.candidates[0]
        rec = {"gates": {}, "timings": {}}
        try:
            session.run_gates(cand.name, prep.specs[cand.name], rec, base["answers"], cand)
            out["candidate"] = {"gates": rec["gates"], "failed": None}
        except GateFailed as exc:
            out["candidate"] = {"gates": rec["gates"], "failed": exc.gate, "why": exc.why}
        print("RESULT " + json.dumps(out))
    finally:
        for p in reversed(procs):
            p.stop()
''')


def test_runner_gates_pass_the_baseline_and_doctor_fails_a_lever_not_in_effect(tmp_path):
    router_port, metrics_port, prefill_port, bootstrap_port, decode_port = free_ports(5)
    cluster = {"name": "local", "engine": "sim", "sglang_version": "0.5.23", "model": {"path": "/models/sim-test", "served_name": MODEL},
               "target_concurrency": 8, "tuning": {"all": {"context_length": 4096}, "decode": {"cuda_graph_max_bs": 8}}}
    hosts = {"local": {
        "ssh_hostname": "127.0.0.1",
        "pdkit_node": {"gpu": "none", "gpus": {"model": "virtual", "count": 2, "memory_gib": 80, "compute_capability": "9.0"},
                       "engines": [{"name": "prefill", "role": "prefill", "gpus": [0], "port": prefill_port, "bootstrap_port": bootstrap_port},
                                   {"name": "decode", "role": "decode", "gpus": [1], "port": decode_port}]},
        "pdkit_router": {"port": router_port, "prometheus_port": metrics_port},
    }}
    inventory = write_inventory(tmp_path, hosts, cluster)
    campaign = tmp_path / "c.yaml"
    campaign.write_text(json.dumps({
        "name": "local", "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"), "downtime": True,  # one node
        "workload": {"input_len": 16, "output_len": 8, "concurrency": [2, 8], "requests": 8, "warmup": 1},
        "correctness": {"prompts": 8, "max_new_tokens": 8},
        "soak": {"seconds": 2, "max_new_tokens": 8}, "doctor": {"window_s": 1, "probe_requests": 2},
        "candidates": [{"name": "graphs-off", "set": {"decode.cuda_graph": False}}]}))
    logs = tmp_path / "logs"
    logs.mkdir()
    done = subprocess.run([sys.executable, "-c", CHILD, str(inventory), str(campaign), str(logs), str(router_port), str(metrics_port)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    out = json.loads(line.removeprefix("RESULT "))
    base = out["baseline"]
    assert all(g["ok"] for g in base["gates"].values()) and list(base["gates"]) == ["correctness", "soak", "doctor", "bench"], base
    assert base["match_rate"] == 1.0 and base["answers"] == 8
    assert base["levels"] == [2, 8] and base["env"]["engine"] == "sim" and base["env"]["engine_flags"]["local/decode"]
    cand = out["candidate"]
    assert cand["gates"]["correctness"]["ok"] and cand["gates"]["soak"]["ok"], cand
    assert cand["failed"] == "doctor", cand
    assert "local/decode" in cand["why"] and "not in effect" in cand["why"], cand["why"]
