"""`python -m bench.tiered`: see bench/README.md."""

import sys

from bench.tiered.runner import main

if __name__ == "__main__":
    sys.exit(main())
