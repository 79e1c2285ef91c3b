import json, sys
out = {"python": "%d.%d.%d" % tuple(sys.version_info[:3])}  # type: dict
def error(e):
    text = str(e).strip().splitlines()
    return type(e).__name__ + (": " + text[0] if text else "")
try:
    from importlib import metadata
    try:
        out["sglang_dist"] = metadata.version("sglang")
    except Exception:
        out["sglang_dist"] = None
except Exception:
    pass
try:
    import sglang
    out["sglang"] = getattr(sglang, "__version__", None)
except BaseException as e:
    out["sglang_error"] = error(e)
try:
    __NIXL_IMPORT__  # type: ignore[name-defined]  # replaced by pdkit.upstream.versions.NIXL_IMPORT before it is sent
    out["nixl"] = True
except BaseException as e:
    out["nixl"] = False
    out["nixl_error"] = error(e)
print("pdkit-engine-env-probe: " + json.dumps(out, sort_keys=True))
