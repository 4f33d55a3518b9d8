"""Where a TF2 synthetic-benchmark step's time goes; run under horovodrun (1 or N ranks).

    python -m benchmarks.workers.tf_step_profile OUT.json [--rounds 6] [--steps 10] [--intra 1] [--inter 1] [--pin]

Every rank builds the synthetic benchmark's CNN (``examples/tensorflow2/tensorflow2_synthetic_benchmark.py``) and
times, in alternating blocks of ``--steps`` calls so that the machine's noise falls on all of them alike:

- ``dist``: the benchmark's step (``DistributedGradientTape`` in a ``tf.function``, SGD) with the early starts
  on (``horovod.tensorflow.overlap``, gradients of ``--alone-bytes`` or more start alone as soon as they exist);
- ``grouped``: the same with ``groups=1``: one grouped allreduce of every gradient after the backward pass;
- ``local``: the same step with a plain tape (no collective): with N ranks, what sharing the cores costs;
- ``reduce``: only the allreduce of the gradients' shapes in a ``tf.function`` (one grouped allreduce), with
  nothing to compute beside it.

``dist - local`` is what the gradient exchange adds to a step, ``reduce`` what it costs alone. Each rank writes
its per-step seconds to ``OUT.json.<rank>``; rank 0 also prints the medians. ``--pin`` pins rank r's process to
core ``r % cores`` (engine thread included).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
from horovod.tensorflow import overlap

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "tensorflow2"))
from tensorflow2_synthetic_benchmark import build_model  # noqa: E402


def _steps(batch: int, image: int) -> Dict[str, Callable[[], None]]:
    """The three timed calls (see the module docstring)."""
    model = build_model("cnn", image)
    opt = keras.optimizers.SGD(learning_rate=0.01 * hvd.size())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.uniform([batch, image, image, 3])
    target = tf.random.uniform([batch], minval=0, maxval=10, dtype=tf.int64)

    def make(distributed: bool, **options):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(target, model(data, training=True))
            if distributed:
                tape = hvd.DistributedGradientTape(tape, **options)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return step

    shapes = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables]
    reduce_only = tf.function(lambda: hvd.grouped_allreduce(shapes, name="profile.reduce"))
    dist = make(True)
    dist()
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(opt.variables, root_rank=0)
    return {"dist": dist, "grouped": make(True, groups=1), "local": make(False), "reduce": reduce_only}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--intra", type=int, default=1, help="intra-op threads per rank (0: TF's default)")
    parser.add_argument("--inter", type=int, default=1, help="inter-op threads per rank (0: TF's default)")
    parser.add_argument("--pin", action="store_true", help="pin rank r to core r %% cores")
    parser.add_argument("--alone-bytes", type=int, default=1 << 20,
                        help="for the dist step: overlap.ALONE_BYTES (gradients that start alone as soon as "
                             "they exist; -1: off, one grouped allreduce)")
    args = parser.parse_args()

    hvd.init()
    overlap.ALONE_BYTES = args.alone_bytes if args.alone_bytes >= 0 else None
    if args.pin:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[hvd.local_rank() % len(cores)]})
    if args.intra:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra)
    if args.inter:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter)
    keras.utils.set_random_seed(0)
    runs = _steps(args.batch_size, args.image_size)
    for run in runs.values():
        for _ in range(args.warmup):
            run()
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            hvd.allreduce(tf.zeros([1]), name="profile.barrier")
            for _ in range(args.steps):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    Path(f"{args.out}.{hvd.rank()}").write_text(json.dumps({"rank": hvd.rank(), "size": hvd.size(),
                                                            "args": vars(args), "times": times}))
    if hvd.rank() == 0:
        print(" ".join(f"{k} {1e3 * float(np.median(v)):.1f} ms" for k, v in times.items()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
