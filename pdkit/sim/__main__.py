"""`python -m pdkit.sim <sglang flags>`: run the rehearsal engine with SGLang's argv."""

import sys

from pdkit.sim.main import main

if __name__ == "__main__":
    sys.exit(main())
