"""The contract checkers can say no and can say yes, with the real parsers.

Each sglang version's argvs go to its parser in one subprocess (module-scoped cache);
a version whose virtualenv is missing is skipped with the command that builds it
(`bash .ci/contract-env.sh`).
"""

from __future__ import annotations

import pytest

from pdkit.contract import check_router_argvs, run_router_check, run_sglang_check
from pdkit.upstream.venvs import ContractEnvMissing, contract_home

pytestmark = pytest.mark.contract

SGLANG_VERSIONS = ("0.5.17", "0.5.23")

COMMON = [
    "--model-path", "/models/llama-1b",
    "--served-model-name", "llama-1b",
    "--trust-remote-code",
    "--load-format", "dummy",
    "--host", "0.0.0.0",
    "--tp-size", "2",
    "--base-gpu-id", "0",
    "--gpu-id-step", "1",
    "--numa-node", "0", "0", "0", "0", "1", "1", "1", "1",
    "--mem-fraction-static", "0.85",
    "--page-size", "16",
    "--chunked-prefill-size", "8192",
    "--max-running-requests", "128",
    "--attention-backend", "flashinfer",
    "--kv-cache-dtype", "auto",
    "--quantization", "fp8",
    "--enable-metrics",
    "--log-level", "info",
    "--decode-log-interval", "40",
    "--watchdog-timeout", "600",
    "--disable-custom-all-reduce",
    "--api-key", "not-a-real-key",
    "--disaggregation-transfer-backend", "nixl",
    "--disaggregation-bootstrap-port", "8998",
]  # fmt: skip

PREFILL = COMMON + [
    "--port", "30000",
    "--disaggregation-mode", "prefill",
    "--cuda-graph-backend-prefill", "disabled",
    "--moe-runner-backend", "auto",
]  # fmt: skip

DECODE = COMMON + [
    "--port", "30001",
    "--disaggregation-mode", "decode",
    "--cuda-graph-backend-decode", "full",
    "--cuda-graph-max-bs-decode", "256",
    "--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "32", "64", "128", "256",
    "--max-queued-requests", "512",
    "--num-reserved-decode-tokens", "512",
    "--num-continuous-decode-steps", "1",
]  # fmt: skip

SPECULATIVE = DECODE + [
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip

# name -> (argv, {version: None (accepted) | substring of the error})
SGLANG_CASES: dict[str, tuple[list[str], dict[str, str | None]]] = {
    "prefill": (PREFILL, {"0.5.17": None, "0.5.23": None}),
    "decode": (DECODE, {"0.5.17": None, "0.5.23": None}),
    "speculative_nextn": (SPECULATIVE, {"0.5.17": None, "0.5.23": None}),
    "invalid_choice_nixel": (
        PREFILL + ["--disaggregation-transfer-backend", "nixel"],
        dict.fromkeys(SGLANG_VERSIONS, "argument --disaggregation-transfer-backend: invalid choice: 'nixel'"),
    ),
    "unknown_flag": (
        DECODE + ["--enable-warp-drive"],
        dict.fromkeys(SGLANG_VERSIONS, "unrecognized arguments: --enable-warp-drive"),
    ),
    "bad_int": (
        ["--model-path", "/m", "--tp-size", "two"],
        dict.fromkeys(SGLANG_VERSIONS, "argument --tp-size/--tensor-parallel-size: invalid int value: 'two'"),
    ),
    "bad_log_level": (
        ["--model-path", "/m", "--log-level", "loud"],
        dict.fromkeys(SGLANG_VERSIONS, "'loud' is not a logging level"),
    ),
    "ambiguous_prefix": (
        ["--model-path", "/m", "--disaggregation", "prefill"],
        dict.fromkeys(SGLANG_VERSIONS, "ambiguous option: --disaggregation could match"),
    ),
    "mtp_is_not_an_algorithm": (
        DECODE + ["--speculative-algorithm", "MTP", "--speculative-num-steps", "3"],
        dict.fromkeys(SGLANG_VERSIONS, "Unknown speculative algorithm name: MTP"),
    ),
    # Renamed to --cuda-graph-max-bs-decode: a deprecated alias in 0.5.17, gone in
    # 0.5.23, where argparse's prefix matching makes it ambiguous.
    "old_cuda_graph_max_bs": (
        DECODE + ["--cuda-graph-max-bs", "256"],
        {
            "0.5.17": None,
            "0.5.23": "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
        },
    ),
    "old_cuda_graph_bs": (
        DECODE + ["--cuda-graph-bs", "1", "2", "4"],
        {"0.5.17": None, "0.5.23": "ambiguous option: --cuda-graph-bs could match --cuda-graph-bs-decode, --cuda-graph-bs-prefill"},
    ),
    "old_disable_piecewise_cuda_graph": (
        PREFILL + ["--disable-piecewise-cuda-graph"],
        {"0.5.17": None, "0.5.23": "unrecognized arguments: --disable-piecewise-cuda-graph"},
    ),
    "tc_piecewise_backend": (
        PREFILL + ["--cuda-graph-backend-prefill", "tc_piecewise"],
        {"0.5.17": None, "0.5.23": "tc_piecewise was removed"},
    ),
    # the algorithm name is checked the way resolution does (alias map, then from_string)
    "uno_algorithm": (
        DECODE + ["--speculative-algorithm", "UNO"],
        {"0.5.17": "Unknown speculative algorithm name: UNO", "0.5.23": None},
    ),
    "disable_cuda_graph_still_accepted": (DECODE + ["--disable-cuda-graph"], {"0.5.17": None, "0.5.23": None}),
    "help_is_not_a_launch": (["--help"], dict.fromkeys(SGLANG_VERSIONS, "status 0")),
}

_replies: dict[str, dict] = {}


def _sglang_reply(version: str) -> dict:
    if version not in _replies:
        names = list(SGLANG_CASES)
        try:
            reply = run_sglang_check(version, [SGLANG_CASES[n][0] for n in names], describe=True)
        except ContractEnvMissing as exc:
            pytest.skip(str(exc))
        _replies[version] = {"cases": dict(zip(names, reply["results"])), "options": reply["options"]}
    return _replies[version]["cases"]


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
@pytest.mark.parametrize("case", list(SGLANG_CASES))
def test_sglang_parser_verdict(version: str, case: str) -> None:
    result = _sglang_reply(version)[case]
    expected = SGLANG_CASES[case][1][version]
    if expected is None:
        assert result["ok"], f"sglang {version} rejected {case}: {result['error']}"
        assert result["error"] is None
    else:
        assert not result["ok"], f"sglang {version} accepted {case}"
        assert expected in result["error"], result["error"]


def test_sglang_0_5_17_warns_about_old_spellings() -> None:
    replies = _sglang_reply("0.5.17")
    assert any("--cuda-graph-max-bs-decode" in w for w in replies["old_cuda_graph_max_bs"]["warnings"])
    assert any("--cuda-graph-backend-prefill=disabled" in w for w in replies["old_disable_piecewise_cuda_graph"]["warnings"])


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_disable_cuda_graph_is_deprecated(version: str) -> None:
    warnings = _sglang_reply(version)["disable_cuda_graph_still_accepted"]["warnings"]
    assert any("'--disable-cuda-graph' is deprecated" in w for w in warnings), warnings


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_describe_lists_pd_flags(version: str) -> None:
    _sglang_reply(version)
    options = {flag: o for o in _replies[version]["options"] for flag in o["flags"]}
    assert options["--disaggregation-transfer-backend"]["choices"] == ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]
    assert options["--disaggregation-bootstrap-port"]["default"] == 8998
    assert "--cuda-graph-max-bs-decode" in options


# --- routers --------------------------------------------------------------------------

PD_ROUTER = [
    "--pd-disaggregation",
    "--prefill", "http://127.0.0.1:30000", "8998",
    "--prefill", "http://127.0.0.1:30002", "8999",
    "--decode", "http://127.0.0.1:30001",
    "--prefill-policy", "cache_aware",
    "--decode-policy", "power_of_two",
    "--host", "127.0.0.1",
    "--port", "8000",
    "--prometheus-host", "127.0.0.1",
    "--prometheus-port", "29000",
    "--health-check-interval-secs", "10",
    "--health-failure-threshold", "3",
    "--log-level", "info",
    "--request-timeout-secs", "1800",
]  # fmt: skip

# package -> version -> [(argv, None | substring of the error)]
ROUTER_CASES = {
    ("smg", "1.13.0"): [
        (["launch", *PD_ROUTER, "--remove-unhealthy-workers"], None),
        (["launch", *PD_ROUTER, "--prefill-policy", "fastest"], "argument --prefill-policy: invalid choice: 'fastest'"),
        # the Rust CLI's --drain-settle-secs / --engine-metrics are not in the Python launcher
        (["launch", *PD_ROUTER, "--drain-settle-secs", "5", "--engine-metrics"], "unrecognized arguments: --drain-settle-secs 5 --engine-metrics"),
        (["launch", "--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "boot", "--decode", "http://127.0.0.1:30001"], "Invalid bootstrap port: boot"),
        (PD_ROUTER, "status 1"),  # no subcommand: smg prints its help and exits 1
    ],
    ("sglang-router", "0.3.2"): [
        (PD_ROUTER, None),
        (PD_ROUTER + ["--decode-policy", "least_load"], "argument --decode-policy: invalid choice: 'least_load'"),
        (PD_ROUTER + ["--remove-unhealthy-workers"], "unrecognized arguments: --remove-unhealthy-workers"),
        (["launch", *PD_ROUTER], "unrecognized arguments: launch"),
    ],
}


@pytest.mark.parametrize("package,version", list(ROUTER_CASES))
def test_router_parser_verdicts(package: str, version: str) -> None:
    cases = ROUTER_CASES[(package, version)]
    try:
        verdicts = check_router_argvs(package, version, [argv for argv, _ in cases])
    except ContractEnvMissing as exc:
        pytest.skip(str(exc))
    for (argv, expected), verdict in zip(cases, verdicts):
        if expected is None:
            assert verdict is None, f"{package} {version} rejected {argv}: {verdict}"
        else:
            assert verdict is not None, f"{package} {version} accepted {argv}"
            assert expected in verdict, verdict


def test_router_describe_has_pd_flags() -> None:
    try:
        reply = run_router_check("smg", "1.13.0", [], describe=True)
    except ContractEnvMissing as exc:
        pytest.skip(str(exc))
    flags = {flag for o in reply["options"] for flag in o["flags"]}
    assert {"--pd-disaggregation", "--prefill", "--decode", "--prometheus-port", "--remove-unhealthy-workers"} <= flags


def test_missing_env_names_the_script(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PDKIT_CONTRACT_HOME", str(tmp_path))
    assert contract_home() == tmp_path
    with pytest.raises(ContractEnvMissing, match=r"bash \.ci/contract-env\.sh"):
        run_sglang_check("0.5.23", [["--model-path", "/m"]])
    with pytest.raises(ContractEnvMissing, match="smg-1.13.0"):
        check_router_argvs("smg", "1.13.0", [["launch"]])


@pytest.mark.parametrize("package,version", list(ROUTER_CASES))
def test_rendered_router_argv_with_its_drain_flag_is_accepted_by_the_routers_parser(package, version, base, tmp_path):
    """pdkit.render.flags.router_args (with --shutdown-grace-period-secs from the spec) through the pinned
    router's own parser; the flag's spelling is the parser's (pdkit/upstream/parser_table.json, generated from it)."""
    from pdkit.inventory.loader import load
    from pdkit.render import flags
    from pdkit.upstream import parsertable
    from tests.conftest import require, write_inventory

    cluster, hosts = base
    hosts["gpu01"]["pdkit_router"].update(package=package, version=version, shutdown_grace_period_secs=45)
    spec = load(write_inventory(tmp_path, hosts, cluster))
    host = spec.host("gpu01")
    argv = flags.router_args(spec, host)
    assert argv[argv.index("--shutdown-grace-period-secs") + 1] == "45"
    options = {f for o in parsertable.table()["router"][f"{package} {version}"]["options"] for f in o["flags"]}
    assert "--shutdown-grace-period-secs" in options
    assert flags.router_stop_timeout_s(host) > 45
    try:
        verdicts = check_router_argvs(package, version, [(["launch"] if package == "smg" else []) + argv])
    except ContractEnvMissing as exc:
        require(False, str(exc))
        return
    assert verdicts == [None], verdicts
