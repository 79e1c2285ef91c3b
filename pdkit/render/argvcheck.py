"""Rules decided on the command lines pdkit renders, read through the pinned parsers' table.

Each engine's and router's argv (`pdkit.render.flags`) is read the way its own argparse reads it
(`pdkit.upstream.parsertable`, generated from the real wheels), which decides:

- spec fields SGLang or the router accept only from a fixed set: the valid values are
  that release's own choices;
- `extra_args`: split, resolved through aliases and prefixes, unknown flags, bad choices,
  clashes with a generated flag, credentials;
- what every prefill/decode pair the router can make must agree on.
"""

from __future__ import annotations

from pdkit.render import flags
from pdkit.spec import ClusterSpec, Engine, HostSpec, Problem, modelconfig, pairing_sets
from pdkit.spec.pagesize import RunPage, run_page
from pdkit.spec.startup import effective_page, tuning_origin
from pdkit.upstream import startchecks, ucxcheck
from pdkit.upstream.parsertable import Parsed, Parser, router_parser, sglang_parser, speculative_algorithms
from pdkit.upstream.versions import SGLANG_RELEASES

SECRETS_POINTER = (
    "on the command line it is visible in ps, the unit file and the journal; credentials reach hosts only "
    "through pdkit_cluster.secrets (README: the secrets table"
)
# tuning field -> the spec field to name when an extra flag restates it
_FIELD_OF_FLAG = {flag: f"tuning.{name}" for name, flag in flags._VALUE_FLAGS}
# SGLang fields that must agree across a pair besides the ones its help marks `both_roles`
# (docs/tuning.md: NIXL/mooncake move KV pages as laid out by page size and dtype)
_PAIR_DESTS = {"page_size": "tuning.page_size", "kv_cache_dtype": "tuning.kv_cache_dtype"}


# model path -> (its config.json keys, where they were read); validate reads a directory on this machine
ModelConfigs = dict[str, tuple[dict, str]]


def local_model_configs(spec: ClusterSpec) -> ModelConfigs:
    """The config.json of every model directory that is on this machine (pdkit.spec.modelconfig.read_local)."""
    out: ModelConfigs = {}
    for _, engine in spec.engines():
        path = spec.engine_model(engine).path
        if path.startswith("/") and path not in out:
            config = modelconfig.read_local(path)
            if config is not None:
                out[path] = (config, f"{path.rstrip('/')}/config.json, read by validate on this machine")
    return out


def problems(spec: ClusterSpec, configs: ModelConfigs | None = None) -> list[Problem]:
    """Every problem the pinned parsers' table finds, in inventory order. CONFIGS: the model configs known
    (None: those on this machine), which decide the page a checkpoint forces."""
    found: dict[tuple[str, str, str], Problem] = {}
    configs = local_model_configs(spec) if configs is None else configs

    def add(problem: Problem) -> None:
        found.setdefault((problem.host, problem.field, problem.message), problem)

    engine_args: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    for host, engine in spec.engines():
        args = _check_engine(spec, host, engine, add)
        engine_args[(host.name, engine.name)] = args
        _check_engine_env(spec, host, engine, add)
        page = engine_run_page(spec, host, engine, args, configs)
        _check_derivations(spec, host, engine, add, page)
        _check_engine_page(spec, host, engine, page, add)
    for host in spec.router_hosts:
        _check_router(spec, host, add)
    _check_pairs(spec, engine_args, add, configs)
    return list(found.values())


def pair_page_problems(spec: ClusterSpec, configs: ModelConfigs, host_name: str) -> list[Problem]:
    """The PD pairs' page agreement judged on CONFIGS (the preflight's config.json keys from HOST_NAME's node), as
    `problems` judges it on a local config.json: the problems reported on HOST_NAME's engines (each pair is
    reported on its second engine's host, so once)."""
    engine_args = {}
    for host, engine in spec.engines():
        parsed, _ = sglang_parser(spec.engine_version(engine)).parse(flags.sglang_args(spec, host, engine))
        engine_args[(host.name, engine.name)] = {p.option.dest: p.values or ("(set)",) for p in parsed}
    found: list[Problem] = []
    _check_pairs(spec, engine_args, found.append, configs, pages_only=True)
    return [p for p in found if p.host == host_name]


def engine_run_page(spec: ClusterSpec, host: HostSpec, engine: Engine, args: dict[str, tuple[str, ...]],
                    configs: ModelConfigs) -> RunPage:
    """The page ENGINE really runs with (pdkit.spec.pagesize.run_page): its argv, its node's GPU generation and the
    model's config.json where known."""
    node = host.node
    sm_major = node.gpus.sm_major if node is not None and node.gpu == "nvidia" else None
    known = configs.get(spec.engine_model(engine).path)
    return run_page(spec.engine_version(engine), args, sm_major, known[0] if known else None)


def _check_engine_page(spec: ClusterSpec, host: HostSpec, engine: Engine, page: RunPage, add) -> None:
    """A page_size fa4 replaces on SM100 (pdkit.spec.pagesize, _fa4_page_constraint): a warning on the field (the
    model-forced pages warn in pdkit.spec.modelconfig.architecture_problems)."""
    tuning = spec.engine_tuning(engine)
    if tuning.page_size is None or page.page == tuning.page_size or not page.sure or "fa4" not in page.why:
        return
    field = tuning_origin(spec, engine, "", "page_size")
    add(Problem(host.name, field if field.startswith("pdkit_cluster") else f"{engine_path(host, engine)}.{field}",
                f"page_size {tuning.page_size} is replaced: {page.why}, as for every non-MLA checkpoint on SM100 "
                f"unless EAGLE's topk is above 1; every rule and PD pair runs on page {page.page}: set page_size "
                f"{page.page} or leave it unset", "warning"))


def _check_engine_env(spec: ClusterSpec, host: HostSpec, engine: Engine, add) -> None:
    """An engine's `env` may not set a variable pdkit renders for it from a field (its environment file
    is read last: the value would silently replace the field's, and every rule checked on it): an error
    naming the field to use instead (pdkit.render.flags.RENDERED_ENV_OWNERS). Variables pdkit does not render
    for this engine (UCX_TLS beside ucx_net_devices, NCCL_PROTO without a PCIe profile) stay the user's."""
    if not engine.env:
        return
    rendered = flags.rendered_env(spec, host, engine)
    at = engine_path(host, engine)
    tls = engine.env.get("UCX_TLS", rendered.get("UCX_TLS"))  # which transports read their settings
    loads_ucx = engine.role != "unified" and spec.cluster.transfer_backend == "nixl"
    for var, value in engine.env.items():
        owner = flags.RENDERED_ENV_OWNERS.get(var)
        if var not in rendered or owner is None:
            if var.startswith("UCX_") and (found := ucxcheck.setting_problem(var, str(value), tls)):
                severity, why = found
                if not loads_ucx and severity == "error":
                    # nothing in this engine opens UCX: the value cannot fail it, only mislead the reader
                    reason = ("a unified engine hands no KV off" if engine.role == "unified"
                              else f"the transfer backend is {spec.cluster.transfer_backend}")
                    severity = "warning"
                    why = f"{why} (but this engine does not load UCX: {reason}, so nothing reads it here)"
                add(Problem(host.name, f"{at}.env.{var}", why, severity))
            continue
        add(Problem(host.name, f"{at}.env.{var}",
                    f"{var}={value!r} would replace the {rendered[var]!r} pdkit renders for this engine (its env file "
                    f"is read last, so every check of that value would be wrong): remove it and set {owner} instead"))
    # the UCX variables the inventory sets and may set (an owned one is refused above)
    given = {var for var in engine.env
             if var.startswith("UCX_") and not (var in rendered and flags.RENDERED_ENV_OWNERS.get(var))}
    if given and loads_ucx:
        # what NIXL's UCX reads at the engine's start: pdkit's UCX variables with the inventory's on top
        effective = {k: str(v) for k, v in {**rendered, **engine.env}.items() if k.startswith("UCX_")}
        for var, why in ucxcheck.related_problems(effective, given):
            add(Problem(host.name, f"{at}.env.{var}", why))


def _check_derivations(spec: ClusterSpec, host: HostSpec, engine: Engine, add, page: RunPage) -> None:
    """What SGLang derives before its start checks (0.5.23's backend aliases, EAGLE's adjusted draft tokens,
    the default chunk by GPU memory, MoE runner resolution, SGLANG_CUTLASS_MOE, backends in extra_args):
    pdkit.upstream.startchecks.derivation_problems, judged on the page the engine really runs (PAGE: the MLA and fa4
    snaps and the model's own page where known; SGLang's default 1 when none is set)."""
    node = host.node
    assert node is not None
    tuning = spec.engine_tuning(engine)
    at = engine_path(host, engine)
    gpu = node.gpu == "nvidia"
    for severity, name, why in startchecks.derivation_problems(
            spec.engine_version(engine), engine.role, tuning, tuple(engine.extra_args), dict(engine.env),
            node.gpus.sm_major if gpu else None, node.gpus.memory_gib if gpu else None,
            page.page if page.page is not None else effective_page(spec.engine_version(engine), tuning, engine),
            engine.attn_dp or 1, engine.ep):
        head = name.split(".")[0]
        field = (name if name.startswith(("env.", "extra_args"))
                 else tuning_origin(spec, engine, "", head) + name[len(head):])
        add(Problem(host.name, field if field.startswith("pdkit_cluster") else f"{at}.{field}", why, severity))


def engine_path(host: HostSpec, engine: Engine) -> str:
    assert host.node is not None
    return f"pdkit_node.engines[{host.node.engines.index(engine)}]"


def _check_engine(spec: ClusterSpec, host: HostSpec, engine: Engine, add) -> dict[str, tuple[str, ...]]:
    """Choices of the engine's spec fields and its extra_args; returns its argv as dest -> values."""
    version = spec.engine_version(engine)
    parser = sglang_parser(version)
    at = engine_path(host, engine)
    tuning = spec.engine_tuning(engine)
    missing = _levers_missing(version, parser, tuning)
    for name, flag in missing.items():
        have = [v for v in sorted(SGLANG_RELEASES) if flag in sglang_parser(v).by_flag]
        add(Problem(host.name, f"{at}.tuning.{name}",
                    f"SGLang {version}'s parser has no {flag} (pdkit/upstream/parser_table.json): this lever is "
                    f"offered only "
                    f"on {', '.join(have) or 'no pinned release'}; valid: sglang_version "
                    f"{' or '.join(have) or '(none)'}, or {name} unset"))
    for name, flag in flags._VALUE_FLAGS:
        value = getattr(tuning, name)
        if value is None or name in missing:
            continue
        choices = parser.choices(flag)
        if choices is not None and str(value) not in choices:
            add(Problem(host.name, f"{at}.tuning.{name}",
                        f"SGLang {version} has no {name} {value!r}; valid: {', '.join(choices)}"))
    model = spec.engine_model(engine)
    model_at = f"{at}.model" if engine.model is not None else "pdkit_cluster.model"
    load_formats = parser.choices("--load-format")
    if model.load_format is not None and load_formats is not None and model.load_format not in load_formats:
        add(Problem(host.name, f"{model_at}.load_format",
                    f"SGLang {version} has no load format {model.load_format!r}; valid: {', '.join(load_formats)}"))
    transfer = parser.choices("--disaggregation-transfer-backend") or ()
    if engine.role != "unified" and spec.cluster.transfer_backend not in transfer:
        add(Problem(host.name, "pdkit_cluster.transfer_backend",
                    f"SGLang {version} has no transfer backend {spec.cluster.transfer_backend!r}; valid: "
                    f"{', '.join(transfer)}"))
    if tuning.speculative is not None and tuning.speculative.algorithm not in speculative_algorithms(version):
        add(Problem(host.name, f"{at}.tuning.speculative.algorithm",
                    f"SGLang {version} has no algorithm {tuning.speculative.algorithm!r}; valid: "
                    f"{', '.join(speculative_algorithms(version))}"))

    argv = flags.sglang_args(spec, host, engine)
    generated = argv[: len(argv) - len(engine.extra_args)]
    gen_parsed, _ = parser.parse(generated)  # pdkit's own flags: tests/test_contract_generated.py holds them to SGLang
    extra_parsed = _check_extra_args(parser, host.name, f"{at}.extra_args", gen_parsed, engine.extra_args, add,
                                     "the engine")
    unchecked = startchecks.unchecked_fields(version)
    for p in extra_parsed:
        says = unchecked.get(p.option.dest)
        if says is not None:
            shown = says if len(says) <= 160 else says[:157] + "..."
            add(Problem(host.name, f"{at}.extra_args",
                        f"{p.written.split('=', 1)[0]} is read by a check SGLang {version} runs at start ({shown}), "
                        "which pdkit cannot check before start: validate holds extra_args to the parser only, so a bad "
                                                      "combination fails the engine's start "
                                                      "(pdkit/upstream/data/startup_checks.json)", "warning"))
    values: dict[str, tuple[str, ...]] = {}
    for p in [*gen_parsed, *extra_parsed]:
        values[p.option.dest] = p.values or ("(set)",)
    _check_what_pdkit_reads(host, at, tuning, values, add)
    return values


# What pdkit itself reads from an engine's log (issue 46: settings that switch it off pass validation
# and then leave doctor, the roll's timings and the dashboards blind): SGLang writes both at INFO
# (entrypoints/http_server.py the readiness line pdkit.agent.health.READY_LOG_LINE, the scheduler's
# "Decode batch, ... cuda graph: True" every --decode-log-interval steps, default 40).
LOG_READERS = ("the 'Decode batch' lines that show whether decode runs its CUDA graphs (pdkit/agent/exporter/logs.py, "
               "doctor's decode-graph row) and the readiness line the roll times restarts by")
QUIET_LOG_LEVELS = ("warning", "error", "critical")
MAX_DECODE_LOG_INTERVAL = 1000  # steps: beyond it a batch line comes too seldom for a scrape window


def _check_what_pdkit_reads(host: HostSpec, at: str, tuning, values: dict[str, tuple[str, ...]], add) -> None:
    """A warning (the inventory may mean it) when the engine's argv stops logging what pdkit reads."""
    level = (values.get("log_level") or ("info",))[0]
    if level in QUIET_LOG_LEVELS:
        field = f"{at}.tuning.log_level" if tuning.log_level is not None else f"{at}.extra_args"
        add(Problem(host.name, field, f"--log-level {level} hides {LOG_READERS}, which SGLang writes at INFO: "
                    "valid: info or debug (the journal's size follows pdkit_node's journal settings)", "warning"))
    interval = (values.get("decode_log_interval") or ("40",))[0]
    if interval.isdigit() and int(interval) > MAX_DECODE_LOG_INTERVAL:
        field = f"{at}.tuning.decode_log_interval" if tuning.decode_log_interval is not None else f"{at}.extra_args"
        add(Problem(host.name, field,
                    f"--decode-log-interval {interval}: a 'Decode batch' line every {interval} decode steps is too "
                    f"seldom for {LOG_READERS.split(' and ')[0]}: valid: at most {MAX_DECODE_LOG_INTERVAL} "
                    "(SGLang's default 40)", "warning"))


def _levers_missing(version: str, parser: Parser, tuning) -> dict[str, str]:
    """{tuning field: its flag} for every lever set on TUNING whose flag VERSION's parser lacks."""
    return {name: flag for name, flag in flags.LEVER_FLAGS.items()
            if getattr(tuning, name) is not None and flag not in parser.by_flag}


def _check_router(spec: ClusterSpec, host: HostSpec, add) -> None:
    router = host.router
    assert router is not None
    package, version = spec.router_release(host)
    parser = router_parser(package, version)
    for field, flag in (("policy", "--policy"), ("prefill_policy", "--prefill-policy"),
                        ("decode_policy", "--decode-policy")):
        value = getattr(router, field)
        choices = parser.choices(flag)
        if value is not None and choices is not None and value not in choices:
            add(Problem(host.name, f"pdkit_router.{field}",
                        f"{package} {version} has no {flag.removeprefix('--')} {value!r}; valid: {', '.join(choices)}"))
    argv = flags.router_args(spec, host)
    generated = argv[: len(argv) - len(router.extra_args)]
    gen_parsed, _ = parser.parse(generated)
    _check_extra_args(parser, host.name, "pdkit_router.extra_args", gen_parsed, router.extra_args, add, "the router")


def _check_extra_args(parser: Parser, host: str, field: str, generated: list[Parsed], extra: tuple[str, ...], add,
                      owner: str) -> list[Parsed]:
    """extra_args may add flags, never restate one pdkit generates, and never carry a credential."""
    parsed, argv_problems = parser.parse(extra)
    for problem in argv_problems:
        add(Problem(host, f"{field}[{problem.index}]", problem.message))
    generated_by_dest = {p.option.dest: p.option.name for p in generated}
    seen: dict[str, int] = {}
    kept: list[Parsed] = []
    for p in parsed:
        at = f"{field}[{p.index}]"
        option = p.option
        if option.secret:
            key_field = ("pdkit_cluster.secrets.router_api_key" if owner == "the router" and option.dest == "api_key"
                         else "pdkit_cluster.secrets")
            add(Problem(host, at, f"{option.name} is a credential: {SECRETS_POINTER}); use {key_field}"))
            continue
        dests = {option.dest}
        if option.replaced_by:
            replacement, _ = parser.resolve(option.replaced_by)
            if replacement is not None:
                dests.add(replacement.dest)
        clash = sorted(generated_by_dest[d] for d in dests if d in generated_by_dest)
        if clash:
            spelled = p.written.split("=", 1)[0]
            alias = "" if spelled == clash[0] else f" (argparse reads {spelled} as {clash[0]})"
            instead = _FIELD_OF_FLAG.get(clash[0])
            hint = f"set {instead} instead" if instead else "set the matching spec field instead"
            add(Problem(host, at, f"{spelled} clashes with {clash[0]}, which pdkit generates from the spec{alias}; "
                        f"{hint}"))
            continue
        if option.dest in seen:
            add(Problem(host, at, f"{option.name} is already given at {field}[{seen[option.dest]}]; argparse keeps "
                        "only the last one: give it once"))
            continue
        seen[option.dest] = p.index
        kept.append(p)
    return kept


def _check_pairs(spec: ClusterSpec, engine_args: dict[tuple[str, str], dict[str, tuple[str, ...]]], add,
                 configs: ModelConfigs | None = None, pages_only: bool = False) -> None:
    reported: set[tuple[str, str]] = set()  # an engine in a router's set and a pd_group: one problem per field
    for label, members in pairing_sets(spec):
        if not {e.role for _, e in members} >= {"prefill", "decode"}:
            continue  # spec.cross_checks reports a set without both roles
        first_host, first = members[0]
        reference = _pair_facts(spec, first, engine_args[(first_host.name, first.name)])
        for host, engine in members[1:]:
            facts = _pair_facts(spec, engine, engine_args[(host.name, engine.name)])
            for key, (field, value) in facts.items():
                want = reference.get(key, (field, None))[1]
                at = (host.name, f"{engine_path(host, engine)}.{field}")
                if pages_only and key != "page_size":
                    continue
                if key == "page_size":
                    _check_pair_pages(spec, label, (first_host, first), (host, engine), engine_args, reported, add,
                                      configs or {})
                    continue
                if value != want and at not in reported:
                    reported.add(at)
                    shown = "unset" if value is None else repr(value)
                    add(Problem(host.name, f"{engine_path(host, engine)}.{field}",
                                f"{label} mixes {key} {shown} with {want if want is None else repr(want)} on "
                                f"{first_host.name}/{first.name}; every prefill/decode pair the router can make must "
                                "match (the KV transfer fails or output is corrupted)"))


def _check_pair_pages(spec: ClusterSpec, label: str, first: tuple[HostSpec, Engine], other: tuple[HostSpec, Engine],
                      engine_args: dict[tuple[str, str], dict[str, tuple[str, ...]]], reported: set, add,
                      configs: ModelConfigs | None = None) -> None:
    """The page sizes the two engines really run with must agree (pdkit.spec.pagesize.run_page: the page the
    checkpoint forces where its config.json is known, then the backends' snaps, fa4's on SM100 included, on
    each engine's own GPU generation): one error naming both engines where both are certain, a warning where
    one depends on what pdkit was not told (SGLang's default page for the backend it picks, an undeclared GPU
    generation, an unread config.json). A pair that differs on paper but runs the same page is valid."""
    (h1, e1), (h2, e2) = first, other
    r1 = engine_run_page(spec, h1, e1, engine_args[(h1.name, e1.name)], configs or {})
    r2 = engine_run_page(spec, h2, e2, engine_args[(h2.name, e2.name)], configs or {})
    field = f"{engine_path(h2, e2)}.tuning.page_size"
    if r1.page == r2.page or (h2.name, field) in reported:
        return
    reported.add((h2.name, field))
    known = (configs or {}).get(spec.engine_model(e2).path)
    read = f" (the model's config.json: {known[1]})" if known else ""
    says = (f"{label}: {h2.name}/{e2.name} runs KV page size {r2.page if r2.page is not None else 'unset'} "
            f"({r2.why}), {h1.name}/{e1.name} {r1.page if r1.page is not None else 'unset'} ({r1.why}){read}")
    decided = ("snaps", "sets it", "override", "takes")
    if r1.page is None or r2.page is None:
        if any(w in r1.why + r2.why for w in decided):
            add(Problem(h2.name, field, f"{says}: SGLang's default page for the other engine's backend may differ, "
                        "and a pair whose pages differ fails its KV transfer: set page_size to the snapped value on "
                        "both", "warning"))
            return
    elif not (r1.sure and r2.sure):
        add(Problem(h2.name, field, f"{says}: the pages may differ, and a pair whose pages differ fails its KV "
                    "transfer: declare the nodes' compute_capability (and keep the model directory where validate "
                    "reads it) to have it judged, or set the page each engine really runs on both", "warning"))
        return
    add(Problem(h2.name, field, f"{says}; every prefill/decode pair the router can make must match (the KV transfer "
                "fails or output is corrupted): set the same page_size on both (a snapped one: that value)"))


def _pair_facts(spec: ClusterSpec, engine: Engine, args: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, object]]:
    """What must agree across a PD pair: key -> (the field that sets it, its value)."""
    facts: dict[str, tuple[str, object]] = {
        "model": ("model", spec.engine_model(engine).path),
        "sglang_version": ("sglang_version", spec.engine_version(engine)),
    }
    for dest, field in _PAIR_DESTS.items():
        facts[dest] = (field, " ".join(args[dest]) if dest in args else None)
    for option in sglang_parser(spec.engine_version(engine)).both_roles:
        facts[option.name] = ("extra_args", " ".join(args[option.dest]) if option.dest in args else None)
    return facts
