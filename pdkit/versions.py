"""What pdkit knows about each pinned SGLang and router version.

Flag generation is keyed on these tables, never on string comparisons scattered
through the code: when a pin moves, this is the one file to re-check against the
new wheel's `sglang/srt/server_args.py` (see docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SglangRelease:
    """Facts about one SGLang release that change the command line pdkit renders."""

    version: str
    # --cuda-graph-max-bs-decode / --cuda-graph-bs-decode / --cuda-graph-backend-{decode,prefill}
    # exist from 0.5.17 on; the old --cuda-graph-max-bs is only an alias there and is gone
    # (argparse "ambiguous option") from 0.5.20 on, so pdkit always emits the per-phase names.
    per_phase_cuda_graph_flags: bool
    # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (FlashInfer PCIe IPC all-reduce) appeared in 0.5.23.
    has_pcie_ipc_allreduce: bool
    speculative_algorithms: tuple[str, ...]
    disaggregation_transfer_backends: tuple[str, ...]
    # The router package that pairs with this release on a GPU node's Python.
    default_router: tuple[str, str]


_SPECULATIVE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
_TRANSFER = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")

SGLANG_RELEASES: dict[str, SglangRelease] = {
    "0.5.17": SglangRelease(
        version="0.5.17",
        per_phase_cuda_graph_flags=True,
        has_pcie_ipc_allreduce=False,
        speculative_algorithms=_SPECULATIVE,
        disaggregation_transfer_backends=_TRANSFER,
        default_router=("sglang-router", "0.3.2"),
    ),
    "0.5.23": SglangRelease(
        version="0.5.23",
        per_phase_cuda_graph_flags=True,
        has_pcie_ipc_allreduce=True,
        speculative_algorithms=_SPECULATIVE,
        disaggregation_transfer_backends=_TRANSFER,
        default_router=("smg", "1.13.0"),
    ),
}

# The newest release whose pins fit CUDA 13 + torch 2.14; what a new inventory gets.
DEFAULT_SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class RouterRelease:
    """How one router package is launched."""

    package: str
    version: str
    # argv[0..] before the router's own arguments, relative to the venv's bin/ directory
    launcher: tuple[str, ...]
    metrics_prefix: str


ROUTER_RELEASES: dict[tuple[str, str], RouterRelease] = {
    ("smg", "1.13.0"): RouterRelease("smg", "1.13.0", ("smg", "launch"), "smg_"),
    ("sglang-router", "0.3.2"): RouterRelease(
        "sglang-router", "0.3.2", ("python", "-m", "sglang_router.launch_router"), "sgl_router_"
    ),
}

# Versions of the other pinned Python packages that go into a node's wheelhouse.
NIXL_PACKAGE = ("nixl-cu13", "1.5.1")
