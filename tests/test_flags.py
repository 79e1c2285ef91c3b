"""Spec -> argv / env decisions, one lever at a time."""

from __future__ import annotations

import copy

import pytest

from pdkit.inventory.loader import load
from pdkit.render import flags
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory


def _spec(tmp_path, cluster, hosts):
    return load(write_inventory(tmp_path, hosts, cluster))


def _engine_args(spec, host="gpu01", name="decode"):
    h = spec.host(host)
    e = next(e for e in h.node.engines if e.name == name)
    return flags.sglang_args(spec, h, e)


def _value(args, flag):
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_decode_graph_flags_use_the_per_phase_spelling(version, base, tmp_path):
    cluster, hosts = base
    cluster.update(sglang_version=version)
    cluster["tuning"]["decode"].update(cuda_graph_bs=[1, 2, 4, 8, 16, 32])
    args = _engine_args(_spec(tmp_path, cluster, hosts))
    # 0.5.20+ fails on the old --cuda-graph-max-bs ("ambiguous option"); 0.5.17 already has both
    assert "--cuda-graph-max-bs" not in args and "--cuda-graph-bs" not in args
    assert _value(args, "--cuda-graph-max-bs-decode") == "32"
    i = args.index("--cuda-graph-bs-decode")
    assert args[i + 1 : i + 7] == ["1", "2", "4", "8", "16", "32"]


def test_cuda_graphs_off_disables_the_decode_backend_only_on_decode(base, tmp_path):
    cluster, hosts = base
    cluster["target_concurrency"] = None
    cluster["tuning"]["all"] = {"cuda_graph": False, "prefill_cuda_graph": False}
    spec = _spec(tmp_path, cluster, hosts)
    decode = _engine_args(spec, name="decode")
    prefill = _engine_args(spec, name="prefill")
    assert _value(decode, "--cuda-graph-backend-decode") == "disabled"
    assert "--cuda-graph-max-bs-decode" not in decode
    assert "--cuda-graph-backend-prefill" not in decode
    assert "--cuda-graph-backend-decode" not in prefill
    assert _value(prefill, "--cuda-graph-backend-prefill") == "disabled"


def test_pd_flags_and_gpu_placement(base, tmp_path):
    spec = _spec(tmp_path, *base)
    prefill = _engine_args(spec, name="prefill")
    decode = _engine_args(spec, name="decode")
    assert _value(prefill, "--disaggregation-mode") == "prefill"
    assert _value(prefill, "--disaggregation-bootstrap-port") == "8998"
    assert _value(decode, "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in decode
    assert _value(decode, "--base-gpu-id") == "2" and _value(decode, "--gpu-id-step") == "1"
    assert _value(decode, "--host") == "10.9.0.1"
    assert "--enable-metrics" in decode


def test_gpu_step_from_an_evenly_spaced_list(base, tmp_path):
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"]["engines"][0]["gpus"] = [0, 2]
    hosts["gpu01"]["pdkit_node"]["engines"][1]["gpus"] = [1, 3]
    hosts["gpu01"]["pdkit_node"]["gpus"] = {**hosts["gpu01"]["pdkit_node"]["gpus"], "numa": [0, 0, 0, 0]}
    args = _engine_args(_spec(tmp_path, cluster, hosts), name="decode")
    assert _value(args, "--base-gpu-id") == "1" and _value(args, "--gpu-id-step") == "2"


def test_tuning_layers_all_then_role_then_engine(base, tmp_path):
    cluster, hosts = base
    cluster["tuning"]["all"] = {"context_length": 8192, "mem_fraction_static": 0.8}
    cluster["tuning"]["decode"].update(mem_fraction_static=0.85)
    hosts["gpu01"]["pdkit_node"]["engines"][1]["tuning"] = {"context_length": 4096}
    spec = _spec(tmp_path, cluster, hosts)
    d1 = _engine_args(spec, "gpu01", "decode")
    d2 = _engine_args(spec, "gpu02", "decode")
    p1 = _engine_args(spec, "gpu01", "prefill")
    assert (_value(d1, "--context-length"), _value(d1, "--mem-fraction-static")) == ("4096", "0.85")
    assert (_value(d2, "--context-length"), _value(d2, "--mem-fraction-static")) == ("8192", "0.85")
    assert (_value(p1, "--context-length"), _value(p1, "--mem-fraction-static")) == ("8192", "0.8")


def test_every_lever_reaches_its_flag(base, tmp_path):
    cluster, hosts = base
    cluster["target_concurrency"] = 8
    hosts["gpu01"]["pdkit_node"]["engines"][1]["tuning"] = {
        "num_continuous_decode_steps": 4, "max_running_requests": 8, "max_queued_requests": 100,
        "chunked_prefill_size": 4096, "page_size": 16, "overlap_schedule": False, "torch_compile": True,
        "attention_backend": "triton", "sampling_backend": "pytorch", "moe_runner_backend": "triton",
        "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "watchdog_timeout": 600, "decode_log_interval": 10,
        "log_level": "warning", "custom_all_reduce": "off", "cuda_graph_max_bs": 8,
    }
    hosts["gpu01"]["pdkit_node"]["engines"][1]["extra_args"] = ["--enable-p2p-check"]
    # its prefill partner must share the KV layout (validation refuses a pair that differs)
    hosts["gpu01"]["pdkit_node"]["engines"][0]["tuning"] = {"page_size": 16, "kv_cache_dtype": "fp8_e4m3"}
    cluster["answers"] = {"acknowledge": ["kv_cache_quantized"]}  # changes the answers by design (pdkit/spec/numerics.py)
    args = _engine_args(_spec(tmp_path, cluster, hosts))
    for flag, value in [("--num-continuous-decode-steps", "4"), ("--max-running-requests", "8"), ("--max-queued-requests", "100"),
                        ("--chunked-prefill-size", "4096"), ("--page-size", "16"), ("--attention-backend", "triton"),
                        ("--sampling-backend", "pytorch"), ("--moe-runner-backend", "triton"), ("--quantization", "fp8"),
                        ("--kv-cache-dtype", "fp8_e4m3"), ("--watchdog-timeout", "600"), ("--decode-log-interval", "10"),
                        ("--log-level", "warning"), ("--cuda-graph-max-bs-decode", "8")]:
        assert _value(args, flag) == value, flag
    for flag in ["--disable-overlap-schedule", "--enable-torch-compile", "--disable-custom-all-reduce"]:
        assert flag in args
    assert args[-1] == "--enable-p2p-check"


def test_custom_all_reduce_auto_is_off_at_tp2_on_sm120_only(base, tmp_path):
    cluster, hosts = base
    spec = _spec(tmp_path, cluster, hosts)  # H200, sm_90, TP2
    assert "--disable-custom-all-reduce" not in _engine_args(spec)
    for h in hosts.values():
        if "pdkit_node" in h:
            h["pdkit_node"]["gpus"] = {**h["pdkit_node"]["gpus"], "model": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0", "memory_gib": 96}
            h["pdkit_node"]["nccl_profile"] = "pcie"
    assert "--disable-custom-all-reduce" in _engine_args(_spec(tmp_path, cluster, hosts))


def test_p2p_off_profile_sets_nccl_and_disables_custom_all_reduce(base, tmp_path):
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"].update(nccl_profile="pcie-p2p-off", nic="eno1")
    spec = _spec(tmp_path, cluster, hosts)
    env = flags.nccl_env(spec, spec.host("gpu01"))
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "eno1" and env["NCCL_IB_DISABLE"] == "1"
    assert "--disable-custom-all-reduce" in _engine_args(spec)


def test_pcie_profile_picks_p2p_level_from_the_layout_and_never_ll128(base, tmp_path):
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"]["nccl_profile"] = "pcie"
    spec = _spec(tmp_path, cluster, hosts)
    env = flags.nccl_env(spec, spec.host("gpu01"))
    assert env["NCCL_P2P_LEVEL"] == "PHB"  # each engine inside one NUMA node
    assert "LL128" not in env["NCCL_PROTO"]
    hosts["gpu01"]["pdkit_node"]["engines"] = [{"name": "big", "role": "unified", "gpus": [0, 1, 2, 3], "port": 30000, "pd_group": "x"}]
    hosts["gpu01"]["pdkit_router"]["workers"] = ["gpu01/big"]
    spec = _spec(tmp_path, cluster, hosts)
    assert flags.nccl_env(spec, spec.host("gpu01"))["NCCL_P2P_LEVEL"] == "SYS"


def test_ucx_env_same_node_vs_cross_node(base, tmp_path):
    cluster, hosts = base
    spec = _spec(tmp_path, cluster, hosts)
    assert "cuda_ipc" in flags.ucx_env(spec, spec.host("gpu01"))["UCX_TLS"]
    hosts["gpu01"]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    spec = _spec(tmp_path, cluster, hosts)
    assert flags.ucx_env(spec, spec.host("gpu01")) == {"UCX_NET_DEVICES": "mlx5_0:1"}


def test_engine_env_levers(base, tmp_path):
    cluster, hosts = base
    cluster["tuning"]["all"] = {"allow_longer_context": True, "pcie_ipc_allreduce": True}
    spec = _spec(tmp_path, cluster, hosts)
    h = spec.host("gpu01")
    env = flags.engine_env(spec, h, h.node.engines[0])
    assert env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
    assert env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert env["SGLANG_DISAGGREGATION_NIXL_BACKEND"] == "UCX"


def test_router_pd_args_list_every_worker_with_explicit_bootstrap_ports(base, tmp_path):
    cluster, hosts = base
    hosts["gpu02"]["pdkit_node"]["engines"][0]["bootstrap_port"] = 9000
    hosts["gpu01"]["pdkit_router"]["workers"] = None
    for h in ("gpu01", "gpu02"):
        hosts[h]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    spec = _spec(tmp_path, cluster, hosts)
    args = flags.router_args(spec, spec.host("gpu01"))
    joined = " ".join(args)
    assert args[0] == "--pd-disaggregation"
    assert "--prefill http://10.9.0.1:30000 8998" in joined
    assert "--prefill http://10.9.0.2:30000 9000" in joined
    assert joined.count("--decode http://") == 2
    cmd = flags.router_command(spec, spec.host("gpu01"))
    assert cmd[:2] == ["/opt/pdkit/router-venv/bin/smg", "launch"]


def test_router_regular_mode_and_legacy_router(base, tmp_path):
    cluster, hosts = base
    cluster.update(sglang_version="0.5.17")
    hosts["gpu01"]["pdkit_router"]["workers"] = None
    for h in ("gpu01", "gpu02"):
        for e in hosts[h]["pdkit_node"]["engines"]:
            e["role"] = "unified"
            e.pop("pd_group", None)
    spec = _spec(tmp_path, cluster, hosts)
    args = flags.router_args(spec, spec.host("gpu01"))
    assert "--pd-disaggregation" not in args
    assert args[: args.index("--policy")] == ["--worker-urls", "http://10.9.0.1:30000", "http://10.9.0.1:30001", "http://10.9.0.2:30000", "http://10.9.0.2:30001"]
    # 0.5.17's router pairing is the standalone sglang-router
    assert flags.router_command(spec, spec.host("gpu01"))[:3] == ["/opt/pdkit/router-venv/bin/python", "-m", "sglang_router.launch_router"]


def test_sim_engine_swaps_only_the_module(base, tmp_path):
    cluster, hosts = base
    spec = _spec(tmp_path, cluster, hosts)
    cluster["engine"] = "sim"
    sim = _spec(tmp_path, cluster, hosts)
    h, hs = spec.host("gpu01"), sim.host("gpu01")
    real = flags.engine_command(spec, h, h.node.engines[1])
    fake = flags.engine_command(sim, hs, hs.node.engines[1])
    assert real[2] == "sglang.launch_server" and fake[2] == "pdkit.sim"
    assert real[3:] == fake[3:]


def test_decode_policy_defaults_to_what_the_worker_count_allows(base, tmp_path):
    cluster, hosts = base
    spec = _spec(tmp_path, cluster, hosts)  # one decode worker behind gpu01's router
    args = flags.router_args(spec, spec.host("gpu01"))
    # sglang-router 0.3.2 refuses power_of_two with a single decode worker (seen on the GPU tier)
    assert args[args.index("--decode-policy") + 1] == "round_robin"
    hosts["gpu01"]["pdkit_router"]["workers"] = None
    for h in ("gpu01", "gpu02"):
        hosts[h]["pdkit_node"]["ucx_net_devices"] = "mlx5_0:1"
    spec = _spec(tmp_path, cluster, hosts)
    args = flags.router_args(spec, spec.host("gpu01"))
    assert args[args.index("--decode-policy") + 1] == "power_of_two"


def test_local_model_paths_keep_engines_off_the_hub(base, tmp_path):
    cluster, hosts = base
    spec = _spec(tmp_path, cluster, hosts)
    h = spec.host("gpu01")
    assert flags.engine_env(spec, h, h.node.engines[0])["HF_HUB_OFFLINE"] == "1"
    cluster["model"]["path"] = "deepseek-ai/DeepSeek-V4-Flash"
    spec = _spec(tmp_path, cluster, hosts)
    h = spec.host("gpu01")
    assert "HF_HUB_OFFLINE" not in flags.engine_env(spec, h, h.node.engines[0])


ROUTER_MODULES = {"smg": "smg.launch_router", "sglang-router": "sglang_router.launch_router"}


@pytest.mark.parametrize(("package", "version"), [("smg", "1.13.0"), ("sglang-router", "0.3.2")])
def test_router_breaker_settings_take_effect_in_each_routers_own_parser(base, tmp_path, package, version):
    """Issue #18 item 6: with the routers' default 60 s breaker timeout a recovered worker sat idle
    ~55 s. The rendered argv, parsed by the router's own parse_router_args, must carry pdkit's values."""
    import json as _json
    import subprocess

    from pdkit.upstream.venvs import router_python
    from tests.conftest import require

    python = router_python(package, version)
    require(python is not None, f"contract env {package}-{version} not built (.ci/contract-env.sh)")
    cluster, hosts = base
    if package == "sglang-router":
        cluster.update(sglang_version="0.5.17")
    spec = _spec(tmp_path, cluster, hosts)
    args = flags.router_args(spec, spec.host("gpu01"))
    code = (
        "import json, sys; from importlib import import_module; "
        f"a = import_module({ROUTER_MODULES[package]!r}).parse_router_args(json.loads(sys.argv[1])); "
        "print(json.dumps({k: getattr(a, k) for k in ('cb_failure_threshold', 'cb_success_threshold', 'cb_timeout_duration_secs', 'cb_window_duration_secs')}))"
    )
    out = subprocess.run([str(python), "-c", code, _json.dumps(args)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = _json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed == {k.replace("-", "_"): v for k, v in flags.ROUTER_BREAKER.items()}
    # a breaker opened by a restart is tried again within a few seconds
    assert parsed["cb_timeout_duration_secs"] <= 5


# ---------------------------------------------------------------- issue 20: engines spanning nodes


def _spanning(tmp_path, base, version="0.5.23", **decode):
    """gpu01's decode over gpu01 + gpu02 (TP4 as 2 x 2 GPUs), as tests/test_validate.py's _span."""
    from tests.test_validate import _span

    cluster, hosts = base
    cluster["sglang_version"] = version
    _span(hosts, **decode)
    return _spec(tmp_path, cluster, hosts)


def _ranks(spec, host="gpu01", name="decode"):
    h = spec.host(host)
    e = next(e for e in h.node.engines if e.name == name)
    return [flags.sglang_args(spec, h, e, r) for r in range(e.nnodes)]


def test_every_rank_has_the_same_argv_but_node_rank(base, tmp_path):
    spec = _spanning(tmp_path, base)
    rank0, rank1 = _ranks(spec)
    assert _value(rank0, "--nnodes") == "2" and _value(rank0, "--node-rank") == "0" and _value(rank1, "--node-rank") == "1"
    assert _value(rank0, "--dist-init-addr") == "10.9.0.1:25000" == _value(rank1, "--dist-init-addr")
    assert [a for a in rank0 if a not in ("0", "1")] == [a for a in rank1 if a not in ("0", "1")]
    differ = [i for i, (a, b) in enumerate(zip(rank0, rank1)) if a != b]
    assert differ == [rank0.index("--node-rank") + 1]
    # --host and --port stay rank 0's: only rank 0 runs the HTTP server
    assert _value(rank1, "--host") == "10.9.0.1" and _value(rank1, "--tp-size") == "4"


def test_an_engine_on_one_node_gets_no_multinode_flags(base, tmp_path):
    cluster, hosts = base
    args = _engine_args(_spec(tmp_path, cluster, hosts))
    assert not {"--nnodes", "--node-rank", "--dist-init-addr", "--pp-size", "--ep-size", "--attn-dp-size", "--enable-dp-attention"} & set(args)


@pytest.mark.parametrize("version,expected", [
    # 0.5.23: --attn-dp-size N replaces the deprecated `--dp-size N --enable-dp-attention`
    ("0.5.23", ["--attn-dp-size", "2"]),
    # 0.5.17 has no --attn-dp-size: the attention-DP width is --dp-size with --enable-dp-attention
    ("0.5.17", ["--dp-size", "2", "--enable-dp-attention"]),
])
def test_attention_dp_is_spelled_per_release(version, expected, base, tmp_path):
    spec = _spanning(tmp_path, base, version, attn_dp=2, ep=4, pp=1)
    args = _ranks(spec)[0]
    i = args.index(expected[0])
    assert args[i:i + len(expected)] == expected
    assert _value(args, "--ep-size") == "4"
    assert "--pp-size" not in args


def test_every_multinode_flag_is_in_the_release_parser_table():
    """The spellings pdkit renders exist in each pinned parser (pdkit/upstream/parser_table.json, generated
    from the wheels), and the deprecated 0.5.23 spelling is recorded as replaced by --attn-dp-size."""
    from pdkit.upstream.parsertable import router_parser, sglang_parser
    from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES

    common = ["--nnodes", "--node-rank", "--dist-init-addr", "--pp-size", "--ep-size", "--moe-a2a-backend",
              "--enable-eplb", "--ep-num-redundant-experts"]
    for version, release in SGLANG_RELEASES.items():
        parser = sglang_parser(version)
        attn = ["--attn-dp-size"] if release.attn_dp_size_flag else ["--dp-size", "--enable-dp-attention"]
        for flag in common + attn:
            assert parser.resolve(flag)[0] is not None, f"{flag} not in SGLang {version}'s parser"
        if not release.attn_dp_size_flag:
            assert parser.resolve("--attn-dp-size")[0] is None
    assert "--attn-dp-size" in (sglang_parser("0.5.23").option("--enable-dp-attention").replaced_by or "")
    for (package, version), router in ROUTER_RELEASES.items():
        assert (router_parser(package, version).resolve("--dp-aware")[0] is not None) == router.dp_aware


def test_eplb_and_a2a_knobs(base, tmp_path):
    cluster, hosts = base
    cluster["tuning"]["decode"].update(enable_eplb=True, ep_num_redundant_experts=8, moe_a2a_backend="deepep")
    spec = _spanning(tmp_path, (cluster, hosts), ep=4)
    args = _ranks(spec)[1]
    assert "--enable-eplb" in args and _value(args, "--ep-num-redundant-experts") == "8" and _value(args, "--moe-a2a-backend") == "deepep"


def test_a2a_backend_choice_comes_from_the_parser(base, tmp_path):
    from pdkit.inventory.loader import load_with_problems

    cluster, hosts = base
    cluster["tuning"]["decode"].update(moe_a2a_backend="deep-ep")
    _, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    assert any(p.field.endswith("tuning.moe_a2a_backend") and "valid:" in p.message and "deepep" in p.message for p in problems), problems


def test_router_is_dp_aware_only_with_attention_dp_workers(base, tmp_path):
    import copy

    plain = _spanning(tmp_path, copy.deepcopy(base))
    assert "--dp-aware" not in flags.router_args(plain, plain.host("gpu01"))
    dp = _spanning(tmp_path, copy.deepcopy(base), attn_dp=2)
    assert "--dp-aware" in flags.router_args(dp, dp.host("gpu01"))


def test_cross_node_nccl_env(base, tmp_path):
    cluster, hosts = base
    spec = _spanning(tmp_path, (cluster, hosts))
    for name in ("gpu01", "gpu02"):
        env = flags.nccl_env(spec, spec.host(name))
        assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env
    hosts["gpu01"]["pdkit_node"].update(nccl_net="ib", nccl_ib_hca="mlx5_0,mlx5_1")
    hosts["gpu02"]["pdkit_node"].update(nccl_net="ib", nccl_ib_hca="=mlx5_0:1")
    spec = _spec(tmp_path, cluster, hosts)
    assert flags.nccl_env(spec, spec.host("gpu01"))["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert flags.nccl_env(spec, spec.host("gpu02"))["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert "NCCL_IB_DISABLE" not in flags.nccl_env(spec, spec.host("gpu02"))


def test_each_rank_registers_kv_endpoints_on_its_own_address(base, tmp_path):
    spec = _spanning(tmp_path, base)
    head = spec.host("gpu01")
    decode = next(e for e in head.node.engines if e.name == "decode")
    assert flags.engine_env(spec, head, decode)["SGLANG_HOST_IP"] == "10.9.0.1"
    assert flags.engine_env(spec, head, decode, spec.host("gpu02"))["SGLANG_HOST_IP"] == "10.9.0.2"


def test_plan_one_unit_per_rank_only_rank_0_is_a_target(base, tmp_path):
    """One unit per node; only rank 0 is a router worker, a scrape and bench target; the rank
    above 0 is gated through rank 0's /health; both exporters know which rank they watch and
    check each rank's environment (its NCCL settings included)."""
    import json

    from pdkit.bench.env import engine_flags
    from pdkit.render.plan import plan_cluster
    from roles.services import gates_command

    spec = _spanning(tmp_path, base)
    plans = plan_cluster(spec)
    [s0] = [s for s in plans["gpu01"].services if s.unit == "pdkit-engine-decode.service"]
    [s1] = [s for s in plans["gpu02"].services if s.unit == "pdkit-engine-decode.service"]
    assert (s0.rank, s1.rank) == (0, 1) and s0.span == s1.span == ("gpu01", "gpu02") and s1.head == "gpu01"
    assert s1.health_url == s0.health_url == "http://10.9.0.1:30001/health"
    assert s0.ready_log_line and s1.ready_log_line is None
    assert "--rank pdkit-engine-decode.service http://10.9.0.1:30001/health" in gates_command("py", [s1])
    assert "--engine pdkit-engine-decode.service" in gates_command("py", [s0])
    assert [w for w in flags.router_args(spec, spec.host("gpu01")) if "30001" in w] == ["http://10.9.0.1:30001"]
    assert list(engine_flags(spec)) == ["gpu01/prefill", "gpu01/decode"]
    exp = json.loads(plans["gpu02"].file("/etc/pdkit/exporter.json").content)
    [entry] = exp["engines"]
    assert (entry["rank"], entry["nnodes"], entry["head"]) == (1, 2, "gpu01")
    assert entry["env"]["NCCL_SOCKET_IFNAME"] == "eth0" and entry["env"]["SGLANG_HOST_IP"] == "10.9.0.2"
    assert entry["argv"][entry["argv"].index("--node-rank") + 1] == "1"
    release = json.loads(plans["gpu02"].file("/etc/pdkit/release.json").content)
    assert release["engines"]["decode"]["rank"] == 1


# ---------------------------------------------------------------- issue 22 item 1: a node's own engine environment


def test_engine_python_is_the_nodes_own_environment_where_it_has_one(base, tmp_path):
    """argv[0] of an engine is decided in one place (flags.engine_python): <engine_venv>/bin/python
    on a node that provides its environment, the kit-managed engine environment's python elsewhere
    (never pdkit's node venv: issue 30 item 3); the flags after it are the same either way."""
    cluster, hosts = base
    plain = _spec(tmp_path, cluster, hosts)
    hosts["gpu01"]["pdkit_node"]["engine_venv"] = "/opt/sglang-env"
    spec = _spec(tmp_path, cluster, hosts)
    g1, g2 = spec.host("gpu01"), spec.host("gpu02")
    assert flags.engine_python(spec, g1) == "/opt/sglang-env/bin/python"
    assert flags.engine_python(spec, g2) == flags.engine_python(plain, plain.host("gpu01")) == "/opt/pdkit/engine-venv/bin/python"
    for engine in g1.node.engines:
        command = flags.engine_command(spec, g1, engine)
        assert command[:3] == ["/opt/sglang-env/bin/python", "-m", "sglang.launch_server"]
        assert command[3:] == flags.engine_command(plain, plain.host("gpu01"), engine)[3:]
    assert (flags.engine_service_venv(spec, g1), flags.engine_service_venv(spec, g2)) == (None, "/opt/pdkit/engine-venv")
    # the kit installs an engine environment only where engine processes run from one of its own
    managed = [flags.managed_engine_env(spec, spec.host(h)) for h in ("gpu01", "gpu02", "mon01")]
    assert managed == [None, ("sglang", spec.cluster.sglang_version), None]
    # pdkit's own services never leave the node venv
    assert flags.venv_dir(spec) == "/opt/pdkit/venv"
    assert flags.venv_links(spec) == ("/opt/pdkit/venv", "/opt/pdkit/engine-venv", "/opt/pdkit/router-venv")


def test_a_rank_runs_from_the_environment_of_its_own_node(base, tmp_path):
    """An engine spanning nodes: each rank's argv[0] is its own node's (engine_command's NODE)."""
    cluster, hosts = base
    from tests.test_validate import _span

    _span(hosts)
    hosts["gpu02"]["pdkit_node"]["engine_venv"] = "/opt/sglang-env"
    spec = _spec(tmp_path, cluster, hosts)
    head, rank1 = spec.host("gpu01"), spec.host("gpu02")
    decode = next(e for e in head.node.engines if e.name == "decode")
    assert flags.engine_command(spec, head, decode, 0)[0] == "/opt/pdkit/engine-venv/bin/python"
    assert flags.engine_command(spec, head, decode, 1, node=rank1)[0] == "/opt/sglang-env/bin/python"
    from pdkit.render.plan import plan_cluster

    unit = plan_cluster(spec)["gpu02"].file("/etc/systemd/system/pdkit-engine-decode.service").content
    assert "ExecStart=/opt/sglang-env/bin/python -m sglang.launch_server" in unit


def _cross_host_pair(hosts: dict, net_devices: str) -> None:
    """gpu01's prefill hands KV to gpu02's decode (one router over both), each node sending over NET_DEVICES."""
    hosts["gpu01"]["pdkit_node"]["engines"] = [{"name": "prefill", "role": "prefill", "gpus": [0, 1], "port": 30000}]
    hosts["gpu02"]["pdkit_node"]["engines"] = [{"name": "decode", "role": "decode", "gpus": [0, 1], "port": 30001}]
    hosts["gpu01"]["pdkit_router"]["workers"] = ["gpu01/prefill", "gpu02/decode"]
    for h in ("gpu01", "gpu02"):
        hosts[h]["pdkit_node"]["ucx_net_devices"] = net_devices


def test_ucx_env_gives_both_ends_of_a_tcp_kv_path_its_profile(base, tmp_path):
    """Issue 33: a pair across hosts over TCP gets 512 KiB UCX TCP fragments at both ends (the
    receiver's RX size caps the sender's); over RDMA, and on one host, nothing of the TCP profile."""
    cluster, hosts = base
    _cross_host_pair(hosts, "eth0")
    spec = _spec(tmp_path, cluster, hosts)
    for h in ("gpu01", "gpu02"):
        env = flags.ucx_env(spec, spec.host(h))
        assert env == {"UCX_NET_DEVICES": "eth0", "UCX_TCP_RX_SEG_SIZE": "512k", "UCX_TCP_TX_SEG_SIZE": "512k"}, h
        assert [p.name for p in flags.kv_paths_touching(spec, h)] == ["cross-host-tcp"]
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _cross_host_pair(hosts, "mlx5_0:1")
    spec = _spec(tmp_path, cluster, hosts)
    for h in ("gpu01", "gpu02"):
        assert flags.ucx_env(spec, spec.host(h)) == {"UCX_NET_DEVICES": "mlx5_0:1"}, h
    spec = _spec(tmp_path, copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS))  # pairs on one host each
    assert not any(k.startswith("UCX_TCP_") for h in ("gpu01", "gpu02") for k in flags.ucx_env(spec, spec.host(h)))
