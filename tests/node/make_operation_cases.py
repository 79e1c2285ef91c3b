"""Writes the operation cases' expected commands from the current roles (run, then REVIEW the diff:
the JSON files are the pinned expectations; `python -m tests.node.make_operation_cases`)."""

import json

import pytest

from pdkit.render.node import (
    KEYRING_PATH,
    NCCL_PIN_PATH,
    SOURCES_PATH,
    UNATTENDED_PATH,
    nccl_pin_text,
    sources_text,
    unattended_text,
)
from tests.node.runner import HERE, run_operation_case

UBUNTU = {"node_facts.NodeOsRelease": {"id": "ubuntu", "version_id": "24.04", "codename": "noble", "pretty_name": "Ubuntu 24.04.3 LTS"}, "node_facts.NodeArch": "x86_64", "node_facts.NodeKernel": "6.8.0-51-generic", "server.Which": {"command=curl": "/usr/bin/curl"}}
DEBIAN12 = {**UBUNTU, "node_facts.NodeOsRelease": {"id": "debian", "version_id": "12", "codename": "bookworm", "pretty_name": "Debian GNU/Linux 12 (bookworm)"}, "node_facts.NodeKernel": "6.1.0-28-amd64"}
DEBIAN13 = {**DEBIAN12, "node_facts.NodeOsRelease": {"id": "debian", "version_id": "13", "codename": "trixie", "pretty_name": "Debian GNU/Linux 13 (trixie)"}, "node_facts.NodeKernel": "6.12.48+deb13-amd64"}


def sha1(text: str) -> str:
    import hashlib
    return hashlib.sha1(text.encode()).hexdigest()


def present(path: str, text: str) -> dict:
    return {"files.File": {f"path={path}": {"mode": 644, "user": "root", "group": "root", "size": len(text)}}, "files.Sha1File": {f"path={path}": sha1(text)}}


def merge(*parts: dict) -> dict:
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            if isinstance(v, dict) and isinstance(out.get(k), dict) and all("=" in x for x in v):
                out[k] = {**out[k], **v}
            else:
                out[k] = v
    return out


INSTALLED = {"deb.DebPackages": {p: ["1"] for p in ("nvidia-driver-pinning-580", "linux-headers-6.8.0-51-generic", "nvidia-open", "cuda-toolkit-13-0")} | {"libnccl2": ["2.28.9-1+cuda13.0"], "libnccl-dev": ["2.28.9-1+cuda13.0"]}}
CONFIGURED = merge(
    {"files.File": {f"path={KEYRING_PATH}": {"mode": 644, "user": "root", "group": "root", "size": 1}}},
    present(SOURCES_PATH, sources_text("ubuntu2404", "x86_64")),
    present(UNATTENDED_PATH, unattended_text()),
    present(NCCL_PIN_PATH, nccl_pin_text()),
    {"files.Directory": {f"path={d}": {"mode": 755, "user": "root", "group": "root"} for d in ("/var/lib/pdkit-node", "/etc/apt/sources.list.d", "/etc/apt/apt.conf.d", "/etc/apt/preferences.d")}},
    {"systemd.SystemdEnabled": {"nvidia-persistenced.service": True}, "systemd.SystemdStatus": {"nvidia-persistenced.service": True}},
)

DEBIAN12_HOST = {k: v for k, v in DEBIAN12.items() if k != "server.Which"}
PROVIDED_NODE = {"gpu": "none", "engine_venv": "/opt/vendor/sglang-env"}


def provided_probe(sglang: str) -> dict:
    """roles.node_facts.EngineEnv's output for an environment with SGLang SGLANG and NIXL."""
    return {"path": "/opt/vendor/sglang-env/bin/python", "exists": True, "executable": True, "python": "3.12.3",
            "sglang": sglang, "sglang_dist": sglang, "nixl": True}


CASES = {
    "nvidia_repo/ubuntu2404-fresh": {"deploy": "roles.nvidia_repo.nvidia_repo", "facts": UBUNTU},
    "nvidia_repo/debian12-fresh": {"deploy": "roles.nvidia_repo.nvidia_repo", "facts": DEBIAN12},
    "nvidia_repo/debian13-fresh": {"deploy": "roles.nvidia_repo.nvidia_repo", "facts": DEBIAN13},
    "nvidia_repo/ubuntu2404-configured": {"deploy": "roles.nvidia_repo.nvidia_repo", "facts": merge(UBUNTU, CONFIGURED)},
    "nvidia_driver/ubuntu2404-fresh-dkms": {"deploy": "roles.nvidia_driver.nvidia_driver", "facts": UBUNTU},
    "nvidia_driver/ubuntu2404-fresh-prebuilt": {"deploy": "roles.nvidia_driver.nvidia_driver", "facts": UBUNTU, "node": {"driver_modules": "ubuntu-prebuilt"}},
    "nvidia_driver/debian12-fresh-dkms": {"deploy": "roles.nvidia_driver.nvidia_driver", "facts": DEBIAN12},
    "nvidia_driver/ubuntu2404-installed": {"deploy": "roles.nvidia_driver.nvidia_driver", "facts": merge(UBUNTU, CONFIGURED, INSTALLED)},
    "nvidia_driver/ubuntu2404-reboot-pending-drained": {"deploy": "roles.nvidia_driver.nvidia_driver", "facts": merge(UBUNTU, CONFIGURED, INSTALLED, {"node_facts.RebootRequired": "NVIDIA driver packages changed by pdkit (branch 580, nvidia-dkms)"}), "node": {"reboot": "when-drained"}, "host_data": {"node_drained": True}},
    "nvidia_driver/ubuntu2404-reboot-pending-not-drained": {"deploy": "roles.nvidia_driver.nvidia_driver", "facts": merge(UBUNTU, CONFIGURED, INSTALLED, {"node_facts.RebootRequired": "NVIDIA driver packages changed by pdkit (branch 580, nvidia-dkms)"}), "node": {"reboot": "when-drained"}},
    "cuda/ubuntu2404-fresh": {"deploy": "roles.cuda.cuda", "facts": UBUNTU},
    "cuda/ubuntu2404-installed": {"deploy": "roles.cuda.cuda", "facts": merge(UBUNTU, CONFIGURED, INSTALLED)},
    "nccl/ubuntu2404-fresh": {"deploy": "roles.nccl.nccl", "facts": UBUNTU},
    "nccl/ubuntu2404-installed": {"deploy": "roles.nccl.nccl", "facts": merge(UBUNTU, CONFIGURED, INSTALLED)},
    "nccl/ubuntu2404-other-nccl-installed": {"deploy": "roles.nccl.nccl", "facts": merge(UBUNTU, CONFIGURED, {"deb.DebPackages": {"libnccl2": ["2.27.7-1+cuda13.0"], "libnccl-dev": ["2.27.7-1+cuda13.0"]}})},
    # the whole node layer: driver, CUDA and NCCL each call nvidia_repo(); it is laid down once
    "node/ubuntu2404-fresh": {"deploy": "roles.node.node", "facts": UBUNTU},
    "node/lab-host-gpu-none": {"deploy": "roles.node.node", "facts": DEBIAN12, "node": {"gpu": "none"}},
    "preflight/debian12-no-gpu-declared-nvidia": {"deploy": "roles.preflight.preflight", "facts": DEBIAN12},
    # issue 22 item 1: a node's own engine environment, probed in the preflight's one round trip
    "preflight/lab-host-provided-env-good": {"deploy": "roles.preflight.preflight", "node": PROVIDED_NODE,
                                             "facts": {**DEBIAN12_HOST, "node_facts.EngineEnv": {"venv=/opt/vendor/sglang-env": provided_probe("0.5.23")}}},
    "preflight/lab-host-provided-env-wrong-sglang": {"deploy": "roles.preflight.preflight", "node": PROVIDED_NODE,
                                                     "facts": {**DEBIAN12_HOST, "node_facts.EngineEnv": {"venv=/opt/vendor/sglang-env": provided_probe("0.5.17")}}},
}


def main() -> None:
    mp = pytest.MonkeyPatch()
    for name, case in CASES.items():
        case = {"kwargs": {}, "node": {}, "host_data": {}, **case}
        try:
            case["commands"] = run_operation_case(case, mp)
        finally:
            mp.undo()
        path = HERE / "operations" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(case, indent=2) + "\n")
        print(f"{name}: {len(case['commands'])} operations")


if __name__ == "__main__":
    main()
