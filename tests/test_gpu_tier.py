"""The GPU tier's driver runs exactly what pdkit renders: its systemd parsing must invert pdkit's quoting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "gpu"))

import device_driver as drv  # noqa: E402

from pdkit import flags  # noqa: E402
from pdkit.loader import load  # noqa: E402
from pdkit.plan import exec_start, plan_host  # noqa: E402


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
