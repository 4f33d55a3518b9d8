"""A rank's process inside a Spark task: ``python -m horovod.spark.rank <driver_addr> <port>``.

The task writes the job secret as the first line of this process's stdin, so that it is never on a command
line or in the environment the process was started with (``ps e`` and ``/proc/<pid>/environ`` do not show it).
It is then put into this process's environment for ``hvd.init()`` (which reads it from there), and the rank runs
``horovod.run``'s worker, :func:`horovod.runner.run_task.main`: fetch the function, run it, store its result.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Read the secret from stdin, then run this rank's part of the job; returns the exit code."""
    from horovod.common.wire import SECRET_ENV
    from horovod.runner import run_task

    argv = sys.argv[1:] if argv is None else argv
    secret = sys.stdin.readline().strip()
    if not secret:
        sys.stderr.write("horovod.spark.rank must be started by horovod.spark.run (no secret on stdin).\n")
        return 2
    os.environ[SECRET_ENV] = secret
    return run_task.main(argv)


if __name__ == "__main__":
    sys.exit(main())
