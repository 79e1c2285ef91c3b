"""A small pyinfra-testing style runner for pdkit's custom facts and node roles.

Fact cases (tests/node/facts/<Fact>/<case>.json): {"command", "output", "fact"}: the fact's
command is exactly `command`, and its parser turns `output` into `fact` (JSON-compared).

Operation cases (tests/node/operations/<deploy>/<case>.json): {"node", "host_data", "facts",
"kwargs", "commands"}: the deploy runs against an `@fake` host (pyinfra 3.10's fake connector)
inside a real pyinfra State in API mode, every fact it asks for answered from `facts`, and the
commands each operation would run are compared to `commands`, operation by operation. Facts are
keyed like pyinfra's own test cases: "<module>.<Fact>" -> value, or -> {"arg=value": value} for
facts read with arguments; a fact the case does not give returns its default (absent).
"""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path
from typing import Any

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.host import Host
from pyinfra.context import ctx_host, ctx_state

HERE = Path(__file__).parent
FACT_CASES = sorted(HERE.glob("facts/*/*.json"))
OPERATION_CASES = sorted(HERE.glob("operations/*/*.json"))

CLUSTER = {
    "name": "nodetest",
    "engine": "sglang",
    "sglang_version": "0.5.23",
    "model": {"path": "/models/m", "served_name": "m"},
}
# the seeds' node: 8x RTX PRO 6000 Blackwell, prefill on socket 0, decode on socket 1
NODE = {
    "gpus": {"model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "count": 8, "memory_gib": 96, "compute_capability": "12.0", "numa": [0, 0, 0, 0, 1, 1, 1, 1]},
    "nccl_profile": "pcie",
    "engines": [
        {"name": "prefill", "role": "prefill", "gpus": [0, 1, 2, 3], "port": 30000},
        {"name": "decode", "role": "decode", "gpus": [4, 5, 6, 7], "port": 30001},
    ],
}
_KEEP: list[Inventory] = []  # pdkit.hosts.deploy caches the spec by id(inventory): keep ids unique


def fact_key(cls: type) -> str:
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


def _answer(facts: dict, cls: type, kwargs: dict) -> Any:
    from roles.node_facts import NODE_FACTS, EngineEnv, ModelDirs, NodeFacts

    if cls is NodeFacts:
        # the bundle answers with each named fact's own answer (cases give them one by one)
        values = {name: _answer(facts, NODE_FACTS[name], {}) for name in kwargs["names"]}
        if kwargs.get("engine_venv"):
            # a node's own engine environment: "node_facts.EngineEnv" -> {"venv=<path>": probe}
            values["engine_env"] = _answer(facts, EngineEnv, {"venv": kwargs["engine_venv"]})
        if kwargs.get("model_dirs"):
            # the engines' model directories: "node_facts.ModelDirs" -> the probe's answer
            # (a case that gives none: every directory is a complete, readable checkpoint)
            user, paths = kwargs["model_dirs"]
            fine = {"exists": True, "is_dir": True, "config": True, "indexes": ["model.safetensors.index.json"], "weights": [],
                    "safetensors": 1, "missing_shards": [], "missing_count": 0, "unreadable": []}
            values["model_dirs"] = (_answer(facts, ModelDirs, {}) if fact_key(ModelDirs) in facts
                                    else {"user": user, "user_exists": True, "how": "runuser", "paths": {p: fine for p in paths}})
        return values
    key = fact_key(cls)
    if key not in facts:
        return cls.default() if hasattr(cls, "default") else None
    value = facts[key]
    if isinstance(value, dict) and value and all("=" in k for k in value):
        arg = ",".join(f"{k}={kwargs[k]}" for k in sorted(kwargs) if kwargs[k] is not None)
        return value.get(arg, cls.default())
    return value


def _command_json(command: Any) -> Any:
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        src = command.src
        text = src.getvalue() if isinstance(src, io.StringIO) else str(src)
        return ["upload", command.dest, text]
    if isinstance(command, FunctionCommand):
        return ["function", getattr(command.function, "__name__", str(command.function))]
    return str(command)


def run_operation_case(case: dict, monkeypatch) -> list[dict]:
    """The operations a deploy lays down for the case's host and facts, with their commands."""
    # a new State per case: the roles' per-State caches start empty by themselves
    node = {**NODE, **case.get("node", {})}
    data = {"pdkit_node": node, "pdkit_router": {}, "fake_delay": 0, "fake_delay_jitter": 0, **case.get("host_data", {})}
    inventory = Inventory(([("@fake/gpu01", data)], {}), all=(["@fake/gpu01"], {"pdkit_cluster": CLUSTER}))
    _KEEP.append(inventory)
    state = State(inventory, Config())
    facts = case.get("facts", {})
    monkeypatch.setattr(Host, "get_fact", lambda self, cls, *args, **kwargs: _answer(facts, cls, kwargs))
    connect_all(state)
    module, _, name = case["deploy"].rpartition(".")
    deploy = getattr(importlib.import_module(module), name)
    add_deploy(state, deploy, **case.get("kwargs", {}))
    host = inventory.get_host("@fake/gpu01")
    planned = []
    for op_hash in state.get_op_order():
        if op_hash not in state.ops[host]:
            continue
        op_data = state.get_op_data_for_host(host, op_hash)
        with ctx_state.use(state), ctx_host.use(host):
            commands = [_command_json(c) for c in op_data.command_generator()]
        entry = {"op": sorted(state.op_meta[op_hash].names)[0], "commands": commands}
        if op_data.global_arguments.get("_if"):
            entry["conditional"] = True
        planned.append(entry)
    return planned


def load(path: Path) -> dict:
    return json.loads(path.read_text())
