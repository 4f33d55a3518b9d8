"""horovod.mxnet side of the binding-overhead benchmark; run under horovodrun from MXNet's venv.

    python -m benchmarks.workers.mxnet_overhead OUT.json SIZES [SCALE]

For every size in SIZES (bytes of one float32 array, comma-separated) it times each blocking collective per call
two ways on the same data: through the op layer on numpy arrays (``horovod.core.ops``, as ``python -m
horovod.bench`` calls it) and through ``horovod.mxnet`` on an ``mx.nd.NDArray`` (``hvd.allreduce``,
``allreduce_``, ``broadcast``, ``broadcast_``, ``allgather``, ``reducescatter``). ``SCALE`` multiplies the
iteration counts of ``benchmarks.workers.timing.iterations``. Rank 0 prints a line per row and writes the
seconds per call as JSON (the layout ``benchmarks/torch_overhead.py`` reports).
"""
from __future__ import annotations

from typing import Callable, Dict

import mxnet as mx
import numpy as np

import horovod.mxnet as hvd
from benchmarks.workers.overhead_rows import layer, worker_main
from horovod.core import ops


def calls(nbytes: int, size: int) -> Dict[str, Dict[str, Callable[[], object]]]:
    """Per collective, the op layer's call and horovod.mxnet's on float32 data of ``nbytes``."""
    count = max(size, nbytes // 4 // size * size)
    x, y = np.ones(count, np.float32), np.empty(count, np.float32)
    piece = np.ones(count // size, np.float32)
    t, part = mx.nd.ones((count,)), mx.nd.ones((count // size,))
    s = hvd.Sum
    return {
        "allreduce": {"ops": layer(lambda: ops.allreduce_async(x, y, name="o.ar", op=hvd.Average)),
                      "binding": lambda: hvd.allreduce(t, name="m.ar").wait_to_read()},
        "allreduce_": {"ops": layer(lambda: ops.allreduce_async(x, x, name="o.ar_", op=s)),
                       "binding": lambda: hvd.allreduce_(t, op=s, name="m.ar_").wait_to_read()},
        "broadcast": {"ops": layer(lambda: ops.broadcast_async(x, 0, y, name="o.bc")),
                      "binding": lambda: hvd.broadcast(t, 0, name="m.bc").wait_to_read()},
        "broadcast_": {"ops": layer(lambda: ops.broadcast_async(x, 0, x, name="o.bc_")),
                       "binding": lambda: hvd.broadcast_(t, 0, name="m.bc_").wait_to_read()},
        "allgather": {"ops": layer(lambda: ops.allgather_async(piece, name="o.ag")),
                      "binding": lambda: hvd.allgather(part, name="m.ag").wait_to_read()},
        "reducescatter": {"ops": layer(lambda: ops.reducescatter_async(x, name="o.rs", op=s)),
                          "binding": lambda: hvd.reducescatter(t, op=s, name="m.rs").wait_to_read()},
    }


if __name__ == "__main__":
    worker_main(calls, hvd, "horovod.mxnet")
