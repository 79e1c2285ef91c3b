"""`pdkit validate` on UCX values of every kind an engine's env sets (issue 46, "UCX values of other kinds").

Each value is judged as the pinned UCX's parser of that setting reads it (pdkit/upstream/ucxcheck.py, the kinds in
pdkit/upstream/data/ucx_config.json; tests/test_contract_ucx_kinds.py holds the judgement to the real UCX). The base
inventory's PD pairs run over NIXL with the UCX_TLS pdkit renders for a same-node pair (tcp and sm in it).
"""

from __future__ import annotations

import copy

import pytest

from pdkit.cli import main
from tests.conftest import BASE_CLUSTER, BASE_HOSTS, write_inventory
from tests.test_validate import _engine, assert_validate_refuses

# (case id, mutate(cluster, hosts), host, field path, phrase): an error naming host, engine and variable
BAD_VALUE_CASES = [
    ("bool-true", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_TCP_NODELAY": "true"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TCP_NODELAY", "'ON' and 'true' are refused"),
    ("bool-upper-case-on", lambda c, h: _engine(h, "gpu02", 0).update(env={"UCX_TCP_PUT_ENABLE": "ON"}),
     "gpu02", "pdkit_node.engines[0].env.UCX_TCP_PUT_ENABLE", "UCX_TCP_PUT_ENABLE='ON' is no value"),
    ("time-with-a-space", lambda c, h: _engine(h, "gpu01", 0).update(env={"UCX_KEEPALIVE_INTERVAL": "10 ms"}),
     "gpu01", "pdkit_node.engines[0].env.UCX_KEEPALIVE_INTERVAL", "lower case, no space"),
    ("time-in-hours", lambda c, h: _engine(h, "gpu02", 1).update(env={"UCX_TCP_USER_TIMEOUT": "1h"}),
     "gpu02", "pdkit_node.engines[1].env.UCX_TCP_USER_TIMEOUT", "the engine fails at start"),
    ("time-auto-upper-case", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_TCP_KEEPIDLE": "AUTO"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TCP_KEEPIDLE", "inf or auto (lower case)"),
    ("enum-not-a-choice", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_RNDV_SCHEME": "zcopy"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_RNDV_SCHEME", "one of auto, get_zcopy, put_zcopy"),
    ("int-not-a-number", lambda c, h: _engine(h, "gpu02", 1).update(env={"UCX_TCP_RX_MAX_BUFS": "many"}),
     "gpu02", "pdkit_node.engines[1].env.UCX_TCP_RX_MAX_BUFS", "an integer"),
    ("uint-auto", lambda c, h: _engine(h, "gpu01", 0).update(env={"UCX_MAX_EAGER_RAILS": "auto"}),
     "gpu01", "pdkit_node.engines[0].env.UCX_MAX_EAGER_RAILS", "an unsigned integer or inf"),
    ("bandwidth-without-a-rate", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_BCOPY_BW": "10GB"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_BCOPY_BW", "then ps, /s or s"),
    ("key-value-missing-a-key", lambda c, h: _engine(h, "gpu02", 0).update(env={"UCX_RNDV_THRESH": "intra:8k"}),
     "gpu02", "pdkit_node.engines[0].env.UCX_RNDV_THRESH", "key one of intra, inter"),
    ("ternary-auto", lambda c, h: _engine(h, "gpu01", 0).update(env={"UCX_RCACHE_ENABLE": "auto"}),
     "gpu01", "pdkit_node.engines[0].env.UCX_RCACHE_ENABLE", "try or maybe"),
    ("all-beside-a-device", lambda c, h: _engine(h, "gpu02", 1).update(env={"UCX_SHM_DEVICES": "all,memory"}),
     "gpu02", "pdkit_node.engines[1].env.UCX_SHM_DEVICES", "all (alone)"),
    ("memory-domain-bool", lambda c, h: _engine(h, "gpu01", 1).update(env={"UCX_TCP_BRIDGE_ENABLE": "true"}),
     "gpu01", "pdkit_node.engines[1].env.UCX_TCP_BRIDGE_ENABLE", "leaves out the TCP memory domain"),
]


@pytest.mark.parametrize("case", BAD_VALUE_CASES, ids=[c[0] for c in BAD_VALUE_CASES])
def test_a_value_ucx_refuses_is_an_error_naming_host_engine_and_variable(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


@pytest.mark.parametrize("env", [
    {"UCX_TCP_NODELAY": "Yes", "UCX_TCP_PUT_ENABLE": "0", "UCX_TCP_CONN_NB": "on"},  # bool spellings
    {"UCX_RCACHE_ENABLE": "TRY", "UCX_TM_SW_RNDV": "maybe"},  # ternary
    {"UCX_PROTO_INDIRECT_ID": "Auto", "UCX_GVA_ENABLE": "OFF"},  # on/off/auto: any case
    {"UCX_KEEPALIVE_INTERVAL": "inf", "UCX_TCP_USER_TIMEOUT": "2s", "UCX_TCP_KEEPIDLE": "auto",
     "UCX_RCACHE_OVERHEAD": "50ns", "UCX_DYNAMIC_TL_SWITCH_INTERVAL": "5m"},  # times (m is minutes)
    {"UCX_RNDV_SCHEME": "PUT_ZCOPY", "UCX_ATOMIC_MODE": "Guess"},  # enums: any case
    {"UCX_TCP_RX_MAX_BUFS": "0x400", "UCX_MAX_EAGER_RAILS": "INF", "UCX_NUM_EPS": "Auto"},  # integers
    {"UCX_BCOPY_BW": "100Gbps", "UCX_TCP_MAX_BW": "10GB/s"},  # bandwidths
    {"UCX_RNDV_THRESH": "intra:8k,inter:16k", "UCX_PROTO_OVERHEAD": "single:10ns,5ns"},  # key:value lists
    {"UCX_MULTI_PATH_RATIO": "auto", "UCX_RNDV_PERF_DIFF": "1e-2"},  # doubles
    {"UCX_RNDV_FRAG_MEM_TYPES": "host,CUDA", "UCX_TCP_ALLOC": "md,mmap,heap"},  # bitmaps, arrays of choices
    {"UCX_SHM_DEVICES": "all", "UCX_TCP_PORT_RANGE": "20000-21000"},
])
def test_values_in_ucxs_accepted_spellings_are_valid(env, tmp_path, capsys):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu01", 1).update(env=env)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", "--strict", str(inv)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("env, variable, phrase", [
    # UCS reads its global settings ignoring a refused value: it keeps the default and carries on
    ({"UCX_LOG_LEVEL": "verbose"}, "UCX_LOG_LEVEL", "keeps its default 'WARN'"),
    # sscanf reads the number and never looks at the rest: 10k is 10 for a plain integer
    ({"UCX_TCP_RX_MAX_BUFS": "10k"}, "UCX_TCP_RX_MAX_BUFS", "reads '10' and ignores 'k'"),
    ({"UCX_KEEPALIVE_INTERVAL": "10msec"}, "UCX_KEEPALIVE_INTERVAL", "reads '10ms' and ignores 'ec'"),
])
def test_a_value_ucx_carries_on_with_warns_and_fails_strict(env, variable, phrase, tmp_path, capsys):
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    _engine(hosts, "gpu02", 1).update(env=env)
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if f"gpu02: pdkit_node.engines[1].env.{variable}" in line]
    assert lines and phrase in lines[0], out
    assert main(["validate", "--strict", str(inv)]) == 2


def test_a_transport_setting_ucx_tls_leaves_out_only_warns(tmp_path, capsys):
    """UCX reads a transport's settings only where it opens it: a refused TCP value with no tcp in UCX_TLS
    changes nothing now (it fails once tcp is back), the same value with tcp is an error."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    hosts["gpu01"]["pdkit_node"].update(ucx_net_devices="eth1")  # UCX_TLS is then the inventory's
    _engine(hosts, "gpu01", 1).update(env={"UCX_TLS": "cuda_ipc,cuda_copy,sm,self", "UCX_TCP_NODELAY": "true"})
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    assert "leaves the tcp transport out" in capsys.readouterr().out
    _engine(hosts, "gpu01", 1).update(env={"UCX_TLS": "cuda_ipc,cuda_copy,sm,self,tcp", "UCX_TCP_NODELAY": "true"})
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 2
    assert "gpu01: pdkit_node.engines[1].env.UCX_TCP_NODELAY" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["unified-engine", "mooncake-backend"])
def test_a_refused_value_on_an_engine_that_never_loads_ucx_only_warns(how, tmp_path, capsys):
    """A unified engine hands no KV off and a mooncake pair does not use NIXL's UCX: nothing reads the value,
    so it cannot fail the engine (an error would refuse a valid inventory); the warning says why."""
    cluster, hosts = copy.deepcopy(BASE_CLUSTER), copy.deepcopy(BASE_HOSTS)
    if how == "unified-engine":
        gpus = hosts["gpu02"]["pdkit_node"]["gpus"]
        hosts["gpu02"]["pdkit_node"]["gpus"] = {**gpus, "count": 6, "numa": [0, 0, 1, 1, 1, 1]}
        hosts["gpu02"]["pdkit_node"]["engines"].append({"name": "solo", "role": "unified", "gpus": [4, 5],
                                                        "port": 30005, "env": {"UCX_TCP_NODELAY": "true"}})
        host, at, why = "gpu02", "pdkit_node.engines[2].env.UCX_TCP_NODELAY", "a unified engine hands no KV off"
    else:
        cluster["transfer_backend"] = "mooncake"
        _engine(hosts, "gpu01", 1).update(env={"UCX_TCP_NODELAY": "true"})
        host, at, why = "gpu01", "pdkit_node.engines[1].env.UCX_TCP_NODELAY", "the transfer backend is mooncake"
    inv = write_inventory(tmp_path, hosts, cluster)
    assert main(["validate", str(inv)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if f"{host}: {at}" in line]
    assert lines and "'ON' and 'true' are refused" in lines[0] and why in lines[0], out
    assert main(["validate", "--strict", str(inv)]) == 2
