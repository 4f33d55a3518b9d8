"""What ``horovod.torch`` adds to a blocking collective: per-call time through the torch binding against the op
layer it builds on, N ranks.

Runs ``benchmarks/workers/torch_overhead.py`` under this project's ``horovodrun`` and prints, per size (4 KB and
64 KB and 16 MB by default) and call (``hvd.allreduce``, ``allreduce_``, ``allreduce_async_`` + ``synchronize``,
``broadcast``, ``broadcast_``, ``allgather``, ``reducescatter``), the time of the same collective on numpy arrays
through ``horovod.core.ops`` (as ``python -m horovod.bench`` times it), through the torch call, and the
difference: what the binding costs per call. Each figure is the median of 3 repetitions of the mean over n calls
(``benchmarks/workers/timing.py::measure``).

    python benchmarks/torch_overhead.py [--np 2] [--sizes 4096,65536] [--scale 0.5] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.binding_overhead import overhead_main, report  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    return overhead_main(argv, __doc__, "benchmarks.workers.torch_overhead", "4096,65536,16777216", 0.5, report)


if __name__ == "__main__":
    sys.exit(main())
