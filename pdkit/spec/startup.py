"""What SGLang checks on its server arguments at start (issue 32), per engine, as its *_hook.py
handlers check it, for the flags pdkit renders and the GPUs a node declares (startup_check_problems).

pdkit/upstream/data/startup_checks.json lists every such check of the pinned releases (python -m
pdkit.upstream.startchecks); the rules here are the ones pdkit/upstream/data/startup_check_coverage.json names for
the flags pdkit renders.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pdkit.spec.cluster import ClusterSpec
from pdkit.spec.models import Engine, Node
from pdkit.spec.pagesize import effective_page_size
from pdkit.spec.tuning import Tuning
from pdkit.upstream.parsertable import extra_arg

__all__ = [
    "A2A_ATTN_DP", "A2A_EP_SPANNING", "A2A_RUNNERS", "CUTEDSL_A2A", "DSPARK_ATTN_DP_A2A", "EP_ONE_OR_TP_RUNNERS",
    "GPU_GENERATION_SETTINGS", "MLA_BACKEND_KV_DTYPES", "NGRAM_DEFAULT_BFS_BREADTH", "NVFP4_ONLINE_RUNNERS",
    "NVFP4_PREFILL_BACKENDS", "PAGE_TREE_SPEC_BACKENDS", "PP_SPECULATIVE", "RUNNER_QUANTIZATION", "effective_page",
    "startup_check_problems", "tuning_origin",
]

# SGLang's EnvBool reads these as true (sglang/srt/environ.py, 0.5.17 and 0.5.23)
_ENV_TRUE = ("true", "1", "yes", "y")
# what 0.5.23's check_pipeline_parallel_compat accepts with pp > 1 (NEXTN is EAGLE there:
# speculative_hook._resolve_speculative_algorithm_alias)
PP_SPECULATIVE = ("EAGLE", "NEXTN")
# moe runners whose expert-parallel size must be 1 or tp (server_args.py / moe_hook handle_moe_kernel_config)
EP_ONE_OR_TP_RUNNERS = ("flashinfer_cutlass", "flashinfer_cutedsl")
CUTEDSL_A2A = ("none", "deepep", "flashinfer")
# an explicit --quantization each flashinfer MoE runner takes (handle_moe_kernel_config; unset
# means bf16 or the checkpoint's own quantization_config, which SGLang reads at start)
_RUNNER_QUANTIZATION_0517: dict[str, tuple[str, ...]] = {
    "flashinfer_cutlass": ("modelopt_fp4", "modelopt_fp8", "modelopt_mixed"),
    "flashinfer_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed",
                          "compressed-tensors"),
    "experimental_sgl_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed",
                                "compressed-tensors"),
    "flashinfer_trtllm_routed": ("fp8", "mxfp8", "modelopt_fp4", "modelopt_mixed", "nvfp4_online"),
}
RUNNER_QUANTIZATION: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": _RUNNER_QUANTIZATION_0517,
    # 0.5.23: the same, and the routed runner also takes minimax_m3_nvfp4
    "0.5.23": {**_RUNNER_QUANTIZATION_0517, "flashinfer_trtllm_routed": (
        *_RUNNER_QUANTIZATION_0517["flashinfer_trtllm_routed"], "minimax_m3_nvfp4")},
}
# the runners --quantization nvfp4_online takes (moe_hook _moe_runner_backend_quant_constraints)
NVFP4_ONLINE_RUNNERS = {"0.5.17": ("flashinfer_trtllm", "flashinfer_trtllm_routed"),
                        "0.5.23": ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutedsl",
                                   "flashinfer_megamoe")}
# the runners an all-to-all backend takes (handle_a2a_moe); "auto" is always accepted
A2A_RUNNERS: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": {"flashinfer": ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm_routed"),
               "pplx": ("deep_gemm",)},
    "0.5.23": {"flashinfer": ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm",
                              "flashinfer_trtllm_routed", "deep_gemm"),
               "pplx": ("deep_gemm",), "flashinfer_megamoe": ("flashinfer_megamoe",), "deepep_v2": ("deep_gemm",)},
}
# all-to-all backends after which SGLang sets ep_size = tp_size (arg_groups/overrides.py
# _A2A_EP_SPANNING_BACKENDS / _a2a_ep_size, run from handle_a2a_moe)
A2A_EP_SPANNING: dict[str, tuple[str, ...]] = {
    "0.5.17": ("megamoe", "deepep", "mooncake", "nixl", "ascend_fuseep", "flashinfer", "mori", "pplx"),
    "0.5.23": ("megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep", "flashinfer",
               "flashinfer_megamoe", "mori", "pplx"),
}
# all-to-all backends that need attention DP: "tp" (as many attention-DP groups as TP ranks) or a minimum
A2A_ATTN_DP: dict[str, dict[str, object]] = {
    "0.5.17": {"flashinfer": "tp", "pplx": 2},
    "0.5.23": {"flashinfer_megamoe": "tp", "pplx": 2, "flashinfer": "tp"},
}
# the attention backends a --kv-cache-dtype nvfp4 prefill runs on (0.5.23 kv_cache_hook
# handle_nvfp4_prefill_kv_dequant_dtype: flashinfer with an FP8 workspace, trtllm_mha natively)
NVFP4_PREFILL_BACKENDS = {"0.5.23": ("flashinfer", "trtllm_mha")}


def tuning_origin(spec: ClusterSpec, engine: Engine, at: str, name: str) -> str:
    """The field path a tuning setting of ENGINE comes from (its own layer, its role's, `all`)."""
    if name in engine.tuning.model_fields_set:
        return f"tuning.{name}"
    layers = spec.cluster.tuning
    for layer in (engine.role, "all"):
        if name in getattr(layers, layer).model_fields_set:
            return f"pdkit_cluster.tuning.{layer}.{name}"
    return f"tuning.{name}"


def effective_page(version: str, tuning: Tuning, engine: Engine) -> int:
    """The page size SGLang VERSION's checks see for ENGINE: page_size as the attention backends snap it
    (arg_groups/overrides.py _mla_backend_page_constraints, pdkit.spec.pagesize), else 1 (_page_size_default
    on CUDA); both passes run before the speculative handlers and check_server_args."""
    args: dict[str, tuple[str, ...]] = {}
    if tuning.page_size is not None:
        args["page_size"] = (str(tuning.page_size),)
    if tuning.attention_backend is not None:
        args["attention_backend"] = (tuning.attention_backend,)
    for dest in ("prefill_attention_backend", "decode_attention_backend", "speculative_draft_attention_backend"):
        value = extra_arg(engine.extra_args, "--" + dest.replace("_", "-"))
        if value is not None:
            args[dest] = (value,)
    page, _ = effective_page_size(version, args)
    return page or 1


# attention backends that take an EAGLE tree (topk > 1) over pages > 1 (speculative_hook._handle_eagle_family)
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")
# --speculative-ngram-max-bfs-breadth's default (0.5.17 server_args.py, 0.5.23 arg_groups/fields/spec.py),
# which _handle_ngram copies into speculative_eagle_topk
NGRAM_DEFAULT_BFS_BREADTH = 10
# the KV cache dtypes an MLA attention backend takes (attention_hook._mla_kv_cache_dtype_checks,
# _cutedsl_prefill_backend_fill of 0.5.17 and 0.5.23)
MLA_BACKEND_KV_DTYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": {"trtllm_mla": ("fp8_e4m3", "fp4_e2m1", "bf16", "auto"), "tokenspeed_mla": ("fp8_e4m3",),
               "cutedsl_mla": ("fp8_e4m3", "bf16", "bfloat16", "auto")},
    "0.5.23": {"trtllm_mla": ("fp8_e4m3", "bf16", "auto"), "cutedsl_mla": ("fp8_e4m3", "bf16", "bfloat16", "auto")},
}
# moe_a2a_backend DSPARK takes with attention DP (speculative_hook._handle_dspark)
DSPARK_ATTN_DP_A2A = {"0.5.17": ("none",), "0.5.23": ("none", "megamoe", "mori")}


def _speculative_layout_problems(engine: Engine, tuning: Tuning, version: str, algorithm: str,
                                 origin: Callable[[str], str]) -> list[tuple[str, str]]:
    """Speculative decoding against attention DP, TP/PP and the attention backend, as each
    algorithm's handler checks it (speculative_hook._handle_dflash / _dspark / _eagle_family /
    _ngram / _uno of 0.5.17 and 0.5.23)."""
    out: list[tuple[str, str]] = []
    spec_at = origin("speculative")
    attn_dp = engine.attn_dp or 1
    extra = {a.split("=", 1)[0] for a in engine.extra_args}
    topk = tuning.speculative.eagle_topk if tuning.speculative is not None else None
    refuses_attn_dp = {"NGRAM": "ngram", "STANDALONE": "standalone"}
    if version == "0.5.17":
        refuses_attn_dp["DFLASH"] = "DFLASH"
    if algorithm in ("UNO",):
        refuses_attn_dp["UNO"] = "UNO"
    if attn_dp > 1 and algorithm in refuses_attn_dp:
        out.append(("attn_dp", f"attn_dp {attn_dp} with speculative algorithm {algorithm}: SGLang {version} refuses it "
                               f"at start ('Currently {refuses_attn_dp[algorithm]} speculative decoding does not "
                               "support dp attention'); "
                               "valid: attn_dp 1 for this engine, or an algorithm that runs with attention DP (EAGLE, "
                               f"EAGLE3, NEXTN{', DFLASH' if version != '0.5.17' else ''}, DSPARK)"))
    if (attn_dp > 1 and algorithm in ("DFLASH", "DSPARK") and "--enable-dp-lm-head" not in extra
        and not (algorithm == "DFLASH" and version == "0.5.17")):
        out.append(("extra_args", f"attn_dp {attn_dp} with speculative algorithm {algorithm}: SGLang {version} "
                                  "requires --enable-dp-lm-head at start "
                                  f"('{'DSpark' if algorithm == 'DSPARK' else 'DFLASH'} with dp attention requires "
                                  "--enable-dp-lm-head'); "
                                  "valid: add '--enable-dp-lm-head' to extra_args, or attn_dp 1"))
    if (attn_dp > 1 and algorithm == "DSPARK" and tuning.moe_a2a_backend is not None
        and tuning.moe_a2a_backend not in DSPARK_ATTN_DP_A2A[version]):
        out.append((origin("moe_a2a_backend"), f"moe_a2a_backend {tuning.moe_a2a_backend} with DSPARK and attn_dp "
                    f"{attn_dp}: SGLang {version} refuses it at start; valid: "
                    f"{', '.join(DSPARK_ATTN_DP_A2A[version])}"))
    if algorithm == "DFLASH" and engine.pp != 1:
        out.append(("pp", f"pp {engine.pp} with speculative algorithm DFLASH: SGLang {version} refuses it at start "
                    "('Currently DFLASH speculative decoding only supports pp_size == 1'); valid: pp 1"))
    if algorithm == "UNO" and (engine.tp_size, engine.pp) != (1, 1):
        out.append(("tp" if engine.tp_size != 1 else "pp",
                    f"tp {engine.tp_size} / pp {engine.pp} with speculative algorithm UNO: SGLang {version} refuses it "
                    "at start ('UNO requires TP=PP=1'); valid: tp 1 and pp 1 (one GPU per engine)"))
    if algorithm == "UNO" and tuning.attention_backend == "fa3" and tuning.kv_cache_dtype == "fp8_e5m2":
        # _attention_backend_fa3_fp8_fallback turns fa3 into triton before _handle_uno checks it
        out.append((origin("kv_cache_dtype"), f"kv_cache_dtype fp8_e5m2 with attention_backend fa3 and speculative "
                    f"algorithm UNO: SGLang {version} swaps fa3 for triton with an fp8_e5m2 KV cache, then refuses UNO "
                    "('UNO requires FA3 for both prefill and decode attention'); valid: kv_cache_dtype fp8_e4m3, bf16 "
                    "or auto"))
    if algorithm == "UNO" and tuning.attention_backend not in (None, "fa3"):
        out.append((origin("attention_backend"), f"attention_backend {tuning.attention_backend} with speculative "
                    f"algorithm UNO: SGLang {version} refuses it at start ('UNO requires FA3 for both prefill and "
                    "decode attention'); valid: fa3, or leave it unset"))
    if (algorithm == "DSPARK" and tuning.speculative is not None and tuning.speculative.num_draft_tokens is not None
        and tuning.speculative.num_draft_tokens < 2):
        out.append((spec_at + ".num_draft_tokens",
                    f"num_draft_tokens {tuning.speculative.num_draft_tokens} with DSPARK: SGLang {version} refuses it "
                    "at start ('DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1)'); valid: 2 or more"))
    if topk is not None and topk > 1 and tuning.attention_backend == "trtllm_mha":
        out.append((spec_at + ".eagle_topk", f"eagle_topk {topk} with attention_backend trtllm_mha: SGLang {version} "
                    "refuses it at start ('trtllm_mha backend only supports topk = 1 for speculative decoding'); "
                    "valid: eagle_topk 1, or another attention_backend"))
    # the page size as the backends snap it before the check (trtllm_mla, flashmla, ... force 32/64);
    # NGRAM replaces eagle_topk by --speculative-ngram-max-bfs-breadth first (_handle_ngram)
    page = effective_page(version, tuning, engine)
    tree_at, tree_topk, tree_name = spec_at + ".eagle_topk", topk, "eagle_topk"
    if algorithm == "NGRAM":
        breadth = extra_arg(engine.extra_args, "--speculative-ngram-max-bfs-breadth")
        tree_topk = int(breadth) if breadth is not None and breadth.isdigit() else NGRAM_DEFAULT_BFS_BREADTH
        tree_at, tree_name = spec_at, f"NGRAM's bfs breadth (SGLang's eagle_topk for NGRAM) {tree_topk}"
    if tree_topk is not None and tree_topk > 1 and page > 1 and tuning.attention_backend is not None:
        allowed = ("flashinfer",) if algorithm == "NGRAM" else PAGE_TREE_SPEC_BACKENDS
        if tuning.attention_backend not in allowed:
            shown = f"eagle_topk {tree_topk}" if algorithm != "NGRAM" else tree_name
            out.append((tree_at, f"{shown} with page_size {page}"
                        f"{'' if tuning.page_size == page else ' (as SGLang snaps it for this backend)'} and "
                        f"attention_backend {tuning.attention_backend}: SGLang {version} refuses it at start; "
                        + ("valid: eagle_topk 1, page_size 1, or attention_backend "
                           f"{' / '.join(allowed)}" if algorithm != "NGRAM" else
                           "valid: attention_backend flashinfer, page_size 1, or "
                           "['--speculative-ngram-max-bfs-breadth', '1'] in extra_args")))
    return out


# settings SGLang accepts only on some GPU generations (by the compute capability's major):
# (tuning field, value, majors, what SGLang says) from attention_hook / kv_cache_hook / moe_hook
# (_handle_kv4_compatibility, _handle_mxfp8_kv_cache_compatibility, _moe_runner_backend_quant_constraints,
# handle_a2a_moe, _mla_kv_cache_dtype_checks, _cutedsl_prefill_backend_fill) of 0.5.17 and 0.5.23
GPU_GENERATION_SETTINGS: tuple[tuple[str, str, tuple[int, ...], str], ...] = (
    ("kv_cache_dtype", "nvfp4", (10, 12), "--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120"),
    ("kv_cache_dtype", "mxfp8", (10, 11, 12), "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU"),
    ("quantization", "nvfp4_online", (10,), "--quantization nvfp4_online is supported only on NVIDIA Blackwell "
     "SM100/SM103 GPUs"),
    ("moe_a2a_backend", "flashinfer_megamoe", (10,),
     "FlashInfer MegaMOE currently requires an SM100-family CUDA device"),
    ("attention_backend", "trtllm_mla", (10, 12), "TRTLLM MLA backend is only supported on Blackwell GPUs "
     "(SM100/SM12x)"),
    ("attention_backend", "tokenspeed_mla", (10, 12),
     "tokenspeed_mla backend is only supported on Blackwell GPUs (SM100/SM12x)"),
    ("attention_backend", "cutedsl_mla", (10,), "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)"),
)


def startup_check_problems(spec: ClusterSpec, engine: Engine, node: Node | None = None) -> list[tuple[str, str]]:
    """(field, why) for what the engine's SGLang release refuses at start (its ServerArgs checks),
    for combinations of the flags pdkit renders and the GPUs NODE declares. Field paths are the
    engine's unless they start with pdkit_cluster."""
    out: list[tuple[str, str]] = []
    version = spec.engine_version(engine)
    tuning = spec.engine_tuning(engine)
    spec_cfg = tuning.speculative
    algorithm = spec_cfg.algorithm if spec_cfg is not None else None
    origin = functools.partial(tuning_origin, spec, engine, "")
    def env_on(name: str) -> bool:
        return str(engine.env.get(name, "")).lower() in _ENV_TRUE
    pp = engine.pp
    # pp > 1 with the overlap schedule on is NOT refused: both pinned releases turn the schedule off
    # themselves for pp > 1 before their check runs (arg_groups/overrides.py
    # _pipeline_parallel_overlap_disable; 0.5.17 from server_args.py _handle_pipeline_parallelism,
    # 0.5.23 from arg_groups/pipeline.py's resolution pass), so their assert cannot fire from pdkit's flags
    if pp > 1 and algorithm is not None:
        if version == "0.5.17":
            out.append(("pp", f"pp {pp} with speculative decoding ({algorithm}): SGLang 0.5.17 refuses it at start "
                              "('Pipeline parallelism is not compatible with overlap schedule, speculative decoding'); "
                              "valid: pp 1, no tuning.speculative, or sglang_version 0.5.23 on a prefill engine with "
                              "EAGLE/NEXTN or DSPARK"))
        elif algorithm == "DSPARK":
            if engine.role != "prefill":
                out.append(("pp", f"pp {pp} with speculative algorithm DSPARK on a {engine.role} engine: SGLang "
                                  f"{version} refuses it at start ('Pipeline parallel DSPARK requires "
                                  "disaggregation-mode=prefill'); "
                                  "valid: pp 1, or DSPARK with pp only on a prefill engine"))
            if env_on("SGLANG_ENABLE_PP_SPEC"):
                out.append(("env.SGLANG_ENABLE_PP_SPEC",
                            f"SGLANG_ENABLE_PP_SPEC with DSPARK and pp {pp}: SGLang {version} refuses it at start "
                            "('SGLANG_ENABLE_PP_SPEC does not support DSPARK PD prefill'); valid: remove it"))
        else:
            if algorithm not in PP_SPECULATIVE:
                out.append((origin("speculative") + ".algorithm",
                            f"pp {pp} with speculative algorithm {algorithm}: SGLang {version} refuses it at start "
                            "('Pipeline parallelism currently only supports EAGLE (non-multi-layer) speculative "
                            f"decoding'); valid with pp > 1: {', '.join(PP_SPECULATIVE)} or "
                                                                "DSPARK (prefill engines), or pp 1"))
            if env_on("SGLANG_ENABLE_PP_SPEC"):
                if engine.role != "unified":
                    out.append(("env.SGLANG_ENABLE_PP_SPEC",
                                f"SGLANG_ENABLE_PP_SPEC on a {engine.role} engine: SGLang {version} refuses it with PD "
                                "disaggregation ('SGLANG_ENABLE_PP_SPEC is not compatible "
                                "with --disaggregation-mode'); "
                                                             "valid: remove it (PP + speculative decoding then runs on "
                                                             "prefill engines only), or a unified engine"))
                if (engine.attn_dp or 1) > 1:
                    out.append(("attn_dp", f"attn_dp {engine.attn_dp} with SGLANG_ENABLE_PP_SPEC, pp {pp} and "
                                           f"speculative decoding: SGLang {version} refuses it at start "
                                           "('SGLANG_ENABLE_PP_SPEC is not compatible with attention DP'); "
                                           "valid: attn_dp 1, or remove SGLANG_ENABLE_PP_SPEC"))
            elif engine.role != "prefill":
                out.append(("pp", f"pp {pp} with speculative decoding ({algorithm}) on a {engine.role} engine: SGLang "
                                  f"{version} refuses it at start ('PP + speculative decoding (MTP) is only supported "
                                  "on prefill nodes'); "
                                  "valid: pp 1 on this engine, speculative decoding without pp, or pp with speculative "
                                  "decoding only on prefill engines"))
    if algorithm is not None:
        out += _speculative_layout_problems(engine, tuning, version, algorithm, origin)
    if algorithm is not None and tuning.attention_backend == "flex_attention":
        out.append((origin("attention_backend"), "attention_backend flex_attention with speculative decoding "
                                                 f"({algorithm}): SGLang {version} refuses it at start ('Speculative "
                                                 "decoding is currently not supported with Flex Attention backend'); "
                                                 "valid: another attention_backend (e.g. fa3, flashinfer, triton), or "
                                                 "no tuning.speculative"))
    if engine.role == "prefill" and spec.cluster.transfer_backend == "fake" and spec.cluster.engine == "sglang":
        out.append(("pdkit_cluster.transfer_backend",
                    f"transfer_backend 'fake' with a prefill engine ({engine.name}): SGLang {version} refuses it at "
                    "start (\"Prefill server does not support 'fake' as the transfer backend\"); "
                                                       "valid: nixl or mooncake (fake only discards KV on decode "
                                                       "engines, for benchmarks)"))
    if node is not None and node.gpu == "nvidia" and spec.cluster.engine == "sglang":
        major = node.gpus.sm_major
        for name, value, majors, says in GPU_GENERATION_SETTINGS:
            if getattr(tuning, name) == value and major not in majors:
                out.append((origin(name), f"{name} {value} on {node.gpus.model} (compute capability "
                                          f"{node.gpus.compute_capability}): SGLang {version} refuses it at start "
                                          f"('{says}'); "
                                          f"valid on this GPU: another {name}, or an engine on a node with compute "
                                          f"capability {' / '.join(f'{m}.x' for m in majors)}"))
    if (engine.role != "unified" and spec.cluster.transfer_backend not in ("mooncake", "nixl")
        and env_on("SGLANG_DISAGG_STAGING_BUFFER")):
        out.append(("env.SGLANG_DISAGG_STAGING_BUFFER",
                    f"SGLANG_DISAGG_STAGING_BUFFER with transfer_backend {spec.cluster.transfer_backend!r}: SGLang "
                    f"{version} refuses it at start; valid: remove it, or pdkit_cluster.transfer_backend nixl or "
                                                       "mooncake"))
    kv_dtypes = MLA_BACKEND_KV_DTYPES.get(version, {}).get(tuning.attention_backend or "")
    if kv_dtypes is not None and tuning.kv_cache_dtype is not None and tuning.kv_cache_dtype not in kv_dtypes:
        out.append((origin("kv_cache_dtype"), f"kv_cache_dtype {tuning.kv_cache_dtype} with attention_backend "
                    f"{tuning.attention_backend}: SGLang {version} refuses it at start; valid: {', '.join(kv_dtypes)}"))
    runner = tuning.moe_runner_backend
    tp = engine.tp_size
    if runner in EP_ONE_OR_TP_RUNNERS and engine.ep is not None and engine.ep not in (1, tp):
        out.append(("ep", f"ep {engine.ep} with moe_runner_backend {runner}: SGLang {version} refuses it at start "
                    "('The expert parallel size must be 1 or the same as the tensor parallel size'); valid: ep 1 or ep "
                    f"{tp}"))
    if (runner == "flashinfer_cutedsl" and tuning.moe_a2a_backend is not None
        and tuning.moe_a2a_backend not in CUTEDSL_A2A):
        out.append((origin("moe_a2a_backend"), f"moe_a2a_backend {tuning.moe_a2a_backend} with moe_runner_backend "
                    f"flashinfer_cutedsl: SGLang {version} refuses it at start; valid: {', '.join(CUTEDSL_A2A)}"))
    quant = tuning.quantization
    allowed = RUNNER_QUANTIZATION.get(version, {}).get(runner or "")
    if quant is not None and allowed is not None and quant not in allowed:
        out.append((origin("quantization"), f"quantization {quant} with moe_runner_backend {runner}: SGLang {version} "
                                            f"refuses it at start (\"Invalid quantization '{quant}'\"); "
                                            f"valid: {', '.join(allowed)}, or leave quantization unset (bf16 / the "
                                            "checkpoint's own)"))
    if quant == "nvfp4_online" and runner not in (None, "auto") and runner not in NVFP4_ONLINE_RUNNERS.get(version, ()):
        out.append((origin("moe_runner_backend"), f"moe_runner_backend {runner} with quantization nvfp4_online: SGLang "
                    f"{version} refuses it at start; valid: {', '.join(NVFP4_ONLINE_RUNNERS[version])} or auto"))
    if runner == "cutlass" and quant in ("fp8", "mxfp8") and (engine.ep or 1) > 1:
        out.append(("ep", f"ep {engine.ep} with moe_runner_backend cutlass and quantization {quant}: SGLang {version} "
                    "refuses it at start ('FP8/MXFP8 Cutlass MoE is only supported with ep_size == 1'); valid: ep 1, "
                    "or another moe_runner_backend"))
    a2a = tuning.moe_a2a_backend
    if version == "0.5.23" and runner == "megamoe":
        # 0.5.23's mega_moe_hook.handle_moe_runner_backend_alias: runner megamoe is --moe-a2a-backend megamoe
        # with runner auto, whatever a2a backend was given (a warning), before handle_a2a_moe checks it
        a2a, runner = "megamoe", "auto"
    runners = A2A_RUNNERS.get(version, {}).get(a2a or "")
    if runners is not None and runner not in (None, "auto") and runner not in runners:
        out.append((origin("moe_runner_backend"), f"moe_runner_backend {runner} with moe_a2a_backend {a2a}: SGLang "
                    f"{version} refuses it at start; valid: {', '.join(runners)} or auto"))
    need = A2A_ATTN_DP.get(version, {}).get(a2a or "")
    attn_dp = engine.attn_dp or 1
    extra = {a.split("=", 1)[0] for a in engine.extra_args}
    if a2a == "flashinfer" and "--enable-layernorm-sp" in extra:
        need = None  # 0.5.23's Muse Spark prefill sequence parallelism: its own topology rule (on the checkpoint)
    if need == "tp" and attn_dp != tp:
        out.append(("attn_dp", f"moe_a2a_backend {a2a} needs attention DP over every TP rank: SGLang {version} refuses "
                    f"attn_dp {attn_dp} with tp {tp} at start; valid: attn_dp {tp}"))
    elif isinstance(need, int) and attn_dp < need:
        out.append(("attn_dp", f"moe_a2a_backend {a2a} needs attention DP with at least {need} groups: SGLang "
                    f"{version} refuses attn_dp {attn_dp} at start; valid: attn_dp >= {need} dividing tp {tp}"))
    if a2a == "deepep_v2" and engine.spans_nodes and "--deepep-v2-mode" not in extra:
        out.append((origin("moe_a2a_backend"), f"moe_a2a_backend deepep_v2 on an engine spanning {engine.nnodes} "
                                               f"nodes: SGLang {version} refuses it at start with its default "
                                               "--deepep-v2-mode direct "
                                               "('--deepep-v2-mode direct is NVLink-only and cannot run across "
                                               "nodes'); valid: add ['--deepep-v2-mode', 'hybrid'] to extra_args, or "
                                               "an engine on one node"))
    backend = tuning.attention_backend
    if (tuning.kv_cache_dtype == "nvfp4" and version in NVFP4_PREFILL_BACKENDS and backend is not None
            and backend not in NVFP4_PREFILL_BACKENDS[version] and "--prefill-attention-backend" not in extra):
        out.append((origin("attention_backend"), f"attention_backend {backend} with kv_cache_dtype nvfp4: SGLang "
                                                 f"{version} refuses it at start "
                                                 "(\"NVFP4 prefill supports an FP8 E4M3 workspace or native NVFP4, but "
                                                 f"backend '{backend}' provides neither.\"); "
                                                 f"valid: {' or '.join(NVFP4_PREFILL_BACKENDS[version])}, or leave "
                                                 "attention_backend unset"))
    return out
