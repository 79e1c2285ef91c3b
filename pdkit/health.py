"""`python -m pdkit.health`: the path units and commands run on nodes name, whose venv may predate the
move to pdkit/agent/ (issue 48): runs pdkit/agent/health.py as the program. Nothing imports this module."""

import runpy

if __name__ == "__main__":
    runpy.run_module("pdkit.agent.health", run_name="__main__", alter_sys=True)
