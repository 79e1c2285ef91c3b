"""pdkit/pagesize.py: the page sizes SGLang snaps before start, held to the pinned wheels' source."""

from __future__ import annotations

import ast
import re

import pytest

from pdkit import startchecks
from pdkit.pagesize import PAGE_SNAPS, effective_page_size
from pdkit.versions import SGLANG_RELEASES
from tests.conftest import require


def test_the_snaps_chain_as_sglangs_do():
    assert effective_page_size("0.5.17", {"attention_backend": ("cutlass_mla",)})[0] == 128
    assert effective_page_size("0.5.23", {"attention_backend": ("cutlass_mla",)})[0] is None  # 0.5.23 dropped it
    assert effective_page_size("0.5.23", {"decode_attention_backend": ("trtllm_mla",), "page_size": ("32",)})[0] == 32
    assert effective_page_size("0.5.23", {"decode_attention_backend": ("trtllm_mla",), "page_size": ("16",)})[0] == 64
    assert effective_page_size("0.5.23", {"page_size": ("16",)}) == (16, "set by page_size")


@pytest.mark.contract
@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_the_table_is_the_wheels_own_order_of_snaps(version):
    """Each release's _mla_backend_page_constraints, read from the wheel: the backends it snaps, in order,
    the pages each keeps and the page it snaps to are PAGE_SNAPS' rows."""
    root = startchecks.sglang_root(version)
    require(root is not None, f"contract virtualenv sglang-{version} missing: run `bash .ci/contract-env.sh`")
    tree = ast.parse((root / "srt" / "arg_groups" / "overrides.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_mla_backend_page_constraints")
    rows = []
    for node in fn.body:
        if not isinstance(node, ast.If):
            continue
        text = ast.unparse(node)
        names = re.findall(r"== '([a-z0-9_]+)'", ast.unparse(node.test))
        if not names:
            continue
        kept = re.search(r"page_size not in \[([0-9, ]+)\]|page_size != (\d+)", text)
        kept_pages = (tuple(int(x) for x in (kept.group(1) or kept.group(2)).split(",")) if kept else None)
        snapped = int(re.findall(r"page_size = (\d+)", text)[-1])
        dests = tuple(re.findall(r"view\.([a-z_]+) ==", ast.unparse(node.test)))
        rows.append((names[0], dests, kept_pages, snapped))
    assert rows == [(b, d, k, s) for b, d, k, s in PAGE_SNAPS[version]], rows
