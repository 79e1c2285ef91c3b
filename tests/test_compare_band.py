"""`pdkit bench --repeats` and `pdkit compare` against the baseline's spread (issue 43, item 4)."""

from __future__ import annotations

import copy
import json

import pytest

from pdkit.bench.noise import DEFAULT_MARGIN, record_runs, side, with_repeats
from pdkit.bench.report import render_compare, render_markdown
from pdkit.cli import build_parser, main
from tests.conftest import write_inventory


def record(run_id: str, tok_s: float, ttft_p50: float = 10.0, c: int = 16) -> dict:
    level = {"concurrency": c, "requests": 8, "completed": 8, "errors": 0, "error_samples": [], "duration_s": 1.0,
             "input_tokens": 64, "output_tokens": 128, "output_tok_s": tok_s, "requests_s": 8.0,
             "ttft_ms": {"mean": ttft_p50, "p50": ttft_p50, "p99": 20.0}, "tpot_ms": {"mean": 5.0, "p50": 5.0, "p99": 6.0},
             "itl_ms": {"mean": 5.0, "p50": 5.0, "p99": 9.0}, "e2e_ms": {"mean": 50.0, "p50": 50.0, "p99": 60.0}}
    return {"schema": 1, "id": run_id, "label": "", "time": "2026-11-29T00:00:00+00:00", "tool": "pdkit",
            "inventory": "inv.py", "cluster": "c", "model": "m", "router_url": "http://r:8000", "input_len": 8,
            "output_len": 16, "requests": 8, "warmup": 0, "levels": [level],
            "env": {"spec_hash": "a" * 64, "engine": "sim", "sglang_versions": ["0.5.23"], "router": "smg 1.13.0",
                    "gpus": [], "engine_flags": {"h/decode": ["--x"]}}}


def repeated_baseline() -> dict:
    """A benched 3 times: output tok/s 100, 104, 98 (median 100, spread 6%); TTFT p50 10, 10, 11 (10%)."""
    return with_repeats([record("a1", 100.0), record("a2", 104.0), record("a3", 98.0, ttft_p50=11.0)])


def row(text: str, metric: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| 16 | {metric} |")]
    return line


def test_with_repeats_keeps_run_one_and_the_later_runs_levels():
    a = repeated_baseline()
    assert a["id"] == "a1" and a["levels"][0]["output_tok_s"] == 100.0
    assert [run[0]["output_tok_s"] for run in a["repeats"]] == [104.0, 98.0]
    assert [run[0]["output_tok_s"] for run in record_runs(a)] == [100.0, 104.0, 98.0]
    assert "repeats" not in with_repeats([record("x", 1.0)])


def test_b_within_the_band_is_within_the_noise():
    text = render_compare(repeated_baseline(), record("b", 105.0))  # +5% < 6% + 2%
    assert "| C | metric | A | B | B/A | beyond A's spread? |" in text
    assert row(text, "output tok/s") == ("| 16 | output tok/s | 100.0 | 105.0 | 1.05 | no, within the noise "
                                         "(+5.0%; spread 6.0% + 2.0%) |")
    assert "- A's spread over its 3 runs" in text
    assert "  - C=16: output tok/s 6.0%, req/s 0.0%, TTFT p50 ms 10.0%," in text
    assert row(text, "ITL p50 ms").endswith("| 1.00 | – |")  # no band kept for ITL


def test_b_beyond_the_band_is_better_or_worse_by_the_figures_direction():
    text = render_compare(repeated_baseline(), record("b", 120.0, ttft_p50=13.0))
    assert row(text, "output tok/s").endswith("| yes, better (+20.0%; spread 6.0% + 2.0%) |")
    assert row(text, "TTFT p50 ms").endswith("| yes, worse (-30.0%; spread 10.0% + 2.0%) |")
    slower = render_compare(repeated_baseline(), record("b", 80.0))
    assert row(slower, "output tok/s").endswith("| yes, worse (-20.0%; spread 6.0% + 2.0%) |")


def test_the_margin_moves_the_verdict():
    a, b = repeated_baseline(), record("b", 109.0)  # +9%: beyond 6% + 2%, within 6% + 5%
    assert "yes, better" in row(render_compare(a, b), "output tok/s")
    assert "no, within the noise (+9.0%; spread 6.0% + 5.0%)" in row(render_compare(a, b, 0.05), "output tok/s")


def test_a_single_run_says_the_spread_is_unknown_and_gives_no_verdict():
    text = render_compare(record("a", 100.0), record("b", 300.0))
    assert "- A's spread: unknown, A was benched once" in text and "--repeats 3" in text
    assert "beyond A's spread?" not in text and "better" not in text
    assert row(text, "output tok/s") == "| 16 | output tok/s | 100.0 | 300.0 | 3.00 |"  # the table as before


def test_b_repeated_too_is_judged_by_its_median():
    b = with_repeats([record("b1", 120.0), record("b2", 101.0), record("b3", 103.0)])  # median 103
    text = render_compare(repeated_baseline(), b)
    assert "B's median over its 3 runs against A's median" in text
    assert row(text, "output tok/s").endswith("| 1.20 | no, within the noise (+3.0%; spread 6.0% + 2.0%) |")


def test_side_names_worse_only_beyond_the_band():
    assert side({"gain": -0.09, "spread": 0.06, "margin": 0.02, "beyond": False}) == "worse"
    assert side({"gain": -0.07, "spread": 0.06, "margin": 0.02, "beyond": False}) == "within the noise"
    assert side({"gain": 0.5, "spread": None, "margin": 0.02, "beyond": None}) is None


def test_the_run_markdown_shows_the_spread_of_a_repeated_bench():
    text = render_markdown(repeated_baseline())
    assert "Benched 3 times (--repeats 3): the table is run 1" in text
    assert "- C=16: output tok/s 100.0 (spread 6.0% of 3 runs); req/s 8.0 (spread 0.0% of 3 runs)" in text
    assert "Benched" not in render_markdown(record("a", 100.0))


def test_parser_takes_repeats_and_margin_with_one_default_margin():
    from pdkit.tune.campaign import Noise

    parser = build_parser()
    assert parser.parse_args(["bench", "inv.py"]).repeats == 1
    assert parser.parse_args(["bench", "inv.py", "--repeats", "3"]).repeats == 3
    assert parser.parse_args(["bench", "inv.py", "--repeats", "10"]).repeats == 10
    assert parser.parse_args(["compare", "a", "b"]).margin == DEFAULT_MARGIN == Noise().margin == 0.02
    assert parser.parse_args(["compare", "a", "b", "--margin", "0.05"]).margin == 0.05


REPEATS_REFUSED = "--repeats takes a whole number from 1 to 10"
MARGIN_REFUSED = "--margin takes a fraction from 0 to 1"


@pytest.mark.parametrize("argv, message", [
    (["bench", "inv.py", "--repeats", "0"], REPEATS_REFUSED), (["bench", "inv.py", "--repeats", "11"], REPEATS_REFUSED),
    (["bench", "inv.py", "--repeats", "two"], REPEATS_REFUSED), (["compare", "a", "b", "--margin", "-0.1"], MARGIN_REFUSED),
    (["compare", "a", "b", "--margin", "2"], MARGIN_REFUSED)])
def test_parser_refuses_out_of_range(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_repeats_runs_the_sweep_n_times_and_records_the_runs(base, tmp_path, monkeypatch, capsys):
    import pdkit.bench.cli as bench_cli

    cluster, hosts = base
    inventory = write_inventory(tmp_path, hosts, cluster)
    figures = iter([100.0, 104.0, 98.0])
    calls = []

    def fake_run_bench(spec, **kw):
        calls.append(kw)
        return record(f"r{len(calls)}", next(figures))

    monkeypatch.setattr(bench_cli, "run_bench", fake_run_bench)
    out = tmp_path / "out"
    rc = main(["bench", str(inventory), "--repeats", "3", "--no-ssh", "--no-plot", "--quiet", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert len(calls) == 3
    for i in (1, 2, 3):
        assert f"repeat {i}/3: C=1,16,64" in captured.err
    assert "repeat 2/3 done: C=16 104.0 tok/s" in captured.err
    (line,) = (out / "runs.jsonl").read_text().splitlines()
    saved = json.loads(line)
    assert saved["id"] == "r1" and saved["levels"][0]["output_tok_s"] == 100.0
    assert [run[0]["output_tok_s"] for run in saved["repeats"]] == [104.0, 98.0]
    assert "Benched 3 times" in captured.out
    # and compare reads the spread back from the file
    b = tmp_path / "b.json"
    b.write_text(json.dumps(record("b", 120.0)))
    assert main(["compare", str(out / "runs.jsonl"), str(b), "--runs", str(out / "runs.jsonl")]) == 0
    assert "| 16 | output tok/s | 100.0 | 120.0 | 1.20 | yes, better (+20.0%; spread 6.0% + 2.0%) |" in (
        capsys.readouterr().out)


def test_bench_repeats_refuses_the_agentic_workload(base, tmp_path, capsys):
    cluster, hosts = base
    inventory = write_inventory(tmp_path, hosts, cluster)
    rc = main(["bench", str(inventory), "--workload", "agentic", "--repeats", "2", "--no-ssh",
               "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "--repeats with the agentic workload is not supported yet" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bench_once_keeps_the_record_as_before(base, tmp_path, monkeypatch, capsys):
    import pdkit.bench.cli as bench_cli

    cluster, hosts = base
    inventory = write_inventory(tmp_path, hosts, cluster)
    monkeypatch.setattr(bench_cli, "run_bench", lambda spec, **kw: copy.deepcopy(record("r1", 100.0)))
    out = tmp_path / "out"
    assert main(["bench", str(inventory), "--no-ssh", "--no-plot", "--quiet", "--out", str(out)]) == 0
    assert "repeat" not in capsys.readouterr().err
    assert "repeats" not in json.loads((out / "runs.jsonl").read_text())
