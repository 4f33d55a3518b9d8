"""Data-parallel training of a small MLP on scikit-learn's bundled digits data, in pure numpy.

Launch with ``horovodrun -np 2 python examples/numpy/numpy_digits.py``. It follows the Horovod recipe:
shard the data by rank, scale the learning rate by the number of ranks, broadcast the initial parameters
from rank 0, average gradients with one grouped allreduce per step, and let only rank 0 write checkpoints.
The digits data ships inside scikit-learn, so nothing is downloaded.
"""
from __future__ import annotations

import argparse
import logging
import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.numpy as hvd

log = logging.getLogger("numpy_digits")


def init_params(rng: np.random.Generator, hidden: int) -> list:
    return [rng.normal(0, np.sqrt(2 / 64), (64, hidden)).astype(np.float32), np.zeros(hidden, np.float32),
            rng.normal(0, np.sqrt(1 / hidden), (hidden, 10)).astype(np.float32), np.zeros(10, np.float32)]


def forward(params: list, x: np.ndarray):
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0)
    logits = h @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return h, p


def gradients(params: list, x: np.ndarray, y: np.ndarray):
    """Cross-entropy loss and its gradients for one mini-batch."""
    w1, b1, w2, b2 = params
    h, p = forward(params, x)
    n = x.shape[0]
    loss = float(-np.log(p[np.arange(n), y] + 1e-9).mean())
    d = p.copy()
    d[np.arange(n), y] -= 1
    d /= n
    dw2, db2 = h.T @ d, d.sum(0)
    dh = (d @ w2.T) * (h > 0)
    dw1, db1 = x.T @ dh, dh.sum(0)
    return loss, [dw1.astype(np.float32), db1.astype(np.float32), dw2.astype(np.float32), db2.astype(np.float32)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default="checkpoints/numpy_digits.npz")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                        stratify=digits.target)
    # Each rank trains on its own shard of the training set.
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    params = init_params(np.random.default_rng(args.seed + rank), args.hidden)   # deliberately different per rank ...
    for i, p in enumerate(params):                                    # ... until rank 0's are broadcast
        hvd.broadcast_(p, root_rank=0, name=f"param.{i}")
    velocity = [np.zeros_like(p) for p in params]
    lr = args.lr * size
    rng = np.random.default_rng(args.seed + 1234 + rank)
    steps = int(np.ceil(len(x_shard) / args.batch_size))
    # Every rank must run the same number of steps (each allreduce needs every rank).
    steps = int(hvd.allreduce(np.array([steps]), op=hvd.Min, name="steps")[0])

    progress = range(args.epochs)
    if rank == 0:
        from tqdm import tqdm

        progress = tqdm(progress, desc="epochs", unit="epoch", mininterval=0.5)
    for epoch in progress:
        order = rng.permutation(len(x_shard))
        losses = []
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss, grads = gradients(params, x_shard[idx], y_shard[idx])
            grads = hvd.grouped_allreduce(grads, name="grads", op=hvd.Average)
            for p, v, g in zip(params, velocity, grads):
                v *= 0.9
                v += g
                p -= lr * v
            losses.append(loss)
        mean_loss = float(hvd.allreduce(np.array([np.mean(losses)], np.float64), name="loss")[0])
        if rank == 0:
            progress.set_postfix(loss=f"{mean_loss:.4f}", refresh=False)
            os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
            np.savez(args.checkpoint, *params, epoch=epoch)

    # Evaluate: each rank scores a shard of the test set; the counts are summed across ranks.
    _, p_test = forward(params, x_test[rank::size])
    correct = np.array([(p_test.argmax(1) == y_test[rank::size]).sum(), len(y_test[rank::size])], np.int64)
    correct = hvd.allreduce(correct, op=hvd.Sum, name="accuracy")
    accuracy = correct[0] / correct[1]
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", correct[1], 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
