"""`pdkit tune INVENTORY CAMPAIGN [--dry] [--resume]`: a lever campaign, one candidate at a time.

- campaign.py: the campaign file, sweep expansion, each candidate's derived inventory data and
  its validation through pdkit's loader (pure; no host);
- results.py: records (JSONL), ranking, the markdown report, the plot, resume, the estimate (pure);
- gates.py: the correctness gate and the soak (HTTP only: router and engines);
- runner.py: the campaign itself: pdkit.roll's Roller to apply and roll back, doctor, bench.

docs/tune.md describes the campaign format and every verdict.

This file exports nothing: pdkit/cli.py registers pdkit.tune.runner's add_parser, and tests import
the modules.
"""
