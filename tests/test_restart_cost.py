"""gpu/nspawn/restart_cost.py's parsing of `python -X importtime`, on this interpreter's real output."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import load_script


def test_import_time_is_summed_over_top_level_imports_only():
    rc = load_script("gpu/nspawn/restart_cost.py", "pdkit_restart_cost")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json, email.parser"],
                          capture_output=True, text=True, check=True)
    total, top = rc.importtime_by_package(done.stderr)
    names = [p for p, _ in top]
    assert "json" in names and "email" in names
    assert "decoder" not in names and "parser" not in names  # json.decoder, email.parser: nested or dotted
    # the top-level cumulative times add up to the total, and no nested line was counted twice
    assert abs(sum(s for _, s in top) - total) < 1e-6 or len(top) == 12
    assert 0 < total < 5
