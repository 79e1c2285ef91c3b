"""The sim answers the tune levers in SGLang's direction, and pdkit tune's correctness gate and
soak catch the corrupting and the wedging lever: sim engines behind the real smg router.

Sim figures are never performance claims: only directions and verdicts are asserted.
"""

from __future__ import annotations

import time

import pytest

from pdkit.clients import answers
from pdkit.sim.knobs import KnobError, Knobs, argv_matches, load_knobs
from pdkit.sim.localstack import LocalPDStack
from pdkit.sim.stepmodel import decode_iteration_seconds, decode_step_seconds
from pdkit.tune import gates

from .support import free_ports, post, start_sim

LEVER = "--enable-torch-compile"  # a flag the sim accepts and ignores: the fault's trigger here


# ---------------------------------------------------------------- pure


@pytest.mark.parametrize("cond, argv, expected", [
    ("--enable-torch-compile", ["--port", "1", "--enable-torch-compile"], True),
    ("--enable-torch-compile", ["--port", "1"], False),
    ("!--disable-overlap-schedule", ["--port", "1"], True),
    ("!--disable-overlap-schedule", ["--disable-overlap-schedule"], False),
    ("--num-continuous-decode-steps=4", ["--num-continuous-decode-steps", "4"], True),
    ("--num-continuous-decode-steps=4", ["--num-continuous-decode-steps", "1"], False),
    ("--cuda-graph-bs-decode=1 2 4", ["--cuda-graph-bs-decode", "1", "2", "4", "--port", "3"], True),
    ("--a, !--b", ["--a"], True),
    ("--a, !--b", ["--a", "--b"], False),
    ("", ["--a"], False),
])
def test_argv_conditions(cond, argv, expected):
    assert argv_matches(cond, argv) is expected


def test_fault_knobs_refuse_a_condition_that_is_not_a_flag():
    with pytest.raises(KnobError, match="PDKIT_SIM_WEDGE_WHEN"):
        load_knobs({"PDKIT_SIM_WEDGE_WHEN": "overlap"})
    with pytest.raises(KnobError, match="PDKIT_SIM_WEDGE_MIN_BATCH"):
        load_knobs({"PDKIT_SIM_WEDGE_MIN_BATCH": "0"})


def test_continuous_steps_amortise_scheduling_and_context_cap_cuts_the_indexer_charge():
    k = Knobs(decode_base_ms=10, decode_per_req_ms=0.5, schedule_ms=8, indexer_ms_per_1m_ctx=20)
    per_token = [decode_iteration_seconds(k, 16, True, steps) / steps for steps in (1, 2, 4, 8)]
    assert per_token == sorted(per_token, reverse=True) and per_token[0] > per_token[-1]
    # the indexer scores the configured context, not the tokens in use: 1M vs an 8k cap
    uncapped, capped = decode_step_seconds(k, 16, True, 1_000_000), decode_step_seconds(k, 16, True, 8192)
    assert uncapped > 2 * capped
    assert capped == pytest.approx((10 + 0.5 * 16 + 20 * 16 * 8192 / 1e6) / 1000)
    # no indexer (the default): the context length changes nothing
    assert decode_step_seconds(Knobs(), 16, True, 1_000_000) == decode_step_seconds(Knobs(), 16, True, 8192)


# ---------------------------------------------------------------- one sim: timing directions


def _generate_seconds(port: int, tokens: int) -> float:
    start = time.perf_counter()
    resp = post(f"http://127.0.0.1:{port}/generate",
                {"text": "time me", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}, timeout=60)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["output_ids"]) == tokens
    return time.perf_counter() - start


def test_sim_continuous_decode_steps_and_context_cap_move_time_per_token(procs):
    env = {"PDKIT_SIM_DECODE_BASE_MS": "5", "PDKIT_SIM_SCHEDULE_MS": "15", "PDKIT_SIM_INDEXER_MS_PER_1M_CTX": "20"}
    ports = free_ports(3)
    runs = {
        "steps1": ["--num-continuous-decode-steps", "1", "--context-length", "8192"],
        "steps4": ["--num-continuous-decode-steps", "4", "--context-length", "8192"],
        "uncapped": ["--num-continuous-decode-steps", "4", "--context-length", "1000000"],
    }
    seconds = {}
    for (name, extra), port in zip(runs.items(), ports):
        start_sim(procs, name, "null", port, extra=extra, env=env)
        seconds[name] = min(_generate_seconds(port, 24) for _ in range(2))
    # 24 tokens: steps=1 pays the 15 ms overhead per token, steps=4 once per 4 tokens
    assert seconds["steps4"] < 0.8 * seconds["steps1"], seconds
    # 1M context: +20 ms per step from the indexer, against +0.16 ms with the 8k cap
    assert seconds["uncapped"] > 1.5 * seconds["steps4"], seconds


# ---------------------------------------------------------------- behind the real router


def _stack(tmp_path, name: str, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> LocalPDStack:
    return LocalPDStack(tmp_path / name, sim_env={"PDKIT_SIM_STARTUP_DELAY_S": "0.2", **(env or {})},
                        sim_extra=("--decode-log-interval", "5", *extra))


def test_correctness_gate_passes_the_same_engine_and_fails_the_corrupting_lever(tmp_path):
    prompt_set = answers.prompts(8)
    corrupt_env = {"PDKIT_SIM_CORRUPT_WHEN": LEVER}
    with _stack(tmp_path, "baseline", corrupt_env) as stack:  # armed, but the lever is not pulled
        baseline = answers.ask(stack.router_url, {}, prompt_set, 16, 4)
        again = answers.ask(stack.router_url, {}, prompt_set, 16, 4)
    assert all(len(a["tokens"]) == 16 for a in baseline), baseline
    ok, why = answers.correctness_verdict(answers.compare(baseline, again), 0.9, exact=True)
    assert ok, why

    with _stack(tmp_path, "corrupt", corrupt_env, (LEVER,)) as stack:
        corrupted = answers.ask(stack.router_url, {}, prompt_set, 16, 4)
    comparison = answers.compare(baseline, corrupted)
    ok, why = answers.correctness_verdict(comparison, 0.9, exact=False)
    assert not ok and "below the threshold 0.9" in why, why
    # the prefill's first token is right; the decode's tokens are not
    assert {p["first_divergence"] for p in comparison["prompts"]} == {1}, comparison["prompts"]


def test_soak_passes_a_healthy_stack_and_catches_the_wedging_lever_which_then_lets_go(tmp_path):
    wedge_env = {"PDKIT_SIM_WEDGE_WHEN": LEVER, "PDKIT_SIM_WEDGE_MIN_BATCH": "6", "PDKIT_SIM_WEDGE_HOLD_S": "5"}
    with _stack(tmp_path, "healthy", wedge_env) as stack:
        urls = {"prefill": f"http://127.0.0.1:{stack.prefill_port}", "decode": f"http://127.0.0.1:{stack.decode_port}"}
        ok, why, figures = gates.soak(stack.router_url, {}, urls, 3, 8, 16, 16, wedge_window_s=1.5)
        assert ok, (why, figures)
        assert figures["ok"] > 0 and figures["failed"] == 0

    with _stack(tmp_path, "wedge", wedge_env, (LEVER,)) as stack:
        urls = {"prefill": f"http://127.0.0.1:{stack.prefill_port}", "decode": f"http://127.0.0.1:{stack.decode_port}"}
        # a few requests at a time do not wedge it (the roll's smoke, the correctness gate)
        small = answers.ask(stack.router_url, {}, answers.prompts(4), 8, 4)
        assert all("tokens" in a for a in small), small
        started = time.monotonic()
        ok, why, figures = gates.soak(stack.router_url, {}, urls, 20, 8, 16, 16, wedge_window_s=1.5)
        assert not ok and why.startswith("wedged: decode"), (why, figures)
        assert time.monotonic() - started < 12, "the wedge must stop the soak early"
        # the hold passes: the requests the wedge caught finish and it serves again (so a rollback's
        # drain empties it and no request of a background load is lost)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            running = gates.engine_sample({"decode": urls["decode"]})["decode"]["sglang:num_running_reqs"]
            if running == 0:
                break
            time.sleep(0.2)
        assert running == 0, "the decode still holds the soak's requests after the wedge's hold"
        again = answers.ask(stack.router_url, {}, answers.prompts(2), 8, 2)
        assert all("tokens" in a for a in again), again
