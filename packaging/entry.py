import sys

from danube.cli.main import main

sys.exit(main())
