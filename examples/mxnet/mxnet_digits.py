"""Data-parallel MXNet Gluon training of a small CNN on scikit-learn's bundled digits data.

Launch with ``horovodrun -np 2 python examples/mxnet/mxnet_digits.py`` (in the MXNet venv, see docs/mxnet.md). It is
upstream's ``mxnet2_mnist.py`` program shape on data that ships with scikit-learn (nothing is downloaded):
``hvd.init()``, each rank training on its own part of the data, the learning rate scaled by ``hvd.size()``,
parameters (deferred-initialised until the first batch) broadcast from rank 0 with ``hvd.broadcast_parameters``,
``hvd.DistributedTrainer`` averaging the gradients, metrics summed with ``hvd.allreduce``, and progress output from
rank 0 only.
"""
from __future__ import annotations

import argparse
import logging
from typing import Tuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.mxnet as hvd

log = logging.getLogger("mxnet_digits")


def conv_net() -> gluon.nn.HybridSequential:
    """A small CNN for 8x8 single-channel digit images; input sizes are inferred at the first batch."""
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(16, kernel_size=3, padding=1, activation="relu"),
                gluon.nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
                gluon.nn.MaxPool2D(pool_size=2),
                gluon.nn.Flatten(),
                gluon.nn.Dense(128, activation="relu"),
                gluon.nn.Dense(10))
    return net


def load_data() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 1, 8, 8) float32 arrays in [0, 1], split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return train_test_split(x, digits.target.astype(np.float32), test_size=0.25, random_state=0,
                            stratify=digits.target)


def evaluate(net: gluon.nn.HybridSequential, x: np.ndarray, y: np.ndarray) -> Tuple[int, int]:
    """(correct, seen) on this rank's shard."""
    predictions = net(mx.nd.array(x)).argmax(axis=1).asnumpy()
    return int((predictions == y).sum()), len(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    mx.random.seed(args.seed + rank)   # deliberately different per rank until rank 0's weights are broadcast

    x_train, x_test, y_train, y_test = load_data()
    # Horovod: each rank trains on its own 1/size of the training set and scores its shard of the test set.
    x_train, y_train = x_train[rank::size], y_train[rank::size]
    x_test, y_test = x_test[rank::size], y_test[rank::size]

    net = conv_net()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net.hybridize()
    # Horovod: broadcast rank 0's parameters (they are created at the first batch: the broadcast happens then).
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    # Horovod: scale the learning rate by the number of ranks, and average gradients with DistributedTrainer.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": args.lr * size, "momentum": args.momentum},
                                     compression=compression,
                                     gradient_predivide_factor=args.gradient_predivide_factor)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    order = np.random.RandomState(args.seed + rank)

    for epoch in range(args.epochs):
        permutation = order.permutation(len(x_train))
        # Every rank must take the same number of steps: each step's allreduce needs all of them.
        steps = len(x_train) // args.batch_size
        total_loss = mx.nd.zeros((1,))
        for step in range(steps):
            batch = permutation[step * args.batch_size:(step + 1) * args.batch_size]
            data, label = mx.nd.array(x_train[batch]), mx.nd.array(y_train[batch])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch_size)
            total_loss += loss.mean()
        mean_loss = hvd.allreduce(total_loss / steps, name="avg_loss").asscalar()
        correct, seen = evaluate(net, x_test, y_test)
        totals = hvd.allreduce(mx.nd.array([correct, seen], dtype="int64"), op=hvd.Sum, name="accuracy")
        if rank == 0:
            log.info("Epoch[%d]\tTrain: loss=%f\tValidation: accuracy=%f", epoch, mean_loss,
                     totals[0].asscalar() / totals[1].asscalar())

    correct, seen = evaluate(net, x_test, y_test)
    totals = hvd.allreduce(mx.nd.array([correct, seen], dtype="int64"), op=hvd.Sum, name="accuracy").asnumpy()
    accuracy = float(totals[0]) / float(totals[1])
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", int(totals[1]), 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
