"""List every Prometheus metric a pinned SGLang release's engine exports, from its own collectors.

Run by the Python of an SGLang contract virtualenv (see .ci/contract-env.sh), never by pdkit's:
it imports the standard library, prometheus_client and the sglang installed next to it.

    python sglang_metrics.py > reply.json

What it does, per engine role the kit runs (prefill, decode, unified):

1. The label names: the `labels = {...}` dict literal that SGLang itself builds for each
   collector -- `SchedulerMetricsCollector.init_new` (observability/metrics_collector.py) and
   the tokenizer's (`TokenizerManager.init_metric_collector_watchdog` in 0.5.17,
   `tokenizer_metric_labels()` in metrics_collector.py in 0.5.23) -- read from the wheel's source
   with `ast`. Only the keys that are always there are taken (the `if ...: labels[...] = ...`
   additions are for priority scheduling, DP attention and custom labels, which the kit does
   not turn on).
2. The collectors are constructed with those labels into prometheus_client's registry, exactly
   as the scheduler and the tokenizer manager construct them (`SchedulerMetricsCollector(...)`,
   `TokenizerMetricsCollector(...)`, every optional feature off, as the kit runs them).
3. `log_stats(SchedulerStats())` is called once: the scheduler's periodic stats log of an idle
   engine. A family whose child exists now is `eager`: it is on /metrics from the engine's
   first stats log on. Every other family is `lazy`: its child is created by the first event
   that touches it (`.labels(...)` in an `increment_*` / `observe_*` method), so it is absent
   from /metrics until then.
4. The format strings of the scheduler's "Prefill batch" / "Decode batch" log lines are read
   from `managers/scheduler_components/metrics_reporter.py` (or the scheduler mixin in
   releases that keep them there) for the sim's log lines.

Import quirks: `import triton` gets sglang's own stand-in (sglang_argcheck.install_triton_stub);
`sglang.srt.disaggregation.utils` and `sglang.srt.model_executor.forward_batch_info` pull in
the model executor (torch inductor, transformers), so each is stood in by a module holding only
the class metrics_collector imports from it (DisaggregationMode, ForwardMode), its source taken
verbatim from the wheel's file.

Reply (stdout, one JSON document): {"tool": "sglang-metrics", "version": "0.5.23",
"families": {name: {"type", "labels", "eager", "roles", "buckets"?, "collector"}}, "log_formats": {...}}
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import types
from importlib.metadata import version as dist_version

import prometheus_client
import prometheus_client.metrics as pm
from prometheus_client import REGISTRY

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sglang_argcheck  # noqa: E402  (a sibling file, found through the path entry above)

ROLES = {"prefill": "prefill", "decode": "decode", "unified": "null"}


def _pkg_dir() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        raise ImportError("sglang is not installed in this environment")
    return os.path.dirname(spec.origin)


def _read(rel: str) -> str:
    with open(os.path.join(_pkg_dir(), rel), encoding="utf-8") as f:
        return f.read()


def _stand_in(module: str, rel: str, class_name: str, prelude: str) -> None:
    """sys.modules[module] = a module with only `class_name`, its source verbatim from the wheel."""
    tree = ast.parse(_read(rel))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    mod = types.ModuleType(module)
    mod.__file__ = os.path.join(_pkg_dir(), rel)
    source = ast.get_source_segment(_read(rel), node)
    if source is None:  # only for a node without positions, which ast.parse always gives
        raise LookupError(f"no source text for class {class_name} in sglang/{rel}")
    exec(compile(prelude + "\n" + source, mod.__file__, "exec"), mod.__dict__)
    sys.modules[module] = mod


def _label_keys(*places: tuple[str, str]) -> list[str]:
    """The keys of the first `labels = {"model_name": ...}` dict literal in one of the
    (wheel file, function) places, tried in order (releases move the code)."""
    for rel, function in places:
        if os.path.exists(os.path.join(_pkg_dir(), rel)):
            keys = _label_keys_in(rel, function)
            if keys:
                return keys
    raise LookupError(f"no `labels = {{...}}` literal in any of {places}")


def _label_keys_in(rel: str, function: str) -> list[str] | None:
    tree = ast.parse(_read(rel))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Dict)
                        and any(isinstance(t, ast.Name) and t.id == "labels" for t in sub.targets)):
                    keys = [k.value for k in sub.value.keys
                            if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                    if "model_name" in keys:
                        return keys
    return None


def _log_formats() -> dict[str, str]:
    """The f-string templates of the Prefill/Decode batch log lines, as source text."""
    out: dict[str, str] = {}
    for rel in ("srt/managers/scheduler_components/metrics_reporter.py", "srt/managers/scheduler_metrics_mixin.py"):
        path = os.path.join(_pkg_dir(), rel)
        if not os.path.exists(path):
            continue
        src = _read(rel)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.JoinedStr):
                text = ast.get_source_segment(src, node) or ""
                for key in ("Prefill batch", "Decode batch"):
                    if key in text and key not in out:
                        out[key] = f"{rel}:{node.lineno}: {text}"
    return out


def _families(registry, base: set[str]) -> dict[str, dict]:
    """name as on /metrics -> {type, has_child, children} from a registry's collect(); `children`
    are the values of the labels beyond the collector's own (`base`) of each child present."""
    out = {}
    for fam in registry.collect():
        name = fam.name + ("_total" if fam.type == "counter" else "")
        children = {tuple(sorted((k, v) for k, v in s.labels.items() if k not in base and k not in ("le", "quantile")))
                    for s in fam.samples}
        out[name] = {"type": fam.type, "has_child": bool(fam.samples),
                     "children": [dict(c) for c in sorted(children) if c]}
    return out


def _metric_objects(collector) -> dict[str, pm.MetricWrapperBase]:
    """name as on /metrics -> the prometheus_client metric object held by a collector."""
    out: dict[str, pm.MetricWrapperBase] = {}
    for value in vars(collector).values():
        if isinstance(value, pm.MetricWrapperBase):
            kind = value._type
            name = value._name + ("_total" if kind == "counter" else "")
            out[name] = value
    return out


def _buckets(metric) -> list[float] | None:
    b = getattr(metric, "_upper_bounds", None)
    if not b:
        return None
    return [x for x in b if x != float("inf")]


def main() -> int:
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    sglang_argcheck.install_triton_stub()
    sglang_argcheck.define_torchvision_schemas()
    _stand_in("sglang.srt.disaggregation.utils", "srt/disaggregation/utils.py", "DisaggregationMode",
              "from enum import Enum")
    _stand_in("sglang.srt.model_executor.forward_batch_info", "srt/model_executor/forward_batch_info.py",
              "ForwardMode", "from enum import IntEnum, auto")

    # lazy: sglang only after the triton stub, torchvision schemas and stand-ins above
    import sglang.srt.observability.metrics_collector as mc
    from sglang.srt.server_args import ServerArgs

    sched_keys = _label_keys(("srt/observability/metrics_collector.py", "init_new"))
    tok_keys = _label_keys(("srt/observability/metrics_collector.py", "tokenizer_metric_labels"),
                           ("srt/managers/tokenizer_manager.py", "init_metric_collector_watchdog"))
    ServerArgs.__post_init__ = lambda self: None  # 0.5.17 resolves the model and GPUs there
    families: dict[str, dict] = {}
    for role, mode in ROLES.items():
        for c in list(REGISTRY._collector_to_names):
            REGISTRY.unregister(c)
        server_args = ServerArgs(model_path="/models/m", disaggregation_mode=mode, enable_metrics=True)
        if hasattr(mc, "get_context"):
            # 0.5.2x: the collectors read their settings from the runtime context's config
            # bags. publish() would also resolve the model config (resolve_once); the bags are
            # built from the raw ServerArgs without it (RuntimeContext.set_server_args).
            # Its derived leaves are computed from the model's config (transformers, torchvision):
            # no metric depends on them, so that step is left out.
            import sglang.srt.runtime_context as rc

            rc._install_derived_leaves = lambda tops, server_args: None
            mc.get_context().set_server_args(server_args)
        engine_type = mc.DisaggregationMode.to_engine_type(mode)
        values = {"model_name": "m", "engine_type": engine_type, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
        sched = mc.SchedulerMetricsCollector(
            labels={k: values[k] for k in sched_keys}, enable_lora=False, enable_hierarchical_cache=False,
            enable_streaming_session=False, server_args=server_args)
        tok = mc.TokenizerMetricsCollector(
            server_args=server_args, labels={k: values[k] for k in tok_keys},
            bucket_time_to_first_token=server_args.bucket_time_to_first_token,
            bucket_e2e_request_latency=server_args.bucket_e2e_request_latency,
            bucket_inter_token_latency=server_args.bucket_inter_token_latency)
        sched.log_stats(mc.SchedulerStats())
        present = _families(REGISTRY, set(sched_keys) | set(tok_keys) | {"pid"})
        for collector_name, collector in (("scheduler", sched), ("tokenizer", tok)):
            for name, metric in _metric_objects(collector).items():
                if name not in present:
                    continue  # a GaugeHistogram or a metric another collector owns
                entry = families.setdefault(name, {
                    "type": present[name]["type"],
                    "labels": sorted(metric._labelnames),
                    "collector": collector_name,
                    "eager": {},
                })
                entry["eager"][role] = present[name]["has_child"]
                if present[name]["children"]:
                    # the children an idle engine already has, by their extra labels (the sim creates the same)
                    entry["eager_children"] = present[name]["children"]
                mp_mode = getattr(metric, "_multiprocess_mode", None)
                if mp_mode:
                    entry["multiprocess_mode"] = mp_mode
                b = _buckets(metric)
                if b is not None:
                    entry["buckets"] = b
    # a family is eager when its child exists in every role; roles where it does are listed
    for entry in families.values():
        eager_roles = sorted(r for r, e in entry.pop("eager").items() if e)
        entry["eager_roles"] = eager_roles
        entry["eager"] = eager_roles == sorted(ROLES)
    reply = {
        "tool": "sglang-metrics",
        "version": dist_version("sglang"),
        "prometheus_client": prometheus_client.__version__ if hasattr(prometheus_client, "__version__")
        else dist_version("prometheus-client"),
        "scheduler_labels": sched_keys,
        "tokenizer_labels": tok_keys,
        "families": dict(sorted(families.items())),
        "log_formats": _log_formats(),
    }
    real_stdout.write(json.dumps(reply, indent=1, sort_keys=True) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
