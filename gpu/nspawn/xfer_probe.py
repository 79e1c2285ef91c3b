"""One NIXL/UCX WRITE from one process's memory into another's: the path a PD pair's KV takes.

Run in two hosts (or network namespaces), the target first; the target's one JSON line goes to the
initiator's stdin, and a line on the target's stdin tells it the write is done:

    python xfer_probe.py target    [--dram]   # prints {"meta", "addr", "len", "dev", "mem"}; waits; prints {"target_ok"}
    python xfer_probe.py initiator [--dram]   # reads that line; WRITEs; prints {"state", "seconds", ...}

GPU memory (VRAM, torch on cuda:0) unless --dram (numpy, no GPU: a rehearsal). UCX reads its
transports from the environment (UCX_TLS, UCX_NET_DEVICES), exactly as an engine's would be.
gpu/nspawn/host.py `xfer-probe` runs it between two container hosts sharing the lent GPU, to pick
a UCX_TLS that works across their namespaces before the engines are deployed (docs/gpu.md).
"""

from __future__ import annotations

import base64
import json
import sys
import time

SIZE = 8 << 20  # bytes: a few KV blocks' worth, large enough for UCX's rendezvous protocols
TIMEOUT_S = 30.0
# NIXL logs to stdout too: the probe's own lines carry this prefix
MARK = "PDKIT-XFER "


def say(data: dict) -> None:
    print(MARK + json.dumps(data), flush=True)


def read_marked(stream) -> dict:
    """The first line of STREAM that carries MARK."""
    for line in stream:
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit("xfer_probe: no PDKIT-XFER line on stdin")


def buffers(dram: bool, fill: bool):
    """(keep-alive object, address, device, memory type, check) for SIZE bytes of int32."""
    n = SIZE // 4
    if dram:
        import numpy as np

        buf = np.arange(n, dtype=np.int32) if fill else np.zeros(n, dtype=np.int32)
        return buf, buf.ctypes.data, 0, "DRAM", lambda: bool((buf == np.arange(n, dtype=np.int32)).all())
    import torch

    buf = torch.arange(n, dtype=torch.int32, device="cuda:0") if fill else torch.zeros(n, dtype=torch.int32, device="cuda:0")
    torch.cuda.synchronize()
    return buf, buf.data_ptr(), 0, "VRAM", lambda: bool(torch.equal(buf, torch.arange(n, dtype=torch.int32, device="cuda:0")))


def main(argv: list[str]) -> int:
    from nixl._api import nixl_agent, nixl_agent_config

    role, dram = argv[0], "--dram" in argv
    # CUDA first, the agent second, as in an engine (torch long before SGLang's NIXL agent): on the
    # H200 an agent made before CUDA was initialised failed to register VRAM (NIXL_ERR_BACKEND)
    keep, addr, dev, mem, check = buffers(dram, fill=role == "initiator")
    agent = nixl_agent(f"pdkit-probe-{role}", nixl_agent_config(backends=["UCX"]))
    agent.register_memory([(addr, SIZE, dev, "")], mem)
    if role == "target":
        say({"meta": base64.b64encode(agent.get_agent_metadata()).decode(), "addr": addr, "len": SIZE, "dev": dev, "mem": mem})
        sys.stdin.readline()
        say({"target_ok": check()})
        return 0
    peer = read_marked(sys.stdin)
    name = agent.add_remote_agent(base64.b64decode(peer["meta"]))
    local = agent.get_xfer_descs([(addr, SIZE, dev)], mem)
    remote = agent.get_xfer_descs([(peer["addr"], peer["len"], peer["dev"])], peer["mem"])
    t = time.monotonic()
    handle = agent.initialize_xfer("WRITE", local, remote, name, b"pdkit-probe")
    state = agent.transfer(handle)
    while state == "PROC" and time.monotonic() - t < TIMEOUT_S:
        time.sleep(0.001)
        state = agent.check_xfer_state(handle)
    seconds = time.monotonic() - t
    say({"state": state, "seconds": round(seconds, 4), "bytes": SIZE, "mem": mem,
         "gb_s": round(SIZE / seconds / 1e9, 3) if state == "DONE" and seconds > 0 else None})
    del keep
    return 0 if state == "DONE" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
