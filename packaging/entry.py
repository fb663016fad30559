import multiprocessing
import os
import sys

if __name__ == "__main__":
    # Tiered storage's upload worker is a spawned child: in the frozen executable that child
    # starts as this program, and freeze_support() turns it into the worker.
    multiprocessing.freeze_support()
    # Installed (or linked) under the name danube-admin, it is upstream's admin CLI, so
    # upstream's scripts run unchanged against the one file.
    if os.path.basename(sys.argv[0]) == "danube-admin":
        from danube.cli.admin import main
    else:
        from danube.cli.main import main
    sys.exit(main())
