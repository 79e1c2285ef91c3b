"""The sim's Prefill/Decode batch log lines against SGLang's own: the `#key:` labels of the f-string
source read from each pinned wheel (the metric catalogue's log_formats, pdkit/contract/sglang_metrics.py),
and the whole key sequence of the lines real SGLang 0.5.17 engines wrote (tests/fixtures/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdkit.sim.logs import format_decode_batch, format_keys, format_prefill_batch, line_keys
from pdkit.upstream import catalogue

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "sglang-0.5.17-h200-pd-one-gpu"
SIM_LINES = {
    "Prefill batch": format_prefill_batch(2, 40, 0.01, 0, 1, True, 123.4, pd_prefill_queues=(1, 2)),
    "Decode batch": format_decode_batch(3, 700, 0.02, True, 55.5, 0, pd_decode_queues=(0, 4)),
}


def in_order(wanted: list[str], keys: list[str]) -> bool:
    it = iter(keys)
    return all(any(k == w for k in it) for w in wanted)


@pytest.mark.parametrize("version", catalogue.SGLANG_VERSIONS)
def test_sim_lines_carry_the_wheels_keys_in_order(version):
    formats = catalogue.log_formats(version)
    assert set(formats) == set(SIM_LINES)
    for kind, source in formats.items():
        wanted = format_keys(source)
        assert wanted, (kind, source)
        assert SIM_LINES[kind].startswith(kind)
        assert in_order(wanted, line_keys(SIM_LINES[kind])), (version, kind, wanted, SIM_LINES[kind])


@pytest.mark.parametrize("kind,log", [("Prefill batch", "base-pdkit-engine-prefill.log"),
                                      ("Decode batch", "base-pdkit-engine-decode.log")])
def test_sim_lines_have_the_real_0517_key_sequence(kind, log):
    real = {tuple(line_keys(m.group(0))) for m in re.finditer(rf"{kind}, .*$", (REAL / log).read_text(), re.M)}
    assert len(real) == 1, real  # one shape per engine role in the recorded run
    assert tuple(line_keys(SIM_LINES[kind])) in real


def test_the_order_check_can_fail():
    source = catalogue.log_formats(catalogue.SGLANG_VERSIONS[0])["Prefill batch"]
    old = SIM_LINES["Prefill batch"].replace("#pending-token: 0, ", "")
    assert not in_order(format_keys(source), line_keys(old))
