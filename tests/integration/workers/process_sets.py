"""Worker: process sets end to end, one scenario per run (argv[1]); prints ``RESULT <json>`` lines to check.

- ``static``: ``init(process_sets=[evens, odds, overlapping])`` and a collective on each set this rank is in.
- ``comm``: under mpirun, ``init(process_sets=[ProcessSet(split comm)])``, where each rank passes its own half.
- ``init_comm``: under mpirun, ``init(comm=[0, 1, 2], process_sets=[ProcessSet([0, 2])])``: a Horovod job on
  part of COMM_WORLD with a process set inside it (rank 3 runs no Horovod).
- ``duplicate``: ``init`` with the same set twice (upstream's ValueError).
- ``not_dynamic``: ``add_process_set`` without HOROVOD_DYNAMIC_PROCESS_SETS (upstream's ValueError).
- ``stall``: rank 0 submits on set [0, 1] and rank 1 only much later (the stall inspector names the set).
- ``kill``: rank 1 dies while rank 0 waits on a collective of set [0, 1].
- ``timeline``: (HOROVOD_TIMELINE set by the test) collectives on set [0, 1], which rank 0 coordinates, and on
  set [1, 2], which it is not in.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import horovod.numpy as hvd

scenario = sys.argv[1]


def result(**fields) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def summed(ps, name):
    return hvd.allreduce(np.full(2, float(hvd.rank())), op=hvd.Sum, name=name, process_set=ps).tolist()


if scenario == "static":
    evens, odds, low = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3]), hvd.ProcessSet([0, 1, 2])
    hvd.init(process_sets=[evens, odds, low])
    sets = {"evens": evens, "odds": odds, "low": low}
    out = {key: summed(ps, "x") for key, ps in sets.items() if ps.included()}
    result(rank=hvd.rank(), ids={k: ps.process_set_id for k, ps in sets.items()}, sums=out,
           sizes={k: ps.size() for k, ps in sets.items()})
elif scenario == "comm":
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    ps = hvd.ProcessSet(half)
    hvd.init(process_sets=[ps])
    result(rank=hvd.rank(), id=ps.process_set_id, ranks=ps.ranks, sum=summed(ps, "x"), mpi=hvd.mpi_enabled())
elif scenario == "init_comm":
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 3:
        result(rank=-1)
    else:
        ps = hvd.ProcessSet([0, 2])
        hvd.init(comm=[0, 1, 2], process_sets=[ps])
        out = summed(ps, "x") if ps.included() else None
        result(rank=hvd.rank(), size=hvd.size(), id=ps.process_set_id, sum=out)
elif scenario == "duplicate":
    try:
        hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([0])])
    except ValueError as exc:
        result(rank=hvd.rank(), error=str(exc))
elif scenario == "comm_duplicates":          # under MPI: duplicates made from communicators, then a valid init
    from mpi4py import MPI

    from horovod.core import basics as core_basics

    comm = MPI.COMM_WORLD
    sub = comm.Split(color=0 if comm.rank == 0 else 1)
    errors = {}
    for label, sets in [("dup_of_global", [hvd.ProcessSet(comm.Dup())]),
                        ("dup_of_a_set", [hvd.ProcessSet(sub), hvd.ProcessSet(sub.Dup())]),
                        ("list_equal_to_a_comm_set", [hvd.ProcessSet(sub), hvd.ProcessSet([0])])]:
        try:
            hvd.init(comm=comm, process_sets=sets)
            errors[label] = None
        except ValueError as exc:
            errors[label] = str(exc)
        hvd.shutdown()
    hvd.init(comm=comm, process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([0, 1])])
    result(errors=errors, sets=sorted(map(sorted, core_basics._get_process_set_ids_and_ranks().values())))
elif scenario == "not_dynamic":
    hvd.init()
    try:
        hvd.add_process_set([0])
    except ValueError as exc:
        result(rank=hvd.rank(), error=str(exc))
elif scenario == "stall":
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.init()
    ps = hvd.add_process_set([0, 1])
    if hvd.rank() == 0:
        summed(ps, "late.tensor")
    elif hvd.rank() == 1:
        time.sleep(6.0)     # past the 1 s check time and the slack of a busy machine (tests/support/timing.py)
        summed(ps, "late.tensor")
    hvd.barrier()
    result(rank=hvd.rank(), done=True)
elif scenario == "kill":
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    if os.environ.get("HOROVOD_RANK") != "1":
        # The launcher's fail-fast (SIGTERM once rank 1 is gone) must not cut the report short: it SIGKILLs the
        # survivors after its grace period anyway.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hvd.init()
    ps = hvd.add_process_set([0, 1])
    if hvd.rank() == 1:
        time.sleep(0.5)
        os._exit(17)
    if hvd.rank() == 0:
        try:
            summed(ps, "orphan")
        except Exception as exc:        # HorovodInternalError
            result(rank=0, error=f"{type(exc).__name__}: {exc}")
    time.sleep(5.0)
elif scenario == "timeline":
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.init()
    recorded, elsewhere = hvd.add_process_set([0, 1]), hvd.add_process_set([1, 2])
    for step in range(3):
        if recorded.included():
            summed(recorded, f"in.set.{step}")
        if elsewhere.included():
            summed(elsewhere, f"other.set.{step}")
        summed(hvd.global_process_set, f"global.{step}")
    result(rank=hvd.rank(), done=True)
else:
    raise SystemExit(f"unknown scenario {scenario}")
hvd.shutdown()
