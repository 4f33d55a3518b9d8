"""Elastic data-parallel Keras 3 training with ``model.fit`` on scikit-learn's bundled digits: workers may come
and go.

Launch with (see README.md in this folder)::

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script examples/elastic/discover_hosts.sh \
        python examples/elastic/keras_digits_elastic.py

It is upstream's ``tensorflow2_keras_mnist_elastic.py`` program shape on the model and data of
``examples/keras/keras_digits.py``: ``hvd.elastic.KerasState`` holds the model, its optimizer, the epoch and the
batch; ``CommitStateCallback`` commits it every ``--batches-per-commit`` batches, ``UpdateBatchStateCallback`` and
``UpdateEpochStateCallback`` keep ``state.batch`` and ``state.epoch`` current, and ``model.fit`` runs under
``@hvd.elastic.run`` for the epochs that are left. After every reset the learning rate is scaled to the new number
of workers and each worker trains on its new shard of the data.

It runs on any Keras 3 backend (``horovod.keras`` needs no TensorFlow): ``KERAS_BACKEND=tensorflow`` (the
default), ``torch`` or ``jax``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Tuple

import keras
import numpy as np

import horovod.keras as hvd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "keras"))
from keras_digits import build_model, load_data  # the model and data of the non-elastic example

log = logging.getLogger("keras_digits_elastic")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--batches-per-commit", type=int, default=5,
                        help="commit the state every this many batches (a failure loses at most as many)")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one worker (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    return parser.parse_args()


def evaluate(model: keras.Model, x_test: np.ndarray, y_test: np.ndarray) -> Tuple[float, int]:
    """Every worker scores its shard of the test set; returns (accuracy over all shards, digits scored)."""
    rank, size = hvd.rank(), hvd.size()
    x_shard, y_shard = x_test[rank::size], y_test[rank::size]
    predicted = np.argmax(keras.ops.convert_to_numpy(model.predict(x_shard, verbose=0)), axis=1)
    totals = keras.ops.convert_to_numpy(hvd.allreduce(np.array([(predicted == y_shard).sum(), len(y_shard)]),
                                                      op=hvd.Sum, name="accuracy"))
    return float(totals[0]) / float(totals[1]), int(totals[1])


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hvd.init()
    keras.utils.set_random_seed(args.seed)
    if hvd.rank() == 0:
        log.info("Keras %s on the %s backend", keras.__version__, keras.backend.backend())
    x_train, x_test, y_train, y_test = load_data()

    model = build_model()
    # Horovod: scale the learning rate by the number of workers (the global batch is size times larger).
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=args.momentum))
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    # Horovod: what survives a reset; every worker gets rank 0's copy before training (re)starts.
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    def on_state_reset() -> None:
        state.model.optimizer.learning_rate.assign(args.lr * hvd.size())

    state.register_reset_callbacks([on_state_reset])
    callbacks = [
        # Horovod: report the mean of each metric over the workers, not rank 0's alone.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: the elastic callbacks keep state.epoch and state.batch current and commit the state.
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
    ]

    @hvd.elastic.run
    def train(state: hvd.elastic.KerasState) -> None:
        rank, size = hvd.rank(), hvd.size()        # after a reset, this worker's new shard of the data
        if rank == 0:
            log.info("training epochs %d to %d on %d workers", state.epoch + 1, args.epochs, size)
        state.model.fit(x_train[rank::size], y_train[rank::size], batch_size=args.batch_size, shuffle=True,
                        epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=2 if rank == 0 else 0)

    train(state)
    accuracy, scored = evaluate(model, x_test, y_test)
    if hvd.rank() == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", scored, 100 * accuracy, hvd.size())
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
