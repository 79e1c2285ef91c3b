"""pdkit.agent.jitcache: every engine's JIT/compile caches on its own persistent path, per release.

The rendered units and env files decide (what each engine's env file sets, where its unit may
write); the table's upstream facts are checked against the pinned sources: the sglang files in
the contract venvs (`bash .ci/contract-env.sh`), the kernel libraries' files in the wheelhouse
pool when it is there (`python -m pdkit.wheels.wheelhouse --engine sglang ...`), their versions
against the engine locks.
"""

from __future__ import annotations

import posixpath
import zipfile
from pathlib import Path

import pytest

from pdkit.agent import jitcache
from pdkit.inventory.loader import load
from pdkit.render import flags
from pdkit.render.plan import SYSTEMD_DIR, engine_env_path, plan_cluster
from pdkit.upstream.venvs import sglang_python
from pdkit.upstream.versions import SGLANG_RELEASES
from pdkit.wheels.enginelock import all_locks, canonical
from tests.conftest import REPO, require, write_inventory

EXAMPLES = ["cluster", "a6000", "multinode", "provided-env"]
VARS = [c.var for c in jitcache.CACHES]
# variables that name one directory on purpose: SGLang copies SGLANG_DG_CACHE_DIR into DG_JIT_CACHE_DIR
ALIASES = {frozenset({"SGLANG_DG_CACHE_DIR", "DG_JIT_CACHE_DIR"})}


def _env_file(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def _rendered(name: str, monkeypatch) -> list[tuple[str, str, dict[str, str], str]]:
    """(host, engine, its rendered env file, its rendered unit) of every engine placement of inventory NAME."""
    monkeypatch.chdir(REPO)
    spec = load(f"inventories/{name}.py")
    out = []
    for host, plan in plan_cluster(spec).items():
        files = {f.path: f.content for f in plan.files}
        for p in spec.placements(spec.host(host)):
            out.append((host, p.engine.name, _env_file(files[engine_env_path(spec, p.engine)]),
                        files[f"{SYSTEMD_DIR}/{p.engine.unit_name}"]))
    return out


def _under(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _overlap(a: str, b: str) -> bool:
    return _under(a, b) or _under(b, a)


def test_every_cache_variable_is_set_for_both_engines_of_a_pd_pair_on_one_node(monkeypatch):
    engines = [(h, e, env) for h, e, env, _ in _rendered("cluster", monkeypatch) if h == "gpu01"]
    assert sorted(e for _, e, _ in engines) == ["decode", "prefill"]
    for _, engine, env in engines:
        missing = [v for v in VARS if v not in env]
        assert not missing, f"{engine}: {missing}"
        assert {v: env[v] for v in VARS} == jitcache.cache_env("pdkit", engine, "0.5.23")


@pytest.mark.parametrize("name", EXAMPLES)
def test_two_engines_on_a_node_never_share_a_cache_path(name, monkeypatch):
    by_host: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for host, engine, env, _ in _rendered(name, monkeypatch):
        by_host.setdefault(host, []).append((engine, env))
    for host, engines in by_host.items():
        for i, (a, env_a) in enumerate(engines):
            for b, env_b in engines[i + 1:]:
                shared = [(va, vb) for va in VARS for vb in VARS if _overlap(env_a[va], env_b[vb])]
                assert not shared, f"{host}: {a} and {b} share {shared}"


def test_one_engines_variables_name_distinct_directories():
    env = jitcache.cache_env("pdkit", "prefill", "0.5.23")
    for i, a in enumerate(VARS):
        for b in VARS[i + 1:]:
            if frozenset({a, b}) in ALIASES:
                assert env[a] == env[b]
            else:
                assert not _overlap(env[a], env[b]), (a, b)


def test_another_release_gets_other_paths(base, tmp_path):
    old, new = jitcache.cache_env("pdkit", "decode", "0.5.17"), jitcache.cache_env("pdkit", "decode", "0.5.23")
    assert not [(a, b) for a in old.values() for b in new.values() if _overlap(a, b)]
    # through the spec: an engine's own sglang_version keys its caches
    cluster, hosts = base
    hosts["gpu02"]["pdkit_node"]["engines"][0]["sglang_version"] = "0.5.17"
    hosts["gpu02"]["pdkit_node"]["engines"][1]["sglang_version"] = "0.5.17"
    spec = load(write_inventory(tmp_path, hosts, cluster))
    for host, version in (("gpu01", "0.5.23"), ("gpu02", "0.5.17")):
        h = spec.host(host)
        for engine in h.node.engines:
            env = flags.engine_env(spec, h, engine)
            assert {v: env[v] for v in VARS} == jitcache.cache_env("pdkit", engine.name, version)


def test_the_engines_own_env_overrides_a_cache_path(base, tmp_path):
    cluster, hosts = base
    hosts["gpu01"]["pdkit_node"]["engines"][0]["env"] = {"TRITON_CACHE_DIR": "/srv/triton"}
    spec = load(write_inventory(tmp_path, hosts, cluster))
    h = spec.host("gpu01")
    assert flags.engine_env(spec, h, h.node.engines[0])["TRITON_CACHE_DIR"] == "/srv/triton"


def _writable_roots(unit: str) -> tuple[list[str], dict[str, str]]:
    """The persistent directories UNIT may write, read from its own lines, and those lines."""
    settings: dict[str, list[str]] = {}
    for line in unit.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            settings.setdefault(key.strip(), []).extend(value.split())
    # ProtectSystem=strict: the whole file system is read-only but for what the unit names
    assert settings.get("ProtectSystem") == ["strict"], settings.get("ProtectSystem")
    roots = [f"/var/lib/{d}" for d in settings.get("StateDirectory", [])]
    roots += [f"/var/cache/{d}" for d in settings.get("CacheDirectory", [])]
    roots += [f"/var/log/{d}" for d in settings.get("LogsDirectory", [])]
    roots += [p.lstrip("-+") for p in settings.get("ReadWritePaths", [])]
    flat = {k: " ".join(v) for k, v in settings.items()}
    return roots, flat


@pytest.mark.parametrize("name", EXAMPLES)
def test_cache_paths_are_persistent_paths_the_unit_may_write(name, monkeypatch):
    for host, engine, env, unit in _rendered(name, monkeypatch):
        roots, settings = _writable_roots(unit)
        # PrivateTmp (and RuntimeDirectory) are writable but gone at the next start: never a cache's place
        volatile = ["/tmp", "/var/tmp", "/run"]
        assert settings.get("PrivateTmp") == "yes"
        roots = [r for r in roots if not any(_under(r, v) for v in volatile)]
        assert roots, f"{host}/{engine}: the unit names no persistent writable directory"
        for var in VARS:
            path = env[var]
            assert posixpath.isabs(path) and posixpath.normpath(path) == path, (var, path)
            assert not any(_under(path, v) for v in volatile), f"{host}/{engine}: {var}={path}"
            assert any(_under(path, r) for r in roots), f"{host}/{engine}: {var}={path} is outside {roots}"


def test_cache_env_refuses_a_name_that_is_not_one_directory():
    for args in (("pdkit", "a/b", "0.5.23"), ("pdkit", "..", "0.5.23"), ("", "decode", "0.5.23"),
                 ("pdkit", "decode", "")):
        with pytest.raises(ValueError):
            jitcache.cache_env(*args)


# --- the table against the pinned sources -------------------------------------------------------


def test_the_table_describes_the_pinned_releases():
    for cache in jitcache.CACHES:
        assert set(cache.readers) <= set(SGLANG_RELEASES), cache.var
        assert cache.readers or cache.outside, cache.var
        for release, readers in cache.readers.items():
            assert readers, (cache.var, release)
            assert all(r.package != "sglang" or r.version == release for r in readers), (cache.var, release)
    # a newly pinned release must be looked up (its SGLang reads SGLANG_CACHE_DIR whatever else changed)
    sglang_dir = next(c for c in jitcache.CACHES if c.var == "SGLANG_CACHE_DIR")
    assert set(sglang_dir.readers) == set(SGLANG_RELEASES)


def test_the_tables_library_versions_are_the_engine_locks_pins():
    locks = all_locks()
    for cache in jitcache.CACHES:
        for release, readers in cache.readers.items():
            release_locks = [lk for lk in locks if lk.package == "sglang" and lk.version == release]
            assert release_locks, release
            for reader in readers:
                for lk in release_locks:
                    pinned = lk.pins.get(canonical(reader.package))
                    assert pinned == reader.version, (
                        f"{cache.var}: the table reads {reader.package}=={reader.version} for SGLang {release}, "
                        f"{lk.path.name} pins {pinned}: look the variable up in the new wheel and update "
                        "pdkit/agent/jitcache.py")


def _holds(data: bytes, needle: str) -> bool:
    return needle.encode() in data


def _member_holds(wheel: Path, member: str, needle: str) -> bool:
    """Whether MEMBER of WHEEL holds NEEDLE, read in chunks (libtorch_cuda.so is ~500 MB)."""
    want, tail = needle.encode(), b""
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            return False
        with z.open(member) as f:
            while chunk := f.read(1 << 24):
                if want in tail + chunk:
                    return True
                tail = chunk[-len(want):]
    return False


def _site_packages(python: Path) -> Path:
    [site] = (python.parent.parent / "lib").glob("python3*/site-packages")
    return site


def _installed(site: Path, package: str, version: str) -> bool:
    return any(canonical(d.name[: -len("-" + version + ".dist-info")]) == canonical(package)
               for d in site.glob(f"*-{version}.dist-info"))


@pytest.mark.parametrize("release", sorted(SGLANG_RELEASES))
def test_the_release_reads_the_variables_the_table_says(release):
    """Each pinned SGLang's own source (and any library its contract venv holds at the locked version)
    still reads the variable the table names: an upstream rename fails here."""
    python = sglang_python(release)
    require(python is not None, f"no SGLang {release} contract venv: run `bash .ci/contract-env.sh`")
    assert python is not None
    site = _site_packages(python)
    checked = 0
    for cache in jitcache.CACHES:
        for reader in cache.readers.get(release, ()):
            if reader.package != "sglang" and not _installed(site, reader.package, reader.version):
                continue  # not in the contract venv (CPU torch, no kernel libraries): the wheel test's
            path = site / reader.path
            assert path.is_file(), f"{cache.var}: SGLang {release} has no {reader.path}"
            assert _holds(path.read_bytes(), reader.needle or cache.var), (
                f"{reader.package} {reader.version} {reader.path} no longer holds {reader.needle or cache.var!r}: "
                "find where the release reads that cache now and update pdkit/agent/jitcache.py")
            checked += 1
    assert checked


def _pool_wheel(package: str, version: str) -> Path | None:
    from pdkit.wheels.wheelhouse import cache_root  # lazy: only this test reads the wheelhouse

    found = sorted((cache_root() / "pool").glob(f"*/{canonical(package).replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


@pytest.mark.parametrize("release", sorted(SGLANG_RELEASES))
def test_the_locked_libraries_read_the_variables_the_table_says(release):
    """The kernel libraries' wheels, where the wheelhouse pool holds them (CI builds no engine
    wheelhouse: skipped there, and the lock test above still holds the versions)."""
    readers = [(c, r) for c in jitcache.CACHES for r in c.readers.get(release, ()) if r.package != "sglang"]
    wheels = {(r.package, r.version): _pool_wheel(r.package, r.version) for _, r in readers}
    if not any(wheels.values()):
        pytest.skip(f"no wheel of SGLang {release}'s kernel libraries in the wheelhouse pool")
    checked = 0
    for cache, reader in readers:
        wheel = wheels[(reader.package, reader.version)]
        if wheel is None:
            continue
        assert _member_holds(wheel, reader.path, reader.needle or cache.var), (
            f"{wheel.name}: {reader.path} no longer holds {reader.needle or cache.var!r}: update pdkit/agent/jitcache.py")
        checked += 1
    assert checked


# ---- warm or cold: the stamp the engine gate writes at ready (issue 45 item 2) ----------------------------

def _kit_layout(monkeypatch, tmp_path):
    """Let a temporary directory stand for /var/cache/<user>/jit/<version>/<engine> (the stamp's rule)."""
    import re

    monkeypatch.setattr(jitcache, "_ENGINE_DIR", re.compile("^" + re.escape(str(tmp_path)) + r"/jit/[^/]+/[^/]+$"))


def test_the_engine_dir_is_the_kit_layout_s_parent_of_sglang_cache_dir_and_nothing_else():
    env = jitcache.cache_env("pdkit-engine", "decode", "0.5.23")
    assert jitcache.engine_dir_of(env) == "/var/cache/pdkit-engine/jit/0.5.23/decode"
    assert jitcache.engine_dir_of({**env, "SGLANG_CACHE_DIR": "/data/mine/sglang"}) is None  # the engine's own
    assert jitcache.engine_dir_of({**env, "SGLANG_CACHE_DIR": None}) is None
    assert jitcache.engine_dir_of({}) is None


def test_the_stamp_keeps_the_first_start_beside_the_last_and_starts_over_on_another_environment():
    calls = []

    def phases(seconds):
        return lambda: calls.append(seconds) or {"load_weight": 5.0, "scheduler_e2e": seconds}

    first = jitcache.next_stamp(None, "/opt/pdkit/engine-venv", "engine-aaa", "inv1", 100.0, phases(300.0))
    assert first["first"] == first["last"] and first["starts"] == 1 and first["venv"] == "engine-aaa"
    # a second gate of the same start changes nothing and reads no phases
    assert jitcache.next_stamp(first, "/opt/pdkit/engine-venv", "engine-aaa", "inv1", 101.0, phases(1.0)) is None
    second = jitcache.next_stamp(first, "/opt/pdkit/engine-venv", "engine-aaa", "inv2", 200.0, phases(60.0))
    assert second["first"]["invocation"] == "inv1" and second["last"]["invocation"] == "inv2" and second["starts"] == 2
    assert calls == [300.0, 60.0]
    assert jitcache.cold_extra_s(first) is None and jitcache.cold_extra_s(second) == 240.0
    lock_change = jitcache.next_stamp(second, "/opt/pdkit/engine-venv", "engine-bbb", "inv3", 300.0, phases(280.0))
    assert lock_change["starts"] == 1 and lock_change["first"]["invocation"] == "inv3"


def test_warm_needs_a_stamp_on_the_environment_the_link_points_at_now():
    stamp = jitcache.next_stamp(None, "/opt/pdkit/engine-venv", "engine-aaa", "inv1", 0.0,
                                lambda: {"scheduler_e2e": 42.0})
    state, why = jitcache.warm_state(None, None)
    assert state == "cold" and "no start of this engine passed the kit's engine gate" in why
    state, why = jitcache.warm_state(stamp, "engine-bbb")
    assert state == "cold" and "engine-aaa -> engine-bbb" in why
    state, why = jitcache.warm_state(stamp, "engine-aaa")
    assert state == "warm" and "1 gated start(s)" in why and "(42 s by SGLang's phases)" in why
    assert jitcache.start_seconds({}) is None and jitcache.start_seconds({"a": 1.0, "cuda_graph:x": 3.5}) == 3.5


def test_the_gate_s_stamp_makes_the_caches_warm_and_a_lock_change_cold_again(monkeypatch, tmp_path):
    _kit_layout(monkeypatch, tmp_path)
    venvs = tmp_path / "venvs"
    (venvs / "engine-aaa").mkdir(parents=True)
    (venvs / "engine-bbb").mkdir()
    link = tmp_path / "engine-venv"
    link.symlink_to(venvs / "engine-aaa")
    engine_dir = tmp_path / "jit" / "0.5.23" / "decode"
    env_file = tmp_path / "decode.env"
    env_file.write_text(f"# Rendered by pdkit\nSGLANG_CACHE_DIR={engine_dir}/sglang\nHOME=/var/lib/x\n")
    inputs = [str(tmp_path / "pdkit-engine-decode.service"), str(env_file), str(link)]
    assert jitcache.judge(str(engine_dir))["state"] == "cold"  # nothing yet: the directory is not even there
    jitcache.stamp_ready(inputs, "inv1", lambda: {"scheduler_e2e": 200.0})
    assert (engine_dir / jitcache.WARM_STAMP).is_file() and oct(engine_dir.stat().st_mode & 0o777) == "0o700"
    judged = jitcache.judge(str(engine_dir))
    assert judged["state"] == "warm" and judged["extra_s"] is None, judged
    jitcache.stamp_ready(inputs, "inv2", lambda: {"scheduler_e2e": 50.0})
    assert jitcache.judge(str(engine_dir))["extra_s"] == 150.0
    link.unlink()
    link.symlink_to(venvs / "engine-bbb")  # the deploy installed another lock
    judged = jitcache.judge(str(engine_dir))
    assert judged["state"] == "cold" and "engine-aaa -> engine-bbb" in judged["why"]
    # a new release: its directory has no stamp, and the cost is the other release's measured cold start
    other = jitcache.judge(str(tmp_path / "jit" / "0.5.24" / "decode"))
    assert other["state"] == "cold" and (other["extra_s"], other["extra_from"]) == (150.0, str(engine_dir))
    # an env file that names no kit directory, or nothing readable: no stamp, and never an exception
    jitcache.stamp_ready([str(tmp_path / "missing.env")], "inv3", lambda: {})
