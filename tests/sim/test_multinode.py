"""Issue 20: sim ranks of an engine spanning nodes meet and fail as SGLang's do (loopback).

Rank 0 (the only HTTP server) becomes ready only once every rank joined at --dist-init-addr;
a lost rank makes the others exit 1 with NCCL's watchdog message (systemd's Restart=on-failure
then starts them again), and restarted ranks meet again.
"""

from __future__ import annotations

import signal
import time

from .support import free_ports, post, sim_argv, status_of, wait_until

LOSS_S = "1"
ENV = {"PDKIT_SIM_RANK_LOSS_TIMEOUT_S": LOSS_S}


def _rank_argv(port: int, dist_port: int, rank: int, nnodes: int = 2) -> list[str]:
    # every rank the same argv but --node-rank, as pdkit.render.flags renders them
    return sim_argv("null", port, extra=["--tp-size", "4", "--nnodes", str(nnodes), "--node-rank", str(rank),
                                         "--dist-init-addr", f"127.0.0.1:{dist_port}"])


def _start(procs, name, port, dist, rank, nnodes=2):
    return procs.start(name, _rank_argv(port, dist, rank, nnodes), ENV)


def _ready(port: int) -> bool:
    return status_of(f"http://127.0.0.1:{port}/health") == 200


def _exited(proc) -> str | None:
    """The exit status as text once the process ended ("0" is truthy for wait_until), else None."""
    code = proc.popen.poll()
    return None if code is None else str(code)


def test_rank_0_is_ready_only_when_every_rank_joined(procs):
    port, dist = free_ports(2)
    rank0 = _start(procs, "rank0", port, dist, 0)
    wait_until(lambda: status_of(f"http://127.0.0.1:{port}/health") not in (0, None), 10, "rank 0's HTTP to answer", context=procs.logs)
    time.sleep(1.0)  # well past the 0.2 s startup delay: still waiting for rank 1
    assert not _ready(port), procs.logs()
    assert "waiting for 1 rank(s)" in rank0.log_text()
    rank1 = _start(procs, "rank1", port, dist, 1)  # the same --port: rank 1 binds no HTTP server
    wait_until(lambda: _ready(port), 15, "rank 0 ready after rank 1 joined", context=procs.logs)
    assert "dist init: all 2 ranks joined" in rank0.log_text()
    assert "runs no HTTP server" in rank1.log_text() and rank1.popen.poll() is None
    r = post(f"http://127.0.0.1:{port}/v1/completions", {"model": "sim-test", "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200, r.text


def test_a_lost_rank_ends_the_others_like_an_nccl_timeout_and_restarted_ranks_meet_again(procs):
    port, dist = free_ports(2)
    rank0 = _start(procs, "rank0", port, dist, 0)
    rank1 = _start(procs, "rank1", port, dist, 1)
    wait_until(lambda: _ready(port), 15, "the first meeting", context=procs.logs)

    rank1.popen.send_signal(signal.SIGKILL)  # a node lost: no goodbye
    lost = time.monotonic()
    code = wait_until(lambda: _exited(rank0), 10, "rank 0 to exit on the lost rank", context=procs.logs)
    assert code == "1", procs.logs()
    assert time.monotonic() - lost < 5
    assert "ProcessGroupNCCL's watchdog caught collective operation timeout" in rank0.log_text()

    # systemd restarts both (Restart=on-failure); in either order they meet again
    rank1b = _start(procs, "rank1b", port, dist, 1)
    time.sleep(0.5)
    rank0b = _start(procs, "rank0b", port, dist, 0)
    wait_until(lambda: _ready(port), 15, "the ranks to meet again", context=procs.logs)

    rank0b.popen.send_signal(signal.SIGKILL)  # rank 0 lost: the other rank exits too
    code = wait_until(lambda: _exited(rank1b), 10, "rank 1 to exit on losing rank 0", context=procs.logs)
    assert code == "1" and "ProcessGroupNCCL's watchdog" in rank1b.log_text()


def test_a_rank_started_with_another_layout_is_refused_and_sigterm_is_a_clean_stop(procs):
    port, dist = free_ports(2)
    rank0 = _start(procs, "rank0", port, dist, 0, nnodes=2)
    wrong = _start(procs, "wrong", port, dist, 1, nnodes=3)
    wait_until(lambda: "was started with --nnodes 3, rank 0 with 2" in rank0.log_text(), 10, "the refusal", context=procs.logs)
    assert not _ready(port)
    wrong.popen.send_signal(signal.SIGTERM)
    assert wait_until(lambda: _exited(wrong), 10, "the refused rank to stop on SIGTERM", context=procs.logs) == "0"
    rank0.popen.send_signal(signal.SIGTERM)
    assert wait_until(lambda: _exited(rank0), 10, "rank 0 to stop on SIGTERM", context=procs.logs) == "0"


def test_a_spanning_engine_without_dist_init_addr_fails_at_start(procs):
    port, = free_ports(1)
    proc = procs.start("bad", sim_argv("null", port, extra=["--nnodes", "2", "--node-rank", "1"]), ENV)
    assert wait_until(lambda: _exited(proc), 10, "the sim to refuse", context=procs.logs) == "2"
    assert "--dist-init-addr" in proc.log_text()
