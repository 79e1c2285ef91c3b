"""The campaign file and every candidate's derived spec, decided before any host is touched.

A campaign (YAML, or a Python file defining CAMPAIGN = {...}) names candidates, each an overlay
of spec fields. An overlay key is `SCOPE.FIELD[.SUBFIELD]`:

- SCOPE `all`, `prefill`, `decode` or `unified`: a tuning field (pdkit_cluster.tuning's fields)
  set on every engine of that role (`all`: every engine) on the target hosts, as the engine's
  own `tuning` (it wins over the cluster's role tuning: ClusterSpec.engine_tuning);
- SCOPE `node`: a pdkit_node field (nccl_profile, ...) of the target hosts, or the node's layout:
  `node.engines` (a whole engines list: PD <-> unified, the prefill/decode GPU split, TP per
  engine, one pair <-> two) or `node.layout: unified` (one unified engine over every GPU the
  node's engines use, TP across them). Layout keys apply first, so `unified.F` in the same
  candidate lands on the new engine.

A list value sweeps: `decode.cuda_graph_max_bs: [32, 64, 96]` is three candidates (several swept
keys: their product). For a field that is itself a list (cuda_graph_bs) a sweep is a list of
lists. Each derived spec goes through pdkit's loader and validator (spec_from_host_data), so an
invalid candidate fails the campaign with the usual host/field message.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import itertools
import json
import pprint
import re
import runpy
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pdkit.bench import engine_flags, flag_changes
from pdkit.bench.agentic import AgenticParams, AgenticWorkload
from pdkit.bench.noise import DEFAULT_MARGIN
from pdkit.clients import answers
from pdkit.inventory.loader import spec_from_host_data
from pdkit.roll import rollout_order
from pdkit.spec import Problem, Tuning
from pdkit.spec.models import (
    AnswerAccuracy,
    AnswerTolerance,
    ByDesign,
    ForcedTokens,
    GateLengths,
    LoadConcurrency,
    MatchRate,
    TopK,
)

ENGINE_SCOPES = ("all", "prefill", "decode", "unified")
NODE_SCOPE = "node"
# pdkit_node fields a candidate may change (addresses and the GPUs themselves are the machine,
# not a lever)
NODE_LEVERS = ("nccl_profile", "ucx_net_devices", "nic", "engines", "layout")
# the node keys that change the engines themselves: applied before any engine-scoped key
LAYOUT_LEVERS = ("engines", "layout")
# the shorthand layouts `node.layout` takes (unified_layout)
LAYOUTS = ("unified",)
NAME = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"
BASELINE = "baseline"


class CampaignError(ValueError):
    """The campaign file is wrong: every problem, each naming the campaign field."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path, self.problems = path, problems
        super().__init__(f"{path}: " + "; ".join(problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgenticLoad(_Strict):
    """The agentic workload (pdkit bench --workload agentic): generated sessions, or a trace file
    in SGLang's agentic-trace format; defaults are the generator's own (pdkit.bench.agentic)."""

    sessions: int = Field(default=AgenticParams.sessions, ge=1)  # fresh sessions per level
    turns: int = Field(default=AgenticParams.turns, ge=1)
    system_tokens: int = Field(default=AgenticParams.system_tokens, ge=0)  # the shared prefix
    turn_tokens: int = Field(default=AgenticParams.turn_tokens, ge=1)  # added per turn
    reply_tokens: int = Field(default=AgenticParams.reply_tokens, ge=1)
    think_s: float = Field(default=AgenticParams.think_s, ge=0, le=3600)
    seed: int = Field(default=AgenticParams.seed, ge=0)
    # a trace file instead of the generator (relative to the campaign file); turns/system/turn tokens
    # then come from it
    trace: str | None = None
    max_turns: int | None = Field(default=None, ge=1)  # a trace's conversations cut to this many turns


class Workload(_Strict):
    input_len: int = Field(default=256, ge=1)
    output_len: int = Field(default=64, ge=1)
    concurrency: tuple[int, ...] = Field(default=(16,), min_length=1)
    requests: int = Field(default=64, ge=1)
    warmup: int = Field(default=4, ge=0)
    # set: the bench replays multi-turn sessions instead of input_len/output_len random prompts
    # (input_len still sizes the soak's prompts)
    agentic: AgenticLoad | None = None

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(c < 1 for c in v):
            raise ValueError("every concurrency level must be at least 1")
        twice = sorted({c for c in v if v.count(c) > 1})
        if twice:
            # sorted(set()) would drop the repeat without a word: a typo (16, 16 for 16, 64) loses a level
            raise ValueError(f"concurrency level(s) {', '.join(map(str, twice))} given twice: each level once")
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _levels_reachable(self) -> Workload:
        """A level the request (or session) count can never fill measures a lower concurrency under its name."""
        top = max(self.concurrency)
        if self.agentic is None and top > self.requests:
            raise ValueError(f"concurrency {top} can never be reached with requests {self.requests} (at most "
                             f"{self.requests} in flight): valid: requests >= {top}, or levels <= {self.requests}")
        if self.agentic is not None and self.agentic.trace is None and top > self.agentic.sessions:
            raise ValueError(f"concurrency {top} can never be reached with agentic.sessions {self.agentic.sessions} "
                             f"(one request in flight per session): valid: sessions >= {top}")
        return self


# The bench figures at the target concurrency that can rank candidates: {metric: higher is better}.
# goodput: requests per second whose TTFT <= ttft_slo_ms and whose own TPOT <= tpot_slo_ms
# (SGLang's definition: pdkit.bench.stats.goodput); the TTFT ones are the client's, lower is better.
OBJECTIVE_METRICS = {"output_tok_s": True, "requests_s": True, "goodput": True, "ttft_p50_ms": False,
                     "ttft_p99_ms": False}
GOODPUT = "goodput"


class Objective(_Strict):
    # the bench figure at the target concurrency that ranks candidates (OBJECTIVE_METRICS)
    metric: Literal["output_tok_s", "requests_s", "goodput", "ttft_p50_ms", "ttft_p99_ms"] = "output_tok_s"
    # a candidate whose TPOT p99 at the target concurrency is above this ranks after every one within it
    tpot_p99_slo_ms: float | None = Field(default=None, gt=0)
    # goodput's SLOs, per request (both needed by metric goodput, and read by nothing else)
    ttft_slo_ms: float | None = Field(default=None, gt=0)
    tpot_slo_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _goodput_slos(self) -> Objective:
        missing = [f for f in ("ttft_slo_ms", "tpot_slo_ms") if getattr(self, f) is None]
        if self.metric == GOODPUT and missing:
            raise ValueError("metric goodput counts the requests within a TTFT and a TPOT SLO: set "
                             f"{' and '.join(missing)} (milliseconds, e.g. ttft_slo_ms: 2000, tpot_slo_ms: 50)")
        given = [f for f in ("ttft_slo_ms", "tpot_slo_ms") if getattr(self, f) is not None]
        if self.metric != GOODPUT and given:
            raise ValueError(f"{' and '.join(given)} are goodput's SLOs and metric {self.metric!r} would ignore them: "
                             "set metric: goodput, or remove them")
        return self

    @property
    def higher_is_better(self) -> bool:
        return OBJECTIVE_METRICS[self.metric]

    @property
    def goodput_slo(self) -> dict[str, float] | None:
        """The SLOs the bench judges goodput by (pdkit.bench.stats.goodput), None for other metrics."""
        if self.metric != GOODPUT:
            return None
        assert self.ttft_slo_ms is not None and self.tpot_slo_ms is not None
        return {"ttft_ms": self.ttft_slo_ms, "tpot_ms": self.tpot_slo_ms}

    def describe(self) -> str:
        """What the metric counts and which way is better, then the TPOT p99 SLO (the metric's name not repeated)."""
        text = f"{'higher' if self.higher_is_better else 'lower'} is better"
        if self.metric == GOODPUT:
            text = f"requests/s whose TTFT <= {self.ttft_slo_ms:g} ms and TPOT <= {self.tpot_slo_ms:g} ms, " + text
        return f"({text})" + (f", TPOT p99 <= {self.tpot_p99_slo_ms:g} ms" if self.tpot_p99_slo_ms else "")


_GATE = answers.GateConfig()


class Correctness(_Strict):
    """The graded answer gate (pdkit/clients/answers.py, docs/correctness.md): (a) short prompts token for
    token, (b) teacher-forced scores at the users' lengths, (c) the same under load."""

    prompts: int = Field(default=16, ge=1, le=1024)
    max_new_tokens: int = Field(default=32, ge=1)
    # share of the baseline's tokens a candidate reproduces before its first divergence, over all prompts
    min_match_rate: MatchRate = 0.9
    # every prompt must match the baseline token for token
    exact: bool = False
    concurrency: int = Field(default=4, ge=1)
    # (b) prompt lengths in tokens, each kept where the context cap allows; [] turns (b) and (c) off
    lengths: GateLengths = list(_GATE.lengths)
    # tokens of the baseline's greedy continuation scored at each length
    forced_tokens: ForcedTokens = _GATE.forced_tokens
    # top-k returned per position for the top-1 agreement and the KL estimate
    top_k: TopK = _GATE.top_k
    # (c) concurrent streams while the forced scoring is repeated; 0 turns (c) off
    load_concurrency: LoadConcurrency = _GATE.load_concurrency
    # a text file of the user's own (their code, their documents) instead of the kit's corpus
    corpus: str | None = None
    # the inventory's own model (pdkit_cluster.answers.tolerance): one set of fields and defaults
    tolerance: AnswerTolerance = AnswerTolerance()
    # (d) an accuracy eval through sgl-eval, off by default: the inventory's model (pdkit_cluster.answers.accuracy)
    accuracy: AnswerAccuracy = AnswerAccuracy()

    def gate_config(self) -> answers.GateConfig:
        return answers.GateConfig(
            short_prompts=self.prompts, short_tokens=self.max_new_tokens, short_concurrency=self.concurrency,
            min_match_rate=self.min_match_rate, lengths=tuple(self.lengths), forced_tokens=self.forced_tokens,
            top_k=self.top_k, load_concurrency=self.load_concurrency, corpus=self.corpus,
            tolerance=self.tolerance.tolerance(), accuracy=self.accuracy.accuracy())


class Soak(_Strict):
    seconds: float = Field(default=10, ge=0)
    # default: the target concurrency
    concurrency: int | None = Field(default=None, ge=1)
    max_new_tokens: int = Field(default=32, ge=1)
    # requests running and no token produced for this long: wedged
    wedge_window_s: float = Field(default=3, gt=0)


class Doctor(_Strict):
    window_s: float = Field(default=3, gt=0)
    probe_requests: int = Field(default=4, ge=0)


class Noise(_Strict):
    """How the campaign tells a lever from the run-to-run spread (pdkit.bench.noise)."""

    # bench runs of the baseline before any candidate, back to back; each figure's spread across
    # them is the band a candidate's gain must clear (one run has no spread, so at least two)
    baseline_repeats: int = Field(default=3, ge=2, le=10)
    # after the last candidate, roll the baseline back onto the targets and bench it once more, so
    # drift over the campaign widens the band (one more restart: an outage on a one-node box)
    remeasure_at_end: bool = False
    # what a gain must clear beyond the band, as a fraction of the baseline's median figure
    margin: float = Field(default=DEFAULT_MARGIN, ge=0, le=1)


class CandidateSpec(_Strict):
    name: str = Field(pattern=NAME)
    set: dict[str, Any] = Field(min_length=1)
    exact: bool | None = None
    min_match_rate: float | None = Field(default=None, ge=0, le=1)
    note: str = ""


class Campaign(_Strict):
    name: str = Field(pattern=NAME)
    inventory: str | None = None
    target: Literal["canary", "all"] | tuple[str, ...] = "canary"
    workload: Workload = Workload()
    target_concurrency: int | None = Field(default=None, ge=1)
    objective: Objective = Objective()
    correctness: Correctness = Correctness()
    soak: Soak = Soak()
    doctor: Doctor = Doctor()
    noise: Noise = Noise()
    # best: the top-ranked candidate whose gain clears the baseline's band + margin (else the
    # baseline); baseline; or a candidate's name
    keep: str = "best"
    # true: a candidate may take a router's last workers of a kind out while it rolls (a one-node
    # cluster: `pdkit roll --allow-downtime`); without it such a campaign is refused before any change
    downtime: bool = False
    out_dir: str = "docs/tune"
    state_dir: str = ".pdkit-tune"
    # settings that change the answers by design which this campaign's candidates may set (pdkit/spec/numerics.py:
    # kv_cache_quantized, speculative_accept_below_1, nccl_ll128_pcie); the gate judges them within its tolerance
    acknowledge: list[ByDesign] = []
    candidates: tuple[CandidateSpec, ...] = Field(min_length=1)


@dataclass(frozen=True)
class Candidate:
    """One expanded candidate: its name, its overlay (no lists left to sweep), its gate settings."""

    name: str
    overlay: dict[str, Any]
    exact: bool
    min_match_rate: float
    origin: str  # the campaign entry it came from (a sweep gives several candidates one origin)
    note: str = ""

    @property
    def overlay_hash(self) -> str:
        return overlay_hash(self.overlay)


def overlay_hash(overlay: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(overlay, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------ reading the file


def read_campaign_file(path: str | Path) -> dict[str, Any]:
    """The raw campaign: YAML (.yaml/.yml) or Python (.py defining CAMPAIGN)."""
    p = Path(path)
    if not p.is_file():
        raise CampaignError(str(path), ["no such campaign file (give a .yaml, .yml or .py file)"])
    if p.suffix == ".py":
        try:
            scope = runpy.run_path(str(p))
        except Exception as exc:  # noqa: BLE001 - the user's file: one line
            raise CampaignError(str(path), [f"the file does not run: {type(exc).__name__}: {exc}"]) from None
        raw = scope.get("CAMPAIGN")
        if not isinstance(raw, dict):
            raise CampaignError(str(path), ["a Python campaign defines CAMPAIGN = {...} (a dict)"])
        return raw
    if p.suffix not in (".yaml", ".yml"):
        raise CampaignError(str(path), [f"unknown campaign format {p.suffix!r}: give .yaml, .yml or .py"])
    # lazy: yaml costs ~12-16 ms more than `pdkit --help` (which imports this module) loads; YAML campaigns only
    import yaml

    try:
        raw = yaml.load(p.read_text(), Loader=_unique_keys_loader(yaml))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise CampaignError(str(path), [f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise CampaignError(str(path), ["the top level must be a mapping (name, candidates, ...)"])
    return raw


def _unique_keys_loader(yaml: Any) -> type:
    """yaml.SafeLoader that refuses a key given twice in one mapping: plain safe_load keeps the last one
    silently, so a second `candidates:` or a lever written twice would drop half of what the user wrote."""

    class UniqueKeys(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"the key {key!r} is given twice (first at line {seen[key].line + 1}): YAML would keep only the "
                    "last one; merge them into one", key_node.start_mark)
            seen[key] = key_node.start_mark
        return loader.construct_mapping(node, deep=deep)

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return UniqueKeys


def parse_campaign(raw: dict[str, Any], path: str = "campaign") -> Campaign:
    try:
        return Campaign.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = "campaign." + ".".join(str(p) if not isinstance(p, int) else f"[{p}]"
                                           for p in err["loc"]).replace(".[", "[")
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            problems.append(f"{where}: {msg}")
        raise CampaignError(path, problems) from None


def load_campaign(path: str | Path) -> Campaign:
    return parse_campaign(read_campaign_file(path), str(path))


# ------------------------------------------------------------------ sweeps


def _is_list_field(key: str) -> bool:
    """True when the overlay key's own field holds a list (a flat list is then one value, not a sweep)."""
    scope, _, rest = key.partition(".")
    name = rest.split(".", 1)[0]
    if scope in ENGINE_SCOPES and name in Tuning.model_fields:
        annotation = Tuning.model_fields[name].annotation
        return "tuple" in str(annotation) or any(typing.get_origin(a) is tuple for a in typing.get_args(annotation))
    return scope == NODE_SCOPE and name == "engines"


def sweep_values(key: str, value: Any) -> list[Any]:
    """The values one overlay key takes: a list sweeps, except a flat list for a list-valued field."""
    if not isinstance(value, list):
        return [value]
    if _is_list_field(key):
        return [list(v) for v in value] if value and all(isinstance(v, list) for v in value) else [value]
    return list(value)


def _value_text(value: Any) -> str:
    if isinstance(value, list):
        return "-".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def agentic_workload(load: AgenticLoad, levels: int, base_dir: Path) -> AgenticWorkload:
    """The campaign's agentic workload, built once for the baseline and every candidate alike."""
    if load.trace is not None:
        path = Path(load.trace) if Path(load.trace).is_absolute() else base_dir / load.trace
        return AgenticWorkload.from_file(str(path), load.sessions, load.reply_tokens, load.think_s, load.max_turns)
    params = AgenticParams(sessions=load.sessions, turns=load.turns, system_tokens=load.system_tokens,
                           turn_tokens=load.turn_tokens, reply_tokens=load.reply_tokens, think_s=load.think_s,
                           seed=load.seed)
    return AgenticWorkload.generated(params, levels)


def _layout_text(key: str, value: Any) -> str:
    """A swept value in a candidate's name; an engines list by its roles and GPU counts (p4-d4, u8)."""
    if key == f"{NODE_SCOPE}.engines" and isinstance(value, list):
        return "-".join(f"{str(e.get('role', '?'))[:1]}{len(e.get('gpus') or ())}" if isinstance(e, dict) else "?"
                        for e in value)
    return _value_text(value)


def expand(campaign: Campaign) -> list[Candidate]:
    """Every candidate in campaign order; a sweep expands in the order its values are listed."""
    out: list[Candidate] = []
    for entry in campaign.candidates:
        keys = list(entry.set)
        choices = [sweep_values(k, entry.set[k]) for k in keys]
        swept = [k for k, c in zip(keys, choices) if len(c) > 1 or isinstance(entry.set[k], list)
                 and not _is_list_field(k)]
        for combo in itertools.product(*choices):
            overlay = dict(zip(keys, combo))
            # one swept key: name-VALUE; several: name-FIELDVALUE-FIELDVALUE
            suffix = "".join(f"-{'' if len(swept) == 1 else k.rsplit('.', 1)[-1]}{_layout_text(k, overlay[k])}"
                             for k in swept)
            name = re.sub(r"[^a-z0-9._-]+", "-", f"{entry.name}{suffix}".lower()).strip("-")
            out.append(Candidate(
                name=name, overlay=overlay,
                exact=campaign.correctness.exact if entry.exact is None else entry.exact,
                min_match_rate=campaign.correctness.min_match_rate if entry.min_match_rate is None
                else entry.min_match_rate,
                origin=entry.name, note=entry.note,
            ))
    return out


def campaign_problems(campaign: Campaign, candidates: list[Candidate]) -> list[str]:
    """What is wrong with the campaign itself (names, keys, keep, levels), before any spec is derived."""
    problems = []
    seen: dict[str, str] = {}
    for c in candidates:
        if c.name == BASELINE:
            problems.append(f"campaign.candidates: {c.origin!r} expands to the name 'baseline', which is the "
                            "campaign's reference: rename it")
        if c.name in seen:
            problems.append(f"campaign.candidates: two candidates are named {c.name!r} (from {seen[c.name]!r} and "
                            f"{c.origin!r}): names must be unique")
        seen.setdefault(c.name, c.origin)
    for entry in campaign.candidates:
        for key in entry.set:
            if not sweep_values(key, entry.set[key]):
                # itertools.product over an empty sweep yields nothing: the candidate would vanish silently
                problems.append(f"campaign.candidates[{entry.name}].set.{key}: an empty sweep ([]) expands "
                                f"{entry.name!r} to no candidate at all: give at least one value")
                continue
            why = key_problem(key) or layout_value_problem(key, entry.set[key])
            if why:
                problems.append(f"campaign.candidates[{entry.name}].set.{key}: {why}")
    names = {c.name for c in candidates} | {c.origin for c in candidates}
    if campaign.keep not in ("best", BASELINE) and campaign.keep not in names:
        problems.append(f"campaign.keep: {campaign.keep!r} is not 'best', 'baseline' or a candidate name "
                        f"({', '.join(c.name for c in candidates)})")
    target_c = campaign.target_concurrency
    if target_c is not None and target_c not in campaign.workload.concurrency:
        problems.append(f"campaign.target_concurrency: {target_c} is not one of campaign.workload.concurrency "
                        f"{list(campaign.workload.concurrency)}: the objective is read at that level")
    return problems


def layout_value_problem(key: str, value: Any) -> str | None:
    """What is wrong with a layout key's value (each swept value), before any spec is derived."""
    if key == f"{NODE_SCOPE}.layout":
        bad = [v for v in sweep_values(key, value) if v not in LAYOUTS]
        if bad:
            return (f"{bad[0]!r} is not a layout; valid: {', '.join(LAYOUTS)} (or set node.engines to a whole "
                    "engines list)")
    if key == f"{NODE_SCOPE}.engines":
        for v in sweep_values(key, value):
            if not isinstance(v, list) or not v or not all(isinstance(e, dict) for e in v):
                return ("a whole engines list, as in pdkit_node.engines (a list of engine mappings; a list of "
                        "such lists sweeps)")
    return None


def key_problem(key: str) -> str | None:
    scope, dot, rest = key.partition(".")
    if not dot or not rest:
        return f"an overlay key is SCOPE.FIELD with SCOPE one of {', '.join((*ENGINE_SCOPES, NODE_SCOPE))}"
    name = rest.split(".", 1)[0]
    if scope in ENGINE_SCOPES:
        if name not in Tuning.model_fields:
            return f"{name!r} is not a tuning field; valid: {', '.join(Tuning.model_fields)}"
        return None
    if scope == NODE_SCOPE:
        if "." in rest or name not in NODE_LEVERS:
            return (f"node levers are {', '.join(NODE_LEVERS)} (addresses and the GPUs themselves are the machine, "
                    "not a lever)")
        return None
    return f"unknown scope {scope!r}; valid: {', '.join((*ENGINE_SCOPES, NODE_SCOPE))}"


# ------------------------------------------------------------------ derived host data


HostData = list[tuple[str, tuple[str, ...], dict[str, Any]]]


def _set_path(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        nxt = target.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            target[part] = nxt
        target = nxt
    target[path[-1]] = copy.deepcopy(value)


@dataclass
class Applied:
    """Derived host data and where each overlay key landed (host, inventory path)."""

    hosts: HostData
    landed: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def unified_layout(engines: list[Any]) -> list[dict[str, Any]]:
    """Pure: one unified engine over every GPU ENGINES use, TP across them, on the first engine's
    port; the engine settings every engine shares (model, version, env entries) are kept, the
    role-specific ones (bootstrap port, PD group, per-engine tuning, GPU shares) are not."""
    dicts = [e for e in engines if isinstance(e, dict)]
    gpus = sorted({g for e in dicts for g in (e.get("gpus") or ()) if isinstance(g, int)})
    unified: dict[str, Any] = {"name": "unified", "role": "unified", "gpus": gpus, "tp": max(1, len(gpus)),
                               "port": dicts[0].get("port") if dicts else None}
    for key in ("model", "sglang_version", "numa_node", "nodes", "extra_args"):
        values = [e.get(key) for e in dicts]
        if values and all(v == values[0] for v in values) and values[0] not in (None, (), []):
            unified[key] = copy.deepcopy(values[0])
    shared_env = {k: v for k, v in (dicts[0].get("env") or {}).items()
                  if all((e.get("env") or {}).get(k) == v for e in dicts)} if dicts else {}
    if shared_env:
        unified["env"] = shared_env
    return [unified]


def _apply_layout(node: dict[str, Any], key: str, value: Any) -> None:
    if key == "engines":
        node["engines"] = copy.deepcopy(value)
    elif value in LAYOUTS:
        node["engines"] = unified_layout(node.get("engines") or [])
    else:
        node["layout"] = value  # the validator names it: pdkit_node has no such field


def apply_overlay(hosts: HostData, overlay: dict[str, Any], targets: list[str]) -> Applied:
    """Pure: the inventory's resolved host data with OVERLAY set on the TARGETS' engines / nodes.
    Layout keys (node.engines, node.layout) go first: engine-scoped keys land on the new engines."""
    out: HostData = []
    landed: dict[str, list[tuple[str, str]]] = {k: [] for k in overlay}
    ordered = sorted(overlay.items(), key=lambda kv: kv[0] not in {f"{NODE_SCOPE}.{n}" for n in LAYOUT_LEVERS})
    for name, groups, data in hosts:
        data = copy.deepcopy(data)
        node = data.get("pdkit_node")
        if name in targets and isinstance(node, dict):
            for key, value in ordered:
                scope, _, rest = key.partition(".")
                path = rest.split(".")
                if scope == NODE_SCOPE:
                    if rest in LAYOUT_LEVERS:
                        _apply_layout(node, rest, value)
                    else:
                        _set_path(node, path, value)
                    landed[key].append((name, f"pdkit_node.{rest}"))
                    continue
                for engine in node.get("engines") or []:
                    if isinstance(engine, dict) and (scope == "all" or engine.get("role") == scope):
                        tuning = engine.setdefault("tuning", {})
                        if not isinstance(tuning, dict):
                            continue  # the validator names it
                        _set_path(tuning, path, value)
                        landed[key].append((name, f"pdkit_node.engines[{engine.get('name')}].tuning.{rest}"))
        out.append((name, groups, data))
    return Applied(out, landed)


def derive(hosts: HostData, candidate: Candidate, targets: list[str], inventory: str,
           acknowledge: Sequence[str] = ()):
    """(derived ClusterSpec or None, problems, Applied) for one candidate: the loader's own checks.
    ACKNOWLEDGE (the campaign's) joins the inventory's pdkit_cluster.answers.acknowledge in the candidate's data."""
    applied = apply_overlay(hosts, candidate.overlay, targets)
    for _, _, data in applied.hosts:
        cluster = data.get("pdkit_cluster")
        if acknowledge and isinstance(cluster, dict):
            gate = cluster.setdefault("answers", {})
            if isinstance(gate, dict):
                gate["acknowledge"] = sorted({*(gate.get("acknowledge") or []), *acknowledge})
    spec, problems = spec_from_host_data(applied.hosts, inventory=inventory)
    for key, where in applied.landed.items():
        if not where:
            problems.append(Problem("<campaign>", f"candidates[{candidate.name}].set.{key}",
                                    f"matches no engine or node on the target hosts ({', '.join(targets)}): it would "
                                    "change nothing"))
    if any(p.severity == "error" for p in problems):
        spec = None
    return spec, problems, applied


def resolve_targets(campaign: Campaign, spec) -> list[str]:
    """Host names the candidates are applied to: the roll's canary, every engine host, or a list."""
    engine_hosts = [h.name for h in spec.gpu_hosts if h.node is not None and h.node.engines]
    if campaign.target == "canary":
        order = rollout_order(spec, limit=engine_hosts)
        return order[:1]
    if campaign.target == "all":
        return engine_hosts
    unknown = [h for h in campaign.target if h not in engine_hosts]
    if unknown:
        raise CampaignError("campaign", [f"campaign.target: {unknown} are not hosts with engines in the inventory "
                                         f"({', '.join(engine_hosts)})"])
    return list(campaign.target)


def render_inventory(applied: HostData, source: str, candidate: str) -> str:
    """A pyinfra inventory file holding the derived, already-resolved host data (groups kept).

    Resolved data already carries what group_data contributed, so the file needs no group_data
    beside it. It holds secrets when the inventory does: the runner writes it mode 0600.
    """
    groups: dict[str, list[str]] = {}
    for name, host_groups, _ in applied:
        for g in host_groups:
            if g != "all" and g.isidentifier() and not g.startswith("_"):
                groups.setdefault(g, []).append(name)
    entries = []
    for name, _, data in applied:
        text = repr(data)
        try:
            same = ast.literal_eval(text) == data
        except (ValueError, SyntaxError):
            same = False
        if not same:
            raise CampaignError(source, [f"{name}: its inventory data holds values that cannot be written as plain "
                                         "Python literals; pdkit tune cannot derive an inventory from it"])
        entries.append((name, data))
    lines = [
        f'"""Derived by `pdkit tune` from {source} for candidate {candidate!r}: do not edit (regenerated each run)."""',
        "",
    ]
    for g, members in sorted(groups.items()):
        lines.append(f"{g} = {members!r}")
    lines.append("all = " + pprint.pformat(entries, width=120, sort_dicts=True))  # noqa: A001
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ diffs


def spec_diff(base, derived) -> dict[str, dict[str, list[Any]]]:
    """Per host/engine (and host/node): {field: [baseline value, candidate value]} of what differs."""
    out: dict[str, dict[str, list[Any]]] = {}
    for (h, e), (h2, e2) in zip(base.engines(), derived.engines()):
        a = base.engine_tuning(e).model_dump(mode="json")
        b = derived.engine_tuning(e2).model_dump(mode="json")
        changed = {k: [a[k], b[k]] for k in a if a[k] != b[k]}
        if changed:
            out[f"{h.name}/{e.name}"] = changed
    for h, h2 in zip(base.hosts, derived.hosts):
        if h.node is None or h2.node is None:
            continue
        a, b = h.node.model_dump(mode="json", exclude={"engines"}), h2.node.model_dump(mode="json", exclude={"engines"})
        changed = {k: [a[k], b[k]] for k in a if a[k] != b[k]}
        if changed:
            out[f"{h.name}/node"] = changed
    return out


def flag_diff(base, derived) -> list[str]:
    """Engine argv differences, in `pdkit compare`'s words (pdkit.bench.flag_changes on the rendered flags)."""
    return flag_changes({"env": {"engine_flags": engine_flags(base)}}, {"env": {"engine_flags": engine_flags(derived)}})


def keep_lines(candidate: Candidate, applied: Applied, all_engine_hosts: list[str]) -> list[str]:
    """The inventory fields to set to keep CANDIDATE: per host and engine; cluster-wide when it
    covered every engine host (then one pdkit_cluster.tuning line replaces the per-engine ones)."""
    lines = []
    for key, value in candidate.overlay.items():
        scope, _, rest = key.partition(".")
        hosts = sorted({h for h, _ in applied.landed.get(key, [])})
        shown = json.dumps(value)
        if scope in ENGINE_SCOPES and hosts == sorted(all_engine_hosts):
            lines.append(f"pdkit_cluster.tuning.{scope}.{rest}: {shown}")
            continue
        for host, path in applied.landed.get(key, []):
            lines.append(f"{host}: {path}: {shown}")
    return lines
