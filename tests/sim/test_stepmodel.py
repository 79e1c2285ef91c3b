"""The pure decision functions: step time, CUDA-graph use, admission, knobs, text."""

from __future__ import annotations

import pytest

from pdkit.sim.args import CudaGraphPlan
from pdkit.sim.knobs import KnobError, Knobs, load_knobs
from pdkit.sim.stepmodel import (
    Limits,
    admit_count,
    decode_step_seconds,
    decode_uses_cuda_graph,
    kv_transfer_bytes,
    kv_transfer_seconds,
    prefill_passes,
    prefill_step_seconds,
)
from pdkit.sim.textgen import chat_prompt, expected_output, tokenize

KNOBS = Knobs(decode_base_ms=20, decode_per_req_ms=0.5, no_cuda_graph_factor=4)


def test_decode_step_grows_with_batch_and_without_graphs():
    assert decode_step_seconds(KNOBS, 1, True) < decode_step_seconds(KNOBS, 64, True)
    assert decode_step_seconds(KNOBS, 64, True) == pytest.approx((20 + 0.5 * 64) / 1000)
    assert decode_step_seconds(KNOBS, 64, False) == pytest.approx(4 * decode_step_seconds(KNOBS, 64, True))


def test_graph_used_only_up_to_captured_batch_size():
    plan = CudaGraphPlan(decode_enabled=True, decode_max_bs=32, prefill_enabled=False, prefill_max_tokens=8192)
    assert decode_uses_cuda_graph(plan, 32) and not decode_uses_cuda_graph(plan, 33)
    off = CudaGraphPlan(decode_enabled=False, decode_max_bs=256, prefill_enabled=False, prefill_max_tokens=8192)
    assert not decode_uses_cuda_graph(off, 1)


def test_prefill_costs():
    assert prefill_step_seconds(KNOBS, 4096) > prefill_step_seconds(KNOBS, 16)
    assert prefill_passes(100, 8192) == 1 and prefill_passes(20000, 8192) == 3
    assert kv_transfer_seconds(Knobs(kv_bytes_per_token=1000, kv_transfer_gb_s=1.0), 1000) == pytest.approx(0.001)


LIMITS = Limits(max_running_requests=4, max_prefill_tokens=100, max_total_tokens=1000)


def test_admission_honours_max_running_requests():
    assert admit_count([(10, 10)] * 10, running=0, used_tokens=0, limits=LIMITS) == 4
    assert admit_count([(10, 10)] * 10, running=3, used_tokens=0, limits=LIMITS) == 1
    assert admit_count([(10, 10)] * 10, running=4, used_tokens=0, limits=LIMITS) == 0


def test_admission_honours_prefill_token_budget_but_not_on_decode():
    assert admit_count([(60, 1), (60, 1)], 0, 0, LIMITS) == 1
    assert admit_count([(60, 1), (60, 1)], 0, 0, LIMITS, prefill_budget=False) == 2
    assert admit_count([(500, 1)], 0, 0, LIMITS) == 1  # a long prompt still goes, alone


def test_admission_honours_kv_pool_fcfs():
    assert admit_count([(50, 400), (50, 400), (10, 10)], 0, 0, LIMITS) == 2
    assert admit_count([(50, 400)], 1, 700, LIMITS) == 0
    assert admit_count([(5000, 1)], 0, 0, LIMITS) == 1  # an idle engine never deadlocks


def test_knobs_from_environment():
    knobs = load_knobs({"PDKIT_SIM_NO_CUDA_GRAPH_FACTOR": "5", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "7"})
    assert knobs.no_cuda_graph_factor == 5 and knobs.waiting_timeout_s == 7
    assert load_knobs({}).waiting_timeout_s == 300 and load_knobs({}).bootstrap_timeout_s == 300
    with pytest.raises(KnobError):
        load_knobs({"PDKIT_SIM_TRANSFER_FAIL_RATE": "2"})
    with pytest.raises(KnobError):
        load_knobs({"PDKIT_SIM_STARTUP_DELAY_S": "soon"})


def test_text_is_deterministic_per_prompt_and_seed():
    ids = tokenize("a b c")
    assert ids[0] == 1 and len(ids) == 4 and len(tokenize("")) == 1
    assert expected_output(ids, 0, 5) == expected_output(ids, 0, 5)
    assert expected_output(ids, 0, 5) != expected_output(ids, 1, 5)
    assert expected_output(ids, 0, 8).startswith(expected_output(ids, 0, 3))
    assert chat_prompt([{"role": "user", "content": "hi"}]) == "<|user|> hi\n<|assistant|>"


def test_kv_transfer_figures_are_in_sglangs_units():
    """SGLang observes kv_transfer_total_mb as bytes / 2**20 and kv_transfer_speed_gb_s as
    (MiB / 1024) / seconds (req_time_stats.py compute_and_observe_kv_transfer_metrics); the sim too."""
    from pdkit.sim.stepmodel import sglang_kv_units

    total_mb, speed = sglang_kv_units(192 * 2**20, 0.5)
    assert total_mb == 192.0 and speed == pytest.approx(0.375)
    knobs = Knobs()
    seconds = kv_transfer_seconds(knobs, 3072)
    total_mb, speed = sglang_kv_units(kv_transfer_bytes(knobs, 3072), seconds)
    assert total_mb == 3072 * 65536 / 2**20 == 192.0
    # the knob is a link rate in bytes/s / 1e9: SGLang's histogram reads it in GiB/s
    assert speed == pytest.approx(knobs.kv_transfer_gb_s * 1e9 / 2**30)
