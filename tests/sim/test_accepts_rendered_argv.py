"""Every engine argv the kit renders for the example inventories is accepted by the sim's parser.

The sim runs with exactly the argv generated for `python -m sglang.launch_server`, so a flag the
kit renders that the sim rejects would break `engine: sim` deployments. Rendering lives in
pdkit.render.flags (spec -> argv) and pdkit.inventory.loader (inventory -> spec); while those are missing or
their API moves, this test skips rather than guesses. Inventories are loaded in a child process:
loading one imports pyinfra, which gevent-patches the whole interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from pdkit.sim.args import check_argv

from .support import PYTHON

if importlib.util.find_spec("pdkit.render.flags") is None or importlib.util.find_spec("pdkit.inventory.loader") is None:
    pytest.skip("pdkit.render.flags not available yet", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
INVENTORIES = sorted(p for p in (REPO / "inventories").glob("*.py") if not p.name.startswith("_"))

RENDER = """
import json, sys
import pdkit.render.flags as flags
from pdkit.inventory.loader import load
if not hasattr(flags, "sglang_args"):
    print(json.dumps({"skip": "pdkit.render.flags.sglang_args not available yet"})); sys.exit(0)
spec = load(sys.argv[1], cwd=sys.argv[2])
engines = spec.engines() if callable(spec.engines) else spec.engines
print(json.dumps({"argvs": [flags.sglang_args(spec, h, e) for h, e in engines]}))
"""


def rendered_engine_argvs(inventory: Path) -> list[list[str]]:
    """The flags after `python -m sglang.launch_server` for every engine of an inventory."""
    proc = subprocess.run([PYTHON, "-c", RENDER, str(inventory), str(REPO)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result["argvs"]


@pytest.mark.parametrize("inventory", INVENTORIES, ids=lambda p: p.name)
def test_sim_accepts_every_rendered_engine_argv(inventory):
    argvs = rendered_engine_argvs(inventory)
    assert argvs, f"{inventory.name} renders no engine"
    for argv in argvs:
        try:
            check_argv(argv)
        except ValueError as exc:
            pytest.fail(f"{inventory.name}: the sim rejects {' '.join(argv)!r}: {exc}")
