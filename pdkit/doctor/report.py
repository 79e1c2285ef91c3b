"""How doctor's rows leave it: the human table, the --json document, the exit code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdkit.doctor.model import FAIL, INFO, PASS, WARN, CheckResult, Status

EXIT_FAIL = 1
EXIT_INVALID = 2


def status_counts(results: Sequence[CheckResult]) -> dict[Status, int]:
    """How many rows PASS, INFO, WARN and FAIL."""
    return {s: sum(1 for r in results if r.status == s) for s in (PASS, INFO, WARN, FAIL)}


def render_table(results: Sequence[CheckResult]) -> str:
    """Human output: one block per host/target, a row per check, the hint under INFO/WARN/FAIL rows that have one."""
    lines: list[str] = []
    width = max((len(r.check) for r in results), default=10)
    current = None
    for r in results:
        if (r.host, r.target) != current:
            current = (r.host, r.target)
            lines.append("" if lines else "")
            lines.append(f"{r.host}/{r.target}" if r.host else r.target)
        lines.append(f"  {r.check:<{width}}  {r.status}  {r.reason}")
        if r.hint:
            lines.append(f"  {'':<{width}}        {'note' if r.status == INFO else 'fix'}: {r.hint}")
    counts = status_counts(results)
    lines.append("")
    info = f"{counts[INFO]} INFO, " if counts[INFO] else ""
    lines.append(f"{counts[PASS]} PASS, {info}{counts[WARN]} WARN, {counts[FAIL]} FAIL")
    return "\n".join(lines[1:] if lines and lines[0] == "" else lines)


def exit_code(results: Sequence[CheckResult]) -> int:
    return EXIT_FAIL if any(r.status == FAIL for r in results) else 0



def json_report(inventory: str, cluster: str, results: Sequence[CheckResult]) -> dict[str, Any]:
    """The --json document: the counts, whether all is well and every row."""
    return {"inventory": inventory, "cluster": cluster, "ok": exit_code(results) == 0,
            "counts": status_counts(results), "checks": [r.to_dict() for r in results]}
