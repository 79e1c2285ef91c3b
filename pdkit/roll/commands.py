"""`pdkit roll | releases | rollback`: their argument parsers and commands, what they print (the dry
plan, the refusal, the last line of a stopped roll) and the --report JSON; reading the nodes' state
the roll is planned from.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from pdkit.agent.engineshape import SHAPES_DIR
from pdkit.agent.enginestarts import history_probe_command
from pdkit.agent.health import ready_marks_dir
from pdkit.agent.releases import previous_release, release_json_path
from pdkit.clients import answers
from pdkit.inventory.loader import load_or_report
from pdkit.render.outages import batch_outages
from pdkit.roll.planning import (
    HostDiff,
    RollError,
    format_dry_plan,
    host_diff,
    host_estimates,
    make_batches,
    merge_units,
    outage_lines,
    pairing_units,
    put_back_summary,
    refusal_text,
    rerun_with_downtime,
    restart_to_ready,
    rollout_order,
    spanning_units,
    stop_summary,
    unchanged_hosts,
    version_changes,
)
from pdkit.roll.pyinfra_api import patch_gevent, run_remote
from pdkit.roll.roller import NodeTiming, Progress, Roller, phases_words, timing_probe_command

EXIT_FAILED = 1
EXIT_INVALID = 2


def _load(inventory: str):
    return load_or_report(inventory)



def read_node_state(
    roller: Roller, hosts: list[str],
) -> tuple[dict[str, HostDiff], dict[str, dict[str, str]], dict[str, str]]:
    """(diff per host, engine versions each node runs now, unreachable hosts), read over SSH; nothing changes."""
    # lazy: pyinfra (and pdkit.hosts.hoststate, which imports it) load only after patch_gevent
    from pyinfra.context import ctx_host

    from pdkit.hosts import hoststate

    state, connected, unreachable = roller.pyinfra.connect(hosts)
    diffs: dict[str, HostDiff] = {}
    versions: dict[str, dict[str, str]] = {}
    release_json = release_json_path(roller.spec.cluster.config_dir)
    for name, host in connected.items():
        with ctx_host.use(host):
            facts = hoststate.host_state()
            try:
                new_venvs = hoststate.changed_venv_links()
            except (Exception, SystemExit):  # noqa: BLE001 - no wheelhouse for this python here: say so in the plan
                new_venvs = set()
        diffs[name] = host_diff(roller.plans[name], facts, new_venvs=new_venvs)
        ok, stdout, _ = run_remote(host, f"cat {shlex.quote(release_json)} 2>/dev/null || true", timeout=60)
        try:
            engines = json.loads(stdout).get("engines", {}) if stdout.strip() else {}
        except ValueError:
            engines = {}
        versions[name] = {e: v.get("sglang_version") for e, v in engines.items()}
    return diffs, versions, unreachable


def cmd_roll(args: argparse.Namespace) -> int:
    patch_gevent()
    spec = _load(args.inventory)
    if spec is None:
        return EXIT_INVALID
    try:
        order = rollout_order(spec, limit=args.limit or None, canary=args.canary)
    except ValueError as exc:
        print(f"pdkit roll: {exc}", file=sys.stderr)
        return EXIT_INVALID
    roller = Roller(args.inventory, spec, Progress(), drain_timeout_s=args.drain_timeout,
                    smoke_requests=args.smoke_requests)
    gate = spec.cluster.answers
    if gate.enabled and not getattr(args, "no_answers", False) and spec.router_hosts:
        roller.answer_gate, roller.answer_exact = gate.gate_config(), gate.exact
    progress = roller.progress
    progress("-", "plan", f"reading {len(order)} host(s) to plan the roll")
    diffs, versions, unreachable = read_node_state(roller, order)
    if unreachable and args.dry:
        for h, why in unreachable.items():
            print(f"pdkit roll --dry: {h}: cannot reach it over SSH ({why})", file=sys.stderr)
    units, explanations = merge_units(pairing_units(spec, version_changes(spec, versions)), spanning_units(spec))
    roller.unchanged = unchanged_hosts(diffs)
    try:
        batches = make_batches(order, args.batch, units)
    except ValueError as exc:
        print(f"pdkit roll: {exc}", file=sys.stderr)
        return EXIT_INVALID
    secret = {f.path for plan in roller.plans.values() for f in plan.files if f.secret}
    outages = {i: found for i, b in enumerate(batches)
               if not all(h in roller.unchanged for h in b) and (found := batch_outages(spec, b))}
    roller.restart_s = measure_restarts(roller, sorted({h for i in outages for h in batches[i]}))
    # the announcement: each restarted engine's last warm restart of the class it will have
    # (pdkit/agent/enginestarts.py)
    roller.estimates = {h: host_estimates(roller.plans[h], diffs.get(h), history)
                        for h, history in roller.start_history.items()}
    downtime = outage_lines(batches, outages, roller.restart_s, spec.cluster.ready_timeout_s, roller.estimates)
    if args.dry:
        print(format_dry_plan(batches, diffs, explanations, secret))
        print("", answer_gate_lines(spec, roller.answer_gate, roller.answer_exact), sep="\n")
        if downtime:
            accepted = ("accepted by --allow-downtime" if args.allow_downtime
                        else "the roll refuses it without --allow-downtime")
            print("", f"downtime ({accepted}):", *(f"  {line}" for line in downtime), sep="\n")
        return EXIT_FAILED if unreachable else 0

    def write_report(result: str, **extra: Any) -> None:
        # on every exit once the roll is planned: a failed roll is when the report is wanted most
        if args.report:
            Path(args.report).write_text(json.dumps({"result": result, **report(roller.timings), "downtime": downtime,
                                                     "silences": roller.silencer.records, **extra}, indent=2) + "\n")

    if downtime and not args.allow_downtime:
        print(refusal_text("roll", rerun_with_downtime(args), downtime), file=sys.stderr)
        write_report("refused", reason="downtime not accepted (--allow-downtime)")
        return EXIT_INVALID
    roller.allow_downtime = args.allow_downtime
    try:
        for note in roller.read_router_keys():
            progress("-", "key", note)
    except BaseException as exc:
        write_report("error", error=f"{type(exc).__name__}: {exc}")
        raise
    for line in downtime:
        progress("-", "downtime", line)
    for line in explanations:
        progress("-", "pairing", line)
    progress("-", "plan", "order: " + " | ".join(", ".join(b) for b in batches))
    for i, batch in enumerate(batches):
        try:
            roller.roll_batch(batch)
            if i == 0 and args.bake > 0 and len(batches) > 1:
                roller.bake(batch, args.bake)
        except RollError as exc:
            untouched = [h for b in batches[batches.index(batch) + 1:] for h in b]
            print(f"pdkit roll: stopped: {exc}", file=sys.stderr)
            print(stop_summary(exc, untouched), file=sys.stderr)
            write_report("stopped", answers=roller.answer_record,
                         failed={"host": exc.host, "gate": exc.gate, "message": exc.message,
                                            "restored": exc.restored,
                                            "outage_s": (None if roller.last_outage_s is None
                                                         else round(roller.last_outage_s, 2))},
                         untouched=untouched)
            return EXIT_FAILED
        except BaseException as exc:
            write_report("error", error=f"{type(exc).__name__}: {exc}")
            raise
    write_report("ok", answers=roller.answer_record)
    if roller.timings:
        worst = max(roller.timings, key=lambda t: t.overhead_s)
        progress("-", "done", f"{len(order)} host(s) rolled; largest kit "
                              f"overhead {worst.overhead_s:.1f} s on {worst.host}")
    return 0


def answer_gate_lines(spec: Any, cfg: Any, exact: bool) -> str:
    """What the canary's answer gate will run (`pdkit roll --dry`), and what it costs."""
    if cfg is None:
        why = ("no router to send through" if not spec.router_hosts
               else "off (pdkit_cluster.answers.enabled false, or --no-answers)")
        return f"answers gate: {why}; the canary's smoke requests must only succeed"
    from pdkit.bench.record import context_cap  # lazy: the bench package loads only for a roll that prints its gate

    head = (f"answers gate on the first batch that changes ({'exact' if exact else 'numerics within tolerance'}; "
            "the baseline recorded before its drain, kept per release):")
    from pdkit.spec.numerics import BY_DESIGN, findings  # lazy: read only for the dry plan

    named = [f"  changes the answers by design (acknowledged): {f.host}/{f.engine} {f.setting}"
             for f in findings(spec) if f.id in BY_DESIGN]
    return "\n".join([head, *(f"  {line}" for line in answers.describe(cfg, context_cap(spec), exact)), *named])


def measure_restarts(roller: Roller, hosts: list[str]) -> dict[str, float | None]:
    """Each host's last engine restart-to-ready (Roller.last_restart_to_ready), read over SSH, and
    its engines' start histories (pdkit/agent/enginestarts.py) into roller.start_history; an unreachable
    host has neither (the connect gate will name it)."""
    if not hosts:
        return {}
    _, connected, _ = roller.pyinfra.connect(hosts)
    marks = ready_marks_dir(SHAPES_DIR)
    for name, host in connected.items():
        units = [s.unit for s in roller.plans[name].services if s.kind == "engine"]
        ok, stdout, _ = run_remote(host, history_probe_command(units, marks), timeout=60) if units else (False, "", "")
        try:
            roller.start_history[name] = json.loads(stdout) if ok else {}
        except ValueError:
            roller.start_history[name] = {}
    return {name: roller.last_restart_to_ready(host, name) for name, host in connected.items()}


def report(timings: list[NodeTiming]) -> dict:
    """Per node: total, engines' restart-to-ready, the kit's own overhead, each step (seconds)."""
    return {
        "nodes": [
            {"host": t.host, "total_s": round(t.total_s, 2), "engines": t.engines,
             "engines_restart_to_ready_s": round(t.engines_restart_to_ready_s, 2),
             "overhead_s": round(t.overhead_s, 2), "waited_s": {k: round(v, 2) for k, v in t.waited.items()},
             "outage_s": None if t.outage_s is None else round(t.outage_s, 2),
             "announced_outage_s": None if t.announced_outage_s is None else round(t.announced_outage_s, 2),
             "announced_outage_source": t.announced_source,
             "steps": {k: round(v, 2) for k, v in t.steps.items()},
             "apply_detail": {k: round(v, 2) for k, v in t.apply_detail.items()},
             "engine_phases": t.engine_phases, "weights": t.weights}
            for t in timings
        ]
    }


def _load_for_host(args: argparse.Namespace, command: str):
    """The preamble of `pdkit releases | rollback INVENTORY HOST`: gevent patched before pyinfra loads,
    the inventory loaded and HOST found in it. None, the reason printed, when either fails (exit
    EXIT_INVALID: nothing was contacted)."""
    patch_gevent()
    spec = _load(args.inventory)
    if spec is None:
        return None
    if args.host not in {h.name for h in spec.hosts}:
        print(f"pdkit {command}: {args.host} is not in {args.inventory}", file=sys.stderr)
        return None
    return spec


def _connect_host(roller: Roller, host: str, command: str) -> dict | None:
    """{host: its pyinfra Host} for the one host a command works on; None, the reason printed, when SSH
    cannot reach it (exit EXIT_FAILED)."""
    _, hosts, unreachable = roller.pyinfra.connect([host])
    if unreachable:
        print(f"pdkit {command}: {host}: cannot reach it over SSH ({unreachable[host]})", file=sys.stderr)
        return None
    return hosts


def cmd_releases(args: argparse.Namespace) -> int:
    spec = _load_for_host(args, "releases")
    if spec is None:
        return EXIT_INVALID
    roller = Roller(args.inventory, spec, Progress(sys.stderr))
    hosts = _connect_host(roller, args.host, "releases")
    if hosts is None:
        return EXIT_FAILED
    ok, stdout, stderr = run_remote(hosts[args.host], roller.releases_command(args.host, "list"), timeout=60)
    if not ok:
        print(f"pdkit releases: {args.host}: {stderr.strip()[-500:]}", file=sys.stderr)
        return EXIT_FAILED
    data = json.loads(stdout)
    # the running engines' last starts: restart-to-ready and SGLang's own phases (the gate's ready marks)
    units = [sv.unit for sv in roller.plans[args.host].services if sv.kind == "engine"]
    if units:
        ok, probe, _ = run_remote(hosts[args.host], timing_probe_command(units), timeout=60)
        data["last_starts"] = last_starts(json.loads(probe)) if ok else {}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(format_releases(args.host, data, roller.plans[args.host].release_hash))
    return 0


def last_starts(probe: dict[str, list]) -> dict[str, dict[str, float]]:
    """Pure: per engine unit of a _TIMING_PROBE answer, its last start's restart-to-ready (the stop
    included when it belongs to the start) and SGLang's start-up phases; units never seen ready: left out."""
    out = {}
    for unit, values in probe.items():
        took = restart_to_ready({unit: values})
        if took is not None:
            out[unit] = {"restart_to_ready_s": round(took, 2), **(values[4] if len(values) > 4 else {})}
    return out


def format_releases(host: str, data: dict, planned_hash: str) -> str:
    lines = [f"{host}: {len(data['releases'])} release(s) kept, newest last ('*' = running now, "
             "'plan' = what the inventory says)"]
    for r in data["releases"]:
        marks = ("*" if r["id"] == data.get("current") else " ") + (" plan" if r["hash"] == planned_hash else "     ")
        lines.append(f"{marks} {r['id']}  {r['time']}  {r['files']} files  {weights_words(r)}{r['command']}")
    if not data["releases"]:
        lines.append("  (none: the node has not been deployed with release recording yet)")
    if data.get("last_starts"):
        lines.append("engines' last starts" + phases_words(data["last_starts"]).replace("; ", "\n  "))
    return "\n".join(lines)


def weights_words(release: dict) -> str:
    """`weights <manifest sha256, 16 hex>` per model path of a release (pdkit/weights), GONE when the node lost them."""
    words = [f"weights {w['sha256'][:16]}" + (" GONE" if any(w["version"] in m for m in release.get("weights_missing")
                                                                or ()) else "")
             for _, w in sorted((release.get("weights") or {}).items())]
    return "".join(f"{w}  " for w in words)


def rollback_weights_refusal(host: str, data: dict, to: str | None) -> str | None:
    """Why `pdkit rollback` refuses before any drain: the release it would restore ran on weights gone from
    the node (`releases list`'s weights_missing), naming the host, the release and the path; else None."""
    ids = [r["id"] for r in data.get("releases", [])]
    rid = previous_release(ids, data.get("current")) if to is None else next(
        (i for i in ids if i == to or i.startswith(to)), None)
    release = next((r for r in data.get("releases", []) if r["id"] == rid), None)
    if release is None or not release.get("weights_missing"):
        return None
    return (f"pdkit rollback: {host}: release {rid} ran on weights that are gone from the node: "
            f"{', '.join(release['weights_missing'])}; nothing was drained or changed. Stage them again "
            "(`pdkit stage INVENTORY --source ... --manifest ...`) or pick a release whose weights are kept "
            "(`pdkit releases`)")


def cmd_rollback(args: argparse.Namespace) -> int:
    spec = _load_for_host(args, "rollback")
    if spec is None:
        return EXIT_INVALID
    roller = Roller(args.inventory, spec, Progress(), drain_timeout_s=args.drain_timeout,
                    allow_downtime=args.allow_downtime, command="rollback")
    p = roller.progress
    batch = [args.host]
    for note in roller.read_router_keys():
        p("-", "key", note)
    hosts = _connect_host(roller, args.host, "rollback")
    if hosts is None:
        return EXIT_FAILED
    # before the drain: a release whose weights are gone is refused with nothing changed. Best effort: when
    # the list cannot be read the node's own restore refuses the same release before it changes anything
    try:
        ok, stdout, _ = run_remote(hosts[args.host], roller.releases_command(args.host, "list"), timeout=60)
        refusal = rollback_weights_refusal(args.host, json.loads(stdout), args.to) if ok else None
    except Exception:  # noqa: BLE001 - any failure to read it leaves the decision to the node's restore
        refusal = None
    if refusal:
        print(refusal, file=sys.stderr)
        return EXIT_FAILED
    roller.connected = dict(hosts)
    outages = batch_outages(spec, batch)
    if outages:
        roller.restart_s[args.host] = roller.last_restart_to_ready(hosts[args.host], args.host)
        downtime = outage_lines([batch], {0: outages}, roller.restart_s, spec.cluster.ready_timeout_s)
        if not args.allow_downtime:
            print(refusal_text("rollback", rerun_with_downtime(args), downtime), file=sys.stderr)
            return EXIT_INVALID
        for line in downtime:
            p("-", "downtime", line)
    name = "drain"
    # the node's alerts do not page from the drain to the smoke; a failed step expires the silence
    # once the engines are put back in the router, so a node left broken pages
    with roller.silenced(batch, "drain, restore, gates, re-add, smoke",
                         done="back on the release, ready and in the router",
                         failed="the rollback stopped on it: expired, so whatever is still wrong pages") as step:
        try:
            for name, fn in (("drain", roller.drain),
                             ("restore", lambda b: roller.restore(args.host, hosts[args.host], args.to)),
                             ("ready", roller.ready), ("router", roller.readd), ("smoke", roller.smoke)):
                start = time.monotonic()
                p(args.host, name, fn(batch), time.monotonic() - start)
        except Exception as exc:  # noqa: BLE001
            print(f"pdkit rollback: {args.host}: gate '{name}' failed: {exc}", file=sys.stderr)
            # whatever step failed, the engines the drain took out go back in the router if
            # healthy (the restore, done or not, is not tried again): a healthy box is never left out
            recovery = roller.put_back_in_service(batch)
            restored = None if name == "drain" else name != "restore"
            print(put_back_summary("rollback", args.host, restored=restored,
                                   readded=None if recovery is None else recovery.back,
                                   left_out=None if recovery is None else recovery.left_out), file=sys.stderr)
            step.failed = True
    return EXIT_FAILED if step.failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("roll", help="apply the inventory node by node: drain, apply, "
                                           "gate, re-add, smoke; roll back a failed node")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append", default=[], metavar="HOST", help="only these hosts (repeat)")
    p.add_argument("--canary", metavar="HOST", help="roll this host first, alone (default: "
                                                    "the first GPU node without a router)")
    p.add_argument("--batch", type=int, default=1, metavar="N", help="hosts per batch after the canary (default 1)")
    p.add_argument("--dry", action="store_true", help="print the order and what would "
                                                      "change on each node; change nothing")
    p.add_argument("--no-answers", action="store_true",
                   help="skip the canary's answer gate (pdkit_cluster.answers; docs/correctness.md) for this roll")
    p.add_argument("--bake", type=float, default=0.0, metavar="S",
                   help="after the canary, let it serve S seconds and check it again before going on")
    p.add_argument("--drain-timeout", type=float, default=300.0, metavar="S",
                   help="longest wait for an engine's running requests and PD queues to empty")
    p.add_argument("--smoke-requests", type=int, default=4, metavar="N",
                   help="completions sent through each router after a node rejoins")
    p.add_argument("--report", metavar="FILE", help="write per-node timings (total, engines' restart-to-ready, "
                                                    "kit overhead, outage, steps) and the Alertmanager "
                                                    "silences made (ids, matchers, window) as JSON")
    p.add_argument("--allow-downtime", action="store_true",
                   help="accept an outage where a batch holds a router's last "
                        "workers of a kind (a one-node cluster); refused without it")
    p.set_defaults(func=cmd_roll)

    p = subparsers.add_parser("releases", help="list the releases kept on a node")
    p.add_argument("inventory")
    p.add_argument("host")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_releases)

    p = subparsers.add_parser("rollback", help="put a node back on a kept release (default: "
                                               "the previous one), drained and gated")
    p.add_argument("inventory")
    p.add_argument("host")
    p.add_argument("--to", metavar="RELEASE", help="release id or unique prefix (see `pdkit releases`)")
    p.add_argument("--drain-timeout", type=float, default=300.0, metavar="S")
    p.add_argument("--allow-downtime", action="store_true", help="accept an outage where the node holds "
                                                                 "a router's last workers of a kind")
    p.set_defaults(func=cmd_rollback)
