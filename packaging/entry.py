import multiprocessing
import sys

from danube.cli.main import main

if __name__ == "__main__":
    # Tiered storage's upload worker is a spawned child: in the frozen executable that child
    # starts as this program, and freeze_support() turns it into the worker.
    multiprocessing.freeze_support()
    sys.exit(main())
