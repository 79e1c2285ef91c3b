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
    # argparse choices of the tuning flags, so `pdkit validate` rejects a typo before any host is touched
    attention_backends: tuple[str, ...]
    moe_runner_backends: tuple[str, ...]
    quantizations: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    # The router package that pairs with this release on a GPU node's Python.
    default_router: tuple[str, str]


# Read from each release's own parser (pdkit.contract describe mode); argparse leaves the
# speculative algorithm unchecked, SGLang rejects unknown names only at start-up.
_SPECULATIVE_0517 = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
_TRANSFER = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
_ATTENTION_0517 = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "compressed", "cutlass_mla", "fa3", "fa4",
    "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "dual_chunk_flash_attn",
    "hpc_ops", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
)
_ATTENTION_0523 = tuple(b for b in _ATTENTION_0517 if b not in ("cutlass_mla", "dual_chunk_flash_attn")) + (
    "qsa", "llada2_cfg_flashinfer", "minicpm_flashattn", "minicpm_flashinfer",
)
_MOE_0517 = (
    "auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl", "cutlass", "aiter",
    "marlin", "humming", "experimental_sgl_marlin", "hpc_ops",
)
_MOE_0523 = _MOE_0517 + ("flashinfer_megamoe", "lora_cutedsl", "lora_triton", "lora_marlin", "megamoe", "intel_xpu")
_QUANT_0517 = (
    "awq", "fp8", "mxfp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8",
    "moe_wna16", "w4afp8", "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim", "mxfp_w4a8",
    "quark", "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)
_QUANT_0523 = tuple(q for q in _QUANT_0517 if q != "marlin")
_KV_0517 = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16", "fp4_e2m1")
_KV_0523 = tuple(k for k in _KV_0517 if k != "fp4_e2m1")

SGLANG_RELEASES: dict[str, SglangRelease] = {
    "0.5.17": SglangRelease(
        version="0.5.17",
        per_phase_cuda_graph_flags=True,
        has_pcie_ipc_allreduce=False,
        speculative_algorithms=_SPECULATIVE_0517,
        disaggregation_transfer_backends=_TRANSFER,
        attention_backends=_ATTENTION_0517,
        moe_runner_backends=_MOE_0517,
        quantizations=_QUANT_0517,
        kv_cache_dtypes=_KV_0517,
        default_router=("sglang-router", "0.3.2"),
    ),
    "0.5.23": SglangRelease(
        version="0.5.23",
        per_phase_cuda_graph_flags=True,
        has_pcie_ipc_allreduce=True,
        speculative_algorithms=_SPECULATIVE_0517 + ("UNO",),
        disaggregation_transfer_backends=_TRANSFER,
        attention_backends=_ATTENTION_0523,
        moe_runner_backends=_MOE_0523,
        quantizations=_QUANT_0523,
        kv_cache_dtypes=_KV_0523,
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
    # PUT /workers/{id} and POST /workers take {"health": {"drain_settle_secs": N}}: the per-worker
    # override of the ~5 s the router keeps a removed worker `draining` (checked on smg 1.13.0's
    # binary; its launcher has no flag for it). pdkit drains by the engines' own gauges, so a roll
    # sets 0 where the router lets it and otherwise waits the router's settle time out.
    per_worker_drain_settle: bool = False


ROUTER_RELEASES: dict[tuple[str, str], RouterRelease] = {
    ("smg", "1.13.0"): RouterRelease("smg", "1.13.0", ("smg", "launch"), "smg_", per_worker_drain_settle=True),
    ("sglang-router", "0.3.2"): RouterRelease(
        # 0.3.2 already serves smg_* (checked on the GPU tier), not the older sgl_router_*
        "sglang-router", "0.3.2", ("python", "-m", "sglang_router.launch_router"), "smg_"
    ),
}

# Versions of the other pinned Python packages that go into a node's wheelhouse.
NIXL_PACKAGE = ("nixl-cu13", "1.5.1")


# ---------------------------------------------------------------------------------------- node
# The NVIDIA stack a GPU node gets (pdkit.node decides the apt layout from these; docs/tuning.md).
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
