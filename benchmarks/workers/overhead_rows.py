"""The binding-overhead workers' shared parts (``torch_overhead``, ``jax_overhead``, ``mxnet_overhead``,
``object_helpers``): the op layer's blocking call as the bench times it, and the timing loop over sizes and rows
that writes what ``benchmarks/binding_overhead.py`` reports."""
from __future__ import annotations

import sys
from typing import Callable, Dict, Iterable, List, Optional

from benchmarks.workers.timing import iterations, measure, write
from horovod.core import ops

Rows = Dict[str, Dict[str, Callable[[], object]]]     # row -> {"ops": call, "binding": call}


def layer(start: Callable[[], object]) -> Callable[[], object]:
    """The op layer's call that ``start`` submits, made as a blocking call (``ops.blocking``) and waited for."""
    def run() -> object:
        with ops.blocking():
            return start().wait()
    return run


def time_rows(calls: Callable[[int, int], Rows], sizes: Iterable[int], scale: float, binding: str, out: str,
              rank: int, size: int, barrier: Callable[[], None]) -> None:
    """Time every row's two calls at every size (``measure``, ``iterations(nbytes) * scale`` calls); rank 0 prints a
    line per row and writes ``{"size", "binding", "results": {nbytes: {row: {"ops": s, "binding": s}}}}`` to
    ``out``."""
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    for nbytes in sizes:
        n = max(10, int(iterations(nbytes) * scale))
        for row, pair in calls(nbytes, size).items():
            got = results.setdefault(str(nbytes), {}).setdefault(row, {})
            for label, run in pair.items():
                got[label] = measure(run, barrier, n)
            if rank == 0:
                print(f"{nbytes:>9d} B {row:<17} ops {got['ops'] * 1e6:8.1f} us  {binding} "
                      f"{got['binding'] * 1e6:8.1f} us", flush=True)
    if rank == 0:
        write(out, {"size": size, "binding": binding, "results": results})


def worker_main(calls: Callable[[int, int], Rows], hvd, binding: str, argv: Optional[List[str]] = None) -> None:
    """A worker's command line, ``OUT.json SIZES [SCALE]``: init the binding ``hvd``, time ``calls``' rows
    (:func:`time_rows`, between the op layer's barriers), shut down."""
    args = sys.argv[1:] if argv is None else argv
    out, sizes = args[0], [int(s) for s in args[1].split(",")]
    scale = float(args[2]) if len(args) > 2 else 1.0
    hvd.init()
    time_rows(calls, sizes, scale, binding, out, hvd.rank(), hvd.size(), lambda: ops.barrier_async().wait())
    hvd.shutdown()
