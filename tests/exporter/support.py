"""Helpers for the exporter tests: fixtures on disk, a fake journalctl/systemctl, exposition parsing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

DATA = Path(__file__).resolve().parent / "data"


def data_text(name: str) -> str:
    return (DATA / name).read_text()


def data_json(name: str):
    return json.loads((DATA / name).read_text())


def exposition(collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition as {(name, frozenset(labels)): value} (parsed independently
    of the collector, with prometheus_client's parser)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float | None:
    """The one sample of `name` whose labels include `labels`; None when there is none."""
    hits = [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) <= 1, f"{name} {labels}: {len(hits)} samples"
    return hits[0] if hits else None


def label_sets(found: dict, name: str, **labels) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls), _ in found.items() if n == name and set(labels.items()) <= ls]


class FakeJournal:
    """journalctl over log files, as the exporter calls it: `-o json`, `-u UNIT`..., `--after-cursor C`
    (first N entries after it) or none (the newest N), `-n N`. Cursors are `line=<global index>`.
    Semantics as observed with systemd 252's journalctl (see test_system.py)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.calls: list[list[str]] = []
        self.fail_with: tuple[int, bytes] | None = None

    def add(self, unit: str, message: str, realtime_s: float = 1_800_000_000.0) -> None:
        n = len(self.entries)
        self.entries.append({"__CURSOR": f"line={n}", "__REALTIME_TIMESTAMP": str(int(realtime_s * 1e6)),
                             "_SYSTEMD_UNIT": unit, "MESSAGE": message, "_BOOT_ID": "b"})

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, bytes, bytes]:
        argv = list(argv)
        self.calls.append(argv)
        if self.fail_with is not None:
            rc, err = self.fail_with
            return rc, b"", err
        units = {argv[i + 1] for i, a in enumerate(argv) if a == "-u"}
        n = int(argv[argv.index("-n") + 1])
        chosen = [e for e in self.entries if e["_SYSTEMD_UNIT"] in units]
        if "--after-cursor" in argv:
            cursor = argv[argv.index("--after-cursor") + 1]
            if not cursor.startswith("line="):
                return 1, b"", b"Failed to seek to cursor: Invalid argument"
            after = int(cursor[5:])
            chosen = [e for e in chosen if int(e["__CURSOR"][5:]) > after][:n]
        else:
            chosen = chosen[-n:]
        return 0, b"".join(json.dumps(e).encode() + b"\n" for e in chosen), b""


class FakeSystemctl:
    """`systemctl show -p Id -p MainPID UNIT...` answered from a dict (unit -> pid)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.calls = 0
        self.rc = 0

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, bytes, bytes]:
        self.calls += 1
        if self.rc:
            return self.rc, b"", b"System has not been booted with systemd as init system (PID 1). Can't operate."
        units = [a for a in argv[2:] if not a.startswith("-") and a not in ("Id", "MainPID")]
        blocks = [f"MainPID={self.pids.get(u, 0)}\nId={u}\n" for u in units]
        return 0, "\n".join(blocks).encode(), b""
