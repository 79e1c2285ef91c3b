"""Issue 47 items 5 and 7 on the lab: `pdkit stage` sends a generated model (~256 MB of random bytes in
safetensors-named shards plus config.json, seed 47) to a lab host over real SSH; an interrupted transfer and
a corrupted shard (on the node's disk, then from a corrupted source) replace nothing; the next run resumes,
verifies and switches the model path atomically. Then a small model (4 MB) from one lab host to another
(`--source node:HOST`): streamed through this machine (`--via control`) from a source whose disk no
longer matches its manifest (refused as the source's fault, nothing replaced), then, the source
repaired, resumed by the target pulling from the source's one-transfer server. Its own model path (not
the deployed engines'), so it needs no deploy and leaves the lab's cluster as it was.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdkit.agent import weightstore as store
from pdkit.lab.lifecycle import ssh_run
from tests.conftest import REPO

pytestmark = pytest.mark.lab

PDKIT = str(Path(sys.executable).parent / "pdkit")
PARENT = "/srv/pdkit-stage-lab"
MODEL = f"{PARENT}/m"
SHARDS, SHARD_MB = 4, 64


def generated_model(directory: Path, seed: int, shards: int, shard_mb: int) -> None:
    """A model directory as a checkpoint lays it out: config.json, an index and safetensors-named shards of
    random bytes (deterministic: SEED)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for name in names:
        with open(directory / name, "wb") as fh:
            for _ in range(shard_mb):
                fh.write(rng.randbytes(1 << 20))
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {f"layer.{i}": n for i, n in enumerate(names)}}))


def inventory(tmp_path: Path, *hosts: str) -> str:
    """The lab's inventory cut to HOSTS with the model at MODEL."""
    path = tmp_path / "stage_inventory.py"
    path.write_text(f'''
import runpy
_lab = runpy.run_path({str(REPO / "inventories/lab.py")!r})
gpu_nodes = [h for h in _lab["gpu_nodes"] if h[0] in {list(hosts)!r}]
_cluster = {{k: v for k, v in _lab["all"][1]["pdkit_cluster"].items() if k != "secrets"}}
all = ([h[0] for h in gpu_nodes], {{"pdkit_cluster": {{**_cluster, "model": {{"path": {MODEL!r}, "served_name": "m"}}}}}})
''')
    return str(path)


def stage(inv: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PDKIT, "stage", inv, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def on_node(info, host: str, command: str) -> str:
    done = ssh_run(info, host, command, timeout=60)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


def test_weights_staged_interrupted_corrupted_resumed_and_switched(lab, tmp_path):
    t_start = time.monotonic()
    host = lab.gpu_hosts[0].name
    inv = inventory(tmp_path, host)
    good, v2, bad = tmp_path / "v1", tmp_path / "v2", tmp_path / "v2-corrupted"
    generated_model(good, seed=1, shards=2, shard_mb=4)
    generated_model(v2, seed=47, shards=SHARDS, shard_mb=SHARD_MB)
    manifest = tmp_path / "v2.json"
    on_node(lab, host, f"rm -rf {PARENT} && mkdir -p {PARENT}")

    # 1. the good weights the engines serve: staged with a manifest pdkit writes, the path made a link
    first = stage(inv, "--source", str(good))
    assert first.returncode == 0, first.stderr
    v1 = on_node(lab, host, f"readlink {MODEL}").strip()
    assert v1.startswith(".m.pdkit-w-") and "active: " + MODEL in first.stdout
    served = on_node(lab, host, f"cd {MODEL}/ && sha256sum *.safetensors config.json")

    def still_serving_v1() -> None:
        assert on_node(lab, host, f"readlink {MODEL}").strip() == v1
        assert on_node(lab, host, f"cd {MODEL}/ && sha256sum *.safetensors config.json") == served

    # 2. interrupted: the deploying process killed mid-transfer (after the first shard went through)
    t0 = time.monotonic()
    proc = subprocess.Popen([PDKIT, "stage", inv, "--source", str(v2), "--write-manifest", str(manifest)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if ".safetensors" in line and " sent in " in line:  # shard 1 whole (config.json goes first)
            time.sleep(0.15)
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    interrupted_s = time.monotonic() - t0
    assert proc.returncode == -signal.SIGKILL, "the transfer ended before it could be interrupted"
    still_serving_v1()
    wid = store.weights_id(store.parse_manifest(manifest.read_bytes()))
    partial = store.partial_dir(MODEL, wid)
    listing = on_node(lab, host, f"stat -c '%n %s %a' {partial}/*.safetensors {partial} 2>/dev/null || true")
    assert f"{partial} " in listing and listing.splitlines()[-1].endswith(" 700"), listing

    # 3. corrupted on the node's disk: a shard that had arrived whole gets three bytes overwritten
    shard1 = f"{partial}/model-00001-of-{SHARDS:05d}.safetensors"
    on_node(lab, host, f"printf 'BAD' | dd of={shard1} bs=1 seek=4096 conv=notrunc status=none")
    # ... and a corrupted source: the same manifest, one byte of shard 1 flipped on this machine
    bad.mkdir()
    victim = bad / f"model-00001-of-{SHARDS:05d}.safetensors"
    for p in v2.iterdir():  # the same files (links: no second 268 MB to generate), shard 1 a copy to flip
        (shutil.copyfile if p.name == victim.name else os.link)(p, bad / p.name)
    with open(victim, "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    corrupted = stage(inv, "--source", str(bad), "--manifest", str(manifest))
    assert corrupted.returncode == 1, corrupted.stdout + corrupted.stderr
    # the node's corrupted shard found and not trusted
    assert "the staged copy had" in corrupted.stderr, corrupted.stderr
    assert re.search(r"model-00001-of-00004\.safetensors: sha256 \w+\.\.\. does not match the manifest",
                     corrupted.stderr), corrupted.stderr
    assert "were not replaced" in corrupted.stderr
    cut = re.search(rf"{partial}/model-00002-of-{SHARDS:05d}\.safetensors (\d+) ", listing)
    if cut and 0 < int(cut.group(1)) < SHARD_MB << 20:  # shard 2, cut by the kill, continued from its end
        assert f"resumed at {int(cut.group(1)) / 1e6:,.1f} MB" in corrupted.stderr, corrupted.stderr
    still_serving_v1()
    assert on_node(lab, host, f"test -d {store.version_dir(MODEL, wid)} && echo yes || echo no").strip() == "no"

    # 4. resumed from the good source: shard 1 again, the rest skipped or resumed; staged, verified, not switched
    t0 = time.monotonic()
    resumed = stage(inv, "--source", str(v2), "--manifest", str(manifest))
    resume_s = time.monotonic() - t0
    assert resumed.returncode == 0, resumed.stderr
    sent = float(re.search(r"verified, ([\d.,]+) MB sent", resumed.stdout).group(1).replace(",", ""))
    # shard 1 again (the corrupted run sent the others, shard 2 resumed where the kill cut it): one shard
    assert sent == pytest.approx(SHARD_MB * 1.048576, abs=0.1), resumed.stdout + resumed.stderr
    assert "skipped" in resumed.stderr and "NOT active" in resumed.stdout
    still_serving_v1()  # a path that serves other weights switches only with --activate

    # 5. switched atomically; the old weights kept beside it (a release prunes them once unused)
    switched = stage(inv, "--source", str(v2), "--manifest", str(manifest), "--activate")
    assert switched.returncode == 0 and "0.0 MB sent" in switched.stdout, switched.stdout + switched.stderr
    assert on_node(lab, host, f"readlink {MODEL}").strip() == store.version_name(MODEL, wid)
    local = subprocess.run(["sha256sum", *sorted(p.name for p in v2.iterdir())], cwd=v2, capture_output=True,
                           text=True).stdout
    assert on_node(lab, host, f"cd {MODEL}/ && sha256sum {' '.join(sorted(p.name for p in v2.iterdir()))}") == local
    assert on_node(lab, host, f"test -d {PARENT}/{v1} && echo kept").strip() == "kept"
    # root owns them; the engines' group reads them where it exists, else everyone reads: nobody writes
    group = on_node(lab, host, "getent group pdkit >/dev/null && echo pdkit || echo root").strip()
    modes = set(on_node(lab, host, f"stat -L -c '%U %G %a' {MODEL} {MODEL}/*").split("\n")) - {""}
    want = {"root pdkit 750", "root pdkit 640"} if group == "pdkit" else {"root root 755", "root root 644"}
    assert modes == want, modes
    print(f"\nstage lab: interrupted after {interrupted_s:.1f} s; resume sent {sent:.1f} MB in {resume_s:.1f} s; "
          f"test {time.monotonic() - t_start:.1f} s", file=sys.stderr)
    on_node(lab, host, f"rm -rf {PARENT}")



def test_weights_staged_from_another_node_relayed_then_pulled(lab, tmp_path):
    """The issue's third source: a node that has the weights verified gives them to another, the source's own
    manifest the truth. Kept small (2 shards of 2 MB): the lab's time goes to the paths, not the bytes
    (the refusals that contact nothing are tests/test_stage_node_source.py's)."""
    t_start = time.monotonic()
    a, b = lab.gpu_hosts[0].name, lab.gpu_hosts[1].name
    inv = inventory(tmp_path, a, b)
    src = tmp_path / "small"
    generated_model(src, seed=5, shards=2, shard_mb=2)
    names = sorted(p.name for p in src.iterdir())
    local = subprocess.run(["sha256sum", *names], cwd=src, capture_output=True, text=True).stdout
    for h in (a, b):
        on_node(lab, h, f"rm -rf {PARENT} && mkdir -p {PARENT}")
    assert stage(inv, "--source", str(src), "--limit", a).returncode == 0  # the source gets verified weights

    # 1. the source's disk changed after it was verified (same size: only the bytes tell); streamed through
    # this machine (--via control), the shard is refused as a's fault and nothing becomes b's weights
    shard = f"{PARENT}/$(readlink {MODEL})/model-00002-of-00002.safetensors"
    good = (src / "model-00002-of-00002.safetensors").read_bytes()[4096:4099]

    def write_at_4096(data: bytes) -> str:
        """DATA over 3 bytes of a's active shard 2; a's active version's name."""
        return on_node(lab, a, f"echo {base64.b64encode(data).decode()} | base64 -d | "
                               f"dd of={shard} bs=1 seek=4096 conv=notrunc status=none && readlink {MODEL}").strip()

    version = write_at_4096(b"BAD")
    relayed = stage(inv, "--source", f"node:{a}", "--via", "control")
    assert relayed.returncode == 1, relayed.stdout + relayed.stderr
    assert f"{a} is the source: not a target" in relayed.stderr and "its own manifest" in relayed.stderr
    assert "streamed through this machine" in relayed.stderr and "pulls from" not in relayed.stderr
    assert f"model-00002-of-00002.safetensors: {a}'s own copy does not match its manifest" in relayed.stderr
    assert f"stage {a} again from the original source" in relayed.stderr and "were not replaced" in relayed.stderr
    assert on_node(lab, b, f"test -e {MODEL} || test -d {PARENT}/{version} || echo none").strip() == "none"

    # 2. the source repaired; pulled by b from a's one-transfer server: what arrived is skipped, the one
    # shard fetched, verified, active; the server gone with the transfer
    write_at_4096(good)
    pulled = stage(inv, "--source", f"node:{a}")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    url = re.search(rf"{b}: pulls from {a} at http://[\d.]+:(\d+) ", pulled.stderr)
    assert url, pulled.stderr
    sent = float(re.search(r"verified, ([\d.,]+) MB sent", pulled.stdout).group(1))
    assert sent == pytest.approx(2 * 1.048576, abs=0.01) and "3 file(s) skipped" in pulled.stdout, pulled.stdout
    # one look at b (each SSH round trip costs the lab's time): the link, the bytes, owner and modes
    seen = on_node(lab, b, f"readlink {MODEL}; echo ---; cd {MODEL}/ && sha256sum {' '.join(names)}; echo ---; "
                           "getent group pdkit >/dev/null && echo pdkit || echo root; echo ---; "
                           f"stat -L -c '%U %G %a' {MODEL} {MODEL}/*").split("---\n")
    assert seen[0].strip() == version and seen[1] == local, seen
    modes = set(seen[3].split("\n")) - {""}
    assert modes == ({"root pdkit 750", "root pdkit 640"} if seen[2].strip() == "pdkit"
                     else {"root root 755", "root root 644"}), modes
    # nothing listens on the server's port any more (/proc/net/tcp: LISTEN is 0A)
    sockets = [line.split() for line in on_node(lab, a, "cat /proc/net/tcp /proc/net/tcp6").splitlines()]
    assert not [s for s in sockets if s[1].endswith(f":{int(url.group(1)):04X}") and s[3] == "0A"], sockets
    print(f"\nstage lab, node to node: test {time.monotonic() - t_start:.1f} s", file=sys.stderr)
    for h in (a, b):
        on_node(lab, h, f"rm -rf {PARENT}")
