"""`python -m bench.e2e`: see bench/README.md."""

import sys

from bench.e2e.runner import main

if __name__ == "__main__":
    sys.exit(main())
