"""pdkit/spec/pagesize.py: the page sizes SGLang snaps before start, held to the pinned wheels' source."""

from __future__ import annotations

import ast
import re

import pytest

from pdkit.spec.pagesize import FA4_PAGE, FA4_PAGE_ONE, FA4_SM_MAJOR, PAGE_SNAPS, RunPage, effective_page_size, run_page
from pdkit.upstream import startchecks
from pdkit.upstream.versions import SGLANG_RELEASES
from tests.conftest import require


def test_the_snaps_chain_as_sglangs_do():
    assert effective_page_size("0.5.17", {"attention_backend": ("cutlass_mla",)})[0] == 128
    assert effective_page_size("0.5.23", {"attention_backend": ("cutlass_mla",)})[0] is None  # 0.5.23 dropped it
    assert effective_page_size("0.5.23", {"decode_attention_backend": ("trtllm_mla",), "page_size": ("32",)})[0] == 32
    assert effective_page_size("0.5.23", {"decode_attention_backend": ("trtllm_mla",), "page_size": ("16",)})[0] == 64
    assert effective_page_size("0.5.23", {"page_size": ("16",)}) == (16, "set by page_size")


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_table_is_the_wheels_own_order_of_snaps(version):
    """Each release's _mla_backend_page_constraints, read from the wheel: the backends it snaps, in order,
    the pages each keeps and the page it snaps to are PAGE_SNAPS' rows."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    tree = ast.parse((root / "srt" / "arg_groups" / "overrides.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_mla_backend_page_constraints")
    rows = []
    for node in fn.body:
        if not isinstance(node, ast.If):
            continue
        text = ast.unparse(node)
        names = re.findall(r"== '([a-z0-9_]+)'", ast.unparse(node.test))
        if not names:
            continue
        kept = re.search(r"page_size not in \[([0-9, ]+)\]|page_size != (\d+)", text)
        kept_pages = (tuple(int(x) for x in (kept.group(1) or kept.group(2)).split(",")) if kept else None)
        snapped = int(re.findall(r"page_size = (\d+)", text)[-1])
        dests = tuple(re.findall(r"view\.([a-z_]+) ==", ast.unparse(node.test)))
        rows.append((names[0], dests, kept_pages, snapped))
    assert rows == [(b, d, k, s) for b, d, k, s in PAGE_SNAPS[version]], rows


QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "kv_lora_rank": 512}
DSA = {"architectures": ["DeepseekV32ForCausalLM"], "kv_lora_rank": 512, "index_topk": 2048}


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_fa4_sets_page_128_on_sm100_for_a_non_mla_checkpoint(version):
    fa4 = {"attention_backend": ("fa4",), "page_size": ("64",)}
    assert run_page(version, fa4, 10, QWEN3) == run_page(version, {**fa4, "page_size": ("16",)}, 10, QWEN3)
    assert run_page(version, fa4, 10, QWEN3).page == 128 and run_page(version, fa4, 10, QWEN3).sure
    # a decode (or prefill) backend alone counts too; the page given or not
    assert run_page(version, {"decode_attention_backend": ("fa4",)}, 10, QWEN3).page == 128
    # Hopper, an MLA checkpoint, an EAGLE tree: the page stays as given
    assert run_page(version, fa4, 9, QWEN3) == RunPage(64, "set by page_size")
    assert run_page(version, fa4, 10, DSV3).page == 64
    assert run_page(version, {**fa4, "speculative_eagle_topk": ("4",)}, 10, QWEN3).page == 64
    # an undeclared GPU generation or an unread config.json: not sure
    assert not run_page(version, fa4, None, QWEN3).sure and not run_page(version, fa4, 10, None).sure
    # fa4 runs after the MLA snaps: trtllm_mha's 64 on decode becomes fa4's 128 on prefill
    assert run_page(version, {"prefill_attention_backend": ("fa4",), "decode_attention_backend": ("trtllm_mha",),
                              "page_size": ("32",)}, 10, QWEN3).page == 128


def test_fa4_gives_diffusion_gemma_page_1_in_0523_only():
    gemma = {"architectures": ["DiffusionGemmaForBlockDiffusion"]}
    assert run_page("0.5.23", {"attention_backend": ("fa4",)}, 10, gemma).page == 1
    assert run_page("0.5.17", {"attention_backend": ("fa4",)}, 10, gemma).page == 128


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_page_a_checkpoint_forces_comes_first(version):
    # DSA: 64 whatever page_size says; the MLA snaps then keep it
    assert run_page(version, {"page_size": ("16",)}, 9, DSA).page == 64
    assert run_page(version, {"page_size": ("16",), "decode_attention_backend": ("flashmla",)}, 9, DSA).page == 64
    # DeepSeek-V4: 256 on dsv4, the backend given is replaced
    v4 = {"architectures": ["DeepseekV4ForCausalLM"]}
    assert run_page(version, {"page_size": ("64",), "attention_backend": ("fa4",)}, 10, v4).page == 256
    # DeepSeek-V3 MLA without a backend on SM100: trtllm_mla snaps the page to 64 (32 kept); Hopper: as given
    assert run_page(version, {"page_size": ("1",)}, 10, DSV3).page == 64
    assert run_page(version, {"page_size": ("32",)}, 10, DSV3).page == 32
    assert run_page(version, {"page_size": ("1",)}, 9, DSV3).page == 1
    # GPT-OSS without a backend on SM100: trtllm_mha, whose snap makes an unset page 64
    oss = {"architectures": ["GptOssForCausalLM"]}
    assert run_page(version, {}, 10, oss).page == 64
    assert run_page(version, {}, 9, oss).page is None
    assert not run_page(version, {"page_size": ("1",)}, None, oss).sure
    # no config: only the argv decides, as before
    assert run_page(version, {"page_size": ("16",)}) == RunPage(16, "set by page_size")


def test_exaone4_takes_trtllm_mha_on_sm100_in_0523_only():
    exaone = {"architectures": ["Exaone4ForCausalLM"], "sliding_window_pattern": "LLLG"}
    assert run_page("0.5.23", {}, 10, exaone).page == 64
    assert run_page("0.5.17", {}, 10, exaone).page is None
    assert run_page("0.5.23", {}, 10, {**exaone, "sliding_window_pattern": None}).page is None


def _fn(tree, name):
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_fa4s_page_constraint_is_the_wheels(version):
    """_fa4_page_constraint, read from each wheel: fa4 on any of the three backend arguments, not MLA, SM100 (compute
    capability 10), EAGLE topk at most 1 -> page 128 (0.5.23: DiffusionGemma -> 1); and it runs after the MLA snaps
    and after the model overrides (pagesize.run_page's order)."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    srt = root / "srt"
    text = ast.unparse(_fn(ast.parse((srt / "arg_groups" / "overrides.py").read_text()), "_fa4_page_constraint"))
    for dest in ("attention_backend", "decode_attention_backend", "prefill_attention_backend"):
        assert f"view.{dest} == 'fa4'" in text
    sm100 = "is_sm100_supported()" if version == "0.5.17" else "get_platform().is_sm100"
    mla = "not view.use_mla_backend()" if version == "0.5.17" else "not use_mla_backend(view)"
    for part in (sm100, mla, "(view.speculative_eagle_topk or 0) <= 1", f"return {{'page_size': {FA4_PAGE}}}"):
        assert part in text, f"SGLang {version} _fa4_page_constraint: {part!r} is gone"
    assert ("DiffusionGemmaForBlockDiffusion" in text) == ("DiffusionGemmaForBlockDiffusion" in FA4_PAGE_ONE.get(
        version, ())) and (version == "0.5.17" or "return {'page_size': 1}" in text)
    if version == "0.5.17":
        common = (root / "srt" / "utils" / "common.py").read_text()
        assert re.search(r"is_sm100_supported = lru_cache\(maxsize=1\)\(\s*partial\(\s*_check_cuda_device_version, "
                         rf"device_capability_majors=\[{FA4_SM_MAJOR}\]", common)
        server = (srt / "server_args.py").read_text()
        order = [server.index(t) for t in ("self._handle_model_specific_adjustments()",
                                           "self._handle_attention_backend_compatibility()",
                                           "run_post_process_pass(self, _mla_backend_page_constraints)",
                                           "run_post_process_pass(self, _fa4_page_constraint)",
                                           "run_post_process_pass(self, _page_size_default)")]
    else:
        context = (root / "srt" / "runtime_context.py").read_text()
        assert '"is_sm100": "is_sm100_supported"' in context
        common = (root / "srt" / "utils" / "common.py").read_text()
        assert re.search(r"is_sm100_supported = lru_cache\(maxsize=1\)\(\s*partial\(\s*_check_cuda_device_version, "
                         rf"device_capability_majors=\[{FA4_SM_MAJOR}\]", common)
        pipeline = (srt / "arg_groups" / "pipeline.py").read_text()
        hook = (srt / "arg_groups" / "attention_hook.py").read_text()
        order = [pipeline.index("run_hook(handle_model_specific_adjustments, server_args)"),
                 pipeline.index("run_hook(handle_attention_backend_compatibility, server_args)")]
        order += [10**7 + hook.index(t) for t in ("run_post_process_pass(server_args, _mla_backend_page_constraints)",
                                                  "run_post_process_pass(server_args, _fa4_page_constraint)")]
    assert order == sorted(order), f"SGLang {version}: the page's passes run in another order"
