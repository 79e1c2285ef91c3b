"""Bundles: deterministic bytes, and an unchanged set of wheels is not read (packed) again."""

from __future__ import annotations

import os

from pdkit import wheelhouse


def test_a_bundle_is_packed_once_per_set_of_inputs(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "cache_root", lambda: tmp_path / "cache")
    pool = tmp_path / "pool"
    pool.mkdir()
    a, b = pool / "a-1.0-py3-none-any.whl", pool / "b-2.0-py3-none-any.whl"
    a.write_bytes(b"wheel a")
    b.write_bytes(b"wheel b")
    packed = []
    real = wheelhouse._pack
    monkeypatch.setattr(wheelhouse, "_pack", lambda *args: packed.append(args[0]) or real(*args))

    first = wheelhouse.pack("router", [b, a], ["a==1.0", "b==2.0"])
    again = wheelhouse.pack("router", [a, b], ["a==1.0", "b==2.0"])
    assert packed == ["router"]  # the second call read the kept digest
    assert again == first and first.tarball.is_file()

    # a changed wheel (new bytes, new size or mtime) is packed again, with a new digest
    a.write_bytes(b"wheel a, rebuilt")
    changed = wheelhouse.pack("router", [a, b], ["a==1.0", "b==2.0"])
    assert packed == ["router", "router"] and changed.digest != first.digest

    # the digest depends only on names and contents: same bytes, new mtime -> same digest
    a.write_bytes(b"wheel a")
    os.utime(a, ns=(1, 1))
    assert wheelhouse.pack("router", [a, b], ["a==1.0", "b==2.0"]).digest == first.digest

    # a kept digest whose tarball is gone is not trusted
    first.tarball.unlink()
    assert wheelhouse.pack("router", [a, b], ["a==1.0", "b==2.0"]).tarball.is_file()
