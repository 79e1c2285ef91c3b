"""The prefix-cache levers (issue 43, item 3): radix cache off, eviction policy, the decode's own
radix cache (experimental in SGLang), HiCache and its host pool against the node's RAM; each
offered only on a release whose parser has its flag (pdkit/upstream/parser_table.json)."""

from __future__ import annotations

import pytest

from pdkit.inventory.loader import load_with_problems
from pdkit.render import argvcheck, flags
from pdkit.upstream.parsertable import Parser, sglang_parser, table
from tests.conftest import REPO, write_inventory


def load(tmp_path, cluster, hosts):
    spec, found = load_with_problems(str(write_inventory(tmp_path, hosts, cluster)), cwd=str(REPO))
    return spec, found


def argv_of(spec, host, engine):
    h = next(x for x in spec.gpu_hosts if x.name == host)
    return flags.sglang_args(spec, h, h.node.engine(engine))


def said(found, field, severity=None):
    """Problems on the tuning setting FIELD ("tuning.x"), wherever it was set: the engine's own
    tuning (pdkit_node.engines[i].tuning.x) or its role's layer (pdkit_cluster.tuning.<role>.x)."""
    if not field.startswith("tuning."):
        return [p for p in found if p.field.endswith(field) and (severity is None or p.severity == severity)]
    name = field.rsplit(".", 1)[-1]
    return [p for p in found if p.field.rsplit(".", 1)[-1] == name and ".tuning." in p.field
            and (severity is None or p.severity == severity)]


def test_each_lever_renders_its_flag_on_the_engines_it_applies_to(tmp_path, base):
    cluster, hosts = base
    cluster["tuning"]["prefill"] = {"hicache": True, "hicache_size_gb": 32, "radix_eviction_policy": "lfu"}
    cluster["tuning"]["decode"].update(decode_radix_cache=True)
    # an engine's own tuning wins over its role's: gpu02's prefill has no prefix cache, so no HiCache
    hosts["gpu02"]["pdkit_node"]["engines"][0]["tuning"] = {"radix_cache": False, "hicache": None, "hicache_size_gb": None}
    spec, found = load(tmp_path, cluster, hosts)
    assert spec is not None and not [p for p in found if p.severity == "error"], found
    prefill, decode = argv_of(spec, "gpu01", "prefill"), argv_of(spec, "gpu01", "decode")
    assert "--enable-hierarchical-cache" in prefill and prefill[prefill.index("--hicache-size") + 1] == "32"
    assert prefill[prefill.index("--radix-eviction-policy") + 1] == "lfu"
    assert "--disaggregation-decode-enable-radix-cache" in decode and "--enable-hierarchical-cache" not in decode
    assert "--disaggregation-decode-enable-radix-cache" not in prefill
    assert "--disable-radix-cache" in argv_of(spec, "gpu02", "prefill") and "--disable-radix-cache" not in prefill
    # the decode radix cache is labelled experimental wherever validate shows it
    experimental = said(found, "tuning.decode_radix_cache", "warning")
    assert experimental and all("experimental" in p.message and "EXPERIMENTAL" in p.message for p in experimental), found


@pytest.mark.parametrize("tuning, transfer, field, fragment", [
    ({"prefill": {"hicache_ratio": 2.0}}, "nixl", "tuning.hicache_ratio", "set hicache: true"),
    ({"prefill": {"hicache_size_gb": 8}}, "nixl", "tuning.hicache_size_gb", "set hicache: true"),
    ({"prefill": {"hicache": True, "radix_cache": False}}, "nixl", "tuning.hicache", "refuses --enable-hierarchical-cache with --disable-radix-cache"),
    ({"decode": {"cuda_graph_max_bs": 32, "decode_radix_cache": True}}, "fake", "tuning.decode_radix_cache", "transfer_backend fake"),
    ({"decode": {"cuda_graph_max_bs": 32, "decode_radix_cache": True, "radix_cache": False}}, "nixl", "tuning.decode_radix_cache", "contradicts radix_cache: false"),
    ({"prefill": {"radix_eviction_policy": "fifo"}}, "nixl", "tuning.radix_eviction_policy", "valid: lfu, lru, priority, slru, tlru"),
])
def test_a_lever_sglang_would_refuse_is_an_error_naming_host_and_field(tmp_path, base, tuning, transfer, field, fragment):
    cluster, hosts = base
    cluster["tuning"].update(tuning)
    cluster["transfer_backend"] = transfer
    _, found = load(tmp_path, cluster, hosts)
    errors = said(found, field, "error")
    assert errors and any(fragment in p.message for p in errors), found
    assert {p.host for p in errors} == {"gpu01", "gpu02"}


def test_levers_that_do_nothing_where_they_are_set_are_warned(tmp_path, base):
    cluster, hosts = base
    cluster["tuning"]["all"] = {"decode_radix_cache": True}
    cluster["tuning"]["decode"] = {"cuda_graph_max_bs": 32, "radix_eviction_policy": "lru"}
    _, found = load(tmp_path, cluster, hosts)
    # named where it was set (the `all` layer), for the prefill engines it reaches
    prefill = [p for p in said(found, "tuning.decode_radix_cache", "warning") if "this is a prefill engine" in p.message]
    assert prefill and {p.field for p in prefill} == {"pdkit_cluster.tuning.all.decode_radix_cache"}, found
    assert "applies to decode engines only" in prefill[0].message
    # with decode_radix_cache on (from `all`) the decode's policy is used: no warning for it
    assert not said(found, "tuning.radix_eviction_policy")
    cluster["tuning"]["all"] = {}
    _, found = load(tmp_path, cluster, hosts)
    ignored = said(found, "tuning.radix_eviction_policy", "warning")
    assert {p.field for p in ignored} == {"pdkit_cluster.tuning.decode.radix_eviction_policy"}, found
    assert ignored and "a PD decode has no radix cache unless decode_radix_cache: true" in ignored[0].message, found


def _without(version: str, flag: str) -> Parser:
    options = [o for o in table()["sglang"][version]["options"] if flag not in o["flags"]]
    return Parser(f"sglang {version} without {flag}", options)


@pytest.mark.parametrize("field, value, flag", [
    ("decode_radix_cache", True, "--disaggregation-decode-enable-radix-cache"),
    ("hicache", True, "--enable-hierarchical-cache"),
    ("radix_eviction_policy", "lru", "--radix-eviction-policy"),
    ("radix_cache", False, "--disable-radix-cache"),
])
def test_a_lever_is_offered_only_on_releases_whose_parser_has_its_flag(tmp_path, base, monkeypatch, field, value, flag):
    """Both pinned releases have every cache flag (the table says so); a release without one (a
    parser with it removed stands in for a future pin) refuses the lever with the releases that have it."""
    for version in ("0.5.17", "0.5.23"):
        assert flag in sglang_parser(version).by_flag
    real = argvcheck.sglang_parser
    monkeypatch.setattr(argvcheck, "sglang_parser", lambda v: _without(v, flag) if v == "0.5.17" else real(v))
    cluster, hosts = base
    cluster["sglang_version"] = "0.5.17"
    cluster["tuning"]["decode"].update({field: value})
    if field == "hicache":
        cluster["tuning"]["decode"]["hicache_size_gb"] = 4
    _, found = load(tmp_path, cluster, hosts)
    errors = said(found, f"engines[1].tuning.{field}", "error")
    assert errors, found
    assert (f"SGLang 0.5.17's parser has no {flag} (pdkit/upstream/parser_table.json): this lever is offered only on 0.5.23; "
            f"valid: sglang_version 0.5.23, or {field} unset") in errors[0].message
    cluster["sglang_version"] = "0.5.23"
    _, found = load(tmp_path, cluster, hosts)
    assert not said(found, f"engines[1].tuning.{field}", "error"), found


@pytest.mark.parametrize("ram_gb, weights_gb, size_gb, ratio, expected", [
    (None, None, 32, None, "set ram_gb"),
    (2048, 300.0, 32, None, None),                 # 2 x 32 x 2 nodes' engines... per node: 2 ranks x 32 = 64 GB
    (256, 300.0, 32, None, "= 380 GB, more than the node's 256 GB"),  # 64 + 300 + 16
    (256, None, 200, None, "unknown for /models/m: set model.weights_gb"),
    (512, 100.0, None, 2.0, "at most"),            # ratio: 2 x 141 GiB x 0.9 x 2 ranks = 508 GB, + 116
])
def test_hicache_host_pools_weights_and_os_are_checked_against_the_nodes_ram(tmp_path, base, ram_gb, weights_gb, size_gb, ratio, expected):
    cluster, hosts = base
    cluster["tuning"]["prefill"] = {"hicache": True, **({"hicache_size_gb": size_gb} if size_gb else {}),
                                    **({"hicache_ratio": ratio} if ratio else {})}
    if weights_gb is not None:
        cluster["model"]["weights_gb"] = weights_gb
    for h in ("gpu01", "gpu02"):
        if ram_gb is not None:
            hosts[h]["pdkit_node"]["ram_gb"] = ram_gb
    _, found = load(tmp_path, cluster, hosts)
    ram = said(found, "pdkit_node.ram_gb")
    if expected is None:
        assert not ram, ram
        return
    assert ram and all(p.severity == "warning" for p in ram) and {p.host for p in ram} == {"gpu01", "gpu02"}, found
    assert expected in ram[0].message and "prefill " in ram[0].message, ram[0].message


def test_a_lever_without_hicache_needs_no_ram_figure(tmp_path, base):
    cluster, hosts = base
    _, found = load(tmp_path, cluster, hosts)
    assert not said(found, "pdkit_node.ram_gb")
