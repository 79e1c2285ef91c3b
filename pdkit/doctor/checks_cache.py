"""Doctor's prefix-cache row (`prefix_cache`, issue 43 item 5): the hit rate of an engine's prefix cache over
doctor's window, and on a PD prefill the KV its hand-offs carried per request against what the uncached part
of the prompts needs. Pure: observations in, a row out.

The hit rate is cached / prompt tokens from the engine's own counters (sglang:cached_tokens_total, every
cache_source, over sglang:prompt_tokens_total), each the increase between doctor's two /metrics samples: the
rule bench's levels use (pdkit.spec.kvcost cache_counts, cache_window, hit_rate). The hand-off: the prefill's
sglang:kv_transfer_total_mb over the same window (pdkit.spec.kvcost.kv_figures) against the window's uncached
prompt tokens x one token's KV bytes (pdkit.spec.kvcost.kv_bytes_per_token: the KV pool's GiB over its tokens,
from the prefill's own page). A PD decode without a radix cache (SGLang's default) receives the whole
prompt's KV on every request, however much the prefill had cached (docs/sim.md "Decode radix cache (PD)"):
for multi-turn sessions that is most of what crosses."""

from __future__ import annotations

from collections.abc import Sequence

from pdkit.doctor.checkbase import cannot_measure, engine_row
from pdkit.doctor.model import INFO, PASS, WARN, CheckResult, EngineObservation
from pdkit.render.flags import LEVER_FLAGS
from pdkit.spec.kvcost import KV_RESEND_MIN_MB, KV_RESEND_WARN, cache_window, handoff_need, hit_rate, kv_figures
from pdkit.upstream.metricnames import SGLANG

NAME = "prefix_cache"
DECODE_RADIX_FLAG = LEVER_FLAGS["decode_radix_cache"]
TUNE_HINT = ("compare with and without it before keeping it: `pdkit tune` with a candidate that sets "
             "decode.decode_radix_cache: true (docs/tune.md, 'The prefix-cache levers')")


def check_prefix_cache(obs: EngineObservation, decodes: Sequence[EngineObservation] = ()) -> CheckResult:
    """The prefix cache over doctor's window, on a prefill or unified engine (a PD decode counts the prefill's
    hits again). INFO without a prompt token in the window, or when a prefill's hand-off cannot be compared
    (no hand-off in the window, one token's KV size not on its page); WARN when a prefill's hand-offs carried
    more than KV_RESEND_WARN x the KV of the uncached prompt tokens and at least KV_RESEND_MIN_MB per request
    more than that (its decodes re-receive cached prefixes); PASS otherwise. `decodes`: the decode engines,
    for whether the prefill's partners (plan.kv_decodes) run the decode radix cache."""
    plan = obs.plan
    if (early := cannot_measure(obs, NAME, needs="both metrics samples")) is not None:
        return early
    window = obs.second.at - obs.first.at
    cache = cache_window(obs.first.cache, obs.second.cache or {})
    rate = hit_rate(cache)
    if rate is None:
        return engine_row(plan, NAME, INFO, f"no traffic in the last {window:.0f} s: no prompt token counted, so no "
                                            "hit rate", "to see one, run doctor while the cluster serves (or raise "
                                                        "--probe-requests); the overview dashboard's 'Prefix cache "
                                                        "hit rate' panel has the history")
    hits = (f"hit rate {rate:.1%} in the last {window:.0f} s ({cache['cached']:.0f} of {cache['prompt']:.0f} prompt "
            "tokens from the cache)")
    if plan.role != "prefill":
        return engine_row(plan, NAME, PASS, f"{hits}; no KV hand-off on a unified engine")
    fig = kv_figures(obs.first.kv or {}, obs.second.kv or {})
    if fig.transfers == 0 or fig.mb_per_request is None:
        return engine_row(plan, NAME, INFO, f"{hits}; no KV hand-off in the window: the hand-off is not compared "
                                            "with the uncached part", "see the kv_transfer row")
    bytes_per_token = obs.second.kv_bytes_per_token
    if bytes_per_token is None:
        return engine_row(plan, NAME, INFO,
                          f"{hits}; {fig.transfers} hand-offs of {fig.mb_per_request:.1f} MiB/request, not compared "
                          f"with the uncached part: one token's KV size is unknown ({SGLANG['kv_cache_memory']} or "
                          f"{SGLANG['max_total_tokens']} is not on the prefill's page; SGLang sets both once at "
                          "start-up)", "re-run doctor; if they stay absent, the engine's release does not export them")
    need = handoff_need(fig, cache, bytes_per_token)
    assert need is not None  # transfers and MiB are there
    ratio = f"{need.ratio:.2f}x" if need.ratio is not None else "all of it cached"
    figures = (f"{hits}; {need.transfers} hand-offs carried {need.mb_per_request:.1f} MiB/request where the "
               f"{need.uncached_tokens_per_request:.0f} uncached prompt tokens/request need "
               f"{need.need_mb_per_request:.1f} MiB ({bytes_per_token / 1024:.0f} KiB/token): {ratio}")
    partners = [d for d in decodes if f"{d.plan.host}/{d.plan.engine}" in plan.kv_decodes]
    with_cache = [f"{d.plan.host}/{d.plan.engine}" for d in partners if DECODE_RADIX_FLAG in d.plan.argv]
    if not need.too_much:
        if need.ratio is None or need.ratio > KV_RESEND_WARN:
            figures += (f"; the {need.resent_mb_per_request:.1f} MiB/request sent again is under "
                        f"{KV_RESEND_MIN_MB:g} MiB: latency-bound, not judged")
        return engine_row(plan, NAME, PASS, figures)
    over = (f"the hand-offs carry {ratio} the KV the uncached prompt tokens need (above {KV_RESEND_WARN:g}x): "
            f"{need.resent_mb_per_request:.1f} MiB/request of prefix the prefill had cached crosses again")
    if with_cache and len(with_cache) == len(partners):
        why = (f"{', '.join(with_cache)} run{'s' if len(with_cache) == 1 else ''} the decode radix cache "
               f"({DECODE_RADIX_FLAG}), yet cached prefixes still cross")
        hint = ("the decodes' radix caches lose the sessions' prefixes: their KV pools evict them (see the decodes' "
                "KV cache usage on the overview dashboard), or a session's turns land on different decodes (the "
                "router's policy); more decode KV memory or session affinity in the router keeps them")
    else:
        lacking = [f"{d.plan.host}/{d.plan.engine}" for d in partners if DECODE_RADIX_FLAG not in d.plan.argv]
        who = ", ".join(lacking) if lacking else "its decodes"
        why = (f"the decode re-receives cached prefixes: {who} ha{'s' if len(lacking) == 1 else 've'} no radix "
               "cache (SGLang turns it off on a PD decode)")
        hint = (f"tuning.decode_radix_cache: true on the decode ({DECODE_RADIX_FLAG}, experimental: validate always "
                f"warns) sends only what the decode lacks; {TUNE_HINT}")
    return engine_row(plan, NAME, WARN, f"{over}; {why}. {figures}", hint)
