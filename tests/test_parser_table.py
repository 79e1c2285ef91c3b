"""pdkit/upstream/parser_table.json is what the pinned wheels' own parsers say, regenerated here.

`pdkit validate` reads choices, aliases and prefixes from the committed table (it never
imports sglang); this test rebuilds the table from the contract virtualenvs and fails on any
difference, so a pin bump that changes a flag cannot leave the table behind.
"""

from __future__ import annotations

import pytest

from pdkit.contract import parsertable_gen
from pdkit.upstream import parsertable, venvs
from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES
from tests.conftest import require

contract = pytest.importorskip("pdkit.contract")


@pytest.mark.contract
def test_the_committed_parser_table_is_what_the_pinned_parsers_say():
    missing = [f"sglang-{v}" for v in SGLANG_RELEASES if venvs.sglang_python(v) is None]
    missing += [f"{p}-{v}" for p, v in ROUTER_RELEASES if venvs.router_python(p, v) is None]
    require(not missing, f"contract virtualenvs missing ({', '.join(missing)}): run `bash .ci/contract-env.sh`")
    fresh = parsertable_gen.dumps(parsertable_gen.generate())
    committed = parsertable.TABLE_PATH.read_text(encoding="utf-8")
    assert fresh == committed, \
        "pdkit/upstream/parser_table.json is stale: run `python -m pdkit.contract.parsertable_gen --write`"


def test_the_table_covers_every_pinned_release():
    table = parsertable.table()
    assert sorted(table["sglang"]) == sorted(SGLANG_RELEASES)
    assert sorted(table["router"]) == sorted(f"{p} {v}" for p, v in ROUTER_RELEASES)


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_resolution_follows_argparse(version):
    parser = parsertable.sglang_parser(version)
    # an alias and an unambiguous prefix resolve to the flag; an ambiguous prefix does not
    assert parser.resolve("--tensor-parallel-size")[0].dest == "tp_size"
    assert parser.resolve("--tp")[0].dest == "tp_size"
    option, why = parser.resolve("--disaggregation-decode")
    assert option is None and "ambiguous" in why and "--disaggregation-decode-enable-radix-cache" in why
    assert parser.option("--api-key").secret and not parser.option("--tp-size").secret


def test_argv_reading_splits_values_and_rejects_what_argparse_rejects():
    parser = parsertable.sglang_parser("0.5.23")
    parsed, problems = parser.parse(["--tp-size", "2", "--enable-metrics", "--attention-backend=triton", "-1"])
    assert [(p.option.dest, p.values) for p in parsed] == [("tp_size", ("2",)), ("enable_metrics", ()),
                                                           ("attention_backend", ("triton",))]
    assert [p.index for p in problems] == [4]  # a stray value
    _, problems = parser.parse(["--tp-size"])
    assert problems and "expects 1 value" in problems[0].message


def test_validate_imports_no_sglang(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    code = "import sys; from pdkit.cli import main; rc = main(['validate', 'inventories/cluster.py']); " \
           "assert not [m for m in sys.modules if m.split('.')[0] in ('sglang', 'smg', 'sglang_router', 'torch')], " \
           "sorted(sys.modules); sys.exit(rc)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
