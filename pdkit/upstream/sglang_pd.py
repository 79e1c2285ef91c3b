"""What SGLang's PD code does when a peer fails: its fixed constants and the variables that tune it.

Read from SGLang 0.5.17 and 0.5.23 (`sglang/srt/disaggregation/decode.py`, `common/conn.py`,
`environ.py`); the variables' defaults are in pdkit/upstream/parser_table.json, generated from the wheels.
Standard library only: the sim engine imports this on nodes, whose venv has no pydantic
(pdkit/wheels/locks/node.txt). pdkit.spec.faultbudget decides the values; pdkit.sim.bootstrap waits by them.
"""

from __future__ import annotations

# SGLang's own floors (sglang/srt/disaggregation/common/conn.py, CommonKVManager.__init__, 0.5.17
# and 0.5.23): `max(HEARTBEAT_INTERVAL, 2.0)` and `max(HEARTBEAT_MAX_FAILURE, 1)`.
SGLANG_MIN_HEARTBEAT_INTERVAL_S = 2.0
# The decode's heartbeat GET to a prefill's bootstrap server: `timeout=(2, 3)` (connect, read).
SGLANG_HEARTBEAT_CONNECT_TIMEOUT_S = 2.0
SGLANG_HEARTBEAT_READ_TIMEOUT_S = 3.0
# A decode that cannot reach a prefill's bootstrap server before the handshake retries every
# second, 15 times, then aborts the requests for it (decode.py: `_max_ensure_retries = 15`,
# `_ensure_retry_interval = 1.0`; each try is `requests.get(..., timeout=5)`). Not configurable.
SGLANG_ENSURE_ATTEMPTS = 15
SGLANG_ENSURE_INTERVAL_S = 1.0
SGLANG_ENSURE_TRY_TIMEOUT_S = 5.0

# The SGLang variable behind each pdkit.spec.faultbudget.FaultBudget field (the sim reads the
# same names: pdkit/sim/knobs.py).
ENGINE_VARIABLES = {
    "heartbeat_interval_s": "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL",
    "heartbeat_max_failures": "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
    "waiting_timeout_s": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "bootstrap_timeout_s": "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
}


# (release, transfer backend) whose PD prefill never checks SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT:
# 0.5.17's NixlKVSender leaves init_time unset and its poll() never calls _check_bootstrap_timeout
# (nixl/conn.py:2702-2773; common/conn.py:1204 returns at once while init_time is None), so a request
# whose decode never sends its slots waits at the prefill until it is aborted. The kit's validate
# (pdkit/spec/faultbudget.py) and the sim (pdkit/sim/engine.py) both follow this.
NO_PREFILL_BOOTSTRAP_TIMEOUT = frozenset({("0.5.17", "nixl")})
