"""The sim's prefix (radix) cache, as SGLang's (docs/sim.md "Prefix cache"): hits shorten prefill and
count in cached_tokens_total; --disable-radix-cache has none; cached tokens are evicted under pool
pressure; a PD prefill sends the decode only what its radix cache lacks, and only with
--disaggregation-decode-enable-radix-cache; the flags follow each release's parser table."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdkit.sim.args import parse_args, release_problems
from pdkit.sim.prefixcache import PrefixCache
from pdkit.sim.stepmodel import kv_tokens_to_send
from pdkit.upstream import catalogue
from pdkit.upstream.parsertable import sglang_parser

from .support import MODEL, SIM_TEST_ENV, free_ports, get, post, sim_argv, start_sim

# prefill dominates: 10 ms + 100 ms per 1k tokens, so a 3,000-token prompt costs 310 ms, its cached re-run ~10 ms
SLOW_PREFILL = {"PDKIT_SIM_PREFILL_MS_PER_1K_TOKENS": "100"}
KV_BYTES = 65536  # PDKIT_SIM_KV_BYTES_PER_TOKEN's default


def ids(n: int, start: int = 10) -> list[int]:
    return list(range(start, start + n))


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels without the engine's) -> value."""
    out = {}
    for fam in text_string_to_metric_families(get(f"{url}/metrics").text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k not in ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "pid")))
            out[(s.name, labels)] = s.value
    return out


def cached_total(url: str) -> float:
    return sum(v for (name, _), v in metrics(url).items() if name == "sglang:cached_tokens_total")


def generate(url: str, input_ids: list[int], max_new: int = 1, **extra) -> tuple[dict, float]:
    started = time.perf_counter()
    resp = post(f"{url}/generate", {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new}, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json(), time.perf_counter() - started


# ---- the cache itself (pure) ------------------------------------------------------------------

def test_matches_whole_pages_only_and_splits_where_prompts_part():
    cache = PrefixCache(page_size=4)
    assert cache.insert(ids(10)) == (8, cache.match(ids(10))[1])  # 10 tokens store 2 whole pages
    assert cache.total_size == 8
    assert cache.match(ids(7))[0] == 4  # 7 shared tokens: one whole page
    assert cache.match(ids(10), limit=9)[0] == 8
    other = ids(6) + [999, 998, 997, 996, 995]
    assert cache.match(other)[0] == 4  # the pages part at token 6: the first page only
    assert cache.insert(other)[0] == 8 and cache.total_size == 12  # the shared page is stored once
    assert PrefixCache(page_size=4, enabled=False).insert(ids(10))[0] == 0


def test_evicts_unlocked_least_recently_used_first():
    cache = PrefixCache(page_size=1)
    _, a = cache.insert(ids(100, 0))
    _, b = cache.insert(ids(100, 1000))
    _, c = cache.insert(ids(100, 2000))
    cache.match(ids(100, 0))  # a is now the most recently used
    cache.lock(b)  # b runs: protected
    assert (cache.evictable_size, cache.protected_size) == (200, 100)
    assert cache.evict(50) == 100  # a whole leaf goes: c, the least recently used unlocked one
    assert cache.match(ids(100, 2000))[0] == 0 and cache.match(ids(100, 0))[0] == 100
    assert cache.evict(1000) == 100 and cache.match(ids(100, 1000))[0] == 100  # locked b stays
    cache.unlock(b)
    assert cache.evict(1000) == 100 and cache.total_size == 0


def test_kv_sent_is_the_prompt_past_the_decode_prefix_in_whole_pages():
    assert kv_tokens_to_send(1000, 0) == 1000
    assert kv_tokens_to_send(1000, 800) == 200
    assert kv_tokens_to_send(1000, 1000) == 0
    assert kv_tokens_to_send(1000, 800, page_size=64) == 256  # 200 tokens ride in 4 pages


# ---- flags, per release --------------------------------------------------------------------------

def test_cache_flags_follow_each_release_parser():
    for version in catalogue.SGLANG_VERSIONS:
        parser = sglang_parser(version)
        for flag in ("--disable-radix-cache", "--disaggregation-decode-enable-radix-cache", "--enable-cache-report"):
            assert flag in parser.by_flag, (version, flag)  # both pinned releases have all three
            assert release_problems([flag], version) == []
    # 0.5.23 added the tlru eviction policy: 0.5.17's parser refuses it, as the sim does under 0.5.17
    assert release_problems(["--radix-eviction-policy", "tlru"], "0.5.23") == []
    assert release_problems(["--radix-eviction-policy", "tlru"], "0.5.17")
    assert release_problems(["--radix-eviction-policy", "lru"], "0.5.17") == []


def test_a_release_without_the_decode_flag_would_refuse_it(monkeypatch):
    """Both pinned parsers have --disaggregation-decode-enable-radix-cache; a release whose table lacked
    it would make the sim refuse it (the check reads the table, not a list of its own)."""
    from pdkit.sim import args
    from pdkit.upstream import parsertable

    options = [o for o in parsertable.table()["sglang"]["0.5.17"]["options"]
               if "--disaggregation-decode-enable-radix-cache" not in o["flags"]]
    monkeypatch.setattr(args, "sglang_parser", lambda version: parsertable.Parser("SGLang 0.5.x", options))
    assert args.release_problems(["--disaggregation-decode-enable-radix-cache"], "0.5.x")
    assert args.release_problems(["--disable-radix-cache"], "0.5.x") == []


def test_sim_refuses_what_the_release_refuses():
    port, = free_ports(1)
    argv = sim_argv("null", port, extra=["--radix-eviction-policy", "tlru"])
    run = subprocess.run(argv, env={**os.environ, **SIM_TEST_ENV,
                                    "PDKIT_SIM_SGLANG_VERSION": "0.5.17"}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "tlru" in run.stderr
    # SGLang refuses the decode radix cache with the fake transfer backend at start-up
    argv = sim_argv("decode", port, extra=["--disaggregation-decode-enable-radix-cache",
                                           "--disaggregation-transfer-backend", "fake"])
    run = subprocess.run(argv, env={**os.environ, **SIM_TEST_ENV}, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "incompatible with --disaggregation-transfer-backend fake" in run.stderr


def test_decode_cache_only_with_its_flag():
    base = ["--model-path", "m", "--disaggregation-mode"]
    assert parse_args([*base, "null"]).radix_cache
    assert not parse_args([*base, "null", "--disable-radix-cache"]).radix_cache
    assert not parse_args([*base, "decode"]).radix_cache  # SGLang forces it off on a decode
    on = parse_args([*base, "decode", "--disaggregation-decode-enable-radix-cache", "--disable-radix-cache"])
    assert on.radix_cache and on.decode_radix_cache  # and the decode flag forces it on
    assert parse_args([*base, "prefill"]).radix_cache and not parse_args([*base, "prefill"]).decode_radix_cache


# ---- a unified engine ------------------------------------------------------------------------------

def test_a_shared_prefix_is_a_hit_faster_to_first_token_and_counted(procs):
    port, = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    start_sim(procs, "unified", "null", port, extra=["--page-size", "16"],
              env={**SIM_TEST_ENV, **SLOW_PREFILL})
    first, cold = generate(url, ids(3000))
    assert first["meta_info"]["cached_tokens"] == 0 and cached_total(url) == 0
    assert "sglang:cached_tokens_total" not in get(f"{url}/metrics").text  # lazy: no hit yet
    # a second request sharing the first 2,900 tokens: the hit is 2,896 (181 whole pages of 16)
    second, warm = generate(url, ids(2900) + ids(100, 50_000))
    assert second["meta_info"]["cached_tokens"] == 2896
    assert warm < cold / 2, (cold, warm)
    m = metrics(url)
    assert m[("sglang:cached_tokens_total", (("cache_source", "device"),))] == 2896
    assert m[("sglang:realtime_tokens_total", (("mode", "prefill_cache"),))] == 2896
    assert m[("sglang:cache_hit_rate", ())] == pytest.approx(2896 / 3000)
    # the same prompt again: at most prompt - 1 tokens may hit (2,999), in whole pages
    third, _ = generate(url, ids(3000))
    assert third["meta_info"]["cached_tokens"] == 2992
    assert cached_total(url) == 2896 + 2992


def test_cache_report_in_openai_usage(procs):
    port, = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    start_sim(procs, "unified", "null", port, extra=["--enable-cache-report"], env=SIM_TEST_ENV)
    words = " ".join(f"w{i}" for i in range(400))
    chat = {"model": MODEL, "messages": [{"role": "system", "content": words}, {"role": "user", "content": "hi"}],
            "max_tokens": 2}
    assert post(f"{url}/v1/chat/completions", chat).json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    turn2 = {**chat, "messages": chat["messages"] + [{"role": "assistant", "content": "ok"},
                                                     {"role": "user", "content": "more"}]}
    usage = post(f"{url}/v1/chat/completions", turn2).json()["usage"]
    # the first turn's prompt (BOS, system line, user line, the assistant tag) is the second's prefix
    assert usage["prompt_tokens_details"]["cached_tokens"] == 1 + 401 + 2 + 1
    resp = post(f"{url}/v1/completions", {"model": MODEL, "prompt": words, "max_tokens": 2, "stream": True,
                                          "stream_options": {"include_usage": True}}, stream=True)
    last = [line for line in resp.iter_lines() if line.startswith(b"data: {")][-1]
    assert b'"prompt_tokens_details":{"cached_tokens":' in last and b'"cached_tokens":0}' not in last


def test_disable_radix_cache_has_no_hits_and_no_report(procs):
    port, = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    start_sim(procs, "unified", "null", port, extra=["--disable-radix-cache"],
              env={**SIM_TEST_ENV, **SLOW_PREFILL})
    _, cold = generate(url, ids(3000))
    again, warm = generate(url, ids(3000))
    assert again["meta_info"]["cached_tokens"] == 0 and warm > cold / 2
    assert "sglang:cached_tokens_total" not in get(f"{url}/metrics").text
    usage = post(f"{url}/v1/completions", {"model": MODEL, "prompt": "a b c", "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens_details"] is None  # no --enable-cache-report


def test_cached_prompts_are_evicted_under_pool_pressure(procs):
    port, = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    start_sim(procs, "unified", "null", port, extra=["--max-total-tokens", "5000"],
              env=SIM_TEST_ENV)
    a, b = ids(3000), ids(3000, 100_000)
    generate(url, a)
    assert generate(url, a)[0]["meta_info"]["cached_tokens"] == 2999  # room for it: a hit
    # a's 3,000 tokens are cached, unused: evictable (beside the start-up probe's one token, [0])
    assert metrics(url)[("sglang:kv_evictable_tokens", ())] in (3000, 3001)
    generate(url, b)  # 3,000 more tokens do not fit beside a's: a is evicted
    assert generate(url, a)[0]["meta_info"]["cached_tokens"] == 0
    assert generate(url, b)[0]["meta_info"]["cached_tokens"] == 0  # and b went for a's return


# ---- PD ------------------------------------------------------------------------------------------

def kv_sent_bytes(prefill: str) -> float:
    """Bytes the prefill has sent so far: kv_transfer_total_mb's sum is MiB."""
    return metrics(prefill).get(("sglang:kv_transfer_total_mb_sum", ()), 0.0) * 2**20


def pd_turn(prefill: str, decode: str, bootstrap_port: int, room: int, input_ids: list[int]) -> dict:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 3}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap_port, "bootstrap_room": room}
    with ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(post, f"{u}/generate", body, 30.0) for u in (prefill, decode)]
        p, d = (f.result() for f in legs)
    assert p.status_code == d.status_code == 200, (p.text, d.text)
    return d.json()


@pytest.mark.parametrize("decode_cache", [False, True], ids=["no-decode-cache", "decode-radix-cache"])
def test_pd_sends_only_what_the_decode_cache_lacks(procs, decode_cache):
    prefill_port, bootstrap_port, decode_port = free_ports(3)
    start_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env=SIM_TEST_ENV)
    extra = ["--disaggregation-decode-enable-radix-cache"] if decode_cache else []
    decode_proc = start_sim(procs, "decode", "decode", decode_port, extra=extra, env=SIM_TEST_ENV)
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    turn1 = ids(2000)
    turn2 = turn1 + ids(500, 70_000)  # the next turn of the session: the whole first turn, then more

    out1 = pd_turn(prefill, decode, bootstrap_port, 1, turn1)
    sent1 = kv_sent_bytes(prefill)
    assert sent1 == 2000 * KV_BYTES and out1["meta_info"]["cached_tokens"] == 0
    out2 = pd_turn(prefill, decode, bootstrap_port, 2, turn2)
    sent2 = kv_sent_bytes(prefill) - sent1
    # the prefill's own cache hit the first turn either way (its prefill is shorter) ...
    assert out2["meta_info"]["cached_tokens"] == 2000
    assert metrics(prefill)[("sglang:cached_tokens_total", (("cache_source", "device"),))] == 2000
    # ... but only a decode radix cache spares the transfer of the first turn's KV
    assert sent2 == (500 if decode_cache else 2500) * KV_BYTES
    warning = ("EXPERIMENTAL: Radix cache is enabled for decode server" if decode_cache
               else "Radix cache is disabled for decode server")
    assert warning in decode_proc.log_text()
    # what the decode keeps once the turns are over: both turns' prompts with its cache (and the
    # start-up probe's one token), nothing without
    evictable = metrics(decode)[("sglang:kv_evictable_tokens", ())]
    assert evictable in ((2500, 2501) if decode_cache else (0,))


# ---- unified vs PD: the documented model (docs/sim.md) --------------------------------------------

def longest_gap_while_a_long_prompt_prefills(decode_url: str, prefill_url: str, pd: tuple[int, int] | None) -> float:
    """Stream a decoding request, send a long uncached prompt meanwhile; the longest gap between the
    first request's tokens. pd = (bootstrap port, first room) for a PD pair, None for a unified engine."""
    def body(input_ids, max_new, room, stream):
        b = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new}, "stream": stream}
        if pd:
            b.update(bootstrap_host="127.0.0.1", bootstrap_port=pd[0], bootstrap_room=pd[1] + room)
        return b

    def legs(b, stream):
        urls = (prefill_url, decode_url) if pd else (decode_url,)
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(post, f"{u}/generate", b, 60.0, stream and u == decode_url) for u in urls]
            return futures[-1].result()

    gaps: list[float] = []

    def stream_first():
        resp = legs(body(ids(10), 60, 0, True), True)
        last = None
        for line in resp.iter_lines():
            if line.startswith(b"data: {"):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(stream_first)
        time.sleep(0.5)  # the first request is decoding
        assert legs(body(ids(6000, 500_000), 1, 1, False), False).status_code == 200
        first.result()
    return max(gaps)


def test_a_prefill_stalls_decoding_on_a_unified_engine_not_on_a_pd_pair(procs):
    """6,000 uncached tokens cost ~610 ms of prefill (100 ms per 1k): on one engine every decoding request
    waits for it; on a PD pair the prefill engine runs it and the decode keeps stepping."""
    unified_port, prefill_port, bootstrap_port, decode_port = free_ports(4)
    start_sim(procs, "unified", "null", unified_port, env={**SIM_TEST_ENV, **SLOW_PREFILL})
    start_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env={**SIM_TEST_ENV, **SLOW_PREFILL})
    start_sim(procs, "decode", "decode", decode_port, env={**SIM_TEST_ENV, **SLOW_PREFILL})
    unified = f"http://127.0.0.1:{unified_port}"
    stalled = longest_gap_while_a_long_prompt_prefills(unified, unified, None)
    split = longest_gap_while_a_long_prompt_prefills(f"http://127.0.0.1:{decode_port}",
                                                     f"http://127.0.0.1:{prefill_port}", (bootstrap_port, 10))
    assert stalled > 0.5, stalled
    assert split < 0.3, split
