"""Where an engine's JIT and compile caches live: one directory per engine and SGLang release.

    /var/cache/<service_user>/jit/<sglang_version>/<engine>/<subdir>   (the unit's CacheDirectory=)

Left at their defaults they are either wiped at every start by the unit's PrivateTmp=yes (Inductor:
torch 2.11.0/2.14.1 torch/_inductor/runtime/cache_dir_utils.py; CuTe DSL: nvidia-cutlass-dsl 4.6.0/4.8.0
cutlass/base_dsl/cache_helpers.py; QuACK: quack/cache/jit.py) or shared by the prefill and decode that start
together on a node (~/.cache/...): a concurrent write is fatal to DeepGEMM (sgl-project/sglang#27604), and
SGLang 0.5.23 says engines sharing GPUs need separate SGLANG_CACHE_DIRs
(sglang/srt/model_executor/runner/flashinfer_autotune.py). Keyed by release, an upgrade never loads
another release's kernels. `CACHES` names, per pinned release, the wheel files that read each variable
(tests/test_jitcache.py checks them); docs/rolling.md "JIT caches".

Warm or cold (issue 45 item 2): the engine gate writes a stamp, `<engine dir>/warm.json`, when it first
sees a start of the engine ready (`stamp_ready`): the engine environment it ran from (the venv link's
target, `engine-<hash>` of its lock) and SGLang's start-up phases of its first and last such start. The
caches are warm for the next start when the stamp is there and the venv link still points where it did
(`warm_state`); a new release has a new directory, so no stamp. SGLang 0.5.17/0.5.23 have no switch that
makes a JIT miss fatal or logged (their srt/environ.py: SGLANG_JIT_DEEPGEMM_PRECOMPILE only turns the
DeepGEMM pre-compile on or off; DeepGEMM's "Entering DeepGEMM JIT Pre-Compile session" warning is logged at
every start, cached or not), so the stamp and the phase timings are the evidence. Stdlib only: on-node.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reader:
    """A file of a pinned wheel that reads the variable, or, with `needle`, the text it builds the name from."""

    package: str  # the distribution, as its engine lock names it
    version: str
    path: str  # inside the wheel
    needle: str = ""  # the variable name when empty


@dataclass(frozen=True)
class JitCache:
    var: str
    subdir: str  # under the engine's directory
    caches: str  # what is written there
    why: str  # its default, and why that default will not do
    readers: dict[str, tuple[Reader, ...]]  # SGLang release -> what reads it in that release's engine venv
    outside: str = ""  # a reader in no wheel (the NVIDIA driver)


def _sglang(release: str, *paths: str) -> tuple[Reader, ...]:
    return tuple(Reader("sglang", release, p) for p in paths)


_TORCH = {"0.5.17": "2.11.0", "0.5.23": "2.14.1"}
_TRITON = {"0.5.17": "3.6.0", "0.5.23": "3.8.0"}
_FLASHINFER = {"0.5.17": "0.6.15.post1", "0.5.23": "0.7.2"}
_DEEP_GEMM = {"0.5.17": "0.1.5.post1", "0.5.23": "0.2.3.post2"}
_TILELANG = {"0.5.17": "0.1.11", "0.5.23": "0.1.12"}
_CUTLASS_DSL = {"0.5.17": "4.6.0", "0.5.23": "4.8.0"}
_QUACK = {"0.5.17": "0.6.3", "0.5.23": "0.6.5"}
_FLASH_ATTN_4 = {"0.5.17": "4.0.0b19", "0.5.23": "4.0.0b36"}
_TVM_FFI = "0.1.11"
_OUTLINES = "0.1.11"
_FLASHINFER_CUTE = "flashinfer/data/cutlass/python/CuTeDSL/cutlass/base_dsl/cache_helpers.py"

CACHES: tuple[JitCache, ...] = (
    JitCache(
        "SGLANG_CACHE_DIR", "sglang",
        "SGLang's own: torch.compile graphs (torch_compile_cache/, Inductor and Triton pointed under it while "
        "compiling), FlashInfer autotune results, the custom all-reduce P2P probe; 0.5.23 derives its DeepGEMM, "
        "CuTe AOT and third-party defaults (sglang/__init__.py) from it",
        "default ~/.cache/sglang: one directory for every engine and release of the node, where 0.5.23 "
        "itself says engines sharing GPUs must use separate ones (its flashinfer_autotune.py)",
        {"0.5.17": _sglang("0.5.17", "sglang/srt/environ.py"),
         "0.5.23": _sglang("0.5.23", "sglang/srt/environ.py",
                           "sglang/srt/model_executor/runner/flashinfer_autotune.py")},
    ),
    JitCache(
        "SGLANG_DG_CACHE_DIR", "deep_gemm",
        "DeepGEMM's JIT kernels: SGLang copies it into DG_JIT_CACHE_DIR when it imports its DeepGEMM wrapper",
        "default ~/.cache/deep_gemm (0.5.17), $SGLANG_CACHE_DIR/deep_gemm (0.5.23); a concurrent write by "
        "two engines is fatal to DeepGEMM (sgl-project/sglang#27604)",
        {"0.5.17": _sglang("0.5.17", "sglang/srt/environ.py", "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"),
         "0.5.23": _sglang("0.5.23", "sglang/srt/environ.py", "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py")},
    ),
    JitCache(
        "DG_JIT_CACHE_DIR", "deep_gemm",
        "DeepGEMM's JIT kernels (the same directory as SGLANG_DG_CACHE_DIR)",
        "SGLang overwrites it from SGLANG_DG_CACHE_DIR; set alike for a DeepGEMM import before that "
        "(0.2.3's _C.so joins DG_ to JIT_CACHE_DIR at run time)",
        {"0.5.17": (*_sglang("0.5.17", "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"),
                    Reader("sgl-deep-gemm", _DEEP_GEMM["0.5.17"], "deep_gemm/_C.so")),
         "0.5.23": (*_sglang("0.5.23", "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"),
                    Reader("sgl-deep-gemm", _DEEP_GEMM["0.5.23"], "deep_gemm/_C.so", "JIT_CACHE_DIR"))},
    ),
    JitCache(
        "SGLANG_JIT_CACHE_DIR", "sglang-jit",
        "SGLang's own JIT kernel builds (sglang.kernels.jit)",
        "default ~/.cache/sglang/jit, which does not follow SGLANG_CACHE_DIR",
        {"0.5.23": _sglang("0.5.23", "sglang/srt/environ.py", "sglang/kernels/jit/utils/compile/cache.py")},
    ),
    JitCache(
        "TVM_FFI_CACHE_DIR", "tvm-ffi",
        "tvm-ffi C++/CUDA extension builds (SGLang 0.5.17's JIT kernels, the trtllm-gen MoE headers)",
        "default ~/.cache/tvm-ffi: shared by every engine and release",
        {"0.5.17": (*_sglang("0.5.17", "sglang/kernels/jit/utils/compile.py",
                             "sglang/kernels/ops/moe/trtllm_gen_moe.py"),
                    Reader("apache-tvm-ffi", _TVM_FFI, "tvm_ffi/cpp/extension.py")),
         "0.5.23": (Reader("apache-tvm-ffi", _TVM_FFI, "tvm_ffi/cpp/extension.py"),)},
    ),
    JitCache(
        "TORCHINDUCTOR_CACHE_DIR", "inductor",
        "torch.compile: Inductor's FX graph, AOTAutograd and generated-kernel caches",
        "default tempfile.gettempdir()/torchinductor_<user>: the unit's private /tmp, wiped at every start",
        {"0.5.17": (Reader("torch", _TORCH["0.5.17"], "torch/_inductor/runtime/cache_dir_utils.py"),
                    *_sglang("0.5.17", "sglang/srt/compilation/compiler_interface.py")),
         "0.5.23": (Reader("torch", _TORCH["0.5.23"], "torch/_inductor/runtime/cache_dir_utils.py"),
                    *_sglang("0.5.23", "sglang/srt/environ.py", "sglang/srt/compilation/compiler_interface.py"))},
    ),
    JitCache(
        "TRITON_CACHE_DIR", "triton",
        "Triton's compiled kernels (SGLang's Triton attention and MoE kernels, Inductor's)",
        "default $TRITON_HOME/.triton/cache = ~/.triton/cache: shared by every engine and release",
        {"0.5.17": (Reader("triton", _TRITON["0.5.17"], "triton/knobs.py"),
                    *_sglang("0.5.17", "sglang/srt/compilation/compiler_interface.py")),
         "0.5.23": (Reader("triton", _TRITON["0.5.23"], "triton/knobs.py"),
                    *_sglang("0.5.23", "sglang/srt/environ.py", "sglang/srt/compilation/compiler_interface.py"))},
    ),
    JitCache(
        "CUDA_CACHE_PATH", "nv",
        "the CUDA driver's compute cache: PTX JIT-compiled for the GPU",
        "default ~/.nv/ComputeCache: shared by every engine and release",
        {"0.5.23": _sglang("0.5.23", "sglang/srt/environ.py")},
        outside="libcuda (the NVIDIA driver), whatever the release",
    ),
    JitCache(
        "PYTORCH_KERNEL_CACHE_PATH", "torch-kernels",
        "PyTorch's NVRTC-compiled (jiterator) kernels",
        "default $XDG_CACHE_HOME/torch/kernels: shared by every engine and release",
        {"0.5.17": (Reader("torch", _TORCH["0.5.17"], "torch/lib/libtorch_cuda.so"),),
         "0.5.23": (Reader("torch", _TORCH["0.5.23"], "torch/lib/libtorch_cuda.so"),)},
    ),
    JitCache(
        "TORCH_EXTENSIONS_DIR", "torch_extensions",
        "torch.utils.cpp_extension builds (SGLang 0.5.23's cpp_extension_loader)",
        "default $XDG_CACHE_HOME/torch_extensions: shared, and an extension built against one torch "
        "is found by another release's",
        {"0.5.17": (Reader("torch", _TORCH["0.5.17"], "torch/utils/cpp_extension.py"),),
         "0.5.23": (Reader("torch", _TORCH["0.5.23"], "torch/utils/cpp_extension.py"),
                    *_sglang("0.5.23", "sglang/srt/utils/cpp_extension_loader.py"))},
    ),
    JitCache(
        "FLASHINFER_WORKSPACE_BASE", "flashinfer",
        "FlashInfer's JIT modules, generated sources and downloaded cubins (under <base>/.cache/flashinfer)",
        "default $HOME: one ~/.cache/flashinfer for every engine",
        {"0.5.17": (Reader("flashinfer-python", _FLASHINFER["0.5.17"], "flashinfer/jit/env.py"),),
         "0.5.23": (Reader("flashinfer-python", _FLASHINFER["0.5.23"], "flashinfer/jit/env.py"),
                    *_sglang("0.5.23", "sglang/srt/environ.py"))},
    ),
    JitCache(
        "TILELANG_CACHE_DIR", "tilelang",
        "TileLang's compiled kernels (0.5.23: DeepSeek-V4's MHC prenorm)",
        "default ~/.tilelang/cache: shared by every engine and release",
        {"0.5.17": (Reader("tilelang", _TILELANG["0.5.17"], "tilelang/env.py"),),
         "0.5.23": (Reader("tilelang", _TILELANG["0.5.23"], "tilelang/env.py"),
                    *_sglang("0.5.23", "sglang/srt/environ.py"))},
    ),
    JitCache(
        "CUTE_DSL_CACHE_DIR", "cute-dsl",
        "CuTe DSL (nvidia-cutlass-dsl) compiled kernels: FlashAttention 4, QuACK, FlashInfer's CuTe kernels",
        "default $TMPDIR or /tmp/<user>/cutlass_python_cache: the unit's private /tmp, wiped at every start",
        {release: (Reader("nvidia-cutlass-dsl-libs-core", _CUTLASS_DSL[release],
                          "nvidia_cutlass_dsl/dsl_packages/cutlass/base_dsl/cache_helpers.py", '{dsl_name}_CACHE_DIR'),
                   Reader("flashinfer-python", _FLASHINFER[release], _FLASHINFER_CUTE))
         for release in ("0.5.17", "0.5.23")},
    ),
    JitCache(
        "QUACK_CACHE_DIR", "quack",
        "QuACK's compiled kernel objects",
        "default tempfile.gettempdir()/<user>/quack_cache: the unit's private /tmp, wiped at every start",
        {"0.5.17": (Reader("quack-kernels", _QUACK["0.5.17"], "quack/cache/__init__.py"),),
         "0.5.23": (Reader("quack-kernels", _QUACK["0.5.23"], "quack/cache/__init__.py"),
                    Reader("torch", _TORCH["0.5.23"], "torch/_vendor/quack/cache/__init__.py"))},
    ),
    JitCache(
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "flash-attn-cute",
        "FlashAttention's CuTe DSL kernel cache, when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1",
        "default tempfile.gettempdir()/<user>/flash_attention_cute_dsl_cache: the unit's private /tmp",
        {"0.5.17": (*_sglang("0.5.17", "sglang/kernels/ops/attention/flash_attn/cute/cache_utils.py"),
                    Reader("flash-attn-4", _FLASH_ATTN_4["0.5.17"], "flash_attn/cute/cache_utils.py")),
         "0.5.23": (Reader("flash-attn-4", _FLASH_ATTN_4["0.5.23"], "flash_attn/cute/cache_utils.py"),)},
    ),
    JitCache(
        "OUTLINES_CACHE_DIR", "outlines",
        "Outlines' compiled grammar automata (the outlines grammar backend)",
        "default ~/.cache/outlines: shared by every engine and release",
        {release: (Reader("outlines", _OUTLINES, "outlines/caching.py"),) for release in ("0.5.17", "0.5.23")},
    ),
)

JIT_ROOT = "jit"  # under /var/cache/<service_user>


def engine_cache_dir(service_user: str, engine: str, sglang_version: str) -> str:
    """The directory of ENGINE's caches for one release: `CACHES`' subdirectories live there."""
    for part, what in ((service_user, "service user"), (engine, "engine"), (sglang_version, "sglang_version")):
        if not part or "/" in part or part in (".", ".."):
            raise ValueError(f"{what} {part!r} cannot name a directory")
    return f"/var/cache/{service_user}/{JIT_ROOT}/{sglang_version}/{engine}"


def cache_env(service_user: str, engine: str, sglang_version: str) -> dict[str, str]:
    """Every cache variable of `CACHES` -> its path for ENGINE (its name: unique on its node) on SGLANG_VERSION."""
    base = engine_cache_dir(service_user, engine, sglang_version)
    return {c.var: f"{base}/{c.subdir}" for c in CACHES}


# ------------------------------------------------------------------------------------------------
# Warm or cold: the stamp the engine gate writes at ready (docs/rolling.md "JIT caches")

WARM_STAMP = "warm.json"
_ENGINE_DIR = re.compile(r"^/var/cache/[^/]+/" + JIT_ROOT + r"/[^/]+/[^/]+$")


def engine_dir_of(env: Mapping[str, str | None]) -> str | None:
    """The engine's cache directory from its environment: the parent of SGLANG_CACHE_DIR when that is the
    kit's layout (`cache_env`), else None (the engine's own env set it elsewhere: nothing is judged)."""
    value = (env.get(CACHES[0].var) or "").rstrip("/")
    parent, _, leaf = value.rpartition("/")
    return parent if leaf == CACHES[0].subdir and _ENGINE_DIR.match(parent) else None


def venv_id(venv_link: str) -> str:
    """What an engine environment's link points at now (`engine-<hash>`: its lock), "" without a link."""
    return os.path.basename(os.path.realpath(venv_link)) if venv_link else ""


def start_seconds(phases: Mapping[str, float] | None) -> float | None:
    """A start's length by SGLang's own phases (pdkit.agent.health.parse_startup_phases): the longest, as
    scheduler_e2e / tokenizer_e2e span the others; None without phases (metrics off, an older engine)."""
    values = [float(v) for v in (phases or {}).values() if isinstance(v, (int, float))]
    return round(max(values), 3) if values else None


def next_stamp(old: Mapping[str, Any] | None, venv_link: str, venv: str, invocation: str, at: float,
               phases_of: Callable[[], dict[str, float]]) -> dict[str, Any] | None:
    """Pure: the stamp after a start (INVOCATION, ready at AT, from VENV behind VENV_LINK) passed the
    engine gate, or None when OLD already holds it (a second gate of the same start). The first start
    on an environment is kept beside the last: on fresh caches it is the cold one, so the two give
    what compiling cost. PHASES_OF() is read only for a new start."""
    # OLD when it is a stamp of this same environment, else None
    same_env = old if old and old.get("venv") == venv and old.get("venv_link") == venv_link else None
    if same_env is not None and (same_env.get("last") or {}).get("invocation") == invocation:
        return None
    start = {"invocation": invocation, "at": round(at, 3), "phases": phases_of()}
    if same_env is not None:
        return {**same_env, "last": start, "starts": int(same_env.get("starts", 1)) + 1}
    return {"venv_link": venv_link, "venv": venv, "first": start, "last": start, "starts": 1}


def cold_extra_s(stamp: Mapping[str, Any] | None) -> float | None:
    """What compiling cost this engine, from its stamp: its first start on the environment (cold) less
    its last (warm), by SGLang's phases; None before a second start or without phases."""
    if not stamp or int(stamp.get("starts", 1)) < 2:
        return None
    first = start_seconds((stamp.get("first") or {}).get("phases"))
    last = start_seconds((stamp.get("last") or {}).get("phases"))
    return None if first is None or last is None else round(max(first - last, 0.0), 1)


def warm_state(stamp: Mapping[str, Any] | None, venv_now: str | None) -> tuple[str, str]:
    """Pure: ("warm" | "cold", why) of an engine's caches for its next start. VENV_NOW: what the
    stamp's venv link points at now (None: read from nothing, the stamp is missing)."""
    if not stamp:
        return "cold", ("no start of this engine passed the kit's engine gate with these caches (a new release or "
                        "engine, or the caches were removed): its next start compiles its JIT kernels")
    if stamp.get("venv") != venv_now:
        return "cold", (f"its engine environment changed since its last gated start ({stamp.get('venv') or '?'} -> "
                        f"{venv_now or '?'}): kernels of the changed libraries compile again")
    last = stamp.get("last") or {}
    took = start_seconds(last.get("phases"))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(last.get("at", 0))))
    return "warm", (f"{stamp.get('starts', 1)} gated start(s) with these caches"
                    + (f" on {stamp['venv']}" if stamp.get("venv") else "")
                    + f", the last at {when}" + (f" ({took:.0f} s by SGLang's phases)" if took is not None else ""))


def read_stamp(engine_dir: str) -> dict[str, Any] | None:
    try:
        stamp = json.loads((Path(engine_dir) / WARM_STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def judge(engine_dir: str) -> dict[str, Any]:
    """ENGINE_DIR's caches now: {"dir", "state", "why", "extra_s", "extra_from"}. EXTRA_S: what a cold
    start of this engine cost on this node beyond a warm one (`cold_extra_s`), from this directory's
    stamp, else from the same engine's directory of another release (the newest measured); None: never
    measured here."""
    stamp = read_stamp(engine_dir)
    state, why = warm_state(stamp, venv_id(stamp.get("venv_link", "")) if stamp else None)
    extra, source = cold_extra_s(stamp), engine_dir
    if extra is None:
        release_dir, engine = os.path.split(engine_dir.rstrip("/"))
        root = os.path.dirname(release_dir)
        measured = []
        for other in _siblings(root, engine, engine_dir):
            other_stamp = read_stamp(other)
            if other_stamp is not None and (got := cold_extra_s(other_stamp)) is not None:
                measured.append((float((other_stamp.get("last") or {}).get("at", 0)), got, other))
        if measured:
            _, extra, source = max(measured)
    return {"dir": engine_dir, "state": state, "why": why, "extra_s": extra,
            "extra_from": source if extra is not None else None}


def _siblings(root: str, engine: str, but: str) -> Iterable[str]:
    try:
        releases = sorted(os.listdir(root))
    except OSError:
        return []
    return [d for r in releases if (d := os.path.join(root, r, engine)) != but and os.path.isdir(d)]


def _owned_dirs(path: Path) -> None:
    """Make PATH and its missing parents, each 0700 and owned as its nearest existing ancestor (the unit's
    CacheDirectory= is the service user's, and the engine must still write beside the stamp)."""
    missing = []
    here = path
    while not here.exists():
        missing.append(here)
        here = here.parent
    st = here.stat()
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        _chown(d, st)


def _chown(path: Path, like: os.stat_result) -> None:
    try:
        os.chown(path, like.st_uid, like.st_gid)
    except PermissionError:
        pass  # not root (a test, a hand run as the service user): it is that user's already


def stamp_ready(shape_inputs: Iterable[str], invocation: str, phases_of: Callable[[], dict[str, float]]) -> None:
    """At the engine gate's ready (pdkit.agent.health): record this start in the engine's stamp. SHAPE_INPUTS
    are the gate's (the unit's files and its venv link): the engine's env file names its cache directory
    (SGLANG_CACHE_DIR, `engine_dir_of`), the link its environment. Evidence only: never raises."""
    try:
        env: dict[str, str] = {}
        venv_link = ""
        for path in shape_inputs:
            if os.path.isdir(path):
                venv_link = path
            elif path.endswith(".env"):
                env.update(_env_file(path))
        engine_dir = engine_dir_of(env)
        if engine_dir is None:
            return
        stamp = next_stamp(read_stamp(engine_dir), venv_link, venv_id(venv_link), invocation, time.time(), phases_of)
        if stamp is None:
            return
        target = Path(engine_dir)
        _owned_dirs(target)
        owner = target.stat()
        tmp = target / f".{WARM_STAMP}.tmp"
        tmp.write_text(json.dumps(stamp, sort_keys=True))
        os.chmod(tmp, 0o644)
        _chown(tmp, owner)
        tmp.replace(target / WARM_STAMP)
    except (OSError, ValueError):
        pass


def _env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines of a rendered env file (templates/env.j2; a value may be double-quoted)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and key and not key.startswith("#"):
            out[key] = value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value
    return out
