"""The KV page size an engine really runs with: SGLang snaps `--page-size` for some attention backends
before the engine starts (issue 46: a PD pair whose pages then differ fails its KV transfer). Pure.

From the pinned releases' `sglang/srt/arg_groups/overrides.py` `_mla_backend_page_constraints` (a
post-process pass both run before their checks): each row, in SGLang's order, is (the backend, the
arguments it may be chosen by, the page sizes it keeps, the page size it snaps anything else to;
None: it always snaps). The snaps chain on one value, as SGLang's do.

Then `_fa4_page_constraint` (both releases, right after the MLA snaps and the trtllm_mha GPU checks):
fa4 named by any of the three attention-backend arguments, a checkpoint that is not MLA, an SM100 GPU
(is_sm100_supported: compute capability 10.x) and an EAGLE topk of at most 1 set the page to 128
(0.5.23: 1 for DiffusionGemmaForBlockDiffusion). Before all of these the model's own overrides may set
the page or the backend (pdkit.spec.modelconfig.model_page: DSA 64 x index_kpool, DeepSeek-V4 256 on dsv4,
trtllm_mla / trtllm_mha picked on SM100 for a checkpoint without a backend).

`run_page` judges all of it when the engine's GPU generation and the model's config.json are known,
and says when the answer depends on what pdkit was not told (`sure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdkit.spec import modelconfig

_DECODE = ("attention_backend", "decode_attention_backend")
_ALL = ("attention_backend", "decode_attention_backend", "prefill_attention_backend")

# release -> ((backend, argument dests, pages kept (None: none), snapped to), ...) in SGLang's order
PAGE_SNAPS: dict[str, tuple[tuple[str, tuple[str, ...], tuple[int, ...] | None, int], ...]] = {
    "0.5.17": (
        ("flashmla", _DECODE, None, 64),
        ("cutlass_mla", _DECODE, None, 128),
        ("trtllm_mla", _DECODE, (32, 64), 64),
        ("tokenspeed_mla", _DECODE, (32, 64), 64),
        ("cutedsl_mla", _ALL, (32, 64), 64),
        ("trtllm_mha", (*_ALL, "speculative_draft_attention_backend"), (16, 32, 64, 128), 64),
        ("hpc_ops", _ALL, (64,), 64),
    ),
    "0.5.23": (
        ("flashmla", _DECODE, None, 64),
        ("trtllm_mla", _DECODE, (32, 64), 64),
        ("cutedsl_mla", _ALL, (32, 64), 64),
        ("trtllm_mha", (*_ALL, "speculative_draft_attention_backend"), (16, 32, 64, 128), 64),
        ("hpc_ops", _ALL, (64,), 64),
    ),
}


FA4_PAGE = 128
FA4_SM_MAJOR = 10  # is_sm100_supported (0.5.17 utils/common.py), get_platform().is_sm100 (0.5.23)
# 0.5.23's _fa4_page_constraint: this architecture gets page 1 instead of 128
FA4_PAGE_ONE = {"0.5.23": ("DiffusionGemmaForBlockDiffusion",)}
_BACKEND_DESTS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


@dataclass(frozen=True)
class RunPage:
    """The page an engine really runs with (None: SGLang's default for the backend it picks), why, and whether
    that is certain (False: it depends on a GPU generation or a checkpoint pdkit was not told)."""

    page: int | None
    why: str
    sure: bool = True


def run_page(version: str, args: dict[str, tuple[str, ...]], sm_major: int | None = None,
             config: dict[str, Any] | None = None) -> RunPage:
    """The page SGLang VERSION runs an engine with, from its parsed argv ARGS (dest -> values), the compute
    capability major SM_MAJOR of its GPUs (None: not declared) and the model's config.json CONFIG (None: not
    read): the model's overrides, the MLA snaps, then fa4's, in SGLang's order."""
    sure = True
    args = dict(args)
    forced = modelconfig.model_page(version, config, args, sm_major) if config else modelconfig.ModelPage()
    why_model = ""
    if forced.backend is not None:
        args["attention_backend"] = (forced.backend,)
        why_model = forced.why
    if not forced.sure:
        sure, why_model = False, forced.why
    if forced.page is not None:
        args["page_size"] = (str(forced.page),)
        why_model = forced.why
    page, why = effective_page_size(version, args)
    if why_model and forced.page is not None and page == forced.page:
        why = f"{why_model} (SGLang {version}'s model override)"
    elif why_model and forced.backend is not None and "snaps" in why:
        why = f"{why_model}, which {why.split(' ', 1)[1]}"
    elif why_model and not forced.sure:
        why = f"{why}; {why_model}"
    backends = [d for d in _BACKEND_DESTS if (args.get(d) or ("",))[0] == "fa4"]
    if backends:
        topk = (args.get("speculative_eagle_topk") or ("",))[0]
        if topk.isdigit() and int(topk) > 1:
            return RunPage(page, why, sure)  # the page-tree cascade keeps the page as it is
        mla = modelconfig.is_mla(config)
        arch = modelconfig.architecture(config) if config else None
        if sm_major is None or mla is None:
            unknown = "the node declares no compute_capability" if sm_major is None else "the model's config.json " \
                "was not read"
            return RunPage(page, f"{why}; {backends[0]} fa4 sets it to {FA4_PAGE} on SM100 for a non-MLA checkpoint "
                           f"({unknown})", False)
        if sm_major == FA4_SM_MAJOR and not mla:
            target = 1 if arch in FA4_PAGE_ONE.get(version, ()) else FA4_PAGE
            if page != target:
                why = f"{backends[0]} fa4 on SM100 sets it to {target} (SGLang {version} _fa4_page_constraint)"
            page = target
    return RunPage(page, why, sure)


def effective_page_size(version: str, args: dict[str, tuple[str, ...]]) -> tuple[int | None, str]:
    """(the page size the engine runs with, why) from its parsed argv (dest -> values), by the MLA backends'
    snaps alone (run_page adds the model's and fa4's). None: left to SGLang's default for its backend, which
    pdkit does not decide (the why says so)."""
    if version == "0.5.23":
        # 0.5.23's serving_hook.handle_deprecated_args renames tokenspeed_mla to cutedsl_mla (a prefill one to
        # trtllm_mla) before any snap
        args = {d: (("trtllm_mla" if d == "prefill_attention_backend" else "cutedsl_mla"),) + v[1:]
                if v and v[0] == "tokenspeed_mla" else v for d, v in args.items()}
    given = args.get("page_size")
    page: int | None = int(given[0]) if given and given[0].lstrip("-").isdigit() else None
    why = "set by page_size" if page is not None else "SGLang's default for its backend"
    for backend, dests, kept, snapped in PAGE_SNAPS.get(version, ()):
        chosen = [d for d in dests if args.get(d, ("",))[0] == backend]
        if not chosen:
            continue
        if kept is None or page not in kept:
            if page != snapped:
                why = f"{chosen[0]} {backend} snaps it to {snapped} (SGLang {version})"
            page = snapped
    return page, why
