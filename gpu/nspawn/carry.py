"""Pack what the one-node device run needs into equal chunks, one carry per device call.

The device tool sends the session's own checkout (plus the paths a call names in `carry`, 64 MiB
in all per call): a helper's worktree does not travel, and the artefacts (rootfs 55 MiB, wheels
39 MiB, the engine payload 43 MiB, the layers 28 MiB) do not fit one call beside the ~8.5 MiB
tree. So this makes one uncompressed tar of everything (the members are xz already): this
branch's tree as `git archive` (wt.tar.xz), gpu-payload-nspawn/{rootfs,monitoring,cxx,wheels}/*.tar.xz
and the engine payload gpu-payload/{site.tar.xz,nixl.tar.xz,model/} (not router.tar.xz: the
router comes from the wheelhouse), and splits it into N chunks under DEST/cK/ (DEST inside the
session's checkout, git-ignored there). Each call copies its chunk to /root/stash (kept while the
machine stays warm: calls back to back); the last one joins them (`unbundle` below).

    python3 gpu/nspawn/carry.py --dest /work/main/.gpu1 --parts 4 --tree-mib 8.6
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2**20
MEMBERS = [
    "gpu-payload-nspawn/rootfs/rootfs-trixie.tar.xz",
    "gpu-payload-nspawn/monitoring/rootfs-trixie-monitoring.tar.xz",
    "gpu-payload-nspawn/cxx/rootfs-trixie-cxx.tar.xz",
    "gpu-payload-nspawn/wheels/wheels.tar.xz",
    "gpu-payload-nspawn/manifest.json",
    "gpu-payload/site.tar.xz",
    "gpu-payload/nixl.tar.xz",
    "gpu-payload/model",
]



def unbundle(stash: str = "/root/stash", work: str = "/root/b", wt: str = "/root/wt") -> str:
    """What the last call runs first: join the chunks, check them, lay the tree and the artefacts out in WT."""
    return (f"mkdir -p {work} {wt} && cat {stash}/bundle.part-* | tar -x -C {work} && (cd {work} && sha256sum -c SHA256SUMS --quiet) "
            f"&& tar -xJ -C {wt} -f {work}/wt.tar.xz && cp -r {work}/gpu-payload-nspawn {work}/gpu-payload {wt}/ "
            f"&& rm -rf {work} {stash}/bundle.part-*")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, required=True, help="a git-ignored folder inside the session's checkout")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--tree-mib", type=float, required=True, help="what the session's checkout sends by itself")
    ap.add_argument("--ref", default="HEAD", help="what of this repository travels (git archive)")
    args = ap.parse_args(argv)
    missing = [m for m in MEMBERS if not (REPO / m).exists()]
    if missing:
        raise SystemExit(f"missing: {', '.join(missing)} (gpu/nspawn/build.py; gpu/run_gpu_tier.py --dry --single-gpu)")
    wt = subprocess.run(["git", "archive", "--format=tar", args.ref], cwd=REPO, capture_output=True, check=True).stdout
    wt = subprocess.run(["xz", "-6", "-T1"], input=wt, capture_output=True, check=True).stdout
    buf = io.BytesIO()
    sums = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("wt.tar.xz")
        info.size, info.mode = len(wt), 0o644
        tar.addfile(info, io.BytesIO(wt))
        sums.append(f"{hashlib.sha256(wt).hexdigest()}  wt.tar.xz")
        for m in MEMBERS:
            tar.add(REPO / m, arcname=m)
            for f in sorted(p for p in [(REPO / m), *(REPO / m).rglob("*")] if p.is_file()):
                rel = f.relative_to(REPO)
                sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {rel}")
        text = ("\n".join(sums) + "\n").encode()
        info = tarfile.TarInfo("SHA256SUMS")
        info.size, info.mode = len(text), 0o644
        tar.addfile(info, io.BytesIO(text))
    data = buf.getvalue()
    size = -(-len(data) // args.parts)
    room = LIMIT - args.tree_mib * 2**20
    if size > room:
        raise SystemExit(f"{len(data) / 2**20:.1f} MiB in {args.parts} parts is {size / 2**20:.1f} MiB a call, "
                         f"over the {room / 2**20:.1f} MiB left beside the tree: more --parts")
    for old in args.dest.glob("c*/bundle.part-*"):
        old.unlink()
    for k in range(args.parts):
        d = args.dest / f"c{k + 1}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"bundle.part-{k + 1:02d}").write_bytes(data[k * size:(k + 1) * size])
    print(f"{len(data) / 2**20:.1f} MiB (wt.tar.xz {len(wt) / 2**20:.1f} MiB at {args.ref}) in {args.parts} chunks of "
          f"{size / 2**20:.1f} MiB, {room / 2**20 - size / 2**20:.1f} MiB to spare per call, under {args.dest}")
    for k in range(args.parts):
        step = f"mkdir -p /root/stash && cp {args.dest.name}/c{k + 1}/bundle.part-* /root/stash/ && ls -la /root/stash"
        if k == args.parts - 1:
            step += f" && {unbundle()}"
        print(f"call {k + 1}: carry [\"{args.dest.name}/c{k + 1}\"]: {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
