"""The committed JSON tables of pdkit/upstream/ (`parser_table.json`, `data/*.json`: generated from the pinned
wheels by pdkit/contract/), each read once per process. Standard library only: the nodes read them too."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


@functools.cache
def read_table(path: Path) -> dict[str, Any]:
    """The JSON object in the committed table at PATH, read once per process: every caller shares it, none
    changes it."""
    with path.open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data
