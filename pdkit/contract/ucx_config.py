"""Every UCX setting (name, default, kind of value) of the UCX the pinned nixl-cu13 wheel bundles, from UCX itself.

pdkit renders UCX variables into the engines' environment (`pdkit.render.flags.ucx_env`, the KV path
profiles in `pdkit.spec.kvcost.KV_PATHS`). UCX ignores a variable it does not know with a warning, so a
misspelt or renamed one would silently do nothing. The names and defaults here come from the
wheel's own libraries: libucs, libucm, libuct and libucp (auditwheel-vendored in
`nixl_cu13.libs/`) are loaded with ctypes and UCX's own `ucs_config_parser_print_all_opts` prints
every registered configuration table with its defaults, as `ucx_info -c` does (the wheel has no
ucx_info). Transport modules that load lazily (cuda, ib) are not registered by the core libraries
and are not listed: the kit renders none of their variables.

The kind of each setting is the parser UCX reads its value with: the same libraries' registered
configuration tables (`ucs_config_global_list`, laid out as src/ucs/config/parser.h declares
`ucs_config_global_list_entry_t` and `ucs_config_field_t`) are walked with ctypes, and each field's
`parser.read` function is matched by address to the exported `ucs_config_sscanf_<kind>` it is. An enum's
or bitmap's choices are its parser's own NULL-terminated name list, a signal's are `ucs_signal_names`,
an array's element and a key:value list's keys and value come from the parser's argument, and the
syntax is the text the parser's `help` writes (what `ucx_info -c -f` prints as "syntax:"). The walk
must find exactly the settings UCX printed, or the generator stops: a layout change cannot pass unseen.
pdkit.upstream.ucxcheck judges a value by its kind exactly as those parsers read it.

    python -m pdkit.contract.ucx_config WHEEL > pdkit/upstream/data/ucx_config.json

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
        kinds = setting_kinds(libs["libucs"])
    settings = {}
    for line in text.splitlines():
        m = re.match(r"^(UCX_[A-Z0-9_]+)=(.*)$", line)
        if m:
            settings[m.group(1)] = m.group(2)
    if "UCX_TLS" not in settings:
        raise SystemExit(f"{wheel_path}: UCX printed no UCX_TLS: not UCX's configuration ({len(text)} bytes)")
    if set(kinds) != set(settings):
        raise SystemExit(f"{wheel_path}: the configuration tables walked ({len(kinds)} settings) are not the "
                         f"{len(settings)} UCX printed (differing: {sorted(set(kinds) ^ set(settings))[:8]}): "
                         "has ucs_config_field_t's layout changed? (src/ucs/config/parser.h)")
    return {"wheel": Path(wheel_path).name, "ucx_version": version, "settings": dict(sorted(settings.items())),
            "kinds": dict(sorted(kinds.items()))}


# ------------------------------------------------------------------ the kind of each setting
# src/ucs/config/parser.h of UCX 1.23.0: ucs_config_parser_t, ucs_config_array_t, ucs_config_field_t,
# ucs_config_key_field_t, ucs_config_key_value_param_t, ucs_config_global_list_entry_t
class _Parser(ctypes.Structure):
    _fields_ = [("read", ctypes.c_void_p), ("write", ctypes.c_void_p), ("clone", ctypes.c_void_p),
                ("release", ctypes.c_void_p), ("help", ctypes.c_void_p), ("doc", ctypes.c_void_p),
                ("arg", ctypes.c_void_p)]


class _Array(ctypes.Structure):
    _fields_ = [("elem_size", ctypes.c_size_t), ("parser", _Parser)]


class _Field(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dfl_value", ctypes.c_char_p), ("doc", ctypes.c_char_p),
                ("offset", ctypes.c_size_t), ("parser", _Parser)]


class _KeyField(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("doc", ctypes.c_char_p), ("offset", ctypes.c_size_t)]


class _KeyValueParam(ctypes.Structure):
    _fields_ = [("parser", _Parser), ("keys", ctypes.c_void_p)]


class _Link(ctypes.Structure):
    pass


_Link._fields_ = [("prev", ctypes.POINTER(_Link)), ("next", ctypes.POINTER(_Link))]


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("prefix", ctypes.c_char_p), ("table", ctypes.c_void_p),
                ("size", ctypes.c_size_t), ("list", _Link), ("flags", ctypes.c_uint8)]


# every parser UCS defines (ucs_config_sscanf_<kind>, parser.c); a field whose read function is none of
# them stops the generator
PARSER_KINDS = ("string", "int", "uint", "ulong", "ulunits", "double", "pos_double", "hex", "bool", "ternary",
                "ternary_auto", "on_off", "on_off_auto", "enum", "uint_enum", "bitmap", "bitmask", "time",
                "time_units", "bw", "bw_spec", "signo", "memunits", "array", "path_array", "allow_list",
                "allow_list_with_ranges", "table", "key_value", "range_spec")
_DEPRECATED_OFFSET = 2**64 - 1  # UCS_CONFIG_DEPRECATED_FIELD_OFFSET (SIZE_MAX)
_HELP = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p)


def _names(addr: int | None) -> list[str]:
    """A NULL-terminated char* array, as ucs_string_find_in_list walks it (it stops at the first NULL)."""
    out: list[str] = []
    if not addr:
        return out
    step = ctypes.sizeof(ctypes.c_char_p)
    while (name := ctypes.c_char_p.from_address(addr + step * len(out)).value) is not None:
        out.append(name.decode())
    return out


def _address(libucs: ctypes.CDLL, symbol: str) -> int:
    """Where LIBUCS's function SYMBOL is (a parser's read pointer is compared with it); a NULL one would
    match no parser, so it stops the generator."""
    address = ctypes.cast(getattr(libucs, symbol), ctypes.c_void_p).value
    if address is None:
        raise SystemExit(f"{symbol} resolves to NULL in {libucs._name}")
    return address


def _describe(parser: _Parser, kinds_at: dict[int, str], signals: list[str]) -> dict[str, object]:
    """{"kind", "syntax", and per kind "choices" / "of" / "keys"} of one parser."""
    kind = kinds_at.get(parser.read)
    if kind is None:
        raise SystemExit(f"a UCX setting's parser reads with {parser.read:#x}, none of ucs_config_sscanf_*")
    # the help text into 255 bytes of a 256-byte buffer, as ucs_config_parser_print_field asks for it
    buf = ctypes.create_string_buffer(256)
    _HELP(parser.help)(buf, 255, parser.arg)
    out: dict[str, object] = {"kind": kind, "syntax": buf.value.decode()}
    if kind in ("enum", "uint_enum", "bitmap"):
        out["choices"] = _names(parser.arg)
    elif kind == "signo":
        out["choices"] = signals
    elif kind in ("array", "path_array", "allow_list", "allow_list_with_ranges"):
        out["of"] = _describe(_Array.from_address(parser.arg).parser, kinds_at, signals)
    elif kind == "key_value":
        param = _KeyValueParam.from_address(parser.arg)
        keys: list[str] = []
        step = ctypes.sizeof(_KeyField)
        while (key := _KeyField.from_address(param.keys + step * len(keys))).name is not None:
            keys.append(key.name.decode())
        out["keys"] = keys
        out["of"] = _describe(param.parser, kinds_at, signals)
    return out


def _walk(libucs: ctypes.CDLL):
    """(table title, UCX_NAME, field) for every setting of every registered configuration table, named as
    ucs_config_parser_print_opts names it: "UCX_" + the table's prefix + the field's name (a sub-table's
    fields keep the table's prefix); aliases and deprecated fields are not settings."""
    table_read = _address(libucs, "ucs_config_sscanf_table")

    def walk(table: int, title: str, prefix: str):
        step = ctypes.sizeof(_Field)
        index = 0
        while (field := _Field.from_address(table + step * index)).name is not None:
            index += 1
            if field.parser.read == table_read:
                yield from walk(field.parser.arg, title, prefix)
            elif field.dfl_value is not None and field.offset != _DEPRECATED_OFFSET:
                yield title, "UCX_" + prefix + field.name.decode(), field

    head = _Link.in_dll(libucs, "ucs_config_global_list")
    node = head.next
    while ctypes.addressof(node.contents) != ctypes.addressof(head):
        entry = _Entry.from_address(ctypes.addressof(node.contents) - _Entry.list.offset)
        if entry.table:
            yield from walk(entry.table, entry.name.decode(), (entry.prefix or b"").decode())
        node = node.contents.next


def setting_kinds(libucs: ctypes.CDLL) -> dict[str, dict[str, object]]:
    """UCX_NAME -> the kind of value its parser reads (see _describe) and the title of its configuration table,
    for every setting UCX registers."""
    kinds_at = {_address(libucs, f"ucs_config_sscanf_{k}"): k for k in PARSER_KINDS}
    signals = _names(ctypes.addressof(ctypes.c_char_p.in_dll(libucs, "ucs_signal_names")))
    found: dict[str, dict[str, object]] = {}
    for title, name, field in _walk(libucs):
        # the table decides what a refused value does (pdkit.upstream.ucxcheck.IGNORING_TABLES)
        described = {**_describe(field.parser, kinds_at, signals), "table": title}
        if found.setdefault(name, described) != described:
            raise SystemExit(f"{name} is in two tables with different parsers: {found[name]} and {described}")
    return found


# ------------------------------------------------------------------ asking the wheel's UCX about values
def _load(wheel_path: str, scratch: str) -> dict[str, ctypes.CDLL]:
    """The wheel's core libraries, unpacked under SCRATCH once (kept: many child processes share them)."""
    with zipfile.ZipFile(wheel_path) as wheel:
        members = _library_members(wheel)
        for member in members.values():
            if not (Path(scratch) / member).exists():
                wheel.extract(member, scratch)
    return {stem: ctypes.CDLL(os.path.join(scratch, members[stem]), mode=ctypes.RTLD_GLOBAL)
            for stem in CORE_LIBRARIES}


def parsers_read(wheel_path: str, scratch: str, cases: list[tuple[str, str]]) -> list[bool]:
    """For each (UCX_NAME, value): whether the setting's own parser reads the value, called as UCX's
    ucs_config_parser_parse_field calls it (`parser.read(value, var, parser.arg) == 1`, anything else is
    "Invalid value"). Run it in a child process: what a parser allocates is not freed."""
    libucs = _load(wheel_path, scratch)["libucs"]
    fields = {name: field for _title, name, field in _walk(libucs)}
    read_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)
    out = []
    for name, value in cases:
        field = fields[name]
        var = ctypes.create_string_buffer(4096)  # larger than any setting's value (a key:value struct at most)
        out.append(read_type(field.parser.read)(value.encode(), var, field.parser.arg) == 1)
    return out


def setting_tables(wheel_path: str, scratch: str) -> dict[str, str]:
    """UCX_NAME -> the title of the configuration table that holds it ("UCP context", "UCS global", "tcp
    transport", ...): which of UCX's config reads refuses a bad value of it."""
    libucs = _load(wheel_path, scratch)["libucs"]
    return {name: title for title, name, _field in _walk(libucs)}


def config_modify(wheel_path: str, scratch: str, cases: list[tuple[str, str]]) -> list[int]:
    """For each (UCX_NAME, value): the status of ucp_config_modify(config, NAME without UCX_, value) on a
    config from ucp_config_read, as an application (NIXL) sets a UCP setting: 0 where UCX takes the value,
    UCS_ERR_INVALID_PARAM (-5) where the setting's parser refuses it. UCP's own settings and UCS's global
    ones are parsed here; a transport's are only kept for its config read (worker_opens judges those). Run
    it in a child process: UCS's global settings stay modified."""
    ucp = _load(wheel_path, scratch)["libucp"]
    ucp.ucp_config_modify.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    ucp.ucp_config_release.argtypes = [ctypes.c_void_p]
    out = []
    for name, value in cases:
        # a fresh config per value: the parser reads into the default, as UCX reads the environment
        config = ctypes.c_void_p()
        if ucp.ucp_config_read(None, None, ctypes.byref(config)):
            raise RuntimeError("ucp_config_read failed")
        out.append(ucp.ucp_config_modify(config, name.removeprefix("UCX_").encode(), value.encode()))
        ucp.ucp_config_release(config)
    return out


def worker_opens(wheel_path: str, scratch: str) -> tuple[bool, str]:
    """Whether the wheel's UCX opens a UCP worker (every transport UCX_TLS allows) with the UCX_* variables of
    this process's environment, as NIXL does when an engine starts; (False, what UCX logged) where it refuses.
    Run it in a child process per environment: UCX reads its variables once. SCRATCH: where the libraries are
    unpacked (kept, so many children unpack once)."""
    libs = _load(wheel_path, scratch)
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
