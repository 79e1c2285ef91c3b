import grp, os, pwd, sys
try:
    import _json
    class _Decoding:
        strict, object_hook, object_pairs_hook, parse_float, parse_int, parse_constant, memo = True, None, None, float, int, float, {}  # type: ignore[var-annotated]
    _scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]  # the C scanner reads these attributes
    def loads(text):
        text = text.strip()
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("not JSON") from None
        if end != len(text):
            raise ValueError("extra data after the JSON value")
        return value
    quote = _json.encode_basestring_ascii
except (ImportError, AttributeError, TypeError):
    from json import loads  # type: ignore[assignment]
    from json.encoder import encode_basestring_ascii as quote
def dumps(v):
    # what json.dumps(v) gives for JSON's values (str, int, float, bool, None, lists and str-keyed dicts)
    if isinstance(v, str):
        return quote(v)
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        return float.__repr__(v) if v == v and v not in (float("inf"), float("-inf")) else {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(v)]
    if isinstance(v, dict):
        return "{" + ", ".join(quote(k) + ": " + dumps(x) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(dumps(x) for x in v) + "]"
    raise TypeError("not a probe value: %r" % (v,))
try:
    from _sha2 import sha256  # type: ignore[import-not-found]  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # 3.11 and older
    except ImportError:
        from hashlib import sha256
paths, units, user, venvs, packages, releases, texts = loads(sys.argv[1])
def run(argv):
    # argv's stdout (its stderr dropped, its exit status ignored), as subprocess.run would give it
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, null, 2)])
    finally:
        os.close(w)
        os.close(null)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()
def stat(p):
    try:
        st = os.stat(p)
    except OSError:
        return None
    kind = "dir" if os.path.isdir(p) else "file"
    if kind == "file":
        with open(p, "rb") as f:
            digest = sha256(f.read()).hexdigest()
    else:
        digest = None
    try:
        owner, group = pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        owner, group = str(st.st_uid), str(st.st_gid)
    return [kind, "%04o" % (st.st_mode & 0o7777), owner, group, digest]
def unit_states(names):
    # one systemctl call for every unit: blocks of key=value lines, one block per unit, in order
    if not names:
        return {}
    out = run(["systemctl", "show", "-p", "LoadState,ActiveState,UnitFileState", *names])
    blocks = [dict(l.split("=", 1) for l in b.splitlines() if "=" in l) for b in out.strip("\n").split("\n\n")]
    return {u: [v for v in (b.get("LoadState"), b.get("ActiveState"), b.get("UnitFileState")) if v] for u, b in zip(names, blocks)}
def has_user(name):
    try:
        pwd.getpwnam(name); grp.getgrnam(name); return True
    except KeyError:
        return False
def markers(v):
    try:
        return sorted(n for n in os.listdir(v) if n.startswith(".pdkit-bundle-"))
    except OSError:
        return []
def installed(pkgs):
    if not pkgs:
        return []
    out = run(["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *pkgs])
    return sorted(line.split()[0] for line in out.splitlines() if line.endswith(" installed"))
def release(d):
    # the release the node runs now (pdkit/agent/releases.py): CURRENT names it, its meta.json holds the hash
    try:
        cur = open(os.path.join(d, "CURRENT")).read().strip()
        with open(os.path.join(d, cur, "meta.json")) as f:
            meta = loads(f.read())
        # files and services too: what the current release laid down that a new plan may drop (pdkit/agent/changes.py)
        return {"id": cur, "hash": meta["hash"], "venvs": meta.get("venvs", {}), "files": sorted(meta.get("files", {})), "services": meta.get("services", {})}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
def text(kind, arg):
    # ("file", path): its text as `cat` prints it, None when it cannot be read; ("uname", field): as `uname -m`/`-r` print it
    if kind == "uname":
        return getattr(os.uname(), arg) + "\n"
    try:
        with open(arg, "rb") as f:
            return f.read().decode()
    except (OSError, UnicodeDecodeError):
        return None
rel = release(releases) if releases else {}
# the current release's files and units are read too: the deploy removes the ones the plan dropped
paths = sorted(set(paths) | set(rel.get("files", [])))
units = list(units) + [u for u in sorted(rel.get("services", {})) if u not in units]
print(dumps({"release": rel, "packages": installed(packages), "python": "%d.%d" % sys.version_info[:2], "glibc": os.confstr("CS_GNU_LIBC_VERSION") or "", "arch": os.uname().machine, "paths": {p: stat(p) for p in paths}, "units": unit_states(units), "user": all(has_user(u) for u in (user if isinstance(user, list) else [user])), "users": {u: has_user(u) for u in (user if isinstance(user, list) else [user])}, "venvs": {v: markers(v) for v in venvs}, "texts": {name: text(kind, arg) for name, kind, arg in texts}}))
