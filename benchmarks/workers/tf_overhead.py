"""horovod.tensorflow side of the tf.function overhead benchmark; run under horovodrun.

    python -m benchmarks.workers.tf_overhead OUT.json SIZES [SCALE]

For every size in SIZES (bytes of one float32 tensor, comma-separated) it times one ``hvd.allreduce`` per call four ways on the same
tensor: ``horovod.numpy`` (the op layer without TensorFlow, for reference), eagerly in TensorFlow, as the only op
of a ``tf.function`` (a ``HorovodCollective`` kernel), and fetched by ``session.run`` from a TF1 graph (the
kernel inside a one-element tf.data map, off the inter-op pool). Then ``GROUP`` tensors of ``GROUP_BYTES`` each:
one ``grouped_allreduce`` eagerly and in a ``tf.function``, and ``GROUP`` separate allreduces in one
``tf.function``. ``SCALE`` multiplies the iteration counts of ``benchmarks.workers.timing.iterations``.
Rank 0 prints a line per row and writes the seconds per call as JSON.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import horovod.numpy as hnp
import horovod.tensorflow as hvd
from benchmarks.workers.timing import iterations, measure, write

GROUP, GROUP_BYTES = 20, 256 << 10
VARIANTS = ["numpy", "eager", "function", "graph"]


def _tf1_session(build: Callable[[], object]) -> Callable[[], object]:
    """``session.run`` of what ``build`` adds to a fresh TF1 graph (one inter-op thread, as the rest)."""
    graph = tf.Graph()
    with graph.as_default():
        fetch = build()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    session = tf.compat.v1.Session(graph=graph, config=config)
    return lambda: session.run(fetch)


def single(nbytes: int) -> Dict[str, Callable[[], object]]:
    """The four ways to allreduce one float32 tensor of ``nbytes``; each call returns the reduced tensor."""
    count = max(1, nbytes // 4)
    array = np.ones(count, np.float32)
    tensor = tf.ones([count], tf.float32)
    in_function = tf.function(lambda t: hvd.allreduce(t, name=f"function.{nbytes}"))
    return {"numpy": lambda: hnp.allreduce(array, name=f"numpy.{nbytes}"),
            "eager": lambda: hvd.allreduce(tensor, name=f"eager.{nbytes}"),
            "function": lambda: in_function(tensor),
            "graph": _tf1_session(lambda: hvd.allreduce(tf.ones([count], tf.float32), name=f"graph.{nbytes}"))}


def grouped() -> Dict[str, Callable[[], object]]:
    """``GROUP`` tensors: one grouped allreduce eagerly and in a tf.function, and separate ones in a tf.function."""
    tensors = [tf.ones([GROUP_BYTES // 4], tf.float32) for _ in range(GROUP)]
    in_function = tf.function(lambda ts: hvd.grouped_allreduce(ts, name="grouped.function"))
    separate = tf.function(lambda ts: [hvd.allreduce(t, name=f"separate.{i}") for i, t in enumerate(ts)])
    return {"grouped eager": lambda: hvd.grouped_allreduce(tensors, name="grouped.eager"),
            "grouped function": lambda: in_function(tensors),
            "separate function": lambda: separate(tensors)}


def check(result: object) -> None:
    """Every allreduce here averages tensors of ones: the result must be ones."""
    for r in result if isinstance(result, list) else [result]:
        values = np.asarray(r)
        if not np.all(values == 1.0):
            raise AssertionError(f"allreduce returned {values.ravel()[:4]}..., expected ones")


def main(out: str, sizes: List[int], scale: float) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    rank = hvd.rank()
    rows: Dict = {"size": hvd.size(), "threads": "1 intra-op, 1 inter-op", "single": {}, "grouped": {},
                  "group": {"tensors": GROUP, "bytes_each": GROUP_BYTES}}

    def time_all(runs: Dict[str, Callable[[], object]], n: int) -> Dict[str, float]:
        for run in runs.values():
            check(run())
        return {name: measure(run, hnp.barrier, n) for name, run in runs.items()}

    for nbytes in sizes:
        rows["single"][str(nbytes)] = got = time_all(single(nbytes), max(3, int(iterations(nbytes) * scale)))
        if rank == 0:
            print(f"{nbytes:>10d} B  " + "  ".join(f"{k} {v * 1e6:9.1f} us" for k, v in got.items()), flush=True)
    rows["grouped"] = got = time_all(grouped(), max(3, int(iterations(GROUP * GROUP_BYTES) * scale)))
    if rank == 0:
        print(f"{GROUP} x {GROUP_BYTES} B  " + "  ".join(f"{k} {v * 1e6:9.1f} us" for k, v in got.items()),
              flush=True)
        write(out, rows)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")], float(sys.argv[3]) if len(sys.argv) > 3 else 0.25)
