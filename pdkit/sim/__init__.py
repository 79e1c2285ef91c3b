"""pdkit.sim: an SGLang-compatible rehearsal engine (no GPU, never a performance claim).

Run it with exactly the argv rendered for `python -m sglang.launch_server`:

    python -m pdkit.sim --model-path /models/x --disaggregation-mode prefill ...

Entry points for other code:
- `pdkit.sim.args.build_parser()`  the SGLang-compatible argparse parser;
- `pdkit.sim.args.parse_args(argv)`  parse + resolve (exits 2 on a malformed value);
- `pdkit.sim.args.check_argv(argv)`  parse without exiting (raises ValueError), for contract tests;
- `pdkit.sim.main.main(argv)`  the process entry;
- `pdkit.sim.localstack.LocalPDStack`  a sim prefill + decode behind smg on loopback, with the
  router readiness gate (worker list healthy, then a real request);
- `pdkit.sim.metrics.exposed_names(version)`  every metric family /metrics can carry (the
  catalogue's families of that SGLang release).
"""

from pdkit.sim.args import build_parser, check_argv, parse_args

__all__ = ["build_parser", "check_argv", "parse_args"]
