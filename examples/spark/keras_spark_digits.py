"""The digits network trained with ``horovod.spark.keras.KerasEstimator`` (Keras 3) on a Spark DataFrame.

Run ``python examples/spark/keras_spark_digits.py`` (Spark's ``local[2]`` master, 2 Horovod ranks) or give a
cluster: ``--master local-cluster[2,1,1024]`` or ``--master spark://host:7077``. It is upstream's
``keras_spark_mnist.py`` on scikit-learn's bundled digits (nothing is downloaded): a DataFrame with an array
column of 64 pixels and a label, a ``KerasEstimator`` that trains a small CNN on ``--num-proc`` ranks with the
data in a ``LocalStore`` (the estimator reshapes each row to the model's ``(8, 8, 1)`` input), and a
``KerasModel`` that adds a ``label__output`` column of class probabilities to the held-out rows.
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from typing import List, Optional, Tuple

import keras
import numpy as np
from pyspark.sql import DataFrame, SparkSession
from sklearn.datasets import load_digits

from horovod.spark.common.store import Store
from horovod.spark.keras import KerasEstimator, KerasModel

log = logging.getLogger("keras_spark_digits")


def digits_frames(spark: SparkSession, seed: int = 0) -> Tuple[DataFrame, DataFrame]:
    """The digits as a DataFrame of ``features`` (64 floats in [0, 1]) and ``label``, split 75/25."""
    digits = load_digits()
    rows = [([float(v) for v in pixels / 16.0], int(label))
            for pixels, label in zip(digits.data, digits.target)]
    df = spark.createDataFrame(rows, "features array<double>, label long")
    train, test = df.randomSplit([0.75, 0.25], seed=seed)
    return train, test


def build_model() -> keras.Model:
    """A small CNN for 8x8 single-channel digit images, ending in class probabilities."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def build_estimator(args: argparse.Namespace, store: Store) -> KerasEstimator:
    keras.utils.set_random_seed(args.seed)
    return KerasEstimator(
        num_proc=args.num_proc, store=store, model=build_model(),
        optimizer=keras.optimizers.SGD(args.lr * args.num_proc, momentum=0.9),
        loss="sparse_categorical_crossentropy", metrics=["accuracy"], feature_cols=["features"],
        label_cols=["label"], validation=0.1, batch_size=args.batch_size, epochs=args.epochs,
        random_seed=args.seed, verbose=0)


def held_out_accuracy(model: KerasModel, test: DataFrame) -> float:
    """The fraction of held-out digits whose most probable class is the label."""
    rows = model.transform(test).select("label", "label__output").collect()
    return float(np.mean([int(np.argmax(row.label__output.toArray())) == row.label for row in rows]))


def train_and_evaluate(spark: SparkSession, args: argparse.Namespace,
                       work_dir: str) -> Tuple[KerasModel, float, DataFrame]:
    """Fit on the training digits; the fitted model, its test accuracy and the test rows."""
    train, test = digits_frames(spark, args.seed)
    model = build_estimator(args, Store.create(os.path.join(work_dir, "store"))).fit(train)
    return model, held_out_accuracy(model, test), test


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    parser.add_argument("--num-proc", type=int, default=2, help="Horovod ranks (Spark tasks)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank (scaled by ranks)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work-dir", default=None, help="the store's directory (default: a temporary one)")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spark = SparkSession.builder.master(args.master).appName("keras_spark_digits").getOrCreate()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model, acc, _ = train_and_evaluate(spark, args, args.work_dir or tmp)
        history = model.getHistory()
        for epoch in range(len(history["loss"])):
            metrics = {name: round(values[epoch], 4) for name, values in history.items()}
            log.info("epoch %d: %s", epoch + 1, metrics)
        log.info("test accuracy on the held-out digits: %.2f%% (%d ranks)", 100 * acc, args.num_proc)
    finally:
        spark.stop()
    if acc < args.min_accuracy:
        raise SystemExit(f"accuracy {acc:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
