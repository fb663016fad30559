"""`python -m bench.reliable`: see bench/README.md."""

import sys

from bench.reliable.runner import main

if __name__ == "__main__":
    sys.exit(main())
