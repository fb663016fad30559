"""`python -m bench.consume`: see bench/README.md."""

import sys

from bench.consume.runner import main

if __name__ == "__main__":
    sys.exit(main())
