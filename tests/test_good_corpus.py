"""The good corpus (issue 46 item 3): every inventory shape the README, docs/ and SGLang's own recipes
for the pinned releases describe, and pdkit supports, is ACCEPTED by `pdkit validate`.

tests/corpus/good/*.py: one small inventory per shape. Each opens with a header:

    # Shape: what it is
    # Source: where it comes from ("; "-separated: a file of this repository, or sgl-project/sglang's
    #         docs path / "SGLang 0.5.x's" wheel file for the pinned release)
    # Release: SGLang 0.5.17 | 0.5.23
    # Warnings: none            or    # Warnings (why):
                                      #   host: field        (one line per warning validate prints)

The test holds validate to exit 0 and to exactly the warnings the header lists (host and field path;
the message may change). The one shape this corpus found refused (SGLang's MiMo MTP recipe spelled EAGLE without a draft
path) is accepted since, with a warning (tests/corpus/good/mtp-as-eagle-no-draft.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdkit import cli
from pdkit.upstream.versions import SGLANG_RELEASES

REPO = Path(__file__).resolve().parent.parent
GOOD = REPO / "tests" / "corpus" / "good"

# the shapes the corpus must hold, by file name (issue 46 item 3)
REQUIRED_SHAPES = (
    "pd-8gpu-numa-halves",        # the users' one 8-GPU box: prefill TP4 + decode TP4 on the two NUMA halves
    "pd-2gpu-tp1",                # one 2-GPU box, PD TP1 + TP1
    "pd-2gpu-tp1-0517",
    "unified-single-engine",
    "pd-two-nodes",               # PD across two nodes
    "pd-multinode-dp-attention",  # each engine spanning two nodes, with attention DP
    "pp2-overlap-default",        # pp 2, overlap schedule left at its default
    "pp2-overlap-default-0517",
    "attn-dp",
    "attn-dp-0517",
    "attn-dp-ep-deepep",
    "spec-nextn-decode",          # NEXTN on a decode
    "spec-eagle-decode-0517",     # EAGLE with a draft model on a decode
    "spec-pp-prefill",            # speculative decoding with pp on a prefill (0.5.23)
    "unified-nextn-tp2",
    "decode-radix-cache",         # 0.5.23
    "hicache-prefill",
    "chunked-prefill-off",        # chunked_prefill_size -1
    "fp8-kv-cache-acknowledged",  # with pdkit_cluster.answers.acknowledge
    "engine-venv",                # a provided engine environment
    "sim-engine",
    "pd-shared-1gpu",
    "router-api-key",             # auth api_key with its key, router settings at the bounds the routers accept
)

# a citation of a file of this repository: its path first
_REPO_PATH = re.compile(r"^(README\.md|docs/\S+|inventories/\S+\.py|pdkit/\S+\.py)")
_EXTERNAL = ("sgl-project/sglang ", "SGLang 0.5.17", "SGLang 0.5.23")


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.py"))


def _header(path: Path) -> list[str]:
    """The leading comment block, without the '# ' marks."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip() if line == "#" else line[2:])
    return lines


def _field(header: list[str], name: str) -> str | None:
    return next((line[len(name) + 1:].strip() for line in header if line.startswith(name + ":")), None)


def _citations(source: str) -> list[str]:
    """The '; '-separated citations of a Source line (a ';' inside parentheses stays in its citation)."""
    out, depth, current = [], 0, ""
    for i, ch in enumerate(source):
        depth += ch == "("
        depth -= ch == ")"
        if ch == ";" and depth == 0 and source[i + 1:i + 2] == " ":
            out.append(current.strip())
            current = ""
        else:
            current += ch
    return [c for c in out + [current.strip()] if c]


def _expected_warnings(header: list[str]) -> list[str]:
    """'host: field' per warning the header lists ('Warnings: none': [])."""
    start = next((i for i, line in enumerate(header) if line.startswith("Warnings")), None)
    assert start is not None, "the header has no 'Warnings:' line (say 'Warnings: none' or list them)"
    if header[start].startswith("Warnings: none"):
        return []
    listed = []
    for line in header[start + 1:]:
        match = re.fullmatch(r"\s{2,}(\S+: \S+)", line)
        if match is None:
            break
        listed.append(match.group(1))
    assert listed, "'Warnings (...):' lists no 'host: field' line below it"
    return sorted(listed)


def _printed_warnings(stdout: str) -> list[str]:
    """'host: field' of each 'warning HOST: FIELD: message' line validate printed."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("warning "):
            host, field, _ = line[len("warning "):].split(": ", 2)
            out.append(f"{host}: {field}")
    return sorted(out)


@pytest.mark.parametrize("path", _files(GOOD), ids=lambda p: p.stem)
def test_good_shape_is_accepted(path: Path, capsys) -> None:
    header = _header(path)
    expected = _expected_warnings(header)
    rc = cli.main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert rc == 0, f"{path.name} is a documented shape, refused:\n{err}"
    assert _printed_warnings(out) == expected, (
        f"{path.name}: the warnings validate prints differ from its header's list\n{out}")


@pytest.mark.parametrize("path", _files(GOOD), ids=lambda p: p.stem)
def test_header_names_its_source(path: Path) -> None:
    header = _header(path)
    assert _field(header, "Shape"), f"{path.name}: no '# Shape:' line"
    source = _field(header, "Source")
    assert source, f"{path.name}: no '# Source:' line naming the document or recipe it comes from"
    for citation in _citations(source):
        if citation.startswith(_EXTERNAL):
            continue
        match = _REPO_PATH.match(citation)
        assert match, (f"{path.name}: citation {citation!r} is neither a file of this repository nor "
                       f"one of {_EXTERNAL}")
        assert (REPO / match.group(1)).is_file(), f"{path.name}: cites {match.group(1)}, which does not exist"
    release = _field(header, "Release") or ""
    assert any(f"SGLang {v}" in release for v in SGLANG_RELEASES), (
        f"{path.name}: '# Release:' names none of the pinned releases {sorted(SGLANG_RELEASES)}")
    version = re.search(r"\"sglang_version\": \"([0-9.]+)\"", path.read_text())
    assert version and f"SGLang {version.group(1)}" in release, (
        f"{path.name}: '# Release: {release}' is not the inventory's sglang_version")


def test_corpus_holds_the_shapes() -> None:
    present = {p.stem for p in _files(GOOD)}
    missing = [s for s in REQUIRED_SHAPES if s not in present]
    assert not missing, f"tests/corpus/good/ lacks the shapes {missing}"
