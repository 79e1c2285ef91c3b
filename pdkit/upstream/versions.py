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
    # The router package that pairs with this release on a GPU node's Python.
    default_router: tuple[str, str]
    # How attention data parallelism is spelled: 0.5.23 has --attn-dp-size N and deprecates
    # `--dp-size N --enable-dp-attention` (parallel_hook.py handle_deprecated_dp_attention turns
    # it into attn_dp_size); 0.5.17 has only the old pair, where --dp-size counts the
    # attention-DP groups. Checked against both parsers by tests/test_flags.py.
    attn_dp_size_flag: bool = False


# Every flag, alias and choice of a release's parser (and the speculative algorithm names) is
# generated from the wheel itself into pdkit/upstream/parser_table.json: see pdkit.upstream.parsertable.
SGLANG_RELEASES: dict[str, SglangRelease] = {
    "0.5.17": SglangRelease(
        version="0.5.17",
        per_phase_cuda_graph_flags=True,
        has_pcie_ipc_allreduce=False,
        default_router=("sglang-router", "0.3.2"),
    ),
    "0.5.23": SglangRelease(
        version="0.5.23",
        per_phase_cuda_graph_flags=True,
        has_pcie_ipc_allreduce=True,
        default_router=("smg", "1.13.0"),
        attn_dp_size_flag=True,
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
    # PUT /workers/{id} and POST /workers take {"health": {"drain_settle_secs": N}}: the per-worker
    # override of the ~5 s the router keeps a removed worker `draining` (checked on smg 1.13.0's
    # binary; its launcher has no flag for it). pdkit drains by the engines' own gauges, so a roll
    # sets 0 where the router lets it and otherwise waits the router's settle time out.
    per_worker_drain_settle: bool = False
    # In regular (unified) mode, with no worker listed for the model, it answers 404 model_not_found
    # (a client error clients do not retry); a removed worker still listed `draining` gets 503 with
    # Retry-After: 1 (smg 1.13.0, tests/sim/test_router_no_workers.py). So a downtime roll keeps the
    # last regular worker draining through the outage (Roller.hold_settle_s) rather than gone.
    empty_regular_is_404: bool = False
    # --dp-aware: the router asks each worker its DP size and routes to one attention-DP rank
    # (both pinned routers' parsers have it: pdkit/upstream/parser_table.json, tests/test_flags.py)
    dp_aware: bool = True


ROUTER_RELEASES: dict[tuple[str, str], RouterRelease] = {
    ("smg", "1.13.0"): RouterRelease("smg", "1.13.0", ("smg", "launch"), "smg_", per_worker_drain_settle=True,
                                     empty_regular_is_404=True),
    ("sglang-router", "0.3.2"): RouterRelease(
        # 0.3.2 already serves smg_* (checked on the GPU tier), not the older sgl_router_*
        "sglang-router", "0.3.2", ("python", "-m", "sglang_router.launch_router"), "smg_"
    ),
}

# Versions of the other pinned Python packages that go into a node's wheelhouse.
NIXL_PACKAGE = ("nixl-cu13", "1.5.1")
# The `nixl` meta package (the module SGLang imports, NIXL_IMPORT below) at the same release. It
# requires both nixl-cu12 and nixl-cu13; pdkit's engines run CUDA 13 (the locks' torch is a cu13
# build, which nixl's detect_cuda_major reads), so the locks drop nixl-cu12 (NIXL_EXCLUDED).
NIXL_META_PACKAGE = ("nixl", "1.5.1")
NIXL_EXCLUDED = ("nixl-cu12",)
# What SGLang itself imports for NIXL KV transfer (sglang/srt/disaggregation/nixl/conn.py in 0.5.17
# and 0.5.23): the module `nixl` comes from the `nixl` meta package, which loads nixl-cu13's (or
# -cu12's) `nixl_cu13`; the nixl-cu13 wheel alone has no module `nixl`. The preflight runs this in a
# node's own engine environment (pdkit_node.engine_venv).
NIXL_IMPORT = "from nixl._api import nixl_agent"


# ---------------------------------------------------------------------------------------- node
# The NVIDIA stack a GPU node gets (pdkit.render.node decides the apt layout from these; docs/tuning.md).
# R580 is the LTS branch (to 2028-08) and the first with CUDA 13.0 (>= 580.65.06).
NVIDIA_DRIVER_BRANCH = "580"
# CUDA 13.0 user space (what SGLang >= 0.5.11 runs on) needs at least this driver
NVIDIA_DRIVER_MIN_VERSION = "580.65.06"
# NVIDIA's keyring package, fetched from the same repository it trusts
CUDA_KEYRING_VERSION = "1.1-1"
# apt package of the CUDA toolkit (installs /usr/local/cuda-13.0)
CUDA_TOOLKIT_PACKAGE = "cuda-toolkit-13-0"
# libnccl2 / libnccl-dev, exact apt version: NCCL 2.28.9 built for CUDA 13.0
NCCL_APT_VERSION = "2.28.9-1+cuda13.0"


# ---------------------------------------------------------------------------------------- apt pins
# Debian packages installed at an exact version (roles/packages.py: `name=version`), from the
# distribution the hosts run (Debian 12 bookworm). Alertmanager 0.25 decides which receiver
# kinds can keep their credential in a file (pdkit.spec.RECEIVER_KINDS), so it moves only with that table.
APT_PINS: dict[str, str] = {
    "prometheus-alertmanager": "0.25.0-1+b4",
}
