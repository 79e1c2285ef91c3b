"""The GPU card the GPU-tier inventories declare: the one the lent machine really has.

A device call for `nvidia-h200` is often served by an H100 80GB, and the preflight rightly refuses
a declared "NVIDIA H200" there (pdkit/hosts/preflight.py, check `gpu-model`). The inventories
(inventories/h200.py, h200-local.py and every one built on them) take their GPU model, memory and
compute capability from `machine_gpus`, which reads, in order:

1. `PDKIT_GPU_CARD`, when set: `declared` keeps the inventory's own card; `detect` requires
   nvidia-smi; anything else is one line of
   `nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader`
   (e.g. `NVIDIA H100 80GB HBM3, 81559 MiB, 9.0`; the compute capability may be left out);
2. else `nvidia-smi` on this machine, when it is there and lists GPUs (the GPU tier's control side
   runs on the lent machine itself: gpu/nspawn/device_*.sh);
3. else the inventory's declared card, so that a machine without GPUs renders exactly what it
   always did.

The count and NUMA layout stay the inventory's; the loader validates the result as any inventory,
and the preflight still compares it with what the node's nvidia-smi reports. Standard library only
(inventories run it inside pyinfra's loader).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

ENV = "PDKIT_GPU_CARD"
SMI_QUERY = ["--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader"]


class CardError(ValueError):
    """A card the inventory cannot take; the message names where it came from and what is valid."""


def parse_cards(text: str, source: str) -> list[dict]:
    """`name, memory.total[ MiB][, compute_cap]` lines -> [{"name", "memory_mib", "compute_cap" or None}]."""
    cards = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        memory = fields[1].removesuffix("MiB").strip() if len(fields) > 1 else ""
        cc = fields[2] if len(fields) > 2 else None
        if len(fields) not in (2, 3) or not fields[0] or not memory.isdigit() or (
                cc is not None and not _is_cc(cc)):
            raise CardError(f"{source}: {line.strip()!r} is not a card: valid is one line of `nvidia-smi "
                            f"{' '.join(SMI_QUERY)}`, e.g. 'NVIDIA H100 80GB HBM3, 81559 MiB, 9.0'")
        cards.append({"name": fields[0], "memory_mib": int(memory), "compute_cap": cc})
    return cards


def _is_cc(value: str) -> bool:
    major, _, minor = value.partition(".")
    return major.isdigit() and minor.isdigit()


def layout_from_cards(cards: list[dict], declared: Mapping, source: str) -> dict:
    """DECLARED (a pdkit_node.gpus dict) with the model, memory and compute capability of CARDS."""
    if not cards:
        raise CardError(f"{source}: no GPU listed")
    names = sorted({c["name"] for c in cards})
    if len(names) > 1:
        raise CardError(f"{source}: GPUs of different models ({', '.join(names)}): the GPU-tier inventories declare "
                        f"one model per node; set {ENV} to the one the engines use")
    card = cards[0]
    return {
        **declared,
        "model": card["name"],
        # GiB as the spec counts them, rounded up: 143771 MiB -> 141 (H200), 81559 MiB -> 80 (H100 80GB)
        "memory_gib": math.ceil(card["memory_mib"] / 1024),
        "compute_capability": card["compute_cap"] or declared["compute_capability"],
    }


def read_nvidia_smi() -> str | None:
    """This machine's cards as nvidia-smi lists them, or None without nvidia-smi or GPUs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi, *SMI_QUERY], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def machine_gpus(declared: Mapping, environ: Mapping[str, str] | None = None,
                 smi: Callable[[], str | None] = read_nvidia_smi) -> dict:
    """The pdkit_node.gpus an inventory declares on this machine (see the module's docstring)."""
    env = os.environ if environ is None else environ
    setting = env.get(ENV, "").strip()
    if setting == "declared":
        return dict(declared)
    if setting and setting != "detect":
        return layout_from_cards(parse_cards(setting, f"{ENV}={setting!r}"), declared, ENV)
    text = smi()
    if text is None:
        if setting == "detect":
            raise CardError(f"{ENV}=detect: nvidia-smi is absent or lists no GPU on this machine; valid: "
                            f"'declared', 'detect' (on the GPU machine) or a line of `nvidia-smi {' '.join(SMI_QUERY)}`")
        return dict(declared)
    return layout_from_cards(parse_cards(text, "nvidia-smi"), declared, "nvidia-smi")
