"""Settings that change the answers by design (issue 44 item 3, docs/correctness.md).

A lever like these is not a bug when the answers move: it trades exactness for speed or memory on
purpose. The kit names each one where it is set (validate, `pdkit tune --dry`, the campaign
report), and refuses it until the inventory (`pdkit_cluster.answers.acknowledge`) or the campaign
(`acknowledge:`) names it: the answer gate then judges it within its tolerance, never as exact.

The rules, each from the pinned releases' own code:

- `kv_cache_quantized`: `--kv-cache-dtype` other than auto / bf16 / bfloat16 (the choices are the
  release's own, pdkit/upstream/parser_table.json): attention reads rounded keys and values;
- `speculative_accept_below_1`: `--speculative-accept-threshold-single` or `-acc` below 1.0 (SGLang's
  default 1.0: 0.5.17 server_args.py, 0.5.23 arg_groups/fields/spec.py): draft tokens the target
  model would not have chosen are accepted;
- `nccl_ll128_pcie`: NCCL_PROTO with LL128 in an engine's environment on a node whose NCCL profile
  is PCIe: LL128 relies on NVLink's ordering and can corrupt data over PCIe;
- `non_deterministic` (named, never refused): an engine without `--enable-deterministic-inference`
  where its release has that mode (both pinned ones): batch composition changes its numerics,
  which is why the gate's loaded part judges every lever by the tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdkit.spec.cluster import ClusterSpec, HostSpec, Problem
from pdkit.spec.models import Engine
from pdkit.spec.startup import tuning_origin
from pdkit.upstream.parsertable import table

# KV cache dtypes that keep the model's own precision
EXACT_KV_DTYPES = ("auto", "bf16", "bfloat16")
SPECULATIVE_THRESHOLDS = ("--speculative-accept-threshold-single", "--speculative-accept-threshold-acc")
SGLANG_DEFAULT_ACCEPT_THRESHOLD = 1.0
PCIE_PROFILES = ("pcie", "pcie-p2p-off")
DETERMINISTIC_FLAG = "--enable-deterministic-inference"

# id -> what it does to the answers (the message's second half)
BY_DESIGN = {
    "kv_cache_quantized": "a quantized KV cache: attention reads rounded keys and values",
    "speculative_accept_below_1": "speculative acceptance below 1: draft tokens the target model would not have "
                                  "chosen are accepted",
    "nccl_ll128_pcie": "NCCL's LL128 protocol over PCIe, which relies on NVLink's ordering and can corrupt data",
}
INFORMATIONAL = {
    "non_deterministic": "kernels without SGLang's deterministic mode (--enable-deterministic-inference): batch "
                         "composition changes the numerics",
}


@dataclass(frozen=True)
class Finding:
    host: str
    engine: str
    id: str
    field: str
    setting: str


def _options(version: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for option in table()["sglang"][version]["options"]:
        for flag in option.get("flags") or []:
            out[flag] = option
    return out


def _extra_value(engine: Engine, flag: str) -> str | None:
    args = list(engine.extra_args or [])
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def findings(spec: ClusterSpec) -> list[Finding]:
    """Every engine's settings that change the answers by design (BY_DESIGN ids; INFORMATIONAL too)."""
    out: list[Finding] = []
    for host, engine in spec.engines():
        index = next((i for i, e in enumerate(host.node.engines) if e is engine), 0) if host.node else 0
        at = f"pdkit_node.engines[{index}]"
        tuning = spec.engine_tuning(engine)
        version = spec.engine_version(engine)
        options = _options(version)
        kv = tuning.value("kv_cache_dtype")
        choices = (options.get("--kv-cache-dtype") or {}).get("choices") or []
        if kv and kv not in EXACT_KV_DTYPES and (not choices or kv in choices):
            origin = tuning_origin(spec, engine, at, "kv_cache_dtype")
            field = origin if origin.startswith("pdkit_cluster") else f"{at}.{origin}"
            out.append(Finding(host.name, engine.name, "kv_cache_quantized", field, f"--kv-cache-dtype {kv}"))
        for flag in SPECULATIVE_THRESHOLDS:
            raw = _extra_value(engine, flag)
            try:
                below = raw is not None and float(raw) < SGLANG_DEFAULT_ACCEPT_THRESHOLD
            except ValueError:
                below = False  # the argument parser check names a value that is not a number
            if below:
                out.append(Finding(host.name, engine.name, "speculative_accept_below_1", f"{at}.extra_args",
                                   f"{flag} {raw}"))
        proto = (engine.env or {}).get("NCCL_PROTO", "")
        if host.node is not None and host.node.nccl_profile in PCIE_PROFILES and "ll128" in proto.lower():
            out.append(Finding(host.name, engine.name, "nccl_ll128_pcie", f"{at}.env.NCCL_PROTO",
                               f"NCCL_PROTO={proto} with nccl_profile {host.node.nccl_profile}"))
        if DETERMINISTIC_FLAG in options and DETERMINISTIC_FLAG not in (engine.extra_args or []):
            out.append(Finding(host.name, engine.name, "non_deterministic", f"{at}.extra_args",
                               f"no {DETERMINISTIC_FLAG} (SGLang {version} has it)"))
    return out


def check_by_design(spec: ClusterSpec, add: Callable[[Problem], None]) -> None:
    """An unacknowledged setting that changes the answers by design is refused, naming the host, the
    field and the acknowledgement; an acknowledged one is named as a warning (validate, tune --dry)."""
    acknowledged = set(spec.cluster.answers.acknowledge)
    for f in findings(spec):
        if f.id not in BY_DESIGN:
            continue
        what = f"{f.engine}: {f.setting} changes the answers by design ({BY_DESIGN[f.id]})"
        if f.id in acknowledged:
            add(Problem(f.host, f.field, f"{what}; acknowledged (pdkit_cluster.answers.acknowledge): the answer gate "
                                         "judges it within its tolerance (docs/correctness.md)", "warning"))
        else:
            add(Problem(f.host, f.field, f"{what}; acknowledge it with pdkit_cluster.answers.acknowledge: [{f.id}] "
                                         "(or a campaign's acknowledge:), or remove it (docs/correctness.md)"))


def labels(spec: ClusterSpec, host: HostSpec | None = None) -> list[str]:
    """One line per by-design setting (informational ones included), for reports."""
    return [f"{f.host}/{f.engine}: {f.setting}: {(BY_DESIGN | INFORMATIONAL)[f.id]}" for f in findings(spec)
            if host is None or f.host == host.name]
