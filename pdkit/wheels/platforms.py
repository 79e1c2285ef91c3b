"""Which binary wheels a node can install: its Python and the platform tags its glibc accepts.

pip's `--platform` matches tags exactly, so the wheelhouse must name every tag a node's pip
would accept, not a few: llguidance 1.9.1 ships one x86_64 wheel, tagged only
`manylinux_2_31`, and a list of 2_34 / 2_28 / 2_17 never finds it. The list below is the one
`packaging.tags` (pip's own tag logic) yields on a glibc host: `manylinux_2_N` from the node's
glibc down, the legacy aliases at the glibc versions they stand for, then `linux_<arch>`
(tests/test_platforms.py compares the two).

    >>> manylinux_tags((2, 36))[:2]
    ('manylinux_2_36_x86_64', 'manylinux_2_35_x86_64')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# packaging.tags._manylinux._LEGACY_MANYLINUX_MAP: the PEP 513/571/599 names of glibc 2.17 / 2.12 / 2.5
_LEGACY_ALIASES = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
# packaging goes down to glibc 2.5 on x86 (manylinux1, the oldest policy); other arches to 2.17
_OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5}
_DEFAULT_OLDEST_MINOR = 17


@dataclass(frozen=True)
class NodePlatform:
    """A node OS as the wheelhouse sees it: the system Python venvs are made with, and glibc."""

    name: str
    python: str  # MAJOR.MINOR of /usr/bin/python3
    glibc: tuple[int, int]
    arch: str = "x86_64"

    @property
    def tags(self) -> tuple[str, ...]:
        return manylinux_tags(self.glibc, self.arch)

    @property
    def glibc_text(self) -> str:
        return f"{self.glibc[0]}.{self.glibc[1]}"


# The node OSes pdkit supports (the node layer's repositories: pdkit/render/node.py), with what they ship.
KNOWN_PLATFORMS: dict[str, NodePlatform] = {
    "debian12": NodePlatform("debian12", "3.11", (2, 36)),
    "ubuntu2404": NodePlatform("ubuntu2404", "3.12", (2, 39)),
    "debian13": NodePlatform("debian13", "3.13", (2, 41)),
}


def manylinux_tags(glibc: tuple[int, int], arch: str = "x86_64") -> tuple[str, ...]:
    """Every platform tag pip on a glibc GLIBC node accepts, most specific first."""
    major, minor = glibc
    if major != 2:
        raise ValueError(f"glibc {major}.{minor}: only glibc 2.x is known")
    tags = []
    for m in range(minor, _OLDEST_GLIBC_MINOR.get(arch, _DEFAULT_OLDEST_MINOR) - 1, -1):
        tags.append(f"manylinux_2_{m}_{arch}")
        if (2, m) in _LEGACY_ALIASES:
            tags.append(f"{_LEGACY_ALIASES[(2, m)]}_{arch}")
    tags.append(f"linux_{arch}")
    return tuple(tags)


def parse_glibc(text: str) -> tuple[int, int]:
    """`glibc 2.36` (os.confstr / getconf GNU_LIBC_VERSION) or `2.36` -> (2, 36)."""
    found = re.search(r"(\d+)\.(\d+)", text or "")
    if not found:
        raise ValueError(f"not a glibc version: {text!r}")
    return int(found.group(1)), int(found.group(2))


def platform_for(python: str, glibc: tuple[int, int], arch: str = "x86_64") -> NodePlatform:
    """The platform of a node from what it reports, named after the known OS it matches, if any."""
    for known in KNOWN_PLATFORMS.values():
        if (known.python, known.glibc, known.arch) == (python, glibc, arch):
            return known
    return NodePlatform(f"python{python}-glibc{glibc[0]}.{glibc[1]}-{arch}", python, glibc, arch)
