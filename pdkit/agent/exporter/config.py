"""The exporter's config file (`/etc/pdkit/exporter.json`, rendered by the plan).

Checked by hand rather than with pydantic: the exporter runs on every GPU node next to the
engines and is held to a small memory budget (docs/benchmarks.md), so it imports nothing but
the standard library, requests and prometheus_client. Unknown keys are errors, so a typo in
the plan's template fails at start (and with `--check`) instead of silently disabling a check.

    {
      "node": "gpu01",                          # required: the inventory host name (label `node`)
      "cluster": "prod",                         # optional, "" (label on pdkit_engine_info)
      "listen_address": "10.0.0.1",              # optional, "127.0.0.1"
      "listen_port": 9400,                       # optional, 9400
      "release": null,                           # optional: fixed release id for pdkit_engine_info
      "release_file": "/etc/pdkit/release.json", # optional: release id = sha256 of this file
      "timeout_s": 2.0,                          # optional: per engine request (connect + read), <= 30
      "server_info_max_age_s": 60,               # optional: re-read /server_info at least this often
      "journal": {"enabled": true, "max_entries": 2000, "timeout_s": 5.0},   # optional
      "gpu_health": true,                        # optional, false: run the GPU health probe (NVIDIA GPUs, not the sim)
      "engines": [{
        "name": "decode",                        # required, unique (label `engine`)
        "role": "decode",                        # required: prefill | decode | unified (label `role`)
        "url": "http://10.0.0.1:30001",          # required: the engine's base URL
        "unit": "pdkit-engine-decode.service",   # optional (null: no env/cmdline/journal checks)
        "sglang_version": "0.5.23",              # optional: planned version
        "argv": ["--model-path", "/m", "..."],   # required: the planned flags (release.json argv)
        "env": {"NCCL_P2P_LEVEL": "PHB", "HF_TOKEN": null},   # optional: planned env; null = any value
        "drift_ignore": [],                      # optional: flags/keys never reported as drift
        "gpus": [0, 1]                           # optional: the node's GPU indices the engine uses
      }]
    }
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("prefill", "decode", "unified")


def reads_gpu_health(gpu: str, engine: str) -> bool:
    """The rule for `gpu_health`: a node whose `gpu` is nvidia, running a real ENGINE (not the sim). The plan
    renders it, doctor and the alert rules follow it (a lab host, `gpu: none`, has no GPU to read)."""
    return gpu == "nvidia" and engine != "sim"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class EngineConfig:
    name: str
    role: str
    url: str
    argv: tuple[str, ...]
    unit: str | None = None
    sglang_version: str = ""
    env: tuple[tuple[str, str | None], ...] = ()
    drift_ignore: tuple[str, ...] = ()
    # an engine spanning nodes: the rank this exporter watches, of how many, and rank 0's host.
    # A rank above 0 serves no HTTP (SGLang runs the HTTP server on rank 0 only): its process
    # argv and environment are checked, its serving figures come from rank 0's exporter.
    rank: int = 0
    nnodes: int = 1
    head: str | None = None
    # the GPU indices of this node the engine uses (the spec's engine gpus: --base-gpu-id / --gpu-id-step)
    gpus: tuple[int, ...] = ()

    @property
    def env_dict(self) -> dict[str, str | None]:
        return dict(self.env)


@dataclass(frozen=True)
class JournalConfig:
    enabled: bool = True
    max_entries: int = 2000
    timeout_s: float = 5.0


@dataclass(frozen=True)
class ExporterConfig:
    node: str
    engines: tuple[EngineConfig, ...]
    cluster: str = ""
    listen_address: str = "127.0.0.1"
    listen_port: int = 9400
    release: str | None = None
    release_file: str | None = None
    timeout_s: float = 2.0
    server_info_max_age_s: float = 60.0
    journal: JournalConfig = JournalConfig()
    # run the GPU health probe (pdkit.agent.exporter.gpuhealth): a node with NVIDIA GPUs and a real engine; off on
    # `gpu: none` (the lab) and with the sim, where there is no GPU to read
    gpu_health: bool = False


def _check_keys(where: str, data: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(data))
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {', '.join(missing)}")


def _str(where: str, value: Any, allow_none: bool = False, allow_empty: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or (not value and not allow_empty):
        raise ConfigError(f"{where}: expected a {'non-empty ' if not allow_empty else ''}string, got {value!r}")
    return value


def _number(where: str, value: Any, low: float, high: float, integer: bool = False) -> Any:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not (low <= value <= high):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{where}: expected {kind} in [{low:g}, {high:g}], got {value!r}")
    return value


def _engine(i: int, data: Any) -> EngineConfig:
    where = f"engines[{i}]"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object")
    _check_keys(where, data, {"name", "role", "url", "unit", "sglang_version", "argv", "env", "drift_ignore",
                              "rank", "nnodes", "head", "gpus"},
                {"name", "role", "url", "argv"})
    role = _str(f"{where}.role", data["role"])
    if role not in ROLES:
        raise ConfigError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
    url = _str(f"{where}.url", data["url"]).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.url: {url!r} is not an http(s) URL")
    argv = data["argv"]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"{where}.argv: expected a list of strings")
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and k and (v is None or isinstance(v, str))
                                            for k, v in env.items()):
        raise ConfigError(f"{where}.env: expected an object of NAME: string|null")
    ignore = data.get("drift_ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(k, str) and k for k in ignore):
        raise ConfigError(f"{where}.drift_ignore: expected a list of flag names")
    gpus = data.get("gpus") or []
    if not isinstance(gpus, list):
        raise ConfigError(f"{where}.gpus: expected a list of GPU indices")
    nnodes: int  # bound inside the call below, so its error comes in the fields' order
    return EngineConfig(
        name=_str(f"{where}.name", data["name"]),
        role=role,
        url=url,
        argv=tuple(argv),
        unit=_str(f"{where}.unit", data.get("unit"), allow_none=True),
        sglang_version=_str(f"{where}.sglang_version", data.get("sglang_version", ""), allow_empty=True),
        env=tuple(sorted(env.items())),
        drift_ignore=tuple(ignore),
        nnodes=(nnodes := int(_number(f"{where}.nnodes", data.get("nnodes", 1), 1, 4096, integer=True))),
        rank=int(_number(f"{where}.rank", data.get("rank", 0), 0, nnodes - 1, integer=True)),
        head=_str(f"{where}.head", data.get("head"), allow_none=True),
        gpus=tuple(int(_number(f"{where}.gpus[{j}]", g, 0, 1023, integer=True)) for j, g in enumerate(gpus)),
    )


def parse_config(data: Any) -> ExporterConfig:
    if not isinstance(data, dict):
        raise ConfigError("the config must be a JSON object")
    _check_keys("config", data, {"node", "cluster", "listen_address", "listen_port", "release", "release_file",
                                 "timeout_s", "server_info_max_age_s", "journal", "engines",
                                 "gpu_health"}, {"node", "engines"})
    engines_data = data["engines"]
    if not isinstance(engines_data, list):
        raise ConfigError("engines: expected a list")
    engines = tuple(_engine(i, e) for i, e in enumerate(engines_data))
    names = [e.name for e in engines]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"engines: duplicate name(s) {', '.join(dupes)}")
    journal_data = data.get("journal") or {}
    if not isinstance(journal_data, dict):
        raise ConfigError("journal: expected an object")
    _check_keys("journal", journal_data, {"enabled", "max_entries", "timeout_s"}, set())
    enabled = journal_data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"journal.enabled: expected true or false, got {enabled!r}")
    journal = JournalConfig(
        enabled=enabled,
        max_entries=_number("journal.max_entries", journal_data.get("max_entries", 2000), 1, 100000, integer=True),
        timeout_s=_number("journal.timeout_s", journal_data.get("timeout_s", 5.0), 0.1, 60),
    )
    gpu_health = data.get("gpu_health", False)
    if not isinstance(gpu_health, bool):
        raise ConfigError(f"gpu_health: expected true or false, got {gpu_health!r}")
    return ExporterConfig(
        node=_str("node", data["node"]),
        engines=engines,
        cluster=_str("cluster", data.get("cluster", ""), allow_empty=True),
        listen_address=_str("listen_address", data.get("listen_address", "127.0.0.1")),
        listen_port=_number("listen_port", data.get("listen_port", 9400), 1, 65535, integer=True),
        release=_str("release", data.get("release"), allow_none=True),
        release_file=_str("release_file", data.get("release_file"), allow_none=True),
        timeout_s=_number("timeout_s", data.get("timeout_s", 2.0), 0.05, 30),
        server_info_max_age_s=_number("server_info_max_age_s", data.get("server_info_max_age_s", 60.0), 0, 86400),
        journal=journal,
        gpu_health=gpu_health,
    )


def load_config(path: str | Path) -> ExporterConfig:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    return parse_config(data)


__all__ = ["ROLES", "ConfigError", "reads_gpu_health", "EngineConfig", "ExporterConfig", "JournalConfig", "load_config", "parse_config"]
