"""``python -m horovod.bench``: see :mod:`horovod.bench`."""
import sys

from horovod.bench.cli import main

sys.exit(main())
