"""The node's GPU health for pdkit-exporter (issue 47 item 4): the preflight's probe
(pdkit/agent/topology_probe.py, judged by pdkit.agent.topology.wedged_gpus, as `pdkit roll` judges it before its
drain: pdkit/hosts/gpuhealth.py) run by the exporter in the background, its last answer published per engine
GPU (`pdkit_engine_gpu_wedged`) and a node-level error when it could not tell
(`pdkit_exporter_gpu_probe_error`).

nvidia-smi can hang on a wedged GPU, so the probe never runs on the scrape path: a scrape starts it
when it is due (GpuProbe.poll) and publishes the last answer it has; the probe itself runs as a
child process with a hard timeout, in its own process group, killed whole when it overruns."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pdkit.agent import topology

# the probe runs at most this often: a full `nvidia-smi -q` costs about a second of CPU on an 8-GPU node
# and the kernel log is read whole, while what it finds (a reset-class Xid, pending page retirement) lasts
# until someone resets the GPU; a minute is well inside PdkitGpuWedged's `for`
PROBE_EVERY_S = 60.0
# the probe bounds its own `nvidia-smi -q` at 120 s (topology_probe.py) and then says so; past this the
# probe itself is stuck and is killed
PROBE_TIMEOUT_S = 150.0


def probe_argv() -> list[str]:
    """The probe as the exporter runs it: the node venv's python on the probe file, its JSON alone."""
    return [sys.executable, str(topology.PROBE_PATH), "--plain"]


def run_probe(argv: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run the probe once: its JSON, or {"error": why} (it did not start, overran TIMEOUT_S, printed no JSON).
    Its own process group is killed on a timeout, so an nvidia-smi it started cannot keep our pipes open."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True, text=True)
    except OSError as exc:
        return {"error": f"the GPU probe did not start: {exc.strerror or exc}"}
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass  # it ended between the timeout and the kill
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # a child in uninterruptible sleep: the thread moves on, the OS reaps it later
        return {"error": f"the GPU probe did not finish in {timeout_s:g} s (nvidia-smi hangs on a wedged GPU)"}
    try:
        probe = json.loads(stdout)
    except ValueError:
        lines = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
        return {"error": f"the GPU probe printed no JSON (exit {proc.returncode}): "
                         f"{lines[-1][:200] if lines else 'no output'}"}
    return probe if isinstance(probe, dict) else {"error": "the GPU probe printed JSON that is not an object"}


@dataclass(frozen=True)
class GpuState:
    """One GPU an engine uses, as the last probe judged it."""

    gpu: int
    bdf: str
    wedged: bool
    seen: str  # what was seen ("; "-joined), "" when healthy


def judge(probe: dict[str, Any], gpus: Iterable[int], engines_serving: bool) -> tuple[list[GpuState], str | None]:
    """Pure: (the state of each of GPUS the probe found, why it cannot tell) from one probe answer.
    ENGINES_SERVING: the node's engines run, so a busy GPU with no listed process is no sign (in a
    container nvidia-smi lists no process of another PID namespace). Without `nvidia-smi -q` nothing
    says a GPU is healthy: only GPUs wedged by what the kernel log says are given, with the reason."""
    if probe.get("error"):
        return [], str(probe["error"])
    topo = topology.parse_probe(probe)
    wedged = {w.index: w for w in topology.wedged_gpus(topo, engines_serving=engines_serving)}
    cannot_tell = None
    if not probe.get("nvidia_smi_q"):
        said = [u for u in topo.unread if u.startswith("nvidia-smi")]
        cannot_tell = f"nvidia-smi -q not read ({said[0] if said else 'no output'})"
    out = []
    for gpu in sorted(set(gpus)):
        place = topo.gpus.get(gpu)
        if place is None:
            continue
        w = wedged.get(gpu)
        if w is not None:
            out.append(GpuState(gpu, w.bdf, True, "; ".join(w.seen)))
        elif cannot_tell is None:
            out.append(GpuState(gpu, place.bdf, False, ""))
    return out, cannot_tell


class GpuProbe:
    """The probe, run in the background at most every PROBE_EVERY_S; `poll` starts it when due and never
    waits for it, `last` is its last answer."""

    def __init__(self, run: Callable[[], dict[str, Any]] | None = None, clock: Callable[[], float] = time.monotonic,
                 every_s: float = PROBE_EVERY_S, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.run = run if run is not None else (lambda: run_probe(probe_argv(), timeout_s))
        self.clock = clock
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdkit-exporter-gpu")
        self.future: cf.Future[dict[str, Any]] | None = None
        self.started_at: float | None = None
        self.last: dict[str, Any] | None = None  # the last answer, None before the first one

    def poll(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the last answer, why it is stale) after starting a run when one is due; never blocks."""
        now = self.clock()
        if self.future is not None and self.future.done():
            exc = self.future.exception()
            self.last = self.future.result() if exc is None else {"error": f"the GPU probe failed: {exc!r}"}
            self.future = None
        if self.future is None and (self.started_at is None or now - self.started_at >= self.every_s):
            self.started_at = now
            self.future = self.pool.submit(self.run)
        stale = None
        if self.future is not None and self.started_at is not None and now - self.started_at > self.timeout_s + 10:
            stale = f"the GPU probe started {now - self.started_at:.0f} s ago has not ended (a hung nvidia-smi)"
        return self.last, stale

    def wait(self) -> None:
        """Wait for the run in progress (bounded by the probe's own timeout): `--once` prints its answer."""
        if self.future is not None:
            cf.wait([self.future], timeout=self.timeout_s + 10)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["PROBE_EVERY_S", "PROBE_TIMEOUT_S", "GpuProbe", "GpuState", "judge", "probe_argv", "run_probe"]
