"""Record the /metrics pages doctor's prefix_cache row reads, from a sim PD pair serving multi-turn sessions.

    .venv/bin/python -m tests.doctor_data.capture_prefix_cache

Writes tests/doctor_data/sim_prefix_cache/<case>/{prefill,decode}.metrics{1,2}.txt for two cases: the decode
without a radix cache (SGLang's default: `no_decode_cache`) and with --disaggregation-decode-enable-radix-cache
(`decode_radix_cache`). Each: a sim prefill and decode (pdkit.sim, SGLang 0.5.23's pages), 8 sessions whose
first turn (a 2,000-token shared system prompt and 200 tokens of their own) is served before the first page;
then every session's second turn (the first turn again and 300 new tokens) between the first and the second
page, as doctor's window. What the pages then say (the sim's model: docs/sim.md "Decode radix cache (PD)"):
the prefill's cache serves 2,200 of each second turn's 2,500 tokens either way; without the decode's cache
every hand-off carries all 2,500 tokens' KV (64 KiB each), with it the 300 new ones. Not a test: the tests
read what it wrote (tests/test_doctor.py, the prefix_cache row).
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.sim.support import SIM_TEST_ENV, Processes, free_ports, get, post, start_sim

OUT = Path(__file__).resolve().parent / "sim_prefix_cache"
SESSIONS = 8
SYSTEM, FIRST, SECOND = 2000, 200, 300


def ids(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def pd_turn(prefill: str, decode: str, bootstrap_port: int, room: int, input_ids: list[int]) -> None:
    """One request as the router sends it to a PD pair: the same body, with the bootstrap fields, to both."""
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 3}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap_port, "bootstrap_room": room}
    with ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(post, f"{u}/generate", body, 30.0) for u in (prefill, decode)]
        for leg in legs:
            resp = leg.result()
            if resp.status_code != 200:
                raise SystemExit(f"{resp.url}: {resp.status_code} {resp.text[:200]}")


def capture(case: str, decode_cache: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        procs = Processes(Path(tmp))
        try:
            prefill_port, bootstrap_port, decode_port = free_ports(3)
            env = {**SIM_TEST_ENV, "PDKIT_SIM_SGLANG_VERSION": "0.5.23"}
            start_sim(procs, "prefill", "prefill", prefill_port, bootstrap_port, env=env)
            start_sim(procs, "decode", "decode", decode_port,
                      extra=["--disaggregation-decode-enable-radix-cache"] if decode_cache else [], env=env)
            urls = {"prefill": f"http://127.0.0.1:{prefill_port}", "decode": f"http://127.0.0.1:{decode_port}"}
            system = ids(SYSTEM, 10)
            first = [system + ids(FIRST, 100_000 + 1000 * s) for s in range(SESSIONS)]
            for s, prompt in enumerate(first):
                pd_turn(urls["prefill"], urls["decode"], bootstrap_port, 1 + s, prompt)
            pages = {role: [get(f"{url}/metrics").text] for role, url in urls.items()}
            for s, prompt in enumerate(first):
                pd_turn(urls["prefill"], urls["decode"], bootstrap_port, 100 + s,
                        prompt + ids(SECOND, 500_000 + 1000 * s))
            for role, url in urls.items():
                pages[role].append(get(f"{url}/metrics").text)
        finally:
            procs.stop_all()
    where = OUT / case
    where.mkdir(parents=True, exist_ok=True)
    for role, (one, two) in pages.items():
        (where / f"{role}.metrics1.txt").write_text(one)
        (where / f"{role}.metrics2.txt").write_text(two)
    print(f"wrote {where}")


def main(argv: list[str]) -> int:
    capture("no_decode_cache", decode_cache=False)
    capture("decode_radix_cache", decode_cache=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
