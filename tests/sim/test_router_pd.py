"""A sim prefill and a sim decode behind the real smg router, in PD mode."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pdkit.sim.textgen import chat_prompt, expected_output, tokenize
from pdkit.upstream import metricnames

from .support import MODEL, get, post, sse_events, wait_until

# SGLang's log shapes (read from the pinned wheels into pdkit/upstream/data/metric_catalogue.json), with the `[YYYY-MM-DD HH:MM:SS TPn]` prefix.
PREFIX = r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} TP\d+\] "
PREFILL_LINE = re.compile(
    PREFIX + r"Prefill batch[.,] #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: \d+\.\d+, "
    r"#running-req: \d+, #queue-req: \d+, .*cuda graph: (True|False), input throughput \(token/s\): \d+\.\d+$",
    re.M)
DECODE_LINE = re.compile(
    PREFIX + r"Decode batch[.,] #running-req: \d+, #token: \d+, token usage: \d+\.\d+, .*"
    r"cuda graph: (True|False), gen throughput \(token/s\): \d+\.\d+, #queue-req: \d+$",
    re.M)
READY_LINE = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] The server is fired up and ready to roll!$", re.M)

# The families the kit reads (pdkit.upstream.metricnames) that SGLang 0.5.17's own prefill / decode put on their
# pages after load (tests/fixtures/sglang-0.5.17-h200-pd-one-gpu): the sim's pages must have them too,
# and nothing the real pages lack (failure counters while nothing failed, graph modes that never ran).
REAL = Path(__file__).resolve().parent.parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"


def real_families(role: str) -> set[str]:
    text = (REAL / f"metrics-base-after-{role}.txt").read_text()
    return {f.name + ("_total" if f.type == "counter" else "") for f in text_string_to_metric_families(text)
            if f.samples}


def kit_read(role: str) -> set[str]:
    return set(metricnames.SGLANG.values()) & real_families(role)


def samples(url: str) -> list:
    text = get(f"{url}/metrics").text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_completion_through_router(pd_stack):
    prompt = "the quick brown fox"
    resp = post(f"{pd_stack.router_url}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 12})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == expected_output(tokenize(prompt), 0, 12)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17,
                             "prompt_tokens_details": None}


def test_streaming_chat_through_router(pd_stack):
    messages = [{"role": "user", "content": "say something"}]
    resp = post(f"{pd_stack.router_url}/v1/chat/completions",
                {"model": MODEL, "messages": messages, "max_tokens": 10, "stream": True, "seed": 7,
                 "stream_options": {"include_usage": True}}, stream=True)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert not [e for e in events if "error" in e], events
    content = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert content == expected_output(tokenize(chat_prompt(messages)), 7, 10)
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert finishes == ["length"]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 10


def test_native_generate_through_router_is_deterministic(pd_stack):
    body = {"text": "hello world", "sampling_params": {"max_new_tokens": 6}}
    first = post(f"{pd_stack.router_url}/generate", body).json()
    second = post(f"{pd_stack.router_url}/generate", body).json()
    assert first["text"] == second["text"] == expected_output(tokenize("hello world"), 0, 6)
    assert first["meta_info"]["completion_tokens"] == 6
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_prefill_alone_returns_no_completion(pd_stack):
    resp = post(f"{pd_stack.prefill_url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4})
    assert resp.status_code == 400
    assert "bootstrap_room" in resp.json()["message"]


def test_metrics_parse_and_carry_sglang_names(pd_stack):
    post(f"{pd_stack.router_url}/v1/completions", {"model": MODEL, "prompt": "metrics please", "max_tokens": 8})
    for url, engine_type in ((pd_stack.prefill_url, "prefill"), (pd_stack.decode_url, "decode")):
        found = samples(url)
        families = {f.name + ("_total" if f.type == "counter" else "")
                    for f in text_string_to_metric_families(get(f"{url}/metrics").text) if f.samples}
        missing = sorted(kit_read(engine_type) - families)
        assert not missing, f"{engine_type} /metrics lacks {missing}, which SGLang 0.5.17's {engine_type} has"
        extra = sorted(n for n in set(metricnames.SGLANG.values()) & families if n not in real_families(engine_type))
        assert not extra, f"{engine_type} /metrics has {extra}, which SGLang 0.5.17's {engine_type} lacks after load"
        running = [s for s in found if s.name == "sglang:num_running_reqs"]
        assert running and running[0].labels["engine_type"] == engine_type
        assert running[0].labels["model_name"] == MODEL and running[0].labels["tp_rank"] == "0"

    def passes(url: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in samples(url):
            if s.name == "sglang:cuda_graph_passes_total":
                out[s.labels["mode"]] = out.get(s.labels["mode"], 0) + s.value
        return out

    # The decode ran decode steps under graphs, the prefill only prefill passes; a mode's child exists
    # only once a pass of that mode ran.
    decode, prefill = passes(pd_stack.decode_url), passes(pd_stack.prefill_url)
    assert set(decode) == {"decode_cuda_graph"} and decode["decode_cuda_graph"] > 0
    assert set(prefill) <= {"prefill_cuda_graph", "prefill_none"} and sum(prefill.values()) > 0
    transfer = [s for s in samples(pd_stack.prefill_url) if s.name == "sglang:kv_transfer_speed_gb_s_sum"]
    assert transfer and transfer[0].value > 0



def test_log_lines_match_sglang_format(pd_stack):
    # 20 tokens with --decode-log-interval 5 make several decode log lines.
    post(f"{pd_stack.router_url}/v1/completions", {"model": MODEL, "prompt": "log lines", "max_tokens": 20})
    wait_until(lambda: DECODE_LINE.search(pd_stack.decode.log_text()), 5, "a Decode batch line",
               context=pd_stack.procs.logs)
    prefill_log = pd_stack.prefill.log_text()
    assert PREFILL_LINE.search(prefill_log), prefill_log[-2000:]
    assert READY_LINE.search(prefill_log) and READY_LINE.search(pd_stack.decode.log_text())
    decode_lines = DECODE_LINE.findall(pd_stack.decode.log_text())
    assert set(decode_lines) <= {"True", "False"} and "True" in decode_lines
    # Every batch line of both engines is in the strict shape (none half-formatted).
    for log in (prefill_log, pd_stack.decode.log_text()):
        for line in log.splitlines():
            if " batch, " in line:
                assert PREFILL_LINE.match(line) or DECODE_LINE.match(line), line


def test_router_sees_engine_metrics(pd_stack):
    """The router's own Prometheus endpoint is up (the kit scrapes it next to the engines')."""
    text = get(pd_stack.router_metrics_url + "/metrics").text
    assert "smg_" in text
