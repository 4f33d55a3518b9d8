"""What ``hvd.broadcast_object`` and ``hvd.allgather_object`` cost per call, against one blocking collective of
their pickled bytes through the op layer, N ranks.

Runs ``benchmarks/workers/object_helpers.py`` under this project's ``horovodrun`` and prints, per payload size
(about 100 B and 16 KB by default), both helpers' time, the reference collective's, and the difference. Each
figure is the median of 3 repetitions of the mean over n calls (``benchmarks/workers/timing.py::measure``).

    python benchmarks/object_helpers.py [--np 2] [--sizes 100,16384] [--scale 0.25] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.binding_overhead import overhead_main, report  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    return overhead_main(argv, __doc__, "benchmarks.workers.object_helpers", "100,16384", 0.25, report)


if __name__ == "__main__":
    sys.exit(main())
