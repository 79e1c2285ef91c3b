"""Issue 45 item 5: a burst of the declared workload against the PD timeouts (pdkit/spec/faultbudget.py
burst_wait, burst_problems, queue_wait_warnings): SGLang's prefill starts its bootstrap clock when a
request registers, not when the decode admits it, so a burst that queues behind a full decode KV pool
(or, once admitted, behind the prefill) fails with nothing dead when a timeout is below its wait.
`pdkit validate` warns, with the numbers and a safe value."""

from __future__ import annotations

import math

import pytest

from pdkit.cli import main
from pdkit.inventory.loader import load
from pdkit.sim.stepmodel import decode_admitted_at_once
from pdkit.spec import faultbudget
from pdkit.spec.faultbudget import FaultBudget, burst_problems, burst_wait
from tests.conftest import REPO, write_inventory

BOOTSTRAP = "pdkit_cluster.fault_budget.bootstrap_timeout_s"
WAITING = "pdkit_cluster.fault_budget.waiting_timeout_s"


def test_without_the_decode_pool_either_clock_may_take_the_whole_prefill_time():
    wait = burst_wait(64, 8192, 16384.0)
    assert wait.drain_s == pytest.approx(32.0)
    assert wait.bootstrap_s == wait.waiting_s == pytest.approx(32.0)
    assert wait.admitted_at_once is None


def test_the_decode_pool_splits_the_wait_between_the_clocks():
    # 30 of 8192 + 512 fit 262,144 tokens: the other 34 wait for admission, the last admitted behind 30
    wait = burst_wait(64, 8192, 16384.0, decode_pool_tokens=262144)
    assert wait.admitted_at_once == 30 == decode_admitted_at_once(8192, 1, 262144)
    assert wait.bootstrap_s == pytest.approx(34 * 0.5)
    assert wait.waiting_s == pytest.approx(30 * 0.5)
    # a pool that holds the burst: nothing on the bootstrap clock, everything on the waiting clock
    roomy = burst_wait(8, 8192, 16384.0, decode_pool_tokens=10**6)
    assert roomy.admitted_at_once == 8 and roomy.bootstrap_s == 0 and roomy.waiting_s == pytest.approx(4.0)
    # a prompt that fits the pool but not with its reserved decode tokens is never admitted
    never = burst_wait(4, 8000, 16384.0, decode_pool_tokens=8000)
    assert never.admitted_at_once == 0 and math.isinf(never.bootstrap_s)
    # and SGLang's other term: the prompt plus at least one new token
    assert burst_wait(4, 8000, 16384.0, decode_pool_tokens=8000, reserved_decode_tokens=0).admitted_at_once == 0
    assert burst_wait(4, 8000, 16384.0, decode_pool_tokens=8001, reserved_decode_tokens=0).admitted_at_once == 1


def test_a_bootstrap_timeout_below_the_queue_wait_is_named_with_a_safe_value():
    budget = FaultBudget(bootstrap_timeout_s=60)  # the kit's default before issue 45; 60 s each
    wait = burst_wait(64, 32768, 20000.0, decode_pool_tokens=262144)  # 7 at once, 1.64 s a prompt
    found = dict(burst_problems(budget, wait))
    assert set(found) == {BOOTSTRAP}, found
    message = found[BOOTSTRAP]
    assert "64 prompts of 32,768 tokens" in message and "20,000 tokens/s" in message
    assert f"~{wait.bootstrap_s:.0f} s" in message and "admits 7 at once" in message
    assert "bootstrap_timeout_s 60" in message
    assert f"safe: >= {math.ceil(wait.bootstrap_s * 1.25)}" in message
    # at the safe value it is gone
    safe = math.ceil(wait.bootstrap_s * 1.25)
    assert burst_problems(FaultBudget(bootstrap_timeout_s=safe), wait) == []


def test_a_waiting_timeout_below_the_prefill_queue_is_named():
    budget = FaultBudget(waiting_timeout_s=10)
    wait = burst_wait(64, 8192, 20000.0, decode_pool_tokens=10**7)  # all admitted at once
    found = dict(burst_problems(budget, wait))
    assert set(found) == {WAITING}, found
    assert f"~{wait.waiting_s:.0f} s" in found[WAITING] and "waiting_timeout_s 10" in found[WAITING]
    assert f"safe: >= {math.ceil(wait.waiting_s * 1.25)}" in found[WAITING]


def test_unknown_pool_warns_on_both_clocks_and_a_prompt_that_never_fits_says_so():
    found = dict(burst_problems(FaultBudget(bootstrap_timeout_s=60), burst_wait(128, 32768, 30000.0)))
    assert set(found) == {BOOTSTRAP, WAITING}
    assert "not known here" in found[BOOTSTRAP]
    never = dict(burst_problems(FaultBudget(), burst_wait(4, 8000, 30000.0, decode_pool_tokens=8000)))
    assert "never fits the decode's KV pool (8,000 tokens)" in never[BOOTSTRAP]


def test_a_safe_value_past_the_router_timeout_says_to_raise_that_too():
    budget = FaultBudget(bootstrap_timeout_s=60, router_request_timeout_s=100, client_timeout_s=130)
    found = dict(burst_problems(budget, burst_wait(128, 32768, 30000.0)))
    assert "router_request_timeout_s above it, now 100" in found[BOOTSTRAP]


def test_a_release_that_never_checks_the_bootstrap_timeout_gets_no_bootstrap_warning():
    """0.5.17's NIXL prefill never times a request out in Bootstrapping (nixl/conn.py NixlKVSender.poll):
    only the waiting clock can fail the burst there."""
    assert ("0.5.17", "nixl") in faultbudget.NO_PREFILL_BOOTSTRAP_TIMEOUT
    wait = burst_wait(128, 32768, 30000.0)
    assert {f for f, _ in burst_problems(FaultBudget(bootstrap_timeout_s=60), wait, bootstrap_enforced=False)} == {WAITING}


# ---- from an inventory, through `pdkit validate` ---------------------------------------------------

def _sim_cluster(cluster: dict, hosts: dict, base_ms: str | None, **budget) -> None:
    """The base cluster on sim engines, 64 prompts of 8192 tokens declared; BASE_MS: the prefills'
    PDKIT_SIM_PREFILL_BASE_MS (an engine's env may not name PDKIT_SIM_PREFILL_MS_PER_1K_TOKENS: validate
    takes any *TOKEN* variable for a secret)."""
    cluster.update(engine="sim", target_concurrency=64)
    cluster["tuning"] = {"all": {"context_length": 8192}, "decode": {"cuda_graph_max_bs": 64}}
    if budget:
        cluster["fault_budget"] = budget
    if base_ms is not None:
        for host in hosts.values():
            for engine in host.get("pdkit_node", {}).get("engines", []):
                if engine["role"] == "prefill":
                    engine["env"] = {"PDKIT_SIM_PREFILL_BASE_MS": base_ms}


def test_validate_warns_where_the_declared_burst_outlasts_the_bootstrap_timeout(base, tmp_path, capsys):
    cluster, hosts = base
    # a slow sim prefill: two prompts of 8192 tokens a pass (its 16384-token budget) in 1600 + 328 ms; its
    # decode's default pool admits 30 of 64 at once, so the last waits ~33 s for admission
    _sim_cluster(cluster, hosts, "1600", bootstrap_timeout_s=30, router_admission_wait_s=5)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for host in ("gpu01", "gpu02"):  # one PD group each: the group's decode host
        lines = [line for line in out.splitlines() if line.startswith(f"warning {host}: {BOOTSTRAP}")]
        assert len(lines) == 1, out
        assert "admits 30 at once" in lines[0] and "~33 s" in lines[0] and "bootstrap_timeout_s 30" in lines[0], lines[0]
    assert WAITING not in out  # 30 prompts behind the prefill: ~29 s, under 60
    # the same through the function
    spec = load(str(inv))
    assert {(h, f) for h, f, _ in faultbudget.queue_wait_warnings(spec)} == {("gpu01", BOOTSTRAP), ("gpu02", BOOTSTRAP)}


def test_validate_is_quiet_where_the_burst_fits_the_budget_or_nothing_is_stated(base, tmp_path, capsys):
    cluster, hosts = base
    _sim_cluster(cluster, hosts, None)  # the sim's default prefill: 64 x 8192 tokens in ~11 s
    assert faultbudget.queue_wait_warnings(load(str(write_inventory(tmp_path, hosts, cluster)))) == []
    cluster, hosts = base
    assert faultbudget.queue_wait_warnings(load(str(write_inventory(tmp_path, hosts, cluster)))) == []  # sglang
    # the lab as shipped
    assert faultbudget.queue_wait_warnings(load(str(REPO / "inventories" / "lab.py"))) == []


def test_a_stated_prefill_rate_gives_sglang_engines_the_estimate_and_the_default_bootstrap_timeout_holds_it(base, tmp_path):
    """fault_budget.prefill_tokens_per_s: a real engine's burst estimate. 64 prompts at 8192 tokens at
    5,000 tokens/s is ~105 s of prefill; the pool is not known for SGLang, so both clocks are checked
    against it: the waiting clock (60) warns, the bootstrap clock's default (SGLang's 300) does not."""
    cluster, hosts = base
    cluster.update(target_concurrency=64)
    cluster["tuning"] = {"all": {"context_length": 8192}, "decode": {"cuda_graph_max_bs": 64}}
    cluster["fault_budget"] = {"prefill_tokens_per_s": 5000}
    found = {(h, f) for h, f, _ in faultbudget.queue_wait_warnings(load(str(write_inventory(tmp_path, hosts, cluster))))}
    assert found == {("gpu01", WAITING), ("gpu02", WAITING)}, found
    cluster["fault_budget"] = {"prefill_tokens_per_s": 5000, "bootstrap_timeout_s": 60}
    found = {(h, f) for h, f, _ in faultbudget.queue_wait_warnings(load(str(write_inventory(tmp_path, hosts, cluster))))}
    assert ("gpu01", BOOTSTRAP) in found, found


def test_the_sim_pool_and_reserve_come_from_the_decode_engine(base, tmp_path):
    cluster, hosts = base
    _sim_cluster(cluster, hosts, None)
    decode = hosts["gpu01"]["pdkit_node"]["engines"][1]
    decode["extra_args"] = ["--max-total-tokens", "100000", "--num-reserved-decode-tokens", "256"]
    decode["env"] = {"PDKIT_SIM_KV_POOL_FRACTION": "0.5"}
    spec = load(str(write_inventory(tmp_path, hosts, cluster)))
    engine = next(e for h, e in spec.engines() if h.name == "gpu01" and e.role == "decode")
    assert faultbudget.stated_decode_pool(spec, engine) == (50000, 256)
