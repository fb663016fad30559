"""`python -m bench.cluster`: see bench/README.md."""

import sys

from bench.cluster.runner import main

if __name__ == "__main__":
    sys.exit(main())
