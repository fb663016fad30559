import multiprocessing
import sys

if __name__ == "__main__":
    # Tiered storage's upload worker is a spawned child: in the frozen executable that child
    # starts as this program, and freeze_support() turns it into the worker.
    multiprocessing.freeze_support()
    # Installed (or linked) under upstream's names, danube-broker, danube-cli and
    # danube-admin, it is that program, so upstream's scripts run unchanged against the one
    # file; under any other name it is the `danube` command.
    from danube.cli.programs import main_for

    sys.exit(main_for(sys.argv[0])())
