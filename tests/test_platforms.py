"""Platform tags: the wheelhouse asks pip for exactly the tags a node's pip accepts (packaging.tags)."""

from __future__ import annotations

from unittest import mock

import pytest
from packaging import _manylinux
from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

from pdkit.wheels.platforms import KNOWN_PLATFORMS, manylinux_tags, parse_glibc
from pdkit.wheels.wheelhouse import supported_tags

# the one x86_64 wheel llguidance 1.9.1 ships (a dependency of sglang 0.5.17 and 0.5.23)
LLGUIDANCE = "llguidance-1.9.1-cp39-abi3-manylinux_2_31_x86_64.whl"


def packaging_platform_tags(glibc: tuple[int, int], arch: str = "x86_64") -> tuple[str, ...]:
    """What packaging (pip's tag logic) yields on a host of GLIBC, plus its final linux_<arch>."""
    with mock.patch.object(_manylinux, "_get_glibc_version", return_value=glibc), mock.patch.object(_manylinux, "_have_compatible_abi", return_value=True):
        return (*_manylinux.platform_tags([arch]), f"linux_{arch}")


@pytest.mark.parametrize("glibc", [(2, 17), (2, 28), (2, 31), (2, 36), (2, 39), (2, 41)])
def test_tags_are_the_ones_packaging_computes_for_that_glibc(glibc):
    assert manylinux_tags(glibc) == packaging_platform_tags(glibc)


def test_aarch64_tags_stop_at_manylinux2014_as_packaging_does():
    assert manylinux_tags((2, 39), "aarch64") == packaging_platform_tags((2, 39), "aarch64")
    assert "manylinux2014_aarch64" in manylinux_tags((2, 39), "aarch64")


@pytest.mark.parametrize("name", ["debian12", "ubuntu2404", "debian13"])
def test_a_wheel_tagged_only_manylinux_2_31_installs_on_every_supported_node(name):
    platform = KNOWN_PLATFORMS[name]
    wheel_tags = parse_wheel_filename(LLGUIDANCE)[3]
    assert wheel_tags & set(supported_tags(platform)), f"{LLGUIDANCE} not installable on {name}"
    # ... and the old fixed list (2_34, 2_28, 2_17, 2014) really missed it: the bug this guards
    old = {Tag("cp39", "abi3", p) for p in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")}
    assert not wheel_tags & old


def test_a_wheel_for_a_newer_glibc_than_the_node_has_is_refused():
    debian12 = KNOWN_PLATFORMS["debian12"]
    newer = parse_wheel_filename("sglang-0.5.23-cp311-cp311-manylinux_2_39_x86_64.whl")[3]
    assert not newer & set(supported_tags(debian12))
    # the real sglang wheel (2_34) is fine on Debian 12's glibc 2.36
    assert parse_wheel_filename("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl")[3] & set(supported_tags(debian12))


def test_parse_glibc_accepts_what_nodes_print_and_rejects_garbage():
    assert parse_glibc("glibc 2.36") == (2, 36)
    assert parse_glibc("2.39") == (2, 39)
    with pytest.raises(ValueError):
        parse_glibc("musl")
