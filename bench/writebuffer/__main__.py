import sys

from bench.writebuffer.runner import main

sys.exit(main())
