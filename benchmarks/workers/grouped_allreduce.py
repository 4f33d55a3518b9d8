"""Grouped allreduces of many small tensors, ours and Open MPI's; run under horovodrun (``hvd``) or mpirun (``mpi``).

    python -m benchmarks.workers.grouped_allreduce hvd|mpi OUT.json GROUPS [ROUNDS]

GROUPS is a comma-separated list of ``<tensors>x<bytes>`` (float32 tensors of that many bytes each). Per group,
in ``ROUNDS`` alternating rounds (so that the machine's drift falls on every path alike), each round the median
over repeats of the mean of n calls (``horovod.bench.timing.measure``), rank 0 writes the median round's seconds
per call:

- ``hvd``: ``grouped`` is ``hvd.grouped_allreduce`` (a blocking call: one fast round on one host);
  ``coordinator`` the same group submitted without the blocking promise and waited at once (negotiated by the
  coordinator, fused by the data plane: the path every blocking grouped allreduce took before the grouped
  rounds); ``async`` one ``allreduce_async`` per tensor, then a wait for each (a training step's gradient hooks).
- ``mpi``: ``iallreduce`` one ``Iallreduce`` per tensor, then ``Waitall``; ``fused`` one ``Allreduce`` of a buffer
  holding every tensor (packed before and unpacked after, as a fusion buffer or DDP's bucket does).
"""
from __future__ import annotations

import statistics
import sys
from typing import Callable, Dict, List, Tuple

import numpy as np

from benchmarks.workers.timing import finish_job
from horovod.bench.timing import iterations, measure


def parse(groups: str) -> List[Tuple[int, int]]:
    """``8x4096,32x4096`` -> [(8, 4096), (32, 4096)]."""
    return [(int(n), int(b)) for n, b in (g.split("x") for g in groups.split(",") if g)]


def _tensors(count: int, nbytes: int, rank: int) -> List[np.ndarray]:
    return [np.full(nbytes // 4, rank + i, np.float32) for i in range(count)]


def hvd_paths(count: int, nbytes: int) -> Tuple[Dict[str, Callable[[], object]], Callable[[], None], int]:
    import horovod.numpy as hvd
    from horovod.core import ops

    xs = _tensors(count, nbytes, hvd.rank())
    tag = f"{count}x{nbytes}"

    def per_tensor() -> None:
        handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"a.{tag}.{i}") for i, x in enumerate(xs)]
        for h in handles:
            hvd.synchronize(h)

    paths = {"grouped": lambda: hvd.grouped_allreduce(xs, op=hvd.Sum, name=f"g.{tag}"),
             "coordinator": lambda: ops.grouped_allreduce_async(xs, None, f"c.{tag}", hvd.Sum).wait(),
             "async": per_tensor}
    return paths, hvd.barrier, hvd.rank()


def mpi_paths(count: int, nbytes: int) -> Tuple[Dict[str, Callable[[], object]], Callable[[], None], int]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    xs = _tensors(count, nbytes, comm.rank)
    outs = [np.empty_like(x) for x in xs]
    fused, fused_out = np.empty(count * (nbytes // 4), np.float32), np.empty(count * (nbytes // 4), np.float32)
    step = nbytes // 4

    def iallreduce() -> None:
        MPI.Request.Waitall([comm.Iallreduce(x, o) for x, o in zip(xs, outs)])

    def one_buffer() -> None:
        for i, x in enumerate(xs):
            fused[i * step:(i + 1) * step] = x
        comm.Allreduce(fused, fused_out)
        for i, o in enumerate(outs):
            o[...] = fused_out[i * step:(i + 1) * step]

    return {"iallreduce": iallreduce, "fused": one_buffer}, comm.Barrier, comm.rank


def main() -> None:
    mode, out, groups = sys.argv[1], sys.argv[2], parse(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    if mode == "hvd":
        import horovod.numpy as hvd
        hvd.init()
        make = hvd_paths
    else:
        make = mpi_paths
    results: Dict[str, Dict[str, float]] = {}
    rank = 0
    for count, nbytes in groups:
        paths, barrier, rank = make(count, nbytes)
        n = max(50, iterations(count * nbytes) // max(1, count // 4))
        samples: Dict[str, List[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, run in paths.items():
                samples[name].append(measure(run, barrier, n))
        results[f"{count}x{nbytes}"] = {name: statistics.median(s) for name, s in samples.items()}
        if rank == 0:
            print(f"{mode} {count} x {nbytes} B: " + "  ".join(
                f"{name} {t * 1e6:.1f} us" for name, t in results[f"{count}x{nbytes}"].items()), flush=True)
    finish_job(out, {"mode": mode, "results": results}, rank, hvd.shutdown if mode == "hvd" else None)


if __name__ == "__main__":
    main()
