"""MPI side of the data-plane benchmark: run under mpirun. For each data plane Horovod can use under MPI
(forced mpi, forced shm, and the default choice), times every op and size through the engine, interleaved
with raw mpi4py on the same buffers, so that each ratio compares two figures taken moments apart."""
from __future__ import annotations

import os
import sys
from typing import Callable, Dict, List

import numpy as np
from mpi4py import MPI

import horovod.numpy as hvd
from benchmarks.workers.timing import OPS, SIZES, iterations, measure, write
from horovod.bench.peers import Mpi4pyPeer
from horovod.core import basics, ops

PLANES = {"mpi": "mpi", "shm": "shm", "default": ""}
_MPI = Mpi4pyPeer()          # raw mpi4py calls, as horovod.bench times them
STREAM_DEPTH = 8


def _runs(comm, nbytes: int) -> Dict[str, Dict[str, Callable[[], None]]]:
    n = comm.Get_size()
    count = max(1, nbytes // 4)
    x = np.ones(count, np.float32)
    y = np.empty_like(x)
    part = np.ones(max(1, count // n), np.float32)
    return {
        "raw": {op: _MPI.runs(op, nbytes) for op in OPS},
        "engine": {"allreduce": lambda: ops.allreduce_async(x, y, name="bench.ar", op=hvd.Sum).wait(),
                   "allgather": lambda: ops.allgather_async(part, name="bench.ag").wait(),
                   "broadcast": lambda: ops.broadcast_async(x, 0, output=x, name="bench.bc").wait(),
                   "reducescatter": lambda: ops.reducescatter_async(x, name="bench.rs", op=hvd.Sum).wait()},
    }


def _picked(op: str, nbytes: int) -> str:
    """Which plane the running engine's backend uses for this op and size."""
    backend = basics.engine().backend
    if backend.name != "routed":
        return backend.name
    chosen = backend._for_reduce(nbytes) if op == "allreduce" else backend._for_move(nbytes)
    return chosen.name


def _stream(comm, sizes: List[int], rounds: int, depth: int = STREAM_DEPTH) -> Dict:
    """``depth`` allreduces in flight, then wait for all (as gradients are), against as many raw calls.

    Fusion is off in the mpi pass (HOROVOD_FUSION_THRESHOLD=0), so the engine runs ``depth`` separate MPI
    Allreduces of the same size as the raw side: what differs is only that one negotiation covers them all.
    """
    out: Dict = {}
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        xs = [np.ones(count, np.float32) for _ in range(depth)]
        ys = [np.empty_like(x) for x in xs]

        def raw(xs=xs, ys=ys) -> None:
            for x, y in zip(xs, ys):
                comm.Allreduce(x, y, op=MPI.SUM)

        def engine(xs=xs, ys=ys) -> None:
            handles = [ops.allreduce_async(x, y, name=f"bench.stream.{i}", op=hvd.Sum)
                       for i, (x, y) in enumerate(zip(xs, ys))]
            for h in handles:
                h.wait()

        n = max(3, iterations(nbytes) // depth)
        r, e = [], []
        for _ in range(rounds):
            r.append(measure(raw, comm.Barrier, n, repeats=1) / depth)
            e.append(measure(engine, comm.Barrier, n, repeats=1) / depth)
        out[str(nbytes)] = {"raw": sorted(r)[len(r) // 2], "engine": sorted(e)[len(e) // 2], "depth": depth}
        if comm.Get_rank() == 0:
            print(f"stream   {nbytes:>10d} B  {depth} in flight, per op engine/raw "
                  f"{out[str(nbytes)]['engine'] * 1e6:.1f}/{out[str(nbytes)]['raw'] * 1e6:.1f} us", flush=True)
    return out


def main(out: str, sizes: List[int], rounds: int = 3) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rows: Dict = {"size": comm.Get_size(), "library": MPI.Get_library_version().splitlines()[0].split(",")[0],
                  "planes": {}}
    for plane, value in PLANES.items():
        os.environ["HOROVOD_CPU_OPERATIONS"] = value
        os.environ["HOROVOD_FUSION_THRESHOLD"] = "0" if plane == "mpi" else str(128 << 20)
        hvd.init()
        result: Dict = {"reason": basics.data_plane(), "ops": {}}
        for nbytes in sizes:
            runs = _runs(comm, nbytes)
            n = iterations(nbytes)
            for op in OPS:
                raw, eng = [], []
                for _ in range(rounds):     # alternate, so that drift in the VM hits both sides alike
                    raw.append(measure(runs["raw"][op], comm.Barrier, n, repeats=1))
                    eng.append(measure(runs["engine"][op], comm.Barrier, n, repeats=1))
                raw.sort()
                eng.sort()
                result["ops"].setdefault(op, {})[str(nbytes)] = {
                    "raw": raw[len(raw) // 2], "engine": eng[len(eng) // 2], "picked": _picked(op, nbytes)}
            if rank == 0:
                line = "  ".join(f"{op} {result['ops'][op][str(nbytes)]['engine'] * 1e6:8.1f}/"
                                 f"{result['ops'][op][str(nbytes)]['raw'] * 1e6:.1f} us" for op in OPS)
                print(f"{plane:<8} {nbytes:>10d} B  engine/raw  {line}", flush=True)
        if plane == "mpi":
            result["stream"] = _stream(comm, [s for s in sizes if s >= 1 << 20], rounds)
        rows["planes"][plane] = result
        hvd.shutdown()
    if rank == 0:
        write(out, rows)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES[:-1])
