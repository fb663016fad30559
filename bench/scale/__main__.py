"""`python -m bench.scale`: see bench/README.md."""

import sys

from bench.scale.runner import main

if __name__ == "__main__":
    sys.exit(main())
