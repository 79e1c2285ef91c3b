"""Values of every kind of UCX setting, judged by pdkit.upstream.ucxcheck and by the pinned nixl wheel's own UCX.

pdkit/upstream/data/ucx_config.json records each setting's kind: the UCS parser that reads it (pdkit/contract/
ucx_config.py walks the wheel's configuration tables). pdkit.upstream.ucxcheck judges a value as that parser
does; here each kind's good and bad values go to the real UCX three ways, and the judgement must agree
on every one:

- UCP's own settings (and UCS's global ones) through ucp_config_read + ucp_config_modify, as an
  application sets them: UCS_ERR_INVALID_PARAM where the parser refuses the value;
- transport settings through a UCP worker opened with the value in the environment, as NIXL opens one
  at an engine's start (a transport's config is read only there);
- every setting of the table through its own parser function, called as UCS calls it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdkit.upstream import ucxcheck
from pdkit.upstream.venvs import contract_home
from pdkit.upstream.versions import NIXL_PACKAGE
from tests.conftest import REPO, require

# kind -> (a setting of that kind that ucp_config_modify parses, values UCX reads, values it refuses);
# UCX's own spellings and its traps: case rules per word, sscanf's number prefixes, "inf"/"auto"
UCP_CASES: dict[str, tuple[str, list[str], list[str]]] = {
    "bool": ("UCX_ADDRESS_DEBUG_INFO", ["y", "Y", "yes", "YES", "n", "No", "on", "off", "1", "0"],
             ["ON", "Off", "true", "false", "2", "", " y", "yes "]),
    "ternary": ("UCX_RCACHE_ENABLE", ["try", "TRY", "maybe", "Maybe", "yes", "n", "on", "0"],
                ["auto", "ON", "true", "tryy", ""]),
    "on_off_auto": ("UCX_PROTO_INDIRECT_ID", ["on", "ON", "Off", "auto", "AUTO", "try", "maybe", "yes", "N", "1", "0"],
                    ["enable", "2", "", "onn"]),
    "enum": ("UCX_RNDV_SCHEME", ["get_zcopy", "PUT_ZCOPY", "Auto", "am", "rkey_ptr"],
             ["zcopy", "get-zcopy", "get_zcopy ", "", "put_zcopy,am"]),
    "enum (log level)": ("UCX_MODULE_LOG_LEVEL", ["warn", "WARN", "Debug", "poll"], ["warning", "verbose", "5"]),
    "int": ("UCX_RKEY_MPOOL_MAX_MD", ["2", "-1", "0x10", "010", " 7", "7 ", "10k", "1.5"],
            ["", " ", "x", "auto", "inf", "-", "+"]),
    "uint": ("UCX_MAX_EAGER_RAILS", ["2", "inf", "INF", "Inf", "-1", "2x"], ["auto", "two", "", "-"]),
    "ulong": ("UCX_LOG_DATA_SIZE", ["0", "100", " 5"], ["inf", "auto", "", "x1"]),
    "ulunits": ("UCX_NUM_EPS", ["64", "auto", "AUTO", "inf", "INF"], ["unlimited", "", "infinite"]),
    "double": ("UCX_RNDV_PERF_DIFF", ["1.5", "-1", "1e3", ".5", "1.", "inf", "nan", "0x1p3", "1e", "2%"],
               ["", ".", "x1", "%", "-", "infin", "0x", "auto"]),
    "pos_double": ("UCX_MULTI_PATH_RATIO", ["0.5", "auto", "AUTO", "1e-3", "inf"],
                   ["0", "-1", "nan", "", "1e-400", "-0.5"]),
    "time_units": ("UCX_KEEPALIVE_INTERVAL",
                   ["10ms", "1s", "5m", "100us", "1000ns", "20", "1.5s", "inf", "auto", "INF", "10msec", "2e3us"],
                   ["AUTO", "Auto", "10 ms", "10MS", "10sec", "10h", "1min", "", "forever", "ms"]),
    "bw": ("UCX_BCOPY_BW", ["10GBps", "100Gbps", "500MB/s", "1GBs", "10Bps", "80bps", "auto", "AUTO", "10 GBps",
                            "10GBps extra"],
           ["10GB", "10gbps", "10Gbit/s", "10", "", "10KiBps", "10PBps", "GBps"]),
    "memunits": ("UCX_BCOPY_THRESH", ["8k", "8KB", "8Kb", "1mb", "inf", "Auto", "100", " 64", "64kbX", "-1"],
                 ["1.5k", "8 k", "8KiB", "", "8x", "64k ", "auto8"]),
    "bitmap": ("UCX_RNDV_FRAG_MEM_TYPES", ["host", "host,CUDA", "", "host,,cuda", ",host", "cuda-managed"],
               ["gpu", "host,gpu", "host cuda"]),
    "array (of memory units)": ("UCX_RX_MPOOL_SIZES", ["64,1kb", "64", "64,", "inf,auto"],
                                ["64,1.5k", "64,,1k", ",64", "64;1k"]),
    "allow_list": ("UCX_TLS", ["all", "^tcp", "tcp,sm", "", "^all", "all,"],
                   ["all,tcp", "^all,tcp", "all,all"]),
    "allow_list_with_ranges": ("UCX_NET_DEVICES", ["mlx5_0:1", "all", "mlx5_[0-3]:1", ",all", "eth0,,eth1"],
                               ["all,mlx5_0:1", "^all,eth0"]),
    "key_value (memory units)": ("UCX_RNDV_THRESH", ["8k", "intra:8k,inter:16k", "auto", "intra:8k,64k", "inf"],
                                 ["intra:8k", "INTRA:8k,1k", "8kib", "", "intra:8k,inter:1.5k", "node:8k,8k"]),
    "key_value (times)": ("UCX_PROTO_OVERHEAD", ["10ns", "single:10ns,5ns", "1us,sw:2us", "10nss"],
                          ["single:10ns", "10 ns", "Single:1ns,1ns", "10n"]),
    "signo": ("UCX_DEBUG_SIGNO", ["HUP", "SIGUSR1", "usr2", "10", " 10", ""], ["SIGFOO", "sigusr1", "10 ", "SIGNAL0"]),
}

# kind -> (a transport setting, values a worker opens with, values that make it fail) with UCX_TLS=self,sm
# (no network interface needed); what TCP's settings would show is the same parser's
WORKER_TLS = "self,sm"
WORKER_CASES: dict[str, tuple[str, list[str], list[str]]] = {
    "array (of choices)": ("UCX_SELF_ALLOC", ["thp,md", "HEAP,mmap", "md,"], ["thp,foo", ",md", "md,,heap"]),
    "ternary": ("UCX_POSIX_FIFO_HUGETLB", ["try", "maybe", "n", "NO"], ["auto", "true"]),
    "enum": ("UCX_POSIX_FAILURE", ["error", "Diag"], ["err", "fatal!"]),
    "int": ("UCX_POSIX_RX_MAX_BUFS", ["-1", "0x400"], ["", "many"]),
    "ulunits": ("UCX_POSIX_FIFO_MAX_POLL", ["16", "Auto"], ["-", "lots"]),
    "bw": ("UCX_SYSV_BW", ["12800MBs", "auto"], ["12800MB", "fast"]),
    "key_value (times)": ("UCX_POSIX_SEND_OVERHEAD", ["am_short:10ns,am_bcopy:20ns", "5ns"],
                          ["am_short:10ns", "AM_SHORT:1ns,1ns"]),
    "double": ("UCX_SYSV_FIFO_RELEASE_FACTOR", ["0.5", "1e-1"], ["half", ""]),
    "uint": ("UCX_POSIX_RX_BUFS_GROW", ["8", "inf"], ["auto", "some"]),
    "memunits": ("UCX_POSIX_SEG_SIZE", ["8256", "16k"], ["16KiB", "1.5k"]),
}


def _wheel() -> Path | None:
    name, version = NIXL_PACKAGE
    found = sorted((contract_home() / f"{name}-{version}").glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def _need_wheel() -> Path:
    wheel = _wheel()
    require(wheel is not None, f"no {NIXL_PACKAGE[0]} {NIXL_PACKAGE[1]} wheel under {contract_home()}: "
                               "run bash .ci/contract-env.sh")
    assert wheel is not None
    return wheel


def _ask_ucx(function: str, cases: list[tuple[str, str]], scratch: Path) -> list:
    """Run pdkit.contract.ucx_config.FUNCTION(wheel, scratch, cases) in a child process (UCX keeps state)."""
    wheel = _need_wheel()
    run = subprocess.run(
        [sys.executable, "-c", "import json, sys; from pdkit.contract import ucx_config; "
         f"print(json.dumps(ucx_config.{function}(sys.argv[1], sys.argv[2], json.load(sys.stdin))))",
         str(wheel), str(scratch)],
        input=json.dumps(cases), env={k: v for k, v in os.environ.items() if not k.startswith("UCX_")},
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # UCX logs its refusals on stdout: the answer is the last line
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    path = tmp_path_factory.getbasetemp() / "ucx-kind-libs"
    path.mkdir(exist_ok=True)
    return path


def _labelled(cases: dict[str, tuple[str, list[str], list[str]]]) -> list[tuple[str, str, str, bool]]:
    return [(kind, name, value, good) for kind, (name, goods, bads) in sorted(cases.items())
            for good, values in ((True, goods), (False, bads)) for value in values]


def test_the_cases_cover_every_kind_the_table_holds():
    """Every kind of setting the pinned UCX has (but strings, which UCX reads as they are) is tried on a real
    setting of that kind, and each case's setting is of the kind it is listed under."""
    kinds = ucxcheck.table()["kinds"]
    tried = {kinds[name]["kind"] for name, _goods, _bads in [*UCP_CASES.values(), *WORKER_CASES.values()]}
    # array elements and key:value values are kinds too (their parser is the element's)
    tried |= {kinds[name]["of"]["kind"] for name, _g, _b in [*UCP_CASES.values(), *WORKER_CASES.values()]
              if "of" in kinds[name]}
    present = {k["kind"] for k in kinds.values()} | {k["of"]["kind"] for k in kinds.values() if "of" in k}
    # strings and colon lists read anything; the TCP port range needs a network interface for a worker: it is
    # held to its parser below (test_every_settings_own_parser_reads_exactly_what_pdkit_accepts)
    untried = present - tried - {"string", "path_array", "range_spec"}
    assert untried == set(), f"kinds of the table no case tries: {sorted(untried)}"
    for label, (name, _goods, _bads) in [*UCP_CASES.items(), *WORKER_CASES.items()]:
        assert label.split(" ")[0] == kinds[name]["kind"], (label, name, kinds[name]["kind"])


@pytest.mark.parametrize("kind, name, value, good", _labelled(UCP_CASES) + _labelled(WORKER_CASES))
def test_the_pure_judgement_reads_each_value_as_labelled(kind, name, value, good):
    """No wheel needed: the cases' labels (what the contract tests below hold to the real UCX)."""
    assert ucxcheck.value_accepted(name, value) == good, (kind, name, value)
    problem = ucxcheck.value_problem(name, value)
    if not good:
        assert problem is not None and name in problem[1] and repr(value) in problem[1] and "valid: " in problem[1]


@pytest.mark.contract
def test_ucp_config_modify_refuses_exactly_what_pdkit_refuses(scratch):
    cases = _labelled(UCP_CASES)
    statuses = _ask_ucx("config_modify", [(name, value) for _k, name, value, _g in cases], scratch)
    wrong = [(kind, name, value, f"UCX status {status}", f"pdkit accepts: {ucxcheck.value_accepted(name, value)}")
             for (kind, name, value, _good), status in zip(cases, statuses)
             if (status == 0) != ucxcheck.value_accepted(name, value)]
    assert wrong == []
    # and the labels are UCX's (a refusal is UCS_ERR_INVALID_PARAM, nothing else)
    assert [s == 0 for s in statuses] == [good for *_, good in cases]
    assert set(statuses) <= {0, -5}


def _worker_opens(env: dict[str, str], scratch: Path) -> tuple[bool, str]:
    wheel = _need_wheel()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")} | env
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from pdkit.contract.ucx_config import worker_opens; "
         "ok, why = worker_opens(sys.argv[1], sys.argv[2]); print(why); sys.exit(0 if ok else 1)",
         str(wheel), str(scratch)],
        env=child_env, cwd=REPO, capture_output=True, text=True, timeout=120)
    return run.returncode == 0, (run.stdout + run.stderr)[-1500:]


@pytest.mark.contract
@pytest.mark.parametrize("kind, name, value, good", _labelled(WORKER_CASES))
def test_a_worker_opens_exactly_with_the_transport_values_pdkit_accepts(kind, name, value, good, scratch):
    opens, log = _worker_opens({"UCX_TLS": WORKER_TLS, name: value}, scratch)
    assert opens == ucxcheck.value_accepted(name, value) == good, (kind, name, value, log)
    if not good:  # and validate calls it an error: the transport is in UCX_TLS
        assert ucxcheck.setting_problem(name, value, WORKER_TLS)[0] == "error"


@pytest.mark.contract
@pytest.mark.parametrize("env, opens, severity", [
    # UCS reads its global settings ignoring errors: the default is kept, the worker opens
    ({"UCX_LOG_LEVEL": "verbose"}, True, "warning"),
    # UCM drops its read's status
    ({"UCX_MEM_BISTRO_GRACE_DURATION": "10 ms"}, True, "warning"),
    # a transport UCX_TLS leaves out never reads its settings
    ({"UCX_TCP_NODELAY": "true"}, True, "warning"),
    # a memory domain that refuses its config is left out with its transports: the only one asked for
    ({"UCX_TLS": "posix", "UCX_POSIX_USE_PROC_LINK": "true"}, False, "error"),
    # the TCP connection manager's config is read at every worker's creation
    ({"UCX_TCP_CM_REUSEADDR": "true"}, False, "error"),
])
def test_what_a_refused_value_does_depends_on_its_table(env, opens, severity, scratch):
    env = {"UCX_TLS": WORKER_TLS, **env}
    name = next(k for k in env if k != "UCX_TLS")
    assert not ucxcheck.value_accepted(name, env[name])
    got, log = _worker_opens(env, scratch)
    assert got == opens, log
    assert ucxcheck.setting_problem(name, env[name], env["UCX_TLS"])[0] == severity


# values for every setting's own parser: each setting of the table with every one of these
EVERY_SETTING_VALUES = sorted({v for _n, goods, bads in [*UCP_CASES.values(), *WORKER_CASES.values()]
                               for v in goods + bads} | {
    "0", "1", "-1", "08", "0x", "0xg", "10", "1e400", "nan(1)", "10m", "10mb", "10t", "10tb", "10b", "10bb", "10bk",
    "10s", "10us", "10S", "5e-3s", "1ex", "infs", "10Ms", "1000-2000", "1000", "-5", "1-", "1-2-3", "a-b", "1--5",
    "phb:1us,node:2us,sys:3us", "phb:auto,node:auto,sys:auto", "\t10", "10\n", "SIGSIGNAL0", "ILL,,SEGV", "bt,debug"})


@pytest.mark.contract
def test_every_settings_own_parser_reads_exactly_what_pdkit_accepts(scratch):
    kinds = ucxcheck.table()["kinds"]
    cases = [(name, value) for name in sorted(kinds) for value in EVERY_SETTING_VALUES]
    read = _ask_ucx("parsers_read", cases, scratch)
    wrong = [(name, kinds[name]["kind"], value, f"UCX reads it: {ucx}")
             for (name, value), ucx in zip(cases, read) if ucx != ucxcheck.value_accepted(name, value)]
    assert wrong == [], f"{len(wrong)} of {len(cases)} disagree"
    assert 0 < sum(read) < len(read)  # both answers occur


def test_every_ucx_value_the_kit_renders_is_one_ucx_reads():
    """pdkit's own UCX values (the KV path profiles, the example inventories' ucx_env) pass the same judgement."""
    import glob

    from pdkit.inventory.loader import load
    from pdkit.render import flags
    from pdkit.spec import kvcost

    rendered = [(f"KV_PATHS[{p.name!r}]", name, value) for p in kvcost.KV_PATHS.values() for name, value in p.ucx_env]
    for inventory in sorted(glob.glob(str(REPO / "inventories" / "*.py"))):
        spec = load(inventory)
        for host in spec.gpu_hosts:
            rendered += [(f"{Path(inventory).name} {host.name}", n, v) for n, v in flags.ucx_env(spec, host).items()]
    assert len({name for _w, name, _v in rendered}) >= 3
    assert [(where, name, value) for where, name, value in rendered
            if ucxcheck.value_problem(name, value) is not None] == []
