"""The sim's /metrics against the metric catalogue (pdkit/upstream/data/metric_catalogue.json, generated from
each pinned SGLang wheel's own collectors), for every catalogued release: the same family names, types
and label names; the eager families there from the start; the lazy ones absent until their first event
(a request, a KV transfer, a failure) and present after it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from pdkit.upstream import catalogue, metricnames
from pdkit.upstream.sglang_pd import NO_PREFILL_BOOTSTRAP_TIMEOUT

from .support import SIM_TEST_ENV, free_ports, get, post, start_sim, wait_until

S = metricnames.SGLANG
TIMEOUT_S = float(SIM_TEST_ENV["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"])


def page(url: str) -> dict[str, tuple[str, set[str], list]]:
    """family as on the page (counters with _total) -> (type, label names, samples), families with samples."""
    out = {}
    for f in text_string_to_metric_families(get(f"{url}/metrics").text):
        if f.samples:
            name = f.name + ("_total" if f.type == "counter" else "")
            out[name] = (f.type, {k for s in f.samples for k in s.labels} - {"le"}, f.samples)
    return out


def mismatches(families: dict, version: str) -> list[str]:
    """What on a sim page the release's catalogue does not have (name, type or label names)."""
    cat = catalogue.sglang_families(version)
    out = []
    for name, (kind, labels, _) in families.items():
        if name not in cat:
            out.append(f"{name}: SGLang {version} exports no such family")
        elif cat[name]["type"] != kind:
            out.append(f"{name}: {kind}, SGLang {version} has a {cat[name]['type']}")
        elif set(cat[name]["labels"]) != labels:
            out.append(f"{name}: labels {sorted(labels)}, SGLang {version} has {cat[name]['labels']}")
    return out


def value(families: dict, name: str) -> float:
    return sum(s.value for s in families[name][2] if not s.name.endswith(("_bucket", "_sum"))) if name in families else 0.0


def pd_request(prefill: str, decode: str, bootstrap_port: int, room: int, stream: bool,
               to: tuple[str, ...] = ("prefill", "decode"), timeout: float = 30.0) -> list[int]:
    """What smg does for one PD request: the same body, with the prefill's bootstrap address and a
    room, to both engines at once (0: no answer within TIMEOUT)."""
    body = {"text": "catalogue", "sampling_params": {"max_new_tokens": 4}, "stream": stream,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port, "bootstrap_room": room}
    urls = {"prefill": prefill, "decode": decode}

    def one(url: str) -> int:
        try:
            return post(url, body, timeout).status_code
        except requests.exceptions.ReadTimeout:
            return 0

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(one, f"{urls[r]}/generate") for r in to]
        return [f.result() for f in futures]


@pytest.mark.parametrize("version", catalogue.SGLANG_VERSIONS)
def test_sim_metrics_are_the_catalogues(procs, version):
    cat = catalogue.sglang_families(version)
    env = {"PDKIT_SIM_SGLANG_VERSION": version}
    prefill_port, bootstrap_port, decode_port = free_ports(3)
    start_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env=env)
    start_sim(procs, "decode", "decode", decode_port, env=env)
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"

    # 1. Fresh engines: only catalogued families, every eager one there, no lazy one the sim creates on
    #    an event (requests, transfers, failures) yet. (cuda_graph_passes_total may be there: the startup
    #    warm-up generation runs passes, as SGLang's does.)
    lazy_on_events = {S["bootstrap_failed"], S["transfer_failed"], S["aborted"],
                      S["kv_transfer_speed"], S["kv_transfer_latency"], S["kv_transfer_total"], S["requests"],
                      S["prompt_tokens"], S["generation_tokens"], S["ttft"], S["e2e"], S["itl"],
                      "sglang:cached_tokens_total"}
    assert all(not cat[n]["eager"] for n in lazy_on_events)
    eager = {n for n, f in cat.items() if f["eager"]}
    for url in (prefill, decode):
        before = page(url)
        assert not mismatches(before, version), mismatches(before, version)
        assert eager <= set(before), sorted(eager - set(before))
        assert not lazy_on_events & set(before), sorted(lazy_on_events & set(before))
        assert "sglang:num_prefill_prealloc_queue_reqs" not in before  # no release has that name

    # 2. One streamed and one plain PD request: the request series (with is_streaming where the release
    #    has it), the prefill's KV transfer histograms, the graph passes; still no failure series.
    assert pd_request(prefill, decode, bootstrap_port, 1, stream=False) == [200, 200]
    assert pd_request(prefill, decode, bootstrap_port, 2, stream=True) == [200, 200]
    p, d = page(prefill), page(decode)
    for families in (p, d):
        assert not mismatches(families, version), mismatches(families, version)
        assert value(families, S["requests"]) == 2
        streaming = {s.labels.get("is_streaming") for s in families[S["requests"]][2]}
        assert streaming == ({"true", "false"} if "is_streaming" in cat[S["requests"]]["labels"] else {None})
        assert not {S["bootstrap_failed"], S["transfer_failed"]} & set(families)
    # the second request's prompt is the first's: a prefix-cache hit (one token, at most prompt - 1) on the
    # prefill, reported by the decode too (the prefill's hit travels with the KV), under cache_source="device"
    for families in (p, d):
        assert value(families, "sglang:cached_tokens_total") == 1
        assert {s.labels["cache_source"] for s in families["sglang:cached_tokens_total"][2]} == {"device"}
    for name in (S["kv_transfer_speed"], S["kv_transfer_latency"], S["kv_transfer_total"]):
        assert p[name][0] == "histogram" and value(p, name) == 2, name
    assert S["ttft"] in d and S["itl"] in d and S["ttft"] not in p
    assert {s.labels["mode"] for s in d[S["cuda_graph_passes"]][2]} == {"decode_cuda_graph"}

    # 3. A forced failure: a prefill whose decode never comes times out its bootstrap, a decode whose
    #    prefill never gets the request times out waiting for the KV. The failure counters appear, at 1.
    #    Not on 0.5.17 with NIXL (the local stack's backend): its prefill never checks the bootstrap
    #    timeout (pdkit.upstream.sglang_pd.NO_PREFILL_BOOTSTRAP_TIMEOUT), so the request waits on, counted in the
    #    prefill's bootstrap queue, and no failure series appears.
    if (version, "nixl") in NO_PREFILL_BOOTSTRAP_TIMEOUT:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(pd_request, prefill, decode, bootstrap_port, 3, False, ("prefill",), TIMEOUT_S + 4)
            time.sleep(TIMEOUT_S + 1.5)  # past the timeout, before the client gives up
            p = page(prefill)
            assert S["bootstrap_failed"] not in p and value(p, S["prefill_bootstrap_queue"]) == 1, sorted(p)
            assert waiting.result() == [0]  # no answer at all: the client gave up
    else:
        assert pd_request(prefill, decode, bootstrap_port, 3, stream=False, to=("prefill",)) == [500]
        wait_until(lambda: S["bootstrap_failed"] in page(prefill), TIMEOUT_S + 5, "the prefill's bootstrap failure")
        p = page(prefill)
        assert value(p, S["bootstrap_failed"]) == 1 and p[S["bootstrap_failed"]][0] == "counter"
    assert pd_request(prefill, decode, bootstrap_port, 4, stream=False, to=("decode",)) == [500]
    d = page(decode)
    assert value(d, S["bootstrap_failed"]) + value(d, S["transfer_failed"]) == 1
    assert not mismatches(p, version) and not mismatches(d, version)


def test_the_comparison_can_fail():
    """A gauge where the release has a histogram, a family it lacks and a label it lacks are all caught."""
    version = catalogue.SGLANG_VERSIONS[0]
    labels = set(catalogue.sglang_families(version)[S["kv_transfer_speed"]]["labels"])
    wrong = {S["kv_transfer_speed"]: ("gauge", labels, []),
             "sglang:num_prefill_prealloc_queue_reqs": ("gauge", labels, []),
             S["running"]: ("gauge", labels | {"pid"}, [])}
    assert len(mismatches(wrong, version)) == 3
