"""`python -m pdkit.jitwarm`: the path units and commands run on nodes name, whose venv may predate the
move to pdkit/agent/ (issue 48): runs pdkit/agent/jitwarm.py as the program. Nothing imports this module."""

import runpy

if __name__ == "__main__":
    runpy.run_module("pdkit.agent.jitwarm", run_name="__main__", alter_sys=True)
