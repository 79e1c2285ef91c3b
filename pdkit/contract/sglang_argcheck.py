"""Check `python -m sglang.launch_server` argument lists with SGLang's own parser.

Run by the Python of a contract virtualenv (see .ci/contract-env.sh), never by pdkit's:
it imports only the standard library and the sglang installed next to it.

    python sglang_argcheck.py < request.json

Request (stdin, JSON): a list of argvs, or {"argvs": [[...], ...], "describe": false}.
An argv is what follows `python -m sglang.launch_server`: flags only.

Reply (stdout, one JSON document):
    {"tool": "sglang", "version": "0.5.23", "triton": "...", "from_cli_args": "...",
     "results": [{"ok": true, "error": null, "warnings": []}, ...],
     "options": [...]}            # only with "describe": true
or, when sglang cannot be imported at all, {"fatal": "<traceback>"} and exit status 3.

Each argv is parsed the way `sglang.srt.server_args.prepare_server_args` does it: a fresh
`argparse.ArgumentParser(prog="sglang serve")`, `ServerArgs.add_cli_args(parser)`,
`parser.parse_args(argv)`, so unknown flags, bad choices, bad types and ambiguous
prefixes fail exactly as they would on a GPU node. argparse reports by printing to
stderr and calling sys.exit(2): the printed "sglang serve: error: ..." text is returned.
Then `ServerArgs.from_cli_args(namespace)` builds the record. In versions whose
`__post_init__` resolves the whole configuration (0.5.17: it needs the model and GPUs),
it is switched off for that call; from 0.5.2x on `__post_init__` is empty and
resolution is a separate `resolve_once()`, which is not run either way. Last, the
`--log-level` value is looked up the way prepare_server_args does, and a
`--speculative-algorithm` value (argparse takes any string there) is looked up with
SGLang's own `SpeculativeAlgorithm.from_string`, the gate it meets at resolution.
Not checked: everything resolution decides from the model config and the GPUs
(e.g. speculative steps/topk/draft-token consistency, chunked prefill vs page size).

Import quirks handled before sglang is imported:
  * triton absent: sglang's own stand-in is installed -- `sglang/_triton_stub.py`'s
    install() where the wheel has it (0.5.17), else the same mocks assembled from
    `sglang/_platform_stubs.py` (0.5.2x keeps them there, armed only on macOS).
  * torchvision present (sglang 0.5.17 imports it at module level): the CPU torch does
    not define the `torchvision::nms` / `torchvision::qnms` operators that torchvision's
    fake-op registrations expect, so their schemas are defined first.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import traceback
from importlib.metadata import version as dist_version
from typing import Any

# a sibling file: these scripts run outside pdkit
from argcheck_common import ANSI, describe, one_check, reply_stream, request_argvs, send_reply

PROG = "sglang serve"


def _load_file_module(name: str, path: str) -> Any:
    """The module in the file at `path`; Any: its attributes come from the installed sglang."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses in the file look their module up
    spec.loader.exec_module(module)
    return module


def install_triton_stub() -> str:
    """Make `import triton` work without the real (GPU) package; say how."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return "real triton"
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        raise ImportError("sglang is not installed in this environment")
    pkg_dir = os.path.dirname(spec.origin)

    old_stub = os.path.join(pkg_dir, "_triton_stub.py")
    if os.path.exists(old_stub):
        _load_file_module("_pdkit_sglang_triton_stub", old_stub).install()
        return "sglang/_triton_stub.py install()"

    new_stub = os.path.join(pkg_dir, "_platform_stubs.py")
    if not os.path.exists(new_stub):
        raise ImportError(
            "triton is not installed and this sglang ships neither _triton_stub.py nor "
            "_platform_stubs.py: install triton in the contract env"
        )
    m = _load_file_module("_pdkit_sglang_platform_stubs", new_stub)
    stub_base: Any = m._StubBase  # a name, not an attribute: a base class mypy can read
    # The triton half of install_platform_stubs(), which only runs on macOS/arm64 with
    # MPS: the same mocks, built from the same helpers, without the torch.mps patches.

    def mock(parent: Any, name: str) -> Any:
        """The mock module NAME (dotted), set on PARENT under its last part."""
        module = m._make_mock(name)
        setattr(parent, name.rpartition(".")[2], module)
        return module

    def stand_in(module: Any, name: str, base: type = stub_base) -> None:
        """MODULE.NAME: an empty class on BASE, as install_platform_stubs declares each one."""
        setattr(module, name, type(f"_{name}", (base,), {"__module__": __name__}))

    sys.meta_path.insert(0, m._TritonFinder())
    triton = m._make_mock("triton")
    triton.__version__ = "3.0.0"
    triton.cdiv = m._cdiv
    triton.next_power_of_2 = m._next_power_of_2
    triton.Config = m._Config

    tl = mock(triton, "triton.language")

    class _constexpr:
        def __init__(self, value=None):
            self.value = value

        def __repr__(self):
            return f"constexpr({self.value!r})"

    tl.constexpr = _constexpr
    mock(mock(tl, "triton.language.extra"), "triton.language.extra.libdevice")

    runtime = mock(triton, "triton.runtime")
    jit_mod = mock(runtime, "triton.runtime.jit")
    stand_in(jit_mod, "JITFunction", object)
    stand_in(jit_mod, "KernelInterface")
    mock(runtime, "triton.runtime.cache").triton_key = m._triton_key
    autotuner = mock(runtime, "triton.runtime.autotuner")
    stand_in(autotuner, "OutOfResources", Exception)
    stand_in(autotuner, "PTXASError", Exception)
    mock(runtime, "triton.runtime.driver")

    compiler_root = mock(triton, "triton.compiler")
    stand_in(compiler_root, "CompiledKernel")
    compiler_impl = mock(compiler_root, "triton.compiler.compiler")
    stand_in(compiler_impl, "ASTSource")
    compiler_impl.triton_key = m._triton_key

    mock(triton, "triton.testing")
    mock(mock(triton, "triton.tools"), "triton.tools.tensor_descriptor")
    stand_in(mock(mock(triton, "triton.backends"), "triton.backends.compiler"), "GPUTarget")
    return "sglang/_platform_stubs.py mocks"


def define_torchvision_schemas() -> bool:
    """Define torchvision::nms/qnms before torchvision registers fake kernels for them."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    # lazy: CPU torch is slow to import and only needed when torchvision is installed
    import torch

    if torch.version.cuda is not None:
        # an engine venv (CUDA torch and its matching torchvision, e.g. on a node): torchvision's
        # own extension defines these, and defining them first would abort the process
        return False
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    globals()["_torchvision_lib"] = lib  # keep the registration alive
    return True


def _argparse_error(text: str) -> str | None:
    marker = f"{PROG}: error: "
    idx = text.rfind(marker)
    if idx < 0:
        return None
    return text[idx + len(marker):].strip()


def check_one(server_args_mod, argv: list[str], full_post_init: bool) -> dict:
    ServerArgs = server_args_mod.ServerArgs
    parser = argparse.ArgumentParser(prog=PROG)
    ServerArgs.add_cli_args(parser)

    with one_check() as (result, buf):
        try:
            if "--config" in argv:
                try:
                    # lazy: sglang imports only after main() installed the triton stub and torchvision schemas
                    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
                except ImportError:
                    # lazy: same, at its older path
                    from sglang.srt.server_args_config_parser import ConfigArgumentMerger
                argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
            namespace = parser.parse_args(argv)
        except SystemExit as exc:
            text = ANSI.sub("", buf.getvalue())
            msg = _argparse_error(text)
            if msg is None:
                if exc.code in (0, None):
                    msg = "argparse exited with status 0 (does the argv ask for --help?)"
                else:
                    last = text.strip().splitlines()[-1] if text.strip() else None
                    msg = last or f"argparse exited with status {exc.code}"
            result["error"] = msg
            return result
        except Exception as exc:  # noqa: BLE001 - an action or type function raised
            result["error"] = f"{type(exc).__name__} while parsing: {exc}"
            return result

        try:
            if full_post_init:
                # __post_init__ here resolves the whole config (model files, GPUs):
                # build the record without it.
                saved = ServerArgs.__dict__.get("__post_init__")
                ServerArgs.__post_init__ = lambda self: None
                try:
                    ServerArgs.from_cli_args(namespace)
                finally:
                    if saved is None:
                        del ServerArgs.__post_init__
                    else:
                        ServerArgs.__post_init__ = saved
            else:
                ServerArgs.from_cli_args(namespace)
        except Exception as exc:  # noqa: BLE001
            result["error"] = f"ServerArgs.from_cli_args: {type(exc).__name__}: {exc}"
            return result

        # prepare_server_args then calls logging.basicConfig(level=getattr(logging,
        # log_level.upper())): --log-level has no argparse choices either.
        level = getattr(logging, str(getattr(namespace, "log_level", "info")).upper(), None)
        if not isinstance(level, int):
            result["error"] = (
                f"argument --log-level: {namespace.log_level!r} is not a logging level "
                "(prepare_server_args: logging.basicConfig(level=getattr(logging, log_level.upper())))"
            )
            return result

        # --speculative-algorithm has no argparse choices: at resolution SGLang maps
        # the CLI aliases (_resolve_speculative_algorithm_alias: NEXTN/EAGLE -> EAGLE,
        # FROZEN_KV_MTP for a Gemma4 draft, which needs the draft's config and is
        # left out here) and then SpeculativeAlgorithm.from_string rejects unknown
        # names. Both are cheap and run here the same way.
        name = getattr(namespace, "speculative_algorithm", None)
        if name is not None:
            try:
                # lazy: sglang imports only after main() installed the triton stub and torchvision schemas
                from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

                try:
                    # lazy: same; some releases lack it (the ImportError below)
                    from sglang.srt.arg_groups.speculative_hook import (
                        _resolve_speculative_algorithm_alias as resolve_alias,
                    )
                except ImportError:
                    resolve_alias = None
                if resolve_alias is not None:
                    name = resolve_alias(name, None)
                SpeculativeAlgorithm.from_string(name)
            except ValueError as exc:
                result["error"] = f"argument --speculative-algorithm: {exc} (SpeculativeAlgorithm.from_string)"
                return result
        result["ok"] = True
        return result


def describe_server_args(server_args_mod) -> list[dict]:
    parser = argparse.ArgumentParser(prog=PROG)
    server_args_mod.ServerArgs.add_cli_args(parser)
    return describe(parser)


def environment_defaults(prefixes: list[str]) -> dict[str, dict]:
    """Every variable of `sglang.srt.environ.Envs` whose name starts with one of PREFIXES:
    its type (EnvInt, EnvFloat, ...) and its default, as SGLang reads them when unset."""
    # lazy: sglang imports only after main() installed the triton stub and torchvision schemas
    from sglang.srt.environ import EnvField, Envs

    out: dict[str, dict] = {}
    for name, field in sorted(vars(Envs).items()):
        if isinstance(field, EnvField) and any(name.startswith(p) for p in prefixes):
            default = field.default
            out[name] = {"type": type(field).__name__, "default": None if callable(default) else default}
    return out


def speculative_algorithm_names() -> list[str]:
    """The names `SpeculativeAlgorithm.from_string` accepts (argparse leaves the flag unchecked):
    the enum's members but NONE, plus the reserved aliases (NEXTN, 0.5.2x's spec_registry)."""
    # lazy: sglang imports only after main() installed the triton stub and torchvision schemas
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    names = [m.name for m in SpeculativeAlgorithm if m.name != "NONE"]
    try:
        # lazy: same; some releases lack it (the ImportError below)
        from sglang.srt.speculative.spec_registry import _RESERVED_ALIASES
    except ImportError:  # 0.5.17 maps NEXTN to EAGLE in the speculative hook instead
        _RESERVED_ALIASES = frozenset({"NEXTN"})
    return names + sorted(a for a in _RESERVED_ALIASES if a not in names)


def main() -> int:
    request = json.load(sys.stdin)
    if isinstance(request, list):
        request = {"argvs": request}
    argvs = request_argvs(request)
    real_stdout = reply_stream()

    reply: dict = {"tool": "sglang"}
    try:
        reply["triton"] = install_triton_stub()
        reply["torchvision_schemas_defined"] = define_torchvision_schemas()
        # lazy: sglang only now, after the triton stub and torchvision schemas (a failure: the fatal reply)
        import sglang.srt.server_args as server_args_mod

        try:
            reply["version"] = dist_version("sglang")
        except Exception:  # noqa: BLE001
            reply["version"] = None
    except BaseException:  # noqa: BLE001
        reply["fatal"] = traceback.format_exc()
        send_reply(real_stdout, reply)
        return 3

    # 0.5.2x: __post_init__ is empty, resolution is resolve_once(); older: __post_init__
    # resolves everything and must not run here.
    full_post_init = not hasattr(server_args_mod.ServerArgs, "resolve_once")
    reply["from_cli_args"] = (
        "ServerArgs.from_cli_args ran with __post_init__ switched off (it resolves the full config in this version)"
        if full_post_init
        else "ServerArgs.from_cli_args ran (its __post_init__ is empty; resolve_once() not run)"
    )
    reply["results"] = [check_one(server_args_mod, list(argv), full_post_init) for argv in argvs]
    if request.get("describe"):
        reply["options"] = describe_server_args(server_args_mod)
        reply["speculative_algorithms"] = speculative_algorithm_names()
        reply["environment"] = environment_defaults(list(request.get("environment_prefixes") or []))
    send_reply(real_stdout, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
