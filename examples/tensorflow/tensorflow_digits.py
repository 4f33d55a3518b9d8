"""Data-parallel TF1-style (graph mode) training of a small network on scikit-learn's bundled digits data.

Launch with ``horovodrun -np 2 python examples/tensorflow/tensorflow_digits.py``. It is the TensorFlow program of
upstream Horovod's README, adapted only as far as ``tf.compat.v1`` on TensorFlow 2 requires, on data that ships
with scikit-learn (nothing is downloaded): ``hvd.init()``, one GPU per process through ``visible_device_list``
(harmless on CPU), the learning rate scaled by ``hvd.size()``, ``hvd.DistributedOptimizer`` around a
``tf.compat.v1.train`` optimizer, ``hvd.BroadcastGlobalVariablesHook(0)`` so every rank starts from rank 0's
variables, the number of steps divided by ``hvd.size()``, and checkpoints written by rank 0 only, all in a
``MonitoredTrainingSession``. Each rank trains on its own shard of the data; at the end every rank scores its shard
of the held-out digits and the counts are summed with ``hvd.allreduce``.
"""
from __future__ import annotations

import argparse
import logging
from typing import Dict, Iterator, Tuple

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.tensorflow as hvd

log = logging.getLogger("tensorflow_digits")


def load_data() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 8, 8, 1) float32 images in [0, 1] and int64 labels, split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    return train_test_split(x, digits.target.astype(np.int64), test_size=0.25, random_state=0,
                            stratify=digits.target)


def conv_model(image: tf.Tensor, hidden: int = 128) -> tf.Tensor:
    """A small CNN for 8x8 single-channel images (conv 16, conv 32, max-pool, dense, dense); returns logits."""
    def weight(name, shape):
        return tf.compat.v1.get_variable(name, shape, initializer=tf.compat.v1.glorot_uniform_initializer())

    def bias(name, n):
        return tf.compat.v1.get_variable(name, [n], initializer=tf.compat.v1.zeros_initializer())

    x = tf.nn.relu(tf.nn.conv2d(image, weight("conv1", [3, 3, 1, 16]), 1, "SAME") + bias("conv1_b", 16))
    x = tf.nn.relu(tf.nn.conv2d(x, weight("conv2", [3, 3, 16, 32]), 1, "SAME") + bias("conv2_b", 32))
    x = tf.nn.max_pool2d(x, 2, 2, "VALID")
    x = tf.reshape(x, [-1, 4 * 4 * 32])
    x = tf.nn.relu(tf.matmul(x, weight("fc1", [4 * 4 * 32, hidden])) + bias("fc1_b", hidden))
    return tf.matmul(x, weight("fc2", [hidden, 10])) + bias("fc2_b", 10)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled mini-batches of this rank's shard."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chosen = order[start:start + batch_size]
            yield x[chosen], y[chosen]


class EvaluateAtEndHook(tf.compat.v1.train.SessionRunHook):
    """Runs the (allreduced) accuracy counts once training has ended, on every rank."""

    def __init__(self, totals: tf.Tensor, feed_dict: Dict) -> None:
        self.totals = totals
        self.feed_dict = feed_dict
        self.result = None

    def end(self, session) -> None:
        self.result = session.run(self.totals, feed_dict=self.feed_dict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="training steps in all (divided among the ranks)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01, help="Adagrad learning rate for one rank (scaled by size)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint-dir", default="checkpoints/tensorflow_digits",
                        help="rank 0 saves checkpoints here")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    tf.compat.v1.disable_eager_execution()
    # Horovod: initialize Horovod.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    # TensorFlow's own INFO lines (steps, loss, checkpoints) from rank 0 only, and printed once.
    tf.get_logger().propagate = False
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO if rank == 0 else tf.compat.v1.logging.WARN)
    tf.compat.v1.set_random_seed(args.seed + rank)  # deliberately different per rank until rank 0's broadcast

    x_train, x_test, y_train, y_test = load_data()
    # Each rank trains on its own 1/size of the training set and scores its own 1/size of the test set.
    x_train, y_train = x_train[rank::size], y_train[rank::size]
    x_test, y_test = x_test[rank::size], y_test[rank::size]

    image = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1], name="image")
    label = tf.compat.v1.placeholder(tf.int64, [None], name="label")
    logits = conv_model(image)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label, logits=logits))
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), label), tf.int64))
    seen = tf.size(label, out_type=tf.int64)
    totals = hvd.allreduce(tf.stack([correct, seen]), op=hvd.Sum, name="accuracy")

    # Horovod: pin GPU to be used to process local rank (one GPU per process).
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())

    global_step = tf.compat.v1.train.get_or_create_global_step()
    # Horovod: scale the learning rate by the number of ranks (the global batch is size times larger).
    opt = tf.compat.v1.train.AdagradOptimizer(args.lr * size)
    # Horovod: add the Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)
    train_op = opt.minimize(loss, global_step=global_step)

    evaluate = EvaluateAtEndHook(totals, {image: x_test, label: y_test})
    hooks = [
        # Horovod: broadcast rank 0's initial variables to all other ranks, so that every rank starts from the
        # same weights (or from rank 0's restored checkpoint).
        hvd.BroadcastGlobalVariablesHook(0),
        # Horovod: the number of steps is divided by the number of ranks.
        tf.compat.v1.train.StopAtStepHook(last_step=args.steps // size),
        evaluate,
    ]
    if rank == 0:
        hooks.append(tf.compat.v1.train.LoggingTensorHook({"step": global_step, "loss": loss}, every_n_iter=100))

    # Horovod: save checkpoints only on rank 0, so that the other ranks cannot corrupt them.
    checkpoint_dir = args.checkpoint_dir if rank == 0 else None

    # The MonitoredTrainingSession initializes or restores the variables, runs the hooks, and saves checkpoints.
    train_batches = batches(x_train, y_train, args.batch_size, seed=args.seed + rank)
    with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks, config=config,
                                                     log_step_count_steps=None) as mon_sess:
        while not mon_sess.should_stop():
            images, labels = next(train_batches)
            mon_sess.run(train_op, feed_dict={image: images, label: labels})

    num_correct, num_seen = (int(v) for v in evaluate.result)
    accuracy = num_correct / num_seen
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", num_seen, 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
