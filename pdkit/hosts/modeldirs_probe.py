import grp, json, os, pwd, shutil, subprocess, sys
keys, subs, user, paths = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3], sys.argv[4:]
out = {"user": user, "paths": {}}  # type: dict
try:
    pw = pwd.getpwnam(user)
    uid, gids = pw.pw_uid, set([pw.pw_gid] + [g.gr_gid for g in grp.getgrall() if user in g.gr_mem])
    out["user_exists"] = True
except KeyError:
    uid, gids = None, set()  # type: ignore[assignment]  # no such user: None, checked before use
    out["user_exists"] = False
runuser = shutil.which("runuser") if out["user_exists"] and os.geteuid() == 0 else None
out["how"] = "runuser" if runuser else "mode bits"
def grants(st, bit):
    # bit: 4 read, 1 search; the owner's, group's or others' bits as the kernel picks them
    if uid is not None and st.st_uid == uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in gids:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)
def readable(path, is_dir):
    if runuser:
        return all(subprocess.call([runuser, "-u", user, "--", "test", flag, path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
                   for flag in (("-r", "-x") if is_dir else ("-r",)))
    real = os.path.realpath(path)
    parts = real.split("/")
    for i in range(1, len(parts) - 1):
        if not grants(os.stat("/" + "/".join(parts[1:i + 1])), 1):
            return False
    st = os.stat(real)
    return grants(st, 4) and (not is_dir or grants(st, 1))
for path in paths:
    info = {}  # type: dict
    try:
        if not os.path.exists(path):
            info["exists"] = False
            parent = os.path.dirname(path.rstrip("/"))
            while parent not in ("", "/") and not os.path.exists(parent):
                parent = os.path.dirname(parent)
            info["existing_parent"] = parent or "/"
        elif not os.path.isdir(path):
            info.update(exists=True, is_dir=False)
        else:
            names = sorted(os.listdir(path))
            info.update(exists=True, is_dir=True)
            info["config"] = os.path.isfile(os.path.join(path, "config.json"))
            if info["config"]:
                # the keys pdkit.spec.modelconfig judges (CONFIG_KEYS and TEXT_CONFIG_KEYS: the first two arguments)
                try:
                    with open(os.path.join(path, "config.json")) as fh:
                        raw = json.load(fh)
                    if isinstance(raw, dict):
                        kept = {k: raw[k] for k in keys if k in raw}
                        for sub in subs:
                            if isinstance(raw.get(sub), dict):
                                kept[sub] = {k: raw[sub][k] for k in keys if k in raw[sub]}
                        if kept:
                            info["config_keys"] = kept
                except Exception as e:
                    info["config_error"] = "%s: %s" % (type(e).__name__, e)
            info["indexes"] = [n for n in names if n.endswith(".safetensors.index.json") or n == "pytorch_model.bin.index.json"]
            info["weights"] = [n for n in names if n in ("model.safetensors", "pytorch_model.bin")]
            info["safetensors"] = len([n for n in names if n.endswith(".safetensors")])
            missing = []
            for index in info["indexes"][:1]:
                try:
                    with open(os.path.join(path, index)) as fh:
                        shards = sorted(set((json.load(fh).get("weight_map") or {}).values()))
                    missing = [f for f in shards if not os.path.exists(os.path.join(path, f))]
                except Exception as e:
                    info["index_error"] = "%s: %s" % (type(e).__name__, e)
            info["missing_shards"] = missing[:3]
            info["missing_count"] = len(missing)
            targets = [(path, True)]
            if info["config"]:
                targets.append((os.path.join(path, "config.json"), False))
            first = (info["indexes"] + info["weights"])[:1]
            targets += [(os.path.join(path, n), False) for n in first]
            # a directory the user cannot enter hides its files too: name the directory alone then
            info["unreadable"] = [path] if not readable(path, True) else [p for p, d in targets[1:] if not readable(p, d)]
    except Exception as e:
        info["error"] = "%s: %s" % (type(e).__name__, e)
    out["paths"][path] = info
print("pdkit-model-dirs: " + json.dumps(out, sort_keys=True))
