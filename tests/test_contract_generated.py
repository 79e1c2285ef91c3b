"""Every command line pdkit generates, fed to the real parsers of the versions it targets.

SGLang's own `ServerArgs` argparse (per pinned release) and the router's own parser run in
their own virtualenvs (made by .ci/contract-env.sh): a flag renamed between releases, a bad
choice or a typo in pdkit's generation fails here, not on a GPU node.
"""

from __future__ import annotations

import copy

import pytest

from pdkit.inventory.loader import load
from pdkit.render import flags
from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, REPO, require, write_inventory

pytestmark = pytest.mark.contract

contract = pytest.importorskip("pdkit.contract")
from pdkit.upstream import venvs  # noqa: E402


def _with_router(spec, package, version):
    """SPEC with every router host running PACKAGE VERSION (the argv is rendered for that parser)."""
    hosts = tuple(h.model_copy(update={"router": h.router.model_copy(update={"package": package, "version": version})})
                  if h.router is not None else h for h in spec.hosts)
    return spec.model_copy(update={"hosts": hosts})


def _with_version(spec, version):
    return spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"sglang_version": version})})


def _levers_inventory(tmp_path, base):
    """The base cluster with every lever set somewhere, so each generated flag meets the parser."""
    cluster, hosts = base
    cluster["model"].update(trust_remote_code=True, load_format="dummy", tokenizer_path="/models/tok")
    # kv_cache_dtype on every role: a prefill/decode pair must agree on it (pdkit.render.argvcheck)
    cluster["tuning"]["all"] = {"context_length": 8192, "mem_fraction_static": 0.88, "watchdog_timeout": 600,
                                "decode_log_interval": 10, "log_level": "info", "allow_longer_context": True,
                                "kv_cache_dtype": "fp8_e4m3"}
    # the FP8 KV cache changes the answers by design: acknowledged (pdkit/spec/numerics.py)
    cluster["answers"] = {"acknowledge": ["kv_cache_quantized"]}
    cluster["tuning"]["prefill"] = {"chunked_prefill_size": 4096, "page_size": 16, "prefill_cuda_graph": False,
                                    "hicache": True, "hicache_ratio": 2.0, "radix_eviction_policy": "lfu"}
    cluster["tuning"]["decode"] = {"cuda_graph_bs": [1, 2, 4, 8, 16, 24, 32], "num_continuous_decode_steps": 4,
                                   "max_running_requests": 32, "max_queued_requests": 256, "overlap_schedule": False,
                                   "attention_backend": "triton", "sampling_backend": "pytorch",
                                   "custom_all_reduce": "off", "page_size": 16, "decode_radix_cache": True,
                                   "hicache": True, "hicache_size_gb": 4}
    g2 = hosts["gpu02"]["pdkit_node"]["engines"]
    g2[0]["tuning"] = {"quantization": "fp8", "moe_runner_backend": "triton", "torch_compile": True, "hicache": False,
                       "hicache_ratio": None, "radix_cache": False, "hicache_size_gb": None}
    g2[1]["tuning"] = {"cuda_graph": False, "speculative": {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1,
                                                            "num_draft_tokens": 4, "draft_model_path": "/models/draft"}}
    g2[1]["extra_args"] = ["--enable-p2p-check"]
    return load(write_inventory(tmp_path, hosts, cluster))


def _checksum_inventory(tmp_path, base, manifest=None):
    """The base cluster with the model verified at every start (--model-checksum): against the manifest `pdkit stage`
    keeps in the model directory, or MANIFEST."""
    cluster, hosts = base
    cluster["model"].update(verify_checksum=True, **({"checksum_manifest": manifest} if manifest else {}))
    return load(write_inventory(tmp_path, hosts, cluster))


def spanning_inventory(tmp_path, base, *, version="0.5.23", layout=None, hosts_spanned=("gpu01", "gpu02")):
    """The base cluster with its gpu01 decode spanning gpu01 and gpu02 (TP4 as 2 x 2 GPUs),
    attention DP, expert parallelism and EPLB set: the multi-node flags meet the parsers."""
    cluster, hosts = base
    cluster["sglang_version"] = version
    cluster["tuning"]["decode"].update(enable_eplb=True, ep_num_redundant_experts=8, moe_a2a_backend="deepep")
    hosts["gpu02"]["pdkit_node"]["engines"] = [e for e in hosts["gpu02"]["pdkit_node"]["engines"] if e["name"] != "decode"]
    hosts["gpu02"]["pdkit_node"]["engines"][0]["pd_group"] = "default"
    decode = hosts["gpu01"]["pdkit_node"]["engines"][1]
    decode.update(nodes=list(hosts_spanned), dist_init_port=25000, tp=4, ep=4, attn_dp=2, **(layout or {}))
    for name in hosts_spanned:
        hosts[name]["pdkit_node"].update(nic="eth0", nccl_net="socket", ucx_net_devices="eth0")
    hosts["gpu01"]["pdkit_router"]["workers"] = None
    return write_inventory(tmp_path, hosts, cluster)


def every_rank_argv(spec):
    """(name, argv) of every engine process: each rank of an engine spanning nodes; the argv after
    `<engine python> -m sglang.launch_server` in its unit's ExecStart (flags.engine_command)."""
    for host in spec.gpu_hosts:
        for p in spec.placements(host):
            command = flags.engine_command(spec, p.head, p.engine, p.rank, node=host)
            assert command[0] == flags.engine_python(spec, host) and command[1:3] == ["-m", "sglang.launch_server"], command[:3]
            assert command[3:] == flags.sglang_args(spec, p.head, p.engine, p.rank)
            yield f"{host.name}/{p.engine.name}#{p.rank}", command[3:]


def _specs(tmp_path, base, monkeypatch):
    monkeypatch.chdir(REPO)
    return {
        "cluster": load("inventories/cluster.py"),
        "a6000": load("inventories/a6000.py"),
        # the GPU-tier inventories: h200x8 (TP4 prefill + TP4 decode) awaits an 8-GPU machine (issue 10);
        # what a CPU can check of it is that SGLang's own parser takes its argv
        "h200": load("inventories/h200.py"),
        "h200x8": load("inventories/h200x8.py"),
        # the one-GPU tier: a PD pair sharing GPU 0 (derived --mem-fraction-static per engine)
        "h200-1gpu": load("inventories/h200-1gpu.py"),
        "levers": _levers_inventory(tmp_path, base),
        # issue 47: the opt-in model verification, with the staged manifest and with a declared one
        "checksum-staged": _checksum_inventory(tmp_path, copy.deepcopy((BASE_CLUSTER, BASE_HOSTS))),
        "checksum-manifest": _checksum_inventory(tmp_path, copy.deepcopy((BASE_CLUSTER, BASE_HOSTS)),
                                                 "/srv/manifests/m.json"),
        # issue 20: two 8-GPU nodes serving one TP16 decode, and a base-derived spanning engine
        "multinode": load("inventories/multinode.py"),
        "spanning": load(spanning_inventory(tmp_path, copy.deepcopy(base))),
        # issue 22 item 1: engines run from the node's own environment (pdkit_node.engine_venv)
        "provided-env": load("inventories/provided-env.py"),
    }


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_every_generated_engine_argv_parses_with_sglangs_own_parser(version, tmp_path, base, monkeypatch):
    require(venvs.sglang_python(version) is not None, f"no SGLang {version} parser venv: run `bash .ci/contract-env.sh`")
    argvs, names = [], []
    for name, spec in _specs(tmp_path, base, monkeypatch).items():
        spec = _with_version(spec, version)
        for rank_name, argv in every_rank_argv(spec):
            argvs.append(argv)
            names.append(f"{name}:{rank_name}")
    assert len(argvs) >= 7
    assert any("--node-rank" in a for a in argvs) and any("--enable-eplb" in a for a in argvs)
    assert ["--model-checksum", "/models/m/.pdkit-manifest.json"] in [a[i:i + 2] for a in argvs for i in range(len(a))]
    assert ["--model-checksum", "/srv/manifests/m.json"] in [a[i:i + 2] for a in argvs for i in range(len(a))]
    # the provided-env node's engines are in the set (their ExecStart runs /opt/vendor/sglang-env/bin/python)
    assert {n for n in names if n.startswith("provided-env:")} == {"provided-env:gpu01/prefill#0", "provided-env:gpu01/decode#0"}
    results = contract.check_sglang_argvs(version, argvs)
    failures = {n: r for n, r in zip(names, results) if r is not None}
    assert not failures, f"SGLang {version} rejected pdkit's argv: {failures}"


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_contract_check_can_fail(version):
    """The parser really runs: a misspelt choice and an unknown flag are rejected."""
    require(venvs.sglang_python(version) is not None, f"no SGLang {version} parser venv: run `bash .ci/contract-env.sh`")
    bad = [["--model-path", "/m", "--disaggregation-transfer-backend", "nixel"], ["--model-path", "/m", "--no-such-flag"]]
    results = contract.check_sglang_argvs(version, bad)
    assert results[0] is not None and "nixel" in results[0]
    assert results[1] is not None and "no-such-flag" in results[1]


@pytest.mark.parametrize("package,version", sorted(ROUTER_RELEASES))
def test_every_generated_router_argv_parses_with_the_routers_own_parser(package, version, tmp_path, base, monkeypatch):
    require(venvs.router_python(package, version) is not None, f"no {package} {version} parser venv: run `bash .ci/contract-env.sh`")
    argvs, names = [], []
    for name, spec in _specs(tmp_path, base, monkeypatch).items():
        spec = _with_router(spec, package, version)
        for host in spec.router_hosts:
            release = ROUTER_RELEASES[(package, version)]
            # the arguments after the executable, as the console script sees them
            argvs.append(list(release.launcher[1:]) + flags.router_args(spec, host) if package == "smg" else flags.router_args(spec, host))
            names.append(f"{name}:{host.name}")
    results = contract.check_router_argvs(package, version, argvs)
    failures = {n: r for n, r in zip(names, results) if r is not None}
    assert not failures, f"{package} {version} rejected pdkit's argv: {failures}"


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_multinode_flags_parse_to_the_layout_without_deprecated_spellings(version, monkeypatch):
    """Attention DP is spelled per release (0.5.23: --attn-dp-size; 0.5.17: --dp-size N
    --enable-dp-attention): the parser takes it without a deprecation warning, and every rank
    differs from rank 0 only in --node-rank."""
    require(venvs.sglang_python(version) is not None, f"no SGLang {version} parser venv: run `bash .ci/contract-env.sh`")
    monkeypatch.chdir(REPO)
    spec = _with_version(load("inventories/multinode.py"), version)
    head = spec.host("gpu-d0")
    decode = next(e for e in head.node.engines if e.name == "decode")
    ranks = [flags.sglang_args(spec, head, decode, r) for r in range(decode.nnodes)]
    assert ranks[0] != ranks[1]
    assert [i for i, (a, b) in enumerate(zip(ranks[0], ranks[1])) if a != b] == [ranks[0].index("--node-rank") + 1]
    assert ranks[0][ranks[0].index("--dist-init-addr") + 1] == "10.0.1.20:25000"
    reply = contract.run_sglang_check(version, ranks)
    for result in reply["results"]:
        assert result["ok"], result["error"]
        assert not [w for w in result["warnings"] if "deprecated" in w.lower()], result["warnings"]
    assert ("--attn-dp-size" in ranks[0]) == (version == "0.5.23")
    assert ("--enable-dp-attention" in ranks[0]) == (version == "0.5.17")


@pytest.mark.parametrize("package,version", sorted(ROUTER_RELEASES))
def test_dp_aware_router_flag_parses(package, version, monkeypatch):
    """A router fronting an attention-DP worker gets --dp-aware, which both pinned routers take."""
    require(venvs.router_python(package, version) is not None, f"no {package} {version} parser venv: run `bash .ci/contract-env.sh`")
    monkeypatch.chdir(REPO)
    spec = _with_router(load("inventories/multinode.py"), package, version)
    argv = flags.router_args(spec, spec.host("router01"))
    assert "--dp-aware" in argv
    release = ROUTER_RELEASES[(package, version)]
    [result] = contract.check_router_argvs(package, version, [list(release.launcher[1:]) + argv if package == "smg" else argv])
    assert result is None, result
