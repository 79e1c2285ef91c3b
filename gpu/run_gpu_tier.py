"""pdkit GPU tier: build the carry payload, render inventories/h200.py, write the device driver.

Run from the repository root on the CPU machine (the pdkit venv's python):

    .venv/bin/python gpu/run_gpu_tier.py --dry        # build + render + local checks; no device call
    .venv/bin/python gpu/run_gpu_tier.py              # the same, then print the device call to make
    .venv/bin/python gpu/run_gpu_tier.py --rehearse   # + run the driver here against pdkit.sim
    .venv/bin/python gpu/run_gpu_tier.py --report DIR [DIR]  # tables from returned results.json files

What lands in gpu-payload/ (git-ignored, passed to the device with `carry`):

- site.tar.xz    a pip --target tree of the pinned wheels (PINS) for the device image's
                 Python 3.12 / torch 2.11.0+cu130, trimmed to fit the 64 MiB carry limit:
                 sgl_kernel keeps only its sm90 common_ops (no FA3/FlashMLA/InfLLM/sm100),
                 flashinfer loses its JIT sources (data/), debug info is stripped from every
                 shared library; stubs for `datasets` and `IPython.display` (imported at module
                 level by code the servers never run); sgl_kernel's norms use its own
                 precompiled kernels instead of flashinfer's JIT (whose sources are trimmed).
- nixl.tar.xz    nixl 1.5.1 + nixl-cu13 1.5.1 with only the UCX plugin and the libraries it needs.
- router.tar.xz  sglang-router 0.3.2 (what pdkit pairs with sglang 0.5.17).
- model/         gpu/make_model.py's Llama directory (config + locally trained tokenizer).
- plan.json      every rendered file of every variant (units, env files, release.json), each
                 service's argv from pdkit.render.flags, health URLs, the bench plan.
- device_driver.py  gpu/device_driver.py, which runs exactly the rendered units there.

Downloads are cached in ~/.cache/pdkit/gpu/wheels, built trees in ~/.cache/pdkit/gpu/build-*.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "gpu"))

CACHE = Path(os.environ.get("PDKIT_GPU_CACHE", Path.home() / ".cache" / "pdkit" / "gpu"))
WHEELS = CACHE / "wheels"
PAYLOAD = REPO / "gpu-payload"
INVENTORY = REPO / "inventories" / "h200.py"
CARRY_LIMIT = 64 * 1024 * 1024

# Exact versions, for the device image's CPython 3.12 (x86_64, manylinux). sglang 0.5.17 is the
# newest release whose pins accept the image's torch 2.11; transformers 5.12.1 + tokenizers
# 0.22.2 must shadow the image's 5.17 / 0.23.2 (5.17 breaks sglang 0.5.17 at import). The
# rest are the modules SGLang's server, scheduler, bench and the router import that the image
# lacks (found by importing them under torch 2.11.0+cu130 on a CPU machine, --dry checks it).
PINS_ENGINE = {
    "sglang": "0.5.17",
    "sglang-kernel": "0.4.5",
    "flashinfer-python": "0.6.15.post1",
    "transformers": "5.12.1",
    "tokenizers": "0.22.2",
    "xgrammar": "0.2.1",
    "apache-tvm-ffi": "0.1.11",
    "fastapi": "0.135.0",  # 0.150+ needs opentelemetry-api
    "starlette": "1.10.0",
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "uvicorn": "0.54.0",
    "orjson": "3.13.0",
    "pyzmq": "27.3.0",
    "msgspec": "0.23.0",
    "pybase64": "1.5.1",
    "setproctitle": "1.3.8",
    "partial-json-parser": "0.2.1.1.post7",
    "openai": "2.6.1",
    "jiter": "0.19.0",
    "distro": "1.9.0",
    "sniffio": "1.3.1",
    "python-multipart": "0.0.34",
    "interegular": "0.3.3",
    "dill": "0.4.1",
    "compressed-tensors": "0.20.1",
    "loguru": "0.7.3",
    "gguf": "0.19.0",
    "jsonschema": "4.26.0",
    "jsonschema-specifications": "2025.9.1",
    "referencing": "0.37.0",
    "rpds-py": "2026.9.1",
    "soundfile": "0.13.1",
    "cffi": "2.1.1",
    "pycparser": "3.12",
}
PINS_NIXL = {"nixl": "1.5.1", "nixl-cu13": "1.5.1"}
PINS_ROUTER = {"sglang-router": "0.3.2"}
TRIM_VERSION = "4"  # bump when the trimming rules change (cache key)

PLATFORMS = [
    "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
    "manylinux_2_5_x86_64", "manylinux1_x86_64",
]
TARGET_FLAGS = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
                *[x for p in PLATFORMS for x in ("--platform", p)]]

# Where things go on the GPU machine (the inventory's install_dir is /opt/pdkit)
SITE_DIR = "/opt/pdkit/site"
ROUTER_SITE_DIR = "/opt/pdkit/router-site"

STUBS = {
    "datasets/__init__.py": '''\
        """pdkit GPU-tier stub: sglang.benchmark imports HF `datasets` at module level for dataset
        kinds the GPU tier never uses (it runs --dataset-name random-ids --tokenize-prompt)."""


        def load_dataset(*args, **kwargs):
            raise RuntimeError("pdkit GPU tier: HF datasets is not carried; use --dataset-name random-ids --tokenize-prompt")
        ''',
    "IPython/__init__.py": '''\
        """pdkit GPU-tier stub: sglang/utils.py imports IPython.display for notebook helpers only."""
        ''',
    "IPython/display.py": '''\
        """pdkit GPU-tier stub of IPython.display (notebook rendering; never used by a server)."""


        class HTML:
            def __init__(self, data=None, *args, **kwargs):
                self.data = data


        def display(*objs, **kwargs):
            for obj in objs:
                print(getattr(obj, "data", obj))
        ''',
}

# ---------------------------------------------------------------------------------------- wheels


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def wheel_name(name: str, version: str) -> Path | None:
    stem = name.replace("-", "_").lower()
    for w in sorted(WHEELS.glob("*.whl")):
        parts = w.name.split("-")
        if parts[0].lower() == stem and parts[1] == version:
            return w
    return None


def download(pins: dict[str, str]) -> list[Path]:
    WHEELS.mkdir(parents=True, exist_ok=True)
    missing = [f"{n}=={v}" for n, v in pins.items() if wheel_name(n, v) is None]
    if missing:
        print(f"downloading {len(missing)} wheels into {WHEELS}")
        run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS), *TARGET_FLAGS, *missing])
    paths = []
    for n, v in pins.items():
        w = wheel_name(n, v)
        if w is None:
            raise SystemExit(f"no wheel for {n}=={v} in {WHEELS}")
        paths.append(w)
    return paths


def install(wheels: list[Path], target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile", "--no-warn-conflicts",
         "--target", str(target), *TARGET_FLAGS, *map(str, wheels)], stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------- trimming


def rm(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def strip_debug(tree: Path) -> None:
    for so in tree.rglob("*.so*"):
        if so.is_file() and not so.is_symlink() and not so.name.endswith((".la", ".py")):
            # debug info and the static symbol table only; the dynamic symbols stay (xgrammar 51 -> 3 MB)
            subprocess.run(["strip", "--strip-unneeded", str(so)], stderr=subprocess.DEVNULL, check=False)


def drop_common(tree: Path) -> None:
    for name in ("bin", "include", "share", "pkgconfig", "headers", "tools", "build_backend.py", "build_utils.py"):
        rm(tree / name)
    for cache in tree.rglob("__pycache__"):
        rm(cache)
    # static archives are for building against a package, never imported (xgrammar's is 65 MB);
    # keep tvm_ffi's libtvm_ffi_testing.so: its core extension links it
    for archive in tree.rglob("*.a"):
        rm(archive)


def trim_engine(tree: Path) -> None:
    drop_common(tree)
    # sgl_kernel: the H200 loads sm90/common_ops; FA3 (flash_ops, 1.1 GB), FlashMLA, InfLLM and the
    # sm100 build are never loaded with --attention-backend triton on sm_90
    sk = tree / "sgl_kernel"
    for pattern in ("flash_ops*.so", "flashmla_ops*.so", "infllm_ops*.so"):
        for f in sk.glob(pattern):
            rm(f)
    rm(sk / "sm100")
    # sgl_kernel routes rmsnorm through flashinfer's JIT whenever flashinfer imports; its sources
    # (data/) are trimmed below, so make sgl_kernel use its own precompiled norm kernels
    elementwise = sk / "elementwise.py"
    text = elementwise.read_text()
    needle = "    import flashinfer.norm as _flashinfer_norm\n"
    assert needle in text, "sgl_kernel/elementwise.py changed: re-check the flashinfer norm routing"
    elementwise.write_text(text.replace(
        needle,
        "    # pdkit GPU tier: flashinfer's JIT sources are not carried; use sgl_kernel's precompiled norms\n"
        "    raise ImportError('pdkit payload: flashinfer norm JIT disabled')\n" + needle))
    rm(tree / "flashinfer" / "data")
    # SGLang's diffusion server is not used by launch_server
    rm(tree / "sglang" / "multimodal_gen")
    for rel, body in STUBS.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    strip_debug(tree)


def needed(so: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def trim_nixl(tree: Path) -> None:
    """Keep the python bindings, the UCX plugin and the UCX transports a same-host pair uses."""
    drop_common(tree)
    rm(tree / "nixl_ep")
    rm(tree / "nixl_ep_cu13")
    rm(tree / "nixl_cu13.scripts")
    libdirs = [tree / ".nixl_cu13.mesonpy.libs", tree / "nixl_cu13.libs"]
    for plugins in (tree / ".nixl_cu13.mesonpy.libs" / "plugins", tree / "nixl_cu13.libs" / "nixl"):
        for f in plugins.glob("*.so"):
            if f.name != "libplugin_UCX.so":
                rm(f)
    ucx = tree / "nixl_cu13.libs" / "ucx"
    for f in ucx.iterdir():
        # cuda_ipc/cuda_copy (libuct_cuda), cma for sm; no InfiniBand, EFA or perftest on one host
        if not f.name.startswith(("libuct_cuda", "libucm_cuda", "libuct_cma")):
            rm(f)
    # keep only the shared libraries reachable from what is left
    by_name = {f.name: f for d in libdirs for f in d.rglob("*.so*") if f.is_file()}
    roots = [f for f in tree.rglob("*.so*") if f.is_file() and (
        f.parent.name in ("nixl_cu13", "plugins", "nixl", "ucx"))]
    keep: set[Path] = set()
    todo = list(roots)
    while todo:
        f = todo.pop()
        if f in keep:
            continue
        keep.add(f)
        for dep in needed(f):
            if dep in by_name:
                todo.append(by_name[dep])
    for name, f in by_name.items():
        if f not in keep and f.parent.name not in ("plugins", "nixl", "ucx"):
            rm(f)
    strip_debug(tree)


def trim_router(tree: Path) -> None:
    drop_common(tree)
    strip_debug(tree)


def pack(tree: Path, out: Path) -> None:
    env = {**os.environ, "XZ_OPT": "-9 -T0"}
    run(["tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0",
         "-cJf", str(out), "-C", str(tree), "."], env=env)


def build_component(name: str, pins: dict[str, str], trim) -> Path:
    """Download, install into a --target tree, trim, pack; cached by pins + trim rules."""
    import inspect

    rules = inspect.getsource(trim) + inspect.getsource(drop_common) + inspect.getsource(strip_debug) + json.dumps(STUBS)
    key = hashlib.sha256(json.dumps([name, pins, TRIM_VERSION, rules]).encode()).hexdigest()[:12]
    build = CACHE / f"build-{name}-{key}"
    tarball = build / f"{name}.tar.xz"
    if tarball.exists():
        return tarball
    wheels = download(pins)
    tree = build / "tree"
    build.mkdir(parents=True, exist_ok=True)
    print(f"building {name}: {len(wheels)} wheels -> {tree}")
    install(wheels, tree)
    trim(tree)
    pack(tree, tarball)
    return tarball


# ---------------------------------------------------------------------------------------- rendering

# engine env for every engine of the inventory's (first) GPU node
_KV_ENV = 'for _e in gpu_nodes[0][1]["pdkit_node"]["engines"]:\n    _e["env"] = {{**_e.get("env", {{}}), **{env}}}\n'

_TCP = '{"UCX_TLS": "tcp,cuda_copy,self", "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info"}'
_TCP_SEG = '{"UCX_TLS": "tcp,cuda_copy,self", "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info", "UCX_TCP_TX_SEG_SIZE": "512k", "UCX_TCP_RX_SEG_SIZE": "512k"}'
_TCP_PPLN = '{"UCX_TLS": "tcp,cuda_copy,self", "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info", "UCX_RMA_PPLN_ENABLE": "y"}'
_UNIFIED = (
    '_CLUSTER["tuning"] = {"all": {**_CLUSTER["tuning"]["all"], "mem_fraction_static": 0.85}}\n'
    'gpu_nodes[0][1]["pdkit_node"]["engines"] = [{"name": "unified", "role": "unified", "gpus": [0], "port": 30000}]\n'
)

VARIANTS = {
    # name: (description, python statements run on the inventory's _CLUSTER / data after the base file)
    "base": ("inventories/h200.py as written", ""),
    "nograph": ("decode CUDA graphs off through the spec: tuning.decode.cuda_graph = False",
                '_CLUSTER["tuning"]["decode"] = {"cuda_graph": False}\n'),
    "page64": ("KV page size 64 through the spec: tuning.all.page_size = 64",
               '_CLUSTER["tuning"]["all"]["page_size"] = 64\n'),
    # issue 33: the KV hand-off at long prompts. UCX_PROTO_INFO=y makes UCX print the protocol it
    # picks for each transfer shape (logging only); UCX_TLS without cuda_ipc is what a pair on two
    # hosts without RDMA gets (GPU memory staged through host memory and sockets)
    "ucxinfo": ("the base units, UCX printing its protocol choices: engines' env UCX_PROTO_INFO=y",
                _KV_ENV.format(env='{"UCX_PROTO_INFO": "y"}')),
    "tcp": ("KV over TCP as across hosts without RDMA: engines' env UCX_TLS=tcp,cuda_copy,self (+ UCX logging)",
            _KV_ENV.format(env=_TCP)),
    # UCX moves GPU memory over TCP as emulated puts of UCX_TCP_TX_SEG_SIZE (8 KiB) fragments; TX <= RX
    "tcp_seg": ("KV over TCP (as `tcp`) with 512 KiB TCP fragments: UCX_TCP_TX_SEG_SIZE=UCX_TCP_RX_SEG_SIZE=512k",
                _KV_ENV.format(env=_TCP_SEG)),
    "tcp_seg_page64": ("KV over TCP with 512 KiB fragments (as `tcp_seg`) and KV page size 64: tuning.all.page_size = 64",
                       _KV_ENV.format(env=_TCP_SEG) + '_CLUSTER["tuning"]["all"]["page_size"] = 64\n'),
    # UCX 1.23's experimental pipelined RMA: large puts staged through host fragments asynchronously
    "tcp_ppln": ("KV over TCP (as `tcp`) with UCX's pipelined RMA: UCX_RMA_PPLN_ENABLE=y",
                 _KV_ENV.format(env=_TCP_PPLN)),
    "ipc_page64": ("the base units (cuda_ipc) with KV page size 64 and UCX's protocol lines: tuning.all.page_size = 64",
                   _KV_ENV.format(env='{"UCX_PROTO_INFO": "y"}') + '_CLUSTER["tuning"]["all"]["page_size"] = 64\n'),
    # the reference: the same model as one unified engine on the GPU, behind the router in regular mode
    "unified": ("one unified engine on GPU 0 (the reference for the PD pair)", _UNIFIED),
}
# nvidia-h200 (one GPU): the same PD pair sharing GPU 0, as the spec declares it (gpu_share)
SINGLE_GPU_INVENTORY = REPO / "inventories" / "h200-1gpu.py"


def variant_inventory(name: str, code: str, single_gpu: bool) -> Path:
    """A generated inventory: the base file executed as is, then the variant's change to its data."""
    base = SINGLE_GPU_INVENTORY if single_gpu else INVENTORY
    if name == "base":
        return base
    d = PAYLOAD / "inventories"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{base.stem.replace('-', '_')}_{name}.py"
    path.write_text(
        f'"""Generated by gpu/run_gpu_tier.py: {VARIANTS[name][0]}."""\n'
        f"_BASE = {str(base)!r}\n"
        # run as the base file itself (it may find its siblings from __file__)
        "__file__ = _BASE\n"
        "exec(compile(open(_BASE).read(), _BASE, 'exec'))\n"
        + code
    )
    return path


def render_variant(name: str, single_gpu: bool) -> dict:
    from pdkit.inventory.loader import load_with_problems
    from pdkit.render import flags
    from pdkit.render.paths import router_metrics_url, router_url
    from pdkit.render.plan import plan_host

    inv = variant_inventory(name, VARIANTS[name][1], single_gpu)
    spec, problems = load_with_problems(str(inv), cwd=str(REPO))
    errors = [p for p in problems if p.severity == "error"]
    if errors or spec is None:
        raise SystemExit(f"{inv}: does not validate:\n" + "\n".join(map(str, problems)))
    host = spec.gpu_hosts[0]
    plan = plan_host(spec, host)
    files = {f.path: f.content for f in plan.files}
    services = []
    for svc in plan.services:
        unit_path = f"/etc/systemd/system/{svc.unit}"
        if svc.kind not in ("engine", "router"):
            continue  # e.g. the node exporter: not part of what the GPU tier measures
        if svc.kind == "engine":
            engine = next(e for e in host.node.engines if e.name == svc.engine)
            argv = flags.engine_command(spec, host, engine)
            module = flags.ENGINE_MODULES[spec.cluster.engine]
            extra = {"engine": engine.name, "role": engine.role, "port": engine.port,
                     "metrics_url": f"{flags.engine_url(spec, host, engine)}/metrics"}
        else:
            argv = flags.router_command(spec, host)
            module = "sglang_router.launch_router"
            extra = {"base_url": router_url(host),
                     "expected_workers": list(svc.expected_workers), "model": svc.model,
                     "metrics_url": router_metrics_url(host)}
        services.append({"unit": svc.unit, "kind": svc.kind, "unit_path": unit_path, "argv": argv, "module": module,
                         "files": list(svc.files), "health_url": svc.health_url, **extra})
    # engines first, the router last (the deploy's order too)
    services.sort(key=lambda s: s["kind"] == "router")
    metrics_urls = {s["engine"]: s["metrics_url"] for s in services if s["kind"] == "engine"}
    metrics_urls["router"] = next(s["metrics_url"] for s in services if s["kind"] == "router")
    return {"description": VARIANTS[name][0], "inventory": str(inv.relative_to(REPO)), "files": files,
            "services": services, "metrics_urls": metrics_urls, "spec": spec, "host": host,
            "warnings": [str(p) for p in problems]}


# issue 33's shape: 3072-token prompts and 64 output tokens at C=1 and C=16, then shorter prompts at C=16
KV_RUNS = [{"concurrency": 1, "prompts": 4, "input_len": 3072, "output_len": 64},
           {"concurrency": 16, "prompts": 32, "input_len": 3072, "output_len": 64},
           {"concurrency": 16, "prompts": 32, "input_len": 1024, "output_len": 64},
           {"concurrency": 16, "prompts": 32, "input_len": 128, "output_len": 64}]


def build_plan(single_gpu: bool) -> dict:
    variants = {name: render_variant(name, single_gpu) for name in VARIANTS}
    base = variants["base"]
    spec, host = base["spec"], base["host"]
    for name, v in variants.items():
        changes = {}
        for svc, bsvc in zip(v["services"], base["services"]):
            if svc["argv"] != bsvc["argv"]:
                changes[svc["unit"]] = {"removed": [a for a in bsvc["argv"] if a not in svc["argv"]],
                                        "added": [a for a in svc["argv"] if a not in bsvc["argv"]]}
        v["argv_changes"] = changes
    from pdkit.render import flags

    router = next(s for s in base["services"] if s["kind"] == "router")
    model_name = spec.cluster.model.name
    plan = {
        "inventory": str((SINGLE_GPU_INVENTORY if single_gpu else INVENTORY).relative_to(REPO)),
        "single_gpu": single_gpu,
        "model_dir": spec.cluster.model.path,
        "site_dir": SITE_DIR,
        "router_site_dir": ROUTER_SITE_DIR,
        # the rendered engines' argv[0] (pdkit.render.flags.engine_python), where the driver places its interpreter
        "engine_python": flags.engine_python(spec, host),
        "router_python": flags.venv_python(flags.router_venv_dir(spec)),
        "state_dirs": [f"/var/lib/{spec.cluster.service_user}", f"/var/cache/{spec.cluster.service_user}"],
        "ready_timeout_s": spec.cluster.ready_timeout_s,
        "router_ready_timeout_s": 120,
        "metrics_urls": base["metrics_urls"],  # the base variant's: what a phase without its own falls back to
        "bench": {"base_url": router["base_url"], "model": model_name, "input_len": 128, "output_len": 256},
        "variants": {n: {k: v[k] for k in ("description", "inventory", "files", "services", "metrics_urls", "warnings",
                                             "argv_changes")}
                     for n, v in variants.items()},
        "phases": [
            {"name": "base", "variant": "base", "smoke": True, "need_s": 0,
             "runs": [{"concurrency": 1, "prompts": 10}, {"concurrency": 16, "prompts": 160},
                      {"concurrency": 64, "prompts": 320}]},
            {"name": "nograph", "variant": "nograph", "smoke": True, "need_s": 140,
             "runs": [{"concurrency": 1, "prompts": 4}, {"concurrency": 16, "prompts": 64},
                      {"concurrency": 64, "prompts": 192}]},
            {"name": "page64", "variant": "page64", "smoke": True, "need_s": 150,
             "runs": [{"concurrency": 1, "prompts": 8}, {"concurrency": 16, "prompts": 160},
                      {"concurrency": 64, "prompts": 320}]},
            # the same units restarted once their kernels are compiled and cached: the warm start
            {"name": "base_warm", "variant": "base", "smoke": True, "need_s": 110, "force_engines": True,
             "runs": [{"concurrency": 16, "prompts": 160}, {"concurrency": 64, "prompts": 320}]},
            # issue 8: pdkit's own bench (recorded), SGLang's bench through `pdkit bench --engine-bench
            # sglang`, then doctor against the base spec; the graphs-off units are then checked
            # against that same base spec, as after a bad roll: doctor must FAIL the decode engine
            {"name": "tools_base", "variant": "base", "smoke": True, "need_s": 0, "runs": [],
             "tools": {"spec": "spec-base.json", "args": [
                 "--record", "--bench", "1:16,16:128,64:256", "--sglang-bench", "16:128", "--doctor", "--doctor-bench"]}},
            {"name": "tools_nograph", "variant": "nograph", "smoke": True, "need_s": 150, "runs": [],
             "tools": {"spec": "spec-base.json", "args": ["--bench", "1:8,16:128,64:256", "--doctor", "--doctor-bench"]}},
            # issue 33: 3072-token prompts, 64 output tokens (the seeds' agentic shape), C=1 and C=16
            # (and 1024 / 128 at C=16), in the order the device session runs them: the TCP lane (what
            # two hosts without RDMA get) and its levers first, then cuda_ipc (one host), then the reference
            *({"name": f"kv_{v}", "variant": v, "smoke": True, "need_s": 200, "runs": KV_RUNS}
              for v in ("tcp_seg", "tcp", "tcp_seg_page64", "ucxinfo", "ipc_page64", "unified", "tcp_ppln")),
        ],
    }
    # an unmeasured pass first, so JIT compiles and first-touch allocations stay out of the figures
    warmup = {"concurrency": 64, "prompts": 128, "output_len": 32}
    plan["variants"]["base"]["warmup"] = warmup
    plan["variants"]["page64"]["warmup"] = warmup
    plan["digest"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    # what gpu/pdkit_tools.py loads instead of the inventory (exclude_unset: it round-trips to the same plan)
    (PAYLOAD / "spec-base.json").write_text(spec.model_dump_json(exclude_unset=True))
    return plan


# ---------------------------------------------------------------------------------------- model


def tokenizers_path() -> Path:
    """The pinned tokenizers wheel (cp39-abi3: imports on this machine's Python too), unpacked."""
    wheel = download({"tokenizers": PINS_ENGINE["tokenizers"]})[0]
    dest = CACHE / f"tokenizers-{PINS_ENGINE['tokenizers']}"
    if not (dest / "tokenizers").exists():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    return dest


def build_model(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    env = {**os.environ, "PYTHONPATH": str(tokenizers_path())}
    run([sys.executable, str(REPO / "gpu" / "make_model.py"), str(out), "--check"], env=env)


# ---------------------------------------------------------------------------------------- checks


def check_plan(plan: dict) -> None:
    """What the driver will assert there, asserted here first: unit ExecStart == pdkit.render.flags argv."""
    import device_driver as drv

    for name, variant in plan["variants"].items():
        for svc in variant["services"]:
            unit = variant["files"][svc["unit_path"]]
            (exec_start,) = drv.unit_values(unit, "ExecStart")
            assert drv.systemd_split(exec_start) == svc["argv"], f"{name}/{svc['unit']}: ExecStart != argv"
            for path in drv.unit_values(unit, "EnvironmentFile"):
                assert path.lstrip("-") in variant["files"], f"{name}/{svc['unit']}: {path} not rendered"
    print(f"checked: every unit's ExecStart parses back to pdkit.render.flags' argv ({len(plan['variants'])} variants)")


def repo_size() -> int:
    """What the device call copies besides `carry`: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def payload_size() -> int:
    return sum(f.stat().st_size for f in PAYLOAD.rglob("*") if f.is_file())


def ensure_ignored() -> None:
    # a worktree's .git is a file: ask git where its exclude file is (the main checkout's)
    found = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=REPO, capture_output=True, text=True)
    exclude = REPO / found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    if "/gpu-payload/" not in text.splitlines():
        exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + "/gpu-payload/\n")


def device_calls(plan: dict) -> list[dict]:
    """The calls that produce docs/gpu.md: (A) cold start, load, graphs off, page 64;
    (B) cold start again with 3x the prompts, then a warm restart of the same units;
    (C) pdkit bench and pdkit doctor on the base units, then on the graphs-off units."""
    kind = "nvidia-h200" if plan["single_gpu"] else "nvidia-h200-x2"
    calls = []
    for phases, extra, budget, timeout in (("base,nograph,page64", "", 550, 600),
                                           ("base,base_warm", " --prompt-scale 3", 500, 560),
                                           # (C) issue 8: pdkit bench / doctor on the real engines
                                           ("tools_base,tools_nograph", "", 540, 590)):
        calls.append({"kind": kind, "carry": ["gpu-payload"], "timeout_s": timeout,
                      "command": "set -o pipefail; PYTHONUNBUFFERED=1 python3 gpu-payload/device_driver.py run "
                                 f"--out \"$OUT\" --budget-s {budget} --phases {phases}{extra} 2>&1 | tee \"$OUT/driver.log\""})
    return calls


# ---------------------------------------------------------------------------------------- report


def report(results_dir: Path) -> None:
    res = json.loads((results_dir / "results.json").read_text())
    phases = res["phases"]
    print("| phase | C | output tok/s | TPOT mean | TPOT median | TPOT p99 | TTFT median | completed |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ph in phases.items():
        for r in ph.get("bench", []) or []:
            print(f"| {name} | {r['max_concurrency']} | {r['output_throughput']:.0f} | {r['mean_tpot_ms']:.2f} | "
                  f"{r['median_tpot_ms']:.2f} | {r['p99_tpot_ms']:.2f} | {r['median_ttft_ms']:.1f} | {r['completed']} |")
    by = {(n, r["max_concurrency"]): r for n, ph in phases.items() for r in ph.get("bench", []) or []}
    print()
    for c in (1, 16, 64):
        on, off = by.get(("base", c)), by.get(("nograph", c))
        if on and off:
            print(f"C={c}: graphs on/off output throughput ratio {on['output_throughput'] / off['output_throughput']:.2f}x, "
                  f"median TPOT {off['median_tpot_ms'] / on['median_tpot_ms']:.2f}x")
    for c, bar in ((16, 6854), (64, 10465)):
        r = by.get(("base", c))
        if r:
            print(f"C={c}: {r['output_throughput']:.0f} tok/s = {100 * r['output_throughput'] / bar:.1f}% of the hand-made {bar}")
    for name, ph in phases.items():
        st = ph.get("start", {})
        per_engine = ", ".join(f"{k[6:]} {v.get('seconds')} s" for k, v in st.items()
                               if k.startswith("ready_") and isinstance(v, dict))
        print(f"{name}: restarted {st.get('restarted')}; engines ready {st.get('engines_ready_s')} s ({per_engine}); "
              f"stack ready {st.get('ready_s')} s; router {st.get('router', {}).get('kit_gate')}")
    print()
    print("| phase | engine | KV transfers | MB per transfer | mean latency (ms) | mean speed (GB/s) | bootstrap / transfer failures | cuda_graph_passes_total (delta) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ph in phases.items():
        for engine in ("prefill", "decode"):
            d = metric_deltas(ph, engine)
            if not d:
                continue
            n = d.get("kv_transfer_latency_ms_count", 0)
            mb = d.get("kv_transfer_total_mb_sum", 0)
            lat = d.get("kv_transfer_latency_ms_sum", 0)
            spd = d.get("kv_transfer_speed_gb_s_sum", 0)
            passes = ", ".join(f"{k.split('mode=')[1]} {v:.0f}" for k, v in d.items() if k.startswith("cuda_graph_passes_total|mode="))
            if "num_bootstrap_failed_reqs_total" in d or "num_transfer_failed_reqs_total" in d:
                failures = f"{d.get('num_bootstrap_failed_reqs_total', 0):.0f} / {d.get('num_transfer_failed_reqs_total', 0):.0f}"
            else:
                failures = "not exported"
            kv = (f"{n:.0f} | {mb / n:.1f} | {lat / n:.1f} | {spd / n:.2f}" if n else "- | - | - | -")
            print(f"| {name} | {engine} | {kv} | {failures} | {passes} |")
    kv_report(results_dir, res)
    for f in res["failures"]:
        print("FAILURE:", f["what"])


def kv_report(results_dir: Path, res: dict) -> None:
    """Issue 33's table: per bench run, SGLang's TTFT beside the prefill's KV figures over that run
    (pdkit.spec.kvcost on the /metrics pages the bench loop saved before and after each run)."""
    import tarfile

    from pdkit.spec.kvcost import kv_figures, kv_histograms

    logs = results_dir / "logs.tar.xz"
    if not logs.exists():
        return
    with tarfile.open(logs) as tar:
        pages = {Path(m.name).name: tar.extractfile(m).read().decode(errors="replace")
                 for m in tar.getmembers() if Path(m.name).name.startswith("run-") and m.isfile()}
    print()
    print("| phase | C | input | TTFT p50 / p99 (ms) | output tok/s | hand-offs | MiB each | KV mean / p99 (ms) "
          "| effective GB/s | SGLang speed mean | KV share of TTFT (mean) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, ph in res["phases"].items():
        for r in ph.get("bench", []) or []:
            tag = r["tag"]
            before = pages.get(f"run-{tag}-prefill-before.txt")
            after = pages.get(f"run-{tag}-prefill-after.txt")
            kv = (kv_figures(kv_histograms(before), kv_histograms(after), r.get("mean_ttft_ms"))
                  if before is not None and after is not None else None)
            input_len = r["total_input_tokens"] // max(1, r["completed"] or 1)
            ttft = f"{r['median_ttft_ms']:.1f} / {r['p99_ttft_ms']:.1f}"
            if kv is None or not kv.transfers:
                figures = "- | - | - | - | - | -"
            else:
                p99 = f"{'>' if kv.latency_p99_above_buckets else ''}{kv.latency_p99_ms:.0f}"
                figures = (f"{kv.transfers} | {kv.mb_per_request:.0f} | {kv.latency_mean_ms:.1f} / {p99} | "
                           f"{kv.effective_gb_s:.2f} | {kv.sglang_speed_mean_gb_s:.2f} | {100 * (kv.ttft_share or 0):.0f}%")
            print(f"| {name} | {r['max_concurrency']} | {input_len} | {ttft} | {r['output_throughput']:.0f} | {figures} |")


def metric_deltas(phase: dict, engine: str) -> dict[str, float]:
    """after - before for one engine's picked sglang: series, keyed by family (and mode for graph passes)."""
    def fold(values: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for series, value in values.items():
            if not series.startswith("sglang:"):
                continue
            family = series[len("sglang:"):].split("{", 1)[0]
            if family.endswith("_bucket"):
                continue
            if family == "cuda_graph_passes_total":
                mode = series.split('mode="', 1)[1].split('"', 1)[0]
                family = f"cuda_graph_passes_total|mode={mode}"
            out[family] = out.get(family, 0.0) + value
        return out

    before = fold(phase.get("metrics_before", {}).get(engine, {}))
    after = fold(phase.get("metrics_after", {}).get(engine, {}))
    return {k: after[k] - before.get(k, 0.0) for k in after}


# ---------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="build, render and check; print no device call")
    ap.add_argument("--single-gpu", action="store_true", help="nvidia-h200 fallback: both engines on GPU 0")
    ap.add_argument("--rehearse", action="store_true", help="also run the driver here against pdkit.sim")
    ap.add_argument("--rehearsal-python", default=str(CACHE / "rehearsal-venv" / "bin" / "python"),
                    help="a CPython 3.12 with torch 2.11 (+ aiohttp) to rehearse with")
    ap.add_argument("--report", type=Path, nargs="+", metavar="DIR", help="print the tables from DIR/results.json and exit")
    args = ap.parse_args(argv)
    if args.report:
        for directory in args.report:
            print(f"## {directory}")
            report(directory)
            print()
        return 0
    os.chdir(REPO)
    ensure_ignored()
    if PAYLOAD.exists():
        shutil.rmtree(PAYLOAD)
    PAYLOAD.mkdir()
    for name, pins, trim in (("site", PINS_ENGINE, trim_engine), ("nixl", PINS_NIXL, trim_nixl),
                             ("router", PINS_ROUTER, trim_router)):
        tarball = build_component(name, pins, trim)
        shutil.copy(tarball, PAYLOAD / f"{name}.tar.xz")
    build_model(PAYLOAD / "model")
    plan = build_plan(args.single_gpu)
    (PAYLOAD / "plan.json").write_text(json.dumps(plan, indent=1, sort_keys=True))
    shutil.copy(REPO / "gpu" / "device_driver.py", PAYLOAD / "device_driver.py")
    check_plan(plan)
    for name, v in plan["variants"].items():
        for w in v["warnings"]:
            print(f"  {name}: {w}")
    size = payload_size()
    for f in sorted(PAYLOAD.glob("*.tar.xz")):
        print(f"  {f.name:16} {f.stat().st_size / 2**20:6.1f} MiB")
    tracked = repo_size()
    print(f"payload {PAYLOAD}: {size / 2**20:.1f} MiB + the working tree {tracked / 2**20:.1f} MiB = "
          f"{(size + tracked) / 2**20:.1f} MiB, against the {CARRY_LIMIT / 2**20:.0f} MiB one call carries")
    if size > CARRY_LIMIT - 2 * 2**20:
        raise SystemExit("payload too large for one carry")
    if size + tracked > CARRY_LIMIT:
        print("  over one call's limit: carry gpu-payload/site.tar.xz in a first call (copied to /root/stash),\n"
              "  then the other paths of gpu-payload/, and `cp /root/stash/site.tar.xz gpu-payload/` first (docs/gpu.md)")
    if args.rehearse:
        out = Path(tempfile.mkdtemp(prefix="pdkit-rehearsal-out-"))
        cmd = [args.rehearsal_python, str(PAYLOAD / "device_driver.py"), "rehearse", "--out", str(out),
               "--work", str(out / "work"), "--root", str(out / "root"), "--prompt-scale", "0.1", "--budget-s", "900"]
        env = {**os.environ, "PDKIT_SIM_STARTUP_DELAY_S": "2", "PYTHONUNBUFFERED": "1"}
        print("rehearsing:", " ".join(cmd))
        rc = subprocess.run(cmd, env=env).returncode
        print(f"rehearsal exit {rc}; results in {out}")
        report(out)
        if rc != 0:
            return rc
    calls = device_calls(plan)
    if args.dry:
        print("dry: no device call. The calls to make:")
        for call in calls:
            print(" ", json.dumps(call))
        return 0
    print("Make these two device calls (the device tool's `run`; give the machine back after the second),")
    print("then: python gpu/run_gpu_tier.py --report <files_at of call A> <files_at of call B>")
    for call in calls:
        print(json.dumps(call, indent=1))
    print("results land in $OUT on the device and come back as results.json, summary.md, logs.tar.xz, driver.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
