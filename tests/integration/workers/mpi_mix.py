"""Worker (any number of ranks under mpirun): the program's own mpi4py calls interleaved with Horovod's.

The program imports mpi4py first (as MPI programs do: thread level MULTIPLE, mpi4py's default), then starts
Horovod on COMM_WORLD. It checks the MPI probes, then:
1. alternates mpi4py collectives on COMM_WORLD (pickle-based ``allreduce``/``bcast`` and buffer-based
   ``Allreduce``) with ``hvd.allreduce``, checking every value;
2. starts several Horovod ops asynchronously (some large, so that they are still in flight) and, while they
   run on Horovod's engine thread, makes mpi4py calls from the main thread; then waits and checks everything.
argv[1], if given, is ``comm``: pass ``hvd.init(comm=MPI.COMM_WORLD)`` explicitly instead of ``hvd.init()``.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import horovod.numpy as hvd
from horovod.core import basics

world = MPI.COMM_WORLD
me, n = world.Get_rank(), world.Get_size()
if len(sys.argv) > 1 and sys.argv[1] == "comm":
    hvd.init(comm=world)
else:
    hvd.init()
assert hvd.rank() == me and hvd.size() == n, (hvd.rank(), hvd.size(), me, n)
print(f"PROBES enabled={basics.mpi_enabled()} built={basics.mpi_built()} "
      f"threads={basics.mpi_threads_supported()} level={MPI.Query_thread() == MPI.THREAD_MULTIPLE}", flush=True)
expected_plane = os.environ.get("HVD_TEST_EXPECT_DATA_PLANE")
if expected_plane:
    assert basics.data_plane().startswith(expected_plane), basics.data_plane()

rank_sum = n * (n - 1) // 2
# 1. alternate.
for step in range(30):
    assert world.allreduce(me + step) == rank_sum + n * step
    buf = np.full(257, float(me), np.float64)
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    assert np.all(buf == rank_sum), buf[:3]
    out = hvd.allreduce(np.full(257, float(me + step)), op=hvd.Sum, name="alternate")
    assert np.all(out == rank_sum + n * step), out[:3]
    assert world.bcast(step * 10 if me == 0 else None, root=0) == step * 10
print("ALTERNATE ok", flush=True)

# 2. overlap: Horovod ops in flight on the engine thread while the main thread calls MPI.
for _round in range(5):
    big = [np.full(1 << 20, float(me + i), np.float32) for i in range(3)]
    handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"overlap.{i}") for i, t in enumerate(big)]
    gathered = hvd.allgather_async(np.full((2, 3), me, np.int32), name="overlap.gather")
    user = []
    for _ in range(20):
        user.append(world.allreduce(me))
        part = np.full(4096, me, np.int64)
        world.Allreduce(MPI.IN_PLACE, part, op=MPI.MAX)
        assert np.all(part == n - 1)
        world.Barrier()
    assert user == [rank_sum] * 20, user
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        assert np.all(out == rank_sum + n * i), (i, out[:3])
    assert hvd.synchronize(gathered).tolist() == [[r] * 3 for r in range(n) for _ in range(2)]
print("OVERLAP ok", flush=True)
hvd.shutdown()
# MPI is still usable after Horovod's shutdown (Horovod freed only its own communicators).
assert world.allreduce(1) == n
print("AFTER_SHUTDOWN ok", flush=True)
