"""The generated Grafana dashboards against Grafana's own published dashboard schema: `Dashboard` of
@grafana/schema (npm), converted to JSON Schema by ts-json-schema-generator and checked with ajv, all
pinned by .ci/grafana-schema/package-lock.json and installed by .ci/grafana-schema.sh."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pdkit.monitoring.dashboards import dashboards
from tests.conftest import require
from tests.test_monitoring import _load_example

HOME = Path(os.environ.get("PDKIT_GRAFANA_SCHEMA_HOME", Path.home() / ".cache" / "pdkit" / "grafana-schema"))
SCHEMA = HOME / "dashboard.schema.json"
AJV = HOME / "node_modules" / ".bin" / "ajv"


def validate(boards: dict[str, dict], tmp_path: Path) -> subprocess.CompletedProcess:
    require(SCHEMA.is_file() and AJV.is_file(), f"no Grafana dashboard schema at {HOME}: run bash .ci/grafana-schema.sh")
    argv = [str(AJV), "validate", "-s", str(SCHEMA), "--strict=false", "--all-errors", "--errors=line"]
    for name, d in boards.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(d))
        argv += ["-d", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("example", ["lab", "cluster"])
def test_dashboards_validate_against_grafanas_schema(example, tmp_path):
    boards = dashboards(_load_example(example))
    assert boards
    out = validate(boards, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" valid") + out.stderr.count(" valid") >= len(boards)


def test_the_schema_check_fails_on_a_broken_dashboard(tmp_path):
    """A link without Grafana's required fields, a panel whose gridPos lacks `h`: each is rejected."""
    good = next(iter(dashboards(_load_example("lab")).values()))
    link = json.loads(json.dumps(good))
    link["links"] = [{"title": "x", "type": "link", "url": "/d/x"}]
    grid = json.loads(json.dumps(good))
    del grid["panels"][0]["gridPos"]["h"]
    for name, broken in (("link", link), ("grid", grid)):
        out = validate({name: broken}, tmp_path)
        assert out.returncode != 0, (name, out.stdout, out.stderr)
        assert "invalid" in out.stdout + out.stderr
