"""horovod.numpy's object helpers against one collective of their bytes; run under horovodrun.

    python -m benchmarks.workers.object_helpers OUT.json SIZES [SCALE]

For every size in SIZES (bytes of a pickled payload, roughly: a dict holding a bytes string of that length) it
times ``hvd.broadcast_object`` and ``hvd.allgather_object`` per call, and as reference one blocking broadcast or
allgather through the op layer of a uint8 array as long as the pickle. ``SCALE`` multiplies the iteration counts
of ``benchmarks.workers.timing.iterations``. Rank 0 writes the seconds per call as JSON (the layout
``benchmarks/torch_overhead.py`` reports).
"""
from __future__ import annotations

from typing import Callable, Dict

import cloudpickle
import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.overhead_rows import layer, worker_main
from horovod.core import ops


def calls(nbytes: int, size: int) -> Dict[str, Dict[str, Callable[[], object]]]:
    """The object helpers on a dict of about ``nbytes`` pickled, and one collective of the pickle's bytes."""
    obj = {"step": 7, "lr": 0.1, "blob": b"x" * max(0, nbytes - 64)}
    payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8).copy()
    return {
        "broadcast_object": {"ops": layer(lambda: ops.broadcast_async(payload, 0, payload, name="o.bo")),
                             "binding": lambda: hvd.broadcast_object(obj, 0, name="bo")},
        "allgather_object": {"ops": layer(lambda: ops.allgather_async(payload, name="o.ao")),
                             "binding": lambda: hvd.allgather_object(obj, name="ao")},
    }


if __name__ == "__main__":
    worker_main(calls, hvd, "object helper")
