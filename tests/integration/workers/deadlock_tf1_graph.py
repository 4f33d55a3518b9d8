"""Worker: a TF1 graph whose two independent allreduces cross between the ranks for ``LATE`` seconds.

On each rank one allreduce's input is slow to compute (rank 0: ``a``; the others: ``b``), so for ``LATE`` seconds
every rank waits on the allreduce whose input was fast, which the other ranks have not submitted yet. That is
the state of a deadlock, but TensorFlow is still computing the other branch on another thread: the detector must
report it and not end the job. Prints ``PASSED`` with the results.
"""
import sys
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

LATE = float(sys.argv[1])


def slow(x):
    time.sleep(LATE)
    return x


def main() -> None:
    tf.compat.v1.disable_eager_execution()
    hvd.init()
    late = "a" if hvd.rank() == 0 else "b"
    outs = []
    for name in ("a", "b"):
        value = tf.constant(np.full(3, 1.0, np.float32))
        if name == late:
            value = tf.numpy_function(slow, [value], tf.float32, stateful=True)
        outs.append(hvd.allreduce(value, name=f"tf1.{name}", op=hvd.Sum))
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    with tf.compat.v1.Session(config=config) as session:
        a, b = session.run(outs)
    assert a.tolist() == b.tolist() == [float(hvd.size())] * 3, (a, b)
    print("PASSED", a.tolist(), flush=True)


if __name__ == "__main__":
    main()
