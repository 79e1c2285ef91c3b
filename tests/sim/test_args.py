"""The sim's command line agrees with SGLang's on the flags it uses and tolerates the rest."""

from __future__ import annotations

import subprocess

import pytest

from pdkit.sim.args import build_parser, check_argv, parse_args

from .support import PYTHON

KIT_PREFILL_ARGV = (
    "--model-path /models/x --served-model-name x --host 0.0.0.0 --port 30000 --tp-size 4 --base-gpu-id 0 "
    "--disaggregation-mode prefill --disaggregation-transfer-backend nixl --disaggregation-bootstrap-port 8998 "
    "--mem-fraction-static 0.88 --context-length 8192 --enable-metrics --cuda-graph-max-bs-decode 32 "
    "--num-continuous-decode-steps 4 --trust-remote-code"
).split()


def test_kit_rendered_prefill_argv_is_accepted():
    args = parse_args(KIT_PREFILL_ARGV)
    assert (args.mode, args.engine_type, args.host, args.port) == ("prefill", "prefill", "0.0.0.0", 30000)
    assert (args.tp_size, args.context_length, args.bootstrap_port, args.enable_metrics) == (4, 8192, 8998, True)
    assert args.served_model_name == "x"
    assert not args.cuda_graphs.decode_enabled  # a PD prefill never captures decode graphs


def test_defaults_are_sglangs():
    ns = build_parser().parse_args(["--model-path", "m"])
    assert ns.host == "127.0.0.1" and ns.port == 30000
    assert ns.disaggregation_mode == "null" and ns.disaggregation_transfer_backend == "mooncake"
    assert ns.disaggregation_bootstrap_port == 8998 and ns.decode_log_interval == 40
    assert ns.num_reserved_decode_tokens == 512 and ns.watchdog_timeout == 300 and ns.log_level == "info"
    assert parse_args(["--model-path", "m"]).served_model_name == "m"


@pytest.mark.parametrize("unknown", [
    ["--enable-torch-compile"],                                   # no value
    ["--schedule-conservativeness", "0.3"],                       # one value
    ["--json-model-override-args", '{"a": 1}'],                   # one value, JSON
    ["--lora-paths", "a=/x", "b=/y", "c=/z"],                     # several values
    ["--some-future-flag=with-equals"],
    ["--offset", "-1"],                                           # negative number value
])
def test_unknown_sglang_flags_are_accepted_and_reported(unknown):
    args = parse_args(["--model-path", "m", *unknown, "--port", "31000"])
    assert args.port == 31000
    assert list(args.ignored) == unknown


def test_known_but_unmodelled_flags_with_many_values():
    args = parse_args(["--model-path", "m", "--numa-node", "0", "0", "0", "0", "1", "1", "1", "1",
                       "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                       "--mem-fraction-static", "0.88", "--num-continuous-decode-steps", "4"])
    assert args.server["numa_node"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert args.server["speculative_algorithm"] == "NEXTN"


def test_old_cuda_graph_spelling():
    plan = parse_args(["--model-path", "m", "--cuda-graph-max-bs", "16"]).cuda_graphs
    assert plan.decode_enabled and plan.decode_max_bs == 16
    plan = parse_args(["--model-path", "m", "--cuda-graph-bs", "1", "2", "4", "8"]).cuda_graphs
    assert plan.decode_max_bs == 8
    plan = parse_args(["--model-path", "m", "--disable-cuda-graph"]).cuda_graphs
    assert not plan.decode_enabled and not plan.prefill_enabled


def test_new_cuda_graph_spelling():
    plan = parse_args(["--model-path", "m", "--cuda-graph-max-bs-decode", "48", "--cuda-graph-bs-prefill", "512",
                       "1024", "--cuda-graph-backend-prefill", "breakable"]).cuda_graphs
    assert (plan.decode_enabled, plan.decode_max_bs, plan.prefill_enabled, plan.prefill_max_tokens) == (True, 48, True, 1024)
    plan = parse_args(["--model-path", "m", "--cuda-graph-backend-decode", "disabled"]).cuda_graphs
    assert not plan.decode_enabled and plan.prefill_enabled
    # The per-phase flag wins over the deprecated global switch, the JSON config over both.
    plan = parse_args(["--model-path", "m", "--disable-cuda-graph", "--cuda-graph-backend-decode", "full"]).cuda_graphs
    assert plan.decode_enabled and not plan.prefill_enabled
    plan = parse_args(["--model-path", "m", "--cuda-graph-backend-decode", "full",
                       "--cuda-graph-config", '{"decode": {"backend": "disabled"}}']).cuda_graphs
    assert not plan.decode_enabled


def test_decode_graph_default_max_bs_follows_tp_and_max_running():
    assert parse_args(["--model-path", "m"]).cuda_graphs.decode_max_bs == 256
    assert parse_args(["--model-path", "m", "--tp", "4"]).cuda_graphs.decode_max_bs == 512
    assert parse_args(["--model-path", "m", "--max-running-requests", "24"]).cuda_graphs.decode_max_bs == 24


MALFORMED = [
    ["--port", "abc"],
    ["--tp-size", "1.5"],
    ["--disaggregation-mode", "both"],
    ["--disaggregation-transfer-backend", "nixel"],
    ["--disaggregation-bootstrap-port", "eight"],
    ["--cuda-graph-max-bs-decode", "x"],
    ["--cuda-graph-max-bs", "1e3"],
    ["--cuda-graph-bs-decode", "1", "two"],
    ["--cuda-graph-backend-decode", "piecewise"],
    ["--cuda-graph-config", "{not json"],
    ["--decode-log-interval", "ten"],
    ["--max-running-requests", "-"],
    ["--speculative-algorithm", "MTP"],
    ["--mem-fraction-static", "most"],
    ["--port"],
    ["stray-positional"],
]


@pytest.mark.parametrize("bad", MALFORMED, ids=lambda a: " ".join(a))
def test_malformed_values_are_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "m", *bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and "error: " in err
    with pytest.raises(ValueError):
        check_argv(["--model-path", "m", *bad])


def test_missing_model_path_is_a_usage_error():
    with pytest.raises(ValueError, match="model-path"):
        check_argv(["--port", "30000"])


def test_process_exits_2_on_a_malformed_value():
    proc = subprocess.run([PYTHON, "-m", "pdkit.sim", "--model-path", "m", "--port", "abc"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "argument --port: invalid int value: 'abc'" in proc.stderr
