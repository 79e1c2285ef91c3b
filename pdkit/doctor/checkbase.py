"""What every doctor check module shares: an engine's row, the rows a check gives when its engine
cannot be measured (down, or the page it reads did not answer), and a counter's increase between the
two samples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

from pdkit.doctor.model import INFO, PASS, WARN, CheckResult, EngineObservation, EnginePlan, ExporterView, Status

T = TypeVar("T")

# the page a check reads before it can judge anything: /server_info, the second /metrics sample, or both
Needs = Literal["server_info", "metrics", "both metrics samples"]


def engine_row(plan: EnginePlan, check: str, status: Status, reason: str, hint: str = "") -> CheckResult:
    """One engine's row; a PASS carries no fix hint."""
    return CheckResult(plan.host, plan.target, check, status, reason, hint if status != PASS else "")


def not_measured(plan: EnginePlan, check: str, why: str) -> CheckResult:
    """A WARN: the page this check reads did not answer (`why`)."""
    return engine_row(plan, check, WARN, f"not measured: {why}",
                      f"make {plan.url} reachable from this machine (is "
                      f"pdkit-engine-{plan.engine} running on {plan.host}?) and re-run")


def exporter_unread(obs: EngineObservation, check: str) -> CheckResult:
    """An INFO: the node's pdkit-exporter, which this check reads, did not answer."""
    return engine_row(obs.plan, check, INFO, f"not measured: the node's pdkit-exporter was unreadable "
                                             f"({obs.exporter_error})", "")


def exporter_figure(obs: EngineObservation, check: str, figure: Callable[[ExporterView], T | None],
                    absent: str, judge: Callable[[ExporterView, T], CheckResult]) -> CheckResult:
    """The row of a check of one FIGURE the node's pdkit-exporter publishes: JUDGE's, given the exporter's view
    and the figure; or, where there is none to judge, `cannot_measure`'s, an INFO when the exporter did not
    answer (`exporter_unread`), an INFO saying ABSENT when the exporter publishes no such figure."""
    if (early := cannot_measure(obs, check)) is not None:
        return early
    ex = obs.exporter
    if ex is None:
        return exporter_unread(obs, check)
    value = figure(ex)
    if value is None:
        return engine_row(obs.plan, check, INFO, absent, "")
    return judge(ex, value)


def engine_down(obs: EngineObservation) -> bool:
    """Neither /server_info nor /metrics answered (a rank above 0, which serves no HTTP: its host's
    exporter finds no process for it): every check of this engine follows from `reachable`
    (`rank_process`)."""
    if obs.plan.rank > 0:
        return obs.exporter is not None and obs.exporter.rank_up == 0
    return obs.server_info is None and obs.second.figures is None


def unreachable(plan: EnginePlan, check: str) -> CheckResult:
    """The row of every check of a down engine: it follows from `reachable` (`rank_process`)."""
    if plan.rank > 0:
        return engine_row(plan, check, WARN, "not measured: the rank has no running process (see rank_process)",
                          "follows from rank_process")
    return engine_row(plan, check, WARN, "not measured: the engine did not answer (see reachable)",
                      "follows from reachable")


def cannot_measure(obs: EngineObservation, check: str, needs: Needs | None = None) -> CheckResult | None:
    """The row a check opens with when it cannot judge, None when it can: `unreachable` when the engine
    is down, `not measured` when the page it `needs` did not answer."""
    plan = obs.plan
    if engine_down(obs):
        return unreachable(plan, check)
    if needs == "server_info" and obs.server_info is None:
        return not_measured(plan, check, f"/server_info unreadable ({obs.server_info_error})")
    if needs == "metrics" and obs.second.figures is None:
        return not_measured(plan, check, f"/metrics unreadable ({obs.second.error})")
    if needs == "both metrics samples" and (obs.first.figures is None or obs.second.figures is None):
        return not_measured(plan, check, f"/metrics unreadable ({obs.first.error or obs.second.error})")
    return None


def counter_delta(first: float | None, second: float | None) -> float | None:
    """Increase of a cumulative counter between two samples; after a restart (it went back) the new total."""
    if second is None:
        return None
    if first is None or second < first:
        return second
    return second - first
