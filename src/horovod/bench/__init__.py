"""``python -m horovod.bench``: the collectives' latency and bandwidth on this job's ranks, in nccl-tests' columns,
optionally against mpi4py (Open MPI) and torch.distributed Gloo measured in the same processes.

Run it under the launcher, as a training script::

    horovodrun -np 4 python -m horovod.bench
    horovodrun -np 8 -H a:4,b:4 python -m horovod.bench --ops allreduce -b 4K -e 256M
    horovodrun --mpi -np 2 python -m horovod.bench --peers horovod,mpi4py,gloo --json out.json --plot out.png

Each (op, size) is timed for every peer in turn, so that the peers share the machine's load; rank 0 prints.
``cli`` parses and runs, ``peers`` wraps each library, ``timing`` is the loop, ``report`` the table and JSON.
"""
