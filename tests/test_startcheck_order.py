"""Issue 46 item 2: each start-check rule of pdkit validate against the order SGLang runs its own
resolution in. A check reads its fields after the handlers and post-process passes before it have
written them (defaults filled in, settings turned off, page sizes forced); a rule that looks at the
flags pdkit renders instead of what the check sees refuses what SGLang accepts or misses what it
refuses.

ORDER holds, for every coverage entry with a "rule" (pdkit/upstream/data/startup_check_coverage.json) and
every pinned release that runs the check: the call path from ServerArgs' entry methods to the check
(0.5.17: ServerArgs.__post_init__ / check_server_args; 0.5.23: resolve_once ->
arg_groups/pipeline.py run_resolution_pipeline, then check_server_args), the derivations that run
before it and write one of the fields it reads (file:function in the release's sglang/srt), and the
verdict (VERDICTS): SAFE (no earlier derivation changes the verdict for what pdkit renders) or
FIXED (it did, and the rule now models it). The contract test re-derives path and writers from the
wheels' source (no import: it needs triton) with the same walk as pdkit.upstream.startchecks: a release bump
that adds a derivation before a check fails here until the row is read again.

The walk is depth first in source order and ignores conditions, so it lists every writer that can
run before the check (other algorithms' handlers, platform hooks): more than run for one engine,
which the verdict lines account for. Model overrides registered per architecture
(arg_groups/model_overrides, dispatched at run time) are not walked: they depend on the checkpoint.
"""

from __future__ import annotations

import ast
from typing import NamedTuple

import pytest

from pdkit.upstream import parsertable, startchecks
from pdkit.upstream.versions import SGLANG_RELEASES
from tests.conftest import require


class Order(NamedTuple):
    handler: str  # the call path to the check, from ServerArgs' entry method
    earlier: tuple[str, ...]  # file:function of each derivation before it that writes a field it reads
    verdict: str  # a key of VERDICTS


VERDICTS = {
    'attn-dp-not-dividing-tp':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'attn-dp-with-dp-replicas':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'attn-dp-zero':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'chunked-prefill-not-page-multiple':
        "FIXED: the rule now checks the chunk per attention-DP rank (handle_data_parallelism divides it), the page as the backend snaps it (_mla_backend_page_constraints), and skips decode engines; an unset chunk (handle_gpu_memory_settings' default), fa4's SM100 page 128 and model overrides are not modelled",
    'cutedsl-runner-ep-neither-1-nor-tp':
        "SAFE: runs before _a2a_ep_size (handle_a2a_moe); the runner writers only resolve 'auto' (nvfp4_online/mxfp8), the 'megamoe' alias or a checkpoint's choice, never an explicit flashinfer runner; ep only with --dwdp-size",
    'cutedsl-runner-with-mooncake-a2a':
        "SAFE: a2a writers need --enable-waterfill/--dwdp-size (never rendered) or runner 'megamoe' (then not cutedsl); runner writers resolve 'auto' or a checkpoint's choice only",
    'cutlass-fp8-with-ep':
        "SAFE: runs before _a2a_ep_size; quantization writers are GGUF/checkpoint-driven; 0.5.17's _cutlass_moe_env_override needs SGLANG_CUTLASS_MOE in env (not modelled)",
    'cutlass-runner-ep-neither-1-nor-tp':
        "SAFE: runs before _a2a_ep_size (handle_a2a_moe); the runner writers only resolve 'auto' (nvfp4_online/mxfp8), the 'megamoe' alias or a checkpoint's choice, never an explicit flashinfer runner; ep only with --dwdp-size",
    'decode-radix-with-fake-backend':
        "SAFE: handle_pd_disaggregation only rewrites 'mooncake_tcp' to 'mooncake' before the check; 'fake' stays 'fake'",
    'decode-radix-with-nextn-on-0517':
        'SAFE: nothing writes its fields before it',
    'decode-radix-with-ngram-on-0523':
        "SAFE: handle_speculative_decoding upper-cases and aliases NEXTN to EAGLE (pdkit lists NEXTN as valid); --enable-aux-hidden-state capture is never rendered; a Gemma4 draft's FROZEN_KV_MTP promotion is checkpoint-dependent",
    'deepep-v2-across-nodes':
        "SAFE: a2a writers need --enable-waterfill/--dwdp-size or runner 'megamoe' (then a2a megamoe, not deepep_v2)",
    'dflash-with-attention-dp-on-0517':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'dflash-with-pp':
        'SAFE: nothing writes its fields before it',
    'dflash-without-draft':
        'SAFE: the draft-path writers only rewrite a given path (ModelScope/GGUF) or fill it from the checkpoint (DSPARK: a warning in pdkit for that reason)',
    'dspark-attention-dp-without-dp-lm-head':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged; enable_dp_lm_head is forced off only with one DP rank; a2a writers need --enable-waterfill/--dwdp-size',
    'dspark-draft-tokens':
        "SAFE: _handle_dspark fills num_draft_tokens from the draft's gamma only when unset (pdkit checks an explicit value); the other writers are other algorithms' handlers or --speculative-adaptive",
    'dspark-without-draft':
        'SAFE: the draft-path writers only rewrite a given path (ModelScope/GGUF) or fill it from the checkpoint (DSPARK: a warning in pdkit for that reason)',
    'eagle-tree-on-trtllm-mha':
        'SAFE: topk is auto-chosen only when num_steps is unset (then pdkit renders no topk); the backend writers fill an unset backend or swap fa3 for triton, never to or from trtllm_mha',
    'eplb-without-ep':
        'FIXED: _a2a_ep_size (handle_a2a_moe, run before handle_eplb_and_dispatch) sets ep_size = tp_size for the EP-spanning all-to-all backends; the rule now uses that ep (startup.A2A_EP_SPANNING); --dwdp-size never rendered',
    'fake-backend-with-a-prefill':
        "SAFE: handle_pd_disaggregation only rewrites 'mooncake_tcp' to 'mooncake' before the check; 'fake' stays 'fake'",
    'flashinfer-a2a-0517-needs-dp-attention':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged; a2a writers need --enable-waterfill/--dwdp-size',
    'flashinfer-a2a-0517-with-triton-runner':
        "FIXED: 0.5.23's handle_moe_runner_backend_alias turns runner megamoe into a2a megamoe + runner auto (the rule now does too); otherwise the runner writers only resolve 'auto' (nvfp4_online/mxfp8, megamoe, deepep_v2) or a checkpoint's choice; an unset runner with a2a flashinfer is left to SGLang (checkpoint-dependent, not refused)",
    'flashinfer-a2a-0523-attn-dp-below-tp':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged; _a2a_ep_size sets ep = tp, the topology pdkit requires anyway (attn_dp == tp)',
    'flashinfer-megamoe-attn-dp-below-tp':
        "SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged; a2a writers need --enable-waterfill/--dwdp-size or runner 'megamoe' (a2a megamoe, not flashinfer_megamoe)",
    'flashinfer-megamoe-on-hopper':
        "SAFE: a2a writers need --enable-waterfill/--dwdp-size or runner 'megamoe' (a2a megamoe, not flashinfer_megamoe)",
    'flex-attention-with-speculative':
        'SAFE: the backend writers fill an unset backend (hpu/cpu devices, deterministic inference, default) and never produce or remove flex_attention; speculative_algorithm only via --enable-aux-hidden-state capture (never rendered)',
    'gpus-not-evenly-spaced':
        'SAFE: nothing writes its fields before it',
    'hicache-with-nvfp4-kv-on-blackwell':
        "SAFE: kv writers are DeepSeek/DSA checkpoints and 0.5.23's tokenspeed_mla alias (forces fp8_e4m3, so no nvfp4)",
    'hicache-with-radix-cache-off':
        'FIXED: handle_pd_disaggregation sets disable_radix_cache on a decode engine without --disaggregation-decode-enable-radix-cache; the rule now refuses hicache there too; other writers: deterministic inference, multi-item scoring, model overrides (never rendered / checkpoint)',
    'mxfp8-kv-cache-on-hopper':
        "SAFE: kv writers are DeepSeek/DSA checkpoints and 0.5.23's tokenspeed_mla alias (forces fp8_e4m3)",
    'ngram-tree-bfs-breadth':
        'FIXED: _handle_ngram replaces eagle_topk by --speculative-ngram-max-bfs-breadth (default 10) and the snapped page counts; the rule now reads both',
    'ngram-with-attention-dp':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'nvfp4-kv-cache-on-hopper':
        "SAFE: kv writers are DeepSeek/DSA checkpoints and 0.5.23's tokenspeed_mla alias (forces fp8_e4m3, on a backend that itself needs Blackwell)",
    'nvfp4-kv-with-fa3-on-blackwell':
        'SAFE: runs before _attention_backend_default and the fa3 fallback; prefill backend only from extra_args (the rule then stands down); kv writers are checkpoints or the tokenspeed_mla alias',
    'nvfp4-online-quantization-on-hopper':
        'SAFE: quantization writers are GGUF/checkpoint-driven',
    'nvfp4-online-with-triton-runner':
        "SAFE: runner writers resolve 'auto'/'megamoe' or a checkpoint's choice; an explicit triton stays triton",
    'page-tree-snapped-page':
        "FIXED: the page as _mla_backend_page_constraints snaps it (flashmla/trtllm_mla/cutedsl_mla/hpc_ops force >1) now counts (startup.effective_page); fa4's page 128 is skipped for topk > 1; _page_size_default gives 1",
    'pp-dspark-on-decode':
        'SAFE: only the alias (DSPARK stays DSPARK) and --dllm-* (never rendered) write its fields',
    'pp-dspark-with-pp-spec-env':
        'SAFE: the alias keeps DSPARK',
    'pp-speculative-eagle3':
        'SAFE: the alias makes NEXTN EAGLE (PP_SPECULATIVE lists both); aux-hidden-state capture never rendered; Gemma4 draft promotion checkpoint-dependent',
    'pp-speculative-env-on-pd':
        'SAFE: the alias keeps the algorithm non-None; --dllm-* never rendered',
    'pp-speculative-env-with-attention-dp':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'pp-speculative-on-0517':
        'SAFE: for pp > 1 _pipeline_parallel_overlap_disable turns the overlap schedule off (so pdkit no longer refuses it: issue 46); speculative_algorithm stays non-None; other writers are mps/cpu/dllm/checkpoints',
    'pp-speculative-on-decode':
        'SAFE: the alias keeps the algorithm non-None (and not DSPARK); --dllm-* never rendered',
    'pplx-without-attention-dp':
        "SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged; a2a writers need --enable-waterfill/--dwdp-size or runner 'megamoe'",
    'served-name-with-colon':
        'SAFE: handle_missing_default_values fills served_model_name only when unset; pdkit always renders --served-model-name',
    'span-dp-replicas':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged',
    'span-tp-not-divisible-by-nodes':
        'SAFE: pp only with --dllm-*, ep_join_mode only with elastic EP (never rendered)',
    'staging-buffer-with-fake-backend':
        "SAFE: handle_pd_disaggregation only rewrites 'mooncake_tcp' to 'mooncake' before the check",
    'standalone-with-attention-dp':
        'SAFE: the DP writers run only with --dwdp-size (never rendered), for DeepSeek-V4 CP checkpoints, or translate the deprecated --dp-size/--enable-dp-attention spelling (0.5.23) / turn DP attention off with one DP rank: the layout pdkit renders reaches the check unchanged; the algorithm alias never turns STANDALONE into another algorithm',
    'topk-without-steps':
        "FIXED: the assert is the EAGLE family's (_handle_eagle_family) and UNO's tree mode only; DFLASH/DSPARK/NGRAM fill num_steps themselves, so Speculative._consistent_counts now refuses only those; adaptive params need --speculative-adaptive (never rendered)",
    'trtllm-mla-on-hopper':
        "SAFE: the backend writers fill an unset backend or swap fa3 for triton; never to or from trtllm_mla / cutedsl_mla (0.5.23's tokenspeed_mla alias: see report)",
    'trtllm-mla-with-fp8-e5m2-kv':
        'SAFE: the backend writers fill an unset backend; kv writers are DeepSeek/DSA checkpoints and the tokenspeed_mla alias (forces fp8_e4m3, accepted)',
    'trtllm-routed-runner-with-awq':
        "SAFE: runner writers resolve 'auto'/'megamoe' or a checkpoint's choice; quantization writers are GGUF/checkpoint-driven",
    'uno-fa3-fp8-fallback':
        'FIXED: _attention_backend_fa3_fp8_fallback turns fa3 into triton with kv_cache_dtype fp8_e5m2 before _handle_uno; the rule now refuses UNO + fa3 + fp8_e5m2',
    'uno-tree-num-steps':
        'FIXED: UNO asserts num_steps only in tree mode (topk > 1); Speculative._consistent_counts now refuses only that for UNO',
    'uno-with-a-draft':
        'SAFE: the draft-path writers only rewrite a given path (ModelScope/GGUF)',
    'uno-with-tp-2':
        'SAFE: nothing writes tp/pp before it; DP/CP writers as elsewhere (--dwdp-size, DeepSeek-V4 CP)',
    'uno-without-lora':
        'SAFE: nothing writes uno_lora_path before it',
}

ORDER: dict[tuple[str, str], Order] = {
    ('04ba027a6b89', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_model_specific_adjustments > validate_deepseek_v4_cp > context_parallel_attn_dp_size',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
        ),
        'attn-dp-with-dp-replicas'),
    ('079f1d0db15f', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility > _mla_kv_cache_dtype_checks',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-with-fp8-e5m2-kv'),
    ('0a45ceb25539', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'server_args.py:ServerArgs._handle_a2a_moe',
        ),
        'dspark-attention-dp-without-dp-lm-head'),
    ('0b90d72ccde6', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_uno',
        (
            'arg_groups/model_path_hook.py:resolve_hf_gguf_model_path',
            'arg_groups/model_path_hook.py:handle_modelscope_paths',
        ),
        'uno-with-a-draft'),
    ('0c02b06d2dae', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_nvfp4_prefill_kv_dequant_dtype',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'arg_groups/overrides.py:_deterministic_attention_backend',
        ),
        'nvfp4-kv-with-fa3-on-blackwell'),
    ('0c6a9e74fabc', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_data_parallelism',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'attn-dp-not-dividing-tp'),
    ('11755dc2b609', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility > _mla_kv_cache_dtype_checks',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-with-fp8-e5m2-kv'),
    ('11ae32074d60', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
        ),
        'served-name-with-colon'),
    ('11ae32074d60', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args',
        (
            'arg_groups/serving_hook.py:handle_missing_default_values',
        ),
        'served-name-with-colon'),
    ('13d84383a66b', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config > _moe_runner_backend_quant_constraints',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
        ),
        'nvfp4-online-with-triton-runner'),
    ('14d1ccab1a18', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutlass-fp8-with-ep'),
    ('158b123ed358', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'span-dp-replicas'),
    ('1684d1f54f5d', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_uno',
        (
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
        ),
        'uno-tree-num-steps'),
    ('1a5027fb1d69', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_cutedsl_prefill_backend_fill',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
            'arg_groups/overrides.py:_attention_backend_dual_chunk',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_eagle_family',
        ),
        'eagle-tree-on-trtllm-mha'),
    ('1a5027fb1d69', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/kv_cache_hook.py:handle_nvfp4_prefill_kv_dequant_dtype',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_cutedsl_prefill_backend_fill',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_uno',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_iquest_q1_mtp_draft',
            'arg_groups/speculative_hook.py:_handle_eagle_family',
        ),
        'eagle-tree-on-trtllm-mha'),
    ('1d3ed15c5d8a', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_data_parallelism',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
        ),
        'attn-dp-with-dp-replicas'),
    ('283c891de1a0', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_a2a_backend_overrides',
        ),
        'flashinfer-megamoe-on-hopper'),
    ('2b7e64341e46', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
        ),
        'span-dp-replicas'),
    ('349e2b0107a0', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-with-triton-runner'),
    ('37d20aa05836', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_kv4_compatibility',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
        ),
        'nvfp4-kv-cache-on-hopper'),
    ('3b64438a1de6', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'dspark-attention-dp-without-dp-lm-head'),
    ('3dabedcb1947', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_a2a_moe',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_cutlass_moe_env_override',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'server_args.py:ServerArgs._handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-with-triton-runner'),
    ('3e4a407e76ba', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_a2a_backend_overrides',
        ),
        'flashinfer-megamoe-attn-dp-below-tp'),
    ('44d499463da4', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_mxfp8_kv_cache_compatibility',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
        ),
        'mxfp8-kv-cache-on-hopper'),
    ('4773a1866f1d', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config > _moe_runner_backend_quant_constraints',
        (
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
        ),
        'nvfp4-online-quantization-on-hopper'),
    ('47a9da9c7bc8', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (),
        'pp-speculative-on-0517'),
    ('4bd8cfa9f19c', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility > _mla_kv_cache_dtype_checks',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-on-hopper'),
    ('4cc3a488f706', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (
            'server_args.py:ServerArgs._handle_gpu_memory_settings',
            'arg_groups/overrides.py:_mla_backend_page_constraints',
            'arg_groups/overrides.py:_fa4_page_constraint',
            'arg_groups/overrides.py:_intel_xpu_page_constraint',
            'arg_groups/overrides.py:_page_size_default',
            'server_args.py:ServerArgs._handle_multi_item_scoring',
            'server_args.py:ServerArgs._handle_data_parallelism',
            'arg_groups/overrides.py:_dllm_page_size',
            'server_args.py:ServerArgs._handle_dllm_inference',
            'server_args.py:ServerArgs._handle_model_capability_adjustments',
        ),
        'chunked-prefill-not-page-multiple'),
    ('4cc3a488f706', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args',
        (
            'arg_groups/memory_hook.py:handle_gpu_memory_settings',
            'arg_groups/model_hook.py:handle_model_specific_adjustments',
            'arg_groups/overrides.py:_mla_backend_page_constraints',
            'arg_groups/overrides.py:_fa4_page_constraint',
            'arg_groups/overrides.py:_intel_xpu_page_constraint',
            'arg_groups/overrides.py:_page_size_default',
            'arg_groups/attention_hook.py:handle_multi_item_scoring',
            'arg_groups/parallel_hook.py:handle_data_parallelism',
            'arg_groups/kv_shard_hook.py:handle_kv_cache_sharding',
            'arg_groups/overrides.py:_dllm_page_size',
            'arg_groups/dllm_hook.py:handle_dllm_inference',
            'arg_groups/model_hook.py:handle_model_capability_adjustments',
        ),
        'chunked-prefill-not-page-multiple'),
    ('56c2e57cc9c4', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-with-triton-runner'),
    ('5718eddc75c5', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args > check_pipeline_parallel_compat',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
            'arg_groups/dllm_hook.py:handle_dllm_inference',
        ),
        'pp-speculative-on-decode'),
    ('57a32547d0ea', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'arg_groups/model_path_hook.py:resolve_hf_gguf_model_path',
            'arg_groups/model_path_hook.py:handle_modelscope_paths',
            'arg_groups/speculative_hook.py:_handle_dspark',
        ),
        'dspark-without-draft'),
    ('5bc245df8774', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'trtllm-routed-runner-with-awq'),
    ('5dbfa514945f', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_uno',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/kv_cache_hook.py:handle_nvfp4_prefill_kv_dequant_dtype',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_cutedsl_prefill_backend_fill',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
        ),
        'uno-fa3-fp8-fallback'),
    ('63a4b399d16e', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (
            'server_args.py:ServerArgs._handle_elastic_ep',
            'server_args.py:ServerArgs._handle_dllm_inference',
        ),
        'span-tp-not-divisible-by-nodes'),
    ('63a4b399d16e', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args',
        (
            'arg_groups/dllm_hook.py:handle_dllm_inference',
        ),
        'span-tp-not-divisible-by-nodes'),
    ('66df2005cf21', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
        ),
        'decode-radix-with-ngram-on-0523'),
    ('679788ac2307', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
        ),
        'standalone-with-attention-dp'),
    ('6b8ae7ebb435', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (),
        'gpus-not-evenly-spaced'),
    ('6b8ae7ebb435', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args',
        (),
        'gpus-not-evenly-spaced'),
    ('6ce8cfeec67e', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_a2a_moe',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'server_args.py:ServerArgs._handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-needs-dp-attention'),
    ('6dd0f8a8c2b2', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dflash',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'dflash-with-attention-dp-on-0517'),
    ('7143a39052c9', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'pplx-without-attention-dp'),
    ('7206e77d54ee', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_kv4_compatibility',
        (
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
        ),
        'nvfp4-kv-cache-on-hopper'),
    ('75934dedad1b', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutlass-runner-ep-neither-1-nor-tp'),
    ('75934dedad1b', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutlass-runner-ep-neither-1-nor-tp'),
    ('7953432b1710', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_uno',
        (),
        'uno-with-tp-2'),
    ('7c4434848952', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-with-triton-runner'),
    ('7cbd5756695a', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-with-triton-runner'),
    ('7ef0b2d7918b', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'flex-attention-with-speculative'),
    ('7ef0b2d7918b', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_attention_backend_compatibility',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'flex-attention-with-speculative'),
    ('8040316013cf', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (),
        'gpus-not-evenly-spaced'),
    ('8040316013cf', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args',
        (),
        'gpus-not-evenly-spaced'),
    ('8043312dc5e9', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'trtllm-routed-runner-with-awq'),
    ('8043312dc5e9', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'trtllm-routed-runner-with-awq'),
    ('8049c17aee75', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility > _cutedsl_prefill_backend_fill',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-with-fp8-e5m2-kv'),
    ('8049c17aee75', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_attention_backend_compatibility > _cutedsl_prefill_backend_fill',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/kv_cache_hook.py:handle_nvfp4_prefill_kv_dequant_dtype',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-with-fp8-e5m2-kv'),
    ('810229bdb21a', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_mla_backend_page_constraints',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_fa4_page_constraint',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
            'arg_groups/overrides.py:_intel_xpu_page_constraint',
            'arg_groups/overrides.py:_attention_backend_dual_chunk',
            'arg_groups/overrides.py:_page_size_default',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_eagle_family',
        ),
        'page-tree-snapped-page'),
    ('810229bdb21a', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_mla_backend_page_constraints',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_fa4_page_constraint',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
            'arg_groups/overrides.py:_intel_xpu_page_constraint',
            'arg_groups/overrides.py:_page_size_default',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_uno',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_iquest_q1_mtp_draft',
            'arg_groups/speculative_hook.py:_handle_eagle_family',
        ),
        'page-tree-snapped-page'),
    ('81a0d84f1e13', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_a2a_backend_overrides',
        ),
        'deepep-v2-across-nodes'),
    ('81fe8602aa38', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_data_parallelism',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
        ),
        'attn-dp-not-dividing-tp'),
    ('8281f2ef089c', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_cache_compatibility',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
            'server_args.py:ServerArgs._handle_deterministic_inference',
            'server_args.py:ServerArgs._handle_attention_backend_compatibility',
            'server_args.py:ServerArgs._handle_multi_item_scoring',
        ),
        'hicache-with-radix-cache-off'),
    ('8281f2ef089c', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_cache_compatibility',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
            'arg_groups/model_hook.py:handle_model_specific_adjustments',
            'arg_groups/attention_hook.py:handle_deterministic_inference',
            'arg_groups/attention_hook.py:handle_attention_backend_compatibility',
            'arg_groups/attention_hook.py:handle_multi_item_scoring',
        ),
        'hicache-with-radix-cache-off'),
    ('828c49d53758', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_eplb_and_dispatch',
        (
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_a2a_ep_size',
        ),
        'eplb-without-ep'),
    ('87cb2532e488', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'dspark-attention-dp-without-dp-lm-head'),
    ('89e5aaca17ae', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_ngram',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
        ),
        'ngram-with-attention-dp'),
    ('8bcd52e3a068', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
        ),
        'standalone-with-attention-dp'),
    ('8d91d025db85', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutedsl-runner-with-mooncake-a2a'),
    ('8d91d025db85', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutedsl-runner-with-mooncake-a2a'),
    ('919bc864bcd9', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_attention_backend_compatibility > _mla_kv_cache_dtype_checks',
        (
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/kv_cache_hook.py:handle_nvfp4_prefill_kv_dequant_dtype',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-on-hopper'),
    ('9cb90b287844', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'trtllm-routed-runner-with-awq'),
    ('9cb90b287844', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'trtllm-routed-runner-with-awq'),
    ('9df822c21e22', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args > check_pipeline_parallel_compat',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
        ),
        'pp-speculative-eagle3'),
    ('9eae704815bc', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'trtllm-routed-runner-with-awq'),
    ('a154ea340984', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config > _moe_runner_backend_quant_constraints',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
        ),
        'nvfp4-online-with-triton-runner'),
    ('a34861dd3f62', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config > _moe_runner_backend_quant_constraints',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
        ),
        'nvfp4-online-quantization-on-hopper'),
    ('a38b6d6824af', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_ngram',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_mla_backend_page_constraints',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_fa4_page_constraint',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
            'arg_groups/overrides.py:_intel_xpu_page_constraint',
            'arg_groups/overrides.py:_attention_backend_dual_chunk',
            'arg_groups/overrides.py:_page_size_default',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_eagle_family',
            'arg_groups/speculative_hook.py:_handle_ngram',
        ),
        'ngram-tree-bfs-breadth'),
    ('a38b6d6824af', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_ngram',
        (
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
            'arg_groups/overrides.py:_mla_backend_page_constraints',
            'arg_groups/overrides.py:_attention_backend_fa3_fp8_fallback',
            'arg_groups/overrides.py:_fa4_page_constraint',
            'arg_groups/overrides.py:_attention_backend_platform_fallbacks',
            'arg_groups/overrides.py:_intel_xpu_page_constraint',
            'arg_groups/overrides.py:_page_size_default',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_uno',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_iquest_q1_mtp_draft',
            'arg_groups/speculative_hook.py:_handle_eagle_family',
            'arg_groups/speculative_hook.py:_handle_ngram',
        ),
        'ngram-tree-bfs-breadth'),
    ('a3ff223c10fc', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dflash',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'dspark-attention-dp-without-dp-lm-head'),
    ('a98f464374cb', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutedsl-runner-ep-neither-1-nor-tp'),
    ('a98f464374cb', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_moe_kernel_config',
        (
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
        ),
        'cutedsl-runner-ep-neither-1-nor-tp'),
    ('ad65b2c9bd51', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_data_parallelism',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
        ),
        'attn-dp-zero'),
    ('af8359583649', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_pd_disaggregation > handle_pd_disaggregation',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
        ),
        'fake-backend-with-a-prefill'),
    ('af8359583649', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_pd_disaggregation',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
        ),
        'fake-backend-with-a-prefill'),
    ('afed5a8e37b5', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_a2a_moe',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/overrides.py:_a2a_ep_size',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'flashinfer-a2a-0523-attn-dp-below-tp'),
    ('b33aff29be4f', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_attention_backend_compatibility > _cutedsl_prefill_backend_fill',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/kv_cache_hook.py:handle_nvfp4_prefill_kv_dequant_dtype',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-on-hopper'),
    ('b7128e19f5e8', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_moe_kernel_config',
        (
            'server_args.py:ServerArgs._handle_missing_default_values',
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_cutlass_moe_env_override',
        ),
        'cutlass-fp8-with-ep'),
    ('b8dc241618d0', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_a2a_moe',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'server_args.py:ServerArgs._handle_a2a_moe',
        ),
        'pplx-without-attention-dp'),
    ('c0e0fa90d98b', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'arg_groups/speculative_hook.py:_maybe_disable_adaptive',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_dspark',
        ),
        'topk-without-steps'),
    ('c0e0fa90d98b', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_eagle_family',
        (
            'arg_groups/speculative_hook.py:_maybe_disable_adaptive',
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_uno',
            'arg_groups/speculative_hook.py:_handle_dspark',
            'arg_groups/speculative_hook.py:_handle_iquest_q1_mtp_draft',
        ),
        'topk-without-steps'),
    ('c401e6c74843', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_mxfp8_kv_cache_compatibility',
        (
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
        ),
        'mxfp8-kv-cache-on-hopper'),
    ('c5085a1a7688', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_pd_disaggregation > handle_pd_disaggregation',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
        ),
        'staging-buffer-with-fake-backend'),
    ('c5085a1a7688', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_pd_disaggregation',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
        ),
        'staging-buffer-with-fake-backend'),
    ('c61b9f09088a', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/mega_moe_hook.py:handle_moe_runner_backend_alias',
            'arg_groups/serving_hook.py:handle_missing_default_values',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'arg_groups/moe_hook.py:handle_a2a_moe',
        ),
        'dspark-attention-dp-without-dp-lm-head'),
    ('c9f36faca13f', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_attention_backend_compatibility > _mla_kv_cache_dtype_checks',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/platform_hook.py:handle_hpu_backends',
            'arg_groups/platform_hook.py:handle_cpu_backends',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/kv_cache_hook.py:handle_nvfp4_prefill_kv_dequant_dtype',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-with-fp8-e5m2-kv'),
    ('cb61008544c9', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args > check_pipeline_parallel_compat',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
        ),
        'pp-speculative-env-with-attention-dp'),
    ('cc71d32fcd09', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dflash',
        (
            'server_args.py:ServerArgs._handle_modelscope_paths',
        ),
        'dflash-without-draft'),
    ('cc71d32fcd09', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dflash',
        (
            'arg_groups/model_path_hook.py:resolve_hf_gguf_model_path',
            'arg_groups/model_path_hook.py:handle_modelscope_paths',
        ),
        'dflash-without-draft'),
    ('cd6f8025ee11', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_eplb_and_dispatch',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_a2a_ep_size',
        ),
        'eplb-without-ep'),
    ('cddf4d376bd7', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility > _mla_kv_cache_dtype_checks',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-on-hopper'),
    ('ce1ba76739fe', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_kv4_compatibility',
        (
            'arg_groups/serving_hook.py:handle_deprecated_args',
            'arg_groups/overrides.py:_deepseek_v4_kv_cache_dtype',
            'arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
        ),
        'hicache-with-nvfp4-kv-on-blackwell'),
    ('d59c0fe9818d', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_uno',
        (),
        'uno-without-lora'),
    ('dcbf66466c5b', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args > check_pipeline_parallel_compat',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
            'arg_groups/dllm_hook.py:handle_dllm_inference',
        ),
        'pp-dspark-on-decode'),
    ('df4c8fff0a41', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args > check_pipeline_parallel_compat',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
            'arg_groups/dllm_hook.py:handle_dllm_inference',
        ),
        'pp-speculative-env-on-pd'),
    ('e1e19d928df4', '0.5.17'): Order(
        'ServerArgs.check_server_args',
        (
            'server_args.py:ServerArgs._handle_mps_backends',
            'arg_groups/overrides.py:_mamba_radix_cache_resolution',
            'arg_groups/overrides.py:_sparse_head_overlap_disable',
            'arg_groups/overrides.py:_pipeline_parallel_overlap_disable',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
            'arg_groups/speculative_hook.py:_disable_overlap_schedule_for_cpu',
            'arg_groups/overrides.py:_dllm_overlap_disable',
            'server_args.py:ServerArgs._handle_dllm_inference',
        ),
        'pp-speculative-on-0517'),
    ('e40451bdf022', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_pd_disaggregation > handle_pd_disaggregation',
        (),
        'decode-radix-with-nextn-on-0517'),
    ('e4302da8fc38', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (),
        'pp-dspark-on-decode'),
    ('e46e1171ca00', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_a2a_moe',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/overrides.py:_deepseek_moe_quant_resolution',
            'arg_groups/overrides.py:_deepseek_v4_sm120_moe',
            'arg_groups/overrides.py:_moe_runner_backend_quant_constraints',
            'arg_groups/overrides.py:_cutlass_moe_env_override',
            'arg_groups/overrides.py:_a2a_backend_overrides',
            'server_args.py:ServerArgs._handle_a2a_moe',
        ),
        'flashinfer-a2a-0517-with-triton-runner'),
    ('e70d415d0cc6', '0.5.23'): Order(
        'ServerArgs.check_server_args > check_server_args > check_pipeline_parallel_compat',
        (
            'arg_groups/validation_hook.py:handle_aux_hidden_state_capture',
            'arg_groups/speculative_hook.py:handle_speculative_decoding',
        ),
        'pp-dspark-with-pp-spec-env'),
    ('ea067813eb55', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_pd_disaggregation > handle_pd_disaggregation',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
        ),
        'decode-radix-with-fake-backend'),
    ('ea067813eb55', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_pd_disaggregation',
        (
            'arg_groups/pd_disaggregation_hook.py:handle_pd_disaggregation',
        ),
        'decode-radix-with-fake-backend'),
    ('ed4cd29dc339', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_dspark',
        ),
        'dspark-draft-tokens'),
    ('ed4cd29dc339', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'arg_groups/speculative_hook.py:_init_adaptive_speculative_params',
            'arg_groups/speculative_hook.py:_handle_dflash',
            'arg_groups/speculative_hook.py:_handle_uno',
            'arg_groups/speculative_hook.py:_handle_dspark',
        ),
        'dspark-draft-tokens'),
    ('ed80ab62911c', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dspark',
        (
            'server_args.py:ServerArgs._handle_modelscope_paths',
            'arg_groups/speculative_hook.py:_handle_dspark',
        ),
        'dspark-without-draft'),
    ('efbe8bb58781', '0.5.17'): Order(
        'ServerArgs.__post_init__ > ServerArgs._handle_attention_backend_compatibility > _cutedsl_prefill_backend_fill',
        (
            'server_args.py:ServerArgs._handle_hpu_backends',
            'server_args.py:ServerArgs._handle_cpu_backends',
            'arg_groups/overrides.py:_deterministic_attention_backend',
            'arg_groups/overrides.py:_attention_backend_default',
        ),
        'trtllm-mla-on-hopper'),
    ('f3567ced3271', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dflash',
        (),
        'dflash-with-pp'),
    ('f3567ced3271', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_dflash',
        (),
        'dflash-with-pp'),
    ('f72e621468fd', '0.5.23'): Order(
        'ServerArgs.resolve_once > run_resolution_pipeline > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_uno',
        (
            'arg_groups/parallel_hook.py:handle_deprecated_dp_attention',
            'arg_groups/parallel_hook.py:handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
        ),
        'uno-with-tp-2'),
    ('f8f719601bf1', '0.5.17'): Order(
        'ServerArgs.__post_init__ > handle_speculative_decoding > SpeculativeAlgorithm.handle_server_args > _handle_ngram',
        (
            'server_args.py:ServerArgs._handle_dwdp',
            'arg_groups/deepseek_v4_hook.py:validate_deepseek_v4_cp',
            'arg_groups/overrides.py:_data_parallelism_defaults',
        ),
        'ngram-with-attention-dp'),
}


# ------------------------------------------------------------------------------ the walk

# helpers a check calls on the record whose fields it reads (startup_checks.json lists only the
# fields named in the condition text)
IMPLICIT_FIELDS = {
    "attn_dp_enabled_of": ("attn_dp_size", "dp_size", "enable_dp_attention"),
    "attention_backends_of": ("attention_backend", "prefill_attention_backend", "decode_attention_backend"),
    "prefill_backend": ("attention_backend", "prefill_attention_backend", "decode_attention_backend"),
    "decode_backend": ("attention_backend", "prefill_attention_backend", "decode_attention_backend"),
}


def _known(version: str) -> set[str]:
    return {o["dest"] for o in parsertable.table()["sglang"][version]["options"]}


def _written_field(target: ast.AST, known: set[str]) -> str | None:
    node = target
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in startchecks._RECORD_NAMES:
            return node.attr if node.attr in known else None
        node = node.value
    return None


def _writes(fn, known: set[str]) -> list[tuple[int, int, str]]:
    """(line, column, field) of every write in FN: `record.f = ...`, `setattr(record, "f", ...)`,
    `declare_resolution(..., f=...)`, and a field-keyed dict (what a post-process pass returns)."""
    out = []
    for node in ast.walk(fn.node):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for el in (target.elts if isinstance(target, ast.Tuple) else [target]):
                name = _written_field(el, known)
                if name:
                    out.append((node.lineno, node.col_offset, name))
                if isinstance(el, ast.Subscript) and isinstance(el.slice, ast.Constant) and el.slice.value in known:
                    out.append((node.lineno, node.col_offset, el.slice.value))
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.endswith("declare_resolution"):
                out += [(node.lineno, node.col_offset, kw.arg) for kw in node.keywords if kw.arg in known]
            if (func in ("setattr", "object.__setattr__") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in known):
                out.append((node.lineno, node.col_offset, node.args[1].value))
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys if k is not None):
            out += [(node.lineno, node.col_offset, k.value) for k in node.keys if k is not None and k.value in known]
    return out


def derivations_before(version: str, row: dict) -> tuple[str, tuple[str, ...]]:
    """(call path to ROW's check in VERSION, file:function of each earlier write of a field it reads),
    walking ServerArgs' entry methods depth first in source order (each function once)."""
    root = startchecks.sglang_root(version)
    known = _known(version)
    fields = set(row["fields"])
    text = " ".join(row["conditions"])
    for helper, names in IMPLICIT_FIELDS.items():
        if helper in text:
            fields |= set(names) & known
    path, line = row["where"][version].rsplit(":", 1)
    module, line_no = path[:-3].replace("/", "."), int(line)
    walker = startchecks._Walker(root)
    seen: set[tuple[str, str]] = set()
    writers: list[str] = []
    stack: list[str] = []

    def visit(fn) -> bool:
        if (fn.module, fn.qualname) in seen:
            return False
        seen.add((fn.module, fn.qualname))
        stack.append(fn.qualname)
        events = [(ln, col, 1, name) for ln, col, name in _writes(fn, known)]
        events += [(node.lineno, node.col_offset, 0, callee) for node, callee in startchecks._callees(walker, fn)]
        if fn.module == module:
            events += [(n.lineno, n.col_offset, 2, None) for n in ast.walk(fn.node)
                       if isinstance(n, (ast.Raise, ast.Assert)) and n.lineno == line_no]
        for _, _, kind, data in sorted(events, key=lambda e: e[:3]):
            if kind == 2:
                return True
            if kind == 1 and data in fields:
                where = f"{fn.module.removeprefix('sglang.srt.').replace('.', '/')}.py:{fn.qualname}"
                if where not in writers:
                    writers.append(where)
            elif kind == 0 and visit(data):
                return True
        stack.pop()
        return False

    for entry in startchecks.ENTRY_METHODS:
        fn = walker.method("sglang.srt.server_args", "ServerArgs", entry)
        if fn is not None and visit(fn):
            return " > ".join(stack), tuple(writers)
    raise AssertionError(f"{row['id']}: no path from ServerArgs to {row['where'][version]}")


def _rule_rows() -> list[dict]:
    coverage = startchecks.coverage()
    return [row for row in startchecks.table()["checks"] if "rule" in coverage.get(row["id"], {})]


# ------------------------------------------------------------------------------ the tests


def test_every_rule_entry_of_the_coverage_file_is_in_the_table():
    want = {(row["id"], v) for row in _rule_rows() for v in row["releases"]}
    assert want - set(ORDER) == set(), "rules without an order row (walk them with derivations_before)"
    assert set(ORDER) - want == set(), "order rows for checks that are no rule entry (any more)"


def test_each_row_has_a_verdict_that_says_safe_or_fixed():
    for key, order in ORDER.items():
        assert order.verdict in VERDICTS, key
        assert VERDICTS[order.verdict].startswith(("SAFE: ", "FIXED: ")), order.verdict
    assert set(VERDICTS) == {o.verdict for o in ORDER.values()}, "unused verdicts"


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_listed_derivations_are_the_only_writers_before_each_check(version):
    """Read from the pinned wheel's source: the path to each rule's check and every derivation before
    it that writes one of its fields are the ones ORDER lists (a new one fails here, naming it)."""
    require(startchecks.sglang_root(version) is not None,
            f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    wrong = []
    for row in _rule_rows():
        if version not in row["releases"]:
            continue
        handler, earlier = derivations_before(version, row)
        listed = ORDER[(row["id"], version)]
        if (handler, earlier) != (listed.handler, listed.earlier):
            new = sorted(set(earlier) - set(listed.earlier))
            gone = sorted(set(listed.earlier) - set(earlier))
            wrong.append(f"{row['id']} ({row['function']}: {row['message'][:60]}): path {handler!r}; "
                         f"new writers {new}, no longer {gone}")
    assert not wrong, f"SGLang {version}: read these derivations again and update ORDER:\n" + "\n".join(wrong)
