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

The names below are what other packages use (pdkit.tune, pdkit.doctor's baseline, gpu/pdkit_tools.py);
everything else, tests and the siblings here included, is imported from its submodule
(`from pdkit.bench.stats import summarize_level`). The names are looked up in their submodule on first
use (PEP 562), not at import: importing pdkit.bench.stats runs this file first, and it must load nothing
beyond the standard library.
"""

from __future__ import annotations

from typing import Any

from pdkit import lazy_attr

# What other packages use, by the submodule that holds it
_PUBLIC = {
    "client": ("router_target",),
    "env": ("engine_flags",),
    "record": ("append_run", "check_workload", "load_runs", "run_bench"),
    "report": ("describe_measured", "flag_changes", "fmt_cell", "render_plot"),
    "sglang": ("run_sglang_bench",),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """A name of the surface, from its submodule; kept here, so the next lookup (and a test's
    monkeypatch of it: pdkit.doctor.baseline and pdkit.tune.runner look run_bench up here) is a plain
    attribute of the package."""
    return lazy_attr(globals(), _HOME, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
