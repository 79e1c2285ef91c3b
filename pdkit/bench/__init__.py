"""`pdkit bench` and `pdkit compare`: measure the cluster through its router, keep every run.

`pdkit bench INVENTORY --concurrency 1,16,64 --input-len N --output-len N --requests N` sends
streaming requests through the cluster's router (the first router host of the spec) with a
fixed input and output length, after a warm-up, and reports per concurrency level: output
tok/s, requests/s, TTFT, TPOT, ITL (mean, p50, p99) and errors.

`--limit HOST` (repeatable) benches only those hosts' own engines: each request goes to one of
their PD pairs directly, in the form the router gives it (pdkit.bench.measure), the pairs in turn.
Through the router, smg's load-aware decode policy (power_of_two) moves load off a slow engine, so
a change on one node of several barely moves the cluster's figure; a limited bench measures that
node's pairs alone. Its record says so (env.measured.via "engines") and `pdkit doctor` never takes
it as the cluster's baseline.

Where things live, lowest first:
- stats.py: the maths (percentiles, TPOT, ITL, goodput) and how a failed stream is classified;
  standard library only (the bare-python load clients import it);
- client.py: the load client: one streamed /generate request timed, the request body, a level's loop;
- agentic.py: the agentic workload: SGLang's agentic-trace format (generated or a user's trace), the
  multi-turn replayer (chat completions through the router), per-depth figures, run_agentic_bench;
- routes.py: which engines the requests go to (the router's, or a target's own PD pairs);
- measure.py: Measured, sending along those routes (`pdkit tune`'s gates and bench, `--limit`, doctor);
- env.py: the record's environment fingerprint; record.py: the record, run_bench, KV figures per
  level, runs.jsonl; report.py: tables, PNG, compare; sglang.py: `--engine-bench sglang`;
- cli.py: the `bench` and `compare` subcommands (`--workload agentic`, `--trace`, `--write-trace`).

Every public name of the former pdkit/bench.py stays importable from here (`from pdkit.bench import
run_bench`). They are looked up in their submodule on first use (PEP 562), not at import: importing
pdkit.bench.stats runs this file first, and it must load nothing beyond the standard library.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

# The public names of the former pdkit/bench.py, by the submodule that holds them now
_PUBLIC = {
    "agentic": ("AgenticParams", "AgenticWorkload", "generate_trace", "load_trace", "run_agentic_bench",
                "trace_from_dict", "write_trace"),
    "cli": ("EXIT_INVALID", "add_parser", "cmd_bench", "cmd_compare", "limited_measure", "parse_concurrency"),
    "client": ("PROMPT_TOKEN_RANGE", "Progress", "Sender", "generate_body", "prompt_ids", "router_sender",
               "router_target", "run_level", "stream_one"),
    "env": ("NVIDIA_SMI_DRIVER", "SSH_TIMEOUT_S", "engine_flags", "fingerprint", "parse_driver_versions",
            "probe_driver", "spec_hash", "ssh_command"),
    "measure": ("measured_for",),
    "record": ("DEFAULT_OUT", "KV_SCRAPE_TIMEOUT_S", "KvSample", "NO_PD_HANDOFF", "RUNS_FILE", "SCHEMA_VERSION",
               "append_run", "cache_counts", "check_context", "check_workload", "find_run", "kv_prefills",
               "level_kv", "load_runs", "run_bench",
               "level_cache", "run_id", "say_kv_unread", "scrape_kv", "served_model"),
    "report": ("COMPARED_METRICS", "ERRORS", "KV_COLUMNS", "LEVEL_COLUMNS", "METRICS", "argv_options",
               "compare_levels", "describe_env", "describe_measured", "flag_changes", "fmt_cell", "kv_has_figures",
               "kv_text", "render_compare", "render_goodput", "render_kv", "render_markdown", "render_plot",
               "sent_to", "write_outputs"),
    "routes": ("router_measured",),
    "sglang": ("SGLANG_BENCH_MODULE", "level_from_sglang_result", "read_sglang_results", "run_sglang_agentic_bench",
               "run_sglang_bench", "sglang_agentic_command", "sglang_bench_available", "sglang_bench_command"),
    "stats": ("RequestResult", "ratio", "summarize_level"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_HOME)


def _submodules() -> dict[str, ModuleType]:
    # lazy: they load pydantic (through the spec); importing pdkit.bench.stats must need the standard library only
    from pdkit.bench import agentic, cli, client, env, measure, record, report, routes, sglang, stats

    return {"agentic": agentic, "cli": cli, "client": client, "env": env, "measure": measure, "record": record,
            "report": report, "routes": routes, "sglang": sglang, "stats": stats}


def __getattr__(name: str) -> Any:
    """A public name of the former pdkit/bench.py, from its submodule; kept here, so the next lookup
    (and a test's monkeypatch of it) is a plain attribute of the package."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_submodules()[_HOME[name]], name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
