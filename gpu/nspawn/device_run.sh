#!/usr/bin/env bash
# The main job on the lent H200 (issue 22, call 3 of docs/gpu.md's sequence): boot the systemd
# host, then pdkit's own deploy over SSH into it (real SGLang 0.5.17 under systemd), a second run,
# doctor, bench, and a one-field roll. Run from the repository root on the device, after calls 1
# and 2 stashed the rootfs, wheels and monitoring layer in /root/stash. Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/pdkit-device-out}
mkdir -p "$OUT"
P=/root/pdkit-venv/bin
INV=inventories/h200-nspawn.py
export PDKIT_OFFLINE=1 PIP_NO_INDEX=1 PYTHONUNBUFFERED=1
. "$(dirname "${BASH_SOURCE[0]}")/step.sh"  # step NAME LIMIT_S CMD...
cp gpu-payload-nspawn/cxx/*.tar.xz /root/stash/ 2>/dev/null
step host 120 sh -c "python3 gpu/nspawn/host.py unpack --artefacts /root/stash && python3 gpu/nspawn/host.py up --engine-payload gpu-payload" || { tail -40 "$OUT/host.log"; exit 1; }
step deploy1 330 "$P/pyinfra" -y "$INV" deploy/pd.py
step deploy2 90 "$P/pyinfra" -y "$INV" deploy/pd.py
step doctor 60 "$P/pdkit" doctor "$INV"
step bench 150 "$P/pdkit" bench "$INV" --concurrency 1,16,64 --requests 64 --input-len 256 --output-len 128 --no-plot --label h200-nspawn --out "$OUT/bench"
# a one-field roll (decode cuda_graph_max_bs 64 -> 96): one node, so the drain gate must refuse it
python3 - "$INV" > /tmp/h200-nspawn-gbs.py <<'PY'
import sys
print(f'import runpy\n_b = runpy.run_path({sys.argv[1]!r})\n_b["_CLUSTER"]["tuning"].setdefault("decode", {{}})["cuda_graph_max_bs"] = 96\n'
      'gpu_nodes = _b["gpu_nodes"]\nall = _b["all"]  # noqa: A001')
PY
cp /tmp/h200-nspawn-gbs.py inventories/.h200-nspawn-gbs.py
step roll 60 "$P/pdkit" roll inventories/.h200-nspawn-gbs.py --drain-timeout 5
rm -f inventories/.h200-nspawn-gbs.py
for f in deploy1 deploy2 doctor bench roll; do echo "== $f"; tail -12 "$OUT/$f.log"; done
cat "$OUT/steps.txt"
