"""Worker: start Horovod (without importing mpi4py first), print the MPI probes, run a few checked collectives.

Prints ``PROBES enabled=<mpi_enabled()> built=<mpi_built()> threads=<mpi_threads_supported() or the error>``,
``PLANE <data_plane()>``, then ``COLLECTIVES ok`` once allreduce, allgather and broadcast gave the right values.
An exception from ``hvd.init()`` is not caught: the user sees its traceback and the rank exits non-zero.
argv[1], if given, is an mpi4py thread level (e.g. ``funneled``): the program then initializes MPI itself at
that level, before ``hvd.init()``.
"""
import sys

import numpy as np

import horovod.numpy as hvd
from horovod.core import basics

if len(sys.argv) > 1:
    import mpi4py

    mpi4py.rc.thread_level = sys.argv[1]
    from mpi4py import MPI

    print(f"USER_INIT thread_level={MPI.Query_thread()}", flush=True)
hvd.init()
r, n = hvd.rank(), hvd.size()
try:
    threads = basics.mpi_threads_supported()
except ValueError as exc:
    threads = f"ValueError: {exc}"
print(f"PROBES enabled={basics.mpi_enabled()} built={basics.mpi_built()} threads={threads}", flush=True)
print(f"PLANE {basics.data_plane()}", flush=True)
for step in range(10):
    out = hvd.allreduce(np.full(1000, float(r + step)), op=hvd.Sum, name="probe.sum")
    assert np.all(out == n * (n - 1) / 2 + n * step), out[:3]
big = hvd.allreduce(np.full(1 << 20, 1.0, np.float32), op=hvd.Sum, name="probe.big")
assert np.all(big == n), big[:3]
assert hvd.allgather(np.array([r], np.int64), name="probe.gather").tolist() == list(range(n))
assert hvd.broadcast(np.full(2, float(r)), root_rank=n - 1, name="probe.bcast").tolist() == [n - 1.0] * 2
print("COLLECTIVES ok", flush=True)
hvd.shutdown()
