"""The GPU tier's driver runs exactly what pdkit renders: its systemd parsing must invert pdkit's quoting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "gpu"))

import device_driver as drv  # noqa: E402

from pdkit.inventory.loader import load  # noqa: E402
from pdkit.render import flags  # noqa: E402
from pdkit.render.plan import exec_start, plan_host  # noqa: E402


@pytest.mark.parametrize("argv", [
    ["/opt/x/python", "-m", "sglang.launch_server", "--model-path", "/m", "--port", "30000"],
    ["/p", "-m", "m", "--json", '{"a": "b c"}', "--pct", "50%", "--dollar", "$HOME", "--quote", 'say "hi"', "--bs", "1", "2"],
])
def test_systemd_split_inverts_exec_start(argv):
    unit = "[Service]\nExecStart=" + exec_start(argv) + "\nRestart=on-failure\n"
    (value,) = drv.unit_values(unit, "ExecStart")
    assert drv.systemd_split(value) == argv


def test_h200_units_parse_back_to_the_rendered_argv():
    spec = load(REPO / "inventories" / "h200.py", cwd=str(REPO))
    host = spec.gpu_hosts[0]
    plan = plan_host(spec, host)
    for engine in host.node.engines:
        unit = plan.file(f"/etc/systemd/system/{engine.unit_name}").content
        (value,) = drv.unit_values(unit, "ExecStart")
        assert drv.systemd_split(value) == flags.engine_command(spec, host, engine)
        for path in drv.unit_values(unit, "EnvironmentFile"):
            env = drv.env_file_vars(plan.file(path).content)
            if path.endswith(f"{engine.name}.env"):
                assert env["SGLANG_DISAGGREGATION_NIXL_BACKEND"] == "UCX"
    router = plan.file("/etc/systemd/system/pdkit-router.service").content
    (value,) = drv.unit_values(router, "ExecStart")
    argv = drv.systemd_split(value)
    assert argv == flags.router_command(spec, host)
    # sglang-router 0.3.2 exits at start with power_of_two and a single decode worker (docs/gpu.md)
    assert argv[argv.index("--decode-policy") + 1] != "power_of_two"


def test_env_file_values_unquote():
    assert drv.env_file_vars('# c\nA=1\nB="x \\"y\\""\n\nC=a=b\n') == {"A": "1", "B": 'x "y"', "C": "a=b"}


def _kv_page(hand_offs: list[tuple[float, float]]) -> str:
    """A prefill's /metrics page holding the three KV histograms after these (latency ms, MiB) hand-offs."""
    series = {"sglang:kv_transfer_latency_ms": [lat for lat, _ in hand_offs],
              "sglang:kv_transfer_total_mb": [mib for _, mib in hand_offs],
              "sglang:kv_transfer_speed_gb_s": [mib / 1024 / (lat / 1000) for lat, mib in hand_offs]}
    lines = []
    for family, values in series.items():
        lines.append(f"# TYPE {family} histogram")
        for le in (100.0, 1000.0):
            lines.append(f'{family}_bucket{{le="{le}"}} {sum(v <= le for v in values)}')
        lines += [f'{family}_bucket{{le="+Inf"}} {len(values)}', f"{family}_sum {sum(values)}",
                  f"{family}_count {len(values)}"]
    return "\n".join(lines) + "\n"


def test_kv_report_gives_each_run_the_hand_offs_made_during_it(tmp_path, capsys):
    """Issue 33: the bench loop saves each engine's page before and after each run under the run's
    tag; the report subtracts them, so two runs of one phase get their own figures."""
    import io
    import json
    import tarfile

    import run_gpu_tier

    bench = {"input_len": 128}
    runs = [{"concurrency": 1, "input_len": 3072}, {"concurrency": 16, "input_len": 3072}, {"concurrency": 16}]
    tags = [drv.run_tag("kv_tcp", r, bench) for r in runs]
    assert tags == ["kv_tcp-c1-in3072", "kv_tcp-c16-in3072", "kv_tcp-c16"]
    first = [(500.0, 192.0)] * 4  # the C=1 run's hand-offs; then 32 more of 2,000 ms at C=16
    pages = {  # cumulative, as the engine exports them; before its first hand-off SGLang has no KV series
        "run-kv_tcp-c1-in3072-prefill-before.txt": "# no KV histograms yet\n",
        "run-kv_tcp-c1-in3072-prefill-after.txt": _kv_page(first),
        "run-kv_tcp-c16-in3072-prefill-before.txt": _kv_page(first),
        "run-kv_tcp-c16-in3072-prefill-after.txt": _kv_page(first + [(2000.0, 192.0)] * 32),
    }
    with tarfile.open(tmp_path / "logs.tar.xz", "w:xz") as tar:
        for name, text in pages.items():
            info = tarfile.TarInfo(f"logs/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    row = {"max_concurrency": 1, "completed": 4, "total_input_tokens": 4 * 3072, "median_ttft_ms": 520.0,
           "p99_ttft_ms": 560.0, "mean_ttft_ms": 530.0, "output_throughput": 90.0}
    res = {"phases": {"kv_tcp": {"bench": [
        {**row, "tag": tags[0]},
        {**row, "tag": tags[1], "max_concurrency": 16, "completed": 32, "total_input_tokens": 32 * 3072,
         "mean_ttft_ms": 4000.0},
        {**row, "tag": tags[2], "max_concurrency": 16, "completed": 32, "total_input_tokens": 32 * 128}]}},
        "failures": []}
    (tmp_path / "results.json").write_text(json.dumps(res))
    run_gpu_tier.kv_report(tmp_path, res)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| kv_tcp")]
    assert len(rows) == 3
    c1, c16, short = ([c.strip() for c in r.strip("|").split("|")] for r in rows)
    # C=1: 4 hand-offs of 192 MiB in 500 ms each: 0.375 GB/s, 94% of a 530 ms TTFT; p99 interpolated in (100, 1000]
    assert c1[2] == "3072" and c1[5:8] == ["4", "192", "500.0 / 991"] and c1[8] == "0.38" and c1[10] == "94%"
    # C=16: only the 32 made during that run (2,000 ms each), the past top bucket flagged as a floor
    assert c16[5:8] == ["32", "192", "2000.0 / >1000"] and c16[8] == "0.09" and c16[10] == "50%"
    # a run with no saved pages shows no KV figures rather than another run's
    assert short[2] == "128" and short[5:] == ["-"] * 6
