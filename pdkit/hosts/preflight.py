"""Preflight checks: what a GPU node really is (facts from roles/node_facts.py) against its spec.

`check_host(spec, host, facts)` returns every finding at once; `format_report` turns them into
the one per-host report that roles/preflight.py prints before anything on the host changes.
Errors stop a real apply; warnings and notes are reported and the run goes on. Pure functions:
tests/node/test_preflight_checks.py feeds them real captured facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdkit.agent import topology
from pdkit.render import flags
from pdkit.render.node import UnsupportedNode, node_stack
from pdkit.render.plan import engines_not_started_reason
from pdkit.spec import (
    ClusterSpec,
    Engine,
    HostSpec,
    collapse_findings,
    declared_topology,
    engine_model_paths,
    engine_numa_node,
    modelconfig,
    pd_pairs_on_node,
)
from pdkit.upstream.versions import NIXL_IMPORT, NVIDIA_DRIVER_BRANCH, NVIDIA_DRIVER_MIN_VERSION

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    """One preflight result: which check, how bad, and what to do about it."""

    check: str
    severity: Severity
    message: str


# NCCL_P2P_LEVEL values, nearest first. nvidia-smi's NODE (two host bridges of one socket) is a
# path through the CPU inside a NUMA node: NCCL calls that PHB.
NCCL_LEVELS = ("PIX", "PXB", "PHB", "SYS")
_SMI_TO_NCCL = {"PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
# NCCL's own default without NCCL_P2P_LEVEL: P2P only through PCIe switches
NCCL_DEFAULT_P2P_LEVEL = "PXB"
# compute capability majors that need the open kernel modules (Blackwell)
BLACKWELL_SM_MAJORS = (10, 12)


def version_tuple(version: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); anything unparsable sorts lowest."""
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return (0,)


def nccl_level_for_link(link: str) -> str | None:
    """The NCCL_P2P_LEVEL a `nvidia-smi topo -m` link needs; None for NVLink (NV#) or unknown."""
    return _SMI_TO_NCCL.get(link.strip())


def normal_bus_id(bus_id: str) -> str:
    """nvidia-smi's '00000000:18:00.0' -> sysfs' '0000:18:00.0'."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}"


def gpu_numa_nodes(facts: dict) -> dict[int, int]:
    """GPU index -> sysfs NUMA node. nvidia-smi's index order when the driver is up, else PCI order
    (the order nvidia-smi enumerates in). -1 (no NUMA information, e.g. in a VM) stays -1."""
    pci = {d["bus_id"]: d["numa_node"] for d in facts.get("pci_gpus") or []}
    smi = (facts.get("gpus") or {}).get("gpus") or []
    if smi:
        return {g["index"]: pci.get(normal_bus_id(g["pci_bus_id"]), -1) for g in smi}
    return {i: numa for i, (_, numa) in enumerate(sorted(pci.items()))}


def suggest_profile(links: list[str], hazards: list[str] | tuple[str, ...] = ()) -> tuple[str, str | None]:
    """(nccl_profile, nccl_p2p_level) that fits the links between an engine's GPUs. HAZARDS
    (p2p_hazards: what on the node hangs NCCL P2P there) make it 'pcie-p2p-off' until they are fixed."""
    if hazards:
        return "pcie-p2p-off", None
    if links and all(link.startswith("NV") for link in links):
        return "nvlink", None
    levels = [nccl_level_for_link(link) for link in links if not link.startswith("NV")]
    known = [lv for lv in levels if lv is not None]
    need = max(known, key=NCCL_LEVELS.index) if known else "SYS"
    return "pcie", need


def check_host(spec: ClusterSpec, host: HostSpec, facts: dict) -> list[Finding]:
    """Every finding for one host, errors first within each check's order."""
    node = host.node
    found: list[Finding] = []
    add = lambda check, severity, message: found.append(Finding(check, severity, message))  # noqa: E731
    os_release = facts.get("os") or {}
    if node is None:
        return found
    _check_engine_env(spec, host, facts, add)
    if node.gpu == "none":
        add("gpu", "note", "GPU checks skipped: the node declares gpu: none (a virtual GPU layout, e.g. the lab)")
        not_started = engines_not_started_reason(spec, host)
        if not_started:
            add("engines", "note", not_started)
        _check_reboot_marker(facts, add)
        return found  # the engine-env errors, if any, came first

    if node.nvidia_stack == "install":
        # which NVIDIA repository and driver modules fit the OS: only a node whose stack pdkit installs
        try:
            node_stack(os_id=os_release.get("id", ""), version_id=os_release.get("version_id", ""),
                       machine=facts.get("arch") or "", kernel=facts.get("kernel") or "", modules=node.driver_modules)
        except UnsupportedNode as exc:
            add("os", "error", f"{exc} (pdkit_node.driver_modules: {node.driver_modules})")

    layout = node.gpus
    pci = facts.get("pci_gpus") or []
    if len(pci) != layout.count:
        add("gpu-count", "error", f"the spec declares {layout.count} x {layout.model!r} (pdkit_node.gpus.count) but "
            f"the PCI bus shows {len(pci)} NVIDIA GPU(s)")

    smi = facts.get("gpus") or {}
    driver = facts.get("driver")
    module = facts.get("module") or {}
    blackwell = layout.sm_major in BLACKWELL_SM_MAJORS
    if not smi.get("available"):
        add("driver", "warning", "no NVIDIA driver yet (nvidia-smi absent): the nvidia_driver role installs "
            f"R{NVIDIA_DRIVER_BRANCH} open; model, compute capability and topology are checked after the reboot that "
            "follows (re-run the preflight)")
    elif smi.get("error"):
        hint = " (on Blackwell this is what the closed kernel module says: install the open one)" if blackwell else ""
        add("driver", "error", f"nvidia-smi fails: {smi['error']}{hint}")
    else:
        gpus = smi.get("gpus") or []
        if len(gpus) != layout.count and len(gpus) != len(pci):  # else the PCI finding already says it
            add("gpu-count", "error", f"the spec declares {layout.count} GPUs (pdkit_node.gpus.count) but nvidia-smi "
                f"lists {len(gpus)}")
        names = sorted({g["name"] for g in gpus})
        if names and names != [layout.model]:
            add("gpu-model", "error", f"the spec declares {layout.model!r} (pdkit_node.gpus.model) but nvidia-smi "
                f"reports {', '.join(repr(n) for n in names)}")
        caps = sorted({g["compute_cap"] for g in gpus})
        if caps and caps != [layout.compute_capability]:
            add("gpu-model", "error", f"the spec declares compute capability {layout.compute_capability} "
                f"(pdkit_node.gpus.compute_capability) but the GPUs report {', '.join(caps)}")
        for g in gpus:
            real_gib = g["memory_mib"] / 1024
            if abs(real_gib - layout.memory_gib) > 0.03 * layout.memory_gib:
                add("gpu-memory", "warning", f"GPU {g['index']} has {real_gib:.1f} GiB; the spec says "
                    f"{layout.memory_gib} GiB (pdkit_node.gpus.memory_gib), which picks SGLang's memory-class defaults")
                break
        if driver is None:
            add("driver", "error", "nvidia-smi lists GPUs but reports no driver version")
        else:
            _check_driver_version(driver, module, blackwell, add)
        _check_topology(spec, host, facts, add)

    _check_pcie(spec, host, facts, add)
    _check_model_dirs(spec, host, facts, add)
    _check_numa(host, facts, add)
    _check_nics(spec, host, facts, add)
    _check_reboot_marker(facts, add)
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(found, key=lambda f: order[f.severity])


def engine_env_wants(spec: ClusterSpec, host: HostSpec) -> tuple[list[str], bool]:
    """What HOST's own engine environment must provide: the SGLang releases its engine processes
    are rendered for (the cluster's, or an engine's own sglang_version; validation allows one per
    node), and whether they need NIXL (prefill/decode engines with transfer_backend nixl)."""
    placements = spec.placements(host)
    versions = sorted({spec.engine_version(p.engine) for p in placements})
    nixl = spec.cluster.transfer_backend == "nixl" and any(p.engine.role != "unified" for p in placements)
    return versions, nixl


def same_release(found: str, want: str) -> bool:
    """SGLang FOUND is the release WANT: equal, or equal but for a local build label
    ('0.5.23+cu130' is 0.5.23 rebuilt; '0.5.23.post1' or '0.5.23rc0' is another release)."""
    return found == want or found.split("+", 1)[0] == want


def engine_env_problems(host_name: str, venv: str, probe: dict | None, versions: list[str], nixl: bool) -> list[str]:
    """Pure: PROBE (roles.node_facts.EngineEnv's output for pdkit_node.engine_venv VENV) -> every
    problem, each naming the host, the field, the path, what was found and what would be valid."""
    want = " or ".join(versions) or "(no engine)"
    valid = (f"valid: a Python environment whose bin/python imports sglang {want}"
             + (f" and NIXL as SGLang imports it (`{NIXL_IMPORT}`: the nixl package beside nixl-cu13)" if nixl else "")
             + ", or no engine_venv (pdkit then installs SGLang from its lock)")
    at = f"{host_name}: pdkit_node.engine_venv {venv}"
    probe = probe or {"error": "the probe did not run"}
    path = probe.get("path") or flags.venv_python(venv)
    if probe.get("exists") is False:
        if probe.get("link"):
            found = f"{path} is a link to {probe['link']}, which does not exist"
        elif probe.get("venv_exists") is False:
            found = f"{path} does not exist (nor does {venv})"
        else:
            found = f"{path} does not exist"
        return [f"{at}: {found}; {valid}"]
    if probe.get("executable") is False:
        return [f"{at}: {path} is not executable (mode {probe.get('mode', '?')}); {valid}"]
    if probe.get("error"):
        return [f"{at}: {path} did not run: {probe['error']}; {valid}"]
    problems = []
    if probe.get("sglang_error"):
        installed = (f" (the sglang {probe['sglang_dist']} distribution is installed but does not import)"
                     if probe.get("sglang_dist") else "")
        problems.append(f"{at}: `import sglang` failed: {probe['sglang_error']}{installed}; {valid}")
    else:
        version = probe.get("sglang") or probe.get("sglang_dist")
        if not version:
            problems.append(f"{at}: sglang imports but reports no version (sglang.__version__, no distribution "
                            f"metadata); {valid}")
        elif not any(same_release(version, v) for v in versions):
            problems.append(f"{at}: sglang {version}, the spec wants {want} (pdkit_cluster.sglang_version, or the "
                            f"engines' own sglang_version); {valid}")
    if nixl and not probe.get("nixl"):
        why = probe.get("nixl_error") or "not checked"
        problems.append(f"{at}: `{NIXL_IMPORT}` failed: {why} (its prefill/decode engines transfer KV over NIXL, "
                        f"pdkit_cluster.transfer_backend nixl); {valid}")
    return problems


def _check_engine_env(spec: ClusterSpec, host: HostSpec, facts: dict, add) -> None:
    node = host.node
    assert node is not None
    if not node.engine_venv:
        return
    versions, nixl = engine_env_wants(spec, host)
    for problem in engine_env_problems(host.name, node.engine_venv, facts.get("engine_env"), versions, nixl):
        add("engine-env", "error", problem)


@dataclass(frozen=True)
class ModelDir:
    """One model location an engine process on a node reads, as the preflight checks it."""

    engine: str
    what: str  # model | tokenizer | draft model
    field: str  # where the inventory sets it
    path: str
    need_config: bool  # a model or draft: SGLang reads its architecture from config.json
    need_weights: bool  # ... and its weights, unless load_format dummy


def model_dirs_wanted(spec: ClusterSpec, host: HostSpec) -> tuple[list[ModelDir], list[str]]:
    """The model directories HOST's engine processes read (every rank it runs), and a note for
    each location not checked here and why: hub ids, the sim (it never reads the model), engines
    that are not started on this host."""
    notes: list[str] = []
    if spec.cluster.engine != "sglang":
        return [], []  # the sim never reads the model directory
    if engines_not_started_reason(spec, host):
        return [], []  # real SGLang on a gpu: none host: laid down, never started
    wanted: list[ModelDir] = []
    for p in spec.placements(host):
        dummy = spec.engine_model(p.engine).load_format == "dummy"
        for what, field, location in engine_model_paths(spec, p.head, p.engine):
            if not location.startswith("/"):
                notes.append(f"engine {p.engine.name!r} {what} {location}: a Hugging Face hub id, not a directory on "
                             "the node: not checked "
                             "(the engine downloads it at start; a gated model needs pdkit_cluster.secrets.hf_token)")
                continue
            config = what != "tokenizer"
            wanted.append(ModelDir(p.engine.name, what, field, location.rstrip("/") or "/", config,
                                   config and not dummy))
        # --model-checksum's manifest (pdkit_cluster.model.verify_checksum): a file the same probe finds or not
        source = spec.engine_model(p.engine).checksum_source
        if source is not None:
            head = p.head.node
            assert head is not None  # a placement's head is the GPU host that declares the engine
            where = f"pdkit_node.engines[{head.engines.index(p.engine)}].model" if p.engine.model is not None \
                else "pdkit_cluster.model"
            declared = spec.engine_model(p.engine).checksum_manifest is not None
            field = f"{where}.checksum_manifest" if declared else f"{where}.verify_checksum"
            wanted.append(ModelDir(p.engine.name, CHECKSUM_MANIFEST, field, source, False, False))
    return wanted, list(dict.fromkeys(notes))


# ModelDir.what of --model-checksum's manifest: a file, judged by checksum_manifest_problems
CHECKSUM_MANIFEST = "checksum manifest"


def checksum_manifest_problems(at: str, host_name: str, wanted: ModelDir, probe: dict) -> list[str]:
    """The manifest --model-checksum reads, as the model-dirs probe found its path: a file, or the engine fails at
    start (SGLang 0.5.17/0.5.23 model_file_verifier takes a path that is no file for a hub id and asks the hub)."""
    staged = wanted.field.endswith(".verify_checksum")  # no checksum_manifest: the one `pdkit stage` keeps
    if probe.get("exists") is False:
        fix = ("stage the model with `pdkit stage INVENTORY --source DIR` (it keeps the manifest there), or give "
               "checksum_manifest (the manifest's path on the node)" if staged else
               "copy the manifest there, or correct checksum_manifest")
        return [f"{at}: does not exist on {host_name}, so pdkit knows no manifest for this model: {fix}, or set "
                "verify_checksum: false"]
    if probe.get("is_dir") is not False:
        return [f"{at}: is a directory; valid: the manifest file, SGLang's format "
                '({"files": {NAME: {"sha256": HEX, "size": BYTES}}}, what `pdkit stage --write-manifest` writes)']
    return []


def model_dirs_fact_args(spec: ClusterSpec, host: HostSpec) -> tuple[str, tuple[str, ...]] | None:
    """NodeFacts' model_dirs argument for HOST: (service user, directories), or None for none."""
    wanted, _ = model_dirs_wanted(spec, host)
    paths = tuple(dict.fromkeys(d.path for d in wanted))
    return (spec.cluster.service_user, paths) if paths else None


def model_dir_problems(host_name: str, user: str, wanted: ModelDir, probe: dict | None) -> list[str]:
    """Pure: PROBE (roles.node_facts.ModelDirs' output for WANTED.path) -> every problem, each
    naming the host, the engine, the path, what was found and what would be valid."""
    at = f"{host_name}: engine {wanted.engine!r} {wanted.what} {wanted.path} ({wanted.field})"
    if probe is None:
        return [f"{at}: not probed (the preflight's model check did not run for it)"]
    if probe.get("error"):
        return [f"{at}: could not be checked: {probe['error']}"]
    if wanted.what == CHECKSUM_MANIFEST:
        return checksum_manifest_problems(at, host_name, wanted, probe)
    if probe.get("exists") is False:
        return [f"{at}: does not exist on {host_name} (the nearest existing directory is "
                f"{probe.get('existing_parent', '?')}): "
                f"put the model there (e.g. `huggingface-cli download ORG/NAME --local-dir {wanted.path}`), or set "
                f"{wanted.field} to where it is"]
    if probe.get("is_dir") is False:
        return [f"{at}: is not a directory; valid: the model's directory (config.json, tokenizer files, weights)"]
    problems = []
    if wanted.need_config and not probe.get("config"):
        problems.append(f"{at}: has no config.json (SGLang reads the architecture from it): give the directory of a "
                        "Hugging Face checkpoint, the one that holds config.json")
    if wanted.need_weights:
        if not probe.get("indexes") and not probe.get("weights") and not probe.get("safetensors"):
            problems.append(f"{at}: has no weights (no *.safetensors.index.json, model.safetensors, "
                            "pytorch_model.bin(.index.json) or *.safetensors): "
                            "finish the download, or set load_format: dummy for a rehearsal with random weights")
        if probe.get("index_error"):
            problems.append(f"{at}: its weight index {probe['indexes'][0]} does not read: {probe['index_error']}: "
                            "download it again")
        if probe.get("missing_count"):
            shown = ", ".join(probe.get("missing_shards") or [])
            more = (f" and {probe['missing_count'] - len(probe.get('missing_shards') or [])} more"
                    if probe["missing_count"] > len(probe.get("missing_shards") or []) else "")
            problems.append(f"{at}: {probe['indexes'][0]} names {probe['missing_count']} weight file(s) the directory "
                            f"lacks ({shown}{more}): finish the download")
    unreadable = probe.get("unreadable") or []
    if unreadable:
        how = probe.get("_how", "mode bits")
        who = (f"{user} (checked with runuser)" if how == "runuser" else
               f"{user} (checked by the mode bits along the path)" if probe.get("_user_exists") else
               f"{user}, who does not exist yet (the deploy creates it; checked as a user outside the files' owner and "
               "group)")
        problems.append(f"{at}: the engines run as {who} and cannot read {', '.join(unreadable)}: "
                        f"e.g. `chmod -R o+rX {wanted.path}` (and o+x on every directory above it), or group-readable "
                        f"with {user} in the group")
    return problems


def _check_model_dirs(spec: ClusterSpec, host: HostSpec, facts: dict, add) -> None:
    wanted, notes = model_dirs_wanted(spec, host)
    for note in notes:
        add("model", "note", note)
    if not wanted:
        return
    fact = facts.get("model_dirs")
    if fact is None:
        add("model", "warning", "the engines' model directories were not probed "
            f"({', '.join(sorted({d.path for d in wanted}))})")
        return
    if fact.get("error"):
        for d in wanted:
            add("model", "error", f"{host.name}: engine {d.engine!r} {d.what} {d.path}: could not be checked: "
                f"{fact['error']}")
        return
    user = fact.get("user") or spec.cluster.service_user
    context = {"_how": fact.get("how"), "_user_exists": fact.get("user_exists")}
    for d in wanted:
        probe = (fact.get("paths") or {}).get(d.path)
        for problem in model_dir_problems(host.name, user, d, None if probe is None else {**probe, **context}):
            add("model", "error", problem)
    _check_model_configs(spec, host, wanted, fact.get("paths") or {}, add)


def _check_model_configs(spec: ClusterSpec, host: HostSpec, wanted: list[ModelDir], probes: dict, add) -> None:
    """The model's config.json as the node holds it, against the engines' settings (pdkit/spec/modelconfig.py; validate
    runs the same rule when the directory is on the deploying machine)."""
    for p in spec.placements(host):
        model = next((d for d in wanted if d.engine == p.engine.name and d.what == "model"), None)
        config = (probes.get(model.path) or {}).get("config_keys") if model is not None else None
        if model is None or not config:
            continue
        tuning = spec.engine_tuning(p.engine)
        why = modelconfig.context_problem(tuning.context_length, bool(tuning.value("allow_longer_context")), config,
                                          f"{model.path}/config.json, read by the preflight on {host.name}")
        if why:
            add("model", "error", f"{host.name}: engine {p.engine.name!r} context_length {why}")
        # what the model's architecture makes SGLang force or refuse (validate runs the same on a local config.json)
        for severity, _field, message in modelconfig.architecture_problems(
                modelconfig.engine_facts(spec, host, p.engine), config,
                f"{model.path}/config.json, read by the preflight on {host.name}"):
            add("model", severity, f"{host.name}: engine {p.engine.name!r} {message}")
    # a PD pair's page as SGLang runs it on this checkpoint (pdkit.render.argvcheck, as validate judges a local
    # config.json)
    from pdkit.render import argvcheck  # lazy: the parser table is read only where a config was probed
    configs: argvcheck.ModelConfigs = {}
    for d in wanted:
        keys = (probes.get(d.path) or {}).get("config_keys")
        if d.what == "model" and keys:
            configs[d.path] = (keys, f"{d.path}/config.json, read by the preflight on {host.name}")
    for problem in argvcheck.pair_page_problems(spec, configs, host.name) if configs else ():
        add("model", problem.severity, f"{problem.field}: {problem.message}")


def _check_driver_version(driver: str, module: dict, blackwell: bool, add) -> None:
    if version_tuple(driver) < version_tuple(NVIDIA_DRIVER_MIN_VERSION):
        add("driver", "error", f"driver {driver} is older than {NVIDIA_DRIVER_MIN_VERSION}, the minimum for CUDA 13.0 "
            f"user space (SGLang >= 0.5.11); the nvidia_driver role moves it to R{NVIDIA_DRIVER_BRANCH} (reboot "
            "required)")
    elif driver.split(".")[0] != NVIDIA_DRIVER_BRANCH:
        add("driver", "warning", f"driver {driver} is not on branch {NVIDIA_DRIVER_BRANCH}: the nvidia_driver role "
            f"locks the node to R{NVIDIA_DRIVER_BRANCH} (a driver change needs a drained reboot)")
    if blackwell and not module.get("open"):
        add("driver", "error", "Blackwell needs the open kernel module, but /proc/driver/nvidia/version does not say "
            "'Open Kernel Module': install nvidia-open (driver_modules nvidia-dkms) and reboot")
    if module.get("version") and module["version"] != driver:
        add("driver", "error", f"the loaded kernel module is {module['version']} but the user-space driver is {driver} "
            "(\"Driver/library version mismatch\"): reboot the drained node")


def _check_topology(spec: ClusterSpec, host: HostSpec, facts: dict, add) -> None:
    node = host.node
    assert node is not None
    topo = facts.get("topology") or {}
    if topo.get("error"):
        add("topology", "error", f"nvidia-smi topo -m fails: {topo['error']}")
        return
    links = topo.get("links") or {}
    chosen = flags.nccl_env(spec, host).get("NCCL_P2P_LEVEL")
    for i, engine in enumerate(node.engines):
        if len(engine.gpus) < 2:
            continue
        pairs = [(a, b, (links.get(str(a)) or {}).get(str(b))) for j, a in enumerate(engine.gpus)
                 for b in engine.gpus[j + 1:]]
        missing = [(a, b) for a, b, link in pairs if link is None]
        if missing:
            add("topology", "error", f"engine {engine.name!r}: nvidia-smi topo -m has no link for GPUs "
                f"{missing[0][0]}-{missing[0][1]} (pdkit_node.engines[{i}].gpus)")
            continue
        shown = ", ".join(f"{a}-{b} {link}" for a, b, link in pairs)
        profile, level = suggest_profile([link for _, _, link in pairs if link is not None])  # all known here
        where = f"engine {engine.name!r} (GPUs {shown})"
        if node.nccl_profile == "pcie-p2p-off":
            # the reason follows the facts where the PCIe probe read them (issue 47)
            pcie = pcie_topology(facts)
            hazards = p2p_hazards(pcie, engine.gpus) if pcie is not None else None
            then = f"{profile}{' with NCCL_P2P_LEVEL=' + level if level else ''}"
            if hazards:
                add("nccl", "note", f"{where}: P2P is off by the 'pcie-p2p-off' profile, as this node needs: "
                    f"{'; '.join(hazards)}; {then} would fit once that is fixed")
            elif pcie is not None:  # read, and no hazard found
                add("nccl", "note", f"{where}: P2P is off by the 'pcie-p2p-off' profile, but the facts show no trap "
                    f"on these GPUs' paths (no ACS redirect, IOMMU {pcie.iommu['why']}, HMM {pcie.hmm['state']}): "
                    f"{then} fits and keeps P2P (pdkit_node.nccl_profile: pcie)")
            else:
                add("nccl", "note", f"{where}: P2P is off by the 'pcie-p2p-off' profile (IOMMU/ACS workaround; custom "
                    f"all-reduce off); {then} would fit once ACS is off / iommu=pt")
        elif node.nccl_profile == "nvlink" and profile != "nvlink":
            add("nccl", "error", f"{where}: the 'nvlink' profile but the GPUs talk over PCIe: set "
                f"pdkit_node.nccl_profile: pcie (nccl_p2p_level {level})")
        elif node.nccl_profile == "pcie" and profile == "nvlink":
            add("nccl", "warning", f"{where}: NVLink between the GPUs: the 'nvlink' profile fits better (pcie forbids "
                "LL128 and forces a P2P level)")
        elif node.nccl_profile == "pcie" and chosen and level and NCCL_LEVELS.index(level) > NCCL_LEVELS.index(chosen):
            add("nccl", "error", f"{where}: NCCL_P2P_LEVEL={chosen} does not reach {level}, so NCCL would copy through "
                f"host memory: set pdkit_node.nccl_p2p_level: {level}")
        elif (node.nccl_profile == "default" and level
              and NCCL_LEVELS.index(level) > NCCL_LEVELS.index(NCCL_DEFAULT_P2P_LEVEL)):
            add("nccl", "warning", f"{where}: NCCL's default P2P level ({NCCL_DEFAULT_P2P_LEVEL}) does not reach "
                f"{level}: set pdkit_node.nccl_profile: pcie (nccl_p2p_level {level})")


def pcie_topology(facts: dict) -> topology.Topology | None:
    """The PCIe probe's facts parsed (pdkit.agent.topology), GPU indices as nvidia-smi numbers them; None when
    the preflight did not run the probe."""
    probe = facts.get("pcie")
    if probe is None:
        return None
    return topology.parse_probe(probe, (facts.get("gpus") or {}).get("gpus") or None)


def p2p_hazards(pcie: topology.Topology, gpus: tuple[int, ...]) -> list[str]:
    """What on the node hangs P2P between GPUS (each a sentence): ACS redirect on their paths, HMM on."""
    hazards = []
    for bdf, (kind, bits, on) in topology.acs_redirects(pcie, topology.tp_flows(tuple(gpus))).items():
        hazards.append(f"ACS {bits} on {kind} {bdf} (GPUs {', '.join(map(str, on))})")
    if len(gpus) > 1 and pcie.hmm["state"] == "on":
        hazards.append(f"nvidia_uvm HMM on ({pcie.hmm['why']})")
    return hazards


def _rank_shape(engine: Engine) -> bool:
    return engine.dp == 1 and engine.pp == 1


def _check_pcie(spec: ClusterSpec, host: HostSpec, facts: dict, add) -> None:
    """PCIe paths, ACS, IOMMU, HMM and GPU health (pdkit/agent/topology_probe.py's facts, pdkit.agent.topology's rules;
    issue 47): the collapse pattern warns, the traps that hang and a wedged GPU are errors."""
    node = host.node
    assert node is not None
    pcie = pcie_topology(facts)
    if pcie is None:
        return  # not probed (a fact source without it); nothing to say
    if pcie.error:
        add("pcie", "warning", f"{host.name}: the PCIe topology probe did not run ({pcie.error}): root complexes, ACS, "
            "IOMMU, HMM and GPU health are unchecked")
        return
    if not pcie.gpus:
        add("pcie", "note", f"{host.name}: no NVIDIA GPU on the PCI bus: PCIe placement rules skipped")
        return
    if pcie.unread:
        add("pcie", "note", f"{host.name}: the PCIe probe could not read: {'; '.join(pcie.unread)}")
    declared = declared_topology(node)
    differ = topology.layout_disagreements(declared, pcie) if declared is not None else []
    if differ:
        add("pcie", "warning", f"{host.name}: pdkit_node.gpus.pcie disagrees with the PCIe probe: {'; '.join(differ)}. "
            "validate judged the placement on the declared layout, these checks on the probe's: correct "
            "pdkit_node.gpus.pcie to the probe's (the 'pcie' fact line says where each GPU sits)")
    p2p_on = node.nccl_profile != "pcie-p2p-off"
    places = pcie.gpus
    # the collapse pattern, by the rule validate runs on the declared layout (pdkit.spec.collapse_findings): the KV
    # hand-offs of PD pairs on this node (prefill GPUs write into decode GPUs, P2P over PCIe whatever the NCCL
    # profile: NIXL/UCX cuda_ipc or Mooncake), then the TP groups
    for _, message in collapse_findings(node, pcie):
        add("pcie", "warning", f"{host.name}: {message}")
    for p, d in pd_pairs_on_node(host):
        flows = topology.pd_flows(p.gpus, d.gpus, _rank_shape(p) and _rank_shape(d))
        acs = topology.acs_redirects(pcie, flows)
        for bdf, (kind, bits, on) in acs.items():
            add("pcie", "error", f"{host.name}: ACS {bits} on {kind} {bdf}, on the KV path of prefill {p.name!r} -> "
                f"decode {d.name!r} (GPUs {', '.join(map(str, on))}): peer writes are redirected to the root complex "
                f"and through the IOMMU ({pcie.iommu['why']}), where they fault or hang. Clear ACS redirect on that "
                "bridge (BIOS 'ACS disable', or `setpci -s BDF ECAP_ACS+6.w=0` at boot) and boot with iommu=pt")
    # TP groups: every GPU writes to every other in NCCL's collectives
    for engine in node.engines:
        gpus = tuple(g for g in engine.gpus if g in places)
        if len(gpus) < 2 or not p2p_on:
            continue
        for bdf, (kind, bits, on) in topology.acs_redirects(pcie, topology.tp_flows(gpus)).items():
            add("pcie", "error", f"{host.name}: engine {engine.name!r}: ACS {bits} on {kind} {bdf} between its "
                f"GPUs {', '.join(map(str, on))} with NCCL P2P on (nccl_profile {node.nccl_profile}): NCCL's P2P is "
                f"redirected through the root complex ({pcie.iommu['why']}) and the first all-reduce can hang. Clear "
                "ACS redirect (BIOS 'ACS disable', or setpci at boot) and boot with iommu=pt, or set "
                "pdkit_node.nccl_profile: pcie-p2p-off")
        if pcie.hmm["state"] == "on":
            add("pcie", "error", f"{host.name}: engine {engine.name!r} (GPUs {', '.join(map(str, gpus))}) uses NCCL "
                f"P2P (nccl_profile {node.nccl_profile}) with nvidia_uvm HMM on ({pcie.hmm['why']}): NCCL P2P locks "
                "up. Add `options nvidia_uvm uvm_disable_hmm=1` to /etc/modprobe.d/ and reload nvidia_uvm (or "
                "reboot), or set pdkit_node.nccl_profile: pcie-p2p-off")
        elif pcie.hmm["state"] == "unknown":
            add("pcie", "note", f"{host.name}: engine {engine.name!r} uses NCCL P2P and HMM could not be read "
                f"({pcie.hmm['why']}): `options nvidia_uvm uvm_disable_hmm=1` rules out the HMM lock-up")
    if pcie.iommu.get("enabled") and pcie.iommu.get("passthrough") is False and p2p_on and any(
            len(e.gpus) > 1 for e in node.engines):
        add("pcie", "warning", f"{host.name}: the IOMMU translates the GPUs' DMA ({pcie.iommu['why']}) with P2P on: "
            "NCCL all-reduce hangs are reported this way and P2P loses ~15%; boot with iommu=pt (amd_iommu=on iommu=pt "
            "or intel_iommu=on iommu=pt)")
    # a wedged GPU an engine of this node uses: starting on it fails or hangs
    used = {g for e in node.engines for g in e.gpus}
    for w in topology.wedged_gpus(pcie):
        add("gpu-health", "error" if w.index in used else "warning",
            w.message(host.name) + ("" if w.index in used else " (no engine of this node uses it)")
            + ": drain the node and reset the GPU (`nvidia-smi -r -i INDEX`) or reboot before engines start on it")


def _check_numa(host: HostSpec, facts: dict, add) -> None:
    node = host.node
    assert node is not None
    numa_cpus = facts.get("numa_cpus") or {}
    real = gpu_numa_nodes(facts)
    if not real:
        return
    single = len(numa_cpus) <= 1
    # a machine with one NUMA node (or a VM without NUMA information) reports -1: that is node 0
    resolved = {g: (0 if n == -1 and single else n) for g, n in real.items()}
    declared = node.gpus.numa
    if declared is not None:
        for g, says in enumerate(declared):
            have = resolved.get(g)
            if have is not None and have != -1 and have != says:
                add("numa", "error", f"GPU {g} sits on NUMA node {have} but pdkit_node.gpus.numa[{g}] says {says}")
    for i, engine in enumerate(node.engines):
        want = engine_numa_node(host, engine)
        if want is None:
            continue
        if numa_cpus and want not in numa_cpus:
            add("numa", "error", f"engine {engine.name!r} is bound to NUMA node {want} (pdkit_node.engines[{i}]) but "
                f"the host has NUMA node(s) {sorted(numa_cpus)}")
            continue
        for g in engine.gpus:
            have = resolved.get(g)
            if have == -1:
                add("numa", "warning", f"GPU {g}: sysfs reports no NUMA node (-1) on a host with {len(numa_cpus)} NUMA "
                    f"nodes: engine {engine.name!r}'s binding to node {want} cannot be checked")
            elif have is not None and have != want:
                add("numa", "error", f"engine {engine.name!r} is bound to NUMA node {want} but its GPU {g} sits on "
                    f"NUMA node {have} (pdkit_node.engines[{i}].numa_node / pdkit_node.gpus.numa)")


def _check_nics(spec: ClusterSpec, host: HostSpec, facts: dict, add) -> None:
    node = host.node
    assert node is not None
    nics = facts.get("nics") or {}
    interfaces, rdma = nics.get("interfaces") or [], nics.get("rdma") or []
    if node.nic and interfaces and node.nic not in interfaces:
        add("nic", "error", f"pdkit_node.nic {node.nic!r} (NCCL_SOCKET_IFNAME) is not an interface here; valid: "
            f"{', '.join(interfaces)}")
    if node.ucx_net_devices:
        for dev in node.ucx_net_devices.split(","):
            name = dev.split(":")[0]
            if name not in rdma and name not in interfaces:
                add("nic", "error", f"pdkit_node.ucx_net_devices names {name!r}, which is neither an RDMA device "
                    f"({', '.join(rdma) or 'none'}) nor an interface here")
    if rdma and flags.nccl_env(spec, host).get("NCCL_IB_DISABLE") == "1":
        add("nic", "warning", f"RDMA devices {', '.join(rdma)} exist but the NCCL profile sets NCCL_IB_DISABLE=1 (set "
            "ucx_net_devices to an mlx5 device to keep IB on)")


def _check_reboot_marker(facts: dict, add) -> None:
    reason = facts.get("reboot_required")
    if reason:
        add("reboot", "warning", f"reboot required ({reason}): drain the node (pdkit roll does) and reboot it, or set "
            "pdkit_node.reboot: when-drained")


def facts_summary(facts: dict) -> list[str]:
    """The facts the checks used, one line each, for the report."""
    os_release = facts.get("os") or {}
    lines = [f"os {os_release.get('pretty_name') or os_release.get('id', '?')}, {facts.get('arch') or '?'}, kernel "
             f"{facts.get('kernel') or '?'}"]
    smi = (facts.get("gpus") or {}).get("gpus") or []
    if smi:
        first = smi[0]
        lines.append(f"gpus {len(smi)} x {first['name']} ({first['memory_mib']} MiB, cc {first['compute_cap']})")
    else:
        lines.append(f"gpus {len(facts.get('pci_gpus') or [])} NVIDIA GPU(s) on the PCI bus, no nvidia-smi")
    module = facts.get("module") or {}
    kind = "open" if module.get("open") else ("proprietary" if module.get("loaded") else "no")
    lines.append(f"driver {facts.get('driver') or 'none'} ({kind} kernel module)")
    numa = gpu_numa_nodes(facts)
    if numa:
        lines.append("gpu numa " + ", ".join(f"{g}:{n}" for g, n in sorted(numa.items())))
    cpus = facts.get("numa_cpus") or {}
    if cpus:
        lines.append("numa cpus " + ", ".join(f"node{n} {v['cpulist']} ({v['cpus']})" for n, v in sorted(cpus.items())))
    nics = facts.get("nics") or {}
    lines.append(f"nics {', '.join(nics.get('interfaces') or []) or 'none'}; rdma "
                 f"{', '.join(nics.get('rdma') or []) or 'none'}")
    links = (facts.get("topology") or {}).get("links") or {}
    if links:
        pairs = sorted({(min(int(a), int(b)), max(int(a), int(b)), v) for a, row in links.items()
                        for b, v in row.items()})
        lines.append("topology " + ", ".join(f"{a}-{b} {v}" for a, b, v in pairs))
    pcie = pcie_topology(facts)
    if pcie is not None and pcie.gpus:
        lines.append(f"pcie {pcie_summary(pcie)}")
    env = facts.get("engine_env")
    if env is not None:
        lines.append(f"engine env {env_summary(env)}")
    return lines


def pcie_summary(pcie: topology.Topology) -> str:
    """Where the GPUs sit, the IOMMU and HMM, in one line: 'pci0000:00 switch 0000:01:00.0 GPUs 0-3; ...'."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, g in sorted(pcie.gpus.items()):
        groups.setdefault((g.root_complex, f"switch {g.switch}" if g.switch else "root ports"), []).append(i)
    where = "; ".join(f"{root} {how} GPUs {','.join(map(str, gpus))}" for (root, how), gpus in groups.items())
    iommu = pcie.iommu
    mode = ("off" if iommu.get("enabled") is False else "passthrough" if iommu.get("passthrough")
            else "translating" if iommu.get("enabled") else "unknown")
    return f"{where}; iommu {mode}; hmm {pcie.hmm['state']}"


def env_summary(probe: dict) -> str:
    """The node's own engine environment in one line, for the report."""
    path = probe.get("path", "?")
    if probe.get("exists") is False or probe.get("executable") is False or probe.get("error"):
        return f"{path}: unusable (see the error below)"
    sglang = (probe.get("sglang") or (f"does not import ({probe['sglang_error']})" if probe.get("sglang_error")
                                      else "no version"))
    nixl = "yes" if probe.get("nixl") else "no"
    return f"{path}: python {probe.get('python', '?')}, sglang {sglang}, nixl {nixl}"


def format_report(host_name: str, findings: list[Finding], facts: dict) -> str:
    """The one report per host: facts, then every finding; the verdict on the first line."""
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    verdict = (f"FAILED: {errors} error(s), {warnings} warning(s); nothing on this host was changed" if errors
               else f"passed ({warnings} warning(s))")
    lines = [f"pdkit preflight {host_name}: {verdict}"]
    lines += [f"  fact     {line}" for line in facts_summary(facts)]
    lines += [f"  {f.severity:<8} {f.check}: {f.message}" for f in findings]
    return "\n".join(lines)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
