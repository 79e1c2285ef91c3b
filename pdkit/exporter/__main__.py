"""pdkit-exporter's unit runs `python -m pdkit.exporter`; the exporter is pdkit/agent/exporter/ (issue 48)."""

import runpy

runpy.run_module("pdkit.agent.exporter", run_name="__main__", alter_sys=True)
