"""Data-parallel TensorFlow 2 training of a small Keras network on scikit-learn's bundled digits data.

Launch with ``horovodrun -np 2 python examples/tensorflow2/tensorflow2_digits.py``. It is upstream's
``tensorflow2_mnist.py`` program shape on data that ships with scikit-learn (nothing is downloaded):
``hvd.init()``, a per-rank shard of the training set (``tf.data.Dataset.shard``), a ``keras.Sequential`` model,
the learning rate scaled by ``hvd.size()``, a ``@tf.function`` training step whose ``tf.GradientTape`` is wrapped
in ``hvd.DistributedGradientTape``, the model and optimizer variables broadcast from rank 0 after the first step
(Keras creates the optimizer's variables there), and checkpoints and progress output from rank 0 only.
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported: no C++ info banners

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.tensorflow as hvd

log = logging.getLogger("tensorflow2_digits")
Arrays = Tuple[np.ndarray, np.ndarray]


def build_model(hidden: int = 128) -> keras.Model:
    """A small CNN for 8x8 single-channel digit images (the torch example's ``Net``), returning logits."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(10),
    ])


def load_data() -> Tuple[Arrays, Arrays]:
    """The digits as (N, 8, 8, 1) float32 images in [0, 1] and int64 labels, split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                        stratify=digits.target)
    return (x_train, y_train.astype(np.int64)), (x_test, y_test.astype(np.int64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num-threads", type=int, default=1, help="TensorFlow intra-op threads per rank")
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    parser.add_argument("--checkpoint", default="checkpoints/tensorflow2_digits",
                        help="rank 0 writes the model and optimizer state to this tf.train.Checkpoint prefix "
                             "after every epoch")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tf.get_logger().setLevel(logging.WARNING)  # TensorFlow's own INFO lines (e.g. on checkpoint writes)

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.config.threading.set_intra_op_parallelism_threads(args.num_threads)
    keras.utils.set_random_seed(args.seed + rank)  # deliberately different per rank until rank 0's are broadcast

    (x_train, y_train), (x_test, y_test) = load_data()
    # Every rank runs the same number of steps per epoch (each step's allreduce needs every rank), on its own
    # 1/size of the training set, reshuffled every epoch.
    steps_per_epoch = len(x_train) // (size * args.batch_size)
    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(size, rank).repeat()
               .shuffle(len(x_train), seed=args.seed + rank).batch(args.batch_size))

    model = build_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Horovod: scale the learning rate by the number of ranks (the global batch is size times larger).
    opt = keras.optimizers.SGD(learning_rate=args.lr * size, momentum=args.momentum)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    @tf.function
    def training_step(images: tf.Tensor, labels: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss_value = loss_fn(labels, model(images, training=True))
        # Horovod: the tape averages the gradients across ranks (one grouped allreduce).
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # Horovod: broadcast rank 0's initial variables once the first step has created the optimizer's. The
        # first step's update itself used averaged gradients, so after the broadcast every rank agrees.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    epoch_var = tf.Variable(-1, dtype=tf.int64, name="epoch")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, epoch=epoch_var)
    epochs = range(args.epochs)
    if rank == 0:
        from tqdm import tqdm

        epochs = tqdm(epochs, desc="epochs", unit="epoch", mininterval=0.5)
    batches = iter(dataset)
    for epoch in epochs:
        total_loss = 0.0
        for step in range(steps_per_epoch):
            images, labels = next(batches)
            total_loss += float(training_step(images, labels, epoch == 0 and step == 0))
        mean_loss = float(hvd.allreduce(tf.constant(total_loss / max(steps_per_epoch, 1), tf.float64),
                                        name="avg_loss", op=hvd.Average))
        if rank == 0:
            epochs.set_postfix(loss=f"{mean_loss:.4f}", refresh=False)
            epoch_var.assign(epoch)
            os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
            checkpoint.write(args.checkpoint)

    # Evaluate: every rank scores its disjoint shard of the test set; the counts are summed across ranks.
    x_shard, y_shard = x_test[rank::size], y_test[rank::size]
    predicted = np.argmax(model.predict_on_batch(x_shard), axis=1) if len(x_shard) else np.zeros(0, np.int64)
    correct = int((predicted == y_shard).sum())
    totals = hvd.allreduce(tf.constant([correct, len(y_shard)], tf.int64), op=hvd.Sum, name="accuracy").numpy()
    accuracy = float(totals[0]) / float(totals[1])
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", int(totals[1]), 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
