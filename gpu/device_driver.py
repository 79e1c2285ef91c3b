"""pdkit GPU tier, device side: run EXACTLY the units pdkit rendered, gate them, load them, measure.

gpu/run_gpu_tier.py renders inventories/h200.py (and its variants) with pdkit's own functions
into gpu-payload/plan.json and copies this file beside it. On the GPU machine:

    python3 gpu-payload/device_driver.py run --out "$OUT"

Stdlib only (it runs under the device image's python3 before anything is unpacked); the router
readiness gate is pdkit's own (`pdkit.agent.health.wait_router`, also stdlib only, from the carried
repo). What it does, in order:

1. unpacks the carried payload (SGLang and its deps, NIXL, sglang-router) under /opt/pdkit, puts
   the model directory where the inventory says, and places an interpreter at the rendered
   argv[0] (pdkit.render.flags.engine_python: /opt/pdkit/engine-venv/bin/python, or <engine_venv>/bin/python on a
   node with its own engine environment; /opt/pdkit/router-venv/bin/python): a two-line shell
   script that execs the image's python3 with the payload first on PYTHONPATH. So the argv run
   is the rendered one byte for byte, argv[0] included;
2. writes every rendered file (units, env files, release.json) to its absolute path, then for
   each service reads ExecStart= back from the unit file, un-quotes it as systemd does and
   ASSERTS that it equals the argv pdkit.render.flags produced (plan.json), reads the unit's
   EnvironmentFile= files and starts the process with those variables over the machine's
   environment, in the unit's WorkingDirectory;
3. gates: an engine is ready when its log holds SGLang's readiness line and /health answers
   200; the router when pdkit.agent.health.wait_router says so (every planned worker listed healthy
   in GET /workers, then a real completion) -- its /health alone proves nothing (see pdkit/agent/health.py);
4. per phase (base, decode CUDA graphs off, larger KV page, base again warm): a completion and
   a streaming chat completion through the router, SGLang's own bench (sglang.benchmark.serving,
   random-ids + --tokenize-prompt, fixed lengths) at each concurrency through the router, both
   engines' and the router's /metrics before and after; a phase restarts only the services
   whose rendered files changed, as a pdkit rollout would;
5. writes $OUT/results.json (every figure), $OUT/summary.md and $OUT/logs.tar.xz (all logs,
   bench JSONL, raw metrics, versions), refreshed after every step so a timeout still returns
   what was measured.

`rehearse` runs the same steps on a CPU machine with `python -m pdkit.sim` in place of
`sglang.launch_server` (the flags stay identical) and a file-system root prefix, to check the
driver itself without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

# the kit's own gate (stdlib only); the driver must use it, not a copy
from pdkit.agent.health import READY_LOG_LINE, http_request, router_worker_health, wait_router  # noqa: E402

T0 = time.monotonic()
# The bench client only (not the rendered engines): the GPU machine has no network, and without
# these transformers/huggingface_hub look the served model name up on the hub first (five retries,
# ~25 s, several times per bench run: seen on the first device run)
BENCH_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def now() -> float:
    return round(time.monotonic() - T0, 1)


def log(msg: str) -> None:
    print(f"[{now():7.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------- systemd file parsing


def unit_lines(text: str) -> list[str]:
    """A unit file's logical lines: continuation backslashes joined, comments dropped."""
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        if not buf and raw.lstrip().startswith(("#", ";")):
            continue
        if raw.endswith("\\"):
            buf += raw[:-1] + " "
            continue
        out.append(buf + raw)
        buf = ""
    if buf:
        out.append(buf)
    return out


def unit_values(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit_lines(text) if line.startswith(key + "=")]


def systemd_split(command: str) -> list[str]:
    """Split an ExecStart= value as systemd does for what pdkit.render.plan.systemd_quote writes."""
    args: list[str] = []
    i, n = 0, len(command)
    while i < n:
        while i < n and command[i] in " \t":
            i += 1
        if i >= n:
            break
        token = []
        if command[i] == '"':
            i += 1
            while i < n and command[i] != '"':
                if command[i] == "\\" and i + 1 < n:
                    i += 1
                token.append(command[i])
                i += 1
            i += 1  # closing quote
        else:
            while i < n and command[i] not in " \t":
                token.append(command[i])
                i += 1
        args.append("".join(token).replace("%%", "%").replace("$$", "$"))
    return args


def env_file_vars(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        env[key.strip()] = value
    return env


# --------------------------------------------------------------------------- HTTP helpers


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    return http_request(url, timeout=timeout)


def http_post(url: str, payload: dict, timeout: float = 60.0) -> tuple[int, str, float]:
    start = time.monotonic()
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace"), time.monotonic() - start
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), time.monotonic() - start
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc), time.monotonic() - start


def http_stream(url: str, payload: dict, timeout: float = 60.0) -> dict:
    """POST a streaming request; count SSE chunks, the text they carry and whether [DONE] came."""
    start = time.monotonic()
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    result: dict = {"status": 0, "chunks": 0, "done": False, "text": "", "first_chunk_s": None}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            result["status"] = resp.status
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    result["done"] = True
                    break
                if result["first_chunk_s"] is None:
                    result["first_chunk_s"] = round(time.monotonic() - start, 3)
                result["chunks"] += 1
                try:
                    delta = json.loads(data)["choices"][0].get("delta", {})
                    result["text"] += delta.get("content") or ""
                except (ValueError, KeyError, IndexError, TypeError):
                    result.setdefault("unparsed", []).append(data[:200])
    except urllib.error.HTTPError as exc:
        result["status"] = exc.code
        result["error"] = exc.read().decode(errors="replace")[:500]
    except (urllib.error.URLError, OSError) as exc:
        result["error"] = str(exc)
    result["seconds"] = round(time.monotonic() - start, 3)
    result["text"] = result["text"][:300]
    return result


METRIC_PATTERN = re.compile(
    r"^(sglang:(kv_transfer\w*|num_bootstrap_failed_reqs_total|num_transfer_failed_reqs_total|cuda_graph_passes_total"
    r"|startup\w*|num_requests_total|generation_tokens_total|prompt_tokens_total|num_aborted_requests_total"
    r"|is_cuda_graph|kv_transfer_\w+)|sgl_router_\w+|smg_\w+)"
)


def run_tag(phase: str, run: dict, bench: dict) -> str:
    """A bench run's name: phase, concurrency and, where it is not the plan's default, the prompt length."""
    length = run.get("input_len", bench["input_len"])
    return f"{phase}-c{run['concurrency']}" + ("" if length == bench["input_len"] else f"-in{length}")


def scrape(url: str) -> tuple[str, dict[str, float]]:
    status, body = http_get(url, timeout=10)
    picked: dict[str, float] = {}
    if status != 200:
        return f"# {url} answered {status}: {body[:300]}\n", picked
    for line in body.splitlines():
        if line.startswith("#") or not METRIC_PATTERN.match(line):
            continue
        try:
            name, value = line.rsplit(" ", 1)
            picked[name] = float(value)
        except ValueError:
            continue
    return body, picked


# --------------------------------------------------------------------------- processes


class Service:
    def __init__(self, spec: dict, driver: Driver):
        self.spec = spec
        self.driver = driver
        self.unit = spec["unit"]
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.started_at = 0.0
        self.signature: str | None = None

    def argv_and_env(self, files: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
        unit_path = self.spec["unit_path"]
        unit_text = self.driver.read(unit_path)
        assert unit_text == files[unit_path], f"{unit_path}: on-disk unit differs from the rendered one"
        exec_start = unit_values(unit_text, "ExecStart")
        assert len(exec_start) == 1, f"{self.unit}: expected one ExecStart=, found {len(exec_start)}"
        argv = systemd_split(exec_start[0])
        rendered = self.spec["argv"]
        # the assertion the GPU tier rests on: what runs is what pdkit rendered, flag for flag
        assert argv == rendered, f"{self.unit}: ExecStart in the unit file != pdkit.render.flags argv\n{argv}\n{rendered}"
        i = argv.index("-m")
        assert argv[i + 1] == self.spec["module"], f"{self.unit}: module {argv[i + 1]} != {self.spec['module']}"
        env = dict(os.environ)
        env.update(self.driver.base_env)
        env_from_files: dict[str, str] = {}
        for path in unit_values(unit_text, "EnvironmentFile"):
            path = path.lstrip("-")
            env_from_files.update(env_file_vars(self.driver.read(path)))
        env.update(env_from_files)
        workdir = (unit_values(unit_text, "WorkingDirectory") or ["/"])[0]
        run_argv = self.driver.runnable(argv, self.spec)
        self.driver.record_command(self.unit, argv, run_argv, env_from_files)
        return run_argv, env, workdir

    def start(self, files: dict[str, str], tag: str) -> None:
        argv, env, workdir = self.argv_and_env(files)
        workdir_path = Path(self.driver.host_path(workdir))
        workdir_path.mkdir(parents=True, exist_ok=True)
        self.log_path = self.driver.logs / f"{tag}-{self.unit.replace('.service', '')}.log"
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=workdir_path,
                                         start_new_session=True)
        self.started_at = time.monotonic()
        self.signature = self.driver.signature(self.spec, files)
        log(f"started {self.unit} (pid {self.proc.pid}) -> {self.log_path.name}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def tail(self, n: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 15)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # SGLang's scheduler/detokenizer children share the session: make sure none survive, and,
        # as systemd does for a unit's cgroup, wait until they are gone: their GPU memory is only
        # free then (a decode restarted at once found 14 of 140 GB free and sized its KV pool to it)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.2)
        log(f"stopped {self.unit} (exit {self.proc.poll()})")
        self.proc = None


def start_waves(engines: list[dict], files: dict[str, str]) -> list[list[dict]]:
    """ENGINES in start order: each wave after the engines its units name in After= are ready."""
    units = {e["unit"] for e in engines}
    after = {e["unit"]: set(unit_values(files[e["unit_path"]], "After")) & units for e in engines}
    waves, done = [], set()
    while len(done) < len(engines):
        wave = [e for e in engines if e["unit"] not in done and after[e["unit"]] <= done]
        if not wave:
            raise RuntimeError(f"engine units order each other in a cycle: {after}")
        waves.append(wave)
        done |= {e["unit"] for e in wave}
    return waves


def wait_engine(svc: Service, timeout: float) -> dict:
    """pdkit's engine gate: the readiness line in THIS run's log, then /health 200."""
    # not pdkit.agent.health.wait_engine on purpose: the device runs engines as plain processes, no systemd unit or journal to read
    start = svc.started_at
    deadline = start + timeout
    seen_line = None
    while time.monotonic() < deadline:
        if not svc.alive():
            return {"ready": False, "reason": f"process exited {svc.proc.poll() if svc.proc else '?'}",
                    "log_tail": svc.tail(40)}
        if seen_line is None and READY_LOG_LINE in svc.log_text():
            seen_line = time.monotonic() - start
        if seen_line is not None:
            status, body = http_get(svc.spec["health_url"], timeout=5)
            if status == 200:
                return {"ready": True, "seconds": round(time.monotonic() - start, 1),
                        "ready_line_s": round(seen_line, 1)}
        time.sleep(0.5)
    return {"ready": False, "reason": f"not ready after {timeout:.0f} s", "log_tail": svc.tail(40)}


# --------------------------------------------------------------------------- the driver


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.plan = json.loads((HERE / "plan.json").read_text())
        self.rehearse = args.mode == "rehearse"
        self.root = Path(args.root) if self.rehearse else Path("/")
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.deadline = T0 + args.budget_s
        self.services: dict[str, Service] = {}
        self.current_metrics_urls: dict[str, str] | None = None
        self.results: dict = {
            "mode": args.mode,
            "plan_digest": self.plan["digest"],
            "inventory": self.plan["inventory"],
            "commands": {},
            "phases": {},
            "events": [],
            "failures": [],
        }
        # keep NVLink multicast off whatever a process does with its environment (KINDS.md)
        self.base_env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
        self.python = sys.executable

    # paths: on the device the rendered absolute paths are used as they are; a rehearsal prefixes them
    def host_path(self, path: str) -> str:
        if not self.rehearse:
            return path
        return str(self.root / path.lstrip("/"))

    def read(self, path: str) -> str:
        return Path(self.host_path(path)).read_text()

    def runnable(self, argv: list[str], spec: dict) -> list[str]:
        if not self.rehearse:
            return list(argv)  # byte-identical, argv[0] included (a wrapper sits there)
        run = [self.host_path(argv[0]), *argv[1:]]
        if spec["kind"] == "engine":
            i = run.index("-m")
            run[i + 1] = "pdkit.sim"  # the rehearsal engine takes SGLang's exact flags
        return run

    def signature(self, spec: dict, files: dict[str, str]) -> str:
        return json.dumps([files.get(p, "") for p in spec["files"]])

    def record_command(self, unit: str, argv: list[str], run_argv: list[str], env: dict[str, str]) -> None:
        self.results["commands"].setdefault(unit, [])
        entry = {"argv": argv, "env_from_files": env, "ran": run_argv if run_argv != argv else "identical"}
        if entry not in self.results["commands"][unit]:
            self.results["commands"][unit].append(entry)

    def event(self, what: str, **data) -> None:
        entry = {"t": now(), "what": what, **data}
        self.results["events"].append(entry)
        log(what + (" " + json.dumps(data)[:300] if data else ""))

    def fail(self, what: str, **data) -> None:
        self.results["failures"].append({"t": now(), "what": what, **data})
        log("FAILURE: " + what + " " + json.dumps(data)[:1500])

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # ----------------------------------------------------------------- setup

    def setup(self) -> None:
        t = time.monotonic()
        payload = HERE
        site = Path(self.host_path(self.plan["site_dir"]))
        router_site = Path(self.host_path(self.plan["router_site_dir"]))
        for tarball, dest in (("site.tar.xz", site), ("nixl.tar.xz", site), ("router.tar.xz", router_site)):
            src = payload / tarball
            if not src.exists():
                self.fail(f"payload {tarball} missing")
                continue
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(src, "r:xz") as tar:  # no xz binary needed on the image
                tar.extractall(dest, filter="tar") if sys.version_info >= (3, 12) else tar.extractall(dest)
        if self.rehearse:
            # the payload holds only the sm90 kernels; a CPU-only torch asks sgl_kernel for sm100
            sm100 = site / "sgl_kernel" / "sm100"
            if not sm100.exists():
                sm100.symlink_to("sm90")
        model_src = payload / "model"
        model_dst = Path(self.host_path(self.plan["model_dir"]))
        if model_dst.exists():
            shutil.rmtree(model_dst)
        shutil.copytree(model_src, model_dst)
        for key, site_dirs in (("engine_python", [site]), ("router_python", [router_site, site])):
            wrapper = Path(self.host_path(self.plan[key]))
            wrapper.parent.mkdir(parents=True, exist_ok=True)
            pythonpath = ":".join(str(s) for s in site_dirs)
            if self.rehearse:
                pythonpath += ":" + str(REPO)  # pdkit.sim
            wrapper.write_text(
                "#!/bin/sh\n"
                "# pdkit GPU tier: the image's python with the carried payload first on sys.path\n"
                f'export PYTHONPATH="{pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
                f'exec "{self.python}" "$@"\n'
            )
            wrapper.chmod(0o755)
        for d in self.plan["state_dirs"]:
            Path(self.host_path(d)).mkdir(parents=True, exist_ok=True)
        self.event("setup done", seconds=round(time.monotonic() - t, 1))
        # versions and imports are read beside the first start, not before it (device time)
        self.versions_thread = threading.Thread(target=self.versions, daemon=True)
        self.versions_thread.start()

    def versions(self) -> None:
        code = (
            "import importlib, json, sys\n"
            "out = {'python': sys.version.split()[0]}\n"
            "for m in ['torch', 'triton', 'sglang', 'sgl_kernel', 'flashinfer', 'transformers', 'tokenizers', "
            "'xgrammar', 'nixl_cu13', 'sglang_router']:\n"
            "    try:\n"
            "        mod = importlib.import_module(m)\n"
            "        out[m] = getattr(mod, '__version__', None) or getattr(getattr(mod, 'version', None), '__version__', '?')\n"
            "        out[m + '_file'] = getattr(mod, '__file__', None)\n"
            "    except Exception as e:\n"
            "        out[m] = 'IMPORT FAILED: %s: %s' % (type(e).__name__, str(e)[:300])\n"
            "try:\n"
            "    import torch\n"
            "    out['torch_cuda'] = torch.version.cuda\n"
            "    out['gpus'] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]\n"
            "    out['capability'] = [list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]\n"
            "except Exception as e:\n"
            "    out['gpus'] = str(e)\n"
            "print(json.dumps(out))\n"
        )
        info: dict = {}
        for key in ("engine_python", "router_python"):
            proc = subprocess.run([self.host_path(self.plan[key]), "-c", code], capture_output=True, text=True, timeout=240)
            try:
                info[key] = json.loads(proc.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                info[key] = {"error": (proc.stdout + proc.stderr)[-2000:]}
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True) if shutil.which("nvidia-smi") else None
        info["nvidia_smi"] = smi.stdout.strip() if smi else "nvidia-smi not found"
        if shutil.which("nvidia-smi"):
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
            (self.logs / "nvidia-smi-topo.txt").write_text(topo.stdout + topo.stderr)
        self.results["versions"] = info
        self.event("versions", **{k: v for k, v in info.get("engine_python", {}).items() if not k.endswith("_file")})

    # ----------------------------------------------------------------- phases

    def write_files(self, files: dict[str, str]) -> None:
        for path, content in files.items():
            p = Path(self.host_path(path))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)

    def apply(self, name: str, variant: dict, force_engines: bool = False) -> dict:
        """Lay down a variant's files; (re)start the services whose files changed; gate them.

        force_engines restarts the engines even when nothing changed (a warm restart, measured).
        """
        files = variant["files"]
        specs = variant["services"]
        # a variant with other units (the unified reference after a PD pair): stop what it lacks first,
        # so its engines find the GPU memory free
        for unit in [u for u in self.services if u not in {s["unit"] for s in specs}]:
            self.services.pop(unit).stop()
        self.write_files(files)
        changed_engines, router_changed = [], False
        for spec in specs:
            svc = self.services.get(spec["unit"])
            sig = self.signature(spec, files)
            forced = force_engines and spec["kind"] == "engine"
            if forced or svc is None or not svc.alive() or svc.signature != sig:
                if spec["kind"] == "engine":
                    changed_engines.append(spec)
                else:
                    router_changed = True
        # PartOf= (engines sharing a GPU): restarting the earlier engine restarts the later one too
        for spec in specs:
            if spec["kind"] == "engine" and spec not in changed_engines:
                part_of = set(unit_values(files[spec["unit_path"]], "PartOf"))
                if part_of & {c["unit"] for c in changed_engines}:
                    changed_engines.append(spec)
        info: dict = {"restarted": [s["unit"] for s in changed_engines] + (["router"] if router_changed else [])}
        # stop what changes first (GPU memory must be free before the new engine starts)
        for spec in changed_engines:
            if spec["unit"] in self.services:
                self.services[spec["unit"]].stop()
        if router_changed and "pdkit-router.service" in self.services:
            self.services["pdkit-router.service"].stop()
        t_start = time.monotonic()
        timeout = min(self.plan["ready_timeout_s"], max(30.0, self.left() - 60))
        engines_ok = True
        # as systemd would: an engine whose unit says After=<an engine started here> (and waits for
        # its /health in ExecStartPre) starts once that one is ready; the others start together
        for wave in start_waves(changed_engines, files):
            for spec in wave:
                svc = Service(spec, self)
                self.services[spec["unit"]] = svc
                svc.start(files, name)
            for spec in wave:
                gate = wait_engine(self.services[spec["unit"]], timeout - (time.monotonic() - t_start))
                info[f"ready_{spec['engine']}"] = gate
                if not gate["ready"]:
                    engines_ok = False
                    self.fail(f"{name}: engine {spec['engine']} not ready", **gate)
            if not engines_ok:
                break
        info["engines_ready_s"] = round(time.monotonic() - t_start, 1)
        if not engines_ok:
            return info
        router_spec = next(s for s in specs if s["kind"] == "router")
        if router_changed:
            svc = Service(router_spec, self)
            self.services[router_spec["unit"]] = svc
            svc.start(files, name)
        info["router"] = self.gate_router(router_spec, min(self.plan["router_ready_timeout_s"], max(20.0, self.left() - 30)))
        info["ready_s"] = round(time.monotonic() - t_start, 1)
        return info

    def gate_router(self, spec: dict, timeout: float) -> dict:
        base = spec["base_url"]
        t0 = time.monotonic()
        svc = self.services[spec["unit"]]
        health_200 = None
        first_workers = None
        listed_healthy = None
        workers_status = None
        while time.monotonic() - t0 < timeout:
            if not svc.alive():
                return {"ready": False, "reason": "router exited", "log_tail": svc.tail(30)}
            if health_200 is None and http_get(base + "/health", timeout=3)[0] == 200:
                health_200 = round(time.monotonic() - t0, 1)
            status, body = http_get(base + "/workers", timeout=3)
            workers_status = status
            if status == 200:
                if first_workers is None:
                    first_workers = body[:1500]
                try:
                    health = router_worker_health(body)
                except (ValueError, AttributeError):
                    health = {}
                wanted = [w.rstrip("/") for w in spec["expected_workers"]]
                if wanted and all(health.get(w) for w in wanted):
                    listed_healthy = round(time.monotonic() - t0, 1)
                    break
            time.sleep(0.5)
        result = {"health_200_s": health_200, "workers_http_status": workers_status,
                  "first_workers_body": first_workers, "workers_healthy_s": listed_healthy}
        # then the kit's own gate, unchanged: workers healthy AND a real completion through the router
        ok, message = wait_router(base, spec["expected_workers"], max(10.0, timeout - (time.monotonic() - t0)),
                                  model=spec["model"])
        result.update({"ready": ok, "kit_gate": message, "seconds": round(time.monotonic() - t0, 1)})
        status, body = http_get(base + "/workers", timeout=3)
        result["workers_body"] = body[:3000]
        if not ok:
            self.fail("router gate (pdkit.agent.health.wait_router) failed", **result, log_tail=svc.tail(30))
        return result

    def smoke(self, spec: dict) -> dict:
        base = spec["base_url"]
        model = spec["model"]
        status, body, secs = http_post(base + "/v1/completions",
                                       {"model": model, "prompt": "pdkit on an H200 says", "max_tokens": 16,
                                        "temperature": 0})
        completion = {"status": status, "seconds": round(secs, 3), "body": body[:600]}
        chat = http_stream(base + "/v1/chat/completions",
                           {"model": model, "messages": [{"role": "user", "content": "Say hello to pdkit."}],
                            "max_tokens": 16, "stream": True, "temperature": 0})
        ok = status == 200 and chat.get("status") == 200 and chat.get("done") and chat.get("chunks", 0) > 0
        if not ok:
            self.fail("smoke requests through the router failed", completion=completion, chat=chat)
        return {"ok": bool(ok), "completion": completion, "chat_stream": chat}

    def metrics(self, tag: str, variant: dict | None = None) -> dict:
        picked: dict = {}
        urls = (variant or {}).get("metrics_urls") or self.plan["metrics_urls"]
        for name, url in urls.items():
            body, values = scrape(url)
            (self.logs / f"metrics-{tag}-{name}.txt").write_text(body)
            picked[name] = values
        return picked

    def bench(self, tag: str, runs: list[dict]) -> list[dict]:
        """SGLang's own bench, in one process for all concurrencies (its CLI parser, its cli_main)."""
        spec = self.plan["bench"]
        jsonl = self.logs / f"bench-{tag}.jsonl"
        argvs = []
        for run in runs:
            argvs.append([
                "--backend", "sglang", "--base-url", spec["base_url"], "--model", spec["model"],
                "--tokenizer", self.host_path(self.plan["model_dir"]),
                "--dataset-name", "random-ids", "--tokenize-prompt",
                "--random-input-len", str(run.get("input_len", spec["input_len"])),
                "--random-output-len", str(run.get("output_len", spec["output_len"])),
                "--random-range-ratio", "1", "--num-prompts", str(run["prompts"]),
                "--max-concurrency", str(run["concurrency"]), "--request-rate", "inf",
                "--seed", "1", "--warmup-requests", "1", "--ready-check-timeout-sec", "0",
                "--output-file", str(jsonl), "--tag", run_tag(tag, run, spec),
            ])
        runs_file = self.work / f"bench-{tag}.json"
        # every engine's /metrics before and after each run, so KV figures are per run (issue 33)
        urls = {k: v for k, v in (self.current_metrics_urls or {}).items() if k != "router"}
        runs_file.write_text(json.dumps({"argvs": argvs, "tags": [run_tag(tag, r, spec) for r in runs],
                                         "scrape": urls, "scrape_dir": str(self.logs)}))
        python = self.host_path(self.plan["engine_python"])
        before = len(jsonl.read_text().splitlines()) if jsonl.exists() else 0
        timeout = max(30.0, self.left() - 20)
        with open(self.logs / f"bench-{tag}.log", "ab") as fh:
            try:
                proc = subprocess.run([python, str(HERE / "device_driver.py"), "bench-loop", str(runs_file)],
                                      stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, env={**os.environ, **self.base_env, **BENCH_ENV})
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        rows = []
        if jsonl.exists():
            for line in jsonl.read_text().splitlines()[before:]:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        keep = ("tag", "max_concurrency", "completed", "duration", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_throughput", "mean_ttft_ms", "median_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
                "p99_itl_ms", "mean_e2e_latency_ms", "max_output_tokens_per_s", "concurrency")
        summary = [{k: r.get(k) for k in keep} for r in rows]
        if rc != 0 or len(rows) != len(runs):
            self.fail(f"bench {tag}: exit {rc}, {len(rows)} of {len(runs)} runs reported",
                      log_tail="\n".join((self.logs / f"bench-{tag}.log").read_text(errors="replace").splitlines()[-30:]))
        for r in summary:
            self.event(f"bench {r['tag']}", output_tok_s=round(r["output_throughput"] or 0, 1),
                       median_tpot_ms=round(r["median_tpot_ms"] or 0, 2), completed=r["completed"])
        return summary

    def tools(self, name: str, tools: dict) -> dict:
        """pdkit's own bench and doctor against the live stack (gpu/pdkit_tools.py, spec as JSON)."""
        out = self.work / f"tools-{name}.json"
        # the engine's interpreter: the carried site (pydantic with it) first, then the image's packages
        python = self.host_path(self.plan["engine_python"])
        argv = [python, str(REPO / "gpu" / "pdkit_tools.py"), "--spec", str(HERE / tools["spec"]),
                "--out", str(out), "--runs", str(self.work / "runs.jsonl"), "--label", name,
                "--sglang-python", python,
                "--tokenizer", self.host_path(self.plan["model_dir"]), *tools["args"]]
        env = {**os.environ, **self.base_env, **BENCH_ENV, "PYTHONPATH": str(REPO)}
        t = time.monotonic()
        self.event(f"tools {name}: " + " ".join(tools["args"]))
        with open(self.logs / f"tools-{name}.log", "ab") as fh:
            try:
                rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                    timeout=max(30.0, self.left() - 20)).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        res = json.loads(out.read_text()) if out.exists() else {}
        res["exit"], res["seconds"] = rc, round(time.monotonic() - t, 1)
        if rc != 0:
            self.fail(f"tools {name}: exit {rc}", log_tail="\n".join(
                (self.logs / f"tools-{name}.log").read_text(errors="replace").splitlines()[-30:]))
        return res

    def phase(self, name: str, variant: dict, runs: list[dict], smoke: bool, need_s: float,
              force_engines: bool = False, tools: dict | None = None) -> None:
        if self.left() < need_s:
            self.results["phases"][name] = {"skipped": f"only {self.left():.0f} s of the budget left, needs ~{need_s:.0f} s"}
            self.event(f"phase {name} skipped (budget)")
            return
        self.event(f"phase {name}: {variant['description']}")
        res: dict = {"description": variant["description"], "argv_changes": variant.get("argv_changes", {})}
        self.results["phases"][name] = res
        res["start"] = self.apply(name, variant, force_engines)
        self.save()
        partial = len(res["start"].get("restarted", [])) < len(variant["services"])
        if partial and not res["start"].get("router", {}).get("ready") and self.left() > need_s:
            # a rollout that restarts only the changed units left the pair unusable: a kit finding.
            # Record it, then restart every service of the phase so the measurement can go on.
            self.fail(f"{name}: partial restart {res['start'].get('restarted')} left the stack unready; restarting all")
            for svc in list(self.services.values())[::-1]:
                svc.stop()
            self.services.clear()
            res["start_after_full_restart"] = self.apply(name, variant)
            res["start"]["router"] = res["start_after_full_restart"].get("router", {})
            self.save()
        if not res["start"].get("router", {}).get("ready"):
            self.event(f"phase {name}: stack not ready, no load")
            return
        if smoke:
            res["smoke"] = self.smoke(variant["services"][-1])
            self.save()
        self.current_metrics_urls = variant.get("metrics_urls") or self.plan["metrics_urls"]
        res["metrics_before"] = self.metrics(f"{name}-before", variant)
        if runs:
            warm = variant.get("warmup")
            if warm:
                res["warmup"] = self.bench(f"{name}-warmup", [warm])
            res["bench"] = self.bench(name, runs)
        if tools:
            res["pdkit"] = self.tools(name, tools)
        res["metrics_after"] = self.metrics(f"{name}-after", variant)
        self.save()

    def run(self) -> int:
        try:
            self.setup()
            self.save()
            for ph in self.plan["phases"]:
                variant = self.plan["variants"][ph["variant"]]
                self.phase(ph["name"], variant, ph["runs"], ph.get("smoke", False), ph.get("need_s", 60),
                           ph.get("force_engines", False), ph.get("tools"))
        except Exception as exc:  # keep what was measured: results and logs still go back
            self.fail("driver crashed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        finally:
            for svc in list(self.services.values())[::-1]:
                try:
                    svc.stop()
                except Exception as exc:  # noqa: BLE001
                    log(f"stop {svc.unit}: {exc}")
            if getattr(self, "versions_thread", None) is not None:
                self.versions_thread.join(timeout=60)
            self.save(final=True)
        return 0 if not self.results["failures"] else 1

    # ----------------------------------------------------------------- results

    def save(self, final: bool = False) -> None:
        self.results["elapsed_s"] = now()
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2, sort_keys=True, default=str))
        (self.out / "summary.md").write_text(summary_markdown(self.results))
        if final:
            shutil.copy(HERE / "plan.json", self.logs / "plan.json")
            with tarfile.open(self.out / "logs.tar.xz", "w:xz") as tar:
                tar.add(self.logs, arcname="logs")
            log(f"results in {self.out}: results.json, summary.md, logs.tar.xz")


def summary_markdown(results: dict) -> str:
    lines = ["# pdkit GPU tier run", "", f"mode {results['mode']}, plan {results['plan_digest'][:12]}, "
             f"elapsed {results.get('elapsed_s')} s", ""]
    lines += ["| phase | C | output tok/s | TPOT mean / median / p99 (ms) | TTFT median (ms) | completed |",
              "|---|---|---|---|---|---|"]
    for name, ph in results["phases"].items():
        for r in ph.get("bench", []) or []:
            lines.append(
                f"| {name} | {r.get('max_concurrency')} | {r.get('output_throughput') or 0:.0f} | "
                f"{r.get('mean_tpot_ms') or 0:.2f} / {r.get('median_tpot_ms') or 0:.2f} / {r.get('p99_tpot_ms') or 0:.2f} | "
                f"{r.get('median_ttft_ms') or 0:.1f} | {r.get('completed')} |"
            )
    lines.append("")
    for name, ph in results["phases"].items():
        start = ph.get("start", {})
        lines.append(f"- {name}: restarted {start.get('restarted')}, engines ready {start.get('engines_ready_s')} s, "
                     f"stack ready {start.get('ready_s')} s {ph.get('skipped', '')}")
    lines.append("")
    for f in results["failures"]:
        lines.append(f"- FAILURE at {f['t']} s: {f['what']}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- bench loop (runs under the payload)


def bench_loop(runs_file: str) -> int:
    """Run sglang.benchmark.serving's own CLI once per argv list, in this one process."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    from sglang.benchmark import serving

    plan = json.loads(Path(runs_file).read_text())
    argvs = plan["argvs"] if isinstance(plan, dict) else plan
    tags = plan.get("tags", []) if isinstance(plan, dict) else []
    scrape_urls = plan.get("scrape", {}) if isinstance(plan, dict) else {}

    def scrape_all(tag: str, when: str) -> None:
        for engine, url in scrape_urls.items():
            body = http_get(url, timeout=10)[1]
            (Path(plan["scrape_dir"]) / f"run-{tag}-{engine}-{when}.txt").write_text(body)

    rc = 0
    for i, argv in enumerate(argvs):
        tag = tags[i] if i < len(tags) else str(i)
        scrape_all(tag, "before")
        print("=== python -m sglang.benchmark.serving " + " ".join(argv), flush=True)
        sys.argv = ["sglang.benchmark.serving", *argv]
        try:
            serving.cli_main()
        except SystemExit as exc:
            rc = rc or (exc.code if isinstance(exc.code, int) else 1)
        except Exception:  # noqa: BLE001 - report and go on with the next concurrency
            traceback.print_exc()
            rc = 1
        scrape_all(tag, "after")
        sys.stdout.flush()
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    for mode in ("run", "rehearse"):
        p = sub.add_parser(mode)
        p.add_argument("--out", default=os.environ.get("OUT", "/tmp/pdkit-gpu-out"))
        p.add_argument("--work", default="/tmp/pdkit-gpu-work")
        p.add_argument("--budget-s", type=float, default=540.0, help="stop starting new phases past this")
        p.add_argument("--phases", help="comma-separated subset of the plan's phases")
        p.add_argument("--prompt-scale", type=float, default=1.0, help="scale every run's prompt count (rehearsals)")
        if mode == "rehearse":
            p.add_argument("--root", default="/tmp/pdkit-rehearsal-root")
    b = sub.add_parser("bench-loop")
    b.add_argument("runs_file")
    args = ap.parse_args(argv)
    if args.mode == "bench-loop":
        return bench_loop(args.runs_file)
    driver = Driver(args)
    if args.phases:
        wanted = args.phases.split(",")
        driver.plan["phases"] = [p for p in driver.plan["phases"] if p["name"] in wanted]
    if args.prompt_scale != 1.0:
        for ph in driver.plan["phases"]:
            for run in ph["runs"]:
                run["prompts"] = max(2, int(run["prompts"] * args.prompt_scale))
    log(f"pdkit GPU tier driver ({args.mode}), budget {args.budget_s:.0f} s, phases "
        + ",".join(p["name"] for p in driver.plan["phases"]))
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
