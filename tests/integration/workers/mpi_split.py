"""Worker (4 ranks under mpirun): two halves of COMM_WORLD run independent Horovod jobs side by side.

Part 1, a communicator: the ranks split COMM_WORLD by parity (even ranks 0, 2; odd ranks 1, 3) and each half
calls ``hvd.init(comm=half)``. Both halves use the same tensor names at the same time; the values prove that they
never mix: the halves sum, gather and broadcast different numbers.
Part 2, a list of ranks: after a shutdown, COMM_WORLD rank 1 first checks that ``hvd.init(comm=[0, 2])`` is refused
there; then ranks 0 and 2 call ``hvd.init(comm=[0, 2])`` while ranks 1 and 3 first talk to each other over plain
mpi4py (something else), then call ``hvd.init(comm=[3, 1])`` (an unsorted list). Every rank prints what it saw.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import horovod.numpy as hvd
from horovod.core import basics

world = MPI.COMM_WORLD
me = world.Get_rank()
assert world.Get_size() == 4, "run this worker on 4 ranks"
expected_plane = os.environ.get("HVD_TEST_EXPECT_DATA_PLANE")


def show(*fields):
    print(*fields, flush=True)


def exercise(part, members):
    """Run a few collectives in this half and check them; ``members`` are its COMM_WORLD ranks, in order."""
    assert hvd.size() == 2, hvd.size()
    assert hvd.rank() == members.index(me), (hvd.rank(), members)
    assert hvd.local_size() == 2 and hvd.local_rank() == hvd.rank(), (hvd.local_size(), hvd.local_rank())
    assert basics.mpi_enabled() and basics.mpi_threads_supported()
    if expected_plane:
        assert basics.data_plane().startswith(expected_plane), basics.data_plane()
    sums = []
    for step in range(20):                                  # enough steps for the response cache path too
        total = hvd.allreduce(np.full(1000, float(me + step)), op=hvd.Sum, name="same.name")
        assert np.all(total == sum(members) + 2 * step), (step, total[:3])
        sums.append(int(total[0]))
    big = hvd.allreduce(np.full(300_000, float(me), np.float32), op=hvd.Sum, name="big")
    assert np.all(big == sum(members)), big[:3]
    gathered = hvd.allgather(np.array([me] * (1 + hvd.rank()), np.int64), name="who")
    expect_gather = [m for i, m in enumerate(members) for _ in range(1 + i)]
    assert gathered.tolist() == expect_gather, gathered.tolist()
    root_value = hvd.broadcast(np.full(3, float(me)), root_rank=0, name="root.value")
    assert root_value.tolist() == [float(members[0])] * 3, root_value.tolist()
    hvd.barrier()
    show(f"{part} world={me} rank={hvd.rank()} size={hvd.size()} sum={sums[0]} "
         f"gather={gathered.tolist()} bcast={int(root_value[0])} plane={basics.data_plane().split()[0]}")


# ---------------------------------------------------------------- part 1: hvd.init(comm=<a communicator>)
half = world.Split(color=me % 2, key=me)
hvd.init(comm=half)
exercise("COMM", [r for r in range(4) if r % 2 == me % 2])
hvd.shutdown()
assert not hvd.is_initialized()
half.Free()
world.Barrier()

# ---------------------------------------------------------------- part 2: hvd.init(comm=<a list of ranks>)
if me == 1:
    try:
        hvd.init(comm=[0, 2])
        show("NOT_MEMBER accepted")
    except ValueError as exc:
        show("NOT_MEMBER ValueError", str(exc))
if me in (0, 2):
    hvd.init(comm=[0, 2])
    exercise("LIST", [0, 2])
else:
    # Something else first: plain mpi4py between ranks 1 and 3, while 0 and 2 run Horovod.
    peer = 3 if me == 1 else 1
    got = world.sendrecv(f"hello from {me}", dest=peer, source=peer)
    show(f"OTHER world={me} got={got!r}")
    hvd.init(comm=[3, 1])
    exercise("LIST", [1, 3])
hvd.shutdown()
world.Barrier()
show("DONE")
sys.stdout.flush()
