"""One unified sim on its own: start-up, readiness, the info endpoints, the generation APIs."""

from __future__ import annotations

import time

import pytest

from pdkit.sim.textgen import expected_output, tokenize

from .support import (
    MODEL,
    MODEL_PATH,
    PYTHON,
    Processes,
    free_ports,
    get,
    post,
    sse_events,
    status_of,
    wait_until,
)

# long beside Python start-up plus the sim's imports: on a busy 2-core machine those took 1.9 s
STARTUP_DELAY_S = 4.0
UNKNOWN_FLAGS = ["--mem-fraction-static", "0.88", "--num-continuous-decode-steps", "4", "--enable-torch-compile",
                 "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--numa-node", "0", "0", "1", "1",
                 "--attention-backend", "flashinfer", "--lora-paths", "a=/x", "b=/y", "--json-model-override-args",
                 '{"rope_scaling": null}']


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A unified sim without --enable-metrics, with a start-up delay long enough to observe."""
    group = Processes(tmp_path_factory.mktemp("engine"))
    port, = free_ports(1)
    health_fail = tmp_path_factory.mktemp("knobs") / "unhealthy"
    argv = [PYTHON, "-m", "pdkit.sim", "--model-path", MODEL_PATH, "--served-model-name", MODEL,
            "--port", str(port), "--context-length", "64", "--random-seed", "3", "--stream-interval", "2",
            "--log-requests", *UNKNOWN_FLAGS]
    launched = time.monotonic()
    proc = group.start("unified", argv, {"PDKIT_SIM_STARTUP_DELAY_S": str(STARTUP_DELAY_S),
                                         "PDKIT_SIM_HEALTH_FAIL_FILE": str(health_fail),
                                         "PDKIT_SIM_DEFAULT_MAX_TOKENS": "6"})
    url = f"http://127.0.0.1:{port}"
    first = wait_until(lambda: status_of(f"{url}/health"), 10, "the HTTP port to answer", context=group.logs)
    early = {"health": first, "ready": status_of(f"{url}/ready"), "log": proc.log_text(),
             "generate": post(f"{url}/generate", {"text": "x"}).status_code,
             "answered_after": time.monotonic() - launched}
    wait_until(lambda: status_of(f"{url}/health") == 200, 10, "readiness", context=group.logs)
    try:
        yield url, proc, early, health_fail
    finally:
        group.stop_all()


def test_503_until_ready_then_fired_up(engine):
    url, proc, early, _ = engine
    # The port answers long before the start-up delay ends (Python start-up is well under it).
    assert early["answered_after"] < STARTUP_DELAY_S
    assert early["health"] == 503 and early["ready"] == 503 and early["generate"] == 503
    assert "The server is fired up and ready to roll!" not in early["log"]
    assert status_of(f"{url}/ready") == 200 and status_of(f"{url}/health_generate") == 200
    assert "The server is fired up and ready to roll!" in proc.log_text()


def test_unknown_flags_ignored_at_process_level(engine):
    url, proc, _, _ = engine
    info = get(f"{url}/server_info").json()
    assert info["ignored_sglang_args"][:1] == ["--enable-torch-compile"]
    assert "--attention-backend" in info["ignored_sglang_args"]
    assert "does not model these SGLang arguments" in proc.log_text()


def test_info_endpoints(engine):
    url, _, _, _ = engine
    for path in ("/server_info", "/get_server_info"):
        info = get(f"{url}{path}").json()
        assert info["version"] == "sim"
        assert info["served_model_name"] == MODEL and info["model_path"] == MODEL_PATH
        assert info["context_length"] == 64 and info["disaggregation_mode"] == "null"
        assert info["port"] == int(url.rsplit(":", 1)[1]) and info["mem_fraction_static"] == 0.88
    for path in ("/model_info", "/get_model_info"):
        assert get(f"{url}{path}").json()["model_path"] == MODEL_PATH
    model = get(f"{url}/v1/models").json()["data"][0]
    assert (model["id"], model["owned_by"], model["max_model_len"]) == (MODEL, "sglang", 64)
    assert status_of(f"{url}/metrics") == 404  # like SGLang without --enable-metrics


def test_native_generate_with_input_ids_and_stream(engine):
    url, _, _, _ = engine
    body = post(f"{url}/generate", {"input_ids": [1, 5, 9], "sampling_params": {"max_new_tokens": 4}}).json()
    assert body["text"] == expected_output([1, 5, 9], 3, 4)  # --random-seed 3 is the default seed
    assert body["meta_info"]["prompt_tokens"] == 3 and body["meta_info"]["completion_tokens"] == 4
    events = sse_events(post(f"{url}/generate", {"text": "stream me", "stream": True,
                                                  "sampling_params": {"max_new_tokens": 3}}, stream=True))
    # --stream-interval 2: tokens come in pairs, the last group may be short; then the final event.
    assert [e["meta_info"]["completion_tokens"] for e in events] == [2, 3, 3]
    assert events[-1]["text"] == expected_output(tokenize("stream me"), 3, 3)
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


def test_openai_completion_stream_and_chat_default_length(engine):
    url, _, _, _ = engine
    events = sse_events(post(f"{url}/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 5,
                                                        "stream": True}, stream=True))
    assert "".join(e["choices"][0]["text"] for e in events) == expected_output(tokenize("a b"), 3, 5)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    chat = post(f"{url}/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).json()
    # No max_tokens: the sim stops at PDKIT_SIM_DEFAULT_MAX_TOKENS as if at EOS.
    assert chat["choices"][0]["finish_reason"] == "stop" and chat["choices"][0]["matched_stop"] is not None
    assert chat["usage"]["completion_tokens"] == 6


def test_log_requests(engine):
    url, proc, _, _ = engine
    post(f"{url}/generate", {"text": "logged", "rid": "rid-logged", "sampling_params": {"max_new_tokens": 1}})
    wait_until(lambda: "Finish: obj=GenerateReqInput(rid='rid-logged')" in proc.log_text(), 5, "the Finish line")
    assert "Receive: obj=GenerateReqInput(rid='rid-logged'" in proc.log_text()


def test_sglang_style_errors(engine):
    url, _, _, _ = engine
    resp = post(f"{url}/v1/completions", {"model": MODEL, "prompt": " ".join(["w"] * 80), "max_tokens": 4})
    assert resp.status_code == 400
    body = resp.json()
    assert body["object"] == "error" and body["code"] == 400
    assert "longer than the model's context length (64 tokens)" in body["message"]
    resp = post(f"{url}/generate", {"sampling_params": {}})
    assert resp.status_code == 400 and "message" in resp.json()["error"]


def test_health_failure_injection(engine):
    url, _, _, health_fail = engine
    health_fail.touch()
    try:
        assert status_of(f"{url}/health") == 503 and status_of(f"{url}/health_generate") == 503
    finally:
        health_fail.unlink()
    assert status_of(f"{url}/health") == 200
