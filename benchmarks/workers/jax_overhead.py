"""horovod.jax side of the binding-overhead benchmark; run under horovodrun.

    python -m benchmarks.workers.jax_overhead OUT.json SIZES [SCALE]

For every size in SIZES (bytes of one float32 array, comma-separated) it times each eager collective per call
two ways on the same data: through the op layer on numpy arrays (``horovod.core.ops``, as ``python -m
horovod.bench`` calls it) and through ``horovod.jax`` on a ``jax.Array`` (``hvd.allreduce``, ``hvd.broadcast``,
``hvd.allgather``, ``hvd.reducescatter``). ``SCALE`` multiplies the iteration counts of
``benchmarks.workers.timing.iterations``. Rank 0 prints a line per row and writes the seconds per call as JSON
(the layout ``benchmarks/torch_overhead.py`` reports).
"""
from __future__ import annotations

from typing import Callable, Dict

import jax.numpy as jnp
import numpy as np

import horovod.jax as hvd
from benchmarks.workers.overhead_rows import layer, worker_main
from horovod.core import ops


def calls(nbytes: int, size: int) -> Dict[str, Dict[str, Callable[[], object]]]:
    """Per collective, the op layer's call and horovod.jax's on float32 data of ``nbytes``."""
    count = max(size, nbytes // 4 // size * size)
    x, y = np.ones(count, np.float32), np.empty(count, np.float32)
    piece = np.ones(count // size, np.float32)
    t, part = jnp.ones(count, jnp.float32), jnp.ones(count // size, jnp.float32)


    return {
        "allreduce": {"ops": layer(lambda: ops.allreduce_async(x, y, name="o.ar", op=hvd.Average)),
                      "binding": lambda: hvd.allreduce(t, name="j.ar")},
        "broadcast": {"ops": layer(lambda: ops.broadcast_async(x, 0, y, name="o.bc")),
                      "binding": lambda: hvd.broadcast(t, 0, name="j.bc")},
        "allgather": {"ops": layer(lambda: ops.allgather_async(piece, name="o.ag")),
                      "binding": lambda: hvd.allgather(part, name="j.ag")},
        "reducescatter": {"ops": layer(lambda: ops.reducescatter_async(x, name="o.rs", op=hvd.Sum)),
                          "binding": lambda: hvd.reducescatter(t, name="j.rs", op=hvd.Sum)},
    }


if __name__ == "__main__":
    worker_main(calls, hvd, "horovod.jax")
