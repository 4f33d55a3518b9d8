"""The digits network trained with ``horovod.spark.torch.TorchEstimator`` on a Spark DataFrame.

Run ``python examples/spark/pytorch_spark_digits.py`` (Spark's ``local[2]`` master, 2 Horovod ranks) or give a
cluster: ``--master local-cluster[2,1,1024]`` or ``--master spark://host:7077``. It is upstream's
``pytorch_spark_mnist.py`` on scikit-learn's bundled digits (nothing is downloaded): the 64 pixel columns of a
DataFrame become one vector column (a ``VectorAssembler``), a ``TorchEstimator`` in the same ``Pipeline``
trains a small CNN on ``--num-proc`` ranks with the data in a ``LocalStore``, and the fitted ``PipelineModel``
adds a
``label__output`` column of class scores to the held-out rows, from which the accuracy is computed.
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import DataFrame, SparkSession
from sklearn.datasets import load_digits

from horovod.spark.common.store import Store
from horovod.spark.torch import TorchEstimator

log = logging.getLogger("pytorch_spark_digits")
PIXELS = [f"pixel{i}" for i in range(64)]


class Net(nn.Module):
    """A small CNN for 8x8 single-channel digit images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def cross_entropy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The estimator hands labels over as floats (as upstream's does): class indices for cross-entropy."""
    return F.cross_entropy(output, label.long())


def accuracy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output.argmax(1) == label.long()).float().mean()


def digits_frames(spark: SparkSession, seed: int = 0) -> Tuple[DataFrame, DataFrame]:
    """The digits as a DataFrame of 64 pixel columns (in [0, 1]) and a label, split 75/25 into train and
    test."""
    digits = load_digits()
    rows = [tuple(float(v) for v in pixels / 16.0) + (int(label),)
            for pixels, label in zip(digits.data, digits.target)]
    df = spark.createDataFrame(rows, [*PIXELS, "label"])
    train, test = df.randomSplit([0.75, 0.25], seed=seed)
    return train, test


def build_pipeline(args: argparse.Namespace, store: Store) -> Pipeline:
    """VectorAssembler (pixels -> features) then TorchEstimator (features -> label)."""
    torch.manual_seed(args.seed)
    model = Net()
    estimator = TorchEstimator(
        num_proc=args.num_proc, store=store, model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr * args.num_proc, momentum=0.9),
        loss=cross_entropy, metrics=[accuracy], input_shapes=[[-1, 1, 8, 8]],
        feature_cols=["features"], label_cols=["label"], validation=0.1, batch_size=args.batch_size,
        epochs=args.epochs, random_seed=args.seed, verbose=0)
    return Pipeline(stages=[VectorAssembler(inputCols=PIXELS, outputCol="features"), estimator])


def held_out_accuracy(model: PipelineModel, test: DataFrame) -> float:
    """The fraction of held-out digits whose highest class score is the label."""
    rows = model.transform(test).select("label", "label__output").collect()
    return float(np.mean([int(np.argmax(row.label__output.toArray())) == row.label for row in rows]))


def train_and_evaluate(spark: SparkSession, args: argparse.Namespace,
                       work_dir: str) -> Tuple[PipelineModel, float, DataFrame]:
    """Fit the pipeline on the training digits; the fitted model, its test accuracy and the test rows."""
    train, test = digits_frames(spark, args.seed)
    model = build_pipeline(args, Store.create(os.path.join(work_dir, "store"))).fit(train)
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
    spark = SparkSession.builder.master(args.master).appName("pytorch_spark_digits").getOrCreate()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model, acc, _ = train_and_evaluate(spark, args, args.work_dir or tmp)
        for epoch in model.stages[-1].getHistory():
            log.info("epoch %d: %s", epoch["epoch"] + 1, epoch)
        log.info("test accuracy on the held-out digits: %.2f%% (%d ranks)", 100 * acc, args.num_proc)
    finally:
        spark.stop()
    if acc < args.min_accuracy:
        raise SystemExit(f"accuracy {acc:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
