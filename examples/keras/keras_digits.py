"""Data-parallel Keras 3 training with ``model.fit`` on scikit-learn's bundled digits data.

Launch with ``horovodrun -np 2 python examples/keras/keras_digits.py``. It is upstream's
``tensorflow2_keras_mnist.py`` / ``keras_mnist_advanced.py`` program shape on data that ships with scikit-learn
(nothing is downloaded): ``hvd.init()``, a per-rank shard of the training set, the learning rate scaled by
``hvd.size()`` with a warmup, ``hvd.DistributedOptimizer``, and the broadcast, metric-average and warmup
callbacks; checkpoints and progress output come from rank 0 only.

It runs on any Keras 3 backend: ``KERAS_BACKEND=tensorflow`` (the default), ``torch`` or ``jax``.
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Tuple

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.keras as hvd

log = logging.getLogger("keras_digits")


def load_data() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 8, 8, 1) float32 images in [0, 1], split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    return train_test_split(x, digits.target.astype(np.int32), test_size=0.25, random_state=0,
                            stratify=digits.target)


def build_model() -> keras.Model:
    """A small CNN for 8x8 single-channel digit images."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    parser.add_argument("--checkpoint", default="checkpoints/keras_digits.keras",
                        help="rank 0 saves the model here after every epoch")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # different per rank until the callback broadcasts rank 0's

    if rank == 0:
        log.info("Keras %s on the %s backend, %d ranks", keras.__version__, keras.backend.backend(), size)
    x_train, x_test, y_train, y_test = load_data()
    # Each rank trains on its own 1/size of the training set.
    x_train, y_train = x_train[rank::size], y_train[rank::size]

    model = build_model()
    # Horovod: scale the learning rate by the number of ranks (the global batch is size times larger).
    scaled_lr = args.lr * size
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=args.momentum),
                                         compression=compression)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    callbacks = [
        # Start every rank from rank 0's weights, and give every rank's optimizer the same state.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Report the mean of each metric over ranks, not rank 0's alone.
        hvd.callbacks.MetricAverageCallback(),
        # Ramp the learning rate up from lr to lr * size over the first epochs (Goyal et al.).
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs),
    ]
    if rank == 0:
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint))
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
              callbacks=callbacks, verbose=2 if rank == 0 else 0)

    # Evaluate: every rank scores its shard of the test set; the counts are summed across ranks.
    x_shard, y_shard = x_test[rank::size], y_test[rank::size]
    predicted = np.argmax(keras.ops.convert_to_numpy(model.predict(x_shard, verbose=0)), axis=1)
    totals = keras.ops.convert_to_numpy(hvd.allreduce(np.array([(predicted == y_shard).sum(), len(y_shard)]),
                                                      op=hvd.Sum, name="accuracy"))
    accuracy = float(totals[0]) / float(totals[1])
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", int(totals[1]), 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
