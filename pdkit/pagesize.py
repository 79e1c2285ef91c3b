"""The KV page size an engine really runs with: SGLang snaps `--page-size` for some attention backends
before the engine starts (issue 46: a PD pair whose pages then differ fails its KV transfer). Pure.

From the pinned releases' `sglang/srt/arg_groups/overrides.py` `_mla_backend_page_constraints` (a
post-process pass both run before their checks): each row, in SGLang's order, is (the backend, the
arguments it may be chosen by, the page sizes it keeps, the page size it snaps anything else to;
None: it always snaps). The snaps chain on one value, as SGLang's do. `_fa4_page_constraint` (0.5.23,
FA4 on SM100 only, per model) is not modelled: it depends on the GPU and the checkpoint.
"""

from __future__ import annotations

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


def effective_page_size(version: str, args: dict[str, tuple[str, ...]]) -> tuple[int | None, str]:
    """(the page size the engine runs with, why) from its parsed argv (dest -> values). None: left to
    SGLang's default for its backend, which pdkit does not decide (the why says so)."""
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
