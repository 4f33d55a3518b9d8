"""What ``horovod.jax`` adds to an eager collective: per-call time through the JAX binding against the op layer
it builds on, N ranks.

Runs ``benchmarks/workers/jax_overhead.py`` under this project's ``horovodrun`` and prints, per size (4 KB,
64 KB and 1 MB by default) and collective (``hvd.allreduce``, ``broadcast``, ``allgather``, ``reducescatter`` on a
``jax.Array``), the time of the same collective on numpy arrays through ``horovod.core.ops`` (as ``python -m
horovod.bench`` times it), through the JAX call, and the difference. Each figure is the median of 3 repetitions
of the mean over n calls (``benchmarks/workers/timing.py::measure``).

    python benchmarks/jax_overhead.py [--np 2] [--sizes 4096,65536,1048576] [--scale 0.5] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.binding_overhead import overhead_main, report  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    return overhead_main(argv, __doc__, "benchmarks.workers.jax_overhead", "4096,65536,1048576", 0.5, report)


if __name__ == "__main__":
    sys.exit(main())
