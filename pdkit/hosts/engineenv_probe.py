import json, os, stat, subprocess, sys
venv, inner = sys.argv[1], sys.argv[2]
p = os.path.join(venv, "bin", "python")
out = {"path": p}  # type: dict
if not os.path.lexists(p):
    out["exists"] = False
    out["venv_exists"] = os.path.isdir(venv)
elif not os.path.exists(p):
    out.update(exists=False, link=os.readlink(p))
elif os.path.isdir(p) or not os.access(p, os.X_OK):
    out.update(exists=True, executable=False, mode="%04o" % stat.S_IMODE(os.stat(p).st_mode))
else:
    out.update(exists=True, executable=True)
    try:
        proc = subprocess.run([p, "-B", "-c", inner], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=300,
                              universal_newlines=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        found = [l for l in proc.stdout.splitlines() if l.startswith("pdkit-engine-env-probe: ")]
        if found:
            out.update(json.loads(found[-1].split(": ", 1)[1]))
        else:
            lines = [l.strip() for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
            out["error"] = "exit %d: %s" % (proc.returncode, lines[-1] if lines else "no output")
    except subprocess.TimeoutExpired:
        out["error"] = "did not finish in 300 s"
    except OSError as e:
        out["error"] = str(e)
print("pdkit-engine-env: " + json.dumps(out, sort_keys=True))
