"""Every UCX setting (name and default) of the UCX that the pinned nixl-cu13 wheel bundles, from UCX itself.

pdkit renders UCX variables into the engines' environment (`pdkit.flags.ucx_env`, the KV path
profiles in `pdkit.kvcost.KV_PATHS`). UCX ignores a variable it does not know with a warning, so a
misspelt or renamed one would silently do nothing. The names and defaults here come from the
wheel's own libraries: libucs, libucm, libuct and libucp (auditwheel-vendored in
`nixl_cu13.libs/`) are loaded with ctypes and UCX's own `ucs_config_parser_print_all_opts` prints
every registered configuration table with its defaults, as `ucx_info -c` does (the wheel has no
ucx_info). Transport modules that load lazily (cuda, ib) are not registered by the core libraries
and are not listed: the kit renders none of their variables.

    python -m pdkit.contract.ucx_config WHEEL > pdkit/data/ucx_config.json

Standard library only; needs x86_64 Linux (the wheel's platform). tests/test_contract_ucx.py
regenerates it from the wheel .ci/contract-env.sh downloads and fails on a difference.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

# the core libraries, in load order (each needs the ones before it: libucm calls ucs_load_modules)
CORE_LIBRARIES = ("libucs", "libucm", "libuct", "libucp")
# ucs_config_print_flags_t: UCS_CONFIG_PRINT_CONFIG (name=value lines)
_PRINT_CONFIG = 1


def _library_members(wheel: zipfile.ZipFile) -> dict[str, str]:
    """stem -> member name of each core library in the wheel's nixl_cu13.libs/ (names carry a hash)."""
    found = {}
    for name in wheel.namelist():
        base = name.rsplit("/", 1)[-1]
        if name.count("/") == 1 and name.endswith(".libs/" + base):
            stem = base.split("-", 1)[0]
            if stem in CORE_LIBRARIES and ".so" in base:
                found[stem] = name
    missing = [s for s in CORE_LIBRARIES if s not in found]
    if missing:
        raise SystemExit(f"{wheel.filename}: no {', '.join(missing)} under *.libs/")
    return found


def ucx_settings(wheel_path: str) -> dict[str, object]:
    """{"wheel": file name, "ucx_version": ..., "settings": {UCX_NAME: default}} from the wheel's libraries."""
    with zipfile.ZipFile(wheel_path) as wheel, tempfile.TemporaryDirectory() as tmp:
        members = _library_members(wheel)
        for member in members.values():
            wheel.extract(member, tmp)
        libs = {stem: ctypes.CDLL(os.path.join(tmp, member), mode=ctypes.RTLD_GLOBAL)
                for stem, member in ((s, members[s]) for s in CORE_LIBRARIES)}
        ucp_version = libs["libucp"].ucp_get_version_string
        ucp_version.restype = ctypes.c_char_p
        version = ucp_version().decode()

        libc = ctypes.CDLL(None)
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        out = Path(tmp) / "config.txt"
        stream = libc.fopen(str(out).encode(), b"w")
        if not stream:
            raise SystemExit(f"cannot open {out}")
        config_list = ctypes.c_void_p.in_dll(libs["libucs"], "ucs_config_global_list")
        print_all = libs["libucs"].ucs_config_parser_print_all_opts
        print_all.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
        print_all.restype = None
        print_all(stream, b"UCX_", _PRINT_CONFIG, ctypes.addressof(config_list))
        libc.fclose(stream)
        text = out.read_text()
    settings = {}
    for line in text.splitlines():
        m = re.match(r"^(UCX_[A-Z0-9_]+)=(.*)$", line)
        if m:
            settings[m.group(1)] = m.group(2)
    if "UCX_TLS" not in settings:
        raise SystemExit(f"{wheel_path}: UCX printed no UCX_TLS: not UCX's configuration ({len(text)} bytes)")
    return {"wheel": Path(wheel_path).name, "ucx_version": version, "settings": dict(sorted(settings.items()))}


def worker_opens(wheel_path: str, scratch: str) -> tuple[bool, str]:
    """Whether the wheel's UCX opens a UCP worker (every transport UCX_TLS allows) with the UCX_* variables of
    this process's environment, as NIXL does when an engine starts; (False, what UCX logged) where it refuses.
    Run it in a child process per environment: UCX reads its variables once. SCRATCH: where the libraries are
    unpacked (kept, so many children unpack once)."""
    with zipfile.ZipFile(wheel_path) as wheel:
        members = _library_members(wheel)
        for member in members.values():
            if not (Path(scratch) / member).exists():
                wheel.extract(member, scratch)
    libs = {stem: ctypes.CDLL(os.path.join(scratch, members[stem]), mode=ctypes.RTLD_GLOBAL) for stem in CORE_LIBRARIES}
    ucp = libs["libucp"]
    major, minor, release = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    ucp.ucp_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(release))
    config = ctypes.c_void_p()
    if ucp.ucp_config_read(None, None, ctypes.byref(config)):
        return False, "ucp_config_read failed"
    # ucp_params_t: field_mask = UCP_PARAM_FIELD_FEATURES, features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | AM;
    # the rest zero (a generous buffer: the struct's tail is not read without its field bits)
    params = (ctypes.c_uint64 * 64)()
    params[0], params[1] = 1, 1 | 2 | 8
    context = ctypes.c_void_p()
    if ucp.ucp_init_version(major, minor, ctypes.byref(params), config, ctypes.byref(context)):
        return False, "ucp_init failed"
    worker_params = (ctypes.c_uint64 * 64)()  # no field bits: UCX's defaults (one thread)
    worker = ctypes.c_void_p()
    status = ucp.ucp_worker_create(context, ctypes.byref(worker_params), ctypes.byref(worker))
    return status == 0, f"ucp_worker_create: status {status}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(ucx_settings(args[0]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
