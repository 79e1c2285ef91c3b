"""pdkit's GPU-to-GPU bandwidth probe (issue 47 item 3): read as text by pdkit/hosts/p2p.py and run on a GPU
node with the ENGINE environment's python (pdkit.render.flags.engine_python), so that it measures with the
torch and CUDA the engines use; it adds no dependency.

    python p2p_probe.py --pairs 0:4,1:5 [--concurrent 0:4,1:5] [--mib 256] [--iters 5] [--plain]

For each (source, destination) pair, one after another:
- `torch.cuda.can_device_access_peer(src, dst)`;
- "write": the source pushes into the destination's memory (`dst.copy_(src)`: torch issues a
  cross-device copy on the source device's stream), as a prefill writes KV into its decode (NIXL);
- "read": the same bytes copied on a stream of the destination GPU (the CUDA driver's
  cuMemcpyPeerAsync through libcuda, which the driver installs: no new dependency), so the
  destination pulls; where libcuda cannot be loaded the read is left out and says why.
Each is one warm-up and ITERS timed copies of MIB MiB between CUDA events; GB/s is 1e9 bytes per
second (as nvbandwidth and the community measurements state it): the median, min and max of the
iterations. With --concurrent, the listed writes also run at once (one stream each), each timed on
its own stream: the posted-write collapse on PCIe switches shows only when flows run together.
On a node with one GPU, or with no pair given, it times a copy inside GPU 0 (a device copy reads and
writes each byte: the figure is bytes copied per second) and says that no pair exists.

It never raises: without torch, without CUDA, out of memory, it prints {"error": ...} (or a pair's
own "error") after MARK. GPU indices are nvidia-smi's: CUDA_DEVICE_ORDER=PCI_BUS_ID is set before
torch loads (CUDA's own default, fastest first, may number GPUs differently).
"""

import ctypes
import json
import os
import statistics
import sys
import time

MARK = "pdkit-p2p: "
# the output format pdkit/hosts/p2p.py reads
FORMAT = 1
DEFAULT_MIB = 256
DEFAULT_ITERS = 5
# a probe that has run this long stops before the next measurement (the caller's timeout is the hard one)
BUDGET_S = 120.0
GB = 1e9

out = {"format": FORMAT, "pairs": [], "concurrent": None, "device_copy": None, "no_pair": None, "error": None}


def parse_pairs(text):
    pairs = []
    for item in (text or "").split(","):
        if item.strip():
            a, _, b = item.partition(":")
            pair = (int(a), int(b))
            if pair not in pairs:
                pairs.append(pair)
    return pairs


def arg(argv, name, default):
    if name in argv and argv.index(name) + 1 < len(argv):
        return argv[argv.index(name) + 1]
    return default


def figures(nbytes, seconds):
    rates = [nbytes / s / GB for s in seconds if s > 0]
    if not rates:
        return None
    return {"median": round(statistics.median(rates), 2), "min": round(min(rates), 2), "max": round(max(rates), 2),
            "n": len(rates)}


def libcuda():
    """The driver API (libcuda.so.1, installed with the driver), or (None, why)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, "libcuda.so.1 not loadable: %s" % e
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.cuMemcpyPeerAsync.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                                      ctypes.c_size_t, ctypes.c_void_p]
    return lib, None


def primary_ctx(lib, device):
    ctx = ctypes.c_void_p()
    rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
    if rc != 0:
        raise RuntimeError("cuDevicePrimaryCtxRetain(%d) returned CUresult %d" % (device, rc))
    return ctx


def timed(torch, stream, issue, iters):
    """One warm-up and ITERS copies issued by ISSUE on STREAM, each between two CUDA events: seconds each."""
    with torch.cuda.stream(stream):
        issue()
    stream.synchronize()
    seconds = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            issue()
            end.record(stream)
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1000.0)
    return seconds


def measure_pair(torch, lib, why_no_lib, src, dst, nbytes, iters):
    entry = {"src": src, "dst": dst, "peer_access": None, "write_gbps": None, "read_gbps": None,
             "read_error": None, "error": None}
    try:
        entry["peer_access"] = bool(torch.cuda.can_device_access_peer(src, dst))
        a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:%d" % src)
        b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:%d" % dst)
        a.fill_(1)
        # a copy back first: torch enables peer access in both directions (read's copy needs dst -> src)
        a.copy_(b)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        entry["write_gbps"] = figures(nbytes, timed(torch, torch.cuda.Stream(device=src), lambda: b.copy_(a), iters))
        if lib is None:
            entry["read_error"] = why_no_lib
        else:
            ctx_src, ctx_dst = primary_ctx(lib, src), primary_ctx(lib, dst)
            stream = torch.cuda.Stream(device=dst)
            handle = stream.cuda_stream
            rc = []

            def pull():
                rc.append(lib.cuMemcpyPeerAsync(b.data_ptr(), ctx_dst, a.data_ptr(), ctx_src, nbytes, handle))

            seconds = timed(torch, stream, pull, iters)
            bad = [r for r in rc if r != 0]
            if bad:
                entry["read_error"] = "cuMemcpyPeerAsync returned CUresult %d" % bad[0]
            else:
                entry["read_gbps"] = figures(nbytes, seconds)
        a = b = None  # freed before empty_cache
    except Exception as e:  # a pair that fails says why; the other pairs still run
        entry["error"] = "%s: %s" % (type(e).__name__, e)
    torch.cuda.empty_cache()
    return entry


def measure_concurrent(torch, pairs, nbytes, iters):
    """The writes of PAIRS at once, one stream per flow on its source GPU; each timed on its own stream."""
    result = {"pairs": [], "error": None}
    try:
        flows = []
        for src, dst in pairs:
            a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:%d" % src)
            b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:%d" % dst)
            a.copy_(b)  # peer access enabled, both ways
            flows.append((src, dst, a, b, torch.cuda.Stream(device=src)))
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        seconds = {i: [] for i in range(len(flows))}
        for round_ in range(iters + 1):  # the first round warms up
            events = []
            for src, dst, a, b, stream in flows:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream):
                    start.record(stream)
                    b.copy_(a)
                    end.record(stream)
                events.append((start, end))
            for i, (start, end) in enumerate(events):
                end.synchronize()
                if round_:
                    seconds[i].append(start.elapsed_time(end) / 1000.0)
        for i, (src, dst, _a, _b, _s) in enumerate(flows):
            result["pairs"].append({"src": src, "dst": dst, "write_gbps": figures(nbytes, seconds[i])})
        del flows
    except Exception as e:
        result["error"] = "%s: %s" % (type(e).__name__, e)
    torch.cuda.empty_cache()
    return result


def device_copy(torch, nbytes, iters):
    try:
        a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
        a.fill_(1)
        gbps = figures(nbytes, timed(torch, torch.cuda.Stream(device=0), lambda: b.copy_(a), iters))
        a = b = None  # freed before empty_cache
        torch.cuda.empty_cache()
        return {"gpu": 0, "gbps": gbps, "error": None}
    except Exception as e:
        return {"gpu": 0, "gbps": None, "error": "%s: %s" % (type(e).__name__, e)}


def main(argv):
    started = time.monotonic()
    try:
        pairs = parse_pairs(arg(argv, "--pairs", ""))
        concurrent = parse_pairs(arg(argv, "--concurrent", ""))
        mib = int(arg(argv, "--mib", DEFAULT_MIB))
        iters = max(1, int(arg(argv, "--iters", DEFAULT_ITERS)))
    except ValueError as e:
        out["error"] = "bad arguments %r: %s" % (argv, e)
        return
    nbytes = mib << 20
    out.update({"bytes": nbytes, "iters": iters})
    # nvidia-smi's numbering (PCI order), the facts' and the inventory's, before CUDA initialises
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    try:
        # lazy: after CUDA_DEVICE_ORDER is set, and a missing torch is an answer, not a crash
        import torch
    except Exception as e:  # an engine environment without torch: said, not raised
        out["error"] = "torch is not importable by %s: %s: %s" % (sys.executable, type(e).__name__, e)
        return
    out["torch"] = getattr(torch, "__version__", None)
    out["cuda"] = getattr(torch.version, "cuda", None)
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except Exception as e:
        out["error"] = "CUDA is not usable by torch %s: %s: %s" % (out["torch"], type(e).__name__, e)
        return
    if not available or count == 0:
        out["error"] = "CUDA is not available to torch %s (built for CUDA %s) on this node" % (
            out["torch"], out["cuda"])
        return
    out["device_count"] = count
    out["names"] = {str(i): torch.cuda.get_device_name(i) for i in range(count)}
    valid = [(a, b) for a, b in pairs if a != b and 0 <= a < count and 0 <= b < count]
    for a, b in pairs:
        if (a, b) not in valid:
            out["pairs"].append({"src": a, "dst": b, "error": "no such pair on a node with %d GPU(s)" % count})
    if not valid:
        out["no_pair"] = ("one GPU on this node: no GPU pair exists" if count == 1
                          else "no GPU pair given: %d GPUs, none paired by the engines' placement" % count)
        out["device_copy"] = device_copy(torch, nbytes, iters)
        return
    lib, why = libcuda()
    for src, dst in valid:
        if time.monotonic() - started > BUDGET_S:
            out["pairs"].append({"src": src, "dst": dst, "error": "not measured: the probe's %d s budget ran out"
                                 % BUDGET_S})
            continue
        out["pairs"].append(measure_pair(torch, lib, why, src, dst, nbytes, iters))
    together = [(a, b) for a, b in concurrent if (a, b) in valid]
    if len(together) > 1 and time.monotonic() - started <= BUDGET_S:
        out["concurrent"] = measure_concurrent(torch, together, nbytes, iters)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as e:  # the contract: one JSON line, never a traceback
        out["error"] = "%s: %s" % (type(e).__name__, e)
    text = json.dumps(out, sort_keys=True)
    print(text if "--plain" in sys.argv[1:] else MARK + text, flush=True)
