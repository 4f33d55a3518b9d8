"""A Keras 2 program, as upstream's ``tensorflow2_keras_mnist.py`` is written, run through tf-keras.

``TF_USE_LEGACY_KERAS=1 horovodrun -np 2 python examples/keras/tf_keras_digits.py``. With that variable
``tf.keras`` is the ``tf_keras`` package (Keras 2.x), so ``tf.optimizers.Adam``, ``lr=`` and
``tf.keras.optimizers.legacy.*`` work as they did before TensorFlow 2.16. The program has upstream's shape:
``hvd.init()``, a ``tf.data`` pipeline of this rank's shard, the learning rate scaled by ``hvd.size()``,
``hvd.DistributedOptimizer``, ``compile(..., experimental_run_tf_function=False)``, the broadcast, metric-average
and warmup callbacks, ``steps_per_epoch`` divided by the size, and an ``.h5`` checkpoint from rank 0 only. The data
is scikit-learn's bundled digits (nothing is downloaded).
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Tuple

# tf.keras must be tf_keras: the variable is read when TensorFlow first loads tf.keras.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.tensorflow.keras as hvd

log = logging.getLogger("tf_keras_digits")


def load_data() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 8, 8, 1) float32 images in [0, 1], split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    return train_test_split(x, digits.target.astype(np.int64), test_size=0.25, random_state=0,
                            stratify=digits.target)


def build_model() -> tf.keras.Model:
    """Upstream's MNIST CNN, sized for 8x8 images."""
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, [3, 3], activation="relu", padding="same", input_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(32, [3, 3], activation="relu", padding="same"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.002, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--steps", type=int, default=80, help="steps per epoch for one rank (divided by size)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--legacy-optimizer", action="store_true",
                        help="tf.keras.optimizers.legacy.Adam(lr=...) instead of tf.optimizers.Adam")
    parser.add_argument("--checkpoint-dir", default="checkpoints", help="rank 0 saves checkpoint-{epoch}.h5 here")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if not tf.keras.__name__.startswith("tf_keras"):
        raise SystemExit("tf.keras is not tf_keras: install tf-keras and set TF_USE_LEGACY_KERAS=1 before "
                         "TensorFlow is imported.")
    tf.keras.utils.set_random_seed(args.seed + rank)   # different per rank until the callback broadcasts rank 0's
    if rank == 0:
        import tf_keras

        log.info("tf-keras %s (TensorFlow %s), %d ranks", tf_keras.__version__, tf.__version__, size)

    x_train, x_test, y_train, y_test = load_data()
    dataset = tf.data.Dataset.from_tensor_slices((x_train[rank::size], y_train[rank::size]))
    dataset = dataset.repeat().shuffle(2000, seed=args.seed + rank).batch(args.batch_size)

    model = build_model()
    # Horovod: scale the learning rate by the number of ranks.
    scaled_lr = args.lr * size
    opt = tf.keras.optimizers.legacy.Adam(lr=scaled_lr) if args.legacy_optimizer else tf.optimizers.Adam(scaled_lr)
    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
    # Horovod: experimental_run_tf_function=False, as upstream's Keras 2 programs pass it.
    model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                  experimental_run_tf_function=False)

    callbacks = [
        # Horovod: broadcast rank 0's initial variable states to all other ranks.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: start with lr / size and warm up to lr over the first epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]
    # Horovod: save checkpoints only on rank 0 to prevent other ranks from corrupting them.
    if rank == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.h5")))
    model.fit(dataset, steps_per_epoch=args.steps // size, callbacks=callbacks, epochs=args.epochs,
              verbose=2 if rank == 0 else 0)

    # Every rank scores its shard of the test set; the counts are summed across ranks.
    x_shard, y_shard = x_test[rank::size], y_test[rank::size]
    predicted = np.argmax(model.predict(x_shard, verbose=0), axis=1)
    totals = hvd.allreduce(np.array([(predicted == y_shard).sum(), len(y_shard)], np.float64), op=hvd.Sum,
                           name="accuracy").numpy()
    accuracy = totals[0] / totals[1]
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", int(totals[1]), 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
