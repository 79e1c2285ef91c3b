"""`python -m pdkit.clients.evalrun BENCH ARGS...`: sgl-eval's `run` in this process, for the answer gate's
accuracy part (d) (pdkit.clients.answers.run_accuracy builds ARGS; docs/correctness.md).

The endpoint's API key comes from the environment (pdkit.clients.answers.EVAL_KEY_ENV) and is handed to
sgl-eval's own parser inside this process, so it never appears in a command line (/proc/*/cmdline).
Datasets stay offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE), and only the pinned sgl-eval runs
(pyproject's `eval` extra). Exit status: sgl-eval's own (130: aborted), 3 when it is missing or another
version.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

from pdkit.clients.answers import EVAL_KEY_ENV, SGL_EVAL_VERSION


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    key = os.environ.pop(EVAL_KEY_ENV, "") or "EMPTY"  # sgl-eval's own default for no key
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        version = metadata.version("sgl-eval")
    except metadata.PackageNotFoundError:
        print(f"sgl-eval is not installed in {sys.prefix}: pip install 'pdkit[eval]' (sgl-eval=={SGL_EVAL_VERSION}) "
              "in the environment pdkit runs from", file=sys.stderr)
        return 3
    if version != SGL_EVAL_VERSION:
        print(f"sgl-eval {version} is installed in {sys.prefix}; the answer gate is pinned to {SGL_EVAL_VERSION} "
              "(pyproject's eval extra)", file=sys.stderr)
        return 3
    from sgl_eval.cli import main as sgl_eval_main  # lazy: only once the pinned version is known to be there

    # `--api-key=KEY` in one word: a key that starts with '-' is still the option's value
    return int(sgl_eval_main(["run", *args, f"--api-key={key}"]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
