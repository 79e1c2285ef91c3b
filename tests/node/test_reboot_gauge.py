"""pdkit-exporter's pdkit_node_reboot_required follows the marker the driver role writes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdkit.agent.exporter.collector import PdkitCollector
from pdkit.agent.exporter.config import parse_config
from pdkit.agent.exporter.system import REBOOT_MARKER_PATH as EXPORTER_MARKER
from pdkit.agent.exporter.system import ProcessInspector, SystemdPids
from pdkit.render.node import REBOOT_MARKER_PATH
from tests.exporter.support import FakeSystemctl


def gauge(collector) -> float:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "pdkit_node_reboot_required" and s.labels == {"node": "n"})


def test_gauge_follows_the_marker_file(tmp_path):
    assert EXPORTER_MARKER == REBOOT_MARKER_PATH  # the exporter reads what the role writes
    cfg = parse_config({"node": "n", "timeout_s": 0.1, "journal": {"enabled": False, "timeout_s": 0.1}, "engines": []})
    collector = PdkitCollector(cfg, inspector=ProcessInspector(SystemdPids(FakeSystemctl({}))))
    marker = tmp_path / "reboot-required"
    collector.reboot_marker_path = str(marker)
    try:
        assert gauge(collector) == 0
        marker.write_text("NVIDIA driver packages changed by pdkit\n")
        assert gauge(collector) == 1
    finally:
        collector.close()
