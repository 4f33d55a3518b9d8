"""horovod.torch side of the binding-overhead benchmark; run under horovodrun.

    python -m benchmarks.workers.torch_overhead OUT.json SIZES [SCALE]

For every size in SIZES (bytes of one float32 tensor, comma-separated) it times each blocking collective per call
three ways on the same buffers: through the op layer on numpy arrays (``horovod.core.ops``, as
``python -m horovod.bench`` calls it: what every binding builds on), through ``horovod.torch``'s in-place or
differentiable call on a torch tensor (``hvd.allreduce``, ``hvd.allreduce_``, ``hvd.broadcast_``, ``hvd.allgather``,
``hvd.reducescatter`` ...), and as ``*_async`` plus ``hvd.synchronize``. Every call of one row uses the same name,
as a training loop does. ``SCALE`` multiplies the iteration counts of ``benchmarks.workers.timing.iterations``.
Rank 0 prints a line per row and writes the seconds per call as JSON.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch

import horovod.torch as hvd
from benchmarks.workers.overhead_rows import layer, worker_main
from horovod.core import ops

# Each row: (op-layer call, torch calls by label), on float32 buffers of the size.
ROWS = ["allreduce", "allreduce_", "allreduce_async_", "broadcast", "broadcast_", "allgather", "reducescatter"]


def calls(nbytes: int, size: int) -> Dict[str, Dict[str, Callable[[], object]]]:
    """Per row, the op layer's call and the torch binding's on buffers of ``nbytes`` (float32)."""
    count = max(size, nbytes // 4 // size * size)
    x, y = np.ones(count, np.float32), np.empty(count, np.float32)
    t = torch.ones(count)
    part = torch.ones(count // size)
    piece = np.ones(count // size, np.float32)
    s, avg = hvd.Sum, hvd.Average


    return {
        "allreduce": {"ops": layer(lambda: ops.allreduce_async(x, y, name="o.ar", op=avg)),
                      "binding": lambda: hvd.allreduce(t, name="t.ar")},
        "allreduce_": {"ops": layer(lambda: ops.allreduce_async(x, x, name="o.ar_", op=s)),
                       "binding": lambda: hvd.allreduce_(t, name="t.ar_", op=s)},
        "allreduce_async_": {"ops": layer(lambda: ops.allreduce_async(x, x, name="o.ara_", op=s)),
                             "binding": lambda: hvd.synchronize(hvd.allreduce_async_(t, name="t.ara_", op=s))},
        "broadcast": {"ops": layer(lambda: ops.broadcast_async(x, 0, y, name="o.bc")),
                      "binding": lambda: hvd.broadcast(t, 0, name="t.bc")},
        "broadcast_": {"ops": layer(lambda: ops.broadcast_async(x, 0, x, name="o.bc_")),
                       "binding": lambda: hvd.broadcast_(t, 0, name="t.bc_")},
        "allgather": {"ops": layer(lambda: ops.allgather_async(piece, name="o.ag")),
                      "binding": lambda: hvd.allgather(part, name="t.ag")},
        "reducescatter": {"ops": layer(lambda: ops.reducescatter_async(x, name="o.rs", op=s)),
                          "binding": lambda: hvd.reducescatter(t, name="t.rs", op=s)},
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker_main(calls, hvd, "horovod.torch")
